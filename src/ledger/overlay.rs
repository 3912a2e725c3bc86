//! "Cache ∪ ledger": lays a Queue's ledger entries over the snapshot for the length
//! of one decision, then takes them off again. Entries the cache already reflects are
//! skipped, so nothing is counted twice.

use crate::cards::{ObjectKey, QueueName};
use crate::cluster::{PodGroupRecord, PodRecord, Snapshot};

use super::entries::{group_of, pod_of, Entry, EntryKey, Ledger};

/// True when the snapshot already shows what the entry records.
pub fn reflected(snap: &Snapshot, key: &EntryKey, e: &Entry) -> bool {
    match key {
        EntryKey::Pod(k) => match snap.pod(k) {
            Some(p) => e.node.is_none() || p.node.is_some(),
            None => snap.is_known_cardless_pod(k),
        },
        EntryKey::Group(k) => snap.group(k).is_some_and(|g| {
            let rendered: Vec<(String, crate::cards::Cards)> = g
                .live_request()
                .map(|r| r.0.iter().map(|(a, n)| (a.to_string(), *n)).collect())
                .unwrap_or_default();
            rendered == e.request
        }),
    }
}

enum Undo {
    Pod(ObjectKey, Option<PodRecord>),
    Group(ObjectKey, Option<PodGroupRecord>),
}

/// Entries laid over a snapshot; [`Overlay::remove`] restores the snapshot exactly.
#[must_use = "an overlay must be removed, or the snapshot keeps phantom objects"]
pub struct Overlay {
    undo: Vec<Undo>,
}

impl Overlay {
    /// How many entries changed the snapshot.
    pub fn applied(&self) -> usize {
        self.undo.len()
    }

    /// Puts back what the overlay replaced.
    pub fn remove(self, snap: &mut Snapshot) {
        for u in self.undo.into_iter().rev() {
            match u {
                Undo::Pod(_, Some(p)) => snap.upsert_pod(p),
                Undo::Pod(k, None) => snap.remove_pod(&k),
                Undo::Group(_, Some(g)) => snap.upsert_group(g),
                Undo::Group(k, None) => snap.remove_group(&k),
            }
        }
    }
}

/// Lays the live entries of `queue`'s ledger over `snap`.
pub fn apply(snap: &mut Snapshot, queue: &QueueName, ledger: &Ledger, now: i64) -> Overlay {
    let mut undo = Vec::new();
    for (key, e) in ledger.live(now) {
        if reflected(snap, key, e) {
            continue;
        }
        match key {
            EntryKey::Pod(k) => {
                let prev = snap.pod(k).cloned();
                let seq = prev
                    .as_ref()
                    .map(|p| p.seq)
                    .unwrap_or_else(|| snap.next_seq());
                let mut rec = pod_of(k, queue, e, seq);
                if let Some(p) = &prev {
                    // The cache's own view of the pod wins except for the binding.
                    let mut bound = p.clone();
                    bound.node = rec.node.take();
                    bound.charged = rec.charged.take();
                    rec = bound;
                }
                snap.upsert_pod(rec);
                undo.push(Undo::Pod(k.clone(), prev));
            }
            EntryKey::Group(k) => {
                let prev = snap.group(k).cloned();
                let seq = prev
                    .as_ref()
                    .map(|g| g.seq)
                    .unwrap_or_else(|| snap.next_seq());
                match group_of(k, queue, e, seq) {
                    Ok(mut g) => {
                        if let Some(p) = &prev {
                            g.phase = p.phase.clone();
                        }
                        snap.upsert_group(g);
                        undo.push(Undo::Group(k.clone(), prev));
                    }
                    Err(err) => tracing::warn!("ledger entry {key} skipped: {err}"),
                }
            }
        }
    }
    Overlay { undo }
}
