//! The breaker's state machine through its tower service: half-open
//! admission, permits, cancellation, panics, generations, open timing.

use std::time::Duration;

use tokio::time::advance;
use tower::{BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::{Outcome, Verdict};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, ConfigBuilder, State};

use crate::common::{Call, Upstream};

fn setup(config: ConfigBuilder) -> (Breaker, CircuitBreaker<Upstream>, Upstream) {
    let breaker = Breaker::new(config.build().expect("valid config"));
    let upstream = Upstream::default();
    let svc = CircuitBreaker::new(upstream.clone(), &breaker);
    (breaker, svc, upstream)
}

fn one_failure_trips() -> ConfigBuilder {
    Config::builder()
        .name("upstream")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(Duration::from_secs(10))
        .max_open(Duration::from_secs(80))
}

async fn call<S: Service<u32, Response = u32, Error = BoxError>>(
    svc: &mut S,
    req: u32,
) -> Result<u32, BoxError> {
    svc.ready().await?.call(req).await
}

fn open_error(result: Result<u32, BoxError>) -> CircuitOpen {
    let err = result.expect_err("expected a refusal");
    CircuitOpen::find(err.as_ref())
        .unwrap_or_else(|| panic!("expected CircuitOpen, got {err}"))
        .clone()
}

async fn trip(svc: &mut CircuitBreaker<Upstream>, upstream: &Upstream) {
    upstream.fail();
    let _ = call(svc, 0).await;
    upstream.recover();
}

#[tokio::test(start_paused = true)]
async fn open_breaker_refuses_without_polling_or_calling_the_inner_service() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    assert_eq!(breaker.state(), State::Open);
    let (calls, polls) = (upstream.calls(), upstream.polls());

    for _ in 0..10 {
        let open = open_error(call(&mut svc, 1).await);
        assert_eq!(open.breaker(), "upstream");
        assert_eq!(open.state(), State::Open);
        assert_eq!(open.retry_after(), Duration::from_secs(10));
    }
    assert_eq!((upstream.calls(), upstream.polls()), (calls, polls));
    assert_eq!(breaker.snapshot().counts.rejected, 10);
}

#[tokio::test(start_paused = true)]
async fn the_open_period_refuses_through_its_last_millisecond_and_ends_at_its_deadline() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    let calls = upstream.calls();

    advance(Duration::from_millis(9_999)).await;
    let open = open_error(call(&mut svc, 1).await);
    assert_eq!(open.state(), State::Open);
    assert_eq!(open.retry_after(), Duration::from_millis(1));
    assert_eq!(upstream.calls(), calls);

    advance(Duration::from_millis(1)).await;
    assert_eq!(call(&mut svc, 2).await.expect("the probe is sent"), 2);
    assert_eq!(upstream.calls(), calls + 1);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_probes_of_100_concurrent_calls() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips().probes(3));
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    upstream.set(Call::SlowOk(Duration::from_secs(1)));
    let before = upstream.calls();

    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let mut svc = svc.clone();
            tokio::spawn(async move { call(&mut svc, i).await })
        })
        .collect();
    let mut admitted = 0;
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => admitted += 1,
            Err(err) => {
                let open = CircuitOpen::find(err.as_ref()).expect("refusal");
                assert_eq!(open.state(), State::HalfOpen);
                refused += 1;
            }
        }
    }
    assert_eq!((admitted, refused), (3, 97));
    assert_eq!(upstream.calls() - before, 3);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn readiness_in_half_open_is_a_reservation() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;

    let mut first = svc.clone();
    let mut second = svc.clone();
    first.ready().await.unwrap(); // takes the only permit
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    second.ready().await.unwrap(); // ready, but to refuse
    let open = open_error(second.call(2).await);
    assert_eq!(open.state(), State::HalfOpen);
    assert_eq!(first.call(1).await.unwrap(), 1);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn dropped_clone_returns_its_reservation() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;

    let mut holder = svc.clone();
    holder.ready().await.unwrap();
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    drop(holder);
    assert_eq!(breaker.snapshot().probes_in_flight, 0);
    assert_eq!(call(&mut svc, 7).await.unwrap(), 7);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_reopens_for_the_same_period_and_counts_neither_way() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;
    upstream.set(Call::SlowOk(Duration::from_secs(5)));

    let future = svc.ready().await.unwrap().call(1);
    let timed_out = tokio::time::timeout(Duration::from_secs(1), future).await;
    assert!(
        timed_out.is_err(),
        "the probe was cancelled by the outer timeout"
    );
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.probes_in_flight, 0);
    assert_eq!(snap.failed_probe_rounds, 0, "not a failed probe");
    assert_eq!(snap.counts.cancelled, 1);
    // The same 10 s again, not doubled.
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(10)));

    upstream.recover();
    advance(Duration::from_secs(10)).await;
    assert_eq!(call(&mut svc, 2).await.unwrap(), 2);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn panicking_probe_is_a_failure_returns_its_permit_and_reaches_the_caller() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;
    upstream.set(Call::Panic);

    let mut probe = svc.clone();
    let task = tokio::spawn(async move { call(&mut probe, 1).await });
    let joined = task.await;
    assert!(
        joined.unwrap_err().is_panic(),
        "the panic is resumed to the caller"
    );

    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.probes_in_flight, 0);
    assert_eq!(snap.last_trip, Some(TripReason::ProbeFailed));

    // It keeps working: the next period ends, a probe succeeds, it closes.
    upstream.recover();
    advance(Duration::from_secs(20)).await;
    assert_eq!(call(&mut svc, 3).await.unwrap(), 3);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn panicking_closed_call_counts_as_a_failure() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    upstream.set(Call::Panic);
    let mut caller = svc.clone();
    let joined = tokio::spawn(async move { call(&mut caller, 1).await }).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.snapshot().counts.failures, 1);
    let _ = &mut svc;
}

#[tokio::test(start_paused = true)]
async fn panicking_classifier_is_a_failure_and_reaches_the_caller() {
    let breaker = Breaker::new(one_failure_trips().build().unwrap());
    let classify = |result: Result<&u32, &BoxError>| -> Outcome {
        match result {
            Ok(7) => panic!("classifier panicked"),
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        }
    };
    let mut svc = CircuitBreaker::with_classifier(Upstream::default(), &breaker, classify);
    let joined = tokio::spawn(async move { svc.ready().await?.call(7).await }).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn ignored_probe_returns_its_permit_and_counts_neither_way() {
    let breaker = Breaker::new(one_failure_trips().build().unwrap());
    let upstream = Upstream::default();
    // Requests numbered 400 and above stand for "bad request": ignored.
    let classify = |result: Result<&u32, &BoxError>| match result {
        Ok(n) if *n >= 400 => Outcome::Ignore,
        Ok(_) => Outcome::Success,
        Err(_) => Outcome::Failure,
    };
    let mut svc = CircuitBreaker::with_classifier(upstream.clone(), &breaker, classify);
    upstream.fail();
    let _ = svc.ready().await.unwrap().call(0).await;
    upstream.recover();
    advance(Duration::from_secs(10)).await;

    assert_eq!(svc.ready().await.unwrap().call(400).await.unwrap(), 400);
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::HalfOpen);
    assert_eq!((snap.probes_in_flight, snap.probe_successes), (0, 0));
    assert_eq!(snap.counts.ignored, 1);

    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 1);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn closing_needs_successes_to_close_probe_successes() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips().successes_to_close(3));
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;
    for expected in 1..3 {
        call(&mut svc, 1).await.unwrap();
        let snap = breaker.snapshot();
        assert_eq!(snap.state, State::HalfOpen);
        assert_eq!(snap.probe_successes, expected);
    }
    call(&mut svc, 1).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn any_probe_failure_reopens_even_after_successes() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips().successes_to_close(3));
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;
    call(&mut svc, 1).await.unwrap();
    call(&mut svc, 1).await.unwrap();
    upstream.fail();
    assert!(call(&mut svc, 1).await.is_err());
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.retry_after, Some(Duration::from_secs(20)));
}

#[tokio::test(start_paused = true)]
async fn open_period_grows_on_failed_probes_caps_and_resets_on_close() {
    // cooldown 10 s, backoff 2, max 80 s: 10, 20, 40, 80, 80.
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    upstream.fail();
    for expected in [10u64, 20, 40, 80, 80] {
        assert_eq!(breaker.retry_after(), Some(Duration::from_secs(expected)));
        advance(Duration::from_secs(expected - 1)).await;
        assert_eq!(
            breaker.state(),
            State::Open,
            "open for the whole {expected} s"
        );
        advance(Duration::from_secs(1)).await;
        assert_eq!(breaker.state(), State::HalfOpen);
        assert!(call(&mut svc, 1).await.is_err(), "the probe fails");
    }
    // Recovery: the probe succeeds, the breaker closes, the period resets.
    upstream.recover();
    advance(Duration::from_secs(80)).await;
    call(&mut svc, 1).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    trip(&mut svc, &upstream).await;
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(10)));
}

#[tokio::test(start_paused = true)]
async fn jitter_lengthens_the_open_period_and_never_shortens_it() {
    let config = one_failure_trips()
        .cooldown(Duration::from_secs(10))
        .backoff(1.0)
        .jitter(0.5);
    let (breaker, mut svc, upstream) = setup(config);
    let mut longest = Duration::ZERO;
    for _ in 0..40 {
        trip(&mut svc, &upstream).await;
        let open_for = breaker.retry_after().expect("open");
        assert!(open_for >= Duration::from_secs(10), "{open_for:?}");
        assert!(open_for <= Duration::from_secs(15), "{open_for:?}");
        longest = longest.max(open_for);
        // Not a moment before the cooldown: still refused.
        advance(Duration::from_secs(10) - Duration::from_millis(1)).await;
        assert_eq!(breaker.state(), State::Open);
        advance(open_for - Duration::from_secs(10) + Duration::from_millis(1)).await;
        call(&mut svc, 1).await.unwrap();
        assert_eq!(breaker.state(), State::Closed);
    }
    assert!(
        longest > Duration::from_secs(11),
        "jitter applied: {longest:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn max_open_caps_a_jittered_period() {
    let config = one_failure_trips()
        .cooldown(Duration::from_secs(10))
        .max_open(Duration::from_secs(11))
        .jitter(0.99);
    let (breaker, mut svc, upstream) = setup(config);
    for _ in 0..20 {
        trip(&mut svc, &upstream).await;
        let open_for = breaker.retry_after().expect("open");
        assert!(open_for >= Duration::from_secs(10), "{open_for:?}");
        assert!(open_for <= Duration::from_secs(11), "{open_for:?}");
        advance(open_for).await;
        call(&mut svc, 1).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_hint_extends_the_open_period_up_to_max_open() {
    let breaker = Breaker::new(one_failure_trips().build().unwrap());
    let upstream = Upstream::default();
    // A failure whose value says how long the upstream asked us to wait.
    let classify = |result: Result<&u32, &BoxError>| match result {
        Ok(0) => Verdict::new(Outcome::Success),
        Ok(secs) => {
            Verdict::new(Outcome::Failure).with_retry_after(Duration::from_secs(*secs as u64))
        }
        Err(_) => Verdict::new(Outcome::Failure),
    };
    let mut svc = CircuitBreaker::with_classifier(upstream.clone(), &breaker, classify);

    svc.ready().await.unwrap().call(45).await.unwrap();
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(45)));
    advance(Duration::from_secs(45)).await;
    svc.ready().await.unwrap().call(0).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);

    // A hint beyond max_open (80 s) is capped by it.
    svc.ready().await.unwrap().call(100_000).await.unwrap();
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(80)));
}

#[tokio::test(start_paused = true)]
async fn stale_outcome_from_an_earlier_generation_is_dropped() {
    let (breaker, mut svc, upstream) = setup(
        Config::builder()
            .trip(ConsecutiveFailures::new(2))
            .cooldown(Duration::from_secs(10)),
    );
    // A slow failing call admitted while closed, generation 0.
    upstream.set(Call::SlowFail(Duration::from_secs(30)));
    let mut slow = svc.clone();
    let late = tokio::spawn(async move { call(&mut slow, 1).await });
    tokio::task::yield_now().await;

    // Meanwhile the breaker trips, half-opens and closes again.
    upstream.fail();
    let _ = call(&mut svc, 2).await;
    let _ = call(&mut svc, 3).await;
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_secs(10)).await;
    upstream.recover();
    call(&mut svc, 4).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    let generation = breaker.snapshot().generation;

    // The late failure arrives in a later generation: it must not count.
    advance(Duration::from_secs(20)).await;
    assert!(late.await.unwrap().is_err());
    let snap = breaker.snapshot();
    assert_eq!(snap.counts.stale, 1);
    assert_eq!(snap.generation, generation);
    upstream.fail();
    let _ = call(&mut svc, 5).await;
    assert_eq!(breaker.state(), State::Closed, "one fresh failure of two");
}

#[tokio::test(start_paused = true)]
async fn hung_probe_times_out_as_a_failure_and_its_late_result_is_dropped() {
    let (breaker, mut svc, upstream) = setup(
        one_failure_trips()
            .probe_timeout(Some(Duration::from_secs(5)))
            .cooldown(Duration::from_secs(10)),
    );
    trip(&mut svc, &upstream).await;
    advance(Duration::from_secs(10)).await;

    upstream.set(Call::SlowOk(Duration::from_secs(60)));
    let mut prober = svc.clone();
    let hung = tokio::spawn(async move { call(&mut prober, 1).await });
    tokio::task::yield_now().await;
    assert_eq!(breaker.snapshot().probes_in_flight, 1);

    // Before the probe timeout, others are refused with the time left.
    advance(Duration::from_secs(2)).await;
    let open = open_error(call(&mut svc, 2).await);
    assert_eq!(open.state(), State::HalfOpen);
    assert_eq!(open.retry_after(), Duration::from_secs(3));

    // After it, the next caller sees the probe failed: open again, for the
    // second (doubled) period counted from the probe's deadline.
    advance(Duration::from_secs(4)).await;
    let open = open_error(call(&mut svc, 3).await);
    assert_eq!(open.state(), State::Open);
    assert_eq!(open.retry_after(), Duration::from_secs(19));
    assert_eq!(
        breaker.snapshot().last_trip,
        Some(TripReason::ProbeTimedOut)
    );

    // The hung probe finally succeeds: too late, it does not close anything,
    // and it is not counted again (its timeout was its one outcome).
    advance(Duration::from_secs(60)).await;
    assert!(hung.await.unwrap().is_ok());
    let snap = breaker.snapshot();
    assert_eq!((snap.counts.failures, snap.counts.stale), (2, 0));
    assert_ne!(snap.state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn breaker_opened_between_poll_ready_and_call_refuses_without_calling() {
    let (breaker, svc, upstream) = setup(one_failure_trips());
    let mut ready = svc.clone();
    ready.ready().await.unwrap(); // closed: inner polled ready

    let mut other = svc.clone();
    trip(&mut other, &upstream).await;
    assert_eq!(breaker.state(), State::Open);

    let calls = upstream.calls();
    let open = open_error(ready.call(1).await);
    assert_eq!(open.state(), State::Open);
    assert_eq!(upstream.calls(), calls);
}

#[tokio::test(start_paused = true)]
async fn state_reads_half_open_from_the_clock_without_any_call() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    trip(&mut svc, &upstream).await;
    advance(Duration::from_millis(9_999)).await;
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_millis(1)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    assert_eq!(breaker.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn refusal_names_its_breaker_whatever_the_length_of_the_name() {
    for name in [
        "a",
        "exactly-twenty-four-chars",
        "provider:a-model-name-longer-than-inline-storage/ü",
    ] {
        let (_, mut svc, upstream) = setup(one_failure_trips().name(name));
        trip(&mut svc, &upstream).await;
        let open = open_error(call(&mut svc, 1).await);
        assert_eq!(open.breaker(), name);
        assert!(open.to_string().contains(name), "{open}");
    }
}

#[tokio::test(start_paused = true)]
async fn counts_sum_calls_and_refusals_over_live_and_dropped_clones() {
    let (breaker, mut svc, upstream) = setup(one_failure_trips());
    let mut clones: Vec<_> = (0..3).map(|_| svc.clone()).collect();
    for clone in &mut clones {
        call(clone, 1).await.unwrap();
    }
    drop(clones.pop()); // its counts must survive it
    trip(&mut svc, &upstream).await;
    for clone in &mut clones {
        assert!(call(clone, 1).await.is_err());
    }
    let counts = breaker.snapshot().counts;
    assert_eq!(
        counts.calls, 4,
        "three successes and the failure that tripped it"
    );
    assert_eq!(counts.rejected, 2);
    assert_eq!(counts.failures, 1);
    assert_eq!(upstream.calls(), 4);
}
