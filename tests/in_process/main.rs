//! The in-process tests: breakers, registries, policies, failover and the
//! in-memory fleet driven through tower services, permits and bodies,
//! mostly on paused tokio time, with property tests against reference
//! models. One binary (one link of the dependency graph), one module per
//! area.
//!
//! The modules share a process and run on parallel threads. What is
//! process-wide here is harmless to the others: `outside_tower`'s counting
//! allocator counts per thread, `grafana_dashboard`'s `metrics` observer
//! reports to a recorder local to its thread (and to no recorder
//! elsewhere), and `chaos`'s and `model`'s panic hook only hides their
//! scripted panics. Tests that install a global recorder, or read
//! `tracing` events that other threads could hide, are binaries of their
//! own (`tests/metrics.rs`, `tests/registry_http.rs`,
//! `tests/redis_metrics.rs`, `tests/traces/`).

#[path = "../common/mod.rs"]
mod common;

mod active_probe;
mod adaptive;
mod adaptive_model;
mod architecture;
mod body;
mod breaker;
mod cancelled_failure;
mod chaos;
mod doc_links;
mod failover;
mod fleet_memory;
mod fuzz_corpus;
mod gate;
mod glob_import;
mod grafana_dashboard;
mod manual;
mod model;
mod outage_demo;
mod outside_tower;
mod policies;
mod probe_backoff;
mod probe_eligibility;
mod probe_races;
mod provider_failures;
mod quota_hold;
mod registry;
mod retry;
mod retry_after;
mod serde;
mod stream_deadlines;
mod take_refusal;
mod time_window_model;
mod tower_http;
mod tower_stacks;
