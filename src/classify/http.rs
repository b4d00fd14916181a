//! HTTP classification and the `Retry-After` header.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{header::RETRY_AFTER, HeaderValue, Response, StatusCode};

use super::{Classify, Outcome, Verdict};

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
/// On 429 and 503, a `Retry-After` header (seconds or an HTTP date) becomes
/// the verdict's retry-after hint: the breaker, opening on that failure,
/// stays open at least that long (capped by its maximum open period). A
/// header that does not parse is ignored, and so is every header with
/// [`ignore_retry_after`](HttpClassifier::ignore_retry_after), for
/// upstreams whose `Retry-After` cannot be trusted.
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
/// let verdict = Classify::<_, ()>::classify(&HttpClassifier::new(), Ok(&res));
/// assert_eq!(verdict.outcome(), Outcome::Failure);
/// assert_eq!(verdict.retry_after(), Some(Duration::from_secs(120)));
///
/// let status_only = HttpClassifier::new().ignore_retry_after();
/// let verdict = Classify::<_, ()>::classify(&status_only, Ok(&res));
/// assert_eq!(verdict.outcome(), Outcome::Failure);
/// assert_eq!(verdict.retry_after(), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpClassifier {
    ignore_retry_after: bool,
}

impl HttpClassifier {
    /// Judges by status, and reads `Retry-After` on 429 and 503.
    pub const fn new() -> Self {
        HttpClassifier {
            ignore_retry_after: false,
        }
    }

    /// Never reads `Retry-After`: the breaker's own open period (its
    /// cooldown and backoff) alone decides when to probe again. For
    /// upstreams that send nonsense there (a fixed hour, a date in
    /// another clock).
    pub const fn ignore_retry_after(mut self) -> Self {
        self.ignore_retry_after = true;
        self
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
    fn classify(&self, result: Result<&Response<B>, &E>) -> Verdict {
        let response = match result {
            Ok(response) => response,
            Err(_) => return Verdict::new(Outcome::Failure),
        };
        let status = response.status();
        let verdict = Verdict::new(Self::outcome(status));
        if self.ignore_retry_after {
            return verdict;
        }
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            if let Some(hint) = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| parse_retry_after(v, SystemTime::now()))
            {
                return verdict.with_retry_after(hint);
            }
        }
        verdict
    }
}

/// Parses a `Retry-After` value: delay-seconds (`"120"`) or an HTTP date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`, and the obsolete RFC 850 and asctime
/// forms), relative to `now`. A date in the past gives zero. Anything else
/// (negative numbers, fractions, garbage) gives `None`; a delay too large to
/// represent saturates, and the breaker caps it by its maximum open period.
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
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim_matches([' ', '\t']);
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: delay-seconds. Saturate rather than fail on overflow.
        let secs = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let at = parse_http_date(text)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the Unix epoch for an HTTP date in any of its three forms.
fn parse_http_date(text: &str) -> Option<u64> {
    let parts: Vec<&str> = text.split_ascii_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [_, day, month, year, time, "GMT"] => (*day, *month, year.parse::<u64>().ok()?, *time),
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        [_, date, time, "GMT"] => {
            let mut fields = date.split('-');
            let (day, month, year) = (fields.next()?, fields.next()?, fields.next()?);
            if fields.next().is_some() || year.len() != 2 {
                return None;
            }
            let yy = year.parse::<u64>().ok()?;
            // RFC 9110: a two-digit year more than 50 years ahead is in the past century.
            (
                day,
                month,
                if yy < 70 { 2000 + yy } else { 1900 + yy },
                *time,
            )
        }
        // asctime: Sun Nov  6 08:49:37 1994
        [_, month, day, time, year] => (*day, *month, year.parse::<u64>().ok()?, *time),
        _ => return None,
    };
    let day = day.parse::<u64>().ok().filter(|d| (1..=31).contains(d))?;
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    if !(1970..=9999).contains(&year) {
        return None;
    }
    let mut hms = time.split(':');
    let mut field = |max: u64| hms.next()?.parse::<u64>().ok().filter(|v| *v <= max);
    let (h, m, s) = (field(23)?, field(59)?, field(60)?);
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (year >= 1970).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
