//! `retry::RetryPolicy` in a real tower stack (`ServiceBuilder::retry`
//! around a breaker), on paused time: refusals waited out to their
//! `retry_after`, capped and jittered backoff, the retry budget, and the
//! classifier's say on what is worth a retry.
#![cfg(feature = "retry")]

use std::collections::HashSet;
use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Response, StatusCode};
use tokio::time::Instant;
use tower::retry::budget::TpsBudget;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::retry::RetryPolicy;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config, State};

/// When the upstream was called, in virtual time.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Instant>>>);

impl Calls {
    /// Records a call; returns how many came before it.
    fn record(&self) -> usize {
        let mut calls = self.0.lock().expect("not poisoned");
        calls.push(Instant::now());
        calls.len() - 1
    }

    fn times(&self) -> Vec<Instant> {
        self.0.lock().expect("not poisoned").clone()
    }

    /// The time between each call and the next.
    fn gaps(&self) -> Vec<Duration> {
        self.times().windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// An upstream that records each call here and fails it, as a reset
    /// connection does.
    fn failing_upstream(
        &self,
    ) -> impl Service<(), Response = (), Error = BoxError, Future = Ready<Result<(), BoxError>>> + Clone
    {
        let calls = self.clone();
        service_fn(move |_: ()| {
            calls.record();
            ready(Err(BoxError::from("reset")))
        })
    }
}

fn breaker(config: tower_circuit_breaker::ConfigBuilder) -> Breaker {
    Breaker::new(config.build().expect("a valid config"))
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_retried_no_sooner_than_its_retry_after() {
    let cooldown = Duration::from_secs(2);
    let breaker = breaker(
        Config::builder()
            .name("provider")
            .trip(ConsecutiveFailures::new(1))
            .cooldown(cooldown),
    );
    let calls = Calls::default();
    let upstream = {
        let calls = calls.clone();
        // Fails once (which opens the breaker), then answers.
        service_fn(move |prompt: String| {
            let first = calls.record() == 0;
            async move {
                if first {
                    Err(BoxError::from("overloaded"))
                } else {
                    Ok(prompt.len())
                }
            }
        })
    };
    let stack = ServiceBuilder::new()
        .retry(
            RetryPolicy::new()
                .retries(3)
                .backoff(Duration::from_millis(100), Duration::from_millis(100)),
        )
        .layer(breaker.layer())
        .service(upstream);

    let answer = stack
        .oneshot("hello".to_string())
        .await
        .expect("answered on a retry");

    assert_eq!(answer, 5);
    // Sent, refused once without reaching the upstream, then sent again
    // as the probe once the open period was over.
    let times = calls.times();
    assert_eq!(times.len(), 2, "the refusal never reached the upstream");
    assert!(
        times[1] - times[0] >= cooldown,
        "the probe was sent {:?} after the failure, inside the open period",
        times[1] - times[0]
    );
    let counts = breaker.snapshot().counts;
    assert_eq!(counts.rejected, 1, "one refusal, waited out");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_longer_than_max_wait_is_returned_at_once() {
    let breaker = breaker(Config::builder().name("provider"));
    breaker.force_open(Some(Duration::from_secs(60)));
    let calls = Calls::default();
    let upstream = {
        let calls = calls.clone();
        service_fn(move |_: ()| {
            calls.record();
            async { Ok::<_, BoxError>(()) }
        })
    };
    let stack = ServiceBuilder::new()
        .retry(
            RetryPolicy::new()
                .retries(3)
                .max_wait(Duration::from_secs(10)),
        )
        .layer(breaker.layer())
        .service(upstream);

    let start = Instant::now();
    let err = stack.oneshot(()).await.expect_err("refused");

    let open = CircuitOpen::take(err).expect("the caller gets the refusal");
    assert_eq!(open.breaker(), "provider");
    assert_eq!(Instant::now(), start, "no time spent waiting");
    assert!(calls.times().is_empty());
    assert_eq!(breaker.snapshot().counts.rejected, 1, "not retried");
}

#[tokio::test(start_paused = true)]
async fn failures_are_retried_after_a_capped_jittered_backoff() {
    // A breaker that never trips here, so every retry reaches the upstream.
    let breaker = breaker(Config::builder().trip(ConsecutiveFailures::new(100)));
    let calls = Calls::default();
    let upstream = calls.failing_upstream();
    let (base, cap) = (Duration::from_millis(100), Duration::from_millis(300));
    let stack = ServiceBuilder::new()
        .retry(RetryPolicy::new().retries(4).backoff(base, cap))
        .layer(breaker.layer())
        .service(upstream);

    stack.oneshot(()).await.expect_err("every attempt fails");

    let gaps = calls.gaps();
    assert_eq!(gaps.len(), 4, "4 retries after the first attempt");
    for (retry, (gap, ceiling)) in gaps.iter().zip([100, 200, 300, 300]).enumerate() {
        let ceiling = Duration::from_millis(ceiling);
        assert!(
            *gap >= ceiling / 2 && *gap <= ceiling,
            "retry {retry} waited {gap:?}, outside [{:?}, {ceiling:?}]",
            ceiling / 2
        );
    }
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_callers_that_failed_together() {
    let breaker = breaker(Config::builder().trip(ConsecutiveFailures::new(1_000)));
    let calls = Calls::default();
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let upstream = {
        let calls = calls.clone();
        // Each request's first attempt fails, its retry succeeds.
        service_fn(move |request: u32| {
            calls.record();
            let first = seen.lock().expect("not poisoned").insert(request);
            async move {
                if first {
                    Err(BoxError::from("reset"))
                } else {
                    Ok(())
                }
            }
        })
    };
    let stack = ServiceBuilder::new()
        .retry(
            RetryPolicy::new()
                .retries(1)
                .backoff(Duration::from_secs(1), Duration::from_secs(1)),
        )
        .layer(breaker.layer())
        .service(upstream);

    let start = Instant::now();
    let requests: Vec<_> = (0..16)
        .map(|request| tokio::spawn(stack.clone().oneshot(request)))
        .collect();
    for request in requests {
        request
            .await
            .expect("no panic")
            .expect("answered on the retry");
    }

    let retried_at: Vec<Duration> = calls
        .times()
        .iter()
        .map(|t| *t - start)
        .filter(|t| !t.is_zero())
        .collect();
    assert_eq!(retried_at.len(), 16, "every request retried once");
    for at in &retried_at {
        assert!(
            *at >= Duration::from_millis(500) && *at <= Duration::from_secs(1),
            "{at:?}"
        );
    }
    let mut distinct = retried_at.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 8,
        "16 callers that failed together came back at {} instants",
        distinct.len()
    );
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_stops_retries() {
    let breaker = breaker(Config::builder().trip(ConsecutiveFailures::new(1_000)));
    let calls = Calls::default();
    let upstream = calls.failing_upstream();
    // No reserve and no share of requests: nothing to spend on retries.
    let empty = Arc::new(TpsBudget::new(Duration::from_secs(1), 0, 0.0));
    let stack = ServiceBuilder::new()
        .retry(RetryPolicy::new().retries(3).budget(empty))
        .layer(breaker.layer())
        .service(upstream);

    for _ in 0..5 {
        stack.clone().oneshot(()).await.expect_err("fails");
    }
    assert_eq!(
        calls.times().len(),
        5,
        "one attempt each: the budget allows no retry"
    );

    // The same requests with the default budget are retried.
    let calls = Calls::default();
    let upstream = calls.failing_upstream();
    let stack = ServiceBuilder::new()
        .retry(RetryPolicy::new().retries(3))
        .layer(breaker.layer())
        .service(upstream);
    for _ in 0..5 {
        stack.clone().oneshot(()).await.expect_err("fails");
    }
    assert_eq!(calls.times().len(), 20, "four attempts each");
}

fn response(status: StatusCode, retry_after: Option<&'static str>) -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = status;
    if let Some(seconds) = retry_after {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static(seconds),
        );
    }
    response
}

#[tokio::test(start_paused = true)]
async fn an_ignored_answer_is_not_retried_and_a_hinted_failure_waits_its_hint() {
    let scripted = |answers: Vec<Response<()>>| {
        let calls = Calls::default();
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let upstream = {
            let calls = calls.clone();
            service_fn(move |_: ()| {
                calls.record();
                let answer = answers
                    .lock()
                    .expect("not poisoned")
                    .next()
                    .expect("an answer");
                async move { Ok::<_, BoxError>(answer) }
            })
        };
        let stack = ServiceBuilder::new()
            .retry(
                RetryPolicy::new()
                    .retries(2)
                    .classify(HttpClassifier::new()),
            )
            .layer(CircuitBreakerLayer::new(Config::default()).classify(HttpClassifier::new()))
            .service(upstream);
        (stack, calls)
    };

    // A bad request says nothing of the upstream's health: returned as is.
    let (stack, calls) = scripted(vec![response(StatusCode::BAD_REQUEST, None)]);
    let answer = stack.oneshot(()).await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.times().len(), 1);

    // A 503 asking for 3 s is retried, no sooner than that.
    let (stack, calls) = scripted(vec![
        response(StatusCode::SERVICE_UNAVAILABLE, Some("3")),
        response(StatusCode::OK, None),
    ]);
    let answer = stack.oneshot(()).await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::OK);
    let gaps = calls.gaps();
    assert_eq!(gaps.len(), 1);
    assert!(
        gaps[0] >= Duration::from_secs(3),
        "retried after {:?}",
        gaps[0]
    );

    // A 429 asking for longer than `max_wait` is returned at once.
    let (stack, calls) = scripted(vec![response(StatusCode::TOO_MANY_REQUESTS, Some("120"))]);
    let answer = stack.oneshot(()).await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.times().len(), 1);
}
