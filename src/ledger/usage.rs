//! Per-queue, per-model usage (DESIGN §1): allocated from bound pods, pending from
//! unbound pods, reserved from PodGroup requests not yet covered by their own pods.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cards::quantity::Cards;
use crate::cards::{Alternatives, CardName, CardRequest, ObjectKey, Quota};
use crate::cluster::{NodeModels, PodGroupRecord, PodRecord};

use super::feasibility::Demand;
use super::flow::{Network, UNLIMITED};

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
    pub allocated: BTreeMap<CardName, Cards>,
    pub pending: BTreeMap<Alternatives, Cards>,
    pub reserved: BTreeMap<Alternatives, Cards>,
    /// Pending pods (indivisible) and reservations (divisible), oldest first.
    pub demands: Vec<(Source, u64, Demand)>,
    /// Things that could not be charged, for logs.
    pub problems: Vec<String>,
}

/// One row of the usage table (also the JSON of `volcano.sh/card.usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Row {
    pub quota: Cards,
    pub allocated: Cards,
    pub pending: Cards,
    pub reserved: Cards,
}

impl Row {
    pub fn in_use(&self) -> Cards {
        self.allocated + self.pending + self.reserved
    }
    /// Room left; negative when over quota.
    pub fn free(&self) -> i128 {
        self.quota.signed_minus(self.in_use())
    }
}

impl QueueUsage {
    /// Room per model: quota minus allocated (may be negative after a quota cut).
    pub fn rooms(&self) -> BTreeMap<CardName, i128> {
        let mut r: BTreeMap<CardName, i128> = self
            .quota
            .0
            .iter()
            .map(|(m, q)| (m.clone(), q.signed_minus(Cards::ZERO)))
            .collect();
        for (m, a) in &self.allocated {
            let room = r.entry(m.clone()).or_default();
            *room = room.saturating_sub(a.signed_minus(Cards::ZERO));
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
            if !a.is_zero() {
                out.entry(m.to_string()).or_default().allocated = *a;
            }
        }
        for (k, p) in &self.pending {
            if !p.is_zero() {
                out.entry(k.to_string()).or_default().pending = *p;
            }
        }
        for (k, r) in &self.reserved {
            if !r.is_zero() {
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
                .map(|m| self.allocated.get(m).copied().unwrap_or_default())
                .sum(),
            pending: self
                .pending
                .iter()
                .filter(|(k, _)| overlaps(k))
                .map(|(_, n)| *n)
                .sum(),
            reserved: self
                .reserved
                .iter()
                .filter(|(k, _)| overlaps(k))
                .map(|(_, n)| *n)
                .sum(),
        }
    }
}

/// The models a bound pod is charged for, per card resource: its recorded
/// `card.charged`, else its node's model, else its first alternative (fail closed).
pub fn bound_charges(
    pod: &PodRecord,
    nodes: &impl NodeModels,
) -> Result<Vec<(CardName, Cards)>, String> {
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
    // Cards of each group's pods: the models each member may be on, and its cards.
    let mut group_pods: BTreeMap<(String, String), Vec<(Alternatives, Cards)>> = BTreeMap::new();
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
                                .push((Alternatives::single(m), n));
                        }
                    }
                }
                Err(e) => u.problems.push(e),
            }
            continue;
        }
        let cards = p.cards();
        if cards.is_zero() {
            continue;
        }
        match p.effective_alternatives() {
            Some(a) => {
                *u.pending.entry(a.clone()).or_default() += cards;
                if let Some(g) = &gkey {
                    group_pods
                        .entry(g.clone())
                        .or_default()
                        .push((a.clone(), cards));
                }
                pending_pods.push((p.seq, p.key.clone(), Demand::pod(a.clone(), cards)));
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
        let members = group_pods
            .get(&(g.key.namespace.clone(), g.key.name.clone()))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for ((k, _), left) in req.0.iter().zip(uncovered(req, members)) {
            if !left.is_zero() {
                *u.reserved.entry(k.clone()).or_default() += left;
                reservations.push((g.seq, g.key.clone(), Demand::job(k.clone(), left)));
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

/// What is left of each entry of a PodGroup's request once its own pods have drawn on
/// it (DESIGN §1: reserved = request minus the group's pods). A member draws on every
/// entry that shares a model with it, as much as a max-flow allows: first on entries
/// that name all of its models, then on entries that name some of them; narrow entries
/// before broad ones.
pub fn uncovered(req: &CardRequest, members: &[(Alternatives, Cards)]) -> Vec<Cards> {
    // Members with the same models are one node.
    let mut kinds: Vec<(&Alternatives, Cards)> = Vec::new();
    for (a, n) in members {
        match kinds.iter_mut().find(|(k, _)| *k == a) {
            Some((_, total)) => *total += *n,
            None => kinds.push((a, *n)),
        }
    }
    let entries = &req.0;
    if kinds.is_empty() {
        return entries.iter().map(|(_, n)| *n).collect();
    }
    // 0 = source, 1..=kinds, then entries, then the sink.
    let entry_node = |i: usize| 1 + kinds.len() + i;
    let sink = 1 + kinds.len() + entries.len();
    let mut net = Network::new(sink + 1);
    for (j, (a, n)) in kinds.iter().enumerate() {
        net.add(0, 1 + j, n.get());
        for (i, (k, _)) in entries.iter().enumerate() {
            if a.models().iter().any(|m| k.contains(m)) {
                net.add(1 + j, entry_node(i), UNLIMITED);
            }
        }
    }
    for (i, (_, n)) in entries.iter().enumerate() {
        net.add(entry_node(i), sink, n.get());
    }
    // Draw on the narrowest entries first: a broad entry (`A|B`) left over can still go
    // where a narrow one could not. Within that, entries naming all of a member's models
    // come before entries naming only some.
    let widest = entries
        .iter()
        .map(|(k, _)| k.models().len())
        .max()
        .unwrap_or(1);
    for all_models in [true, false] {
        for width in 1..=widest {
            let usable = |u: usize, v: usize| {
                if u == 0 || v == sink || u > kinds.len() {
                    return true;
                }
                let (key, _) = &entries[v - 1 - kinds.len()];
                let member = kinds[u - 1].0;
                key.models().len() <= width && (!all_models || member.is_subset_of(key))
            };
            net.push(0, sink, u128::MAX, usable);
        }
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, (_, n))| Cards::from_u128(n.get().saturating_sub(net.flow(entry_node(i), sink))))
        .collect()
}
