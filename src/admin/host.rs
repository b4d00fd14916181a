//! Which host names the admin endpoint answers under: every route refuses
//! a request whose `Host` is not one of them, so that a page on a name
//! rebound to this machine's address (DNS rebinding) cannot read the
//! breakers or press the buttons.

use std::sync::Arc;

use axum::extract::{Request, State as Shared};
use axum::middleware::Next;
use axum::response::Response;
use http::header::HOST;
use http::StatusCode;

use super::json;
use super::Admin;

/// The names an [`Admin`] answers under, beside the loopback ones.
#[derive(Clone, Debug, Default)]
pub(super) enum Hosts {
    /// Loopback names and addresses only (the default).
    #[default]
    Loopback,
    /// Loopback, and these names (lowercase, without port or final dot).
    Also(Arc<[String]>),
    /// Any name: something in front checks it.
    Any,
}

impl Hosts {
    /// Loopback and `names` (each as a `Host` header writes it: a name, an
    /// IPv4 address or a bracketed IPv6 one; a port is not compared).
    pub(super) fn also<I, H>(names: I) -> Self
    where
        I: IntoIterator<Item = H>,
        H: AsRef<str>,
    {
        Hosts::Also(
            names
                .into_iter()
                .map(|name| name_of(name.as_ref()).to_ascii_lowercase())
                .collect(),
        )
    }

    /// Whether a request naming `host` (a `Host` header's value, or a
    /// URI's authority) is answered.
    fn allows(&self, host: &str) -> bool {
        let name = name_of(host);
        match self {
            Hosts::Any => true,
            _ if is_loopback(name) => true,
            Hosts::Loopback => false,
            Hosts::Also(names) => names.iter().any(|n| n.eq_ignore_ascii_case(name)),
        }
    }
}

/// The name part of `host`: without a port, without a final dot.
fn name_of(host: &str) -> &str {
    let host = host.trim();
    let name = if host.starts_with('[') {
        // `[::1]:8080`: the address with its brackets.
        host.find(']').map_or(host, |end| &host[..=end])
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.strip_suffix('.').unwrap_or(name)
}

/// Names a browser only sends for a page it loaded from this machine:
/// `localhost` and its subdomains (which browsers resolve to loopback
/// themselves, never through DNS), `127.0.0.0/8` and `[::1]`.
fn is_loopback(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    if let Some(v6) = lower.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    }
    lower
        .parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback())
}

/// Every route's first check. A request that names no host at all
/// (HTTP/1.0; no browser sends one) passes: it cannot come from a page.
pub(super) async fn check(
    Shared(admin): Shared<Arc<Admin>>,
    request: Request,
    next: Next,
) -> Response {
    let named = request
        .headers()
        .get(HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"))
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match named {
        Some(host) if !admin.hosts.allows(host) => json::error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this admin endpoint is not served under the host {host:?}: \
                 name it with Admin::allowed_hosts"
            ),
        ),
        _ => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_are_always_allowed() {
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "admin.localhost:3000",
            "127.0.0.1",
            "127.0.0.1:9000",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(Hosts::Loopback.allows(host), "{host}");
            assert!(Hosts::also(["admin.internal"]).allows(host), "{host}");
        }
    }

    #[test]
    fn other_names_need_naming_and_ports_are_not_compared() {
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "10.0.0.5:9000",
            "[fd00::1]:80",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "",
            "\u{fffd}",
        ] {
            assert!(!Hosts::Loopback.allows(host), "{host}");
        }
        let named = Hosts::also(["Admin.Internal", "10.0.0.5:1234", "[FD00::1]"]);
        assert!(named.allows("admin.internal:8080"));
        assert!(named.allows("ADMIN.INTERNAL."));
        assert!(named.allows("10.0.0.5:9000"));
        assert!(named.allows("[fd00::1]:80"));
        assert!(!named.allows("attacker.example"));
        assert!(!named.allows("internal"));
        assert!(Hosts::Any.allows("attacker.example"));
    }
}
