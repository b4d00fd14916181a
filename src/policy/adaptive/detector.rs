//! The running detector: the model and the sequential tests, fed one
//! outcome at a time.

use super::*;

/// The learned model and the tests tuned to it: the policy's large part,
/// kept behind one allocation made with the policy.
#[derive(Clone, Debug)]
pub(super) struct Model {
    pub(super) learned: Learned,
    pub(super) tuned: Tuned,
}

/// The running state of an [`Adaptive`] policy.
#[derive(Debug)]
pub(crate) struct Detector {
    pub(super) settings: Settings,
    pub(super) warm_up: u64,
    pub(super) horizon: f64,
    pub(super) held: Held,
    pub(super) words_since_retune: u32,
    pub(super) recent: RecentRate,
    /// Whether the tests take the recent rate as the baseline.
    pub(super) risen: bool,
    pub(super) evidence: [Evidence; TESTS],
    /// Whether any test holds evidence: a success adds nothing otherwise.
    pub(super) active: bool,
    /// The streak of the outcomes recorded: the state of the next call.
    pub(super) live: Streak,
    pub(super) model: Box<Model>,
    pub(super) fallback: Box<PolicyState>,
}

impl Detector {
    pub(crate) fn new(policy: &Adaptive) -> Self {
        let settings = Settings::new(policy);
        let learned = Learned::new();
        let chances = learned.chances(settings.max_baseline, settings.max_baseline);
        let tuned = Tuned::new(&settings, &chances, 0.0, settings.max_baseline);
        let mut detector = Detector {
            settings,
            warm_up: u64::from(policy.warm_up),
            horizon: f64::from(policy.baseline_horizon),
            held: Held::default(),
            words_since_retune: 0,
            recent: RecentRate::default(),
            risen: false,
            evidence: [Evidence::default(); TESTS],
            active: false,
            live: Streak::default(),
            model: Box::new(Model { learned, tuned }),
            fallback: Box::new(PolicyState::new(&policy.fallback)),
        };
        detector.retune();
        detector
    }

    pub(super) fn warming_up(&self) -> bool {
        self.model.learned.outcomes < self.warm_up
    }

    /// Whether the policy is still learning from its trips (see the
    /// learning phase on [`Adaptive`]).
    pub(super) fn learning(&self) -> bool {
        self.model.learned.outcomes < LEARNING.max(self.warm_up)
    }

    /// Adds one outcome to every test; the first test that reached its
    /// threshold, if any.
    pub(super) fn judge(&mut self, failure: bool) -> Option<usize> {
        let state = self.live.state();
        let tuned = &self.model.tuned;
        let mut tripped = None;
        let mut active = false;
        for (test, evidence) in self.evidence.iter_mut().enumerate() {
            evidence.statistic += if failure {
                tuned.on_failure[test][state]
            } else {
                tuned.on_success[test]
            };
            if evidence.statistic <= 0.0 {
                *evidence = Evidence::default();
                continue;
            }
            active = true;
            evidence.calls = evidence.calls.saturating_add(1);
            evidence.failures = evidence.failures.saturating_add(u32::from(failure));
            if evidence.statistic >= tuned.threshold[test] && tripped.is_none() {
                tripped = Some(test);
            }
        }
        self.active = active;
        tripped
    }

    /// Learns a word of outcomes, and retunes the tests when due.
    pub(super) fn learn(&mut self, word: u64, bits: u32) {
        let max_rate = self.settings.max_baseline;
        self.model.learned.learn(word, bits, self.horizon, max_rate);
        self.words_since_retune += 1;
        let eager = EAGER.max(self.warm_up.saturating_add(u64::from(BATCH)));
        if self.words_since_retune >= RETUNE_WORDS || self.model.learned.outcomes <= eager {
            self.retune();
        }
    }

    /// The long-run rate tested against: Wilson's upper confidence bound on
    /// the learned rate, over the outcomes it averages, at most the cap.
    pub(super) fn normal_rate(&self) -> f64 {
        let learned = &self.model.learned;
        let n = (learned.outcomes as f64).min(self.horizon).max(1.0);
        let (_, upper) = wilson(learned.rate * n, n, CONFIDENCE_Z);
        upper.min(self.settings.max_baseline)
    }

    /// The baseline rate the tests take, from the long-run rate `normal`:
    /// the recent rate's upper bound while it has risen by less than the
    /// smallest degradation, `normal` otherwise.
    pub(super) fn level(&mut self, normal: f64) -> f64 {
        let recent = self.recent;
        // Nothing can rise above the cap.
        if recent.outcomes < RECENT_MIN || normal >= self.settings.max_baseline {
            self.risen = false;
            return normal;
        }
        let error = recent.standard_error();
        let upper = recent.rate + CONFIDENCE_Z * error;
        // A rise that may be the smallest degradation or more is never
        // learned here: it trips, and keeps tripping.
        if upper >= self.model.learned.rate + self.settings.min_degradation {
            self.risen = false;
            return normal;
        }
        // Once risen, it stays so until the long-run rate has caught up,
        // so the baseline never falls back below the recent rate.
        self.risen = if self.risen {
            recent.rate > normal
        } else {
            recent.rate - RISE_Z * error > normal
        };
        if self.risen {
            upper.min(self.settings.max_baseline).max(normal)
        } else {
            normal
        }
    }

    pub(super) fn retune(&mut self) {
        self.words_since_retune = 0;
        self.model.learned.apply_decay();
        let normal = self.normal_rate();
        let level = self.level(normal);
        // The rise, as independent failures added to the learned chances.
        let extra = (level - normal) / (1.0 - normal);
        let chances = self
            .model
            .learned
            .chances(normal, self.settings.max_baseline);
        self.model.tuned = Tuned::new(&self.settings, &chances, extra, level);
    }

    /// The baseline failure rate the tests take as normal.
    pub(super) fn baseline(&self) -> f64 {
        if self.risen {
            self.recent.rate.min(self.settings.max_baseline)
        } else {
            self.model.learned.rate
        }
    }
}

impl Rule for Detector {
    /// Records one outcome. While warming up, the fallback judges and the
    /// tests only gather evidence.
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        let failure = sample.failure;
        if let Some(filled) = self.held.push(failure) {
            self.recent.learn(filled.failures, BATCH, self.horizon);
            if let Some(word) = filled.oldest {
                self.learn(word, BATCH);
            }
        }
        // A success adds nothing to tests that hold no evidence.
        let tripped = if failure || self.active {
            self.judge(failure)
        } else {
            None
        };
        self.live.push(failure);
        if self.warming_up() {
            return self.fallback.record(sample, now_ms);
        }
        tripped.map(|test| TripReason::Policy(self.figures_of(test, now_ms)))
    }

    /// It learns from every success.
    fn success_matters(&self) -> bool {
        true
    }

    fn records_every_success(&self) -> bool {
        true
    }

    /// The breaker opened (or was reset): the tests start again, and the
    /// outcomes not yet learned are forgotten, unless the policy is still
    /// learning what is normal. The baseline stays.
    fn reset(&mut self) {
        self.evidence = [Evidence::default(); TESTS];
        self.active = false;
        let (failures, calls) = self.held.partial();
        self.recent.learn(failures, calls, self.horizon);
        if self.learning() {
            // A young policy (or the fallback, which knows nothing of the
            // baseline) trips on the dependency's normal failures before it
            // has seen them: forgetting what it tripped on would keep it
            // from ever learning them, and the warm-up from ending.
            let max_rate = self.settings.max_baseline;
            for (word, bits) in self.held.drain() {
                self.model.learned.learn(word, bits, self.horizon, max_rate);
            }
            self.retune();
        }
        self.held = Held::default();
        // The next outcome comes after an open period: nothing is known of
        // the calls just before it.
        self.model.learned.streak = Streak::default();
        self.live = Streak::default();
        self.fallback.reset();
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        // The test nearest to its threshold.
        let tuned = &self.model.tuned;
        let nearness = |test: usize| self.evidence[test].statistic / tuned.threshold[test];
        let nearest = (0..TESTS)
            .max_by(|&a, &b| nearness(a).total_cmp(&nearness(b)))
            .unwrap_or(0);
        self.figures_of(nearest, now_ms)
    }
}

impl Detector {
    /// The figures, with `test`'s evidence: the test nearest to tripping,
    /// or the one that tripped.
    fn figures_of(&self, test: usize, now_ms: u64) -> PolicyFigures {
        let evidence = &self.evidence[test];
        PolicyFigures::Adaptive(AdaptiveFigures {
            baseline: self.baseline(),
            learned: self.model.learned.outcomes,
            statistic: evidence.statistic,
            threshold: self.model.tuned.threshold[test],
            failures: evidence.failures,
            calls: evidence.calls,
            learning: self.learning(),
            fallback: self
                .warming_up()
                .then(|| Box::new(self.fallback.figures(now_ms))),
        })
    }
}
