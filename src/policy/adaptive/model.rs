//! The learned model: outcome states, evidence, the held words, the recent
//! window, what is learned and the tests tuned to it.

use super::*;

/// Outcomes are learned this many at a time, from one word of bits.
pub(super) const BATCH: u32 = 64;
/// Words of outcomes held back before they are learned: three full words
/// and the one being filled, so an outcome is learned 192 to 255 calls late.
pub(super) const HELD_WORDS: usize = 4;
/// Standard errors added to a learned rate to give the rate tested against
/// (a one-sided confidence of about 97.7%).
pub(super) const CONFIDENCE_Z: f64 = 2.0;
/// Standard errors by which a state's own chance of a failure must differ
/// from the chance it would otherwise take before it counts: with 47 states,
/// one of them differs by two by chance more often than not.
pub(super) const STATE_Z: f64 = 3.0;
/// Standard errors by which the recent failure rate must exceed the
/// long-run one before a rise is learned.
pub(super) const RISE_Z: f64 = 3.0;
/// Where the heavy test's degraded rate lies, from the light test's rate
/// (0) to every call failing (1).
pub(super) const HEAVY: f64 = 1.0 / 3.0;
/// Degraded rates and chances stay below 1, so a success's ratio stays
/// finite.
pub(super) const MAX_DEGRADED: f64 = 1.0 - 1e-9;
/// Chances stay above 0, so a failure's ratio stays finite.
pub(super) const MIN_CHANCE: f64 = 1e-12;
/// The run test never takes a failure to follow a failure more often than
/// this (or the baseline's cap, if higher): it bounds the failures in a row
/// a hard outage takes to trip, whatever runs the policy learned.
pub(super) const RUN_CHANCE_CAP: f64 = 0.7;
/// The tests: light, heavy, run.
pub(super) const TESTS: usize = 3;
/// The share of the false-trip budget each test spends. The run test needs
/// little: a run of failures adds to its evidence fast.
pub(super) const SHARES: [f64; TESTS] = [0.5, 0.48, 0.02];
/// Outcomes the recent failure rate averages over: short enough to follow
/// a rise spread over a hundred thousand calls within about a point.
pub(super) const RECENT_HORIZON: f64 = 4096.0;
/// Outcomes the recent failure rate must have seen before it is trusted.
pub(super) const RECENT_MIN: f64 = 1024.0;
/// Until this many outcomes are learned (or the warm-up, if longer), the
/// outcomes that led to a trip are learned as well.
pub(super) const LEARNING: u64 = 20_000;
/// Once past [`EAGER`] outcomes, the tests are retuned every this many
/// words learned: the model then moves slowly, and a retune takes up to
/// about 150 logarithms (three when every state takes the same chance).
pub(super) const RETUNE_WORDS: u32 = 16;
/// Until this many outcomes are learned (or the warm-up and one word, if
/// longer), the tests are retuned at every word.
pub(super) const EAGER: u64 = 65_536;

/// The limits on [`Adaptive::false_trips_per_million`].
pub(super) const MIN_BUDGET: f64 = 1e-6;
pub(super) const MAX_BUDGET: f64 = 100_000.0;
/// The smallest [`Adaptive::min_degradation`]: a hundredth of a point.
pub(super) const MIN_DEGRADATION: f64 = 1e-4;

/// The states a call can be made in, by what the calls just before it did:
/// state 0 when nothing is known (at first, and after the breaker opened);
/// then the failure runs (the last `L` calls failed, `L` = 1 to 32 each a
/// state of its own, then 33-64, 65-128 and 129 or more); then the success
/// runs (the last `G` calls succeeded, by powers of two: 1, 2, 3-4, 5-8,
/// ..., 513 or more).
pub(super) const RUN_STATES: usize = 35;
pub(super) const GAP_STATES: usize = 11;
pub(super) const STATES: usize = 1 + RUN_STATES + GAP_STATES;
pub(super) const FIRST_RUN: usize = 1;
pub(super) const FIRST_GAP: usize = FIRST_RUN + RUN_STATES;
pub(super) const UNKNOWN: usize = 0;

/// The state after `run` failures in a row (at least 1).
pub(super) fn run_state(run: u32) -> usize {
    if run <= 32 {
        run as usize
    } else {
        // 33-64, 65-128, 129 and more.
        33 + ((run - 1).ilog2() as usize - 5).min(2)
    }
}

/// The bin of `gap` successes in a row (at least 1): 0 for 1, 1 for 2,
/// 2 for 3-4, 3 for 5-8, and so on, the last bin open-ended.
pub(super) fn gap_bin(gap: u64) -> usize {
    let bin = if gap <= 1 {
        0
    } else {
        (gap - 1).ilog2() as usize + 1
    };
    bin.min(GAP_STATES - 1)
}

/// The state after `gap` successes in a row (at least 1).
pub(super) fn gap_state(gap: u64) -> usize {
    FIRST_GAP + gap_bin(gap)
}

/// The last gap of `gap`'s bin.
pub(super) fn gap_bin_end(gap: u64) -> u64 {
    match gap_bin(gap) {
        bin if bin == GAP_STATES - 1 => u64::MAX,
        bin => 1 << bin,
    }
}

/// How many calls in a row failed, or succeeded, just before now; neither
/// when nothing is known.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Streak {
    pub(super) failures: u32,
    pub(super) successes: u64,
}

impl Streak {
    /// The state the next call is made in.
    pub(super) fn state(&self) -> usize {
        if self.failures > 0 {
            run_state(self.failures)
        } else if self.successes > 0 {
            gap_state(self.successes)
        } else {
            UNKNOWN
        }
    }

    pub(super) fn push(&mut self, failure: bool) {
        if failure {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        } else {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        }
    }
}

/// Wilson's confidence interval for a share of `hits` in `trials` (both
/// possibly fractional, as learned outcomes decay), `z` standard errors
/// wide on each side.
pub(super) fn wilson(hits: f64, trials: f64, z: f64) -> (f64, f64) {
    if trials <= 0.0 {
        return (0.0, 1.0);
    }
    let p = (hits / trials).clamp(0.0, 1.0);
    let z2 = z * z;
    let spread = z * (p * (1.0 - p) / trials + z2 / (4.0 * trials * trials)).sqrt();
    let middle = p + z2 / (2.0 * trials);
    let scale = 1.0 + z2 / trials;
    (
        ((middle - spread) / scale).max(0.0),
        ((middle + spread) / scale).min(1.0),
    )
}

/// One test's evidence so far.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Evidence {
    pub(super) statistic: f64,
    /// Outcomes, and failures, since the statistic last stood at zero: the
    /// evidence a trip is named by.
    pub(super) calls: u32,
    pub(super) failures: u32,
}

/// Outcomes not yet learned, one bit each (1 for a failure), in a ring of
/// words: the word being filled and up to three full ones before it.
#[derive(Clone, Debug, Default)]
pub(super) struct Held {
    pub(super) words: [u64; HELD_WORDS],
    /// The word being filled, and how many of its bits are.
    pub(super) head: usize,
    pub(super) bits: u32,
    /// Full words waiting.
    pub(super) full: usize,
}

/// A word of outcomes just filled: its failures, and the oldest word held,
/// which leaves the ring to be learned once the ring is full.
#[derive(Clone, Copy, Debug)]
pub(super) struct Filled {
    pub(super) failures: u32,
    pub(super) oldest: Option<u64>,
}

impl Held {
    /// Holds one outcome.
    pub(super) fn push(&mut self, failure: bool) -> Option<Filled> {
        self.words[self.head] |= u64::from(failure) << self.bits;
        self.bits += 1;
        if self.bits < BATCH {
            return None;
        }
        let failures = self.words[self.head].count_ones();
        self.bits = 0;
        self.head = (self.head + 1) % HELD_WORDS;
        if self.full < HELD_WORDS - 1 {
            self.full += 1;
            return Some(Filled {
                failures,
                oldest: None,
            });
        }
        // The new head is the oldest full word: learn it and reuse it.
        let oldest = std::mem::take(&mut self.words[self.head]);
        Some(Filled {
            failures,
            oldest: Some(oldest),
        })
    }

    /// The failures and outcomes in the word being filled.
    pub(super) fn partial(&self) -> (u32, u32) {
        (self.words[self.head].count_ones(), self.bits)
    }

    /// Every word held, oldest first, with its number of outcomes; the ring
    /// is left empty.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = (u64, u32)> {
        let held = std::mem::take(self);
        (0..=held.full).map(move |k| {
            let index = (held.head + HELD_WORDS - held.full + k) % HELD_WORDS;
            let bits = if k == held.full { held.bits } else { BATCH };
            (held.words[index], bits)
        })
    }
}

/// The recent failure rate: every closed-state outcome, trips or not,
/// averaged over the last [`RECENT_HORIZON`], and the spread of failures
/// over words of 64 outcomes around it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RecentRate {
    pub(super) rate: f64,
    pub(super) outcomes: f64,
    /// The mean squared difference between a word's failures and the
    /// recent rate's, and the words it averages.
    pub(super) spread: f64,
    pub(super) words: f64,
}

impl RecentRate {
    pub(super) fn learn(&mut self, failures: u32, calls: u32, horizon: f64) {
        if calls == 0 {
            return;
        }
        let n = f64::from(calls);
        if calls == BATCH && self.outcomes >= n {
            let deviation = f64::from(failures) - n * self.rate;
            let weight = (self.words + 1.0).min((horizon / n).max(1.0));
            self.spread += (deviation * deviation - self.spread) / weight;
            self.words += 1.0;
        }
        let weight = (self.outcomes + n).min(RECENT_HORIZON.max(n));
        self.rate = (self.rate + (f64::from(failures) - n * self.rate) / weight).clamp(0.0, 1.0);
        self.outcomes = (self.outcomes + n).min(RECENT_HORIZON);
    }

    /// How much more failures spread over words than independent ones
    /// would: 1 for independent failures, about the mean length of a run
    /// for failures in runs.
    pub(super) fn dispersion(&self) -> f64 {
        let independent = f64::from(BATCH) * self.rate * (1.0 - self.rate);
        if self.words < 16.0 || independent <= 0.0 {
            return 1.0;
        }
        (self.spread / independent).max(1.0)
    }

    /// The standard error of the recent rate, widened by the dispersion.
    pub(super) fn standard_error(&self) -> f64 {
        let variance = self.dispersion() * self.rate * (1.0 - self.rate);
        (variance / self.outcomes.max(1.0)).sqrt()
    }
}

/// What the policy learned of the dependency: the long-run failure rate,
/// and per state the outcomes made in it and the failures among them.
#[derive(Clone, Debug)]
pub(super) struct Learned {
    pub(super) outcomes: u64,
    pub(super) rate: f64,
    pub(super) seen: [f64; STATES],
    pub(super) failed: [f64; STATES],
    /// The factor the tallies are still to be multiplied by, to forget the
    /// oldest outcomes at the rate the long-run rate does.
    pub(super) decay: f64,
    /// The streak at the last outcome learned.
    pub(super) streak: Streak,
}

impl Learned {
    pub(super) fn new() -> Self {
        Learned {
            outcomes: 0,
            rate: 0.0,
            seen: [0.0; STATES],
            failed: [0.0; STATES],
            decay: 1.0,
            streak: Streak::default(),
        }
    }

    /// Learns the first `bits` outcomes of `word` (the others are zero): a
    /// running mean up to the horizon, then an exponentially weighted one;
    /// the rate capped so that it never accepts an outage.
    pub(super) fn learn(&mut self, word: u64, bits: u32, horizon: f64, max_rate: f64) {
        if bits == 0 {
            return;
        }
        let n = f64::from(bits);
        let weight = (self.outcomes as f64 + n).min(horizon.max(n));
        let rate = self.rate + (f64::from(word.count_ones()) - n * self.rate) / weight;
        self.rate = rate.clamp(0.0, max_rate);
        if self.outcomes as f64 + n > horizon {
            self.decay *= 1.0 - n / horizon.max(n);
        }
        self.tally(word, bits);
        self.outcomes = self.outcomes.saturating_add(u64::from(bits));
    }

    /// Counts each outcome in the state it was made in, a run of equal
    /// outcomes at a time.
    pub(super) fn tally(&mut self, word: u64, bits: u32) {
        let (mut rest, mut left) = (word, bits);
        while left > 0 {
            let successes = rest.trailing_zeros().min(left);
            if successes > 0 {
                self.tally_successes(successes);
                rest = rest.checked_shr(successes).unwrap_or(0);
                left -= successes;
            }
            let failures = (!rest).trailing_zeros().min(left);
            if failures > 0 {
                self.tally_failures(failures);
                rest = rest.checked_shr(failures).unwrap_or(0);
                left -= failures;
            }
        }
    }

    pub(super) fn tally_successes(&mut self, count: u32) {
        self.add(self.streak.state(), false);
        // The others are made after 1, 2, ... successes in a row (more if
        // the streak was already one of successes), a bin at a time.
        let mut gap = self.streak.successes.saturating_add(1);
        let mut remaining = u64::from(count - 1);
        while remaining > 0 {
            let take = remaining.min(gap_bin_end(gap) - gap + 1);
            self.seen[gap_state(gap)] += take as f64;
            gap = gap.saturating_add(take);
            remaining -= take;
        }
        self.streak = Streak {
            failures: 0,
            successes: self.streak.successes.saturating_add(u64::from(count)),
        };
    }

    pub(super) fn tally_failures(&mut self, count: u32) {
        self.add(self.streak.state(), true);
        let mut run = self.streak.failures;
        for _ in 1..count {
            run = run.saturating_add(1);
            self.add(run_state(run), true);
        }
        self.streak = Streak {
            failures: self.streak.failures.saturating_add(count),
            successes: 0,
        };
    }

    pub(super) fn add(&mut self, state: usize, failure: bool) {
        if state != UNKNOWN {
            self.seen[state] += 1.0;
            self.failed[state] += f64::from(u8::from(failure));
        }
    }

    pub(super) fn apply_decay(&mut self) {
        if self.decay < 1.0 {
            let decay = std::mem::replace(&mut self.decay, 1.0);
            self.seen.iter_mut().for_each(|n| *n *= decay);
            self.failed.iter_mut().for_each(|n| *n *= decay);
        }
    }

    /// The chance of a failure in each state: the first of each kind takes
    /// `normal` (the rate over all calls), the others the chance of the
    /// state before them, unless their own outcomes show, by [`STATE_Z`]
    /// standard errors, that it differs; then the nearest end of their own
    /// interval. State 0 (nothing known) takes `normal`, and so does every
    /// state once the long-run rate has reached `max_rate`.
    pub(super) fn chances(&self, normal: f64, max_rate: f64) -> [f64; STATES] {
        let mut chances = [normal; STATES];
        // A dependency failing at the cap or more is tested as if its
        // failures were independent at the cap, whatever runs it learned:
        // so a failure rate at the ceiling always trips.
        if self.rate >= max_rate {
            return chances;
        }
        for kind in [FIRST_RUN..FIRST_GAP, FIRST_GAP..STATES] {
            let mut parent = normal;
            let learned = self.failed[kind.clone()]
                .iter()
                .zip(&self.seen[kind.clone()]);
            for (chance, (&failed, &seen)) in chances[kind].iter_mut().zip(learned) {
                let (low, high) = wilson(failed, seen, STATE_Z);
                // max then min rather than clamp: never a panic, whatever
                // the floats.
                parent = parent.max(low).min(high);
                *chance = parent;
            }
        }
        chances
    }
}

/// The tests' steps and thresholds, retuned as the model learns.
#[derive(Clone, Debug)]
pub(super) struct Tuned {
    /// What a failure adds, per test and state.
    pub(super) on_failure: [[f64; STATES]; TESTS],
    /// What a success adds (`ln(1 − e)`, the same in every state).
    pub(super) on_success: [f64; TESTS],
    pub(super) threshold: [f64; TESTS],
}

impl Tuned {
    /// Tests against `chances` raised by `extra` independent failures.
    pub(super) fn new(
        settings: &Settings,
        chances: &[f64; STATES],
        extra: f64,
        level: f64,
    ) -> Self {
        let added = settings.added(level);
        let run_cap = settings.run_chance_cap();
        let mut tuned = Tuned {
            on_failure: [[0.0; STATES]; TESTS],
            on_success: [0.0; TESTS],
            threshold: [0.0; TESTS],
        };
        for (test, &added) in added.iter().enumerate() {
            tuned.threshold[test] = settings.threshold(test, added);
            tuned.on_success[test] = if added >= 1.0 {
                f64::NEG_INFINITY
            } else {
                (-added).ln_1p()
            };
        }
        let [light, heavy, run] = &mut tuned.on_failure;
        // Most states take the chance of the state before them (every one,
        // for independent failures): their steps are computed once.
        let mut previous: Option<(f64, [f64; TESTS])> = None;
        for (state, &chance) in chances.iter().enumerate() {
            let steps = match previous {
                Some((same, steps)) if same == chance => steps,
                _ => {
                    let normal = (chance + (1.0 - chance) * extra).clamp(MIN_CHANCE, MAX_DEGRADED);
                    let ln_normal = normal.ln();
                    let step = |added: f64| (normal + (1.0 - normal) * added).ln() - ln_normal;
                    [step(added[0]), step(added[1]), -normal.min(run_cap).ln()]
                }
            };
            [light[state], heavy[state], run[state]] = steps;
            previous = Some((chance, steps));
        }
        tuned
    }
}
