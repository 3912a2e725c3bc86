//! Per-queue, per-model usage (docs/decisions.md): allocated from bound pods, pending from
//! unbound pods, reserved from PodGroup requests not yet covered by their own pods.
//! [`queue_usage`] recounts a queue from scratch; `tally` keeps the same numbers up to
//! date one change at a time, and the recount is its reference.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::cards::demand::PodDemandError;
use crate::cards::quantity::Cards;
use crate::cards::{Alternatives, CardName, CardPattern, CardRequest, ObjectKey, Quota};
use crate::cluster::{NodeModels, PodGroupRecord, PodRecord};

use super::feasibility::Demand;
use super::flow::{Network, UNLIMITED};

/// The usage of one queue, and the open demands its feasibility depends on. Identical
/// demands are counted, not listed, so its size follows the models, not the pods.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueUsage {
    /// What the queue may use: its `card.quota`, plus `borrow`.
    pub quota: Quota,
    /// The part of `quota` that is borrowed from the card parent's pool (messages
    /// show it apart).
    pub borrow: Quota,
    pub allocated: BTreeMap<CardName, Cards>,
    pub pending: BTreeMap<Alternatives, Cards>,
    pub reserved: BTreeMap<Alternatives, Cards>,
    /// Pending pods (indivisible): how many wait with these models and cards each.
    pub waiting: BTreeMap<(Alternatives, Cards), u64>,
    /// Pods behind card-quota's scheduling gate: cards per models they may use. They
    /// hold no quota (a figure of their own, never part of a decision's room).
    pub gated: BTreeMap<Alternatives, Cards>,
    /// How many pods wait behind the gate.
    pub gated_pods: u64,
    /// Demands with no object yet (replicas a scale-up would add).
    pub planned: Vec<Demand>,
    /// Pods that could not be charged, for logs. Shared: every decision copies its
    /// queue's usage, and these can be many while no decision reads them.
    pub problems: Arc<BTreeMap<ObjectKey, String>>,
}

/// What one pod adds to its queue's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Share {
    /// Nothing: finished, or no cards.
    Nothing,
    /// Bound, or its claims allocated: cards per model it is charged for.
    Allocated(Vec<(CardName, Cards)>),
    /// Unbound: the models it may land on, and its cards.
    Pending(Alternatives, Cards),
    /// Unbound behind card-quota's scheduling gate: waits, holds no quota.
    Gated(Alternatives, Cards),
    /// It cannot be charged; the reason is logged.
    Problem(String),
}

impl Share {
    /// The share of `pod` while it is active (callers check [`PodRecord::is_active`]).
    pub fn of(pod: &PodRecord, nodes: &impl NodeModels) -> Self {
        if let Some(Err(e)) = &pod.claimed {
            return Self::Problem(e.to_string());
        }
        if pod.node.is_some() {
            return match bound_charges(pod, nodes) {
                Ok(c) if c.is_empty() => Self::Nothing,
                Ok(c) => Self::Allocated(c),
                Err(e) => Self::Problem(e.to_string()),
            };
        }
        if let Some(got) = pod.claims_allocated_unbound() {
            return match got {
                [] => Self::Nothing,
                got => Self::Allocated(got.to_vec()),
            };
        }
        let cards = pod.cards();
        if cards.is_zero() {
            return Self::Nothing;
        }
        match pod.effective_alternatives() {
            Some(a) if pod.gated => Self::Gated(a, cards),
            // Waiting without models to name (its card.name broken): still nothing held.
            None if pod.gated => Self::Nothing,
            Some(a) => Self::Pending(a, cards),
            None => Self::Problem(format!(
                "pending pod {} names no valid card model; it is charged when bound",
                pod.key
            )),
        }
    }

    /// What the pod gives its PodGroup's request to draw on: (models, cards).
    pub fn members(&self) -> Vec<(Alternatives, Cards)> {
        match self {
            Self::Allocated(c) => c
                .iter()
                .map(|(m, n)| (Alternatives::single(m.clone()), *n))
                .collect(),
            Self::Pending(a, n) => vec![(a.clone(), *n)],
            Self::Nothing | Self::Gated(..) | Self::Problem(_) => Vec::new(),
        }
    }
}

fn add_to<K: Ord + Clone>(map: &mut BTreeMap<K, Cards>, k: &K, n: Cards) {
    if !n.is_zero() {
        *map.entry(k.clone()).or_default() += n;
    }
}

/// Takes `n` off `k`, dropping the key at zero. False when there was less than `n`,
/// which means the caller's bookkeeping is wrong.
fn take_from<K: Ord>(map: &mut BTreeMap<K, Cards>, k: &K, n: Cards) -> bool {
    if n.is_zero() {
        return true;
    }
    let Some(v) = map.get_mut(k) else {
        return false;
    };
    let ok = *v >= n;
    *v = v.saturating_sub(n);
    if v.is_zero() {
        map.remove(k);
    }
    ok
}

/// A PodGroup's members, merged by models: what its request draws on.
pub type Members = BTreeMap<Alternatives, Cards>;

/// Adds (or, with `add` false, takes away) a pod's share in a members map.
pub fn merge_members(members: &mut Members, share: &Share, add: bool) -> bool {
    let mut ok = true;
    for (a, n) in share.members() {
        if add {
            add_to(members, &a, n);
        } else {
            ok &= take_from(members, &a, n);
        }
    }
    ok
}

/// What is left of a PodGroup's request once its members have drawn on it: the
/// group's reservation, by entry, zero entries left out.
pub fn reservation(req: &CardRequest, members: &Members) -> Vec<(Alternatives, Cards)> {
    let list: Vec<(Alternatives, Cards)> = members.iter().map(|(a, n)| (a.clone(), *n)).collect();
    req.0
        .iter()
        .zip(uncovered(req, &list))
        .filter(|(_, left)| !left.is_zero())
        .map(|((k, _), left)| (k.clone(), left))
        .collect()
}

/// One row of the usage table (also the JSON of `volcano.sh/card.usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Row {
    pub quota: Cards,
    pub allocated: Cards,
    pub pending: Cards,
    pub reserved: Cards,
    /// In a tree: the queue's `card.borrow` (what it may use beyond `quota`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow: Option<Cards>,
    /// In a tree: what the queue's subtree uses beyond its quota, from its card
    /// parent's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed: Option<Cards>,
    /// On a queue with child queues: the sum of its card children's quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<Cards>,
    /// On a queue with child queues: what its subtree may still take (quota + borrow
    /// minus effective use: the children's shares count whole); negative when its
    /// children's shares over-subscribe it.
    #[serde(default, rename = "free", skip_serializing_if = "Option::is_none")]
    pub pool_free: Option<i64>,
    /// Cards of pods waiting behind card-quota's gate for these models: a figure of its
    /// own, not in use (they hold no quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Cards>,
}

impl Row {
    pub fn in_use(&self) -> Cards {
        self.allocated + self.pending + self.reserved
    }
    /// Room left under the quota and what the queue may borrow; negative when over.
    pub fn free(&self) -> i128 {
        self.cap().signed_minus(self.in_use())
    }

    /// Quota plus borrow.
    pub fn cap(&self) -> Cards {
        self.quota + self.borrow.unwrap_or_default()
    }
}

impl QueueUsage {
    /// An empty usage under `quota`.
    pub fn new(quota: Quota) -> Self {
        Self {
            quota,
            ..Default::default()
        }
    }

    /// Counts a pod's share. `key` names the pod in problems.
    pub fn add_share(&mut self, key: &ObjectKey, share: &Share) {
        match share {
            Share::Nothing => {}
            Share::Allocated(c) => {
                for (m, n) in c {
                    add_to(&mut self.allocated, m, *n);
                }
            }
            Share::Pending(a, n) => {
                add_to(&mut self.pending, a, *n);
                *self.waiting.entry((a.clone(), *n)).or_default() += 1;
            }
            Share::Gated(a, n) => {
                add_to(&mut self.gated, a, *n);
                self.gated_pods += 1;
            }
            Share::Problem(e) => {
                Arc::make_mut(&mut self.problems).insert(key.clone(), e.clone());
            }
        }
    }

    /// Takes back a share counted by [`QueueUsage::add_share`]. False when it was not
    /// counted (a bookkeeping error; the numbers stay non-negative).
    pub fn sub_share(&mut self, key: &ObjectKey, share: &Share) -> bool {
        match share {
            Share::Nothing => true,
            Share::Allocated(c) => c.iter().fold(true, |ok, (m, n)| {
                take_from(&mut self.allocated, m, *n) && ok
            }),
            Share::Pending(a, n) => {
                let mut ok = take_from(&mut self.pending, a, *n);
                let k = (a.clone(), *n);
                match self.waiting.get_mut(&k) {
                    Some(c) if *c > 1 => *c -= 1,
                    Some(_) => {
                        self.waiting.remove(&k);
                    }
                    None => ok = false,
                }
                ok
            }
            Share::Gated(a, n) => {
                let ok = take_from(&mut self.gated, a, *n) && self.gated_pods > 0;
                self.gated_pods = self.gated_pods.saturating_sub(1);
                ok
            }
            Share::Problem(_) => {
                self.problems.contains_key(key)
                    && Arc::make_mut(&mut self.problems).remove(key).is_some()
            }
        }
    }

    /// Adds another queue's usage to this one (a subtree's sums); quotas untouched.
    pub fn absorb(&mut self, other: &QueueUsage) {
        for (m, n) in &other.allocated {
            add_to(&mut self.allocated, m, *n);
        }
        for (a, n) in &other.pending {
            add_to(&mut self.pending, a, *n);
        }
        for (a, n) in &other.reserved {
            add_to(&mut self.reserved, a, *n);
        }
        for (k, c) in &other.waiting {
            *self.waiting.entry(k.clone()).or_default() += *c;
        }
        for (a, n) in &other.gated {
            add_to(&mut self.gated, a, *n);
        }
        self.gated_pods += other.gated_pods;
        self.planned.extend(other.planned.iter().cloned());
        if !other.problems.is_empty() {
            let p = Arc::make_mut(&mut self.problems);
            p.extend(other.problems.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }

    /// Takes back what [`QueueUsage::absorb`] added (a queue's sums, out of a subtree's).
    pub fn remove(&mut self, other: &QueueUsage) {
        for (m, n) in &other.allocated {
            take_from(&mut self.allocated, m, *n);
        }
        for (a, n) in &other.pending {
            take_from(&mut self.pending, a, *n);
        }
        for (a, n) in &other.reserved {
            take_from(&mut self.reserved, a, *n);
        }
        for (a, n) in &other.gated {
            take_from(&mut self.gated, a, *n);
        }
        self.gated_pods = self.gated_pods.saturating_sub(other.gated_pods);
        for (k, c) in &other.waiting {
            if let Some(have) = self.waiting.get_mut(k) {
                *have = have.saturating_sub(*c);
                if *have == 0 {
                    self.waiting.remove(k);
                }
            }
        }
        if !other.problems.is_empty() {
            let p = Arc::make_mut(&mut self.problems);
            for k in other.problems.keys() {
                p.remove(k);
            }
        }
    }

    /// Cards this usage holds on `m` for the tree's effective-use rule, in a queue whose
    /// share is `share`: allocated on `m`, unbound demand for `m` alone, and unbound
    /// demand that may use several models placed as its pods would be, in its order: on
    /// each model up to what the share leaves, what exceeds every share on its first
    /// model (so a job's `A|B` cards borrow A only when no share has room for them).
    pub fn effective_use(&self, m: &CardName, share: &Quota) -> Cards {
        let unbound = || self.pending.iter().chain(&self.reserved);
        let mut out = self.allocated.get(m).copied().unwrap_or_default()
            + unbound()
                .filter(|(a, _)| a.models().len() == 1 && a.first() == m)
                .map(|(_, n)| *n)
                .sum::<Cards>();
        let mut composite = unbound().filter(|(a, _)| a.models().len() > 1).peekable();
        if composite.peek().is_none() {
            return out;
        }
        // What each model already holds before the multi-model demand is placed.
        let mut used: BTreeMap<&CardName, Cards> = BTreeMap::new();
        let base = |x: &CardName| {
            self.allocated.get(x).copied().unwrap_or_default()
                + unbound()
                    .filter(|(a, _)| a.models().len() == 1 && a.first() == x)
                    .map(|(_, n)| *n)
                    .sum::<Cards>()
        };
        for (a, n) in composite {
            let mut left = *n;
            for x in a.models() {
                let held = *used.entry(x).or_insert_with(|| base(x));
                let take = left.min(share.get(x).saturating_sub(held));
                used.insert(x, held + take);
                left = left.saturating_sub(take);
                if x == m {
                    out += take;
                }
            }
            if a.first() == m {
                out += left;
            }
            if !left.is_zero() {
                let first = a.first();
                let held = *used.entry(first).or_insert_with(|| base(first));
                used.insert(first, held + left);
            }
        }
        out
    }

    /// Counts a PodGroup's reservation.
    pub fn add_reservation(&mut self, r: &[(Alternatives, Cards)]) {
        for (a, n) in r {
            add_to(&mut self.reserved, a, *n);
        }
    }

    /// Takes back a reservation counted by [`QueueUsage::add_reservation`].
    pub fn sub_reservation(&mut self, r: &[(Alternatives, Cards)]) -> bool {
        r.iter().fold(true, |ok, (a, n)| {
            take_from(&mut self.reserved, a, *n) && ok
        })
    }

    /// Adds a demand with no object yet (replicas a scale-up would add).
    pub fn add_planned(&mut self, d: &Demand) {
        add_to(&mut self.pending, &d.models, d.total());
        self.planned.push(d.clone());
    }

    /// Every open demand, counted: reservations (divisible), pending pods, planned ones.
    pub fn demands(&self) -> Vec<Demand> {
        self.reserved
            .iter()
            .map(|(a, n)| Demand::job(a.clone(), *n))
            .chain(
                self.waiting
                    .iter()
                    .map(|((a, n), count)| Demand::pods(a.clone(), *n, *count)),
            )
            .chain(self.planned.iter().cloned())
            .collect()
    }

    /// Room per model the quota names or something is allocated on (see [`Self::room`]).
    pub fn rooms(&self) -> BTreeMap<CardName, i128> {
        self.quota
            .entries()
            .keys()
            .chain(self.allocated.keys())
            .map(|m| (m.clone(), self.room(m)))
            .collect()
    }

    /// Room on `m`: quota minus allocated (negative after a quota cut).
    pub fn room(&self, m: &CardName) -> i128 {
        let allocated = self.allocated.get(m).copied().unwrap_or_default();
        self.quota
            .get(m)
            .signed_minus(Cards::ZERO)
            .saturating_sub(allocated.signed_minus(Cards::ZERO))
    }

    /// Rows per model (and composite key) that have a quota entry or non-zero usage.
    pub fn rows(&self) -> BTreeMap<UsageKey, Row> {
        let mut out: BTreeMap<UsageKey, Row> = BTreeMap::new();
        for (m, q) in self.quota.entries() {
            out.entry(UsageKey::Model(m.clone())).or_default().quota = *q;
        }
        for (m, a) in &self.allocated {
            if !a.is_zero() {
                out.entry(UsageKey::Model(m.clone())).or_default().allocated = *a;
            }
        }
        for (k, p) in &self.pending {
            if !p.is_zero() {
                out.entry(UsageKey::of(k)).or_default().pending = *p;
            }
        }
        for (k, r) in &self.reserved {
            if !r.is_zero() {
                out.entry(UsageKey::of(k)).or_default().reserved = *r;
            }
        }
        for (k, w) in &self.gated {
            if !w.is_zero() {
                out.entry(UsageKey::of(k)).or_default().waiting = Some(*w);
            }
        }
        if !self.quota.caps().is_empty() {
            // A model only a cap names is limited by it.
            for (k, row) in out.iter_mut() {
                if let UsageKey::Model(m) = k {
                    if !self.quota.entries().contains_key(m) {
                        row.quota = self.quota.get(m);
                    }
                }
            }
            for (p, n) in self.quota.caps() {
                out.insert(UsageKey::Cap(p.clone()), self.cap_row(p, *n));
            }
        }
        out
    }

    /// Numbers for group cap `p` of `cap` cards: what the models it matches have
    /// allocated, and the pending and reserved demand that can only land under it.
    pub fn cap_row(&self, p: &CardPattern, cap: Cards) -> Row {
        let under = |k: &Alternatives| k.models().iter().all(|m| p.matches(m));
        Row {
            borrow: None,
            borrowed: None,
            shares: None,
            pool_free: None,
            waiting: None,
            quota: cap,
            allocated: self
                .allocated
                .iter()
                .filter(|(m, _)| p.matches(m))
                .map(|(_, n)| *n)
                .sum(),
            pending: self
                .pending
                .iter()
                .filter(|(k, _)| under(k))
                .map(|(_, n)| *n)
                .sum(),
            reserved: self
                .reserved
                .iter()
                .filter(|(k, _)| under(k))
                .map(|(_, n)| *n)
                .sum(),
        }
    }

    /// Numbers for a denial naming `key`: every demand that competes for its models.
    pub fn competing(&self, key: &Alternatives) -> Row {
        let overlaps = |k: &Alternatives| k.models().iter().any(|m| key.contains(m));
        Row {
            borrow: None,
            borrowed: None,
            shares: None,
            pool_free: None,
            waiting: None,
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

/// What a usage row counts: one model, or demand that may land on any of several
/// (`A|B`, pending multi-model pods and reservations). Ordered, and written, as its
/// text, so tables and the usage annotation list rows as before.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UsageKey {
    Model(CardName),
    Alternatives(Alternatives),
    /// A group cap (`*`, `NVIDIA-*`): the sum over the models it matches.
    Cap(CardPattern),
}

impl UsageKey {
    /// The key of demand on `a`: a model when `a` names one.
    pub fn of(a: &Alternatives) -> Self {
        match a.as_single() {
            Some(m) => Self::Model(m.clone()),
            None => Self::Alternatives(a.clone()),
        }
    }

    /// True for a single model (a row with a quota of its own).
    pub fn is_model(&self) -> bool {
        matches!(self, Self::Model(_))
    }

    /// True for a row with a limit of its own: a model or a group cap.
    pub fn has_quota(&self) -> bool {
        matches!(self, Self::Model(_) | Self::Cap(_))
    }

    fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Model(m) => m.as_str().into(),
            Self::Alternatives(a) => a.to_string().into(),
            Self::Cap(p) => p.to_string().into(),
        }
    }
}

impl std::fmt::Display for UsageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

impl Ord for UsageKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text().cmp(&other.text())
    }
}

impl PartialOrd for UsageKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl serde::Serialize for UsageKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> serde::Deserialize<'de> for UsageKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Alternatives::parse(&text)
            .map(|a| Self::of(&a))
            .map_err(serde::de::Error::custom)
    }
}

/// Why a bound pod cannot be charged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Demand(#[from] Box<PodDemandError>),
    #[error("pod {pod} on node {node}: no model for {resource} (node unknown or unlabelled, and the pod names none)")]
    NoModel {
        pod: ObjectKey,
        node: String,
        resource: String,
    },
}

/// The models a bound pod is charged for, per card resource: its recorded
/// `card.charged`, else its node's model, else its first alternative (fail closed).
pub fn bound_charges(
    pod: &PodRecord,
    nodes: &impl NodeModels,
) -> Result<Vec<(CardName, Cards)>, ChargeError> {
    let Some(node) = &pod.node else {
        return Ok(Vec::new());
    };
    let demand = pod.demand.as_ref().map_err(Clone::clone)?;
    let mut out = Vec::new();
    for (res, n) in demand {
        // Cards from claims: the models of the devices allocated, once they are.
        if let Some(Ok(c)) = &pod.claimed {
            if c.resource == *res {
                let got: Vec<(CardName, Cards)> = match &c.allocated {
                    Some(allocated) => allocated.clone(),
                    // Bound before this cache shows its claims allocated (the claim
                    // watch behind the pod watch, or a binding known from the ledger
                    // only): on every model it may have got, so its cards count bound
                    // whichever they are (a binding's hard line reads bound cards).
                    None => c
                        .per_model
                        .iter()
                        .filter(|(m, _)| pod.alternatives().is_none_or(|a| a.contains(m)))
                        .map(|(m, n)| (m.clone(), *n))
                        .collect(),
                };
                // None of them (its name narrows to no model its claims allow): by its
                // charge or its node, as any card resource.
                if c.allocated.is_some() || !got.is_empty() {
                    out.extend(got);
                    continue;
                }
            }
        }
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
            None => {
                return Err(ChargeError::NoModel {
                    pod: pod.key.clone(),
                    node: node.clone(),
                    resource: res.clone(),
                })
            }
        }
    }
    Ok(out)
}

/// Recounts the usage of one queue from its pods and PodGroups (the reference the
/// incremental tally is checked against).
pub fn queue_usage<'a>(
    quota: Quota,
    pods: impl IntoIterator<Item = &'a PodRecord>,
    groups: impl IntoIterator<Item = &'a PodGroupRecord>,
    nodes: &impl NodeModels,
    now: jiff::Timestamp,
) -> QueueUsage {
    let mut u = QueueUsage::new(quota);
    // What each group's pods give its request to draw on.
    let mut members: BTreeMap<ObjectKey, Members> = BTreeMap::new();
    for p in pods {
        if !p.is_active(now) {
            continue;
        }
        let share = Share::of(p, nodes);
        u.add_share(&p.key, &share);
        if let Some(g) = p.group_key() {
            merge_members(members.entry(g).or_default(), &share, true);
        }
    }
    let none = Members::new();
    for g in groups {
        if let Some(req) = g.live_request() {
            u.add_reservation(&reservation(req, members.get(&g.key).unwrap_or(&none)));
        }
    }
    u
}

/// What is left of each entry of a PodGroup's request once its own pods have drawn on
/// it (docs/decisions.md: reserved = request minus the group's pods). A member draws on every
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::annotations::{parse_card_name, parse_quota};

    #[test]
    fn several_models_fill_each_share_in_order_and_borrow_on_the_first() {
        let share = parse_quota("q", r#"{"A":1,"B":2}"#).expect("quota");
        let card = |s: &str| CardName::parse(s).expect("card name");
        let (a, b) = (card("A"), card("B"));
        let mut u = QueueUsage::new(share.clone());
        u.add_reservation(&[(parse_card_name("g", "A|B").expect("name"), Cards::from(3))]);
        assert_eq!(u.effective_use(&a, &share), Cards::from(1));
        assert_eq!(u.effective_use(&b, &share), Cards::from(2));
        // A B pod takes one of B's share first: one card of the job borrows, on A.
        add_to(
            &mut u.pending,
            &parse_card_name("p", "B").expect("name"),
            Cards::from(1),
        );
        assert_eq!(u.effective_use(&a, &share), Cards::from(2));
        assert_eq!(u.effective_use(&b, &share), Cards::from(2));
    }
}
