//! `POST /breakers/{name}/{action}`, `POST /groups/{prefix}/{action}` and
//! `POST /control/{action}`: manual control, routed only when
//! [`Admin::control`] enables it.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State as Shared};
use axum::response::Response;
use http::header::{HOST, ORIGIN};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use super::json::{self, Entry};
use super::Admin;
use crate::serialization::parse_duration;
use crate::{Breaker, Control};

const ACTIONS: &str = "force-open, force-closed, disable, restore, reset";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ControlQuery {
    /// For `force-open`: how long, as the `serde` feature writes durations.
    #[serde(rename = "for")]
    pub(super) period: Option<String>,
}

/// The control a path names, with `force-open`'s period.
pub(super) fn read_action(
    name: &str,
    query: ControlQuery,
) -> Result<Control, (StatusCode, String)> {
    let period = match (name, query.period) {
        ("force-open", Some(text)) => Some(parse_duration(&text).map_err(|err| {
            (
                StatusCode::BAD_REQUEST,
                format!("`for` must be a duration such as 30s or 5m: {err}"),
            )
        })?),
        (_, Some(_)) => {
            return Err((
                StatusCode::BAD_REQUEST,
                "only force-open takes `for`".to_string(),
            ))
        }
        (_, None) => None,
    };
    Ok(match name {
        "force-open" => Control::ForceOpen(period),
        "force-closed" => Control::ForceClosed,
        "disable" => Control::Disable,
        "restore" => Control::Restore,
        "reset" => Control::Reset,
        other => {
            return Err((
                StatusCode::NOT_FOUND,
                format!("no action {other:?}; the actions are {ACTIONS}"),
            ))
        }
    })
}

/// Whether a control request may come from where it says it comes from. A
/// browser marks what another site's page makes it send: `Sec-Fetch-Site`
/// (every current browser), or an `Origin` whose host is not the one asked.
/// A page elsewhere must not make an on-call person's logged-in browser
/// press the buttons. Requests without the marks (`curl`, scripts) pass:
/// authentication is the router's layers' job.
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        // `none`: typed in the address bar, or a bookmark.
        return matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return true;
    };
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, host)| host);
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

/// Refuses what another site's page makes a browser send.
pub(super) fn from_this_site(headers: &HeaderMap) -> Result<(), (StatusCode, String)> {
    if same_origin(headers) {
        Ok(())
    } else {
        Err((
            StatusCode::FORBIDDEN,
            "control requests from another site's page are refused".to_string(),
        ))
    }
}

/// The checks every control request passes: where it comes from, what it
/// asks.
fn checked(
    headers: &HeaderMap,
    action: &str,
    query: Result<Query<ControlQuery>, QueryRejection>,
) -> Result<Control, (StatusCode, String)> {
    from_this_site(headers)?;
    let Query(query) = query.map_err(|e| (StatusCode::BAD_REQUEST, e.body_text()))?;
    read_action(action, query)
}

/// `POST /breakers/{name}/{action}`.
pub(super) async fn one(
    Shared(admin): Shared<Arc<Admin>>,
    Path((name, action_name)): Path<(String, String)>,
    headers: HeaderMap,
    query: Result<Query<ControlQuery>, QueryRejection>,
) -> Response {
    match checked(&headers, &action_name, query) {
        Ok(action) => on_breaker(&admin, name, action_name, action),
        Err((status, message)) => json::error(status, message),
    }
}

/// `POST /groups/{prefix}/{action}`: every breaker whose name starts with
/// `prefix`.
pub(super) async fn group(
    Shared(admin): Shared<Arc<Admin>>,
    Path((prefix, action_name)): Path<(String, String)>,
    headers: HeaderMap,
    query: Result<Query<ControlQuery>, QueryRejection>,
) -> Response {
    match checked(&headers, &action_name, query) {
        Ok(action) => on_group(&admin, prefix, action_name, action),
        Err((status, message)) => json::error(status, message),
    }
}

/// The query of `POST /control/{action}`: the breaker or the prefix it
/// acts on, and `force-open`'s period.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TargetQuery {
    breaker: Option<String>,
    prefix: Option<String>,
    #[serde(rename = "for")]
    period: Option<String>,
}

/// `POST /control/{action}?breaker=NAME` or `?prefix=PREFIX`: the same as
/// the two routes above, with the name in the query, where a browser
/// leaves it as it is. In a path, a breaker named `.` or `..` (or a
/// prefix) is a dot segment, which a browser removes before it sends the
/// request; the page uses this route for every button.
pub(super) async fn by_query(
    Shared(admin): Shared<Arc<Admin>>,
    Path(action_name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<TargetQuery>, QueryRejection>,
) -> Response {
    let checked = from_this_site(&headers).and_then(|()| {
        let Query(query) = query.map_err(|e| (StatusCode::BAD_REQUEST, e.body_text()))?;
        let action = read_action(
            &action_name,
            ControlQuery {
                period: query.period,
            },
        )?;
        Ok((query.breaker, query.prefix, action))
    });
    match checked {
        Ok((Some(name), None, action)) => on_breaker(&admin, name, action_name, action),
        Ok((None, Some(prefix), action)) => on_group(&admin, prefix, action_name, action),
        Ok(_) => json::error(
            StatusCode::BAD_REQUEST,
            "name either `breaker` or `prefix` in the query".to_string(),
        ),
        Err((status, message)) => json::error(status, message),
    }
}

/// Carries out `action` on the breaker named `name`.
fn on_breaker(admin: &Admin, name: String, action_name: String, action: Control) -> Response {
    let Some(breaker) = admin.source.find(&name) else {
        return json::error(
            StatusCode::NOT_FOUND,
            format!("no breaker is named {name:?}"),
        );
    };
    #[derive(Serialize)]
    struct Done {
        action: String,
        changed: bool,
        breaker: Entry,
    }
    let changed = breaker.control(action);
    tracing::info!(breaker = ?name, action = ?action_name, changed, "circuit breaker controlled through the admin endpoint");
    json::respond(
        StatusCode::OK,
        &Done {
            action: action_name,
            changed,
            breaker: Entry::of(admin, &breaker),
        },
    )
}

/// Carries out `action` on every breaker whose name starts with `prefix`.
fn on_group(admin: &Admin, prefix: String, action_name: String, action: Control) -> Response {
    let breakers: Vec<Breaker> = admin
        .source
        .breakers()
        .into_iter()
        .filter(|b| b.name().starts_with(&prefix))
        .collect();
    #[derive(Serialize)]
    struct Done {
        action: String,
        prefix: String,
        matched: usize,
        changed: usize,
    }
    let changed = breakers.iter().filter(|b| b.control(action)).count();
    tracing::info!(prefix = ?prefix, action = ?action_name, matched = breakers.len(), changed, "circuit breakers controlled through the admin endpoint");
    json::respond(
        StatusCode::OK,
        &Done {
            action: action_name,
            prefix,
            matched: breakers.len(),
            changed,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    http::HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn requests_another_site_makes_a_browser_send_are_refused() {
        assert!(same_origin(&headers(&[])), "curl");
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "null"),
            ("host", "127.0.0.1:8080")
        ])));
    }

    #[test]
    fn actions_are_read_with_their_period() {
        let read = |name: &str, period: Option<&str>| {
            read_action(
                name,
                ControlQuery {
                    period: period.map(str::to_string),
                },
            )
        };
        assert_eq!(read("force-open", None), Ok(Control::ForceOpen(None)));
        assert_eq!(
            read("force-open", Some("90s")),
            Ok(Control::ForceOpen(Some(Duration::from_secs(90))))
        );
        assert_eq!(read("reset", None), Ok(Control::Reset));
        assert_eq!(
            read("reset", Some("1s")).unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            read("force-open", Some("soon")).unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
        let (status, message) = read("explode", None).unwrap_err();
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(message.contains("force-open, force-closed, disable, restore, reset"));
    }
}
