//! The store's settings, [`RedisStoreBuilder`]: each setting's meaning and
//! default, the checks `build` makes of them, and the start of the store's
//! background task on the current tokio runtime.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use super::{conn, keys, task, Inner, RedisStore, Stats, StoreError};
use crate::error::ConfigError;
use crate::store::fleet::{self, LinkSettings, Queue};

/// Builds a [`RedisStore`]; [`build`](Self::build) checks every value.
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    pub(super) urls: Vec<String>,
    pub(super) cluster: bool,
    pub(super) prefix: String,
    pub(super) instance: Option<String>,
    pub(super) refresh_interval: Duration,
    pub(super) probe_lease: Duration,
    pub(super) hold: Duration,
    pub(super) command_timeout: Duration,
    pub(super) queue_capacity: usize,
    pub(super) failures_to_open: Option<u32>,
    pub(super) failure_window: Duration,
    pub(super) quorum: u32,
    pub(super) index_shards: u16,
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

fn random_instance() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;
    format!("{:016x}", RandomState::new().hash_one(std::process::id()))
}
