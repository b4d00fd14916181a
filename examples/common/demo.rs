//! What the integration examples (`hyper_client`, `tonic_client`,
//! `axum_gateway`, `sse_stream`) share: printing the breaker's transitions
//! as they happen, and waiting out a breaker's cooldown. Included by path
//! at the root of each example (`#[path = "common/demo.rs"] mod demo;`)
//! and in the tests' `tests/common`; an `app.rs` names it as its sibling
//! (`super::demo`).
#![allow(dead_code)] // a test needs only part of it

use std::time::Duration;

use tower_circuit_breaker::Breaker;
use tracing_subscriber::EnvFilter;

/// Prints the breaker's `tracing` events (its transitions) as they happen,
/// and warnings from anything else; `RUST_LOG` overrides this.
pub fn print_breaker_events() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("warn,tower_circuit_breaker::events=info")),
        )
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
}

/// Sleeps out the rest of an open `breaker`'s cooldown (and a little more),
/// so that the next call is its probe; returns at once if it is not open.
pub async fn wait_out_cooldown(breaker: &Breaker) {
    if let Some(rest) = breaker.retry_after() {
        tokio::time::sleep(rest + Duration::from_millis(20)).await;
    }
}
