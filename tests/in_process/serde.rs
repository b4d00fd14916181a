//! The `serde` feature: configs from TOML and JSON, checked as the builders
//! check them, every mistake naming its field; snapshots and transitions as
//! JSON.
#![cfg(feature = "serde")]

use std::time::Duration;

use serde_json::json;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::FailureClass;
use tower_circuit_breaker::events::Transition;
use tower_circuit_breaker::policy::{
    Adaptive, AdaptiveFigures, ConsecutiveFailures, ConsecutiveFailuresFigures, CountWindow,
    CountWindowFigures, FailuresWithin, FailuresWithinFigures, Never, NeverFigures, PerClass,
    PerClassFigures, PolicyFigures, SlowCalls, SlowCallsFigures, TimeWindow, TimeWindowFigures,
    TripPolicy, TripReason,
};
use tower_circuit_breaker::serialization::RegistryConfig;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, Counts, State};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn config(toml: &str) -> Config {
    toml::from_str(toml).unwrap_or_else(|err| panic!("{toml}\n{err}"))
}

/// The same document as JSON, through a TOML value.
fn as_json(toml: &str) -> String {
    let value: toml::Value = toml::from_str(toml).unwrap();
    serde_json::to_string(&value).unwrap()
}

/// The message of the error reading `toml` as a `Config`.
fn error(toml: &str) -> String {
    match toml::from_str::<Config>(toml) {
        Ok(config) => panic!("{toml}\nread as {config:?}"),
        Err(err) => err.message().to_string(),
    }
}

/// Reading `toml` fails with an error that names `field`.
#[track_caller]
fn assert_names(toml: &str, field: &str) -> String {
    let message = error(toml);
    assert!(
        message.starts_with(&format!("invalid circuit breaker config: `{field}` ")),
        "{toml}\nexpected an error naming `{field}`, got: {message}"
    );
    // The JSON form of the same document fails the same way.
    let json = as_json(toml);
    let json_message = serde_json::from_str::<Config>(&json)
        .unwrap_err()
        .to_string();
    assert!(
        json_message.starts_with(&message),
        "{json}\nexpected: {message}\ngot: {json_message}"
    );
    message
}

/// Reading each `(toml, field, problem)` fails with an error that names
/// `field` and says `problem`.
#[track_caller]
fn assert_each_names(cases: &[(&str, &str, &str)]) {
    for &(toml, field, problem) in cases {
        let message = assert_names(toml, field);
        assert!(
            message.contains(problem),
            "{toml}\nexpected {problem:?} in: {message}"
        );
    }
}

/// A one-minute time window in six buckets, tripping at half of 20 calls.
fn minute_window() -> TimeWindow {
    TimeWindow::new(secs(60))
        .buckets(6)
        .min_calls(20)
        .failure_rate(0.5)
}

// ----------------------------------------------------------------- policies

/// Every policy form as a config file writes it, and the policy the
/// builders make of the same values.
fn every_policy_form() -> Vec<(&'static str, TripPolicy)> {
    vec![
        (
            "{ consecutive_failures = { threshold = 3 } }",
            ConsecutiveFailures::new(3).into(),
        ),
        (
            "{ count_window = { failures = 3, window = 10 } }",
            CountWindow::new(3, 10).into(),
        ),
        (
            r#"{ count_window = { failures = 3, window = 10, stale_after = "1m30s" } }"#,
            CountWindow::new(3, 10).stale_after(secs(90)).into(),
        ),
        (
            r#"{ failures_within = { failures = 3, period = "10s" } }"#,
            FailuresWithin::new(3, secs(10)).into(),
        ),
        (
            r#"{ time_window = { window = "60s" } }"#,
            TimeWindow::new(secs(60)).into(),
        ),
        (
            r#"{ time_window = { window = "60s", buckets = 6, min_calls = 20, failure_rate = 0.5 } }"#,
            minute_window().into(),
        ),
        (
            // A rate written as a whole number.
            r#"{ time_window = { window = "1h", failure_rate = 1 } }"#,
            TimeWindow::new(secs(3600)).failure_rate(1.0).into(),
        ),
        (
            r#"{ slow_calls = { slower_than = "10s" } }"#,
            SlowCalls::new(secs(10)).into(),
        ),
        (
            r#"{ slow_calls = { slower_than = "250ms", rate = 0.8, over_calls = 50, min_calls = 5 } }"#,
            SlowCalls::new(Duration::from_millis(250))
                .rate(0.8)
                .over_calls(50)
                .min_calls(5)
                .into(),
        ),
        (
            r#"{ slow_calls = { slower_than = "10s", over_time = { length = "5m", buckets = 5 } } }"#,
            SlowCalls::new(secs(10)).over_time(secs(300), 5).into(),
        ),
        (
            r#"{ slow_calls = { slower_than = "10s", over_time = { length = "5m" } } }"#,
            SlowCalls::new(secs(10)).over_time(secs(300), 10).into(),
        ),
        ("{ adaptive = {} }", Adaptive::new().into()),
        ("{ never = {} }", Never.into()),
        (
            "{ adaptive = { false_trips_per_million = 0.5, min_degradation = 0.15, warm_up = 2000, ceiling = 0.6, baseline_horizon = 100000, fallback = { count_window = { failures = 5, window = 20 } } } }",
            Adaptive::new()
                .false_trips_per_million(0.5)
                .min_degradation(0.15)
                .warm_up(2_000)
                .ceiling(0.6)
                .baseline_horizon(100_000)
                .fallback(CountWindow::new(5, 20))
                .into(),
        ),
        (
            // Adaptive, or every one of the last five failed.
            "{ any_of = [ { adaptive = { false_trips_per_million = 1 } }, { count_window = { failures = 5, window = 5 } } ] }",
            TripPolicy::any_of([
                Adaptive::new().false_trips_per_million(1.0).into(),
                CountWindow::new(5, 5).into(),
            ]),
        ),
        (
            r#"{ any_of = [ { consecutive_failures = { threshold = 3 } }, { time_window = { window = "60s", buckets = 6, min_calls = 20, failure_rate = 0.5 } } ] }"#,
            TripPolicy::any_of([ConsecutiveFailures::new(3).into(), minute_window().into()]),
        ),
        (
            r#"{ any_of = [ { any_of = [ { count_window = { failures = 1, window = 1 } } ] }, { slow_calls = { slower_than = "1s" } } ] }"#,
            TripPolicy::any_of([
                TripPolicy::any_of([CountWindow::new(1, 1).into()]),
                SlowCalls::new(secs(1)).into(),
            ]),
        ),
    ]
}

#[test]
fn every_policy_form_reads_as_the_builders_make_it() {
    for (written, expected) in every_policy_form() {
        let toml = format!("trip = {written}");
        assert_eq!(config(&toml).trip(), &expected, "{toml}");
        let from_json: Config = serde_json::from_str(&as_json(&toml)).unwrap();
        assert_eq!(from_json.trip(), &expected, "{toml} as JSON");
    }
}

#[test]
fn a_policy_reads_on_its_own_too() {
    for (written, expected) in every_policy_form() {
        let json = as_json(&format!("trip = {written}"));
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        let policy: TripPolicy = serde_json::from_value(value["trip"].clone()).unwrap();
        assert_eq!(policy, expected, "{written}");
    }
    let err = serde_json::from_str::<TripPolicy>(r#"{"count_window":{"failures":4,"window":3}}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("invalid circuit breaker config: `count_window.failures` must be at most the window (3)"),
        "{err}"
    );
}

#[test]
fn a_config_read_back_from_its_file_form_is_the_same_config() {
    // Read, written out field by field from the getters, read again.
    for (written, _) in every_policy_form() {
        let first = config(&format!(
            "name = \"openai\"\ncooldown = \"45s\"\nmax_open = \"10m\"\ntrip = {written}"
        ));
        let again = config(&format!(
            "name = {:?}\ncooldown = \"{}ms\"\nmax_open = \"{}ms\"\ntrip = {written}",
            first.name(),
            first.cooldown().as_millis(),
            first.max_open().as_millis(),
        ));
        assert_eq!(again.name(), first.name());
        assert_eq!(again.cooldown(), first.cooldown());
        assert_eq!(again.max_open(), first.max_open());
        assert_eq!(again.trip(), first.trip());
    }
}

// ------------------------------------------------------------------ configs

#[test]
fn every_config_field_reads() {
    let c = config(
        r#"
        name = "anthropic"
        trip = { consecutive_failures = { threshold = 7 } }
        cooldown = "1m30s"
        min_open = "10s"
        max_open = "1h"
        backoff = 1.5
        jitter = 0.2
        probes = 3
        successes_to_close = 2
        probe_timeout = "2m"
        probe_interval = "250ms"
        trip_on_pushback = true
        "#,
    );
    assert_eq!(c.name(), "anthropic");
    assert_eq!(c.trip(), &ConsecutiveFailures::new(7).into());
    assert_eq!(c.cooldown(), secs(90));
    assert_eq!(c.min_open(), secs(10));
    assert_eq!(c.max_open(), secs(3600));
    assert_eq!(c.backoff(), 1.5);
    assert_eq!(c.jitter(), 0.2);
    assert_eq!(c.probes(), 3);
    assert_eq!(c.successes_to_close(), 2);
    assert_eq!(c.probe_timeout(), Some(secs(120)));
    assert_eq!(c.probe_interval(), Duration::from_millis(250));
    assert!(c.trip_on_pushback());
}

#[test]
fn fields_left_out_keep_the_defaults() {
    let read = config("");
    let default = Config::default();
    assert_eq!(read.name(), default.name());
    assert_eq!(read.trip(), default.trip());
    assert_eq!(read.cooldown(), default.cooldown());
    assert_eq!(read.max_open(), default.max_open());
    assert_eq!(read.backoff(), default.backoff());
    assert_eq!(read.probes(), default.probes());
    assert_eq!(read.probe_timeout(), default.probe_timeout());
    assert_eq!(
        config("backoff = 2").backoff(),
        2.0,
        "a whole number is a number"
    );
}

#[test]
fn probe_timeout_takes_a_duration_none_or_null() {
    assert_eq!(config(r#"probe_timeout = "none""#).probe_timeout(), None);
    assert_eq!(
        config(r#"probe_timeout = "90s""#).probe_timeout(),
        Some(secs(90))
    );
    let json: Config = serde_json::from_str(r#"{"probe_timeout": null}"#).unwrap();
    assert_eq!(json.probe_timeout(), None);
    let json: Config = serde_json::from_str(r#"{"probe_timeout": "5s"}"#).unwrap();
    assert_eq!(json.probe_timeout(), Some(secs(5)));
    let message = assert_names(r#"probe_timeout = 60"#, "probe_timeout");
    assert!(message.contains("or \"none\", got integer 60"), "{message}");
    assert_names(r#"probe_timeout = "0s""#, "probe_timeout");
    assert_names(r#"probe_timeout = "never""#, "probe_timeout");
}

#[test]
fn durations_are_human_strings() {
    for (written, expected) in [
        ("30s", secs(30)),
        ("250ms", Duration::from_millis(250)),
        ("5m", secs(300)),
        ("1h", secs(3600)),
        ("1m30s", secs(90)),
        ("1s500ms", Duration::from_millis(1500)),
    ] {
        let c = config(&format!("cooldown = {written:?}\nmax_open = \"2h\""));
        assert_eq!(c.cooldown(), expected, "{written}");
    }
}

#[test]
fn bad_durations_name_their_field_and_say_what_is_wrong() {
    for (written, problem) in [
        ("30", "has no unit after 30"),
        ("-5s", "must not be negative"),
        ("5x", "has an unknown unit `x`"),
        ("99999999999999999999s", "is too large"),
        ("1.5s", "must use whole numbers"),
        ("", "is empty"),
        ("5 s", "must not contain spaces"),
        ("30s1m", "names `m` out of order"),
    ] {
        let message = assert_names(&format!("cooldown = {written:?}"), "cooldown");
        assert!(
            message.contains(&format!("{written:?} {problem}")),
            "{written}: {message}"
        );
    }
    // Anywhere in a policy too, by its whole path.
    assert_names(
        r#"trip = { any_of = [ { consecutive_failures = { threshold = 3 } }, { time_window = { window = "60" } } ] }"#,
        "trip.any_of[1].time_window.window",
    );
    assert_names(
        r#"trip = { count_window = { failures = 1, window = 2, stale_after = "-1s" } }"#,
        "trip.count_window.stale_after",
    );
    assert_names(
        r#"trip = { slow_calls = { slower_than = "5x" } }"#,
        "trip.slow_calls.slower_than",
    );
    assert_names(
        r#"trip = { slow_calls = { slower_than = "1s", over_time = { length = "99999999999999999999s" } } }"#,
        "trip.slow_calls.over_time.length",
    );
    // A number is not a duration: its unit would be a guess.
    let message = assert_names("cooldown = 30", "cooldown");
    assert!(
        message.ends_with("must be a duration such as \"30s\", got integer 30"),
        "{message}"
    );
}

#[test]
fn values_out_of_range_name_their_field() {
    let cases = [
        // Zero thresholds and counts.
        (
            "trip = { consecutive_failures = { threshold = 0 } }",
            "trip.consecutive_failures.threshold",
            "must be at least 1",
        ),
        (
            "trip = { count_window = { failures = 0, window = 10 } }",
            "trip.count_window.failures",
            "must be at least 1",
        ),
        (
            r#"trip = { failures_within = { failures = 0, period = "10s" } }"#,
            "trip.failures_within.failures",
            "must be between 1",
        ),
        (
            r#"trip = { failures_within = { failures = 3, period = "0s" } }"#,
            "trip.failures_within.period",
            "must be at least one millisecond",
        ),
        (
            r#"trip = { time_window = { window = "60s", min_calls = 0 } }"#,
            "trip.time_window.min_calls",
            "must be at least 1",
        ),
        (
            r#"trip = { time_window = { window = "60s", buckets = 0 } }"#,
            "trip.time_window.buckets",
            "must be between 1",
        ),
        ("probes = 0", "probes", "must be between 1"),
        (
            "successes_to_close = 0",
            "successes_to_close",
            "must be between 1",
        ),
        // k > N.
        (
            "trip = { count_window = { failures = 11, window = 10 } }",
            "trip.count_window.failures",
            "must be at most the window (10)",
        ),
        (
            r#"trip = { slow_calls = { slower_than = "1s", over_calls = 5, min_calls = 6 } }"#,
            "trip.slow_calls.min_calls",
            "must be at most the window (5 calls)",
        ),
        // Rates out of range.
        (
            r#"trip = { time_window = { window = "60s", failure_rate = 1.5 } }"#,
            "trip.time_window.failure_rate",
            "must be in (0, 1], got 1.5",
        ),
        (
            r#"trip = { time_window = { window = "60s", failure_rate = 0 } }"#,
            "trip.time_window.failure_rate",
            "must be in (0, 1]",
        ),
        (
            r#"trip = { slow_calls = { slower_than = "1s", rate = -0.1 } }"#,
            "trip.slow_calls.rate",
            "must be in (0, 1]",
        ),
        ("jitter = 1.0", "jitter", "must be in [0, 1)"),
        ("backoff = 0.5", "backoff", "must be between 1.0 and 1000.0"),
        // Windows the file spells its own way.
        (
            r#"trip = { slow_calls = { slower_than = "1s", over_calls = 0 } }"#,
            "trip.slow_calls.over_calls",
            "must be between 1",
        ),
        (
            r#"trip = { slow_calls = { slower_than = "1s", over_time = { length = "5ms", buckets = 10 } } }"#,
            "trip.slow_calls.over_time.length",
            "one millisecond per bucket",
        ),
        (
            r#"trip = { slow_calls = { slower_than = "1s", over_time = { length = "5s", buckets = 0 } } }"#,
            "trip.slow_calls.over_time.buckets",
            "must be between 1",
        ),
        // Zero durations and inconsistent ones.
        (r#"cooldown = "0s""#, "cooldown", "must be longer than zero"),
        (
            r#"cooldown = "10m""#,
            "cooldown",
            "must be at most max_open",
        ),
        (r#"min_open = "1h""#, "min_open", "must be at most max_open"),
        (
            r#"trip = { slow_calls = { slower_than = "0ms" } }"#,
            "trip.slow_calls.slower_than",
            "must be longer than zero",
        ),
        // Adaptive parameters, and its fallback by its path.
        (
            "trip = { adaptive = { false_trips_per_million = 0 } }",
            "trip.adaptive.false_trips_per_million",
            "must be between 0.000001 and 100000, got 0",
        ),
        (
            "trip = { adaptive = { min_degradation = 0.5 } }",
            "trip.adaptive.min_degradation",
            "must be below the ceiling (0.5), got 0.5",
        ),
        (
            "trip = { adaptive = { ceiling = 1.5 } }",
            "trip.adaptive.ceiling",
            "must be in (0, 1], got 1.5",
        ),
        (
            "trip = { adaptive = { baseline_horizon = 0 } }",
            "trip.adaptive.baseline_horizon",
            "must be at least 1",
        ),
        (
            "trip = { any_of = [ { adaptive = { fallback = { count_window = { failures = 3, window = 2 } } } } ] }",
            "trip.any_of[0].adaptive.fallback.count_window.failures",
            "must be at most the window (2)",
        ),
        // An empty any-of, and one member of a nested one.
        (
            "trip = { any_of = [] }",
            "trip.any_of",
            "must hold at least one policy",
        ),
        (
            "trip = { any_of = [ { any_of = [ { consecutive_failures = { threshold = 0 } } ] } ] }",
            "trip.any_of[0].any_of[0].consecutive_failures.threshold",
            "must be at least 1",
        ),
    ];
    assert_each_names(&cases);
    assert_eq!(
        error("trip = { count_window = { failures = 11, window = 10 } }"),
        "invalid circuit breaker config: `trip.count_window.failures` must be at most the window (10)"
    );
}

#[test]
fn values_of_the_wrong_type_or_missing_name_their_field() {
    let cases = [
        (
            r#"trip = { consecutive_failures = { threshold = "five" } }"#,
            "trip.consecutive_failures.threshold",
            "must be a whole number, got string \"five\"",
        ),
        (
            "trip = { consecutive_failures = { threshold = -3 } }",
            "trip.consecutive_failures.threshold",
            "must not be negative, got -3",
        ),
        (
            "trip = { consecutive_failures = { threshold = 4294967296 } }",
            "trip.consecutive_failures.threshold",
            "must be at most 4294967295",
        ),
        (
            "trip = { consecutive_failures = { threshold = 2.5 } }",
            "trip.consecutive_failures.threshold",
            "must be a whole number, got float 2.5",
        ),
        (
            "trip = { consecutive_failures = {} }",
            "trip.consecutive_failures.threshold",
            "is required",
        ),
        (
            "trip = { count_window = { failures = 3 } }",
            "trip.count_window.window",
            "is required",
        ),
        (
            "trip = { time_window = {} }",
            "trip.time_window.window",
            "is required",
        ),
        (
            "trip = { slow_calls = { rate = 0.5 } }",
            "trip.slow_calls.slower_than",
            "is required",
        ),
        (
            r#"trip = { slow_calls = { slower_than = "1s", over_time = { buckets = 4 } } }"#,
            "trip.slow_calls.over_time.length",
            "is required",
        ),
        (
            r#"trip = { slow_calls = { slower_than = "1s", over_calls = 10, over_time = { length = "1m" } } }"#,
            "trip.slow_calls.over_time",
            "conflicts with `over_calls`",
        ),
        (
            "trip = { adaptive = { warm_up = 0.5 } }",
            "trip.adaptive.warm_up",
            "must be a whole number, got float 0.5",
        ),
        (
            r#"trip = { adaptive = { min_degradation = "10%" } }"#,
            "trip.adaptive.min_degradation",
            "must be a number, got string \"10%\"",
        ),
        (
            "probes = true",
            "probes",
            "must be a whole number, got boolean true",
        ),
        ("probes = [1]", "probes", "got a list"),
        ("jitter = \"0.1\"", "jitter", "must be a number, got string"),
        ("name = 7", "name", "must be a string, got integer 7"),
        (
            "trip_on_pushback = \"yes\"",
            "trip_on_pushback",
            "must be true or false, got string \"yes\"",
        ),
        ("cooldown = { secs = 30 }", "cooldown", "got a table"),
    ];
    assert_each_names(&cases);
    // JSON's null is no value for a duration (only for probe_timeout).
    let err = serde_json::from_str::<Config>(r#"{"cooldown": null}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`cooldown` must be a duration such as \"30s\", got null"),
        "{err}"
    );
}

/// The error a config written as JSON gets.
fn json_error(json: &str) -> String {
    serde_json::from_str::<Config>(json)
        .expect_err("an invalid config")
        .to_string()
}

#[test]
fn a_policy_table_is_checked_as_its_policy_reads_it() {
    for (json, expected) in [
        (
            r#"{"trip": {"consecutive_failures": {"threshold": 3, "threshold": 4}}}"#,
            "`trip.consecutive_failures.threshold` is written twice",
        ),
        (
            r#"{"trip": {"consecutive_failures": 3}}"#,
            "`trip.consecutive_failures` must be a table, got integer 3",
        ),
        (
            r#"{"trip": {"any_of": {"a": 1}}}"#,
            "`trip.any_of` must be a list of policies, got a table",
        ),
        (
            r#"{"trip": {"slow_calls": {"slower_than": "1s", "over_time": "5m"}}}"#,
            "`trip.slow_calls.over_time` must be a table, got string \"5m\"",
        ),
        (
            r#"{"trip": {}}"#,
            "`trip` must be a table with one key naming a policy, got 0 keys",
        ),
        (
            r#"{"trip": {"never": {}, "adaptive": {}}}"#,
            "`trip` must be a table with one key naming a policy, got 2 keys",
        ),
        (
            r#"{"trip": {"never": {"threshold": 3}}}"#,
            "`trip.never` has an unknown field `threshold`: it takes no settings",
        ),
        (
            r#"{"trip": {"adaptive": {"fallback": {"count_window": {"failures": 3}}}}}"#,
            "`trip.adaptive.fallback.count_window.window` is required",
        ),
    ] {
        let message = json_error(json);
        assert!(message.contains(expected), "{json}: {message}");
    }
    // A policy read on its own is named `policy`.
    let message = serde_json::from_str::<TripPolicy>(r#"{"bogus": {}}"#)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with(
            "invalid circuit breaker config: `policy` names an unknown policy `bogus`"
        ),
        "{message}"
    );
}

#[test]
fn a_nested_policy_or_table_written_as_null_is_left_out() {
    let config: Config =
        serde_json::from_str(r#"{"trip": {"adaptive": {"fallback": null}}}"#).unwrap();
    assert_eq!(config.trip(), &TripPolicy::from(Adaptive::new()));
    let config: Config = serde_json::from_str(
        r#"{"trip": {"slow_calls": {"slower_than": "1s", "over_calls": 50, "over_time": null}}}"#,
    )
    .unwrap();
    assert_eq!(
        config.trip(),
        &TripPolicy::from(SlowCalls::new(secs(1)).over_calls(50))
    );
    let config: Config = serde_json::from_str(
        r#"{"trip": {"per_class": {"rest": {"never": {}}, "classes": null}}}"#,
    )
    .unwrap();
    assert_eq!(config.trip(), &TripPolicy::from(PerClass::new(Never)));
}

#[test]
fn unknown_fields_and_policies_are_errors_that_name_them() {
    let message = error(r#"cooldwn = "30s""#);
    assert!(message.contains("unknown field `cooldwn`"), "{message}");
    let message = error("trip = { consecutive_failures = { threshhold = 3 } }");
    assert!(message.contains("unknown field `threshhold`"), "{message}");
    let message = error("trip = { never = { threshold = 3 } }");
    assert!(
        message.contains("`trip.never` has an unknown field `threshold`"),
        "{message}"
    );
    let message = error("trip = { consecutive_failure = { threshold = 3 } }");
    assert!(
        message.contains("unknown policy `consecutive_failure`"),
        "{message}"
    );
    assert!(
        message.contains("`consecutive_failures`"),
        "the names it knows: {message}"
    );
}

// ---------------------------------------------------------------- registry

#[test]
fn key_sections_lay_over_the_default() {
    let configs: RegistryConfig<String> = toml::from_str(
        r#"
        [default]
        cooldown = "20s"
        probes = 2
        trip = { consecutive_failures = { threshold = 4 } }

        [keys."openai/gpt-x"]
        cooldown = "5s"
        trip = { count_window = { failures = 2, window = 5 } }
        "#,
    )
    .unwrap();
    let default = configs.default_config();
    assert_eq!(default.cooldown(), secs(20));
    let gpt_x = configs.config(&"openai/gpt-x".to_string());
    assert_eq!(gpt_x.name(), "openai/gpt-x");
    assert_eq!(gpt_x.cooldown(), secs(5), "its own");
    assert_eq!(gpt_x.probes(), 2, "from [default]");
    assert_eq!(
        gpt_x.trip(),
        &CountWindow::new(2, 5).into(),
        "replaced whole"
    );
    assert_eq!(configs.config(&"other".to_string()).cooldown(), secs(20));
    assert_eq!(configs.max_keys(), None);
}

#[test]
fn registry_errors_name_the_section_and_the_field() {
    let read = |toml: &str| {
        toml::from_str::<RegistryConfig<String>>(toml)
            .unwrap_err()
            .message()
            .to_string()
    };
    assert_eq!(
        read("[keys.\"openai/gpt-x\"]\ntrip = { count_window = { failures = 11, window = 10 } }"),
        "invalid circuit breaker config: `keys.\"openai/gpt-x\".trip.count_window.failures` must be at most the window (10)"
    );
    for (toml, start) in [
        ("[default]\ncooldown = \"30\"", "`default.cooldown` "),
        (
            "[keys.local]\nprobe_timeout = \"-1s\"",
            "`keys.\"local\".probe_timeout` ",
        ),
        ("max_keys = 0", "`max_keys` must be at least 1"),
    ] {
        let message = read(toml);
        assert!(
            message.starts_with(&format!("invalid circuit breaker config: {start}")),
            "{message}"
        );
    }
    let message = read("[defaults]\ncooldown = \"30s\"");
    assert!(message.contains("unknown field `defaults`"), "{message}");
    // A key given twice (JSON allows it; the second would silently win).
    let err = serde_json::from_str::<RegistryConfig<String>>(r#"{"keys": {"a": {}, "a": {}}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`keys` names \"a\" twice"), "{err}");
}

#[tokio::test]
async fn providers_toml_builds_a_registry_with_every_key_configured() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/providers.toml"
    ))
    .unwrap();
    let configs: RegistryConfig<String> = toml::from_str(&text).unwrap();
    assert_eq!(configs.max_keys(), Some(1000));
    let keys: Vec<&str> = configs.keys().iter().map(|(k, _)| k.as_str()).collect();
    for key in [
        "openai",
        "openai/gpt-x",
        "openai/gpt-x-mini",
        "anthropic",
        "anthropic/claude-y",
        "local",
        "local/llama-70b",
    ] {
        assert!(keys.contains(&key), "{key} in {keys:?}");
    }

    let default = configs.default_config();
    assert_eq!(default.trip(), &ConsecutiveFailures::new(5).into());
    assert_eq!(default.cooldown(), secs(30));
    assert_eq!(default.max_open(), secs(300));
    assert_eq!(default.jitter(), 0.1);
    assert_eq!(default.probe_timeout(), Some(secs(60)));

    let registry = configs.build();
    let config_of = |key: &str| registry.get(&key.to_string()).unwrap().config();
    assert_eq!(config_of("openai").trip(), &minute_window().into());
    assert_eq!(
        config_of("openai/gpt-x").trip(),
        &TripPolicy::any_of([ConsecutiveFailures::new(3).into(), minute_window().into()])
    );
    let mini = config_of("openai/gpt-x-mini");
    assert_eq!(
        mini.trip(),
        &CountWindow::new(3, 10).stale_after(secs(120)).into()
    );
    assert_eq!(mini.cooldown(), secs(15));
    assert_eq!(mini.max_open(), secs(300), "from [default]");
    assert_eq!(
        config_of("anthropic").trip(),
        &TimeWindow::new(secs(120))
            .min_calls(20)
            .failure_rate(0.6)
            .into()
    );
    let claude = config_of("anthropic/claude-y");
    assert_eq!(
        claude.trip(),
        &TripPolicy::any_of([
            ConsecutiveFailures::new(4).into(),
            SlowCalls::new(secs(20))
                .rate(0.8)
                .over_calls(50)
                .min_calls(10)
                .into(),
        ])
    );
    assert_eq!(claude.probe_timeout(), Some(secs(120)));
    assert_eq!(claude.successes_to_close(), 2);
    let llama = config_of("local/llama-70b");
    assert_eq!(llama.trip(), &ConsecutiveFailures::new(3).into());
    assert_eq!(
        (
            llama.cooldown(),
            llama.max_open(),
            llama.jitter(),
            llama.probes()
        ),
        (secs(5), secs(60), 0.0, 2)
    );
    assert_eq!(llama.probe_timeout(), Some(secs(10)));
    // A key without a section gets the default; breakers are named by key.
    let other = registry.get(&"mistral/small".to_string()).unwrap();
    assert_eq!(other.name(), "mistral/small");
    assert_eq!(other.config().trip(), default.trip());
    assert_eq!(other.config().cooldown(), default.cooldown());
}

#[tokio::test]
async fn reloading_the_file_reconfigures_and_keeps_state() {
    let before: RegistryConfig<String> =
        toml::from_str("[keys.openai]\ncooldown = \"30s\"").unwrap();
    let registry = before.build();
    let openai = registry.get(&"openai".to_string()).unwrap();
    openai.force_open(Some(secs(60)));

    let after: RegistryConfig<String> = toml::from_str(
        "[default]\nprobes = 3\n[keys.openai]\ntrip = { consecutive_failures = { threshold = 2 } }",
    )
    .unwrap();
    after.reload(&registry);
    assert_eq!(openai.state(), State::Open, "a reload forgives nothing");
    assert_eq!(openai.config().trip(), &ConsecutiveFailures::new(2).into());
    assert_eq!(openai.config().probes(), 3, "from the new [default]");
    let new_key = registry.get(&"anthropic".to_string()).unwrap();
    assert_eq!(new_key.config().probes(), 3);
}

// --------------------------------------------------------------- snapshots

#[tokio::test(start_paused = true)]
async fn a_snapshot_serializes_with_durations_in_milliseconds() {
    let breaker = Breaker::new(
        Config::builder()
            .name("openai")
            .trip(TripPolicy::any_of([
                ConsecutiveFailures::new(2).into(),
                CountWindow::new(3, 10).into(),
            ]))
            .cooldown(secs(30))
            .build()
            .unwrap(),
    );
    let mut svc = CircuitBreaker::new(
        service_fn(|fail: bool| async move {
            if fail {
                Err(BoxError::from("503"))
            } else {
                Ok(())
            }
        }),
        &breaker,
    );
    for fail in [true, true, false] {
        let _ = svc.ready().await.unwrap().call(fail).await;
    }
    tokio::time::advance(Duration::from_millis(1_500)).await;

    let json = serde_json::to_value(breaker.snapshot()).unwrap();
    assert_eq!(
        json,
        json!({
            "name": "openai",
            "state": "open",
            "generation": 1,
            "time_in_state_ms": 1_500,
            "retry_after_ms": 28_500,
            "probes_in_flight": 0,
            "probe_successes": 0,
            "failed_probe_rounds": 0,
            "last_trip": {
                "policy": "consecutive_failures",
                "failures": 2,
                "threshold": 2,
                "message": "2 consecutive failures",
            },
            "policy": {
                "policy": "any_of",
                "members": [
                    { "policy": "consecutive_failures", "failures": 0, "threshold": 2 },
                    { "policy": "count_window", "failures": 0, "threshold": 3, "window": 10 },
                ],
            },
            "counts": {
                "calls": 2, "rejected": 1, "rejected_by_parent": 0, "failures": 2, "ignored": 0,
                "stale": 0, "cancelled": 0, "opened": 1, "probes": 0, "recorded": 0,
            },
            "shadow": false,
        })
    );
    // Closed, there is nothing to wait for.
    breaker.reset();
    assert_eq!(
        serde_json::to_value(breaker.snapshot()).unwrap()["retry_after_ms"],
        serde_json::Value::Null
    );
}

#[test]
fn states_serialize_as_snake_case_names() {
    for (state, name) in [
        (State::Closed, "closed"),
        (State::Open, "open"),
        (State::HalfOpen, "half_open"),
        (State::ForcedOpen, "forced_open"),
        (State::ForcedClosed, "forced_closed"),
        (State::Disabled, "disabled"),
    ] {
        assert_eq!(serde_json::to_value(state).unwrap(), json!(name));
    }
    assert_eq!(
        serde_json::to_value(Counts::default()).unwrap(),
        json!({ "calls": 0, "rejected": 0, "rejected_by_parent": 0, "failures": 0, "ignored": 0, "stale": 0, "cancelled": 0, "opened": 0, "probes": 0, "recorded": 0 })
    );
}

#[test]
fn every_trip_reason_and_figure_serializes_with_its_policy() {
    let adaptive = AdaptiveFigures {
        baseline: 0.02,
        learned: 30_048,
        statistic: 13.5,
        threshold: 12.25,
        failures: 9,
        calls: 33,
        learning: false,
        fallback: None,
    };
    let reasons = [
        (
            TripReason::Policy(
                ConsecutiveFailuresFigures {
                    failures: 5,
                    threshold: 5,
                }
                .into(),
            ),
            json!({ "policy": "consecutive_failures", "failures": 5, "threshold": 5, "message": "5 consecutive failures" }),
        ),
        (
            TripReason::Policy(
                CountWindowFigures {
                    failures: 3,
                    threshold: 3,
                    window: 10,
                }
                .into(),
            ),
            json!({ "policy": "count_window", "failures": 3, "threshold": 3, "window": 10, "message": "3 failures in the last 10 calls" }),
        ),
        (
            TripReason::Policy(
                TimeWindowFigures {
                    calls: 20,
                    failures: 12,
                }
                .into(),
            ),
            json!({ "policy": "time_window", "failures": 12, "calls": 20, "message": "12 failures in 20 calls within the time window" }),
        ),
        (
            TripReason::Policy(SlowCallsFigures { calls: 10, slow: 8 }.into()),
            json!({ "policy": "slow_calls", "slow": 8, "calls": 10, "message": "8 slow calls in 10 calls" }),
        ),
        (
            TripReason::Policy(
                FailuresWithinFigures {
                    failures: 3,
                    threshold: 3,
                    period: Duration::from_secs(10),
                }
                .into(),
            ),
            json!({ "policy": "failures_within", "failures": 3, "threshold": 3, "period_ms": 10_000, "message": "3 failures within 10s" }),
        ),
        (
            TripReason::Policy(adaptive.clone().into()),
            json!({ "policy": "adaptive", "baseline": 0.02, "learned": 30_048, "statistic": 13.5, "threshold": 12.25,
                "failures": 9, "calls": 33, "learning": false, "fallback": null,
                "message": "9 failures in the last 33 calls, significantly above the baseline failure rate of 2.00%" }),
        ),
        (
            TripReason::PerClass {
                class: FailureClass::Timeout,
                reason: Box::new(TripReason::Policy(
                    ConsecutiveFailuresFigures {
                        failures: 3,
                        threshold: 3,
                    }
                    .into(),
                )),
            },
            json!({ "policy": "consecutive_failures", "class": "timeout",
                "reason": { "policy": "consecutive_failures", "failures": 3, "threshold": 3, "message": "3 consecutive failures" },
                "message": "3 consecutive failures of class timeout" }),
        ),
        (
            TripReason::ProbeFailed,
            json!({ "policy": "probe_failed", "message": "half-open probe failed" }),
        ),
        (
            TripReason::ProbeTimedOut,
            json!({ "policy": "probe_timed_out", "message": "half-open probe timed out" }),
        ),
        (
            TripReason::Manual,
            json!({ "policy": "manual", "message": "set by an operator" }),
        ),
        (
            TripReason::Pushback {
                retry_after: Duration::from_millis(1_200),
            },
            json!({ "policy": "pushback", "retry_after_ms": 1_200, "message": "the upstream asked to come back in 1200 ms" }),
        ),
        (
            // A wait is rounded up: a caller told to come back never comes
            // back early.
            TripReason::Pushback {
                retry_after: Duration::from_micros(1_199_200),
            },
            json!({ "policy": "pushback", "retry_after_ms": 1_200, "message": "the upstream asked to come back in 1200 ms" }),
        ),
    ];
    for (reason, expected) in reasons {
        assert_eq!(
            serde_json::to_value(&reason).unwrap(),
            expected,
            "{reason:?}"
        );
    }
    assert_eq!(
        serde_json::to_value(PolicyFigures::from(NeverFigures)).unwrap(),
        json!({ "policy": "never" })
    );
    let figures = PolicyFigures::AnyOf(vec![
        TimeWindowFigures {
            calls: 20,
            failures: 4,
        }
        .into(),
        SlowCallsFigures { calls: 10, slow: 1 }.into(),
        FailuresWithinFigures {
            failures: 2,
            threshold: 3,
            period: Duration::from_millis(1_500),
        }
        .into(),
    ]);
    assert_eq!(
        serde_json::to_value(&figures).unwrap(),
        json!({ "policy": "any_of", "members": [
            { "policy": "time_window", "calls": 20, "failures": 4 },
            { "policy": "slow_calls", "calls": 10, "slow": 1 },
            { "policy": "failures_within", "failures": 2, "threshold": 3, "period_ms": 1_500 },
        ] })
    );
    let warming = PolicyFigures::from(AdaptiveFigures {
        baseline: 0.015,
        learned: 640,
        statistic: 1.5,
        failures: 1,
        calls: 2,
        learning: true,
        fallback: Some(Box::new(
            ConsecutiveFailuresFigures {
                failures: 1,
                threshold: 5,
            }
            .into(),
        )),
        ..adaptive.clone()
    });
    assert_eq!(
        serde_json::to_value(&warming).unwrap(),
        json!({ "policy": "adaptive", "baseline": 0.015, "learned": 640, "statistic": 1.5, "threshold": 12.25,
            "failures": 1, "calls": 2, "learning": true,
            "fallback": { "policy": "consecutive_failures", "failures": 1, "threshold": 5 } })
    );
    let per_class = PolicyFigures::from(PerClassFigures {
        rest: Box::new(PolicyFigures::from(adaptive)),
        classes: vec![(
            FailureClass::RateLimited,
            ConsecutiveFailuresFigures {
                failures: 4,
                threshold: 20,
            }
            .into(),
        )],
    });
    assert_eq!(
        serde_json::to_value(&per_class).unwrap(),
        json!({ "policy": "per_class",
            "rest": { "policy": "adaptive", "baseline": 0.02, "learned": 30_048, "statistic": 13.5, "threshold": 12.25,
                "failures": 9, "calls": 33, "learning": false, "fallback": null },
            "classes": [{ "class": "rate_limited", "figures": { "policy": "consecutive_failures", "failures": 4, "threshold": 20 } }] })
    );
}

#[tokio::test(start_paused = true)]
async fn transitions_serialize_for_an_event_stream() {
    let breaker = Breaker::new(Config::builder().name("local").build().unwrap());
    let mut transitions = breaker.subscribe();
    breaker.force_open(Some(Duration::from_millis(2_500)));
    breaker.reset();
    let opened: Transition = transitions.recv().await.unwrap();
    assert_eq!(
        serde_json::to_value(&opened).unwrap(),
        json!({
            "breaker": "local",
            "from": "closed",
            "to": "open",
            "generation": opened.generation,
            "reason": { "policy": "manual", "message": "set by an operator" },
            "retry_after_ms": 2_500,
            "shadow": false,
        })
    );
    let json = serde_json::to_value(transitions.recv().await.unwrap()).unwrap();
    assert_eq!(
        (&json["from"], &json["to"]),
        (&json!("open"), &json!("closed"))
    );
}

#[test]
fn per_class_policies_and_latency_to_are_read_from_files() {
    use tower_circuit_breaker::classify::FailureClass;
    use tower_circuit_breaker::policy::PerClass;
    use tower_circuit_breaker::LatencyTo;

    let config: Config = toml::from_str(
        r#"
        latency_to = "end"
        trip = { per_class = { rest = { consecutive_failures = { threshold = 5 } }, classes = { timeout = { consecutive_failures = { threshold = 3 } }, rate_limited = { consecutive_failures = { threshold = 20 } } } } }
        "#,
    )
    .unwrap();
    assert_eq!(config.latency_to(), LatencyTo::End);
    assert_eq!(
        config.trip(),
        &PerClass::new(ConsecutiveFailures::new(5))
            .class(FailureClass::RateLimited, ConsecutiveFailures::new(20))
            .class(FailureClass::Timeout, ConsecutiveFailures::new(3))
            .into()
    );
    let err = toml::from_str::<Config>(
        r#"trip = { per_class = { rest = { consecutive_failures = { threshold = 5 } }, classes = { slowness = { consecutive_failures = { threshold = 3 } } } } }"#,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("trip.per_class.classes.slowness"),
        "{err}"
    );
    let err = toml::from_str::<Config>(r#"latency_to = "tail""#).unwrap_err();
    assert!(err.to_string().contains("latency_to"), "{err}");
}

#[test]
fn a_quota_hold_is_written_as_its_ceiling_and_probe_interval() {
    let held = config("max_quota_hold = \"1d\"\nquota_probe_interval = \"10m\"");
    assert_eq!(held.max_quota_hold(), Some(secs(24 * 3600)));
    assert_eq!(held.quota_probe_interval(), secs(600));
    assert_eq!(config("max_quota_hold = \"none\"").max_quota_hold(), None);
    assert_names("max_quota_hold = \"1m\"", "max_quota_hold");
}
