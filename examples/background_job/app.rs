//! The background-job example's wiring, which
//! `tests/loopback/outside_tower_examples.rs` runs too: a worker draining a
//! queue of items to a flaky upstream through the breaker's two-step form
//! (`try_acquire`, then the permit records the outcome), with no tower service.
//! What the breaker refuses goes back on the queue, and the worker waits out
//! the refusal's `retry_after` instead of calling.

use std::collections::VecDeque;
use std::time::Duration;

use tower_circuit_breaker::classify::{Classify, HttpClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, Config, ConfigError};

use super::flaky_upstream::{http_client, FlakyUpstream};

/// Failures in a row that open the breaker.
pub const THRESHOLD: u32 = 3;
/// How long the breaker stays open before it lets a probe through.
pub const COOLDOWN: Duration = Duration::from_millis(200);

/// The breaker the worker asks before each item.
pub fn breaker() -> Result<Breaker, ConfigError> {
    Ok(Breaker::new(
        Config::builder()
            .name("indexer")
            .trip(ConsecutiveFailures::new(THRESHOLD))
            .cooldown(COOLDOWN)
            .backoff(1.0)
            .build()?,
    ))
}

/// What happened to one attempt at one item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Sent, and the upstream took it.
    Done(usize),
    /// Sent, and the upstream failed: back on the queue.
    Failed(usize),
    /// Refused by the breaker without sending: back on the queue, the
    /// worker waits this long (in milliseconds).
    Refused(usize, u64),
}

/// Sends items `0..items` to `upstream`, each through `breaker`, until
/// every one is done; `on_attempt` hears of every attempt as it ends.
pub async fn work(
    upstream: &FlakyUpstream,
    breaker: &Breaker,
    items: usize,
    mut on_attempt: impl FnMut(&Attempt),
) -> Vec<Attempt> {
    let client = http_client();
    let classifier = HttpClassifier::new();
    let mut queue: VecDeque<usize> = (0..items).collect();
    let mut attempts = Vec::new();
    while let Some(item) = queue.pop_front() {
        let attempt = match breaker.try_acquire() {
            Err(open) => {
                queue.push_front(item);
                let wait = open.retry_after().max(Duration::from_millis(5));
                tokio::time::sleep(wait).await;
                Attempt::Refused(item, wait.as_millis() as u64)
            }
            Ok(permit) => {
                let result = client
                    .request(upstream.request(&format!("/items/{item}")))
                    .await;
                let verdict = classifier.classify(result.as_ref()).at_head();
                let served = result.is_ok_and(|response| response.status().is_success());
                permit.finish(verdict);
                if served {
                    Attempt::Done(item)
                } else {
                    queue.push_back(item);
                    Attempt::Failed(item)
                }
            }
        };
        on_attempt(&attempt);
        attempts.push(attempt);
    }
    attempts
}
