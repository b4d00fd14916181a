//! The admin endpoint's JSON: a breaker as it is shown, written so that no
//! name can pass for markup, and the answers that carry it.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use http::{HeaderValue, StatusCode};
use serde::Serialize;

use super::Admin;
use crate::{Breaker, Snapshot};

/// A breaker as the endpoint shows it: its snapshot's fields, its parent's
/// name, whether that parent holds it, and its failure rate.
#[derive(Serialize)]
pub(super) struct Entry {
    #[serde(flatten)]
    pub(super) snapshot: Snapshot,
    parent: Option<String>,
    /// Whether its parent is open (or held open): every call of this
    /// breaker is refused there, whatever this breaker's own state.
    held_by_parent: bool,
    failure_rate: Option<f64>,
}

impl Entry {
    pub(super) fn of(admin: &Admin, breaker: &Breaker) -> Self {
        let parent = admin.parents(&[breaker]).pop().flatten();
        let held = parent
            .as_deref()
            .and_then(|name| admin.source.find(name))
            .is_some_and(|parent| parent.refuses_calls());
        Entry::with_parent(breaker, parent, held)
    }

    /// The entry of `breaker`, whose parent's name, and whether it holds
    /// the breaker, are known.
    pub(super) fn with_parent(breaker: &Breaker, parent: Option<String>, held: bool) -> Self {
        let snapshot = breaker.snapshot();
        Entry {
            parent,
            held_by_parent: held,
            failure_rate: failure_rate(&snapshot),
            snapshot,
        }
    }
}

/// Failures over the outcomes that counted since the breaker was made:
/// admitted calls and outcomes recorded from outside calls, less those
/// ignored, dropped as stale or cancelled; numerator and denominator count
/// the same outcomes. (Calls still in flight count as not failed;
/// successes are not counted separately, see [`Counts`](crate::Counts).)
fn failure_rate(snapshot: &Snapshot) -> Option<f64> {
    let counts = &snapshot.counts;
    let settled = counts
        .calls
        .saturating_add(counts.recorded)
        .saturating_sub(counts.ignored)
        .saturating_sub(counts.stale)
        .saturating_sub(counts.cancelled);
    (settled > 0).then(|| (counts.failures as f64 / settled as f64).min(1.0))
}

/// `value` as JSON in which `<`, `>`, `&` and the two line separators
/// JavaScript rejects in strings are written as `\u` escapes. They can only
/// stand inside strings in JSON, so the text stays the same JSON, and no
/// page that embeds it, or browser that sniffs it, can read a name as
/// markup.
pub(super) fn to_json(value: &impl Serialize) -> Result<String, serde_json::Error> {
    let json = serde_json::to_string(value)?;
    let mut escaped = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            '\u{2028}' => escaped.push_str("\\u2028"),
            '\u{2029}' => escaped.push_str("\\u2029"),
            c => escaped.push(c),
        }
    }
    Ok(escaped)
}

/// An answer of `status` with `value` as JSON.
pub(super) fn respond(status: StatusCode, value: &impl Serialize) -> Response {
    match to_json(value) {
        Ok(json) => with_headers(status, "application/json", json),
        Err(err) => with_headers(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("cannot write the answer as JSON: {err}\n"),
        ),
    }
}

/// An error as `{"error": message}`.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Error {
        error: String,
    }
    respond(
        status,
        &Error {
            error: message.into(),
        },
    )
}

/// `body` with its type, and the headers every admin answer carries: never
/// sniffed as another type, never stored by a cache (it is live state).
pub(super) fn with_headers(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response {
    let mut response = (status, Body::from(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_characters_are_escaped_and_the_json_reads_back_the_same() {
        let name = "<img src=x onerror=alert(1)> & \"q\" \u{2028}";
        let json = to_json(&name).unwrap();
        assert!(!json.contains(['<', '>', '&', '\u{2028}']), "{json}");
        assert_eq!(serde_json::from_str::<String>(&json).unwrap(), name);
    }

    #[test]
    fn failure_rate_leaves_out_outcomes_that_did_not_count() {
        let breaker = Breaker::new(crate::Config::default());
        let mut snapshot = breaker.snapshot();
        assert_eq!(failure_rate(&snapshot), None, "no call yet");
        snapshot.counts.calls = 10;
        snapshot.counts.ignored = 2;
        snapshot.counts.cancelled = 2;
        snapshot.counts.stale = 1;
        snapshot.counts.failures = 4;
        assert_eq!(failure_rate(&snapshot), Some(0.8));
    }

    #[test]
    fn outcomes_recorded_outside_calls_count_in_the_rate_on_both_sides() {
        use crate::classify::Outcome;
        use crate::policy::ConsecutiveFailures;
        let config = crate::Config::builder()
            .trip(ConsecutiveFailures::new(100))
            .build()
            .unwrap();
        let breaker = Breaker::new(config);
        // Three health checks failed, one passed; no call was made.
        for outcome in [
            Outcome::Failure,
            Outcome::Failure,
            Outcome::Success,
            Outcome::Failure,
        ] {
            breaker.record(outcome);
        }
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.counts.calls, snapshot.counts.recorded), (0, 4));
        assert_eq!(
            failure_rate(&snapshot),
            Some(0.75),
            "not 3 failures over 0 calls"
        );
        // Open: a recorded outcome changes nothing, and is not counted.
        breaker.force_open(None);
        breaker.record(Outcome::Failure);
        assert_eq!(breaker.snapshot().counts.recorded, 4);
    }
}
