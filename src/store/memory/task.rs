//! One instance's task: it alone carries out that instance's writes on the
//! fleet's state, and brings what the fleet decided into its breakers.
//!
//! It drains the write queue, takes in the instance's news (attachments,
//! answers, other instances' changes) in the order the fleet decided them,
//! and races for the probe lock when a name's open period ends. Every
//! answer goes into the local breakers through the `fleet_*` transitions,
//! from here, never from the request path.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::state::{Caller, News};
use super::{FleetInner, Inner};
use crate::millis::millis;
use crate::store::fleet::{Args, LocalBreakers, Op, Queue, Reply, Write};

/// Writes carried out in one exchange, at most.
const BATCH: usize = 256;

pub(crate) struct Task {
    fleet: Arc<FleetInner>,
    id: Caller,
    /// The instance's handles, for its counters; the task holds it weakly.
    inner: Weak<Inner>,
    queue: Arc<Queue>,
    inbox: UnboundedReceiver<News>,
    entries: HashMap<Arc<str>, LocalBreakers>,
    /// Entries when they were last swept of breakers gone.
    swept_at: usize,
}

impl Task {
    /// The task of instance `inner`; it ends when every handle of the
    /// instance is gone (its `inbox` closes).
    pub(crate) fn new(inner: &Arc<Inner>, inbox: UnboundedReceiver<News>) -> Self {
        Task {
            fleet: Arc::clone(&inner.fleet),
            id: inner.id,
            inner: Arc::downgrade(inner),
            queue: Arc::clone(&inner.queue),
            inbox,
            entries: HashMap::new(),
            swept_at: 0,
        }
    }

    pub(crate) async fn run(mut self) {
        loop {
            let (news, writes) = self.wake().await;
            if self.inner.strong_count() == 0 {
                // Every handle of this instance is gone: what its breakers
                // still queue is nobody's to carry out.
                return;
            }
            match news {
                // The inbox closes with the last handle: seen above.
                Some(None) => return,
                Some(Some(news)) => {
                    self.take(news);
                    while let Ok(news) = self.inbox.try_recv() {
                        self.take(news);
                    }
                }
                None => {}
            }
            if writes {
                self.flush();
            }
            self.probe_due();
        }
    }

    /// Waits for news, queued writes, or a name's time to race for the
    /// probe lock. Every source is polled each time (tokio's `select!`
    /// would need its macros in the core), and whatever is ready is
    /// returned, so a wake-up taken is never lost.
    async fn wake(&mut self) -> (Option<Option<News>>, bool) {
        let probe_at = self.entries.values().filter_map(|e| e.next_probe).min();
        let mut probe_time = pin!(probe_at.map(tokio::time::sleep_until));
        let mut queued = pin!(self.queue.notify.notified());
        let inbox = &mut self.inbox;
        poll_fn(|cx| {
            let news = match inbox.poll_recv(cx) {
                Poll::Ready(news) => Some(news),
                Poll::Pending => None,
            };
            let writes = queued.as_mut().poll(cx).is_ready();
            let due = probe_time
                .as_mut()
                .as_pin_mut()
                .is_some_and(|sleep| sleep.poll(cx).is_ready());
            if news.is_some() || writes || due {
                Poll::Ready((news, writes))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Carries out `writes` on the fleet's state and takes in the answers,
    /// after whatever news came before them.
    fn exchange(&mut self, writes: &[Write]) {
        let news = {
            let mut fleet = self.fleet.lock();
            fleet.exchange(self.id, &mut self.inbox, writes, Instant::now())
        };
        for news in news {
            self.take(news);
        }
    }

    /// Carries out queued writes, a batch at a time.
    fn flush(&mut self) {
        let batch = self.queue.take(BATCH);
        if batch.is_empty() {
            return;
        }
        self.exchange(&batch);
        if let Some(inner) = self.inner.upgrade() {
            let n = batch.len() as u64;
            inner.stats.writes.fetch_add(n, Ordering::Relaxed);
        }
        // More may be waiting: come back at once.
        self.queue.notify.notify_one();
    }

    /// Races for the probe lock of every name whose time has come; names
    /// whose breakers are all gone are forgotten instead (they would hold
    /// the probe lock with nothing to probe).
    fn probe_due(&mut self) {
        let now = Instant::now();
        let lease_ms = millis(self.fleet.timing.lease);
        let mut batch = Vec::new();
        self.entries.retain(|key, entry| {
            if entry.next_probe.is_none_or(|at| at > now) {
                return true;
            }
            entry.next_probe = None;
            if !entry.prune() {
                return false;
            }
            batch.push(Write {
                key: Arc::clone(key),
                op: Op::Probe,
                args: Args {
                    lease_ms,
                    ..Args::default()
                },
            });
            true
        });
        if !batch.is_empty() {
            self.exchange(&batch);
        }
    }

    fn take(&mut self, news: News) {
        match news {
            News::Attached {
                key,
                breaker,
                state,
                control,
            } => {
                self.entries
                    .entry(Arc::clone(&key))
                    .or_default()
                    .join(breaker, control);
                self.apply(&key, state);
                self.sweep();
            }
            News::Controlled { key, control } => {
                if let Some(entry) = self.entries.get_mut(&key) {
                    entry.control(control);
                }
            }
            News::Reply { key, reply } => self.apply(&key, reply),
            News::Closed { key, generation } => {
                if let Some(entry) = self.entries.get_mut(&key) {
                    let breakers = entry.live();
                    entry.close(&breakers, Some(generation), 0);
                }
            }
        }
    }

    /// Brings the local breakers of `key` in line with `reply`; forgets the
    /// name once its breakers are all gone.
    fn apply(&mut self, key: &Arc<str>, reply: Reply) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let timing = &self.fleet.timing;
        if entry.apply(reply, timing.hold, timing.lease) {
            if let Some(inner) = self.inner.upgrade() {
                inner.stats.probe_locks_won.fetch_add(1, Ordering::Relaxed);
            }
        }
        if entry.breakers.is_empty() {
            self.entries.remove(key);
        }
    }

    /// Forgets names whose breakers are all gone, once there are twice as
    /// many as after the last sweep: a registry evicting keys leaves no
    /// trail here.
    fn sweep(&mut self) {
        if self.entries.len() < self.swept_at.saturating_mul(2).max(64) {
            return;
        }
        self.entries.retain(|_, e| e.prune());
        self.swept_at = self.entries.len();
    }
}

/// The settings every instance's task shares.
#[derive(Debug)]
pub(crate) struct Timing {
    /// How long past the fleet's period a following breaker waits for word.
    pub(crate) hold: Duration,
    /// The probe lock.
    pub(crate) lease: Duration,
}
