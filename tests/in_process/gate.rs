//! Gate readiness: an open breaker is not ready, and wakes its waiters
//! exactly when a probe becomes possible or the breaker changes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::common;

use tokio::time::advance;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, Readiness, State,
};

use common::{counting_waker, send, wakes, Upstream};

fn config() -> Config {
    Config::builder()
        .name("gated")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn gated(breaker: &Breaker, upstream: &Upstream) -> CircuitBreaker<Upstream> {
    CircuitBreaker::new(upstream.clone(), breaker).readiness(Readiness::Gate)
}

async fn trip(svc: &mut CircuitBreaker<Upstream>, upstream: &Upstream) {
    upstream.fail();
    assert!(send(svc, 0).await.is_err());
    upstream.recover();
}

/// A gated breaker over a fresh upstream, opened by one failed call.
async fn tripped_gate() -> (Breaker, Upstream, CircuitBreaker<Upstream>) {
    let breaker = Breaker::new(config());
    let upstream = Upstream::default();
    let mut svc = gated(&breaker, &upstream);
    trip(&mut svc, &upstream).await;
    (breaker, upstream, svc)
}

/// A gating layer, its breaker, and a fresh upstream to wrap.
fn gate_layer() -> (CircuitBreakerLayer, Breaker, Upstream) {
    let layer = CircuitBreakerLayer::new(config()).readiness(Readiness::Gate);
    let breaker = layer.breaker();
    (layer, breaker, Upstream::default())
}

#[tokio::test(start_paused = true)]
async fn open_gate_is_pending_without_polling_the_inner_service() {
    let (breaker, upstream, mut svc) = tripped_gate().await;
    assert_eq!(breaker.state(), State::Open);

    let polls = upstream.polls();
    let (_, waker) = counting_waker();
    for _ in 0..5 {
        assert!(svc
            .poll_ready(&mut Context::from_waker(&waker))
            .is_pending());
    }
    assert_eq!(upstream.polls(), polls);
}

#[tokio::test(start_paused = true)]
async fn gate_waiter_is_woken_exactly_when_the_open_period_ends() {
    let (breaker, _, mut svc) = tripped_gate().await;

    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(svc.poll_ready(&mut cx).is_pending());
    advance(Duration::from_millis(9_999)).await;
    assert_eq!(wakes(&counter), 0, "no wake-up before the period ends");
    advance(Duration::from_millis(1)).await;
    assert_eq!(wakes(&counter), 1, "one wake-up when it ends");

    assert!(
        svc.poll_ready(&mut cx).is_ready(),
        "ready with a probe permit"
    );
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    assert_eq!(
        svc.call(5).await.unwrap(),
        5,
        "a reserved permit is never refused"
    );
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn ten_clones_in_half_open_one_ready_nine_woken_when_the_probe_ends() {
    let (breaker, _, svc) = tripped_gate().await;
    advance(Duration::from_secs(10)).await;

    let mut clones: Vec<_> = (0..10).map(|_| (svc.clone(), counting_waker())).collect();
    let ready: Vec<bool> = clones
        .iter_mut()
        .map(|(svc, (_, waker))| svc.poll_ready(&mut Context::from_waker(waker)).is_ready())
        .collect();
    assert_eq!(ready.iter().filter(|r| **r).count(), 1);
    let prober = ready.iter().position(|r| *r).unwrap();

    let (mut probe, _) = clones.remove(prober);
    assert_eq!(probe.call(1).await.unwrap(), 1);
    assert_eq!(breaker.state(), State::Closed);
    for (svc, (counter, waker)) in &mut clones {
        assert_eq!(wakes(counter), 1, "each waiter is woken once");
        assert!(svc.poll_ready(&mut Context::from_waker(waker)).is_ready());
    }
}

#[tokio::test(start_paused = true)]
async fn failed_probe_on_another_clone_wakes_waiters_who_wait_for_the_next_period() {
    let (breaker, upstream, svc) = tripped_gate().await;
    advance(Duration::from_secs(10)).await;

    let mut prober = svc.clone();
    let mut waiter = svc.clone();
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(prober.poll_ready(&mut cx).is_ready());
    assert!(waiter.poll_ready(&mut cx).is_pending());

    upstream.fail();
    assert!(prober.call(1).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(wakes(&counter), 1, "woken by the probe's failure");

    // Open again for 20 s: pending, then woken when those end.
    assert!(waiter.poll_ready(&mut cx).is_pending());
    advance(Duration::from_millis(19_999)).await;
    assert_eq!(wakes(&counter), 1);
    advance(Duration::from_millis(1)).await;
    assert_eq!(wakes(&counter), 2);
    assert!(waiter.poll_ready(&mut cx).is_ready());
}

/// Counts how often the wrapped future is polled.
struct CountPolls<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for CountPolls<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.inner.as_mut().poll(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn waiting_task_is_not_polled_while_the_breaker_stays_open() {
    let (breaker, _, mut svc) = tripped_gate().await;

    let polls = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(CountPolls {
        inner: Box::pin(async move {
            svc.ready().await.unwrap();
            svc.call(3).await
        }),
        polls: Arc::clone(&polls),
    });
    for _ in 0..9 {
        advance(Duration::from_secs(1)).await;
    }
    assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once, then asleep");
    assert_eq!(
        task.await.unwrap().unwrap(),
        3,
        "woken at the end of the period"
    );
    assert_eq!(polls.load(Ordering::SeqCst), 2);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn load_shed_around_an_open_gate_answers_overloaded_at_once() {
    let (layer, breaker, upstream) = gate_layer();
    let mut svc = ServiceBuilder::new()
        .load_shed()
        .layer(layer)
        .service(upstream.clone());
    upstream.fail();
    assert!(send(&mut svc, 0).await.is_err());
    assert_eq!(breaker.state(), State::Open);

    let calls = upstream.calls();
    let err = send(&mut svc, 1).await.unwrap_err();
    assert!(err.is::<tower::load_shed::error::Overloaded>(), "{err}");
    assert_eq!(upstream.calls(), calls);
}

#[tokio::test(start_paused = true)]
async fn load_shed_around_a_gate_loses_the_retry_after_that_fail_fast_passes_through() {
    // Gate: the caller learns only that the service is overloaded.
    let (layer, _, upstream) = gate_layer();
    let mut gated = ServiceBuilder::new()
        .load_shed()
        .layer(layer)
        .service(upstream.clone());
    upstream.fail();
    assert!(send(&mut gated, 0).await.is_err());
    let err = send(&mut gated, 1).await.unwrap_err();
    assert!(err.is::<tower::load_shed::error::Overloaded>(), "{err}");
    assert!(CircuitOpen::find(err.as_ref()).is_none(), "{err}");

    // Fail fast, the alternative: refused as soon, with the refusal itself.
    let layer = CircuitBreakerLayer::new(config());
    let upstream = Upstream::default();
    let mut fail_fast = ServiceBuilder::new()
        .load_shed()
        .layer(layer)
        .service(upstream.clone());
    upstream.fail();
    assert!(send(&mut fail_fast, 0).await.is_err());
    let calls = upstream.calls();
    let err = send(&mut fail_fast, 1).await.unwrap_err();
    let open = CircuitOpen::find(err.as_ref()).expect("the refusal reaches the caller");
    assert_eq!(open.retry_after(), Duration::from_secs(10));
    assert_eq!(upstream.calls(), calls);
}

#[tokio::test(start_paused = true)]
async fn timeout_outside_a_gate_does_not_bound_the_wait_for_readiness() {
    let (layer, breaker, upstream) = gate_layer();
    let mut svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(layer)
        .service(upstream.clone());
    upstream.fail();
    assert!(send(&mut svc, 0).await.is_err());
    upstream.recover();
    assert_eq!(breaker.state(), State::Open);

    // tower's timeout times `call`; the gate holds the caller in
    // `poll_ready`, so five times the timeout passes with no error.
    let started = tokio::time::Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(5), svc.ready()).await;
    assert!(waited.is_err(), "still waiting at the gate after 5 s");

    // The caller is let through when the open period ends, not before.
    let answer = svc.ready().await.unwrap().call(7).await.unwrap();
    assert_eq!(answer, 7);
    assert_eq!(started.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_on_ready_bounds_the_wait_at_a_gate() {
    let (_, upstream, mut svc) = tripped_gate().await;
    let calls = upstream.calls();

    let started = tokio::time::Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(1), svc.ready()).await;
    assert!(waited.is_err(), "the deadline ends the wait");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(upstream.calls(), calls, "nothing was sent");
}

#[tokio::test(start_paused = true)]
async fn buffer_around_a_gate_waits_instead_of_failing_and_is_never_poisoned() {
    let (layer, breaker, upstream) = gate_layer();
    let svc = ServiceBuilder::new()
        .buffer(16)
        .layer(layer)
        .service(upstream.clone());

    upstream.fail();
    assert!(svc.clone().oneshot(0).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    upstream.recover();

    // Queued behind the gate: served when the open period ends, not refused.
    let started = tokio::time::Instant::now();
    let answers: Vec<_> = (1..=3)
        .map(|i| tokio::spawn(svc.clone().oneshot(i)))
        .collect();
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer.await.unwrap().unwrap(), i as u32 + 1);
    }
    assert!(started.elapsed() >= Duration::from_secs(10));
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(svc.oneshot(9).await.unwrap(), 9, "the buffer still serves");
}

/// A p2c balancer over `upstreams`, each behind its breaker in gate mode
/// and counted by its pending requests.
fn gated_balance(
    upstreams: &[Upstream],
    breakers: &[Breaker],
) -> Balance<ServiceList<Vec<PendingRequests<CircuitBreaker<Upstream>>>>, u32> {
    let endpoints: Vec<_> = upstreams
        .iter()
        .zip(breakers)
        .map(|(upstream, breaker)| {
            PendingRequests::new(
                ServiceBuilder::new()
                    .layer(breaker.layer().readiness(Readiness::Gate))
                    .service(upstream.clone()),
                CompleteOnResponse::default(),
            )
        })
        .collect();
    Balance::new(ServiceList::new(endpoints))
}

/// A balancer's endpoints behind a registry's breakers, one per endpoint's
/// key, in gate mode: the keyed way to balance (a keyed service cannot gate,
/// since its key comes with the request). The open endpoint's key is
/// routed around; the registry's snapshot is what the balancer saw.
#[tokio::test(start_paused = true)]
async fn p2c_routes_around_an_endpoint_whose_registry_breaker_is_open() {
    let registry = tower_circuit_breaker::registry::Registry::<String>::new(config());
    let upstreams: Vec<Upstream> = (0..3).map(|_| Upstream::default()).collect();
    let breakers: Vec<Breaker> = (0..upstreams.len())
        .map(|i| registry.get(&format!("pool/{i}")).expect("room"))
        .collect();
    let mut balance = gated_balance(&upstreams, &breakers);
    upstreams[0].fail();
    let state = |key: &str| registry.get(&key.to_string()).expect("room").state();
    for i in 0..200 {
        let _ = send(&mut balance, i).await;
        if state("pool/0") == State::Open {
            break;
        }
    }
    assert_eq!(state("pool/0"), State::Open);
    assert_eq!(upstreams[0].calls(), 1);
    for i in 0..100 {
        assert_eq!(send(&mut balance, i).await.unwrap(), i, "routed around");
    }
    assert_eq!(upstreams[0].calls(), 1, "the open endpoint saw nothing");
    let open = registry.keys_in(State::Open);
    assert_eq!(open, ["pool/0".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn p2c_routes_around_an_open_endpoint_which_sees_only_probes_then_rejoins() {
    let upstreams: Vec<Upstream> = (0..3).map(|_| Upstream::default()).collect();
    let breakers: Vec<Breaker> = (0..3).map(|_| Breaker::new(config())).collect();
    let mut balance = gated_balance(&upstreams, &breakers);
    let calls = |i: usize| upstreams[i].calls();
    let sick = &upstreams[0];
    sick.fail();

    // Until endpoint 0 is picked once, fails, and trips.
    let mut failures = 0;
    for i in 0..200 {
        if send(&mut balance, i).await.is_err() {
            failures += 1;
        }
        if breakers[0].state() == State::Open {
            break;
        }
    }
    assert_eq!(breakers[0].state(), State::Open);
    assert_eq!((failures, calls(0)), (1, 1));

    // Open: every request succeeds on the healthy two; endpoint 0 sees none.
    for i in 0..100 {
        assert_eq!(send(&mut balance, i).await.unwrap(), i);
    }
    assert_eq!(calls(0), 1);

    // Half-open while still sick: only the probe reaches it.
    advance(Duration::from_secs(10)).await;
    let mut failures = 0;
    for i in 0..100 {
        if send(&mut balance, i).await.is_err() {
            failures += 1;
        }
    }
    assert_eq!((failures, calls(0)), (1, 2), "one probe, which failed");
    assert_eq!(breakers[0].state(), State::Open);

    // Recovered: after the next (doubled) period, a probe closes it and it
    // takes its share of traffic again.
    sick.recover();
    advance(Duration::from_secs(20)).await;
    for i in 0..300 {
        assert_eq!(send(&mut balance, i).await.unwrap(), i);
    }
    assert_eq!(breakers[0].state(), State::Closed);
    assert!(calls(0) > 2 + 30, "rejoined: {} calls", calls(0));
    assert!(calls(1) > 30 && calls(2) > 30);
}

#[tokio::test(start_paused = true)]
async fn gate_call_without_a_reservation_still_refuses_an_open_breaker() {
    let (_, upstream, mut svc) = tripped_gate().await;
    let calls = upstream.calls();
    // `call` without `poll_ready` breaks tower's contract; it still must not
    // reach the upstream.
    let err = svc.call(1).await.unwrap_err();
    assert!(CircuitOpen::find(err.as_ref()).is_some());
    assert_eq!(upstream.calls(), calls);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_wakes_gate_waiters_at_once() {
    let (breaker, _, mut svc) = tripped_gate().await;
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(svc.poll_ready(&mut cx).is_pending());

    breaker.set_shadow(true);
    assert_eq!(wakes(&counter), 1, "woken by the change, not by its timer");
    assert!(
        svc.poll_ready(&mut cx).is_ready(),
        "shadow mode lets it through"
    );
    assert_eq!(svc.call(3).await.unwrap(), 3);
    assert_eq!(
        breaker.state(),
        State::Open,
        "the breaker itself stays open"
    );
}
