//! Active probes: while a breaker is open, it sends a small request of its
//! own to the dependency instead of letting a user's request find out.
//!
//! Passive probing (the default) lets the first user requests after the open
//! period through as probes: cheap, but those users pay if the dependency is
//! still down. With [`Breaker::probe_actively`](crate::Breaker::probe_actively), the breaker keeps refusing
//! user requests while it is open or half-open, and a background task sends
//! the request you build (a one-token completion, a health check) once the
//! open period (at least `min_open`) has passed and then every
//! `probe_interval`, until `successes_to_close` probes in a row succeed and
//! the breaker closes. A failed probe keeps it open for another
//! `probe_interval` (longer if the upstream announced a retry-after).
//!
//! There is one task per breaker, started when the breaker opens (on the
//! tokio runtime the opening happens on) and ended when it closes, when an
//! operator takes over, or when the last handle to the breaker is dropped: it
//! holds only a weak reference between probes. It never runs two probes at
//! once. A probe runs under `probe_timeout`. Where no tokio runtime is
//! running, no task can start, and the breaker falls back to passive probing
//! rather than stay open. A breaker may outlive the runtime its task ran on
//! (a runtime per test, per worker thread, or a restart): when that runtime
//! shuts down and drops the task, the breaker probes passively until it next
//! opens, and then starts a task on the runtime that opening happens on.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tower_service::Service;

use crate::breaker::shared::{Prober, Shared, Turn};
use crate::breaker::Breaker;
use std::convert::Infallible;

use crate::classify::{Classify, Outcome, Verdict};

impl Breaker {
    /// Probes actively: while the breaker is open, a background task sends
    /// `make_request()` through `service` (the bare upstream, without this
    /// breaker) after the open period and then every
    /// [`probe_interval`](crate::Config::probe_interval), judging the
    /// result with `classifier`, and user requests are refused until
    /// `successes_to_close` probes in a row succeed. See [`crate::probe`].
    ///
    /// The classifier judges each probe's result at once (its
    /// [`Eos`](crate::classify::Classify::Eos) is `Infallible`, as for
    /// `HttpClassifier` and closures): a probe's body is not read, so a
    /// classifier that waits for the end of a stream (`StreamingHttp`,
    /// `GrpcClassifier`) cannot judge it. Probe an endpoint that answers
    /// whole, such as a one-token completion without streaming.
    /// Returns false if the breaker already has a prober.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{service_fn, BoxError};
    /// use tower_circuit_breaker::{classify::ErrorsAsFailures, Breaker, Config};
    ///
    /// let breaker = Breaker::new(Config::model_router().name("openai").build()?);
    /// let upstream = service_fn(|prompt: String| async move { Ok::<_, BoxError>(prompt.len()) });
    /// // The smallest useful request: a one-token completion.
    /// breaker.probe_actively(upstream, || "ping".to_string(), ErrorsAsFailures);
    /// # Ok::<_, tower_circuit_breaker::ConfigError>(())
    /// ```
    pub fn probe_actively<S, Req, F, C>(&self, service: S, make_request: F, classifier: C) -> bool
    where
        S: Service<Req> + Clone + Send + 'static,
        S::Future: Send,
        S::Response: Send,
        S::Error: Send,
        Req: Send + 'static,
        F: Fn() -> Req + Send + Sync + 'static,
        C: Classify<S::Response, S::Error, Eos = Infallible> + Send + Sync + 'static,
    {
        self.shared.set_prober(Box::new(Spawner {
            // Behind a mutex, so that a service that is `Send` but not
            // `Sync` can be kept here and cloned for each task.
            service: Mutex::new(service),
            make_request: Arc::new(make_request),
            classifier: Arc::new(classifier),
        }))
    }
}

/// Starts probe tasks for one breaker: what each needs, kept between them.
struct Spawner<S, F, C> {
    service: Mutex<S>,
    make_request: Arc<F>,
    classifier: Arc<C>,
}

impl<S, Req, F, C> Prober for Spawner<S, F, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Req: Send + 'static,
    F: Fn() -> Req + Send + Sync + 'static,
    C: Classify<S::Response, S::Error, Eos = Infallible> + Send + Sync + 'static,
{
    fn start(&self, breaker: Weak<Shared>) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let service = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Made here, not in the task's body: a task dropped before its first
        // poll (its runtime shut down) still clears the mark.
        let running = Running {
            breaker,
            finished: false,
        };
        runtime.spawn(run(
            running,
            service,
            Arc::clone(&self.make_request),
            Arc::clone(&self.classifier),
        ));
        true
    }
}

/// Clears the breaker's "prober running" mark however the task ends: run
/// to its end, panicked, or dropped by its runtime (before its first poll
/// or while it slept), so that the breaker probes passively meanwhile and
/// the next opening starts another task.
struct Running {
    breaker: Weak<Shared>,
    /// The task ran to its end (rather than being dropped or panicking).
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(shared) = self.breaker.upgrade() {
            shared.prober_stopped(self.finished);
        }
    }
}

async fn run<S, Req, F, C>(
    mut running: Running,
    mut service: S,
    make_request: Arc<F>,
    classifier: Arc<C>,
) where
    S: Service<Req>,
    F: Fn() -> Req,
    C: Classify<S::Response, S::Error, Eos = Infallible>,
{
    let weak = running.breaker.clone();
    loop {
        let Some(shared) = weak.upgrade() else {
            return; // every handle to the breaker is gone
        };
        let permit = match shared.prober_turn() {
            Turn::Done => {
                running.finished = true;
                return;
            }
            Turn::Wait(wait) => {
                drop(shared);
                wait.until_due(&weak).await;
                continue;
            }
            Turn::Probe(permit) => permit,
        };
        let interval = shared.probe_interval();
        let timeout = shared.probe_timeout();
        drop(shared);
        let verdict = probe(&mut service, &*make_request, &*classifier, timeout).await;
        match verdict.outcome() {
            Outcome::Success => permit.succeed(),
            Outcome::Failure => permit.fail(verdict.retry_after()),
            Outcome::Ignore => drop(permit),
        }
        // The breaker may have closed; otherwise the next probe waits its turn.
        tokio::time::sleep(interval).await;
    }
}

/// Sends one probe and judges it; a timeout or a panic is a failure.
async fn probe<S, Req, F, C>(
    service: &mut S,
    make_request: &F,
    classifier: &C,
    timeout: Option<Duration>,
) -> Verdict
where
    S: Service<Req>,
    F: Fn() -> Req,
    C: Classify<S::Response, S::Error, Eos = Infallible>,
{
    let call = async {
        std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
        service.call(make_request()).await
    };
    let result = match timeout {
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => return Verdict::new(Outcome::Failure),
        },
        None => call.await,
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        classifier.classify_head(result.as_ref())
    }))
    .unwrap_or(Verdict::new(Outcome::Failure))
}
