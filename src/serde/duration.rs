//! Human durations: `"30s"`, `"250ms"`, `"5m"`, `"1h"`, `"1m30s"`.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Units from the largest to the smallest, with their length in
/// milliseconds. A duration names each at most once, largest first.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Parses a duration written as whole numbers with units, largest unit
/// first: `"30s"`, `"250ms"`, `"5m"`, `"1h"`, `"1m30s"`, `"2d"`.
///
/// The grammar is strict so that a typo never becomes a silently different
/// value: a number without a unit (`"30"`), a sign (`"-5s"`), a fraction
/// (`"1.5s"`), spaces, an unknown unit (`"5x"`), a unit given twice or out
/// of order (`"30s1m"`), and a value past `u64::MAX` milliseconds are all
/// errors that say what is wrong.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::serialization::parse_duration;
///
/// assert_eq!(parse_duration("1m30s")?, Duration::from_secs(90));
/// assert_eq!(parse_duration("250ms")?, Duration::from_millis(250));
/// assert!(parse_duration("30").is_err(), "a unit is required");
/// assert!(parse_duration("-5s").is_err());
/// # Ok::<_, tower_circuit_breaker::serialization::DurationError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let fail = |problem: String| DurationError {
        input: text.to_string(),
        problem,
    };
    if text.is_empty() {
        return Err(fail("is empty".into()));
    }
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut total_ms: u64 = 0;
    // Index into UNITS of the last unit seen: the next must be smaller.
    let mut last_unit: Option<usize> = None;
    while pos < bytes.len() {
        let digits_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos == digits_start {
            return Err(fail(match bytes[pos] {
                b'-' => "must not be negative".into(),
                b'+' => "must not have a sign".into(),
                c if c.is_ascii_whitespace() => "must not contain spaces".into(),
                _ => format!("has no number before `{}`", rest(text, pos)),
            }));
        }
        let digits = &text[digits_start..pos];
        let unit_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
            pos += 1;
        }
        let unit = &text[unit_start..pos];
        if unit.is_empty() {
            return Err(fail(match bytes.get(pos) {
                None => format!("has no unit after {digits} (write {digits}s or {digits}ms)"),
                Some(b'.') | Some(b',') => {
                    "must use whole numbers (write 1500ms rather than 1.5s)".into()
                }
                Some(c) if c.is_ascii_whitespace() => "must not contain spaces".into(),
                Some(_) => format!("has an unexpected `{}`", rest(text, pos)),
            }));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(fail(format!(
                "has an unknown unit `{unit}` (expected d, h, m, s or ms)"
            )));
        };
        if last_unit.is_some_and(|last| index <= last) {
            return Err(fail(format!(
                "names `{unit}` out of order (largest unit first, each once, as in 1m30s)"
            )));
        }
        last_unit = Some(index);
        let too_large = || fail("is too large".into());
        let value: u64 = digits.parse().map_err(|_| too_large())?;
        total_ms = value
            .checked_mul(UNITS[index].1)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(too_large)?;
    }
    Ok(Duration::from_millis(total_ms))
}

/// The text from `pos` on, for error messages: the first character only.
fn rest(text: &str, pos: usize) -> &str {
    let end = text[pos..]
        .char_indices()
        .nth(1)
        .map_or(text.len(), |(i, _)| pos + i);
    &text[pos..end]
}

/// A duration string that [`parse_duration`] rejected, with what is wrong
/// with it.
///
/// ```
/// use tower_circuit_breaker::serialization::parse_duration;
///
/// let err = parse_duration("5x").unwrap_err();
/// assert_eq!(err.input(), "5x");
/// assert!(err.to_string().contains("unknown unit `x`"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationError {
    input: String,
    problem: String,
}

impl DurationError {
    /// The text that was parsed.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What is wrong with it, such as `is too large`.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "duration {:?} {}", self.input, self.problem)
    }
}

impl Error for DurationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_combinations() {
        let ms = |text| parse_duration(text).map(|d| d.as_millis());
        assert_eq!(ms("0s"), Ok(0));
        assert_eq!(ms("250ms"), Ok(250));
        assert_eq!(ms("30s"), Ok(30_000));
        assert_eq!(ms("5m"), Ok(300_000));
        assert_eq!(ms("1h"), Ok(3_600_000));
        assert_eq!(ms("2d"), Ok(172_800_000));
        assert_eq!(ms("1m30s"), Ok(90_000));
        assert_eq!(ms("1h2m3s4ms"), Ok(3_723_004));
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        let problem = |text| parse_duration(text).unwrap_err().problem().to_string();
        assert_eq!(problem(""), "is empty");
        assert!(problem("30").contains("no unit after 30"));
        assert!(problem("-5s").contains("negative"));
        assert!(problem("+5s").contains("sign"));
        assert!(problem("5x").contains("unknown unit `x`"));
        assert!(problem("5S").contains("unknown unit `S`"));
        assert!(problem("1.5s").contains("whole numbers"));
        assert!(problem("5 s").contains("spaces"));
        assert!(problem(" 5s").contains("spaces"));
        assert!(problem("s").contains("no number before `s`"));
        assert!(problem("30s1m").contains("out of order"));
        assert!(problem("1s1s").contains("out of order"));
        assert!(problem("5sé").contains("no number before `é`"));
        assert_eq!(problem("99999999999999999999s"), "is too large");
        assert_eq!(problem("18446744073709551615s"), "is too large");
        assert_eq!(problem("213503982334d1000000s"), "is too large");
    }
}
