//! The tests over loopback: real hyper, tonic and axum servers and clients
//! on 127.0.0.1 (free ports, real time), the examples' wiring run as
//! tests, and the admin endpoint. One binary, each former test file a
//! module; apart from the in-process tests, so that their sockets and
//! timeouts do not share the cores with property tests.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod axum_gateway;
mod axum_route_layer;
mod body_panics;
mod hyper_client;
mod outside_tower_examples;
mod registry_keys;
mod sse_stream;
mod streamed_bodies;
mod streamed_frameworks;
mod tonic_client;
mod upstream_hints;
