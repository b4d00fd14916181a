//! Refreshes: the shards' versions, then the indexes of the shards whose
//! version moved, a page at a time.

use super::*;
use crate::store::redis::view::controlled_name;

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
            let all: Vec<u16> = (0..self.shards).collect();
            let (versions, error) = self.versions(&all).await;
            let silent: Vec<u16> = all
                .iter()
                .zip(&versions)
                .filter_map(|(&shard, v)| v.is_none().then_some(shard))
                .collect();
            let error = error.unwrap_or_else(timed_out);
            if silent.len() == all.len() {
                return self.mark_down(&error);
            }
            self.mark_up();
            self.fail(&silent, &error);
            let answered: Vec<u16> = all
                .iter()
                .zip(&versions)
                .filter_map(|(&shard, v)| v.is_some().then_some(shard))
                .collect();
            self.reached(&answered);
            self.scan_whole = silent.is_empty();
            for (shard, version) in all.into_iter().zip(versions) {
                let Some(version) = version else { continue };
                match version_of(&version) {
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
            let installed = self.read_pages(&conn).await;
            if self.is_down() {
                return;
            }
            changed.extend(installed);
        }
        let done = self.scans.is_empty();
        if done && self.scan_whole {
            self.count(|s| &s.refreshes, 1);
        }
        self.view.prune();
        let now = Instant::now();
        self.rejoin_read(now);
        if self.resync && self.view_whole() {
            self.resync = false;
            self.sweep(true);
            let names: Vec<(u16, Arc<str>)> = self
                .entries
                .iter()
                .map(|(name, e)| (e.shard, Arc::clone(name)))
                .collect();
            for (shard, name) in names {
                self.apply_control(&name);
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
        // Controls first: a hold's end lets the breakers follow the
        // fleet's state that comes with it.
        changed.sort_by_key(|(_, name)| controlled_name(name).is_none());
        for (shard, name) in changed.into_iter().chain(idle) {
            self.apply_change(shard, &name, now);
        }
    }

    /// Reads the next page of every shard being read, all in flight at
    /// once, each under its own command timeout; installs the shards whose
    /// last page came, and returns the breakers whose state changed. A
    /// page that is merely slow ends the shard's read, which the next
    /// refresh makes again: Redis answered the versions in time, and is
    /// not down. An error about the shard's data skips it; after any other
    /// error Redis is down (on a Cluster: the shards that then do not
    /// answer their versions).
    pub(super) async fn read_pages(&mut self, conn: &Conn) -> Vec<(u16, Arc<str>)> {
        let scans = std::mem::take(&mut self.scans);
        let limit = self.timing.command_timeout;
        let calls: Vec<_> = scans
            .iter()
            .map(|scan| {
                let shard = &self.shard_keys[usize::from(scan.shard)];
                read_invocation(&self.scripts, shard, scan.cursor)
            })
            .collect();
        let reads = calls.iter().map(|call| {
            let mut conn = conn.clone();
            async move { bounded(limit, conn.invoke(call)).await }
        });
        let replies = join_all(reads).await;
        let at = Instant::now();
        let mut changed = Vec::new();
        let mut slow = 0;
        let mut failed = Vec::new();
        let mut error = None;
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
                // A Redis that answers in a protocol it should not.
                Ok(Err(v)) => {
                    failed.push(shard);
                    error = Some(garbage(&format!("{v:?}")));
                }
                Err(e) if e.is_timeout() => slow += 1,
                Err(e) if concerns_one_key(&e) => {
                    tracing::debug!(store = "redis", shard, error = %e, "unusable index shard");
                    self.count(|s| &s.key_errors, 1);
                    self.scan_whole = false;
                }
                Err(e) => {
                    failed.push(shard);
                    error = Some(e);
                }
            }
        }
        if slow > 0 {
            self.slow_read(slow);
        }
        if let Some(error) = error {
            self.fail_confirmed(&failed, &error).await;
        }
        changed
    }

    /// `shards` shards' reads that took longer than the command timeout.
    pub(super) fn slow_read(&mut self, shards: usize) {
        self.scan_whole = false;
        self.count(|s| &s.slow_reads, 1);
        tracing::debug!(store = "redis", shards, "index read timed out");
    }
}

impl Task {
    /// The versions of `shards` (`None` where not answered in time), read
    /// on the versions' own connection, and the last error. On a single
    /// server, one `MGET`; on a Cluster, one `GET` per shard, all in
    /// flight at once, each under its own timeout, so that one node's
    /// silence costs its own shards alone.
    pub(super) async fn versions(
        &mut self,
        shards: &[u16],
    ) -> (Vec<Option<Value>>, Option<RedisError>) {
        let check = match self.check_conn().await {
            Ok(conn) => conn,
            Err(e) => return (vec![None; shards.len()], Some(e)),
        };
        let limit = self.timing.command_timeout;
        let keys: Vec<&str> = shards
            .iter()
            .map(|&s| self.version_keys[usize::from(s)].as_str())
            .collect();
        if !self.backend.is_cluster() {
            let mut check = check;
            return match bounded(limit, check.mget(&keys)).await {
                Ok(values) => (values.into_iter().map(Some).collect(), None),
                Err(e) => (vec![None; shards.len()], Some(e)),
            };
        }
        let reads = keys.iter().map(|&key| {
            let mut check = check.clone();
            async move { bounded(limit, check.get(key)).await }
        });
        let mut error = None;
        let values = join_all(reads)
            .await
            .into_iter()
            .map(|reply| match reply {
                Ok(value) => Some(value),
                // Answered, with something other than a version: the
                // shard's read says what it is.
                Err(e) if concerns_one_key(&e) => Some(Value::Okay),
                Err(e) => {
                    error = Some(e);
                    None
                }
            })
            .collect();
        (values, error)
    }

    /// Exchanges about `shards` failed with `error`. On a single server,
    /// Redis is down. On a Cluster, those shards' versions are asked at
    /// once, and only those that do not answer are cut off: an error the
    /// cluster client returns while it follows a move (a failover, a
    /// resharding) is not a node gone.
    pub(super) async fn fail_confirmed(&mut self, shards: &[u16], error: &RedisError) {
        if !self.backend.is_cluster() {
            return self.mark_down(error);
        }
        let mut shards = shards.to_vec();
        shards.sort_unstable();
        shards.dedup();
        let (versions, _) = self.versions(&shards).await;
        let silent: Vec<u16> = shards
            .iter()
            .zip(&versions)
            .filter_map(|(&shard, v)| v.is_none().then_some(shard))
            .collect();
        self.fail(&silent, error);
    }
}
