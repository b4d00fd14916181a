// The fixes the message names: a timeout inside the breaker, or the
// client's error boxed inside it. Both compile as they are.
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_circuit_breaker::{CircuitBreakerLayer, Config};

fn main() {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let with_timeout = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(Config::default()))
        .timeout(Duration::from_secs(30))
        .service(client.clone());
    let _boxed = BoxCloneService::new(with_timeout);

    let boxed_errors = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(Config::default()))
        .map_err(BoxError::from)
        .service(client);
    let _boxed = BoxCloneService::new(boxed_errors);
}
