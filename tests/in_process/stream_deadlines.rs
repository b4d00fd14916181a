//! Stream deadlines: a body whose first data frame comes too late, or that
//! goes silent between frames, ends for its reader with a `StreamTimeout`
//! and counts as a failure (a probe, as a failed probe), on one breaker or
//! a keyed one. Paused time: the provider's delays and the limits are
//! tokio's virtual time.
#![cfg(feature = "http-body")]

use std::pin::Pin;
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use tokio::time::advance;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::body::StreamTimeout;
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, ConfigBuilder, State};

use crate::common::paced::{paced, Paced};

const SECOND: Duration = Duration::from_secs(1);

fn config() -> ConfigBuilder {
    crate::common::one_failure_opens("provider")
}

/// A breaker with `config` over a provider answering `200` at once with a
/// stream made by `stream`.
fn provider(
    breaker: &Breaker,
    stream: fn() -> Paced,
) -> impl Service<Request<()>, Response = Response<impl Body<Error = BoxError>>, Error = BoxError> + Clone
{
    CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(StreamingHttp::new())
        .layer(service_fn(move |_: Request<()>| async move {
            Ok::<_, BoxError>(Response::new(stream()))
        }))
}

/// Reads a body to its end: the data frames it gave, and its error, if any.
async fn read<B: Body<Error = BoxError> + Unpin>(mut body: B) -> (usize, Option<BoxError>) {
    let mut frames = 0;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        match frame {
            Ok(_) => frames += 1,
            Err(err) => {
                // Nothing more after the error: the stream has ended.
                let after = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
                assert!(after.is_none(), "the body ended with its error");
                assert!(body.is_end_stream());
                return (frames, Some(err));
            }
        }
    }
    (frames, None)
}

fn timeout(err: &BoxError) -> &StreamTimeout {
    err.downcast_ref::<StreamTimeout>()
        .unwrap_or_else(|| panic!("a StreamTimeout, not {err}"))
}

fn frozen_after_one_chunk() -> Paced {
    paced(vec![(Duration::ZERO, b"data: token 1\n\n")], true)
}

fn first_token_after_four_seconds() -> Paced {
    paced(vec![(4 * SECOND, b"data: token 1\n\n")], false)
}

fn steady() -> Paced {
    let chunk: &'static [u8] = b"data: token\n\n";
    paced(vec![(SECOND / 2, chunk); 6], false)
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_freezes_after_its_first_chunk_ends_with_a_timeout_and_a_failure() {
    let breaker = Breaker::new(config().frame_idle_timeout(Some(SECOND)).build().unwrap());
    let svc = provider(&breaker, frozen_after_one_chunk);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    let (frames, err) = read(Box::pin(response.into_body())).await;
    let err = err.expect("the frozen stream ended with an error");
    assert_eq!(frames, 1);
    let timeout = timeout(&err);
    assert_eq!((timeout.is_first_frame(), timeout.limit()), (false, SECOND));
    assert_eq!(timeout.breaker(), "provider");
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.counts.failures, snap.counts.cancelled),
        (State::Open, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_token_later_than_its_limit_is_a_failure() {
    let breaker = Breaker::new(config().first_frame_timeout(Some(SECOND)).build().unwrap());
    let svc = provider(&breaker, first_token_after_four_seconds);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    let (frames, err) = read(Box::pin(response.into_body())).await;
    assert_eq!(frames, 0);
    let err = err.expect("no token within the limit");
    assert_eq!(
        (timeout(&err).is_first_frame(), timeout(&err).limit()),
        (true, SECOND)
    );
    assert_eq!(breaker.snapshot().counts.failures, 1);
}

#[tokio::test(start_paused = true)]
async fn without_limits_a_late_first_token_is_waited_for() {
    let breaker = Breaker::new(config().build().unwrap());
    let svc = provider(&breaker, first_token_after_four_seconds);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(read(Box::pin(response.into_body())).await.0, 1);
    assert_eq!(breaker.snapshot().counts.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_stream_within_its_limits_closes_a_half_open_breaker() {
    let limits = config()
        .first_frame_timeout(Some(SECOND))
        .frame_idle_timeout(Some(SECOND));
    let breaker = Breaker::new(limits.build().unwrap());
    breaker.force_open(Some(SECOND));
    advance(SECOND).await;
    let svc = provider(&breaker, steady);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    let (frames, err) = read(Box::pin(response.into_body())).await;
    assert_eq!((frames, err.map(|e| e.to_string())), (6, None));
    assert_eq!(
        breaker.state(),
        State::Closed,
        "the probe's stream kept within its limits"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_stream_freezes_is_a_failed_probe() {
    let breaker = Breaker::new(config().frame_idle_timeout(Some(SECOND)).build().unwrap());
    breaker.force_open(Some(SECOND));
    advance(SECOND).await;
    let svc = provider(&breaker, frozen_after_one_chunk);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert!(read(Box::pin(response.into_body())).await.1.is_some());
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.probes_in_flight),
        (State::Open, 0),
        "reopened, its permit back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_breaker_applies_its_keys_limits() {
    let registry = Registry::<String>::builder()
        .default_config(config().frame_idle_timeout(Some(SECOND)).build().unwrap())
        .parent(|key: &String| key.split_once('/').map(|(p, _)| p.to_string()))
        .build();
    let svc = KeyedLayer::new(registry.clone(), |_: &Request<()>| {
        "alpha/large".to_string()
    })
    .classify(StreamingHttp::new())
    .layer(service_fn(|_: Request<()>| async {
        Ok::<_, BoxError>(Response::new(frozen_after_one_chunk()))
    }));
    let response = svc.oneshot(Request::new(())).await.unwrap();
    let (_, err) = read(Box::pin(response.into_body())).await;
    assert_eq!(timeout(&err.expect("a timeout")).breaker(), "alpha/large");
    for key in ["alpha/large", "alpha"] {
        let snap = registry.get(&key.to_string()).unwrap().snapshot();
        assert_eq!(
            (snap.state, snap.counts.failures),
            (State::Open, 1),
            "{key}"
        );
    }
}

#[test]
fn a_zero_limit_is_a_config_error() {
    for (builder, field) in [
        (
            config().first_frame_timeout(Some(Duration::ZERO)),
            "first_frame_timeout",
        ),
        (
            config().frame_idle_timeout(Some(Duration::ZERO)),
            "frame_idle_timeout",
        ),
    ] {
        assert_eq!(builder.build().unwrap_err().field(), field);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_dropped_after_the_cancellation_limit_is_a_failure() {
    let breaker = Breaker::new(
        config()
            .cancelled_failure_after(Some(3 * SECOND))
            .build()
            .unwrap(),
    );
    let svc = provider(&breaker, frozen_after_one_chunk);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    advance(5 * SECOND).await;
    drop(response); // the client hung up on a frozen stream
    let snap = breaker.snapshot();
    assert_eq!((snap.counts.failures, snap.counts.cancelled), (1, 0));
}
