//! The store's background task: it alone talks to Redis (its subscriber
//! aside).
//!
//! It drains the write queue (every write of a batch in flight at once),
//! checks the index shards' versions each refresh interval and reads the
//! shards whose version moved, takes the subscriber's messages, and tries
//! the probe lock when a key's open period ends. What it learns goes into
//! its [`View`] and, where a breaker's state changed, into the local
//! breakers through the `fleet_*` transitions.
//!
//! Every exchange has a timeout, and each is bounded whatever the number
//! of keys and whatever is open: the versions are one small read (one per
//! shard on a Cluster, each under its own timeout), a shard's index is
//! read a page (about [`PAGE`](super::script::PAGE) entries) at a time, a
//! batch of writes is at most [`BATCH`] calls, each under its own
//! timeout. A version check or a write that fails or times out marks
//! Redis unavailable until one succeeds again (on a Cluster, only the
//! shards whose versions then go unanswered); a page of the index that
//! is merely slow is read again at the next refresh.
//!
//! By job: connections and the loop here; `reach` (which shards answer,
//! and Redis down or back), `refresh` (the versions and the index pages),
//! `writes` (the queue and its exchanges), `probe` (the probe lock),
//! `messages` (the subscriber's news, and what any news changes in the
//! local breakers).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::time::{timeout, Instant};

use super::conn::{garbage, timed_out, Backend, Conn};
use super::keys::{self, Keys, Shard};
use super::pubsub::{subscriber, Listen, Message, Source};
use super::schedule::Schedule;
use super::script::{invocation, read_invocation, Publish, Scripts};
use super::view::{version_of, Known, ShardRead, View};
use super::{Inner, StoreEvent};
use crate::breaker::shared::Shared;
use crate::millis::millis;
use crate::store::fleet::{settle, Args, LocalBreakers, Op, Queue, Reply, Write};

mod control;
mod messages;
mod probe;
mod reach;
mod refresh;
mod writes;

pub(crate) use control::Request;

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

/// A shard's index being read, page by page.
struct Scan {
    shard: u16,
    /// Where the next page starts.
    cursor: u64,
    /// The pages read so far.
    read: Option<ShardRead>,
}

/// An attached key: its shard, and its local breakers.
struct Entry {
    shard: u16,
    local: LocalBreakers,
}

pub(crate) struct Task {
    backend: Backend,
    conn: Option<Conn>,
    /// The connection the versions are read on, a connection of their own:
    /// on the other, the versions would wait behind this instance's own
    /// scripts (a burst of probe-lock attempts, a script Redis holds back),
    /// and a busy Redis would read as a down one.
    check_conn: Option<Conn>,
    /// Batches of writes not answered in time since the last that was.
    slow_streak: u32,
    scripts: Scripts,
    inner: Weak<Inner>,
    queue: Arc<Queue>,
    requests: mpsc::UnboundedReceiver<Request>,
    timing: Timing,
    prefix: String,
    instance: String,
    /// Whose failures this instance's count toward a quorum.
    voter: String,
    shards: u16,
    /// The single server's channel; `None` on a Cluster (each shard has
    /// its own).
    channel: Option<String>,
    shard_keys: Vec<Shard>,
    version_keys: Vec<String>,
    events: broadcast::Sender<StoreEvent>,
    entries: HashMap<Arc<str>, Entry>,
    /// Keys whose next try at the probe lock is scheduled, and when.
    scheduled: Schedule,
    view: View,
    /// The shards whose reads are under way; empty between refreshes.
    scans: Vec<Scan>,
    /// Whether every shard of the refresh under way was read.
    scan_whole: bool,
    /// Every attached breaker is to learn the view's state of its key at
    /// the next whole read: at the first, after Redis was unavailable, and
    /// after writes were dropped (an opening among them would otherwise
    /// never be shared).
    resync: bool,
    /// Dropped writes when last looked at.
    dropped_seen: u64,
    /// Entries when they were last swept of breakers gone.
    swept_at: usize,
    /// Whether Redis counts as available; `None` before the first exchange.
    available: Option<bool>,
    /// The shards cut off from the fleet (a Cluster's node not answering
    /// for them), by shard.
    unreachable: Vec<bool>,
    /// The shards back from being cut, whose breakers learn the fleet's
    /// state once the shard has been read again.
    rejoin: Vec<bool>,
}

/// What a batch sent to Redis carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Exchange {
    /// Queued writes: counts, openings, probe results.
    Writes,
    /// Tries at the probe locks of keys whose open periods ended.
    ProbeLocks,
}

/// Batches of writes not answered in time, in a row, that make Redis
/// count as down even while the versions are answered.
const SLOW_STREAK: u32 = 3;

/// Writes carried out in one batch, at most.
const BATCH: usize = 256;

impl Task {
    /// The task of the store `inner`; it holds the store only weakly, and
    /// ends when every handle of it is gone (`requests` closes).
    pub(crate) fn new(
        backend: Backend,
        inner: &Arc<Inner>,
        requests: mpsc::UnboundedReceiver<Request>,
        timing: Timing,
    ) -> Self {
        let shards = inner.shards;
        let shard_keys: Vec<Shard> = (0..shards)
            .map(|s| Shard::new(&inner.prefix, s, shards))
            .collect();
        let channel = (!backend.is_cluster()).then(|| keys::channel(&inner.prefix));
        Task {
            conn: None,
            check_conn: None,
            slow_streak: 0,
            scripts: Scripts::new(),
            inner: Arc::downgrade(inner),
            queue: Arc::clone(&inner.queue),
            requests,
            timing,
            prefix: inner.prefix.clone(),
            instance: inner.instance.clone(),
            voter: inner.voter.clone(),
            shards,
            channel,
            version_keys: shard_keys.iter().map(|s| s.version.clone()).collect(),
            shard_keys,
            events: inner.events.clone(),
            entries: HashMap::new(),
            scheduled: Schedule::default(),
            view: View::new(shards),
            scans: Vec::new(),
            scan_whole: true,
            resync: true,
            dropped_seen: 0,
            swept_at: 0,
            available: None,
            unreachable: vec![false; usize::from(shards)],
            rejoin: vec![false; usize::from(shards)],
            backend,
        }
    }

    fn listen(&self) -> Listen {
        let (source, channels) = match &self.backend {
            Backend::Single(client) => (
                Source::Single(client.clone()),
                vec![keys::channel(&self.prefix)],
            ),
            Backend::Cluster { urls, .. } => (
                Source::Cluster(urls.clone()),
                self.shard_keys.iter().map(|s| s.channel.clone()).collect(),
            ),
        };
        Listen {
            source,
            channels,
            every: self.timing.refresh,
            limit: self.timing.command_timeout,
        }
    }

    pub(crate) async fn run(mut self) {
        let (tx, mut messages) = mpsc::channel(1024);
        let subscriber = tokio::spawn(subscriber(self.listen(), tx));
        let _stop_subscriber = AbortOnDrop(subscriber.abort_handle());
        let mut next_refresh = Instant::now();
        loop {
            let wake = self
                .scheduled
                .next()
                .map_or(next_refresh, |at| at.min(next_refresh));
            tokio::select! {
                request = self.requests.recv() => match request {
                    // Every store handle is gone.
                    None => return,
                    Some(request) => {
                        self.take(request).await;
                        while let Ok(request) = self.requests.try_recv() {
                            self.take(request).await;
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
                // A read in pages goes on at once, once what else is due
                // (writes, messages, probe locks) had its turn.
                next_refresh = if self.scans.is_empty() {
                    Instant::now() + self.refresh_every()
                } else {
                    Instant::now()
                };
            }
            self.probe_due().await;
        }
    }

    /// A breaker attached: it learns its key's state from the view at
    /// once, if the view holds its shard (otherwise at the first read).
    fn add(&mut self, attached: Attached) {
        let shard = keys::shard_of(&attached.escaped, self.shards);
        let known =
            !self.resync && !self.is_down() && !self.is_cut(shard) && self.view.has_read(shard);
        let entry = self
            .entries
            .entry(Arc::clone(&attached.escaped))
            .or_insert_with(|| Entry {
                shard,
                local: LocalBreakers::default(),
            });
        if known {
            let control = self.view.control(shard, &attached.escaped);
            entry.local.join(attached.breaker, control);
            let reply = self.view.reply(shard, &attached.escaped, Instant::now());
            self.apply(&attached.escaped, reply);
        } else {
            let control = entry.local.control;
            entry.local.join(attached.breaker, control);
        }
        self.sweep(false);
    }

    /// Forgets keys whose breakers are all gone: at once with `now`,
    /// otherwise once there are twice as many as after the last sweep (a
    /// registry evicting keys leaves no trail here).
    fn sweep(&mut self, now: bool) {
        if !now && self.entries.len() < self.swept_at.saturating_mul(2).max(64) {
            return;
        }
        self.entries.retain(|_, e| e.local.prune());
        let entries = &self.entries;
        self.scheduled.retain(|name| entries.contains_key(name));
        self.swept_at = self.entries.len();
    }

    /// The connection, made if need be.
    async fn conn(&mut self) -> RedisResult<Conn> {
        kept(&mut self.conn, &self.backend, self.timing.command_timeout).await
    }

    /// The connection the versions are read on, made if need be.
    async fn check_conn(&mut self) -> RedisResult<Conn> {
        kept(
            &mut self.check_conn,
            &self.backend,
            self.timing.command_timeout,
        )
        .await
    }

    fn stats(&self) -> Option<Arc<Inner>> {
        self.inner.upgrade()
    }

    fn count(&self, counter: impl Fn(&super::Stats) -> &std::sync::atomic::AtomicU64, n: u64) {
        if let Some(inner) = self.stats() {
            counter(&inner.stats).fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Whether `error` is about one key's data rather than about Redis.
fn concerns_one_key(error: &RedisError) -> bool {
    use redis::ErrorKind::{CrossSlot, ExecAbortError, ExtensionError, ResponseError, TypeError};
    matches!(
        error.kind(),
        ResponseError | ExtensionError | TypeError | ExecAbortError | CrossSlot
    ) && !error.is_io_error()
        && !error.is_timeout()
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `fut`, given `limit` to answer.
async fn bounded<T>(limit: Duration, fut: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    timeout(limit, fut)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// The connection kept in `slot`, made (and kept) if there is none.
async fn kept(slot: &mut Option<Conn>, backend: &Backend, limit: Duration) -> RedisResult<Conn> {
    if let Some(conn) = slot {
        return Ok(conn.clone());
    }
    let conn = backend.connect(limit).await?;
    *slot = Some(conn.clone());
    Ok(conn)
}
