//! The `metrics` feature: one-hot state gauges after every transition,
//! transition counters, and counts exported from snapshots. In a test binary
//! of its own: it installs the global recorder.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::advance;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{metrics_facade, Breaker, CircuitBreaker, Config, State};

/// Counters the crate sets to absolute values when exporting.
const ABSOLUTE: [&str; 2] = [
    "circuit_breaker_calls_total",
    "circuit_breaker_opened_total",
];

/// What the recorder saw so far. Its snapshots hand out each counter's
/// increase and each gauge's value once, so they are accumulated here.
struct Seen {
    snapshotter: Snapshotter,
    counters: HashMap<(String, String), f64>,
    gauges: HashMap<(String, String), f64>,
}

impl Seen {
    fn new(snapshotter: Snapshotter) -> Self {
        Seen {
            snapshotter,
            counters: HashMap::new(),
            gauges: HashMap::new(),
        }
    }

    /// Values of every series of `name` for `breaker`, keyed by the labels
    /// other than `breaker`, joined.
    fn series(&mut self, name: &str, breaker: &str) -> HashMap<String, f64> {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let id = (key.key().name().to_string(), labels.join(","));
            match value {
                // Exported counts are absolute (and never go down); a
                // snapshot taken after one reads zero until the next export.
                DebugValue::Counter(n) if ABSOLUTE.contains(&id.0.as_str()) => {
                    let count = self.counters.entry(id).or_default();
                    *count = count.max(n as f64);
                }
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n as f64,
                DebugValue::Gauge(g) => {
                    self.gauges.insert(id, g.into_inner());
                }
                DebugValue::Histogram(_) => {}
            }
        }
        let own = format!("breaker={breaker}");
        self.counters
            .iter()
            .chain(&self.gauges)
            .filter(|((n, labels), _)| n == name && labels.split(',').any(|l| l == own))
            .map(|((_, labels), v)| {
                let rest: Vec<&str> = labels.split(',').filter(|l| *l != own).collect();
                (rest.join(","), *v)
            })
            .collect()
    }

    fn assert_one_hot(&mut self, breaker: &str, expected: &str) {
        let gauges = self.series("circuit_breaker_state", breaker);
        assert_eq!(gauges.len(), 6, "one series per state: {gauges:?}");
        for (labels, value) in &gauges {
            let want = if labels == &format!("state={expected}") {
                1.0
            } else {
                0.0
            };
            assert_eq!(*value, want, "{labels} while {expected}: {gauges:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn state_gauge_is_one_hot_after_every_transition_and_counts_export() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen::new(recorder.snapshotter());
    recorder
        .install()
        .expect("the only recorder in this binary");
    metrics_facade::install();

    let breaker = Breaker::new(
        Config::builder()
            .name("metered")
            .trip(ConsecutiveFailures::new(1))
            .cooldown(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    seen.assert_one_hot("metered", "closed");

    let mut svc = CircuitBreaker::new(
        service_fn(|fail: bool| async move {
            if fail {
                Err(BoxError::from("down"))
            } else {
                Ok(())
            }
        }),
        &breaker,
    );
    let _ = svc.ready().await.unwrap().call(true).await;
    seen.assert_one_hot("metered", "open");
    let _ = svc.ready().await.unwrap().call(false).await; // refused

    advance(Duration::from_secs(10)).await;
    // Read half-open from the clock before any call: exported, it shows.
    metrics_facade::export(&breaker);
    seen.assert_one_hot("metered", "half_open");

    svc.ready().await.unwrap().call(false).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    seen.assert_one_hot("metered", "closed");
    breaker.force_open(None);
    seen.assert_one_hot("metered", "forced_open");
    breaker.disable();
    seen.assert_one_hot("metered", "disabled");
    breaker.restore();
    seen.assert_one_hot("metered", "closed");

    let transitions = seen.series("circuit_breaker_transitions_total", "metered");
    assert_eq!(transitions["from=closed,to=open"], 1.0);
    assert_eq!(transitions["from=open,to=half_open"], 1.0);
    assert_eq!(transitions["from=half_open,to=closed"], 1.0);
    assert_eq!(transitions["from=closed,to=forced_open"], 1.0);

    // A call whose caller gives up before the answer: cancelled.
    drop(svc.ready().await.unwrap().call(false));
    // A health check's result, fed from outside any call.
    breaker.record(tower_circuit_breaker::classify::Outcome::Success);

    metrics_facade::export(&breaker);
    let calls = seen.series("circuit_breaker_calls_total", "metered");
    assert_eq!(calls["outcome=admitted"], 3.0);
    assert_eq!(calls["outcome=rejected"], 1.0);
    assert_eq!(calls["outcome=failure"], 1.0);
    assert_eq!(calls["outcome=cancelled"], 1.0);
    assert_eq!(calls["outcome=recorded"], 1.0);
    // Successes, as the module docs derive them: the probe and the check.
    let settled = ["failure", "ignored", "stale", "cancelled"]
        .map(|o| calls.get(&format!("outcome={o}")).copied().unwrap_or(0.0));
    let successes =
        calls["outcome=admitted"] + calls["outcome=recorded"] - settled.iter().sum::<f64>();
    assert_eq!(successes, 2.0);
    let opened = seen.series("circuit_breaker_opened_total", "metered");
    assert_eq!(
        opened[""], 1.0,
        "the trip; an operator's hold is a state of its own"
    );
}
