//! The Grafana dashboard in `grafana/circuit-breakers.json` queries only
//! series the crate emits: every metric its queries name, every label they
//! match or group on, and every literal label value they match, is one the
//! `metrics` feature reports. What the crate emits is not copied here: a
//! recorder collects it while breakers go through their states and their
//! counts are exported.
#![cfg(feature = "metrics")]

use std::collections::{BTreeMap, BTreeSet};

use metrics_util::debugging::DebuggingRecorder;
use serde_json::Value;
use tower_circuit_breaker::{metrics_facade, Breaker, Config};

/// Each metric the crate emitted, with each of its labels and the values
/// seen for it.
type Emitted = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Series the crate emits, as a recorder sees them: a breaker made, taken
/// through every manual state and back, and its counts exported.
fn emitted() -> Emitted {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics_facade::install();
    // The breakers announce on the thread that makes the change, so a
    // recorder local to this thread hears all of it.
    ::metrics::with_local_recorder(&recorder, || {
        let breaker = Breaker::new(Config::builder().name("dashboard").build().unwrap());
        breaker.force_open(None);
        breaker.restore();
        breaker.force_closed();
        breaker.disable();
        breaker.reset();
        metrics_facade::export(&breaker);
    });
    let mut emitted = Emitted::new();
    for (key, _, _, _) in snapshotter.snapshot().into_vec() {
        let labels = emitted.entry(key.key().name().to_string()).or_default();
        for label in key.key().labels() {
            labels
                .entry(label.key().to_string())
                .or_default()
                .insert(label.value().to_string());
        }
    }
    emitted
}

/// A label matcher in a selector: `label op "value"`.
#[derive(Debug, Clone, PartialEq)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

/// What one query asks for: the metrics it selects, with their matchers,
/// and the labels it groups on (`by (...)`, `without (...)`,
/// `label_values(metric, label)`).
#[derive(Debug, Default)]
struct Query {
    selectors: Vec<(String, Vec<Matcher>)>,
    grouping: Vec<String>,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

/// Reads the PromQL of a dashboard query, as much of it as the checks
/// need: metric names (every identifier starting `circuit_breaker_`), their
/// `{...}` matchers, and grouping labels. Range brackets and strings are
/// skipped.
fn parse(expr: &str) -> Query {
    let chars: Vec<char> = expr.chars().collect();
    let mut query = Query::default();
    let mut i = 0;
    let skip_spaces = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let ident_at = |start: usize| {
        let mut end = start;
        while end < chars.len() && is_ident(chars[end]) {
            end += 1;
        }
        (chars[start..end].iter().collect::<String>(), end)
    };
    // The labels listed in `( a, b )` from `open`; returns them and the end.
    let list_at = |open: usize| {
        let close = (open..chars.len())
            .find(|&j| chars[j] == ')')
            .unwrap_or_else(|| panic!("unclosed ( in {expr}"));
        let inside: String = chars[open + 1..close].iter().collect();
        let items: Vec<String> = inside.split(',').map(|s| s.trim().to_string()).collect();
        (items, close + 1)
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '[' {
            i = (i..chars.len())
                .find(|&j| chars[j] == ']')
                .map_or(chars.len(), |j| j + 1);
        } else if c == '"' {
            i = (i + 1..chars.len())
                .find(|&j| chars[j] == '"')
                .map_or(chars.len(), |j| j + 1);
        } else if is_ident_start(c) && (i == 0 || !is_ident(chars[i - 1])) {
            let (ident, end) = ident_at(i);
            let next = skip_spaces(end);
            if ident.starts_with("circuit_breaker_") {
                let mut matchers = Vec::new();
                i = end;
                if next < chars.len() && chars[next] == '{' {
                    let close = (next..chars.len())
                        .find(|&j| chars[j] == '}')
                        .unwrap_or_else(|| panic!("unclosed {{ in {expr}"));
                    let inside: String = chars[next + 1..close].iter().collect();
                    for part in inside.split(',').filter(|p| !p.trim().is_empty()) {
                        matchers.push(matcher(part.trim(), expr));
                    }
                    i = close + 1;
                }
                query.selectors.push((ident, matchers));
            } else if matches!(ident.as_str(), "by" | "without")
                && next < chars.len()
                && chars[next] == '('
            {
                let (labels, end) = list_at(next);
                query.grouping.extend(labels);
                i = end;
            } else if ident == "label_values" && next < chars.len() && chars[next] == '(' {
                let (args, _) = list_at(next);
                assert_eq!(args.len(), 2, "label_values(metric, label) in {expr}");
                query.grouping.push(args[1].clone());
                // The metric is read as any other selector.
                i = next + 1;
            } else {
                i = end;
            }
        } else {
            i += 1;
        }
    }
    query
}

/// `label="value"`, `label=~"a|b"`, `label!="value"` or `label!~"..."`.
fn matcher(text: &str, expr: &str) -> Matcher {
    let at = text
        .find(['=', '!'])
        .unwrap_or_else(|| panic!("no operator in {text:?} of {expr}"));
    let label = text[..at].trim().to_string();
    let rest = &text[at..];
    let op_len = if rest.starts_with("=~") || rest.starts_with("!=") || rest.starts_with("!~") {
        2
    } else {
        1
    };
    let value = rest[op_len..].trim();
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("an unquoted value in {text:?} of {expr}"));
    Matcher {
        label,
        op: rest[..op_len].to_string(),
        value: value.to_string(),
    }
}

/// What in `expr` is not among the emitted series; empty when all is.
fn unknown_in(expr: &str, emitted: &Emitted) -> Vec<String> {
    let query = parse(expr);
    let mut unknown = Vec::new();
    if query.selectors.is_empty() {
        unknown.push(format!("no series of the crate in {expr:?}"));
    }
    let mut labels_in_query = BTreeSet::new();
    for (metric, matchers) in &query.selectors {
        let Some(labels) = emitted.get(metric) else {
            unknown.push(format!("metric {metric}"));
            continue;
        };
        labels_in_query.extend(labels.keys().cloned());
        for m in matchers {
            let Some(values) = labels.get(&m.label) else {
                unknown.push(format!("label {} of {metric}", m.label));
                continue;
            };
            // Template variables (`$breaker`) are filled in by Grafana.
            if m.value.contains('$') {
                continue;
            }
            let literal: Vec<&str> = match m.op.as_str() {
                "=" | "!=" => vec![m.value.as_str()],
                _ => m.value.split('|').collect(),
            };
            for value in literal {
                if !values.contains(value) {
                    unknown.push(format!("{}={value:?} of {metric}", m.label));
                }
            }
        }
    }
    for label in &query.grouping {
        if !labels_in_query.contains(label) {
            unknown.push(format!("label {label} to group on"));
        }
    }
    unknown
}

/// Every query string of the dashboard: panel targets' `expr`, and the
/// template variables' queries.
fn queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr" | "definition", Value::String(q)) => found.push(q.clone()),
                        ("query", Value::String(q)) => found.push(q.clone()),
                        _ => walk(value, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(dashboard, &mut found);
    found
}

fn dashboard() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/circuit-breakers.json");
    let text = std::fs::read_to_string(path).expect("the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

#[test]
fn every_series_the_dashboard_queries_is_one_the_crate_emits() {
    let emitted = emitted();
    let dashboard = dashboard();
    let queries = queries(&dashboard);
    assert!(queries.len() >= 8, "{queries:?}");
    for query in &queries {
        let unknown = unknown_in(query, &emitted);
        assert!(
            unknown.is_empty(),
            "{query}\nasks for what the crate does not emit: {unknown:?}\nit emits: {emitted:#?}"
        );
    }
}

#[test]
fn the_dashboard_shows_states_transitions_refusals_and_failure_rate() {
    let queries = queries(&dashboard());
    let asks = |metric: &str, matcher: Option<(&str, &str)>| {
        queries.iter().any(|q| {
            parse(q).selectors.iter().any(|(name, matchers)| {
                name == metric
                    && matcher.is_none_or(|(label, value)| {
                        // `outcome="failure"`, or one of `outcome=~"admitted|recorded"`.
                        matchers
                            .iter()
                            .any(|m| m.label == label && m.value.split('|').any(|v| v == value))
                    })
            })
        })
    };
    assert!(asks("circuit_breaker_state", Some(("state", "open"))));
    assert!(asks("circuit_breaker_transitions_total", None));
    assert!(asks(
        "circuit_breaker_calls_total",
        Some(("outcome", "rejected"))
    ));
    assert!(asks(
        "circuit_breaker_calls_total",
        Some(("outcome", "failure"))
    ));
    assert!(asks(
        "circuit_breaker_calls_total",
        Some(("outcome", "admitted"))
    ));
    // The failure rate's denominator has what its numerator can count.
    assert!(asks(
        "circuit_breaker_calls_total",
        Some(("outcome", "recorded"))
    ));
    let dashboard = dashboard();
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for title in [
        "State over time, per breaker",
        "Transitions",
        "Refusals per second",
        "Failure rate",
    ] {
        assert!(titles.contains(&title), "{title} in {titles:?}");
    }
}

#[test]
fn the_check_finds_a_series_label_or_value_the_crate_does_not_emit() {
    let emitted = emitted();
    assert_eq!(
        unknown_in(
            "sum(rate(circuit_breaker_calls_total{outcome=\"refused\"}[5m]))",
            &emitted
        ),
        ["outcome=\"refused\" of circuit_breaker_calls_total"]
    );
    assert_eq!(
        unknown_in("circuit_breaker_made_up_total", &emitted),
        ["metric circuit_breaker_made_up_total"]
    );
    assert_eq!(
        unknown_in("sum by (provider) (circuit_breaker_opened_total)", &emitted),
        ["label provider to group on"]
    );
    assert_eq!(
        unknown_in(
            "circuit_breaker_state{state=~\"open|ajar\", breaker=~\"$breaker\"}",
            &emitted
        ),
        ["state=\"ajar\" of circuit_breaker_state"]
    );
    assert_eq!(
        unknown_in("label_values(circuit_breaker_state, breaker)", &emitted),
        Vec::<String>::new()
    );
}
