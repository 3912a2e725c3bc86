//! "Does this change fit?": the usage of a queue before and after a change, and the
//! exact feasibility check restricted to the models the change can affect.

use std::collections::{BTreeSet, HashSet};

use crate::cards::{Alternatives, CardName, ObjectKey, QueueName};
use crate::cluster::{PodGroupRecord, PodRecord, Snapshot};
use crate::ledger::{check, queue_usage, Demand, QueueUsage, Verdict, DEFAULT_BUDGET};

/// A hypothetical change to one queue's objects.
#[derive(Debug, Default, Clone)]
pub struct Change {
    pub remove_pods: Vec<ObjectKey>,
    pub add_pods: Vec<PodRecord>,
    pub remove_groups: Vec<ObjectKey>,
    pub add_groups: Vec<PodGroupRecord>,
    /// Demands with no object yet (replicas a scale-up would add, counted).
    pub extra: Vec<Demand>,
}

/// The outcome of a fit check. The usage before the change is only computed when a
/// denial needs its numbers (admitted requests are the hot path).
#[derive(Debug, Clone)]
pub struct Fit<'a> {
    pub verdict: Verdict,
    pub after: QueueUsage,
    snap: &'a Snapshot,
    queue: &'a QueueName,
    now: jiff::Timestamp,
}

impl Fit<'_> {
    /// Usage of the queue as it is, before the change.
    pub fn before(&self) -> QueueUsage {
        usage_of(self.snap, self.queue, self.now)
    }
}

/// Usage of `queue` as the snapshot holds it.
pub fn usage_of(snap: &Snapshot, queue: &QueueName, now: jiff::Timestamp) -> QueueUsage {
    let quota = snap
        .queue(queue)
        .map(|q| q.effective_quota())
        .unwrap_or_default();
    queue_usage(
        quota,
        snap.queue_pods(queue),
        snap.queue_groups(queue),
        snap,
        now,
    )
}

/// Usage of `queue` after `change`.
pub fn usage_after(
    snap: &Snapshot,
    queue: &QueueName,
    change: &Change,
    now: jiff::Timestamp,
) -> QueueUsage {
    let quota = snap
        .queue(queue)
        .map(|q| q.effective_quota())
        .unwrap_or_default();
    let drop_pods: HashSet<&ObjectKey> = change
        .remove_pods
        .iter()
        .chain(change.add_pods.iter().map(|p| &p.key))
        .collect();
    let drop_groups: HashSet<&ObjectKey> = change
        .remove_groups
        .iter()
        .chain(change.add_groups.iter().map(|g| &g.key))
        .collect();
    let pods = snap
        .queue_pods(queue)
        .filter(|p| !drop_pods.contains(&p.key))
        .chain(change.add_pods.iter());
    let groups = snap
        .queue_groups(queue)
        .filter(|g| !drop_groups.contains(&g.key))
        .chain(change.add_groups.iter());
    let mut u = queue_usage(quota, pods, groups, snap, now);
    for d in &change.extra {
        add_planned(&mut u, d);
    }
    u
}

/// Adds a demand with no object yet (replicas a scale-up would add) to a usage.
pub fn add_planned(u: &mut QueueUsage, d: &Demand) {
    *u.pending.entry(d.models.clone()).or_default() += d.total();
    u.demands
        .push((crate::ledger::Source::Planned, u64::MAX, d.clone()));
}

/// Demands of `u` in the component of models reachable from `touched`.
fn component(u: &QueueUsage, touched: &BTreeSet<CardName>) -> Vec<Demand> {
    let mut models = touched.clone();
    let mut taken = vec![false; u.demands.len()];
    loop {
        let mut grew = false;
        for (i, (_, _, d)) in u.demands.iter().enumerate() {
            if !taken[i] && d.models.models().iter().any(|m| models.contains(m)) {
                taken[i] = true;
                for m in d.models.models() {
                    grew |= models.insert(m.clone());
                }
            }
        }
        if !grew {
            break;
        }
    }
    u.demands
        .iter()
        .zip(taken)
        .filter(|(_, t)| *t)
        .map(|((_, _, d), _)| d.clone())
        .collect()
}

/// Is the demand of `u` that can reach `touched` feasible?
pub fn feasible(u: &QueueUsage, touched: &BTreeSet<CardName>) -> Verdict {
    let demands = component(u, touched);
    check(&u.rooms(), &demands, DEFAULT_BUDGET)
}

/// Checks `change` against `queue`: feasible after the change.
pub fn fit<'a>(
    snap: &'a Snapshot,
    queue: &'a QueueName,
    change: &Change,
    touched: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> Fit<'a> {
    let after = usage_after(snap, queue, change, now);
    let verdict = feasible(&after, touched);
    Fit {
        verdict,
        after,
        snap,
        queue,
        now,
    }
}

/// The models named by some alternatives lists.
pub fn models_of<'a>(alts: impl IntoIterator<Item = &'a Alternatives>) -> BTreeSet<CardName> {
    alts.into_iter()
        .flat_map(|a| a.models().iter().cloned())
        .collect()
}
