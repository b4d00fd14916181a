//! The in-process tests: breakers, registries, policies, failover and
//! stores driven through tower services, permits and bodies on paused
//! tokio time, with property tests against reference models. One binary
//! (one link of the dependency graph), each former test file a module.
//!
//! They share the process: a counting allocator (`outside_tower`) counts
//! per thread, and the `metrics` observer the dashboard test adds
//! (`grafana_dashboard`) reports to a recorder local to its thread.
//! Tests that need a global recorder, or a `tracing` subscriber that no
//! other thread may disturb, are binaries of their own (`tests/metrics.rs`,
//! `tests/registry_http.rs`, `tests/redis_metrics.rs`, `tests/traces/`).

#[path = "../common/mod.rs"]
mod common;

mod active_probe;
mod adaptive;
mod adaptive_model;
mod architecture;
mod body;
mod breaker;
mod chaos;
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
mod probe_races;
mod registry;
mod retry;
mod retry_after;
mod serde;
mod take_refusal;
mod time_window_model;
mod tower_http;
mod tower_stacks;
