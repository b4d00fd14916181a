//! The fleet's shared state against real `redis-server` processes on free
//! loopback ports (started and stopped by the tests; a missing binary
//! fails with what to install): one server, a three-node cluster, and the
//! fleet example's scenario. Built with the `redis` feature
//! (`required-features` in Cargo.toml).

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod cluster_failover;
mod conformance;
#[cfg(feature = "admin")]
mod fleet_control;
mod fleet_example;
mod server;
