//! A breaker's whole life against a simulated model provider:
//! closed -> open -> half-open -> open again, longer -> half-open -> closed.
//!
//! `cargo run --example lifecycle`. Time is tokio's paused, virtual clock, so
//! 30 s timeouts and open periods take no real time; story lines start with
//! virtual seconds since the start; `WARN`/`INFO` lines are the breaker's own
//! transition events, printed by a `tracing` subscriber.

use std::cell::Cell;
use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::{advance, sleep, Instant};
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{is_timeout, HttpClassifier};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config};

/// What the simulated provider does with a request.
#[derive(Clone, Copy)]
enum Mode {
    Healthy,   // answers in 0.8 s
    Degraded,  // takes the request and never answers: only a timeout ends it
    Recovered, // answers in 0.8 s again
}

/// Prints the story with virtual timestamps and keeps the tallies.
struct Story {
    start: Instant,
    breaker: Breaker,
    sent: Cell<u32>,
    waited: Cell<u32>,
    refused: Cell<u32>,
}

impl Story {
    fn say(&self, line: impl Display) {
        println!("[{:>6.1}s] {line}", self.start.elapsed().as_secs_f64());
    }

    /// Sends one request through `client` and tells what became of it.
    async fn ask<S>(&self, client: &mut S)
    where
        S: Service<Request<String>, Response = Response<String>, Error = BoxError>,
    {
        let n = self.sent.get() + 1;
        self.sent.set(n);
        let (at, req) = (Instant::now(), Request::new(format!("prompt #{n}")));
        // `ready` first: the breaker decides in `poll_ready` (which never fails
        // because the circuit is open: tower would throw the service away).
        let result = async { client.ready().await?.call(req).await }.await;
        let (took, state) = (at.elapsed().as_secs_f64(), self.breaker.state());
        let line = match result {
            Ok(res) => format!("{} after {took:.1}s; breaker {state:?}", res.status()),
            // The refusal is a typed error, found inside tower's BoxError.
            Err(err) => match CircuitOpen::find(err.as_ref()) {
                Some(open) => {
                    self.refused.set(self.refused.get() + 1);
                    let (s, wait) = (open.state(), open.retry_after());
                    format!("refused at once ({s:?}), retry after {wait:?}")
                }
                None if is_timeout(err.as_ref()) => {
                    self.waited.set(self.waited.get() + 1);
                    format!("no answer, timed out after {took:.1}s; breaker {state:?}")
                }
                None => format!("failed: {err}"),
            },
        };
        self.say(format_args!("call #{n}: {line}"));
    }
}

// Paused time: whenever every task waits on a timer, tokio jumps the clock
// straight to the next one, so a 30 s timeout costs nothing.
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .compact()
        .without_time() // wall-clock time means nothing here
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();

    // The simulated provider: a mode switch and a count of requests it got.
    let mode = Arc::new(Mutex::new(Mode::Healthy));
    let calls = Arc::new(AtomicU32::new(0));
    let provider = {
        let (mode, calls) = (mode.clone(), calls.clone());
        service_fn(move |req: Request<String>| {
            calls.fetch_add(1, SeqCst);
            let mode = *mode.lock().unwrap();
            async move {
                if let Mode::Degraded = mode {
                    std::future::pending::<()>().await; // hold it forever
                }
                sleep(Duration::from_millis(800)).await;
                Ok::<_, BoxError>(Response::new(format!("completion for {}", req.body())))
            }
        })
    };

    // Default trip policy (5 consecutive failures) and backoff (2x).
    let config = Config::builder()
        .name("provider")
        .cooldown(Duration::from_secs(30))
        .max_open(Duration::from_secs(300))
        .probes(1)
        .build()?;
    // HttpClassifier: 5xx, 408, 429 and errors (timeouts) count as failures.
    let layer = CircuitBreakerLayer::new(config).classify(HttpClassifier::new());
    let breaker = layer.breaker(); // a handle to read state and counters from

    // The timeout sits *inside* the breaker: a hang comes back to it as an
    // `Elapsed` error it records as a failure. Outside, the timeout would
    // cancel the breaker's response future and the hang would never count.
    let mut client = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(30))
        .service(provider);
    let mut other = client.clone(); // a second caller sharing the breaker

    let story = Story {
        start: Instant::now(),
        breaker: breaker.clone(),
        sent: Cell::new(0),
        waited: Cell::new(0),
        refused: Cell::new(0),
    };

    story.say("-- provider healthy: calls answer quickly");
    for _ in 0..3 {
        story.ask(&mut client).await;
    }

    story.say("-- provider degraded: each call waits out the 30 s timeout");
    *mode.lock().unwrap() = Mode::Degraded;
    for _ in 0..5 {
        story.ask(&mut client).await;
    }

    story.say("-- breaker open: callers hear at once, the provider hears nothing");
    let before = calls.load(SeqCst);
    for _ in 0..3 {
        story.ask(&mut client).await;
    }
    let new = calls.load(SeqCst) - before;
    story.say(format_args!("provider received {new} calls while open"));

    let wait = breaker.retry_after().unwrap_or_default();
    advance(wait).await;
    let state = breaker.state();
    story.say(format_args!(
        "-- {wait:?} later: breaker {state:?}, one probe may go"
    ));
    // Two callers at once: the first takes the only probe permit (and hangs
    // until the 30 s timeout); the second is refused while it is in flight,
    // told to retry when the probe's own deadline (`probe_timeout`, 60 s) ends.
    tokio::join!(story.ask(&mut client), story.ask(&mut other));
    let (state, wait) = (breaker.state(), breaker.retry_after().unwrap_or_default());
    story.say(format_args!(
        "probe failed: breaker {state:?} again, for {wait:?} (2x)"
    ));

    story.say("-- provider recovers, but the breaker cannot know until it probes");
    *mode.lock().unwrap() = Mode::Recovered;
    story.ask(&mut client).await; // still refused: the open period runs on
    let wait = breaker.retry_after().unwrap_or_default();
    advance(wait).await;
    let state = breaker.state();
    story.say(format_args!("-- {wait:?} later: breaker {state:?}"));
    for _ in 0..3 {
        story.ask(&mut client).await; // the probe closes it, then calls flow
    }

    story.say("-- summary");
    let (waited, refused) = (story.waited.get(), story.refused.get());
    let (got, sent) = (calls.load(SeqCst), story.sent.get());
    story.say(format_args!(
        "{waited} calls waited out the 30 s timeout, {refused} were refused at once, \
         the provider received {got} of {sent}"
    ));
    let snap = breaker.snapshot();
    let c = snap.counts;
    story.say(format_args!(
        "snapshot: {:?}, opened {}x, {} failures, {} rejected, {} probes, {} stale",
        snap.state, c.opened, c.failures, c.rejected, c.probes, c.stale
    ));
    Ok(())
}
