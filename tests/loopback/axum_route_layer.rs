//! A breaker guarding an axum route on the server side, wired as the
//! guide's "guarding a route" shows (`src/guide/clients.md`: `route_layer`,
//! `HandleErrorLayer` outside the breaker, a timeout inside it), served on
//! loopback and called over real HTTP. Real sockets, so real time: the
//! test asserts answers and counts, not timings.
#![cfg(feature = "axum")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use http::header::RETRY_AFTER;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower::{BoxError, ServiceBuilder};
use tower_circuit_breaker::classify::{is_timeout, HttpClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config, State};

const THRESHOLD: u32 = 2;
const COOLDOWN: Duration = Duration::from_secs(60);

/// The route's dependency: fails (the handler answers 502) while `failing`.
#[derive(Clone, Default)]
struct Provider {
    failing: Arc<AtomicBool>,
    handled: Arc<AtomicUsize>,
}

/// The app: `POST /complete` behind the breaker, and an unguarded
/// `POST /echo`.
fn app(breaker: &Breaker, provider: &Provider) -> Router {
    let guard = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(|err: BoxError| async move {
            match CircuitOpen::take(err) {
                Ok(open) => open.into_response(),
                Err(err) if is_timeout(err.as_ref()) => StatusCode::GATEWAY_TIMEOUT.into_response(),
                Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
            }
        }))
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(HttpClassifier::new()))
        .timeout(Duration::from_secs(30));
    let provider = provider.clone();
    let complete = move |prompt: String| async move {
        provider.handled.fetch_add(1, Ordering::SeqCst);
        if provider.failing.load(Ordering::SeqCst) {
            Err(StatusCode::BAD_GATEWAY)
        } else {
            Ok(format!("completion of {prompt:?}"))
        }
    };
    Router::new()
        .route("/complete", post(complete))
        .route_layer(guard)
        .route("/echo", post(|body: String| async move { body }))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: String,
}

async fn post_to(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> Answer {
    let request = http::Request::post(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::from("hello")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_string());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        retry_after,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn breaker() -> Breaker {
    let config = Config::builder()
        .name("completions")
        .trip(ConsecutiveFailures::new(THRESHOLD))
        .cooldown(COOLDOWN)
        .build()
        .unwrap();
    Breaker::new(config)
}

#[tokio::test]
async fn an_open_breaker_on_a_route_answers_503_with_retry_after_without_running_the_handler() {
    let (breaker, provider) = (breaker(), Provider::default());
    let addr = serve(app(&breaker, &provider)).await;
    let client = Client::builder(TokioExecutor::new()).build_http();

    let ok = post_to(&client, addr, "/complete").await;
    assert_eq!(
        (ok.status, ok.body.as_str()),
        (StatusCode::OK, "completion of \"hello\"")
    );

    // The handler's 502s are the route's failures: they open the breaker.
    provider.failing.store(true, Ordering::SeqCst);
    for _ in 0..THRESHOLD {
        let failed = post_to(&client, addr, "/complete").await;
        assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
        assert_eq!(failed.retry_after, None);
    }
    assert_eq!(breaker.state(), State::Open);
    let handled = provider.handled.load(Ordering::SeqCst);
    assert_eq!(handled, 1 + THRESHOLD as usize);

    // Refused by the breaker, answered by HandleErrorLayer: the handler is
    // not run.
    for _ in 0..3 {
        let refused = post_to(&client, addr, "/complete").await;
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            refused.retry_after.as_deref(),
            Some("60"),
            "the cooldown's remaining seconds, rounded up"
        );
        assert!(refused.body.contains("completions"), "{}", refused.body);
    }
    assert_eq!(provider.handled.load(Ordering::SeqCst), handled);
    assert_eq!(breaker.snapshot().counts.rejected, 3);

    // Other routes are not behind it.
    let echo = post_to(&client, addr, "/echo").await;
    assert_eq!((echo.status, echo.body.as_str()), (StatusCode::OK, "hello"));
}

#[tokio::test]
async fn paths_the_router_does_not_match_never_reach_the_breaker() {
    let (breaker, provider) = (breaker(), Provider::default());
    let addr = serve(app(&breaker, &provider)).await;
    let client = Client::builder(TokioExecutor::new()).build_http();

    for _ in 0..THRESHOLD + 1 {
        let missing = post_to(&client, addr, "/nowhere").await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
    }
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(
        snapshot.counts.calls, 0,
        "route_layer guards matched routes only"
    );
    assert_eq!(provider.handled.load(Ordering::SeqCst), 0);
}
