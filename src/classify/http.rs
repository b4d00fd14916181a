//! HTTP classification and the `Retry-After` header.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Response, StatusCode};

use std::convert::Infallible;

use super::{Classified, Classify, FailureClass, Outcome, Verdict};

/// Classifies `http::Response`s by status, the way a model-provider client
/// wants:
///
/// | result | outcome |
/// | --- | --- |
/// | 5xx, 408 Request Timeout, 429 Too Many Requests | failure |
/// | other 4xx (400, 401, 403, 404...) | ignored: the request, not the provider, is at fault |
/// | 1xx, 2xx, 3xx | success |
/// | any `Err` (connection refused, `tower::timeout`'s `Elapsed`...) | failure |
///
/// On every status that counts as a failure (a 429, a 5xx, Anthropic's 529),
/// the wait the provider asks for becomes the verdict's retry-after hint:
/// the breaker, opening on that failure, stays open at least that long
/// (capped by its maximum open period). Read, in this order:
///
/// | header | from | turned off by |
/// | --- | --- | --- |
/// | `retry-after-ms` (milliseconds), else `Retry-After` (seconds or an HTTP date) | OpenAI, Azure, Anthropic, any server | [`ignore_retry_after`](HttpClassifier::ignore_retry_after) |
/// | `x-ratelimit-reset-requests` / `-tokens` (`1m30s`, `20ms`), when the matching `x-ratelimit-remaining-*` is `0`, or on a 429 naming none spent (the latest reset) | OpenAI | [`ignore_reset_headers`](HttpClassifier::ignore_reset_headers) |
/// | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset` (RFC 3339), likewise | Anthropic | [`ignore_reset_headers`](HttpClassifier::ignore_reset_headers) |
///
/// An explicit wait wins over the reset headers. A value that does not
/// parse is ignored, never a panic; a success or an ignored status reads
/// nothing.
///
/// ```
/// use http::{Response, StatusCode};
/// use std::time::Duration;
/// use tower_circuit_breaker::classify::{Classify, HttpClassifier, Outcome};
///
/// let res = Response::builder()
///     .status(StatusCode::TOO_MANY_REQUESTS)
///     .header("retry-after", "120")
///     .body(())
///     .unwrap();
/// let verdict = Classify::<_, ()>::classify(&HttpClassifier::new(), Ok(&res)).at_head();
/// assert_eq!(verdict.outcome(), Outcome::Failure);
/// assert_eq!(verdict.retry_after(), Some(Duration::from_secs(120)));
///
/// let status_only = HttpClassifier::new().ignore_retry_after();
/// let verdict = Classify::<_, ()>::classify(&status_only, Ok(&res)).at_head();
/// assert_eq!(verdict.outcome(), Outcome::Failure);
/// assert_eq!(verdict.retry_after(), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpClassifier {
    ignore_retry_after: bool,
    ignore_reset_headers: bool,
}

impl HttpClassifier {
    /// Judges by status, and reads the retry hints of every failing status.
    pub const fn new() -> Self {
        HttpClassifier {
            ignore_retry_after: false,
            ignore_reset_headers: false,
        }
    }

    /// Never reads `Retry-After` nor `retry-after-ms`: with
    /// [`ignore_reset_headers`](Self::ignore_reset_headers) too, the
    /// breaker's own open period (its cooldown and backoff) alone decides
    /// when to probe again. For upstreams that send nonsense there (a
    /// fixed hour, a date in another clock).
    pub const fn ignore_retry_after(mut self) -> Self {
        self.ignore_retry_after = true;
        self
    }

    /// Never reads the providers' rate-limit reset headers (OpenAI's
    /// `x-ratelimit-reset-*`, Anthropic's `anthropic-ratelimit-*-reset`):
    /// `Retry-After` and `retry-after-ms` alone, unless turned off too,
    /// give hints.
    pub const fn ignore_reset_headers(mut self) -> Self {
        self.ignore_reset_headers = true;
        self
    }

    /// The class of a failing status: 429 rate-limited; 503 and 529
    /// overloaded; 408 and 504 a timeout; any other 5xx a server error.
    /// `None` for a status that is no failure.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_circuit_breaker::classify::{FailureClass, HttpClassifier};
    ///
    /// let overloaded = StatusCode::from_u16(529).unwrap();
    /// assert_eq!(HttpClassifier::class(overloaded), Some(FailureClass::Overloaded));
    /// assert_eq!(HttpClassifier::class(StatusCode::OK), None);
    /// ```
    pub fn class(status: StatusCode) -> Option<FailureClass> {
        if Self::outcome(status) != Outcome::Failure {
            return None;
        }
        Some(match status.as_u16() {
            429 => FailureClass::RateLimited,
            503 | 529 => FailureClass::Overloaded,
            408 | 504 => FailureClass::Timeout,
            _ => FailureClass::ServerError,
        })
    }

    /// The outcome for a status code alone.
    pub fn outcome(status: StatusCode) -> Outcome {
        if status.is_server_error()
            || status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
        {
            Outcome::Failure
        } else if status.is_client_error() {
            Outcome::Ignore
        } else {
            Outcome::Success
        }
    }
}

impl<B, E> Classify<Response<B>, E> for HttpClassifier {
    type Eos = Infallible;

    fn classify(&self, result: Result<&Response<B>, &E>) -> Classified<Infallible> {
        Classified::Ready(self.verdict(result))
    }
}

impl HttpClassifier {
    /// The verdict on a response, or on the error in its place.
    pub(crate) fn verdict<B, E>(&self, result: Result<&Response<B>, &E>) -> Verdict {
        let response = match result {
            Ok(response) => response,
            Err(_) => return Verdict::failure(FailureClass::Other),
        };
        warn_if_grpc(response);
        let status = response.status();
        let verdict = match Self::class(status) {
            Some(class) => Verdict::failure(class),
            None => Verdict::new(Self::outcome(status)),
        };
        if verdict.outcome() != Outcome::Failure
            || (self.ignore_retry_after && self.ignore_reset_headers)
        {
            return verdict;
        }
        match super::hints::hint(
            response.headers(),
            status,
            SystemTime::now(),
            !self.ignore_retry_after,
            !self.ignore_reset_headers,
        ) {
            Some(hint) => verdict.with_retry_after(hint),
            None => verdict,
        }
    }
}

/// Says once per process, as a `tracing` warning, that a classifier judging
/// by HTTP status alone sees a gRPC response: its status is in
/// `grpc-status` (often in the trailers), so UNAVAILABLE and every other
/// failure look like a 200 to it, and the breaker would never open. The
/// fix is a breaker classifying with the gRPC classifier, which judges the trailers.
pub(crate) fn warn_if_grpc<B>(response: &Response<B>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    let grpc = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "a circuit breaker judging by HTTP status sees a gRPC response \
             (content-type application/grpc): gRPC failures answer 200 with the \
             status in `grpc-status`, so they count as successes and the breaker \
             never opens; classify with `CircuitBreakerLayer::classify(GrpcClassifier::new())`"
        );
    }
}

/// Parses a `Retry-After` value: delay-seconds (`"120"`) or an HTTP date,
/// relative to `now`. A date in the past gives zero. Anything else gives
/// `None`; a delay too large to represent saturates, and the breaker caps
/// it by its maximum open period.
///
/// Dates are read as RFC 9110 (section 5.6.7) writes them, in its three
/// forms, and nothing else:
///
/// | form | example |
/// | --- | --- |
/// | IMF-fixdate | `Sun, 06 Nov 1994 08:49:37 GMT` |
/// | RFC 850 (obsolete) | `Sunday, 06-Nov-94 08:49:37 GMT` |
/// | asctime (obsolete) | `Sun Nov  6 08:49:37 1994` (or `Nov 06`) |
///
/// * every field has its exact width, each separator is one space, and
///   names are case-sensitive (`Sun`, `Nov`, `GMT`); only spaces and tabs
///   around the whole value are allowed;
/// * the date exists (no `31 Feb`), the time is `00:00:00` to `23:59:59`,
///   or `23:59:60` (a leap second, read as the next midnight), and the
///   weekday is the date's own;
/// * an RFC 850 two-digit year is the year with those digits that is not
///   more than 50 years after `now` (its date and time compared with
///   `now`'s, 50 years on): with `now` in 2025, `94` is 1994 and `70`
///   is 2070.
///
/// Delay-seconds is one or more ASCII digits, nothing else (no sign, no
/// fraction).
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use http::HeaderValue;
/// use tower_circuit_breaker::classify::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_400); // 07:26:40 GMT
/// let date = HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
/// assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(80)));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("30"), now), Some(Duration::from_secs(30)));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("-1"), now), None);
/// // 21 October 2015 was a Wednesday, not a Thursday.
/// let wrong_day = HeaderValue::from_static("Thu, 21 Oct 2015 07:28:00 GMT");
/// assert_eq!(parse_retry_after(&wrong_day, now), None);
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = trim_ows(value.as_bytes());
    if text.is_empty() {
        return None;
    }
    if text.iter().all(u8::is_ascii_digit) {
        // All digits: delay-seconds. Saturate rather than fail on overflow.
        let secs = std::str::from_utf8(text)
            .ok()?
            .parse::<u64>()
            .unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let now = unix_seconds(now);
    let at = parse_http_date(text, now)?;
    let wait = (at - i128::from(now)).max(0);
    Some(Duration::from_secs(u64::try_from(wait).unwrap_or(u64::MAX)))
}

/// `bytes` without the spaces and tabs (optional whitespace) around them.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// Whole seconds since the Unix epoch, rounded down (negative before it).
pub(super) fn unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => {
            let before = before.duration();
            let secs = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            // Rounded down: 0.5 s before the epoch is in second -1.
            if before.subsec_nanos() > 0 {
                (-secs).saturating_sub(1)
            } else {
                -secs
            }
        }
    }
}

const DAY_NAMES: [&[u8]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];
const LONG_DAY_NAMES: [&[u8]; 7] = [
    b"Sunday",
    b"Monday",
    b"Tuesday",
    b"Wednesday",
    b"Thursday",
    b"Friday",
    b"Saturday",
];
const MONTHS: [&[u8]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// A date and time as an HTTP date writes it, checked field by field.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Civil {
    year: i64,
    month: u8,
    day: u8,
    // Seconds into the day: up to 86 400 for a leap second.
    second_of_day: u32,
}

/// Seconds since the Unix epoch (negative before it) of an HTTP date in
/// any of its three forms (see [`parse_retry_after`]); an RFC 850 year is
/// read relative to `now`, in seconds since the epoch. In `i128`: an RFC
/// 850 date 50 years after the last second an `i64` holds is still a date.
fn parse_http_date(text: &[u8], now: i64) -> Option<i128> {
    let (weekday, civil) = match text.len() {
        29 => imf_fixdate(text)?,
        24 => asctime(text)?,
        _ => rfc850_date(text, now)?,
    };
    let days = days_from_civil(civil.year, civil.month, civil.day);
    if weekday_of(days) != weekday {
        return None;
    }
    Some(i128::from(days) * 86_400 + i128::from(civil.second_of_day))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(s: &[u8]) -> Option<(usize, Civil)> {
    let [a, b, c, b',', b' ', d1, d2, b' ', m1, m2, m3, b' ', y1, y2, y3, y4, b' ', time @ .., b' ', b'G', b'M', b'T'] =
        s
    else {
        return None;
    };
    let weekday = DAY_NAMES.iter().position(|n| *n == [*a, *b, *c])?;
    let year = i64::from(digits(&[*y1, *y2, *y3, *y4])?);
    let civil = civil(year, &[*m1, *m2, *m3], digits(&[*d1, *d2])?, time)?;
    Some((weekday, civil))
}

/// `Sun Nov  6 08:49:37 1994`, or `Sun Nov 06 08:49:37 1994`
fn asctime(s: &[u8]) -> Option<(usize, Civil)> {
    let [a, b, c, b' ', m1, m2, m3, b' ', d1, d2, b' ', time @ .., b' ', y1, y2, y3, y4] = s else {
        return None;
    };
    let weekday = DAY_NAMES.iter().position(|n| *n == [*a, *b, *c])?;
    let day = match d1 {
        b' ' => digits(&[*d2])?,
        _ => digits(&[*d1, *d2])?,
    };
    let year = i64::from(digits(&[*y1, *y2, *y3, *y4])?);
    let civil = civil(year, &[*m1, *m2, *m3], day, time)?;
    Some((weekday, civil))
}

/// `Sunday, 06-Nov-94 08:49:37 GMT`, its century chosen relative to `now`.
fn rfc850_date(s: &[u8], now: i64) -> Option<(usize, Civil)> {
    let comma = s.iter().position(|b| *b == b',')?;
    let (name, rest) = s.split_at(comma);
    let weekday = LONG_DAY_NAMES.iter().position(|n| *n == name)?;
    let [b',', b' ', d1, d2, b'-', m1, m2, m3, b'-', y1, y2, b' ', time @ .., b' ', b'G', b'M', b'T'] =
        rest
    else {
        return None;
    };
    let two_digits = i64::from(digits(&[*y1, *y2])?);
    // Checked in the year 0, a leap year: the day may be 29 February, and
    // the year it falls in is chosen below.
    let mut civil = civil(0, &[*m1, *m2, *m3], digits(&[*d1, *d2])?, time)?;
    // RFC 9110: a two-digit year that appears to be more than 50 years in
    // the future is in the past century. The latest year with those digits
    // up to 50 years from now, unless its date and time fall after now's,
    // 50 years on.
    let (now_year, now_month, now_day) = civil_from_days(now.div_euclid(86_400));
    let limit = Civil {
        year: now_year + 50,
        month: now_month,
        day: now_day,
        second_of_day: u32::try_from(now.rem_euclid(86_400)).ok()?,
    };
    civil.year = limit.year - (limit.year - two_digits).rem_euclid(100);
    if civil > limit {
        civil.year -= 100;
    }
    (civil.day <= days_in_month(civil.year, civil.month)).then_some((weekday, civil))
}

/// A checked date and time: `month` one of [`MONTHS`], `day` within it,
/// `time` as `HH:MM:SS`.
fn civil(year: i64, month: &[u8], day: u16, time: &[u8]) -> Option<Civil> {
    let month = u8::try_from(MONTHS.iter().position(|m| *m == month)? + 1).ok()?;
    let day = u8::try_from(day).ok()?;
    if day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let [h1, h2, b':', m1, m2, b':', s1, s2] = time else {
        return None;
    };
    let (hour, minute, second) = (
        digits(&[*h1, *h2])?,
        digits(&[*m1, *m2])?,
        digits(&[*s1, *s2])?,
    );
    let leap_second = (hour, minute, second) == (23, 59, 60);
    if hour > 23 || minute > 59 || (second > 59 && !leap_second) {
        return None;
    }
    Some(Civil {
        year,
        month,
        day,
        second_of_day: u32::from(hour) * 3600 + u32::from(minute) * 60 + u32::from(second),
    })
}

/// The number written by ASCII digits, all of them digits.
fn digits(bytes: &[u8]) -> Option<u16> {
    bytes.iter().try_fold(0u16, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + u16::from(b - b'0'))
    })
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

pub(super) fn days_in_month(year: i64, month: u8) -> u8 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The weekday of a day counted from 1970-01-01 (a Thursday), Sunday 0.
fn weekday_of(days: i64) -> usize {
    // In 0..7, so the cast is exact.
    (days + 4).rem_euclid(7) as usize
}

/// Days from 1970-01-01 to a proleptic Gregorian date (negative before).
pub(super) fn days_from_civil(year: i64, month: u8, day: u8) -> i64 {
    let (month, day) = (i64::from(month), i64::from(day));
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The proleptic Gregorian date of a day counted from 1970-01-01: year,
/// month (1 to 12), day (1 to 31).
fn civil_from_days(days: i64) -> (i64, u8, u8) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    // Both within 1..=31 and 1..=12, so the casts are exact.
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u8;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u8;
    let year = year_of_era + era * 400;
    (if month <= 2 { year + 1 } else { year }, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn parse(v: &str, now: SystemTime) -> Option<Duration> {
        parse_retry_after(&HeaderValue::from_str(v).unwrap(), now)
    }

    #[test]
    fn all_three_date_forms_agree() {
        // 784111777 = Sun, 06 Nov 1994 08:49:37 GMT
        let now = at(784_111_777 - 10);
        for v in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse(v, now), Some(Duration::from_secs(10)), "{v}");
        }
    }

    #[test]
    fn dates_in_the_past_give_zero() {
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", at(2_000_000_000)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn garbage_is_ignored_and_huge_values_saturate() {
        let now = at(0);
        for v in [
            "",
            "  ",
            "-5",
            "1.5",
            "soon",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "99999999999999999999999 GMT",
        ] {
            assert_eq!(parse(v, now), None, "{v:?}");
        }
        assert_eq!(
            parse("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(parse(" 7 ", now), Some(Duration::from_secs(7)));
    }

    #[test]
    fn statuses_map_to_outcomes() {
        assert_eq!(HttpClassifier::outcome(StatusCode::OK), Outcome::Success);
        assert_eq!(
            HttpClassifier::outcome(StatusCode::BAD_REQUEST),
            Outcome::Ignore
        );
        assert_eq!(
            HttpClassifier::outcome(StatusCode::UNAUTHORIZED),
            Outcome::Ignore
        );
        assert_eq!(
            HttpClassifier::outcome(StatusCode::REQUEST_TIMEOUT),
            Outcome::Failure
        );
        assert_eq!(
            HttpClassifier::outcome(StatusCode::TOO_MANY_REQUESTS),
            Outcome::Failure
        );
        assert_eq!(
            HttpClassifier::outcome(StatusCode::BAD_GATEWAY),
            Outcome::Failure
        );
    }
}
