//! The `redis` and `metrics` features together: an episode of Redis being
//! unavailable is counted once, and the availability gauge follows it. In a
//! test binary of its own: it installs the global recorder.

mod common;
use common::redis as redis_support;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis_support::{eventually, next_event, RedisServer};
use tower_circuit_breaker::store::redis::{RedisStore, StoreEvent};
use tower_circuit_breaker::{Breaker, Config};

/// The store's counter (summed over snapshots) and gauge (latest value).
#[derive(Default)]
struct Seen {
    unavailable_total: u64,
    available: Option<f64>,
}

impl Seen {
    fn update(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            match (key.key().name(), value) {
                ("circuit_breaker_store_unavailable_total", DebugValue::Counter(n)) => {
                    self.unavailable_total += n;
                }
                ("circuit_breaker_store_available", DebugValue::Gauge(g)) => {
                    self.available = Some(g.into_inner());
                }
                _ => {}
            }
        }
    }
}

#[tokio::test]
async fn an_unavailable_episode_is_counted_once_and_the_gauge_follows() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    let mut seen = Seen::default();

    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("metrics")
        .refresh_interval(Duration::from_millis(50))
        .command_timeout(Duration::from_millis(100))
        .hold(Duration::from_millis(350))
        .build()
        .unwrap();
    let breaker = Breaker::new(Config::builder().name("llm").build().unwrap());
    store.attach(&breaker);
    let mut events = store.subscribe();
    eventually("the store's first refresh", || store.stats().refreshes > 0).await;
    seen.update(&snapshotter);
    assert_eq!(seen.available, Some(1.0));
    assert_eq!(seen.unavailable_total, 0);

    server.kill();
    assert!(matches!(
        next_event(&mut events).await,
        StoreEvent::Unavailable { .. }
    ));
    // Many failed refreshes later, still one episode.
    tokio::time::sleep(Duration::from_millis(500)).await;
    seen.update(&snapshotter);
    assert_eq!(seen.unavailable_total, 1);
    assert_eq!(seen.available, Some(0.0));
    assert_eq!(store.stats().unavailable_episodes, 1);

    server.restart();
    assert_eq!(next_event(&mut events).await, StoreEvent::Restored);
    seen.update(&snapshotter);
    assert_eq!(seen.available, Some(1.0));
    assert_eq!(seen.unavailable_total, 1);
}
