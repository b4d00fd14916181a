//! Failover logging. In the traces binary, not with the other failover
//! tests: `tracing` caches whether a call site is enabled globally, so
//! tests running on other threads without a subscriber could hide events
//! from this one.

use std::sync::{Arc, Mutex};

use tower::ServiceExt;

use crate::common::failover as failover_common;
use failover_common::*;

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
