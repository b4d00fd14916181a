//! axum integration (feature `axum`): a refused call answers
//! `503 Service Unavailable` with `Retry-After`, through `CircuitOpen`'s
//! `IntoResponse`; so do a failover whose every candidate is out
//! ([`Exhausted`]) and a full registry ([`RegistryFull`], without
//! `Retry-After`). The wiring of axum clients and of a guarded route, the
//! crate's guide (section *Wiring each client*).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};

use crate::error::{retry_after_seconds, CircuitOpen};
use crate::failover::Exhausted;
use crate::registry::RegistryFull;

impl IntoResponse for CircuitOpen {
    /// `503 Service Unavailable`, with:
    ///
    /// * `Retry-After` in whole seconds, rounded up and at least 1, as
    ///   [`CircuitOpen::to_http_response`] computes it (1.2 s gives `2`,
    ///   zero gives `1`);
    /// * a short `text/plain` body naming the breaker:
    ///   ``upstream `openai` is unavailable; retry after 12 s``.
    ///
    /// The body carries the breaker's name to the client: name breakers
    /// after what a client may know (a provider, a model), or map the
    /// error to a response of your own.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::response::{IntoResponse, Response};
    /// use http::{header::RETRY_AFTER, StatusCode};
    /// use tower::{service_fn, BoxError, Layer, ServiceExt};
    /// use tower_circuit_breaker::{Breaker, CircuitOpen, Config};
    ///
    /// /// What a handler returns for an upstream error.
    /// fn error_response(err: BoxError) -> Response {
    ///     match CircuitOpen::take(err) {
    ///         Ok(open) => open.into_response(),
    ///         Err(err) => (StatusCode::BAD_GATEWAY, err.to_string()).into_response(),
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), BoxError> {
    /// let breaker = Breaker::new(Config::builder().name("openai").build()?);
    /// breaker.force_open(Some(Duration::from_secs(12)));
    /// let upstream = breaker.layer().layer(service_fn(|_: ()| async { Ok::<_, BoxError>("hi") }));
    ///
    /// let response = error_response(upstream.oneshot(()).await.unwrap_err());
    /// assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    /// assert_eq!(response.headers()[RETRY_AFTER], "12");
    /// # Ok(())
    /// # }
    /// ```
    fn into_response(self) -> Response {
        let mut response = self.to_http_response::<Body>();
        // The header is the one place the seconds are computed.
        let seconds = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("1");
        let message = format!(
            "upstream `{}` is unavailable; retry after {seconds} s\n",
            self.breaker()
        );
        *response.body_mut() = Body::from(message);
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

/// `503 Service Unavailable` with a `text/plain` body, and `Retry-After`
/// in whole seconds (rounded up, at least 1) when `retry_after` is known.
fn unavailable(retry_after: Option<Duration>, message: String) -> Response {
    let mut response = Response::new(Body::from(message));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    if let Some(after) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_seconds(after)));
    }
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl IntoResponse for Exhausted {
    /// `503 Service Unavailable` with `Retry-After` set to the smallest
    /// retry-after among the open candidates (whole seconds, rounded up,
    /// at least 1), or none when no open candidate has a known end (every
    /// candidate failed, or an operator holds them open): the answer of a
    /// router whose every provider is out. The body names no candidate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::response::IntoResponse;
    /// use http::{header::RETRY_AFTER, StatusCode};
    /// use tower_circuit_breaker::failover::{Exhausted, Reason, Unavailable};
    /// use tower_circuit_breaker::State;
    ///
    /// let exhausted = Exhausted::new([
    ///     Unavailable::new(0, "openai", Reason::open(State::Open, Some(Duration::from_millis(20_500)))),
    ///     Unavailable::new(1, "anthropic", Reason::open(State::Open, Some(Duration::from_secs(30)))),
    /// ]);
    /// let response = exhausted.into_response();
    /// assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    /// assert_eq!(response.headers()[RETRY_AFTER], "21");
    /// ```
    fn into_response(self) -> Response {
        let message = match self.retry_after() {
            Some(_) => "every upstream is unavailable; retry later\n",
            None => "every upstream is unavailable\n",
        };
        unavailable(self.retry_after(), message.to_string())
    }
}

impl IntoResponse for RegistryFull {
    /// `503 Service Unavailable`, without `Retry-After`: the registry has
    /// no room for a breaker of the request's key until one of its
    /// breakers closes (or an operator lets go of one). The body says so,
    /// naming no key.
    fn into_response(self) -> Response {
        unavailable(None, format!("{self}\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::to_bytes;
    use http::StatusCode;

    use super::*;
    use crate::error::Name;
    use crate::State;

    fn refusal(name: &str, retry_after_ms: u64) -> CircuitOpen {
        CircuitOpen::new(
            Name::new(&Arc::from(name)),
            tokio::time::Instant::now() + std::time::Duration::from_millis(retry_after_ms),
            State::Open,
        )
    }

    fn retry_after<B>(response: &http::Response<B>) -> &str {
        response.headers()[RETRY_AFTER].to_str().unwrap()
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        for (ms, header) in [
            (0, "1"),
            (1, "1"),
            (999, "1"),
            (1_000, "1"),
            (1_001, "2"),
            (1_200, "2"),
            (12_000, "12"),
            (u64::MAX, "18446744073709552"),
        ] {
            let response = refusal("openai", ms).to_http_response::<()>();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(retry_after(&response), header, "{ms} ms");
        }
    }

    #[test]
    fn to_http_response_has_an_empty_default_body() {
        let response = refusal("openai", 5_000).to_http_response::<String>();
        assert!(response.body().is_empty());
        assert_eq!(response.headers().len(), 1, "only Retry-After");
    }

    #[tokio::test]
    async fn into_response_names_the_breaker_and_matches_the_header() {
        let response = refusal("openai", 11_200).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after(&response), "12");
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert_eq!(
            &body[..],
            b"upstream `openai` is unavailable; retry after 12 s\n"
        );
    }

    #[tokio::test]
    async fn an_exhausted_chain_answers_with_its_smallest_retry_after_or_none() {
        use crate::failover::{Reason, Unavailable};
        let open = |i, ms| {
            Unavailable::new(
                i,
                format!("p{i}"),
                Reason::open(State::Open, Some(std::time::Duration::from_millis(ms))),
            )
        };
        let response =
            Exhausted::new([open(0, 9_000), open(1, 2_100), open(2, 5_000)]).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after(&response), "3");
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert!(!body.windows(2).any(|w| w == b"p0"), "names no candidate");

        let failed = Unavailable::new(0, "p0", Reason::failed(None, None));
        let held = Unavailable::new(1, "p1", Reason::open(State::ForcedOpen, None));
        let response = Exhausted::new([failed, held]).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }

    #[test]
    fn a_full_registry_is_a_503_without_retry_after() {
        let full = crate::registry::Registry::<String>::builder()
            .max_keys(1)
            .build();
        full.get(&"a".to_string()).unwrap().force_open(None);
        let err = full.get(&"b".to_string()).unwrap_err();
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }

    #[tokio::test]
    async fn a_long_name_is_carried_whole() {
        let name = "a-breaker-name-longer-than-the-inline-copy";
        let response = refusal(name, 0).into_response();
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains(name));
    }
}
