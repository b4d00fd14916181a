//! The fleet's state in memory, and the operations on it: what the Redis
//! store keeps in Redis keys and decides in its script, kept here per name
//! and decided under one lock.
//!
//! Each name has a [`Record`] whose parts expire as the Redis keys of that
//! name do (the opening, its open period, `min_open`, the failure count,
//! the probe lease), on tokio's clock. Every operation answers the calling
//! instance with a [`Reply`], exactly as the script would, and tells every
//! other instance what changed (an opening, a closing, a new failure
//! count): what pub/sub and the index do for Redis, here at once and
//! in order.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, WeakUnboundedSender};
use tokio::time::Instant;

use crate::breaker::shared::Shared;
use crate::millis::millis_up;
use crate::store::fleet::{settle, Args, Op, Reply, Write};
use crate::store::{FleetOpening, FleetState};
use crate::Control;

/// Which instance of the fleet: the probe lease's holder, and whom news
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

/// The fleet's opening of one name (Redis: its `record` hash).
#[derive(Debug)]
struct Opening {
    generation: u64,
    attempt: u32,
    /// Probe successes in this generation.
    successes: u64,
    /// When the fleet forgets it.
    until: Instant,
}

/// The probe lease (Redis: `probe_lock`).
#[derive(Debug)]
struct Lease {
    holder: InstanceId,
    until: Instant,
}

/// Everything the fleet keeps of one name; each part is gone once its time
/// is up, as a Redis key that expires.
#[derive(Debug, Default)]
struct Record {
    opening: Option<Opening>,
    /// While the open period runs (Redis: `wait`).
    open_until: Option<Instant>,
    /// Until `min_open` has passed since the outage began.
    min_open_until: Option<Instant>,
    /// The failure count, and when it is forgotten.
    failures: Option<(u64, Instant)>,
    /// The instances whose failures the count holds (with a quorum above
    /// 1; Redis: the fields of the `failures` hash), forgotten with it.
    failing: Vec<VoterId>,
    /// Instances whose own opening was declined, and until when each
    /// counts as failing (Redis: `votes`).
    votes: Vec<(VoterId, Instant)>,
    lease: Option<Lease>,
    /// An operator's fleet-wide hold (Redis: the index's `!<name>`
    /// field), kept until restored or reset.
    control: Option<(u64, Control)>,
}

impl Record {
    /// Drops every part whose time is up.
    fn expire(&mut self, now: Instant) {
        if self.opening.as_ref().is_some_and(|o| o.until <= now) {
            self.opening = None;
        }
        if self.open_until.is_some_and(|at| at <= now) {
            self.open_until = None;
        }
        if self.min_open_until.is_some_and(|at| at <= now) {
            self.min_open_until = None;
        }
        if self.failures.is_some_and(|(_, at)| at <= now) {
            self.failures = None;
        }
        if self.failures.is_none() {
            self.failing.clear();
        }
        self.votes.retain(|(_, until)| *until > now);
        if self.lease.as_ref().is_some_and(|l| l.until <= now) {
            self.lease = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.opening.is_none()
            && self.open_until.is_none()
            && self.min_open_until.is_none()
            && self.failures.is_none()
            && self.votes.is_empty()
            && self.lease.is_none()
            && self.control.is_none()
    }

    /// Instances failing at once: those whose failures the count holds,
    /// those whose vote runs, and `caller` (the script's `failing`).
    fn failing(&self, caller: VoterId) -> usize {
        let mut seen: Vec<VoterId> = self.failing.clone();
        seen.extend(self.votes.iter().map(|(who, _)| *who));
        seen.push(caller);
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }

    /// Forgets the failure count and who failed.
    fn forget_failures(&mut self) -> bool {
        self.failing.clear();
        self.failures.take().is_some()
    }

    fn failures(&self) -> u64 {
        self.failures.map_or(0, |(n, _)| n)
    }

    /// What is left of the open period, in whole milliseconds rounded up
    /// (so it reads 0 only once the period is over).
    fn open_left_ms(&self, now: Instant) -> u64 {
        self.open_until
            .map_or(0, |at| millis_up(at.saturating_duration_since(now)))
    }

    /// The script's `state()`.
    fn state(&self, now: Instant) -> Reply {
        match &self.opening {
            None => Reply::Closed {
                failures: self.failures(),
            },
            Some(o) => Reply::Open {
                generation: o.generation,
                left_ms: self.open_left_ms(now),
                attempt: o.attempt,
            },
        }
    }

    fn lease_left_ms(&self, now: Instant) -> u64 {
        self.lease
            .as_ref()
            .map_or(0, |l| millis_up(l.until.saturating_duration_since(now)))
    }
}

/// `ms` after `now`; past the clock's range, as late as it goes (no
/// setting can make the fleet panic).
fn after(now: Instant, ms: u64) -> Instant {
    let far = Duration::from_secs(86_400 * 365 * 30);
    now.checked_add(Duration::from_millis(ms))
        .or_else(|| now.checked_add(far))
        .unwrap_or(now)
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

    /// The control in force on `key`.
    pub(crate) fn control_of(&self, key: &str) -> Option<(u64, Control)> {
        self.records.get(key).and_then(|r| r.control)
    }

    /// An operator's fleet-wide `control` of `key`, told to every instance
    /// (the caller's included) as any change is; `open` are the arguments
    /// of an opening for a period.
    pub(crate) fn control(&mut self, key: &Arc<str>, control: Control, open: &Args, now: Instant) {
        let record = self.records.entry(Arc::clone(key)).or_default();
        record.expire(now);
        let mut changes = Vec::new();
        match control {
            Control::ForceOpen(Some(_)) => {
                if record.control.take().is_some() {
                    changes.push(Change::Controlled(None));
                }
                let (_, opened) = open_record(record, &mut self.last_generation, open, 0, now);
                changes.extend(opened);
            }
            Control::Restore => {
                record.control = None;
                changes.push(Change::Controlled(None));
            }
            Control::Reset => {
                *record = Record::default();
                self.last_control += 1;
                changes.push(Change::Controlled(Some((self.last_control, control))));
            }
            held => {
                self.last_control += 1;
                record.control = Some((self.last_control, held));
                changes.push(Change::Controlled(record.control));
            }
        }
        if record.is_empty() {
            self.records.remove(key);
        }
        for change in changes {
            // From nobody: every instance hears it, the caller's too.
            self.announce(0, key, change);
        }
    }

    /// Everything the fleet keeps of `key`, `now`.
    pub(crate) fn inspect(&mut self, key: &str, now: Instant) -> FleetState {
        let Some(record) = self.records.get_mut(key) else {
            return FleetState::default();
        };
        record.expire(now);
        let left =
            |at: Option<Instant>| at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        let opening = record.opening.as_ref().map(|o| FleetOpening {
            generation: o.generation,
            attempt: o.attempt,
            open_for: left(record.open_until),
            kept_for: left(Some(o.until)),
            min_open_for: left(record.min_open_until),
            probe_successes: u32::try_from(o.successes).unwrap_or(u32::MAX),
        });
        let (failures, failing, votes, lease, control) = (
            record.failures(),
            record.failing.clone(),
            record.votes.iter().map(|(who, _)| *who).collect::<Vec<_>>(),
            record
                .lease
                .as_ref()
                .map(|l| (l.holder, left(Some(l.until)))),
            record.control,
        );
        FleetState {
            opening,
            failures,
            failing: failing.into_iter().map(|v| self.voter_name(v)).collect(),
            votes: votes.into_iter().map(|v| self.voter_name(v)).collect(),
            prober: lease.map(|(holder, left)| (self.name_of(holder), left)),
            control: control.and_then(|(_, c)| (c != Control::Reset).then_some(c)),
        }
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

/// One operation on one name's record, as the Redis store's script decides
/// it (see `store/redis/script.rs`, whose argument floors it keeps): the
/// answer, and what changed for the other instances.
fn operate(
    record: &mut Record,
    last_generation: &mut u64,
    caller: Caller,
    write: &Write,
    now: Instant,
) -> (Reply, Option<Change>) {
    // Quorums count voters; a probe lease belongs to one instance.
    let (from, voter) = (caller.instance, caller.voter);
    let args = &write.args;
    let lease_ms = args.lease_ms.max(1);
    let quorum = usize::try_from(args.quorum.max(1)).unwrap_or(usize::MAX);
    match write.op {
        Op::Fail => {
            if record.opening.is_some() {
                return (record.state(now), None);
            }
            let count = record.failures().saturating_add(1);
            record.failures = Some((count, after(now, args.window_ms.max(1))));
            if quorum > 1 && !record.failing.contains(&voter) {
                record.failing.push(voter);
            }
            if count < u64::from(args.threshold.max(1)) || record.failing(voter) < quorum {
                return (
                    Reply::Closed { failures: count },
                    Some(Change::Count(count)),
                );
            }
            open_record(record, last_generation, args, 0, now)
        }
        Op::Reset => {
            if record.opening.is_none() && record.forget_failures() {
                return (record.state(now), Some(Change::Count(0)));
            }
            (record.state(now), None)
        }
        Op::Open => match &record.opening {
            Some(o) if o.generation != args.known_generation || record.open_until.is_some() => {
                (record.state(now), None)
            }
            // A new opening needs `quorum` instances failing; below it,
            // the caller's opening is a vote, for its open period and the
            // probe lease.
            None if record.failing(voter) < quorum => {
                let until = after(now, args.open_ms.max(1).saturating_add(lease_ms));
                record.votes.retain(|(who, _)| *who != voter);
                record.votes.push((voter, until));
                let declined = Reply::Declined {
                    failures: record.failures(),
                };
                (declined, None)
            }
            _ => open_record(record, last_generation, args, args.attempt, now),
        },
        Op::Probe => {
            let (generation, attempt) = match &record.opening {
                Some(o) if record.open_until.is_none() => (o.generation, o.attempt),
                _ => return (record.state(now), None),
            };
            match &record.lease {
                Some(lease) if lease.holder == from => {
                    // The caller's lease ran out without a verdict: its
                    // turn is over.
                    record.lease = None;
                    let held = Reply::ProbeHeld {
                        generation,
                        lease_ms: 0,
                        attempt,
                    };
                    (held, None)
                }
                None => {
                    record.lease = Some(Lease {
                        holder: from,
                        until: after(now, lease_ms),
                    });
                    (
                        Reply::ProbeWon {
                            generation,
                            attempt,
                        },
                        None,
                    )
                }
                Some(_) => {
                    let held = Reply::ProbeHeld {
                        generation,
                        lease_ms: record.lease_left_ms(now),
                        attempt,
                    };
                    (held, None)
                }
            }
        }
        Op::ProbeOk => {
            let Some(opening) = record.opening.as_mut() else {
                return (record.state(now), None);
            };
            if opening.generation != args.known_generation || record.open_until.is_some() {
                return (record.state(now), None);
            }
            let (generation, attempt) = (opening.generation, opening.attempt);
            opening.successes = opening.successes.saturating_add(1);
            if opening.successes >= u64::from(args.successes.max(1))
                && record.min_open_until.is_none()
            {
                *record = Record {
                    control: record.control,
                    ..Record::default()
                };
                return (
                    Reply::Closed { failures: 0 },
                    Some(Change::Closed(generation)),
                );
            }
            match record.lease.as_mut() {
                Some(lease) if lease.holder == from => {
                    lease.until = after(now, lease_ms);
                    (
                        Reply::ProbeWon {
                            generation,
                            attempt,
                        },
                        None,
                    )
                }
                _ => {
                    let held = Reply::ProbeHeld {
                        generation,
                        lease_ms: record.lease_left_ms(now),
                        attempt,
                    };
                    (held, None)
                }
            }
        }
    }
}

/// The script's `open(attempt)`: a new fleet generation, open for
/// `open_ms`, the count and the lease forgotten.
fn open_record(
    record: &mut Record,
    last_generation: &mut u64,
    args: &Args,
    attempt: u32,
    now: Instant,
) -> (Reply, Option<Change>) {
    *last_generation += 1;
    let generation = *last_generation;
    let open_ms = args.open_ms.max(1);
    record.opening = Some(Opening {
        generation,
        attempt,
        successes: 0,
        until: after(now, args.keep_ms.max(1)),
    });
    record.open_until = Some(after(now, open_ms));
    // `min_open` counts from the first opening of an outage, not from
    // each reopening.
    if args.min_open_ms > 0 && record.min_open_until.is_none() {
        record.min_open_until = Some(after(now, args.min_open_ms));
    }
    record.forget_failures();
    record.votes.clear();
    record.lease = None;
    let reply = Reply::Open {
        generation,
        left_ms: open_ms,
        attempt,
    };
    (reply, Some(Change::Opened(reply)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: InstanceId = 1;
    const B: InstanceId = 2;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Carries out `op` for `from` at `now` on `record`.
    fn run(
        record: &mut Record,
        generations: &mut u64,
        from: InstanceId,
        op: Op,
        args: Args,
        now: Instant,
    ) -> Reply {
        record.expire(now);
        let write = Write {
            key: Arc::from("llm"),
            op,
            args,
        };
        let caller = Caller {
            instance: from,
            voter: from,
        };
        operate(record, generations, caller, &write, now).0
    }

    fn opening(known_generation: u64, attempt: u32) -> Args {
        Args {
            open_ms: 100,
            min_open_ms: 300,
            keep_ms: 60_000,
            attempt,
            known_generation,
            lease_ms: 50,
            successes: 2,
            ..Args::default()
        }
    }

    #[test]
    fn failures_open_at_the_threshold_and_the_opening_forgets_them() {
        let (mut record, mut generations, t) = (Record::default(), 0, Instant::now());
        let fail = Args {
            threshold: 3,
            window_ms: 1_000,
            open_ms: 100,
            keep_ms: 60_000,
            ..Args::default()
        };
        for n in 1..3 {
            let reply = run(&mut record, &mut generations, A, Op::Fail, fail.clone(), t);
            assert_eq!(reply, Reply::Closed { failures: n });
        }
        let reply = run(&mut record, &mut generations, B, Op::Fail, fail.clone(), t);
        assert_eq!(
            reply,
            Reply::Open {
                generation: 1,
                left_ms: 100,
                attempt: 0
            }
        );
        assert_eq!(record.failures(), 0);
        // While open, failures are not counted.
        let reply = run(&mut record, &mut generations, A, Op::Fail, fail, t + ms(40));
        assert!(
            matches!(reply, Reply::Open { left_ms: 60, .. }),
            "{reply:?}"
        );
    }

    #[test]
    fn a_failure_count_expires_after_its_window() {
        let (mut record, mut generations, t) = (Record::default(), 0, Instant::now());
        let fail = Args {
            threshold: 3,
            window_ms: 1_000,
            ..Args::default()
        };
        run(&mut record, &mut generations, A, Op::Fail, fail.clone(), t);
        let reply = run(
            &mut record,
            &mut generations,
            A,
            Op::Fail,
            fail,
            t + ms(1_000),
        );
        assert_eq!(
            reply,
            Reply::Closed { failures: 1 },
            "the first one forgotten"
        );
    }

    #[test]
    fn an_opening_is_written_once_per_generation_and_min_open_counts_from_the_first() {
        let (mut record, mut generations, t) = (Record::default(), 0, Instant::now());
        let first = run(&mut record, &mut generations, A, Op::Open, opening(0, 0), t);
        assert!(matches!(first, Reply::Open { generation: 1, .. }));
        // Another instance, unaware of it, opens too: the fleet's stands.
        let again = run(&mut record, &mut generations, B, Op::Open, opening(0, 0), t);
        assert!(matches!(
            again,
            Reply::Open {
                generation: 1,
                left_ms: 100,
                ..
            }
        ));
        // A probe of generation 1 failed once its period was over: a new
        // generation, with its attempt; `min_open` is not restarted.
        let later = t + ms(150);
        let reopened = run(
            &mut record,
            &mut generations,
            A,
            Op::Open,
            opening(1, 1),
            later,
        );
        assert_eq!(
            reopened,
            Reply::Open {
                generation: 2,
                left_ms: 100,
                attempt: 1
            }
        );
        assert_eq!(record.min_open_until, Some(t + ms(300)));
        // An instance still reporting generation 1 changes nothing.
        let stale = run(
            &mut record,
            &mut generations,
            B,
            Op::Open,
            opening(1, 1),
            later,
        );
        assert!(matches!(stale, Reply::Open { generation: 2, .. }));
    }

    #[test]
    fn one_lease_at_a_time_and_a_holder_whose_lease_ran_out_gives_it_up() {
        let (mut record, mut generations, t) = (Record::default(), 0, Instant::now());
        run(&mut record, &mut generations, A, Op::Open, opening(0, 0), t);
        let probe = || opening(0, 0);
        let early = run(
            &mut record,
            &mut generations,
            A,
            Op::Probe,
            probe(),
            t + ms(60),
        );
        assert!(
            matches!(early, Reply::Open { left_ms: 40, .. }),
            "{early:?}"
        );
        let over = t + ms(100);
        let won = run(&mut record, &mut generations, A, Op::Probe, probe(), over);
        assert!(matches!(won, Reply::ProbeWon { generation: 1, .. }));
        let held = run(
            &mut record,
            &mut generations,
            B,
            Op::Probe,
            probe(),
            over + ms(20),
        );
        assert!(
            matches!(held, Reply::ProbeHeld { lease_ms: 30, .. }),
            "{held:?}"
        );
        // The holder looks again before its lease ends, with no verdict:
        // its turn is over, and the lease is free.
        let given_up = run(
            &mut record,
            &mut generations,
            A,
            Op::Probe,
            probe(),
            over + ms(49),
        );
        assert!(matches!(given_up, Reply::ProbeHeld { lease_ms: 0, .. }));
        let taken = run(
            &mut record,
            &mut generations,
            B,
            Op::Probe,
            probe(),
            over + ms(49),
        );
        assert!(matches!(taken, Reply::ProbeWon { generation: 1, .. }));
    }

    #[test]
    fn probe_successes_close_at_the_count_once_min_open_has_passed() {
        let (mut record, mut generations, t) = (Record::default(), 0, Instant::now());
        run(&mut record, &mut generations, A, Op::Open, opening(0, 0), t);
        let over = t + ms(100);
        run(
            &mut record,
            &mut generations,
            A,
            Op::Probe,
            opening(0, 0),
            over,
        );
        // A success of another generation counts for nothing.
        let stale = run(
            &mut record,
            &mut generations,
            A,
            Op::ProbeOk,
            opening(7, 0),
            over,
        );
        assert!(matches!(stale, Reply::Open { generation: 1, .. }));
        // Two successes, the second before `min_open` (300 ms) has passed:
        // still half-open, the holder's lease renewed.
        for _ in 0..2 {
            let ok = run(
                &mut record,
                &mut generations,
                A,
                Op::ProbeOk,
                opening(1, 0),
                over,
            );
            assert!(
                matches!(ok, Reply::ProbeWon { generation: 1, .. }),
                "{ok:?}"
            );
        }
        // The next success from any instance, once `min_open` has passed,
        // closes the fleet.
        let closed = run(
            &mut record,
            &mut generations,
            B,
            Op::ProbeOk,
            opening(1, 0),
            t + ms(300),
        );
        assert_eq!(closed, Reply::Closed { failures: 0 });
        assert!(record.is_empty());
    }

    #[test]
    fn generations_never_repeat_across_names_or_once_a_name_is_forgotten() {
        let mut fleet = Fleet::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let a = fleet.join(tx.downgrade(), None);
        let t = Instant::now();
        let open = |key: &str| Write {
            key: Arc::from(key),
            op: Op::Open,
            args: Args {
                keep_ms: 200,
                ..opening(0, 0)
            },
        };
        let mut generations = Vec::new();
        for (key, now) in [("x", t), ("y", t), ("x", t + ms(200))] {
            for news in fleet.exchange(a, &mut rx, &[open(key)], now) {
                if let News::Reply {
                    reply: Reply::Open { generation, .. },
                    ..
                } = news
                {
                    generations.push(generation);
                }
            }
        }
        // By then `x`'s first opening was forgotten, as its record expired.
        assert_eq!(generations, [1, 2, 3]);
    }
}
