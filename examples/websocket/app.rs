//! The websocket example's wiring, which
//! `tests/loopback/outside_tower_examples.rs` runs too: an axum server whose
//! websocket sessions answer each message by asking a flaky local "model
//! provider", through the breaker's `run_with` (the messages of a session are
//! no tower requests). A message the breaker refuses is answered at once,
//! saying when to come back, and the provider is not called.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State as AxumState;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tower::BoxError;
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitOpen, Config, ConfigError};

use super::flaky_upstream::{http_client, FlakyUpstream, HttpClient};

/// Failures in a row that open the breaker.
pub const THRESHOLD: u32 = 2;
/// How long the breaker stays open before it lets a probe through.
pub const COOLDOWN: Duration = Duration::from_millis(200);

/// The breaker in front of the provider, shared by every session.
pub fn breaker() -> Result<Breaker, ConfigError> {
    Ok(Breaker::new(
        Config::builder()
            .name("provider")
            .trip(ConsecutiveFailures::new(THRESHOLD))
            .cooldown(COOLDOWN)
            .backoff(1.0)
            .build()?,
    ))
}

#[derive(Clone)]
struct Chat {
    breaker: Breaker,
    provider: FlakyUpstream,
    client: HttpClient,
}

/// Serves `GET /chat` (a websocket) on a free port of 127.0.0.1 until the
/// runtime shuts down; every session asks `provider` through `breaker`.
pub async fn serve(provider: &FlakyUpstream, breaker: &Breaker) -> io::Result<SocketAddr> {
    let chat = Chat {
        breaker: breaker.clone(),
        provider: provider.clone(),
        client: http_client(),
    };
    let app = Router::new().route("/chat", get(upgrade)).with_state(chat);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

async fn upgrade(ws: WebSocketUpgrade, AxumState(chat): AxumState<Chat>) -> Response {
    ws.on_upgrade(move |socket| session(socket, chat))
}

/// One session: each text message is answered from the provider, through
/// the breaker, or with the breaker's refusal.
async fn session(mut socket: WebSocket, chat: Chat) {
    while let Some(Ok(message)) = socket.recv().await {
        let Message::Text(prompt) = message else {
            continue;
        };
        let reply = answer(&chat, prompt.as_str()).await;
        if socket.send(Message::Text(reply.into())).await.is_err() {
            return;
        }
    }
}

/// The reply to one prompt.
async fn answer(chat: &Chat, prompt: &str) -> String {
    let request = chat
        .provider
        .request(&format!("/complete/{}", prompt.len()));
    let asked = chat
        .breaker
        .run_with(HttpClassifier::new(), || async {
            chat.client.request(request).await.map_err(BoxError::from)
        })
        .await;
    match asked {
        Ok(response) if response.status().is_success() => format!("answer to {prompt}"),
        Ok(response) => format!("provider failed: {}", response.status().as_u16()),
        Err(err) => match CircuitOpen::find(err.as_ref()) {
            Some(open) => format!(
                "provider unavailable; retry in {} ms",
                open.retry_after().as_millis()
            ),
            None => format!("provider failed: {err}"),
        },
    }
}
