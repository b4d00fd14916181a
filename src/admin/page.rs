//! `GET /`: the live page, one self-contained document. Its script reads
//! `breakers` and `events` relative to where the page is served, so the
//! router nests under any path.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use axum::response::Response;
use http::header::{HeaderName, CONTENT_SECURITY_POLICY, REFERRER_POLICY, X_FRAME_OPTIONS};
use http::{HeaderValue, StatusCode};

use super::json::with_headers;

/// The page, with `{nonce}` where its script and style tags take the
/// response's nonce.
const PAGE: &str = include_str!("page.html");

/// `GET /`.
pub(super) async fn page() -> Response {
    let nonce = nonce();
    let html = PAGE.replace("{nonce}", &nonce);
    let mut response = with_headers(StatusCode::OK, "text/html; charset=utf-8", html);
    // Only the page's own script and style run, and it talks only to the
    // server it came from: markup that reached the document by mistake
    // could not run a handler, load anything or send anything elsewhere.
    let policy = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    );
    let headers = response.headers_mut();
    if let Ok(policy) = HeaderValue::from_str(&policy) {
        headers.insert(CONTENT_SECURITY_POLICY, policy);
    }
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// 128 bits no one outside the process can guess: SipHash under the keys
/// `RandomState` draws from the operating system's randomness (per thread,
/// then stepped for each new state), as `std` keys its hash maps against
/// attackers. Fresh for every response, as a nonce must be.
fn nonce() -> String {
    let high = RandomState::new().hash_one(0u8);
    let low = RandomState::new().hash_one(1u8);
    format!("{high:016x}{low:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_response_has_its_own_nonce() {
        let a = nonce();
        assert_eq!(a.len(), 32);
        assert_ne!(a, nonce());
    }

    #[test]
    fn the_page_fetches_nothing_from_elsewhere() {
        assert!(PAGE.contains("{nonce}"));
        for forbidden in [
            "http://",
            "https://",
            "src=",
            "href=",
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!PAGE.contains(forbidden), "the page contains {forbidden:?}");
        }
    }
}
