//! A server-sent event stream through a breaker that judges each call at
//! the end of its stream.
//!
//! `cargo run --example sse_stream --features http-body` (under a second).
//!
//! A completion streamed as server-sent events answers `200 OK` at once and
//! may still die midway. With `CircuitBreakerLayer::classify(StreamingHttp::new())`
//! the response body records the outcome when the stream ends: a stream cut
//! midway is a failure (here it opens the breaker, set to open on one
//! failure), and a stream read to its end is a success (here the half-open
//! probe, which closes the breaker only once its last event is in). The
//! upstream is a hyper server on a free port of 127.0.0.1; the breaker's
//! counts are printed at the end.
//!
//! The wiring is `sse_stream/app.rs`, which `tests/loopback/sse_stream.rs` runs
//! too.

#[path = "sse_stream/app.rs"]
mod app;
#[path = "common/demo.rs"]
mod demo;

use std::sync::atomic::Ordering;

use tower::BoxError;

use app::Seen;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    demo::print_breaker_events();

    let (addr, received) = app::serve().await?;
    let breaker = app::breaker()?;
    println!("event stream upstream on {addr}; one failure opens the breaker");
    app::run(addr, &breaker, |path, seen| match seen {
        Seen::Head(status, state) => {
            println!("GET {path}: {status}, breaker {state:?} (judged at the end of the stream)")
        }
        Seen::Event(data) => println!("    event: {data}"),
        Seen::End {
            error: Some(err),
            state,
        } => {
            println!("    stream cut: {err}; breaker {state:?}")
        }
        Seen::End { error: None, state } => println!("    stream complete; breaker {state:?}"),
        Seen::Refused(state) => println!("GET {path}: refused without sending, breaker {state:?}"),
        Seen::Failed(err) => println!("GET {path}: failed: {err}"),
    })
    .await;

    let counts = breaker.snapshot().counts;
    println!(
        "breaker counts: {} calls sent ({} success, {} failure, {} ignored), {} refused, {} probe; \
         upstream received {}",
        counts.calls,
        counts.calls - counts.failures - counts.ignored - counts.stale,
        counts.failures,
        counts.ignored,
        counts.rejected,
        counts.probes,
        received.load(Ordering::SeqCst),
    );
    Ok(())
}
