//! Count window: trip when `failures` of the last `window` outcomes failed.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

#[cfg(feature = "serde")]
use super::{required, Figure, FromFile, Written};
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripReason};
use crate::error::ConfigError;
use crate::millis::millis;

/// The most failures a count window may require; bounds the memory a window
/// keeps (16 bytes per failure).
pub(crate) const MAX_FAILURES: u32 = 100_000;

/// Trips when at least `failures` of the last `window` recorded outcomes are
/// failures ("3 of the last 10"). Outcomes older than [`stale_after`] do not
/// count, so a failure from last night cannot combine with two from this
/// morning.
///
/// The window is a true ring over outcomes: after a thousand successes, the
/// next `failures` failures within `window` calls trip it. A success writes
/// nothing shared while the window holds no failure, and never reads the
/// clock.
///
/// [`stale_after`]: CountWindow::stale_after
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{policy::CountWindow, Config};
///
/// let config = Config::builder()
///     .trip(CountWindow::new(3, 10).stale_after(Duration::from_secs(60)))
///     .build()?;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountWindow {
    failures: u32,
    window: u32,
    stale_after: Option<Duration>,
}

impl CountWindow {
    /// Trip when `failures` of the last `window` outcomes are failures.
    pub fn new(failures: u32, window: u32) -> Self {
        CountWindow {
            failures,
            window,
            stale_after: None,
        }
    }

    /// Outcomes older than `age` no longer count toward the window.
    pub fn stale_after(mut self, age: Duration) -> Self {
        self.stale_after = Some(age);
        self
    }

    /// Failures needed to trip.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Number of most recent outcomes considered.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Age after which an outcome no longer counts, if set.
    pub fn staleness(&self) -> Option<Duration> {
        self.stale_after
    }
}

#[cfg(feature = "serde")]
impl FromFile for CountWindow {
    const FIELDS: &'static [&'static str] = &["failures", "window", "stale_after"];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        let failures = required(written, "failures", |w, f| w.count(f))?;
        let window = required(written, "window", |w, f| w.count(f))?;
        let mut policy = CountWindow::new(failures, window);
        if let Some(age) = written.duration("stale_after")? {
            policy = policy.stale_after(age);
        }
        Ok(policy)
    }
}

impl Policy for CountWindow {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.failures == 0 {
            return Err(ConfigError::new(
                format!("{path}.failures"),
                "must be at least 1",
            ));
        }
        if self.failures > MAX_FAILURES {
            return Err(ConfigError::new(
                format!("{path}.failures"),
                format!("must be at most {MAX_FAILURES}"),
            ));
        }
        if self.failures > self.window {
            return Err(ConfigError::new(
                format!("{path}.failures"),
                format!("must be at most the window ({})", self.window),
            ));
        }
        if self.stale_after == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                format!("{path}.stale_after"),
                "must be longer than zero",
            ));
        }
        Ok(())
    }

    fn needs_clock(&self) -> bool {
        false
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(Ring::new(self)))
    }
}

/// Keeps the `failures` most recent failures as (outcome number, time). The
/// breaker trips when the oldest of them is still inside the window by count
/// and by age: then all of them are.
#[derive(Debug)]
pub(crate) struct Ring {
    failures: u32,
    window: u64,
    stale_after_ms: Option<u64>,
    /// Outcomes recorded while the window held a failure. Successes while it
    /// holds none are not counted: they could not change a verdict.
    outcomes: u64,
    recent: VecDeque<(u64, u64)>,
}

impl Ring {
    pub(crate) fn new(policy: &CountWindow) -> Self {
        Ring {
            failures: policy.failures,
            window: policy.window as u64,
            stale_after_ms: policy.stale_after.map(|d| millis(d).max(1)),
            outcomes: 0,
            recent: VecDeque::new(),
        }
    }

    fn expire_by_count(&mut self) {
        while let Some(&(n, _)) = self.recent.front() {
            if n + self.window <= self.outcomes {
                self.recent.pop_front();
            } else {
                break;
            }
        }
    }

    /// Failures inside the window by count and by age.
    fn counted(&self, now_ms: u64) -> u32 {
        let fresh = |&&(_, at): &&(u64, u64)| match self.stale_after_ms {
            Some(age) => now_ms.saturating_sub(at) < age,
            None => true,
        };
        self.recent.iter().filter(fresh).count() as u32
    }
}

impl Rule for Ring {
    /// Records one outcome. `now_ms` is read only for a failure: a success
    /// moves the window by count and cannot trip it.
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        self.outcomes += 1;
        if !sample.failure {
            self.expire_by_count();
            return None;
        }
        self.recent.push_back((self.outcomes, now_ms));
        if self.recent.len() > self.failures as usize {
            self.recent.pop_front();
        }
        self.expire_by_count();
        let counted = self.counted(now_ms);
        (counted >= self.failures).then(|| TripReason::Policy(self.figures_with(counted)))
    }

    fn success_matters(&self) -> bool {
        !self.recent.is_empty()
    }

    fn reset(&mut self) {
        self.outcomes = 0;
        self.recent.clear();
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        self.figures_with(self.counted(now_ms))
    }
}

impl Ring {
    /// Its figures, holding `failures` failures.
    fn figures_with(&self, failures: u32) -> PolicyFigures {
        PolicyFigures::CountWindow(CountWindowFigures {
            failures,
            threshold: self.failures,
            window: self.window as u32,
        })
    }
}

/// [`CountWindow`]'s figures: failures inside the window (by count and
/// age), the failures that trip, and the window's size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountWindowFigures {
    /// Failures in the window.
    pub failures: u32,
    /// Failures that trip.
    pub threshold: u32,
    /// Size of the window.
    pub window: u32,
}

impl Figures for CountWindowFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failures in the last {} calls",
            self.failures, self.window
        )
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("failures", Figure::Count(self.failures.into())),
            ("threshold", Figure::Count(self.threshold.into())),
            ("window", Figure::Count(self.window.into())),
        ]
    }
}
