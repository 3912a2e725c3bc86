//! Per-queue, per-model usage (DESIGN §1): allocated from bound pods, pending from
//! unbound pods, reserved from PodGroup requests not yet covered by their own pods.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cards::{Alternatives, CardName, ObjectKey, Quota};
use crate::cluster::{NodeModels, PodGroupRecord, PodRecord};

use super::feasibility::Demand;

/// Who a demand belongs to, so a decision can replace it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Pod(ObjectKey),
    Group(ObjectKey),
    /// A demand with no object yet (replicas a scale-up would add).
    Planned,
}

/// The usage of one queue, and the open demands its feasibility depends on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueUsage {
    pub quota: Quota,
    pub allocated: BTreeMap<CardName, u64>,
    pub pending: BTreeMap<Alternatives, u64>,
    pub reserved: BTreeMap<Alternatives, u64>,
    /// Pending pods (indivisible) and reservations (divisible), oldest first.
    pub demands: Vec<(Source, u64, Demand)>,
    /// Things that could not be charged, for logs.
    pub problems: Vec<String>,
}

/// One row of the usage table (also the JSON of `volcano.sh/card.usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Row {
    pub quota: u64,
    pub allocated: u64,
    pub pending: u64,
    pub reserved: u64,
}

impl Row {
    pub fn in_use(&self) -> u64 {
        self.allocated + self.pending + self.reserved
    }
    /// Room left; negative when over quota.
    pub fn free(&self) -> i64 {
        self.quota as i64 - self.in_use() as i64
    }
}

impl QueueUsage {
    /// Room per model: quota minus allocated (may be negative after a quota cut).
    pub fn rooms(&self) -> BTreeMap<CardName, i64> {
        let mut r: BTreeMap<CardName, i64> = self
            .quota
            .0
            .iter()
            .map(|(m, q)| (m.clone(), *q as i64))
            .collect();
        for (m, a) in &self.allocated {
            *r.entry(m.clone()).or_default() -= *a as i64;
        }
        r
    }

    /// Rows per model (and composite key) that have a quota entry or non-zero usage.
    pub fn rows(&self) -> BTreeMap<String, Row> {
        let mut out: BTreeMap<String, Row> = BTreeMap::new();
        for (m, q) in &self.quota.0 {
            out.entry(m.to_string()).or_default().quota = *q;
        }
        for (m, a) in &self.allocated {
            if *a > 0 {
                out.entry(m.to_string()).or_default().allocated = *a;
            }
        }
        for (k, p) in &self.pending {
            if *p > 0 {
                out.entry(k.to_string()).or_default().pending = *p;
            }
        }
        for (k, r) in &self.reserved {
            if *r > 0 {
                out.entry(k.to_string()).or_default().reserved = *r;
            }
        }
        out
    }

    /// Numbers for a denial naming `key`: every demand that competes for its models.
    pub fn competing(&self, key: &Alternatives) -> Row {
        let overlaps = |k: &Alternatives| k.models().iter().any(|m| key.contains(m));
        Row {
            quota: key.models().iter().map(|m| self.quota.get(m)).sum(),
            allocated: key
                .models()
                .iter()
                .map(|m| self.allocated.get(m).copied().unwrap_or(0))
                .sum(),
            pending: self
                .pending
                .iter()
                .filter(|(k, _)| overlaps(k))
                .map(|(_, n)| n)
                .sum(),
            reserved: self
                .reserved
                .iter()
                .filter(|(k, _)| overlaps(k))
                .map(|(_, n)| n)
                .sum(),
        }
    }
}

/// The models a bound pod is charged for, per card resource: its recorded
/// `card.charged`, else its node's model, else its first alternative (fail closed).
pub fn bound_charges(
    pod: &PodRecord,
    nodes: &impl NodeModels,
) -> Result<Vec<(CardName, u64)>, String> {
    let Some(node) = &pod.node else {
        return Ok(Vec::new());
    };
    let demand = pod.demand.as_ref().map_err(Clone::clone)?;
    let mut out = Vec::new();
    for (res, n) in demand {
        let model = match (&pod.charged, demand.len()) {
            (Some(c), 1) => Some(c.clone()),
            _ => match nodes.node_model(node, res) {
                Some(Some(m)) => Some(m.clone()),
                _ => pod
                    .alternatives()
                    .map(|a| a.first().clone())
                    .or_else(|| pod.charged.clone()),
            },
        };
        match model {
            Some(m) => out.push((m, *n)),
            None => return Err(format!("pod {} on node {node}: no model for {res} (node unknown or unlabelled, and the pod names none)", pod.key)),
        }
    }
    Ok(out)
}

/// A group member's cards: its bound model or its pending alternatives.
type MemberCards = (Option<CardName>, Option<Alternatives>, u64);

/// Computes the usage of one queue from its pods and PodGroups.
pub fn queue_usage<'a>(
    quota: Quota,
    pods: impl IntoIterator<Item = &'a PodRecord>,
    groups: impl IntoIterator<Item = &'a PodGroupRecord>,
    nodes: &impl NodeModels,
    now: jiff::Timestamp,
) -> QueueUsage {
    let mut u = QueueUsage {
        quota,
        ..Default::default()
    };
    // Cards of each group's pods, as (bound model | pending alternatives, cards).
    let mut group_pods: BTreeMap<(String, String), Vec<MemberCards>> = BTreeMap::new();
    let mut pending_pods: Vec<(u64, ObjectKey, Demand)> = Vec::new();
    for p in pods {
        if !p.is_active(now) {
            continue;
        }
        let gkey = p
            .group
            .as_ref()
            .map(|g| (p.key.namespace.clone(), g.clone()));
        if p.node.is_some() {
            match bound_charges(p, nodes) {
                Ok(charges) => {
                    for (m, n) in charges {
                        *u.allocated.entry(m.clone()).or_default() += n;
                        if let Some(g) = &gkey {
                            group_pods
                                .entry(g.clone())
                                .or_default()
                                .push((Some(m), None, n));
                        }
                    }
                }
                Err(e) => u.problems.push(e),
            }
            continue;
        }
        let cards = p.cards();
        if cards == 0 {
            continue;
        }
        match p.alternatives() {
            Some(a) => {
                *u.pending.entry(a.clone()).or_default() += cards;
                if let Some(g) = &gkey {
                    group_pods
                        .entry(g.clone())
                        .or_default()
                        .push((None, Some(a.clone()), cards));
                }
                pending_pods.push((
                    p.seq,
                    p.key.clone(),
                    Demand {
                        models: a.clone(),
                        cards,
                        divisible: false,
                    },
                ));
            }
            None => u.problems.push(format!(
                "pending pod {} names no valid card model; it is charged when bound",
                p.key
            )),
        }
    }
    let mut reservations: Vec<(u64, ObjectKey, Demand)> = Vec::new();
    for g in groups {
        let Some(req) = g.live_request() else {
            continue;
        };
        let mut left: Vec<u64> = req.0.iter().map(|(_, n)| *n).collect();
        let members = group_pods.get(&(g.key.namespace.clone(), g.key.name.clone()));
        for (model, alts, n) in members.into_iter().flatten() {
            let entry = req.0.iter().position(|(k, _)| match (model, alts) {
                (Some(m), _) => k.contains(m),
                (None, Some(a)) => a.is_subset_of(k),
                _ => false,
            });
            if let Some(i) = entry {
                left[i] = left[i].saturating_sub(*n);
            }
        }
        for ((k, _), l) in req.0.iter().zip(left) {
            if l > 0 {
                *u.reserved.entry(k.clone()).or_default() += l;
                reservations.push((
                    g.seq,
                    g.key.clone(),
                    Demand {
                        models: k.clone(),
                        cards: l,
                        divisible: true,
                    },
                ));
            }
        }
    }
    reservations.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    pending_pods.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    u.demands = reservations
        .into_iter()
        .map(|(s, k, d)| (Source::Group(k), s, d))
        .chain(
            pending_pods
                .into_iter()
                .map(|(s, k, d)| (Source::Pod(k), s, d)),
        )
        .collect();
    u
}
