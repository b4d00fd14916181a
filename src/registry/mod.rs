//! Keyed breakers: one breaker per key (provider, credential, model, host),
//! made on first use, bounded in number, each with an optional parent.
//!
//! A provider (and a credential) is what goes down; a single model can be
//! withdrawn while its siblings work. A [`Registry`] holds one [`Breaker`] per
//! key, from a default config or a per-key one, and serves the request path
//! ([`KeyedLayer`]) and the metrics page ([`Registry::snapshot`]) from the
//! very same breakers.
//!
//! # Bounds
//!
//! Keys can come from request data an attacker controls, so the number of
//! breakers is bounded ([`RegistryBuilder::max_keys`], default 10,000). When
//! a new key finds the registry full, idle closed breakers are evicted, those
//! with nothing to forget first, then the least recently used (to within a
//! sixty-fourth of the bound, so that hot keys rarely write their use), in a
//! batch of a sixteenth of the bound, so that the cost of a scan is shared by
//! many insertions. An open, half-open or manually held breaker is never
//! evicted, nor one in shadow mode or probing actively (settings a new
//! breaker for the key would not have), nor one a user holds a handle to
//! (see [`Registry::get`]); if nothing can be, the request gets
//! [`RegistryFull`] rather than the registry growing. A breaker costs about
//! 1 KiB (more with large windows), so the default bound holds about
//! 10 MiB.
//!
//! Evicting forgets a breaker's counts, not the calls it let through: a
//! call still in flight when its breaker is evicted counts, when it ends,
//! in the breaker the registry holds for its key then (a failure makes one
//! if the key has none). Receivers from an evicted breaker's own
//! [`Breaker::subscribe`] hear nothing more; [`Registry::subscribe`] hears
//! every key's transitions, whichever breaker holds it.
//!
//! Keys are hashed with a randomly keyed SipHash, as `std`'s `HashMap` does,
//! so an attacker cannot aim keys at one bucket.
//!
//! Each clone of a [`KeyedCircuitBreaker`] also remembers the breakers of up
//! to [`RECENT_KEYS`] keys it calls again and again, and calls them without
//! asking the registry; it forgets a breaker the registry has evicted at its
//! next call with that key. A clone that remembers anything holds about
//! 400 bytes of handles per remembered breaker (up to `2 × RECENT_KEYS`
//! with parents) plus a copy of each key, and may keep that many evicted
//! breakers alive beyond the bound until it calls their keys again.
//!
//! # Parents
//!
//! With [`RegistryBuilder::parent`], every key may have a parent key
//! (provider over provider-and-model). Every outcome counts in the child
//! and in its parent; a request is refused if either is open, and the
//! [`CircuitOpen`](crate::CircuitOpen) error names which. Parents are keys
//! like any other, with their own configs.
//!
//! ```
//! use tower_circuit_breaker::{registry::Registry, Config, State};
//!
//! let registry = Registry::<String>::builder()
//!     .default_config(Config::default())
//!     .parent(|key: &String| key.split_once('/').map(|(provider, _)| provider.to_string()))
//!     .max_keys(1_000)
//!     .build();
//! let model = registry.get(&"openai/gpt-x".to_string())?;
//! assert_eq!(model.name(), "openai/gpt-x");
//! assert_eq!(registry.get(&"openai".to_string())?.state(), State::Closed);
//! # Ok::<_, tower_circuit_breaker::registry::RegistryFull>(())
//! ```

mod extract;
mod permit;
mod service;

use std::collections::hash_map::RandomState;
use std::collections::hash_map::{self, HashMap};
use std::error::Error;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::broadcast;

pub use extract::{authority, header};
pub use permit::{AcquireError, KeyedPermit};
pub use service::{KeyedCircuitBreaker, KeyedFuture, KeyedLayer, RECENT_KEYS};

use crate::breaker::shared::{Shared, Successor, EVENT_CAPACITY};
use crate::breaker::{Breaker, BreakerGroup, Snapshot};
use crate::classify::{Outcome, Verdict};
use crate::config::Config;
use crate::events::Transition;
use crate::State;

/// The number of shards: lookups of different keys rarely share a lock.
const SHARDS: usize = 16;

/// The shard of a key's hash, from bits 32 to 35. A shard's map uses the
/// same hash: its low bits place an entry and its top seven are the tag
/// its control bytes compare before any entry is read. Taken from the top,
/// the shard would fix four of the tag's seven bits for every key in it:
/// one entry in eight would then carry a lookup's tag instead of one in
/// 128, and a lookup among many keys would read one or two other entries
/// (a cache miss each) for the one it finds.
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

type ParentOf<K> = Arc<dyn Fn(&K) -> Option<K> + Send + Sync>;

/// A breaker per key. Cheap to clone: clones share the breakers.
pub struct Registry<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Registry<K> {
    fn clone(&self) -> Self {
        Registry {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Entries by the key's hash (already computed: the shard map hashes no
/// further), a bucket holding the rare keys whose hashes collide.
type Shard<K> = HashMap<u64, Bucket<K>, BuildHasherDefault<Prehashed>>;

/// The keys with one hash: almost always one, held in the map itself, so
/// that a lookup misses no allocation of its own in the cache.
enum Bucket<K> {
    One([(K, Breaker); 1]),
    Many(Vec<(K, Breaker)>),
}

impl<K: Eq> Bucket<K> {
    fn entries(&self) -> &[(K, Breaker)] {
        match self {
            Bucket::One(entry) => entry,
            Bucket::Many(entries) => entries,
        }
    }

    fn find(&self, key: &K) -> Option<&Breaker> {
        let (_, breaker) = self.entries().iter().find(|(k, _)| k == key)?;
        Some(breaker)
    }

    fn into_vec(self) -> Vec<(K, Breaker)> {
        match self {
            Bucket::One(entry) => Vec::from(entry),
            Bucket::Many(entries) => entries,
        }
    }

    /// Changes the entries as a list, which the bucket holds from then on.
    fn edit<R>(&mut self, f: impl FnOnce(&mut Vec<(K, Breaker)>) -> R) -> R {
        let mut entries = std::mem::replace(self, Bucket::Many(Vec::new())).into_vec();
        let result = f(&mut entries);
        *self = Bucket::Many(entries);
        result
    }

    /// Adds a key whose hash collides with those held (rare).
    fn push(&mut self, entry: (K, Breaker)) {
        self.edit(|entries| entries.push(entry));
    }

    /// Removes the `i`th entry.
    fn remove(&mut self, i: usize) -> (K, Breaker) {
        self.edit(|entries| entries.swap_remove(i))
    }
}

struct Inner<K> {
    shards: Vec<RwLock<Shard<K>>>,
    hasher: RandomState,
    configs: RwLock<Configs<K>>,
    parent_of: Option<ParentOf<K>>,
    max_keys: usize,
    /// A use is marked when this many insertions have passed since the
    /// last mark: a sixty-fourth of the bound.
    mark_every: u64,
    keys: AtomicU64,
    /// Counts insertions: the clock of eviction order (each breaker notes
    /// the count at its last use).
    insertions: AtomicU64,
    /// Makes evictions one at a time.
    evicting: Mutex<()>,
    events: broadcast::Sender<Transition>,
    /// Every breaker made is attached to this store.
    store: Option<crate::store::Fleet>,
}

/// Whether no user holds the breaker `shared` (the registry's own handle):
/// a user's [`Breaker`], or a service or a layer built from one, holds
/// it, as evicted it would go on guarding that user's calls with a breaker
/// that no longer counts its key's failures. The keyed services' own
/// handles (keys a clone remembers, calls in flight) do not: a call in
/// flight whose breaker is evicted has its outcome passed on to the key's
/// breaker then.
fn held_by_none(shared: &Arc<Shared>) -> bool {
    let others = Arc::strong_count(shared) as u64 - 1;
    others <= shared.keeper_handles()
}

struct Configs<K> {
    default: Config,
    per_key: HashMap<K, Config>,
}

/// Builds a [`Registry`].
pub struct RegistryBuilder<K> {
    default: Config,
    per_key: HashMap<K, Config>,
    parent_of: Option<ParentOf<K>>,
    max_keys: usize,
    store: Option<crate::store::Fleet>,
}

/// The registry holds as many breakers as it may, and none can be evicted:
/// every one is open, half-open or held by an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryFull {
    max_keys: usize,
}

impl RegistryFull {
    /// The registry's bound.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }
}

impl fmt::Display for RegistryFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "circuit breaker registry is full ({} keys, none idle and closed)",
            self.max_keys
        )
    }
}

impl Error for RegistryFull {}

/// An error type a keyed breaker's guarded service may have: one that can
/// hold both of its refusals, an open circuit ([`CircuitOpen`]) and a full
/// registry ([`RegistryFull`]). tower's `BoxError` does.
///
/// Implemented for every such type; named in bounds so that a service
/// whose error holds neither (a hyper client's own error) is reported with
/// the fixes:
///
/// ```compile_fail
/// use tower::{service_fn, Layer};
/// use tower_circuit_breaker::registry::{KeyedLayer, Registry};
///
/// #[derive(Debug)]
/// struct Upstream;
/// let registry = Registry::<String>::new(Default::default());
/// let svc = KeyedLayer::new(registry, |_: &u32| "k".to_string())
///     .layer(service_fn(|_: u32| async { Err::<(), _>(Upstream) }));
/// let _ = tower::ServiceExt::<u32>::oneshot(svc, 1); // `Upstream` holds no refusal
/// ```
///
/// [`CircuitOpen`]: crate::CircuitOpen
#[diagnostic::on_unimplemented(
    message = "a keyed circuit breaker refuses calls with the guarded service's error type, and `{Self}` cannot hold its refusals",
    label = "the keyed breaker's error would be `{Self}`, which lacks `From<CircuitOpen>` or `From<RegistryFull>`",
    note = "put `.timeout(..)` inside the breaker (its error, `BoxError`, holds both refusals), or map the inner error inside the breaker: `.map_err(BoxError::from)` on the `ServiceBuilder` (`tower::util::MapErrLayer`), or to a type of yours that implements `From<CircuitOpen>` and `From<RegistryFull>`"
)]
pub trait HoldsKeyedRefusals: From<crate::CircuitOpen> + From<RegistryFull> {}

// As for `HoldsCircuitOpen`: reported as missing this trait, whose message
// names the fixes.
#[diagnostic::do_not_recommend]
impl<E: From<crate::CircuitOpen> + From<RegistryFull>> HoldsKeyedRefusals for E {}

impl<K> Registry<K>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    /// Starts a registry: default config, no parents, at most 10,000 keys.
    pub fn builder() -> RegistryBuilder<K> {
        RegistryBuilder {
            default: Config::default(),
            per_key: HashMap::new(),
            parent_of: None,
            max_keys: 10_000,
            store: None,
        }
    }

    /// A registry with `config` for every key.
    pub fn new(config: Config) -> Self {
        Self::builder().default_config(config).build()
    }

    fn hash(&self, key: &K) -> u64 {
        self.inner.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard<K>> {
        &self.inner.shards[shard_of(hash)]
    }

    /// `key`'s breaker, if it exists; a use at insertion count `now`.
    /// Inlined into the request path's lookup, whose cache misses it then
    /// overlaps.
    #[inline(always)]
    fn find(&self, key: &K, hash: u64, now: Option<u64>) -> Option<Breaker> {
        let shard = self.shard(hash).read().unwrap_or_else(|p| p.into_inner());
        let breaker = shard.get(&hash)?.find(key)?;
        if let Some(now) = now {
            self.mark_used(&breaker.shared, now);
        }
        // Cloned under the lock: one reference count, no entry to keep.
        Some(breaker.clone())
    }

    /// The clock of eviction order, for a use found without a lookup.
    #[inline]
    fn now(&self) -> u64 {
        self.inner.insertions.load(Ordering::Relaxed)
    }

    /// Marks a use of a breaker at insertion count `now`. To a sixty-fourth
    /// of the bound: eviction takes a sixteenth at a time, and the marks of
    /// hot keys then cost one write per that many insertions.
    /// Repeated use of a hot key writes nothing, and keys arriving all the
    /// time make it write at most once per interval. The mark is kept in
    /// the breaker's keeper word.
    #[inline]
    fn mark_used(&self, shared: &Shared, now: u64) {
        let used_at = shared.keeper_mark();
        if now.wrapping_sub(used_at.load(Ordering::Relaxed)) >= self.inner.mark_every {
            used_at.store(now, Ordering::Relaxed);
        }
    }

    /// The breaker for `key`, made on first use. Its name is the key.
    ///
    /// **The handle holds the breaker in the registry**: while it, a clone
    /// of it, or a service or layer built from it lives, the registry never
    /// evicts that breaker, so it goes on protecting whatever calls go
    /// through it, and every lookup of `key` finds it. Drop the handle to
    /// let the key be evicted again. Held breakers count toward
    /// [`max_keys`](RegistryBuilder::max_keys): a registry whose every
    /// breaker is held, open or manually controlled is full. (The keyed
    /// services' own handles do not hold a breaker: they look the key up
    /// again once it is evicted.)
    ///
    /// ```
    /// use tower::{service_fn, BoxError, ServiceExt};
    /// use tower_circuit_breaker::{registry::Registry, CircuitBreaker, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// let registry = Registry::<String>::builder().max_keys(2).build();
    /// let search = registry.get(&"search".to_string())?;
    /// let upstream = service_fn(|q: &'static str| async move { Ok::<_, BoxError>(q.len()) });
    /// let client = CircuitBreaker::new(upstream, &search);
    /// drop(search); // the service still holds it
    /// for key in ["a", "b", "c"] {
    ///     let _ = registry.get(&key.to_string()); // other keys come and go
    /// }
    /// assert!(registry.breakers().iter().any(|(key, _)| key == "search"));
    /// assert_eq!(client.oneshot("hi").await?, 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn get(&self, key: &K) -> Result<Breaker, RegistryFull> {
        self.get_hashed(key, self.hash(key))
    }

    /// [`get`](Self::get), with the key's hash already computed.
    fn get_hashed(&self, key: &K, hash: u64) -> Result<Breaker, RegistryFull> {
        match self.find(key, hash, Some(self.now())) {
            Some(breaker) => Ok(breaker),
            None => self.insert(key, hash),
        }
    }

    /// The parent key of `key`, as the registry's parent function names it
    /// (`None` without one, or when it names `key` itself).
    #[cfg(feature = "admin")]
    pub(crate) fn parent_key(&self, key: &K) -> Option<K> {
        self.inner
            .parent_of
            .as_ref()
            .and_then(|f| f(key))
            .filter(|parent| parent != key)
    }

    /// Whether the registry has a parent function.
    #[cfg(feature = "admin")]
    pub(crate) fn has_parents(&self) -> bool {
        self.inner.parent_of.is_some()
    }

    /// The breakers `key` has now, its own and its parent's, without making
    /// either: a key with none has never refused anything.
    pub(crate) fn find_with_parent(&self, key: &K) -> [Option<Breaker>; 2] {
        let child = self.find(key, self.hash(key), None);
        let parent = match self.inner.parent_of.as_ref().and_then(|f| f(key)) {
            Some(parent) if &parent != key => self.find(&parent, self.hash(&parent), None),
            _ => None,
        };
        [child, parent]
    }

    /// The breaker for `key` and, when the key has one, its parent's.
    pub fn get_with_parent(&self, key: &K) -> Result<(Breaker, Option<Breaker>), RegistryFull> {
        self.get_with_parent_hashed(key, self.hash(key))
    }

    /// [`get_with_parent`](Self::get_with_parent), with the key's hash
    /// already computed.
    fn get_with_parent_hashed(
        &self,
        key: &K,
        hash: u64,
    ) -> Result<(Breaker, Option<Breaker>), RegistryFull> {
        let child = self.get_hashed(key, hash)?;
        let parent = match self.inner.parent_of.as_ref().and_then(|f| f(key)) {
            Some(parent) if &parent != key => Some(self.get(&parent)?),
            _ => None,
        };
        Ok((child, parent))
    }

    fn insert(&self, key: &K, hash: u64) -> Result<Breaker, RegistryFull> {
        // A place is taken before the breaker is made, so that callers
        // inserting at once never hold more than `max_keys` between them:
        // the bound is a promise against keys an attacker makes up.
        if !self.take_place() {
            self.evict();
            if !self.take_place() {
                // Full, but another caller may have made this very key.
                return self.find(key, hash, None).ok_or(RegistryFull {
                    max_keys: self.inner.max_keys,
                });
            }
        }
        let mut shard = self.shard(hash).write().unwrap_or_else(|p| p.into_inner());
        // Another caller may have made it meanwhile: the place goes back.
        if let Some(breaker) = shard.get(&hash).and_then(|bucket| bucket.find(key)) {
            self.inner.keys.fetch_sub(1, Ordering::Relaxed);
            return Ok(breaker.clone());
        }
        let breaker = Breaker {
            shared: Shared::new_arc_forwarding(self.config_for(key), self.inner.events.clone()),
        };
        if let Some(store) = &self.inner.store {
            store.attach(&breaker);
        }
        let tick = self.inner.insertions.fetch_add(1, Ordering::Relaxed) + 1;
        // Its first use.
        breaker.shared.keeper_mark().store(tick, Ordering::Relaxed);
        let entry = (key.clone(), breaker.clone());
        match shard.entry(hash) {
            hash_map::Entry::Occupied(mut bucket) => bucket.get_mut().push(entry),
            hash_map::Entry::Vacant(vacant) => {
                vacant.insert(Bucket::One([entry]));
            }
        }
        Ok(breaker)
    }

    /// Counts one more key if the registry has room for it.
    fn take_place(&self) -> bool {
        let max_keys = self.inner.max_keys as u64;
        self.inner
            .keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |keys| {
                (keys < max_keys).then_some(keys + 1)
            })
            .is_ok()
    }

    fn config_for(&self, key: &K) -> Config {
        let configs = self.inner.configs.read().unwrap_or_else(|p| p.into_inner());
        let mut config = configs.per_key.get(key).unwrap_or(&configs.default).clone();
        config.name = Arc::from(key.to_string());
        config
    }

    /// Evicts a batch of idle closed breakers: those with no failure to
    /// forget first, then the least recently used.
    fn evict(&self) {
        let _one_at_a_time = self
            .inner
            .evicting
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Whoever evicted while we waited may have made room.
        if (self.inner.keys.load(Ordering::Relaxed) as usize) < self.inner.max_keys {
            return;
        }
        let mut candidates: Vec<(bool, u64, u64, K)> = Vec::new();
        for shard in &self.inner.shards {
            let shard = shard.read().unwrap_or_else(|p| p.into_inner());
            for (hash, bucket) in shard.iter() {
                for (key, breaker) in bucket.entries() {
                    // Idle and held by no user: see `held_by_none`.
                    if breaker.shared.is_idle() && held_by_none(&breaker.shared) {
                        candidates.push((
                            breaker.shared.holds_failures(),
                            breaker.shared.keeper_mark().load(Ordering::Relaxed),
                            *hash,
                            key.clone(),
                        ));
                    }
                }
            }
        }
        let batch = (self.inner.max_keys / 16).max(1);
        if candidates.len() > batch {
            candidates.select_nth_unstable_by_key(batch - 1, |(f, used, _, _)| (*f, *used));
            candidates.truncate(batch);
        }
        for (_, _, hash, key) in candidates {
            let mut shard = self.shard(hash).write().unwrap_or_else(|p| p.into_inner());
            if let Some(bucket) = shard.get_mut(&hash) {
                // Evict only if still idle: it may have tripped meanwhile.
                if let Some(i) = bucket.entries().iter().position(|(k, b)| {
                    k == &key
                        && Shared::supersede_if(
                            &b.shared,
                            self.successor(key.clone()),
                            held_by_none,
                        )
                }) {
                    bucket.remove(i);
                    self.inner.keys.fetch_sub(1, Ordering::Relaxed);
                }
                if bucket.entries().is_empty() {
                    shard.remove(&hash);
                }
            }
        }
    }

    /// Where an evicted breaker of `key` sends the outcomes of the calls it
    /// admitted: to the key's breaker now (a failure makes one if there is
    /// none; a success without one changes nothing). Holds the registry
    /// weakly: an evicted breaker does not keep it alive.
    fn successor(&self, key: K) -> Successor {
        let registry = Arc::downgrade(&self.inner);
        Arc::new(move |verdict: Verdict, timing| {
            let Some(inner) = registry.upgrade() else {
                return;
            };
            let registry = Registry { inner };
            let hash = registry.hash(&key);
            let breaker = match verdict.outcome() {
                Outcome::Failure => registry.get_hashed(&key, hash).ok(),
                _ => registry.find(&key, hash, None),
            };
            if let Some(breaker) = breaker {
                breaker.shared.record_passed_on(verdict, timing);
            }
        })
    }

    /// How many keys the registry holds.
    pub fn len(&self) -> usize {
        self.inner.keys.load(Ordering::Relaxed) as usize
    }

    /// Whether the registry holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key with its breaker. Like [`get`](Self::get)'s, these handles
    /// hold their breakers in the registry for as long as they are kept.
    pub fn breakers(&self) -> Vec<(K, Breaker)> {
        let mut all = Vec::with_capacity(self.len());
        for shard in &self.inner.shards {
            let shard = shard.read().unwrap_or_else(|p| p.into_inner());
            for (key, breaker) in shard.values().flat_map(Bucket::entries) {
                all.push((key.clone(), breaker.clone()));
            }
        }
        all
    }

    /// Every key with its snapshot: state, counts, the policy's figures,
    /// retry-after and time in state, read from the breakers the request
    /// path uses.
    pub fn snapshot(&self) -> Vec<(K, Snapshot)> {
        self.breakers()
            .into_iter()
            .map(|(key, breaker)| (key, breaker.snapshot()))
            .collect()
    }

    /// The breakers whose keys match `filter`, under one control (isolate
    /// every model of a provider in one call).
    pub fn group(&self, filter: impl Fn(&K) -> bool) -> BreakerGroup {
        BreakerGroup::new(
            self.breakers()
                .into_iter()
                .filter(|(key, _)| filter(key))
                .map(|(_, breaker)| breaker),
        )
    }

    /// Sets `key`'s config (and reconfigures its breaker if it exists,
    /// keeping its state, counts and open period).
    pub fn configure(&self, key: K, config: Config) {
        // The config first: a breaker made for the key from now on reads
        // it, and one made before is found below.
        self.inner
            .configs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .per_key
            .insert(key.clone(), config.clone());
        let existing = self.find(&key, self.hash(&key), None);
        if let Some(breaker) = existing {
            breaker.reconfigure(config);
        }
    }

    /// Replaces the default and every per-key config at once, and
    /// reconfigures every existing breaker: states, counts and open periods
    /// are kept, so a reload never forgives an outage in progress.
    pub fn reload(&self, default: Config, per_key: impl IntoIterator<Item = (K, Config)>) {
        {
            let mut configs = self
                .inner
                .configs
                .write()
                .unwrap_or_else(|p| p.into_inner());
            configs.default = default;
            configs.per_key = per_key.into_iter().collect();
        }
        for (key, breaker) in self.breakers() {
            breaker.reconfigure(self.config_for(&key));
        }
    }

    /// A receiver of every transition of every breaker in the registry,
    /// in order per breaker.
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.inner.events.subscribe()
    }

    /// The keys whose breakers are in `state`.
    pub fn keys_in(&self, state: State) -> Vec<K> {
        self.breakers()
            .into_iter()
            .filter(|(_, b)| b.state() == state)
            .map(|(k, _)| k)
            .collect()
    }
}

impl<K> RegistryBuilder<K>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    /// The config of every key without one of its own.
    pub fn default_config(mut self, config: Config) -> Self {
        self.default = config;
        self
    }

    /// A config of `key`'s own.
    pub fn config(mut self, key: K, config: Config) -> Self {
        self.per_key.insert(key, config);
        self
    }

    /// How to find a key's parent (for example the provider of a
    /// provider-and-model key); `None` for keys without one.
    pub fn parent(mut self, parent_of: impl Fn(&K) -> Option<K> + Send + Sync + 'static) -> Self {
        self.parent_of = Some(Arc::new(parent_of));
        self
    }

    /// The most keys the registry holds (at least 1; default 10,000).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Shares every breaker the registry makes with a fleet through
    /// `store` (a [`RedisStore`](crate::store::redis::RedisStore) or a
    /// [`MemoryStore`](crate::store::memory::MemoryStore)), each under its
    /// key (see [`crate::store`]). Parents are shared too: they are
    /// breakers of the registry like any other.
    pub fn store(mut self, store: impl Into<crate::store::Fleet>) -> Self {
        self.store = Some(store.into());
        self
    }

    /// The registry.
    pub fn build(self) -> Registry<K> {
        Registry {
            inner: Arc::new(Inner {
                shards: (0..SHARDS)
                    .map(|_| RwLock::new(HashMap::default()))
                    .collect(),
                hasher: RandomState::new(),
                configs: RwLock::new(Configs {
                    default: self.default,
                    per_key: self.per_key,
                }),
                parent_of: self.parent_of,
                max_keys: self.max_keys,
                mark_every: (self.max_keys as u64 / 64).max(1),
                keys: AtomicU64::new(0),
                insertions: AtomicU64::new(0),
                evicting: Mutex::new(()),
                events: broadcast::channel(EVENT_CAPACITY).0,
                store: self.store,
            }),
        }
    }
}

impl<K> fmt::Debug for Registry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("keys", &self.inner.keys.load(Ordering::Relaxed))
            .field("max_keys", &self.inner.max_keys)
            .finish_non_exhaustive()
    }
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in for safety.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys with one hash, as a collision of the keyed hash would give.
    const SAME_HASH: u64 = 7;

    fn breaker(registry: &Registry<String>, key: &str, hash: u64) -> Breaker {
        registry.get_hashed(&key.to_string(), hash).unwrap()
    }

    fn names(registry: &Registry<String>) -> Vec<String> {
        let mut names: Vec<String> = registry.breakers().into_iter().map(|(k, _)| k).collect();
        names.sort();
        names
    }

    /// `key`'s breaker, if held, without marking a use.
    fn held(registry: &Registry<String>, key: &str, hash: u64) -> Option<Breaker> {
        registry.find(&key.to_string(), hash, None)
    }

    /// Keys of one shard still differ in all seven bits of the tag its map
    /// compares first, and in the low bits that place them.
    #[test]
    fn a_shard_leaves_its_map_every_bit_of_the_tag_and_the_place() {
        let mut hashes = std::iter::successors(Some(0x9E37_79B9_7F4A_7C15_u64), |h| {
            Some(
                h.wrapping_mul(0x5851_F42D_4C95_7F2D)
                    .wrapping_add(1442695040888963407),
            )
        });
        let mut tags = [false; 128];
        let mut places = [false; 256];
        for hash in hashes.by_ref().filter(|&h| shard_of(h) == 3).take(20_000) {
            tags[(hash >> 57) as usize] = true;
            places[(hash & 0xff) as usize] = true;
        }
        assert!(tags.iter().all(|&seen| seen), "tags seen: {tags:?}");
        assert!(places.iter().all(|&seen| seen));
        assert!(hashes.take(SHARDS * 64).any(|h| shard_of(h) == SHARDS - 1));
    }

    #[test]
    fn keys_whose_hashes_collide_keep_their_own_breakers() {
        let registry = Registry::<String>::builder().max_keys(3).build();
        // Watched without holding them, so that they can be evicted.
        let a = Arc::downgrade(&breaker(&registry, "a", SAME_HASH).shared);
        let b = Arc::downgrade(&breaker(&registry, "b", SAME_HASH).shared);
        assert!(!a.ptr_eq(&b));
        let found = |key| Arc::downgrade(&held(&registry, key, SAME_HASH).unwrap().shared);
        assert!(found("a").ptr_eq(&a) && found("b").ptr_eq(&b));
        assert_eq!(held(&registry, "b", SAME_HASH).unwrap().name(), "b");
        breaker(&registry, "c", 8);
        breaker(&registry, "b", SAME_HASH); // used after `c` was made

        // Full: the least recently used, `a`, goes; `b` keeps the bucket.
        breaker(&registry, "d", 9);
        assert_eq!(names(&registry), ["b", "c", "d"]);
        assert!(a.upgrade().is_none(), "evicted, and held by nothing");
        assert!(found("b").ptr_eq(&b));

        // Then `b` goes (`c` used since), and the bucket with it.
        breaker(&registry, "c", 8);
        breaker(&registry, "e", 10);
        assert_eq!(names(&registry), ["c", "d", "e"]);
        assert!(b.upgrade().is_none());
        let shard = registry.shard(SAME_HASH).read().unwrap();
        assert!(shard.get(&SAME_HASH).is_none());
    }
}
