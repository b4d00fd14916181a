//! The stack-pinned call loop the hot-path and fleet benches share:
//! readiness, call, and one poll of the response future pinned on the
//! stack, with a waker that does nothing.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tower::Service;

/// A waker that does nothing: every service measured is ready at once, so
/// nothing is ever woken.
// `Waker::noop` is newer than the library's minimum Rust version; the
// benchmarks are development targets, built with a current toolchain, and
// nothing in the library depends on it.
#[allow(clippy::incompatible_msrv)]
pub fn noop_waker() -> &'static Waker {
    Waker::noop()
}

/// One call, as a caller without an executor makes it: readiness, call, and
/// one poll of the response future, pinned on the stack.
#[inline(always)]
pub fn call_once<S: Service<u64>>(
    svc: &mut S,
    cx: &mut Context<'_>,
    x: u64,
) -> Poll<Result<S::Response, S::Error>> {
    if !matches!(svc.poll_ready(cx), Poll::Ready(Ok(()))) {
        not_ready();
    }
    let future = pin!(svc.call(x));
    future.poll(cx)
}

#[cold]
#[inline(never)]
pub fn not_ready() -> ! {
    panic!("every benchmarked service must be ready at once")
}

/// `calls` calls, timed as a whole.
pub fn drive<S: Service<u64>>(svc: &mut S, calls: u64) -> Duration {
    let mut cx = Context::from_waker(noop_waker());
    let start = Instant::now();
    for i in 0..calls {
        let _ = black_box(call_once(svc, &mut cx, black_box(i)));
    }
    start.elapsed()
}
