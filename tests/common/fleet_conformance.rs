//! One suite of fleet behaviours, run against both fleet backends: the
//! in-process memory fleet on paused time (`tests/in_process/fleet_memory.rs`)
//! and a real `redis-server` on real time (`tests/redis/conformance.rs`).
//! Each scenario is written once, over [`store::Fleet`], so the two
//! backends are held to the same promises under the same names.
//!
//! Each instance is its own store with its own breaker of the shared name,
//! called as a service is: a clone per request, each request a task of its
//! own. Every wait is on tokio's clock (paused time advances by itself,
//! real time is polled) and bounded, failing with what it waited for.

use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::store::Fleet;
use tower_circuit_breaker::{Breaker, CircuitOpen, Config, Control, State};

use super::Upstream;

/// How long a shared opening lasts in every scenario.
pub const OPEN: Duration = Duration::from_millis(500);

/// A fleet backend under test.
pub trait Backend {
    /// A fresh fleet of its own (no state shared with any other) whose
    /// openings need `quorum` instances failing; each call of the function
    /// returned is a new instance's store.
    fn fleet(&self, quorum: u32) -> Box<dyn Fn() -> Fleet + '_>;
}

/// One instance of the service.
pub struct Instance {
    pub store: Fleet,
    pub breaker: Breaker,
}

impl Instance {
    /// An instance whose breaker of `name` opens after `failures`
    /// failures in a row, for [`OPEN`].
    pub fn new(store: Fleet, name: &str, failures: u32) -> Self {
        let config = Config::builder()
            .name(name)
            .trip(ConsecutiveFailures::new(failures))
            .cooldown(OPEN)
            .backoff(1.0)
            .build()
            .expect("a valid config");
        let breaker = Breaker::new(config);
        assert!(store.attach(&breaker));
        Instance { store, breaker }
    }

    /// One request (`0`: a probe, if it reaches the upstream), on a task
    /// of its own with a clone of the client; whether the breaker refused
    /// it.
    pub async fn refused(&self, upstream: &Upstream, request: u32) -> bool {
        let client = self.breaker.layer().layer(upstream.clone());
        let call = tokio::spawn(async move { client.oneshot(request).await });
        match call.await.expect("the request task ran") {
            Ok(_) => false,
            Err(e) => CircuitOpen::find(e.as_ref()).is_some(),
        }
    }

    pub fn state(&self) -> State {
        self.breaker.state()
    }
}

/// `n` instances of `new`, each with its breaker of `name`, in step with
/// the fleet.
pub async fn instances(
    new: &dyn Fn() -> Fleet,
    n: usize,
    name: &str,
    failures: u32,
) -> Vec<Instance> {
    let fleet: Vec<Instance> = (0..n)
        .map(|_| Instance::new(new(), name, failures))
        .collect();
    // Every store has read the fleet once: its state of the name is known.
    let store = &fleet[0].store;
    let state = store.state(name).await.expect("the fleet answers");
    assert_eq!(state.opening, None);
    settle().await;
    fleet
}

/// Waits until `done` holds; fails after 10 s of tokio's clock naming
/// `what`.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Lets the stores take in what they were told: on paused time, every
/// task runs first; on real time, longer than a refresh interval (the
/// Redis backend's is 200 ms here).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

/// Waits until the fleet counts `n` failures of `name`, as `store` reads
/// it; fails after 10 s of tokio's clock.
pub async fn counted(store: &Fleet, name: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = store.state(name).await.expect("the fleet answers");
        if state.failures == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never counted {n} failures: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every instance sends a request every 10 ms until one reaches the
/// upstream (the probe, once the open period is over); then every
/// instance must close, the upstream having seen that one call.
async fn probe_closes_the_fleet(fleet: &[Instance], upstream: &Upstream) {
    let calls = upstream.calls();
    let deadline = Instant::now() + Duration::from_secs(10);
    'probing: loop {
        assert!(Instant::now() < deadline, "never probed");
        for instance in fleet {
            instance.refused(upstream, 0).await;
            if upstream.calls() > calls {
                break 'probing;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    all_in(fleet, State::Closed, "the probe closed every instance").await;
    assert_eq!(upstream.calls(), calls + 1, "one probe for the fleet");
}

/// `n` requests through `instance`, each failing at the upstream.
async fn fail(instance: &Instance, upstream: &Upstream, n: usize) {
    upstream.fail();
    for _ in 0..n {
        assert!(!instance.refused(upstream, 1).await, "refused, not failed");
    }
}

async fn all_in(fleet: &[Instance], state: State, what: &str) {
    eventually(what, || fleet.iter().all(|i| i.state() == state)).await;
}

/// Failures spread over three instances, one each, open all three.
pub async fn failures_spread_over_instances_open_every_instance(backend: &impl Backend) {
    let new = backend.fleet(1);
    let fleet = instances(&*new, 3, "spread", 3).await;
    let upstream = Upstream::default();
    upstream.fail();
    for instance in &fleet[..2] {
        assert!(!instance.refused(&upstream, 1).await);
    }
    counted(&fleet[2].store, "spread", 2).await;
    assert!(fleet.iter().all(|i| i.state() == State::Closed));
    assert!(!fleet[2].refused(&upstream, 1).await);
    all_in(
        &fleet,
        State::Open,
        "the third failure opened every instance",
    )
    .await;
    assert!(fleet[2]
        .store
        .state("spread")
        .await
        .unwrap()
        .opening
        .is_some());
}

/// A success anywhere starts the shared count again.
pub async fn a_success_anywhere_resets_the_shared_count(backend: &impl Backend) {
    let new = backend.fleet(1);
    let fleet = instances(&*new, 2, "reset-count", 3).await;
    let upstream = Upstream::default();
    upstream.fail();
    assert!(!fleet[0].refused(&upstream, 1).await);
    assert!(!fleet[0].refused(&upstream, 1).await);
    counted(&fleet[1].store, "reset-count", 2).await;
    // Once every instance has heard of the count (the Redis store, at its
    // next refresh; a success writes only when its instance knows the
    // count is not zero).
    settle().await;
    upstream.recover();
    assert!(!fleet[1].refused(&upstream, 1).await);
    counted(&fleet[0].store, "reset-count", 0).await;
    // A failure after the success (where the instance's own streak also
    // started again): one in the fleet's count, which opens nothing.
    upstream.fail();
    assert!(!fleet[1].refused(&upstream, 1).await);
    counted(&fleet[0].store, "reset-count", 1).await;
    settle().await;
    assert_eq!(
        [fleet[0].state(), fleet[1].state()],
        [State::Closed; 2],
        "one failure after the success opens nothing"
    );
}

/// Four instances calling every 10 ms through an outage send one probe
/// per open period between them, and the probe that succeeds closes all.
pub async fn instances_send_one_probe_per_open_period_and_all_learn_the_result(
    backend: &impl Backend,
) {
    let new = backend.fleet(1);
    let fleet = instances(&*new, 4, "probes", 1).await;
    let upstream = Upstream::default();
    upstream.fail();
    assert!(!fleet[0].refused(&upstream, 1).await);
    all_in(&fleet, State::Open, "the failure opened every instance").await;
    let before = upstream.calls();
    let started = Instant::now();
    while started.elapsed() < OPEN * 5 {
        for instance in &fleet {
            instance.refused(&upstream, 0).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probes = upstream.calls() - before;
    let periods = (started.elapsed().as_millis() / OPEN.as_millis()) as usize;
    assert!(
        (periods.saturating_sub(2)..=periods).contains(&probes),
        "{probes} probes in {periods} open periods: at most one each"
    );

    upstream.recover();
    probe_closes_the_fleet(&fleet, &upstream).await;
}

/// Below the quorum, one instance's failures open only its own breaker;
/// a second instance failing makes the quorum and opens every one.
pub async fn below_the_quorum_one_instance_opens_alone_and_a_quorum_opens_all(
    backend: &impl Backend,
) {
    let new = backend.fleet(2);
    let fleet = instances(&*new, 3, "quorum", 2).await;
    let upstream = Upstream::default();
    fail(&fleet[0], &upstream, 2).await;
    eventually("the first instance open on its own", || {
        fleet[0].state() == State::Open
    })
    .await;
    settle().await;
    assert_eq!(
        [fleet[1].state(), fleet[2].state()],
        [State::Closed; 2],
        "one instance is no quorum"
    );
    let state = fleet[1].store.state("quorum").await.unwrap();
    assert_eq!(state.opening, None);
    assert_eq!(
        state.votes.len(),
        1,
        "its opening counts as a vote: {state:?}"
    );
    assert!(!fleet[1].refused(&upstream, 1).await);
    all_in(&fleet, State::Open, "two instances failing opened all").await;
}

/// A fleet-wide hold reaches every instance's breaker, and an instance's
/// that attaches later; restore undoes it everywhere; a hold one instance
/// made on its own while the fleet held nothing is left alone.
pub async fn a_fleet_wide_hold_reaches_every_instance_and_restore_undoes_it(
    backend: &impl Backend,
) {
    let new = backend.fleet(1);
    let mut fleet = instances(&*new, 3, "held", 2).await;
    let upstream = Upstream::default();
    let steer = fleet[1].store.clone();
    for (control, held) in [
        (Control::ForceClosed, State::ForcedClosed),
        (Control::Disable, State::Disabled),
        (Control::ForceOpen(None), State::ForcedOpen),
    ] {
        steer.control("held", control).await.unwrap();
        all_in(&fleet, held, &format!("{control:?} everywhere")).await;
        assert_eq!(steer.state("held").await.unwrap().control, Some(control));
    }
    let before = upstream.calls();
    for instance in &fleet {
        assert!(instance.refused(&upstream, 1).await);
    }
    assert_eq!(
        upstream.calls(),
        before,
        "a held-open instance calls nothing"
    );
    fleet.push(Instance::new(new(), "held", 2));
    all_in(&fleet, State::ForcedOpen, "the late instance held open too").await;

    steer.control("held", Control::Restore).await.unwrap();
    all_in(&fleet, State::Closed, "restored everywhere").await;
    for instance in &fleet {
        assert!(!instance.refused(&upstream, 1).await);
    }
    assert_eq!(steer.state("held").await.unwrap().control, None);

    fleet[0].breaker.force_open(None);
    steer.control("held", Control::Restore).await.unwrap();
    settle().await;
    assert_eq!(fleet[0].state(), State::ForcedOpen, "its own hold");
    assert_eq!(fleet[1].state(), State::Closed);
}

/// A fleet-wide force-open for a period is an opening like any other: one
/// instance probes once it ends, for the whole fleet.
pub async fn a_timed_fleet_force_open_ends_in_one_probe_for_the_fleet(backend: &impl Backend) {
    let new = backend.fleet(1);
    let fleet = instances(&*new, 4, "timed", 2).await;
    let upstream = Upstream::default();
    fleet[0]
        .store
        .control("timed", Control::ForceOpen(Some(OPEN * 2)))
        .await
        .unwrap();
    all_in(&fleet, State::Open, "open everywhere").await;
    let opening = fleet[3].store.state("timed").await.unwrap().opening;
    assert!(opening.expect("a fleet opening").open_for <= OPEN * 2);
    probe_closes_the_fleet(&fleet, &upstream).await;
}

/// A fleet-wide reset forgets the fleet's opening and count, and resets
/// every instance's breaker, holds included.
pub async fn a_fleet_wide_reset_forgets_the_opening_and_every_instances_counts(
    backend: &impl Backend,
) {
    let new = backend.fleet(1);
    let fleet = instances(&*new, 3, "reset", 2).await;
    let upstream = Upstream::default();
    fail(&fleet[0], &upstream, 2).await;
    all_in(&fleet, State::Open, "open everywhere").await;
    fleet[2].breaker.force_closed();
    let steer = fleet[1].store.clone();
    steer.control("reset", Control::Reset).await.unwrap();
    all_in(&fleet, State::Closed, "reset everywhere").await;
    let state = steer.state("reset").await.unwrap();
    assert_eq!((state.opening, state.failures), (None, 0));
    assert!(!fleet[1].refused(&upstream, 1).await);
    settle().await;
    assert!(
        fleet.iter().all(|i| i.state() == State::Closed),
        "the counts started again: one failure opens nothing"
    );
}

/// One test per scenario of the suite, each `#[$test]` on `$backend`:
/// the backends' files name the suite once, so none can leave a scenario
/// out.
#[allow(unused_macros)]
macro_rules! conformance_tests {
    (#[$test:meta] $backend:expr) => {
        $crate::common::fleet_conformance::conformance_tests!(@each #[$test] $backend;
            failures_spread_over_instances_open_every_instance,
            a_success_anywhere_resets_the_shared_count,
            instances_send_one_probe_per_open_period_and_all_learn_the_result,
            below_the_quorum_one_instance_opens_alone_and_a_quorum_opens_all,
            a_fleet_wide_hold_reaches_every_instance_and_restore_undoes_it,
            a_timed_fleet_force_open_ends_in_one_probe_for_the_fleet,
            a_fleet_wide_reset_forgets_the_opening_and_every_instances_counts,
        );
    };
    (@each #[$test:meta] $backend:expr; $($scenario:ident),* $(,)?) => {$(
        #[$test]
        async fn $scenario() {
            $crate::common::fleet_conformance::$scenario(&$backend).await;
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use conformance_tests;
