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
//! Three things to know before wiring your own: every service one
//! [`CircuitBreakerLayer`] wraps shares one breaker (build one layer per
//! dependency, or use [keyed breakers](guide::keyed)); the timeout belongs
//! inside the breaker; and the error type under the breaker must be able to
//! hold a refusal, as tower's `BoxError` can ([the stack](guide::stack)).
//!
//! # The guide
//!
//! The [`guide`] teaches the crate a page per subject, each with examples
//! that compile and run:
//!
//! | page | teaches | features |
//! | --- | --- | --- |
//! | [behaviour](guide::behaviour) | states, admission, probe permits, the open period, the clock, the refusal | |
//! | [the stack](guide::stack) | where the breaker sits, the error rule, retries that know the breaker, answering callers | `retry`, `axum`, `tonic` |
//! | [wiring each client](guide::clients) | hyper-util, a tonic `Channel` and a gRPC router, axum on both sides, any tower client | `tonic`, `axum` |
//! | [readiness](guide::readiness) | fail fast or gate, and what tower's layers do outside a gate | |
//! | [trip policies](guide::policies) | every policy, and how to choose | |
//! | [classification](guide::classification) | what counts as a failure; providers' signals; streamed bodies | `http-body`, `tonic`, `tower-http` |
//! | [keyed breakers](guide::keyed) | a breaker per key, parents, bounds, keys without credentials | |
//! | [failover](guide::failover) | ordered candidates, each behind its breakers | |
//! | [probes](guide::probes) | which requests may probe; active probes | |
//! | [outside tower](guide::outside_tower) | permits, `run`, signals from elsewhere | |
//! | [the fleet](guide::fleet) | one breaker across instances, on Redis or in memory; its capacity | `redis` |
//! | [operations](guide::operations) | tracing, metrics and Grafana, the admin page, manual control, configs from files | `metrics`, `admin`, `serde` |
//! | [testing](guide::testing) | testing your own stack on paused time | |
//! | [cost](guide::cost) | what it costs and what it saves | |
//! | [limits](guide::limits) | everything it does not do, in one list; the versions it is tied to | |
//! | [words](guide::glossary) | the words these docs use; how the crate is built | |
//!
//! # Cargo features
//!
//! The core needs none; it depends only on tower, tower-layer,
//! tower-service, pin-project-lite, tokio (`rt`, `sync`, `time`), http and
//! tracing.
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
//! [tower]: https://docs.rs/tower

#![warn(missing_docs)]
// The crate's docs and the guide's pages link to items behind every
// feature; a build without some of them cannot resolve those links (the
// all-features build, as on docs.rs and in CI, checks them).
#![cfg_attr(
    not(all(
        feature = "admin",
        feature = "axum",
        feature = "http-body",
        feature = "metrics",
        feature = "redis",
        feature = "retry",
        feature = "serde",
        feature = "tonic",
        feature = "tower-http"
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
// The guide's pages: in the docs, and, for their examples, in the doc tests
// with every feature on (`cargo test --doc --all-features`), since the
// examples wire every integration. Two declarations rather than one
// `any(doc, ...)`, so that docs.rs marks the guide with no feature.
#[cfg(doc)]
pub mod guide;
#[cfg(all(
    doctest,
    not(doc),
    feature = "admin",
    feature = "axum",
    feature = "http-body",
    feature = "metrics",
    feature = "redis",
    feature = "retry",
    feature = "serde",
    feature = "tonic",
    feature = "tower-http"
))]
pub mod guide;
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
