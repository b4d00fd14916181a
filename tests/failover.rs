//! The failover chain: skips, fallbacks, ignored outcomes, the exhausted
//! error, the attempt bound, the last resort, cancellation and its logs.
//!
//! All timing runs on paused tokio time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Response, StatusCode};
use tokio::time::advance;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::failover::{Exhausted, Reason};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, Failover, State};

type Reply = Response<&'static str>;
type Inner = BoxCloneService<&'static str, Reply, BoxError>;
type Candidate = CircuitBreaker<Inner, HttpClassifier>;

/// What a scripted upstream does with the next request.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Answer at once with this status.
    Status(u16),
    /// Fail at once with an error.
    Error,
    /// Never answer.
    Hang,
}

/// A scripted upstream: its breaker, its call count, and a switch for what it
/// does next.
struct Upstream {
    breaker: Breaker,
    calls: Arc<AtomicUsize>,
    act: Arc<Mutex<Act>>,
}

impl Upstream {
    /// An upstream named `name` whose breaker opens after `threshold`
    /// consecutive failures and stays open `cooldown`.
    fn new(name: &'static str, act: Act, threshold: u32, cooldown: Duration) -> Self {
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

    fn candidate(&self) -> Candidate {
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
        CircuitBreaker::with_classifier(BoxCloneService::new(inner), &self.breaker, HttpClassifier)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn set(&self, act: Act) {
        *self.act.lock().unwrap() = act;
    }

    /// Fails it once through its own breaker (threshold 1): it opens.
    async fn trip(&self) {
        let before = self.act.lock().unwrap().to_owned();
        self.set(Act::Error);
        let _ = self.candidate().oneshot("trip").await;
        self.set(before);
        assert_eq!(self.breaker.state(), State::Open);
    }
}

fn chain(upstreams: &[&Upstream]) -> Failover<Inner, HttpClassifier, HttpClassifier> {
    Failover::new(upstreams.iter().map(|u| u.candidate())).classify(HttpClassifier)
}

fn exhausted(err: &BoxError) -> &Exhausted {
    Exhausted::find(err.as_ref()).unwrap_or_else(|| panic!("expected Exhausted, got {err}"))
}

const OK: Act = Act::Status(200);
const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn skips_an_open_candidate_without_calling_it() {
    let primary = Upstream::new("primary", OK, 1, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 30 * SECOND);
    primary.trip().await;
    let calls_before = primary.calls();

    let mut failover = chain(&[&primary, &secondary]);
    for _ in 0..3 {
        let reply = failover.ready().await.unwrap().call("hi").await.unwrap();
        assert_eq!(*reply.body(), "secondary");
    }
    assert_eq!(
        primary.calls(),
        calls_before,
        "an open candidate is never called"
    );
    assert_eq!(
        primary.breaker.snapshot().counts.rejected,
        0,
        "nor even refused"
    );
    assert_eq!(secondary.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn moves_on_after_a_failure() {
    let primary = Upstream::new("primary", Act::Status(503), 5, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 5, 30 * SECOND);

    let reply = chain(&[&primary, &secondary]).oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary");
    assert_eq!((primary.calls(), secondary.calls()), (1, 1));
    // The breaker recorded the failure too; one is not enough to open it.
    assert_eq!(primary.breaker.snapshot().counts.failures, 1);
    assert_eq!(primary.breaker.state(), State::Closed);

    primary.set(Act::Error);
    let reply = chain(&[&primary, &secondary]).oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary", "errors move on too");
}

#[tokio::test(start_paused = true)]
async fn returns_an_ignored_outcome_without_moving_on() {
    let primary = Upstream::new("primary", Act::Status(400), 1, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 30 * SECOND);

    let reply = chain(&[&primary, &secondary]).oneshot("bad").await.unwrap();
    assert_eq!(reply.status(), StatusCode::BAD_REQUEST);
    assert_eq!(*reply.body(), "primary");
    assert_eq!(secondary.calls(), 0, "a bad request is bad everywhere");
    assert_eq!(primary.breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn exhausted_chain_carries_each_reason_and_the_smallest_retry_after() {
    let slow = Upstream::new("slow-to-recover", OK, 1, 30 * SECOND);
    let soon = Upstream::new("soon-to-recover", OK, 1, 10 * SECOND);
    let failing = Upstream::new("failing", Act::Error, 5, 30 * SECOND);
    slow.trip().await;
    soon.trip().await;
    advance(2 * SECOND).await;

    let err = chain(&[&slow, &soon, &failing])
        .oneshot("hi")
        .await
        .unwrap_err();
    let exhausted = exhausted(&err);
    let reasons: Vec<_> = exhausted.candidates().iter().map(|c| c.reason()).collect();
    assert!(matches!(
        reasons[0],
        Reason::Open { state: State::Open, retry_after: Some(d), .. } if *d == 28 * SECOND
    ));
    assert!(matches!(
        reasons[1],
        Reason::Open { state: State::Open, retry_after: Some(d), .. } if *d == 8 * SECOND
    ));
    assert!(
        matches!(reasons[2], Reason::Failed { error: Some(e), .. } if e.to_string() == "failing is down")
    );
    assert_eq!(exhausted.retry_after(), Some(8 * SECOND));

    let names: Vec<_> = exhausted.candidates().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["slow-to-recover", "soon-to-recover", "failing"]);
    let indices: Vec<_> = exhausted.candidates().iter().map(|c| c.index()).collect();
    assert_eq!(indices, [0, 1, 2]);
    let text = exhausted.to_string();
    assert!(
        text.contains("#1 `soon-to-recover` open, retry after 8000 ms"),
        "{text}"
    );
    assert!(
        text.contains("#2 `failing` failed: failing is down"),
        "{text}"
    );
    // The last failure is the error's source.
    let source = std::error::Error::source(exhausted).map(|e| e.to_string());
    assert_eq!(source.as_deref(), Some("failing is down"));
    assert_eq!((slow.calls(), soon.calls(), failing.calls()), (1, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_failed_response_is_reported_without_its_body() {
    let only = Upstream::new("only", Act::Status(503), 5, 30 * SECOND);
    let err = chain(&[&only]).oneshot("hi").await.unwrap_err();
    let exhausted = exhausted(&err);
    assert!(matches!(
        exhausted.candidates()[0].reason(),
        Reason::Failed { error: None, .. }
    ));
    assert_eq!(exhausted.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn attempt_bound_is_respected() {
    let upstreams: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|name| Upstream::new(name, Act::Error, 5, 30 * SECOND))
        .collect();
    let refs: Vec<&Upstream> = upstreams.iter().collect();

    let err = chain(&refs)
        .max_attempts(2)
        .oneshot("hi")
        .await
        .unwrap_err();
    let calls: Vec<_> = upstreams.iter().map(Upstream::calls).collect();
    assert_eq!(calls, [1, 1, 0]);
    let reasons = exhausted(&err).candidates();
    assert!(matches!(reasons[0].reason(), Reason::Failed { .. }));
    assert!(matches!(reasons[1].reason(), Reason::Failed { .. }));
    assert!(matches!(reasons[2].reason(), Reason::NotTried));

    // The default bound is one call per candidate.
    let _ = chain(&refs).oneshot("hi").await.unwrap_err();
    let calls: Vec<_> = upstreams.iter().map(Upstream::calls).collect();
    assert_eq!(calls, [2, 2, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_costs_no_attempt() {
    // Half-open with its one probe in flight: the breaker refuses the call
    // with `CircuitOpen`; the failover moves on, even with one attempt.
    let primary = Upstream::new("primary", Act::Hang, 1, 5 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 5 * SECOND);
    primary.trip().await;
    advance(5 * SECOND).await;
    assert_eq!(primary.breaker.state(), State::HalfOpen);

    let failover = chain(&[&primary, &secondary]).max_attempts(1);
    let probe = tokio::spawn(failover.clone().oneshot("probe"));
    tokio::task::yield_now().await;
    assert_eq!(primary.breaker.snapshot().probes_in_flight, 1);

    let reply = failover.clone().oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "secondary");
    assert_eq!(
        primary.calls(),
        2,
        "the trip and the probe, not this request"
    );
    assert_eq!(primary.breaker.snapshot().counts.rejected, 1);
    probe.abort();
}

#[tokio::test(start_paused = true)]
async fn cancelled_attempt_gives_back_its_probe_permit() {
    let primary = Upstream::new("primary", Act::Hang, 1, 5 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 5 * SECOND);
    primary.trip().await;
    advance(5 * SECOND).await;

    let failover = chain(&[&primary, &secondary]);
    let probe = tokio::spawn(failover.clone().oneshot("probe"));
    tokio::task::yield_now().await;
    assert_eq!(primary.breaker.snapshot().probes_in_flight, 1);
    probe.abort();
    let _ = probe.await;
    assert_eq!(primary.breaker.snapshot().probes_in_flight, 0);

    // The next request can probe again, and closes the breaker.
    primary.set(OK);
    let reply = failover.oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "primary");
    assert_eq!(primary.breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn last_resort_calls_the_soonest_to_recover_candidate_only_when_enabled() {
    let later = Upstream::new("later", OK, 1, 20 * SECOND);
    let sooner = Upstream::new("sooner", OK, 1, 5 * SECOND);
    later.trip().await;
    sooner.trip().await;
    let (later_before, sooner_before) = (later.calls(), sooner.calls());

    // Off by default: nothing is called.
    let err = chain(&[&later, &sooner]).oneshot("hi").await.unwrap_err();
    assert_eq!(exhausted(&err).retry_after(), Some(5 * SECOND));
    assert_eq!(
        (later.calls(), sooner.calls()),
        (later_before, sooner_before)
    );

    // On: the one that recovers soonest is called, around its breaker.
    let failover = chain(&[&later, &sooner]).last_resort(true);
    let reply = failover.clone().oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "sooner");
    assert_eq!(
        (later.calls(), sooner.calls()),
        (later_before, sooner_before + 1)
    );
    assert_eq!(
        sooner.breaker.state(),
        State::Open,
        "its breaker saw nothing"
    );
    assert_eq!(sooner.breaker.retry_after(), Some(5 * SECOND));

    // Only when every candidate is open: here one failed, so no last resort.
    let failing = Upstream::new("failing", Act::Error, 5, 20 * SECOND);
    let err = chain(&[&later, &failing, &sooner])
        .last_resort(true)
        .oneshot("hi")
        .await
        .unwrap_err();
    assert_eq!(exhausted(&err).candidates().len(), 3);
    assert_eq!(sooner.calls(), sooner_before + 1);

    // An operator's isolation has no end: never a last resort.
    sooner.breaker.force_open(None);
    let err = failover.clone().oneshot("hi").await;
    assert_eq!(*err.unwrap().body(), "later");
}

#[tokio::test(start_paused = true)]
async fn a_shadow_breaker_is_called_while_it_reads_open() {
    let primary = Upstream::new("primary", OK, 1, 30 * SECOND);
    let secondary = Upstream::new("secondary", OK, 1, 30 * SECOND);
    primary.breaker.set_shadow(true);
    primary.trip().await;

    let reply = chain(&[&primary, &secondary]).oneshot("hi").await.unwrap();
    assert_eq!(*reply.body(), "primary", "shadow mode never refuses");
}

#[tokio::test(start_paused = true)]
async fn each_fallback_is_logged_with_structured_fields() {
    use tracing_subscriber::layer::{Context, SubscriberExt};

    #[derive(Default)]
    struct Fields(Vec<(String, String)>);
    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
        fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
            self.0.push((field.name().to_owned(), value.to_string()));
        }
    }
    type Event = (tracing::Level, Vec<(String, String)>);
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Event>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            if event.metadata().target().ends_with("failover::future") {
                let mut fields = Fields::default();
                event.record(&mut fields);
                let level = *event.metadata().level();
                self.0.lock().unwrap().push((level, fields.0));
            }
        }
    }

    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));

    let open = Upstream::new("open", OK, 1, 30 * SECOND);
    let failing = Upstream::new("failing", Act::Error, 5, 30 * SECOND);
    let healthy = Upstream::new("healthy", OK, 5, 30 * SECOND);
    open.trip().await;
    capture.0.lock().unwrap().clear();

    let reply = chain(&[&open, &failing, &healthy])
        .oneshot("hi")
        .await
        .unwrap();
    assert_eq!(*reply.body(), "healthy");

    let events = capture.0.lock().unwrap();
    let field = |n: usize, name: &str| {
        events[n]
            .1
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("event {n} has no `{name}`: {:?}", events[n]))
    };
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, tracing::Level::DEBUG);
    assert_eq!(field(0, "candidate"), "0");
    assert_eq!(field(0, "breaker"), "open");
    assert_eq!(field(0, "state"), "Open");
    assert_eq!(field(0, "retry_after_ms"), "30000");
    assert_eq!(events[1].0, tracing::Level::INFO);
    assert_eq!(field(1, "candidate"), "1");
    assert_eq!(field(1, "breaker"), "failing");
    assert_eq!(field(1, "state"), "Closed");
    assert_eq!(field(1, "reason"), "failed: failing is down");
}
