//! A gRPC router over four tonic backends: a breaker per backend and
//! method, each under its backend's breaker, tonic's own deadlines,
//! failover for unary calls, and streams judged by their trailers.
//!
//! `cargo run --example grpc_router --features tonic` (a few seconds).
//!
//! The backends are `tonic-health` servers on loopback (no protoc): one
//! hangs past every deadline, one answers RESOURCE_EXHAUSTED with
//! `grpc-retry-pushback-ms`, one answers unary calls but ends each `Watch`
//! stream with UNAVAILABLE after its first message, one is steady. Unary
//! `Check`s fail over down the chain; the hanging and pushing-back backends
//! open after a few calls and are skipped without being called. Streams
//! start on the first backend that lets them; the draining backend's
//! `Watch` breaker opens on its streams' trailers while its `Check` breaker
//! stays closed.
//!
//! The wiring is `grpc_router/router.rs`, shown in the guide's page on
//! wiring each client (`src/guide/clients.md`); the scenario,
//! `grpc_router/scenario.rs`, is what `tests/loopback/grpc_router.rs`
//! checks.

#[path = "grpc_router/backends.rs"]
mod backends;
#[path = "grpc_router/router.rs"]
mod router;
#[path = "grpc_router/scenario.rs"]
mod scenario;

use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let run = scenario::run().await?;
    let answered = run.unary.iter().filter(|r| r.is_ok()).count();
    println!(
        "{} unary callers, {} calls each: {answered} answered, {} failed",
        scenario::CALLERS,
        scenario::CALLS,
        run.unary.len() - answered
    );
    for backend in &run.backends {
        println!(
            "  {:<13} received {:>3} RPCs; breaker {:?}, Check {:?}, Watch {:?}",
            backend.name,
            backend.received(),
            run.state(backend.name),
            run.state(&format!("{} /grpc.health.v1.Health/Check", backend.name)),
            run.state(&format!("{} /grpc.health.v1.Health/Watch", backend.name)),
        );
    }
    let pushed = "pushing-back /grpc.health.v1.Health/Check";
    if let Some(open) = run.breaker(pushed) {
        let period = open.retry_after.unwrap_or_default() + open.time_in_state;
        println!("`{pushed}` is open for {period:.1?}: its pushback, 3 s, over the 2 s cooldown");
    }
    for (i, stream) in run.streams.iter().enumerate() {
        let end = match stream.ended {
            Some(code) => format!("ended {code:?}"),
            None => "still open when its reader stopped".to_string(),
        };
        println!("stream {}: {} message(s), {end}", i + 1, stream.messages);
    }
    println!("a unary call after the streams: {:?}", run.after);
    Ok(())
}
