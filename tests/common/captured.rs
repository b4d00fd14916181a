//! Everything this crate says through `tracing` on the test's thread,
//! captured as text.
//!
//! Used by the tests that read it; each uses a part, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::subscriber::NoSubscriber;
use tracing::Dispatch;
use tracing_subscriber::EnvFilter;

/// The text of this crate's events, one line each.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures this crate's events at `level` and above on this thread (a
    /// `#[tokio::test]` runs every task on it) until the guard is dropped.
    /// Only this crate's: other crates' traces (hyper-util's of its
    /// connection pool shows a URI's userinfo) are not the test's to read.
    pub fn start(level: &str) -> (Captured, tracing::subscriber::DefaultGuard) {
        ask_every_subscriber();
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(format!("tower_circuit_breaker={level}")))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// `tracing` caches whether each call site is enabled. While a single
/// subscriber is registered it asks only the thread that reaches a call
/// site first, so a test on a thread without a subscriber (any other test
/// of the binary) can disable the call site for this thread's subscriber
/// too: the event is lost. A second subscriber, registered once and kept
/// for the life of the process, makes `tracing` ask every live subscriber.
fn ask_every_subscriber() {
    static KEPT: OnceLock<Dispatch> = OnceLock::new();
    KEPT.get_or_init(|| Dispatch::new(NoSubscriber::default()));
}
