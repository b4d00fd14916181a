//! Trip policies: pure decisions that take outcomes in and say when to open.
//!
//! A policy sees only closed-state outcomes of the current generation; the
//! breaker resets it whenever it opens. Choose one, or combine several with
//! [`TripPolicy::any_of`]:
//!
//! | policy | trips when | choose it when | in a config file (required in bold) |
//! | --- | --- | --- | --- |
//! | [`ConsecutiveFailures`] | `k` failures in a row | a dependency is either up or down (the default, `k = 5`) | `consecutive_failures`: **`threshold`** |
//! | [`CountWindow`] | `k` of the last `N` outcomes failed | failures interleave with successes; traffic is bursty | `count_window`: **`failures`**, **`window`**, `stale_after` |
//! | [`FailuresWithin`] | `k` failures within a period, whatever the successes | a few failures close together mean the dependency is down (nginx's `max_fails`) | `failures_within`: **`failures`**, **`period`** |
//! | [`TimeWindow`] | failure share over a time window reaches a rate | traffic is steady and a rate means something | `time_window`: **`window`**, `buckets`, `min_calls`, `failure_rate` |
//! | [`SlowCalls`] | share of slow calls reaches a rate | the dependency degrades by slowing down before it fails | `slow_calls`: **`slower_than`**, `rate`, `over_calls` or `over_time = { length, buckets }`, `min_calls` |
//! | [`Adaptive`] | recent outcomes are significantly worse than the dependency's learned baseline, by a sequential test with a stated false-trip rate | the normal failure rate is not zero, differs between dependencies, or drifts | `adaptive`: `false_trips_per_million`, `min_degradation`, `warm_up`, `ceiling`, `baseline_horizon`, `fallback` (a policy) |
//! | [`TripPolicy::any_of`] | any member trips | you want a fast trip on a hard outage and a rate for partial ones | `any_of`: a list of policies |
//! | [`Never`] | never, on its own: only the upstream's pushback, a signal, an operator or the fleet open it | a breaker answers for a quota the upstream announces, not for health | `never`: no settings (`never = {}`) |
//! | [`PerClass`] | the policy of one failure class trips (each counts its class's failures apart) | kinds of failure weigh differently: 3 timeouts, but 20 rate limits | `per_class`: **`rest`** (a policy), `classes` (a table from a failure class's name, such as `timeout` or `rate_limited`, to a policy) |
//!
//! With the `serde` feature a config file writes a policy as a table with
//! one key naming it, whose value holds its settings, named as the
//! builder's methods are (see [`serialization`](crate::serialization) for
//! the rest of a config).

/// Every trip policy, one line each: its type, the type of its figures,
/// the file both live in, and its name in a config (which extends the
/// paths of its settings in a [`ConfigError`], and names it in logs). A
/// policy is its file and its line here: its type, its checks and running
/// state ([`Policy`], [`Rule`]), its figures ([`Figures`]) and how a config
/// file writes it (`FromFile`) are all in its file, and the lines below
/// make the rest: its [`TripPolicy`] and [`PolicyFigures`] variants, their
/// conversions and names, and its place among the policies a config file
/// may name.
macro_rules! policies {
    ($($ty:ident($figures:ident) in $file:ident as $key:literal,)*) => {
        $(mod $file;)*
        $(pub use $file::{$ty, $figures};)*

        /// The rule that decides when a closed breaker opens.
        ///
        /// Build one from a policy type (`ConsecutiveFailures::new(5).into()`) or
        /// pass the policy type straight to [`ConfigBuilder::trip`].
        ///
        /// [`ConfigBuilder::trip`]: crate::ConfigBuilder::trip
        #[derive(Clone, Debug, PartialEq)]
        #[non_exhaustive]
        pub enum TripPolicy {
            $(
                #[doc = concat!("See [`", stringify!($ty), "`].")]
                $ty($ty),
            )*
            /// Trips when any member trips; the first member (in order) that trips
            /// is the one the transition names.
            AnyOf(Vec<TripPolicy>),
        }

        $(
            impl From<$ty> for TripPolicy {
                fn from(policy: $ty) -> Self {
                    TripPolicy::$ty(policy)
                }
            }
        )*

        impl TripPolicy {
            /// The policy as the breaker sees it, whichever it is.
            fn policy(&self) -> &dyn Policy {
                match self {
                    $(TripPolicy::$ty(p) => p,)*
                    TripPolicy::AnyOf(list) => list,
                }
            }

            /// Its name in a config (`time_window`).
            fn key(&self) -> &'static str {
                match self {
                    $(TripPolicy::$ty(_) => $key,)*
                    TripPolicy::AnyOf(_) => ANY_OF,
                }
            }
        }

        /// A trip policy's figures: what it counts now, as a
        /// [`Snapshot`](crate::Snapshot) shows it, or what it had counted
        /// when it tripped, as [`TripReason::Policy`] names it.
        #[derive(Clone, Debug, PartialEq)]
        #[non_exhaustive]
        pub enum PolicyFigures {
            $(
                #[doc = concat!("[`", stringify!($ty), "`]'s.")]
                $ty($figures),
            )*
            /// Figures of each member of an [`any_of`](TripPolicy::any_of), in order.
            AnyOf(Vec<PolicyFigures>),
        }

        $(
            impl From<$figures> for PolicyFigures {
                fn from(figures: $figures) -> Self {
                    PolicyFigures::$ty(figures)
                }
            }
        )*

        impl PolicyFigures {
            /// The policy's name in a config (`time_window`), for logs and
            /// metric labels.
            pub fn policy(&self) -> &'static str {
                match self {
                    $(PolicyFigures::$ty(_) => $key,)*
                    PolicyFigures::AnyOf(_) => ANY_OF,
                }
            }

            /// The figures as the policy shows them, whichever it is.
            fn shown(&self) -> &dyn Figures {
                match self {
                    $(PolicyFigures::$ty(figures) => figures,)*
                    PolicyFigures::AnyOf(members) => members,
                }
            }
        }

        /// Each policy a config file may name as a table of settings, by
        /// its name: the settings it knows, and how it reads them.
        #[cfg(feature = "serde")]
        pub(crate) const IN_FILES: &[InFile] = &[
            $(InFile {
                key: $key,
                fields: <$ty as FromFile>::FIELDS,
                read: |written| <$ty as FromFile>::from_file(written).map(TripPolicy::from),
            },)*
        ];
    };
}

policies! {
    ConsecutiveFailures(ConsecutiveFailuresFigures) in consecutive as "consecutive_failures",
    CountWindow(CountWindowFigures) in count_window as "count_window",
    TimeWindow(TimeWindowFigures) in time_window as "time_window",
    SlowCalls(SlowCallsFigures) in slow_calls as "slow_calls",
    Adaptive(AdaptiveFigures) in adaptive as "adaptive",
    PerClass(PerClassFigures) in per_class as "per_class",
    FailuresWithin(FailuresWithinFigures) in failures_within as "failures_within",
    Never(NeverFigures) in never as "never",
}

mod any_of;

use std::fmt;
use std::time::Duration;

pub use slow_calls::Window;

use crate::error::ConfigError;
use crate::outcome::FailureClass;

/// The name of [`TripPolicy::AnyOf`] in a config: a list of policies.
pub(crate) const ANY_OF: &str = "any_of";

/// A policy a config file may name (see `IN_FILES`).
#[cfg(feature = "serde")]
pub(crate) struct InFile {
    /// Its name in a config.
    pub(crate) key: &'static str,
    /// The settings it knows.
    pub(crate) fields: &'static [&'static str],
    /// Reads it from its settings as written.
    pub(crate) read: fn(&dyn Written) -> Result<TripPolicy, ConfigError>,
}

/// A trip policy's settings as a config file writes them, read by name:
/// the file format implements it (the `serde` feature's reader), and each
/// policy's file reads its own settings through it ([`FromFile`]), so that
/// the policy's file is the one place that knows them. Each read is
/// `None` when the field is not written, and an error naming the field's
/// path when it is written as the wrong type.
#[cfg(feature = "serde")]
pub(crate) trait Written {
    /// The path of `field` in the file (`trip.count_window.window`).
    fn path(&self, field: &str) -> String;

    /// Whether `field` is written.
    fn has(&self, field: &str) -> bool;

    /// A whole number.
    fn count(&self, field: &str) -> Result<Option<u32>, ConfigError>;

    /// A number.
    fn number(&self, field: &str) -> Result<Option<f64>, ConfigError>;

    /// A duration (`"30s"`).
    fn duration(&self, field: &str) -> Result<Option<Duration>, ConfigError>;

    /// A trip policy.
    fn policy(&self, field: &str) -> Result<Option<TripPolicy>, ConfigError>;

    /// A table of trip policies by name, in the order of their names.
    fn policies(&self, field: &str) -> Result<Vec<(String, TripPolicy)>, ConfigError>;

    /// A table of settings of its own, which may hold only `fields`.
    fn table<'a>(
        &'a self,
        field: &str,
        fields: &'static [&'static str],
    ) -> Result<Option<Box<dyn Written + 'a>>, ConfigError>;
}

/// A field a policy cannot do without: its value, or an error naming it.
#[cfg(feature = "serde")]
pub(crate) fn required<T>(
    written: &dyn Written,
    field: &str,
    read: impl FnOnce(&dyn Written, &str) -> Result<Option<T>, ConfigError>,
) -> Result<T, ConfigError> {
    read(written, field)?.ok_or_else(|| ConfigError::new(written.path(field), "is required"))
}

/// How a config file writes a trip policy: the settings it knows, and how
/// it is made from them. Its values are converted here and checked where
/// code's are, when the config is built.
#[cfg(feature = "serde")]
pub(crate) trait FromFile: Sized {
    /// The settings it knows; any other is an error.
    const FIELDS: &'static [&'static str];

    /// The policy `written` describes.
    fn from_file(written: &dyn Written) -> Result<Self, ConfigError>;
}

impl TripPolicy {
    /// Combine policies: the breaker opens as soon as any of them trips.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::policy::{ConsecutiveFailures, TimeWindow, TripPolicy};
    ///
    /// let policy = TripPolicy::any_of([
    ///     TripPolicy::from(ConsecutiveFailures::new(5)),
    ///     TimeWindow::new(Duration::from_secs(60)).failure_rate(0.3).into(),
    /// ]);
    /// ```
    pub fn any_of(policies: impl IntoIterator<Item = TripPolicy>) -> Self {
        TripPolicy::AnyOf(policies.into_iter().collect())
    }

    /// Checks the settings; `path` is the config's path to this policy
    /// (`trip`, `trip.any_of[1]`), which the policy's key extends.
    pub(crate) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        self.policy().validate(&format!("{path}.{}", self.key()))
    }

    /// Whether recording a success needs the time: time windows do; streaks
    /// and count windows only need it for failures; an adaptive policy only
    /// for its fallback.
    pub(crate) fn needs_clock(&self) -> bool {
        self.policy().needs_clock()
    }

    /// Whether calls must be timed.
    pub(crate) fn needs_latency(&self) -> bool {
        self.policy().needs_latency()
    }

    /// The lowest slow-call threshold: a success slower than it may be a
    /// slow call and is always recorded.
    pub(crate) fn slow_threshold(&self) -> Option<Duration> {
        self.policy().slow_threshold()
    }
}

/// What a trip policy's settings are to the breaker. Each policy implements
/// it in its own file, beside [`Rule`], the state it runs with: the
/// breaker, the config and the snapshot ask nothing else of a policy.
pub(crate) trait Policy {
    /// Checks the settings; `path` ends with the policy's key.
    fn validate(&self, path: &str) -> Result<(), ConfigError>;

    /// Whether recording a success needs the time (a failure always reads
    /// it, to date an opening).
    fn needs_clock(&self) -> bool;

    /// Whether calls must be timed.
    fn needs_latency(&self) -> bool {
        false
    }

    /// The lowest slow-call threshold it judges by, if any.
    fn slow_threshold(&self) -> Option<Duration> {
        None
    }

    /// Its state, fresh.
    fn start(&self) -> PolicyState;
}

/// A trip policy's running state: it sees the closed-state outcomes of one
/// generation, says when to trip, and shows its figures.
pub(crate) trait Rule: fmt::Debug + Send {
    /// Records one outcome; returns the reason to trip, if any.
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason>;

    /// Whether a success (no slower than any slow-call threshold) must be
    /// recorded at once, under the breaker's lock (see
    /// [`PolicyState::success_matters`]).
    fn success_matters(&self) -> bool;

    /// Whether it records every success under the lock, whatever its
    /// figures: successes are then never tallied.
    fn records_every_success(&self) -> bool {
        false
    }

    /// Calls `f` with each set of buckets of time it counts calls in (a
    /// tallied success is added to every one).
    fn each_buckets(&mut self, f: &mut dyn FnMut(&mut time_window::Buckets)) {
        let _ = f;
    }

    /// Starts afresh: called whenever the breaker opens, and on a reset.
    fn reset(&mut self);

    /// Its figures at `now_ms`.
    fn figures(&self, now_ms: u64) -> PolicyFigures;
}

impl Default for TripPolicy {
    fn default() -> Self {
        ConsecutiveFailures::default().into()
    }
}

/// Why a breaker opened: a policy tripped (with its figures), or a probe
/// failed, or something outside the calls decided.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TripReason {
    /// A trip policy tripped, with its figures as it did
    /// ([`PolicyFigures::policy`] names it).
    Policy(PolicyFigures),
    /// A [`PerClass`] member tripped: the class whose failures it counts,
    /// and its own reason.
    PerClass {
        /// The failures' class.
        class: crate::outcome::FailureClass,
        /// Why that class's policy tripped.
        reason: Box<TripReason>,
    },
    /// A half-open probe failed.
    ProbeFailed,
    /// A half-open probe was still running after the probe timeout.
    ProbeTimedOut,
    /// A half-open probe's caller dropped it before its outcome: the
    /// breaker opens again for the period it just had.
    ProbeCancelled,
    /// An operator changed the state (force open or closed, disable,
    /// restore, reset).
    Manual,
    /// The upstream announced a retry-after (a failing status's `Retry-After` or rate-limit reset, gRPC
    /// pushback) and the config trips at once on one
    /// ([`ConfigBuilder::trip_on_pushback`](crate::ConfigBuilder::trip_on_pushback)).
    Pushback {
        /// The announced delay, capped by `max_open`.
        retry_after: std::time::Duration,
    },
    /// The fleet decided, through shared state: another instance opened the
    /// breaker (or it was open when this instance joined), or the fleet
    /// closed it.
    Shared,
    /// Code outside the breaker's calls saw the dependency struggle (a load
    /// shedder, a health check, a quota alarm) and said so with
    /// [`Breaker::open_on_signal`](crate::Breaker::open_on_signal).
    Signal {
        /// What the code that tripped it said.
        reason: std::sync::Arc<str>,
    },
}

impl TripReason {
    /// A short name for the policy or event behind this reason, for logs and
    /// metric labels: the policy's name in a config, or the event's.
    pub fn policy(&self) -> &'static str {
        match self {
            TripReason::Policy(figures) => figures.policy(),
            TripReason::PerClass { reason, .. } => reason.policy(),
            TripReason::ProbeFailed => "probe_failed",
            TripReason::ProbeTimedOut => "probe_timed_out",
            TripReason::ProbeCancelled => "probe_cancelled",
            TripReason::Manual => "manual",
            TripReason::Pushback { .. } => "pushback",
            TripReason::Shared => "shared",
            TripReason::Signal { .. } => "signal",
        }
    }

    /// The figures of the policy that tripped, a per-class member's
    /// included; none for the other reasons.
    pub fn figures(&self) -> Option<&PolicyFigures> {
        match self {
            TripReason::Policy(figures) => Some(figures),
            TripReason::PerClass { reason, .. } => reason.figures(),
            _ => None,
        }
    }
}

impl fmt::Display for TripReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TripReason::Policy(figures) => figures.shown().tripped(f),
            TripReason::PerClass { class, reason } => write!(f, "{reason} of class {class}"),
            TripReason::ProbeFailed => f.write_str("half-open probe failed"),
            TripReason::ProbeTimedOut => f.write_str("half-open probe timed out"),
            TripReason::ProbeCancelled => f.write_str("half-open probe cancelled by its caller"),
            TripReason::Manual => f.write_str("set by an operator"),
            TripReason::Pushback { retry_after } => write!(
                f,
                "the upstream asked to come back in {} ms",
                crate::millis::millis_up(*retry_after)
            ),
            TripReason::Shared => f.write_str("decided by the fleet through shared state"),
            TripReason::Signal { reason } => write!(f, "tripped from outside its calls: {reason}"),
        }
    }
}

impl PolicyFigures {
    /// Its figures by name, as the serde form writes them.
    #[cfg(feature = "serde")]
    pub(crate) fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        self.shown().fields()
    }
}

/// What a policy's figures are to their readers: each policy's figures
/// type implements it in the policy's file.
pub(crate) trait Figures {
    /// The trip these figures describe, in words (`5 consecutive
    /// failures`): a [`TripReason`]'s text.
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// Its figures by name, as the serde form writes them.
    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)>;
}

/// One figure of a policy, as the serde form writes it.
#[cfg(feature = "serde")]
pub(crate) enum Figure<'a> {
    /// A whole number.
    Count(u64),
    /// A number, such as a rate.
    Number(f64),
    /// Yes or no.
    Flag(bool),
    /// A duration, written in whole milliseconds.
    Duration(Duration),
    /// Another policy's figures, if any.
    Figures(Option<&'a PolicyFigures>),
    /// Other policies' figures, in order.
    Members(&'a [PolicyFigures]),
    /// Each failure class's policy's figures.
    Classes(&'a [(FailureClass, PolicyFigures)]),
}

/// One recorded closed-state outcome.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) failure: bool,
    /// A failure's class, if its classifier said.
    pub(crate) class: Option<FailureClass>,
    /// The call's latency, when a policy times calls.
    pub(crate) elapsed: Option<Duration>,
}

/// The running state of a [`TripPolicy`]: the default policy's streak held
/// inline (a breaker with the default policy allocates nothing for it),
/// any other policy's rule boxed.
#[derive(Debug)]
pub(crate) enum PolicyState {
    InARow(consecutive::InARow),
    Rule(Box<dyn Rule>),
}

impl PolicyState {
    pub(crate) fn new(policy: &TripPolicy) -> Self {
        policy.policy().start()
    }

    fn rule(&self) -> &dyn Rule {
        match self {
            PolicyState::InARow(in_a_row) => in_a_row,
            PolicyState::Rule(rule) => rule.as_ref(),
        }
    }

    fn rule_mut(&mut self) -> &mut dyn Rule {
        match self {
            PolicyState::InARow(in_a_row) => in_a_row,
            PolicyState::Rule(rule) => rule.as_mut(),
        }
    }

    /// Records one outcome; returns the reason to trip, if any.
    pub(crate) fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        self.rule_mut().record(sample, now_ms)
    }

    /// Whether a success (no slower than any slow-call threshold) must be
    /// recorded at once, under the breaker's lock. When it need not, the
    /// breaker skips it, or, for policies that count calls in time, adds it
    /// to a tally of successes folded in later (see [`Self::tally_end`]).
    pub(crate) fn success_matters(&self) -> bool {
        self.rule().success_matters()
    }

    /// Whether a member records every success under the lock, whatever
    /// the figures (an adaptive policy): successes are then never tallied.
    pub(crate) fn records_every_success(&self) -> bool {
        self.rule().records_every_success()
    }

    /// For policies that count calls in buckets of time: until when a
    /// success made at `now_ms` falls in the same bucket of every such
    /// policy, so that successes made before then may be counted together.
    /// `None` when no policy counts calls in time (an adaptive policy
    /// records every success itself).
    pub(crate) fn tally_end(&mut self, now_ms: u64) -> Option<u64> {
        let mut end: Option<u64> = None;
        self.each_buckets(&mut |buckets| {
            let bucket_end = buckets.bucket_end(now_ms);
            end = Some(end.map_or(bucket_end, |end| end.min(bucket_end)));
        });
        end
    }

    /// Counts `count` successes made at `at_ms` that were tallied rather
    /// than recorded: calls that are not hits, in every policy that counts
    /// calls in time. (The others skip such successes, as they are only
    /// tallied while no success matters.)
    pub(crate) fn add_successes(&mut self, count: u32, at_ms: u64) {
        self.each_buckets(&mut |buckets| buckets.add_calls(count, at_ms));
    }

    pub(crate) fn each_buckets(&mut self, f: &mut dyn FnMut(&mut time_window::Buckets)) {
        self.rule_mut().each_buckets(f);
    }

    /// Called whenever the breaker opens, and on a manual reset. An adaptive
    /// policy clears its test and keeps its baseline.
    pub(crate) fn reset(&mut self) {
        self.rule_mut().reset();
    }

    pub(crate) fn figures(&self, now_ms: u64) -> PolicyFigures {
        self.rule().figures(now_ms)
    }
}
