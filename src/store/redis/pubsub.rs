//! The subscriber: hears every opening and closing the fleet publishes,
//! and keeps hearing.
//!
//! On a single server it subscribes to the store's channel on a
//! connection of its own. On a Cluster each index shard publishes on a
//! channel of its own slot (sharded pub/sub, Redis 7), and the subscriber
//! subscribes to every shard's channel through a cluster connection, on
//! whichever node holds each: no node's loss or absence from the URLs
//! given silences it, and the channels of a node that does not answer
//! are tried again every quarter interval (as the task refreshes while a
//! shard is cut off) while the others are heard. Every refresh interval
//! it checks that its
//! connections still answer (`PING`, to every node of a Cluster), and
//! replaces them when they do not, when one drops, or when a Cluster
//! moves a shard's channel away: a subscriber on a connection gone silent
//! would hear nothing and say nothing. Each (re)subscription is passed on:
//! messages may have been missed, and the task looks at the shards'
//! versions.

use std::time::Duration;

use futures_util::future::join_all;
use futures_util::StreamExt;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant, MissedTickBehavior};

/// What the subscriber passes on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// (Re)subscribed: messages may have been missed.
    Subscribed,
    Open {
        /// The shard's version this opening made.
        version: u64,
        escaped: String,
        generation: u64,
        left_ms: u64,
        attempt: u32,
        /// How long the fleet keeps the opening.
        keep_ms: u64,
    },
    Close {
        version: u64,
        escaped: String,
        generation: u64,
    },
    /// An operator's fleet-wide control: `kind` as the index writes it
    /// (`open`, `closed`, `disabled`, `restore`, `reset`).
    Control {
        version: u64,
        escaped: String,
        kind: String,
    },
}

impl Message {
    /// `open <version> <generation> <open ms> <attempt> <keep ms> <name>`,
    /// `close <version> <generation> <name>` or `ctl <version> <kind>
    /// <name>`; anything else is not ours.
    pub(crate) fn parse(payload: &str) -> Option<Message> {
        let mut words = payload.split(' ');
        let kind = words.next()?;
        let version = words.next()?.parse().ok()?;
        if kind == "ctl" {
            let kind = words.next()?;
            if !matches!(kind, "open" | "closed" | "disabled" | "restore" | "reset") {
                return None;
            }
            let message = Message::Control {
                version,
                kind: kind.to_owned(),
                escaped: words.next()?.to_owned(),
            };
            return words.next().is_none().then_some(message);
        }
        let generation = words.next()?.parse().ok()?;
        let message = match kind {
            "open" => {
                let left_ms = words.next()?.parse().ok()?;
                let attempt = words.next()?.parse().ok()?;
                let keep_ms = words.next()?.parse().ok()?;
                Message::Open {
                    version,
                    escaped: words.next()?.to_owned(),
                    generation,
                    left_ms,
                    attempt,
                    keep_ms,
                }
            }
            "close" => Message::Close {
                version,
                escaped: words.next()?.to_owned(),
                generation,
            },
            _ => return None,
        };
        words.next().is_none().then_some(message)
    }
}

/// Where to listen.
pub(crate) enum Source {
    /// One server, its channel.
    Single(redis::Client),
    /// A Cluster (some of its nodes), every shard's channel.
    Cluster(Vec<String>),
}

/// How the subscriber works.
pub(crate) struct Listen {
    pub(crate) source: Source,
    pub(crate) channels: Vec<String>,
    /// How often the connections are checked, and the pause before
    /// trying again after a failure.
    pub(crate) every: Duration,
    /// How long one exchange may take.
    pub(crate) limit: Duration,
}

impl Listen {
    /// How often channels not yet subscribed are tried again: a quarter
    /// of the check interval, at least two exchanges, at most the
    /// interval (the task's refresh while a shard is cut off).
    fn retry_every(&self) -> Duration {
        (self.every / 4).max(self.limit * 2).min(self.every)
    }
}

/// Subscribes, forever: ends only when the task has gone (`messages`
/// closed).
pub(crate) async fn subscriber(listen: Listen, messages: mpsc::Sender<Message>) {
    loop {
        let ended = match &listen.source {
            Source::Single(client) => single(client, &listen, &messages).await,
            Source::Cluster(urls) => cluster(urls, &listen, &messages).await,
        };
        match ended {
            Ended::Gone => return,
            Ended::Lost => tokio::time::sleep(listen.every).await,
            Ended::Reachable => {}
        }
    }
}

/// Why a subscription ended.
enum Ended {
    /// The task has gone.
    Gone,
    /// A connection failed, dropped or went silent, or a channel moved:
    /// subscribed again after a pause.
    Lost,
    /// A node whose channels were pending answers again: subscribed again
    /// at once, on a fresh connection.
    Reachable,
}

/// Passes `payload` on if it is one of ours; whether the task has gone.
async fn pass_on(payload: &[u8], messages: &mpsc::Sender<Message>) -> bool {
    let Some(message) = std::str::from_utf8(payload).ok().and_then(Message::parse) else {
        return false;
    };
    messages.send(message).await.is_err()
}

/// A check every `every`, the first one interval from now.
fn checks(every: Duration) -> tokio::time::Interval {
    let mut check = tokio::time::interval_at(Instant::now() + every, every);
    check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    check
}

/// Listens on one server until its connection fails or goes silent, or
/// the task has gone.
async fn single(
    client: &redis::Client,
    listen: &Listen,
    messages: &mpsc::Sender<Message>,
) -> Ended {
    let Ok(Ok(pubsub)) = timeout(listen.limit, client.get_async_pubsub()).await else {
        return Ended::Lost;
    };
    let (mut sink, mut stream) = pubsub.split();
    if !matches!(
        timeout(listen.limit, sink.subscribe(&listen.channels)).await,
        Ok(Ok(()))
    ) {
        return Ended::Lost;
    }
    if messages.send(Message::Subscribed).await.is_err() {
        return Ended::Gone;
    }
    let mut check = checks(listen.every);
    loop {
        tokio::select! {
            message = stream.next() => match message {
                None => return Ended::Lost,
                Some(message) => {
                    if pass_on(message.get_payload_bytes(), messages).await {
                        return Ended::Gone;
                    }
                }
            },
            _ = check.tick() => {
                let pong = timeout(listen.limit, sink.ping::<Value>()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    // Silent or gone: replaced by a new connection.
                    return Ended::Lost;
                }
            }
        }
    }
}

/// Listens to every shard's channel on a Cluster until a connection
/// fails, drops or goes silent, a channel moves, a node whose channels
/// were pending answers again, or the task has gone.
async fn cluster(urls: &[String], listen: &Listen, messages: &mpsc::Sender<Message>) -> Ended {
    let (pushes, mut heard) = mpsc::unbounded_channel::<PushInfo>();
    let Ok(client) = ClusterClient::builder(urls.iter().map(String::as_str))
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes)
        .connection_timeout(listen.limit)
        .response_timeout(listen.limit)
        .retries(1)
        .build()
    else {
        return Ended::Lost;
    };
    let Ok(Ok(mut conn)) = timeout(listen.limit, client.get_async_connection()).await else {
        return Ended::Lost;
    };
    // Connections made and dropped while learning the cluster's layout
    // tell of it here: they were never subscribed.
    while heard.try_recv().is_ok() {}
    // Channels on a node that does not answer (a master dead until Redis
    // promotes its replica) are tried again at every check; the others
    // are heard meanwhile.
    let mut pending: Vec<&str> = listen.channels.iter().map(String::as_str).collect();
    if subscribe(&conn, &mut pending, listen.limit).await == 0 {
        return Ended::Lost;
    }
    if messages.send(Message::Subscribed).await.is_err() {
        return Ended::Gone;
    }
    let mut check = checks(listen.every);
    // Pending channels are tried again sooner, at the pace of the task's
    // refresh while a shard is cut off: a shard's channel is heard again
    // soon after its replica is promoted, not a whole interval later.
    let mut retry = checks(listen.retry_every());
    loop {
        tokio::select! {
            _ = retry.tick(), if !pending.is_empty() => {
                // One channel tells whether its node answers again. The
                // rest are subscribed on a fresh connection: subscriptions
                // made while the connection is still (re)connecting to the
                // node can land on a connection it drops, and be lost
                // without a word.
                let mut first = vec![pending[0]];
                if subscribe(&conn, &mut first, listen.limit).await > 0 {
                    return Ended::Reachable;
                }
            }
            push = heard.recv() => match push {
                None => return Ended::Lost,
                Some(push) => match push.kind {
                    PushKind::SMessage => {
                        if let [_, Value::BulkString(payload)] = push.data.as_slice() {
                            if pass_on(payload, messages).await {
                                return Ended::Gone;
                            }
                        }
                    }
                    // A node's connection dropped (its subscriptions with
                    // it), or a slot moved and took a channel away.
                    PushKind::Disconnection | PushKind::SUnsubscribe => return Ended::Lost,
                    _ => {}
                },
            },
            _ = check.tick() => {
                // A node is known not to answer: the check below would
                // fail for it until it is replaced.
                if !pending.is_empty() {
                    continue;
                }
                // To every primary: one silent node is enough to replace
                // the whole subscription.
                let pong = timeout(listen.limit, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return Ended::Lost;
                }
            }
        }
    }
}

/// Subscribes to each of `pending` (all at once, each on the node holding
/// its slot) and keeps there those that failed; how many succeeded.
async fn subscribe(conn: &ClusterConnection, pending: &mut Vec<&str>, limit: Duration) -> usize {
    let tries = pending.iter().map(|&channel| {
        let mut conn = conn.clone();
        async move { matches!(timeout(limit, conn.ssubscribe(channel)).await, Ok(Ok(()))) }
    });
    let subscribed = join_all(tries).await;
    let before = pending.len();
    let mut done = subscribed.into_iter();
    pending.retain(|_| !done.next().unwrap_or(false));
    before - pending.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_strictly() {
        assert_eq!(
            Message::parse("open 9 3 500 1 60000 a%3Ab"),
            Some(Message::Open {
                version: 9,
                escaped: "a%3Ab".to_owned(),
                generation: 3,
                left_ms: 500,
                attempt: 1,
                keep_ms: 60_000
            })
        );
        assert!(matches!(
            Message::parse("close 9 3 x"),
            Some(Message::Close {
                version: 9,
                generation: 3,
                ..
            })
        ));
        // The empty name is a name.
        assert!(matches!(
            Message::parse("close 9 3 "),
            Some(Message::Close { ref escaped, .. }) if escaped.is_empty()
        ));
        assert_eq!(
            Message::parse("ctl 12 closed a"),
            Some(Message::Control {
                version: 12,
                escaped: "a".to_owned(),
                kind: "closed".to_owned()
            })
        );
        for garbage in [
            "",
            "ctl 12 explode a",
            "ctl 12 open",
            "ctl x open a",
            "open",
            "open 9 x 1 1 1 a",
            "open 9 3 500 1 a",
            "close 9 3",
            "close 9 3 a b",
            "shut 9 3 a",
        ] {
            assert!(Message::parse(garbage).is_none(), "{garbage:?}");
        }
    }
}
