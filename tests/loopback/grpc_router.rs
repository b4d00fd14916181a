//! The gRPC router example over loopback (`examples/grpc_router/`): a
//! breaker per backend and method under its backend's breaker, tonic's own
//! deadlines, failover for unary calls, streams judged by their trailers.
//! Real sockets, so real time: the scenario takes about a second, and the
//! test asserts counts and states, not timings.
#![cfg(feature = "tonic")]

#[path = "../../examples/grpc_router/backends.rs"]
mod backends;
#[path = "../../examples/grpc_router/router.rs"]
mod router;
#[path = "../../examples/grpc_router/scenario.rs"]
mod scenario;

use std::time::Duration;

use tonic::Code;
use tower_circuit_breaker::State;

use scenario::{StreamRun, CALLERS, CALLS, STREAMS};

const CHECK: &str = "/grpc.health.v1.Health/Check";
const WATCH: &str = "/grpc.health.v1.Health/Watch";

#[tokio::test]
async fn the_router_fails_over_unary_calls_and_judges_streams_by_their_trailers() {
    let run = tokio::time::timeout(Duration::from_secs(60), scenario::run())
        .await
        .expect("the scenario ends")
        .expect("the scenario runs");
    let [hanging, pushing_back, draining, steady] = &run.backends[..] else {
        panic!("four backends");
    };

    // Every unary caller got an answer: a hang past the deadline and a
    // RESOURCE_EXHAUSTED were failed over, never handed back.
    assert_eq!(run.unary.len(), CALLERS * CALLS);
    let failed: Vec<_> = run.unary.iter().filter_map(|r| r.err()).collect();
    assert!(failed.is_empty(), "calls answered {failed:?}");
    // Each failing backend was paid for by the first wave of callers (one
    // call each) and at most a probe or two after; then skipped uncalled.
    for backend in [hanging, pushing_back] {
        assert!(
            backend.received() <= CALLERS + 2,
            "{} received {}",
            backend.name,
            backend.received()
        );
        assert_eq!(
            run.state(backend.name),
            Some(State::Open),
            "{}",
            backend.name
        );
        let check = format!("{} {CHECK}", backend.name);
        assert_eq!(run.state(&check), Some(State::Open), "{check}");
    }
    // The hanging backend's calls ended at tonic's deadline, as failures.
    let hung = run.breaker(&format!("hanging {CHECK}")).unwrap();
    assert!(hung.counts.failures >= 3, "{:?}", hung.counts);
    // The pushback set the open period: 3 s, over the 2 s cooldown.
    let pushed = run.breaker(&format!("pushing-back {CHECK}")).unwrap();
    let period = pushed.retry_after.expect("open") + pushed.time_in_state;
    let around = Duration::from_millis(2_900)..=Duration::from_millis(3_100);
    assert!(around.contains(&period), "{period:?}");

    // Streams: the first three started on the draining backend and ended
    // with UNAVAILABLE in their trailers after a message; its `Watch`
    // breaker opened on them, so the fourth started on the steady one.
    let drained = StreamRun {
        messages: 1,
        ended: Some(Code::Unavailable),
    };
    assert_eq!(run.streams.len(), STREAMS);
    assert_eq!(
        run.streams[..3],
        [drained.clone(), drained.clone(), drained]
    );
    let steady_stream = StreamRun {
        messages: 1,
        ended: None,
    };
    assert_eq!(run.streams[3], steady_stream);
    let watch = run.breaker(&format!("draining {WATCH}")).unwrap();
    assert_eq!(watch.state, State::Open);
    assert_eq!(watch.counts.failures, 3);
    // A breaker per method: the draining backend's `Check` and the backend
    // itself stay closed, and unary calls still go there.
    assert_eq!(run.state(&format!("draining {CHECK}")), Some(State::Closed));
    assert_eq!(run.state("draining"), Some(State::Closed));
    assert_eq!(run.after, Ok(()));
    assert_eq!(steady.received(), 1, "only the fourth stream");
    assert!(draining.received() >= CALLERS * CALLS);
    // The open backends refused the streams without being called.
    for backend in [hanging, pushing_back] {
        let watch = run.breaker(&format!("{} {WATCH}", backend.name));
        assert_eq!(watch.map(|w| w.counts.calls), Some(0), "{}", backend.name);
    }
}

#[test]
fn the_guides_grpc_router_is_the_routers_wiring() {
    let wiring = include_str!("../../examples/grpc_router/router.rs");
    let page = include_str!("../../src/guide/clients.md");
    let marker = "<!-- the gRPC router's wiring: examples/grpc_router/router.rs -->";
    let code = crate::model_router::shown_block(page, marker);
    assert_eq!(
        code, wiring,
        "the guide's clients page shows grpc_router/router.rs as it is"
    );
}
