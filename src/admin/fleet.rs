//! `GET /fleet?breaker={name}` and `POST /fleet/{action}?breaker={name}`:
//! one name as the whole fleet keeps it, beside this instance's breaker,
//! and the controls that reach every instance; routed only when
//! [`Admin::fleet`] gives a fleet store (the control route only with
//! [`Admin::control`] as well).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State as Shared};
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use super::control::{from_this_site, read_action, ControlQuery};
use super::json::{self, Entry};
use super::Admin;
use crate::store::{Fleet, FleetState};
use crate::Control;

/// The query of both routes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FleetQuery {
    breaker: Option<String>,
    /// For `force-open`: how long.
    #[serde(rename = "for")]
    period: Option<String>,
}

/// The fleet's state of a name as JSON: every duration in milliseconds.
#[derive(Serialize)]
struct FleetView {
    /// `open` (with `opening`), `counting` (failures counted) or `closed`,
    /// as the fleet keeps it.
    state: &'static str,
    opening: Option<OpeningView>,
    failures: u64,
    failing: Vec<String>,
    votes: Vec<String>,
    prober: Option<ProberView>,
    /// The fleet-wide control in force: `forced_open`, `forced_closed`,
    /// `disabled`, or null.
    control: Option<&'static str>,
}

#[derive(Serialize)]
struct OpeningView {
    generation: u64,
    attempt: u32,
    open_for_ms: u128,
    kept_for_ms: u128,
    min_open_for_ms: u128,
    probe_successes: u32,
}

#[derive(Serialize)]
struct ProberView {
    instance: String,
    lease_ms: u128,
}

impl From<FleetState> for FleetView {
    fn from(s: FleetState) -> Self {
        let state = match (&s.opening, s.failures) {
            (Some(_), _) => "open",
            (None, 0) => "closed",
            (None, _) => "counting",
        };
        FleetView {
            state,
            opening: s.opening.map(|o| OpeningView {
                generation: o.generation,
                attempt: o.attempt,
                open_for_ms: o.open_for.as_millis(),
                kept_for_ms: o.kept_for.as_millis(),
                min_open_for_ms: o.min_open_for.as_millis(),
                probe_successes: o.probe_successes,
            }),
            failures: s.failures,
            failing: s.failing,
            votes: s.votes,
            prober: s.prober.map(|(instance, lease)| ProberView {
                instance,
                lease_ms: lease.as_millis(),
            }),
            control: s.control.map(|c| match c {
                Control::ForceOpen(_) => "forced_open",
                Control::ForceClosed => "forced_closed",
                _ => "disabled",
            }),
        }
    }
}

/// One name, the fleet's view beside this instance's.
#[derive(Serialize)]
struct Both {
    breaker: String,
    /// This instance's name in the fleet.
    instance: String,
    /// Whether this instance shares the name with the fleet now.
    shared: bool,
    fleet: FleetView,
    /// This instance's breaker of that name; null if it has none.
    local: Option<Entry>,
}

/// The name the query gives, or why it gives none.
fn named(
    query: Result<Query<FleetQuery>, QueryRejection>,
) -> Result<FleetQuery, (StatusCode, String)> {
    let Query(query) = query.map_err(|e| (StatusCode::BAD_REQUEST, e.body_text()))?;
    if query.breaker.is_none() {
        return Err((
            StatusCode::BAD_REQUEST,
            "name the breaker in the query: `?breaker=NAME`".to_string(),
        ));
    }
    Ok(query)
}

/// Reads the fleet's state of `name`, beside the local one.
async fn both(admin: &Admin, fleet: &Fleet, name: String) -> Result<Both, (StatusCode, String)> {
    let state = fleet
        .state(&name)
        .await
        .map_err(|err| (StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(Both {
        instance: fleet.instance().to_owned(),
        shared: fleet.shares(&name),
        fleet: state.into(),
        local: admin.source.find(&name).map(|b| Entry::of(admin, &b)),
        breaker: name,
    })
}

/// `GET /fleet?breaker={name}`.
pub(super) async fn view(
    Shared(admin): Shared<Arc<Admin>>,
    query: Result<Query<FleetQuery>, QueryRejection>,
) -> Response {
    let query = match named(query) {
        Ok(query) => query,
        Err((status, message)) => return json::error(status, message),
    };
    if query.period.is_some() {
        return json::error(StatusCode::BAD_REQUEST, "only force-open takes `for`");
    }
    let Some(fleet) = admin.fleet.clone() else {
        return json::error(StatusCode::NOT_FOUND, "no fleet store is configured");
    };
    match both(&admin, &fleet, query.breaker.unwrap_or_default()).await {
        Ok(both) => json::respond(StatusCode::OK, &both),
        Err((status, message)) => json::error(status, message),
    }
}

/// `POST /fleet/{action}?breaker={name}`: the action on every instance's
/// breaker of that name; answers with the fleet's state after it.
pub(super) async fn control(
    Shared(admin): Shared<Arc<Admin>>,
    Path(action_name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<FleetQuery>, QueryRejection>,
) -> Response {
    if let Err((status, message)) = from_this_site(&headers) {
        return json::error(status, message);
    }
    let query = match named(query) {
        Ok(query) => query,
        Err((status, message)) => return json::error(status, message),
    };
    let action = match read_action(
        &action_name,
        ControlQuery {
            period: query.period,
        },
    ) {
        Ok(action) => action,
        Err((status, message)) => return json::error(status, message),
    };
    let Some(fleet) = admin.fleet.clone() else {
        return json::error(StatusCode::NOT_FOUND, "no fleet store is configured");
    };
    let name = query.breaker.unwrap_or_default();
    if let Err(err) = fleet.control(&name, action).await {
        return json::error(StatusCode::SERVICE_UNAVAILABLE, err.to_string());
    }
    tracing::info!(breaker = ?name, action = ?action_name, instance = fleet.instance(), "circuit breaker controlled fleet-wide through the admin endpoint");
    #[derive(Serialize)]
    struct Done {
        action: String,
        #[serde(flatten)]
        both: Both,
    }
    match both(&admin, &fleet, name).await {
        Ok(both) => json::respond(
            StatusCode::OK,
            &Done {
                action: action_name,
                both,
            },
        ),
        Err((status, message)) => json::error(status, message),
    }
}
