// A hyper-util client behind a breaker, with nothing inside the breaker:
// its error (`hyper_util::client::legacy::Error`) cannot hold a refusal.
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneService;
use tower::ServiceBuilder;
use tower_circuit_breaker::{CircuitBreakerLayer, Config};

fn main() {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let guarded = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(Config::default()))
        .service(client);
    let _boxed = BoxCloneService::new(guarded);
}
