//! Which parts of Redis answer: the whole server on a single server, each
//! index shard on a Cluster.
//!
//! A single server answers or not, and when it does not every breaker
//! runs on its own ([`mark_down`](Task::mark_down)). A Cluster fails in
//! parts: a master dies, a node goes slow, and until Redis promotes a
//! replica only the slots it held go unanswered. So on a Cluster only
//! the index shards (and the names they hold) whose node does not answer
//! leave the fleet ([`fail`](Task::fail)): their queued writes are
//! dropped, their probe holds run out, and their breakers work on their
//! own, while every other shard keeps its shared counts, its one prober
//! and its pushes. A cut shard's version is asked again at every refresh,
//! more often while any shard is cut, and the first answer brings it back
//! ([`reached`](Task::reached)): it is read again whole, and each of its
//! breakers learns the fleet's state of its name. Only when no shard
//! answers is the Cluster down as a whole.

use super::*;

impl Task {
    /// `shards` did not answer (`error`). On a single server, Redis is
    /// down; on a Cluster, those shards leave the fleet until they answer
    /// again, and the Cluster is down only once none answers.
    pub(super) fn fail(&mut self, shards: &[u16], error: &RedisError) {
        if shards.is_empty() {
            return;
        }
        if !self.backend.is_cluster() {
            return self.mark_down(error);
        }
        let mut newly = Vec::new();
        for &shard in shards {
            let Some(cut) = self.unreachable.get_mut(usize::from(shard)) else {
                continue;
            };
            if !*cut {
                *cut = true;
                self.rejoin[usize::from(shard)] = false;
                self.view.clear_shard(shard);
                newly.push(shard);
            }
        }
        if self.unreachable.iter().all(|&cut| cut) {
            return self.mark_down(error);
        }
        if newly.is_empty() {
            return;
        }
        // The shards left are dealt with apart from the one that failed:
        // its slow streak is over.
        self.slow_streak = 0;
        let unreachable = &self.unreachable;
        self.scans
            .retain(|scan| !unreachable[usize::from(scan.shard)]);
        // Their breakers' holds run out by themselves, and they probe on
        // their own, as with Redis down.
        for (name, entry) in &mut self.entries {
            if unreachable[usize::from(entry.shard)] && entry.local.next_probe.take().is_some() {
                self.scheduled.set(name, None);
            }
        }
        if let Some(inner) = self.stats() {
            for &shard in &newly {
                inner.unreachable[usize::from(shard)].store(true, Ordering::Relaxed);
            }
            inner.stats.shard_episodes.fetch_add(1, Ordering::Relaxed);
        }
        tracing::warn!(
            store = "redis",
            shards = ?newly,
            error = %error,
            "index shards unreachable: their names run on their local breakers"
        );
        #[cfg(feature = "metrics")]
        crate::metrics::store_unreachable_shards(self.unreachable_count());
        let _ = self.events.send(StoreEvent::ShardsUnavailable {
            shards: newly,
            error: error.to_string(),
        });
    }

    /// `shards` answered: those that were cut come back, to be read again
    /// whole before their breakers learn the fleet's state.
    pub(super) fn reached(&mut self, shards: &[u16]) {
        let mut back = Vec::new();
        for &shard in shards {
            let i = usize::from(shard);
            if self.unreachable.get(i).copied().unwrap_or(false) {
                self.unreachable[i] = false;
                self.rejoin[i] = true;
                self.view.clear_shard(shard);
                back.push(shard);
            }
        }
        if back.is_empty() {
            return;
        }
        if let Some(inner) = self.stats() {
            for &shard in &back {
                inner.unreachable[usize::from(shard)].store(false, Ordering::Relaxed);
            }
        }
        tracing::info!(store = "redis", shards = ?back, "index shards reachable again");
        #[cfg(feature = "metrics")]
        crate::metrics::store_unreachable_shards(self.unreachable_count());
        let _ = self
            .events
            .send(StoreEvent::ShardsRestored { shards: back });
    }

    /// Tells every breaker of a shard back from being cut the fleet's
    /// state of its name, once the shard has been read again.
    pub(super) fn rejoin_read(&mut self, now: Instant) {
        let ready: Vec<bool> = (0..self.shards)
            .map(|s| self.rejoin[usize::from(s)] && self.view.has_read(s))
            .collect();
        if !ready.contains(&true) {
            return;
        }
        let names: Vec<(u16, Arc<str>)> = self
            .entries
            .iter()
            .filter(|(_, e)| ready[usize::from(e.shard)])
            .map(|(name, e)| (e.shard, Arc::clone(name)))
            .collect();
        for (shard, name) in names {
            let reply = self.view.reply(shard, &name, now);
            self.apply(&name, reply);
        }
        for (rejoin, ready) in self.rejoin.iter_mut().zip(ready) {
            *rejoin &= !ready;
        }
    }

    /// Whether `shard` is cut off from the fleet.
    pub(super) fn is_cut(&self, shard: u16) -> bool {
        self.unreachable
            .get(usize::from(shard))
            .copied()
            .unwrap_or(false)
    }

    /// How many shards are cut off.
    pub(super) fn unreachable_count(&self) -> usize {
        self.unreachable.iter().filter(|&&cut| cut).count()
    }

    /// Whether every shard not cut off has been read.
    pub(super) fn view_whole(&self) -> bool {
        (0..self.shards).all(|s| self.is_cut(s) || self.view.has_read(s))
    }

    /// How long until the next refresh: the interval, or a quarter of it
    /// (but at least two command timeouts) while shards are cut, so that a
    /// replica Redis promotes is used soon after.
    pub(super) fn refresh_every(&self) -> Duration {
        if self.unreachable_count() == 0 {
            return self.timing.refresh;
        }
        (self.timing.refresh / 4)
            .max(self.timing.command_timeout * 2)
            .min(self.timing.refresh)
    }

    /// Redis is down: every breaker runs on its own until it answers.
    pub(super) fn mark_down(&mut self, error: &RedisError) {
        // The next exchange connects afresh: a connection that stopped
        // answering (the host behind the address gone without a reset) is
        // never told so, and would time out for as long as the kernel keeps
        // its socket.
        self.conn = None;
        self.check_conn = None;
        self.slow_streak = 0;
        self.scans.clear();
        // Down as a whole: the resync after it covers every shard.
        let was_cut = self.unreachable_count() > 0;
        self.unreachable.iter_mut().for_each(|cut| *cut = false);
        self.rejoin.iter_mut().for_each(|r| *r = false);
        if was_cut {
            #[cfg(feature = "metrics")]
            crate::metrics::store_unreachable_shards(0);
        }
        if let Some(inner) = self.stats() {
            for cut in &inner.unreachable {
                cut.store(false, Ordering::Relaxed);
            }
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

    /// Redis answered.
    pub(super) fn mark_up(&mut self) {
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

    pub(super) fn is_down(&self) -> bool {
        self.available == Some(false)
    }
}
