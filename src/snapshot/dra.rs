//! The snapshot's DRA objects (DeviceClasses, ResourceClaimTemplates, ResourceClaims,
//! ResourceSlices) and the pods whose cards come from them: a change of one reads the
//! pods it may move again.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::cards::dra::{
    claim_spec, device_class, is_claim_resource, slice_devices, ClaimCards, ClaimRecord,
    ClaimSource, ClaimSpec, Device, DeviceClass, DraError, DraObjects, DraSettings, DraView,
    Prepared,
};
use crate::cards::ObjectKey;
use crate::cluster::PodRecord;

use super::Snapshot;

impl Snapshot {
    /// The DRA settings.
    pub fn dra(&self) -> &DraSettings {
        self.dra.settings()
    }

    /// The DRA objects held.
    pub fn dra_objects(&self) -> &DraObjects {
        &self.dra
    }

    /// Reads what `p`'s claims add up to into its record: its card demand under the
    /// claims' resource name, and [`PodRecord::claimed`].
    pub(super) fn read_claims(&self, p: &mut PodRecord) {
        // A record without claims keeps the claims' cards it carries: a ledger entry's
        // pod holds them as admitted, with no claim to read them from.
        if p.claims.is_empty() {
            return;
        }
        let read = self
            .dra
            .pod_cards(&p.key, &p.claims, |c| self.payer(&[p], c));
        Self::set_claimed(p, read);
    }

    /// `p` as it would read were `claim` held as given (a claim's status write not
    /// applied yet), or `None` when `p` has no claims.
    pub fn with_claim_as(&self, p: &PodRecord, claim: ClaimRecord) -> Option<PodRecord> {
        if p.claims.is_empty() {
            return None;
        }
        let mut p = p.clone();
        let read = self
            .dra
            .pod_cards_if(&p.key, &p.claims, |c| self.payer(&[&p], c), claim);
        Self::set_claimed(&mut p, read);
        Some(p)
    }

    /// `p` read as bound to `node` (its claims' cards as it would pay for them then),
    /// and the other pods of its shared claims whose reading that changes: a shared
    /// claim's cards move to the pod whose binding puts them to use first.
    pub fn as_bound(&self, p: &PodRecord, node: &str) -> (PodRecord, Vec<PodRecord>) {
        let mut bound = p.clone();
        if p.claims.is_empty() {
            return (bound, Vec::new());
        }
        bound.node = Some(node.to_string());
        self.read_claims(&mut bound);
        let shared = shared_claims(p);
        let sharers = self
            .claim_pods
            .iter()
            .filter_map(|k| self.pods.get(k))
            .filter(|o| o.key != p.key && shared.iter().any(|c| uses(o, c)))
            .filter_map(|o| {
                let read = self
                    .dra
                    .pod_cards(&o.key, &o.claims, |c| self.payer(&[o, &bound], c));
                let mut again = o.clone();
                Self::set_claimed(&mut again, read);
                (again.claimed != o.claimed || again.demand != o.demand).then_some(again)
            })
            .collect();
        bound.node.clone_from(&p.node);
        (bound, sharers)
    }

    /// Who pays for a shared `claim` in the queue of `seen[0]` (one of its users, held
    /// yet or not, as it is read now), with the pods of `seen` as given rather than as
    /// held: of the claim's users held in that queue and not finished, the first it is
    /// reserved for that is bound (one not terminating before one that is), else the
    /// first it is reserved for, else the first by name.
    /// Per queue: the invariant counts a card in every queue with a pod that uses it, so
    /// a claim shared across queues is paid once in each, and a sharer of another queue
    /// is charged and checked like any claim pod (paid in one queue only, the cards
    /// moved into the other unchecked when their payer went).
    /// Held pods only: a claim as a lagging watch shows it may still be reserved for a
    /// pod gone, which would pay for nothing.
    /// Bound first: the pod whose binding puts the claim's cards to use pays for them,
    /// and is checked for them at that binding (paid by a pending sharer, they went
    /// into use unchecked when another bound first). Not terminating first: a sharer's
    /// deletion is an event, so the payment moves to a sharer that stays right then,
    /// rather than when the leaver's deadline passes, which no event marks. The rule
    /// reads no clock, so every replica and every recount picks the same payer.
    fn payer(&self, seen: &[&PodRecord], claim: &ClaimRecord) -> Option<String> {
        let pod = seen[0];
        // A pod whose queue cannot be told (its PodGroup not held) shares with no one:
        // it pays, which only counts more.
        let queue = self.resolve_queue(pod).ok();
        let sharer = |p: &PodRecord| {
            !p.is_finished()
                && uses(p, &claim.key)
                && queue.is_some()
                && self.resolve_queue(p).ok() == queue
        };
        let find = |name: &String| match seen.iter().find(|s| s.key.name == *name) {
            Some(s) => Some(*s),
            None => self
                .pods
                .get(&ObjectKey::new(pod.key.namespace.clone(), name.clone())),
        };
        // A pod shown under a reservation's name that is not the one reserved for (by
        // uid) is not that reservation.
        let reserved = |bound: bool, staying: bool| {
            claim.reserved_for.iter().find(|r| {
                find(&r.name).is_some_and(|p| {
                    r.is(p.version.uid.as_deref())
                        && sharer(p)
                        && (!bound || p.node.is_some())
                        && (!staying || !p.is_terminating())
                })
            })
        };
        if let Some(payer) = reserved(true, true)
            .or_else(|| reserved(true, false))
            .or_else(|| reserved(false, false))
        {
            return Some(payer.name.clone());
        }
        self.first_user(seen, sharer)
            .or_else(|| Some(pod.key.name.clone()))
    }

    fn set_claimed(p: &mut PodRecord, read: Result<Option<ClaimCards>, DraError>) {
        if let Ok(d) = &mut p.demand {
            d.retain(|r, _| !is_claim_resource(r));
        }
        p.claimed = match read {
            Ok(None) => None,
            Ok(Some(c)) => Some(Ok(c)),
            Err(e) => Some(Err(Box::new(e))),
        };
        p.count_claimed();
    }

    /// The first by name of the pods `sharer` picks (one bound before one pending, one
    /// not terminating before one that is), the pods of `seen` as given: who pays for a
    /// shared claim not reserved for one of them yet. By name, not by arrival: every
    /// replica, and a restarted one, charges the same pod. Bound first: a claim watch
    /// behind the pod watch (or a binding known from the ledger only) shows a sharer
    /// bound before the claim reserved for it, and the card it holds must count as
    /// bound, or a binding's hard line (bound cards within the quota) misses it (found by
    /// the committer model: a pending sharer paid, and after a quota cut another claim
    /// pod's allocation was let through beside the bound one).
    fn first_user(
        &self,
        seen: &[&PodRecord],
        sharer: impl Fn(&PodRecord) -> bool,
    ) -> Option<String> {
        let held = self
            .claim_pods
            .iter()
            .filter(|k| !seen.iter().any(|s| s.key == **k))
            .filter_map(|k| self.pods.get(k));
        held.chain(seen.iter().copied())
            .filter(|p| sharer(p))
            .map(|p| (p.node.is_none(), p.is_terminating(), &p.key.name))
            .min()
            .map(|(.., name)| name.clone())
    }

    /// After a pod that uses shared claims came or went: the other pods that use them
    /// may pay for them now, or no longer.
    pub(super) fn reread_sharers(&mut self, pod: &PodRecord) {
        let shared = shared_claims(pod);
        if shared.is_empty() {
            return;
        }
        let me = pod.key.clone();
        self.reread_claim_pods(|p| p.key != me && shared.iter().any(|c| uses(p, c)));
    }

    /// True when some ResourceSlice publishes a device of `model`.
    /// The models of the DRA devices published (with repeats).
    pub fn dra_models(&self) -> impl Iterator<Item = &crate::cards::CardName> + '_ {
        self.dra.device_models()
    }

    pub fn dra_offers(&self, model: &crate::cards::CardName) -> bool {
        let one = crate::cards::Alternatives::single(model.clone());
        let found = self.dra.devices_of(&one).next().is_some();
        found
    }

    /// True when a claim or template `pod` names is not held (yet).
    pub fn claims_missing(&self, pod: &PodRecord) -> bool {
        let read = self.with_claims(pod.clone());
        matches!(&read.claimed, Some(Err(e)) if matches!(**e, DraError::Missing { .. }))
    }

    /// How far the claims' stream had come when it showed `p`'s claims as they are held:
    /// the newest resourceVersion among them (`None`: one is not held, or has none).
    pub fn claims_version(&self, p: &PodRecord) -> Option<u64> {
        p.claims.iter().try_fold(0, |newest, c| {
            let key = ObjectKey::new(p.key.namespace.clone(), c.claim_name()?);
            Some(newest.max(self.dra.claim(&key)?.resource_version?))
        })
    }

    /// True while the pod held under `key` has card claims not seen allocated yet.
    pub fn claims_unallocated(&self, key: &ObjectKey) -> bool {
        self.pods
            .get(key)
            .and_then(|p| p.claimed.as_ref())
            .is_some_and(|c| matches!(c, Ok(c) if c.allocated.is_none()))
    }

    /// A pod record as the snapshot would hold it: its claims read (a request's pod,
    /// before it is decided).
    pub fn with_claims(&self, mut p: PodRecord) -> PodRecord {
        self.read_claims(&mut p);
        p
    }

    /// Reads again the claim pods `pick` picks, and counts again those that moved.
    fn reread_claim_pods(&mut self, pick: impl Fn(&PodRecord) -> bool) {
        let moved: Vec<PodRecord> = self
            .claim_pods
            .iter()
            .filter_map(|k| self.pods.get(k))
            .filter(|p| pick(p))
            .filter_map(|p| {
                let mut again = p.clone();
                self.read_claims(&mut again);
                (again.claimed != p.claimed || again.demand != p.demand).then_some(again)
            })
            .collect();
        for p in moved {
            self.upsert_pod(p);
        }
    }

    /// Adds or replaces the devices of one ResourceSlice.
    pub fn upsert_slice(
        &mut self,
        name: String,
        devices: Vec<Device>,
        prepared: Option<&Prepared>,
    ) {
        let mut nodes = self.slice_nodes(&name);
        nodes.extend(devices.iter().filter_map(|d| d.node.clone()));
        if let Some(r) = self.dra.upsert_slice(name, devices, prepared) {
            self.reread_claim_pods(|p| r.touches(&p.key.namespace, &p.claims));
            nodes.iter().for_each(|n| self.reread_extended(n));
        }
    }

    /// Forgets a ResourceSlice.
    pub fn remove_slice(&mut self, name: &str, prepared: Option<&Prepared>) {
        let nodes = self.slice_nodes(name);
        if let Some(r) = self.dra.remove_slice(name, prepared) {
            self.reread_claim_pods(|p| r.touches(&p.key.namespace, &p.claims));
            nodes.iter().for_each(|n| self.reread_extended(n));
        }
    }

    /// The nodes a held slice publishes devices of.
    fn slice_nodes(&self, name: &str) -> BTreeSet<String> {
        let devices = self.dra.slices().get(name).into_iter().flatten();
        devices.filter_map(|d| d.node.clone()).collect()
    }

    /// Every node some held slice publishes devices of: what a DeviceClass change may
    /// serve differently.
    fn dra_nodes(&self) -> BTreeSet<String> {
        let devices = self.dra.slices().values().flatten();
        devices.filter_map(|d| d.node.clone()).collect()
    }

    /// The ResourceSlices held, by name.
    pub fn slice_names(&self) -> Vec<String> {
        self.dra.slices().keys().cloned().collect()
    }

    /// Adds or replaces a DeviceClass (`prepared`: its selectors counted without the
    /// lock, [`DraRecord::prepare`]).
    pub fn upsert_class(&mut self, class: DeviceClass, prepared: Option<&Prepared>) {
        if self.dra.upsert_class(class, prepared) {
            self.reread_claim_pods(|_| true);
            self.dra_nodes()
                .iter()
                .for_each(|n| self.reread_extended(n));
        }
    }

    /// Forgets a DeviceClass.
    pub fn remove_class(&mut self, name: &str, prepared: Option<&Prepared>) {
        if self.dra.remove_class(name, prepared) {
            self.reread_claim_pods(|_| true);
            self.dra_nodes()
                .iter()
                .for_each(|n| self.reread_extended(n));
        }
    }

    /// The DeviceClasses held, by name.
    pub fn class_names(&self) -> Vec<String> {
        self.dra.class_names()
    }

    /// Adds or replaces a ResourceClaimTemplate (`spec`: its `spec.spec` read).
    pub fn upsert_template(
        &mut self,
        key: ObjectKey,
        spec: Result<ClaimSpec, DraError>,
        prepared: Option<&Prepared>,
    ) {
        let ns = key.namespace.clone();
        self.dra.upsert_template(key, spec, prepared);
        self.reread_claim_pods(|p| p.key.namespace == ns);
    }

    /// Forgets a ResourceClaimTemplate.
    pub fn remove_template(&mut self, key: &ObjectKey) {
        if self.dra.remove_template(key) {
            let ns = key.namespace.clone();
            self.reread_claim_pods(|p| p.key.namespace == ns);
        }
    }

    /// The ResourceClaimTemplates held.
    pub fn template_keys(&self) -> Vec<ObjectKey> {
        self.dra.template_keys()
    }

    /// Adds or replaces a ResourceClaim; the pods that use it are read again.
    pub fn upsert_claim(&mut self, claim: ClaimRecord, prepared: Option<&Prepared>) {
        let key = claim.key.clone();
        if self.dra.upsert_claim(claim, prepared) {
            self.reread_claim_pods(|p| uses(p, &key));
        }
    }

    /// Forgets a ResourceClaim.
    pub fn remove_claim(&mut self, key: &ObjectKey) {
        if self.dra.remove_claim(key) {
            self.reread_claim_pods(|p| uses(p, key));
        }
    }

    /// The ResourceClaims held.
    pub fn claim_keys(&self) -> Vec<ObjectKey> {
        self.dra.claim_keys()
    }
}

/// The DRA kinds [`Snapshot::store_dra`] reads.
pub const DRA_KINDS: [&str; 4] = [
    "ResourceSlice",
    "DeviceClass",
    "ResourceClaimTemplate",
    "ResourceClaim",
];

/// A DRA object of one of [`DRA_KINDS`] as read from its JSON, with no snapshot at hand
/// (its selectors compiled, a slice's devices and their models read): the watchers read
/// it, and count a claim's requirements, without the lock.
#[derive(Debug, Clone)]
pub enum DraRecord {
    Slice(String, Result<Vec<Device>, DraError>),
    /// A ResourceSlice deleted: its devices are judged without the lock too.
    SliceGone(String),
    Class(String, Result<DeviceClass, DraError>),
    /// A DeviceClass deleted: what its requirements allow without it is counted without
    /// the lock too.
    ClassGone(String),
    Template(ObjectKey, Result<ClaimSpec, DraError>),
    Claim(ObjectKey, Result<ClaimRecord, DraError>),
}

impl DraRecord {
    /// Reads `v` (`namespace`: for an object that names none); `Ok(None)` for another
    /// kind, an error for an object of these kinds without a name.
    pub fn read(
        v: &Value,
        namespace: &str,
        settings: &DraSettings,
    ) -> Result<Option<Self>, DraError> {
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(namespace);
        let key = ObjectKey::new(ns, name.clone());
        if name.is_empty() && DRA_KINDS.contains(&kind) {
            return Err(DraError::Claim {
                object: kind.to_string(),
                field: "metadata.name".into(),
                expected: "a name".into(),
            });
        }
        Ok(Some(match kind {
            "ResourceSlice" => Self::Slice(name, slice_devices(v, settings)),
            "DeviceClass" => Self::Class(name, device_class(v)),
            "ResourceClaimTemplate" => {
                let object = format!("ResourceClaimTemplate {key}");
                let spec = claim_spec(v.pointer("/spec/spec").unwrap_or(&Value::Null), &object);
                Self::Template(key, spec)
            }
            "ResourceClaim" => {
                let claim = ClaimRecord::parse(v).map(|mut c| {
                    c.key = key.clone();
                    c
                });
                Self::Claim(key, claim)
            }
            _ => return Ok(None),
        }))
    }

    /// What can be worked out against `view` without the lock: a claim's or template's
    /// requirements counted, a slice's changed devices judged, a class's requirements
    /// counted with its new selectors.
    pub fn prepare(&self, view: &DraView) -> Option<Prepared> {
        match self {
            Self::Slice(name, Ok(devices)) => Some(view.prepare_slice(name, devices)),
            Self::SliceGone(name) => Some(view.prepare_slice(name, &[])),
            Self::Class(name, Ok(class)) => Some(view.prepare_class(name, Some(class))),
            Self::ClassGone(name) => Some(view.prepare_class(name, None)),
            Self::Template(_, Ok(spec)) => Some(view.prepare(spec)),
            Self::Claim(_, Ok(c)) => c.spec.as_ref().ok().map(|spec| view.prepare(spec)),
            _ => None,
        }
    }
}

impl Snapshot {
    /// What a DRA record's requirements may be counted against without the lock.
    pub fn dra_view(&self) -> DraView {
        self.dra.view()
    }

    /// Stores a DRA object of one of [`DRA_KINDS`] (`namespace`: for an object that
    /// names none); `Ok(false)` for another kind. An object that cannot be read is an
    /// error naming it, and what was held under its name is forgotten: it no longer says
    /// that.
    pub fn store_dra(&mut self, v: &Value, namespace: &str) -> Result<bool, DraError> {
        match DraRecord::read(v, namespace, self.dra())? {
            Some(r) => self.store_dra_record(r, None).map(|()| true),
            None => Ok(false),
        }
    }

    /// Stores a DRA object read already, with its requirements counted (`prepared`) when
    /// the watcher could; as [`Self::store_dra`] for what cannot be read.
    pub fn store_dra_record(
        &mut self,
        record: DraRecord,
        prepared: Option<&Prepared>,
    ) -> Result<(), DraError> {
        match record {
            DraRecord::Slice(name, Ok(devices)) => {
                for d in &devices {
                    if let Some(Err(e)) = &d.model {
                        tracing::warn!("ResourceSlice {name}: {e}");
                    }
                }
                self.upsert_slice(name, devices, prepared);
            }
            DraRecord::Slice(name, Err(e)) => {
                self.remove_slice(&name, None);
                return Err(e);
            }
            DraRecord::SliceGone(name) => self.remove_slice(&name, prepared),
            DraRecord::Class(_, Ok(c)) => self.upsert_class(c, prepared),
            DraRecord::Class(name, Err(e)) => {
                self.remove_class(&name, None);
                return Err(e);
            }
            DraRecord::ClassGone(name) => self.remove_class(&name, prepared),
            DraRecord::Template(key, spec) => self.upsert_template(key, spec, prepared),
            DraRecord::Claim(_, Ok(c)) => self.upsert_claim(c, prepared),
            DraRecord::Claim(_, Err(e)) => return Err(e),
        }
        Ok(())
    }

    /// Forgets a DRA object by kind and key; false for another kind.
    pub fn remove_dra(&mut self, kind: &str, key: &ObjectKey) -> bool {
        match kind {
            "ResourceSlice" => self.remove_slice(&key.name, None),
            "DeviceClass" => self.remove_class(&key.name, None),
            "ResourceClaimTemplate" => self.remove_template(key),
            "ResourceClaim" => self.remove_claim(key),
            _ => return false,
        }
        true
    }
}

/// The claims `p` names directly (made apart from it: they may be shared).
fn shared_claims(p: &PodRecord) -> Vec<ObjectKey> {
    p.claims
        .iter()
        .filter(|c| matches!(c.source, ClaimSource::Claim(_)))
        .filter_map(|c| c.claim_name())
        .map(|n| ObjectKey::new(p.key.namespace.clone(), n))
        .collect()
}

fn uses(p: &PodRecord, claim: &ObjectKey) -> bool {
    p.key.namespace == claim.namespace
        && p.claims
            .iter()
            .any(|c| c.claim_name() == Some(claim.name.as_str()))
}
