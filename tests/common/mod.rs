//! Helpers shared by the integration tests: here, a harness that drives a
//! breaker over the shared fake upstream ([`Upstream`], in `upstream.rs`);
//! in the submodules, what tests of one kind share (paused time, servers on
//! loopback, captured traces).
//!
//! Each test binary declares this module once (`#[path =
//! "../common/mod.rs"] mod common;` in `tests/<group>/main.rs`) and its
//! modules name what they use (`use crate::common::paused;`). Each uses a
//! different subset, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod admin;
pub mod captured;
// What the integration examples share, for the tests that run their
// wiring (`app.rs` names it as its sibling, `super::demo`).
#[path = "../../examples/common/demo.rs"]
pub mod demo;
pub mod failover;
pub mod fleet_conformance;
// The outage bench's failure processes, for the adaptive policy's tests.
#[path = "../../benches/outage_support/failures.rs"]
pub mod failures;
#[cfg(feature = "http-body")]
pub mod gateway;
pub mod grpc;
#[cfg(feature = "http-body")]
pub mod paced;
pub mod panics;
pub mod paused;
#[cfg(feature = "redis")]
pub mod redis;
pub mod rng;
pub mod upstream;

pub use upstream::{Call, InnerFailure, Upstream};

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tower::{BoxError, Service, ServiceExt};
use tower_circuit_breaker::policy::TripPolicy;
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, ConfigBuilder, State};

/// Whether `err` is (or wraps) the breaker's open rejection.
pub fn is_open(err: &BoxError) -> bool {
    CircuitOpen::find(err.as_ref()).is_some()
}

/// Whether `err` is (or wraps) the scripted inner failure.
pub fn is_inner_failure(err: &BoxError) -> bool {
    let mut current: Option<&(dyn Error + 'static)> = Some(err.as_ref());
    while let Some(e) = current {
        if e.is::<InnerFailure>() {
            return true;
        }
        current = e.source();
    }
    false
}

/// A builder with the given trip policy and the defaults otherwise.
pub fn builder(policy: impl Into<TripPolicy>) -> ConfigBuilder {
    Config::builder().name("test").trip(policy)
}

/// A provider's breaker that opens on its first failure, for 10 s: one
/// call shows what counts as a failure.
pub fn one_failure_opens(name: &str) -> ConfigBuilder {
    Config::builder()
        .name(name)
        .trip(tower_circuit_breaker::policy::ConsecutiveFailures::new(1))
        .cooldown(std::time::Duration::from_secs(10))
}

/// Asserts that a config tripping on `policy` is rejected, naming `field`.
#[track_caller]
pub fn assert_policy_rejected(policy: impl Into<TripPolicy>, field: &str) {
    assert_rejected(builder(policy), field);
}

/// Asserts that `builder` fails to build, with an error that names `field`
/// (in `field()` and in its message) and says what is wrong with it.
#[track_caller]
pub fn assert_rejected(builder: ConfigBuilder, field: &str) {
    match builder.build() {
        Ok(config) => panic!("expected an error on `{field}`, got {config:?}"),
        Err(err) => {
            assert_eq!(err.field(), field, "{err}");
            assert!(!err.problem().is_empty());
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}

/// A breaker with the given trip policy and the defaults otherwise.
pub fn breaker(policy: impl Into<TripPolicy>) -> Breaker {
    Breaker::new(builder(policy).build().expect("valid config"))
}

/// A breaker guarding an [`Upstream`] of [`Call`]s, driven one call at a
/// time.
pub struct Harness {
    pub breaker: Breaker,
    pub inner: Upstream<Call>,
    pub svc: CircuitBreaker<Upstream<Call>>,
}

impl Harness {
    pub fn new(policy: impl Into<TripPolicy>) -> Self {
        Self::with_breaker(breaker(policy))
    }

    pub fn with_config(config: Config) -> Self {
        Self::with_breaker(Breaker::new(config))
    }

    pub fn with_breaker(breaker: Breaker) -> Self {
        let inner = Upstream::default();
        let svc = CircuitBreaker::new(inner.clone(), &breaker);
        Harness {
            breaker,
            inner,
            svc,
        }
    }

    pub fn state(&self) -> State {
        self.breaker.state()
    }

    /// One call, through `ready` then `call`.
    pub async fn call(&mut self, call: Call) -> Result<(), BoxError> {
        self.svc.ready().await?.call(call).await
    }

    /// One call that must reach the inner service and come back as `call`
    /// says: `Ok` for `Ok`/`SlowOk`, the inner failure for `Fail`/`SlowFail`
    /// (a `Panic` panics).
    pub async fn through(&mut self, call: Call) {
        let before = self.inner.calls();
        let result = self.call(call).await;
        assert_eq!(
            self.inner.calls(),
            before + 1,
            "{call:?} did not reach the inner service: {result:?}"
        );
        match call {
            Call::Ok | Call::SlowOk(_) => {
                assert!(result.is_ok(), "{call:?} returned {result:?}")
            }
            Call::Fail | Call::SlowFail(_) => match result {
                Err(err) => assert!(is_inner_failure(&err), "{call:?} returned {err}"),
                Ok(()) => panic!("{call:?} returned Ok"),
            },
            Call::Panic => unreachable!("the inner service panicked"),
        }
    }

    /// `n` successes, each reaching the inner service.
    pub async fn succeed(&mut self, n: usize) {
        self.repeat(n, Call::Ok).await;
    }

    /// `n` failures, each reaching the inner service.
    pub async fn fail(&mut self, n: usize) {
        self.repeat(n, Call::Fail).await;
    }

    /// `call` `n` times, each reaching the inner service.
    pub async fn repeat(&mut self, n: usize, call: Call) {
        for _ in 0..n {
            self.through(call).await;
        }
    }

    /// One call that the breaker must refuse without calling the inner
    /// service; returns the rejection.
    pub async fn refused(&mut self) -> CircuitOpen {
        let before = self.inner.calls();
        let err = self
            .call(Call::Ok)
            .await
            .expect_err("an open breaker must refuse the call");
        assert_eq!(
            self.inner.calls(),
            before,
            "a refused call reached the inner service"
        );
        CircuitOpen::find(err.as_ref())
            .cloned()
            .unwrap_or_else(|| panic!("expected CircuitOpen, got {err}"))
    }
}

/// Waits for `svc` to be ready (panicking if it fails), then sends it `req`.
pub async fn send<S, R>(svc: &mut S, req: R) -> Result<S::Response, S::Error>
where
    S: Service<R>,
    S::Error: fmt::Debug,
{
    svc.ready().await.unwrap().call(req).await
}

/// A waker that counts how often it is woken.
#[derive(Default)]
pub struct CountingWaker(AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A fresh counting waker: its counter and the waker itself.
pub fn counting_waker() -> (Arc<CountingWaker>, std::task::Waker) {
    let counter = Arc::new(CountingWaker::default());
    (Arc::clone(&counter), std::task::Waker::from(counter))
}

/// How often `counter`'s waker has been woken.
pub fn wakes(counter: &CountingWaker) -> usize {
    counter.0.load(Ordering::SeqCst)
}
