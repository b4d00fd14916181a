//! `Retry-After` as RFC 9110 writes it: explicit cases, and generated
//! dates checked against `httpdate` (a maintained parser of HTTP dates).

use crate::common::paused;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use proptest::prelude::*;
use tower_circuit_breaker::classify::parse_retry_after;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    parse_retry_after(&HeaderValue::from_str(value).unwrap(), now)
}

/// 2025-01-01 00:00:00 GMT.
const NEW_YEAR_2025: u64 = 1_735_689_600;

#[test]
fn an_rfc850_year_more_than_50_years_ahead_is_in_the_past_century() {
    let now = at(NEW_YEAR_2025);
    // 06-Nov-70 is 2070 (45 years ahead), a Thursday; not 1970.
    let in_2070 = 3_182_489_377 - NEW_YEAR_2025;
    assert_eq!(
        parse("Thursday, 06-Nov-70 08:49:37 GMT", now),
        Some(Duration::from_secs(in_2070))
    );
    assert_eq!(
        parse("Friday, 06-Nov-70 08:49:37 GMT", now),
        None,
        "1970's weekday: the date is read as 2070"
    );
    // 06-Nov-94 is 1994 (2094 would be 69 years ahead): in the past.
    assert_eq!(
        parse("Sunday, 06-Nov-94 08:49:37 GMT", now),
        Some(Duration::ZERO)
    );
}

#[test]
fn an_rfc850_date_exactly_50_years_ahead_is_still_ahead() {
    // 2025-06-01 12:00:00 GMT; 50 years on is a Saturday.
    let now = at(1_748_779_200);
    let fifty_years = 3_326_616_000 - 1_748_779_200;
    assert_eq!(
        parse("Saturday, 01-Jun-75 12:00:00 GMT", now),
        Some(Duration::from_secs(fifty_years))
    );
    // A second more is more than 50 years ahead: 1975, a Sunday.
    assert_eq!(
        parse("Sunday, 01-Jun-75 12:00:01 GMT", now),
        Some(Duration::ZERO)
    );
    assert_eq!(parse("Saturday, 01-Jun-75 12:00:01 GMT", now), None);
}

#[test]
fn dates_that_do_not_exist_are_refused() {
    let now = at(0);
    for value in [
        // 31 February, 29 February of a common year, of 2100.
        "Wed, 31 Feb 2027 00:00:00 GMT",
        "Sat, 29 Feb 2027 00:00:00 GMT",
        "Mon, 29 Feb 2100 00:00:00 GMT",
        "Wed, 31 Apr 2027 00:00:00 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 32 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:60 GMT", // a leap second only ends a day
        "Wednesday, 31-Feb-27 00:00:00 GMT",
        "Wed Feb 31 00:00:00 2027",
    ] {
        assert_eq!(parse(value, now), None, "{value}");
    }
    for value in [
        "Thu, 29 Feb 2024 00:00:00 GMT",
        "Tue, 29 Feb 2000 00:00:00 GMT",
    ] {
        assert!(parse(value, now).is_some(), "{value}");
    }
}

#[test]
fn the_weekday_must_be_the_dates_own() {
    let now = at(784_111_777 - 10); // Sun, 06 Nov 1994 08:49:27 GMT
    for (right, wrong) in [
        (
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
        ),
        (
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Saturday, 06-Nov-94 08:49:37 GMT",
        ),
        ("Sun Nov  6 08:49:37 1994", "Wed Nov  6 08:49:37 1994"),
    ] {
        assert_eq!(parse(right, now), Some(Duration::from_secs(10)), "{right}");
        assert_eq!(parse(wrong, now), None, "{wrong}");
    }
}

#[test]
fn every_field_has_its_exact_width_and_case() {
    let now = at(0);
    for value in [
        "Sun, +6 Nov 1994 08:49:37 GMT",
        "Sun,  6 Nov 1994 08:49:37 GMT",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 Nov 01994 08:49:37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37 gmt",
        "sun, 06 nov 1994 08:49:37 GMT",
        "SUN, 06 NOV 1994 08:49:37 GMT",
        "Sun,  06 Nov 1994 08:49:37 GMT",
        "Sun, 06  Nov 1994 08:49:37 GMT",
        "Sun,\t06 Nov 1994 08:49:37 GMT",
        "Sunday, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sunday, +6-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT GMT",
        "Sunday, 06-Nov-94 08:49:37GMT",
        "Sun Nov +6 08:49:37 1994",
        "Sun Nov 6 08:49:37 1994",
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 08:49:37 1994 GMT",
        "Sun Nov  6 08:49:37  1994",
    ] {
        assert_eq!(parse(value, now), None, "{value:?}");
    }
    // Spaces and tabs around the value are not part of it.
    assert!(parse(" \tSun, 06 Nov 1994 08:49:37 GMT\t ", now).is_some());
    // asctime's day: a space and a digit, or two digits.
    assert_eq!(
        parse("Sun Nov 06 08:49:37 1994", now),
        parse("Sun Nov  6 08:49:37 1994", now)
    );
}

#[test]
fn a_leap_second_is_the_next_midnight() {
    let now = at(0);
    let midnight = parse("Sun, 01 Jan 2017 00:00:00 GMT", now);
    assert!(midnight.is_some());
    assert_eq!(parse("Sat, 31 Dec 2016 23:59:60 GMT", now), midnight);
}

#[test]
fn a_date_before_1970_is_in_the_past() {
    assert_eq!(
        parse("Sun, 20 Jul 1969 20:17:40 GMT", at(NEW_YEAR_2025)),
        Some(Duration::ZERO)
    );
    // Before the epoch, `now` still reads dates: a day before it, the epoch
    // is a day away.
    let day_before = UNIX_EPOCH - Duration::from_secs(86_400);
    assert_eq!(
        parse("Thu, 01 Jan 1970 00:00:00 GMT", day_before),
        Some(Duration::from_secs(86_400))
    );
}

/// The last second of 9999.
const END_OF_9999: u64 = 253_402_300_799;

/// Seconds in 49 years, a margin inside the RFC 850 window's 50.
const FORTY_NINE_YEARS: u64 = 49 * 365 * 86_400;

/// The three forms of the instant `secs`, built from httpdate's
/// IMF-fixdate: (IMF-fixdate, RFC 850, asctime with a padded day, asctime
/// with two digits).
fn forms(secs: u64) -> (String, String, String, String) {
    let imf = httpdate::fmt_http_date(at(secs));
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let (weekday, day, month, year, time) = (
        &imf[0..3],
        &imf[5..7],
        &imf[8..11],
        &imf[12..16],
        &imf[17..25],
    );
    let long = match weekday {
        "Sun" => "Sunday",
        "Mon" => "Monday",
        "Tue" => "Tuesday",
        "Wed" => "Wednesday",
        "Thu" => "Thursday",
        "Fri" => "Friday",
        _ => "Saturday",
    };
    let rfc850 = format!("{long}, {day}-{month}-{} {time} GMT", &year[2..]);
    let padded = day.replacen('0', " ", usize::from(day.starts_with('0')));
    let asctime = format!("{weekday} {month} {padded} {time} {year}");
    let asctime_two_digits = format!("{weekday} {month} {day} {time} {year}");
    (imf, rfc850, asctime, asctime_two_digits)
}

/// httpdate's wait for `value` from `now`: the reference.
fn reference(value: &str, now: SystemTime) -> Option<Duration> {
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What RFC 9110 reads in `value` where httpdate reads nothing: a year
/// before 1970, or a leap second.
enum BeyondHttpdate {
    Before1970,
    LeapSecond,
}

fn beyond_httpdate(value: &str) -> Option<BeyondHttpdate> {
    let year = match value.len() {
        29 => value.get(12..16),
        24 => value.get(20..24),
        _ => None,
    };
    if year
        .and_then(|y| y.parse::<u16>().ok())
        .is_some_and(|y| y < 1970)
    {
        Some(BeyondHttpdate::Before1970)
    } else if value.contains("23:59:60") {
        Some(BeyondHttpdate::LeapSecond)
    } else {
        None
    }
}

proptest! {
    #![proptest_config(paused::proptest_config(2_000))]

    /// Every instant from 1970 to 9999, in IMF-fixdate and asctime, reads
    /// as httpdate reads it, from any `now`.
    #[test]
    fn imf_fixdate_and_asctime_agree_with_httpdate(
        secs in 0..=END_OF_9999,
        now in 0..=END_OF_9999,
    ) {
        let now = at(now);
        let (imf, _, asctime, asctime_two_digits) = forms(secs);
        for value in [&imf, &asctime, &asctime_two_digits] {
            let expected = reference(value, now);
            prop_assert!(expected.is_some(), "httpdate reads {:?}", value);
            prop_assert_eq!(parse(value, now), expected, "{:?}", value);
        }
    }

    /// An RFC 850 date less than 49 years either side of `now` reads as the
    /// very instant it was written from (whichever century that is), which
    /// is what httpdate reads from its IMF-fixdate.
    #[test]
    fn rfc850_dates_within_the_window_agree_with_httpdate(
        now in 50 * 366 * 86_400..=END_OF_9999 - 50 * 366 * 86_400,
        offset in 0..2 * FORTY_NINE_YEARS,
    ) {
        let secs = now - FORTY_NINE_YEARS + offset;
        let now = at(now);
        let (imf, rfc850, _, _) = forms(secs);
        prop_assert_eq!(parse(&rfc850, now), reference(&imf, now), "{:?}", rfc850);
    }

    /// A date with one byte changed reads as httpdate reads it: the same
    /// wait, or refused by both. httpdate reads neither years before 1970
    /// nor leap seconds, which RFC 9110 allows: such a date is in the past,
    /// and a leap second is a second after 23:59:59.
    #[test]
    fn a_changed_byte_reads_as_httpdate_reads_it(
        secs in 0..=END_OF_9999,
        now in 0..=END_OF_9999,
        asctime in any::<bool>(),
        position in 0..29usize,
        byte in 0x20u8..0x7f,
    ) {
        let now = at(now);
        let (imf, _, padded, _) = forms(secs);
        let mut value = if asctime { padded } else { imf }.into_bytes();
        let position = position % value.len();
        value[position] = byte;
        let value = String::from_utf8(value).expect("ASCII");
        let ours = parse(&value, now);
        match beyond_httpdate(&value) {
            Some(BeyondHttpdate::Before1970) => {
                prop_assert!(ours.is_none() || ours == Some(Duration::ZERO), "{:?}", value);
            }
            Some(BeyondHttpdate::LeapSecond) => {
                let last_second = value.replace("23:59:60", "23:59:59");
                let expected = httpdate::parse_http_date(&last_second).ok().map(|at| {
                    let leap = at + Duration::from_secs(1);
                    leap.duration_since(now).unwrap_or(Duration::ZERO)
                });
                prop_assert_eq!(ours, expected, "{:?}", value);
            }
            None => prop_assert_eq!(ours, reference(&value, now), "{:?}", value),
        }
    }

    /// A weekday other than the date's own is refused, in every form.
    #[test]
    fn a_wrong_weekday_is_refused(secs in 0..=END_OF_9999, shift in 1..7usize) {
        const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
        let (imf, rfc850, asctime, _) = forms(secs);
        let own = DAYS.iter().position(|d| imf.starts_with(d)).expect("a weekday");
        let other = DAYS[(own + shift) % 7];
        let now = at(secs);
        prop_assert_eq!(parse(&format!("{other}{}", &imf[3..]), now), None);
        prop_assert_eq!(parse(&format!("{other}{}", &asctime[3..]), now), None);
        let comma = rfc850.find(',').expect("a comma");
        let long = match other {
            "Sun" => "Sunday",
            "Mon" => "Monday",
            "Tue" => "Tuesday",
            "Wed" => "Wednesday",
            "Thu" => "Thursday",
            "Fri" => "Friday",
            _ => "Saturday",
        };
        prop_assert_eq!(parse(&format!("{long}{}", &rfc850[comma..]), now), None);
    }
}
