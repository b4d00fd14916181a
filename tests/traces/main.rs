//! Tests that read what the crate says through `tracing`, each with a
//! subscriber of its own on its thread. In a binary of their own: `tracing`
//! caches whether a call site is enabled, and while a single subscriber is
//! registered a call site first reached on a thread without one is cached
//! as disabled for every thread, so tests on other threads without a
//! subscriber could hide events from these. `grpc_misuse` also needs the
//! process's once-only gRPC warning to itself.

#[path = "../common/mod.rs"]
mod common;

mod events;
mod failover_events;
mod grpc_misuse;
