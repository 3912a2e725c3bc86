//! Pods and PodGroups the watches showed deleted, by uid: a ledger entry for one of
//! them charges something that existed and is gone. Without this, a charge recorded
//! shortly before its object was deleted looked like one not stored yet, and counted
//! as a phantom until its clock ran out (a quota refused for up to 120 s after a
//! scale-down).

use std::collections::VecDeque;

use crate::cards::hashing::Map;
use crate::cards::ObjectKey;
use crate::cluster::records::Version;
use crate::ledger::entries::Stream;

/// How many deletions are remembered. An entry outlives its object by at most its
/// clock (120 s) and a fence, so this covers deletions at up to ~400 per second.
const KEPT: usize = 50_000;

/// One deleted object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    pub stream: Stream,
    pub key: ObjectKey,
    /// The last resourceVersion the cache held of it: a reader at or past it shows the
    /// object itself or its deletion, never neither.
    pub resource_version: Option<u64>,
}

/// The deletions seen, the oldest forgotten first.
#[derive(Debug, Default, Clone)]
pub struct GoneObjects {
    by_uid: Map<String, Gone>,
    order: VecDeque<String>,
}

impl GoneObjects {
    /// Remembers that the object of `stream` at `key`, last held at `version`, was
    /// deleted (one without a uid cannot be told from a later incarnation: not kept).
    pub fn record(&mut self, stream: Stream, key: &ObjectKey, version: &Version) {
        let Some(uid) = version.uid.clone() else {
            return;
        };
        let gone = Gone {
            stream,
            key: key.clone(),
            resource_version: version.resource_version,
        };
        if self.by_uid.insert(uid.clone(), gone).is_none() {
            self.order.push_back(uid);
        }
        while self.order.len() > KEPT {
            if let Some(old) = self.order.pop_front() {
                self.by_uid.remove(&old);
            }
        }
    }

    /// The deletion of the object of `stream` with `uid` and `key`, when seen.
    pub fn get(&self, stream: Stream, uid: &str, key: &ObjectKey) -> Option<&Gone> {
        self.by_uid
            .get(uid)
            .filter(|g| g.stream == stream && g.key == *key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_deletions_are_forgotten_past_the_bound() {
        let mut g = GoneObjects::default();
        let key = |i: usize| ObjectKey::new("ml", format!("p{i}"));
        for i in 0..KEPT + 2 {
            let version = Version {
                uid: Some(format!("u{i}")),
                resource_version: Some(i as u64),
            };
            g.record(Stream::Pods, &key(i), &version);
        }
        assert!(g.get(Stream::Pods, "u0", &key(0)).is_none());
        assert!(g.get(Stream::Pods, "u1", &key(1)).is_none());
        assert!(g.get(Stream::Pods, "u2", &key(2)).is_some());
        assert!(g.get(Stream::PodGroups, "u2", &key(2)).is_none());
        assert!(g.get(Stream::Pods, "u2", &key(3)).is_none());
    }
}
