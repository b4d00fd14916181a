//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (cargo
//! feature `metrics`): install any recorder (Prometheus, StatsD...) and the
//! breakers report to it.
//!
//! | metric | kind | labels | when |
//! | --- | --- | --- | --- |
//! | `circuit_breaker_state` | gauge, one-hot: 1 for the current state, 0 for every other | `breaker`, `state` | at creation and on every transition |
//! | `circuit_breaker_transitions_total` | counter | `breaker`, `from`, `to` | on every transition |
//! | `circuit_breaker_calls_total` | counter | `breaker`, `outcome` (`admitted`, `rejected`, `rejected_by_parent` (of the rejected, those a registry parent refused), `failure`, `ignored`, `stale`, `cancelled`, `recorded`) | by [`export`] / [`export_registry`] |
//! | `circuit_breaker_opened_total` | counter | `breaker` | by [`export`] / [`export_registry`] |
//!
//! A Grafana dashboard over these series (states over time per breaker,
//! transitions, refusals, failure rate) is in the crate's repository, as
//! `grafana/circuit-breakers.json`, to import with a Prometheus data source.
//!
//! Call [`install`] once, next to installing your recorder: from then on
//! every breaker's state gauges and transition counters are pushed as
//! transitions happen (the breakers tell an [observer](crate::events::Observer)
//! that this module adds; they know nothing of metrics). Call counts are
//! taken from the breakers' own counts when you export them, typically right
//! before rendering a scrape: the request path writes nothing extra for
//! metrics. The `breaker` label is the breaker's name (its key, in a
//! registry).
//!
//! The outcomes are those of [`Counts`](crate::Counts): `recorded` counts
//! outcomes fed from outside any call ([`Breaker::record`]), which also
//! count in `failure` or `ignored`. There is no `success` series: a
//! closed-state success writes nothing shared (that is what keeps the
//! request path free of contention), so successes are what is left,
//! in PromQL
//!
//! ```text
//! sum without (outcome) (circuit_breaker_calls_total{outcome=~"admitted|recorded"})
//!   - sum without (outcome) (circuit_breaker_calls_total{outcome=~"failure|ignored|stale|cancelled"})
//! ```
//!
//! which counts the calls still in flight as successes until they end.
//!
//! In a [`Registry`], every key gets its own series (six state gauges from
//! the breaker's creation), and a recorder keeps the series of evicted keys
//! unless it is set to drop idle ones (the Prometheus exporter's idle
//! timeout, for one). [`RegistryBuilder::max_keys`](crate::registry::RegistryBuilder::max_keys)
//! bounds the breakers, not the recorder: key on a closed set (providers,
//! models), or let the recorder expire idle series, when keys come from
//! request data.
//!
//! ```
//! use tower_circuit_breaker::{metrics_facade, Breaker, Config};
//!
//! metrics_facade::install(); // once, at start-up, beside the recorder
//! let breaker = Breaker::new(Config::builder().name("openai").build()?);
//! // ... serve requests; then, when scraped:
//! metrics_facade::export(&breaker);
//! # Ok::<_, tower_circuit_breaker::ConfigError>(())
//! ```

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Once};

use ::metrics::{counter, gauge};

use crate::events::{self, Observer, Transition};
use crate::registry::Registry;
use crate::{Breaker, State};

/// Every state, in the order the gauge's series are written.
const STATES: [State; 6] = [
    State::Closed,
    State::Open,
    State::HalfOpen,
    State::ForcedOpen,
    State::ForcedClosed,
    State::Disabled,
];

/// The `state` label of a state: [`State::as_str`].
pub fn state_label(state: State) -> &'static str {
    state.as_str()
}

/// Sets the state gauge one-hot: `current` to 1, every other state to 0.
fn set_state(breaker: &str, current: State) {
    for state in STATES {
        gauge!(
            "circuit_breaker_state",
            "breaker" => breaker.to_string(),
            "state" => state_label(state)
        )
        .set(if state == current { 1.0 } else { 0.0 });
    }
}

/// Reports every breaker of the process from now on: its state gauges at
/// creation and after each transition, and the transition counters. Call
/// it once at start-up (later calls do nothing); breakers made before it
/// report from their next transition, or their next [`export`].
///
/// ```
/// use tower_circuit_breaker::metrics_facade;
///
/// // metrics::set_global_recorder(your_recorder)?;
/// metrics_facade::install();
/// ```
pub fn install() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| events::observe(Arc::new(Metrics)));
}

/// The observer [`install`] adds.
struct Metrics;

impl Observer for Metrics {
    fn created(&self, name: &str) {
        set_state(name, State::Closed);
    }

    fn transition(&self, t: &Transition) {
        set_state(&t.breaker, t.to);
        counter!(
            "circuit_breaker_transitions_total",
            "breaker" => t.breaker.to_string(),
            "from" => state_label(t.from),
            "to" => state_label(t.to)
        )
        .increment(1);
    }
}

/// Reports `breaker`'s counts (and refreshes its state gauge, so that an
/// open breaker whose period has ended reads half-open).
pub fn export(breaker: &Breaker) {
    let snapshot = breaker.snapshot();
    let name = breaker.name().to_string();
    set_state(&name, snapshot.state);
    let counts = snapshot.counts;
    for (outcome, value) in [
        ("admitted", counts.calls),
        ("rejected", counts.rejected),
        ("rejected_by_parent", counts.rejected_by_parent),
        ("failure", counts.failures),
        ("ignored", counts.ignored),
        ("stale", counts.stale),
        ("cancelled", counts.cancelled),
        ("recorded", counts.recorded),
    ] {
        counter!("circuit_breaker_calls_total", "breaker" => name.clone(), "outcome" => outcome)
            .absolute(value);
    }
    counter!("circuit_breaker_opened_total", "breaker" => name).absolute(counts.opened);
}

/// [`export`] for every breaker of a registry.
pub fn export_registry<K>(registry: &Registry<K>)
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    for (_, breaker) in registry.breakers() {
        export(&breaker);
    }
}

/// Redis became unavailable: one more episode, and the gauge at 0.
#[cfg(feature = "redis")]
pub(crate) fn store_unavailable() {
    counter!("circuit_breaker_store_unavailable_total", "store" => "redis").increment(1);
    store_available(false);
}

/// How many index shards a Cluster has cut off now.
#[cfg(feature = "redis")]
pub(crate) fn store_unreachable_shards(shards: usize) {
    gauge!("circuit_breaker_store_unreachable_shards", "store" => "redis").set(shards as f64);
}

/// Whether Redis answers (1) or not (0).
#[cfg(feature = "redis")]
pub(crate) fn store_available(available: bool) {
    gauge!("circuit_breaker_store_available", "store" => "redis").set(if available {
        1.0
    } else {
        0.0
    });
}
