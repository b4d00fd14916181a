//! How a row calls its service: the loops beside the shared driver's
//! stack-pinned one, each timing `calls` operations as a whole.
//!
//! * [`drive_async`]: the call as tower users write it,
//!   `svc.ready().await?.call(req).await` in an async fn ([`ready_call`]),
//!   so that the response future is moved into that function's state and
//!   awaited there. The loop is the executor: each call is a task (the
//!   async fn's future) polled once with a no-op waker; every service
//!   measured answers at once, so each task completes on that poll.
//! * [`drive_oneshot`]: a request through a fresh clone,
//!   `svc.clone().oneshot(req).await` in an async fn ([`oneshot_call`]), as
//!   axum routes, `Buffer` callers and balancers make one.
//! * [`drive_clone_drop`]: a clone of the service, dropped at once: what a
//!   clone per request costs before any call.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower::{Service, ServiceExt};

use crate::driver::{noop_waker, not_ready};

/// One call the way tower users write it: readiness awaited, then the
/// response, the response future moved into this function's state.
pub async fn ready_call<S: Service<u64>>(svc: &mut S, req: u64) -> Result<S::Response, S::Error> {
    svc.ready().await?.call(req).await
}

/// One request through a clone made for it, as axum routes make them.
pub async fn oneshot_call<S>(svc: &S, req: u64) -> Result<S::Response, S::Error>
where
    S: Service<u64> + Clone,
{
    svc.clone().oneshot(req).await
}

/// Polls `task` once, with a no-op waker. Nothing would wake it, and every
/// service measured answers at once: a task still pending is a broken row.
#[inline(always)]
pub fn complete<F: Future>(cx: &mut Context<'_>, task: F) -> F::Output {
    match pin!(task).poll(cx) {
        Poll::Ready(output) => output,
        Poll::Pending => not_ready(),
    }
}

/// `calls` calls made by [`ready_call`], timed as a whole.
pub fn drive_async<S: Service<u64>>(svc: &mut S, calls: u64) -> Duration {
    let mut cx = Context::from_waker(noop_waker());
    let start = Instant::now();
    for i in 0..calls {
        let _ = black_box(complete(&mut cx, ready_call(svc, black_box(i))));
    }
    start.elapsed()
}

/// `calls` requests, each through a fresh clone of `svc` ([`oneshot_call`]),
/// timed as a whole.
pub fn drive_oneshot<S: Service<u64> + Clone>(svc: &mut S, calls: u64) -> Duration {
    let mut cx = Context::from_waker(noop_waker());
    let start = Instant::now();
    for i in 0..calls {
        let _ = black_box(complete(&mut cx, oneshot_call(svc, black_box(i))));
    }
    start.elapsed()
}

/// `calls` clones of `svc`, each dropped at once, timed as a whole.
pub fn drive_clone_drop<S: Clone>(svc: &mut S, calls: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..calls {
        let clone = black_box(&*svc).clone();
        black_box(&clone);
        drop(clone);
    }
    start.elapsed()
}
