// A keyed breaker over a hyper-util client, judged at the end of each
// streamed body, with the client's error boxed inside it.
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneService;
use tower::ServiceBuilder;
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};

fn main() {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let registry = Registry::<String>::builder()
        .parent(|key: &String| key.split_once('/').map(|(provider, _)| provider.to_string()))
        .build();
    let guarded = ServiceBuilder::new()
        .layer(
            KeyedLayer::new(registry, |req: &http::Request<Empty<Bytes>>| {
                format!("{}/{}", req.uri().host().unwrap_or("unknown"), req.uri().path())
            })
            .classify(StreamingHttp::new()),
        )
        .timeout(Duration::from_secs(30))
        .service(client);
    let _boxed = BoxCloneService::new(guarded);
}
