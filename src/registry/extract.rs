//! Ready-made key extractors for `http::Request`s.
//!
//! A key becomes its breaker's name, and a name is shown wherever its
//! breaker is: the `breaker` label of every metric, the `breaker` field of
//! every tracing event, the message of a [`CircuitOpen`](crate::CircuitOpen)
//! (and the 503 body or gRPC status made from one, which reach clients),
//! failover errors, snapshots, and the keys of a shared store. So no
//! extractor here puts a credential in a key: [`authority`] drops the
//! `user:password@` of a URI or a `Host` header, and [`header`] keys a
//! header that may carry a credential by a fingerprint of its value, never
//! by the value itself.

use http::header::{HeaderName, HOST};
use http::uri::Authority;
use http::{HeaderValue, Request};

/// Keys a request by its authority (`host:port`, the host in lower case):
/// from the URI (as a client sends it), or from the `Host` header (as a
/// server receives it). Userinfo (`user:password@`) is never part of the
/// key. Requests with neither, or with a `Host` that is not an authority,
/// share the key `""`.
///
/// ```
/// use http::Request;
/// use tower_circuit_breaker::registry::authority;
///
/// let req = Request::get("https://api.example.com:8443/v1/chat").body(()).unwrap();
/// assert_eq!(authority(&req), "api.example.com:8443");
///
/// let with_credentials = Request::get("https://alice:s3cret@API.example.com/v1/chat")
///     .body(())
///     .unwrap();
/// assert_eq!(authority(&with_credentials), "api.example.com");
/// ```
pub fn authority<B>(req: &Request<B>) -> String {
    if let Some(authority) = req.uri().authority() {
        return host_and_port(authority);
    }
    req.headers()
        .get(HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .map(|authority| host_and_port(&authority))
        .unwrap_or_default()
}

/// `host:port` (or `host`) of an authority, without its userinfo.
fn host_and_port(authority: &Authority) -> String {
    let host = authority.host().to_ascii_lowercase();
    match authority.port() {
        Some(port) => format!("{host}:{}", port.as_str()),
        None => host,
    }
}

/// Parts of a header name that mark it as carrying a credential:
/// `Authorization`, `Proxy-Authorization`, `Cookie`, `x-api-key`, `api-key`,
/// `x-goog-api-key`, `x-auth-token`, `x-session-id`...
const CREDENTIAL_MARKS: [&str; 8] = [
    "auth",
    "cookie",
    "key",
    "token",
    "secret",
    "passw",
    "credential",
    "session",
];

fn carries_a_credential(name: &HeaderName) -> bool {
    // Header names are lower case.
    let name = name.as_str();
    CREDENTIAL_MARKS.iter().any(|mark| name.contains(mark))
}

/// Keys requests by the value of header `name` (a tenant, a model name);
/// requests without it, or with a value that is not visible ASCII, share
/// the key `""`.
///
/// A header that may carry a credential is keyed by a fingerprint of its
/// value instead, `<name>#<16 hex digits>`: one breaker per credential, and
/// the credential itself in no name. That is every header whose name
/// contains `auth`, `cookie`, `key`, `token`, `secret`, `passw`,
/// `credential` or `session` (`Authorization`, `Cookie`, `x-api-key`,
/// `x-goog-api-key`, `x-auth-token`...), and any value marked
/// [sensitive](HeaderValue::is_sensitive).
///
/// The fingerprint is the 64-bit FNV-1a hash of the value's bytes: the same
/// in every process and version (instances sharing state through a store
/// agree on it), and not a secret-keeping hash: it keeps the credential out
/// of metrics, logs and errors, not from someone who can guess it and
/// compare.
///
/// ```
/// use http::{header::{HeaderName, AUTHORIZATION}, Request};
/// use tower_circuit_breaker::registry::header;
///
/// let key_of = header(HeaderName::from_static("x-model"));
/// let req = Request::get("/").header("x-model", "gpt-x").body(()).unwrap();
/// assert_eq!(key_of(&req), "gpt-x");
///
/// let per_credential = header(AUTHORIZATION);
/// let req = Request::get("/").header(AUTHORIZATION, "Bearer sk-s3cret").body(()).unwrap();
/// let key = per_credential(&req);
/// assert!(key.starts_with("authorization#") && !key.contains("s3cret"));
/// ```
pub fn header<B>(name: HeaderName) -> impl Fn(&Request<B>) -> String + Clone {
    let credential = carries_a_credential(&name);
    move |req| match req.headers().get(&name) {
        Some(value) if credential || value.is_sensitive() => fingerprint(&name, value),
        Some(value) => value.to_str().unwrap_or_default().to_string(),
        None => String::new(),
    }
}

/// `<name>#<FNV-1a of the value, 16 hex digits>`.
fn fingerprint(name: &HeaderName, value: &HeaderValue) -> String {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let hash = value.as_bytes().iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    });
    format!("{}#{hash:016x}", name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    fn server(host: &str) -> Request<()> {
        Request::get("/v1/chat")
            .header(HOST, host)
            .body(())
            .unwrap()
    }

    #[test]
    fn userinfo_never_reaches_the_key() {
        for (request, key) in [
            (
                client("http://alice:s3cret@api.example.com/"),
                "api.example.com",
            ),
            (
                client("https://alice:s3cret@API.example.com:8443/v1"),
                "api.example.com:8443",
            ),
            (client("http://s3cret@[::1]:8080/"), "[::1]:8080"),
            (server("alice:s3cret@api.example.com"), "api.example.com"),
            (
                server("s3cret@api.example.com:8443"),
                "api.example.com:8443",
            ),
            (server("Api.Example.com"), "api.example.com"),
            (server("not an authority"), ""),
            (Request::get("/").body(()).unwrap(), ""),
        ] {
            assert_eq!(authority(&request), key, "{request:?}");
        }
    }

    #[test]
    fn credential_headers_are_keyed_by_their_fingerprint() {
        let req = |name: &str, value: &'static str| {
            Request::get("/").header(name, value).body(()).unwrap()
        };
        for name in [
            "authorization",
            "proxy-authorization",
            "cookie",
            "x-api-key",
            "api-key",
            "x-goog-api-key",
            "x-auth-token",
            "x-client-secret",
        ] {
            let key_of = header(HeaderName::from_static(name));
            let a = key_of(&req(name, "s3cret-a"));
            let b = key_of(&req(name, "s3cret-b"));
            assert!(a.starts_with(&format!("{name}#")), "{a}");
            assert!(!a.contains("s3cret") && !b.contains("s3cret"));
            assert_ne!(a, b, "one breaker per credential");
            assert_eq!(a, key_of(&req(name, "s3cret-a")), "the same every time");
        }
        // Any header marked sensitive.
        let mut value = HeaderValue::from_static("s3cret");
        value.set_sensitive(true);
        let req = Request::get("/")
            .header("x-tenant", value)
            .body(())
            .unwrap();
        let key = header(HeaderName::from_static("x-tenant"))(&req);
        assert!(key.starts_with("x-tenant#") && !key.contains("s3cret"));
    }

    #[test]
    fn other_headers_are_keyed_by_their_value() {
        for name in ["x-model", "x-tenant", "x-provider", "content-type"] {
            let req = Request::get("/").header(name, "v1").body(()).unwrap();
            assert_eq!(header(HeaderName::from_static(name))(&req), "v1", "{name}");
        }
    }

    #[test]
    fn the_fingerprint_is_fnv1a() {
        // FNV-1a's published test vectors.
        let name = HeaderName::from_static("x-key");
        assert_eq!(
            fingerprint(&name, &HeaderValue::from_static("")),
            "x-key#cbf29ce484222325"
        );
        assert_eq!(
            fingerprint(&name, &HeaderValue::from_static("a")),
            "x-key#af63dc4c8601ec8c"
        );
        assert_eq!(
            fingerprint(&name, &HeaderValue::from_static("foobar")),
            "x-key#85944171f73967e8"
        );
    }
}
