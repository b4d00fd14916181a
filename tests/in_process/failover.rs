//! The failover chain: skips, fallbacks, ignored outcomes, the exhausted
//! error, the attempt bound, the last resort, cancellation and its logs.
//!
//! All timing runs on paused tokio time.

use http::StatusCode;
use tokio::time::advance;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::failover::Reason;
use tower_circuit_breaker::State;

use crate::common::failover as failover_common;
use failover_common::*;

#[tokio::test(start_paused = true)]
async fn skips_an_open_candidate_without_calling_it() {
    let primary = Upstream::new("primary", OK, 1, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 30 * SECOND);
    primary.trip().await;
    let calls_before = primary.calls();

    let mut failover = chain(&[&primary, &secondary]);
    for _ in 0..3 {
        let reply = failover.ready().await.unwrap().call("hi").await.unwrap();
        assert_eq!(*reply.body(), "secondary");
    }
    assert_eq!(
        primary.calls(),
        calls_before,
        "an open candidate is never called"
    );
    assert_eq!(
        primary.breaker.snapshot().counts.rejected,
        0,
        "nor even refused"
    );
    assert_eq!(secondary.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn moves_on_after_a_failure() {
    let primary = Upstream::new("primary", Act::Status(503), 5, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 5, 30 * SECOND);

    let reply = chain(&[&primary, &secondary]).oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary");
    assert_eq!((primary.calls(), secondary.calls()), (1, 1));
    // The breaker recorded the failure too; one is not enough to open it.
    assert_eq!(primary.breaker.snapshot().counts.failures, 1);
    assert_eq!(primary.breaker.state(), State::Closed);

    primary.set(Act::Error);
    let reply = chain(&[&primary, &secondary]).oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary", "errors move on too");
}

#[tokio::test(start_paused = true)]
async fn returns_an_ignored_outcome_without_moving_on() {
    let primary = Upstream::new("primary", Act::Status(400), 1, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 30 * SECOND);

    let reply = chain(&[&primary, &secondary]).oneshot("bad").await.unwrap();
    assert_eq!(reply.status(), StatusCode::BAD_REQUEST);
    assert_eq!(*reply.body(), "primary");
    assert_eq!(secondary.calls(), 0, "a bad request is bad everywhere");
    assert_eq!(primary.breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn exhausted_chain_carries_each_reason_and_the_smallest_retry_after() {
    let slow = Upstream::new("slow-to-recover", OK, 1, 30 * SECOND);
    let soon = Upstream::new("soon-to-recover", OK, 1, 10 * SECOND);
    let failing = Upstream::new("failing", Act::Error, 5, 30 * SECOND);
    slow.trip().await;
    soon.trip().await;
    advance(2 * SECOND).await;

    let err = chain(&[&slow, &soon, &failing])
        .oneshot("hi")
        .await
        .unwrap_err();
    let exhausted = exhausted(&err);
    let reasons: Vec<_> = exhausted.candidates().iter().map(|c| c.reason()).collect();
    assert!(matches!(
        reasons[0],
        Reason::Open { state: State::Open, retry_after: Some(d), .. } if *d == 28 * SECOND
    ));
    assert!(matches!(
        reasons[1],
        Reason::Open { state: State::Open, retry_after: Some(d), .. } if *d == 8 * SECOND
    ));
    assert!(
        matches!(reasons[2], Reason::Failed { error: Some(e), .. } if e.to_string() == "failing is down")
    );
    assert_eq!(exhausted.retry_after(), Some(8 * SECOND));

    let names: Vec<_> = exhausted.candidates().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["slow-to-recover", "soon-to-recover", "failing"]);
    let indices: Vec<_> = exhausted.candidates().iter().map(|c| c.index()).collect();
    assert_eq!(indices, [0, 1, 2]);
    let text = exhausted.to_string();
    assert!(
        text.contains("#1 `soon-to-recover` open, retry after 8000 ms"),
        "{text}"
    );
    assert!(
        text.contains("#2 `failing` failed: failing is down"),
        "{text}"
    );
    // The last failure is the error's source.
    let source = std::error::Error::source(exhausted).map(|e| e.to_string());
    assert_eq!(source.as_deref(), Some("failing is down"));
    assert_eq!((slow.calls(), soon.calls(), failing.calls()), (1, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_failed_response_is_reported_without_its_body() {
    let only = Upstream::new("only", Act::Status(503), 5, 30 * SECOND);
    let err = chain(&[&only]).oneshot("hi").await.unwrap_err();
    let exhausted = exhausted(&err);
    assert!(matches!(
        exhausted.candidates()[0].reason(),
        Reason::Failed { error: None, .. }
    ));
    assert_eq!(exhausted.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn attempt_bound_is_respected() {
    let upstreams: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|name| Upstream::new(name, Act::Error, 5, 30 * SECOND))
        .collect();
    let refs: Vec<&Upstream> = upstreams.iter().collect();

    let err = chain(&refs)
        .max_attempts(2)
        .oneshot("hi")
        .await
        .unwrap_err();
    let calls: Vec<_> = upstreams.iter().map(Upstream::calls).collect();
    assert_eq!(calls, [1, 1, 0]);
    let reasons = exhausted(&err).candidates();
    assert!(matches!(reasons[0].reason(), Reason::Failed { .. }));
    assert!(matches!(reasons[1].reason(), Reason::Failed { .. }));
    assert!(matches!(reasons[2].reason(), Reason::NotTried));

    // The default bound is one call per candidate.
    let _ = chain(&refs).oneshot("hi").await.unwrap_err();
    let calls: Vec<_> = upstreams.iter().map(Upstream::calls).collect();
    assert_eq!(calls, [2, 2, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_costs_no_attempt() {
    // Half-open with its one probe in flight: the breaker refuses the call
    // with `CircuitOpen`; the failover moves on, even with one attempt.
    let primary = Upstream::new("primary", Act::Hang, 1, 5 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 5 * SECOND);
    primary.trip().await;
    advance(5 * SECOND).await;
    assert_eq!(primary.breaker.state(), State::HalfOpen);

    let failover = chain(&[&primary, &secondary]).max_attempts(1);
    let probe = tokio::spawn(failover.clone().oneshot("probe"));
    tokio::task::yield_now().await;
    assert_eq!(primary.breaker.snapshot().probes_in_flight, 1);

    let reply = failover.clone().oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary");
    assert_eq!(
        primary.calls(),
        2,
        "the trip and the probe, not this request"
    );
    assert_eq!(primary.breaker.snapshot().counts.rejected, 1);
    probe.abort();
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_attempt_reopens_its_candidate_for_the_same_period() {
    let primary = Upstream::new("primary", Act::Hang, 1, 5 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 5 * SECOND);
    primary.trip().await;
    advance(5 * SECOND).await;

    let failover = chain(&[&primary, &secondary]);
    let probe = tokio::spawn(failover.clone().oneshot("probe"));
    tokio::task::yield_now().await;
    assert_eq!(primary.breaker.snapshot().probes_in_flight, 1);
    probe.abort();
    let _ = probe.await;
    assert_eq!(primary.breaker.snapshot().probes_in_flight, 0);
    // No evidence either way: open again for the same 5 s, so the next
    // request goes on to the secondary rather than probe at once.
    assert_eq!(primary.breaker.state(), State::Open);
    primary.set(OK);
    let reply = failover.clone().oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary");

    // After it, a request probes the primary again, and closes it.
    advance(5 * SECOND).await;
    let reply = failover.oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "primary");
    assert_eq!(primary.breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn last_resort_calls_the_soonest_to_recover_candidate_only_when_enabled() {
    let later = Upstream::new("later", OK, 1, 20 * SECOND);
    let sooner = Upstream::new("sooner", OK, 1, 5 * SECOND);
    later.trip().await;
    sooner.trip().await;
    let (later_before, sooner_before) = (later.calls(), sooner.calls());

    // Off by default: nothing is called.
    let err = chain(&[&later, &sooner]).oneshot("hi").await.unwrap_err();
    assert_eq!(exhausted(&err).retry_after(), Some(5 * SECOND));
    assert_eq!(
        (later.calls(), sooner.calls()),
        (later_before, sooner_before)
    );

    // On: the one that recovers soonest is called, around its breaker.
    let failover = chain(&[&later, &sooner]).last_resort(true);
    let reply = failover.clone().oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "sooner");
    assert_eq!(
        (later.calls(), sooner.calls()),
        (later_before, sooner_before + 1)
    );
    assert_eq!(
        sooner.breaker.state(),
        State::Open,
        "its breaker saw nothing"
    );
    assert_eq!(sooner.breaker.retry_after(), Some(5 * SECOND));

    // Only when every candidate is open: here one failed, so no last resort.
    let failing = Upstream::new("failing", Act::Error, 5, 20 * SECOND);
    let err = chain(&[&later, &failing, &sooner])
        .last_resort(true)
        .oneshot("hi")
        .await
        .unwrap_err();
    assert_eq!(exhausted(&err).candidates().len(), 3);
    assert_eq!(sooner.calls(), sooner_before + 1);

    // An operator's isolation has no end: never a last resort.
    sooner.breaker.force_open(None);
    let err = failover.clone().oneshot("hi").await;
    assert_eq!(*err.unwrap().body(), "later");
}

#[tokio::test(start_paused = true)]
async fn a_shadow_breaker_is_called_while_it_reads_open() {
    let primary = Upstream::new("primary", OK, 1, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 30 * SECOND);
    primary.breaker.set_shadow(true);
    primary.trip().await;

    let reply = chain(&[&primary, &secondary]).oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "primary", "shadow mode never refuses");
}

/// An upstream whose readiness a test holds back, then releases. Not the
/// shared `common::Upstream`: it answers its own name, so the chain's reply
/// says which candidate answered.
#[derive(Clone)]
struct HeldBack {
    name: &'static str,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    waker: std::sync::Arc<std::sync::Mutex<Option<std::task::Waker>>>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl HeldBack {
    fn new(name: &'static str) -> Self {
        HeldBack {
            name,
            ready: Default::default(),
            waker: Default::default(),
            calls: Default::default(),
        }
    }

    fn release(&self) {
        self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(waker) = self.waker.lock().unwrap().take() {
            waker.wake();
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl tower::Service<&'static str> for HeldBack {
    type Response = &'static str;
    type Error = tower::BoxError;
    type Future = std::future::Ready<Result<&'static str, tower::BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), tower::BoxError>> {
        if self.ready.load(std::sync::atomic::Ordering::SeqCst) {
            return std::task::Poll::Ready(Ok(()));
        }
        *self.waker.lock().unwrap() = Some(cx.waker().clone());
        std::task::Poll::Pending
    }

    fn call(&mut self, _: &'static str) -> Self::Future {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(Ok(self.name))
    }
}

fn breaker_named(
    name: &'static str,
    max_open: std::time::Duration,
) -> tower_circuit_breaker::Breaker {
    tower_circuit_breaker::Breaker::new(
        tower_circuit_breaker::Config::builder()
            .name(name)
            .cooldown(max_open)
            .max_open(max_open)
            .build()
            .unwrap(),
    )
}

type HeldChain = tower_circuit_breaker::Failover<
    tower_circuit_breaker::CircuitBreaker<
        tower::util::BoxCloneService<&'static str, &'static str, tower::BoxError>,
    >,
>;

fn held_chain(candidates: &[(&HeldBack, &tower_circuit_breaker::Breaker)]) -> HeldChain {
    tower_circuit_breaker::Failover::new(candidates.iter().map(|(upstream, breaker)| {
        tower_circuit_breaker::CircuitBreaker::new(
            tower::util::BoxCloneService::new((*upstream).clone()),
            breaker,
        )
    }))
    .last_resort(true)
}

/// Isolated by an operator between the chain's look at its state and its
/// admission, a candidate refuses as "forced open"; the last resort must
/// not take that refusal for an ordinary open one and call it.
#[tokio::test(start_paused = true)]
async fn last_resort_never_calls_a_candidate_isolated_while_the_chain_waited_for_it() {
    let isolated = HeldBack::new("isolated");
    let open = HeldBack::new("open");
    open.release();
    // The soonest to recover on paper: its `max_open` is 5 s.
    let isolated_breaker = breaker_named("isolated", 5 * SECOND);
    let open_breaker = breaker_named("open", 30 * SECOND);
    open_breaker.force_open(Some(30 * SECOND));

    let chain = held_chain(&[(&isolated, &isolated_breaker), (&open, &open_breaker)]);
    let mut answer = std::pin::pin!(chain.oneshot("hi"));
    // Closed when the chain looks: it waits for the upstream's readiness.
    assert!(futures_poll(answer.as_mut()).is_pending());
    isolated_breaker.force_open(None);
    isolated.release();

    let reply = answer.await.unwrap();
    assert_eq!(reply, "open", "the last resort is the ordinary open one");
    assert_eq!(
        isolated.calls(),
        0,
        "a forced-open candidate is never called"
    );
}

/// Isolated while the last resort waits for its readiness: not called.
#[tokio::test(start_paused = true)]
async fn last_resort_never_calls_a_candidate_isolated_while_it_waited_to_be_ready() {
    let sooner = HeldBack::new("sooner");
    let later = HeldBack::new("later");
    let sooner_breaker = breaker_named("sooner", 5 * SECOND);
    let later_breaker = breaker_named("later", 30 * SECOND);
    sooner_breaker.force_open(Some(5 * SECOND));
    later_breaker.force_open(Some(30 * SECOND));

    let chain = held_chain(&[(&sooner, &sooner_breaker), (&later, &later_breaker)]);
    let mut answer = std::pin::pin!(chain.oneshot("hi"));
    assert!(futures_poll(answer.as_mut()).is_pending());
    sooner_breaker.force_open(None);
    sooner.release();

    let err = answer.await.unwrap_err();
    assert_eq!(exhausted(&err).candidates().len(), 2);
    assert_eq!(sooner.calls(), 0, "a forced-open candidate is never called");
}

/// Polls `future` once with a waker that does nothing.
fn futures_poll<F: std::future::Future>(
    future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}
