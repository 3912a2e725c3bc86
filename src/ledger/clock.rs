//! Pruning's clock: when a replica first saw each ledger entry as it is now. An entry
//! stops counting on this clock (behind a fence), so it must never run longer than the
//! charge the entry records has existed.

use std::collections::HashMap;

use crate::cards::QueueName;

use super::entries::{Entry, EntryId};

/// When each entry of each queue was first seen, in the caller's time `T` (a monotonic
/// `Instant` in `serve`, a step in the models).
///
/// An entry rewritten under the same id (a pod's CREATE charge replaced by its binding:
/// both carry the pod's uid) is a new charge and is timed again. Timed from the first
/// version, a binding admitted 30 s after its pod's CREATE was past its grace at once,
/// and a fence read before the bind landed dropped it while the bind was in flight.
#[derive(Debug, Clone)]
pub struct EntryClock<T> {
    seen: HashMap<(QueueName, EntryId), (u64, T)>,
}

impl<T> Default for EntryClock<T> {
    fn default() -> Self {
        Self {
            seen: HashMap::new(),
        }
    }
}

impl<T: Copy> EntryClock<T> {
    /// When `entry` (as it is now) was first seen, starting its clock at `now` if it
    /// is new or changed.
    pub fn first_seen(&mut self, queue: &QueueName, id: &EntryId, entry: &Entry, now: T) -> T {
        let mark = entry.clock_mark();
        let seen = self
            .seen
            .entry((queue.clone(), id.clone()))
            .or_insert((mark, now));
        if seen.0 != mark {
            *seen = (mark, now);
        }
        seen.1
    }

    /// When `entry` as it is now was first seen, if its clock runs.
    pub fn get(&self, queue: &QueueName, id: &EntryId, entry: &Entry) -> Option<T> {
        self.seen
            .get(&(queue.clone(), id.clone()))
            .filter(|(mark, _)| *mark == entry.clock_mark())
            .map(|(_, t)| *t)
    }

    /// Keeps the clocks `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&QueueName, &EntryId) -> bool) {
        self.seen.retain(|(q, id), _| keep(q, id));
    }

    /// How many clocks run.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when no clock runs.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::ObjectKey;
    use crate::ledger::entries::EntryKey;

    fn entry(node: Option<&str>) -> Entry {
        Entry {
            of: EntryKey::Pod(ObjectKey::new("ml", "p")),
            group: None,
            resources: [(
                "nvidia.com/gpu".to_string(),
                crate::cards::Cards::from(1u64),
            )]
            .into_iter()
            .collect(),
            card: Some("A".into()),
            charged: node.map(|_| "A".to_string()),
            node: node.map(str::to_string),
            pinned: Default::default(),
            excluded: Default::default(),
            request: Vec::new(),
            phase: None,
            base: None,
            queue: None,
            retried: 0,
        }
    }

    #[test]
    fn an_entry_rewritten_under_its_id_is_timed_from_the_rewrite() {
        let q = QueueName::new("q1");
        let id = EntryId::for_key(&EntryKey::Pod(ObjectKey::new("ml", "p")));
        let mut clock = EntryClock::default();
        let created = entry(None);
        assert_eq!(clock.first_seen(&q, &id, &created, 0u64), 0);
        assert_eq!(
            clock.first_seen(&q, &id, &created, 40),
            0,
            "unchanged: still timed from 0"
        );
        let bound = entry(Some("a1"));
        assert_eq!(
            clock.get(&q, &id, &bound),
            None,
            "the binding's clock has not started"
        );
        assert_eq!(clock.first_seen(&q, &id, &bound, 40), 40);
        assert_eq!(clock.first_seen(&q, &id, &bound, 75), 40);
        assert_eq!(clock.get(&q, &id, &bound), Some(40));
        clock.retain(|_, _| false);
        assert!(clock.is_empty());
    }
}
