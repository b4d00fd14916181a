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
//!   the probe lease ([`probe_lease`](MemoryFleetBuilder::probe_lease) long)
//!   and its breakers go half-open; the others keep refusing, hear that the
//!   lease is held elsewhere, and learn the result. A lease that runs out
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
//! instance's task has to race for the probe lease (which ends the local
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

mod state;
mod task;

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::ConfigError;
use crate::millis::millis;
use crate::store::fleet::{self, Args, Link, LinkSettings, Queue};
use crate::store::{FleetError, FleetState};
use crate::{Breaker, Control};
use state::{Caller, Fleet, News};
use task::{Task, Timing};

/// The shared state of one fleet of instances, in memory: what a Redis
/// server is to the [Redis store](crate::store::redis). Cheap to clone;
/// clones are the same fleet.
///
/// Make one with [`builder`](Self::builder), then one [`MemoryStore`] per
/// instance of the service with [`instance`](Self::instance). See the
/// [module docs](self) for what is shared and how.
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
    inner: Arc<FleetInner>,
}

pub(crate) struct FleetInner {
    state: Mutex<Fleet>,
    settings: Arc<LinkSettings>,
    timing: Timing,
    queue_capacity: usize,
    runtime: tokio::runtime::Handle,
}

impl FleetInner {
    fn lock(&self) -> MutexGuard<'_, Fleet> {
        // Nothing panics under this lock; should it ever, the state is
        // still whole (every operation writes it in one piece).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Builds a [`MemoryFleet`]; [`build`](Self::build) checks every value.
///
/// The settings are the Redis store's, where they apply (a fleet in memory
/// has no refresh interval, command timeout or key prefix):
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::store::memory::MemoryFleet;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let fleet = MemoryFleet::builder()
///     .probe_lease(Duration::from_secs(5))
///     .hold(Duration::from_millis(200))
///     .failure_window(Duration::from_secs(30))
///     .failures_to_open(10)
///     .queue_capacity(1024)
///     .build();
/// assert!(fleet.is_ok());
///
/// let invalid = MemoryFleet::builder().probe_lease(Duration::ZERO).build();
/// assert!(invalid.is_err(), "an invalid setting is an error, never a panic");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryFleetBuilder {
    probe_lease: Duration,
    hold: Duration,
    queue_capacity: usize,
    failures_to_open: Option<u32>,
    failure_window: Duration,
    quorum: u32,
}

/// One instance of a service in a [`MemoryFleet`]: what one `RedisStore`
/// is. Cheap to clone; its task stops when the last clone is dropped, and
/// its breakers stop sharing.
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
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    id: Caller,
    /// Its name in the fleet's state.
    name: String,
    fleet: Arc<FleetInner>,
    queue: Arc<Queue>,
    /// The task's news: attachments come this way, in order with what the
    /// fleet tells the instance. The fleet holds it weakly, so the task
    /// ends when the instance's handles are gone.
    inbox: mpsc::UnboundedSender<News>,
    stats: Stats,
}

#[derive(Default)]
struct Stats {
    writes: AtomicU64,
    probe_locks_won: AtomicU64,
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
    /// Times this instance won a probe lease.
    pub probe_locks_won: u64,
}

/// Why a [`MemoryFleet`] could not be built.
///
/// ```
/// use tower_circuit_breaker::store::memory::{MemoryFleet, MemoryFleetError};
///
/// // Outside a tokio runtime: the instances' tasks would have nowhere to run.
/// let error = MemoryFleet::builder().build().unwrap_err();
/// assert!(matches!(error, MemoryFleetError::NoRuntime));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum MemoryFleetError {
    /// A setting is out of range.
    Config(ConfigError),
    /// `build` was called outside a tokio runtime, which the instances'
    /// tasks need.
    NoRuntime,
}

impl fmt::Display for MemoryFleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryFleetError::Config(e) => e.fmt(f),
            MemoryFleetError::NoRuntime => {
                f.write_str("the memory fleet must be built inside a tokio runtime")
            }
        }
    }
}

impl Error for MemoryFleetError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            MemoryFleetError::Config(e) => Some(e),
            MemoryFleetError::NoRuntime => None,
        }
    }
}

impl From<ConfigError> for MemoryFleetError {
    fn from(e: ConfigError) -> Self {
        MemoryFleetError::Config(e)
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
    /// its name is still one instance failing. Its probe leases are its
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

impl MemoryFleetBuilder {
    /// How long the probe lease is held (default 10 s): it should cover a
    /// probe's duration and be shorter than the open period. A lease that
    /// runs out without a verdict passes the turn on; a prober still
    /// half-open renews it.
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.probe_lease = lease;
        self
    }

    /// How long past the fleet's open period (or another instance's probe
    /// lease) a breaker keeps refusing while its instance's task races for
    /// the lease (default 1 s). If the task is gone, the breaker probes on
    /// its own once the hold has run out.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// Writes that may wait for each instance's task (default 4,096); past
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
    /// a breaker (default 1: any instance's evidence opens it for all).
    /// See the Redis store's
    /// [`quorum`](crate::store::redis::RedisStoreBuilder::quorum), which
    /// this mirrors: below the quorum, an instance's breaker opens on its
    /// own and the others keep serving. Instances are told apart as
    /// [`MemoryFleet::named_instance`] says.
    pub fn quorum(mut self, instances: u32) -> Self {
        self.quorum = instances;
        self
    }

    /// Checks the settings and makes the fleet, whose instances' tasks will
    /// run on the current tokio runtime. Must be called inside one.
    pub fn build(self) -> Result<MemoryFleet, MemoryFleetError> {
        fleet::check_durations(&[
            ("probe_lease", self.probe_lease),
            ("hold", self.hold),
            ("failure_window", self.failure_window),
        ])?;
        fleet::check_counts(self.queue_capacity, self.failures_to_open, self.quorum)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| MemoryFleetError::NoRuntime)?;
        Ok(MemoryFleet {
            inner: Arc::new(FleetInner {
                state: Mutex::new(Fleet::default()),
                settings: Arc::new(LinkSettings {
                    failures_to_open: self.failures_to_open,
                    failure_window: self.failure_window,
                    probe_lease: self.probe_lease,
                    quorum: self.quorum,
                }),
                timing: Timing {
                    hold: self.hold,
                    lease: self.probe_lease,
                },
                queue_capacity: self.queue_capacity,
                runtime,
            }),
        })
    }
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
    /// lease, the votes toward a quorum, and the fleet-wide control in
    /// force. Instances are named by their number (`3`), after their name
    /// when they have one (`pod-a/3`).
    pub async fn fleet_state(&self, name: &str) -> Result<FleetState, FleetError> {
        Ok(self.inner.fleet.lock().inspect(name, Instant::now()))
    }

    /// This instance's name in the fleet's state, as
    /// [`fleet_state`](Self::fleet_state) names the holder of a probe
    /// lease.
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
