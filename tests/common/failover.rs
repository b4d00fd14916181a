//! Scripted upstreams behind breakers, and a failover chain over them,
//! for the failover tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Response;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::failover::Exhausted;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, Failover, State};

pub type Reply = Response<&'static str>;
pub type Inner = BoxCloneService<&'static str, Reply, BoxError>;
pub type Candidate = CircuitBreaker<Inner, HttpClassifier>;

/// What a scripted upstream does with the next request.
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// Answer at once with this status.
    Status(u16),
    /// Fail at once with an error.
    Error,
    /// Never answer.
    Hang,
}

/// A scripted upstream: its breaker, its call count, and a switch for what it
/// does next. Not the shared [`super::Upstream`]: it answers HTTP statuses
/// (judged by `HttpClassifier`) with its name as the body, and errors that
/// name it, so a chain's reply and its `Exhausted` tell the candidates apart.
pub struct Upstream {
    pub breaker: Breaker,
    pub calls: Arc<AtomicUsize>,
    pub act: Arc<Mutex<Act>>,
}

impl Upstream {
    /// An upstream named `name` whose breaker opens after `threshold`
    /// consecutive failures and stays open `cooldown`.
    pub fn new(name: &'static str, act: Act, threshold: u32, cooldown: Duration) -> Self {
        let config = Config::builder()
            .name(name)
            .trip(ConsecutiveFailures::new(threshold))
            .cooldown(cooldown)
            .backoff(1.0)
            .probe_timeout(None)
            .build()
            .unwrap();
        Upstream {
            breaker: Breaker::new(config),
            calls: Arc::default(),
            act: Arc::new(Mutex::new(act)),
        }
    }

    pub fn candidate(&self) -> Candidate {
        let (name, calls, act) = (self.breaker.name().to_owned(), &self.calls, &self.act);
        let (calls, act) = (calls.clone(), act.clone());
        let name: &'static str = Box::leak(name.into_boxed_str());
        let inner = service_fn(move |_prompt: &'static str| {
            calls.fetch_add(1, Ordering::SeqCst);
            let act = *act.lock().unwrap();
            async move {
                match act {
                    Act::Status(code) => Ok(Response::builder().status(code).body(name).unwrap()),
                    Act::Error => Err(BoxError::from(format!("{name} is down"))),
                    Act::Hang => std::future::pending().await,
                }
            }
        });
        CircuitBreaker::with_classifier(
            BoxCloneService::new(inner),
            &self.breaker,
            HttpClassifier::new(),
        )
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn set(&self, act: Act) {
        *self.act.lock().unwrap() = act;
    }

    /// Fails it once through its own breaker (threshold 1): it opens.
    pub async fn trip(&self) {
        let before = self.act.lock().unwrap().to_owned();
        self.set(Act::Error);
        let _ = self.candidate().oneshot("trip").await;
        self.set(before);
        assert_eq!(self.breaker.state(), State::Open);
    }
}

pub fn chain(
    upstreams: &[&Upstream],
) -> Failover<CircuitBreaker<Inner, HttpClassifier>, HttpClassifier> {
    Failover::new(upstreams.iter().map(|u| u.candidate())).classify(HttpClassifier::new())
}

pub fn exhausted(err: &BoxError) -> &Exhausted {
    Exhausted::find(err.as_ref()).unwrap_or_else(|| panic!("expected Exhausted, got {err}"))
}

pub const OK: Act = Act::Status(200);
pub const SECOND: Duration = Duration::from_secs(1);
