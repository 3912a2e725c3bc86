//! The tree of queues (`spec.parent`) as card quota reads it (docs/hierarchy.md): card
//! levels, ancestors, subtrees. Every walk is bounded, so a cycle or a very long chain
//! stored in the cluster costs a bounded amount and is reported, not followed.

use std::collections::BTreeSet;

use crate::cards::{QueueName, Quota};
use crate::cluster::QueueRecord;

use super::Snapshot;

pub use crate::cards::names::WALK_LIMIT;

/// Why a queue's place in the tree refuses its charges (only its subtree is affected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeFault {
    /// The parents lead back to a queue already walked: these queues, in walk order.
    Cycle(Vec<QueueName>),
    /// More than [`WALK_LIMIT`] ancestors.
    TooDeep,
    /// A card level above whose `card.quota` or `card.borrow` does not parse.
    BrokenAncestor { ancestor: QueueName, error: String },
    /// An ancestor that is Closed or Closing.
    ClosedAncestor { ancestor: QueueName, state: String },
}

/// Where a queue sits for card charges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ancestry {
    /// The card levels above the queue (ancestors with `card.quota`), nearest first.
    pub levels: Vec<QueueName>,
    /// Every ancestor walked, nearest first (transparent ones included).
    pub ancestors: Vec<QueueName>,
    /// A `spec.parent` naming a queue that does not exist: the walk stopped there.
    pub missing: Option<QueueName>,
}

/// Volcano's `root` queue, as a parent.
static ROOT: std::sync::LazyLock<QueueName> =
    std::sync::LazyLock::new(|| QueueName::new(QueueName::ROOT));

impl Snapshot {
    /// The parent card-quota reads for `r`: its `spec.parent`; for a queue under `root`
    /// (empty or `root`), `root` only when an admin made it a budget (`card.quota` on it),
    /// else none (a top queue).
    pub fn link<'a>(&'a self, r: &'a QueueRecord) -> Option<&'a QueueName> {
        match &r.parent {
            Some(p) => Some(p),
            None if self.root_budget && r.name.as_str() != QueueName::ROOT => Some(&ROOT),
            None => None,
        }
    }

    /// Builds the children index again from every queue (root's budget changed).
    pub(super) fn relink_all(&mut self) {
        self.children.clear();
        let links: Vec<(QueueName, QueueName)> = self
            .queues
            .values()
            .filter_map(|r| Some((r.name.clone(), self.link(r)?.clone())))
            .collect();
        for (c, p) in links {
            self.children.entry(p).or_default().insert(c);
        }
        self.dirty = super::Dirty::All;
        self.tree_changed();
    }

    /// The queues whose `spec.parent` is `q`.
    pub fn children_of(&self, q: &QueueName) -> impl Iterator<Item = &QueueName> {
        self.children.get(q).into_iter().flatten()
    }

    /// True when some queue names `q` as its parent.
    pub fn has_children(&self, q: &QueueName) -> bool {
        self.children.get(q).is_some_and(|c| !c.is_empty())
    }

    /// The tally's subtree sums follow the new tree.
    pub(super) fn tree_changed(&mut self) {
        self.tree_epoch += 1;
        self.tree_seen |= !self.is_flat();
        let parents = self
            .queues
            .values()
            .filter_map(|r| Some((r.name.clone(), self.link(r)?.clone())))
            .collect();
        self.tally.set_parents(parents);
    }

    pub(super) fn unlink(&mut self, child: &QueueName, parent: Option<&QueueName>) {
        if let Some(p) = parent {
            if let Some(set) = self.children.get_mut(p) {
                set.remove(child);
                if set.is_empty() {
                    self.children.remove(p);
                }
            }
        }
    }

    /// True when no queue in the snapshot has a parent: the cluster is flat, and every
    /// tree rule is skipped.
    pub fn is_flat(&self) -> bool {
        self.children.is_empty()
    }

    /// The ancestors of `q` and its card levels. A fault anywhere on the way up refuses
    /// `q`'s charges; a missing parent does not (the queue is then a top level).
    pub fn ancestry(&self, q: &QueueName) -> Result<Ancestry, TreeFault> {
        let mut out = Ancestry::default();
        if self.is_flat() {
            return Ok(out);
        }
        let mut seen: BTreeSet<&QueueName> = BTreeSet::from([q]);
        let mut walked = vec![q.clone()];
        let mut at = self.queues.get(q).and_then(|r| self.link(r));
        while let Some(p) = at {
            if !seen.insert(p) {
                let from = walked.iter().position(|w| w == p).unwrap_or(0);
                let mut cycle = walked[from..].to_vec();
                cycle.push(p.clone());
                return Err(TreeFault::Cycle(cycle));
            }
            if walked.len() > WALK_LIMIT {
                return Err(TreeFault::TooDeep);
            }
            walked.push(p.clone());
            let Some(rec) = self.queues.get(p) else {
                out.missing = Some(p.clone());
                break;
            };
            if rec.is_closed() {
                return Err(TreeFault::ClosedAncestor {
                    ancestor: p.clone(),
                    state: rec.state.clone().unwrap_or_default(),
                });
            }
            out.ancestors.push(p.clone());
            if let Some(quota) = &rec.quota {
                let broken = quota.as_ref().err().map(ToString::to_string).or_else(|| {
                    rec.borrow
                        .as_ref()
                        .and_then(|b| b.as_ref().err())
                        .map(ToString::to_string)
                });
                if let Some(error) = broken {
                    return Err(TreeFault::BrokenAncestor {
                        ancestor: p.clone(),
                        error,
                    });
                }
                out.levels.push(p.clone());
            }
            at = self.link(rec);
        }
        Ok(out)
    }

    /// The ledger `q`'s charges are recorded in: its own, or, below card levels, the one
    /// of its tree's top card level, so that charges that borrow from a pool are
    /// serialized between replicas (docs/hierarchy.md).
    pub fn ledger_key(&self, q: &QueueName) -> QueueName {
        if self.is_flat() {
            return q.clone();
        }
        match self.ancestry(q) {
            Ok(a) => a.levels.last().cloned().unwrap_or_else(|| q.clone()),
            Err(_) => q.clone(),
        }
    }

    /// The queues above `q` (existing ones, nearest first), bounded; empty on a cycle's
    /// second lap.
    pub fn ancestors_of(&self, q: &QueueName) -> Vec<QueueName> {
        let mut out: Vec<QueueName> = Vec::new();
        let mut at = self.queues.get(q).and_then(|r| self.link(r));
        while let Some(p) = at {
            if p == q || out.contains(p) || out.len() > WALK_LIMIT {
                break;
            }
            out.push(p.clone());
            at = self.queues.get(p).and_then(|r| self.link(r));
        }
        out
    }

    /// The card parent of `q`: its nearest ancestor with `card.quota` (`None` at the
    /// top, or on a fault).
    pub fn card_parent(&self, q: &QueueName) -> Option<QueueName> {
        self.ancestry(q).ok()?.levels.into_iter().next()
    }

    /// True when `q` is a card level: it carries `card.quota`, or has no children.
    pub fn is_card_level(&self, q: &QueueName) -> bool {
        !self.has_children(q) || self.queues.get(q).is_some_and(|r| r.quota.is_some())
    }

    /// The card children of `x`: the card levels below it whose card parent is `x`
    /// (transparent queues in between are looked through). Bounded by [`WALK_LIMIT`]
    /// levels; a cycle below is not followed twice.
    pub fn card_children(&self, x: &QueueName) -> Vec<QueueName> {
        let mut out = Vec::new();
        let mut seen: BTreeSet<&QueueName> = BTreeSet::from([x]);
        let mut frontier: Vec<(&QueueName, usize)> = self.children_of(x).map(|c| (c, 1)).collect();
        while let Some((c, depth)) = frontier.pop() {
            if !seen.insert(c) || depth > WALK_LIMIT {
                continue;
            }
            if self.is_card_level(c) {
                out.push(c.clone());
            } else {
                frontier.extend(self.children_of(c).map(|g| (g, depth + 1)));
            }
        }
        out.sort();
        out
    }

    /// `x` and every queue below it, each once, bounded by [`WALK_LIMIT`] levels.
    pub fn subtree(&self, x: &QueueName) -> Vec<QueueName> {
        let mut seen: BTreeSet<&QueueName> = BTreeSet::new();
        let mut frontier: Vec<(&QueueName, usize)> = vec![(x, 0)];
        while let Some((c, depth)) = frontier.pop() {
            if depth > WALK_LIMIT || !seen.insert(c) {
                continue;
            }
            frontier.extend(self.children_of(c).map(|g| (g, depth + 1)));
        }
        seen.into_iter().cloned().collect()
    }

    /// The share of `q` (its `card.quota`, 0 for every model without one or when it does
    /// not parse).
    pub fn share_of(&self, q: &QueueName) -> Quota {
        self.queues
            .get(q)
            .map(|r| r.effective_quota())
            .unwrap_or_default()
    }

    /// What `q`'s subtree may use: its quota, plus its `card.borrow` when it has a card
    /// parent to borrow from.
    pub fn borrow_of(&self, q: &QueueName) -> Option<Quota> {
        let b = self.queues.get(q)?.borrow.as_ref()?.as_ref().ok()?;
        self.card_parent(q).map(|_| b.clone())
    }
}
