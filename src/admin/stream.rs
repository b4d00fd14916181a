//! `GET /events`: transitions as server-sent events, pushed as they are
//! announced, each client reading from a bounded buffer of its own.

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State as Shared};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::future::{select, Either};
use futures_util::stream::{self, Stream};
use http::header::X_CONTENT_TYPE_OPTIONS;
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::{sleep_until, Instant};

use super::json;
use super::source::Feed;
use super::Admin;
use crate::events::Transition;

/// How soon a browser reconnects after the stream ends (a client that
/// fell behind is dropped and comes back).
const RECONNECT: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    prefix: Option<String>,
}

/// `GET /events`.
pub(super) async fn events(
    Shared(admin): Shared<Arc<Admin>>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let prefix = match query {
        Ok(Query(query)) => query.prefix.unwrap_or_default(),
        Err(rejection) => return json::error(StatusCode::BAD_REQUEST, rejection.body_text()),
    };
    // Subscribed before the answer leaves: a client that has the answer's
    // head misses no transition made after it.
    let live = Live {
        feed: admin.source.subscribe(),
        prefix,
        keep_alive: admin.keep_alive,
        quiet_until: None,
    };
    let mut response = Sse::new(transitions(live)).into_response();
    response
        .headers_mut()
        .insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// One client's stream.
struct Live {
    feed: Feed,
    prefix: String,
    keep_alive: Option<Duration>,
    /// When a keep-alive comment is due, if nothing is sent before.
    quiet_until: Option<Instant>,
}

/// What the stream waited for.
enum Next {
    Received(Result<Transition, RecvError>),
    Quiet,
}

/// The events: a first one that sets the reconnection delay, then each
/// transition of the source whose breaker's name starts with the prefix; a
/// `lagged` event, and the end, for a client that fell behind.
fn transitions(live: Live) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let hello = Event::default()
        .retry(RECONNECT)
        .comment("transitions follow");
    let rest = stream::unfold(Some(live), |live| async move {
        let mut live = live?;
        loop {
            let next = {
                let received = pin!(live.feed.receiver.recv());
                match live.keep_alive {
                    None => Next::Received(received.await),
                    Some(every) => {
                        let due = *live
                            .quiet_until
                            .get_or_insert_with(|| Instant::now() + every);
                        match select(received, pin!(sleep_until(due))).await {
                            Either::Left((received, _)) => Next::Received(received),
                            Either::Right(_) => Next::Quiet,
                        }
                    }
                }
            };
            let event = match next {
                Next::Quiet => Event::default().comment("keep-alive"),
                Next::Received(Ok(t))
                    if live.feed.is_ours(&t) && t.breaker.starts_with(&live.prefix) =>
                {
                    transition(&t)
                }
                Next::Received(Ok(_)) => continue,
                // Further behind than its buffer: the breakers never wait
                // for a reader, so this one is dropped, and told why.
                Next::Received(Err(RecvError::Lagged(missed))) => {
                    return Some((Ok(lagged(missed)), None));
                }
                // The registry is gone: nothing more will come.
                Next::Received(Err(RecvError::Closed)) => return None,
            };
            live.quiet_until = None;
            return Some((Ok(event), Some(live)));
        }
    });
    futures_util::StreamExt::chain(stream::iter([Ok(hello)]), rest)
}

fn transition(t: &Transition) -> Event {
    match json::to_json(t) {
        Ok(data) => Event::default().event("transition").data(data),
        // A transition always serializes; were it not to, the client still
        // learns that something changed.
        Err(_) => Event::default().event("transition").data("{}"),
    }
}

fn lagged(missed: u64) -> Event {
    #[derive(Serialize)]
    struct Lagged {
        missed: u64,
    }
    let data = json::to_json(&Lagged { missed }).unwrap_or_default();
    Event::default().event("lagged").data(data)
}
