//! Half-open probe edge cases: races between taking and giving back
//! permits, reopening with an announced retry-after while permits change,
//! an overdue probe while a permit is free, and a reservation never used.
//! The two race tests drive a second OS thread against the paused runtime
//! for a bounded number of rounds.

/// Review: a probe admitted while another probe's permit is being released
/// (between `release_permit`'s CAS and its lock) finds no free deadline slot
/// and runs without a probe deadline: if it hangs, the breaker stays
/// half-open with every permit taken, and `probe_timeout` never fires.
use crate::common::paused;

use paused::paused_runtime;

mod permit_release_race {
    #[allow(unused_imports)]
    use super::{paused_runtime, poll_once, ready_now, ROUNDS};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};
    use std::task::Poll;
    use std::time::Duration;

    use tower::{service_fn, BoxError, Service};
    use tower_circuit_breaker::classify::Outcome;
    use tower_circuit_breaker::policy::ConsecutiveFailures;
    use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, State};

    type Fut = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

    /// 0: answered at once, classified Ignore; 1: fails; 2: hangs forever.
    fn upstream(req: u32) -> Fut {
        Box::pin(async move {
            match req {
                1 => Err::<u32, BoxError>("down".into()),
                2 => std::future::pending().await,
                n => Ok(n),
            }
        })
    }

    fn classify(r: Result<&u32, &BoxError>) -> Outcome {
        match r {
            Ok(0) => Outcome::Ignore,
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        }
    }

    #[test]
    fn probe_admitted_during_a_permit_release_still_times_out() {
        let rt = paused_runtime();
        let handle = rt.handle().clone();
        let _guard = rt.enter();

        for iteration in 0..ROUNDS {
            let breaker = Breaker::new(
                Config::builder()
                    .trip(ConsecutiveFailures::new(1))
                    .cooldown(Duration::from_secs(1))
                    .probes(1)
                    .probe_timeout(Some(Duration::from_secs(5)))
                    .build()
                    .unwrap(),
            );
            let mut a = CircuitBreaker::with_classifier(
                service_fn(upstream),
                &breaker,
                classify as fn(Result<&u32, &BoxError>) -> Outcome,
            );
            let mut b = a.clone();
            let mut c = a.clone();

            // Trip, then let the open period end.
            ready_now(&mut a);
            let _ = poll_once(&mut a.call(1));
            assert_eq!(breaker.state(), State::Open);
            rt.block_on(tokio::time::advance(Duration::from_secs(1)));

            // `a` takes the only permit; its call will be ignored (permit released).
            ready_now(&mut a);
            let mut ignored = a.call(0);

            // `b` (another thread) spins for the permit and sends a hanging probe.
            let go = Arc::new(Barrier::new(2));
            let stop = Arc::new(AtomicBool::new(false));
            let t = {
                let (go, stop, handle) = (go.clone(), stop.clone(), handle.clone());
                std::thread::spawn(move || {
                    let _g = handle.enter();
                    go.wait();
                    loop {
                        let _ = poll_once(&mut std::future::poll_fn(|cx| b.poll_ready(cx)));
                        let mut f = b.call(2);
                        if poll_once(&mut f).is_pending() {
                            return Some((b, f)); // a probe in flight, hanging
                        }
                        if stop.load(Ordering::Relaxed) {
                            return None;
                        }
                    }
                })
            };
            go.wait();
            assert!(poll_once(&mut ignored).is_ready()); // Ignore: permit goes back
            drop(ignored);
            // Give `b` a moment to take the freed permit (no time passes).
            let mut spins = 0;
            while breaker.snapshot().probes_in_flight == 0 && spins < 100_000 {
                spins += 1;
                std::hint::spin_loop();
            }
            stop.store(true, Ordering::Relaxed);
            let held = t.join().unwrap();
            if held.is_none() {
                continue;
            }

            // The hanging probe is past its 5 s deadline: the next caller must
            // see it time out and reopen the breaker.
            rt.block_on(tokio::time::advance(Duration::from_secs(6)));
            ready_now(&mut c);
            let res = poll_once(&mut c.call(3));
            let state = breaker.state();
            assert_ne!(
                state,
                State::HalfOpen,
                "iteration {iteration}: probe past its timeout did not time out; \
                 call got {res:?}, snapshot {:?}",
                breaker.snapshot()
            );
            if let Poll::Ready(Err(e)) = res {
                let open = CircuitOpen::find(e.as_ref()).expect("a refusal");
                assert_eq!(open.state(), State::Open);
            }
            drop(held);
        }
    }
}

/// Review: `reopen` computes the open deadline with `open_until`, which
/// `take`s the retry-after hint, before its compare-and-swap. When a
/// lock-free permit change (another clone taking or giving back a probe
/// permit) makes that CAS fail, the retry computes the deadline again
/// without the hint: the breaker reopens for the backoff period only,
/// shorter than the Retry-After the upstream announced (DESIGN decision 4).
mod reopen_hint_race {
    #[allow(unused_imports)]
    use super::{paused_runtime, poll_once, ready_now, ROUNDS};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use tower::{service_fn, BoxError, Service};
    use tower_circuit_breaker::classify::{Outcome, Verdict};
    use tower_circuit_breaker::policy::ConsecutiveFailures;
    use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};

    type Fut = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

    /// 0: answered at once, classified Ignore; 1: fails with Retry-After 60 s.
    fn upstream(req: u32) -> Fut {
        Box::pin(async move {
            match req {
                1 => Err::<u32, BoxError>("503".into()),
                n => Ok(n),
            }
        })
    }

    fn classify(r: Result<&u32, &BoxError>) -> Verdict {
        match r {
            Ok(0) => Verdict::new(Outcome::Ignore),
            Ok(_) => Verdict::new(Outcome::Success),
            Err(_) => Verdict::new(Outcome::Failure).with_retry_after(Duration::from_secs(60)),
        }
    }

    #[test]
    fn failed_probe_with_retry_after_keeps_the_breaker_open_that_long() {
        let rt = paused_runtime();
        let handle = rt.handle().clone();
        let _guard = rt.enter();

        for iteration in 0..ROUNDS {
            let breaker = Breaker::new(
                Config::builder()
                    .trip(ConsecutiveFailures::new(1))
                    .cooldown(Duration::from_secs(1))
                    .max_open(Duration::from_secs(300))
                    .probes(2)
                    .build()
                    .unwrap(),
            );
            let mut a = CircuitBreaker::with_classifier(
                service_fn(upstream),
                &breaker,
                classify as fn(Result<&u32, &BoxError>) -> Verdict,
            );
            let mut b = a.clone();

            // Trip (this failure's 60 s hint holds the first period open), then
            // let the open period end.
            ready_now(&mut a);
            let _ = poll_once(&mut a.call(1));
            assert_eq!(breaker.state(), State::Open);
            rt.block_on(tokio::time::advance(Duration::from_secs(61)));

            // `a` takes a probe permit; `b` (another thread) keeps taking and
            // giving back the other one.
            ready_now(&mut a);
            let mut probe = a.call(1);
            let go = Arc::new(Barrier::new(2));
            let stop = Arc::new(AtomicBool::new(false));
            let t = {
                let (go, stop, handle) = (go.clone(), stop.clone(), handle.clone());
                std::thread::spawn(move || {
                    let _g = handle.enter();
                    go.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let _ = poll_once(&mut std::future::poll_fn(|cx| b.poll_ready(cx)));
                        let _ = poll_once(&mut b.call(0));
                    }
                })
            };
            go.wait();
            assert!(poll_once(&mut probe).is_ready()); // the probe fails: reopen
            stop.store(true, Ordering::Relaxed);
            t.join().unwrap();

            assert_eq!(breaker.state(), State::Open);
            let retry_after = breaker.retry_after().unwrap();
            assert!(
                retry_after >= Duration::from_secs(60),
                "iteration {iteration}: upstream said Retry-After 60 s, breaker reopened for {retry_after:?}"
            );
        }
    }
}

/// Review: a probe past its `probe_timeout` only counts as failed when a
/// caller finds *every* permit taken. With `probes > 1`, while other probes
/// come and go (cancelled by an outer timeout, or classified Ignore), a hung
/// probe never times out and the breaker stays half-open, sending traffic to
/// an upstream whose probe has been hanging far past its deadline.
mod overdue_probe_with_free_permit {
    #[allow(unused_imports)]
    use super::{paused_runtime, poll_once, ready_now, ROUNDS};
    use std::time::Duration;

    use tokio::time::advance;
    use tower::{service_fn, BoxError, Service, ServiceExt};
    use tower_circuit_breaker::policy::ConsecutiveFailures;
    use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};

    #[tokio::test(start_paused = true)]
    async fn hung_probe_times_out_even_while_a_permit_is_free() {
        let breaker = Breaker::new(
            Config::builder()
                .trip(ConsecutiveFailures::new(1))
                .cooldown(Duration::from_secs(10))
                .probes(2)
                .probe_timeout(Some(Duration::from_secs(5)))
                .build()
                .unwrap(),
        );
        // 0: fails at once; 1: hangs forever.
        let inner = service_fn(|req: u32| async move {
            match req {
                0 => Err::<(), BoxError>("down".into()),
                _ => std::future::pending().await,
            }
        });
        let mut svc = CircuitBreaker::new(inner, &breaker);
        assert!(svc.ready().await.unwrap().call(0).await.is_err());
        advance(Duration::from_secs(10)).await;

        // Probe 1 hangs (its caller waits).
        let _hung = svc.ready().await.unwrap().call(1);
        advance(Duration::from_secs(6)).await; // past its 5 s deadline

        // Another caller comes along while the second permit is free.
        let cancelled = svc.ready().await.unwrap().call(1);
        drop(cancelled); // e.g. an outer timeout
        assert_eq!(
            breaker.state(),
            State::Open,
            "probe 1 is 1 s past its probe timeout: {:?}",
            breaker.snapshot()
        );
    }
}

/// Review: a probe's deadline starts when `poll_ready` reserves the permit,
/// not when `call` sends the probe. A reservation that is never used (or is
/// used late) times out as a *failed probe*: the breaker reopens with
/// backoff on no evidence from the upstream at all.
mod unused_reservation {
    #[allow(unused_imports)]
    use super::{paused_runtime, poll_once, ready_now, ROUNDS};
    use std::time::Duration;

    use tokio::time::advance;
    use tower::{service_fn, BoxError, Service, ServiceExt};
    use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
    use tower_circuit_breaker::{Breaker, CircuitBreaker, Config};

    #[tokio::test(start_paused = true)]
    async fn an_unused_reservation_is_not_a_failed_probe() {
        let breaker = Breaker::new(
            Config::builder()
                .trip(ConsecutiveFailures::new(1))
                .cooldown(Duration::from_secs(10))
                .probe_timeout(Some(Duration::from_secs(5)))
                .build()
                .unwrap(),
        );
        let inner = service_fn(|fail: bool| async move {
            if fail {
                Err::<(), BoxError>("down".into())
            } else {
                Ok(())
            }
        });
        let mut svc = CircuitBreaker::new(inner, &breaker);
        assert!(svc.ready().await.unwrap().call(true).await.is_err());
        advance(Duration::from_secs(10)).await;

        // A clone reserves the probe permit (e.g. it sits in a ready cache).
        let mut holder = svc.clone();
        holder.ready().await.unwrap();
        advance(Duration::from_secs(6)).await;

        // Nothing was sent to the upstream, yet the next caller reopens it.
        let _ = svc.ready().await.unwrap().call(false).await;
        let snap = breaker.snapshot();
        assert!(
            snap.failed_probe_rounds == 0 && snap.last_trip != Some(TripReason::ProbeTimedOut),
            "no probe was ever sent, yet: {snap:?}"
        );
    }
}

/// A probe whose answer comes after its `probe_timeout` timed out, whatever
/// the answer, even when no other call came by to notice the deadline.
mod late_probe_outcome {
    use std::time::Duration;

    use tokio::time::advance;
    use tower::{service_fn, BoxError, Service, ServiceExt};
    use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
    use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};

    fn breaker() -> Breaker {
        Breaker::new(
            Config::builder()
                .trip(ConsecutiveFailures::new(1))
                .cooldown(Duration::from_secs(10))
                .backoff(1.0)
                .probe_timeout(Some(Duration::from_secs(5)))
                .build()
                .unwrap(),
        )
    }

    /// Fails at once for 0; for n > 0 answers after n seconds, failing
    /// when n is odd.
    fn upstream() -> impl Service<u64, Response = (), Error = BoxError, Future: Send> + Clone {
        service_fn(|secs: u64| async move {
            if secs == 0 {
                return Err::<(), BoxError>("down".into());
            }
            tokio::time::sleep(Duration::from_secs(secs)).await;
            if secs % 2 == 1 {
                Err("down".into())
            } else {
                Ok(())
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_after_the_probe_timeout_reopens_instead_of_closing() {
        let breaker = breaker();
        let mut svc = CircuitBreaker::new(upstream(), &breaker);
        assert!(svc.ready().await.unwrap().call(0).await.is_err());
        advance(Duration::from_secs(10)).await;

        // The only call in flight: it succeeds 8 s later, 3 s past its
        // deadline.
        let probe = svc.ready().await.unwrap().call(8);
        assert!(probe.await.is_ok(), "the caller still gets its answer");
        let snap = breaker.snapshot();
        assert_eq!(snap.state, State::Open, "{snap:?}");
        assert_eq!(snap.last_trip, Some(TripReason::ProbeTimedOut));
        assert_eq!(snap.counts.failures, 2, "the trip and the late probe");
        assert_eq!(
            breaker.retry_after(),
            Some(Duration::from_secs(7)),
            "open from the probe's deadline (5 s in), not from its answer (8 s)"
        );
        advance(Duration::from_secs(7)).await;
        svc.ready().await.unwrap().call(2).await.unwrap();
        assert_eq!(breaker.state(), State::Closed, "a timely probe closes it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_after_the_probe_timeout_counts_once_as_a_timeout() {
        let breaker = breaker();
        let mut svc = CircuitBreaker::new(upstream(), &breaker);
        assert!(svc.ready().await.unwrap().call(0).await.is_err());
        advance(Duration::from_secs(10)).await;
        assert!(svc.ready().await.unwrap().call(7).await.is_err());
        let snap = breaker.snapshot();
        assert_eq!(snap.last_trip, Some(TripReason::ProbeTimedOut));
        assert_eq!(snap.counts.failures, 2);
        assert_eq!(snap.counts.opened, 2);
        assert_eq!(breaker.retry_after(), Some(Duration::from_secs(8)));
    }
}

/// Rounds of each race test: enough to hit the window within seconds.
const ROUNDS: usize = 2_000;

struct Noop;

impl std::task::Wake for Noop {
    fn wake(self: std::sync::Arc<Self>) {}
}

fn noop_waker() -> std::task::Waker {
    std::task::Waker::from(std::sync::Arc::new(Noop))
}

/// A current-thread runtime with time enabled and paused.
/// Polls `f` once with a waker that does nothing.
fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut std::task::Context::from_waker(&noop_waker()))
}

/// Asserts that `svc` is ready at the first poll.
fn ready_now<S: tower::Service<R>, R>(svc: &mut S) {
    assert!(poll_once(&mut std::future::poll_fn(|cx| svc.poll_ready(cx))).is_ready());
}
