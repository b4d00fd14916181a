//! One breaker across a fleet whose instances share one process: the
//! fleet's state in memory, with the same semantics as the Redis store.
//!
//! A [`MemoryFleet`] is what a Redis server is to the
//! [Redis store](crate::store::redis): the fleet's state of every breaker
//! name, shared by its instances. Each [`MemoryStore`], made by
//! [`MemoryFleet::instance`], stands for one instance of a service (what
//! one `RedisStore` is): attach its breakers, and the instances act as one
//! breaker per name, exactly as the Redis store's script decides:
//!
//! - **One count.** Closed-state failures from every instance add to one
//!   count per name, which opens the breaker for all of them at the
//!   policy's consecutive-failures threshold (the smallest in an any-of),
//!   or at [`failures_to_open`](MemoryFleetBuilder::failures_to_open); a
//!   success anywhere resets it. Every other policy still trips on an
//!   instance's own evidence, and the opening is then shared.
//! - **A quorum.** With [`quorum`](MemoryFleetBuilder::quorum) above 1, a
//!   fleet-wide opening needs that many distinct instances failing at once;
//!   below it, the failing instance's breaker opens on its own and the
//!   others keep serving.
//! - **One prober.** When the fleet's open period ends, one instance wins
//!   the probe lock ([`probe_lease`](MemoryFleetBuilder::probe_lease) long)
//!   and its breakers go half-open; the others keep refusing, hear that the
//!   probe lock is held elsewhere, and learn the result. A lease that runs out
//!   without a verdict (its instance gone, or its breaker dropped) passes
//!   the turn on. A failed probe reopens the fleet with the prober's
//!   backoff; probe successes are counted fleet-wide, so
//!   `successes_to_close` and `min_open` hold across the fleet.
//! - **A request never waits.** Admission reads only the breaker's own
//!   memory. What a breaker reports goes through a bounded queue (a full
//!   queue drops the oldest write and counts it,
//!   [`MemoryStoreStats::dropped_writes`]) to its instance's task, which
//!   carries it out on the fleet's state and brings the answers into the
//!   breakers. Every change (an opening, a closing, a new failure count)
//!   reaches every other instance's task at once and in the order the
//!   fleet decided it: what pub/sub and the index do for Redis, with
//!   nothing to lose on the way. A breaker attached late learns the
//!   fleet's state at once.
//! - **Tokio's clock.** Open periods, leases, `min_open` and the failure
//!   window run on `tokio::time`, so paused time drives a whole fleet: a
//!   test can open, probe and close one on virtual time, without Redis,
//!   several instances in one test.
//!
//! While a breaker follows a fleet opening, its own open period is the
//! fleet's plus a [`hold`](MemoryFleetBuilder::hold): the time its
//! instance's task has to race for the probe lock (which ends the local
//! period at once) or hear that another instance holds it (which extends
//! it). An instance whose handles are all gone stops hearing; its breakers,
//! if anything still holds them, fall back to their own reckoning when the
//! hold runs out, as with a Redis that went silent.
//!
//! Manual control on a breaker ([`Breaker::force_open`] and the others)
//! stays local to the instance where it is called; [`MemoryStore::control`]
//! (or [`Fleet`](crate::store::Fleet), or the admin endpoint given the
//! store) acts on every instance's breaker of a name, as the Redis
//! store's does, and [`MemoryStore::fleet_state`] reads what the fleet
//! keeps of a name.
//!
//! [`Breaker::force_open`]: crate::Breaker::force_open
//!
//! # Example
//!
//! Failures spread over three instances open the breaker for all of them,
//! on paused time:
//!
//! ```
//! use tower::{service_fn, BoxError, Layer, ServiceExt};
//! use tower_circuit_breaker::policy::ConsecutiveFailures;
//! use tower_circuit_breaker::store::memory::MemoryFleet;
//! use tower_circuit_breaker::{CircuitBreakerLayer, Config, State};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fleet = MemoryFleet::builder().build()?;
//! let config = Config::builder().name("llm").trip(ConsecutiveFailures::new(3)).build()?;
//! let mut instances = Vec::new();
//! for _ in 0..3 {
//!     let store = fleet.instance();
//!     let layer = CircuitBreakerLayer::new(config.clone());
//!     store.attach(&layer.breaker());
//!     // The store lives as long as its instance: dropped, it stops sharing.
//!     instances.push((store, layer));
//! }
//! let down = service_fn(|()| async { Err::<(), BoxError>("upstream down".into()) });
//! for (_, layer) in &instances {
//!     assert!(layer.layer(down).oneshot(()).await.is_err());
//! }
//! // Let the instances' tasks carry out the writes.
//! tokio::time::sleep(std::time::Duration::from_millis(1)).await;
//! assert!(instances.iter().all(|(_, layer)| layer.breaker().state() == State::Open));
//! # Ok(())
//! # }
//! ```

mod builder;
mod error;
mod fleet;
mod instance;
mod state;
mod task;

pub use builder::MemoryFleetBuilder;
pub use error::MemoryFleetError;
pub(crate) use fleet::FleetInner;
pub use fleet::MemoryFleet;
pub(crate) use instance::Inner;
pub use instance::{MemoryStore, MemoryStoreStats};
