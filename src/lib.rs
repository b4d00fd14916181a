//! A circuit breaker for [tower] services, built for dependencies that are
//! slow and expensive when they fail: model providers, and any HTTP or gRPC
//! upstream behind hyper, tonic, axum or a tower client.
//!
//! A degraded provider accepts a request, holds it and times out. Without a
//! breaker every request pays the full timeout to learn what the previous one
//! already knew. With one, the first few calls pay for the discovery; after
//! them the breaker answers at once with [`CircuitOpen`] (carrying a
//! retry-after), lets exactly `probes` calls through when it is time to look
//! again, and closes only on evidence.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::{CircuitBreakerLayer, CircuitOpen, Config};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let layer = CircuitBreakerLayer::new(Config::builder().name("provider").build()?);
//! let breaker = layer.breaker(); // read state and counters from here
//!
//! let client = ServiceBuilder::new()
//!     .layer(layer) // outside the timeout...
//!     .timeout(Duration::from_secs(30)) // ...so a hang is a failure it sees
//!     .service(service_fn(|prompt: String| async move { Ok::<_, BoxError>(prompt.len()) }));
//!
//! match client.oneshot("hello".to_string()).await {
//!     Ok(n) => println!("answered: {n}"),
//!     Err(err) => match CircuitOpen::find(err.as_ref()) {
//!         Some(open) => println!("skipped; retry in {:?}", open.retry_after()),
//!         None => println!("failed: {err}"),
//!     },
//! }
//! # let _ = breaker;
//! # Ok(())
//! # }
//! ```
//!
//! # How it behaves
//!
//! * **Admission** happens in `poll_ready`. Closed, it polls the inner
//!   service. Open, it is ready at once without polling it, and `call`
//!   refuses without calling it. It never returns `Err` from `poll_ready`
//!   because a circuit is open: tower would discard the service.
//! * **Half-open is derived from the clock**: open plus an elapsed open
//!   period reads as half-open. No timer task exists that could be lost.
//! * **The clock is tokio's** ([`tokio::time::Instant`]), so paused time
//!   (`#[tokio::test(start_paused = true)]`, `advance`) drives open periods,
//!   windows and probe deadlines in your tests as in ours, and an open period
//!   ends when tokio's clock says, not a tick later. It is read only where a
//!   decision needs it: never by a success under the default or count-window
//!   policies (a failure reads it, to date an opening); once by a refusal,
//!   which compares it with the period's end that each service clone works out
//!   once per open period; once per call by time windows, twice by slow-call
//!   policies. A coarse OS clock would be cheaper to read but needs a
//!   dependency the core does without and ignores paused time; a timestamp
//!   cached by a timer task would be cheaper still, but ends periods up to a
//!   tick late, needs a task on every runtime and would need a second path for
//!   paused time.
//! * **Two readiness modes** ([`Readiness`]): fail fast (the default: ready
//!   at once, `call` refuses) or gate (`Pending` until a probe is possible,
//!   woken exactly then, so `tower::balance` routes around the endpoint).
//! * **Probes are reservations**: a half-open permit is taken in
//!   `poll_ready`, moved into the response future by `call`, and given back
//!   when the future completes, is dropped, or panics.
//! * **Which requests may probe** is a predicate's to say
//!   (`probe_when`, [`eligible`]): the others are refused while a probe is
//!   due and take no permit (then the permit is taken in `call`, where the
//!   request is seen); closed, every request passes.
//! * **The open period** starts at `cooldown`, grows by `backoff` on each
//!   failed probe up to `max_open`, resets on close, and is never shorter
//!   than `min_open`. A retry-after the upstream announced sets the period
//!   instead (never under the first one, capped by `max_open`), as gRPC's
//!   pushback replaces a retry's backoff: backoff grows only the periods the
//!   breaker chooses itself.
//! * **Generations**: every admitted call carries the generation it was
//!   admitted in; an outcome arriving after the breaker moved on is dropped.
//! * **Classification** decides what counts ([`classify`]): by default every
//!   `Err` is a failure; [`HttpClassifier`](classify::HttpClassifier) ignores
//!   4xx other than 408 and 429, so one bad client cannot open the circuit.
//! * **Time** comes from `tokio::time`, so tests run on paused time.
//! * **Transitions** are emitted once each as `tracing` events ([`events`]).
//!
//! # Where it sits in a stack
//!
//! Outermost first: failover → **circuit breaker** → retry → timeout →
//! client. The timeout belongs inside, so a hang becomes a failure the
//! breaker records; a timeout outside would cancel calls before they are
//! recorded. A retry inside the breaker retries a single failed attempt; a
//! retry outside must not retry a [`CircuitOpen`] before its `retry_after`.
//!
//! # Trip policies
//!
//! See [`policy`]: consecutive failures (default), count window, time
//! window, slow calls, an adaptive test against the dependency's learned
//! baseline, and any-of combinations.
//!
//! ```
//! use std::time::Duration;
//! use tower_circuit_breaker::{policy::{ConsecutiveFailures, TimeWindow, TripPolicy}, Config};
//!
//! // Open on a hard outage at once, and on a partial one by its rate.
//! let config = Config::builder()
//!     .trip(TripPolicy::any_of([
//!         ConsecutiveFailures::new(5).into(),
//!         TimeWindow::new(Duration::from_secs(60)).min_calls(20).failure_rate(0.5).into(),
//!     ]))
//!     .build()?;
//! # let _ = config;
//! # Ok::<_, tower_circuit_breaker::ConfigError>(())
//! ```
//!
//! # Classification
//!
//! A [`Classify`](classify::Classify) says which results are failures,
//! which are successes, and which say nothing of the dependency's health
//! (ignored). Closures work:
//!
//! ```
//! use tower::BoxError;
//! use tower_circuit_breaker::{classify::Outcome, CircuitBreakerLayer, Config};
//!
//! let layer = CircuitBreakerLayer::new(Config::default()).classify(
//!     |result: Result<&u16, &BoxError>| match result {
//!         Ok(400..=499) => Outcome::Ignore, // the request's fault
//!         Ok(500..) | Err(_) => Outcome::Failure,
//!         Ok(_) => Outcome::Success,
//!     },
//! );
//! # let _ = layer;
//! ```
//!
//! With the `http-body` feature, a classifier may defer its verdict to the
//! end of the response's body: `.classify(StreamingHttp::new())` judges
//! server-sent event streams, `.classify(GrpcClassifier::new())` gRPC calls
//! by the status in their trailers, on one breaker or a keyed one alike
//! (see [`body`]).
//!
//! # Keyed breakers
//!
//! One breaker per provider, credential or model, bounded in number, with
//! parents ([`registry`]):
//!
//! ```
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::{registry::{KeyedLayer, Registry}, Config};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let registry = Registry::<String>::new(Config::default());
//! let svc = ServiceBuilder::new()
//!     .layer(KeyedLayer::new(registry.clone(), |req: &(String, String)| req.0.clone()))
//!     .service(service_fn(|(_, prompt): (String, String)| async move {
//!         Ok::<_, BoxError>(prompt.len())
//!     }));
//! svc.oneshot(("openai".to_string(), "hi".to_string())).await?;
//! assert_eq!(registry.snapshot().len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Failover
//!
//! [`Failover`] tries candidates in order, each behind its own breaker: an
//! open one is skipped without a call, a failure moves on, and an ignored
//! outcome (a bad request) comes back to the caller.
//!
//! ```
//! use tower::{service_fn, BoxError, ServiceExt};
//! use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, Failover};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let provider = |name: &'static str| {
//!     service_fn(move |prompt: String| async move { Ok::<_, BoxError>(format!("{name}: {prompt}")) })
//! };
//! let primary = Breaker::new(Config::builder().name("primary").build()?);
//! let secondary = Breaker::new(Config::builder().name("secondary").build()?);
//! primary.force_open(None); // the primary is out
//! let chain = Failover::new([
//!     CircuitBreaker::new(provider("primary"), &primary),
//!     CircuitBreaker::new(provider("secondary"), &secondary),
//! ]);
//! assert_eq!(chain.oneshot("hi".to_string()).await?, "secondary: hi");
//! # Ok(())
//! # }
//! ```
//!
//! # Outside tower
//!
//! Code that is not a tower service (a background job, a websocket
//! session, a queue consumer) shares the same breaker through its two-step
//! form ([`permit`]): [`Breaker::try_acquire`] admits a call as the service
//! would, and the [`CallPermit`] records how it went. [`Breaker::open_on_signal`]
//! opens the breaker on a signal from elsewhere (a load shedder, a health
//! check), through its normal path.
//!
//! ```
//! use tower_circuit_breaker::{Breaker, Config};
//!
//! let breaker = Breaker::new(Config::default());
//! if let Ok(permit) = breaker.try_acquire() {
//!     // ... make the call ...
//!     permit.success();
//! }
//! ```
//!
//! # Shared state across a fleet
//!
//! By default a breaker's state lives in the process. With the `redis`
//! feature, several instances share one breaker per name through Redis
//! ([`store::redis`]): one failure count, one open record, one prober per
//! key, while admission still reads only local memory. [`store::memory`]
//! shares it the same way between instances in one process, on tokio's
//! clock: a fleet to test on paused time, without Redis.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn fleet() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_circuit_breaker::store::redis::RedisStore;
//! use tower_circuit_breaker::{CircuitBreakerLayer, Config};
//!
//! let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("gateway").build()?;
//! let layer = CircuitBreakerLayer::new(Config::builder().name("openai").build()?);
//! store.attach(&layer.breaker());
//! # Ok(())
//! # }
//! ```
//!
//! # Observability
//!
//! Transitions are `tracing` events and can be subscribed to; snapshots
//! read the very breakers the request path uses; the `metrics` feature
//! reports gauges and counts:
//!
//! ```
//! use tower_circuit_breaker::{Breaker, Config, State};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let breaker = Breaker::new(Config::builder().name("search").build().unwrap());
//! let mut transitions = breaker.subscribe();
//! breaker.force_open(None);
//! assert_eq!(transitions.recv().await.unwrap().to, State::ForcedOpen);
//! assert_eq!(breaker.snapshot().state, State::ForcedOpen);
//! # }
//! ```
//!
//! # Architecture
//!
//! One direction: a request meets **admission**, the **inner** service
//! answers, a classifier turns the answer into an **outcome**, the outcome
//! feeds the trip **policy**, the policy's verdict makes a **transition**,
//! and the transition goes out as **events** to subscribers and observers.
//! The rooms, from the bottom up; each names only rooms below it:
//!
//! | room | holds |
//! | --- | --- |
//! | `policy`, `outcome`, `classify` | pure decisions: outcomes in, a verdict out; a call's result in, an outcome out |
//! | `config`, `error`, `events` | validated settings; typed errors; states, transitions and the [observer](events::Observer) hook |
//! | `breaker` (the core) | the state word and generations, admission and permits, recording, transitions, manual control; the ports it defines: the fleet backend's trait, the prober's |
//! | `service`, `future`, `body`, `layer`, `eligible` | the tower service and layer over the core; outcomes recorded when the response, or its body's end of stream, arrives; which requests may probe |
//! | `registry`, `failover`, `probe` | keyed breakers; the candidate chain; active probing through the core's admission |
//! | `store`, `metrics_facade`, `serialization`, `axum`, `tonic` | fleet backends on the core's port; observers; integrations |
//!
//! A test (`tests/in_process/architecture.rs`) checks that the core and the
//! pure rooms name nothing above them.
//!
//! # Glossary
//!
//! The words these docs use, one meaning each:
//!
//! | word | means |
//! | --- | --- |
//! | breaker | one circuit: a state, a trip policy and counts, shared by every service clone made from one layer (or one registry key) |
//! | state | closed (calls go through), open (calls are refused), half-open (probes go through), or an operator's hold: forced open, forced closed, disabled |
//! | open period | how long an opened breaker refuses before it lets probes through; it grows with each failed round (backoff) or follows the upstream's retry-after hint |
//! | admission | the decision, at `poll_ready` and `call`, to let a call through, refuse it, or make it a probe |
//! | refusal | a call the breaker answered itself with [`CircuitOpen`], without sending it (counted as [`Counts::rejected`]) |
//! | probe | a call let through while half-open to test the upstream; it holds one of the config's `probes` permits until its outcome is in |
//! | permit | a probe's right to go through, given back when the probe's outcome is recorded or it is dropped |
//! | generation | the count of the breaker's transitions, which every admitted call carries: an outcome from before the latest transition feeds no policy |
//! | outcome | what a call's answer was to the breaker: success, failure, or ignored; with its failure class, a [`Verdict`](classify::Verdict) |
//! | classifier | what turns a call's result (or its body's end of stream) into a verdict |
//! | cancelled | a call dropped before its outcome was known: counted, neither success nor failure (a probe's permit goes back) |
//! | trip policy | what decides, from outcomes, when a closed breaker opens |
//! | hint | a retry-after an upstream sent (`Retry-After`, a reset header, gRPC pushback), which the open period honours |
//! | key, parent | a registry breaker's name, and the breaker of a larger unit above it (a provider over its models) whose refusal also refuses the key |
//! | fleet | instances sharing breaker state through a store; one of them probes per open period |
//!
//! # Cargo features
//!
//! | feature | adds |
//! | --- | --- |
//! | `http-body` | [end-of-stream classification](body) of `http::Response` bodies; gRPC statuses |
//! | `metrics` | state gauges, transitions and counts through the `metrics` facade ([`metrics_facade`]) |
//! | `serde` | configs deserialize (durations as `"30s"`), snapshots serialize ([`serialization`]) |
//! | `tower-http` | tower-http's classifiers, whole or streamed ([`classify::TowerHttp`]) |
//! | `axum` | `CircuitOpen` answers as a 503 with `Retry-After` |
//! | `tonic` | `CircuitOpen` into `tonic::Status`; a classifier of `Status` errors ([`classify::TonicClassifier`]) |
//! | `redis` | breaker state shared by a fleet through Redis ([`store::redis`]) |
//! | `admin` | an axum router for the people on call ([`admin`]): breakers as JSON, transitions as server-sent events, a live page, opt-in control |
//! | `retry` | a `tower::retry` policy that waits out refusals, backs off with jitter and spends a retry budget ([`retry`]) |
//!
//! # Versions it is tied to
//!
//! Some dependencies are part of this crate's public API: their types
//! appear in its signatures, or it recognises their values at run time.
//! Each of their major releases is then a breaking release of this crate,
//! and a program that uses another major of one of them gets no help from
//! the integration, silently:
//!
//! | dependency | tied through | with another major in the program |
//! | --- | --- | --- |
//! | `tower` 0.5, `tower-service` 0.3, `tower-layer` 0.3 | `Service` and `Layer` impls; [`classify::is_timeout`] downcasts to tower 0.5's `Elapsed` | the layer does not fit the stack (a compile error); a timeout from another tower is not recognised as one: `is_timeout` says `false`, so a classifier that gives timeouts their own class counts it as a plain failure |
//! | `http` 1 | classifiers and refusal responses over `http::Response` | a compile error |
//! | `tower-http` 0.7 (feature) | [`classify::TowerHttp`] wraps its classifiers | a compile error |
//! | `axum` 0.8 (feature) | `IntoResponse` for [`CircuitOpen`], the [`admin`] router | a compile error |
//! | `tonic` 0.14 (feature) | `From<CircuitOpen>` for `Status`, [`classify::TonicClassifier`] | a compile error |
//! | `metrics` 0.24 (feature) | the facade's global recorder | nothing is reported: a recorder installed through another `metrics` major is another global, which this crate never reaches |
//!
//! The Redis client stays out of the public API ([`store::redis`] takes a
//! URL and a config, not a client), so its releases are not this crate's.
//!
//! [tower]: https://docs.rs/tower

#![warn(missing_docs)]
// The guide links to items behind features; a build without them cannot
// resolve those links (the all-features build, as on docs.rs, checks them).
#![cfg_attr(
    not(all(
        feature = "http-body",
        feature = "tower-http",
        feature = "redis",
        feature = "retry",
        feature = "metrics",
        feature = "serde",
        feature = "tonic"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
#[cfg(feature = "axum")]
mod axum;
#[cfg(feature = "http-body")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-body")))]
pub mod body;
mod breaker;
pub mod classify;
mod config;
pub mod eligible;
mod error;
pub mod events;
pub mod failover;
pub mod future;
mod layer;
mod local;
// Not `metrics`, so that `use tower_circuit_breaker::*` leaves the name of
// the `metrics` crate alone; `crate::metrics` inside the crate.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
#[path = "metrics.rs"]
pub mod metrics_facade;
// Used by the stores that report through it, when built with them.
#[cfg(feature = "metrics")]
#[allow(unused_imports)]
pub(crate) use metrics_facade as metrics;
mod millis;
mod outcome;
pub mod permit;
pub mod policy;
pub mod probe;
pub mod registry;
#[cfg(feature = "retry")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry")))]
pub mod retry;
// Not `serde`, for the same reason (the `axum` and `tonic` modules hold
// trait impls only, and are private).
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
#[path = "serde/mod.rs"]
pub mod serialization;
mod service;
pub mod store;
mod sync;
#[cfg(feature = "tonic")]
mod tonic;

pub use breaker::{Breaker, BreakerGroup, Control, Counts, Recorded, Snapshot};
pub use config::{Config, ConfigBuilder, LatencyTo};
pub use error::{CircuitOpen, ConfigError, HoldsCircuitOpen};
pub use events::State;
pub use failover::Failover;
pub use layer::CircuitBreakerLayer;
pub use permit::CallPermit;
pub use service::{CircuitBreaker, Readiness};

/// The README's examples, compiled and run as doc tests, so that what a
/// reader copies from it builds. They wire hyper, tonic and axum (the
/// crate's dev-dependencies) and use every integration, so they run with
/// every feature on (`cargo test --all-features`).
#[cfg(all(
    doctest,
    feature = "admin",
    feature = "axum",
    feature = "http-body",
    feature = "redis",
    feature = "retry",
    feature = "tonic"
))]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
