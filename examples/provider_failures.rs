//! How a breaker sees a model provider fail, measured: the ways an
//! OpenAI-compatible provider fails (a stream that freezes, a first token
//! that takes 4 s, an error event inside a `200`, the rate-limit and quota
//! signals of OpenAI, Anthropic and Gemini), each sent 20 calls, 4 at a
//! time, through a breaker wired as before (`Config::model_router()`,
//! `StreamingHttp::new()`) and as now (with stream limits, the SSE error
//! judge and a quota hold). It prints a Markdown table of what each wiring
//! counted: calls sent to the provider, the breaker's successes and
//! failures, calls given up, calls refused, the breaker's state and
//! `retry_after()` at the end, and the longest a caller waited.
//!
//! `cargo run --release --example provider_failures --features http-body`
//! (about 30 s: every case runs at once, and the longest is 20 calls given
//! up after 6 s each, 4 at a time).
//!
//! The provider is a hyper server on a free port of 127.0.0.1 (one per case
//! and wiring, counting the calls it receives), stopped when the example
//! ends. The caller is a hyper-util client behind the breaker, with
//! `tower::timeout` (3 s, for the head) inside it, cloned per request; each
//! body is read to its end, or given up after 6 s, as a gateway's own limit
//! would.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::timeout::TimeoutLayer;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{Classify, ClassifyEos, StreamingHttp};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config, State};

/// Calls per case, and how many are in flight at once.
const CALLS: usize = 20;
const AT_ONCE: usize = 4;
/// The client's timeout for a response's head, inside the breaker.
const HEAD_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a caller waits for a whole answer before giving up on it (a
/// gateway's own limit), outside the breaker.
const GIVE_UP: Duration = Duration::from_secs(6);

/// The failures, as paths of the fake provider, with the table's labels.
const CASES: [(&str, &str); 9] = [
    ("/frozen", "1. 200 SSE, first chunk, then frozen"),
    ("/slow-first-token", "2. 200 at once, first token after 4 s"),
    (
        "/anthropic/error-event",
        "3. Anthropic `event: error` mid-stream",
    ),
    (
        "/openai/error-data",
        "3b. OpenAI `data: {\"error\"}` mid-stream",
    ),
    ("/openai/429", "4. 429, `x-ratelimit-reset-requests: 20s`"),
    ("/anthropic/529", "5. 529, `retry-after: 30`"),
    (
        "/anthropic/429",
        "6. 429, `anthropic-ratelimit-requests-reset` +45 s",
    ),
    (
        "/gemini/429",
        "7. 429, Gemini `retryDelay: 52s` in the body",
    ),
    ("/openai/quota", "8. 429 quota spent, `retry-after: 3600`"),
];

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let started = Instant::now();
    let mut runs = Vec::new();
    for (path, _) in CASES {
        runs.push(tokio::spawn(measure(path, false)));
        runs.push(tokio::spawn(measure(path, true)));
    }
    let mut cells = Vec::new();
    for run in runs {
        cells.push(run.await??);
    }

    println!("| case | as before | now |");
    println!("| --- | --- | --- |");
    for ((_, label), pair) in CASES.iter().zip(cells.chunks(2)) {
        println!("| {label} | {} | {} |", pair[0], pair[1]);
    }
    println!();
    println!(
        "{CALLS} calls per case, {AT_ONCE} at a time; as before: `Config::model_router()`, \
         `StreamingHttp::new()`; now: plus `first_frame_timeout(2 s)`, \
         `frame_idle_timeout(1 s)`, `sse_errors()`, `max_quota_hold(1 day)`. \
         \"open\": `retry_after()` when the case's last call ended; \"counted after \
         it opened\": outcomes of calls in flight when it opened. Whole run: {:.1} s.",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs one case against a provider of its own, through a fresh breaker
/// wired as before or as now, and describes what happened.
async fn measure(path: &'static str, now: bool) -> Result<String, BoxError> {
    let (provider, sent) = provider().await?;
    let uri = format!("http://{provider}{path}");
    if now {
        let config = Config::model_router()
            .name("provider")
            .first_frame_timeout(Some(Duration::from_secs(2)))
            .frame_idle_timeout(Some(Duration::from_secs(1)))
            .max_quota_hold(Some(Duration::from_secs(24 * 3600)))
            .build()?;
        run(
            Breaker::new(config),
            StreamingHttp::new().sse_errors(),
            uri,
            sent,
        )
        .await
    } else {
        let config = Config::model_router().name("provider").build()?;
        run(Breaker::new(config), StreamingHttp::new(), uri, sent).await
    }
}

/// What one call came to, as its caller saw it.
#[derive(Default)]
struct Seen {
    refused: usize,
    given_up: usize,
    worst_wait: Duration,
}

async fn run<C, Eos>(
    breaker: Breaker,
    classifier: C,
    uri: String,
    sent: Arc<AtomicUsize>,
) -> Result<String, BoxError>
where
    // The judge at the end of stream as a parameter of its own, not
    // `C::Eos`: a spawned future's `Send` is then provable.
    C: Classify<Response<Incoming>, BoxError, Eos = Eos> + Clone + Send + Sync + 'static,
    Eos: ClassifyEos + Send + 'static,
{
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(classifier))
        .layer(TimeoutLayer::new(HEAD_TIMEOUT))
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());

    // AT_ONCE callers take the next of the CALLS calls until none is left.
    let next = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for _ in 0..AT_ONCE {
        let (client, next, uri) = (client.clone(), next.clone(), uri.clone());
        callers.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            while next.fetch_add(1, Ordering::SeqCst) < CALLS {
                let request = Request::get(&uri).body(Empty::new())?;
                let start = Instant::now();
                // A clone per request, as a server calls its services.
                let call = client.clone().oneshot(request);
                match tokio::time::timeout(GIVE_UP, read_through(call)).await {
                    Err(_) => seen.given_up += 1,
                    Ok(Err(err)) if CircuitOpen::find(err.as_ref()).is_some() => seen.refused += 1,
                    // A failure or a success: the breaker's counts tell which.
                    Ok(_) => {}
                }
                seen.worst_wait = seen.worst_wait.max(start.elapsed());
            }
            Ok::<_, BoxError>(seen)
        }));
    }
    let mut seen = Seen::default();
    for caller in callers {
        let one = caller.await??;
        seen.refused += one.refused;
        seen.given_up += one.given_up;
        seen.worst_wait = seen.worst_wait.max(one.worst_wait);
    }

    let snapshot = breaker.snapshot();
    let counts = snapshot.counts;
    let successes =
        counts.calls - counts.failures - counts.ignored - counts.stale - counts.cancelled;
    let mut cell = vec![format!("{} sent", sent.load(Ordering::SeqCst))];
    if successes > 0 {
        cell.push(several(successes, "success", "successes"));
    }
    cell.push(several(counts.failures, "failure", "failures"));
    if counts.stale > 0 {
        cell.push(format!("{} counted after it opened", counts.stale));
    }
    if seen.given_up > 0 {
        cell.push(format!("{} given up after 6 s", seen.given_up));
    }
    if seen.refused > 0 {
        cell.push(format!("{} refused at once", seen.refused));
    }
    cell.push(match (snapshot.state, breaker.retry_after()) {
        (State::Open, Some(wait)) => format!("open {}", span(wait)),
        (state, _) => state.as_str().replace('_', "-"),
    });
    cell.push(format!("worst wait {:.1} s", seen.worst_wait.as_secs_f64()));
    Ok(cell.join(", "))
}

/// Awaits a call's response and reads its body to the end.
async fn read_through<F, B>(call: F) -> Result<(), BoxError>
where
    F: std::future::Future<Output = Result<Response<B>, BoxError>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    let response = call.await?;
    response.into_body().collect().await.map_err(Into::into)?;
    Ok(())
}

fn several(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// A wait as the table shows it: seconds, or minutes past two.
fn span(wait: Duration) -> String {
    let secs = wait.as_secs_f64();
    if secs < 120.0 {
        format!("{secs:.0} s")
    } else {
        format!("{:.0} min", secs / 60.0)
    }
}

/// Starts the fake provider on a free port of 127.0.0.1; it counts the
/// calls it receives, and runs until the runtime shuts down.
async fn provider() -> Result<(SocketAddr, Arc<AtomicUsize>), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sent = Arc::new(AtomicUsize::new(0));
    let received = sent.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let received = received.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                received.fetch_add(1, Ordering::SeqCst);
                let answer = answer(req.uri().path());
                async move { Ok::<_, Infallible>(answer) }
            });
            tokio::spawn(async move {
                // A connection ends with an error when its caller gives up
                // mid-stream: nothing to report.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, sent))
}

const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";
/// A pause between two chunks, so that each is a frame of its own.
const BEAT: Duration = Duration::from_millis(20);

/// The provider's answer to `path` (see [`CASES`]).
fn answer(path: &str) -> Response<Script> {
    let stream = |chunks: Vec<(Duration, &'static str)>, then_freeze| {
        (
            StatusCode::OK,
            "text/event-stream",
            Script::new(chunks, then_freeze),
        )
    };
    let error = |status: u16, json: &'static str| {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
        (
            status,
            "application/json",
            Script::new(vec![(Duration::ZERO, json)], false),
        )
    };
    let (status, content_type, body) = match path {
        "/frozen" => stream(vec![(Duration::ZERO, TOKEN)], true),
        "/slow-first-token" => stream(
            vec![(Duration::from_secs(4), TOKEN), (BEAT, TOKEN), (BEAT, DONE)],
            false,
        ),
        "/anthropic/error-event" => stream(
            vec![
                (Duration::ZERO, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"),
                (BEAT, "event: er"),
                (BEAT, "ror\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"),
            ],
            false,
        ),
        "/openai/error-data" => stream(
            vec![
                (Duration::ZERO, TOKEN),
                (BEAT, "data: {\"er"),
                (BEAT, "ror\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n"),
                (BEAT, DONE),
            ],
            false,
        ),
        "/openai/429" => error(
            429,
            "{\"error\":{\"message\":\"Rate limit reached for requests\",\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}",
        ),
        "/anthropic/529" => error(
            529,
            "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}",
        ),
        "/anthropic/429" => error(
            429,
            "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Number of requests has exceeded your rate limit\"}}",
        ),
        "/gemini/429" => error(
            429,
            "{\"error\":{\"code\":429,\"message\":\"Resource has been exhausted (e.g. check quota).\",\"status\":\"RESOURCE_EXHAUSTED\",\"details\":[{\"@type\":\"type.googleapis.com/google.rpc.RetryInfo\",\"retryDelay\":\"52s\"}]}}",
        ),
        "/openai/quota" => error(
            429,
            "{\"error\":{\"message\":\"You exceeded your current quota, please check your plan and billing details.\",\"type\":\"insufficient_quota\",\"code\":\"insufficient_quota\"}}",
        ),
        _ => error(404, "{\"error\":{\"message\":\"no such route\"}}"),
    };
    let length = body.length;
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static(content_type));
    if status != StatusCode::OK {
        headers.insert("content-length", HeaderValue::from(length));
    }
    let mut set = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    match path {
        "/openai/429" => {
            set("x-ratelimit-limit-requests", "500".into());
            set("x-ratelimit-remaining-requests", "0".into());
            set("x-ratelimit-reset-requests", "20s".into());
        }
        "/anthropic/529" => set("retry-after", "30".into()),
        "/anthropic/429" => {
            set("anthropic-ratelimit-requests-remaining", "0".into());
            let reset = SystemTime::now() + Duration::from_secs(45);
            set("anthropic-ratelimit-requests-reset", rfc3339(reset));
        }
        "/openai/quota" => set("retry-after", "3600".into()),
        _ => {}
    }
    response
}

/// A provider's body: each chunk after its delay, sent by a task; then the
/// end, or, when made to freeze, silence until the caller goes away.
struct Script {
    chunks: mpsc::Receiver<&'static str>,
    /// The bytes in all: the `content-length` of an error body.
    length: usize,
}

impl Script {
    fn new(chunks: Vec<(Duration, &'static str)>, then_freeze: bool) -> Script {
        let length = chunks.iter().map(|(_, chunk)| chunk.len()).sum();
        let (send, receive) = mpsc::channel(1);
        tokio::spawn(async move {
            for (delay, chunk) in chunks {
                tokio::time::sleep(delay).await;
                if send.send(chunk).await.is_err() {
                    return; // the caller went away
                }
            }
            if then_freeze {
                send.closed().await;
            }
        });
        Script {
            chunks: receive,
            length,
        }
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))))
    }
}

/// `time` as RFC 3339, to the second, in UTC.
fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}
