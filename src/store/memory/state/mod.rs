//! The fleet's state in memory, and the operations on it: what the Redis
//! store keeps in Redis keys and decides in its script, kept here per name
//! and decided under one lock.
//!
//! Each name has a [`Record`] whose parts expire as the Redis keys of that
//! name do (the opening, its open period, `min_open`, the failure count,
//! the probe lock), on tokio's clock. Every operation answers the calling
//! instance with a [`Reply`], exactly as the script would, and tells every
//! other instance what changed (an opening, a closing, a new failure
//! count): what pub/sub and the index do for Redis, here at once and
//! in order.
//!
//! By job: the fleet, its instances and the news they hear here; `record`
//! (one name's record and the expiry of its parts), `operate` (one
//! instance's write on a record, as the script decides it), `control` (an
//! operator's fleet-wide control, and the fleet's state of a name as an
//! operator reads it).

mod control;
mod operate;
mod record;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc::{UnboundedReceiver, WeakUnboundedSender};
use tokio::time::Instant;

use crate::breaker::shared::Shared;
use crate::store::fleet::{settle, Reply, Write};
use crate::Control;
use operate::operate;
use record::Record;

/// Which instance of the fleet: the probe lock's holder, and whom news
/// goes to. A new one for every instance made.
pub(crate) type InstanceId = u64;

/// Whose failures count toward a quorum: an instance's name when it has
/// one (the same after it restarts), else an identity of its own.
pub(crate) type VoterId = u64;

/// The instance an operation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) instance: InstanceId,
    pub(crate) voter: VoterId,
}

/// What an instance's task takes in, in the order the fleet decided it.
pub(crate) enum News {
    /// A breaker attached on this instance, and the fleet's state of its
    /// name when it was, with the control in force.
    Attached {
        key: Arc<str>,
        breaker: Weak<Shared>,
        state: Reply,
        control: Option<(u64, Control)>,
    },
    /// The fleet's answer to this instance, or the fleet's new state of a
    /// name another instance changed.
    Reply { key: Arc<str>, reply: Reply },
    /// Another instance's probe closed fleet generation `generation`.
    Closed { key: Arc<str>, generation: u64 },
    /// An operator's fleet-wide control of the name is now `control`: the
    /// change that made it, and what it is (`None`: restored).
    Controlled {
        key: Arc<str>,
        control: Option<(u64, Control)>,
    },
}

/// The state of a whole fleet: every name's record, and the instances to
/// tell of changes.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    records: HashMap<Arc<str>, Record>,
    /// Held weakly: an instance whose handles are all gone stops hearing,
    /// and its task ends.
    instances: Vec<(InstanceId, WeakUnboundedSender<News>)>,
    /// Fleet generations come from one counter, so they never repeat
    /// whatever the fleet forgets.
    last_generation: u64,
    last_instance: InstanceId,
    /// The voters of named instances, by name; unnamed ones take the next
    /// number after `last_voter`.
    voters: HashMap<Arc<str>, VoterId>,
    last_voter: VoterId,
    /// Each instance's name in the fleet's state as an operator reads it.
    names: HashMap<InstanceId, String>,
    /// Operators' controls come from one counter: each is told apart
    /// from the one before.
    last_control: u64,
    /// Records when expired ones were last swept out.
    swept_at: usize,
}

/// What changed, for the other instances.
#[derive(Clone, Copy)]
enum Change {
    Opened(Reply),
    Closed(u64),
    Count(u64),
    Controlled(Option<(u64, Control)>),
}

impl Fleet {
    /// A new instance, told of changes through `inbox`. Named, its
    /// failures count toward a quorum under that name, as those of any
    /// earlier instance of that name do.
    pub(crate) fn join(&mut self, inbox: WeakUnboundedSender<News>, name: Option<&str>) -> Caller {
        self.last_instance += 1;
        self.instances.push((self.last_instance, inbox));
        let voter = match name {
            Some(name) => match self.voters.get(name) {
                Some(&voter) => voter,
                None => {
                    self.last_voter += 1;
                    self.voters.insert(Arc::from(name), self.last_voter);
                    self.last_voter
                }
            },
            None => {
                self.last_voter += 1;
                self.last_voter
            }
        };
        let instance = self.last_instance;
        self.names.insert(
            instance,
            match name {
                Some(name) => format!("{name}/{instance}"),
                None => instance.to_string(),
            },
        );
        Caller { instance, voter }
    }

    /// The name of `instance`, as [`Fleet::inspect`] gives it.
    pub(crate) fn name_of(&self, instance: InstanceId) -> String {
        self.names
            .get(&instance)
            .cloned()
            .unwrap_or_else(|| instance.to_string())
    }

    /// The voter's name: its instances' name when they have one, else its
    /// number.
    fn voter_name(&self, voter: VoterId) -> String {
        self.voters
            .iter()
            .find(|(_, v)| **v == voter)
            .map_or_else(|| voter.to_string(), |(name, _)| name.to_string())
    }

    /// The fleet's state of `key` (as the Redis store's bulk read gives it).
    pub(crate) fn read(&mut self, key: &str, now: Instant) -> Reply {
        match self.records.get_mut(key) {
            None => Reply::Closed { failures: 0 },
            Some(record) => {
                record.expire(now);
                record.state(now)
            }
        }
    }

    /// The failure count of `key`.
    pub(crate) fn failures(&mut self, key: &str, now: Instant) -> u64 {
        match self.read(key, now) {
            Reply::Closed { failures } => failures,
            _ => 0,
        }
    }

    /// Carries out `writes` for instance `from`, in order. Returns, in the
    /// order the fleet decided them, what `inbox` (that instance's) held
    /// before and the answers: applied in that order, nothing the instance
    /// hears is older than what it heard before.
    pub(crate) fn exchange(
        &mut self,
        from: Caller,
        inbox: &mut UnboundedReceiver<News>,
        writes: &[Write],
        now: Instant,
    ) -> Vec<News> {
        let mut news = Vec::with_capacity(writes.len());
        while let Ok(earlier) = inbox.try_recv() {
            news.push(earlier);
        }
        let replies = writes
            .iter()
            .map(|write| (Arc::clone(&write.key), self.carry_out(from, write, now)))
            .collect();
        for (key, reply) in settle(replies) {
            news.push(News::Reply { key, reply });
        }
        self.sweep(now);
        news
    }

    fn carry_out(&mut self, from: Caller, write: &Write, now: Instant) -> Reply {
        let record = self.records.entry(Arc::clone(&write.key)).or_default();
        record.expire(now);
        let (reply, change) = operate(record, &mut self.last_generation, from, write, now);
        if record.is_empty() {
            self.records.remove(&write.key);
        }
        if let Some(change) = change {
            self.announce(from.instance, &write.key, change);
        }
        reply
    }

    /// Tells every instance but `from` of `change`, forgetting instances
    /// that are gone.
    fn announce(&mut self, from: InstanceId, key: &Arc<str>, change: Change) {
        self.instances.retain(|(id, inbox)| {
            let Some(inbox) = inbox.upgrade() else {
                return false;
            };
            if *id != from {
                let key = Arc::clone(key);
                let news = match change {
                    Change::Opened(reply) => News::Reply { key, reply },
                    Change::Count(failures) => News::Reply {
                        key,
                        reply: Reply::Closed { failures },
                    },
                    Change::Closed(generation) => News::Closed { key, generation },
                    Change::Controlled(control) => News::Controlled { key, control },
                };
                // Only fails if the task has just ended.
                let _ = inbox.send(news);
            }
            true
        });
    }

    /// Forgets records whose every part expired, once there are twice as
    /// many as after the last sweep: names nobody touches again cost
    /// nothing for long.
    fn sweep(&mut self, now: Instant) {
        if self.records.len() < self.swept_at.saturating_mul(2).max(64) {
            return;
        }
        self.records.retain(|_, r| {
            r.expire(now);
            !r.is_empty()
        });
        self.swept_at = self.records.len();
    }
}
