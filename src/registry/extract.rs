//! Ready-made key extractors for `http::Request`s.

use http::header::{HeaderName, HOST};
use http::Request;

/// Keys a request by its authority (`host:port`): from the URI (as a client
/// sends it), or from the `Host` header (as a server receives it); requests
/// with neither share the key `""`.
///
/// ```
/// use http::Request;
/// use tower_circuit_breaker::registry::authority;
///
/// let req = Request::get("https://api.example.com:8443/v1/chat").body(()).unwrap();
/// assert_eq!(authority(&req), "api.example.com:8443");
/// ```
pub fn authority<B>(req: &Request<B>) -> String {
    if let Some(authority) = req.uri().authority() {
        return authority.as_str().to_ascii_lowercase();
    }
    req.headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default()
}

/// Keys requests by the value of header `name` (a credential id, a tenant,
/// a model name); requests without it, or with a value that is not visible
/// ASCII, share the key `""`.
///
/// ```
/// use http::{header::HeaderName, Request};
/// use tower_circuit_breaker::registry::header;
///
/// let key_of = header(HeaderName::from_static("x-model"));
/// let req = Request::get("/").header("x-model", "gpt-x").body(()).unwrap();
/// assert_eq!(key_of(&req), "gpt-x");
/// ```
pub fn header<B>(name: HeaderName) -> impl Fn(&Request<B>) -> String + Clone {
    move |req| {
        req.headers()
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }
}
