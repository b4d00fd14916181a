//! One breaker across a fleet: shared state in Redis, with the read path
//! still local.
//!
//! Several instances of a service each keep their own breakers, and each
//! would otherwise discover an outage on its own and probe the provider on
//! its own cycle. Attach their breakers to a [`RedisStore`] and the fleet
//! acts as one breaker per key:
//!
//! - **One count.** A closed-state failure is counted in Redis, and the
//!   decision to open is taken there, atomically, by a script: three
//!   failures spread over three instances open the breaker for all of them.
//!   The count opens at the policy's consecutive-failures threshold (the
//!   smallest in an any-of), or at
//!   [`failures_to_open`](RedisStoreBuilder::failures_to_open); like a
//!   streak, a success anywhere resets it. A success costs no Redis write
//!   unless the shared count is known to be non-zero. Every other policy
//!   (windows, slow calls) still trips on this instance's evidence, and the
//!   opening is then shared with the fleet.
//! - **A quorum.** With [`quorum`](RedisStoreBuilder::quorum) above 1, a
//!   fleet-wide opening needs that many distinct instances failing at once,
//!   so that one instance whose own network path is broken cannot open a
//!   healthy provider for everyone: below it, that instance's breaker opens
//!   on its own, and the others keep serving.
//! - **A local read path, and a cost that follows what is open.**
//!   Admission reads only local memory. The fleet keeps an index of the
//!   breakers that are open or counting failures, split into
//!   [`index_shards`](RedisStoreBuilder::index_shards) shards, each with a
//!   version that moves on every change. Each instance keeps its own view
//!   of the index: every
//!   [`refresh_interval`](RedisStoreBuilder::refresh_interval) it reads the
//!   shards' versions (one command on a single server), and reads a
//!   shard's index only when its version moved and pub/sub did not already
//!   tell it what changed. Pub/sub tells every instance of every opening
//!   and closing at once, so the fleet learns of a trip within
//!   milliseconds. A key attached later learns its state from the view, at
//!   once, with no read of its own. With nothing changing, an instance
//!   costs Redis two commands per interval (the versions, and a check that
//!   its subscription still answers), whether it has ten keys or a
//!   million; with keys open, a shard read costs in proportion to what is
//!   open in it. Writes go to a background task through a bounded queue; a
//!   full queue drops the oldest write and counts it
//!   ([`StoreStats::dropped_writes`]); a request never waits.
//! - **One prober.** When the fleet's open period ends, an instance must win
//!   the probe lock (`SET NX` with a
//!   [`probe_lease`](RedisStoreBuilder::probe_lease)) before its breaker
//!   goes half-open; the others keep refusing and learn the result from the
//!   shared state. An instance that dies mid-probe frees the lock when the
//!   lease expires. Probe successes are counted in Redis, so
//!   `successes_to_close` holds fleet-wide, and the script closes only once
//!   `min_open` has passed since the opening. No lock is ever held across a
//!   user's request except the probe's own. Several breakers of one name on
//!   one instance send one probe between them.
//! - **Redis slow or down.** No request waits on it. Each instance keeps
//!   working on its local breakers, emits [`StoreEvent::Unavailable`] (and,
//!   with the `metrics` feature, counts the episode) once per episode, and
//!   when Redis answers again resyncs: it reads the whole index again,
//!   adopts the fleet's openings and shares those of its own still open
//!   ([`StoreEvent::Restored`]). Outcomes seen meanwhile stay local: writes
//!   due while Redis is down are dropped and counted, never replayed later
//!   for an outage that may be over. Every exchange with Redis is bounded
//!   whatever the number of keys. Redis counts as unavailable when the
//!   versions (read on a connection of their own, so that they never wait
//!   behind the instance's own scripts) are not answered within the
//!   [`command_timeout`](RedisStoreBuilder::command_timeout), or a batch
//!   of writes is not and the versions asked right after are not either
//!   (or three batches in a row are not). Otherwise Redis is busy, not
//!   down (a fleet racing for the probe locks of many keys at once keeps
//!   it so): a batch of writes answered late is counted
//!   ([`StoreStats::slow_write_rounds`]) and its writes are lost; a round
//!   of probe-lock attempts answered late is counted
//!   ([`StoreStats::slow_lock_rounds`]) and those keys' local breakers
//!   keep their hold. The index is
//!   read in pages of about a thousand entries, each its own exchange
//!   under the timeout, so that a shard holding many open keys never
//!   makes one exchange that outgrows it; a page that is merely slow is
//!   read again at the next refresh ([`StoreStats::slow_reads`]), and does
//!   not count as Redis being down. A Redis that answers in a protocol it
//!   should not is treated as down; a key holding data of another shape
//!   (another application's, or damaged) is skipped and counted
//!   ([`StoreStats::key_errors`]) while the other keys are shared: an error
//!   about one key never takes the store down. No period read from Redis
//!   holds a breaker open longer than its `max_open` (plus the hold below)
//!   from when the instance began following it, and generations never
//!   repeat (a lost counter starts again from Redis's clock).
//! - **The fleet steered as one.** An operator's control of a name
//!   ([`RedisStore::control`], or the admin endpoint) reaches every
//!   instance's breaker of that name, and its undoing too (see [How the
//!   state is kept](#how-the-state-is-kept)).
//! - **Part of a Redis Cluster down.** A failure stays where it is. Each
//!   index shard's version is read from the node holding its slot, with a
//!   timeout of its own; a shard whose node does not answer within the
//!   [`command_timeout`](RedisStoreBuilder::command_timeout) (a master
//!   killed, frozen or slow, its replica not yet promoted) is cut off
//!   alone: its
//!   names run on their local breakers, their writes are dropped and
//!   counted, its probe locks are not asked for, and the store emits
//!   [`StoreEvent::ShardsUnavailable`] with the shards cut
//!   ([`RedisStore::unreachable_shards`], [`StoreStats::unreachable_shards`],
//!   and with the `metrics` feature the
//!   `circuit_breaker_store_unreachable_shards` gauge). Every other name
//!   keeps its shared count, its one prober and its pushes; the store stays
//!   [available](RedisStore::is_available), and
//!   [`RedisStore::shares`] tells, for one name, whether it is shared now.
//!   Only when no shard answers is Redis down, as above. While a shard is
//!   cut off the versions are read every quarter refresh interval (at
//!   least two command timeouts, at most the interval), and the subscriber
//!   tries the shard's channel at the same pace: once Redis has promoted
//!   the replica, its shards are used again within one such period plus
//!   one read of their index ([`StoreEvent::ShardsRestored`]), the
//!   instance's openings on them are shared and the fleet's adopted. A
//!   write answered with a connection error or a redirection is retried
//!   once on a fresh slot map; the bound on the whole blind window is
//!   Redis's own failover time (its `cluster-node-timeout`, 15 s by
//!   default, plus the election) plus that period. Redis's default
//!   `cluster-require-full-coverage yes` makes every node refuse commands
//!   while any slot is uncovered: then no shard answers and the whole store
//!   runs locally until the promotion. Set it to `no` to keep the other
//!   shards shared meanwhile.
//!
//! # How the state is kept
//!
//! The name is escaped (every byte but ASCII letters, digits, `.`, `_` and
//! `-` becomes `%XX`), one-to-one, so no name, however hostile (`:`, `*`,
//! braces, newlines, any length, or empty), can reach another breaker's
//! keys or change a hash tag. The escaped name picks one of the index
//! shards (a hash of it, the same in every process), and shard `s` of `n`
//! keeps everything under the hash tag `{<prefix>:<s>/<n>}`, never empty:
//! its index (`<prefix>:{<prefix>:<s>/<n>}:index`, a hash of the breakers
//! open or counting failures), its version (`...:version`), and each of its
//! breakers' keys, `<prefix>:{<prefix>:<s>/<n>}:<escaped name>:<part>`:
//! `record` (a hash: fleet generation, failed probe rounds, probe
//! successes; it expires `max_open` after its open period ends), `wait`
//! (exists while the open period runs; its time to live is what is left,
//! measured by Redis, so instances' clocks never matter), `min_open`,
//! `failures` (the count, and who failed), `generation`, `probe_lock` and
//! `votes` (instances whose opening the quorum declined). So one script, in
//! one slot of a Redis Cluster, changes a breaker's state and its shard's
//! index together, and the index's load spreads over the shards' slots. On
//! a single server, openings and closings are published on
//! `<prefix>:events`; on a Cluster, on each shard's own channel
//! (`...:events`, sharded pub/sub: Redis 7 or later), to which every
//! instance subscribes on whichever node holds it.
//!
//! Locally, an instance that follows a fleet opening keeps its breaker open
//! for the fleet's period plus [`hold`](RedisStoreBuilder::hold): the time
//! its task has to take the probe lock (which ends the local period at once)
//! or learn that another instance holds it (which extends it). A task that
//! cannot reach Redis lets the hold run out, and the breaker probes on its
//! own, as a breaker without a store would.
//!
//! Manual control on a breaker ([`Breaker::force_open`] and the others)
//! stays local to the instance where it is called. Fleet-wide control is
//! the store's: [`RedisStore::control`] (or the admin endpoint's
//! `POST /fleet/{action}`, given the store with `Admin::fleet`) forces a
//! name open, closed or disabled on every instance, or resets it, and
//! [`Control::Restore`] undoes it everywhere. The control is kept in the
//! name's shard of the index (under `!<escaped name>`, which no name can
//! reach) and published with the shard's version, so every instance
//! carries it out within milliseconds by pub/sub, or at its next refresh
//! from the index (a moved version, one read of the shard) if it missed
//! the message; an instance that attaches a breaker of that name later
//! carries it out on attaching, and one that was cut off from Redis on
//! its resync. A timed force-open is a fleet opening like any other
//! (every instance refuses, then one probes); a reset deletes the name's
//! fleet state and leaves a mark in the index for ten refresh intervals
//! (at least a minute) for instances that read rather than hear it.
//! [`RedisStore::fleet_state`] reads what the fleet keeps of a name.
//!
//! # Capacity
//!
//! What a fleet costs Redis has two parts, measured by
//! `cargo bench --features redis --bench fleet` (its fleet-scale study:
//! M instances, each its own store with K keyed breakers, in one process,
//! against a local `redis-server` 7.0, Redis's own `INFO` over 10 s).
//!
//! * **Each instance, whatever its keys**: two commands per refresh
//!   interval (the shards' versions, and the check of its subscription),
//!   about 0.2 ms of Redis CPU and 0.7 KB of traffic per second at the
//!   default 1 s interval: the same at 100 and at 100,000 keys. On a
//!   Cluster the versions take one command per shard, and the check one
//!   per node. An instance holds three connections: its scripts', its
//!   versions' (so that they never wait behind its own scripts) and its
//!   subscription's (on a Cluster, each to the nodes it needs).
//! * **Each change**: an opening or a closing, and in an outage each open
//!   period's end (the fleet races for the probe lock, probes, and
//!   reopens). A change costs about one script plus one per instance (each
//!   instance tries the probe lock once per period) and a pub/sub delivery
//!   per instance: measured with 1,000 keys reopening every second at 1, 4
//!   and 8 instances, about 70 µs of Redis CPU and 0.6 KB of traffic per
//!   change, plus 39 µs and 0.78 KB per instance. A key that stays open
//!   costs nothing between its changes; a closed key costs nothing at all.
//!
//! For **100 instances × 100,000 keys with 1% open** (1,000 keys open, in
//! an outage that reopens each of them once per open period): the
//! instances cost 200 commands, 0.02 CPU seconds and 70 KB per second; a
//! change about 3.9 ms of CPU, 79 KB and 100 scripts. With the default 30 s
//! first open period that is 33 changes per second: about 0.15 CPU seconds
//! per second in all (15% of one core), 2.7 MB/s of traffic and 3,300
//! scripts per second; once the backoff has reached `max_open` (300 s),
//! about a tenth of that. Earlier releases of this store read three
//! commands per key per instance per interval: 3×10^7 commands per second
//! for the same fleet with nothing open (about 17 Redis cores, 1.8 GB/s).
//!
//! # Why redis-rs
//!
//! Built on [redis-rs](https://docs.rs/redis) (the `redis` crate) rather
//! than fred: it is the most used Redis client in Rust and is maintained
//! under the Redis organisation; its `ConnectionManager` reconnects by
//! itself, its cluster client follows slot moves, its `Script` type loads
//! scripts on demand, and the features this store needs (tokio, connection
//! manager, async cluster, scripts) add few dependencies. fred offers as
//! much and more (sentinel, client tracking, its own pooling), at the price
//! of a larger dependency tree and an API that owns its reconnection
//! policy. TLS and authentication come from the URL (`rediss://`,
//! `redis://user:password@host`), as redis-rs supports them. TLS needs one
//! of redis-rs's TLS features, which the application turns on by depending
//! on the same redis-rs release (cargo unifies features), for example:
//!
//! ```toml
//! redis = { version = "0.32", features = ["tokio-rustls-comp", "tls-rustls-webpki-roots"] }
//! ```
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_circuit_breaker::store::redis::RedisStore;
//! use tower_circuit_breaker::{CircuitBreakerLayer, Config};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .prefix("checkout")
//!     .refresh_interval(Duration::from_secs(1))
//!     .build()?;
//! let layer = CircuitBreakerLayer::new(Config::builder().name("payments").build()?);
//! store.attach(&layer.breaker());
//! # Ok(())
//! # }
//! ```
//!
//! For keyed breakers, give the store to the registry
//! ([`RegistryBuilder::store`](crate::registry::RegistryBuilder::store)):
//! every breaker it makes is attached under its key.
//!
//! [`Breaker::force_open`]: crate::Breaker::force_open

mod conn;
mod keys;
mod pubsub;
mod schedule;
mod script;
mod task;
mod view;

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::error::ConfigError;
use crate::store::fleet::{self, Link, LinkSettings, Queue};
use crate::store::{FleetError, FleetState};
use crate::{Breaker, Control};

/// Breaker state shared by a fleet through Redis. Cheap to clone; the
/// background task stops when the last clone is dropped.
///
/// See the [module docs](self) for what is shared and how.
///
/// Building a store and attaching breakers needs no Redis yet: the
/// store's task connects (and reconnects) on its own, and until it does
/// every breaker works on its own.
///
/// ```
/// use tower_circuit_breaker::registry::Registry;
/// use tower_circuit_breaker::store::redis::RedisStore;
/// use tower_circuit_breaker::{Breaker, Config};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("gateway").build()?;
///
/// // One breaker, shared under its name...
/// let search = Breaker::new(Config::builder().name("search").build()?);
/// assert!(store.attach(&search));
/// assert!(!store.attach(&search), "a breaker reports to one store");
///
/// // ...or every breaker of a registry, under its key.
/// let registry: Registry<String> = Registry::builder()
///     .default_config(Config::default())
///     .store(&store)
///     .build();
/// let openai = registry.get(&"openai".to_string())?;
/// assert!(store.is_attached(&openai));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    prefix: String,
    instance: String,
    voter: String,
    shards: u16,
    queue: Arc<Queue>,
    settings: Arc<LinkSettings>,
    requests: mpsc::UnboundedSender<task::Request>,
    events: broadcast::Sender<StoreEvent>,
    pub(crate) stats: Stats,
    /// The index shards cut off from the fleet, by shard.
    pub(crate) unreachable: Box<[AtomicBool]>,
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

/// Builds a [`RedisStore`]; [`build`](Self::build) checks every value.
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    urls: Vec<String>,
    cluster: bool,
    prefix: String,
    instance: Option<String>,
    refresh_interval: Duration,
    probe_lease: Duration,
    hold: Duration,
    command_timeout: Duration,
    queue_capacity: usize,
    failures_to_open: Option<u32>,
    failure_window: Duration,
    quorum: u32,
    index_shards: u16,
}

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
        /// The shards cut off, as [`RedisStore::shard_of`] numbers them.
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
    /// answer), out of [`index_shards`](RedisStoreBuilder::index_shards).
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

/// Why a [`RedisStore`] could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A setting is out of range.
    Config(ConfigError),
    /// The URL is not one redis-rs accepts.
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `build` was called outside a tokio runtime, which the store's task
    /// needs.
    NoRuntime,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Config(e) => e.fmt(f),
            StoreError::Url { url, reason } => write!(f, "invalid Redis URL `{url}`: {reason}"),
            StoreError::NoRuntime => {
                f.write_str("the Redis store must be built inside a tokio runtime")
            }
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StoreError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for StoreError {
    fn from(e: ConfigError) -> Self {
        StoreError::Config(e)
    }
}

impl RedisStore {
    /// Starts a store on one Redis server, such as `redis://127.0.0.1:6379`
    /// (`rediss://` for TLS, `redis://user:password@host:port/db` with
    /// authentication).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            urls: vec![url.into()],
            cluster: false,
            prefix: "circuit-breaker".to_owned(),
            instance: None,
            refresh_interval: Duration::from_secs(1),
            probe_lease: Duration::from_secs(10),
            hold: Duration::from_secs(1),
            command_timeout: Duration::from_millis(250),
            queue_capacity: 4096,
            failures_to_open: None,
            failure_window: Duration::from_secs(60),
            quorum: 1,
            index_shards: 16,
        }
    }

    /// Starts a store on a Redis Cluster, given some of its nodes.
    pub fn cluster_builder(urls: impl IntoIterator<Item = impl Into<String>>) -> RedisStoreBuilder {
        let mut builder = Self::builder(String::new());
        builder.urls = urls.into_iter().map(Into::into).collect();
        builder.cluster = true;
        builder
    }

    /// Shares `breaker`'s state with the fleet under its name; false if it
    /// already reports to a store. Every instance that attaches a breaker of
    /// the same name, with the same prefix, shares one breaker.
    pub fn attach(&self, breaker: &Breaker) -> bool {
        let escaped: Arc<str> = Arc::from(keys::escape(breaker.name()));
        let link = Link {
            key: Arc::clone(&escaped),
            queue: Arc::clone(&self.inner.queue),
            settings: Arc::clone(&self.inner.settings),
        };
        if !breaker.shared.attach_link(Box::new(link)) {
            return false;
        }
        // The task has stopped only if every store handle is gone, and this
        // is one: sending cannot fail.
        let _ = self
            .inner
            .requests
            .send(task::Request::Attach(task::Attached {
                escaped,
                breaker: Arc::downgrade(&breaker.shared),
            }));
        true
    }

    /// Carries out `control` on the breakers named `name` of every
    /// instance of the fleet: see [`Fleet`](crate::store::Fleet) for what each control does
    /// fleet-wide. Written to Redis in one script, which publishes it: this
    /// instance's breakers carry it out when it returns, the others' as
    /// they hear it (within milliseconds), or at the latest at their next
    /// refresh; an instance that attaches a breaker of that name later
    /// carries it out on attaching. Fails, changing nothing, when Redis
    /// does not answer for the name's shard within the command timeout.
    ///
    /// ```no_run
    /// use tower_circuit_breaker::store::redis::RedisStore;
    /// use tower_circuit_breaker::Control;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("gateway").build()?;
    /// store.control("openai/gpt-x", Control::ForceOpen(None)).await?; // every instance
    /// store.control("openai/gpt-x", Control::Restore).await?; // undone everywhere
    /// # Ok(())
    /// # }
    /// ```
    pub async fn control(&self, name: &str, control: Control) -> Result<(), FleetError> {
        let (answer, answered) = oneshot::channel();
        let _ = self.inner.requests.send(task::Request::Control {
            escaped: Arc::from(keys::escape(name)),
            control,
            answer,
        });
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Everything the fleet keeps of the breaker named `name`, read from
    /// Redis now: its opening (generation, what is left of the period,
    /// when it is forgotten), its shared failure count, the instance
    /// holding the probe lock, the votes toward a quorum, and the
    /// fleet-wide control in force.
    pub async fn fleet_state(&self, name: &str) -> Result<FleetState, FleetError> {
        let (answer, answered) = oneshot::channel();
        let _ = self.inner.requests.send(task::Request::Inspect {
            escaped: Arc::from(keys::escape(name)),
            answer,
        });
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Whether `breaker` reports to a store.
    pub fn is_attached(&self, breaker: &Breaker) -> bool {
        breaker.shared.has_link()
    }

    /// Receives the store's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.inner.events.subscribe()
    }

    /// The store's counters.
    pub fn stats(&self) -> StoreStats {
        let s = &self.inner.stats;
        StoreStats {
            available: s.available.load(Ordering::Relaxed),
            unavailable_episodes: s.episodes.load(Ordering::Relaxed),
            unreachable_shards: self.unreachable_shards().len() as u16,
            shard_episodes: s.shard_episodes.load(Ordering::Relaxed),
            dropped_writes: self.inner.queue.dropped.load(Ordering::Relaxed),
            failed_writes: s.failed_writes.load(Ordering::Relaxed),
            writes: s.writes.load(Ordering::Relaxed),
            refreshes: s.refreshes.load(Ordering::Relaxed),
            messages: s.messages.load(Ordering::Relaxed),
            probe_locks_won: s.probe_locks_won.load(Ordering::Relaxed),
            key_errors: s.key_errors.load(Ordering::Relaxed),
            index_reads: s.index_reads.load(Ordering::Relaxed),
            slow_reads: s.slow_reads.load(Ordering::Relaxed),
            slow_lock_rounds: s.slow_lock_rounds.load(Ordering::Relaxed),
            slow_write_rounds: s.slow_write_rounds.load(Ordering::Relaxed),
        }
    }

    /// Whether Redis answers: the last exchange with a single server
    /// succeeded, or some node of a Cluster answers. A Cluster with some
    /// index shards cut off is available; [`shares`](Self::shares) tells
    /// for one name.
    pub fn is_available(&self) -> bool {
        self.inner.stats.available.load(Ordering::Relaxed)
    }

    /// The index shards cut off now, in order: on a Cluster, those whose
    /// node does not answer (their names run on their local breakers).
    /// Empty on a single server, and while Redis answers in full.
    pub fn unreachable_shards(&self) -> Vec<u16> {
        (0u16..)
            .zip(self.inner.unreachable.iter())
            .filter_map(|(shard, cut)| cut.load(Ordering::Relaxed).then_some(shard))
            .collect()
    }

    /// The index shard that holds the breaker named `name`, the same in
    /// every process of the fleet.
    pub fn shard_of(&self, name: &str) -> u16 {
        keys::shard_of(&keys::escape(name), self.inner.shards)
    }

    /// Whether the breaker named `name` is shared with the fleet now:
    /// Redis is available and `name`'s shard is not cut off.
    pub fn shares(&self, name: &str) -> bool {
        self.is_available()
            && !self.inner.unreachable[usize::from(self.shard_of(name))].load(Ordering::Relaxed)
    }

    /// This instance's name in probe locks: the
    /// [name](RedisStoreBuilder::instance) it was given (if any) and a
    /// random suffix, unique to this process.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// The name this instance's failures count under toward a quorum: the
    /// [name](RedisStoreBuilder::instance) it was given, or, without one,
    /// its [`instance`](Self::instance) name.
    pub fn voter(&self) -> &str {
        &self.inner.voter
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("instance", &self.inner.instance)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key and channel name (default `circuit-breaker`):
    /// applications that share a Redis keep apart by it. It may not contain
    /// `{`, `}` or white space.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// This instance's stable name (a host, a pod; default: none), which
    /// should outlive a restart of the process. Toward a
    /// [quorum](Self::quorum), its failures count under this name, with
    /// those of every earlier process of the same name, so a broken
    /// instance that crashes and starts again and again is still one
    /// instance failing. In probe locks it is followed by a random suffix,
    /// so two live processes never share a probe.
    ///
    /// Without a name, each process counts under an identity of its own: a
    /// process started again after a crash is another voter, and the
    /// failures of the one before count for the
    /// [failure window](Self::failure_window), so with a quorum of 2 a
    /// single crash-looping instance can open a healthy provider for the
    /// fleet. Name instances where a quorum matters; two processes given
    /// one name count as one.
    pub fn instance(mut self, name: impl Into<String>) -> Self {
        self.instance = Some(name.into());
        self
    }

    /// How often the index shards' versions are checked, and the shards
    /// that moved read (default 1 s): the bound on how stale an instance's
    /// view can be when a pub/sub message was lost, how often the
    /// subscription is checked, and how often an unavailable Redis is tried
    /// again.
    pub fn refresh_interval(mut self, interval: Duration) -> Self {
        self.refresh_interval = interval;
        self
    }

    /// How long the probe lock is held (default 10 s): it should cover a
    /// probe's duration and be shorter than the open period. A prober that
    /// dies frees it when it expires; a prober still half-open renews it.
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.probe_lease = lease;
        self
    }

    /// How long past the fleet's open period (or another instance's probe
    /// lease) this instance keeps refusing while waiting for word from Redis
    /// (default 1 s). If Redis stays silent that long, the breaker probes on
    /// its own. Must exceed three command timeouts.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// How long one exchange with Redis may take (default 250 ms). The
    /// versions' check and a batch of writes that take longer make Redis
    /// count as unavailable; a slower read of the index is tried again at
    /// the next refresh. No exchange grows with the number of keys.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Writes that may wait for the background task (default 4,096); past
    /// that the oldest is dropped and counted.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity;
        self
    }

    /// Failures (with no success in between, anywhere in the fleet) that
    /// open a breaker fleet-wide, whatever its policy. By default, the
    /// policy's consecutive-failures threshold; a policy without one is not
    /// counted fleet-wide (its openings are still shared).
    pub fn failures_to_open(mut self, failures: u32) -> Self {
        self.failures_to_open = Some(failures);
        self
    }

    /// How long the fleet's count remembers a failure with no further
    /// failure (default 60 s).
    pub fn failure_window(mut self, window: Duration) -> Self {
        self.failure_window = window;
        self
    }

    /// How many instances must be failing at once before the fleet opens
    /// a breaker for all of them (default 1: any instance's evidence opens
    /// it).
    ///
    /// An instance whose own network path, DNS or connection pool is
    /// broken fails every call, while the provider is healthy; with a
    /// quorum of 1 its failures open the provider for the whole fleet. With
    /// a quorum of `n`, a fleet-wide opening needs failures from `n`
    /// distinct instances at once: those whose failures the fleet's count
    /// holds (since the last success anywhere), and those whose own breaker
    /// opened within its open period. Below it, the failing instance's
    /// breaker opens on its own (it probes on its own, too) and the others
    /// keep serving. 2 guards against one bad instance; every instance of a
    /// fleet should use the same value. Instances are told apart by their
    /// [names](Self::instance): give each a stable one, or a bad instance
    /// that restarts counts as a new instance each time.
    pub fn quorum(mut self, instances: u32) -> Self {
        self.quorum = instances;
        self
    }

    /// Into how many shards the fleet's open index is split (default 16,
    /// at most 1,024). Each shard has its own hash tag, so on a Cluster the
    /// index's writes and the store's pub/sub spread over up to this many
    /// slots; each refresh checks every shard's version (one command on a
    /// single server; one per shard, on its own node, on a Cluster). Every
    /// instance of a fleet must use the same value: it is part of the key
    /// names, and instances that differ do not share breakers.
    pub fn index_shards(mut self, shards: u16) -> Self {
        self.index_shards = shards;
        self
    }

    /// Checks the settings and starts the store's background task, which
    /// connects (and reconnects) by itself: Redis need not be up yet. Must
    /// be called inside a tokio runtime.
    pub fn build(self) -> Result<RedisStore, StoreError> {
        let bad = |field: &str, problem: &str| StoreError::Config(ConfigError::new(field, problem));
        keys::check_prefix(&self.prefix).map_err(|p| bad("prefix", p))?;
        if self.urls.is_empty() {
            return Err(bad("urls", "must name at least one node"));
        }
        fleet::check_durations(&[
            ("refresh_interval", self.refresh_interval),
            ("probe_lease", self.probe_lease),
            ("hold", self.hold),
            ("command_timeout", self.command_timeout),
            ("failure_window", self.failure_window),
        ])?;
        // One pass of the task may wait on a write, a refresh and a probe
        // lock attempt in turn before the hold runs out.
        if self.hold <= self.command_timeout.saturating_mul(3) {
            return Err(bad("hold", "must be longer than three command timeouts"));
        }
        fleet::check_counts(self.queue_capacity, self.failures_to_open, self.quorum)?;
        if !(1..=1024).contains(&self.index_shards) {
            return Err(bad("index_shards", "must be between 1 and 1024"));
        }
        let backend = conn::Backend::new(&self.urls, self.cluster, self.command_timeout)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StoreError::NoRuntime)?;
        // A random suffix keeps two instances given the same name apart: a
        // shared name would let both take one probe lock.
        let (instance, voter) = match self.instance {
            Some(name) => (format!("{name}-{}", random_instance()), name),
            None => {
                let random = random_instance();
                (random.clone(), random)
            }
        };
        let (requests, received) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            prefix: self.prefix,
            instance,
            voter,
            shards: self.index_shards,
            queue: Arc::new(Queue::new(self.queue_capacity)),
            settings: Arc::new(LinkSettings {
                failures_to_open: self.failures_to_open,
                failure_window: self.failure_window,
                probe_lease: self.probe_lease,
                quorum: self.quorum,
            }),
            requests,
            events: broadcast::channel(16).0,
            stats: Stats::default(),
            unreachable: (0..self.index_shards)
                .map(|_| AtomicBool::new(false))
                .collect(),
        });
        let task = task::Task::new(
            backend,
            &inner,
            received,
            task::Timing {
                refresh: self.refresh_interval,
                hold: self.hold,
                lease: self.probe_lease,
                command_timeout: self.command_timeout,
            },
        );
        runtime.spawn(task.run());
        Ok(RedisStore { inner })
    }
}

/// The store's task has stopped (the runtime it ran on shut down).
fn stopped() -> FleetError {
    FleetError::new("the store's task has stopped")
}

crate::store::steer_through_methods!(RedisStore);

fn random_instance() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;
    format!("{:016x}", RandomState::new().hash_one(std::process::id()))
}
