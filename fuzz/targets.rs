//! The bodies of the fuzz targets, shared by the cargo-fuzz binaries in
//! `fuzz/fuzz_targets/` and by `tests/in_process/fuzz_corpus.rs` (which replays
//! the committed corpora and a seeded stream of inputs under `cargo test`),
//! both through `#[path]`.
//!
//! Each target takes raw bytes, must never panic, and checks what must hold
//! of every input (DESIGN.md, invariant 7: nothing a user, an upstream or a
//! file sends can make the library panic, or hold a breaker open longer than
//! its maximum open period).

// Each fuzz binary uses one target.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::HeaderValue;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::{
    parse_retry_after, Classify, HttpClassifier, Outcome, Verdict,
};
use tower_circuit_breaker::policy::{
    Adaptive, ConsecutiveFailures, CountWindow, SlowCalls, TimeWindow, TripPolicy,
};
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};

/// How many configs were valid and put through [`exercise`]: replays
/// report it, to show the inputs reach past the builder.
pub static EXERCISED: AtomicUsize = AtomicUsize::new(0);

/// Reads the input front to back; past its end every read is zero.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (taken, rest) = self.data.split_at(n);
        self.data = rest;
        taken
    }

    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }

    fn le(&mut self, n: usize) -> u64 {
        self.bytes(n)
            .iter()
            .rev()
            .fold(0, |acc, b| (acc << 8) | u64::from(*b))
    }

    pub fn u16(&mut self) -> u16 {
        self.le(2) as u16
    }

    pub fn u32(&mut self) -> u32 {
        self.le(4) as u32
    }

    pub fn u64(&mut self) -> u64 {
        self.le(8)
    }

    /// A count: small ones, the edges of every bound the config checks, or
    /// any `u32`.
    pub fn count(&mut self) -> u32 {
        const EDGES: [u32; 12] = [
            0,
            1,
            2,
            10,
            10_000,
            10_001,
            100_000,
            100_001,
            (1 << 20) - 1,
            1 << 20,
            1_000_001,
            u32::MAX,
        ];
        match self.byte() % 4 {
            0 | 1 => u32::from(self.byte() % 16),
            2 => EDGES[usize::from(self.byte()) % EDGES.len()],
            _ => self.u32(),
        }
    }

    /// A duration: zero, the largest, whole units, or any.
    pub fn duration(&mut self) -> Duration {
        match self.byte() % 8 {
            0 => Duration::ZERO,
            1 => Duration::from_millis(u64::from(self.u16())),
            2 => Duration::from_secs(u64::from(self.u16())),
            3 => Duration::from_nanos(self.u64()),
            4 => Duration::new(self.u64(), self.u32() % 1_000_000_000),
            5 => Duration::MAX,
            6 => Duration::from_secs(u64::from(self.u32())),
            _ => Duration::from_micros(u64::from(self.u32())),
        }
    }

    /// A float: the edges of every range the config checks, a fraction, or
    /// any bit pattern (NaN and the infinities included).
    pub fn float(&mut self) -> f64 {
        const EDGES: [f64; 16] = [
            0.0,
            -0.0,
            0.5,
            1.0,
            1.5,
            2.0,
            1000.0,
            1_000.000_000_1,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            1.0 - f64::EPSILON,
            f64::MAX,
            0.999_999,
        ];
        match self.byte() % 3 {
            0 => EDGES[usize::from(self.byte()) % EDGES.len()],
            1 => f64::from(self.u16()) / 1000.0,
            _ => f64::from_bits(self.u64()),
        }
    }
}

// ---------------------------------------------------------------------------
// retry_after: `Retry-After` values from an upstream.
// ---------------------------------------------------------------------------

/// Bytes: a flag (bit 0: `now` before the epoch), eight bytes of seconds for
/// `now`, then the header value's bytes. Checks the wait's range, that
/// dates read as `httpdate` reads them (see [`check_against_httpdate`]),
/// and the HTTP classifier's hint.
pub fn retry_after(data: &[u8]) {
    let mut input = Input::new(data);
    let before_epoch = input.byte() & 1 == 1;
    let offset = Duration::from_secs(input.u64());
    let value = input.rest();
    let now = if before_epoch {
        UNIX_EPOCH.checked_sub(offset)
    } else {
        UNIX_EPOCH.checked_add(offset)
    };
    let (Some(now), Ok(value)) = (now, HeaderValue::from_bytes(value)) else {
        return;
    };
    let parsed = parse_retry_after(&value, now);
    if let Ok(text) = value.to_str() {
        check_against_httpdate(text, now, parsed);
    }
    let Some(wait) = parsed else {
        return check_classifier(&value, None);
    };
    assert!(
        wait <= Duration::from_secs(u64::MAX),
        "{value:?} gave {wait:?}"
    );
    let text = value
        .to_str()
        .expect("a parsed value is text")
        .trim_matches([' ', '\t']);
    if is_delay_seconds(&value) {
        // Delay-seconds: the number itself, saturated, whatever `now` is.
        let secs = text.parse::<u64>().unwrap_or(u64::MAX);
        assert_eq!(wait, Duration::from_secs(secs), "{value:?}");
        assert_eq!(parse_retry_after(&value, UNIX_EPOCH), parsed, "{value:?}");
    } else {
        // An HTTP date: at most the end of year 9999 from now (a leap
        // second then is the next midnight), an RFC 850 date at most 50
        // years from now, and a second later it is a second closer (or
        // already past).
        let now_secs = if before_epoch {
            -i128::from(offset.as_secs())
        } else {
            i128::from(offset.as_secs())
        };
        let latest = if is_rfc850_shaped(text) {
            50 * 366 * 86_400 + 1
        } else {
            (END_OF_9999 + 1 - now_secs).max(0)
        };
        assert!(
            i128::from(wait.as_secs()) <= latest,
            "{value:?} gave {wait:?}"
        );
        assert_eq!(wait.subsec_nanos(), 0, "{value:?} gave {wait:?}");
        if let Some(later) = now.checked_add(Duration::from_secs(1)) {
            assert_eq!(
                parse_retry_after(&value, later),
                Some(wait.saturating_sub(Duration::from_secs(1))),
                "{value:?} one second after {now:?}"
            );
        }
    }
    check_classifier(&value, parsed);
}

/// The last second of the year 9999, in seconds since the epoch.
const END_OF_9999: i128 = 253_402_300_799;

/// Whether a date is neither IMF-fixdate (29 bytes) nor asctime (24
/// bytes): RFC 850, whose year has two digits.
fn is_rfc850_shaped(text: &str) -> bool {
    text.len() != 29 && text.len() != 24
}

/// Checks a date against `httpdate`, a maintained parser of HTTP dates:
/// where it reads a date, the wait is the same; where it refuses one, so
/// does the crate. Except for what RFC 9110 allows and httpdate does not
/// read (years before 1970, a leap second at 23:59:60), what httpdate lets
/// through and RFC 9110 does not (any byte between an RFC 850 year and its
/// time), and RFC 850 years, which httpdate reads in 1970 to 2069 and RFC
/// 9110 as the latest year with those digits at most 50 years after now.
/// There the crate reads httpdate's date moved by a multiple of 400 years
/// (the calendar's period, weekdays included), or refuses the value when
/// the years differ by anything else (the weekday cannot match then).
fn check_against_httpdate(text: &str, now: SystemTime, parsed: Option<Duration>) {
    let text = text.trim_matches([' ', '\t']);
    if is_delay_seconds_text(text) {
        return;
    }
    let wait_until = |at: SystemTime| at.duration_since(now).unwrap_or(Duration::ZERO);
    let reference = httpdate::parse_http_date(text).ok();
    if is_rfc850_shaped(text) {
        let Some(at) = reference else {
            // httpdate refuses no RFC 850 date that RFC 9110 reads with
            // one of its years, 1970 to 2069; dates it cannot tell.
            return;
        };
        let (Some((year, month, day, second)), Some(now_date)) = (calendar(at), calendar(now))
        else {
            return;
        };
        // httpdate reads `Sunday, 06-Nov-94?08:49:37 GMT` whatever `?` is.
        let separated = text
            .find(',')
            .is_some_and(|comma| text.as_bytes().get(comma + 11) == Some(&b' '));
        let limit = (now_date.0 + 50, now_date.1, now_date.2, now_date.3);
        let mut window_year = limit.0 - (limit.0 - year).rem_euclid(100);
        if (window_year, month, day, second) > limit {
            window_year -= 100;
        }
        let shift = window_year - year;
        let expected = if separated && shift % 400 == 0 {
            let days = i64::from(shift / 400) * 146_097;
            let moved = Duration::from_secs(days.unsigned_abs() * 86_400);
            let at = if days < 0 {
                at.checked_sub(moved)
            } else {
                at.checked_add(moved)
            };
            at.map(wait_until)
        } else {
            None
        };
        assert_eq!(
            parsed, expected,
            "{text:?} from {now:?}: httpdate reads {at:?}, RFC 9110 the year {window_year}"
        );
        return;
    }
    match reference {
        Some(at) => assert_eq!(
            parsed,
            Some(wait_until(at)),
            "{text:?}: httpdate reads {at:?}"
        ),
        None => {
            let year = if text.len() == 29 {
                text.get(12..16)
            } else {
                text.get(20..24)
            };
            let year = year.and_then(|y| y.parse::<u16>().ok());
            if year.is_some_and(|y| y < 1970) {
                // Before httpdate's years: in the past, unless `now` is too.
                if now >= UNIX_EPOCH {
                    assert!(
                        parsed.is_none_or(|wait| wait.is_zero()),
                        "{text:?} gave {parsed:?}"
                    );
                }
            } else if text.contains("23:59:60") {
                // A leap second: a second after 23:59:59.
                let last_second = text.replace("23:59:60", "23:59:59");
                let expected = httpdate::parse_http_date(&last_second)
                    .ok()
                    .map(|at| wait_until(at + Duration::from_secs(1)));
                assert_eq!(parsed, expected, "{text:?}");
            } else {
                assert_eq!(parsed, None, "{text:?}: httpdate refuses it");
            }
        }
    }
}

/// Year, month, day and second of the day of `time`, as httpdate writes
/// it; `None` outside its years (1970 to 9999).
fn calendar(time: SystemTime) -> Option<(i32, usize, u32, u32)> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let since_epoch = time.duration_since(UNIX_EPOCH).ok()?;
    if since_epoch.as_secs() > END_OF_9999 as u64 {
        return None;
    }
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let text = httpdate::fmt_http_date(time);
    let field = |range: std::ops::Range<usize>| text.get(range)?.parse::<u32>().ok();
    let month = MONTHS.iter().position(|m| Some(*m) == text.get(8..11))? + 1;
    let second_of_day = field(17..19)? * 3600 + field(20..22)? * 60 + field(23..25)?;
    Some((
        i32::try_from(field(12..16)?).ok()?,
        month,
        field(5..7)?,
        second_of_day,
    ))
}

/// The HTTP classifier reads the same value from a 429 or a 503 without
/// panicking, and only ever as a hint on a failure.
fn check_classifier(value: &HeaderValue, parsed: Option<Duration>) {
    for status in [429, 503] {
        let response = http::Response::builder()
            .status(status)
            .header(RETRY_AFTER, value.clone())
            .body(())
            .expect("a valid response");
        let verdict = Classify::<_, ()>::classify(&HttpClassifier::new(), Ok(&response)).at_head();
        assert_eq!(verdict.outcome(), Outcome::Failure);
        if is_delay_seconds(value) {
            assert_eq!(verdict.retry_after(), parsed, "{value:?}");
        }
        // Against the wall clock: present exactly when it parsed (a date in
        // the past still parses, to zero).
        if parsed.is_none() && !is_date_like(value) {
            assert_eq!(verdict.retry_after(), None, "{value:?}");
        }
    }
}

/// Whether a value is delay-seconds, whose parse does not depend on the
/// clock.
fn is_delay_seconds(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(is_delay_seconds_text)
}

fn is_delay_seconds_text(text: &str) -> bool {
    let text = text.trim_matches([' ', '\t']);
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a value could be a date, whose parse depends on the clock.
fn is_date_like(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|t| t.contains(':'))
}

// ---------------------------------------------------------------------------
// config: any numbers and policy shapes through the builder.
// ---------------------------------------------------------------------------

/// A trip policy of any shape, nested up to three levels.
pub fn policy(input: &mut Input<'_>, depth: u32) -> TripPolicy {
    let kinds = if depth < 3 { 6 } else { 5 };
    match input.byte() % kinds {
        0 => ConsecutiveFailures::new(input.count()).into(),
        1 => {
            let mut p = CountWindow::new(input.count(), input.count());
            if input.byte() & 1 == 1 {
                p = p.stale_after(input.duration());
            }
            p.into()
        }
        2 => {
            let mut p = TimeWindow::new(input.duration());
            let set = input.byte();
            if set & 1 != 0 {
                p = p.buckets(input.count());
            }
            if set & 2 != 0 {
                p = p.min_calls(input.count());
            }
            if set & 4 != 0 {
                p = p.failure_rate(input.float());
            }
            p.into()
        }
        3 => {
            let mut p = SlowCalls::new(input.duration());
            let set = input.byte();
            if set & 1 != 0 {
                p = p.rate(input.float());
            }
            if set & 2 != 0 {
                p = p.over_calls(input.count());
            }
            if set & 4 != 0 {
                p = p.over_time(input.duration(), input.count());
            }
            if set & 8 != 0 {
                p = p.min_calls(input.count());
            }
            p.into()
        }
        4 => {
            let mut p = Adaptive::new();
            let set = input.byte();
            if set & 1 != 0 {
                p = p.false_trips_per_million(input.float());
            }
            if set & 2 != 0 {
                p = p.min_degradation(input.float());
            }
            if set & 4 != 0 {
                p = p.warm_up(input.count());
            }
            if set & 8 != 0 {
                p = p.ceiling(input.float());
            }
            if set & 16 != 0 {
                p = p.baseline_horizon(input.count());
            }
            if set & 32 != 0 && depth < 3 {
                p = p.fallback(policy(input, depth + 1));
            }
            // The bound on a hard outage is computed for any values.
            let _ = p.max_failures_to_trip();
            p.into()
        }
        _ => {
            let members = usize::from(input.byte() % 4);
            TripPolicy::any_of((0..members).map(|_| policy(input, depth + 1)))
        }
    }
}

/// Bytes: a mask of the settings to set, each setting's value, then the
/// steps a breaker with that config is put through (see [`exercise`]).
pub fn config(data: &[u8]) {
    let mut input = Input::new(data);
    let set = input.u16();
    let mut builder = Config::builder();
    if set & 1 != 0 {
        let len = usize::from(input.byte() % 48);
        builder = builder.name(String::from_utf8_lossy(input.bytes(len)).into_owned());
    }
    if set & 2 != 0 {
        builder = builder.trip(policy(&mut input, 0));
    }
    if set & 4 != 0 {
        builder = builder.cooldown(input.duration());
    }
    if set & 8 != 0 {
        builder = builder.min_open(input.duration());
    }
    if set & 16 != 0 {
        builder = builder.max_open(input.duration());
    }
    if set & 32 != 0 {
        builder = builder.backoff(input.float());
    }
    if set & 64 != 0 {
        builder = builder.jitter(input.float());
    }
    if set & 128 != 0 {
        builder = builder.probes(input.count());
    }
    if set & 256 != 0 {
        builder = builder.successes_to_close(input.count());
    }
    if set & 512 != 0 {
        let timeout = (input.byte() & 1 == 1).then(|| input.duration());
        builder = builder.probe_timeout(timeout);
    }
    if set & 1024 != 0 {
        builder = builder.probe_interval(input.duration());
    }
    match builder.build() {
        Ok(config) => exercise(config, &mut input),
        Err(err) => {
            // A refusal names its field and says what is wrong.
            assert!(!err.field().is_empty(), "{err:?}");
            assert!(!err.to_string().is_empty());
        }
    }
}

/// What a valid config promises, then a breaker with it through the steps
/// the rest of the input describes, on paused time.
pub fn exercise(config: Config, input: &mut Input<'_>) {
    EXERCISED.fetch_add(1, Ordering::Relaxed);
    let (min_open, max_open) = (config.min_open(), config.max_open());
    assert!(config.cooldown() > Duration::ZERO && config.cooldown() <= max_open);
    assert!(min_open <= max_open);
    assert!(config.probes() >= 1 && config.successes_to_close() >= 1);
    for attempt in [0, 1, 2, 10, 31, 32, 33, 63, 64, 1_000, u32::MAX] {
        let period = config.open_period(attempt);
        assert!(
            min_open <= period && period <= max_open,
            "open_period({attempt}) = {period:?} outside [{min_open:?}, {max_open:?}]"
        );
    }
    // An open period is kept in whole milliseconds, rounded up.
    let longest_open = Duration::from_millis(
        u64::try_from(max_open.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let breaker = Breaker::new(config.clone());
        let classify = |result: Result<&Verdict, &BoxError>| match result {
            Ok(verdict) => *verdict,
            Err(_) => Verdict::new(Outcome::Failure),
        };
        let upstream = service_fn(|(verdict, latency): (Verdict, Duration)| async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            Ok::<_, BoxError>(verdict)
        });
        let mut svc = CircuitBreaker::with_classifier(upstream, &breaker, classify);
        for _ in 0..24 {
            if input.is_empty() {
                break;
            }
            match input.byte() % 12 {
                0..=4 => {
                    let outcome = match input.byte() % 3 {
                        0 => Outcome::Success,
                        1 => Outcome::Failure,
                        _ => Outcome::Ignore,
                    };
                    let mut verdict = Verdict::new(outcome);
                    if input.byte() & 1 == 1 {
                        verdict = verdict.with_retry_after(input.duration());
                    }
                    // Bounded so that the paused clock never overflows.
                    let latency = input.duration().min(Duration::from_secs(86_400));
                    let ready = svc.ready().await.expect("poll_ready never fails");
                    let _ = ready.call((verdict, latency)).await;
                }
                5 => {
                    let step = input.duration().min(Duration::from_secs(400 * 86_400));
                    tokio::time::advance(step).await;
                }
                6 => {
                    let period = (input.byte() & 1 == 1).then(|| input.duration());
                    breaker.force_open(period);
                }
                7 => {
                    let _changed = match input.byte() % 4 {
                        0 => breaker.force_closed(),
                        1 => breaker.disable(),
                        2 => breaker.restore(),
                        _ => breaker.reset(),
                    };
                }
                8 => breaker.reconfigure(config.clone()),
                9 => breaker.set_shadow(input.byte() & 1 == 1),
                10 => {
                    // A call reserved and dropped before it is made.
                    let mut clone = svc.clone();
                    let _ = clone.ready().await;
                }
                _ => {
                    let snapshot = breaker.snapshot();
                    assert_eq!(snapshot.name.as_ref(), breaker.name());
                }
            }
            // Never open for longer than the maximum open period.
            if let Some(retry_after) = breaker.retry_after() {
                assert!(
                    retry_after <= longest_open,
                    "retry_after {retry_after:?} over max_open {max_open:?}"
                );
            }
            let snapshot = breaker.snapshot();
            assert_eq!(
                snapshot.retry_after.is_some(),
                snapshot.state == State::Open
            );
            assert!(snapshot.probes_in_flight <= config.probes());
            assert!(snapshot.counts.failures + snapshot.counts.ignored <= snapshot.counts.calls);
        }
        // Every call has ended: every permit is back.
        drop(svc);
        assert_eq!(breaker.snapshot().probes_in_flight, 0);
    });
}

// ---------------------------------------------------------------------------
// config_file: configs and registry configs from TOML and JSON (feature
// `serde`).
// ---------------------------------------------------------------------------

/// The steps a config read from a file is put through: trip, wait, probe.
#[cfg(feature = "serde")]
const FILE_SCRIPT: &[u8] = &[
    // Five failures (the default threshold).
    0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0,
    // A minute passes; two probes succeed.
    5, 2, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    // A snapshot; isolated, reloaded, restored; one more failure.
    11, 6, 0, 8, 7, 2, 0, 1, 0, 0,
];

/// Bytes: text (not UTF-8 is not a config) read as a `Config` and as a
/// `RegistryConfig<String>`, from JSON and from TOML, and as a duration.
#[cfg(feature = "serde")]
pub fn config_file(data: &[u8]) {
    use tower_circuit_breaker::serialization::{parse_duration, RegistryConfig};

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let configs = [
        serde_json::from_str::<Config>(text).ok(),
        toml::from_str::<Config>(text).ok(),
    ];
    for config in configs.into_iter().flatten() {
        // Every config read from a file went through the builder.
        let rebuilt = config.to_builder().build().expect("a file config is valid");
        assert_eq!(rebuilt.max_open(), config.max_open());
        exercise(config, &mut Input::new(FILE_SCRIPT));
    }
    let registries = [
        serde_json::from_str::<RegistryConfig<String>>(text).ok(),
        toml::from_str::<RegistryConfig<String>>(text).ok(),
    ];
    for registry in registries.into_iter().flatten() {
        let built = registry.build();
        for (key, config) in registry.keys() {
            let breaker = built.get(key).expect("a registry from a file has room");
            assert_eq!(breaker.name(), key.as_str());
            assert_eq!(breaker.config().max_open(), config.max_open());
        }
        registry.reload(&built);
    }
    if let Ok(duration) = parse_duration(text) {
        assert!(duration.as_millis() <= u128::from(u64::MAX), "{text:?}");
        assert!(!text.is_empty() && text.is_ascii(), "{text:?}");
    }
}

// ---------------------------------------------------------------------------
// grpc_headers: `grpc-status` and `grpc-retry-pushback-ms` from an upstream.
// ---------------------------------------------------------------------------

/// Bytes: a split point, then two header values: `grpc-status` and
/// `grpc-retry-pushback-ms`, each as an upstream may send it.
#[cfg(feature = "http-body")]
pub fn grpc_headers(data: &[u8]) {
    use tower_circuit_breaker::classify::{
        grpc_status, parse_pushback, Classified, Classify, ClassifyEos, GrpcClassifier, Outcome,
    };

    let mut input = Input::new(data);
    let split = input.byte() as usize;
    let rest = input.rest();
    let (status, pushback) = rest.split_at(split.min(rest.len()));
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(status) {
        headers.insert("grpc-status", value);
    }
    if let Ok(value) = HeaderValue::from_bytes(pushback) {
        // A pushback is a whole number of milliseconds, or nothing.
        if let Some(wait) = parse_pushback(&value) {
            assert!(wait <= Duration::from_millis(u64::MAX), "{value:?}");
        }
        headers.insert("grpc-retry-pushback-ms", value);
    }
    let code = grpc_status(&headers);
    for classifier in [
        GrpcClassifier::new(),
        GrpcClassifier::new().internal_is_failure(true),
    ] {
        // In the trailers, at the end of a stream.
        let at_end =
            Classify::<http::Response<()>, ()>::classify(&classifier, Ok(&http::Response::new(())));
        let Classified::AtEndOfStream(eos) = at_end else {
            panic!("a head without grpc-status is judged at the end");
        };
        let verdict = eos.classify_eos(Some(&headers));
        // Only a failure carries a hint; OK is a success, whatever else came.
        if verdict.outcome() != Outcome::Failure {
            assert_eq!(verdict.retry_after(), None, "{headers:?}");
        }
        if code == Some(0) {
            assert_eq!(verdict.outcome(), Outcome::Success, "{headers:?}");
        }
        // In the head (trailers-only): the same verdict.
        let mut head = http::Response::new(());
        *head.headers_mut() = headers.clone();
        if code.is_some() {
            match Classify::<http::Response<()>, ()>::classify(&classifier, Ok(&head)) {
                Classified::Ready(now) => assert_eq!(now, verdict, "{headers:?}"),
                Classified::AtEndOfStream(_) => panic!("a status in the head is judged at once"),
            }
        }
    }
}
