//! The fleet demo's scenario (`examples/fleet/scenario.rs`, the same code
//! `cargo run --example fleet` runs), run as a test against a
//! `redis-server` it starts on a free loopback port (a missing binary fails
//! with a message saying what to install), and its story checked.
//!
//! The demo runs on real time (Redis expiry does), so everything asserted
//! here is a count, with margins a loaded machine cannot break; where time
//! comes in, it is the time the run actually took, which a slow machine
//! only lengthens.

#[path = "../../examples/fleet/ledger.rs"]
mod ledger;
use crate::common::redis::local_redis;
#[path = "../../examples/fleet/report.rs"]
mod report;
#[path = "../../examples/fleet/scenario.rs"]
mod scenario;

use tower_circuit_breaker::policy::{PolicyFigures, TripReason};
use tower_circuit_breaker::State;

#[test]
fn four_instances_open_probe_one_at_a_time_and_close_as_one() {
    let redis = local_redis::LocalRedis::start().unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let timing = scenario::Timing::demo();
    let report = runtime
        .block_on(scenario::run(&redis.url(), "fleet-test", timing))
        .expect("the demo runs");
    // The demo's own printing, on the figures checked below.
    println!("{}", report::table(&report));
    println!("{}", report::summary(&report));

    // Every instance opened, and the first opening anywhere came from the
    // fleet's count or from an instance's own failures, never elsewhere.
    assert_eq!(report.instances.len(), timing.instances);
    for instance in &report.instances {
        let opened = instance
            .transitions
            .iter()
            .find(|t| t.to == State::Open)
            .unwrap_or_else(|| panic!("{} never opened", instance.name));
        assert!(
            matches!(
                opened.reason,
                Some(
                    TripReason::Shared | TripReason::Policy(PolicyFigures::ConsecutiveFailures(_))
                )
            ),
            "{}: opened for {:?}",
            instance.name,
            opened.reason
        );
        assert!(instance.refused > 0, "{} refused nothing", instance.name);
    }
    assert!(report.trip_failures.len() >= timing.threshold as usize);

    // While the provider failed, the fleet kept its calls off it: the
    // failures that opened the breaker, a straggler or two, and the probes.
    let requests = report.total(|i| i.outage_requests);
    let upstream = report.total(|i| i.outage_upstream_calls);
    assert!(
        requests >= 100,
        "only {requests} requests during the outage"
    );
    assert!(
        upstream * 5 <= requests,
        "{upstream} of {requests} requests reached the failing provider"
    );

    // At most one probe per open period across the fleet: no two probes
    // ever in flight at once, every probe sent under the fleet's probe
    // lock, and no more probes during the outage than open periods fit in
    // it (a slow machine makes periods fewer, never more).
    let outage_probes = report.outage_probes().count() as u64;
    assert!(outage_probes >= 1, "the fleet never probed the outage");
    assert!(
        outage_probes <= report.outage_periods() + 1,
        "{outage_probes} probes in at most {} open periods",
        report.outage_periods()
    );
    let mut probes = report.probes.clone();
    probes.sort_by_key(|p| p.started);
    for pair in probes.windows(2) {
        assert!(
            pair[1].started >= pair[0].ended,
            "two probes at once: {:?}",
            pair
        );
    }
    let locks = report.total(|i| i.probe_locks_won);
    assert!(
        locks >= report.probes.len() as u64,
        "{} probes, only {locks} probe locks won",
        report.probes.len()
    );

    // After the recovery, one probe was answered and everyone closed.
    assert!(report.probes.iter().any(|p| p.succeeded));
    assert!(report.all_closed, "not every breaker closed");
    for instance in &report.instances {
        let last = instance.transitions.last().expect("transitions");
        assert_eq!(
            last.to,
            State::Closed,
            "{} ends {:?}",
            instance.name,
            last.to
        );
    }
}
