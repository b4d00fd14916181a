//! This instance's view of the fleet's open index: per shard, the
//! breakers open or counting failures, as last read, published or
//! answered, and the version it is complete up to.
//!
//! The view is what makes the store's cost follow what changes: a shard
//! whose version has not moved since the view took it in is not read
//! again, and a key attached later learns its state from the view, with no
//! read of its own. Every piece of news carries the shard version it was
//! made at, so that news older than what the view holds (a message that
//! was on its way while the script that answered came back) never
//! overrides it.

use std::collections::HashMap;
use std::sync::Arc;

use redis::Value;
use tokio::time::Instant;

use super::script::control_of;
use crate::millis::millis_up;
use crate::store::fleet::Reply;
use crate::Control;
use std::time::Duration;

/// What the view knows of one breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    Open {
        generation: u64,
        attempt: u32,
        /// When the fleet's open period ends.
        open_until: Instant,
        /// When the fleet forgets the opening, if known.
        kept_until: Option<Instant>,
    },
    /// Closed, with failures counted.
    Counting { failures: u64 },
    /// Closed: kept while older news of the breaker may still come.
    Closed,
    /// Under `!<name>`: an operator's fleet-wide control of the name, made
    /// at shard version `id`.
    Controlled { control: Control, id: u64 },
}

/// How a breaker's state differs from another's, for telling the local
/// breakers only of what changed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Open(u64, u32),
    Counting,
    Closed,
    Controlled(u64),
}

impl Known {
    fn class(self) -> Class {
        match self {
            Known::Open {
                generation,
                attempt,
                ..
            } => Class::Open(generation, attempt),
            Known::Counting { .. } => Class::Counting,
            Known::Closed => Class::Closed,
            Known::Controlled { id, .. } => Class::Controlled(id),
        }
    }

    /// What `reply` tells of the breaker's state, `now`.
    pub(crate) fn of(reply: Reply, now: Instant) -> Known {
        match reply {
            Reply::Closed { failures: 0 } | Reply::Declined { failures: 0 } => Known::Closed,
            Reply::Closed { failures } | Reply::Declined { failures } => {
                Known::Counting { failures }
            }
            Reply::Open {
                generation,
                left_ms,
                attempt,
            } => Known::Open {
                generation,
                attempt,
                open_until: now + Duration::from_millis(left_ms),
                kept_until: None,
            },
            Reply::ProbeWon {
                generation,
                attempt,
            }
            | Reply::ProbeHeld {
                generation,
                attempt,
                ..
            } => Known::Open {
                generation,
                attempt,
                open_until: now,
                kept_until: None,
            },
        }
    }

    /// The breaker's state as a read would give it, `now`.
    fn reply(self, now: Instant) -> Reply {
        match self {
            Known::Open {
                kept_until: Some(kept),
                ..
            } if kept <= now => Reply::Closed { failures: 0 },
            Known::Open {
                generation,
                attempt,
                open_until,
                ..
            } => Reply::Open {
                generation,
                left_ms: millis_up(open_until.saturating_duration_since(now)),
                attempt,
            },
            Known::Counting { failures } => Reply::Closed { failures },
            Known::Closed | Known::Controlled { .. } => Reply::Closed { failures: 0 },
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Stamped {
    /// The shard's version when this was true.
    version: u64,
    known: Known,
}

/// One shard as the view holds it.
#[derive(Default)]
struct ShardView {
    /// The version of the last read; `None` before the first.
    read: Option<u64>,
    /// The view holds every change up to this version: the last read, then
    /// published changes in an unbroken run.
    complete: Option<u64>,
    /// The last version heard published: no older message can come.
    heard: u64,
    entries: HashMap<Arc<str>, Stamped>,
}

/// One shard's index as read: its version, and its entries. A read in
/// pages holds the version of its first page: every change after it is
/// either among the entries (stamped with its own, later, version), or
/// moves the version past the read's, so that the shard is read again.
pub(crate) struct ShardRead {
    pub(crate) version: u64,
    entries: Vec<(Arc<str>, Stamped)>,
    /// Entries that could not be read (another application's data, or
    /// damaged).
    pub(crate) unreadable: u64,
}

/// A version as Redis holds it: absent (0) or a number.
pub(crate) fn version_of(value: &Value) -> Option<u64> {
    match value {
        Value::Nil => Some(0),
        Value::BulkString(bytes) if bytes.is_empty() => Some(0),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

impl ShardRead {
    /// A shard that never changed (its version key does not exist): its
    /// index is empty, without reading it.
    pub(crate) fn empty() -> ShardRead {
        ShardRead {
            version: 0,
            entries: Vec::new(),
            unreadable: 0,
        }
    }

    /// The read script's answer, `{version, now, cursor, name, entry,
    /// ...}`: one page, and the cursor of the next (0: none), with Redis's
    /// times made local from `at` (when the answer came); `None` when it
    /// is not one at all.
    pub(crate) fn parse(value: &Value, at: Instant) -> Option<(ShardRead, u64)> {
        let Value::Array(items) = value else {
            return None;
        };
        let [version, now, cursor, rest @ ..] = items.as_slice() else {
            return None;
        };
        let version = version_of(version)?;
        let number = |value: &Value| -> Option<u64> {
            match value {
                Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
                _ => None,
            }
        };
        let (now, cursor) = (number(now)?, number(cursor)?);
        if rest.len() % 2 != 0 {
            return None;
        }
        let local = |redis_ms: u64| -> Instant {
            match redis_ms.checked_sub(now) {
                Some(ahead) => at + Duration::from_millis(ahead),
                None => at,
            }
        };
        let mut read = ShardRead {
            version,
            entries: Vec::with_capacity(rest.len() / 2),
            unreadable: 0,
        };
        for pair in rest.chunks_exact(2) {
            let (Value::BulkString(name), Value::BulkString(entry)) = (&pair[0], &pair[1]) else {
                read.unreadable += 1;
                continue;
            };
            let parsed = std::str::from_utf8(name)
                .ok()
                .zip(std::str::from_utf8(entry).ok())
                .and_then(|(name, entry)| Some((Arc::from(name), parse_entry(entry, &local)?)));
            match parsed {
                Some(entry) => read.entries.push(entry),
                None => read.unreadable += 1,
            }
        }
        Some((read, cursor))
    }

    /// Adds a later page of the same read.
    pub(crate) fn extend(&mut self, page: ShardRead) {
        self.entries.extend(page.entries);
        self.unreadable += page.unreadable;
    }
}

/// `o <version> <generation> <attempt> <open until> <kept until>`,
/// `c <version> <failures> <until>`, or (under `!<name>`) `x <version>
/// <kind> <until>`.
fn parse_entry(entry: &str, local: &impl Fn(u64) -> Instant) -> Option<Stamped> {
    let mut words = entry.split(' ');
    let kind = words.next()?;
    let version = words.next()?.parse().ok()?;
    if kind == "x" {
        let control = match words.next()? {
            "reset" => Control::Reset,
            kind => control_of(kind)?,
        };
        words.next()?.parse::<u64>().ok()?;
        let known = Known::Controlled {
            control,
            id: version,
        };
        return words.next().is_none().then_some(Stamped { version, known });
    }
    let mut number = || -> Option<u64> { words.next()?.parse().ok() };
    let known = match kind {
        "o" => Known::Open {
            generation: number()?,
            attempt: u32::try_from(number()?).ok()?,
            open_until: local(number()?),
            kept_until: Some(local(number()?)),
        },
        "c" => {
            let failures = number()?;
            number()?;
            Known::Counting { failures }
        }
        _ => return None,
    };
    words.next().is_none().then_some(Stamped { version, known })
}

/// The index field of `escaped`'s fleet-wide control.
pub(crate) fn control_field(escaped: &str) -> String {
    format!("!{escaped}")
}

/// The name whose control `field` is, if it is a control's field.
pub(crate) fn controlled_name(field: &str) -> Option<&str> {
    field.strip_prefix('!')
}

/// The view: one [`ShardView`] per shard.
pub(crate) struct View {
    shards: Vec<ShardView>,
}

impl View {
    pub(crate) fn new(shards: u16) -> Self {
        View {
            shards: (0..shards.max(1)).map(|_| ShardView::default()).collect(),
        }
    }

    /// Forgets everything: every shard will be read again.
    pub(crate) fn clear(&mut self) {
        for shard in &mut self.shards {
            *shard = ShardView::default();
        }
    }

    /// Whether `shard` has been read since the view was made or cleared.
    pub(crate) fn has_read(&self, shard: u16) -> bool {
        self.shard(shard).is_some_and(|s| s.read.is_some())
    }

    /// Forgets what `shard` held: it will be read again.
    pub(crate) fn clear_shard(&mut self, shard: u16) {
        if let Some(s) = self.shards.get_mut(usize::from(shard)) {
            *s = ShardView::default();
        }
    }

    /// Whether the view of `shard` lacks changes, Redis's version being
    /// `version`.
    pub(crate) fn is_behind(&self, shard: u16, version: u64) -> bool {
        self.shard(shard)
            .is_none_or(|s| s.complete != Some(version))
    }

    fn shard(&self, shard: u16) -> Option<&ShardView> {
        self.shards.get(usize::from(shard))
    }

    /// The state of `escaped` (in `shard`) as the view knows it, `now`.
    pub(crate) fn reply(&self, shard: u16, escaped: &str, now: Instant) -> Reply {
        self.shard(shard)
            .and_then(|s| s.entries.get(escaped))
            .map_or(Reply::Closed { failures: 0 }, |e| e.known.reply(now))
    }

    /// The fleet-wide control of `escaped` (in `shard`) as the view knows
    /// it: the shard version that made it, and what it is.
    pub(crate) fn control(&self, shard: u16, escaped: &str) -> Option<(u64, Control)> {
        let entry = self
            .shard(shard)?
            .entries
            .get(control_field(escaped).as_str())?;
        match entry.known {
            Known::Controlled { control, id } => Some((id, control)),
            _ => None,
        }
    }

    /// Takes in `known` of `escaped`, true at `version`, unless the view
    /// holds newer news; returns whether what the breakers should know of
    /// it changed.
    pub(crate) fn learn(&mut self, shard: u16, escaped: &str, version: u64, known: Known) -> bool {
        let Some(view) = self.shards.get_mut(usize::from(shard)) else {
            return false;
        };
        let before = match view.entries.get(escaped) {
            Some(e) if e.version > version => return false,
            Some(e) => e.known.class(),
            // What the last read included, it holds already.
            None if view.read.is_some_and(|read| version <= read) => return false,
            None => Class::Closed,
        };
        let key = match view.entries.get_key_value(escaped) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(escaped),
        };
        view.entries.insert(key, Stamped { version, known });
        before != known.class()
    }

    /// A published change of `shard`, at `version`.
    pub(crate) fn heard(&mut self, shard: u16, escaped: &str, version: u64, known: Known) -> bool {
        let changed = self.learn(shard, escaped, version, known);
        if let Some(view) = self.shards.get_mut(usize::from(shard)) {
            view.heard = view.heard.max(version);
            if view
                .complete
                .is_some_and(|v| v.checked_add(1) == Some(version))
            {
                view.complete = Some(version);
            }
        }
        changed
    }

    /// Takes in a read of `shard`; returns the breakers whose state, as the
    /// local breakers should know it, changed.
    pub(crate) fn install(&mut self, shard: u16, read: ShardRead) -> Vec<Arc<str>> {
        let Some(view) = self.shards.get_mut(usize::from(shard)) else {
            return Vec::new();
        };
        let mut old = std::mem::take(&mut view.entries);
        let mut changed = Vec::new();
        for (name, stamped) in read.entries {
            let entry = match old.remove(&name) {
                // Newer than the read: the view's stands.
                Some(mine) if mine.version > read.version => mine,
                Some(mine) => {
                    if mine.known.class() != stamped.known.class() {
                        changed.push(Arc::clone(&name));
                    }
                    stamped
                }
                None => {
                    if stamped.known.class() != Class::Closed {
                        changed.push(Arc::clone(&name));
                    }
                    stamped
                }
            };
            view.entries.insert(name, entry);
        }
        // What the read does not list is closed, unless the view knows of
        // it from later.
        for (name, mine) in old {
            if mine.version > read.version {
                view.entries.insert(name, mine);
            } else if mine.known.class() != Class::Closed {
                changed.push(name);
            }
        }
        view.read = Some(read.version);
        view.complete = Some(read.version);
        view.entries
            .retain(|_, e| e.known != Known::Closed || e.version > read.version);
        changed
    }

    /// Forgets closed breakers no older news can come of: every shard's
    /// channel has carried a later change, or a later read took them in.
    pub(crate) fn prune(&mut self) {
        for view in &mut self.shards {
            let settled = view.heard.max(view.read.unwrap_or(0));
            view.entries
                .retain(|_, e| e.known != Known::Closed || e.version > settled);
        }
    }

    /// Every breaker the view holds open, with its shard.
    pub(crate) fn open(&self) -> impl Iterator<Item = (u16, &Arc<str>)> + '_ {
        self.shards.iter().enumerate().flat_map(|(shard, view)| {
            view.entries
                .iter()
                .filter(|(_, e)| matches!(e.known, Known::Open { .. }))
                .map(move |(name, _)| (shard as u16, name))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn read(version: u64, entries: &[(&str, &str)]) -> ShardRead {
        page(version, 0, entries).0
    }

    fn page(version: u64, cursor: u64, entries: &[(&str, &str)]) -> (ShardRead, u64) {
        let mut items = vec![
            bulk(&version.to_string()),
            bulk("1000000"),
            bulk(&cursor.to_string()),
        ];
        for (name, entry) in entries {
            items.push(bulk(name));
            items.push(bulk(entry));
        }
        ShardRead::parse(&Value::Array(items), Instant::now()).expect("a read")
    }

    #[test]
    fn a_read_tells_of_what_changed_and_only_that() {
        let mut view = View::new(1);
        assert!(view.is_behind(0, 0), "never read");
        let changed = view.install(
            0,
            read(
                5,
                &[("a", "o 5 7 0 1000300 1060000"), ("b", "c 3 2 1060000")],
            ),
        );
        assert_eq!(changed.len(), 2);
        assert!(!view.is_behind(0, 5));
        let now = Instant::now();
        assert!(matches!(
            view.reply(0, "a", now),
            Reply::Open {
                generation: 7,
                left_ms: 1..=300,
                attempt: 0
            }
        ));
        assert_eq!(view.reply(0, "b", now), Reply::Closed { failures: 2 });
        assert_eq!(view.reply(0, "c", now), Reply::Closed { failures: 0 });
        // The same state again at a later version: nothing to tell; `a`
        // closed: that.
        let changed = view.install(0, read(7, &[("b", "c 6 3 1060000")]));
        assert_eq!(changed, vec![Arc::from("a")]);
    }

    #[test]
    fn older_news_never_overrides_newer() {
        let mut view = View::new(1);
        view.install(0, read(10, &[("a", "o 10 7 0 1000300 1060000")]));
        let now = Instant::now();
        // The probe that closed `a` answered at version 12...
        assert!(view.learn(0, "a", 12, Known::of(Reply::Closed { failures: 0 }, now)));
        // ...before the message of its reopening at 11 came: stale.
        let reopened = Known::of(
            Reply::Open {
                generation: 8,
                left_ms: 300,
                attempt: 1,
            },
            now,
        );
        assert!(!view.heard(0, "a", 11, reopened));
        assert_eq!(view.reply(0, "a", now), Reply::Closed { failures: 0 });
        // A read made before the closing does not bring it back either.
        view.install(0, read(11, &[("a", "o 11 8 1 1000300 1060000")]));
        assert_eq!(view.reply(0, "a", now), Reply::Closed { failures: 0 });
        // Once a read covers the closing, its mark is gone.
        view.install(0, read(12, &[]));
        assert!(view.shards[0].entries.is_empty());
    }

    #[test]
    fn published_changes_in_an_unbroken_run_keep_the_view_complete() {
        let mut view = View::new(1);
        view.install(0, read(3, &[]));
        let open = Known::of(
            Reply::Open {
                generation: 1,
                left_ms: 100,
                attempt: 0,
            },
            Instant::now(),
        );
        assert!(view.heard(0, "a", 4, open));
        assert!(!view.is_behind(0, 4), "4 follows 3");
        // A change nobody published (a count) in between: behind.
        view.heard(0, "b", 6, open);
        assert!(view.is_behind(0, 6));
        assert!(view.open().count() == 2);
    }

    #[test]
    fn a_control_is_read_under_its_field_and_gone_once_a_read_lacks_it() {
        let mut view = View::new(1);
        let changed = view.install(
            0,
            read(
                4,
                &[
                    ("!a", "x 3 open 9999999999"),
                    ("a", "c 2 1 1060000"),
                    ("!b", "x 4 reset 1060000"),
                ],
            ),
        );
        assert_eq!(changed.len(), 3);
        assert_eq!(view.control(0, "a"), Some((3, Control::ForceOpen(None))));
        assert_eq!(view.control(0, "b"), Some((4, Control::Reset)));
        assert_eq!(view.control(0, "c"), None);
        // The name's own entry is apart from its control.
        assert_eq!(
            view.reply(0, "a", Instant::now()),
            Reply::Closed { failures: 1 }
        );
        // Restored: the next read lacks it.
        let changed = view.install(0, read(6, &[("a", "c 2 1 1060000")]));
        assert_eq!(changed.len(), 2, "{changed:?}");
        assert_eq!(view.control(0, "a"), None);
        assert_eq!(controlled_name("!a"), Some("a"));
        assert_eq!(controlled_name("a"), None);
    }

    #[test]
    fn unreadable_entries_are_counted_and_skipped() {
        let r = read(2, &[("a", "o 2 x"), ("b", "z 2"), ("c", "c 2 1 1060000")]);
        assert_eq!(r.unreadable, 2);
        assert_eq!(r.entries.len(), 1);
        assert!(ShardRead::parse(&Value::Okay, Instant::now()).is_none());
        assert!(ShardRead::parse(&Value::Array(vec![bulk("1")]), Instant::now()).is_none());
        let no_cursor = Value::Array(vec![bulk("1"), bulk("1000000"), bulk("x")]);
        assert!(ShardRead::parse(&no_cursor, Instant::now()).is_none());
    }

    #[test]
    fn a_read_in_pages_holds_its_first_pages_version_and_every_page() {
        let (mut first, cursor) = page(5, 17, &[("a", "o 5 7 0 1000300 1060000")]);
        assert_eq!(cursor, 17, "more to come");
        // A change made while the pages were read comes with its own,
        // later, version.
        let (second, cursor) = page(6, 0, &[("b", "c 6 2 1060000")]);
        assert_eq!(cursor, 0, "the last page");
        first.extend(second);
        let mut view = View::new(1);
        let changed = view.install(0, first);
        assert_eq!(changed.len(), 2);
        // The read stands for version 5: the shard, now at 6, is read
        // again.
        assert!(view.is_behind(0, 6));
        assert!(!view.is_behind(0, 5));
        assert_eq!(
            view.reply(0, "b", Instant::now()),
            Reply::Closed { failures: 2 }
        );
    }
}
