//! The store's background task: it alone talks to Redis.
//!
//! It drains the write queue (every write of a batch in flight at once on
//! one multiplexed connection), reads back the state of every attached key
//! each refresh interval (and of newly attached keys at once, a burst of
//! them in one round), takes pub/sub messages from the subscriber task,
//! and tries the probe lock when a key's open period ends. Every answer goes
//! back into the local breakers through the `fleet_*` transitions. Every
//! exchange has a timeout; a failed or garbled exchange marks Redis
//! unavailable until one succeeds again.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, RedisResult, Script, ScriptInvocation, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::time::{timeout, Instant};

use super::keys::{self, Keys};
use super::script::{invocation, script};
use super::{Inner, StoreError, StoreEvent};
use crate::breaker::shared::Shared;
use crate::millis::millis;
use crate::store::fleet::{Args, LocalBreakers, Op, Queue, Reply, Write};

/// A breaker to share, sent by [`RedisStore::attach`](super::RedisStore::attach).
pub(crate) struct Attached {
    pub(crate) escaped: Arc<str>,
    pub(crate) breaker: Weak<Shared>,
}

pub(crate) struct Timing {
    pub(crate) refresh: Duration,
    pub(crate) hold: Duration,
    pub(crate) lease: Duration,
    pub(crate) command_timeout: Duration,
}

struct Names {
    prefix: String,
    channel: String,
    instance: String,
}

/// Where Redis is.
pub(crate) enum Backend {
    Single(redis::Client),
    /// The cluster, and its first node for pub/sub (a Cluster delivers every
    /// message to subscribers on any node).
    Cluster(Box<ClusterClient>, redis::Client),
}

impl Backend {
    pub(crate) fn new(
        urls: &[String],
        cluster: bool,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let bad_url = |url: &str, e: RedisError| StoreError::Url {
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let first = urls.first().map(String::as_str).unwrap_or_default();
        let client = redis::Client::open(first).map_err(|e| bad_url(first, e))?;
        if !cluster {
            return Ok(Backend::Single(client));
        }
        for url in urls {
            redis::Client::open(url.as_str()).map_err(|e| bad_url(url, e))?;
        }
        let cluster = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(1)
            .build()
            .map_err(|e| bad_url(first, e))?;
        Ok(Backend::Cluster(Box::new(cluster), client))
    }

    async fn connect(&self, limit: Duration) -> RedisResult<Conn> {
        let attempt = async {
            match self {
                Backend::Single(client) => {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(limit)
                        .set_response_timeout(limit)
                        .set_number_of_retries(1);
                    client
                        .get_connection_manager_with_config(config)
                        .await
                        .map(Conn::Single)
                }
                Backend::Cluster(cluster, _) => cluster
                    .get_async_connection()
                    .await
                    .map(|c| Conn::Cluster(Box::new(c))),
            }
        };
        match timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => Err(timed_out()),
        }
    }

    fn pubsub_client(&self) -> redis::Client {
        match self {
            Backend::Single(client) | Backend::Cluster(_, client) => client.clone(),
        }
    }
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "Redis did not answer in time",
    ))
}

fn garbage(what: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::TypeError,
        "unexpected answer from Redis",
        what.to_owned(),
    ))
}

/// A connection that reconnects by itself; clones share it.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    async fn invoke(&mut self, call: &ScriptInvocation<'_>) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => call.invoke_async(c).await,
            Conn::Cluster(c) => call.invoke_async(c.as_mut()).await,
        }
    }

    async fn pipe(&mut self, pipe: &redis::Pipeline) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => pipe.query_async(c.as_mut()).await,
        }
    }

    async fn ping(&mut self) -> RedisResult<()> {
        let reply: String = match self {
            Conn::Single(c) => redis::cmd("PING").query_async(c).await?,
            Conn::Cluster(c) => redis::cmd("PING").query_async(c.as_mut()).await?,
        };
        if reply == "PONG" {
            Ok(())
        } else {
            Err(garbage(&reply))
        }
    }
}

/// What the subscriber task passes on.
enum Message {
    /// (Re)subscribed: messages may have been missed; refresh.
    Subscribed,
    Open {
        escaped: String,
        generation: u64,
        left_ms: u64,
        attempt: u32,
    },
    Close {
        escaped: String,
        generation: u64,
    },
}

impl Message {
    fn parse(payload: &str) -> Option<Message> {
        let mut words = payload.split(' ');
        let kind = words.next()?;
        let generation = words.next()?.parse().ok()?;
        let message = match kind {
            "open" => {
                let left_ms = words.next()?.parse().ok()?;
                let attempt = words.next()?.parse().ok()?;
                Message::Open {
                    escaped: words.next()?.to_owned(),
                    generation,
                    left_ms,
                    attempt,
                }
            }
            "close" => Message::Close {
                escaped: words.next()?.to_owned(),
                generation,
            },
            _ => return None,
        };
        words.next().is_none().then_some(message)
    }
}

/// Subscribes to the channel, forever: reconnects after a pause whenever
/// the subscription ends.
async fn subscriber(
    client: redis::Client,
    channel: String,
    messages: mpsc::Sender<Message>,
    pause: Duration,
    limit: Duration,
) {
    loop {
        if let Ok(Ok(mut pubsub)) = timeout(limit, client.get_async_pubsub()).await {
            if let Ok(Ok(())) = timeout(limit, pubsub.subscribe(&channel)).await {
                if messages.send(Message::Subscribed).await.is_err() {
                    return;
                }
                let mut stream = pubsub.into_on_message();
                while let Some(msg) = stream.next().await {
                    let Ok(payload) = msg.get_payload::<String>() else {
                        continue;
                    };
                    if let Some(message) = Message::parse(&payload) {
                        if messages.send(message).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// An attached key: its Redis key names, made once, and its local
/// breakers.
struct Entry {
    keys: Keys,
    local: LocalBreakers,
}

pub(crate) struct Task {
    backend: Backend,
    conn: Option<Conn>,
    script: Script,
    inner: Weak<Inner>,
    queue: Arc<Queue>,
    attached: mpsc::UnboundedReceiver<Attached>,
    timing: Timing,
    names: Names,
    events: broadcast::Sender<StoreEvent>,
    entries: HashMap<Arc<str>, Entry>,
    /// Keys attached since the last read of their state.
    fresh: Vec<Arc<str>>,
    /// Whether Redis counts as available; `None` before the first exchange.
    available: Option<bool>,
}

/// Writes carried out in one batch, at most.
const BATCH: usize = 256;

impl Task {
    /// The task of the store `inner`; it holds the store only weakly, and
    /// ends when every handle of it is gone (`attached` closes).
    pub(crate) fn new(
        backend: Backend,
        inner: &Arc<Inner>,
        attached: mpsc::UnboundedReceiver<Attached>,
        timing: Timing,
    ) -> Self {
        Task {
            backend,
            conn: None,
            script: script(),
            inner: Arc::downgrade(inner),
            queue: Arc::clone(&inner.queue),
            attached,
            timing,
            names: Names {
                prefix: inner.prefix.clone(),
                channel: keys::channel(&inner.prefix),
                instance: inner.instance.clone(),
            },
            events: inner.events.clone(),
            entries: HashMap::new(),
            fresh: Vec::new(),
            available: None,
        }
    }

    pub(crate) async fn run(mut self) {
        let (tx, mut messages) = mpsc::channel(1024);
        let subscriber = tokio::spawn(subscriber(
            self.backend.pubsub_client(),
            self.names.channel.clone(),
            tx,
            self.timing.refresh,
            self.timing.command_timeout,
        ));
        let _stop_subscriber = AbortOnDrop(subscriber.abort_handle());
        let mut next_refresh = Instant::now();
        loop {
            let wake = self
                .entries
                .values()
                .filter_map(|e| e.local.next_probe)
                .fold(next_refresh, Instant::min);
            tokio::select! {
                attached = self.attached.recv() => match attached {
                    // Every store handle is gone.
                    None => return,
                    Some(attached) => {
                        // A burst of attachments (a registry warming up)
                        // is read back in one round, not one each.
                        self.add(attached);
                        while let Ok(attached) = self.attached.try_recv() {
                            self.add(attached);
                        }
                    }
                },
                Some(message) = messages.recv() => {
                    if self.on_message(message) {
                        next_refresh = Instant::now();
                    }
                }
                () = self.queue.notify.notified() => self.flush().await,
                () = tokio::time::sleep_until(wake) => {}
            }
            if Instant::now() >= next_refresh {
                self.refresh().await;
                next_refresh = Instant::now() + self.timing.refresh;
            } else if !self.fresh.is_empty() {
                // Only the new keys: the others were read at the last
                // refresh, and messages keep them current.
                let fresh = std::mem::take(&mut self.fresh);
                self.read_back(fresh).await;
            }
            self.probe_due().await;
        }
    }

    fn add(&mut self, attached: Attached) {
        let prefix = &self.names.prefix;
        let entry = self
            .entries
            .entry(Arc::clone(&attached.escaped))
            .or_insert_with(|| Entry {
                keys: Keys::new(prefix, &attached.escaped),
                local: LocalBreakers::default(),
            });
        entry.local.breakers.push(attached.breaker);
        self.fresh.push(attached.escaped);
    }

    /// The connection, made if need be.
    async fn conn(&mut self) -> RedisResult<Conn> {
        if let Some(conn) = &self.conn {
            return Ok(conn.clone());
        }
        let conn = self.backend.connect(self.timing.command_timeout).await?;
        self.conn = Some(conn.clone());
        Ok(conn)
    }

    fn stats(&self) -> Option<Arc<Inner>> {
        self.inner.upgrade()
    }

    fn mark_down(&mut self, error: &RedisError) {
        // The next exchange connects afresh: a connection that stopped
        // answering (the host behind the address gone without a reset) is
        // never told so, and would time out for as long as the kernel keeps
        // its socket.
        self.conn = None;
        if let Some(inner) = self.stats() {
            inner.stats.available.store(false, Ordering::Relaxed);
            if self.available == Some(false) {
                return;
            }
            inner.stats.episodes.fetch_add(1, Ordering::Relaxed);
        }
        self.available = Some(false);
        self.drop_queued();
        tracing::warn!(
            store = "redis",
            error = %error,
            "shared breaker state unavailable: instances run on their local breakers"
        );
        #[cfg(feature = "metrics")]
        crate::metrics::store_unavailable();
        let _ = self.events.send(StoreEvent::Unavailable {
            error: error.to_string(),
        });
    }

    fn mark_up(&mut self) {
        if let Some(inner) = self.stats() {
            inner.stats.available.store(true, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        crate::metrics::store_available(true);
        if self.available.replace(true) == Some(false) {
            tracing::info!(store = "redis", "shared breaker state available again");
            let _ = self.events.send(StoreEvent::Restored);
        }
    }

    fn is_down(&self) -> bool {
        self.available == Some(false)
    }

    /// Drops every queued write, counting them: while Redis is down,
    /// outcomes stay local. (Replayed later, they would reopen the fleet
    /// for an outage that may be over; the resync shares what is still
    /// open instead.)
    fn drop_queued(&self) {
        let dropped = self.queue.take(usize::MAX).len() as u64;
        self.queue.dropped.fetch_add(dropped, Ordering::Relaxed);
    }

    /// Carries out queued writes, a batch at a time; while Redis is down,
    /// drops them.
    async fn flush(&mut self) {
        if self.is_down() {
            return self.drop_queued();
        }
        let batch = self.queue.take(BATCH);
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let sent = self.send(batch).await;
        if let Some(inner) = self.stats() {
            let counter = if sent {
                &inner.stats.writes
            } else {
                &inner.stats.failed_writes
            };
            counter.fetch_add(n, Ordering::Relaxed);
        }
        if sent {
            // More may be waiting: come back at once.
            self.queue.notify.notify_one();
        }
    }

    /// Reads back the state of every attached key, all reads in flight at
    /// once; with no key, checks that Redis answers.
    async fn refresh(&mut self) {
        self.fresh.clear();
        self.entries.retain(|_, e| e.local.prune());
        if self.entries.is_empty() {
            let mut conn = match self.conn().await {
                Ok(conn) => conn,
                Err(e) => return self.mark_down(&e),
            };
            return match timeout(self.timing.command_timeout, conn.ping()).await {
                Ok(Ok(())) => self.mark_up(),
                Ok(Err(e)) => self.mark_down(&e),
                Err(_) => self.mark_down(&timed_out()),
            };
        }
        let names: Vec<Arc<str>> = self.entries.keys().cloned().collect();
        self.read_back(names).await;
    }

    /// Reads back the state of the attached keys `names`, all reads in
    /// flight at once, and applies it; whether Redis answered.
    async fn read_back(&mut self, names: Vec<Arc<str>>) -> bool {
        let conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                self.mark_down(&e);
                return false;
            }
        };
        let mut names: Vec<Arc<str>> = names
            .into_iter()
            .filter(|name| self.entries.contains_key(name))
            .collect();
        // A key attached twice (two breakers of one name) is read once.
        names.sort_unstable();
        names.dedup();
        let futures = names.iter().map(|name| {
            let keys = &self.entries[name].keys;
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET")
                .arg(&keys.record)
                .arg("gen")
                .arg("attempt");
            pipe.cmd("PTTL").arg(&keys.wait);
            pipe.cmd("GET").arg(&keys.failures);
            let mut conn = conn.clone();
            async move { conn.pipe(&pipe).await }
        });
        let replies = match timeout(self.timing.command_timeout, join_all(futures)).await {
            Ok(replies) => replies,
            Err(_) => {
                self.mark_down(&timed_out());
                return false;
            }
        };
        let replies = replies
            .into_iter()
            .map(|r| r.and_then(|v| read_state(&v).ok_or_else(|| garbage(&format!("{v:?}")))));
        let parsed = match self.sort_replies(names.into_iter().zip(replies)) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.mark_down(&e);
                return false;
            }
        };
        self.mark_up();
        if let Some(inner) = self.stats() {
            inner.stats.refreshes.fetch_add(1, Ordering::Relaxed);
        }
        for (name, reply) in parsed {
            self.apply(&name, reply);
        }
        true
    }

    /// Tries the probe lock of every key whose time has come.
    async fn probe_due(&mut self) {
        if self.is_down() {
            // The holds run out by themselves; local breakers probe.
            for entry in self.entries.values_mut() {
                entry.local.next_probe = None;
            }
            return;
        }
        let now = Instant::now();
        let lease_ms = millis(self.timing.lease);
        let batch: Vec<Write> = self
            .entries
            .iter_mut()
            .filter(|(_, e)| e.local.next_probe.is_some_and(|at| at <= now))
            .map(|(name, e)| {
                e.local.next_probe = None;
                Write {
                    key: Arc::clone(name),
                    op: Op::Probe,
                    args: Args {
                        lease_ms,
                        ..Args::default()
                    },
                }
            })
            .collect();
        if batch.is_empty() {
            return;
        }
        self.send(batch).await;
    }

    /// Carries out `batch`, every call in flight at once, and applies the
    /// answers; false (and Redis marked down) if any failed.
    async fn send(&mut self, batch: Vec<Write>) -> bool {
        let conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                self.mark_down(&e);
                return false;
            }
        };
        // An attached key's names are made once; a write may come before
        // its key is attached.
        let keyed: Vec<(Cow<'_, Keys>, &Write)> = batch
            .iter()
            .map(|w| match self.entries.get(&w.key) {
                Some(entry) => (Cow::Borrowed(&entry.keys), w),
                None => (Cow::Owned(Keys::new(&self.names.prefix, &w.key)), w),
            })
            .collect();
        let (channel, instance, script) = (
            self.names.channel.as_str(),
            self.names.instance.as_str(),
            &self.script,
        );
        let futures = keyed.iter().map(|(keys, w)| {
            let mut conn = conn.clone();
            let call = invocation(script, keys, w.op, (channel, &w.key, instance), &w.args);
            async move { conn.invoke(&call).await }
        });
        let replies = match timeout(self.timing.command_timeout, join_all(futures)).await {
            Ok(replies) => replies,
            Err(_) => {
                self.mark_down(&timed_out());
                return false;
            }
        };
        let replies = replies
            .into_iter()
            .map(|r| r.and_then(|v| Reply::parse(&v).ok_or_else(|| garbage(&format!("{v:?}")))));
        let names = batch.iter().map(|w| Arc::clone(&w.key));
        let parsed = match self.sort_replies(names.zip(replies)) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.mark_down(&e);
                return false;
            }
        };
        self.mark_up();
        for (escaped, reply) in parsed {
            self.apply(&escaped, reply);
        }
        true
    }

    /// The answers to apply. An error that concerns one key (an error
    /// reply, or an answer of the wrong shape: someone else's data under
    /// that key) skips that key and is counted; any other error (the
    /// connection, a timeout, a protocol Redis does not speak) is returned:
    /// Redis is down.
    fn sort_replies(
        &self,
        replies: impl Iterator<Item = (Arc<str>, RedisResult<Reply>)>,
    ) -> RedisResult<Vec<(Arc<str>, Reply)>> {
        let mut parsed = Vec::new();
        for (name, reply) in replies {
            match reply {
                Ok(reply) => parsed.push((name, reply)),
                Err(e) if concerns_one_key(&e) => {
                    tracing::debug!(store = "redis", key = %name, error = %e, "unusable state in Redis");
                    if let Some(inner) = self.stats() {
                        inner.stats.key_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(parsed)
    }

    /// Returns whether a refresh is due.
    fn on_message(&mut self, message: Message) -> bool {
        if let Some(inner) = self.stats() {
            inner.stats.messages.fetch_add(1, Ordering::Relaxed);
        }
        match message {
            Message::Subscribed => return true,
            Message::Open {
                escaped,
                generation,
                left_ms,
                attempt,
            } => {
                let reply = Reply::Open {
                    generation,
                    left_ms,
                    attempt,
                };
                self.apply(&escaped, reply);
            }
            Message::Close {
                escaped,
                generation,
            } => {
                if let Some(entry) = self.entries.get_mut(escaped.as_str()) {
                    let breakers = entry.local.live();
                    entry.local.close(&breakers, Some(generation), 0);
                }
            }
        }
        false
    }

    /// Brings the local breakers of `escaped` in line with `reply`.
    fn apply(&mut self, escaped: &str, reply: Reply) {
        let Some(entry) = self.entries.get_mut(escaped) else {
            return;
        };
        if entry
            .local
            .apply(reply, self.timing.hold, self.timing.lease)
        {
            if let Some(inner) = self.inner.upgrade() {
                inner.stats.probe_locks_won.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Whether `error` is about one key's data rather than about Redis.
fn concerns_one_key(error: &RedisError) -> bool {
    use redis::ErrorKind::{ExecAbortError, ExtensionError, ResponseError, TypeError};
    matches!(
        error.kind(),
        ResponseError | ExtensionError | TypeError | ExecAbortError
    ) && !error.is_io_error()
        && !error.is_timeout()
}

/// A key's state from its bulk read: `[[gen, attempt], pttl(wait),
/// failures]`.
fn read_state(value: &Value) -> Option<Reply> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [Value::Array(record), Value::Int(wait), failures] = parts.as_slice() else {
        return None;
    };
    let number = |v: &Value| -> Option<Option<u64>> {
        match v {
            Value::Nil => Some(None),
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok().map(Some),
            Value::Int(i) => u64::try_from(*i).ok().map(Some),
            _ => None,
        }
    };
    let [generation, attempt] = record.as_slice() else {
        return None;
    };
    let failures = number(failures)?.unwrap_or(0);
    match (number(generation)?, number(attempt)?) {
        (None, _) => Some(Reply::Closed { failures }),
        (Some(generation), attempt) => Some(Reply::Open {
            generation,
            left_ms: u64::try_from(*wait).unwrap_or(0),
            attempt: u32::try_from(attempt.unwrap_or(0)).ok()?,
        }),
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_strictly() {
        assert!(matches!(
            Message::parse("open 3 500 1 a%3Ab"),
            Some(Message::Open { generation: 3, left_ms: 500, attempt: 1, ref escaped }) if escaped == "a%3Ab"
        ));
        assert!(matches!(
            Message::parse("close 3 x"),
            Some(Message::Close { generation: 3, .. })
        ));
        for garbage in [
            "",
            "open",
            "open x 1 1 a",
            "close 3",
            "close 3 a b",
            "shut 3 a",
        ] {
            assert!(Message::parse(garbage).is_none(), "{garbage:?}");
        }
    }

    #[test]
    fn bulk_reads_of_the_wrong_shape_are_garbage() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let closed = Value::Array(vec![
            Value::Array(vec![Value::Nil, Value::Nil]),
            Value::Int(-2),
            bulk("2"),
        ]);
        assert_eq!(read_state(&closed), Some(Reply::Closed { failures: 2 }));
        let open = Value::Array(vec![
            Value::Array(vec![bulk("4"), bulk("1")]),
            Value::Int(250),
            Value::Nil,
        ]);
        assert_eq!(
            read_state(&open),
            Some(Reply::Open {
                generation: 4,
                left_ms: 250,
                attempt: 1
            })
        );
        let wrong = Value::Array(vec![Value::Okay, Value::Int(1), Value::Nil]);
        assert_eq!(read_state(&wrong), None);
        let text = Value::Array(vec![
            Value::Array(vec![bulk("four"), bulk("1")]),
            Value::Int(250),
            Value::Nil,
        ]);
        assert_eq!(read_state(&text), None);
    }
}
