//! The synchronisation primitives the breaker's state is built on: `std`'s,
//! or, when built with `--cfg tcb_loom`, loom's, so that the loom models in
//! `tests/loom.rs` explore every interleaving of the atomics and locks.
//!
//! (The cfg is the crate's own rather than `loom`: tokio reads `cfg(loom)`
//! for its own models and would not build with it.)

#[cfg(not(tcb_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(not(tcb_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(tcb_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(tcb_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
