//! One instance of the fleet, [`MemoryStore`]: attaching its breakers
//! (each told the fleet's state of its name through the instance's task),
//! fleet-wide control and inspection on the fleet's state, and the
//! instance's counters ([`MemoryStoreStats`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::state::{Caller, News};
use super::FleetInner;
use crate::millis::millis;
use crate::store::fleet::{Args, Link, Queue};
use crate::store::{FleetError, FleetState};
use crate::{Breaker, Control};

/// One instance of a service in a [`MemoryFleet`](super::MemoryFleet):
/// what one `RedisStore` is. Cheap to clone; its task stops when the last
/// clone is dropped, and its breakers stop sharing.
///
/// ```
/// use tower_circuit_breaker::store::memory::MemoryFleet;
/// use tower_circuit_breaker::{Breaker, Config};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let fleet = MemoryFleet::builder().build()?;
/// let store = fleet.instance();
/// let search = Breaker::new(Config::builder().name("search").build()?);
/// assert!(store.attach(&search));
/// assert!(store.is_attached(&search));
/// assert!(!fleet.instance().attach(&search), "a breaker reports to one store");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    pub(super) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(super) id: Caller,
    /// Its name in the fleet's state.
    pub(super) name: String,
    pub(super) fleet: Arc<FleetInner>,
    pub(super) queue: Arc<Queue>,
    /// The task's news: attachments come this way, in order with what the
    /// fleet tells the instance. The fleet holds it weakly, so the task
    /// ends when the instance's handles are gone.
    pub(super) inbox: mpsc::UnboundedSender<News>,
    pub(super) stats: Stats,
}

#[derive(Default)]
pub(super) struct Stats {
    pub(super) writes: AtomicU64,
    pub(super) probe_locks_won: AtomicU64,
}

/// A [`MemoryStore`]'s counters.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_circuit_breaker::store::memory::MemoryFleet;
/// use tower_circuit_breaker::{CircuitBreakerLayer, Config};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let fleet = MemoryFleet::builder().queue_capacity(2).build()?;
/// let store = fleet.instance();
/// let layer = CircuitBreakerLayer::new(Config::builder().name("search").build()?);
/// store.attach(&layer.breaker());
/// // Three failures before the instance's task runs: the oldest write is
/// // dropped.
/// let down = service_fn(|()| async { Err::<(), BoxError>("upstream down".into()) });
/// for _ in 0..3 {
///     assert!(layer.layer(down).oneshot(()).await.is_err());
/// }
/// tokio::time::sleep(Duration::from_millis(1)).await;
/// let stats = store.stats();
/// assert_eq!((stats.writes, stats.dropped_writes), (2, 1));
/// assert_eq!(fleet.failures("search"), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStoreStats {
    /// Writes carried out on the fleet's state.
    pub writes: u64,
    /// Writes dropped because the queue was full (the oldest go first).
    pub dropped_writes: u64,
    /// Times this instance won a probe lock.
    pub probe_locks_won: u64,
}

impl MemoryStore {
    /// Shares `breaker`'s state with the fleet under its name; false if it
    /// already reports to a store. Every instance of the fleet that
    /// attaches a breaker of the same name shares one breaker. The breaker
    /// learns the fleet's state of its name at once (as soon as the
    /// instance's task runs).
    pub fn attach(&self, breaker: &Breaker) -> bool {
        let key: Arc<str> = Arc::from(breaker.name());
        let link = Link {
            key: Arc::clone(&key),
            queue: Arc::clone(&self.inner.queue),
            settings: Arc::clone(&self.inner.fleet.settings),
        };
        if !breaker.shared.attach_link(Box::new(link)) {
            return false;
        }
        // Read and sent under the fleet's lock: the task hears of the
        // attachment after every change before it, and before every
        // change after it.
        let mut fleet = self.inner.fleet.lock();
        let state = fleet.read(&key, Instant::now());
        let control = fleet.control_of(&key);
        // The task stops only once every handle is gone, and this is one:
        // sending cannot fail while the runtime runs.
        let _ = self.inner.inbox.send(News::Attached {
            key,
            breaker: Arc::downgrade(&breaker.shared),
            state,
            control,
        });
        drop(fleet);
        true
    }

    /// Whether `breaker` reports to a store.
    pub fn is_attached(&self, breaker: &Breaker) -> bool {
        breaker.shared.has_link()
    }

    /// Carries out `control` on the breakers named `name` of every
    /// instance of the fleet: see [`Fleet`](crate::store::Fleet) for what each control does
    /// fleet-wide. Every instance's task (this one's too) carries it out
    /// as soon as it runs, in order with the fleet's other changes; an
    /// instance that attaches a breaker of that name later carries it out
    /// on attaching. The fleet is memory: this never fails.
    pub async fn control(&self, name: &str, control: Control) -> Result<(), FleetError> {
        let timing = &self.inner.fleet.timing;
        let open_ms = match control {
            Control::ForceOpen(Some(period)) => millis(period),
            _ => 0,
        };
        let open = Args {
            open_ms,
            keep_ms: open_ms
                .saturating_add(60_000)
                .saturating_add(millis(timing.lease)),
            ..Args::default()
        };
        self.inner
            .fleet
            .lock()
            .control(&Arc::from(name), control, &open, Instant::now());
        Ok(())
    }

    /// Everything the fleet keeps of the breaker named `name` now: its
    /// opening, its shared failure count, the instance holding the probe
    /// lock, the votes toward a quorum, and the fleet-wide control in
    /// force. Instances are named by their number (`3`), after their name
    /// when they have one (`pod-a/3`).
    pub async fn fleet_state(&self, name: &str) -> Result<FleetState, FleetError> {
        Ok(self.inner.fleet.lock().inspect(name, Instant::now()))
    }

    /// This instance's name in the fleet's state, as
    /// [`fleet_state`](Self::fleet_state) names the holder of a probe
    /// lock.
    pub fn instance(&self) -> &str {
        &self.inner.name
    }

    /// Whether the breaker named `name` is shared with the fleet now:
    /// always, the fleet being this process's memory (the Redis store's
    /// method of the same name can say no).
    pub fn shares(&self, _name: &str) -> bool {
        true
    }

    /// This instance's counters.
    pub fn stats(&self) -> MemoryStoreStats {
        let s = &self.inner.stats;
        MemoryStoreStats {
            writes: s.writes.load(Ordering::Relaxed),
            dropped_writes: self.inner.queue.dropped.load(Ordering::Relaxed),
            probe_locks_won: s.probe_locks_won.load(Ordering::Relaxed),
        }
    }
}

crate::store::steer_through_methods!(MemoryStore);

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("instance", &self.inner.id)
            .field("stats", &self.stats())
            .finish()
    }
}
