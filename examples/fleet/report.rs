//! The report: what the scenario measured, per instance and over the fleet,
//! and its printing as a table and a summary in words.
#![allow(dead_code)] // each user reads a different part of it

use std::fmt::Write as _;
use std::time::Duration;

use tower_circuit_breaker::policy::TripReason;
use tower_circuit_breaker::State;

use super::scenario::{instance_name, Timing};

/// One state change seen on one instance.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When, from the start.
    pub at: Duration,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// Why, as the breaker reported it.
    pub reason: Option<TripReason>,
}

/// One probe: a call that reached the provider while its instance's
/// breaker was half-open.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// The instance that sent it.
    pub instance: usize,
    /// When it started and ended, from the start.
    pub started: Duration,
    /// When it ended.
    pub ended: Duration,
    /// Whether the provider answered.
    pub succeeded: bool,
}

/// What one instance did and saw.
#[derive(Clone, Debug, Default)]
pub struct InstanceReport {
    /// Its name in probe locks, `i0`, `i1`...
    pub name: String,
    /// Requests sent through its breaker.
    pub requests: u64,
    /// Answered by the provider.
    pub answered: u64,
    /// Failed by the provider.
    pub failed: u64,
    /// Refused by the breaker, without calling the provider.
    pub refused: u64,
    /// Calls that reached the provider.
    pub upstream_calls: u64,
    /// Of those, probes (sent while this instance's breaker was half-open).
    pub probes: u64,
    /// Probe locks this instance's store won.
    pub probe_locks_won: u64,
    /// Requests sent while the provider was failing.
    pub outage_requests: u64,
    /// Calls that reached the provider while it was failing.
    pub outage_upstream_calls: u64,
    /// Requests refused after the provider had recovered, while the fleet
    /// waited for its next probe.
    pub refused_after_recovery: u64,
    /// Times its store found Redis unavailable.
    pub store_unavailable: u64,
    /// Its breaker's transitions, in order.
    pub transitions: Vec<Seen>,
}

/// Everything the scenario measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// The scenario.
    pub timing: Timing,
    /// Per instance.
    pub instances: Vec<InstanceReport>,
    /// Every probe, in the order they ended.
    pub probes: Vec<Probe>,
    /// The instances whose closed-state failures came before the first
    /// opening, in order.
    pub trip_failures: Vec<usize>,
    /// Calls that reached the provider during the outage before any
    /// instance had opened.
    pub outage_calls_before_open: u64,
    /// When the first instance opened, from the start.
    pub first_open: Option<Duration>,
    /// Whether every breaker was closed at the end.
    pub all_closed: bool,
    /// How long the traffic ran.
    pub ran_for: Duration,
}

impl Report {
    /// Requests over the fleet.
    pub fn total(&self, field: impl Fn(&InstanceReport) -> u64) -> u64 {
        self.instances.iter().map(field).sum()
    }

    /// When every instance had opened once, from the start.
    pub fn all_open(&self) -> Option<Duration> {
        self.latest(|i| {
            i.transitions
                .iter()
                .find(|t| t.to == State::Open)
                .map(|t| t.at)
        })
    }

    /// When the last instance closed after the outage, from the start.
    pub fn all_closed_at(&self) -> Option<Duration> {
        if !self.all_closed {
            return None;
        }
        self.latest(|i| {
            i.transitions
                .last()
                .filter(|t| t.to == State::Closed)
                .map(|t| t.at)
        })
    }

    /// The latest of one moment per instance; `None` if any instance has
    /// none.
    fn latest(&self, at: impl Fn(&InstanceReport) -> Option<Duration>) -> Option<Duration> {
        self.instances
            .iter()
            .map(at)
            .try_fold(Duration::ZERO, |latest, at| at.map(|at| latest.max(at)))
    }

    /// Probes sent while the provider was failing.
    pub fn outage_probes(&self) -> impl Iterator<Item = &Probe> {
        let (from, to) = self.timing.outage();
        self.probes
            .iter()
            .filter(move |p| p.started >= from && p.started < to)
    }

    /// The most open periods that fit between the first opening and the
    /// provider's recovery: each probe during the outage ends one.
    pub fn outage_periods(&self) -> u64 {
        let Some(opened) = self.first_open else {
            return 0;
        };
        let span = self.timing.outage().1.saturating_sub(opened);
        span.as_nanos().div_ceil(self.timing.cooldown.as_nanos()) as u64
    }
}

/// The table per instance.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:>9} {:>9} {:>7} {:>8} {:>15} {:>7} {:>16}",
        "instance",
        "requests",
        "answered",
        "failed",
        "refused",
        "upstream calls",
        "probes",
        "probe locks won"
    );
    let row = |out: &mut String, name: &str, r: &InstanceReport| {
        let _ = writeln!(
            out,
            "{:<8} {:>9} {:>9} {:>7} {:>8} {:>15} {:>7} {:>16}",
            name,
            r.requests,
            r.answered,
            r.failed,
            r.refused,
            r.upstream_calls,
            r.probes,
            r.probe_locks_won
        );
    };
    for instance in &report.instances {
        row(&mut out, &instance.name, instance);
    }
    let fleet = InstanceReport {
        requests: report.total(|i| i.requests),
        answered: report.total(|i| i.answered),
        failed: report.total(|i| i.failed),
        refused: report.total(|i| i.refused),
        upstream_calls: report.total(|i| i.upstream_calls),
        probes: report.total(|i| i.probes),
        probe_locks_won: report.total(|i| i.probe_locks_won),
        ..InstanceReport::default()
    };
    row(&mut out, "fleet", &fleet);
    out
}

/// What the figures say, in words.
pub fn summary(report: &Report) -> String {
    let timing = &report.timing;
    let (from, to) = timing.outage();
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "The provider failed from {} to {}.",
        secs(from),
        secs(to)
    );
    match (report.first_open, report.all_open()) {
        (Some(first), Some(all)) => {
            let who: Vec<String> = report
                .trip_failures
                .iter()
                .map(|&i| instance_name(i))
                .collect();
            let own: Vec<&str> = report
                .instances
                .iter()
                .filter(|i| {
                    i.transitions
                        .iter()
                        .find(|t| t.to == State::Open)
                        .is_some_and(|t| t.reason != Some(TripReason::Shared))
                })
                .map(|i| i.name.as_str())
                .collect();
            let how = if own.is_empty() {
                format!(
                    "no instance saw {} failures itself: the fleet's count in Redis decided, \
                     and every instance opened with reason `shared`",
                    timing.threshold
                )
            } else {
                format!(
                    "{} tripped on its own evidence and shared the opening; the others followed",
                    own.join(", ")
                )
            };
            let _ = writeln!(
                out,
                "- The breaker opened at {} and on all {} instances by {}, after failures on {}: {how}.",
                secs(first),
                report.instances.len(),
                secs(all),
                who.join(", "),
            );
        }
        _ => {
            let _ = writeln!(out, "- The breaker did not open on every instance.");
        }
    }
    let requests = report.total(|i| i.outage_requests);
    let upstream = report.total(|i| i.outage_upstream_calls);
    let probes = report.outage_probes().count() as u64;
    let before = report.outage_calls_before_open;
    let late = upstream.saturating_sub(before + probes);
    let _ = writeln!(
        out,
        "- During the outage the fleet took {requests} requests and {upstream} reached the provider: \
         {before} before the breaker opened, {late} already admitted as it opened, and {probes} probes \
         (at most {} open periods of {} fit between the opening and the recovery).",
        report.outage_periods(),
        secs(timing.cooldown),
    );
    let locks = report.total(|i| i.probe_locks_won);
    let mut probers: Vec<String> = Vec::new();
    for instance in &report.instances {
        if instance.probes > 0 {
            probers.push(format!("{} {}", instance.name, instance.probes));
        }
    }
    let _ = writeln!(
        out,
        "- Probes over the whole run: {} ({}), each sent by the instance holding the fleet's \
         probe lock for its period ({locks} locks won); the other instances kept refusing.",
        report.probes.len(),
        probers.join(", "),
    );
    let recovered = report.probes.iter().find(|p| p.succeeded);
    match (recovered, report.all_closed_at()) {
        (Some(probe), Some(closed)) => {
            let _ = writeln!(
                out,
                "- The first probe after the recovery, by {} at {}, was answered, and every \
                 instance had closed by {}. Meanwhile the fleet refused {} requests the provider \
                 could have answered: the price of waiting for a probe.",
                instance_name(probe.instance),
                secs(probe.started),
                secs(closed),
                report.total(|i| i.refused_after_recovery),
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "- Not every instance had closed when the demo stopped, {} in.",
                secs(report.ran_for)
            );
        }
    }
    let unavailable = report.total(|i| i.store_unavailable);
    if unavailable > 0 {
        let _ = writeln!(
            out,
            "- Redis was unavailable {unavailable} times on some instance (a loaded machine?): \
             meanwhile those instances ran on their local breakers, and may have probed on their own."
        );
    }
    out
}
