//! Where breaker state lives.
//!
//! By default a breaker's state is in-process memory: one atomic word and a
//! small book behind a mutex, shared by the clones of one layer (and by the
//! breakers of one [`Registry`](crate::registry::Registry)). A fleet of
//! instances shares state through a fleet backend: every instance adds to
//! one failure count, one instance per key probes at a time, and the
//! request path still reads only local memory. Two backends implement the
//! core's fleet port, with the same semantics:
//!
//! * [`redis`] (feature `redis`): instances in separate processes share
//!   state through Redis or Redis Cluster;
//! * [`memory`]: instances in one process share state in memory, on
//!   tokio's clock, so a whole fleet can be tested on paused time, without
//!   Redis.
//!
//! Either store converts into a [`Fleet`], the handle a registry
//! ([`RegistryBuilder::store`](crate::registry::RegistryBuilder::store))
//! and the admin endpoint take: it attaches breakers, reads the fleet's
//! state of a name ([`FleetState`]) and carries out an operator's
//! [`Control`](crate::Control) on every instance's breaker of that name.

mod fleet;
pub mod memory;
mod steer;

pub(crate) use steer::{steer_through_methods, Pending, Steer};
pub use steer::{Fleet, FleetError, FleetOpening, FleetState};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
