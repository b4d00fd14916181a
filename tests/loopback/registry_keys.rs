//! Keys built from request data carry no credentials into breaker names:
//! a URI's or a `Host` header's `user:password@` is dropped, and a
//! credential header is keyed by a fingerprint. Checked where a name shows:
//! the registry's keys, the refusal's message (and the HTTP and gRPC
//! answers made from it), tracing fields and metric labels. Through a real
//! hyper client and server on 127.0.0.1.

use crate::common::captured;

use std::convert::Infallible;
use std::net::SocketAddr;

use http::header::{AUTHORIZATION, HOST};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::{authority, header, KeyedLayer, Registry};
use tower_circuit_breaker::{CircuitOpen, Config};

use captured::Captured;

const SECRET: &str = "s3cret";

/// An HTTP/1 upstream on a free port of 127.0.0.1 answering every request
/// 503, until the runtime shuts down.
async fn unavailable_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|_: Request<Incoming>| async {
                let mut response = Response::new(Full::new(Bytes::from_static(b"down")));
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, Infallible>(response)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

/// Two failures in a row open a key's breaker.
fn registry() -> Registry<String> {
    let config = Config::builder()
        .trip(ConsecutiveFailures::new(2))
        .build()
        .unwrap();
    Registry::new(config)
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `request()` three times through `svc`: two 503s open the key's
/// breaker, the third is refused. Returns the refusal.
async fn open_and_refuse<S>(svc: S, request: impl Fn() -> Request<Empty<Bytes>>) -> CircuitOpen
where
    S: Service<Request<Empty<Bytes>>, Response = Response<Incoming>, Error = BoxError> + Clone,
{
    for _ in 0..2 {
        let response = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let refused = svc.oneshot(request()).await.unwrap_err();
    CircuitOpen::find(refused.as_ref())
        .cloned()
        .unwrap_or_else(|| panic!("expected a refusal, got {refused}"))
}

/// Opens, through a hyper client keyed by authority in `registry`, the
/// breaker of an unavailable upstream called with `alice:<secret>@` in its
/// URI. Returns the upstream's address and the refusal.
async fn refused_by_authority(registry: &Registry<String>) -> (SocketAddr, CircuitOpen) {
    let upstream = unavailable_upstream().await;
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(registry.clone(), authority).classify(HttpClassifier::new()))
        .map_err(BoxError::from)
        .service(client());
    let uri = format!("http://alice:{SECRET}@{upstream}/v1/chat");
    let refusal = open_and_refuse(svc, || Request::get(&uri).body(Empty::new()).unwrap()).await;
    (upstream, refusal)
}

/// Asserts that nothing a breaker shows holds the secret: the registry's
/// keys, the refusal and what is made of it (the axum and tonic answers),
/// the tracing output.
async fn assert_nowhere(registry: &Registry<String>, refusal: &CircuitOpen, captured: &Captured) {
    let keys: Vec<String> = registry.breakers().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(!keys[0].contains(SECRET), "key {:?}", keys[0]);
    assert!(!refusal.breaker().contains(SECRET), "{refusal}");
    assert!(!refusal.to_string().contains(SECRET), "{refusal}");
    #[cfg(feature = "axum")]
    {
        use axum::response::IntoResponse;
        let body = refusal.clone().into_response().into_body();
        let body = body.collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(refusal.breaker()), "{body}");
        assert!(!body.contains(SECRET), "{body}");
    }
    #[cfg(feature = "tonic")]
    {
        let status = tonic::Status::from(refusal.clone());
        assert!(!status.message().contains(SECRET), "{status:?}");
    }
    let events = captured.text();
    assert!(
        events.contains(refusal.breaker()),
        "the transition was traced: {events}"
    );
    assert!(!events.contains(SECRET), "{events}");
}

#[tokio::test]
async fn a_client_keyed_by_authority_names_no_userinfo() {
    let (captured, _guard) = Captured::start("trace");
    let registry = registry();
    let (upstream, refusal) = refused_by_authority(&registry).await;
    assert_eq!(refusal.breaker(), upstream.to_string());
    assert_nowhere(&registry, &refusal, &captured).await;
}

#[tokio::test]
async fn a_client_keyed_by_its_authorization_names_a_fingerprint() {
    let (captured, _guard) = Captured::start("trace");
    let upstream = unavailable_upstream().await;
    let registry = registry();
    let svc = ServiceBuilder::new()
        .layer(
            KeyedLayer::new(registry.clone(), header(AUTHORIZATION))
                .classify(HttpClassifier::new()),
        )
        .map_err(BoxError::from)
        .service(client());
    let request = || {
        Request::get(format!("http://{upstream}/v1/chat"))
            .header(AUTHORIZATION, format!("Bearer sk-{SECRET}"))
            .body(Empty::new())
            .unwrap()
    };
    let refusal = open_and_refuse(svc, request).await;
    assert!(refusal.breaker().starts_with("authorization#"), "{refusal}");
    assert_nowhere(&registry, &refusal, &captured).await;
}

/// A gateway keyed by the `Host` its clients send: a client that puts
/// credentials there does not get them into names, nor back in the
/// gateway's refusal.
#[tokio::test]
async fn a_server_keyed_by_the_host_header_names_no_userinfo() {
    let (captured, _guard) = Captured::start("trace");
    let registry = registry();
    let keyed = KeyedLayer::new(registry.clone(), authority).classify(HttpClassifier::new());
    let gateway = keyed.layer(service_fn(|_: Request<Incoming>| async {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        Ok::<_, BoxError>(response)
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let gateway = gateway.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                // A clone per request, as servers call services.
                let gateway = gateway.clone();
                async move {
                    Ok::<_, Infallible>(match gateway.oneshot(req).await {
                        Ok(response) => response,
                        Err(err) => {
                            // The refusal's message, as a gateway might answer it.
                            let mut response =
                                Response::new(Full::new(Bytes::from(err.to_string())));
                            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            response
                        }
                    })
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });

    let client = client();
    let mut last_body = String::new();
    for _ in 0..3 {
        let request = Request::get(format!("http://{addr}/v1/chat"))
            .header(HOST, format!("alice:{SECRET}@api.example.com"))
            .body(Empty::new())
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        last_body = String::from_utf8_lossy(&body).into_owned();
    }
    assert!(
        last_body.contains("`api.example.com`"),
        "the third was refused: {last_body:?}"
    );
    assert!(!last_body.contains(SECRET), "{last_body}");
    let keys: Vec<String> = registry.breakers().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["api.example.com"]);
    let events = captured.text();
    assert!(events.contains("api.example.com"), "{events}");
    assert!(!events.contains(SECRET), "{events}");
}

/// The `breaker` label of every metric is the key.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metric_labels_carry_no_userinfo() {
    use metrics_util::debugging::DebuggingRecorder;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = ::metrics::set_default_local_recorder(&recorder);
    let registry = registry();
    let (upstream, _) = refused_by_authority(&registry).await;
    tower_circuit_breaker::metrics_facade::export_registry(&registry);

    let labels: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .flat_map(|(key, _, _, _)| {
            key.key()
                .labels()
                .filter(|l| l.key() == "breaker")
                .map(|l| l.value().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!labels.is_empty(), "the breaker reported");
    for label in labels {
        assert_eq!(label, upstream.to_string());
    }
}
