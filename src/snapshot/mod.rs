//! A read-only view of the objects the decisions need, as plain maps with the indexes
//! that keep a decision proportional to its queue, not to the cluster. Backed by
//! watch events in `serve` and by a YAML stream in `replay`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::cards::annotations::Enforcement;
use crate::cards::hashing::{Map, Set};
use crate::cards::CardResources;
use crate::cards::{CardName, NodeCards, ObjectKey, QueueName, Quota};

use crate::ledger::entries::{Stream, Watermark};
use crate::ledger::{Adjusted, QueueUsage, Tally};

use crate::cluster::records::{
    JobRecord, PodGroupRecord, PodRecord, QueueRecord, WorkloadKind, WorkloadRecord,
};
use crate::cluster::NodeModels;
use crate::ledger::LedgerRecord;

mod dra;
pub use dra::DraRecord;
pub mod gone;
pub mod load;
pub mod overlay;
pub mod pins_in_flight;
pub mod tree;

/// A pod's queue depends on this PodGroup (its name, in the pod's namespace), which
/// the snapshot does not hold (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PodGroup {0} is not known")]
pub struct UnknownGroup(pub String);

/// Picks object keys (a relist's sweep picks the keys the relist did not return).
pub type KeyPick<'a> = &'a dyn Fn(&ObjectKey) -> bool;

/// Past this many remembered seal sightings, those of seals no ledger holds any more
/// are forgotten (a ledger holds one seal per queue).
const SEALS_SEEN_MAX: usize = 10_000;

/// The cluster as the decisions see it.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    nodes: Map<String, NodeCards>,
    /// Which extended resources are cards (the install's `--card-resource` list).
    card_resources: CardResources,
    /// DeviceClasses, ResourceClaimTemplates, ResourceClaims and published devices.
    dra: crate::cards::dra::DraObjects,
    /// Card pods that use ResourceClaims: read again when a DRA object changes.
    claim_pods: Set<ObjectKey>,
    /// Counts changes of a node's cards: what is reported as unmanaged is computed again
    /// only when it moved.
    cards_changes: u64,
    model_resources: BTreeMap<CardName, BTreeMap<String, usize>>,
    /// model -> the nodes that offer it (the pin checks a constrained pod against those
    /// only, not against every node of the cluster, under the lock).
    model_nodes: BTreeMap<CardName, BTreeSet<String>>,
    /// model -> the node label (key, value) that places a pod on it.
    model_pins: BTreeMap<CardName, (String, String)>,
    queues: BTreeMap<QueueName, QueueRecord>,
    /// Queue -> the queues whose `spec.parent` names it (whether it exists or not).
    children: BTreeMap<QueueName, BTreeSet<QueueName>>,
    /// The Queue `root` carries `card.quota`: a budget over every top queue.
    root_budget: bool,
    /// Counts the changes of the queue tree that may send a queue's charges to another
    /// ledger (a link, root's budget, a card level).
    tree_epoch: u64,
    /// Some queue has had a parent (or root a budget) since the snapshot began: charges
    /// may have been recorded in a ledger other than their queue's own.
    tree_seen: bool,
    /// The tree epoch at which every ledger was last read from the API server (live);
    /// `None` when ledgers are not watched (offline: the ledgers given are all there are).
    ledgers_read: Option<u64>,
    /// Queues read from the API server itself (a quorum read, not the cache), with
    /// when: what lifts the seal of a tree change that never landed.
    queues_confirmed: BTreeMap<QueueName, (Option<u64>, jiff::Timestamp)>,
    /// Queues whose quorum read was last tried (and failed or timed out), with when: a
    /// writer does not try again within the read gap (a stalled connection would
    /// otherwise cost every write of the ledger the read's timeout).
    queue_reads_failed: BTreeMap<QueueName, jiff::Timestamp>,
    /// When this replica first saw each seal (by the Queue and version it waits for), on
    /// its own clock: the one a seal whose change never landed is lifted by. One per
    /// sealing change still in a ledger, forgotten once no ledger holds it.
    seals_seen: BTreeMap<String, BTreeMap<u64, jiff::Timestamp>>,
    /// Namespace -> the queue its `scheduling.volcano.sh/queue-name` annotation names:
    /// where Volcano puts a PodGroup of queue `default` made in it.
    namespace_queues: Map<String, QueueName>,
    groups: Map<ObjectKey, PodGroupRecord>,
    pods: Map<ObjectKey, PodRecord>,
    /// Pins this replica chose at `/mutate` whose charge it has not recorded yet: only
    /// ever an order of preference (see the module).
    pins_in_flight: pins_in_flight::PinsInFlight,
    other_pods: Map<ObjectKey, Option<Box<str>>>,
    /// Card pods and PodGroups the watches showed deleted.
    gone: gone::GoneObjects,
    workloads: Map<(WorkloadKind, ObjectKey), WorkloadRecord>,
    /// Volcano Jobs: the demand of a PodGroup without `card.request` comes from them.
    jobs: Map<ObjectKey, JobRecord>,
    /// The Jobs come from a watch (live), which may not show a Job yet; offline, the
    /// Jobs given are all there are.
    jobs_mirrored: bool,
    /// Hashed, not ordered: a decision's ledger overlay files and unfiles each laid pod
    /// here, and nothing reads a queue's pods in key order (its usage is sums).
    pods_by_queue: Map<QueueName, Set<ObjectKey>>,
    groups_by_queue: Map<QueueName, BTreeSet<ObjectKey>>,
    pods_by_group: Map<ObjectKey, BTreeSet<ObjectKey>>,
    /// Node -> the card pods bound to it: a node whose cards change counts its own pods
    /// again, not every pod of the cluster (one event, bounded work under the lock).
    pods_by_node: Map<String, Set<ObjectKey>>,
    /// Namespace -> its card pods that take their queue from the namespace's annotation
    /// ([`takes_namespace_queue`]): what a change of that annotation files again.
    namespace_pods: Map<String, Set<ObjectKey>>,
    ledgers: BTreeMap<QueueName, Arc<LedgerRecord>>,
    /// Ledgers holding charges of other queues (a tree's, or one left by a change of
    /// the tree): in a flat cluster, the only ones another ledger's decisions may need.
    ledgers_naming_others: BTreeSet<QueueName>,
    /// How far the pod and PodGroup watches have come (resourceVersions).
    progress: Watermark,
    /// Usage per queue, kept up to date with every change above.
    tally: Tally,
    /// Set for one decision only, to the install's enforcement (see
    /// [`Snapshot::lifted`]).
    lifting: Option<Enforcement>,
    seq: u64,
    dirty: Dirty,
}

/// A pod whose queue is its namespace's `scheduling.volcano.sh/queue-name`: no queue
/// stamped, no PodGroup named, Volcano's scheduler (its PodGroup is made in the
/// namespace's queue).
fn takes_namespace_queue(p: &PodRecord) -> bool {
    p.stamped_queue.is_none() && p.group.is_none() && p.volcano_scheduled()
}

/// Queues whose usage may have changed since the reconciler last looked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Dirty {
    #[default]
    None,
    Queues(BTreeSet<QueueName>),
    /// Node changes can move every bound pod without a recorded charge.
    All,
}

impl Dirty {
    fn mark(&mut self, q: &QueueName) {
        match self {
            Self::All => {}
            Self::None => *self = Self::Queues(BTreeSet::from([q.clone()])),
            Self::Queues(s) => {
                s.insert(q.clone());
            }
        }
    }
}

impl NodeModels for Snapshot {
    fn node_model(&self, node: &str, resource: &str) -> Option<Option<&CardName>> {
        self.nodes.node_model(node, resource)
    }
}

impl NodeModels for Map<String, NodeCards> {
    fn node_model(&self, node: &str, resource: &str) -> Option<Option<&CardName>> {
        self.get(node).map(|n| n.model_for(resource))
    }
}

impl Snapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// The enforcement in force for `queue`: its own annotation, else `default` (the
    /// install's; a malformed annotation, which the queue hook refuses, also falls back
    /// to it).
    pub fn enforcement_of(&self, queue: &QueueName, default: Enforcement) -> Enforcement {
        match self.queue(queue).map(|q| &q.enforcement) {
            Some(Ok(Some(e))) => *e,
            _ => default,
        }
    }

    /// True when some queue may be in `warn` under the install's `default`.
    pub fn any_warn(&self, default: Enforcement) -> bool {
        default == Enforcement::Warn
            || self
                .queues
                .values()
                .any(|q| q.enforcement == Ok(Some(Enforcement::Warn)))
    }

    /// Runs `f` with the quota of every `warn` queue unlimited (`default`: the
    /// install's enforcement): what a request would be if those queues enforced nothing.
    /// The snapshot is as it was afterwards.
    pub fn lifted<T>(&mut self, default: Enforcement, f: impl FnOnce(&Snapshot) -> T) -> T {
        self.lifting = Some(default);
        // A panicking decision must not leave every later one lifted (the webhook's
        // lock survives a panic).
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        self.lifting = None;
        out.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// True while [`Snapshot::lifted`] runs, for a `warn` queue.
    pub fn quota_lifted(&self, queue: &QueueName) -> bool {
        self.lifting
            .is_some_and(|d| self.enforcement_of(queue, d) == Enforcement::Warn)
    }

    /// A monotonically increasing number that orders objects by arrival.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    // ---- nodes -------------------------------------------------------------------

    pub fn upsert_node(&mut self, name: String, mut cards: NodeCards) {
        // Only the install's card resources are cards; the others a node announces are
        // kept apart and reported.
        cards.keep_managed(|r| self.card_resources.matches(r));
        cards.set_extended(self.dra.extended_cards(&name), |r| {
            self.card_resources.matches(r)
        });
        self.place_node(name, cards);
    }

    /// Reads again what `node` offers through DRA-backed extended resources (its
    /// ResourceSlices or the DeviceClasses changed).
    pub(super) fn reread_extended(&mut self, node: &str) {
        let Some(mut cards) = self.nodes.get(node).cloned() else {
            return;
        };
        cards.set_extended(self.dra.extended_cards(node), |r| {
            self.card_resources.matches(r)
        });
        self.place_node(node.to_string(), cards);
    }

    fn place_node(&mut self, name: String, cards: NodeCards) {
        let before = self.nodes.get(&name).map(|n| &n.extended_problems);
        for p in &cards.extended_problems {
            if !before.is_some_and(|b| b.contains(p)) {
                tracing::warn!("node {name}: {p}");
            }
        }
        if self.nodes.get(&name) == Some(&cards) {
            return;
        }
        self.detach_node(&name);
        self.dirty = Dirty::All;
        self.cards_changes += 1;
        for (res, (m, _)) in &cards.resources {
            *self
                .model_resources
                .entry(m.clone())
                .or_default()
                .entry(res.clone())
                .or_default() += 1;
            if let Some(pin) = cards.pins.get(res) {
                self.model_pins
                    .entry(m.clone())
                    .or_insert_with(|| pin.clone());
            }
            self.model_nodes
                .entry(m.clone())
                .or_default()
                .insert(name.clone());
        }
        self.nodes.insert(name.clone(), cards);
        self.retally_node(&name);
    }

    pub fn remove_node(&mut self, name: &str) {
        self.cards_changes += 1;
        self.detach_node(name);
        self.retally_node(name);
    }

    /// Bound pods may be charged by their node's model: count them again.
    fn retally_node(&mut self, name: &str) {
        let on: Vec<ObjectKey> = self
            .pods_by_node
            .get(name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for k in on {
            let q = self.tally.queue_of(&k).cloned();
            self.retally_pod(&k, q);
        }
    }

    /// Takes a node out of the indexes.
    fn detach_node(&mut self, name: &str) {
        let Some(old) = self.nodes.remove(name) else {
            return;
        };
        self.dirty = Dirty::All;
        for (res, (m, _)) in &old.resources {
            if let Some(on) = self.model_nodes.get_mut(m) {
                on.remove(name);
                if on.is_empty() {
                    self.model_nodes.remove(m);
                }
            }
            if let Some(by_res) = self.model_resources.get_mut(m) {
                if let Some(c) = by_res.get_mut(res) {
                    *c -= 1;
                    if *c == 0 {
                        by_res.remove(res);
                    }
                }
                if by_res.is_empty() {
                    self.model_resources.remove(m);
                    self.model_pins.remove(m);
                }
            }
        }
    }

    pub fn node(&self, name: &str) -> Option<&NodeCards> {
        self.nodes.get(name)
    }

    /// Names of every node held.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// Is `resource` a card resource of this install?
    pub fn is_card_resource(&self, resource: &str) -> bool {
        self.card_resources.matches(resource)
    }

    /// The install's card resources.
    pub fn card_resources(&self) -> &CardResources {
        &self.card_resources
    }

    /// Sets the install's card resources. Set before any object is added: nodes and
    /// pods are read with the list in force when they arrive.
    pub fn set_card_resources(&mut self, c: CardResources) {
        if self.dra.settings() != c.dra() {
            self.dra = crate::cards::dra::DraObjects::new(c.dra().clone());
        }
        self.card_resources = c;
    }

    /// How many times nodes' cards changed: a reader that saw the same
    /// count has seen the same unmanaged cards.
    pub fn cards_changes(&self) -> u64 {
        self.cards_changes
    }

    /// Nodes that announce cards of resources this install does not gate: node, resource,
    /// model and cards (reported, never counted).
    pub fn unmanaged_cards(&self) -> impl Iterator<Item = (&str, &str, &CardName, u64)> {
        self.nodes.iter().flat_map(|(n, c)| {
            c.unmanaged
                .iter()
                .map(move |(r, (m, k))| (n.as_str(), r.as_str(), m, *k))
        })
    }

    /// Nodes with allocatable card resources no product label names a model for: node,
    /// resource and cards (reported: nothing can be pinned to or charged on them).
    pub fn modelless_cards(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.nodes.iter().flat_map(|(n, c)| {
            c.modelless
                .iter()
                .map(move |(r, k)| (n.as_str(), r.as_str(), *k))
        })
    }

    /// Resources that request `model` on some node.
    /// Every model some node offers, by name.
    pub fn known_models(&self) -> impl Iterator<Item = &CardName> {
        self.model_resources.keys()
    }

    pub fn resources_of(&self, model: &CardName) -> Option<&BTreeMap<String, usize>> {
        self.model_resources.get(model)
    }

    /// Whether some node offers `model` for `resource` and whether one of those the
    /// pod's own constraints allow: (offered, allowed).
    pub fn model_nodes_allowed(
        &self,
        model: &CardName,
        resource: &str,
        constraints: &crate::cluster::placement::NodeConstraints<'_>,
    ) -> (bool, bool) {
        let mut offered = false;
        let on = self.model_nodes.get(model).into_iter().flatten();
        for (name, n) in on.filter_map(|name| self.nodes.get(name).map(|n| (name, n))) {
            if n.model_for(resource) != Some(model) {
                continue;
            }
            offered = true;
            if constraints.allow(name, &n.labels) {
                return (true, true);
            }
        }
        (offered, false)
    }

    /// Models some node offers for `resource`, by name.
    pub fn models_offering(&self, resource: &str) -> Vec<CardName> {
        self.model_resources
            .iter()
            .filter(|(_, r)| r.contains_key(resource))
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Pins this replica chose at `/mutate` and has not charged yet.
    pub fn pins_in_flight(&self) -> &pins_in_flight::PinsInFlight {
        &self.pins_in_flight
    }

    pub fn pins_in_flight_mut(&mut self) -> &mut pins_in_flight::PinsInFlight {
        &mut self.pins_in_flight
    }

    /// The node label (key, value) that places a pod on `model`, when a node offers it.
    pub fn pin_of(&self, model: &CardName) -> Option<&(String, String)> {
        self.model_pins.get(model)
    }

    /// Models offered for `resource` on nodes whose `label` equals `product`.
    pub fn models_for_product(
        &self,
        label: &str,
        product: &str,
        resource: &str,
    ) -> BTreeSet<CardName> {
        let prefix = label.split('/').next().unwrap_or("");
        self.nodes
            .values()
            .filter(|n| {
                n.prefixes.iter().any(|p| p == prefix) && n.products.iter().any(|p| p == product)
            })
            .filter_map(|n| n.model_for(resource).cloned())
            .collect()
    }

    // ---- queues ------------------------------------------------------------------

    /// Stores a Queue unless the snapshot already holds a newer version of it (a
    /// write's answer can arrive after the watch delivered a later change).
    pub fn remember_queue(&mut self, rec: QueueRecord) {
        let newer = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (Some(a), Some(b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) => a > b,
                _ => false,
            },
            _ => false,
        };
        if let Some(cur) = self.queue(&rec.name) {
            if newer(&cur.resource_version, &rec.resource_version) {
                return;
            }
        }
        self.upsert_queue(rec);
    }

    pub fn upsert_queue(&mut self, q: QueueRecord) {
        self.dirty.mark(&q.name);
        let name = q.name.clone();
        let budget = q.quota.is_some();
        let was_level = self.queues.get(&name).map(|r| r.quota.is_some());
        if !self.is_flat() && was_level != Some(budget) {
            // A card level appears or goes: the top card level of a tree may change.
            self.tree_epoch += 1;
        }
        let old_link = self.queues.get(&name).and_then(|r| self.link(r)).cloned();
        let old_ancestors = self.ancestors_of(&name);
        self.queues.insert(name.clone(), q);
        if name.as_str() == QueueName::ROOT && budget != self.root_budget {
            // root became (or stopped being) a cluster budget: every top queue moves.
            self.root_budget = budget;
            self.relink_all();
            return;
        }
        let new_link = self.queues.get(&name).and_then(|r| self.link(r)).cloned();
        if old_link != new_link {
            // The old ancestors lose the queue's usage from their subtree sums.
            for a in old_ancestors {
                self.dirty.mark(&a);
            }
            self.unlink(&name, old_link.as_ref());
            if let Some(p) = new_link {
                self.children.entry(p).or_default().insert(name);
            }
            self.tree_changed();
        }
    }

    pub fn remove_queue(&mut self, name: &QueueName) {
        self.dirty.mark(name);
        let link = self.queues.get(name).and_then(|r| self.link(r)).cloned();
        if self.queues.remove(name).is_some() {
            if name.as_str() == QueueName::ROOT && self.root_budget {
                self.root_budget = false;
                self.relink_all();
            } else if link.is_some() {
                self.unlink(name, link.as_ref());
                self.tree_changed();
            }
        }
    }

    /// Marks a queue for the reconciler to look at again.
    pub fn mark_dirty(&mut self, q: &QueueName) {
        self.dirty.mark(q);
    }

    /// Takes the set of queues whose usage may have changed.
    pub fn take_dirty(&mut self) -> Dirty {
        // A queue's subtree sums and pool change with every queue below it.
        if let (false, Dirty::Queues(set)) = (self.is_flat(), &self.dirty) {
            let above: Vec<QueueName> = set.iter().flat_map(|q| self.ancestors_of(q)).collect();
            for q in above {
                self.dirty.mark(&q);
            }
        }
        std::mem::take(&mut self.dirty)
    }

    pub fn queue(&self, name: &QueueName) -> Option<&QueueRecord> {
        self.queues.get(name)
    }

    pub fn queues(&self) -> impl Iterator<Item = &QueueRecord> {
        self.queues.values()
    }

    /// The queues `namespace`'s card pods are counted in and its PodGroups name: what a
    /// tenant of that namespace is charged to.
    pub fn queues_used_in(&self, namespace: &str) -> BTreeSet<QueueName> {
        let pods = self
            .pods
            .keys()
            .filter(|k| k.namespace == namespace)
            .filter_map(|k| self.tally.queue_of(k).cloned());
        let groups = self
            .groups
            .values()
            .filter(|g| g.key.namespace == namespace)
            .map(|g| g.queue.clone());
        pods.chain(groups).collect()
    }

    /// Every queue that has a record, a pod or a PodGroup.
    pub fn queue_names(&self) -> BTreeSet<QueueName> {
        let mut out: BTreeSet<QueueName> = self.queues.keys().cloned().collect();
        out.extend(
            self.pods_by_queue
                .iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(q, _)| q.clone()),
        );
        out.extend(
            self.groups_by_queue
                .iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(q, _)| q.clone()),
        );
        out
    }

    // ---- ledgers ---------------------------------------------------------------------

    /// Says that ledgers are watched: from now on a change of the queue tree makes
    /// [`Snapshot::ledgers_behind_tree`] true until every ledger is read again.
    pub fn watch_ledgers(&mut self) {
        self.ledgers_read.get_or_insert(self.tree_epoch);
    }

    /// True once some queue has had a parent (or root a budget).
    pub fn tree_seen(&self) -> bool {
        self.tree_seen
    }

    /// The count of tree changes so far (see [`Snapshot::ledgers_read_at`]).
    pub fn tree_epoch(&self) -> u64 {
        self.tree_epoch
    }

    /// True when the queue tree changed since every ledger was last read: a queue's
    /// charges may have moved to a ledger whose watch has not delivered the charges
    /// recorded before the change, so no charge is decided until they are read again.
    pub fn ledgers_behind_tree(&self) -> bool {
        self.ledgers_read.is_some_and(|r| r < self.tree_epoch)
    }

    /// Records that every ledger was read (a consistent list) after the tree reached
    /// `epoch`; the stored ledgers of that read were given to [`Snapshot::upsert_ledger`].
    pub fn ledgers_read_at(&mut self, epoch: u64) {
        if let Some(r) = self.ledgers_read.as_mut() {
            *r = (*r).max(epoch);
        }
    }

    /// Records a quorum read of Queue `q` made at `at`: its resourceVersion, or `None`
    /// when it does not exist.
    pub fn confirm_queue(&mut self, q: &QueueName, version: Option<u64>, at: jiff::Timestamp) {
        self.queue_reads_failed.remove(q);
        self.queues_confirmed.insert(q.clone(), (version, at));
    }

    /// Records that a quorum read of Queue `q` asked for at `at` failed or timed out.
    pub fn queue_read_failed(&mut self, q: &QueueName, at: jiff::Timestamp) {
        self.queue_reads_failed.insert(q.clone(), at);
    }

    /// When a quorum read of Queue `q` last failed, since its last success.
    pub fn queue_read_failure(&self, q: &QueueName) -> Option<jiff::Timestamp> {
        self.queue_reads_failed.get(q).copied()
    }

    /// Notes that this replica saw `seal` at `now` (the first sighting is kept).
    pub fn note_seal(&mut self, seal: &crate::ledger::seal::Seal, now: jiff::Timestamp) {
        if self.seal_seen(seal).is_some() {
            return;
        }
        if self.seals_seen.values().map(BTreeMap::len).sum::<usize>() >= SEALS_SEEN_MAX {
            let live: BTreeSet<(&str, u64)> = self
                .ledgers
                .values()
                .flat_map(|l| l.ledger.seals().values())
                .map(|s| (s.by.as_str(), s.version))
                .collect();
            for (by, seen) in self.seals_seen.iter_mut() {
                seen.retain(|v, _| live.contains(&(by.as_str(), *v)));
            }
            self.seals_seen.retain(|_, seen| !seen.is_empty());
        }
        self.seals_seen
            .entry(seal.by.clone())
            .or_default()
            .insert(seal.version, now);
    }

    /// When this replica first saw `seal` (see [`Snapshot::note_seal`]).
    pub fn seal_seen(&self, seal: &crate::ledger::seal::Seal) -> Option<jiff::Timestamp> {
        self.seals_seen.get(&seal.by)?.get(&seal.version).copied()
    }

    /// The last quorum read of Queue `q` (see [`Snapshot::confirm_queue`]).
    pub fn queue_confirmed(&self, q: &QueueName) -> Option<(Option<u64>, jiff::Timestamp)> {
        self.queues_confirmed.get(q).copied()
    }

    /// The resourceVersion of Queue `q` as the cache holds it (`None`: absent, or not a
    /// number).
    pub fn queue_version(&self, q: &QueueName) -> Option<u64> {
        self.queues
            .get(q)?
            .resource_version
            .as_deref()?
            .parse()
            .ok()
    }

    /// Stores a ledger unless the snapshot already holds a newer version of it.
    pub fn upsert_ledger(&mut self, l: LedgerRecord) {
        if let Some(cur) = self.ledgers.get(&l.queue) {
            if cur.is_newer_than(&l) {
                return;
            }
        }
        if l.ledger.iter().any(|(_, e)| e.queue.is_some()) {
            self.ledgers_naming_others.insert(l.queue.clone());
        } else {
            self.ledgers_naming_others.remove(&l.queue);
        }
        self.ledgers.insert(l.queue.clone(), Arc::new(l));
    }

    pub fn remove_ledger(&mut self, queue: &QueueName) {
        self.ledgers.remove(queue);
        self.ledgers_naming_others.remove(queue);
    }

    /// The stored ledgers that hold charges of queues other than their own.
    pub fn ledgers_naming_others(&self) -> impl Iterator<Item = &Arc<LedgerRecord>> {
        self.ledgers_naming_others
            .iter()
            .filter_map(|q| self.ledgers.get(q))
    }

    /// The queue's stored ledger (empty when none is stored); cheap to hold on to.
    pub fn ledger(&self, queue: &QueueName) -> Arc<LedgerRecord> {
        self.ledgers
            .get(queue)
            .cloned()
            .unwrap_or_else(|| Arc::new(LedgerRecord::empty(queue.clone())))
    }

    pub fn ledgers(&self) -> impl Iterator<Item = &Arc<LedgerRecord>> {
        self.ledgers.values()
    }

    /// How far the pod and PodGroup caches have come.
    pub fn progress(&self) -> Watermark {
        self.progress
    }

    pub fn set_progress(&mut self, p: Watermark) {
        self.progress = p;
    }

    // ---- pod groups --------------------------------------------------------------

    pub fn upsert_group(&mut self, g: PodGroupRecord) {
        let key = g.key.clone();
        let old_queue = self.groups.get(&key).map(|o| o.queue.clone());
        if let Some(q) = &old_queue {
            if let Some(s) = self.groups_by_queue.get_mut(q) {
                s.remove(&key);
            }
        }
        self.groups_by_queue
            .entry(g.queue.clone())
            .or_default()
            .insert(key.clone());
        let changed = old_queue.as_ref() != Some(&g.queue);
        if let Some(q) = &old_queue {
            self.dirty.mark(q);
        }
        self.dirty.mark(&g.queue);
        self.groups.insert(key.clone(), g);
        if changed {
            self.reindex_group_pods(&key);
        }
        self.tally.group(&key, self.groups.get(&key));
    }

    /// A PodGroup deleted (a watch's delete, or a relist that no longer returns it):
    /// removed, and remembered as gone (see [`gone`]).
    pub fn delete_group(&mut self, key: &ObjectKey) {
        if let Some(g) = self.groups.get(key) {
            self.gone.record(Stream::PodGroups, key, &g.version);
        }
        self.remove_group(key);
    }

    /// Takes the PodGroup out of the snapshot (also a ledger overlay's undo, which
    /// deletes nothing).
    pub fn remove_group(&mut self, key: &ObjectKey) {
        if let Some(g) = self.groups.remove(key) {
            self.dirty.mark(&g.queue);
            if let Some(s) = self.groups_by_queue.get_mut(&g.queue) {
                s.remove(key);
            }
            self.reindex_group_pods(key);
            self.tally.group(key, None);
        }
    }

    /// Keys of the PodGroups held that `pick` picks (a relist's sweep picks the
    /// unlisted, so only they are copied).
    pub fn group_keys(&self, pick: KeyPick<'_>) -> Vec<ObjectKey> {
        self.groups.keys().filter(|k| pick(k)).cloned().collect()
    }

    pub fn group(&self, key: &ObjectKey) -> Option<&PodGroupRecord> {
        self.groups.get(key)
    }

    /// Card pods that name the PodGroup `group` (whatever queue they are charged to).
    pub fn group_pods(&self, group: &ObjectKey) -> impl Iterator<Item = &PodRecord> {
        self.pods_by_group
            .get(group)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k))
    }

    fn reindex_group_pods(&mut self, group: &ObjectKey) {
        let members: Vec<ObjectKey> = self
            .pods_by_group
            .get(group)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        self.refile_pods(members);
    }

    /// Files `pods` again under the queue each resolves to now, and counts them there.
    fn refile_pods(&mut self, pods: Vec<ObjectKey>) {
        for k in pods {
            if let Some(mut p) = self.pods.get(&k).cloned() {
                let previous = self.tally.queue_of(&k).cloned();
                // Shared claims are paid per queue: a pod that moves may pay for one
                // now, or no longer, and so may the sharers it leaves and joins.
                let sharer = !p.claims.is_empty()
                    && previous.as_ref() != self.resolve_queue(&p).ok().as_ref();
                if sharer {
                    self.read_claims(&mut p);
                    self.put_pod(p.clone());
                }
                let q = self.index_pod(&p, previous);
                self.retally_pod(&k, Some(q));
                if sharer {
                    self.reread_sharers(&p);
                }
            }
        }
    }

    /// A pod's queue for charging: the queue stamped on it at admission, else the
    /// queue Volcano would schedule it in ([`Snapshot::volcano_queue`]).
    /// An error when that depends on a PodGroup this snapshot does not hold.
    pub fn resolve_queue(&self, pod: &PodRecord) -> Result<QueueName, UnknownGroup> {
        match &pod.stamped_queue {
            Some(q) => Ok(q.clone()),
            None => self.volcano_queue(pod),
        }
    }

    /// The queue Volcano schedules a pod in (docs/annotations.md): its PodGroup's queue, else
    /// [`Snapshot::named_queue`].
    pub fn volcano_queue(&self, pod: &PodRecord) -> Result<QueueName, UnknownGroup> {
        if let Some(g) = &pod.group {
            return self
                .groups
                .get(&ObjectKey::new(pod.key.namespace.clone(), g.clone()))
                .map(|g| g.queue.clone())
                .ok_or_else(|| UnknownGroup(g.clone()));
        }
        Ok(self.named_queue(pod))
    }

    /// The queue of a pod without a PodGroup: the queue its label or annotations name,
    /// else `default`; for a pod of Volcano's scheduler, `default` is the queue its
    /// Namespace names, if it names one. Volcano makes such a pod a PodGroup of that
    /// queue and its PodGroup webhook sends a PodGroup of `default` there
    /// (v1.15.1 podgroups/mutate), an explicit `default` included.
    pub fn named_queue(&self, pod: &PodRecord) -> QueueName {
        let named = pod.named_queue.clone();
        if named.as_ref().is_none_or(QueueName::is_default) && pod.volcano_scheduled() {
            if let Some(q) = self.namespace_queues.get(&pod.key.namespace) {
                return q.clone();
            }
        }
        named.unwrap_or_else(QueueName::default_queue)
    }

    /// The Namespaces that name a queue.
    pub fn namespaces_naming_queues(&self) -> Vec<String> {
        self.namespace_queues.keys().cloned().collect()
    }

    /// The queue `namespace`'s `scheduling.volcano.sh/queue-name` annotation names.
    pub fn namespace_queue(&self, namespace: &str) -> Option<&QueueName> {
        self.namespace_queues.get(namespace)
    }

    /// Records the queue a Namespace names (`None`: it names none, or it is gone). Pods
    /// already admitted keep their stamped queue; the others of the namespace are filed
    /// again.
    pub fn set_namespace_queue(&mut self, namespace: &str, queue: Option<QueueName>) {
        let old = match queue {
            Some(q) => self
                .namespace_queues
                .insert(namespace.to_string(), q.clone()),
            None => self.namespace_queues.remove(namespace),
        };
        if old.as_ref() == self.namespace_queues.get(namespace) {
            return;
        }
        let moved: Vec<ObjectKey> = self
            .namespace_pods
            .get(namespace)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        self.refile_pods(moved);
    }

    // ---- pods --------------------------------------------------------------------

    /// Files a card pod under its queue (taking it out of the old one); returns the queue.
    /// The queue a pod is counted in lives in the tally (one copy per pod).
    fn index_pod(&mut self, p: &PodRecord, previous: Option<QueueName>) -> QueueName {
        self.unindex_pod(&p.key);
        // A PodGroup that is gone (or not cached yet) does not move a pod's cards: it
        // stays where it was, or goes where it names itself.
        let q = self
            .resolve_queue(p)
            .unwrap_or_else(|_| previous.unwrap_or_else(|| self.named_queue(p)));
        self.pods_by_queue
            .entry(q.clone())
            .or_default()
            .insert(p.key.clone());
        self.dirty.mark(&q);
        q
    }

    /// Takes a pod out of the queue the tally counts it in (the tally is re-counted
    /// right after).
    fn unindex_pod(&mut self, key: &ObjectKey) {
        if let Some(q) = self.tally.queue_of(key).cloned() {
            if let Some(s) = self.pods_by_queue.get_mut(&q) {
                s.remove(key);
            }
            self.dirty.mark(&q);
        }
    }

    /// Adds or replaces a pod; pods without cards are only remembered by key. A
    /// replaced pod keeps its place in the queue (its `seq`).
    pub fn upsert_pod(&mut self, mut p: PodRecord) {
        p.reclassify(|r| self.card_resources.matches(r));
        self.read_claims(&mut p);
        if p.claims.is_empty() {
            self.claim_pods.remove(&p.key);
        } else {
            self.claim_pods.insert(p.key.clone());
        }
        if let Some(old) = self.pods.get(&p.key) {
            p.seq = old.seq;
        }
        let previous = self.tally.queue_of(&p.key).cloned();
        let new_here = !self.pods.contains_key(&p.key);
        // Bound, unbound, finished or going: who pays for its shared claims may change.
        let ran = |r: &PodRecord| (r.node.is_some(), r.phase.clone(), r.deletion);
        let runs_otherwise = self.pods.get(&p.key).is_some_and(|old| ran(old) != ran(&p));
        // Every card pod counts, whatever its scheduler (docs/decisions.md).
        if !p.is_card_pod() {
            self.remove_pod(&p.key);
            self.other_pods
                .insert(p.key.clone(), p.version.uid.as_deref().map(Into::into));
            return;
        }
        // A card pod replacing one: the tally swaps the old share for the new in the one
        // re-count below, so the old pod leaves only the indexes here.
        self.other_pods.remove(&p.key);
        let old_group = self.take_pod(&p.key).and_then(|old| old.group);
        if old_group != p.group {
            if let Some(g) = old_group {
                self.leave_group(&ObjectKey::new(p.key.namespace.clone(), g), &p.key);
            }
        }
        if let Some(g) = &p.group {
            self.pods_by_group
                .entry(ObjectKey::new(p.key.namespace.clone(), g.clone()))
                .or_default()
                .insert(p.key.clone());
        }
        let was = previous.clone();
        let q = self.index_pod(&p, previous);
        // Counted before it is stored: the record is at hand, and its key is cloned once.
        for g in self.tally.pod(&p.key, Some((&q, &p)), &self.nodes) {
            self.tally.group(&g, self.groups.get(&g));
        }
        // A pod new to shared claims, one that is bound (or stops) now, or one in
        // another queue now may pay for one another pod paid for, or no longer.
        let moved = was.as_ref() != Some(&q);
        let sharer =
            ((new_here || runs_otherwise || moved) && !p.claims.is_empty()).then(|| p.clone());
        self.put_pod(p);
        if let Some(p) = sharer {
            self.reread_sharers(&p);
        }
    }

    /// Counts a pod again in `queue`'s usage (`None`: it no longer counts), and its
    /// PodGroup's reservation with it.
    fn retally_pod(&mut self, key: &ObjectKey, queue: Option<QueueName>) {
        let now_in = self.pods.get(key).zip(queue.as_ref()).map(|(p, q)| (q, p));
        for g in self.tally.pod(key, now_in, &self.nodes) {
            self.tally.group(&g, self.groups.get(&g));
        }
    }

    /// A pod deleted (a watch's delete, or a relist that no longer returns it): removed,
    /// and a card pod remembered as gone (see [`gone`]).
    pub fn delete_pod(&mut self, key: &ObjectKey) {
        if let Some(p) = self.pods.get(key) {
            self.gone.record(Stream::Pods, key, &p.version);
        }
        self.remove_pod(key);
    }

    /// The deletion of the `stream` object with `uid` and `key`, when a watch showed it.
    pub fn gone(&self, stream: Stream, uid: &str, key: &ObjectKey) -> Option<&gone::Gone> {
        self.gone.get(stream, uid, key)
    }

    /// Takes the pod out of the snapshot (also a ledger overlay's undo, which deletes
    /// nothing).
    pub fn remove_pod(&mut self, key: &ObjectKey) {
        self.other_pods.remove(key);
        self.claim_pods.remove(key);
        if let Some(old) = self.take_pod(key) {
            self.unindex_pod(key);
            self.retally_pod(key, None);
            self.reread_sharers(&old);
            if let Some(g) = &old.group {
                self.leave_group(&ObjectKey::new(old.key.namespace.clone(), g.clone()), key);
            }
        }
    }

    /// Stores a card pod's record. With [`Snapshot::take_pod`], the only writes of
    /// `pods`: they keep the indexes by node and by namespace with it.
    fn put_pod(&mut self, p: PodRecord) {
        self.take_pod(&p.key);
        if let Some(n) = &p.node {
            self.pods_by_node
                .entry(n.clone())
                .or_default()
                .insert(p.key.clone());
        }
        if takes_namespace_queue(&p) {
            self.namespace_pods
                .entry(p.key.namespace.clone())
                .or_default()
                .insert(p.key.clone());
        }
        self.pods.insert(p.key.clone(), p);
    }

    /// Takes a card pod's record out of `pods` and of the indexes by node and namespace.
    fn take_pod(&mut self, key: &ObjectKey) -> Option<PodRecord> {
        let old = self.pods.remove(key)?;
        let unindex = |index: &mut Map<String, Set<ObjectKey>>, at: &str| {
            if let Some(s) = index.get_mut(at) {
                s.remove(key);
                if s.is_empty() {
                    index.remove(at);
                }
            }
        };
        if let Some(n) = &old.node {
            unindex(&mut self.pods_by_node, n);
        }
        if takes_namespace_queue(&old) {
            unindex(&mut self.namespace_pods, &key.namespace);
        }
        Some(old)
    }

    fn leave_group(&mut self, group: &ObjectKey, pod: &ObjectKey) {
        if let Some(s) = self.pods_by_group.get_mut(group) {
            s.remove(pod);
            if s.is_empty() {
                self.pods_by_group.remove(group);
            }
        }
    }

    pub fn pod(&self, key: &ObjectKey) -> Option<&PodRecord> {
        self.pods.get(key)
    }

    /// True when the pod is known and requests no cards.
    pub fn is_known_cardless_pod(&self, key: &ObjectKey) -> bool {
        self.other_pods.contains_key(key)
    }

    /// True when the pod with `uid` (any, if `None`) is known and requests no cards:
    /// another incarnation under its name says nothing about it.
    pub fn is_known_cardless_incarnation(&self, key: &ObjectKey, uid: Option<&str>) -> bool {
        match (self.other_pods.get(key), uid) {
            (None, _) => false,
            (Some(Some(known)), Some(uid)) => **known == *uid,
            (Some(_), _) => true,
        }
    }

    /// Keys of every pod held, card pods or not.
    pub fn pod_keys(&self) -> Vec<ObjectKey> {
        self.pod_keys_picked(&|_| true)
    }

    /// Keys of the pods held (card pods or not) that `pick` picks.
    pub fn pod_keys_picked(&self, pick: KeyPick<'_>) -> Vec<ObjectKey> {
        self.pods
            .keys()
            .chain(self.other_pods.keys())
            .filter(|k| pick(k))
            .cloned()
            .collect()
    }

    /// Card pods charged to `queue`.
    pub fn queue_pods(&self, queue: &QueueName) -> impl Iterator<Item = &PodRecord> {
        self.pods_by_queue
            .get(queue)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k))
    }

    /// How many card pods and PodGroups `queue` holds (what recounting it reads).
    pub fn queue_size(&self, queue: &QueueName) -> usize {
        let pods = self.pods_by_queue.get(queue).map_or(0, Set::len);
        let groups = self.groups_by_queue.get(queue).map_or(0, BTreeSet::len);
        pods + groups
    }

    /// PodGroups of `queue`.
    pub fn queue_groups(&self, queue: &QueueName) -> impl Iterator<Item = &PodGroupRecord> {
        self.groups_by_queue
            .get(queue)
            .into_iter()
            .flatten()
            .filter_map(|k| self.groups.get(k))
    }

    // ---- usage -------------------------------------------------------------------

    /// The usage of `queue` at `now`, from the incremental tally.
    pub fn usage(&self, queue: &QueueName, now: jiff::Timestamp) -> QueueUsage {
        let quota = self.cap_of(queue).into_owned();
        let mut u = self.tally.usage(
            queue,
            quota,
            |k| self.pods.get(k),
            |k| self.groups.get(k),
            &self.nodes,
            now,
        );
        if !self.quota_lifted(queue) {
            u.borrow = self.borrow_of(queue).unwrap_or_default();
        }
        u
    }

    /// What `queue`'s charges may reach: its quota (0 everywhere when it does not
    /// parse), plus its `card.borrow` when it has a card parent; unlimited while lifted.
    pub fn cap_of(&self, queue: &QueueName) -> Cow<'_, Quota> {
        if self.quota_lifted(queue) {
            return Cow::Owned(Quota::unlimited());
        }
        let own = match self.queue(queue).and_then(|q| q.quota.as_ref()) {
            Some(Ok(q)) => Cow::Borrowed(q),
            _ => Cow::Owned(Quota::default()),
        };
        match self.borrow_of(queue) {
            Some(b) => Cow::Owned(own.plus(&b)),
            None => own,
        }
    }

    /// The usage `queue`'s own objects count at `now` (quota left empty), read in place.
    pub fn counted(&self, queue: &QueueName, now: jiff::Timestamp) -> Cow<'_, QueueUsage> {
        self.tally.counted(
            queue,
            |k| self.pods.get(k),
            |k| self.groups.get(k),
            &self.nodes,
            now,
        )
    }

    /// The usage of `queue`'s whole subtree at `now`, itself included (quota left
    /// empty), from the sums the tally keeps per tree.
    pub fn subtree_usage(&self, queue: &QueueName, now: jiff::Timestamp) -> Cow<'_, QueueUsage> {
        self.tally.subtree_counted(
            queue,
            |k| self.pods.get(k),
            |k| self.groups.get(k),
            &self.nodes,
            now,
        )
    }

    /// The usage of `queue` at `now`, ready for a change on top, without a copy.
    pub fn adjusted(&self, queue: &QueueName, now: jiff::Timestamp) -> Adjusted<'_> {
        let quota = self.cap_of(queue);
        let base = self.tally.counted(
            queue,
            |k| self.pods.get(k),
            |k| self.groups.get(k),
            &self.nodes,
            now,
        );
        Adjusted::new(base, quota)
    }

    /// The members `group` has in `queue` at `now`, merged by models.
    pub fn group_members(
        &self,
        group: &ObjectKey,
        queue: &QueueName,
        now: jiff::Timestamp,
    ) -> crate::ledger::usage::Members {
        self.tally
            .members_now(group, queue, |k| self.pods.get(k), &self.nodes, now)
    }

    /// The queue a card pod is counted in.
    pub fn pod_queue(&self, key: &ObjectKey) -> Option<&QueueName> {
        self.tally.queue_of(key)
    }

    /// The incremental tally (for the recount that checks it).
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Drops a pod from the tally alone, as a lost event would (tests of the recount).
    #[cfg(test)]
    pub(crate) fn forget_in_tally(&mut self, key: &ObjectKey) {
        let _ = self.tally.pod(key, None, &self.nodes);
    }

    /// Rebuilds the tally from scratch (after a recount found it wrong).
    pub fn rebuild_tally(&mut self) {
        self.tally = Tally::default();
        let filed: Vec<(QueueName, ObjectKey)> = self
            .pods_by_queue
            .iter()
            .flat_map(|(q, keys)| keys.iter().map(move |k| (q.clone(), k.clone())))
            .collect();
        for (q, k) in filed {
            self.retally_pod(&k, Some(q));
        }
        let groups: Vec<ObjectKey> = self.groups.keys().cloned().collect();
        for g in groups {
            self.tally.group(&g, self.groups.get(&g));
        }
        self.tree_changed();
    }

    // ---- workloads ---------------------------------------------------------------

    pub fn upsert_workload(&mut self, mut w: WorkloadRecord) {
        w.template.reclassify(|r| self.card_resources.matches(r));
        self.workloads.insert((w.kind, w.key.clone()), w);
    }

    pub fn remove_workload(&mut self, kind: WorkloadKind, key: &ObjectKey) {
        self.workloads.remove(&(kind, key.clone()));
    }

    /// Keys of the workloads of `kind` held that `pick` picks.
    pub fn workload_keys(&self, kind: WorkloadKind, pick: KeyPick<'_>) -> Vec<ObjectKey> {
        self.workloads
            .keys()
            .filter(|(k, key)| *k == kind && pick(key))
            .map(|(_, key)| key.clone())
            .collect()
    }

    pub fn workload(&self, kind: WorkloadKind, key: &ObjectKey) -> Option<&WorkloadRecord> {
        self.workloads.get(&(kind, key.clone()))
    }

    /// PodGroups with card demand waiting in line (no phase or Pending): the Jobs
    /// card-quota holds at Volcano's enqueue, in no particular order.
    pub fn waiting_groups_unordered(&self) -> impl Iterator<Item = &PodGroupRecord> {
        self.groups.values().filter(|g| g.waits_in_line())
    }

    /// [`Snapshot::waiting_groups_unordered`], oldest first.
    pub fn waiting_groups(&self) -> Vec<&PodGroupRecord> {
        let mut w: Vec<&PodGroupRecord> = self.waiting_groups_unordered().collect();
        w.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
        w
    }

    // ---- Volcano Jobs -------------------------------------------------------------

    pub fn upsert_job(&mut self, mut j: JobRecord) {
        for (_, _, t) in &mut j.tasks {
            t.reclassify(|r| self.card_resources.matches(r));
        }
        self.jobs.insert(j.key.clone(), j);
    }

    pub fn remove_job(&mut self, key: &ObjectKey) {
        self.jobs.remove(key);
    }

    /// Keys of the Volcano Jobs held that `pick` picks.
    pub fn job_keys(&self, pick: KeyPick<'_>) -> Vec<ObjectKey> {
        self.jobs.keys().filter(|k| pick(k)).cloned().collect()
    }

    pub fn job(&self, key: &ObjectKey) -> Option<&JobRecord> {
        self.jobs.get(key)
    }

    /// Marks the Jobs as mirrored by a watch: a Job not shown may exist.
    pub fn mirror_jobs(&mut self) {
        self.jobs_mirrored = true;
    }

    /// True when a Job missing here may exist (see [`Snapshot::mirror_jobs`]).
    pub fn jobs_mirrored(&self) -> bool {
        self.jobs_mirrored
    }
}
