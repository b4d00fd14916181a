//! Streamed bodies: the cost per data frame of reading a response body
//! through the breaker, beside the bare body, and what the breaker
//! allocates per body and per frame.
//!
//! A streamed completion (server-sent events from an LLM provider) is read
//! frame by frame for as long as the model talks, so the breaker's body
//! wrapper is on a path walked hundreds of times per call, where the call
//! itself is walked once. Each row reads bodies of [`FRAMES`] data frames,
//! each a clone of one `Bytes` holding an OpenAI chat-completion chunk
//! ([`CHUNK`], 133 bytes), answered at once by a `service_fn` with
//! `content-type: text/event-stream`:
//!
//! * `streams/bare`: the inner service's body, read as it comes;
//! * `streams/streaming_http`: through a breaker classifying with
//!   `StreamingHttp::new()`, no stream limits: the body is a `BreakerBody`
//!   that judges the call at its end;
//! * `streams/limits`: with `first_frame_timeout` and `frame_idle_timeout`
//!   too, whose one timer per body is reset on each data frame;
//! * `streams/limits_sse`: with the limits and `StreamingHttp::new().sse_errors()`,
//!   which reads every frame's bytes for an error event. About 9x bare
//!   per frame (the limits alone, about 4.9x); reading a byte at a time
//!   it was about 33x.
//!
//! The body is obtained as users get it, `svc.clone().oneshot(req).await`
//! on a `CircuitBreaker` made by a `CircuitBreakerLayer`, and read with
//! `BodyExt::frame` to its end, inside a current-thread tokio runtime with
//! its timer (the limits make a `Sleep`). The calls are made a batch of
//! bodies at a time, outside the timing; what is timed is reading the
//! batch to the end (the breaker's verdict included, which it records as
//! the last frame passes), so that the figure is per frame, not diluted by
//! the call, and the clock is read once per batch, not per body. The
//! source hands out clones of a static `Bytes` (no allocation, no
//! reference count), so that what differs between rows is the wrapper.
//!
//! Allocations are counted apart from the timed rounds, in two parts: the
//! calls (per body: the response's header map in every row, the limits'
//! timer in theirs) and the reading (per frame). Reading through the
//! breaker must allocate nothing more than the bare body does: every run
//! asserts it, `cargo test --benches` included.

use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use http::{header, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::runtime::Runtime;
use tower::util::ServiceFn;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, State};

use crate::alloc::{counting, Tally};
use crate::scenario::{ratio, Counting, Rounds};

/// Data frames per body.
pub const FRAMES: u32 = 64;

/// Bodies called before a batch is read: enough that the one clock read
/// around a batch weighs nothing per frame, few enough to stay in cache.
const BATCH: usize = 256;

/// One data frame: an OpenAI chat-completion chunk, as it comes.
pub const CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n";

/// A body of `left` data frames, each a clone of `chunk`, that reports its
/// end as hyper's bodies do (`is_end_stream` once the last frame is out).
#[derive(Debug)]
pub struct Chunks {
    chunk: Bytes,
    left: u32,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(u64::from(self.left) * self.chunk.len() as u64)
    }
}

/// The upstream's answer, ready at once.
type Answer = Ready<Result<Response<Chunks>, BoxError>>;

/// The upstream: a `200` event stream of [`FRAMES`] chunks, at once.
fn upstream() -> ServiceFn<impl Fn(Request<()>) -> Answer + Clone> {
    service_fn(|_: Request<()>| {
        let mut response = Response::new(Chunks {
            // Static: a clone is a copy of the pointer, no reference count.
            chunk: Bytes::from_static(CHUNK),
            left: FRAMES,
        });
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        ready(Ok(response))
    })
}

/// What one run of a row took and allocated.
#[derive(Default)]
struct Run {
    /// Reading the bodies to their end.
    reading: Duration,
    /// The calls that made the bodies (counted runs only).
    calls: Tally,
    /// Reading the bodies (counted runs only).
    reads: Tally,
}

/// One run of `bodies` bodies.
type Runner = Box<dyn FnMut(u64, Counting) -> Run>;

/// A row: a service whose responses' bodies are read, and the run that
/// reads them.
pub struct StreamRow {
    pub name: &'static str,
    run: Runner,
}

impl StreamRow {
    /// The row `name`, reading the bodies of `svc`'s responses; `judged`
    /// tells whether a body read to its end has had its call recorded, and
    /// `breaker` (if any) must stay closed with no failure nor cancellation.
    fn new<S, B>(
        name: &'static str,
        runtime: &Rc<Runtime>,
        svc: S,
        judged: fn(&B) -> bool,
        breaker: Option<Breaker>,
    ) -> Self
    where
        S: Service<Request<()>, Response = Response<B>, Error = BoxError> + Clone + 'static,
        B: Body + Unpin + 'static,
        B::Error: fmt::Debug,
    {
        let runtime = Rc::clone(runtime);
        let mut batch = Vec::with_capacity(BATCH);
        let run = move |bodies: u64, count: Counting| {
            let counted = |f: &mut dyn FnMut()| match count {
                Counting::Off => {
                    f();
                    Tally::default()
                }
                Counting::On => counting(f).1,
            };
            let mut run = Run::default();
            let mut left = bodies;
            while left > 0 {
                let n = left.min(BATCH as u64);
                left -= n;
                run.calls = add(
                    run.calls,
                    counted(&mut || {
                        runtime.block_on(async {
                            for _ in 0..n {
                                let response = svc.clone().oneshot(Request::new(())).await;
                                batch.push(response.unwrap_or_else(|e| panic!("{name}: {e}")));
                            }
                        })
                    }),
                );
                let start = Instant::now();
                let reads = counted(&mut || {
                    runtime.block_on(async {
                        for response in batch.iter_mut() {
                            read_to_end(name, response.body_mut()).await;
                        }
                    })
                });
                run.reading += start.elapsed();
                run.reads = add(run.reads, reads);
                for response in batch.drain(..) {
                    assert!(
                        judged(response.body()),
                        "{name}: a body read to its end was not judged"
                    );
                }
            }
            if let Some(breaker) = &breaker {
                let snapshot = breaker.snapshot();
                assert_eq!(snapshot.state, State::Closed, "{name}: breaker after a run");
                assert_eq!(snapshot.counts.failures, 0, "{name}: failures");
                assert_eq!(snapshot.counts.cancelled, 0, "{name}: cancelled calls");
            }
            run
        };
        StreamRow {
            name,
            run: Box::new(run),
        }
    }
}

fn add(a: Tally, b: Tally) -> Tally {
    Tally {
        allocations: a.allocations + b.allocations,
        allocated: a.allocated + b.allocated,
        freed: a.freed + b.freed,
    }
}

/// Reads `body` to its end, checking it gave [`FRAMES`] data frames.
async fn read_to_end<B>(name: &str, body: &mut B)
where
    B: Body + Unpin,
    B::Error: fmt::Debug,
{
    let mut frames = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                black_box(frame);
                frames += 1;
            }
            Err(e) => panic!("{name}: the body failed: {e:?}"),
        }
    }
    assert_eq!(frames, FRAMES, "{name}: frames read");
}

/// The four rows, sharing one current-thread runtime with its timer.
pub fn rows() -> Vec<StreamRow> {
    let runtime = Rc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime"),
    );
    let limits = || {
        Config::builder()
            .name("streams/limits")
            .first_frame_timeout(Some(Duration::from_secs(30)))
            .frame_idle_timeout(Some(Duration::from_secs(10)))
            .build()
            .expect("valid benchmark config")
    };
    let no_limits = Config::builder()
        .name("streams/streaming_http")
        .build()
        .expect("valid benchmark config");

    let layer = CircuitBreakerLayer::new(no_limits).classify(StreamingHttp::new());
    let plain = (layer.breaker(), layer.layer(upstream()));
    let layer = CircuitBreakerLayer::new(limits()).classify(StreamingHttp::new());
    let limited = (layer.breaker(), layer.layer(upstream()));
    let layer = CircuitBreakerLayer::new(limits()).classify(StreamingHttp::new().sse_errors());
    let sse = (layer.breaker(), layer.layer(upstream()));

    vec![
        StreamRow::new("streams/bare", &runtime, upstream(), |_| true, None),
        StreamRow::new(
            "streams/streaming_http",
            &runtime,
            plain.1,
            |body| !body.is_pending(),
            Some(plain.0),
        ),
        StreamRow::new(
            "streams/limits",
            &runtime,
            limited.1,
            |body| !body.is_pending(),
            Some(limited.0),
        ),
        StreamRow::new(
            "streams/limits_sse",
            &runtime,
            sse.1,
            |body| !body.is_pending(),
            Some(sse.0),
        ),
    ]
}

/// Criterion over the rows, one group, each iteration one body: figures
/// per frame through `Throughput::Elements`.
pub fn bench(c: &mut Criterion, rows: &mut [StreamRow]) {
    let mut group = c.benchmark_group("streams");
    group.throughput(Throughput::Elements(u64::from(FRAMES)));
    for row in rows.iter_mut() {
        let id = row.name.strip_prefix("streams/").unwrap_or(row.name);
        group.bench_function(id, |b| {
            b.iter_custom(|bodies| (row.run)(bodies, Counting::Off).reading)
        });
    }
    group.finish();
}

/// Times every row (the minimum and the median over `rounds.rounds` runs
/// of `rounds.calls` frames, the rows taking turns), counts allocations
/// over `rounds.alloc_calls` frames, asserts that the breaker adds none per
/// frame, and prints the table.
pub fn summarize(rows: &mut [StreamRow], rounds: &Rounds) {
    let bodies_of = |frames: u64| frames.div_ceil(u64::from(FRAMES)).max(2);
    let bodies = bodies_of(rounds.calls);
    for row in rows.iter_mut() {
        (row.run)(bodies, Counting::Off);
    }
    let mut runs = vec![Vec::with_capacity(rounds.rounds as usize); rows.len()];
    for _ in 0..rounds.rounds {
        for (row, runs) in rows.iter_mut().zip(&mut runs) {
            runs.push((row.run)(bodies, Counting::Off).reading);
        }
    }
    let counted_bodies = bodies_of(rounds.alloc_calls);
    let counted: Vec<Run> = rows
        .iter_mut()
        .map(|row| (row.run)(counted_bodies, Counting::On))
        .collect();
    let frames = (bodies * u64::from(FRAMES)) as f64;
    let per_frame = |d: Duration| d.as_nanos() as f64 / frames;
    let (ns, median): (Vec<f64>, Vec<f64>) = runs
        .iter_mut()
        .map(|runs| {
            runs.sort_unstable();
            (per_frame(runs[0]), per_frame(runs[runs.len() / 2]))
        })
        .unzip();

    let bare = rows.iter().position(|row| row.name == "streams/bare");
    println!();
    println!(
        "streamed bodies ({}): {FRAMES} frames of {} bytes per body; min (and median) of {} runs \
         x {bodies} bodies; allocations over {counted_bodies} bodies",
        rounds.mode,
        CHUNK.len(),
        rounds.rounds
    );
    println!(
        "ns/frame: reading to the end, the call excluded; x bare: ns/frame over bare's; \
         per body: the call, until the response is in hand"
    );
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>8} {:>12} {:>11} {:>11}",
        "scenario",
        "ns/frame",
        "median",
        "+ns",
        "x bare",
        "allocs/frame",
        "allocs/body",
        "bytes/body"
    );
    let frames_counted = (counted_bodies * u64::from(FRAMES)) as f64;
    for (i, row) in rows.iter().enumerate() {
        let added = bare.map(|b| ns[i] - ns[b]);
        println!(
            "{:<26} {:>9.2} {:>9.2} {:>9} {:>8} {:>12.2} {:>11.2} {:>11.1}",
            row.name,
            ns[i],
            median[i],
            added.map_or(String::new(), |a| format!("{a:.2}")),
            ratio(ns[i], bare.map(|b| ns[b])),
            counted[i].reads.allocations as f64 / frames_counted,
            counted[i].calls.allocations as f64 / counted_bodies as f64,
            counted[i].calls.allocated as f64 / counted_bodies as f64,
        );
    }
    if let Some(b) = bare {
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(
                counted[i].reads.allocations, counted[b].reads.allocations,
                "{}: reading through the breaker allocated ({} over {counted_bodies} bodies, bare {})",
                row.name, counted[i].reads.allocations, counted[b].reads.allocations
            );
        }
    }
}
