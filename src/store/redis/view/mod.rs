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
//!
//! By job: the view and its shards here; `known` (what the view knows of
//! one breaker, stamped with the shard version it was true at), `read`
//! (a shard's index as the read script gives it, and its entries' text).

mod known;
mod read;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use crate::store::fleet::Reply;
use crate::Control;
pub(crate) use known::Known;
use known::{Class, Stamped};
pub(crate) use read::{control_field, controlled_name, version_of, ShardRead};

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
