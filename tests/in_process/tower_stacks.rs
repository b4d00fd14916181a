//! The breaker inside real tower stacks: timeout, HTTP classification,
//! buffer, load shedding, retry, shared layers, and the open path that never
//! touches the inner service.
//!
//! All timing runs on paused tokio time.

use crate::common;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use http::Response;
use tokio::time::{advance, Instant};
use tower::buffer::Buffer;
use tower::load_shed::error::Overloaded;
use tower::retry::Policy;
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{is_timeout, HttpClassifier};
use tower_circuit_breaker::policy::{
    ConsecutiveFailures, ConsecutiveFailuresFigures, SlowCalls, SlowCallsFigures, TripReason,
};
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, State,
};

use common::{is_inner_failure, is_open, send, Call, Upstream};

fn layer(threshold: u32) -> CircuitBreakerLayer {
    CircuitBreakerLayer::new(
        common::builder(ConsecutiveFailures::new(threshold))
            .build()
            .unwrap(),
    )
}

/// A layer that trips after `threshold` consecutive failures and stays open
/// for a 10 s cooldown.
fn cooling_layer(threshold: u32) -> CircuitBreakerLayer {
    CircuitBreakerLayer::new(
        common::builder(ConsecutiveFailures::new(threshold))
            .cooldown(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

/// A breaker (one failure trips it, 10 s cooldown) over an [`Upstream`] of
/// [`Call`]s, opened by one failed call.
async fn tripped_over_scripted() -> (Breaker, Upstream<Call>, CircuitBreaker<Upstream<Call>>) {
    let layer = cooling_layer(1);
    let breaker = layer.breaker();
    let inner = Upstream::<Call>::default();
    let mut svc = ServiceBuilder::new().layer(layer).service(inner.clone());
    send(&mut svc, Call::Fail).await.unwrap_err();
    (breaker, inner, svc)
}

/// Drives all futures concurrently on this task; their outputs in order.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                if let Poll::Ready(value) = future.as_mut().poll(cx) {
                    *output = Some(value);
                }
            }
        }
        if outputs.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

fn open_error(err: &BoxError) -> &CircuitOpen {
    CircuitOpen::find(err.as_ref()).unwrap_or_else(|| panic!("expected CircuitOpen, got {err}"))
}

// ---------------------------------------------------------------------------
// tower::timeout inside the breaker
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn timeouts_inside_the_breaker_open_it_and_later_calls_fail_fast_without_reaching_the_hang() {
    let layer = layer(3);
    let breaker = layer.breaker();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(5))
        .service(service_fn({
            let calls = Arc::clone(&calls);
            move |_: ()| {
                calls.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<(), BoxError>>()
            }
        }));

    for i in 0..3 {
        assert_eq!(breaker.state(), State::Closed, "before timeout {i}");
        let start = Instant::now();
        let err = send(&mut svc, ()).await.unwrap_err();
        assert!(is_timeout(err.as_ref()), "{err}");
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.snapshot().last_trip,
        Some(TripReason::Policy(
            ConsecutiveFailuresFigures {
                failures: 3,
                threshold: 3
            }
            .into()
        ))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let start = Instant::now();
    for _ in 0..10 {
        let err = send(&mut svc, ()).await.unwrap_err();
        assert!(!is_timeout(err.as_ref()));
        assert_eq!(open_error(&err).state(), State::Open);
    }
    // Refused at once: no timeout paid, the hanging service never called.
    assert_eq!(Instant::now(), start);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(breaker.snapshot().counts.rejected, 10);
}

#[tokio::test(start_paused = true)]
async fn timeout_outside_the_breaker_cancels_calls_before_they_are_recorded() {
    // The wrong order, pinned so the guide's advice stays true: the
    // timeout drops the breaker's response future, which records nothing.
    let layer = layer(3);
    let breaker = layer.breaker();
    let mut svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(5))
        .layer(layer)
        .service(service_fn(|_: ()| {
            std::future::pending::<Result<(), BoxError>>()
        }));
    for _ in 0..10 {
        let err = send(&mut svc, ()).await.unwrap_err();
        assert!(is_timeout(err.as_ref()));
    }
    assert_eq!(breaker.state(), State::Closed);
    let counts = breaker.snapshot().counts;
    assert_eq!(counts.failures, 0);
    assert_eq!(
        (counts.calls, counts.cancelled),
        (10, 10),
        "counted as cancelled: the sign of a timeout on the wrong side"
    );
}

// ---------------------------------------------------------------------------
// HttpClassifier
// ---------------------------------------------------------------------------

/// A request to the fake HTTP upstream: the status to answer with, an
/// optional `Retry-After` value, and an optional delay.
#[derive(Clone, Copy, Debug)]
struct Reply(u16, Option<&'static str>, Duration);

fn reply(status: u16) -> Reply {
    Reply(status, None, Duration::ZERO)
}

fn reply_after(status: u16, retry_after: &'static str) -> Reply {
    Reply(status, Some(retry_after), Duration::ZERO)
}

type HttpFuture = Pin<Box<dyn Future<Output = Result<Response<()>, BoxError>> + Send>>;

/// An HTTP stack: breaker with `HttpClassifier` over an upstream that
/// answers as each request says; returns the service, breaker and call count.
fn http_stack(
    config: Config,
) -> (
    impl Service<Reply, Response = Response<()>, Error = BoxError>,
    tower_circuit_breaker::Breaker,
    Arc<AtomicUsize>,
) {
    let layer = CircuitBreakerLayer::new(config).classify(HttpClassifier::new());
    let breaker = layer.breaker();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = ServiceBuilder::new().layer(layer).service(service_fn(
        move |Reply(status, retry_after, delay)| {
            counter.fetch_add(1, Ordering::SeqCst);
            let fut: HttpFuture = Box::pin(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let mut res = Response::builder().status(status);
                if let Some(value) = retry_after {
                    res = res.header("retry-after", value);
                }
                Ok(res.body(())?)
            });
            fut
        },
    ));
    (svc, breaker, calls)
}

fn http_config(threshold: u32) -> Config {
    common::builder(ConsecutiveFailures::new(threshold))
        .cooldown(Duration::from_secs(30))
        .max_open(Duration::from_secs(300))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn http_400_and_401_never_open_the_breaker_however_many() {
    let (mut svc, breaker, calls) = http_stack(http_config(1));
    for _ in 0..100 {
        for status in [400, 401] {
            let res = send(&mut svc, reply(status)).await.unwrap();
            assert_eq!(res.status().as_u16(), status);
        }
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counts.ignored, 200);
    assert_eq!(snap.counts.failures, 0);
    assert_eq!(snap.counts.opened, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 200);
}

#[tokio::test(start_paused = true)]
async fn http_ignored_responses_neither_reset_nor_extend_a_failure_streak() {
    let (mut svc, breaker, _) = http_stack(http_config(3));
    for status in [500, 500, 400, 401, 404] {
        send(&mut svc, reply(status)).await.unwrap();
    }
    assert_eq!(breaker.state(), State::Closed);
    send(&mut svc, reply(500)).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.snapshot().last_trip,
        Some(TripReason::Policy(
            ConsecutiveFailuresFigures {
                failures: 3,
                threshold: 3
            }
            .into()
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn http_500_503_429_and_408_each_open_the_breaker() {
    for status in [500, 502, 503, 429, 408] {
        let (mut svc, breaker, calls) = http_stack(http_config(3));
        for _ in 0..3 {
            assert_eq!(breaker.state(), State::Closed, "status {status}");
            send(&mut svc, reply(status)).await.unwrap();
        }
        assert_eq!(breaker.state(), State::Open, "status {status}");
        assert_eq!(breaker.snapshot().counts.failures, 3, "status {status}");
        let err = send(&mut svc, reply(200)).await.unwrap_err();
        open_error(&err);
        assert_eq!(calls.load(Ordering::SeqCst), 3, "status {status}");
    }
}

#[tokio::test(start_paused = true)]
async fn http_2xx_and_3xx_are_successes_that_reset_the_streak() {
    let (mut svc, breaker, _) = http_stack(http_config(2));
    for status in [500, 200, 500, 204, 500, 301, 500] {
        send(&mut svc, reply(status)).await.unwrap();
    }
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 4);
}

async fn retry_after_keeps_open_for_its_full_length(status: u16) {
    let (mut svc, breaker, calls) = http_stack(http_config(1));
    send(&mut svc, reply_after(status, "120")).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(120)));
    let err = send(&mut svc, reply(200)).await.unwrap_err();
    assert_eq!(open_error(&err).retry_after(), Duration::from_secs(120));

    // Well past the 30 s cooldown, not yet past the announced 120 s.
    advance(Duration::from_secs(119)).await;
    assert_eq!(breaker.state(), State::Open, "status {status}");
    let err = send(&mut svc, reply(200)).await.unwrap_err();
    assert_eq!(open_error(&err).retry_after(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    advance(Duration::from_secs(1)).await;
    assert_eq!(breaker.state(), State::HalfOpen, "status {status}");
    send(&mut svc, reply(200)).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn http_429_with_retry_after_120_stays_open_120s_despite_30s_cooldown() {
    retry_after_keeps_open_for_its_full_length(429).await;
}

#[tokio::test(start_paused = true)]
async fn http_503_with_retry_after_120_stays_open_120s_despite_30s_cooldown() {
    retry_after_keeps_open_for_its_full_length(503).await;
}

#[tokio::test(start_paused = true)]
async fn http_retry_after_beyond_max_open_is_capped_at_max_open() {
    let (mut svc, breaker, _) = http_stack(http_config(1));
    send(&mut svc, reply_after(429, "100000")).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(300)));
    advance(Duration::from_secs(299)).await;
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_secs(2)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn http_retry_after_shorter_than_cooldown_does_not_shorten_the_open_period() {
    let (mut svc, breaker, _) = http_stack(http_config(1));
    send(&mut svc, reply_after(503, "5")).await.unwrap();
    advance(Duration::from_secs(29)).await;
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_secs(1)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn http_retry_after_on_a_500_is_a_hint() {
    // Every failing status carries the wait its server asks for, as the
    // classifier documents: a 500 with `Retry-After: 120` too.
    let (mut svc, breaker, _) = http_stack(http_config(1));
    send(&mut svc, reply_after(500, "120")).await.unwrap();
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(120)));
    advance(Duration::from_secs(30)).await;
    assert_eq!(breaker.state(), State::Open, "held past the cooldown");
    advance(Duration::from_secs(90)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn http_slow_400s_count_neither_as_calls_nor_as_slow_calls() {
    let config = common::builder(
        SlowCalls::new(Duration::from_secs(1))
            .rate(0.5)
            .over_calls(10)
            .min_calls(2),
    )
    .build()
    .unwrap();
    let (mut svc, breaker, _) = http_stack(config);
    for _ in 0..10 {
        send(&mut svc, Reply(400, None, Duration::from_secs(5)))
            .await
            .unwrap();
    }
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.ignored, 10);
    assert_eq!(
        breaker.snapshot().policy,
        tower_circuit_breaker::policy::PolicyFigures::SlowCalls(SlowCallsFigures {
            calls: 0,
            slow: 0
        })
    );
    // A slow 200 is slow: with a fast one it reaches one half.
    send(&mut svc, Reply(200, None, Duration::from_secs(5)))
        .await
        .unwrap();
    send(&mut svc, reply(200)).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
}

// ---------------------------------------------------------------------------
// tower::buffer around the breaker
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn buffer_around_breaker_reports_circuit_open_then_serves_again_after_close() {
    let layer = cooling_layer(2);
    let breaker = layer.breaker();
    let healthy = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new().layer(layer).service(service_fn({
        let (healthy, calls) = (Arc::clone(&healthy), Arc::clone(&calls));
        move |n: u32| {
            calls.fetch_add(1, Ordering::SeqCst);
            let up = healthy.load(Ordering::SeqCst);
            async move {
                if up {
                    Ok(n * 2)
                } else {
                    Err(BoxError::from(common::InnerFailure))
                }
            }
        }
    }));
    let mut buffered = Buffer::new(svc, 8);

    for n in 0..2 {
        let err = send(&mut buffered, n).await.unwrap_err();
        assert!(is_inner_failure(&err), "{err}");
    }
    assert_eq!(breaker.state(), State::Open);

    for n in 0..5 {
        let svc = buffered.ready().await.expect("buffer must stay ready");
        let err = svc.call(n).await.unwrap_err();
        assert_eq!(open_error(&err).state(), State::Open);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    advance(Duration::from_secs(10)).await;
    healthy.store(true, Ordering::SeqCst);
    assert_eq!(send(&mut buffered, 21).await.unwrap(), 42);
    assert_eq!(breaker.state(), State::Closed);

    // The same buffer keeps serving: its worker was never poisoned.
    for n in 0..20 {
        assert_eq!(send(&mut buffered, n).await.unwrap(), n * 2);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2 + 1 + 20);
}

#[tokio::test(start_paused = true)]
async fn buffer_clones_share_the_breaker_and_all_see_circuit_open() {
    let layer = layer(1);
    let breaker = layer.breaker();
    let inner = Upstream::<Call>::default();
    let buffered = Buffer::new(ServiceBuilder::new().layer(layer).service(inner.clone()), 8);

    let err = buffered.clone().oneshot(Call::Fail).await.unwrap_err();
    assert!(is_inner_failure(&err));
    assert_eq!(breaker.state(), State::Open);

    // Ten callers at once, each through its own clone of the buffer.
    let calls = (0..10).map(|_| buffered.clone().oneshot(Call::Ok));
    let results = std::pin::pin!(join_all(calls)).await;
    for result in results {
        let err = result.unwrap_err();
        assert!(is_open(&err), "{err}");
    }
    assert_eq!(inner.calls(), 1);
    assert_eq!(breaker.snapshot().counts.rejected, 10);
}

// ---------------------------------------------------------------------------
// tower::load_shed outside the breaker
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn load_shed_outside_open_breaker_gets_circuit_open_not_overloaded() {
    let layer = layer(2);
    let breaker = layer.breaker();
    let inner = Upstream::<Call>::default();
    let mut svc = ServiceBuilder::new()
        .load_shed()
        .layer(layer)
        .service(inner.clone());

    assert!(send(&mut svc, Call::Ok).await.is_ok());
    for _ in 0..2 {
        let err = send(&mut svc, Call::Fail).await.unwrap_err();
        assert!(is_inner_failure(&err));
    }
    assert_eq!(breaker.state(), State::Open);

    // Even with an inner service that is not ready, an open breaker is
    // ready at once (fail-fast), so the call meets CircuitOpen.
    inner.set_ready(false);
    let polls = inner.polls();
    for _ in 0..5 {
        let err = send(&mut svc, Call::Ok).await.unwrap_err();
        assert!(err.downcast_ref::<Overloaded>().is_none(), "{err}");
        assert!(is_open(&err), "{err}");
    }
    assert_eq!(inner.polls(), polls);
    assert_eq!(inner.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn load_shed_outside_closed_breaker_sheds_when_inner_is_not_ready() {
    let layer = layer(2);
    let breaker = layer.breaker();
    let inner = Upstream::<Call>::default();
    let mut svc = ServiceBuilder::new()
        .load_shed()
        .layer(layer)
        .service(inner.clone());

    inner.set_ready(false);
    let err = send(&mut svc, Call::Ok).await.unwrap_err();
    assert!(err.downcast_ref::<Overloaded>().is_some(), "{err}");
    assert!(!is_open(&err));
    assert_eq!(inner.calls(), 0);
    // Shedding is not a failure of the dependency.
    assert_eq!(breaker.snapshot().counts.failures, 0);

    inner.set_ready(true);
    assert!(send(&mut svc, Call::Ok).await.is_ok());
    assert_eq!(breaker.state(), State::Closed);
}

// ---------------------------------------------------------------------------
// tower::retry
// ---------------------------------------------------------------------------

/// Retries failures up to `budget` times. A `CircuitOpen` is never retried
/// before its `retry_after`: either given up on at once, or (with
/// `wait_for_open`) retried only after sleeping for its `retry_after`.
#[derive(Clone)]
struct RetryFailures {
    budget: usize,
    wait_for_open: bool,
    open_errors_seen: Arc<AtomicUsize>,
}

impl RetryFailures {
    fn new(budget: usize, wait_for_open: bool) -> Self {
        RetryFailures {
            budget,
            wait_for_open,
            open_errors_seen: Arc::default(),
        }
    }
}

impl<Req: Clone, Res> Policy<Req, Res, BoxError> for RetryFailures {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        _req: &mut Req,
        result: &mut Result<Res, BoxError>,
    ) -> Option<Self::Future> {
        let err = result.as_ref().err()?;
        let open = CircuitOpen::find(err.as_ref()).map(CircuitOpen::retry_after);
        if open.is_some() {
            self.open_errors_seen.fetch_add(1, Ordering::SeqCst);
        }
        if self.budget == 0 {
            return None;
        }
        match open {
            Some(_) if !self.wait_for_open => None,
            Some(retry_after) => {
                self.budget -= 1;
                Some(Box::pin(tokio::time::sleep(retry_after)))
            }
            None => {
                self.budget -= 1;
                Some(Box::pin(std::future::ready(())))
            }
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn retry_outside_the_breaker_does_not_retry_an_open_error() {
    let layer = layer(3);
    let breaker = layer.breaker();
    let inner = Upstream::<Call>::default();
    let policy = RetryFailures::new(10, false);
    let open_errors = Arc::clone(&policy.open_errors_seen);
    let mut svc = ServiceBuilder::new()
        .retry(policy)
        .layer(layer)
        .service(inner.clone());

    let start = Instant::now();
    // Three failed attempts open the breaker; the fourth meets CircuitOpen
    // and the policy gives up instead of hammering it.
    let err = send(&mut svc, Call::Fail).await.unwrap_err();
    assert!(is_open(&err), "{err}");
    assert_eq!(inner.calls(), 3);
    assert_eq!(open_errors.load(Ordering::SeqCst), 1);
    assert_eq!(breaker.state(), State::Open);

    let err = send(&mut svc, Call::Ok).await.unwrap_err();
    assert!(is_open(&err), "{err}");
    assert_eq!(inner.calls(), 3);
    assert_eq!(open_errors.load(Ordering::SeqCst), 2);
    assert_eq!(breaker.snapshot().counts.rejected, 2);
    assert_eq!(Instant::now(), start);
}

#[tokio::test(start_paused = true)]
async fn retry_outside_the_breaker_waits_out_retry_after_then_its_probe_closes_it() {
    let layer = cooling_layer(3);
    let breaker = layer.breaker();
    let times = Arc::new(Mutex::new(Vec::new()));
    let policy = RetryFailures::new(10, true);
    let open_errors = Arc::clone(&policy.open_errors_seen);
    // Fails its first three calls, then answers.
    let mut svc = ServiceBuilder::new()
        .retry(policy)
        .layer(layer)
        .service(service_fn({
            let times = Arc::clone(&times);
            move |_: ()| {
                let mut times = times.lock().unwrap();
                times.push(Instant::now());
                let fail = times.len() <= 3;
                async move {
                    if fail {
                        Err(BoxError::from(common::InnerFailure))
                    } else {
                        Ok("answer")
                    }
                }
            }
        }));

    let start = Instant::now();
    let answer = send(&mut svc, ()).await.unwrap();
    assert_eq!(answer, "answer");
    assert_eq!(open_errors.load(Ordering::SeqCst), 1);
    let times = times.lock().unwrap().clone();
    assert_eq!(times.len(), 4, "three failures and one probe");
    assert!(times[..3].iter().all(|t| *t == start));
    // The retry after CircuitOpen waited for its retry_after.
    assert!(times[3] >= start + Duration::from_secs(10), "{times:?}");
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.probes, 1);
}

#[tokio::test(start_paused = true)]
async fn retry_inside_the_breaker_counts_one_failure_per_exhausted_call() {
    let layer = layer(2);
    let breaker = layer.breaker();
    let inner = Upstream::<Call>::default();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .retry(RetryFailures::new(2, false))
        .service(inner.clone());

    let err = send(&mut svc, Call::Fail).await.unwrap_err();
    assert!(is_inner_failure(&err));
    assert_eq!(inner.calls(), 3);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 1);

    send(&mut svc, Call::Fail).await.unwrap_err();
    assert_eq!(inner.calls(), 6);
    assert_eq!(breaker.state(), State::Open);

    // Open: refused before the retry layer, so nothing is retried.
    let err = send(&mut svc, Call::Fail).await.unwrap_err();
    assert!(is_open(&err), "{err}");
    assert_eq!(inner.calls(), 6);
}

#[tokio::test(start_paused = true)]
async fn retry_inside_the_breaker_hides_failures_it_recovered_from() {
    let layer = layer(1);
    let breaker = layer.breaker();
    let calls = Arc::new(AtomicUsize::new(0));
    // Every other call fails.
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .retry(RetryFailures::new(1, false))
        .service(service_fn({
            let calls = Arc::clone(&calls);
            move |_: ()| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n % 2 == 0 {
                        Err(BoxError::from(common::InnerFailure))
                    } else {
                        Ok(())
                    }
                }
            }
        }));
    for _ in 0..10 {
        send(&mut svc, ()).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 20);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 0);
}

// ---------------------------------------------------------------------------
// One layer, one breaker
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn two_services_wrapped_by_one_layer_share_one_breaker() {
    let builder = ServiceBuilder::new().layer(layer(3));
    let (inner_a, inner_b) = (Upstream::<Call>::default(), Upstream::<Call>::default());
    let mut a = builder.service(inner_a.clone());
    let mut b = builder.service(inner_b.clone());
    assert!(a.breaker().ptr_eq(&b.breaker()));

    for _ in 0..3 {
        let err = send(&mut a, Call::Fail).await.unwrap_err();
        assert!(is_inner_failure(&err));
    }
    assert_eq!(b.breaker().state(), State::Open);
    assert_eq!(
        b.breaker().snapshot().last_trip,
        Some(TripReason::Policy(
            ConsecutiveFailuresFigures {
                failures: 3,
                threshold: 3
            }
            .into()
        ))
    );

    let err = send(&mut b, Call::Ok).await.unwrap_err();
    assert_eq!(open_error(&err).breaker(), "test");
    assert_eq!(inner_b.calls(), 0);
    assert_eq!(inner_b.polls(), 0);
    assert_eq!(inner_a.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn failures_split_across_two_services_of_one_layer_add_up() {
    let layer = layer(4);
    let breaker = layer.breaker();
    let mut a = ServiceBuilder::new()
        .layer(layer.clone())
        .service(Upstream::<Call>::default());
    let mut b = ServiceBuilder::new()
        .layer(layer)
        .service(Upstream::<Call>::default());
    for _ in 0..2 {
        send(&mut a, Call::Fail).await.unwrap_err();
        send(&mut b, Call::Fail).await.unwrap_err();
    }
    assert_eq!(breaker.state(), State::Open);
    assert!(is_open(&send(&mut a, Call::Ok).await.unwrap_err()));
}

// ---------------------------------------------------------------------------
// The open path never touches the inner service
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn open_breaker_neither_polls_nor_calls_the_inner_service() {
    let (breaker, inner, mut svc) = tripped_over_scripted().await;
    assert_eq!(breaker.state(), State::Open);
    let (polls, calls) = (inner.polls(), inner.calls());
    assert_eq!((polls, calls), (1, 1));

    for _ in 0..50 {
        // Ready at once, without an error: tower must not discard us.
        let ready = poll_fn(|cx| Poll::Ready(svc.poll_ready(cx))).await;
        assert!(matches!(ready, Poll::Ready(Ok(()))));
        let err = svc.call(Call::Ok).await.unwrap_err();
        assert!(is_open(&err));
    }
    assert_eq!(inner.polls(), polls);
    assert_eq!(inner.calls(), calls);
    assert_eq!(breaker.snapshot().counts.rejected, 50);

    // Once half-open, the probe does go through to the inner service.
    advance(Duration::from_secs(10)).await;
    send(&mut svc, Call::Ok).await.unwrap();
    assert_eq!(inner.polls(), polls + 1);
    assert_eq!(inner.calls(), calls + 1);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_breaker_with_its_probe_in_flight_refuses_others_without_polling_inner() {
    let (breaker, inner, mut svc) = tripped_over_scripted().await;
    advance(Duration::from_secs(10)).await;

    let probe = tokio::spawn(svc.clone().oneshot(Call::SlowOk(Duration::from_secs(5))));
    tokio::task::yield_now().await;
    assert_eq!(inner.calls(), 2);
    assert_eq!(breaker.snapshot().probes_in_flight, 1);

    let (polls, calls) = (inner.polls(), inner.calls());
    for _ in 0..5 {
        let err = send(&mut svc, Call::Ok).await.unwrap_err();
        assert_eq!(open_error(&err).state(), State::HalfOpen);
    }
    assert_eq!((inner.polls(), inner.calls()), (polls, calls));

    probe.await.unwrap().unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

/// While a probe is in flight, the others are told to come back after the
/// open period that just ended (200 ms here), not after the probe timeout's
/// worst case (60 s): a gateway would otherwise send its users away for a
/// minute with `Retry-After: 60`.
#[tokio::test(start_paused = true)]
async fn half_open_refusals_advertise_the_open_period_not_the_probe_timeout() {
    let layer = CircuitBreakerLayer::new(
        common::builder(ConsecutiveFailures::new(1))
            .cooldown(Duration::from_millis(200))
            .probe_timeout(Some(Duration::from_secs(60)))
            .build()
            .unwrap(),
    );
    let breaker = layer.breaker();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(Upstream::<Call>::default());
    send(&mut svc, Call::Fail).await.unwrap_err();
    advance(Duration::from_millis(200)).await;

    let probe = tokio::spawn(
        svc.clone()
            .oneshot(Call::SlowOk(Duration::from_millis(300))),
    );
    tokio::task::yield_now().await;
    assert_eq!(breaker.snapshot().probes_in_flight, 1);

    let err = send(&mut svc, Call::Ok).await.unwrap_err();
    let open = open_error(&err);
    assert_eq!(open.state(), State::HalfOpen);
    assert_eq!(open.retry_after(), Duration::from_millis(200));
    let response: http::Response<String> = open.to_http_response();
    assert_eq!(response.headers()["retry-after"], "1");

    // Later in the probe's flight, still never more than the open period.
    advance(Duration::from_millis(250)).await;
    let err = send(&mut svc, Call::Ok).await.unwrap_err();
    assert_eq!(open_error(&err).retry_after(), Duration::from_millis(200));

    probe.await.unwrap().unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

// ---------------------------------------------------------------------------
// tower's readiness contract toward the inner service
// ---------------------------------------------------------------------------

/// A breaker readied while open promised a refusal without polling its inner
/// service. If another clone then probes and closes the breaker before this
/// one calls, `call` must still not call the inner service: it was never
/// polled ready, and tower services such as `ConcurrencyLimit` and `Buffer`
/// panic (or misbehave) when called without a successful `poll_ready`.
#[tokio::test(start_paused = true)]
async fn call_after_open_readiness_never_calls_an_unpolled_inner_even_if_the_breaker_closed_meanwhile(
) {
    let layer = cooling_layer(1);
    let breaker = layer.breaker();
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = service_fn({
        let calls = Arc::clone(&calls);
        move |fail: bool| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if fail {
                    Err(BoxError::from(common::InnerFailure))
                } else {
                    Ok(())
                }
            }
        }
    });
    let builder = ServiceBuilder::new().layer(layer).concurrency_limit(1);
    let mut a = builder.service(inner.clone());
    let mut b = builder.service(inner);

    send(&mut a, true).await.unwrap_err();
    assert_eq!(breaker.state(), State::Open);

    // b is readied while open: ready at once, its inner limit not polled.
    let ready = poll_fn(|cx| Poll::Ready(b.poll_ready(cx))).await;
    assert!(matches!(ready, Poll::Ready(Ok(()))));

    // Meanwhile a probes and closes the breaker.
    advance(Duration::from_secs(10)).await;
    send(&mut a, false).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // b's call must not reach its unpolled inner service (today it does,
    // and ConcurrencyLimit panics: "poll_ready must be called first").
    let outcome = tokio::spawn(async move {
        let result = b.call(false).await;
        (b, result)
    })
    .await;
    let (mut b, result) = match outcome {
        Ok(pair) => pair,
        Err(join) => panic!("calling the breaker panicked in its inner service: {join}"),
    };
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let err = result.expect_err("the refusal promised at poll_ready");
    assert!(is_open(&err), "{err}");

    // The next ready/call pair goes through normally.
    send(&mut b, false).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn http_failed_probe_with_retry_after_keeps_the_reopened_breaker_open_that_long() {
    let (mut svc, breaker, _) = http_stack(http_config(1));
    send(&mut svc, reply(500)).await.unwrap();
    advance(Duration::from_secs(30)).await;
    assert_eq!(breaker.state(), State::HalfOpen);

    // The probe meets a 503 announcing 200 s: longer than the 60 s backoff.
    send(&mut svc, reply_after(503, "200")).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.snapshot().last_trip, Some(TripReason::ProbeFailed));
    advance(Duration::from_secs(199)).await;
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_secs(1)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn trip_on_pushback_opens_on_the_first_announced_retry_after() {
    let breaker = Breaker::new(
        Config::builder()
            .trip(ConsecutiveFailures::new(5))
            .trip_on_pushback(true)
            .build()
            .unwrap(),
    );
    let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(HttpClassifier::new())
        .layer(tower::service_fn(|status: u16| async move {
            let mut response = http::Response::new(());
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            if status == 429 {
                response
                    .headers_mut()
                    .insert("retry-after", http::HeaderValue::from_static("60"));
            }
            Ok::<_, BoxError>(response)
        }));
    // A plain 500 counts toward the threshold only.
    svc.clone().oneshot(500).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    // A 429 that says when to come back opens it at once, for that long.
    svc.clone().oneshot(429).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(
        breaker.snapshot().last_trip,
        Some(TripReason::Pushback {
            retry_after: Duration::from_secs(60)
        })
    );
}

#[tokio::test(start_paused = true)]
async fn without_trip_on_pushback_a_retry_after_only_lengthens_the_next_open_period() {
    let breaker = Breaker::new(
        Config::builder()
            .trip(ConsecutiveFailures::new(5))
            .build()
            .unwrap(),
    );
    let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(HttpClassifier::new())
        .layer(tower::service_fn(|_: u16| async move {
            let mut response = http::Response::new(());
            *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
            response
                .headers_mut()
                .insert("retry-after", http::HeaderValue::from_static("60"));
            Ok::<_, BoxError>(response)
        }));
    svc.clone().oneshot(429).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
}
