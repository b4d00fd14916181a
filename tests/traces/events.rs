//! Transition events. In the traces binary, not with the in-process tests:
//! `tracing` caches whether a call site is enabled globally, so tests
//! running on other threads without a subscriber could hide events from
//! this one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::advance;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};

/// Captures the breaker's tracing events as text, one line each.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn each_transition_emits_exactly_one_event_with_structured_fields() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let breaker = Breaker::new(
        Config::builder()
            .name("upstream")
            .trip(ConsecutiveFailures::new(1))
            .cooldown(Duration::from_secs(10))
            .probes(4)
            .build()
            .unwrap(),
    );
    let upstream = service_fn(|fail: bool| async move {
        if fail {
            Err(BoxError::from("down"))
        } else {
            Ok(())
        }
    });
    let mut svc = CircuitBreaker::new(upstream, &breaker);
    assert!(svc.ready().await.unwrap().call(true).await.is_err());
    advance(Duration::from_secs(10)).await;
    // Many clones observe the elapsed open period at once: one half-open event.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let mut svc = svc.clone();
            tokio::spawn(async move { svc.ready().await?.call(i > 100).await })
        })
        .collect();
    for task in tasks {
        let _ = task.await.unwrap();
    }
    assert_eq!(breaker.state(), State::Closed);

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("circuit breaker opened"), 1, "{text}");
    assert_eq!(count("circuit breaker half-open"), 1, "{text}");
    assert_eq!(count("circuit breaker closed"), 1, "{text}");
    let opened = text.lines().find(|l| l.contains("opened")).unwrap();
    assert!(opened.contains("WARN"), "{opened}");
    for field in [
        "breaker=upstream",
        "from=Closed",
        "to=Open",
        "policy=\"consecutive_failures\"",
        "retry_after_ms=10000",
    ] {
        assert!(opened.contains(field), "missing {field} in {opened}");
    }
}
