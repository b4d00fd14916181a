//! `GET /breakers` and `GET /breakers/{name}`: breakers as JSON, filtered,
//! ordered and paged on the server.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State as Shared};
use axum::response::Response;
use http::StatusCode;
use serde::{Deserialize, Serialize};

use super::json::{self, Entry};
use super::Admin;
use crate::{Breaker, State};

/// A page's rows when the request does not say.
const DEFAULT_LIMIT: usize = 100;
/// The most rows a page may ask for.
pub(super) const MAX_LIMIT: usize = 1_000;

/// Every state, in the order the page lists them: what needs looking at
/// first, closed last.
const STATES: [State; 6] = [
    State::Open,
    State::HalfOpen,
    State::ForcedOpen,
    State::ForcedClosed,
    State::Disabled,
    State::Closed,
];

/// The query as written; every field checked by [`Query::read`].
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuery {
    prefix: Option<String>,
    state: Option<String>,
    sort: Option<String>,
    offset: Option<String>,
    limit: Option<String>,
}

/// Which breakers a page shows.
#[derive(Debug, PartialEq)]
pub(super) struct Filter {
    prefix: String,
    /// The states asked for, by rank (`None` for every state): a mask, so
    /// that a list naming a state many times costs what naming it once does.
    states: Option<[bool; STATES.len()]>,
    by_name: bool,
    offset: usize,
    limit: usize,
}

impl Filter {
    /// Checks the query: every mistake names its parameter.
    pub(super) fn read(raw: RawQuery) -> Result<Self, String> {
        let states = match raw.state.as_deref() {
            None | Some("") => None,
            Some(list) => {
                let mut wanted = [false; STATES.len()];
                for name in list.split(',') {
                    if let Some(slot) = wanted.get_mut(rank(state_named(name.trim())?)) {
                        *slot = true;
                    }
                }
                Some(wanted)
            }
        };
        let by_name = match raw.sort.as_deref() {
            None | Some("state") => false,
            Some("name") => true,
            Some(other) => return Err(format!("`sort` must be `state` or `name`, not {other:?}")),
        };
        let offset = number("offset", raw.offset.as_deref(), 0)?;
        let limit = number("limit", raw.limit.as_deref(), DEFAULT_LIMIT)?;
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(format!(
                "`limit` must be from 1 to {MAX_LIMIT}, not {limit}"
            ));
        }
        Ok(Filter {
            prefix: raw.prefix.unwrap_or_default(),
            states,
            by_name,
            offset,
            limit,
        })
    }
}

fn state_named(name: &str) -> Result<State, String> {
    STATES
        .into_iter()
        .find(|state| state.as_str() == name)
        .ok_or_else(|| {
            let known: Vec<_> = STATES.iter().map(|s| s.as_str()).collect();
            format!("`state` must be one of {}, not {name:?}", known.join(", "))
        })
}

fn number(parameter: &str, value: Option<&str>, default: usize) -> Result<usize, String> {
    match value {
        None | Some("") => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|_| format!("`{parameter}` must be a whole number, not {text:?}")),
    }
}

/// Where a state is listed: lower first.
fn rank(state: State) -> usize {
    STATES
        .iter()
        .position(|s| *s == state)
        .unwrap_or(STATES.len())
}

/// One page of breakers.
#[derive(Serialize)]
pub(super) struct Page {
    total: usize,
    matched: usize,
    offset: usize,
    limit: usize,
    control: bool,
    /// Whether `GET /fleet` exists (a fleet store is given).
    fleet: bool,
    states: serde_json::Map<String, serde_json::Value>,
    breakers: Vec<Entry>,
}

impl Page {
    /// The page `filter` asks for. Every breaker's state is read once; only
    /// the page's breakers are snapshotted.
    pub(super) fn of(admin: &Admin, all: Vec<Breaker>, filter: &Filter) -> Page {
        let total = all.len();
        let mut in_states = [0usize; STATES.len()];
        let mut matched: Vec<(usize, Breaker)> = all
            .into_iter()
            .filter(|b| b.name().starts_with(&filter.prefix))
            .filter_map(|b| {
                let rank = rank(b.state());
                if let Some(count) = in_states.get_mut(rank) {
                    *count += 1;
                }
                let wanted = filter
                    .states
                    .as_ref()
                    .is_none_or(|wanted| wanted.get(rank).copied().unwrap_or(false));
                wanted.then_some((rank, b))
            })
            .collect();
        if filter.by_name {
            matched.sort_unstable_by(|(_, a), (_, b)| a.name().cmp(b.name()));
        } else {
            matched.sort_unstable_by(|(ra, a), (rb, b)| {
                ra.cmp(rb).then_with(|| a.name().cmp(b.name()))
            });
        }
        let shown: Vec<&Breaker> = matched
            .iter()
            .skip(filter.offset)
            .take(filter.limit)
            .map(|(_, b)| b)
            .collect();
        let parents = admin.parents(&shown);
        // The parents the page names that hold their children: one pass
        // over the source, whatever the number of rows.
        let named: std::collections::HashSet<&str> =
            parents.iter().flatten().map(String::as_str).collect();
        let holding: std::collections::HashSet<String> = if named.is_empty() {
            Default::default()
        } else {
            admin
                .source
                .breakers()
                .into_iter()
                .filter(|b| named.contains(b.name()) && b.refuses_calls())
                .map(|b| b.name().to_string())
                .collect()
        };
        let breakers = shown
            .iter()
            .zip(parents)
            .map(|(b, parent)| {
                let held = parent.as_ref().is_some_and(|p| holding.contains(p));
                Entry::with_parent(b, parent, held)
            })
            .collect();
        Page {
            total,
            matched: matched.len(),
            offset: filter.offset,
            limit: filter.limit,
            control: admin.control,
            fleet: admin.fleet.is_some(),
            states: STATES
                .iter()
                .zip(in_states)
                .map(|(state, n)| (state.as_str().to_string(), n.into()))
                .collect(),
            breakers,
        }
    }
}

/// `GET /breakers`.
pub(super) async fn list(
    Shared(admin): Shared<Arc<Admin>>,
    query: Result<Query<RawQuery>, QueryRejection>,
) -> Response {
    let filter = match query
        .map_err(|e| e.body_text())
        .and_then(|Query(raw)| Filter::read(raw))
    {
        Ok(filter) => filter,
        Err(message) => return json::error(StatusCode::BAD_REQUEST, message),
    };
    json::respond(
        StatusCode::OK,
        &Page::of(&admin, admin.source.breakers(), &filter),
    )
}

/// `GET /breakers/{name}`.
pub(super) async fn one(Shared(admin): Shared<Arc<Admin>>, Path(name): Path<String>) -> Response {
    match admin.source.find(&name) {
        Some(breaker) => json::respond(StatusCode::OK, &Entry::of(&admin, &breaker)),
        None => json::error(
            StatusCode::NOT_FOUND,
            format!("no breaker is named {name:?}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn raw(pairs: &[(&str, &str)]) -> RawQuery {
        let mut raw = RawQuery::default();
        for (key, value) in pairs {
            let value = Some(value.to_string());
            match *key {
                "prefix" => raw.prefix = value,
                "state" => raw.state = value,
                "sort" => raw.sort = value,
                "offset" => raw.offset = value,
                "limit" => raw.limit = value,
                other => panic!("no parameter {other}"),
            }
        }
        raw
    }

    #[test]
    fn mistakes_name_their_parameter() {
        for (pairs, needle) in [
            (
                &[("limit", "0")][..],
                "`limit` must be from 1 to 1000, not 0",
            ),
            (&[("limit", "1001")][..], "`limit` must be from 1 to 1000"),
            (
                &[("limit", "ten")][..],
                "`limit` must be a whole number, not \"ten\"",
            ),
            (&[("offset", "-1")][..], "`offset` must be a whole number"),
            (
                &[("state", "open,ajar")][..],
                "`state` must be one of open, half_open",
            ),
            (&[("sort", "age")][..], "`sort` must be `state` or `name`"),
        ] {
            let err = Filter::read(raw(pairs)).unwrap_err();
            assert!(err.contains(needle), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn a_state_named_many_times_filters_as_named_once() {
        // A query is request data: a list of thousands of repeats must not
        // make every breaker's check a scan of the list.
        let repeated = vec!["open"; 10_000].join(",");
        let many = Filter::read(raw(&[("state", repeated.as_str())])).unwrap();
        let once = Filter::read(raw(&[("state", "open")])).unwrap();
        assert_eq!(many, once);
    }

    #[test]
    fn a_page_orders_what_needs_looking_at_first() {
        let admin = Admin::new(Vec::new());
        let breakers: Vec<Breaker> = ["d", "c", "b", "a"]
            .iter()
            .map(|name| Breaker::new(Config::builder().name(*name).build().unwrap()))
            .collect();
        breakers[0].force_open(None);
        breakers[1].force_open(Some(std::time::Duration::from_secs(60)));
        let names = |filter: &Filter| -> Vec<String> {
            Page::of(&admin, breakers.clone(), filter)
                .breakers
                .iter()
                .map(|e| e.snapshot.name.to_string())
                .collect()
        };
        let by_state = Filter::read(RawQuery::default()).unwrap();
        assert_eq!(names(&by_state), ["c", "d", "a", "b"]);
        let by_name =
            Filter::read(raw(&[("sort", "name"), ("offset", "1"), ("limit", "2")])).unwrap();
        assert_eq!(names(&by_name), ["b", "c"]);
        let open = Filter::read(raw(&[("state", "open,forced_open")])).unwrap();
        let page = Page::of(&admin, breakers.clone(), &open);
        assert_eq!((page.total, page.matched), (4, 2));
        assert_eq!(page.states["closed"], 2);
    }
}
