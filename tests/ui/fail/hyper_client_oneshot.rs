// The same client, called straight away with a `ServiceExt` method: rustc
// reports the unmet `Service` bound of the method, one level up from the
// error type (its message for method calls lists only that level).
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{CircuitBreakerLayer, Config};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let guarded = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(Config::default()))
        .service(client);
    let request = http::Request::get("http://127.0.0.1:1/").body(Empty::new()).unwrap();
    let _ = guarded.oneshot(request).await;
}
