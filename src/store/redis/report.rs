//! What the store reports: its events ([`StoreEvent`], for logs and
//! alerts), its counters as a snapshot ([`StoreStats`]), and the atomic
//! counters behind them (`Stats`), which the task adds to and the handle
//! reads.

use std::sync::atomic::{AtomicBool, AtomicU64};

/// Something the store went through, for logs and alerts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreEvent {
    /// Redis could not be reached, timed out, or answered garbage: the
    /// instance runs on its local breakers until it returns. Once per
    /// episode.
    Unavailable {
        /// What went wrong, in words.
        error: String,
    },
    /// Redis answers again; the instance has resynced with the fleet.
    Restored,
    /// On a Cluster, the node holding these index shards does not answer
    /// (dead, frozen, or too slow), while others do: the breakers whose
    /// names fall in them run on their own until the shards answer
    /// again; every other name is still shared. Once per episode of each
    /// shard.
    ShardsUnavailable {
        /// The shards cut off, as
        /// [`RedisStore::shard_of`](super::RedisStore::shard_of) numbers them.
        shards: Vec<u16>,
        /// What went wrong, in words.
        error: String,
    },
    /// On a Cluster, these index shards answer again (Redis promoted a
    /// replica, or the node came back): their names are shared again,
    /// each breaker learning the fleet's state of its name once the shard
    /// has been read again.
    ShardsRestored {
        /// The shards back.
        shards: Vec<u16>,
    },
}

/// The store's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Whether the last exchange with Redis succeeded.
    pub available: bool,
    /// Episodes of Redis being unavailable.
    pub unavailable_episodes: u64,
    /// On a Cluster, the index shards cut off now (their node does not
    /// answer), out of [`index_shards`](super::RedisStoreBuilder::index_shards).
    pub unreachable_shards: u16,
    /// On a Cluster, episodes of index shards being cut off while others
    /// answered (each [`StoreEvent::ShardsUnavailable`]).
    pub shard_episodes: u64,
    /// Writes dropped because the queue was full, or because Redis was down
    /// when they were due (outcomes seen while Redis is down stay local).
    pub dropped_writes: u64,
    /// Writes sent that Redis did not carry out (it failed meanwhile).
    pub failed_writes: u64,
    /// Writes carried out.
    pub writes: u64,
    /// Refreshes completed: each interval's check of the index shards'
    /// versions, and the read of every shard whose version moved.
    pub refreshes: u64,
    /// Whole reads of an index shard (one per shard whose version moved
    /// since this instance last took it in), each made of one or more
    /// pages.
    pub index_reads: u64,
    /// Rounds of index pages that took longer than the command timeout:
    /// those shards are read again at the next refresh (Redis, which
    /// answered the versions in time, does not count as unavailable).
    pub slow_reads: u64,
    /// Batches of probe-lock attempts not answered within the command
    /// timeout (the fleet's instances racing for the locks of many keys
    /// at once make a busy Redis, not a down one): those keys' local
    /// breakers keep their hold and probe on their own if it runs out, and
    /// Redis does not count as unavailable.
    pub slow_lock_rounds: u64,
    /// Batches of writes not answered within the command timeout while
    /// Redis still answered the versions in time (busy, not down): their
    /// writes count in `failed_writes`, and Redis does not count as
    /// unavailable unless three such batches come in a row.
    pub slow_write_rounds: u64,
    /// Pub/sub messages taken in.
    pub messages: u64,
    /// Times this instance won a probe lock.
    pub probe_locks_won: u64,
    /// Answers about one key that could not be used (an error reply, or
    /// data of another shape under the key): that key was skipped.
    pub key_errors: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) available: AtomicBool,
    pub(crate) episodes: AtomicU64,
    pub(crate) shard_episodes: AtomicU64,
    pub(crate) failed_writes: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) refreshes: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) probe_locks_won: AtomicU64,
    pub(crate) key_errors: AtomicU64,
    pub(crate) index_reads: AtomicU64,
    pub(crate) slow_reads: AtomicU64,
    pub(crate) slow_lock_rounds: AtomicU64,
    pub(crate) slow_write_rounds: AtomicU64,
}
