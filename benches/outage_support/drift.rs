//! Study 7: a baseline that moves. A provider healthy at one failure rate
//! for a long stretch, whose rate then rises and stays: gradually (from 2%
//! to 10% over 100,000, 1,000,000 or 5,000,000 calls), or at once (2% to
//! 10%, a rise smaller than the adaptive policy's `min_degradation` of ten
//! points; and 10% to 20%, a rise of exactly that). Failures are
//! independent throughout; calls go through the layer, driven as in
//! studies 5 and 6. The table counts the times each configuration opened
//! while the rate rose (or, for a sudden rise, in its first million
//! calls), in the million calls after that, and in the million after
//! those.

use tower::Layer;
use tower_circuit_breaker::policy::TripPolicy;

use crate::baselines::{adaptive, on_every_core, step_seed, Coin, Drive, Judged, Pick, DEGRADED};
use crate::failures::{Failures, Provider};
use crate::{paused_runtime, Scale};

/// One way the rate moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Move {
    pub from: f64,
    pub to: f64,
    /// Calls the rise is spread over; 1 for a sudden one.
    pub over: u64,
}

impl Move {
    pub fn describe(&self) -> String {
        if self.over <= 1 {
            format!(
                "{:.0}% to {:.0}% at once",
                self.from * 100.0,
                self.to * 100.0
            )
        } else {
            format!(
                "{:.0}% to {:.0}% over {} calls",
                self.from * 100.0,
                self.to * 100.0,
                self.over
            )
        }
    }
}

/// The moves of the study.
pub fn moves(scale: &Scale) -> Vec<Move> {
    let mut moves: Vec<Move> = scale
        .drift_spans
        .iter()
        .map(|&over| Move {
            from: 0.02,
            to: 0.1,
            over,
        })
        .collect();
    moves.push(Move {
        from: 0.02,
        to: 0.1,
        over: 1,
    });
    moves.push(Move {
        from: 0.1,
        to: 0.2,
        over: 1,
    });
    moves
}

/// What one configuration did through one move, for one seed.
#[derive(Clone, Debug, Default)]
pub struct Moved {
    /// Trips while the rate rose (a sudden rise: in its first stretch),
    /// in the stretch after, and in the one after that.
    pub trips: [u64; 3],
    /// Calls from the start of the move to the first trip.
    pub first_trip: Option<u64>,
    /// Calls to detect a step from the new rate, once it was reached
    /// (only where asked for).
    pub detect: Judged,
}

/// A configuration through a move, through the layer: `before` healthy
/// calls at the first rate, then the move, then two stretches of
/// `after` calls at the new rate; with `steps`, trials of each step from
/// the new rate at the end.
fn through(trip: &TripPolicy, shift: Move, scale: &Scale, seed: u64, steps: u32) -> Moved {
    paused_runtime().block_on(async {
        let seed = 0xd21f7 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let healthy = Provider::new(Failures::Independent { rate: shift.from }, seed);
        let mut drive = Drive::new(trip, healthy, |breaker| breaker.layer().layer(Coin));
        let mut moved = Moved::default();
        drive.healthy(scale.drift_before).await;
        // The move: the provider's rate follows it, call by call (probes
        // included).
        let start = drive.healthy.calls();
        drive.healthy.set(Failures::Drift {
            from: shift.from,
            to: shift.to,
            after: start,
            over: shift.over.max(1),
        });
        let mut judged = 0;
        let rising = |drive: &Drive<_>, judged: u64| {
            if shift.over > 1 {
                drive.healthy.calls() < start + shift.over
            } else {
                judged < scale.drift_after
            }
        };
        while rising(&drive, judged) {
            // Small steps until the first trip, to tell when it came.
            let chunk = if moved.first_trip.is_none() {
                10
            } else {
                1_000
            };
            let trips = drive.healthy(chunk).await;
            if trips > 0 && moved.first_trip.is_none() {
                moved.first_trip = Some(drive.healthy.calls() - start);
            }
            moved.trips[0] += trips;
            judged += chunk;
        }
        moved.trips[1] = drive.healthy(scale.drift_after).await;
        moved.trips[2] = drive.healthy(scale.drift_after).await;
        for trial in 0..steps {
            for (d, &rate) in DEGRADED.iter().enumerate() {
                drive.healthy(scale.study5_gap).await;
                let mut rng = step_seed(shift.to, d, trial, seed);
                let calls = drive.degraded(rate, &mut rng, scale.study5_cap).await;
                moved.detect.detect[d].push(calls);
                drive.until_closed().await;
            }
        }
        moved
    })
}

/// One row: a configuration through a move, over the seeds.
pub struct Row {
    pub name: String,
    pub shift: Move,
    pub per_seed: Vec<Moved>,
}

/// Runs every configuration through every move: the adaptive policy, and
/// the fixed settings studies 5 chose for the first and the last rate.
pub fn study(picks: &[(Failures, Vec<Pick>)], scale: &Scale) -> Vec<Row> {
    let mut setups: Vec<(String, TripPolicy)> =
        vec![("adaptive (defaults)".to_string(), adaptive().into())];
    for (failures, family_picks) in picks {
        if matches!(failures, Failures::Independent { rate } if *rate == 0.02 || *rate == 0.1) {
            for pick in family_picks {
                setups.push((
                    format!("{} (tuned for {})", pick.fixed.name(), failures.describe()),
                    pick.fixed.trip(),
                ));
            }
        }
    }
    let mut jobs = Vec::new();
    for shift in moves(scale) {
        for (name, trip) in &setups {
            for &seed in &scale.eval_seeds {
                jobs.push((name.clone(), trip.clone(), shift, seed));
            }
        }
    }
    let results = on_every_core(&jobs, |(name, trip, shift, seed)| {
        // The adaptive policy's detection after the fastest gradual rise.
        let steps = if name.starts_with("adaptive")
            && Some(shift.over) == scale.drift_spans.first().copied()
        {
            scale.drift_trials
        } else {
            0
        };
        through(trip, *shift, scale, *seed, steps)
    });
    let mut rows: Vec<Row> = Vec::new();
    for ((name, _, shift, _), moved) in jobs.into_iter().zip(results) {
        match rows.iter_mut().find(|r| r.name == name && r.shift == shift) {
            Some(row) => row.per_seed.push(moved),
            None => rows.push(Row {
                name,
                shift,
                per_seed: vec![moved],
            }),
        }
    }
    rows
}

pub fn print(rows: &[Row], scale: &Scale) {
    println!();
    println!(
        "Study 7: a provider failing 2% (or 10%) of calls, independently, for {} calls, whose rate then rises and stays",
        scale.drift_before
    );
    println!(
        "times the breaker opened, each seed: while the rate rose (at once: in the first {} calls), \
         in the {} calls after, and in the {} after those; calls from the start of the rise to the first trip",
        scale.drift_after, scale.drift_after, scale.drift_after
    );
    println!(
        "{:<30} {:<44} {:>18} {:>18} {:>18} {:>16}",
        "rise", "policy", "while rising", "next", "after", "first trip"
    );
    let cells = |row: &Row, k: usize| -> String {
        let each: Vec<String> = row
            .per_seed
            .iter()
            .map(|m| m.trips[k].to_string())
            .collect();
        each.join(" / ")
    };
    for row in rows {
        let first: Vec<String> = row
            .per_seed
            .iter()
            .map(|m| m.first_trip.map_or("-".to_string(), |c| c.to_string()))
            .collect();
        println!(
            "{:<30} {:<44} {:>18} {:>18} {:>18} {:>16}",
            row.shift.describe(),
            row.name,
            cells(row, 0),
            cells(row, 1),
            cells(row, 2),
            first.join(" / ")
        );
    }
    for row in rows {
        let mut detect = Judged::default();
        for moved in &row.per_seed {
            for (mine, theirs) in detect.detect.iter_mut().zip(&moved.detect.detect) {
                mine.extend(theirs.iter().copied());
            }
        }
        if detect.detect[0].is_empty() {
            continue;
        }
        let cap = scale.study5_cap;
        println!(
            "{} after a rise {}: calls to detect a step to 20% / 40% / 100%: {:.1} / {:.1} / {:.2} \
             (mean over {} steps x {} seeds; study 5 gives the same steps at a steady 10%)",
            row.name,
            row.shift.describe(),
            detect.mean_detect(0, cap).0,
            detect.mean_detect(1, cap).0,
            detect.mean_detect(2, cap).0,
            scale.drift_trials,
            row.per_seed.len()
        );
    }
}

/// What study 7 must show of the adaptive policy: a rise from 2% to 10%
/// over the shortest span is learned with at most a handful of trips and
/// none in the second stretch at the new rate; a sudden rise of ten points
/// trips it at once.
pub fn check(rows: &[Row], scale: &Scale) {
    let adaptive = |shift: &Move| {
        rows.iter()
            .find(|r| r.name.starts_with("adaptive") && r.shift == *shift)
    };
    let shifts = moves(scale);
    if let Some(row) = shifts.first().and_then(adaptive) {
        for (seed, moved) in row.per_seed.iter().enumerate() {
            let name = format!("study 7, adaptive, {}, seed {seed}", row.shift.describe());
            assert!(
                moved.trips[0] + moved.trips[1] <= 5,
                "{name}: {:?} trips, more than a handful",
                moved.trips
            );
            assert_eq!(
                moved.trips[2], 0,
                "{name}: trips in the second stretch at 10%"
            );
        }
    }
    if let Some(row) = shifts.last().and_then(adaptive) {
        for moved in &row.per_seed {
            let first = moved.first_trip.unwrap_or(u64::MAX);
            assert!(
                first <= 2_000,
                "study 7, adaptive, {}: first trip after {first} calls",
                row.shift.describe()
            );
        }
    }
}
