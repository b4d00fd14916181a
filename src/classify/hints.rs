//! The retry hints model providers send beside a failure: how long to stay
//! away, read from headers. Pure: headers and a clock in, a wait out.
//!
//! | header | provider | read |
//! | --- | --- | --- |
//! | `retry-after-ms` | OpenAI, Azure | milliseconds |
//! | `Retry-After` | every HTTP server | seconds or an HTTP date ([`parse_retry_after`](super::parse_retry_after)) |
//! | `x-ratelimit-reset-requests`, `x-ratelimit-reset-tokens` | OpenAI | a duration such as `1m30s`, `20ms`, `6m0s`, `1.5s` |
//! | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset` | Anthropic | an RFC 3339 time |
//!
//! An explicit wait (`retry-after-ms`, else `Retry-After`) is the answer
//! when present. Otherwise the reset of a limit that is spent (its
//! `-remaining` header says `0`), or, on a 429 that names none spent, the
//! latest reset given. A value that does not parse is ignored.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};

use super::http::{days_from_civil, parse_retry_after, unix_seconds};

/// OpenAI's limits: each reset header and the remaining count beside it.
const OPENAI: [(&str, &str); 2] = [
    (
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-requests",
    ),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
];

/// Anthropic's limits, likewise.
const ANTHROPIC: [(&str, &str); 4] = [
    (
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-requests-remaining",
    ),
    (
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-tokens-remaining",
    ),
    (
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-input-tokens-remaining",
    ),
    (
        "anthropic-ratelimit-output-tokens-reset",
        "anthropic-ratelimit-output-tokens-remaining",
    ),
];

/// The wait `headers` ask for, beside a failure with `status`: the explicit
/// one (when `explicit`), else the reset of a spent limit (when `resets`).
pub(super) fn hint(
    headers: &HeaderMap,
    status: StatusCode,
    now: SystemTime,
    explicit: bool,
    resets: bool,
) -> Option<Duration> {
    if explicit {
        let millis = headers.get("retry-after-ms").and_then(parse_millis);
        let wait = millis.or_else(|| {
            headers
                .get(http::header::RETRY_AFTER)
                .and_then(|v| parse_retry_after(v, now))
        });
        if wait.is_some() {
            return wait;
        }
    }
    if !resets {
        return None;
    }
    let openai = OPENAI.map(|(reset, left)| {
        let reset = headers
            .get(reset)
            .and_then(|v| parse_reset_duration(v.as_bytes()));
        (reset, spent(headers.get(left)))
    });
    let now_secs = unix_seconds(now);
    let anthropic = ANTHROPIC.map(|(reset, left)| {
        let at = headers.get(reset).and_then(|v| parse_rfc3339(v.as_bytes()));
        let reset = at.map(|at| wait_until(at, now_secs, now));
        (reset, spent(headers.get(left)))
    });
    let all = openai.iter().chain(&anthropic);
    let spent_resets = all
        .clone()
        .filter(|(_, s)| *s)
        .filter_map(|(r, _)| *r)
        .max();
    if spent_resets.is_some() {
        return spent_resets;
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        return all.filter_map(|(r, _)| *r).max();
    }
    None
}

/// Whether a `-remaining` header says the limit is spent.
fn spent(value: Option<&HeaderValue>) -> bool {
    value.is_some_and(|v| v.as_bytes().trim_ascii() == b"0")
}

/// `retry-after-ms`: whole (or fractional) milliseconds.
fn parse_millis(value: &HeaderValue) -> Option<Duration> {
    let text = std::str::from_utf8(value.as_bytes()).ok()?.trim();
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let millis: u64 = whole.parse().unwrap_or(u64::MAX);
    Some(Duration::from_millis(millis))
}

/// An OpenAI reset duration: numbers (a fraction allowed) with units `h`,
/// `m`, `s`, `ms`, largest first or not, at least one: `1m30s`, `20ms`,
/// `6m0s`, `1.5s`. Saturates rather than overflows.
pub(super) fn parse_reset_duration(text: &[u8]) -> Option<Duration> {
    let mut rest = text.trim_ascii();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(rest.len());
        let number = std::str::from_utf8(&rest[..number_end]).ok()?;
        if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        rest = &rest[number_end..];
        let (seconds_per_unit, unit_len) = if rest.starts_with(b"ms") {
            (0.001, 2)
        } else if rest.starts_with(b"h") {
            (3600.0, 1)
        } else if rest.starts_with(b"m") {
            (60.0, 1)
        } else if rest.starts_with(b"s") {
            (1.0, 1)
        } else {
            return None;
        };
        rest = &rest[unit_len..];
        total += value * seconds_per_unit;
    }
    // Rounded up to the millisecond: never shorter than asked.
    let millis = (total * 1000.0).ceil();
    Some(Duration::from_millis(
        if millis.is_finite() && millis < u64::MAX as f64 {
            millis as u64
        } else {
            u64::MAX
        },
    ))
}

/// An RFC 3339 time (`2026-12-02T10:00:00Z`, `...T10:00:00.5+01:00`) as
/// seconds since the Unix epoch, and the nanoseconds past.
pub(super) fn parse_rfc3339(text: &[u8]) -> Option<(i64, u32)> {
    let s = text.trim_ascii();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(range)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let sep = |at: usize, allowed: &[u8]| s.get(at).is_some_and(|b| allowed.contains(b));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let month = u8::try_from(month).ok().filter(|m| (1..=12).contains(m))?;
    let day = u8::try_from(day).ok()?;
    if day == 0
        || day > super::http::days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut nanos = 0u32;
    if s.get(at) == Some(&b'.') {
        let digits = s[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        for (i, b) in s[at + 1..at + 1 + digits].iter().take(9).enumerate() {
            nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
        }
        at += 1 + digits;
    }
    let offset = match s.get(at..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let two = |a: u8, b: u8| -> Option<i64> {
                (a.is_ascii_digit() && b.is_ascii_digit())
                    .then(|| i64::from((a - b'0') * 10 + (b - b'0')))
            };
            let (h, m) = (two(*h1, *h2)?, two(*m1, *m2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let offset = h * 3600 + m * 60;
            if *sign == b'+' {
                offset
            } else {
                -offset
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    Some((secs, nanos))
}

/// The wait until `(secs, nanos)` from `now` (`now_secs` its whole
/// seconds): zero for a time past.
fn wait_until((secs, nanos): (i64, u32), now_secs: i64, now: SystemTime) -> Duration {
    let now_nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let whole = secs.saturating_sub(now_secs);
    let total = i128::from(whole) * 1_000_000_000 + i128::from(nanos) - i128::from(now_nanos);
    if total <= 0 {
        return Duration::ZERO;
    }
    let total = u128::try_from(total).unwrap_or(0);
    Duration::new(
        u64::try_from(total / 1_000_000_000).unwrap_or(u64::MAX),
        (total % 1_000_000_000) as u32,
    )
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    /// 2026-12-02T10:00:00Z.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_796_205_600)
    }

    #[test]
    fn openai_durations_parse_as_openai_writes_them() {
        for (text, millis) in [
            ("20s", 20_000),
            ("1m30s", 90_000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("1.5s", 1_500),
            ("1h2m3s", 3_723_000),
            ("0.0001s", 1),
        ] {
            assert_eq!(
                parse_reset_duration(text.as_bytes()),
                Some(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for bad in ["", "s", "20", "1x", "1.s", ".5s", "-1s", "1m 30s", "1e9s"] {
            assert_eq!(parse_reset_duration(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(
            parse_reset_duration(b"99999999999999999999999h"),
            Some(Duration::from_millis(u64::MAX))
        );
    }

    #[test]
    fn rfc3339_times_parse_with_offsets_and_fractions() {
        let at = |t: &str| parse_rfc3339(t.as_bytes());
        assert_eq!(at("2026-12-02T10:00:00Z"), Some((1_796_205_600, 0)));
        assert_eq!(at("2026-12-02T11:00:00+01:00"), Some((1_796_205_600, 0)));
        assert_eq!(
            at("2026-12-02T10:00:20.5Z"),
            Some((1_796_205_620, 500_000_000))
        );
        for bad in [
            "2026-13-02T10:00:00Z",
            "2026-02-30T10:00:00Z",
            "2026-12-02 10:00",
            "tomorrow",
            "2026-12-02T10:00:00",
            "2026-12-02T10:00:00+1:00",
        ] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_explicit_wait_wins_and_ms_before_seconds() {
        let both = headers(&[
            ("retry-after", "30"),
            ("retry-after-ms", "1500"),
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-remaining-requests", "0"),
        ]);
        assert_eq!(
            hint(&both, StatusCode::TOO_MANY_REQUESTS, now(), true, true),
            Some(Duration::from_millis(1500))
        );
        let seconds = headers(&[("retry-after", "30")]);
        let overloaded = StatusCode::from_u16(529).unwrap();
        assert_eq!(
            hint(&seconds, overloaded, now(), true, true),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            hint(&seconds, overloaded, now(), false, true),
            None,
            "turned off"
        );
    }

    #[test]
    fn openai_resets_count_when_their_limit_is_spent_or_on_a_429() {
        let requests_spent = headers(&[
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
            ("x-ratelimit-remaining-tokens", "1000"),
        ]);
        let wait = hint(
            &requests_spent,
            StatusCode::TOO_MANY_REQUESTS,
            now(),
            true,
            true,
        );
        assert_eq!(
            wait,
            Some(Duration::from_secs(20)),
            "the spent limit's reset"
        );
        let none_named = headers(&[
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-reset-tokens", "1m"),
        ]);
        assert_eq!(
            hint(
                &none_named,
                StatusCode::TOO_MANY_REQUESTS,
                now(),
                true,
                true
            ),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            hint(&none_named, StatusCode::BAD_GATEWAY, now(), true, true),
            None,
            "not a 429, nothing spent"
        );
        assert_eq!(
            hint(
                &requests_spent,
                StatusCode::TOO_MANY_REQUESTS,
                now(),
                true,
                false
            ),
            None,
            "turned off"
        );
    }

    #[test]
    fn anthropic_resets_are_times() {
        let spent = headers(&[
            ("anthropic-ratelimit-requests-reset", "2026-12-02T10:00:45Z"),
            ("anthropic-ratelimit-requests-remaining", "0"),
        ]);
        assert_eq!(
            hint(&spent, StatusCode::TOO_MANY_REQUESTS, now(), true, true),
            Some(Duration::from_secs(45))
        );
        let past = headers(&[
            ("anthropic-ratelimit-tokens-reset", "2026-12-02T09:00:00Z"),
            ("anthropic-ratelimit-tokens-remaining", "0"),
        ]);
        assert_eq!(
            hint(&past, StatusCode::TOO_MANY_REQUESTS, now(), true, true),
            Some(Duration::ZERO)
        );
        let garbage = headers(&[
            ("anthropic-ratelimit-requests-reset", "soon"),
            ("anthropic-ratelimit-requests-remaining", "0"),
        ]);
        assert_eq!(
            hint(&garbage, StatusCode::TOO_MANY_REQUESTS, now(), true, true),
            None
        );
    }
}
