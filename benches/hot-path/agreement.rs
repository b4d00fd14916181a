//! The driver-agreement check, printed after the summary table: the same
//! row's added cost under each loop that makes the same call (async,
//! hand-polled, `block_on`, stack-pinned), side by side, with the rows on
//! which two loops disagree named, and the ratios of this crate's cost to
//! recloser's and to the floor's under each loop.
//!
//! Every inner service answers at once, so the loops differ only in the
//! code around the call; a row whose figure moves with the loop says more
//! about where the compiler put that row's code than about the service, and
//! a comparison that holds under one loop only is not one users can count
//! on. So the check reports each loop's figure and never averages them.

use crate::scenario::{ratio, Caller, Scenario};

/// The callers that make the same call, whose rows the agreement check
/// compares, in the order of its columns.
const AGREEING: [Caller; 4] = [Caller::Async, Caller::Hand, Caller::BlockOn, Caller::Stack];

/// Two drivers disagree on a row when its added cost under one is more
/// than this much above its cost under the other, relative to the
/// smaller...
const DISAGREE_RATIO: f64 = 0.25;
/// ...and more than this many nanoseconds above it.
const DISAGREE_NS: f64 = 5.0;

/// The driver-agreement check: every row measured over a baseline by more
/// than one of the [`AGREEING`] callers, its added nanoseconds under each,
/// and a `DISAGREE:` line for each row whose drivers disagree (the widest
/// pair: if any two disagree, those do). Then, per driver, this crate's
/// added cost over recloser's and over the floor's, closed and open.
/// Nothing is averaged: a figure that holds under one driver only is
/// reported as such.
pub fn report(scenarios: &[Scenario], plus: &[Option<f64>]) {
    // Each row's name within its caller, with its added cost per driver, in
    // the order the rows first appear.
    let mut rows: Vec<(&str, [Option<f64>; 4])> = Vec::new();
    for (scenario, plus) in scenarios.iter().zip(plus) {
        let Some(column) = AGREEING.iter().position(|&c| c == scenario.caller) else {
            continue;
        };
        let (Some(_), Some(plus)) = (&scenario.baseline, *plus) else {
            continue;
        };
        let name = &scenario.name[scenario.caller.prefix().len()..];
        match rows.iter_mut().find(|(row, _)| *row == name) {
            Some((_, costs)) => costs[column] = Some(plus),
            None => {
                let mut costs = [None; 4];
                costs[column] = Some(plus);
                rows.push((name, costs));
            }
        }
    }
    rows.retain(|(_, costs)| costs.iter().flatten().count() > 1);
    if rows.is_empty() {
        return;
    }

    println!();
    println!(
        "driver agreement: +ns of every row measured by more than one driver \
         (async, hand, block_on, stack-pinned)"
    );
    println!(
        "DISAGREE: a row whose +ns under one driver is more than {:.0}% above (of the smaller) \
         and more than {DISAGREE_NS:.0} ns above its +ns under another",
        DISAGREE_RATIO * 100.0
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>9}",
        "scenario", "async", "hand", "block_on", "stack"
    );
    let mut disagreements = Vec::new();
    for (name, costs) in &rows {
        let cell = |c: Option<f64>| c.map_or("-".to_string(), |c| format!("{c:.2}"));
        println!(
            "{:<44} {:>9} {:>9} {:>9} {:>9}",
            name,
            cell(costs[0]),
            cell(costs[1]),
            cell(costs[2]),
            cell(costs[3])
        );
        let present = || {
            AGREEING
                .iter()
                .zip(costs)
                .filter_map(|(caller, cost)| cost.map(|cost| (*caller, cost)))
        };
        let low = present().min_by(|a, b| a.1.total_cmp(&b.1));
        let high = present().max_by(|a, b| a.1.total_cmp(&b.1));
        if let (Some((low_by, low)), Some((high_by, high))) = (low, high) {
            let apart = high - low;
            // A smaller side at or under zero makes any gap over the
            // nanoseconds' threshold a disagreement.
            if apart > DISAGREE_NS && apart > DISAGREE_RATIO * low.max(0.0) {
                disagreements.push(format!(
                    "DISAGREE: {name}: {:.2} ns under {} against {:.2} ns under {} \
                     ({:.2} ns apart, {})",
                    high,
                    driver_name(high_by),
                    low,
                    driver_name(low_by),
                    apart,
                    ratio(high, Some(low))
                ));
            }
        }
    }
    if disagreements.is_empty() {
        println!("no row's drivers disagree");
    }
    for line in &disagreements {
        println!("{line}");
    }

    // The ratios the targets are set in, per driver.
    let cost = |caller: Caller, row: &str| {
        let name = format!("{}{row}", caller.prefix());
        scenarios
            .iter()
            .zip(plus)
            .find(|(s, _)| s.name == name)
            .and_then(|(_, plus)| *plus)
    };
    println!();
    println!(
        "this crate's +ns over recloser's and over the floor's, per driver: closed is \
         closed/consecutive over peer/closed/recloser and floor/closed, rejected is \
         rejected over peer/rejected/recloser and floor/rejected"
    );
    println!(
        "{:<10} {:>20} {:>20} {:>20} {:>20}",
        "driver", "closed / recloser", "closed / floor", "rejected / recloser", "rejected / floor"
    );
    for caller in AGREEING {
        let over = |ours: &str, theirs: &str| match cost(caller, ours) {
            Some(ours) => ratio(ours, cost(caller, theirs)),
            None => String::new(),
        };
        println!(
            "{:<10} {:>20} {:>20} {:>20} {:>20}",
            driver_name(caller),
            over("closed/consecutive", "peer/closed/recloser"),
            over("closed/consecutive", "floor/closed"),
            over("rejected", "peer/rejected/recloser"),
            over("rejected", "floor/rejected"),
        );
    }
}

/// A caller's name in the agreement check's text.
fn driver_name(caller: Caller) -> &'static str {
    match caller {
        Caller::Async => "async",
        Caller::Hand => "hand",
        Caller::BlockOn => "block_on",
        Caller::Stack => "stack",
        Caller::Oneshot => "oneshot",
        Caller::CloneDrop => "clone_drop",
    }
}
