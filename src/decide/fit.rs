//! "Does this change fit?": the usage of a queue before and after a change, and the
//! exact feasibility check restricted to the models the change can affect.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::cards::{Alternatives, CardName, Cards, ObjectKey, QueueName};
use crate::cluster::{PodGroupRecord, PodRecord};
use crate::ledger::usage::{merge_members, reservation};
use crate::ledger::{Adjusted, Demand, QueueUsage, Share, Verdict};
use crate::snapshot::Snapshot;

use super::messages::insufficient;
use super::tree::{check_levels, LevelCheck};

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
    /// The queue's usage with the change made (read in place, not copied).
    pub after: Adjusted<'a>,
    /// What the card levels above the queue say (nothing in a flat cluster).
    pub levels: LevelCheck,
    snap: &'a Snapshot,
    queue: &'a QueueName,
    now: jiff::Timestamp,
}

impl Fit<'_> {
    /// Usage of the queue as it is, before the change.
    pub fn before(&self) -> QueueUsage {
        usage_of(self.snap, self.queue, self.now)
    }

    /// Why the change does not fit, for a request of `requested` cards of `key`: the
    /// first level that refuses it, from the queue up.
    pub fn message(&self, key: &Alternatives, requested: Cards) -> String {
        match &self.levels.refusal {
            Some(r) => r.message(self.queue, key, requested),
            None => {
                let text = insufficient(self.queue, key, requested, &self.before());
                with_missing_parent(self.snap, self.queue, text)
            }
        }
    }
}

/// `text`, saying so when `queue`'s parent does not exist (it is then a top level:
/// nothing to borrow from).
pub fn with_missing_parent(snap: &Snapshot, queue: &QueueName, text: String) -> String {
    match snap.ancestry(queue).ok().and_then(|a| a.missing) {
        Some(p) => format!("{text} (its parent queue {p} does not exist: nothing can be borrowed)"),
        None => text,
    }
}

/// Usage of `queue` as the snapshot holds it.
pub fn usage_of(snap: &Snapshot, queue: &QueueName, now: jiff::Timestamp) -> QueueUsage {
    snap.usage(queue, now)
}

/// Usage of `queue` after `change`, as a whole (see [`adjusted_after`]).
pub fn usage_after(
    snap: &Snapshot,
    queue: &QueueName,
    change: &Change,
    now: jiff::Timestamp,
) -> QueueUsage {
    adjusted_after(snap, queue, change, now).usage()
}

/// Usage of `queue` after `change`: the queue's tally with the change's pods and
/// PodGroups taken out or counted in, and the reservations of the groups they touch
/// counted again. O(touched models and groups), whatever the queue's size: the
/// tally's numbers are read in place.
pub fn adjusted_after<'a>(
    snap: &'a Snapshot,
    queue: &QueueName,
    change: &Change,
    now: jiff::Timestamp,
) -> Adjusted<'a> {
    let mut u = snap.adjusted(queue, now);
    // Member changes per touched group, applied on top of its current members.
    let mut touched: BTreeMap<ObjectKey, Vec<(Share, bool)>> = BTreeMap::new();
    for k in &change.remove_groups {
        touched.entry(k.clone()).or_default();
    }
    for g in &change.add_groups {
        touched.entry(g.key.clone()).or_default();
    }
    let mut replaced: Vec<&ObjectKey> = change
        .remove_pods
        .iter()
        .chain(change.add_pods.iter().map(|p| &p.key))
        .collect();
    replaced.sort_unstable();
    replaced.dedup();
    for k in replaced {
        let Some(p) = snap.pod(k).filter(|p| p.is_active(now)) else {
            continue;
        };
        if snap.pod_queue(k) != Some(queue) {
            continue;
        }
        // The share the tally counts the pod with, when it keeps one.
        let computed;
        let share = match snap.tally().settled_share(k) {
            Some(s) => s,
            None => {
                computed = Share::of(p, snap);
                &computed
            }
        };
        u.sub_share(k, share);
        if let Some(g) = p.group_key() {
            touched.entry(g).or_default().push((share.clone(), false));
        }
    }
    for p in change.add_pods.iter().filter(|p| p.is_active(now)) {
        let share = Share::of(p, snap);
        u.add_share(&p.key, &share);
        if let Some(g) = p.group_key() {
            touched.entry(g).or_default().push((share, true));
        }
    }
    for (g, deltas) in touched {
        let old = snap.group(&g).filter(|r| &r.queue == queue);
        let new = match change.add_groups.iter().rev().find(|r| r.key == g) {
            Some(r) => Some(r),
            None if change.remove_groups.contains(&g) => None,
            None => old,
        };
        let old_req = old.and_then(|r| r.live_request());
        let new_req = new.and_then(|r| r.live_request());
        if old_req.is_none() && new_req.is_none() {
            continue;
        }
        let mut members = snap.group_members(&g, queue, now);
        if let Some(req) = old_req {
            u.sub_reservation(&reservation(req, &members));
        }
        if let Some(req) = new_req {
            for (share, add) in &deltas {
                merge_members(&mut members, share, *add);
            }
            u.add_reservation(&reservation(req, &members));
        }
    }
    for d in &change.extra {
        u.add_planned(d);
    }
    u
}

/// Is the demand of `u` that can reach `touched` feasible?
pub fn feasible(u: &QueueUsage, touched: &BTreeSet<CardName>) -> Verdict {
    Adjusted::new(Cow::Borrowed(u), Cow::Borrowed(&u.quota)).feasible(touched)
}

/// Checks `change` against `queue` and every card level above it: feasible after the
/// change, within each level's cap, borrowing only from pools (docs/hierarchy.md).
pub fn fit<'a>(
    snap: &'a Snapshot,
    queue: &'a QueueName,
    change: &Change,
    touched: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> Fit<'a> {
    let mut f = fit_leaf(snap, queue, change, touched, now);
    if f.verdict == Verdict::Feasible && !snap.is_flat() {
        let before = usage_of(snap, queue, now);
        f.levels = check_levels(snap, queue, &before, &f.after.usage(), touched, now);
        if f.levels.refusal.is_some() {
            f.verdict = Verdict::Infeasible;
        }
    }
    f
}

/// [`fit`] against `queue` alone (bindings check the levels above for allocation only).
pub fn fit_leaf<'a>(
    snap: &'a Snapshot,
    queue: &'a QueueName,
    change: &Change,
    touched: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> Fit<'a> {
    let after = adjusted_after(snap, queue, change, now);
    let verdict = after.feasible(touched);
    Fit {
        verdict,
        after,
        levels: LevelCheck::default(),
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
