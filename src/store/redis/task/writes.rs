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
    /// drops them, and so for the writes of shards cut off.
    pub(super) async fn flush(&mut self) {
        if self.is_down() {
            return self.drop_queued();
        }
        let mut batch = self.queue.take(BATCH);
        if batch.is_empty() {
            return;
        }
        let before = batch.len();
        batch.retain(|w| !self.is_cut(keys::shard_of(&w.key, self.shards)));
        let cut = (before - batch.len()) as u64;
        if cut > 0 {
            // Counted as seen: the shard's read when it answers again
            // covers them.
            self.queue.dropped.fetch_add(cut, Ordering::Relaxed);
            self.dropped_seen += cut;
        }
        if !batch.is_empty() {
            let sent = self.send(batch, Exchange::Writes).await;
            self.count(|s| &s.writes, sent.carried);
            self.count(|s| &s.failed_writes, sent.lost);
        }
        if !self.is_down() {
            // More may be waiting: come back at once.
            self.queue.notify.notify_one();
        }
    }

    /// Carries out `batch`, every call in flight at once, each under its
    /// own timeout, and applies the answers.
    ///
    /// A write that fails for a reason other than its key's data says that
    /// Redis is down, or on a Cluster that its shard's node may be: the
    /// shards of such writes are asked their versions at once, those that
    /// do not answer are cut off, and the writes of those that do (the
    /// cluster client had been following a failover or a move) are sent
    /// once more.
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
    pub(super) async fn send(&mut self, batch: Vec<Write>, exchange: Exchange) -> Sent {
        let locks = exchange == Exchange::ProbeLocks;
        let all_lost = Sent {
            carried: 0,
            lost: batch.len() as u64,
        };
        let conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                self.mark_down(&e);
                return all_lost;
            }
        };
        let mut replies = self.exchange(&conn, &batch).await;
        let failed: Vec<usize> = (0..batch.len())
            .filter(|&i| matches!(&replies[i], Err(e) if !e.is_timeout() && !concerns_one_key(e)))
            .collect();
        if let Some(&first) = failed.first() {
            let error = std::mem::replace(&mut replies[first], Err(timed_out()))
                .err()
                .unwrap_or_else(timed_out);
            let shards: Vec<u16> = failed
                .iter()
                .map(|&i| keys::shard_of(&batch[i].key, self.shards))
                .collect();
            self.fail_confirmed(&shards, &error).await;
            if self.is_down() {
                return all_lost;
            }
            let again: Vec<usize> = failed
                .into_iter()
                .filter(|&i| !self.is_cut(keys::shard_of(&batch[i].key, self.shards)))
                .collect();
            let retry: Vec<Write> = again.iter().map(|&i| batch[i].clone()).collect();
            for (i, reply) in again.into_iter().zip(self.exchange(&conn, &retry).await) {
                replies[i] = reply;
            }
        }
        let now = Instant::now();
        let mut sent = Sent {
            carried: 0,
            lost: 0,
        };
        let mut slow = Vec::new();
        let mut heard = false;
        let mut answers = Vec::with_capacity(batch.len());
        for (write, reply) in batch.iter().zip(replies) {
            let shard = keys::shard_of(&write.key, self.shards);
            match reply {
                Ok((reply, version)) => {
                    heard = true;
                    sent.carried += 1;
                    self.view
                        .learn(shard, &write.key, version, Known::of(reply, now));
                    answers.push((Arc::clone(&write.key), reply));
                }
                // The connection's own response timeout, or ours.
                Err(e) if e.is_timeout() => {
                    sent.lost += 1;
                    slow.push(shard);
                }
                // An error reply, or an answer of the wrong shape: someone
                // else's data under that key. That key is skipped.
                Err(e) if concerns_one_key(&e) => {
                    tracing::debug!(store = "redis", key = %write.key, error = %e, "unusable state in Redis");
                    self.count(|s| &s.key_errors, 1);
                    heard = true;
                    sent.lost += 1;
                }
                // Its shard is cut off.
                Err(_) => sent.lost += 1,
            }
        }
        if heard {
            self.mark_up();
        }
        for (name, reply) in settle(answers) {
            self.apply(&name, reply);
        }
        if slow.is_empty() {
            self.slow_streak = 0;
        } else if locks {
            self.count(|s| &s.slow_lock_rounds, 1);
        } else {
            slow.sort_unstable();
            slow.dedup();
            self.slow_or_down(&slow).await;
        }
        sent
    }

    /// Sends `batch`, every call in flight at once, each under its own
    /// command timeout; an answer of the wrong shape is an error about its
    /// key.
    async fn exchange(&self, conn: &Conn, batch: &[Write]) -> Vec<RedisResult<(Reply, u64)>> {
        let limit = self.timing.command_timeout;
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
            async move {
                bounded(limit, conn.invoke(call))
                    .await
                    .and_then(|v| Reply::parse(&v).ok_or_else(|| garbage(&format!("{v:?}"))))
            }
        });
        join_all(futures).await
    }

    /// Writes of `shards` not answered in time. Those shards are cut off
    /// (on a single server, Redis is down) if their versions, asked on
    /// their own connection, are not answered in time either, or if this
    /// is the [`SLOW_STREAK`]th such batch in a row (a connection gone
    /// silent while another still answers); otherwise Redis is busy (the
    /// fleet's own bursts, an instance's racing for many locks, a script
    /// running long): the batch is counted slow
    /// ([`StoreStats::slow_write_rounds`](super::StoreStats::slow_write_rounds)),
    /// its writes as failed, and the queue goes on. Declaring a busy Redis
    /// down would drop every queued write and make the instance share
    /// again every opening it holds: more load on a Redis already behind.
    pub(super) async fn slow_or_down(&mut self, shards: &[u16]) {
        self.slow_streak += 1;
        if self.slow_streak >= SLOW_STREAK {
            return self.fail_slow(shards);
        }
        let (versions, _) = self.versions(shards).await;
        let silent: Vec<u16> = shards
            .iter()
            .zip(&versions)
            .filter_map(|(&shard, v)| v.is_none().then_some(shard))
            .collect();
        if silent.is_empty() {
            self.count(|s| &s.slow_write_rounds, 1);
        } else {
            self.fail_slow(&silent);
        }
    }

    fn fail_slow(&mut self, shards: &[u16]) {
        // On a single server, every shard is the server.
        if self.backend.is_cluster() {
            self.fail(shards, &timed_out());
        } else {
            self.mark_down(&timed_out());
        }
    }
}

/// What became of a batch of writes.
pub(super) struct Sent {
    /// Carried out.
    pub(super) carried: u64,
    /// Not carried out: not answered in time, refused for the key's data,
    /// or not sent (Redis down, the shard cut off).
    pub(super) lost: u64,
}
