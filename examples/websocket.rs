//! A websocket server behind the breaker, without tower: each message of a
//! session asks a flaky local "model provider" through `breaker.run_with`,
//! and a message the breaker refuses is answered at once with when to come
//! back, without calling the provider. A client sends a prompt every 40 ms;
//! the provider fails for a while, the breaker opens after two failures,
//! and a probe closes it once the provider has recovered.
//!
//! `cargo run --example websocket` (about a second).
//!
//! The wiring is `websocket/app.rs`, which
//! `tests/loopback/outside_tower_examples.rs` runs too.

#[path = "websocket/app.rs"]
mod app;
#[path = "common/demo.rs"]
mod demo;
#[path = "common/flaky_upstream.rs"]
mod flaky_upstream;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tower::BoxError;

use flaky_upstream::FlakyUpstream;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    demo::print_breaker_events();
    let provider = FlakyUpstream::start().await?;
    let breaker = app::breaker()?;
    let addr = app::serve(&provider, &breaker).await?;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/chat")).await?;
    provider.fail(true);
    for n in 0..16 {
        if n == 6 {
            provider.fail(false); // the provider recovers
        }
        socket.send(Message::text(format!("prompt-{n}"))).await?;
        if let Some(reply) = socket.next().await {
            println!("prompt-{n}: {}", reply?.to_text()?);
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    println!(
        "the provider received {} requests for 16 prompts",
        provider.received()
    );
    Ok(())
}
