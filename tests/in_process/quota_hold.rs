//! Quota exhaustion is not congestion: a retry-after hint beyond
//! `max_open` (a reset an hour away) holds the breaker open up to
//! `max_quota_hold`, with one probe every `quota_probe_interval` for an
//! early reset; it lands on the breakers whose config has a hold (a
//! provider's, over its models'). On paused time, through the layer with
//! the HTTP classifier, one clone per request, as a client calls it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::{advance, Instant};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::policy::{ConsecutiveFailures, Never, TripReason};
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, ConfigBuilder, State};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// Five failures in a row open it; periods up to the default `max_open`
/// (5 min).
fn base() -> ConfigBuilder {
    Config::builder()
        .name("provider")
        .trip(ConsecutiveFailures::new(5))
        .cooldown(Duration::from_secs(30))
}

fn held() -> ConfigBuilder {
    base()
        .max_quota_hold(Some(Duration::from_secs(24 * 3600)))
        .quota_probe_interval(15 * MINUTE)
}

/// A provider whose quota is spent until `reset` after the test's start:
/// until then it answers `429` with the seconds left in `header`, then
/// `200`. Counts the calls it receives.
#[derive(Clone)]
struct Quota {
    start: Instant,
    reset: Duration,
    header: &'static str,
    calls: Arc<AtomicUsize>,
}

impl Quota {
    fn new(reset: Duration, header: &'static str) -> Self {
        Quota {
            start: Instant::now(),
            reset,
            header,
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn answer(&self) -> Response<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let left = self.reset.saturating_sub(self.start.elapsed());
        let mut response = Response::new(());
        if !left.is_zero() {
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            let value = match self.header {
                "retry-after" => left.as_secs().to_string(),
                // OpenAI's duration format.
                _ => format!("{}m{}s", left.as_secs() / 60, left.as_secs() % 60),
            };
            response
                .headers_mut()
                .insert(self.header, value.parse().unwrap());
        }
        response
    }

    fn service(
        &self,
        breaker: &Breaker,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = BoxError> + Clone {
        let quota = self.clone();
        CircuitBreakerLayer::from_breaker(breaker.clone())
            .classify(HttpClassifier::new())
            .layer(service_fn(move |_: Request<()>| {
                let response = quota.answer();
                async move { Ok::<_, BoxError>(response) }
            }))
    }
}

/// Calls `service` once a second for `span`, as clients keep coming.
async fn traffic<S>(service: &S, span: Duration)
where
    S: Service<Request<()>, Response = Response<()>, Error = BoxError> + Clone,
{
    for _ in 0..span.as_secs() {
        let _ = service.clone().oneshot(Request::new(())).await;
        advance(Duration::from_secs(1)).await;
    }
}

/// Under [`Never`], a breaker answers for a quota alone: a thousand
/// server errors leave it closed, the spent quota's `429` opens it for as
/// long as the upstream asks, and the first call after that closes it.
#[tokio::test(start_paused = true)]
async fn a_breaker_that_never_trips_on_failures_opens_on_the_quota_alone() {
    let breaker = Breaker::new(
        Config::builder()
            .name("provider-key")
            .trip(Never)
            .trip_on_pushback(true)
            .build()
            .unwrap(),
    );
    let errors = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(HttpClassifier::new())
        .layer(service_fn(|_: Request<()>| async {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            Ok::<_, BoxError>(response)
        }));
    for _ in 0..1_000 {
        let response = errors.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        advance(Duration::from_millis(100)).await;
    }
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(
        breaker.snapshot().counts.failures,
        1_000,
        "counted, never tripped on"
    );

    let quota = Quota::new(2 * MINUTE, "retry-after");
    let service = quota.service(&breaker);
    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.snapshot().last_trip,
        Some(TripReason::Pushback {
            retry_after: 2 * MINUTE
        })
    );
    traffic(&service, 2 * MINUTE).await;
    assert_eq!(quota.calls(), 1, "refused until the quota's reset");
    traffic(&service, Duration::from_secs(1)).await;
    assert_eq!(quota.calls(), 2);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_reset_an_hour_away_holds_it_open_with_a_probe_every_quarter_hour() {
    let breaker = Breaker::new(held().build().unwrap());
    let quota = Quota::new(HOUR, "retry-after");
    let service = quota.service(&breaker);

    let _ = service.clone().oneshot(Request::new(())).await;
    // A spent quota opens it at once, whatever the threshold.
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(15 * MINUTE));

    traffic(&service, HOUR - Duration::from_secs(1)).await;
    // The first call, then a probe at 15, 30 and 45 min; none sooner.
    assert_eq!(quota.calls(), 4);
    assert_eq!(breaker.state(), State::Open);

    // At the reset the next probe goes, succeeds and closes it.
    traffic(&service, Duration::from_secs(2)).await;
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn without_a_hold_the_hint_is_cut_to_max_open_and_probes_come_often() {
    let breaker = Breaker::new(base().trip_on_pushback(true).build().unwrap());
    let quota = Quota::new(HOUR, "retry-after");
    let service = quota.service(&breaker);

    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.retry_after(), Some(5 * MINUTE));
    traffic(&service, HOUR - Duration::from_secs(1)).await;
    // One probe every 5 min: 11 more calls the hour through.
    assert_eq!(quota.calls(), 12);
}

#[tokio::test(start_paused = true)]
async fn an_early_reset_is_caught_by_the_next_probe() {
    let breaker = Breaker::new(held().build().unwrap());
    // The provider said an hour, and restored the quota after 20 min.
    let quota = Quota::new(20 * MINUTE, "retry-after");
    let service = quota.service(&breaker);
    let hint: http::HeaderValue = "3600".parse().unwrap();
    let _ = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(HttpClassifier::new())
        .layer(service_fn(move |_: Request<()>| {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response.headers_mut().insert("retry-after", hint.clone());
            async move { Ok::<_, BoxError>(response) }
        }))
        .oneshot(Request::new(()))
        .await;
    assert_eq!(breaker.state(), State::Open);

    traffic(&service, 29 * MINUTE).await;
    // One probe at 15 min (the quota still spent), none since.
    assert_eq!(quota.calls(), 1);
    assert_eq!(breaker.state(), State::Open);
    advance(MINUTE).await;
    // The probe at 30 min finds the quota back, and closes it.
    let response = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(quota.calls(), 2);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn openais_reset_header_an_hour_away_is_a_hold() {
    let breaker = Breaker::new(held().build().unwrap());
    let quota = Quota::new(HOUR, "x-ratelimit-reset-requests");
    let service = quota.service(&breaker);
    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(15 * MINUTE));
}

#[tokio::test(start_paused = true)]
async fn a_hold_never_outlasts_its_ceiling() {
    let breaker = Breaker::new(
        base()
            .max_quota_hold(Some(20 * MINUTE))
            .quota_probe_interval(HOUR)
            .build()
            .unwrap(),
    );
    let quota = Quota::new(24 * HOUR, "retry-after");
    let service = quota.service(&breaker);
    let _ = service.clone().oneshot(Request::new(())).await;
    // A day announced, 20 min held, however long the probe interval.
    assert_eq!(breaker.retry_after(), Some(20 * MINUTE));
}

#[tokio::test(start_paused = true)]
async fn a_short_hint_is_congestion_and_opens_as_before() {
    let breaker = Breaker::new(held().build().unwrap());
    let quota = Quota::new(Duration::from_secs(20), "retry-after");
    let service = quota.service(&breaker);
    let _ = service.clone().oneshot(Request::new(())).await;
    // Within `max_open`: no hold, and the threshold still decides.
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_hold_lands_on_the_provider_whose_config_has_one() {
    let registry = Registry::<String>::builder()
        .default_config(base().build().unwrap())
        .config("openai".into(), held().name("openai").build().unwrap())
        .parent(|key: &String| key.split_once('/').map(|(p, _)| p.to_string()))
        .build();
    let quota = Quota::new(HOUR, "retry-after");
    let upstream = quota.clone();
    let service = KeyedLayer::new(registry.clone(), |_: &Request<()>| {
        "openai/gpt-x".to_string()
    })
    .classify(HttpClassifier::new())
    .layer(service_fn(move |_: Request<()>| {
        let response = upstream.answer();
        async move { Ok::<_, BoxError>(response) }
    }));
    let _ = service.clone().oneshot(Request::new(())).await;

    let provider = registry.get(&"openai".to_string()).unwrap();
    let model = registry.get(&"openai/gpt-x".to_string()).unwrap();
    assert_eq!(provider.state(), State::Open);
    assert_eq!(provider.retry_after(), Some(15 * MINUTE));
    // The model's config has no hold: one 429 of its five.
    assert_eq!(model.state(), State::Closed);

    traffic(&service, 14 * MINUTE).await;
    assert_eq!(quota.calls(), 1, "the provider's hold refuses every model");
}

#[test]
fn a_hold_no_longer_than_max_open_is_an_error() {
    let err = Config::builder()
        .max_quota_hold(Some(Duration::from_secs(300)))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "max_quota_hold");
    let err = Config::builder()
        .quota_probe_interval(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "quota_probe_interval");
}
