//! When the task next tries each key's probe lock, in time order.
//!
//! The task looks at the schedule on every pass of its loop (every message,
//! every batch of writes), so finding the next time and the keys due costs
//! in proportion to the keys due, never to every key scheduled: with a
//! thousand keys open and hundreds of changes a second, a scan of them all
//! on every pass was most of an instance's work.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::time::Instant;

#[derive(Default)]
pub(crate) struct Schedule {
    at: HashMap<Arc<str>, Instant>,
    order: BTreeSet<(Instant, Arc<str>)>,
}

impl Schedule {
    /// Schedules `name` at `when`, or takes it off with `None`.
    pub(crate) fn set(&mut self, name: &Arc<str>, when: Option<Instant>) {
        let before = self.at.get(name).copied();
        if before == when {
            return;
        }
        if let Some(before) = before {
            self.order.remove(&(before, Arc::clone(name)));
            self.at.remove(name);
        }
        if let Some(when) = when {
            self.at.insert(Arc::clone(name), when);
            self.order.insert((when, Arc::clone(name)));
        }
    }

    /// The earliest time scheduled.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.order.first().map(|(at, _)| *at)
    }

    /// Takes off and returns the keys due at `now`, earliest first.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Arc<str>> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.order.first() {
            if *at > now {
                break;
            }
            if let Some((_, name)) = self.order.pop_first() {
                self.at.remove(&name);
                due.push(name);
            }
        }
        due
    }

    /// Takes off and returns every key.
    pub(crate) fn take_all(&mut self) -> Vec<Arc<str>> {
        self.at.clear();
        std::mem::take(&mut self.order)
            .into_iter()
            .map(|(_, name)| name)
            .collect()
    }

    /// Keeps only the keys for which `keep` holds.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.at.retain(|name, _| keep(name));
        let at = &self.at;
        self.order.retain(|(_, name)| at.contains_key(name));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn keys_come_due_in_time_order_and_a_move_replaces_the_old_time() {
        let now = Instant::now();
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        let mut schedule = Schedule::default();
        schedule.set(&a, Some(now + Duration::from_millis(30)));
        schedule.set(&b, Some(now + Duration::from_millis(10)));
        schedule.set(&c, Some(now + Duration::from_millis(20)));
        assert_eq!(schedule.next(), Some(now + Duration::from_millis(10)));
        // `a` moved earlier: its old time is gone.
        schedule.set(&a, Some(now + Duration::from_millis(5)));
        assert_eq!(schedule.len(), 3);
        let due = schedule.take_due(now + Duration::from_millis(15));
        assert_eq!(due, vec![a.clone(), b.clone()]);
        assert_eq!(schedule.next(), Some(now + Duration::from_millis(20)));
        schedule.set(&c, None);
        assert_eq!(schedule.next(), None);
        assert!(schedule.take_due(now + Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn retain_and_take_all_leave_nothing_behind() {
        let now = Instant::now();
        let mut schedule = Schedule::default();
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            schedule.set(
                &Arc::from(name),
                Some(now + Duration::from_millis(i as u64)),
            );
        }
        schedule.retain(|name| name != "b");
        assert_eq!(schedule.len(), 2);
        assert_eq!(schedule.take_all().len(), 2);
        assert_eq!(schedule.next(), None);
        assert_eq!(schedule.len(), 0);
    }
}
