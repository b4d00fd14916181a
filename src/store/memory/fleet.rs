//! The fleet's handle, [`MemoryFleet`]: the shared state under its lock
//! (`FleetInner`), what every instance of the fleet reads of it (its
//! settings and timing, the runtime its tasks run on), and the making of
//! instances, each with its task.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::instance::Stats;
use super::state::Fleet;
use super::task::{Task, Timing};
use super::{Inner, MemoryFleetBuilder, MemoryStore};
use crate::store::fleet::{LinkSettings, Queue};

/// The shared state of one fleet of instances, in memory: what a Redis
/// server is to the [Redis store](crate::store::redis). Cheap to clone;
/// clones are the same fleet.
///
/// Make one with [`builder`](Self::builder), then one [`MemoryStore`] per
/// instance of the service with [`instance`](Self::instance). See the
/// [module docs](super) for what is shared and how.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_circuit_breaker::store::memory::MemoryFleet;
/// use tower_circuit_breaker::{CircuitBreakerLayer, Config, State};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let fleet = MemoryFleet::builder().failures_to_open(2).build()?;
/// let (east, west) = (fleet.instance(), fleet.instance());
/// let config = Config::builder().name("search").build()?;
/// let here = CircuitBreakerLayer::new(config.clone());
/// let there = CircuitBreakerLayer::new(config);
/// assert!(east.attach(&here.breaker()) && west.attach(&there.breaker()));
///
/// // One failure on each instance: two for the fleet, which opens both.
/// let down = service_fn(|()| async { Err::<(), BoxError>("upstream down".into()) });
/// assert!(here.layer(down).oneshot(()).await.is_err());
/// tokio::time::sleep(Duration::from_millis(1)).await;
/// assert_eq!(fleet.failures("search"), 1);
/// assert!(there.layer(down).oneshot(()).await.is_err());
/// tokio::time::sleep(Duration::from_millis(1)).await;
/// assert_eq!(here.breaker().state(), State::Open);
/// assert_eq!(there.breaker().state(), State::Open);
/// assert_eq!(fleet.failures("search"), 0, "an opening starts the count again");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryFleet {
    pub(super) inner: Arc<FleetInner>,
}

pub(crate) struct FleetInner {
    pub(super) state: Mutex<Fleet>,
    pub(super) settings: Arc<LinkSettings>,
    pub(super) timing: Timing,
    pub(super) queue_capacity: usize,
    pub(super) runtime: tokio::runtime::Handle,
}

impl FleetInner {
    pub(super) fn lock(&self) -> MutexGuard<'_, Fleet> {
        // Nothing panics under this lock; should it ever, the state is
        // still whole (every operation writes it in one piece).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MemoryFleet {
    /// Starts a fleet with the Redis store's defaults: a 10 s probe lease,
    /// a 1 s hold, a 60 s failure window, 4,096 queued writes per instance,
    /// and the policy's own threshold for the fleet's count.
    pub fn builder() -> MemoryFleetBuilder {
        MemoryFleetBuilder {
            probe_lease: Duration::from_secs(10),
            hold: Duration::from_secs(1),
            queue_capacity: 4096,
            failures_to_open: None,
            failure_window: Duration::from_secs(60),
            quorum: 1,
        }
    }

    /// A new instance of the service in this fleet, its task started on
    /// the runtime the fleet was built on. Keep it as long as the instance
    /// lives: once every clone of it is dropped, its breakers stop sharing.
    ///
    /// An instance made this way has no name: toward a
    /// [quorum](MemoryFleetBuilder::quorum), its failures count under an
    /// identity of its own, so an instance made again after a restart is
    /// another voter, and the failures of the one before still count for
    /// the failure window. Give instances names with
    /// [`named_instance`](Self::named_instance) where a quorum matters.
    pub fn instance(&self) -> MemoryStore {
        self.join(None)
    }

    /// A new instance named `name` (a host, a pod): toward a quorum, its
    /// failures count under that name, with those of every instance of the
    /// same name, so a crash-looping instance made again and again under
    /// its name is still one instance failing. Its probe locks are its
    /// own: two live instances of one name never share a probe. The fleet
    /// remembers each name it was given for as long as it lives: name
    /// instances from a bounded set (hosts, pods), not afresh each time.
    ///
    /// ```
    /// use tower_circuit_breaker::store::memory::MemoryFleet;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_circuit_breaker::store::memory::MemoryFleetError> {
    /// let fleet = MemoryFleet::builder().quorum(2).build()?;
    /// let first = fleet.named_instance("pod-a");
    /// drop(first); // the process restarts
    /// let again = fleet.named_instance("pod-a"); // still one voter
    /// # let _ = again;
    /// # Ok(())
    /// # }
    /// ```
    pub fn named_instance(&self, name: &str) -> MemoryStore {
        self.join(Some(name))
    }

    fn join(&self, name: Option<&str>) -> MemoryStore {
        let (inbox, news) = mpsc::unbounded_channel();
        let (id, name) = {
            let mut fleet = self.inner.lock();
            let id = fleet.join(inbox.downgrade(), name);
            (id, fleet.name_of(id.instance))
        };
        let inner = Arc::new(Inner {
            id,
            name,
            fleet: Arc::clone(&self.inner),
            queue: Arc::new(Queue::new(self.inner.queue_capacity)),
            inbox,
            stats: Stats::default(),
        });
        self.inner.runtime.spawn(Task::new(&inner, news).run());
        MemoryStore { inner }
    }

    /// The fleet's failure count for the breaker named `name` now: failures
    /// counted from every instance since the last success, opening or
    /// closing (0 while open).
    pub fn failures(&self, name: &str) -> u64 {
        self.inner.lock().failures(name, Instant::now())
    }
}

impl fmt::Debug for MemoryFleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryFleet")
            .field("probe_lease", &self.inner.timing.lease)
            .field("hold", &self.inner.timing.hold)
            .field("failure_window", &self.inner.settings.failure_window)
            .field("failures_to_open", &self.inner.settings.failures_to_open)
            .field("quorum", &self.inner.settings.quorum)
            .field("queue_capacity", &self.inner.queue_capacity)
            .finish()
    }
}
