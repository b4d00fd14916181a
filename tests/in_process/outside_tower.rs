//! The breaker outside tower: permits from `try_acquire` and the keyed
//! registry, `run`, and signals from elsewhere (`trip`, `record`), sharing
//! one admission with the tower service.

use std::cell::Cell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::advance;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::{Outcome, Verdict};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::registry::{AcquireError, Registry};
use tower_circuit_breaker::store::memory::MemoryFleet;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, Recorded, State};

/// Counts this thread's heap allocations while `COUNTING` is on: no shared
/// counter, so that other tests running at once cannot add to it.
struct CountingAlloc;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every method forwards to `System` unchanged; the thread-local
// counter has no effect on the memory handed out (and is only touched
// through `try_with`, which never allocates).
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count();
        std::alloc::System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        count();
        std::alloc::System.realloc(ptr, layout, size)
    }
}

fn count() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Heap allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(Cell::get)
}

fn breaker(threshold: u32) -> Breaker {
    Breaker::new(
        Config::builder()
            .name("provider")
            .trip(ConsecutiveFailures::new(threshold))
            .cooldown(Duration::from_secs(10))
            .backoff(1.0)
            .build()
            .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn permits_count_trip_and_refuse_as_service_calls_do() {
    let breaker = breaker(2);
    breaker.try_acquire().unwrap().failure();
    breaker.try_acquire().unwrap().success(); // resets the streak
    breaker.try_acquire().unwrap().failure();
    assert_eq!(breaker.state(), State::Closed);
    breaker.try_acquire().unwrap().failure();
    assert_eq!(breaker.state(), State::Open);

    let refused = breaker.try_acquire().unwrap_err();
    assert_eq!(refused.state(), State::Open);
    assert_eq!(refused.retry_after(), Duration::from_secs(10));
    assert_eq!(refused.breaker(), "provider");
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.calls, counts.rejected, counts.failures), (4, 1, 3));

    // The service sees the same breaker the permits opened.
    let mut svc = CircuitBreaker::new(
        service_fn(|_: ()| async { Ok::<_, BoxError>(()) }),
        &breaker,
    );
    assert!(svc.ready().await.unwrap().call(()).await.is_err());
    advance(Duration::from_secs(10)).await;
    // Half-open: a permit is the probe; the service is refused meanwhile.
    let probe = breaker.try_acquire().unwrap();
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(tower_circuit_breaker::CircuitOpen::find(err.as_ref()).is_some());
    probe.success();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_permit_dropped_unrecorded_is_a_cancellation_and_a_probe_so_dropped_reopens() {
    let breaker = breaker(1);
    drop(breaker.try_acquire().unwrap());
    assert_eq!(breaker.snapshot().counts.cancelled, 1);
    assert_eq!(breaker.state(), State::Closed, "neither way");

    breaker.try_acquire().unwrap().failure();
    advance(Duration::from_secs(10)).await;
    let probe = breaker.try_acquire().unwrap();
    assert!(
        breaker.try_acquire().is_err(),
        "the only probe permit is taken"
    );
    // Dropped by a panic unwinding past it.
    let unwound = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let _held = probe;
        panic!("the job crashed");
    }));
    assert!(unwound.is_err());
    let snap = breaker.snapshot();
    assert_eq!((snap.probes_in_flight, snap.counts.cancelled), (0, 2));
    // No evidence either way: open for the same period, no failure counted.
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.failed_probe_rounds, 0);
    assert!(breaker.try_acquire().is_err(), "no probe at once");
    advance(Duration::from_secs(10)).await;
    breaker
        .try_acquire()
        .expect("a probe after the period")
        .success();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_permit_from_an_earlier_generation_records_nothing() {
    let breaker = breaker(1);
    let late = breaker.try_acquire().unwrap();
    breaker.try_acquire().unwrap().failure(); // trips it
    late.failure();
    let snap = breaker.snapshot();
    assert_eq!((snap.counts.failures, snap.counts.stale), (1, 1));
    assert_eq!(snap.counts.opened, 1, "not opened twice");

    // A probe permit held across the next open period is stale too.
    advance(Duration::from_secs(10)).await;
    let held = breaker.try_acquire().unwrap();
    breaker.open_on_signal("status page: degraded", None);
    advance(Duration::from_secs(10)).await;
    held.success();
    assert_ne!(
        breaker.state(),
        State::Closed,
        "a stale probe closes nothing"
    );
    assert_eq!(breaker.snapshot().counts.stale, 2);
}

#[tokio::test(start_paused = true)]
async fn a_closed_permit_allocates_nothing() {
    let breaker = breaker(5);
    breaker.try_acquire().unwrap().success(); // warm
    let made = allocations(|| {
        for _ in 0..100 {
            breaker.try_acquire().unwrap().success();
        }
    });
    assert_eq!(made, 0);
}

/// Whether the block crashes: always, but the compiler is not told.
fn crashes() -> bool {
    std::hint::black_box(true)
}

#[tokio::test(start_paused = true)]
async fn run_classifies_resumes_panics_and_counts_drops_as_cancelled() {
    let breaker = breaker(3);
    let ok: Result<u32, BoxError> = breaker.run(|| async { Ok(7) }).await;
    assert_eq!(ok.unwrap(), 7);
    let failed: Result<u32, BoxError> = breaker.run(|| async { Err("down".into()) }).await;
    assert!(failed.is_err());
    assert_eq!(breaker.snapshot().counts.failures, 1);

    let ignore_4xx = |result: Result<&u16, &BoxError>| match result {
        Ok(400..=499) => Outcome::Ignore,
        Ok(_) => Outcome::Success,
        Err(_) => Outcome::Failure,
    };
    let status = breaker
        .run_with(ignore_4xx, || async { Ok::<u16, BoxError>(404) })
        .await;
    assert_eq!(status.unwrap(), 404);
    assert_eq!(breaker.snapshot().counts.ignored, 1);

    let panicked = tokio::spawn({
        let breaker = breaker.clone();
        async move {
            breaker
                .run(|| async {
                    if crashes() {
                        panic!("the block crashed");
                    }
                    Ok::<(), BoxError>(())
                })
                .await
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic(), "resumed to the caller");
    assert_eq!(
        breaker.snapshot().counts.failures,
        2,
        "a panic is a failure"
    );

    // Dropped before its block completes: cancelled.
    let mut pending = Box::pin(breaker.run(std::future::pending::<Result<(), BoxError>>));
    let waker = std::task::Waker::noop();
    assert!(pending
        .as_mut()
        .poll(&mut Context::from_waker(waker))
        .is_pending());
    drop(pending);
    assert_eq!(breaker.snapshot().counts.cancelled, 1);

    // Open: refused without running the block.
    breaker.force_open(None);
    let refused: Result<(), BoxError> = breaker
        .run(|| async {
            assert!(!crashes(), "must not run while open");
            Ok(())
        })
        .await;
    assert!(tower_circuit_breaker::CircuitOpen::find(refused.unwrap_err().as_ref()).is_some());
}

/// `run`'s closure itself panics, before it has made a future: still an
/// admitted call that ends as a failure, and a probe that fails reopens.
#[tokio::test(start_paused = true)]
async fn a_panic_while_run_builds_its_future_is_a_failure_and_a_failed_probe() {
    async fn crash_while_building(breaker: &Breaker) -> bool {
        let breaker = breaker.clone();
        tokio::spawn(async move {
            breaker
                .run(|| {
                    if crashes() {
                        panic!("the job crashed before it started");
                    }
                    async { Ok::<(), BoxError>(()) }
                })
                .await
        })
        .await
        .unwrap_err()
        .is_panic()
    }

    let breaker = breaker(1);
    assert!(
        crash_while_building(&breaker).await,
        "resumed to the caller"
    );
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.calls, counts.failures), (1, 1), "{counts:?}");
    assert_eq!(breaker.state(), State::Open, "the failure tripped it");

    advance(Duration::from_secs(10)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    assert!(crash_while_building(&breaker).await);
    assert_eq!(breaker.state(), State::Open, "the crashed probe failed");
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.calls, counts.failures, counts.opened), (2, 2, 2));
}

/// A call in flight through the service when `trip` comes from another
/// task: its outcome belongs to the generation the trip ended.
#[tokio::test(start_paused = true)]
async fn a_trip_from_another_task_opens_it_and_calls_in_flight_count_nowhere() {
    let breaker = breaker(5);
    let (answer, answered) = tokio::sync::oneshot::channel::<bool>();
    let answered = Arc::new(tokio::sync::Mutex::new(Some(answered)));
    let upstream = service_fn(move |_: ()| {
        let answered = Arc::clone(&answered);
        async move {
            let receiver = answered.lock().await.take().expect("one call");
            match receiver.await {
                Ok(true) => Ok(()),
                _ => Err(BoxError::from("upstream failed")),
            }
        }
    });
    let svc = CircuitBreaker::new(upstream, &breaker);
    let in_flight = tokio::spawn(svc.oneshot(()));
    tokio::task::yield_now().await;

    let tripper = tokio::spawn({
        let breaker = breaker.clone();
        async move { breaker.open_on_signal("load shedder: overloaded", Some(Duration::from_secs(30))) }
    });
    assert!(tripper.await.unwrap());
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(30)));
    let snap = breaker.snapshot();
    assert!(
        matches!(snap.last_trip, Some(TripReason::Signal { ref reason }) if &**reason == "load shedder: overloaded")
    );

    answer.send(false).unwrap();
    assert!(in_flight.await.unwrap().is_err());
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.failures, counts.stale), (0, 1), "a stale outcome");

    // Probed and closed on evidence, as any opening.
    advance(Duration::from_secs(30)).await;
    breaker.try_acquire().unwrap().success();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_trip_is_shared_with_the_fleet_like_any_opening() {
    let fleet = MemoryFleet::builder().build().unwrap();
    let (here, there) = (breaker(5), breaker(5));
    // One store per instance, each kept for as long as it shares.
    let (store_here, store_there) = (fleet.instance(), fleet.instance());
    assert!(store_here.attach(&here));
    assert!(store_there.attach(&there));
    tokio::time::sleep(Duration::from_millis(1)).await;

    here.open_on_signal("quota alarm", None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(there.state(), State::Open, "the other instance follows");
    assert_eq!(there.snapshot().last_trip, Some(TripReason::Shared));
}

#[tokio::test(start_paused = true)]
async fn record_feeds_the_policy_while_closed_changes_nothing_while_open_and_says_which() {
    let breaker = breaker(2);
    assert_eq!(breaker.record(Outcome::Failure), Recorded::Counted);
    let hinted = Verdict::new(Outcome::Failure).with_retry_after(Duration::from_secs(60));
    assert_eq!(breaker.record(hinted), Recorded::Opened);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.retry_after(),
        Some(Duration::from_secs(60)),
        "the hint holds"
    );
    assert_eq!(breaker.record(Outcome::Success), Recorded::Ignored);
    assert_eq!(breaker.state(), State::Open, "no probe: it changes nothing");
    advance(Duration::from_secs(61)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    assert_eq!(breaker.record(Outcome::Success), Recorded::Ignored);
    assert_eq!(breaker.state(), State::HalfOpen, "still no probe");
    breaker.force_closed();
    assert_eq!(breaker.record(Outcome::Failure), Recorded::CountedWhileHeld);
    assert_eq!(
        breaker.snapshot().counts.failures,
        3,
        "held closed: counted"
    );
    assert_eq!(breaker.state(), State::ForcedClosed);
    breaker.disable();
    assert_eq!(breaker.record(Outcome::Failure), Recorded::Ignored);
    assert_eq!(
        breaker.snapshot().counts.failures,
        3,
        "disabled: not counted"
    );
}

fn registry() -> Registry<String> {
    Registry::<String>::builder()
        .default_config(
            Config::builder()
                .trip(ConsecutiveFailures::new(2))
                .build()
                .unwrap(),
        )
        .parent(|key: &String| key.split_once('/').map(|(p, _)| p.to_string()))
        .build()
}

#[tokio::test(start_paused = true)]
async fn keyed_permits_count_in_the_key_and_its_parent_and_an_open_parent_refuses() {
    let registry = registry();
    let key = "openai/gpt-x".to_string();
    registry.try_acquire(&key).unwrap().failure();
    drop(registry.try_acquire(&key).unwrap());
    for name in ["openai/gpt-x", "openai"] {
        let counts = registry.get(&name.to_string()).unwrap().snapshot().counts;
        assert_eq!(
            (counts.calls, counts.failures, counts.cancelled),
            (2, 1, 1),
            "{name}"
        );
    }
    registry
        .open_on_signal(&"openai".to_string(), "provider down", None)
        .unwrap();
    match registry.try_acquire(&key) {
        Err(AcquireError::Open(open)) => assert_eq!(open.breaker(), "openai"),
        other => panic!("the open parent refuses: {other:?}"),
    }
    let child = registry.get(&key).unwrap().snapshot();
    assert_eq!(child.counts.calls, 2, "the child was not asked");

    let recorded = registry
        .record(&"openai/gpt-y".to_string(), Outcome::Failure)
        .unwrap();
    assert_eq!(recorded, Recorded::Counted, "the sibling's own breaker");
    let sibling = registry
        .get(&"openai/gpt-y".to_string())
        .unwrap()
        .snapshot();
    assert_eq!(sibling.counts.failures, 1);
}

/// The two-step path and the service path share one admission: half-open
/// with one probe permit, a permit and a service clone compete for it.
#[tokio::test(start_paused = true)]
async fn a_service_probe_and_a_permit_share_the_probe_limit() {
    let breaker = breaker(1);
    breaker.try_acquire().unwrap().failure();
    advance(Duration::from_secs(10)).await;
    let mut svc = CircuitBreaker::new(
        service_fn(|_: ()| async { Ok::<_, BoxError>(()) }),
        &breaker,
    );
    let waker = std::task::Waker::noop();
    assert!(matches!(
        svc.poll_ready(&mut Context::from_waker(waker)),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(
        breaker.snapshot().probes_in_flight,
        1,
        "the service reserved it"
    );
    assert!(breaker.try_acquire().is_err());
    svc.call(()).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
}
