//! The record's operations against the script's semantics (thresholds,
//! failure windows, one opening per generation, one probe lock at a time,
//! closing on probe successes once `min_open` has passed), and generations
//! that never repeat across the fleet.

use std::time::Duration;

use super::*;
use crate::store::fleet::{Args, Op};

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
fn one_probe_lock_at_a_time_and_a_holder_whose_lease_ran_out_gives_it_up() {
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
    // its turn is over, and the probe lock is free.
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
