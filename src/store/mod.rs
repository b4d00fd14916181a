//! Where breaker state lives.
//!
//! By default a breaker's state is in-process memory: one atomic word and a
//! small book behind a mutex, shared by the clones of one layer (and by the
//! breakers of one [`Registry`](crate::registry::Registry)). With the
//! `redis` feature, a fleet of instances shares state through Redis
//! ([`redis`]): every instance adds to one failure count, one instance per
//! key probes at a time, and the request path still reads only local memory.

mod fleet;
pub mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
