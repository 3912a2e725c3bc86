//! A Queue's place in the tree, checked at `kubectl apply` (docs/hierarchy.md): refused
//! when it cannot hold (self-parent, a cycle through the object under admission, too
//! deep, a parent with card pods of its own, a move whose subtree does not fit under its
//! new ancestors); warned when GitOps may be mid-way (shares above the parent's quota or
//! one of its group caps, a child quota above its parent's, a borrow with nothing to
//! borrow from, a quota or cap below its subtree's usage).

use std::collections::BTreeSet;

use crate::cards::{CardName, CardPattern, Cards, QueueName, Quota};
use crate::cluster::QueueRecord;
use crate::ledger::QueueUsage;
use crate::snapshot::tree::WALK_LIMIT;
use crate::snapshot::Snapshot;

use super::messages::{BAD_TREE, INSUFFICIENT};
use super::tree::fits_cap;
use super::Decision;

/// The chain above `rec` once it is stored: its parent, the parent's parent, ... (the
/// object under admission replaces its stored version in the walk).
#[derive(Debug, Default)]
struct Chain {
    /// Existing ancestors, nearest first.
    ancestors: Vec<QueueName>,
    /// The walk came back to `rec`: the queues of the cycle.
    cycle: Option<Vec<QueueName>>,
}

fn chain(snap: &Snapshot, rec: &QueueRecord) -> Chain {
    let mut out = Chain::default();
    let mut seen: BTreeSet<&QueueName> = BTreeSet::from([&rec.name]);
    let mut at = snap.link(rec);
    while let Some(p) = at {
        if *p == rec.name {
            let mut c = vec![rec.name.clone()];
            c.extend(out.ancestors.iter().cloned());
            c.push(rec.name.clone());
            out.cycle = Some(c);
            return out;
        }
        // A cycle above that does not pass through `rec` is the gate's to report.
        if !seen.insert(p) || out.ancestors.len() > WALK_LIMIT {
            return out;
        }
        let Some(r) = snap.queue(p) else {
            return out;
        };
        out.ancestors.push(p.clone());
        at = snap.link(r);
    }
    out
}

/// How many levels lie below `q` (0 for a leaf), bounded.
fn height(snap: &Snapshot, q: &QueueName) -> usize {
    let mut best = 0;
    let mut seen: BTreeSet<&QueueName> = BTreeSet::from([q]);
    let mut frontier: Vec<(&QueueName, usize)> = snap.children_of(q).map(|c| (c, 1)).collect();
    while let Some((c, d)) = frontier.pop() {
        if d > WALK_LIMIT || !seen.insert(c) {
            continue;
        }
        best = best.max(d);
        frontier.extend(snap.children_of(c).map(|g| (g, d + 1)));
    }
    best
}

/// The usage of `q`'s whole subtree.
fn subtree_usage(snap: &Snapshot, q: &QueueName, now: jiff::Timestamp) -> QueueUsage {
    snap.subtree_usage(q, now).into_owned()
}

fn in_use(u: &QueueUsage, m: &CardName) -> Cards {
    u.competing(&crate::cards::Alternatives::single(m.clone()))
        .in_use()
}

fn models(u: &QueueUsage) -> BTreeSet<CardName> {
    u.allocated
        .keys()
        .cloned()
        .chain(
            u.pending
                .keys()
                .chain(u.reserved.keys())
                .flat_map(|a| a.models().to_vec()),
        )
        .collect()
}

fn is_empty(u: &QueueUsage) -> bool {
    u.allocated.is_empty() && u.pending.is_empty() && u.reserved.is_empty()
}

/// The tree checks of a Queue CREATE / UPDATE: `Err` refuses, `Ok` carries warnings.
pub fn check(
    snap: &Snapshot,
    rec: &QueueRecord,
    old: Option<&QueueRecord>,
    max_depth: usize,
    now: jiff::Timestamp,
) -> Result<Vec<String>, Decision> {
    let q = &rec.name;
    let moved = old.map(|o| &o.parent) != Some(&rec.parent);
    let c = chain(snap, rec);
    if moved {
        if let Some(p) = rec.parent.as_ref().filter(|p| *p == q) {
            return Err(Decision::deny(
                BAD_TREE,
                format!("queue {q} cannot be its own parent (spec.parent: {p})"),
            ));
        }
        if let Some(cycle) = &c.cycle {
            let names: Vec<&str> = cycle.iter().map(QueueName::as_str).collect();
            let p = rec.parent.as_ref().map_or("", QueueName::as_str);
            return Err(Decision::deny(
                BAD_TREE,
                format!(
                    "queue {q} cannot have parent {p}: {p} is below {q}, which would make a cycle ({})",
                    names.join(" -> ")
                ),
            ));
        }
        let above = c
            .ancestors
            .iter()
            .filter(|a| a.as_str() != QueueName::ROOT)
            .count();
        let depth = above + 1 + height(snap, q);
        if depth > max_depth {
            return Err(Decision::deny(
                BAD_TREE,
                format!(
                    "queue {q} under {} would make the tree {depth} levels deep below root; at most {max_depth} (--max-queue-depth)",
                    rec.parent.as_ref().map_or("root", QueueName::as_str)
                ),
            ));
        }
        if let Some(p) = rec.parent.as_ref() {
            let own = snap.usage(p, now);
            if !snap.has_children(p) && !is_empty(&own) {
                let total: Cards = models(&own).iter().map(|m| in_use(&own, m)).sum();
                return Err(Decision::deny(
                    BAD_TREE,
                    format!(
                        "queue {p} has card workloads of its own ({total} cards in use): it cannot get child queue {q} until they finish; submit card workloads to leaf queues"
                    ),
                ));
            }
        }
        check_move(snap, rec, old, &c, now)?;
    }
    Ok(warnings(snap, rec, &c, now))
}

/// A queue whose subtree holds cards moves only where they fit: every card level it
/// gains must hold them within its cap.
fn check_move(
    snap: &Snapshot,
    rec: &QueueRecord,
    old: Option<&QueueRecord>,
    c: &Chain,
    now: jiff::Timestamp,
) -> Result<(), Decision> {
    if old.is_none() {
        return Ok(());
    }
    let q = &rec.name;
    let moving = subtree_usage(snap, q, now);
    if is_empty(&moving) {
        return Ok(());
    }
    let kept: BTreeSet<QueueName> = snap
        .ancestry(q)
        .map(|a| a.levels.into_iter().collect())
        .unwrap_or_default();
    let touched = models(&moving);
    for level in &c.ancestors {
        let Some(Ok(_)) = snap.queue(level).and_then(|r| r.quota.as_ref()) else {
            continue;
        };
        if kept.contains(level) {
            continue;
        }
        let here = subtree_usage(snap, level, now);
        let mut sum = here.clone();
        sum.absorb(&moving);
        sum.quota = snap.cap_of(level).into_owned();
        if fits_cap(&sum, &touched) {
            continue;
        }
        let Some(m) = touched
            .iter()
            .find(|m| in_use(&sum, m) > sum.quota.get(m))
            .or_else(|| touched.iter().next())
            .cloned()
        else {
            continue;
        };
        return Err(Decision::deny(
            INSUFFICIENT,
            format!(
                "queue {q} cannot move under {}: {level} would have {} {m} in use ({} there, {} moving with {q}), quota {}",
                rec.parent.as_ref().map_or("root", QueueName::as_str),
                in_use(&sum, &m),
                in_use(&here, &m),
                in_use(&moving, &m),
                sum.quota.get(&m)
            ),
        ));
    }
    Ok(())
}

fn quota_of(r: &QueueRecord) -> Option<&Quota> {
    r.quota.as_ref().and_then(|q| q.as_ref().ok())
}

/// Warnings, not refusals: a GitOps apply may be one of several that put the tree right.
fn warnings(snap: &Snapshot, rec: &QueueRecord, c: &Chain, now: jiff::Timestamp) -> Vec<String> {
    let q = &rec.name;
    let mut out = Vec::new();
    let card_parent = c
        .ancestors
        .iter()
        .find(|a| snap.queue(a).is_some_and(|r| r.quota.is_some()));
    if let Some(Ok(b)) = &rec.borrow {
        if card_parent.is_none() && b.entries().values().any(|n| !n.is_zero()) {
            out.push(format!(
                "queue {q}: volcano.sh/card.borrow has no effect: no ancestor carries volcano.sh/card.quota to borrow from"
            ));
        }
    }
    let own = quota_of(rec);
    if let (Some(p), Some(own)) = (card_parent, own) {
        if let Some(pq) = snap.queue(p).and_then(quota_of) {
            for (m, n) in own.entries() {
                if *n > pq.get(m) {
                    out.push(format!(
                        "queue {q}: its quota for {m} ({n}) is above its parent {p}'s ({})",
                        pq.get(m)
                    ));
                }
            }
            // The parent's children's shares, with this queue as it will be.
            let mut children = snap.card_children(p);
            if !children.contains(q) {
                children.push(q.clone());
            }
            out.extend(oversubscribed(snap, p, pq, &children, Some(rec)));
        }
    }
    if let Some(own) = own {
        // root becoming a budget: its children are every top queue, from now on.
        let top_queues = || -> Vec<QueueName> {
            snap.queues()
                .filter(|r| r.parent.is_none() && r.name.as_str() != QueueName::ROOT)
                .filter(|r| snap.is_card_level(&r.name))
                .map(|r| r.name.clone())
                .collect()
        };
        let children = if q.as_str() == QueueName::ROOT && !snap.has_children(q) {
            top_queues()
        } else {
            snap.card_children(q)
        };
        if !children.is_empty() {
            out.extend(oversubscribed(snap, q, own, &children, None));
            let u = subtree_usage(snap, q, now);
            for (m, n) in own.entries() {
                let used = in_use(&u, m);
                if *n < used {
                    out.push(format!(
                        "queue {q}: quota for {m} ({n}) is below the current usage of its subtree ({used}); nothing is evicted, charges that raise it are refused"
                    ));
                }
            }
            for (p, n) in own.caps() {
                let used = u.cap_row(p, *n).in_use();
                if *n < used {
                    out.push(format!(
                        "queue {q}: group cap {p} ({n}) is below the current usage of its subtree ({used}); nothing is evicted, charges that raise it are refused"
                    ));
                }
            }
        }
    }
    out
}

/// `parent`'s children's shares above its quota, per model.
fn oversubscribed(
    snap: &Snapshot,
    parent: &QueueName,
    quota: &Quota,
    children: &[QueueName],
    replaced: Option<&QueueRecord>,
) -> Vec<String> {
    let share = |c: &QueueName| -> Quota {
        match replaced.filter(|r| r.name == *c) {
            Some(r) => quota_of(r).cloned().unwrap_or_default(),
            None => snap.share_of(c),
        }
    };
    let shares: Vec<(QueueName, Quota)> = children.iter().map(|c| (c.clone(), share(c))).collect();
    let models: BTreeSet<&CardName> = shares
        .iter()
        .flat_map(|(_, s)| s.entries().keys())
        .collect();
    let mut out = Vec::new();
    for m in models {
        let total: Cards = shares.iter().map(|(_, s)| s.get(m)).sum();
        if total > quota.get(m) {
            let parts: Vec<String> = shares
                .iter()
                .filter(|(_, s)| !s.get(m).is_zero())
                .map(|(c, s)| format!("{c} {}", s.get(m)))
                .collect();
            out.push(format!(
                "queue {parent}: the shares of its children ({}) add up to {total} {m}, above its quota {}: nothing can be borrowed there and shares are first come, first served",
                super::messages::short_list(&parts),
                quota.get(m)
            ));
        }
    }
    // A group cap of the parent caps its children's shares together.
    for (p, cap) in quota.caps() {
        let under: Vec<(&QueueName, Cards)> = shares
            .iter()
            .map(|(c, s)| (c, share_under(snap, s, p)))
            .filter(|(_, n)| !n.is_zero())
            .collect();
        let total: Cards = under.iter().map(|(_, n)| *n).sum();
        if total > *cap {
            let parts: Vec<String> = under.iter().map(|(c, n)| format!("{c} {n}")).collect();
            out.push(format!(
                "queue {parent}: the shares of its children ({}) add up to {total} cards under its group cap {p}, above the cap ({cap}): nothing can be borrowed there and shares are first come, first served",
                super::messages::short_list(&parts),
            ));
        }
    }
    out
}

/// The most of a share `s` that counts under the pattern `p`: its models `p` matches
/// (named, or reached through one of its own caps), at most any cap of its own that
/// holds all of `p`.
fn share_under(snap: &Snapshot, s: &Quota, p: &CardPattern) -> Cards {
    let through_caps = snap
        .known_models()
        .filter(|m| s.caps_over(m).next().is_some());
    let models: BTreeSet<&CardName> = s.entries().keys().chain(through_caps).collect();
    let sum: Cards = models
        .into_iter()
        .filter(|m| p.matches(m))
        .map(|m| s.get(m))
        .sum();
    s.caps()
        .iter()
        .filter(|(c, _)| c.contains(p))
        .map(|(_, n)| *n)
        .fold(sum, Cards::min)
}
