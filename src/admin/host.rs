//! Which host names the admin endpoint answers under: every route refuses
//! a request whose `Host` is not one of them, so that a page on a name
//! rebound to this machine's address (DNS rebinding) cannot read the
//! breakers or press the buttons.

use std::net::{Ipv4Addr, Ipv6Addr};
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
    /// Loopback, and these names (each [`canonical`], without port or
    /// final dot).
    Also(Arc<[String]>),
    /// Any name: something in front checks it.
    Any,
}

impl Hosts {
    /// Loopback and `names` (each as a `Host` header writes it: a name, an
    /// IPv4 address or an IPv6 one, bracketed or not; a port is not
    /// compared).
    pub(super) fn also<I, H>(names: I) -> Self
    where
        I: IntoIterator<Item = H>,
        H: AsRef<str>,
    {
        Hosts::Also(
            names
                .into_iter()
                .map(|name| canonical(name_of(name.as_ref())))
                .collect(),
        )
    }

    /// Whether a request naming `host` (a `Host` header's value, or a
    /// URI's authority) is answered.
    fn allows(&self, host: &str) -> bool {
        let name = canonical(name_of(host));
        match self {
            Hosts::Any => true,
            _ if is_loopback(&name) => true,
            Hosts::Loopback => false,
            Hosts::Also(names) => names.contains(&name),
        }
    }
}

/// The name part of `host`: without a port, without a final dot. An IPv6
/// address keeps its brackets, or is taken whole when it has none (it
/// cannot have a port then).
fn name_of(host: &str) -> &str {
    let host = host.trim();
    let name = if host.starts_with('[') {
        // `[::1]:8080`: the address with its brackets.
        host.find(']').map_or(host, |end| &host[..=end])
    } else if host.bytes().filter(|&b| b == b':').count() > 1 {
        host
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.strip_suffix('.').unwrap_or(name)
}

/// One spelling per host: names in lowercase, addresses as the standard
/// library writes them (IPv6 in brackets, compressed), so that
/// `[FD00:0::1]`, `fd00::1` and `[fd00::1]` are one host.
fn canonical(name: &str) -> String {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    if let Ok(v6) = bare.parse::<Ipv6Addr>() {
        return format!("[{v6}]");
    }
    if let Ok(v4) = bare.parse::<Ipv4Addr>() {
        return v4.to_string();
    }
    name.to_ascii_lowercase()
}

/// Names a browser only sends for a page it loaded from this machine:
/// `localhost`, `127.0.0.0/8` and `[::1]` (and IPv4 loopback mapped into
/// IPv6). Subdomains of `localhost` are not among them: most browsers
/// resolve them to loopback themselves, but a client that asks a resolver
/// could be given another address; name them with
/// [`Admin::allowed_hosts`](super::Admin::allowed_hosts) to allow them.
/// `name` is [`canonical`].
fn is_loopback(name: &str) -> bool {
    if name == "localhost" {
        return true;
    }
    if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return v6.parse::<Ipv6Addr>().is_ok_and(|a| {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        });
    }
    name.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
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
            "127.0.0.1",
            "127.0.0.1:9000",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
            "[0:0:0:0:0:0:0:1]:8080",
            "[::ffff:127.0.0.1]:8080",
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
            "admin.localhost:3000",
            "10.0.0.5:9000",
            "[fd00::1]:80",
            "[::ffff:10.0.0.1]",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "",
            "\u{fffd}",
        ] {
            assert!(!Hosts::Loopback.allows(host), "{host}");
        }
        let named = Hosts::also([
            "Admin.Internal",
            "10.0.0.5:1234",
            "fd00::1",
            "[FD00:0::2]:80",
            "admin.localhost",
        ]);
        assert!(named.allows("admin.internal:8080"));
        assert!(named.allows("ADMIN.INTERNAL."));
        assert!(named.allows("10.0.0.5:9000"));
        assert!(
            named.allows("[fd00::1]:80"),
            "a bare IPv6 address keeps its last group"
        );
        assert!(
            named.allows("[fd00::2]"),
            "addresses compare in one spelling"
        );
        assert!(
            named.allows("admin.localhost:3000"),
            "subdomains of localhost when named"
        );
        assert!(!named.allows("[fd00::123]"));
        assert!(!named.allows("fd00:"));
        assert!(!named.allows("attacker.example"));
        assert!(!named.allows("internal"));
        assert!(Hosts::Any.allows("attacker.example"));
    }
}
