//! How a row calls its service: the loops beside the shared driver's
//! stack-pinned one, each timing `calls` operations as a whole.
//!
//! * [`drive_async`]: the call as tower users write it,
//!   `svc.ready().await?.call(req).await` in an async fn ([`ready_call`]),
//!   so that the response future is moved into that function's state and
//!   awaited there. The loop is the executor: each call is a task (the
//!   async fn's future) polled once with a no-op waker; every service
//!   measured answers at once, so each task completes on that poll.
//! * [`drive_hand`]: the same call, in the loop an independent measuring
//!   program wrote: a fresh [`program_call`] future (a copy of
//!   [`ready_call`]) pinned in the loop and polled once by a `match` in
//!   place, only `r.is_ok()` kept (`black_box`ed), where [`drive_async`]
//!   keeps the whole result. The
//!   service's work is the same: a figure that moves between the two comes
//!   from the code around the call (what is kept of the result, where the
//!   compiler puts things), and is not what every user gets.
//! * [`drive_block_on`]: the same call awaited in an async block run by
//!   tokio's current-thread `block_on`, one `block_on` per run of `calls`
//!   calls, timed inside the block: each call's future is part of the
//!   block's state, polled by a real executor with a real waker.
//! * [`drive_oneshot`]: a request through a fresh clone,
//!   `svc.clone().oneshot(req).await` in an async fn ([`oneshot_call`]), as
//!   axum routes, `Buffer` callers and balancers make one.
//! * [`drive_clone_drop`]: a clone of the service, dropped at once: what a
//!   clone per request costs before any call.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tower::{Service, ServiceExt};

use crate::driver::{noop_waker, not_ready};

/// One call the way tower users write it: readiness awaited, then the
/// response, the response future moved into this function's state.
pub async fn ready_call<S: Service<u64>>(svc: &mut S, req: u64) -> Result<S::Response, S::Error> {
    svc.ready().await?.call(req).await
}

/// [`ready_call`] again, word for word, for the independent program's
/// loops ([`drive_hand`], [`drive_block_on`]), which share it as that
/// program's two loops shared its one.
// A copy, not `ready_call` itself: with three loops polling one
// `ready_call` per service type, the compiler stopped inlining its poll
// into `drive_async`: `async/bare` and `async/boxed/bare` went from 0.8 to
// 13 ns, and the breakers' async rows' ns/op rose by about as much,
// measured. The copy leaves the async rows as they were before these loops
// were added.
pub async fn program_call<S: Service<u64>>(svc: &mut S, req: u64) -> Result<S::Response, S::Error> {
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

/// `calls` calls made by [`program_call`], each future pinned in the loop
/// and polled once in place, timed as a whole: the hand-polled loop of the
/// independent program, as it wrote it.
pub fn drive_hand<S: Service<u64>>(svc: &mut S, calls: u64) -> Duration {
    let mut cx = Context::from_waker(noop_waker());
    let start = Instant::now();
    for i in 0..calls {
        match pin!(program_call(svc, black_box(i))).poll(&mut cx) {
            Poll::Ready(r) => {
                black_box(r.is_ok());
            }
            Poll::Pending => panic!("every benchmarked service must be ready at once"),
        }
    }
    start.elapsed()
}

/// The runtime of [`drive_block_on`]: current-thread, `enable_all()`, as
/// the independent program made it (with this package's tokio features
/// that is the time driver: there is no `net` feature here, and adding it
/// would change the tokio every row is built with).
///
/// A runtime of its own, not the one `main` enters: `enter()` only sets the
/// current handle, it does not mark the thread as running a runtime, so
/// `block_on` under it is legal and does not nest (tokio refuses only a
/// `block_on` inside a `block_on` or a task). Its own runtime keeps this
/// loop self-contained (any row, any caller order) and configured as the
/// program's was. It lives in a static and is never dropped: a runtime
/// dropped in a thread-local's destructor may find tokio's own
/// thread-locals gone.
fn block_on_runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// `calls` calls made by [`program_call`] awaited in one async block that
/// tokio's current-thread `block_on` runs, timed inside the block (the
/// `block_on` itself, once per run, is outside the timing).
pub fn drive_block_on<S: Service<u64>>(svc: &mut S, calls: u64) -> Duration {
    block_on_runtime().block_on(async {
        let start = Instant::now();
        for i in 0..calls {
            black_box(program_call(svc, black_box(i)).await.is_ok());
        }
        start.elapsed()
    })
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
