//! The keyed tower service: each request goes through the breaker of its
//! key (and of the key's parent).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::{AcquireError, HoldsKeyedRefusals, Registry, RegistryFull};
use crate::breaker::admission::{settle, Admission, CountIn, Refused};
use crate::breaker::shared::Shared;
use crate::breaker::Breaker;
use crate::classify::{Classified, Classify, ErrorsAsFailures, Outcome, Verdict};
use crate::eligible::{AnyRequest, ProbeEligibility};
use crate::error::{CircuitOpen, Name};
use crate::future::{Finish, Obligation, Pending};
use crate::local::{Loan, Owner};

/// Wraps services in a [`KeyedCircuitBreaker`]: every request goes through
/// the breaker its key names, made on first use in the [`Registry`].
///
/// `key_of` reads the key from the request; see [`authority`](super::authority)
/// and [`header`](super::header) for `http::Request`s.
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_circuit_breaker::{registry::{KeyedLayer, Registry}, Config};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let registry = Registry::<String>::new(Config::default());
/// let svc = ServiceBuilder::new()
///     .layer(KeyedLayer::new(registry.clone(), |req: &(String, u32)| req.0.clone()))
///     .service(service_fn(|(_, n): (String, u32)| async move { Ok::<_, BoxError>(n) }));
/// assert_eq!(svc.oneshot(("openai".to_string(), 7)).await?, 7);
/// assert_eq!(registry.len(), 1);
/// # Ok(())
/// # }
/// ```
pub struct KeyedLayer<K, F, C = ErrorsAsFailures, P = AnyRequest> {
    registry: Registry<K>,
    key_of: F,
    classifier: C,
    eligible: P,
}

impl<K, F: Clone, C: Clone, P: Clone> Clone for KeyedLayer<K, F, C, P> {
    fn clone(&self) -> Self {
        KeyedLayer {
            registry: self.registry.clone(),
            key_of: self.key_of.clone(),
            classifier: self.classifier.clone(),
            eligible: self.eligible.clone(),
        }
    }
}

impl<K, F> KeyedLayer<K, F> {
    /// A layer over `registry`, keying requests with `key_of`.
    ///
    /// A key names its breaker in metric labels, transitions, refusals
    /// and, with a fleet store, Redis keys: a `key_of` of your own must keep
    /// credentials out of it, as the ready-made extractors
    /// ([`authority`](super::authority), [`header`](super::header)) do. The
    /// crate cannot tell a secret in a key you built.
    pub fn new(registry: Registry<K>, key_of: F) -> Self {
        KeyedLayer {
            registry,
            key_of,
            classifier: ErrorsAsFailures,
            eligible: AnyRequest,
        }
    }
}

impl<K, F, C, P> KeyedLayer<K, F, C, P> {
    /// Uses `classifier` to decide which results count as failures.
    pub fn classify<C2>(self, classifier: C2) -> KeyedLayer<K, F, C2, P> {
        KeyedLayer {
            registry: self.registry,
            key_of: self.key_of,
            classifier,
            eligible: self.eligible,
        }
    }

    /// Lets only the requests `predicate` accepts be a half-open probe, at
    /// every key's breaker and at its parent's (default: any request). A
    /// request it refuses, met by a breaker with a probe due, is refused
    /// with [`CircuitOpen`] and takes no permit; closed breakers let every
    /// request through without asking. See [`eligible`](crate::eligible).
    ///
    /// ```
    /// use http::Request;
    /// use tower::{service_fn, BoxError, ServiceBuilder};
    /// use tower_circuit_breaker::{eligible, registry::{KeyedLayer, Registry}, Config};
    ///
    /// let registry = Registry::<String>::new(Config::default());
    /// let svc = ServiceBuilder::new()
    ///     .layer(
    ///         KeyedLayer::new(registry, |req: &Request<()>| req.uri().path().to_string())
    ///             .probe_when(eligible::marked::<()>),
    ///     )
    ///     .service(service_fn(|_req: Request<()>| async { Ok::<_, BoxError>(()) }));
    /// # let _ = svc;
    /// ```
    pub fn probe_when<P2>(self, predicate: P2) -> KeyedLayer<K, F, C, P2> {
        KeyedLayer {
            registry: self.registry,
            key_of: self.key_of,
            classifier: self.classifier,
            eligible: predicate,
        }
    }
}

impl<S, K, F: Clone, C: Clone, P: Clone> Layer<S> for KeyedLayer<K, F, C, P> {
    type Service = KeyedCircuitBreaker<S, K, F, C, P>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedCircuitBreaker {
            inner,
            registry: self.registry.clone(),
            key_of: self.key_of.clone(),
            classifier: self.classifier.clone(),
            eligible: self.eligible.clone(),
            recent: Recent::new(),
        }
    }
}

/// A service whose requests each go through the breaker of their key and,
/// if the key has a parent, through the parent's too.
///
/// Readiness is the inner service's: the key comes from the request, so
/// admission happens in `call` (a half-open permit is taken there, not
/// reserved by `poll_ready`). A refused call never reaches the inner
/// service. Its error type is the inner service's, which must hold a
/// [`CircuitOpen`] and a [`RegistryFull`] (`BoxError` holds both).
///
/// Each clone remembers the breakers of up to [`RECENT_KEYS`] keys it
/// calls again and again (and their parents), so that such a key skips the
/// registry: no hash, no shard lock, no parent lookup, no reference count
/// shared with other clones, and no shared write but a mark of use once in
/// a while (for the registry's eviction order). A key is remembered when it
/// comes back while the clone still has its last misses in mind (the last
/// 16); a stream of ever new keys, or a clone made for a single request
/// (`svc.clone().oneshot(req)`), remembers nothing and allocates nothing
/// for it. When more keys come back than there are slots, a remembered key
/// called since the last replacement keeps its slot (a second chance), so
/// the slots stay with keys in use instead of changing hands on every call.
/// A breaker the registry evicts is forgotten at the clone's next call with
/// its key; until then the clone keeps it alive. A clone that remembers
/// holds about 400 bytes of handles per breaker (at most `2 × RECENT_KEYS`)
/// plus a copy of each key. Clone once per task or connection, as `Buffer`
/// and balancers do, rather than once per request.
///
/// With a probe predicate ([`KeyedLayer::probe_when`]), it is asked in
/// `call`, only when a breaker the request meets is not closed.
pub struct KeyedCircuitBreaker<S, K, F, C = ErrorsAsFailures, P = AnyRequest> {
    inner: S,
    registry: Registry<K>,
    key_of: F,
    classifier: C,
    eligible: P,
    recent: Recent<K>,
}

impl<S: Clone, K, F: Clone, C: Clone, P: Clone> Clone for KeyedCircuitBreaker<S, K, F, C, P> {
    fn clone(&self) -> Self {
        KeyedCircuitBreaker {
            inner: self.inner.clone(),
            registry: self.registry.clone(),
            key_of: self.key_of.clone(),
            classifier: self.classifier.clone(),
            eligible: self.eligible.clone(),
            // Each clone remembers its own keys.
            recent: Recent::new(),
        }
    }
}

impl<S: fmt::Debug, K, F, C, P> fmt::Debug for KeyedCircuitBreaker<S, K, F, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCircuitBreaker")
            .field("inner", &self.inner)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// How many keys a [`KeyedCircuitBreaker`] clone remembers.
pub const RECENT_KEYS: usize = 8;

/// The keys a service clone calls again and again, with its handles on
/// their breakers.
struct Recent<K> {
    /// Made when the first key is remembered: a clone that never sees a
    /// key twice allocates nothing.
    slots: Option<Box<[Slot<K>; RECENT_KEYS]>>,
    /// The slot replacement looks at next.
    hand: usize,
    /// The hashes of the last keys not found here, oldest overwritten.
    missed: [u64; MISSES],
    next_miss: usize,
}

/// How many missed keys a clone keeps in mind.
const MISSES: usize = 16;

/// A slot: a remembered key, and whether it was called since replacement
/// last passed by (a second chance).
struct Slot<K> {
    remembered: Option<Remembered<K>>,
    called: bool,
}

/// A remembered key: this clone's own handles on its breakers. They do not
/// hold the breakers in the registry: it may evict them, and the clone then
/// forgets them at its next call with the key.
struct Remembered<K> {
    key: K,
    child: Owner<()>,
    parent: Option<Owner<()>>,
}

impl<K> Remembered<K> {
    fn new(key: K, child: &Breaker, parent: Option<&Breaker>) -> Self {
        let handle = |breaker: &Breaker| {
            let owner = Owner::new(Arc::clone(&breaker.shared), ());
            breaker.shared.note_keeper_handle(true);
            owner
        };
        Remembered {
            key,
            child: handle(child),
            parent: parent.map(handle),
        }
    }
}

impl<K> Drop for Remembered<K> {
    fn drop(&mut self) {
        // Before the handles themselves go: until then the breaker reads as
        // held, which only delays its eviction.
        self.child.shared.note_keeper_handle(false);
        if let Some(parent) = &self.parent {
            parent.shared.note_keeper_handle(false);
        }
    }
}

impl<K> Recent<K> {
    fn new() -> Self {
        Recent {
            slots: None,
            hand: 0,
            // A hash of zero only makes a key with that hash remembered on
            // its first miss rather than its second.
            missed: [0; MISSES],
            next_miss: 0,
        }
    }
}

impl<K: Eq> Recent<K> {
    /// The breakers remembered for `key`, unless the registry has evicted
    /// one of them since (then forgotten).
    #[inline]
    fn find(&mut self, key: &K) -> Option<&mut Remembered<K>> {
        let slots = self.slots.as_deref_mut()?;
        let slot = slots
            .iter_mut()
            .find(|slot| slot.remembered.as_ref().is_some_and(|r| &r.key == key))?;
        let remembered = slot.remembered.as_ref()?;
        let superseded = remembered.child.shared.is_superseded()
            || remembered
                .parent
                .as_ref()
                .is_some_and(|p| p.shared.is_superseded());
        if superseded {
            slot.remembered = None;
            return None;
        }
        slot.called = true;
        slot.remembered.as_mut()
    }

    /// Whether a key with `hash`, just missed, has been missed lately:
    /// then it comes back, and is worth remembering. If not, it is noted.
    #[inline]
    fn missed_again(&mut self, hash: u64) -> bool {
        if let Some(seen) = self.missed.iter_mut().find(|seen| **seen == hash) {
            // Noted once: if it cannot be remembered now, it must miss
            // twice again to be considered.
            *seen = 0;
            return true;
        }
        self.missed[self.next_miss] = hash;
        self.next_miss = (self.next_miss + 1) % MISSES;
        false
    }

    /// Remembers `key`'s breakers in an empty slot, or in the slot under
    /// the hand if it was not called since the hand last passed. A slot
    /// called since gets a second chance: the hand clears its mark and moves
    /// on, and `key` is not remembered this time. More keys in turn than
    /// slots thus keep as many remembered as there are slots, rather than
    /// replacing one with another on every call.
    fn remember(&mut self, key: &K, child: &Breaker, parent: Option<&Breaker>)
    where
        K: Clone,
    {
        let slots = self.slots.get_or_insert_with(|| {
            Box::new(std::array::from_fn(|_| Slot {
                remembered: None,
                called: false,
            }))
        });
        let at = match slots.iter().position(|slot| slot.remembered.is_none()) {
            Some(empty) => empty,
            None => {
                let at = self.hand;
                self.hand = (self.hand + 1) % RECENT_KEYS;
                if std::mem::take(&mut slots[at].called) {
                    return;
                }
                at
            }
        };
        slots[at] = Slot {
            remembered: Some(Remembered::new(key.clone(), child, parent)),
            called: false,
        };
    }
}

/// How a call reaches a breaker it went through until its outcome is in.
pub(super) enum Via {
    /// Through a breaker this clone remembers: a loan of the clone's own
    /// handle (no reference count shared with other clones).
    Loaned(Loan<()>),
    /// Through a breaker just looked up: a reference.
    LookedUp(LookedUp),
}

impl Via {
    #[inline]
    pub(super) fn shared(&self) -> &Arc<Shared> {
        match self {
            Via::Loaned(loan) => &loan.shared,
            Via::LookedUp(looked_up) => &looked_up.0.shared,
        }
    }
}

/// A breaker looked up for one call: a handle that does not hold it in the
/// registry (evicted while the call is in flight, the outcome goes to the
/// key's breaker then), so that calls in flight never fill the registry.
pub(super) struct LookedUp(Breaker);

impl LookedUp {
    pub(super) fn new(breaker: Breaker) -> Self {
        breaker.shared.note_keeper_handle(true);
        LookedUp(breaker)
    }
}

impl Drop for LookedUp {
    fn drop(&mut self) {
        self.0.shared.note_keeper_handle(false);
    }
}

/// One breaker a call went through, and how it was admitted there.
pub(super) struct Leg {
    pub(super) via: Via,
    admission: Admission,
}

impl Leg {
    /// Admits the call at the breaker `via` holds, or says why not
    /// (counting the refusal). The admission is counted by the caller once
    /// every breaker the call goes through has admitted it: a call a child
    /// refuses was not admitted by its parent either.
    /// `may_probe` is asked only when the breaker is not closed.
    #[inline(always)]
    fn admit(
        via: Via,
        counts: CountIn<'_>,
        may_probe: impl FnOnce() -> bool,
    ) -> Result<Leg, CircuitOpen> {
        let shared = via.shared();
        match settle(shared.admit_if(may_probe), shared, counts) {
            Ok(admission) => Ok(Leg { via, admission }),
            Err(Refused { retry_at, state }) => {
                counts.count(shared, false);
                Err(CircuitOpen::new(Name::new(shared.name()), retry_at, state))
            }
        }
    }

    /// Counts the call as cancelled, unless its outcome was recorded (the
    /// leg is being dropped; a probe's permit goes back as it does).
    pub(super) fn cancel(&mut self, start: Option<Instant>) {
        self.admission.cancel(self.via.shared(), start);
    }

    /// Hands the recording on to a streamed body's obligation: `None` if
    /// nothing is left to record.
    fn defer(&mut self, start: Option<Instant>) -> Option<Pending> {
        let admission = self.admission.hand_on()?;
        let shared = Arc::clone(self.via.shared());
        shared.note_keeper_handle(true);
        Some(Pending::new(shared, true, admission, start))
    }

    #[inline(always)]
    pub(super) fn record(&mut self, verdict: Verdict, start: Option<Instant>) {
        self.admission.record(self.via.shared(), verdict, start);
    }
}

/// Admits a call at its key's breaker and its parent's: the parent first,
/// so that when it is open the child is not asked (and takes no probe
/// permit it would only give back). Dropping the parent's leg on the
/// child's refusal gives back any permit it took. `may_probe` says whether
/// the call may be a probe, asked only of a breaker that is not closed.
#[inline(always)]
pub(super) fn admit_both(
    child: (Via, CountIn<'_>),
    parent: Option<(Via, CountIn<'_>)>,
    may_probe: impl Fn() -> bool,
) -> Result<[Option<Leg>; 2], CircuitOpen> {
    let (via, counts) = child;
    let parent = match parent {
        Some((parent, parent_counts)) => match Leg::admit(parent, parent_counts, &may_probe) {
            Ok(leg) => Some((leg, parent_counts)),
            Err(refused) => {
                // The child's call, refused for it: its count shows it too.
                counts.count_parent_refusal(via.shared());
                return Err(refused);
            }
        },
        None => None,
    };
    let child = Leg::admit(via, counts, &may_probe)?;
    counts.count(child.via.shared(), true);
    if let Some((leg, counts)) = &parent {
        counts.count(leg.via.shared(), true);
    }
    Ok([Some(child), parent.map(|(leg, _)| leg)])
}

/// [`admit_both`] at a key's breaker and its parent's, as just looked up
/// in the registry.
#[inline(always)]
pub(super) fn admit_looked_up(
    child: Breaker,
    parent: Option<Breaker>,
    may_probe: impl Fn() -> bool,
) -> Result<[Option<Leg>; 2], CircuitOpen> {
    let looked_up = |breaker| Via::LookedUp(LookedUp::new(breaker));
    admit_both(
        (looked_up(child), CountIn::Breaker),
        parent.map(|parent| (looked_up(parent), CountIn::Breaker)),
        may_probe,
    )
}

impl<S, K, F, C, P, Req> Service<Req> for KeyedCircuitBreaker<S, K, F, C, P>
where
    S: Service<Req>,
    S::Error: HoldsKeyedRefusals,
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
    F: Fn(&Req) -> K,
    C: Classify<S::Response, S::Error> + Clone,
    C::Eos: Finish<S::Response>,
    P: ProbeEligibility<Req>,
{
    type Response = <C::Eos as Finish<S::Response>>::Response;
    type Error = S::Error;
    type Future = KeyedFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = (self.key_of)(&req);
        let eligible = &self.eligible;
        let may_probe = || P::ANY_REQUEST || eligible.may_probe(&req);
        let legs = match admit(&mut self.recent, &self.registry, &key, may_probe) {
            Ok(legs) => legs,
            Err(failed) => return KeyedFuture::failed(failed),
        };
        let needs_latency = legs
            .iter()
            .flatten()
            .any(|leg| leg.via.shared().needs_latency());
        let start = needs_latency.then(Instant::now);
        KeyedFuture {
            state: KeyedState::Called {
                future: self.inner.call(req),
                legs,
                classifier: self.classifier.clone(),
                start,
            },
        }
    }
}

impl<S, K, F, C, P> KeyedCircuitBreaker<S, K, F, C, P> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The registry the breakers come from.
    pub fn registry(&self) -> &Registry<K> {
        &self.registry
    }
}

impl<S, K, F, C, P> KeyedCircuitBreaker<S, K, F, C, P>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    /// The name of `request`'s breaker (its key), and the breakers it
    /// would go through as they are now, its key's and the key's parent's,
    /// without making either.
    pub(crate) fn breakers_of<Req>(&self, request: &Req) -> (String, [Option<Breaker>; 2])
    where
        F: Fn(&Req) -> K,
    {
        let key = (self.key_of)(request);
        let found = self.registry.find_with_parent(&key);
        (key.to_string(), found)
    }
}

/// Admits a call with `key` at its breakers: remembered ones (in `recent`),
/// or ones looked up in `registry` (then remembered). `may_probe` is asked
/// only of a breaker that is not closed.
#[inline]
fn admit<K>(
    recent: &mut Recent<K>,
    registry: &Registry<K>,
    key: &K,
    may_probe: impl Fn() -> bool,
) -> Result<[Option<Leg>; 2], AcquireError>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    if let Some(remembered) = recent.find(key) {
        // A use, for the registry's eviction order.
        let now = registry.now();
        registry.mark_used(&remembered.child.shared, now);
        let parent = remembered.parent.as_mut().map(|owner| {
            registry.mark_used(&owner.shared, now);
            let loan = owner.loan();
            (Via::Loaned(loan), CountIn::Clone(&owner.counts))
        });
        let child = &mut remembered.child;
        let loan = child.loan();
        return Ok(admit_both(
            (Via::Loaned(loan), CountIn::Clone(&child.counts)),
            parent,
            may_probe,
        )?);
    }
    let hash = registry.hash(key);
    let (child, parent) = registry.get_with_parent_hashed(key, hash)?;
    if recent.missed_again(hash) {
        recent.remember(key, &child, parent.as_ref());
    }
    Ok(admit_looked_up(child, parent, may_probe)?)
}

pin_project! {
    /// Response future of [`KeyedCircuitBreaker`]: records the outcome in
    /// the key's breaker and its parent's when the call completes, or, when
    /// the classifier defers to the body's end, hands the response on with
    /// its body wrapped to record then. Dropped before, the call counts as
    /// cancelled in each.
    pub struct KeyedFuture<F, C> {
        #[pin]
        state: KeyedState<F, C>,
    }

    impl<F, C> PinnedDrop for KeyedFuture<F, C> {
        fn drop(this: Pin<&mut Self>) {
            if let KeyedProj::Called { legs, start, .. } = this.project().state.project() {
                for leg in legs.iter_mut().flatten() {
                    leg.cancel(*start);
                }
            }
        }
    }
}

pin_project! {
    #[project = KeyedProj]
    enum KeyedState<F, C> {
        Called {
            #[pin]
            future: F,
            legs: [Option<Leg>; 2],
            classifier: C,
            start: Option<Instant>,
        },
        Failed {
            // An error made before the call: a refusal, or a full registry.
            error: Option<AcquireError>,
        },
    }
}

impl<F, C> KeyedFuture<F, C> {
    fn failed(error: AcquireError) -> Self {
        KeyedFuture {
            state: KeyedState::Failed { error: Some(error) },
        }
    }
}

impl<F, C, T, E> Future for KeyedFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: From<CircuitOpen> + From<RegistryFull>,
    C: Classify<T, E>,
    C::Eos: Finish<T>,
{
    type Output = Result<<C::Eos as Finish<T>>::Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            KeyedProj::Failed { error } => match error.take() {
                Some(AcquireError::Open(open)) => Poll::Ready(Err(E::from(open))),
                Some(AcquireError::Full(full)) => Poll::Ready(Err(E::from(full))),
                None => panic!("KeyedFuture polled after completion"),
            },
            KeyedProj::Called {
                future,
                legs,
                classifier,
                start,
            } => {
                let output = match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(output)) => output,
                    Err(panic) => {
                        for leg in legs.iter_mut().flatten() {
                            leg.record(Verdict::new(Outcome::Failure), *start);
                        }
                        resume_unwind(panic)
                    }
                };
                let verdict =
                    match catch_unwind(AssertUnwindSafe(|| classifier.classify(output.as_ref()))) {
                        Ok(verdict) => verdict,
                        Err(panic) => {
                            for leg in legs.iter_mut().flatten() {
                                leg.record(Verdict::new(Outcome::Failure), *start);
                            }
                            resume_unwind(panic)
                        }
                    };
                match verdict {
                    Classified::Ready(verdict) => {
                        for leg in legs.iter_mut().flatten() {
                            leg.record(verdict, *start);
                        }
                    }
                    // An error has no body to wait for: a failure.
                    Classified::AtEndOfStream(_) if output.is_err() => {
                        for leg in legs.iter_mut().flatten() {
                            leg.record(Verdict::new(Outcome::Failure), *start);
                        }
                    }
                    Classified::AtEndOfStream(eos) => {
                        let [child, parent] = legs;
                        let child = child.as_mut().and_then(|leg| leg.defer(*start));
                        let parent = parent.as_mut().and_then(|leg| leg.defer(*start));
                        let obligation = Obligation::of_legs(child, parent);
                        return Poll::Ready(output.map(|response| eos.defer(response, obligation)));
                    }
                }
                Poll::Ready(output.map(<C::Eos as Finish<T>>::finish))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Ready};

    use tower::util::ServiceFn;
    use tower::{service_fn, BoxError, ServiceExt};

    use super::*;
    use crate::Config;

    type Echo = ServiceFn<fn(u64) -> Ready<Result<u64, BoxError>>>;
    type Keyed = KeyedCircuitBreaker<Echo, u64, fn(&u64) -> u64>;

    fn keyed() -> Keyed {
        let echo: fn(u64) -> Ready<Result<u64, BoxError>> = |n| ready(Ok(n));
        let key_of: fn(&u64) -> u64 = |n| *n;
        KeyedLayer::new(Registry::new(Config::default()), key_of).layer(service_fn(echo))
    }

    fn remembered(svc: &Keyed) -> Vec<u64> {
        handles(svc).into_iter().map(|(key, _)| key).collect()
    }

    async fn call(svc: &mut Keyed, key: u64) {
        svc.ready().await.unwrap().call(key).await.unwrap();
    }

    #[tokio::test]
    async fn keys_that_come_back_are_remembered_and_ever_new_ones_are_not() {
        let mut svc = keyed();
        for key in 0..1_000 {
            call(&mut svc, key).await;
        }
        assert_eq!(remembered(&svc), Vec::<u64>::new());
        assert!(svc.recent.slots.is_none(), "nothing allocated");

        for key in [7, 8, 9, 7, 8, 9, 7] {
            call(&mut svc, key).await;
        }
        assert_eq!(remembered(&svc), vec![7, 8, 9]);
        assert_eq!(remembered(&svc.clone()), Vec::<u64>::new(), "per clone");
    }

    /// Each remembered key with the calls made through its handle.
    fn handles(svc: &Keyed) -> Vec<(u64, u64)> {
        let mut handles: Vec<(u64, u64)> = svc
            .recent
            .slots
            .iter()
            .flat_map(|slots| slots.iter())
            .filter_map(|slot| slot.remembered.as_ref())
            .map(|r| (r.key, r.child.issued()))
            .collect();
        handles.sort_unstable();
        handles
    }

    #[tokio::test]
    async fn more_keys_in_turn_than_slots_keep_the_slots_full_without_churn() {
        for keys in [RECENT_KEYS as u64 + 1, 10, 12, 16] {
            let mut svc = keyed();
            for _ in 0..3 {
                for key in 0..keys {
                    call(&mut svc, key).await;
                }
            }
            let settled = handles(&svc);
            assert_eq!(settled.len(), RECENT_KEYS, "{keys} keys");
            for _ in 0..20 {
                for key in 0..keys {
                    call(&mut svc, key).await;
                }
            }
            // Every handle kept, and every call with its key made through it.
            let later: Vec<(u64, u64)> = settled.iter().map(|&(k, n)| (k, n + 20)).collect();
            assert_eq!(handles(&svc), later, "{keys} keys: none replaced");
        }
    }

    #[tokio::test]
    async fn a_new_working_set_takes_the_place_of_one_no_longer_called() {
        let mut svc = keyed();
        for _ in 0..3 {
            for key in 0..RECENT_KEYS as u64 {
                call(&mut svc, key).await;
            }
        }
        assert_eq!(remembered(&svc).len(), RECENT_KEYS);
        for _ in 0..4 {
            for key in 100..100 + RECENT_KEYS as u64 {
                call(&mut svc, key).await;
            }
        }
        assert_eq!(
            remembered(&svc),
            (100..100 + RECENT_KEYS as u64).collect::<Vec<_>>()
        );
    }
}
