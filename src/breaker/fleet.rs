//! The fleet port: what a breaker that shares its state with other
//! instances (a fleet) tells its backend, and what the backend tells it.
//!
//! The core defines the port; backends implement it (the `store` module:
//! Redis, and an in-process one). A breaker holds an attached backend only
//! as a [`FleetLink`], and a reader of the core never reads a backend to
//! know what a transition does.
//!
//! # Outbound: the breaker tells its backend
//!
//! [`FleetLink`]'s methods are called **on the request path, under the
//! breaker's lock**: a failure counted, a success after failures, an
//! opening decided here, a probe's success. An implementation must:
//!
//! * **never block or wait** (no I/O, no lock held by anything that waits):
//!   queue the news for a task of its own, and drop it rather than wait
//!   when the queue is full;
//! * **never call back into the breaker** from these methods (the inbound
//!   methods below take the breaker's lock: that would deadlock); answer
//!   later, from its own task;
//! * **never panic**.
//!
//! # Inbound: the backend tells the breaker
//!
//! From its own task, never from inside a [`FleetLink`] method, a backend
//! brings the fleet's decisions back through three methods of the shared
//! state, each a transition like any other (under the lock, one
//! compare-and-swap, one event):
//!
//! * [`Shared::fleet_open`]: the fleet holds the breaker open in a fleet
//!   generation, for so long, with this backoff attempt; or its period is
//!   over and another instance holds the probe lock;
//! * [`Shared::fleet_probe_won`]: this instance holds the probe lock of
//!   that generation: its local open period ends now, and it probes;
//! * [`Shared::fleet_closed`]: the fleet is closed (with a failure count),
//!   or closed a given generation.
//!
//! A backend promises:
//!
//! * **one opening, one prober**: fleet generations of one name never
//!   repeat and only grow; at most one instance at a time holds the probe
//!   lock of a generation, for a bounded lease;
//! * **counts that add up**: failures from every instance add to one count,
//!   and a success reported after failures resets it; `successes_to_close`
//!   and `min_open` hold across the fleet;
//! * **unavailability by silence**: when the backend cannot reach the
//!   fleet, it stops calling in; the breaker's own reckoning (an opening it
//!   follows holds at most the fleet's period plus a short hold, never past
//!   `max_open`) brings it back to its local view. The backend reports the
//!   episode to its own users (events, metrics), and when the fleet is
//!   reachable again reads every attached breaker back and says what is
//!   open, closed or unknown to the fleet.

use std::fmt;
use std::time::Duration;

use crate::config::Config;

/// A breaker's link to its fleet backend (see the [module docs](self) for
/// what an implementation must promise).
pub(crate) trait FleetLink: Send + Sync + fmt::Debug {
    /// A closed-state failure: counts it in the fleet, if failures under
    /// `config` are counted fleet-wide; returns whether they are (then a
    /// later success must [`reset`](Self::reset) the count).
    fn failure(&self, config: &Config) -> bool;

    /// A closed-state success after failures the fleet counted: the count
    /// starts again.
    fn reset(&self);

    /// This breaker opened on its own evidence, for `open`, at backoff
    /// `attempt` (its policy tripped, or a probe failed in fleet generation
    /// `known`; 0 when it follows no fleet opening): share it.
    fn opened(&self, config: &Config, open: Duration, attempt: u32, known: u64);

    /// A probe succeeded in fleet generation `known`.
    fn probe_succeeded(&self, config: &Config, known: u64);
}
