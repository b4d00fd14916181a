//! The single-thread rows, in the order the summary prints them: calls
//! from an async caller first (keyed calls as the registry grows among
//! them), then the same call hand-polled and under `block_on` (the rows
//! the driver-agreement check compares), a clone per request, the
//! stack-pinned calls, and the references.

use std::fmt;
use std::future::ready;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use tower::load_shed::LoadShed;
use tower::timeout::Timeout;
use tower::{service_fn, BoxError, Layer, Service};
use tower_circuit_breaker::policy::{
    Adaptive, ConsecutiveFailures, CountWindow, SlowCalls, TimeWindow,
};
use tower_circuit_breaker::registry::KeyedLayer;
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, Readiness, State};

use crate::floor;
use crate::keyed;
use crate::peers;
use crate::scenario::{breaker_in, Caller, Scenario};
use crate::services::{
    config, expect_refused, expect_served, inner, inner_boxed, registry_of, trip, ArcRoundTrip,
    BenchError, Refusal, HOUR,
};

/// Every single-thread row.
pub fn scenarios() -> Vec<Scenario> {
    let mut rows = breaker_rows(Caller::Async);
    rows.extend(keyed::growth());
    rows.extend(agreement_rows(Caller::Hand));
    rows.extend(agreement_rows(Caller::BlockOn));
    rows.extend(clone_rows(Caller::Oneshot));
    rows.extend(clone_rows(Caller::CloneDrop));
    rows.extend(breaker_rows(Caller::Stack));
    rows.extend(references());
    rows
}

/// A breaker, closed, in front of `inner`, checked to serve a call.
fn closed<S, E>(
    caller: Caller,
    name: &str,
    config: Config,
    readiness: Readiness,
    inner: S,
) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + Clone + 'static,
    E: From<CircuitOpen> + fmt::Debug,
{
    let full = format!("{}{name}", caller.prefix());
    let breaker = Breaker::new(config);
    let mut svc = CircuitBreaker::new(inner, &breaker).readiness(readiness);
    assert_eq!(breaker.state(), State::Closed, "{full}: a new breaker");
    expect_served(&full, &mut svc);
    Scenario::new(caller, name, svc, breaker_in(&full, breaker, State::Closed))
}

/// A breaker, open for an hour, in front of `inner`, checked to refuse a
/// call. It is tripped by one failure through a second service on the same
/// breaker, whose inner service always fails, so that the measured service
/// wraps exactly the inner service of the other rows.
fn rejected<S, E>(caller: Caller, name: &str, inner: S, failure: fn() -> E) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + Clone + 'static,
    E: From<CircuitOpen> + Refusal + 'static,
{
    let full = format!("{}{name}", caller.prefix());
    let config = Config::builder()
        .name(name)
        .trip(ConsecutiveFailures::new(1))
        .cooldown(HOUR)
        .max_open(HOUR)
        .build()
        .expect("valid benchmark config");
    let breaker = Breaker::new(config);
    trip(
        &full,
        &mut CircuitBreaker::new(
            service_fn(move |_: u64| ready(Err::<u64, E>(failure()))),
            &breaker,
        ),
    );
    assert_eq!(breaker.state(), State::Open, "{full}: after one failure");

    let mut svc = CircuitBreaker::new(inner, &breaker);
    expect_refused(&full, &mut svc);
    Scenario::new(caller, name, svc, breaker_in(&full, breaker, State::Open))
}

/// A call made outside tower, in the two-step form (`try_acquire`, the
/// call, then the permit records a success), wrapped as a service so that
/// it is called and timed as every other row is.
#[derive(Clone)]
struct TwoStep<S> {
    breaker: Breaker,
    inner: S,
}

impl<S> Service<u64> for TwoStep<S>
where
    S: Service<
        u64,
        Response = u64,
        Error = BenchError,
        Future = std::future::Ready<Result<u64, BenchError>>,
    >,
{
    type Response = u64;
    type Error = BenchError;
    type Future = std::future::Ready<Result<u64, BenchError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BenchError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, x: u64) -> Self::Future {
        match self.breaker.try_acquire() {
            Ok(permit) => {
                let answer = self.inner.call(x).into_inner();
                match &answer {
                    Ok(_) => permit.success(),
                    Err(_) => permit.failure(),
                }
                ready(answer)
            }
            Err(open) => ready(Err(open.into())),
        }
    }
}

/// The default breaker, closed, through the two-step form.
fn two_step(caller: Caller) -> Scenario {
    let name = "closed/two_step";
    let full = format!("{}{name}", caller.prefix());
    let breaker = Breaker::new(Config::default());
    let mut svc = TwoStep {
        breaker: breaker.clone(),
        inner: inner(),
    };
    expect_served(&full, &mut svc);
    Scenario::new(caller, name, svc, breaker_in(&full, breaker, State::Closed))
}

/// This crate and the peers, closed and open, with a typed error and with
/// `BoxError`, called by `caller`.
fn breaker_rows(caller: Caller) -> Vec<Scenario> {
    let fail_fast = Readiness::FailFast;
    let ours = vec![
        closed(
            caller,
            "closed/consecutive",
            Config::default(),
            fail_fast,
            inner(),
        ),
        closed(
            caller,
            "closed/gate",
            Config::default(),
            Readiness::Gate,
            inner(),
        ),
        closed(
            caller,
            "closed/count_window",
            config("closed/count_window", CountWindow::new(5, 20)),
            fail_fast,
            inner(),
        ),
        time_window(caller),
        closed(
            caller,
            "closed/slow_calls",
            config("closed/slow_calls", SlowCalls::new(Duration::from_secs(1))),
            fail_fast,
            inner(),
        ),
        closed(
            caller,
            "closed/adaptive",
            config("closed/adaptive", Adaptive::new()),
            fail_fast,
            inner(),
        ),
        two_step(caller),
        rejected(caller, "rejected", inner(), || BenchError::Failed),
    ];
    let boxed = vec![
        Scenario::new(caller, "boxed/bare", inner_boxed(), |_| {}),
        closed(
            caller,
            "boxed/closed/consecutive",
            Config::default(),
            fail_fast,
            inner_boxed(),
        )
        .over("boxed/bare"),
        closed(
            caller,
            "boxed/closed/gate",
            Config::default(),
            Readiness::Gate,
            inner_boxed(),
        )
        .over("boxed/bare"),
        rejected(caller, "boxed/rejected", inner_boxed(), || {
            BoxError::from("down")
        })
        .over("boxed/bare"),
    ];
    let bare = Scenario::new(caller, "bare", inner(), |_| {});
    std::iter::once(bare)
        .chain(ours.into_iter().map(|row| row.over("bare")))
        .chain(peers::closed(
            caller,
            "peer/closed",
            inner,
            "bare",
            "closed/consecutive",
        ))
        .chain(peers::rejected(caller, "peer/rejected", "bare", "rejected"))
        .chain(floor::rows(caller))
        .chain(boxed)
        .chain(peers::closed(
            caller,
            "boxed/peer/closed",
            inner_boxed,
            "boxed/bare",
            "boxed/closed/consecutive",
        ))
        .collect()
}

/// The default breaker with a time window of 10 s, closed.
fn time_window(caller: Caller) -> Scenario {
    let name = "closed/time_window";
    let policy = TimeWindow::new(Duration::from_secs(10));
    closed(
        caller,
        name,
        config(name, policy),
        Readiness::FailFast,
        inner(),
    )
}

/// The rows of the callers that exist to check the others (`Caller::Hand`,
/// `Caller::BlockOn`): the bare service; this crate closed (default and
/// time window), open, and closed with `BoxError` (over `boxed/bare`);
/// each peer closed and forced open; the floor closed and open. Each is
/// also an async and a stack-pinned row, under the same name.
fn agreement_rows(caller: Caller) -> Vec<Scenario> {
    const ROWS: [&str; 8] = [
        "bare",
        "closed/consecutive",
        "closed/time_window",
        "rejected",
        "floor/closed",
        "floor/rejected",
        "boxed/bare",
        "boxed/closed/consecutive",
    ];
    let prefix = caller.prefix();
    breaker_rows(caller)
        .into_iter()
        .filter(|row| {
            let name = row.name.strip_prefix(prefix).unwrap_or(&row.name);
            ROWS.contains(&name) || name.starts_with("peer/")
        })
        .collect()
}

/// A clone per request (`Caller::Oneshot`), or a clone dropped at once
/// (`Caller::CloneDrop`): the bare service, a service holding one `Arc`
/// (the unit), this crate closed (default policy), a keyed service, the
/// floor, and each peer closed.
fn clone_rows(caller: Caller) -> Vec<Scenario> {
    const OURS: &str = "tower-circuit-breaker";
    let arc = ArcRoundTrip {
        shared: Arc::new(0),
    };
    // Four keys of a registry of 1,000: a clone made for one request
    // remembers none of them, so each request asks the registry.
    let mut keyed = KeyedLayer::new(registry_of(1_000), |req: &u64| req % 4).layer(inner());
    expect_served(&format!("{}keyed", caller.prefix()), &mut keyed);

    vec![
        Scenario::new(caller, "bare", inner(), |_| {}),
        Scenario::new(caller, "reference/arc", arc, |_| {}).over("bare"),
        closed(
            caller,
            OURS,
            Config::default(),
            Readiness::FailFast,
            inner(),
        )
        .over("bare"),
        Scenario::new(caller, "keyed/1k_keys/4_keys", keyed, |_| {})
            .over("bare")
            .versus(OURS),
        floor::closed(caller, "floor").over("bare").versus(OURS),
    ]
    .into_iter()
    .chain(peers::closed(caller, "peer", inner, "bare", OURS))
    .collect()
}

/// For scale, stack-pinned: `tower::load_shed` and `tower::timeout`, the
/// reference-count round trip, and a read of tokio's clock.
fn references() -> Vec<Scenario> {
    let mut load_shed = LoadShed::new(inner());
    expect_served("reference/load_shed", &mut load_shed);
    let mut timeout = Timeout::new(inner(), HOUR);
    expect_served("reference/timeout", &mut timeout);
    let stack = Caller::Stack;
    vec![
        // Both accept any inner error that converts into `BoxError`, so they
        // wrap the very inner service the breaker rows use; their own error
        // type is `BoxError`, which matters only on failure.
        Scenario::new(stack, "reference/load_shed", load_shed, |_| {}),
        Scenario::new(stack, "reference/timeout", timeout, |_| {}),
        Scenario::new(
            stack,
            "reference/arc_round_trip",
            ArcRoundTrip {
                shared: Arc::new(0),
            },
            |_| {},
        ),
        Scenario::new(
            stack,
            "reference/clock_read",
            service_fn(|x: u64| {
                black_box(tokio::time::Instant::now());
                ready(Ok::<u64, BenchError>(x))
            }),
            |_| {},
        ),
    ]
    .into_iter()
    .map(|row| row.over("bare"))
    .collect()
}
