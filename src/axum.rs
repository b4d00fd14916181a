//! axum integration (feature `axum`): a refused call answers
//! `503 Service Unavailable` with `Retry-After`, through `CircuitOpen`'s
//! `IntoResponse`. The wiring of axum clients and of a guarded route, the
//! crate's guide (section *Wiring each client*).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::HeaderValue;

use crate::error::CircuitOpen;

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
    async fn a_long_name_is_carried_whole() {
        let name = "a-breaker-name-longer-than-the-inline-copy";
        let response = refusal(name, 0).into_response();
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains(name));
    }
}
