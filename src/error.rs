//! Errors: the open rejection callers see, and invalid configuration.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::events::State;

/// The breaker refused a call without sending it: the circuit is open, or
/// half-open with every probe permit taken.
///
/// It reaches the caller as the service's error type. With `tower`'s
/// `BoxError` (the usual case behind `tower::timeout`), find it by downcast
/// or with [`CircuitOpen::find`], which also looks through wrappers such as
/// `tower::buffer`'s `ServiceError`:
///
/// ```
/// use std::time::Duration;
/// use tower::BoxError;
/// use tower_circuit_breaker::CircuitOpen;
///
/// fn retry_hint(err: &BoxError) -> Option<Duration> {
///     CircuitOpen::find(err.as_ref()).map(CircuitOpen::retry_after)
/// }
/// ```
///
/// Services with a typed error enum get it through `From<CircuitOpen>`.
#[cfg_attr(not(feature = "tonic"), derive(Clone))]
#[derive(Debug)]
pub struct CircuitOpen {
    name: Name,
    /// When the breaker may admit a call again: [`retry_after`](Self::retry_after)
    /// is what is left of it when asked.
    retry_at: RetryAt,
    /// The refusal as a gRPC status, made the first time its source is
    /// asked for (see `source`).
    #[cfg(feature = "tonic")]
    status: std::sync::OnceLock<Box<tonic::Status>>,
}

#[cfg(feature = "tonic")]
impl Clone for CircuitOpen {
    fn clone(&self) -> Self {
        CircuitOpen {
            name: self.name.clone(),
            retry_at: self.retry_at,
            status: std::sync::OnceLock::new(),
        }
    }
}

/// A refusal's instant and state, in two words with no padding: the
/// instant as seconds and nanoseconds from [`base`], the state beside the
/// nanoseconds. With the name's three words, a refusal is five whole words,
/// so that every move of one (and of a response future that may hold one)
/// copies words at the widths they were written with, aligned; an
/// `Instant` would leave four bytes of padding that a move copies too,
/// unaligned, with its neighbours. The state's unused values are the niche
/// a typed error's enum and a `Result` use as their tags.
#[derive(Clone, Copy, Debug)]
struct RetryAt {
    secs: u64,
    nanos: u32,
    state: StateWord,
}

/// A [`State`] as a word's half.
#[derive(Clone, Copy, Debug)]
#[repr(u32)]
enum StateWord {
    Closed,
    Open,
    HalfOpen,
    ForcedOpen,
    ForcedClosed,
    Disabled,
}

/// An instant as a refusal carries it: seconds and nanoseconds from
/// [`base`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Since {
    secs: u64,
    nanos: u32,
}

impl Since {
    /// `at`, from [`base`].
    pub(crate) fn of(at: Instant) -> Self {
        let since = at.saturating_duration_since(base());
        Since {
            secs: since.as_secs(),
            nanos: since.subsec_nanos(),
        }
    }
}

impl RetryAt {
    #[inline(always)]
    fn new(since: Since, state: State) -> Self {
        RetryAt {
            secs: since.secs,
            nanos: since.nanos,
            state: match state {
                State::Closed => StateWord::Closed,
                State::Open => StateWord::Open,
                State::HalfOpen => StateWord::HalfOpen,
                State::ForcedOpen => StateWord::ForcedOpen,
                State::ForcedClosed => StateWord::ForcedClosed,
                State::Disabled => StateWord::Disabled,
            },
        }
    }

    fn instant(self) -> Instant {
        base() + Duration::new(self.secs, self.nanos)
    }

    fn state(self) -> State {
        match self.state {
            StateWord::Closed => State::Closed,
            StateWord::Open => State::Open,
            StateWord::HalfOpen => State::HalfOpen,
            StateWord::ForcedOpen => State::ForcedOpen,
            StateWord::ForcedClosed => State::ForcedClosed,
            StateWord::Disabled => State::Disabled,
        }
    }
}

/// The instant a refusal's [`RetryAt`] counts from: the first refusal's
/// clock reading less 2^32 seconds (less as much as the clock can go back,
/// where it cannot go back that far), so that every instant a refusal
/// carries, under tokio's paused clock too, is after it. An instant before
/// it would read back as the base itself, at worst too soon: never later
/// than the instant it was made from.
#[inline(always)]
fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = Instant::from_std(std::time::Instant::now());
        [1u64 << 32, 1 << 24, 1 << 16, 1 << 8]
            .into_iter()
            .find_map(|secs| now.checked_sub(Duration::from_secs(secs)))
            .unwrap_or(now)
    })
}

/// The longest name a rejection carries by value.
const INLINE_NAME: usize = 23;

/// The last byte of a [`Name`]'s words when they refer to a shared copy.
const SHARED: u8 = u8::MAX;

/// A breaker's name as a rejection carries it, in three aligned words: a
/// name of up to 23 bytes by value (its bytes, then its length in the last
/// byte), so that refusing a call touches no reference count (which another
/// thread may be touching too); a longer one by reference to the refusing
/// service clone's own copy (the breaker's, for a clone serving one
/// request), the last byte then [`SHARED`]. Whole words, so that each move
/// of a refusal copies three words with the widths it was written with: a
/// copy that reads back narrower stores as one wider load waits for them to
/// reach the cache.
pub(crate) struct Name {
    words: [u64; 3],
}

/// The bytes of a name's words.
#[inline(always)]
fn bytes(words: &[u64; 3]) -> &[u8; 24] {
    // SAFETY: `[u64; 3]` and `[u8; 24]` have the same size, `u8` needs no
    // alignment, and every bit pattern is a valid byte.
    unsafe { &*words.as_ptr().cast::<[u8; 24]>() }
}

/// The bytes of a name's words, to write.
#[inline(always)]
fn bytes_mut(words: &mut [u64; 3]) -> &mut [u8; 24] {
    // SAFETY: as in `bytes`; any bytes written are valid `u64` bits.
    unsafe { &mut *words.as_mut_ptr().cast::<[u8; 24]>() }
}

impl Name {
    /// `name`, copied when short, referred to when long.
    #[inline]
    pub(crate) fn new(name: &Arc<str>) -> Self {
        let mut words = [0; 3];
        let len = name.len();
        if len <= INLINE_NAME {
            let bytes = bytes_mut(&mut words);
            bytes[..len].copy_from_slice(name.as_bytes());
            bytes[INLINE_NAME] = len as u8;
        } else {
            let shared = Arc::into_raw(Arc::clone(name));
            words[0] = shared.cast::<u8>().expose_provenance() as u64;
            words[1] = len as u64;
            bytes_mut(&mut words)[INLINE_NAME] = SHARED;
        }
        Name { words }
    }

    /// The last byte: a short name's length, or [`SHARED`]. Read from the
    /// last word as a whole, whatever the byte order, so that a copy of the
    /// name stays three whole-word loads and stores.
    #[inline(always)]
    fn last_byte(&self) -> u8 {
        (self.words[2].to_le() >> 56) as u8
    }

    /// The shared copy this name refers to, if it is long.
    #[inline(always)]
    fn shared(&self) -> Option<*const str> {
        (self.last_byte() == SHARED).then(|| {
            let data = std::ptr::with_exposed_provenance::<u8>(self.words[0] as usize);
            std::ptr::slice_from_raw_parts(data, self.words[1] as usize) as *const str
        })
    }

    fn as_str(&self) -> &str {
        match self.shared() {
            // SAFETY: the name holds a reference to the `Arc` it came from
            // (released in `drop`), so the `str` lives as long as `self`.
            Some(shared) => unsafe { &*shared },
            None => {
                let bytes = bytes(&self.words);
                let len = usize::from(self.last_byte());
                // The bytes are a whole `str` copied in `new`: always valid.
                std::str::from_utf8(&bytes[..len]).unwrap_or("")
            }
        }
    }
}

impl Clone for Name {
    #[inline]
    fn clone(&self) -> Self {
        if let Some(shared) = self.shared() {
            // SAFETY: `shared` came from `Arc::into_raw`, and this name's
            // reference keeps it alive; the clone owns the one added here.
            unsafe { Arc::increment_strong_count(shared) };
        }
        Name { words: self.words }
    }
}

impl Drop for Name {
    #[inline]
    fn drop(&mut self) {
        if let Some(shared) = self.shared() {
            release(shared);
        }
    }
}

/// Releases a long name's reference to its shared copy.
#[cold]
#[inline(never)]
fn release(shared: *const str) {
    // SAFETY: `shared` came from `Arc::into_raw` in `new` (or had its count
    // raised in `clone`), and the name dropping owned that reference.
    drop(unsafe { Arc::from_raw(shared) });
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl CircuitOpen {
    pub(crate) fn new(name: Name, retry_at: Instant, state: State) -> Self {
        CircuitOpen {
            name,
            retry_at: RetryAt::new(Since::of(retry_at), state),
            #[cfg(feature = "tonic")]
            status: std::sync::OnceLock::new(),
        }
    }

    /// A refusal whose instant is already counted from [`base`].
    #[inline(always)]
    pub(crate) fn refusal(name: Name, retry_at: Since, state: State) -> Self {
        CircuitOpen {
            name,
            retry_at: RetryAt::new(retry_at, state),
            #[cfg(feature = "tonic")]
            status: std::sync::OnceLock::new(),
        }
    }

    /// How long to wait, from now, before asking again (read from the
    /// clock, so it shrinks as time passes): the rest of the open period;
    /// when half-open with every probe in flight, the length of the open
    /// period that just ended, or the time left until those probes time
    /// out if that is sooner. Never the probe timeout's worst case: a probe
    /// that answers settles the question long before it, and a caller that
    /// comes back early is refused again at once; an operator's hold
    /// ([`State::ForcedOpen`]) says `max_open`, as nobody knows its end.
    /// With active probing, while half-open, the probe interval.
    pub fn retry_after(&self) -> Duration {
        self.retry_at
            .instant()
            .saturating_duration_since(Instant::now())
    }

    /// The name of the breaker that refused the call.
    pub fn breaker(&self) -> &str {
        self.name.as_str()
    }

    /// The state the breaker was in when it refused: [`State::Open`] or
    /// [`State::HalfOpen`].
    pub fn state(&self) -> State {
        self.retry_at.state()
    }

    /// An empty `503 Service Unavailable` with a `Retry-After` header, for
    /// hyper services and other `http` servers without axum.
    ///
    /// `Retry-After` holds whole seconds, rounded **up** (1.2 s gives `2`:
    /// rounding down would send clients back before the breaker admits
    /// them), and **at least `1`**: a zero `retry_after` (the time the
    /// refusal named has passed, or the probes in flight reach their
    /// deadline that instant) would otherwise invite an immediate retry,
    /// which may well be refused again.
    ///
    /// The body is `B::default()`, empty for the usual body types. With the
    /// `axum` feature, `CircuitOpen`'s `IntoResponse` gives the same status
    /// and header with a short plain-text body naming the breaker.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{header::RETRY_AFTER, StatusCode};
    /// use tower::{service_fn, BoxError, Layer, ServiceExt};
    /// use tower_circuit_breaker::{Breaker, CircuitOpen, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), BoxError> {
    /// let breaker = Breaker::new(Config::builder().name("openai").build()?);
    /// breaker.force_open(Some(Duration::from_millis(1_200)));
    /// let svc = breaker.layer().layer(service_fn(|_: ()| async { Ok::<_, BoxError>(()) }));
    ///
    /// let err = svc.oneshot(()).await.unwrap_err();
    /// let open = CircuitOpen::find(err.as_ref()).ok_or("not refused")?;
    /// let response: http::Response<String> = open.to_http_response();
    /// assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    /// assert_eq!(response.headers()[RETRY_AFTER], "2"); // 1.2 s, rounded up
    /// assert!(response.body().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn to_http_response<B: Default>(&self) -> http::Response<B> {
        let seconds = retry_after_seconds(self.retry_after());
        let mut response = http::Response::new(B::default());
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
        response
    }

    /// Takes the refusal out of a boxed error, to answer with it by value
    /// (`into_response()`, `Status::from`, a retry's wait): `Ok` with the
    /// `CircuitOpen` when `err` is one, or holds one in its source chain
    /// (as `tower::buffer`'s `ServiceError` does: then a copy, since a
    /// source is only lent); `Err(err)`, untouched, when it is any other
    /// error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{service_fn, BoxError, Layer, ServiceExt};
    /// use tower_circuit_breaker::{Breaker, CircuitOpen, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), BoxError> {
    /// let breaker = Breaker::new(Config::builder().name("openai").build()?);
    /// breaker.force_open(Some(Duration::from_secs(12)));
    /// let upstream = breaker.layer().layer(service_fn(|_: ()| async { Ok::<_, BoxError>("hi") }));
    ///
    /// let answer: http::Response<String> = match upstream.oneshot(()).await {
    ///     Ok(text) => http::Response::new(text.to_string()),
    ///     Err(err) => match CircuitOpen::take(err) {
    ///         Ok(open) => open.to_http_response(), // 503, Retry-After: 12
    ///         Err(err) => return Err(err),          // the call was made and failed
    ///     },
    /// };
    /// assert_eq!(answer.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    /// # Ok(())
    /// # }
    /// ```
    pub fn take(
        err: Box<dyn Error + Send + Sync>,
    ) -> Result<CircuitOpen, Box<dyn Error + Send + Sync>> {
        match err.downcast::<CircuitOpen>() {
            Ok(open) => Ok(*open),
            Err(err) => match CircuitOpen::find(err.as_ref()) {
                Some(open) => Ok(open.clone()),
                None => Err(err),
            },
        }
    }

    /// Finds a `CircuitOpen` in an error or anywhere in its source chain.
    pub fn find<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a CircuitOpen> {
        let mut current = Some(err);
        while let Some(e) = current {
            if let Some(open) = e.downcast_ref::<CircuitOpen>() {
                return Some(open);
            }
            current = e.source();
        }
        None
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "circuit breaker `{}` is {}; retry after {} ms",
            self.name.as_str(),
            match self.state() {
                State::HalfOpen => "half-open with every probe in flight",
                _ => "open",
            },
            crate::millis::millis_up(self.retry_after())
        )
    }
}

/// With the `tonic` feature, a refusal's source is itself as a gRPC
/// status (`UNAVAILABLE` with `grpc-retry-pushback-ms`, as
/// `From<CircuitOpen> for Status` makes it), so that tonic finds it in an
/// error chain: a generated client over a stack whose error is `BoxError`
/// (`tower::timeout` inside the breaker) answers a refusal with that status,
/// not `UNKNOWN`. Without the feature, it has none.
impl Error for CircuitOpen {
    #[cfg(feature = "tonic")]
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        let status = self
            .status
            .get_or_init(|| Box::new(crate::tonic::unavailable(self)));
        Some(&**status)
    }
}

/// The requirement on the error type of the service a breaker guards: it
/// can hold a refusal (`From<CircuitOpen>`), since a refused call answers
/// with the inner service's error type.
///
/// Every type with `From<CircuitOpen>` has it: tower's `BoxError` (so a
/// stack with `tower::timeout` inside the breaker needs no glue),
/// `tonic::Status` with the `tonic` feature, and your own error enums with
/// a `From<CircuitOpen>` impl. Nothing else implements it: it exists so
/// that the compiler names the fix when the requirement is not met. A
/// client whose error cannot hold a refusal, such as hyper-util's
/// `Client` (`hyper_util::client::legacy::Error`), fails to compile where
/// the guarded service is used as a service (handed to a server, a
/// `Buffer`, a `BoxCloneService`, a `Failover`...) with:
///
/// ```text
/// error[E0277]: a circuit breaker refuses calls with the guarded service's error type,
///               and `hyper_util::client::legacy::Error` cannot hold a refusal
///    = help: the trait `HoldsCircuitOpen` is not implemented for `hyper_util::client::legacy::Error`
///    = note: put `.timeout(..)` inside the breaker (its error, `BoxError`, holds a refusal),
///            or map the inner error inside the breaker: `.map_err(BoxError::from)` ...
/// ```
///
/// A `ServiceExt` method called on it directly (`guarded.oneshot(req)`)
/// is reported instead as "the method `oneshot` exists ... but its trait
/// bounds were not satisfied", naming only `CircuitBreaker<..>: Service<_>`:
/// rustc lists the first level of bounds there. The cause and the fixes
/// are the same.
///
/// The fixes, inside the breaker: a `tower::timeout` (which belongs there
/// anyway, so that a hang is a failure the breaker sees); or the inner
/// error boxed with `.map_err(BoxError::from)` (`tower::util::MapErrLayer`),
/// or mapped to a type of your own that implements `From<CircuitOpen>`:
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_circuit_breaker::{CircuitBreakerLayer, Config};
///
/// #[derive(Debug)]
/// struct ClientError; // stands for an error type with no `From<CircuitOpen>`
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let client = service_fn(|_: ()| async { Ok::<_, ClientError>("answer") });
/// let guarded = ServiceBuilder::new()
///     .layer(CircuitBreakerLayer::new(Config::default()))
///     .map_err(|_: ClientError| BoxError::from("the client failed")) // the glue
///     .service(client);
/// assert_eq!(guarded.oneshot(()).await?, "answer");
/// # Ok(())
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "a circuit breaker refuses calls with the guarded service's error type, and `{Self}` cannot hold a refusal",
    label = "the breaker's error would be `{Self}`, which has no `From<CircuitOpen>`",
    note = "put `.timeout(..)` inside the breaker (its error, `BoxError`, holds a refusal), or map the inner error inside the breaker: `.map_err(BoxError::from)` on the `ServiceBuilder` (`tower::util::MapErrLayer`), or to a type of yours that implements `From<CircuitOpen>`"
)]
pub trait HoldsCircuitOpen: From<CircuitOpen> {}

// `do_not_recommend`: a type without `From<CircuitOpen>` is then reported
// as missing this trait, whose message names the fixes, rather than as
// missing `From<CircuitOpen>`, which names none.
#[diagnostic::do_not_recommend]
impl<E: From<CircuitOpen>> HoldsCircuitOpen for E {}

/// A configuration value is out of range or inconsistent with another.
///
/// Returned by [`ConfigBuilder::build`](crate::ConfigBuilder::build); names
/// the field by its path, for example `trip.count_window.failures`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// Path of the offending field, such as `probes` or
    /// `trip.any_of[1].time_window.failure_rate`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid circuit breaker config: `{}` {}",
            self.field, self.problem
        )
    }
}

impl Error for ConfigError {}

/// A delay as `Retry-After` says it: whole seconds, rounded up (a client
/// told to come back never comes back early), at least 1.
pub(crate) fn retry_after_seconds(delay: Duration) -> u64 {
    delay
        .as_nanos()
        .div_ceil(1_000_000_000)
        .clamp(1, u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_names_read_back_and_long_ones_share_one_copy() {
        for text in [
            "",
            "openai",
            "a name of 23 bytes long",
            "a name of twenty-four bytes",
        ] {
            let source: Arc<str> = Arc::from(text);
            let name = Name::new(&source);
            let copy = name.clone();
            assert_eq!(name.as_str(), text);
            assert_eq!(copy.as_str(), text);
            // A long name holds the source, once per copy; a short one not.
            let held = if text.len() > INLINE_NAME { 3 } else { 1 };
            assert_eq!(Arc::strong_count(&source), held, "{text:?}");
            drop(name);
            drop(copy);
            assert_eq!(Arc::strong_count(&source), 1, "{text:?}");
        }
    }
}
