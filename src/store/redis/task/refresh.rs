//! Refreshes: the shards' versions, then the indexes of the shards whose
//! version moved, a page at a time.

use super::*;

impl Task {
    /// One step of a refresh. A refresh reads the shards' versions (one
    /// small read, the check that Redis answers), then the shards whose
    /// version moved, in pages: each step reads one page of every shard
    /// still being read, all in flight at once, so that no exchange grows
    /// with what the index holds, and the task comes back to its writes,
    /// messages and probe locks between pages. The breakers learn what
    /// changed as each shard's read completes.
    pub(super) async fn refresh(&mut self) {
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
    pub(super) async fn read_pages(&mut self, conn: &Conn) -> RedisResult<Vec<(u16, Arc<str>)>> {
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
    pub(super) fn slow_read(&mut self, shards: usize) {
        self.scan_whole = false;
        self.count(|s| &s.slow_reads, 1);
        tracing::debug!(store = "redis", shards, "index read timed out");
    }
}
