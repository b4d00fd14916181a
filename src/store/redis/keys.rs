//! Redis key names for a breaker: escaped, prefixed, and tagged so that all
//! keys of one breaker hash to one Cluster slot.
//!
//! A breaker's name becomes `%`-escaped text made only of ASCII letters,
//! digits, `.`, `_` and `-` (every other byte as `%XX`), so no name can
//! contain `:`, `{`, `}`, a space or a newline. That text is the key's hash
//! tag: `<prefix>:{<escaped>}:<part>`. Escaping is one-to-one, so two names
//! can never share a key, and a name can never reach past its braces into
//! another breaker's or another application's keys.

use std::fmt::Write as _;

/// The escaped form of a breaker's name.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            out.push(byte as char);
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Whether `prefix` can start key names: non-empty, and without the
/// characters that would change a key's hash tag or split a message.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Err("must not be empty");
    }
    if prefix
        .chars()
        .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err("must not contain `{`, `}`, white space or control characters");
    }
    Ok(())
}

/// The keys of one breaker, in the order the scripts take them.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    /// Hash: `gen`, `attempt`, `ok` (probe successes this round).
    pub(crate) record: String,
    /// Exists while the open period runs; its time to live is what is left.
    pub(crate) wait: String,
    /// Exists until `min_open` has passed since the breaker opened.
    pub(crate) min_open: String,
    /// The fleet's failure count.
    pub(crate) failures: String,
    /// Generation counter: one more on every opening.
    pub(crate) generation: String,
    /// The probe lock: the instance that may probe, with a lease.
    pub(crate) probe_lock: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, escaped: &str) -> Self {
        let key = |part: &str| format!("{prefix}:{{{escaped}}}:{part}");
        Keys {
            record: key("record"),
            wait: key("wait"),
            min_open: key("min_open"),
            failures: key("failures"),
            generation: key("generation"),
            probe_lock: key("probe_lock"),
        }
    }

    pub(crate) fn all(&self) -> [&str; 6] {
        [
            &self.record,
            &self.wait,
            &self.min_open,
            &self.failures,
            &self.generation,
            &self.probe_lock,
        ]
    }
}

/// The channel on which instances announce openings and closings.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:events")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_one_to_one_and_leaves_no_tag_characters() {
        let names = ["a:b", "a%3Ab", "{x}", "a b", "a\nb", "é", "*", ""];
        let escaped: Vec<String> = names.iter().map(|n| escape(n)).collect();
        for (i, e) in escaped.iter().enumerate() {
            assert!(!e.contains([':', '{', '}', ' ', '\n', '*']), "{e}");
            for other in &escaped[i + 1..] {
                assert_ne!(e, other);
            }
        }
        assert_eq!(escape("openai/gpt-4.1_mini"), "openai%2Fgpt-4.1_mini");
    }

    #[test]
    fn every_key_of_a_breaker_carries_its_escaped_name_as_hash_tag() {
        let keys = Keys::new("app", &escape("p:{q}"));
        for key in keys.all() {
            assert!(key.starts_with("app:{p%3A%7Bq%7D}:"), "{key}");
        }
    }

    #[test]
    fn prefixes_that_would_change_the_hash_tag_are_refused() {
        assert!(check_prefix("app").is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{b").is_err());
        assert!(check_prefix("a b").is_err());
    }
}
