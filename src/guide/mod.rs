//! The guide: how to wire the breaker, choose its settings, run it across a
//! fleet and operate it, a page per subject.
//!
//! Every example on these pages compiles and runs as a doc test. The pages
//! are listed, with what each teaches, on the [crate's front page](crate#the-guide).
//! The studies behind the figures they quote are in the repository, beside
//! their benches, each with the command that regenerates its tables:
//! `benches/hot-path/README.md` (the cost study),
//! `benches/fleet/README.md` (the fleet studies) and
//! `benches/outage_support/README.md` (what an outage costs, and the
//! adaptive policy study).

#[doc = include_str!("behaviour.md")]
pub mod behaviour {}

#[doc = include_str!("stack.md")]
pub mod stack {}

#[doc = include_str!("clients.md")]
pub mod clients {}

#[doc = include_str!("readiness.md")]
pub mod readiness {}

#[doc = include_str!("policies.md")]
pub mod policies {}

#[doc = include_str!("classification.md")]
pub mod classification {}

#[doc = include_str!("keyed.md")]
pub mod keyed {}

#[doc = include_str!("failover.md")]
pub mod failover {}

#[doc = include_str!("probes.md")]
pub mod probes {}

#[doc = include_str!("outside_tower.md")]
pub mod outside_tower {}

#[doc = include_str!("fleet.md")]
pub mod fleet {}

#[doc = include_str!("operations.md")]
pub mod operations {}

#[doc = include_str!("testing.md")]
pub mod testing {}

#[doc = include_str!("cost.md")]
pub mod cost {}

#[doc = include_str!("limits.md")]
pub mod limits {}

#[doc = include_str!("glossary.md")]
pub mod glossary {}
