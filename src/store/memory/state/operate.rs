//! One instance's write on one name's record (a failure, a reset, an
//! opening, a probe and its success), decided as the Redis store's script
//! decides it: the answer for the calling instance, and what changed for
//! the others. Opening a record is shared with an operator's timed
//! force-open.

use tokio::time::Instant;

use super::record::{after, Opening, ProbeLock, Record};
use super::{Caller, Change};
use crate::store::fleet::{Args, Op, Reply, Write};

/// One operation on one name's record, as the Redis store's script decides
/// it (see `store/redis/script.rs`, whose argument floors it keeps): the
/// answer, and what changed for the other instances.
pub(super) fn operate(
    record: &mut Record,
    last_generation: &mut u64,
    caller: Caller,
    write: &Write,
    now: Instant,
) -> (Reply, Option<Change>) {
    // Quorums count voters; a probe lock belongs to one instance.
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
            // probe lock.
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
            match &record.probe_lock {
                Some(lock) if lock.holder == from => {
                    // The caller's lease ran out without a verdict: its
                    // turn is over.
                    record.probe_lock = None;
                    let held = Reply::ProbeHeld {
                        generation,
                        lease_ms: 0,
                        attempt,
                    };
                    (held, None)
                }
                None => {
                    record.probe_lock = Some(ProbeLock {
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
            match record.probe_lock.as_mut() {
                Some(lock) if lock.holder == from => {
                    lock.until = after(now, lease_ms);
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
/// `open_ms`, the count and the probe lock forgotten.
pub(super) fn open_record(
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
    record.probe_lock = None;
    let reply = Reply::Open {
        generation,
        left_ms: open_ms,
        attempt,
    };
    (reply, Some(Change::Opened(reply)))
}
