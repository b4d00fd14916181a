//! Writes: the queue drained a batch at a time, every write of a batch in
//! flight at once; slow and failed exchanges.

use super::*;

impl Task {
    /// Drops every queued write, counting them: while Redis is down,
    /// outcomes stay local. (Replayed later, they would reopen the fleet
    /// for an outage that may be over; the resync shares what is still
    /// open instead.)
    pub(super) fn drop_queued(&mut self) {
        let dropped = self.queue.take(usize::MAX).len() as u64;
        self.queue.dropped.fetch_add(dropped, Ordering::Relaxed);
        // Counted as seen: the resync after Redis returns covers them.
        self.dropped_seen = self.queue.dropped.load(Ordering::Relaxed);
    }

    /// Carries out queued writes, a batch at a time; while Redis is down,
    /// drops them.
    pub(super) async fn flush(&mut self) {
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
    pub(super) async fn send(&mut self, batch: Vec<Write>, exchange: Exchange) -> bool {
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
    pub(super) async fn slow_or_down(&mut self) {
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
    pub(super) fn sort_replies<T>(
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
}
