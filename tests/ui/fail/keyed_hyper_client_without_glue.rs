// A hyper-util client behind a keyed breaker, with nothing inside it: its
// error (`hyper_util::client::legacy::Error`) can hold neither refusal.
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneService;
use tower::ServiceBuilder;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};

fn main() {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let registry = Registry::<String>::builder().build();
    let guarded = ServiceBuilder::new()
        .layer(KeyedLayer::new(registry, |req: &http::Request<Empty<Bytes>>| {
            req.uri().host().unwrap_or("unknown").to_string()
        }))
        .service(client);
    let _boxed = BoxCloneService::new(guarded);
}
