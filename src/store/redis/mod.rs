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
//! about a tenth of that. These figures come from the fleet-scale study
//! (`benches/fleet/README.md` in the repository), which says how to
//! measure them again on your own Redis.
//!
//! # Releases in one fleet
//!
//! Every instance of a fleet must run a release of this crate with the same
//! Redis key layout: instances whose layouts differ do not share breakers
//! (each reads and writes keys the others do not), and an older release
//! counts the index fields a newer one adds as key errors. The CHANGELOG
//! says when the layout changes; roll such a change out as a new fleet
//! (another key prefix, [`RedisStoreBuilder::prefix`]) rather than instance
//! by instance.
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
//! [`Control::Restore`]: crate::Control::Restore

mod builder;
mod conn;
mod error;
mod handle;
mod keys;
mod pubsub;
mod report;
mod schedule;
mod script;
mod task;
mod view;

pub use builder::RedisStoreBuilder;
pub use error::StoreError;
pub(crate) use handle::Inner;
pub use handle::RedisStore;
pub(crate) use report::Stats;
pub use report::{StoreEvent, StoreStats};
