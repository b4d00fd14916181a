//! `CircuitOpen::take`: the refusal out of a `BoxError` by value, whether
//! the error is the refusal itself or wraps it (an outer layer's error, a
//! gRPC status), and any other error given back untouched.

use std::fmt;
use std::time::Duration;

use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{Breaker, CircuitOpen, Config, State};

fn open_breaker(name: &str, period: Duration) -> Breaker {
    let breaker = Breaker::new(
        Config::builder()
            .name(name)
            .build()
            .expect("a valid config"),
    );
    breaker.force_open(Some(period));
    breaker
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_taken_out_by_value() {
    let breaker = open_breaker("openai", Duration::from_secs(12));
    let svc = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(service_fn(|_: ()| async { Ok::<_, BoxError>("hi") }));

    let err = svc.oneshot(()).await.expect_err("refused while open");
    let open = CircuitOpen::take(err).expect("the error is the refusal");
    assert_eq!(open.breaker(), "openai");
    assert_eq!(open.state(), State::Open);
    assert_eq!(open.retry_after(), Duration::from_secs(12));
}

/// An error of a layer outside the breaker that keeps the breaker's error
/// as its source, as a gateway's own error type does (an error type, not a
/// fake upstream: the services here are one-line `service_fn`s).
#[derive(Debug)]
struct GatewayError(BoxError);

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upstream call failed")
    }
}

impl std::error::Error for GatewayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

#[tokio::test(start_paused = true)]
async fn a_refusal_wrapped_by_an_outer_error_is_taken_out_of_it() {
    let breaker = open_breaker("search", Duration::from_secs(3));
    let svc = ServiceBuilder::new()
        .map_err(|err: BoxError| BoxError::from(GatewayError(err)))
        .layer(breaker.layer())
        .service(service_fn(|_: ()| async { Ok::<_, BoxError>(()) }));

    let err = svc.oneshot(()).await.expect_err("refused while open");
    assert!(
        err.is::<GatewayError>(),
        "the outer layer wraps the refusal"
    );
    let open = CircuitOpen::take(err).expect("the wrapped refusal is found");
    assert_eq!(open.breaker(), "search");
    assert_eq!(open.retry_after(), Duration::from_secs(3));
}

#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn a_refusal_inside_a_grpc_status_is_taken_out_of_it() {
    let breaker = open_breaker("search", Duration::from_secs(3));
    let svc = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(service_fn(|_: ()| async { Ok::<_, tonic::Status>(()) }));

    let status = svc.oneshot(()).await.expect_err("refused while open");
    let open = CircuitOpen::take(Box::new(status)).expect("the status's source");
    assert_eq!(open.breaker(), "search");
}

#[tokio::test(start_paused = true)]
async fn any_other_error_is_given_back_untouched() {
    let breaker = Breaker::new(
        Config::builder()
            .name("flaky")
            .build()
            .expect("a valid config"),
    );
    let svc = ServiceBuilder::new()
        .layer(breaker.layer())
        .service(service_fn(|_: ()| async {
            Err::<(), _>(BoxError::from("connection reset"))
        }));

    let err = svc.oneshot(()).await.expect_err("the call failed");
    let address = &*err as *const _ as *const u8;
    let back = CircuitOpen::take(err).expect_err("not a refusal");
    assert_eq!(back.to_string(), "connection reset");
    assert_eq!(
        &*back as *const _ as *const u8, address,
        "the same box, not a copy"
    );
}
