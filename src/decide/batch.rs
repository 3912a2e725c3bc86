//! Group commit, the pure half: the charging requests one replica holds for a queue are
//! decided in arrival order against one snapshot with the queue's ledger laid over it,
//! each on top of the ones admitted before it, and come out as one new ledger to write
//! with one compare-and-swap (the scheme of Kubernetes' ResourceQuota admission).

use std::time::Duration;

use crate::cards::QueueName;
use crate::ledger::entries::{EntryId, Fate, Ledger, Watermark, MAX_BYTES, MAX_ENTRIES};
use crate::snapshot::overlay::{self, Overlay};
use crate::snapshot::Snapshot;

use super::enforcement::decide_enforcing;
use super::messages::RETRY;
use super::review::AdmissionRequest;
use super::{Config, Decision};

/// What became of one request of a batch.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Final now: a denial, an admission that charges nothing, or "try again".
    Answer(Decision),
    /// Admitted, answered once the ledger write lands.
    Admit(Decision),
}

/// A batch, decided.
#[derive(Debug, Clone)]
pub struct Batch {
    /// One per request, in the order given.
    pub outcomes: Vec<Outcome>,
    /// The ledger to store: what was there, pruned, plus the admitted charges.
    pub ledger: Ledger,
    /// Its stored form.
    pub text: String,
    /// The precondition of the write (`None`: the ledger object does not exist yet).
    pub resource_version: Option<String>,
    /// Entries pruning dropped.
    pub pruned: usize,
    /// Requests refused because the ledger is at its cap.
    pub full: usize,
}

impl Batch {
    /// True when the write can be skipped: nothing admitted, nothing pruned.
    pub fn unchanged(&self) -> bool {
        self.pruned == 0 && !self.outcomes.iter().any(|o| matches!(o, Outcome::Admit(_)))
    }
}

/// The watermark this snapshot's caches must reach before deciding from `queue`'s
/// ledger, when they have not reached it yet.
pub fn behind(snap: &Snapshot, queue: &QueueName) -> Option<Watermark> {
    let mark = snap.ledger(queue).ledger.watermark();
    (!mark.reached_by(&snap.progress())).then_some(mark)
}

fn full(queue: &QueueName) -> Decision {
    Decision::deny(
        RETRY,
        format!("queue {queue} has {MAX_ENTRIES} charges in flight that card-quota's caches do not show yet; try again in a few seconds"),
    )
}

fn moved(queue: &QueueName, to: &QueueName) -> Decision {
    Decision::deny(
        RETRY,
        format!("queue of this request changed while it was decided ({queue} -> {to}); try again"),
    )
}

/// Decides `reqs` (all charging `queue`, in arrival order) and plans the ledger write.
/// `age` is how long this replica has known an entry (pruning's clock). The snapshot
/// is left exactly as it was found.
pub fn plan(
    snap: &mut Snapshot,
    queue: &QueueName,
    reqs: &[&AdmissionRequest],
    cfg: &Config,
    now: jiff::Timestamp,
    age: impl Fn(&EntryId) -> Duration,
) -> Batch {
    let stored = snap.ledger(queue);
    let mut ledger = stored.ledger.clone();
    let mut layer = overlay::apply(snap, queue, &stored.ledger);
    let mut admitted: Vec<(usize, EntryId)> = Vec::new();
    let mut outcomes = Vec::with_capacity(reqs.len());
    let mut refused_full = 0;
    for (i, req) in reqs.iter().enumerate() {
        let d = decide_enforcing(req, snap, cfg, now);
        let charge = match (&d.charge, d.allowed && !req.is_dry_run()) {
            (Some(c), true) => c.clone(),
            _ => {
                outcomes.push(Outcome::Answer(d));
                continue;
            }
        };
        if snap.ledger_key(&charge.queue) != *queue {
            outcomes.push(Outcome::Answer(moved(queue, &charge.queue)));
            continue;
        }
        if ledger.len() >= MAX_ENTRIES {
            refused_full += 1;
            outcomes.push(Outcome::Answer(full(queue)));
            continue;
        }
        let id = ledger.record_for(
            &charge.effect,
            (&charge.queue != queue).then_some(&charge.queue),
        );
        if let Some(e) = ledger.get(&id) {
            layer.add(snap, queue, &id, e);
        }
        admitted.push((i, id));
        outcomes.push(Outcome::Admit(d));
    }
    Overlay::remove(layer, snap);
    let fresh: std::collections::HashSet<&EntryId> = admitted.iter().map(|(_, id)| id).collect();
    let pruned = ledger.prune(|id, e| {
        if fresh.contains(id) {
            Fate::Keep
        } else {
            overlay::fate(snap, id, e, age(id), now)
        }
    });
    // Past the object size limit, the latest admissions wait for pruning to catch up.
    let mut text = ledger.render();
    while text.len() > MAX_BYTES {
        let Some((i, id)) = admitted.pop() else { break };
        ledger.forget(&id);
        outcomes[i] = Outcome::Answer(full(queue));
        refused_full += 1;
        text = ledger.render();
    }
    Batch {
        outcomes,
        ledger,
        text,
        resource_version: stored.resource_version.clone(),
        pruned,
        full: refused_full,
    }
}

/// Decides one request against "cache ∪ ledger" without recording it (`/mutate`, dry
/// runs, and the first look that tells which queue a request charges).
pub fn decide_with_ledger(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    let first = decide_enforcing(req, snap, cfg, now);
    let Some(queue) = first.charge.as_ref().map(|c| snap.ledger_key(&c.queue)) else {
        return first;
    };
    let stored = snap.ledger(&queue);
    if stored.ledger.is_empty() {
        return first;
    }
    let layer = overlay::apply(snap, &queue, &stored.ledger);
    let d = if layer.applied() == 0 {
        first
    } else {
        decide_enforcing(req, snap, cfg, now)
    };
    layer.remove(snap);
    match &d.charge {
        Some(c) if d.allowed && snap.ledger_key(&c.queue) != queue => moved(&queue, &c.queue),
        _ => d,
    }
}
