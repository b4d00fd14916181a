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
//! of keys and whatever is open: the versions are one small read, a
//! shard's index is read a page (about [`PAGE`](super::script::PAGE) entries) at a time, a
//! batch of writes is at most [`BATCH`] calls. A version check or a write
//! that fails or times out marks Redis unavailable until one succeeds
//! again; a page of the index that is merely slow is read again at the
//! next refresh.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use redis::{RedisError, RedisResult};
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
    attached: mpsc::UnboundedReceiver<Attached>,
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
    /// ends when every handle of it is gone (`attached` closes).
    pub(crate) fn new(
        backend: Backend,
        inner: &Arc<Inner>,
        attached: mpsc::UnboundedReceiver<Attached>,
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
            attached,
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
                attached = self.attached.recv() => match attached {
                    // Every store handle is gone.
                    None => return,
                    Some(attached) => {
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
                // A read in pages goes on at once, once what else is due
                // (writes, messages, probe locks) had its turn.
                next_refresh = if self.scans.is_empty() {
                    Instant::now() + self.timing.refresh
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
        let entry = self
            .entries
            .entry(Arc::clone(&attached.escaped))
            .or_insert_with(|| Entry {
                shard,
                local: LocalBreakers::default(),
            });
        entry.local.breakers.push(attached.breaker);
        if !self.resync && !self.is_down() && self.view.has_read(shard) {
            let reply = self.view.reply(shard, &attached.escaped, Instant::now());
            self.apply(&attached.escaped, reply);
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

    fn mark_down(&mut self, error: &RedisError) {
        // The next exchange connects afresh: a connection that stopped
        // answering (the host behind the address gone without a reset) is
        // never told so, and would time out for as long as the kernel keeps
        // its socket.
        self.conn = None;
        self.check_conn = None;
        self.slow_streak = 0;
        self.scans.clear();
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
            // What the view held may be stale (Redis may even have
            // restarted empty): read everything again, and tell every
            // breaker.
            self.view.clear();
            self.resync = true;
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
    fn drop_queued(&mut self) {
        let dropped = self.queue.take(usize::MAX).len() as u64;
        self.queue.dropped.fetch_add(dropped, Ordering::Relaxed);
        // Counted as seen: the resync after Redis returns covers them.
        self.dropped_seen = self.queue.dropped.load(Ordering::Relaxed);
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
        let sent = self.send(batch, Exchange::Writes).await;
        self.count(|s| if sent { &s.writes } else { &s.failed_writes }, n);
        if !self.is_down() {
            // More may be waiting: come back at once.
            self.queue.notify.notify_one();
        }
    }

    /// One step of a refresh. A refresh reads the shards' versions (one
    /// small read, the check that Redis answers), then the shards whose
    /// version moved, in pages: each step reads one page of every shard
    /// still being read, all in flight at once, so that no exchange grows
    /// with what the index holds, and the task comes back to its writes,
    /// messages and probe locks between pages. The breakers learn what
    /// changed as each shard's read completes.
    async fn refresh(&mut self) {
        let conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => return self.mark_down(&e),
        };
        let mut changed = Vec::new();
        if self.scans.is_empty() {
            let dropped = self.queue.dropped.load(Ordering::Relaxed);
            if dropped != self.dropped_seen {
                self.dropped_seen = dropped;
                self.resync = true;
            }
            let mut check = match self.check_conn().await {
                Ok(conn) => conn,
                Err(e) => return self.mark_down(&e),
            };
            let versions =
                match timeout(self.timing.command_timeout, check.mget(&self.version_keys)).await {
                    Ok(Ok(versions)) => versions,
                    Ok(Err(e)) => return self.mark_down(&e),
                    Err(_) => return self.mark_down(&timed_out()),
                };
            self.mark_up();
            self.scan_whole = true;
            for shard in 0..self.shards {
                match versions.get(usize::from(shard)).and_then(version_of) {
                    Some(version) if !self.view.is_behind(shard, version) => {}
                    // A shard that never changed has nothing in its index:
                    // nothing to read.
                    Some(0) => changed.extend(
                        self.view
                            .install(shard, ShardRead::empty())
                            .into_iter()
                            .map(|name| (shard, name)),
                    ),
                    // Moved, or not a version: read the shard, which says
                    // what it is.
                    _ => self.scans.push(Scan {
                        shard,
                        cursor: 0,
                        read: None,
                    }),
                }
            }
        }
        if !self.scans.is_empty() {
            match self.read_pages(&conn).await {
                Ok(installed) => changed.extend(installed),
                Err(e) => return self.mark_down(&e),
            }
        }
        let done = self.scans.is_empty();
        if done && self.scan_whole {
            self.count(|s| &s.refreshes, 1);
        }
        self.view.prune();
        let now = Instant::now();
        if self.resync && self.view.is_whole() {
            self.resync = false;
            self.sweep(true);
            let names: Vec<(u16, Arc<str>)> = self
                .entries
                .iter()
                .map(|(name, e)| (e.shard, Arc::clone(name)))
                .collect();
            for (shard, name) in names {
                let reply = self.view.reply(shard, &name, now);
                self.apply(&name, reply);
            }
            return;
        }
        // Once a refresh is over, open keys whose breakers here follow
        // nothing (held by an operator, or closed here in that generation)
        // are told again, as later news would: an operator's release lets
        // them follow.
        let idle: Vec<(u16, Arc<str>)> = if done {
            self.view
                .open()
                .filter(|(_, name)| {
                    self.entries
                        .get(*name)
                        .is_some_and(|e| e.local.next_probe.is_none())
                })
                .map(|(s, n)| (s, Arc::clone(n)))
                .collect()
        } else {
            Vec::new()
        };
        for (shard, name) in changed.into_iter().chain(idle) {
            if self.entries.contains_key(&name) {
                let reply = self.view.reply(shard, &name, now);
                self.apply(&name, reply);
            }
        }
    }

    /// Reads the next page of every shard being read, all in flight at
    /// once, under one command timeout; installs the shards whose last
    /// page came, and returns the breakers whose state changed. A page
    /// that is merely slow ends the shard's read, which the next refresh
    /// makes again: Redis answered the versions in time, and is not
    /// down. An error about the shard's data skips it; any other error is
    /// returned (Redis is down).
    async fn read_pages(&mut self, conn: &Conn) -> RedisResult<Vec<(u16, Arc<str>)>> {
        let scans = std::mem::take(&mut self.scans);
        let calls: Vec<_> = scans
            .iter()
            .map(|scan| {
                let shard = &self.shard_keys[usize::from(scan.shard)];
                read_invocation(&self.scripts, shard, scan.cursor)
            })
            .collect();
        let reads = calls.iter().map(|call| {
            let mut conn = conn.clone();
            async move { conn.invoke(call).await }
        });
        let Ok(replies) = timeout(self.timing.command_timeout, join_all(reads)).await else {
            self.slow_read(scans.len());
            return Ok(Vec::new());
        };
        let at = Instant::now();
        let mut changed = Vec::new();
        let mut slow = 0;
        for (scan, reply) in scans.into_iter().zip(replies) {
            let shard = scan.shard;
            match reply.map(|v| ShardRead::parse(&v, at).ok_or(v)) {
                Ok(Ok((page, cursor))) => {
                    let read = match scan.read {
                        Some(mut read) => {
                            read.extend(page);
                            read
                        }
                        None => page,
                    };
                    if cursor != 0 {
                        self.scans.push(Scan {
                            shard,
                            cursor,
                            read: Some(read),
                        });
                        continue;
                    }
                    self.count(|s| &s.index_reads, 1);
                    self.count(|s| &s.key_errors, read.unreadable);
                    changed.extend(
                        self.view
                            .install(shard, read)
                            .into_iter()
                            .map(|name| (shard, name)),
                    );
                }
                Ok(Err(v)) => return Err(garbage(&format!("{v:?}"))),
                // The connection's own response timeout: slow, as above.
                Err(e) if e.is_timeout() => slow += 1,
                Err(e) if concerns_one_key(&e) => {
                    tracing::debug!(store = "redis", shard, error = %e, "unusable index shard");
                    self.count(|s| &s.key_errors, 1);
                    self.scan_whole = false;
                }
                Err(e) => return Err(e),
            }
        }
        if slow > 0 {
            self.slow_read(slow);
        }
        Ok(changed)
    }

    /// `shards` shards' reads that took longer than the command timeout.
    fn slow_read(&mut self, shards: usize) {
        self.scan_whole = false;
        self.count(|s| &s.slow_reads, 1);
        tracing::debug!(store = "redis", shards, "index read timed out");
    }

    /// Tries the probe lock of every key whose time has come.
    async fn probe_due(&mut self) {
        if self.is_down() {
            // The holds run out by themselves; local breakers probe.
            for name in self.scheduled.take_all() {
                if let Some(entry) = self.entries.get_mut(&name) {
                    entry.local.next_probe = None;
                }
            }
            return;
        }
        let now = Instant::now();
        let lease_ms = millis(self.timing.lease);
        let due = self.scheduled.take_due(now);
        let mut batch = Vec::with_capacity(due.len());
        for name in due {
            let Some(entry) = self.entries.get_mut(&name) else {
                continue;
            };
            entry.local.next_probe = None;
            // A key whose breakers are all gone would hold the lock with
            // nothing to probe.
            if !entry.local.prune() {
                continue;
            }
            batch.push(Write {
                key: name,
                op: Op::Probe,
                args: Args {
                    lease_ms,
                    ..Args::default()
                },
            });
        }
        // In batches, as queued writes are: a round of many keys ending at
        // once (a fleet with a thousand keys open) is no one exchange.
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(BATCH));
            if !self.send(batch, Exchange::ProbeLocks).await {
                if !self.is_down() {
                    // Slow: the keys not yet sent try again shortly.
                    let again = Instant::now() + self.timing.command_timeout;
                    for write in rest {
                        if let Some(entry) = self.entries.get_mut(&write.key) {
                            entry.local.next_probe = Some(again);
                            self.reschedule(&write.key);
                        }
                    }
                }
                return;
            }
            batch = rest;
        }
    }

    /// Carries out `batch`, every call in flight at once, and applies the
    /// answers; false if any failed (and Redis is marked down), or, for
    /// probe-lock attempts, if any was not answered in time.
    ///
    /// A fleet's instances race for the probe locks of the keys whose open
    /// periods end together, every instance at once: M instances times the
    /// keys due, a burst that can keep a busy Redis from answering a batch
    /// within the timeout while it is anything but down. A lock attempt not
    /// answered in time is therefore counted as slow
    /// ([`StoreStats::slow_lock_rounds`](super::StoreStats::slow_lock_rounds))
    /// and not retried: the key's local breaker keeps its hold, learns of
    /// the winner's probe by pub/sub, and probes on its own if the hold runs
    /// out first (should the attempt have won the lock after all, the lease
    /// frees it). Whether Redis is down, the next version check says.
    async fn send(&mut self, batch: Vec<Write>, exchange: Exchange) -> bool {
        let locks = exchange == Exchange::ProbeLocks;
        let conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                self.mark_down(&e);
                return false;
            }
        };
        let publish = Publish {
            channel: self.channel.as_deref(),
        };
        let calls: Vec<_> = batch
            .iter()
            .map(|w| {
                let keys = Keys::new(&self.prefix, &w.key, self.shards);
                let names = (
                    publish,
                    &*w.key,
                    self.instance.as_str(),
                    self.voter.as_str(),
                );
                invocation(&self.scripts, &keys, w.op, names, &w.args)
            })
            .collect();
        let futures = calls.iter().map(|call| {
            let mut conn = conn.clone();
            async move { conn.invoke(call).await }
        });
        let replies = match timeout(self.timing.command_timeout, join_all(futures)).await {
            Ok(replies) => replies,
            Err(_) if locks => {
                self.count(|s| &s.slow_lock_rounds, 1);
                return false;
            }
            Err(_) => {
                self.slow_or_down().await;
                return false;
            }
        };
        let mut answered = Vec::with_capacity(replies.len());
        let mut slow = false;
        for (write, reply) in batch.iter().zip(replies) {
            match reply {
                // The connection's own response timeout, as above.
                Err(e) if e.is_timeout() => slow = true,
                reply => answered.push((
                    Arc::clone(&write.key),
                    reply.and_then(|v| Reply::parse(&v).ok_or_else(|| garbage(&format!("{v:?}")))),
                )),
            }
        }
        if slow && locks {
            self.count(|s| &s.slow_lock_rounds, 1);
        }
        let parsed = match self.sort_replies(answered.into_iter()) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.mark_down(&e);
                return false;
            }
        };
        self.mark_up();
        let now = Instant::now();
        let mut answers = Vec::with_capacity(parsed.len());
        for (name, (reply, version)) in parsed {
            let shard = keys::shard_of(&name, self.shards);
            self.view
                .learn(shard, &name, version, Known::of(reply, now));
            answers.push((name, reply));
        }
        for (name, reply) in settle(answers) {
            self.apply(&name, reply);
        }
        if !slow {
            self.slow_streak = 0;
        } else if !locks {
            self.slow_or_down().await;
        }
        !slow
    }

    /// A batch of writes not answered in time. Redis is down if the
    /// versions, asked on their own connection, are not answered in time
    /// either, or if this is the [`SLOW_STREAK`]th such batch in a row (a
    /// connection gone silent while another still answers); otherwise it
    /// is busy (the fleet's own bursts, an instance's racing for many
    /// locks, a script running long): the batch is counted slow
    /// ([`StoreStats::slow_write_rounds`](super::StoreStats::slow_write_rounds)),
    /// its writes as failed, and the queue goes on. Declaring a busy Redis
    /// down would drop every queued write and make the instance share
    /// again every opening it holds: more load on a Redis already behind.
    async fn slow_or_down(&mut self) {
        self.slow_streak += 1;
        let answered = self.slow_streak < SLOW_STREAK
            && match self.check_conn().await {
                Ok(mut check) => matches!(
                    timeout(self.timing.command_timeout, check.mget(&self.version_keys)).await,
                    Ok(Ok(_))
                ),
                Err(_) => false,
            };
        if answered {
            self.count(|s| &s.slow_write_rounds, 1);
        } else {
            self.mark_down(&timed_out());
        }
    }

    /// The answers to apply. An error that concerns one key (an error
    /// reply, or an answer of the wrong shape: someone else's data under
    /// that key) skips that key and is counted; any other error (the
    /// connection, a timeout, a protocol Redis does not speak) is returned:
    /// Redis is down.
    fn sort_replies<T>(
        &self,
        replies: impl Iterator<Item = (Arc<str>, RedisResult<T>)>,
    ) -> RedisResult<Vec<(Arc<str>, T)>> {
        let mut parsed = Vec::new();
        for (name, reply) in replies {
            match reply {
                Ok(reply) => parsed.push((name, reply)),
                Err(e) if concerns_one_key(&e) => {
                    tracing::debug!(store = "redis", key = %name, error = %e, "unusable state in Redis");
                    self.count(|s| &s.key_errors, 1);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(parsed)
    }

    /// Takes in a message; returns whether a refresh is due.
    fn on_message(&mut self, message: Message) -> bool {
        self.count(|s| &s.messages, 1);
        let now = Instant::now();
        match message {
            Message::Subscribed => return true,
            Message::Open {
                version,
                escaped,
                generation,
                left_ms,
                attempt,
                keep_ms,
            } => {
                let shard = keys::shard_of(&escaped, self.shards);
                let known = Known::Open {
                    generation,
                    attempt,
                    open_until: now + Duration::from_millis(left_ms),
                    kept_until: Some(now + Duration::from_millis(keep_ms)),
                };
                // Older than what the view holds (this instance's own
                // answer came first): already told.
                if self.view.heard(shard, &escaped, version, known) {
                    let reply = Reply::Open {
                        generation,
                        left_ms,
                        attempt,
                    };
                    self.apply(&escaped, reply);
                }
            }
            Message::Close {
                version,
                escaped,
                generation,
            } => {
                let shard = keys::shard_of(&escaped, self.shards);
                if self.view.heard(shard, &escaped, version, Known::Closed) {
                    if let Some(entry) = self.entries.get_mut(escaped.as_str()) {
                        let breakers = entry.local.live();
                        entry.local.close(&breakers, Some(generation), 0);
                        self.reschedule(&escaped);
                    }
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
            self.count(|s| &s.probe_locks_won, 1);
        }
        self.reschedule(escaped);
    }

    /// Keeps `scheduled` in step with the key's next try at the lock.
    fn reschedule(&mut self, escaped: &str) {
        let Some((name, entry)) = self.entries.get_key_value(escaped) else {
            return;
        };
        self.scheduled.set(name, entry.local.next_probe);
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

/// The connection kept in `slot`, made (and kept) if there is none.
async fn kept(slot: &mut Option<Conn>, backend: &Backend, limit: Duration) -> RedisResult<Conn> {
    if let Some(conn) = slot {
        return Ok(conn.clone());
    }
    let conn = backend.connect(limit).await?;
    *slot = Some(conn.clone());
    Ok(conn)
}
