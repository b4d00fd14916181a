//! The tests over loopback: real hyper, tonic and axum servers and clients
//! on free ports of 127.0.0.1, on real time; the examples' wiring run as
//! tests; the admin endpoint. One binary, one module per area, apart from
//! the in-process tests so that their sockets and real-time bounds never
//! share the cores with property tests.
//!
//! `registry_keys` reads the crate's traces while the other modules run
//! without a subscriber: `common::captured` keeps `tracing` asking every
//! subscriber whether a call site is enabled (see there).
//!
//! The admin endpoint of a set of breakers hears every transition of the
//! process and drops a reader that falls 1,024 behind: a module that makes
//! thousands of transitions at once belongs in another binary.

#[path = "../common/mod.rs"]
mod common;

// The model-router demo's own modules, as `cargo run -p model-router`
// builds them (at the root, as there: they name each other as `super::`).
#[cfg(feature = "http-body")]
#[allow(dead_code)]
#[path = "../../examples/router/src/gateway.rs"]
mod gateway;
#[cfg(feature = "http-body")]
#[allow(dead_code)]
#[path = "../../examples/router/src/providers.rs"]
mod providers;
#[cfg(feature = "http-body")]
#[allow(dead_code)]
#[path = "../../examples/router/src/scenario.rs"]
mod scenario;

mod admin;
mod axum_gateway;
mod axum_route_layer;
mod body_panics;
mod grpc_deadlines;
mod grpc_probes;
mod grpc_router;
mod hyper_client;
mod keyed_gateway;
mod model_router;
mod outside_tower_examples;
mod provider_signals;
mod provider_stalls;
mod provider_streams;
mod registry_keys;
mod sse_stream;
mod streamed_bodies;
mod streamed_frameworks;
mod tonic_client;
mod upstream_hints;
