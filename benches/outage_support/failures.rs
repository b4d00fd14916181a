//! Which calls of a provider fail: the failure processes of the outage
//! bench's baselines (studies 5 to 7) and of the adaptive policy's tests,
//! drawn from the seeded generator of `tests/common/rng.rs`, so that a run
//! can be repeated exactly.
//!
//! Included by path (`#[path = ...] mod failures;`) next to a `rng`
//! module: at the outage bench's root, and in the tests' `tests/common`.
//! Each user takes a different subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use super::rng::SplitMix64;

/// How a provider's failures come.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Failures {
    /// Each call fails with chance `rate`, independently.
    Independent { rate: f64 },
    /// Runs of `shortest` to `longest` failures in a row (each length as
    /// likely), `rate` of calls in all. After each success a run starts
    /// with a fixed chance, so runs start at random; a run is always
    /// followed by a success, so runs never merge.
    Runs {
        rate: f64,
        shortest: u32,
        longest: u32,
    },
    /// Bad periods of `shortest` to `longest` calls, in which each call
    /// fails with chance `bad`; no call fails outside them; `rate` of calls
    /// in all. A period starts at random outside one.
    Periods {
        rate: f64,
        bad: f64,
        shortest: u32,
        longest: u32,
    },
    /// Independent failures whose rate goes from `from` to `to` in a
    /// straight line over `over` calls, beginning after `after` calls.
    Drift {
        from: f64,
        to: f64,
        after: u64,
        over: u64,
    },
}

impl Failures {
    /// The share of calls that fail, in the long run (at the end, for a
    /// drift).
    pub fn rate(&self) -> f64 {
        match *self {
            Failures::Independent { rate }
            | Failures::Runs { rate, .. }
            | Failures::Periods { rate, .. } => rate,
            Failures::Drift { to, .. } => to,
        }
    }

    /// A short description, for tables.
    pub fn describe(&self) -> String {
        match *self {
            Failures::Independent { rate } => format!("{}%, independent", percent(rate)),
            Failures::Runs {
                rate,
                shortest,
                longest,
            } => format!("{}%, runs of {shortest}-{longest}", percent(rate)),
            Failures::Periods {
                rate,
                bad,
                shortest,
                longest,
            } => format!(
                "{}%, periods of {shortest}-{longest} at {}%",
                percent(rate),
                percent(bad)
            ),
            Failures::Drift { from, to, over, .. } => {
                format!("{}% to {}% over {over} calls", percent(from), percent(to))
            }
        }
    }
}

/// `0.02` as `2`, `0.005` as `0.5`.
fn percent(rate: f64) -> String {
    let p = rate * 100.0;
    if p == p.round() {
        format!("{p:.0}")
    } else {
        format!("{p:.1}")
    }
}

/// A provider's failures, call by call.
pub struct Provider {
    rng: SplitMix64,
    failures: Failures,
    /// Failures still to come in the current run, or calls in the current
    /// bad period.
    left: u32,
    /// A run just ended: the next call succeeds.
    ended: bool,
    calls: u64,
}

impl Provider {
    pub fn new(failures: Failures, seed: u64) -> Self {
        Provider {
            rng: SplitMix64(seed),
            failures,
            left: 0,
            ended: false,
            calls: 0,
        }
    }

    /// Changes how the provider fails from the next call on (a step), in
    /// the middle of a run or period if one is going on.
    pub fn set(&mut self, failures: Failures) {
        self.failures = failures;
    }

    pub fn failures(&self) -> Failures {
        self.failures
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Whether the next call fails.
    pub fn fails(&mut self) -> bool {
        self.calls += 1;
        match self.failures {
            Failures::Independent { rate } => self.rng.next_f64() < rate,
            Failures::Drift {
                from,
                to,
                after,
                over,
            } => {
                let done = self.calls.saturating_sub(after) as f64 / over.max(1) as f64;
                self.rng.next_f64() < from + (to - from) * done.min(1.0)
            }
            Failures::Runs {
                rate,
                shortest,
                longest,
            } => {
                if self.left > 0 {
                    self.left -= 1;
                    self.ended = self.left == 0;
                    return true;
                }
                if std::mem::take(&mut self.ended) {
                    return false;
                }
                // A share `rate` fails when runs of mean length `m` start
                // with chance `s` after each success: `m / (m + 1/s)`.
                let mean = f64::from(shortest + longest) / 2.0;
                let start = rate / (mean * (1.0 - rate));
                if self.rng.next_f64() >= start {
                    return false;
                }
                self.left = self.length(shortest, longest).saturating_sub(1);
                self.ended = self.left == 0;
                true
            }
            Failures::Periods {
                rate,
                bad,
                shortest,
                longest,
            } => {
                if self.left == 0 {
                    // The share of calls in bad periods is `rate / bad`.
                    let mean = f64::from(shortest + longest) / 2.0;
                    let inside = (rate / bad).min(1.0);
                    let start = inside / (mean * (1.0 - inside));
                    if self.rng.next_f64() < start {
                        self.left = self.length(shortest, longest);
                    }
                }
                if self.left == 0 {
                    return false;
                }
                self.left -= 1;
                self.rng.next_f64() < bad
            }
        }
    }

    /// A length from `shortest` to `longest`, each as likely.
    fn length(&mut self, shortest: u32, longest: u32) -> u32 {
        let span = u64::from(longest.saturating_sub(shortest)) + 1;
        shortest + (self.rng.next_u64() % span) as u32
    }
}
