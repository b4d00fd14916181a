//! The model router's pipeline through real hyper servers and clients: a
//! keyed breaker per (provider, model) with a parent per provider, judged
//! at the end of each streamed body, and failover over keyed candidates,
//! over HTTP/1 and HTTP/2. Real sockets, so real time, except open periods,
//! skipped on tokio's clock; the tests assert states, counts and who was
//! called, never timings.
#![cfg(all(feature = "http-body", feature = "axum"))]

use crate::common::gateway;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use http::{header::RETRY_AFTER, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Bytes, Incoming};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::failover::{Exhausted, Failover};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Config, State};

use gateway::{skip, upstream, Http, COOLDOWN, EVENTS};

/// A registry of breakers per `provider/model`, each with the provider's
/// as parent; each opens on two failures in a row, for [`COOLDOWN`].
fn registry() -> Registry<String> {
    let config = Config::builder()
        .trip(ConsecutiveFailures::new(2))
        .cooldown(COOLDOWN)
        .build()
        .expect("a valid config");
    Registry::builder()
        .default_config(config)
        .parent(|key: &String| {
            key.split_once('/')
                .map(|(provider, _)| provider.to_string())
        })
        .build()
}

/// The model a request asks for: the first segment of its path
/// (`/sse/ok` asks for `sse`).
fn model(req: &Request<Empty<Bytes>>) -> String {
    req.uri()
        .path()
        .split('/')
        .nth(1)
        .unwrap_or("none")
        .to_string()
}

/// Provider `name`'s keyed layer: its request's model picks the
/// `name/model` breaker, and through it the provider's.
fn keyed(
    registry: &Registry<String>,
    name: &'static str,
) -> KeyedLayer<String, impl Fn(&Request<Empty<Bytes>>) -> String + Clone, StreamingHttp> {
    KeyedLayer::new(registry.clone(), move |req: &Request<Empty<Bytes>>| {
        format!("{name}/{}", model(req))
    })
    .classify(StreamingHttp::new())
}

/// A gateway speaking `http` to its clients: each request's path is asked
/// of `upstream` through `client`, the answer streamed back; an error is a
/// 503 (with `Retry-After` when a failover had none to give), as the
/// axum features answer them.
async fn gateway<S, B>(http: Http, upstream: SocketAddr, client: S) -> SocketAddr
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    gateway::serve(http, move |req: Request<Incoming>| {
        let client = client.clone();
        async move {
            let request = gateway::upstream_request(upstream, req.uri().path());
            let answer = match client.oneshot(request).await {
                Ok(response) => response.map(|b| b.map_err(Into::into).boxed_unsync()),
                Err(err) => {
                    let error = match Exhausted::take(err) {
                        Ok(exhausted) => exhausted.into_response(),
                        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
                    };
                    let (head, _) = error.into_parts();
                    let empty = Full::new(Bytes::new()).map_err(|never| match never {});
                    Response::from_parts(head, empty.boxed_unsync())
                }
            };
            Ok::<_, Infallible>(answer)
        }
    })
    .await
}

/// GETs `path` from `addr` over `http`: the status, the `Retry-After`, and
/// the body, or that it broke off.
async fn fetch(
    http: Http,
    addr: SocketAddr,
    path: &str,
) -> (StatusCode, Option<String>, Result<String, String>) {
    let uri = format!("http://{addr}{path}").parse().expect("a valid URI");
    let response = gateway::client(http).get(uri).await.expect("an answer");
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .map(|v| v.to_str().unwrap_or_default().to_string());
    let body = match response.into_body().collect().await {
        Ok(body) => Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned()),
        Err(err) => Err(err.to_string()),
    };
    (status, retry_after, body)
}

/// A keyed, streamed gateway over one provider `alpha`.
async fn keyed_gateway(http: Http) -> (Registry<String>, SocketAddr) {
    let registry = registry();
    let upstream = upstream(http).await;
    let client = ServiceBuilder::new()
        .layer(keyed(&registry, "alpha"))
        .map_err(BoxError::from)
        .service(gateway::client(http));
    (registry.clone(), gateway(http, upstream, client).await)
}

fn breaker(registry: &Registry<String>, key: &str) -> tower_circuit_breaker::Breaker {
    registry.get(&key.to_string()).expect("room for the key")
}

async fn a_completed_stream_counts_in_the_model_and_its_provider(http: Http) {
    let (registry, gateway) = keyed_gateway(http).await;
    // Both opened by failures of this model, then half-open: the next call
    // is a probe of each.
    for _ in 0..2 {
        let (status, _, _) = fetch(http, gateway, "/plain/fail").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
    }
    for key in ["alpha/plain", "alpha"] {
        assert_eq!(breaker(&registry, key).state(), State::Open, "{key}");
    }
    skip(COOLDOWN + Duration::from_millis(1)).await;
    let (_, _, _) = fetch(http, gateway, "/plain/ok").await; // closes alpha/plain and alpha
    for key in ["alpha/plain", "alpha"] {
        assert_eq!(breaker(&registry, key).state(), State::Closed, "{key}");
    }

    // Now a stream: opened by two breaks, half-open, then probed by a stream
    // read to its end.
    for _ in 0..2 {
        let (status, _, body) = fetch(http, gateway, "/sse/break").await;
        assert_eq!(status, StatusCode::OK, "the head was fine");
        assert!(body.is_err(), "the body broke off: {body:?}");
    }
    let model = breaker(&registry, "alpha/sse").snapshot();
    let provider = breaker(&registry, "alpha").snapshot();
    assert_eq!(
        (model.state, model.counts.failures),
        (State::Open, 2),
        "a body that fails midway is a failure of the model"
    );
    assert_eq!(
        (provider.state, provider.counts.failures),
        (State::Open, 2 + 2),
        "and of its provider"
    );

    skip(COOLDOWN + Duration::from_millis(1)).await;
    let (status, _, body) = fetch(http, gateway, "/sse/ok").await;
    assert_eq!((status, body), (StatusCode::OK, Ok(EVENTS.concat())));
    for key in ["alpha/sse", "alpha"] {
        let snap = breaker(&registry, key).snapshot();
        assert_eq!(
            (snap.state, snap.probes_in_flight, snap.counts.cancelled),
            (State::Closed, 0, 0),
            "{key}: the probe's stream ended, a success that closes it"
        );
    }
}

#[tokio::test]
async fn over_http1_a_completed_stream_counts_in_the_model_and_its_provider() {
    a_completed_stream_counts_in_the_model_and_its_provider(Http::One).await;
}

#[tokio::test]
async fn over_http2_a_completed_stream_counts_in_the_model_and_its_provider() {
    a_completed_stream_counts_in_the_model_and_its_provider(Http::Two).await;
}

/// An upstream provider that counts the requests it receives.
async fn counted_upstream(http: Http) -> (Arc<AtomicUsize>, SocketAddr) {
    let received = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&received);
    let addr = gateway::serve(http, move |req: Request<Incoming>| {
        seen.fetch_add(1, Ordering::Relaxed);
        let path = req.uri().path().to_owned();
        async move { Ok::<_, Infallible>(gateway::answer(&path)) }
    })
    .await;
    (received, addr)
}

/// A failover gateway over providers `beta` then `alpha`, each a keyed
/// candidate over its own upstream server, streamed through; with a last
/// resort when `last_resort`.
async fn failover_gateway(
    http: Http,
    last_resort: bool,
) -> (Registry<String>, [Arc<AtomicUsize>; 2], SocketAddr) {
    let registry = registry();
    let (beta_calls, beta) = counted_upstream(http).await;
    let (alpha_calls, alpha) = counted_upstream(http).await;
    // Each candidate sends to its own upstream whatever the request names.
    let to = |addr: SocketAddr| {
        tower::util::MapRequestLayer::new(move |req: Request<Empty<Bytes>>| {
            let path = req.uri().path().to_owned();
            gateway::upstream_request(addr, &path)
        })
    };
    let candidate = |name, addr| {
        ServiceBuilder::new()
            .layer(keyed(&registry, name))
            .map_err(BoxError::from)
            .layer(to(addr))
            .service(gateway::client(http))
    };
    let chain = Failover::new([candidate("beta", beta), candidate("alpha", alpha)])
        .classify(StreamingHttp::new())
        .last_resort(last_resort);
    let front = gateway(http, alpha, chain).await;
    (registry, [beta_calls, alpha_calls], front)
}

async fn an_isolated_provider_is_never_called(http: Http) {
    for last_resort in [false, true] {
        let (registry, [beta_calls, alpha_calls], gateway) =
            failover_gateway(http, last_resort).await;
        breaker(&registry, "beta").force_open(None);

        let (status, _, body) = fetch(http, gateway, "/sse/ok").await;
        assert_eq!((status, body), (StatusCode::OK, Ok(EVENTS.concat())));
        assert_eq!(beta_calls.load(Ordering::Relaxed), 0, "beta is isolated");
        assert_eq!(alpha_calls.load(Ordering::Relaxed), 1);

        // alpha's model opens too. Without a last resort nobody is called;
        // with one, alpha's model (open, with an end) is, around its
        // breakers: never beta, held open by its operator.
        breaker(&registry, "alpha/sse").force_open(Some(Duration::from_secs(30)));
        let (status, _, _) = fetch(http, gateway, "/sse/ok").await;
        let (expected, alpha_called) = match last_resort {
            false => (StatusCode::SERVICE_UNAVAILABLE, 1),
            true => (StatusCode::OK, 2),
        };
        assert_eq!(status, expected, "last resort {last_resort}");
        assert_eq!(
            beta_calls.load(Ordering::Relaxed),
            0,
            "beta is isolated, last resort {last_resort}"
        );
        assert_eq!(alpha_calls.load(Ordering::Relaxed), alpha_called);
    }
}

#[tokio::test]
async fn over_http1_a_provider_isolated_at_its_parent_is_never_called() {
    an_isolated_provider_is_never_called(Http::One).await;
}

#[tokio::test]
async fn over_http2_a_provider_isolated_at_its_parent_is_never_called() {
    an_isolated_provider_is_never_called(Http::Two).await;
}

#[tokio::test]
async fn when_every_provider_is_open_the_gateway_answers_503_with_the_smallest_retry_after() {
    let http = Http::Two;
    let (registry, [beta_calls, alpha_calls], gateway) = failover_gateway(http, false).await;
    breaker(&registry, "beta").force_open(Some(Duration::from_secs(40)));
    breaker(&registry, "alpha/sse").force_open(Some(Duration::from_secs(7)));

    let (status, retry_after, _) = fetch(http, gateway, "/sse/ok").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let seconds: u64 = retry_after
        .expect("a Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(
        (6..=7).contains(&seconds),
        "the smallest, alpha's: {seconds}"
    );
    assert_eq!(
        beta_calls.load(Ordering::Relaxed) + alpha_calls.load(Ordering::Relaxed),
        0,
        "nobody called"
    );

    // Another model of alpha is closed: it answers.
    let (status, _, _) = fetch(http, gateway, "/plain/ok").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(alpha_calls.load(Ordering::Relaxed), 1);
}

/// A model whose own breaker is disabled still has its streams judged by
/// its provider's: a half-open provider is closed by a stream of that
/// model read to its end.
#[tokio::test]
async fn a_disabled_models_stream_still_counts_in_its_provider() {
    let http = Http::One;
    let (registry, gateway) = keyed_gateway(http).await;
    breaker(&registry, "alpha/sse").disable();
    for _ in 0..2 {
        let (status, _, _) = fetch(http, gateway, "/plain/fail").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(breaker(&registry, "alpha").state(), State::Open);
    skip(COOLDOWN + Duration::from_millis(1)).await;

    let (status, _, body) = fetch(http, gateway, "/sse/ok").await;
    assert_eq!((status, body), (StatusCode::OK, Ok(EVENTS.concat())));
    let provider = breaker(&registry, "alpha").snapshot();
    assert_eq!(
        (
            provider.state,
            provider.probes_in_flight,
            provider.counts.cancelled
        ),
        (State::Closed, 0, 0),
        "the provider's probe was judged at the stream's end"
    );
    assert_eq!(breaker(&registry, "alpha/sse").state(), State::Disabled);
}

/// A chain reads its candidates' breakers without making any: a request
/// the first provider answers leaves no breaker for the others.
#[tokio::test]
async fn a_failover_makes_no_breaker_for_a_candidate_it_does_not_call() {
    let http = Http::One;
    let (registry, [_, alpha_calls], gateway) = failover_gateway(http, false).await;
    breaker(&registry, "beta").force_open(None);
    let (status, _, _) = fetch(http, gateway, "/sse/ok").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(alpha_calls.load(Ordering::Relaxed), 1);
    let mut keys: Vec<String> = registry
        .breakers()
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["alpha", "alpha/sse", "beta"],
        "no beta/sse: beta was skipped"
    );
}
