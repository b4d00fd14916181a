//! The providers' own rate-limit signals through a real hyper client and
//! server: an upstream that answers as OpenAI, Anthropic or an overloaded
//! provider does holds the breaker open for as long as it asks, and each
//! reader can be turned off. Real sockets, so real time; the tests assert
//! the announced waits, within a few seconds of slack, never timings.
#![cfg(feature = "http-body")]

use crate::common::gateway;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{HttpClassifier, StreamingHttp};
use tower_circuit_breaker::policy::{ConsecutiveFailures, Never};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, State};

use gateway::Http;

/// The breaker's own first open period.
const COOLDOWN: Duration = Duration::from_secs(10);

fn breaker() -> Breaker {
    let config = Config::builder()
        .name("provider")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(COOLDOWN)
        .max_open(Duration::from_secs(3600))
        .build()
        .unwrap();
    Breaker::new(config)
}

/// An upstream answering every request `status` with `headers`.
async fn provider(status: u16, headers: Vec<(&'static str, String)>) -> SocketAddr {
    gateway::serve(Http::One, move |_: Request<Incoming>| {
        let headers = headers.clone();
        async move {
            let mut response = Response::new(Full::new(Bytes::from_static(b"{\"error\":{}}")));
            *response.status_mut() = StatusCode::from_u16(status).expect("a status");
            for (name, value) in headers {
                let value = HeaderValue::from_str(&value).expect("a header value");
                response.headers_mut().insert(name, value);
            }
            Ok::<_, Infallible>(response)
        }
    })
    .await
}

/// How long `breaker` stays open after one call to `upstream` through a
/// hyper client judged by `classifier`.
async fn open_for<C>(classifier: C, upstream: SocketAddr) -> Duration
where
    C: tower_circuit_breaker::classify::Classify<
            Response<Incoming>,
            BoxError,
            Eos = std::convert::Infallible,
        > + Clone,
{
    let breaker = breaker();
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(classifier))
        .map_err(BoxError::from)
        .service(gateway::client(Http::One));
    let _ = client
        .oneshot(gateway::upstream_request(upstream, "/v1/chat/completions"))
        .await;
    assert_eq!(breaker.state(), State::Open);
    breaker.retry_after().expect("open")
}

#[track_caller]
fn about(wait: Duration, asked: Duration) {
    assert!(
        wait <= asked && wait + Duration::from_secs(5) > asked,
        "open for {wait:?}, not about {asked:?}"
    );
}

#[tokio::test]
async fn an_openai_429_with_a_request_reset_holds_it_open_until_then() {
    let upstream = provider(
        429,
        vec![
            ("x-ratelimit-reset-requests", "20s".into()),
            ("x-ratelimit-remaining-requests", "0".into()),
            ("x-ratelimit-reset-tokens", "6m0s".into()),
            ("x-ratelimit-remaining-tokens", "15000".into()),
        ],
    )
    .await;
    about(
        open_for(HttpClassifier::new(), upstream).await,
        Duration::from_secs(20),
    );
    let ignoring = HttpClassifier::new().ignore_reset_headers();
    about(open_for(ignoring, upstream).await, COOLDOWN);
}

/// A quota breaker (`Never`, tripping on pushback) over a real hyper
/// client, a clone per request: a provider's 500s leave it closed, and its
/// 429 with OpenAI's reset headers holds it open until the reset.
#[tokio::test]
async fn a_quota_breaker_ignores_server_errors_and_opens_on_the_providers_429() {
    let breaker = Breaker::new(
        Config::builder()
            .name("openai-key")
            .trip(Never)
            .trip_on_pushback(true)
            // The least open period: the provider's reset sets the rest.
            .cooldown(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(HttpClassifier::new()))
        .map_err(BoxError::from)
        .service(gateway::client(Http::One));
    let failing = provider(500, Vec::new()).await;
    for _ in 0..50 {
        let response = client
            .clone()
            .oneshot(gateway::upstream_request(failing, "/v1/chat/completions"))
            .await
            .expect("answered, not refused");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 50);

    let limited = provider(
        429,
        vec![
            ("x-ratelimit-reset-requests", "20s".into()),
            ("x-ratelimit-remaining-requests", "0".into()),
        ],
    )
    .await;
    let _ = client
        .clone()
        .oneshot(gateway::upstream_request(limited, "/v1/chat/completions"))
        .await;
    assert_eq!(breaker.state(), State::Open);
    about(
        breaker.retry_after().expect("open"),
        Duration::from_secs(20),
    );
    let refused = client
        .clone()
        .oneshot(gateway::upstream_request(limited, "/v1/chat/completions"))
        .await
        .expect_err("refused while the quota is spent");
    assert!(
        refused.is::<tower_circuit_breaker::CircuitOpen>(),
        "{refused}"
    );
}

#[tokio::test]
async fn an_overloaded_529_with_retry_after_holds_it_open_that_long() {
    let upstream = provider(529, vec![("retry-after", "30".into())]).await;
    about(
        open_for(HttpClassifier::new(), upstream).await,
        Duration::from_secs(30),
    );
    let ignoring = HttpClassifier::new().ignore_retry_after();
    about(open_for(ignoring, upstream).await, COOLDOWN);
}

#[tokio::test]
async fn an_anthropic_reset_time_holds_it_open_until_then() {
    let reset = SystemTime::now() + Duration::from_secs(45);
    let upstream = provider(
        429,
        vec![
            ("anthropic-ratelimit-requests-reset", rfc3339(reset)),
            ("anthropic-ratelimit-requests-remaining", "0".into()),
        ],
    )
    .await;
    about(
        open_for(HttpClassifier::new(), upstream).await,
        Duration::from_secs(45),
    );
}

#[tokio::test]
async fn a_streaming_breaker_reads_the_same_signals() {
    let upstream = provider(503, vec![("retry-after-ms", "25000".into())]).await;
    let breaker = breaker();
    let client = gateway::guarded(Http::One, &gateway::layer(&breaker, StreamingHttp::new()));
    let response = client
        .oneshot(gateway::upstream_request(upstream, "/v1/chat/completions"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    about(
        breaker.retry_after().expect("open"),
        Duration::from_secs(25),
    );
}

#[tokio::test]
async fn malformed_signals_are_ignored() {
    let upstream = provider(
        429,
        vec![
            ("retry-after", "soon".into()),
            ("retry-after-ms", "-5".into()),
            ("x-ratelimit-reset-requests", "1 minute".into()),
            ("anthropic-ratelimit-requests-reset", "tomorrow".into()),
        ],
    )
    .await;
    about(open_for(HttpClassifier::new(), upstream).await, COOLDOWN);
}

/// `time` as RFC 3339, to the second, in UTC.
fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}
