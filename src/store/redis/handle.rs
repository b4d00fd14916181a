//! The store's public handle, [`RedisStore`], and what it shares with its
//! task (`Inner`): attaching breakers, fleet-wide control and inspection,
//! sent to the task; the counters, the shards cut off and the names the
//! instance goes by, read from memory without asking Redis.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};

use super::{keys, task, RedisStoreBuilder, Stats, StoreEvent, StoreStats};
use crate::store::fleet::{Link, LinkSettings, Queue};
use crate::store::{FleetError, FleetState};
use crate::{Breaker, Control};

/// Breaker state shared by a fleet through Redis. Cheap to clone; the
/// background task stops when the last clone is dropped.
///
/// See the [module docs](super) for what is shared and how.
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
    pub(super) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(super) prefix: String,
    pub(super) instance: String,
    pub(super) voter: String,
    pub(super) shards: u16,
    pub(super) queue: Arc<Queue>,
    pub(super) settings: Arc<LinkSettings>,
    pub(super) requests: mpsc::UnboundedSender<task::Request>,
    pub(super) events: broadcast::Sender<StoreEvent>,
    pub(crate) stats: Stats,
    /// The index shards cut off from the fleet, by shard.
    pub(crate) unreachable: Box<[AtomicBool]>,
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

/// The store's task has stopped (the runtime it ran on shut down).
fn stopped() -> FleetError {
    FleetError::new("the store's task has stopped")
}

crate::store::steer_through_methods!(RedisStore);
