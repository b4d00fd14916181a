//! Redis key names: escaped breaker names, spread over index shards, each
//! shard under one hash tag, so that a breaker's keys and its shard's
//! index live in one Cluster slot and one script updates both.
//!
//! A breaker's name becomes `%`-escaped text made only of ASCII letters,
//! digits, `.`, `_` and `-` (every other byte as `%XX`), so no name can
//! contain `:`, `{`, `}`, a space or a newline. Escaping is one-to-one, so
//! two names can never share a key, and a name can never reach past its
//! segment into another breaker's or another application's keys.
//!
//! The escaped name picks one of `shards` index shards (FNV-1a, the same
//! in every process and release). Shard `s` of `n` owns the hash tag
//! `{<prefix>:<s>/<n>}`, never empty whatever the name (the empty name
//! included), and its keys:
//!
//! * `<prefix>:{<prefix>:<s>/<n>}:index`: a hash of the shard's breakers
//!   that are open, or whose failure count is not zero;
//! * `<prefix>:{<prefix>:<s>/<n>}:version`: one more on every change of the
//!   index;
//! * `<prefix>:{<prefix>:<s>/<n>}:events`: on a Cluster, the shard's
//!   channel (sharded pub/sub);
//! * `<prefix>:{<prefix>:<s>/<n>}:<escaped>:<part>`: each breaker's own.

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

/// The index shard of the breaker whose escaped name is `escaped`.
pub(crate) fn shard_of(escaped: &str, shards: u16) -> u16 {
    // FNV-1a: stable across processes, platforms and releases, as every
    // instance of a fleet must agree on it.
    let hash = escaped.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % u64::from(shards.max(1))) as u16
}

/// The keys of one index shard.
#[derive(Clone, Debug)]
pub(crate) struct Shard {
    /// Hash: escaped name → the breaker's entry (see the script).
    pub(crate) index: String,
    /// The index's version: one more on every change.
    pub(crate) version: String,
    /// The shard's sharded pub/sub channel (on a Cluster).
    pub(crate) channel: String,
}

/// The start of every key of shard `shard` of `shards`: `<prefix>:{<tag>}`.
fn base(prefix: &str, shard: u16, shards: u16) -> String {
    format!("{prefix}:{{{prefix}:{shard}/{shards}}}")
}

impl Shard {
    pub(crate) fn new(prefix: &str, shard: u16, shards: u16) -> Self {
        let base = base(prefix, shard, shards);
        Shard {
            index: format!("{base}:index"),
            version: format!("{base}:version"),
            channel: format!("{base}:events"),
        }
    }
}

/// The keys of one breaker, in the order the script takes them.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    /// Hash: `gen`, `attempt`, `ok` (probe successes this round).
    pub(crate) record: String,
    /// Exists while the open period runs; its time to live is what is left.
    pub(crate) wait: String,
    /// Exists until `min_open` has passed since the breaker opened.
    pub(crate) min_open: String,
    /// Hash: the fleet's failure count (`n`), and the instances whose
    /// failures it holds.
    pub(crate) failures: String,
    /// Generation counter: one more on every opening.
    pub(crate) generation: String,
    /// The probe lock: the instance that may probe, with a lease.
    pub(crate) probe_lock: String,
    /// Sorted set: instances whose own breaker opened, until when.
    pub(crate) votes: String,
    /// The breaker's shard.
    pub(crate) shard: Shard,
}

impl Keys {
    pub(crate) fn new(prefix: &str, escaped: &str, shards: u16) -> Self {
        let shard = shard_of(escaped, shards);
        let base = base(prefix, shard, shards);
        let key = |part: &str| format!("{base}:{escaped}:{part}");
        Keys {
            record: key("record"),
            wait: key("wait"),
            min_open: key("min_open"),
            failures: key("failures"),
            generation: key("generation"),
            probe_lock: key("probe_lock"),
            votes: key("votes"),
            shard: Shard::new(prefix, shard, shards),
        }
    }

    pub(crate) fn all(&self) -> [&str; 9] {
        [
            &self.record,
            &self.wait,
            &self.min_open,
            &self.failures,
            &self.generation,
            &self.probe_lock,
            &self.votes,
            &self.shard.index,
            &self.shard.version,
        ]
    }
}

/// The channel on which instances announce openings and closings on a
/// single server.
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

    /// The hash tag Redis Cluster reads in `key`: the text between its first
    /// `{` and the next `}`, if that is not empty.
    fn hash_tag(key: &str) -> Option<&str> {
        let open = key.find('{')?;
        let close = key[open + 1..].find('}')?;
        let tag = &key[open + 1..open + 1 + close];
        (!tag.is_empty()).then_some(tag)
    }

    #[test]
    fn every_key_of_a_breaker_shares_its_shards_hash_tag_whatever_its_name() {
        for name in ["p:{q}", "", "{}", "}{", "a b"] {
            let keys = Keys::new("app", &escape(name), 16);
            let tag = hash_tag(&keys.shard.index).expect("a tag");
            assert_eq!(tag, format!("app:{}/16", shard_of(&escape(name), 16)));
            for key in keys.all() {
                assert!(key.starts_with("app:{"), "{key}");
                assert_eq!(hash_tag(key), Some(tag), "{name:?}: {key}");
            }
            assert_eq!(hash_tag(&keys.shard.channel), Some(tag));
        }
    }

    #[test]
    fn names_spread_over_every_shard_and_always_land_in_the_same_one() {
        let mut seen = [0u32; 16];
        for i in 0..1_600 {
            let escaped = escape(&format!("provider-{i}"));
            let shard = shard_of(&escaped, 16);
            assert_eq!(shard, shard_of(&escaped, 16));
            seen[usize::from(shard)] += 1;
        }
        assert!(seen.iter().all(|&n| (50..=150).contains(&n)), "{seen:?}");
        assert_eq!(shard_of("anything", 1), 0);
    }

    #[test]
    fn prefixes_that_would_change_the_hash_tag_are_refused() {
        assert!(check_prefix("app").is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{b").is_err());
        assert!(check_prefix("a b").is_err());
    }
}
