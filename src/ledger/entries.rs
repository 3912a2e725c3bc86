//! The consistency ledger: charges admitted a moment ago that informer caches may not
//! show yet. Each queue's ledger is one document, stored in card-quota's own namespace
//! and written with a resourceVersion precondition (see `live::ledgers`).
//!
//! Entries are keyed by the uid of the object they charge, so a pod deleted and created
//! again under the same name is a new charge, and hold the record as it looks once
//! admitted, so "cache ∪ ledger" counts each object once: an entry is skipped as soon as
//! the cache shows that object.
//!
//! The watermark makes pruning safe with several replicas: an entry is dropped once the
//! pruning replica's cache shows its object at resourceVersion `r`, and the ledger then
//! carries `r`. A replica decides from a ledger only once its own cache has come as far
//! as the watermark, so whatever was pruned is in its cache instead.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cards::dra::{is_claim_resource, ClaimCards};
use crate::cards::{
    Alternatives, AnnotationError, CardName, CardRequest, Cards, ObjectKey, QueueName, Subject,
};
use crate::cluster::records::Version;
use crate::cluster::{PodGroupRecord, PodRecord};

/// How many entries one ledger may hold. Entries live only while caches lag, so the
/// cap is reached only when caches stop following; it is far above any burst's
/// in-flight requests (a ConfigMap holds up to 1 MiB).
pub const MAX_ENTRIES: usize = 5_000;
/// A rendered ledger must stay under this many bytes (the API server's object limit
/// is 1 MiB, etcd's request limit 1.5 MiB).
pub const MAX_BYTES: usize = 900 * 1024;
/// A binding entry whose pod the cache shows unbound this long after the entry was
/// first seen is a bind that failed after card-quota admitted it.
pub const UNBOUND_GRACE: Duration = Duration::from_secs(30);
/// An entry whose object no cache ever shows stops counting after this long (the API
/// server refused the object after card-quota admitted it, or the client gave up).
/// Measured on the pruning replica's monotonic clock from when it first read the
/// entry: never shorter than the entry's real age, and free of clock skew.
pub const TTL: Duration = Duration::from_secs(120);

/// One recorded charge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Entry {
    /// The object charged: `pod:<namespace>/<name>` or `podgroup:<namespace>/<name>`.
    #[serde(with = "key_text")]
    pub of: EntryKey,
    /// The pod's PodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Card resources of a pod (whole cards).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Cards>,
    /// The pod's `card.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    /// The model a bound pod is charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged: Option<String>,
    /// The node a bound pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Cards per model of the devices a bound pod's claims were allocated, when they are
    /// of several models (one model is `charged`): the allocation admitted, which a cache
    /// may not show yet.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: BTreeMap<String, Cards>,
    /// Product pins of the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned: BTreeMap<String, Vec<String>>,
    /// Products the pod's constraints rule out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub excluded: BTreeMap<String, Vec<String>>,
    /// A PodGroup's `card.request`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request: Vec<(String, Cards)>,
    /// The phase a PodGroup was admitted into (Inqueue, Running...). Entries written
    /// before reservations began at the enqueue have none: they reserved at CREATE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The resourceVersion the admitted write was made against: a cache that shows the
    /// object past it, still without what the entry records, shows the write lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
    /// The queue charged, when it is not the ledger's own: the queues of a tree share
    /// the ledger of its top card level, so charges that borrow are serialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// How often the binding was admitted again (a scheduler's retry) before any cache
    /// showed it. Each retry rewrites the entry, which starts every clock on it again:
    /// the retry's bind gets its own grace, as the first one did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retried: u64,
}

mod key_text {
    use super::EntryKey;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(k: &EntryKey, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&k.render())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<EntryKey, D::Error> {
        let s = String::deserialize(d)?;
        EntryKey::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{s:?} is not pod:<namespace>/<name> or podgroup:<namespace>/<name>"
            ))
        })
    }
}

/// What an entry is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntryKey {
    Pod(ObjectKey),
    Group(ObjectKey),
}

impl EntryKey {
    fn render(&self) -> String {
        match self {
            Self::Pod(k) => format!("pod:{k}"),
            Self::Group(k) => format!("podgroup:{k}"),
        }
    }
    fn parse(s: &str) -> Option<Self> {
        let (kind, rest) = s.split_once(':')?;
        let (ns, name) = rest.split_once('/')?;
        if ns.is_empty() || name.is_empty() {
            return None;
        }
        let key = ObjectKey::new(ns, name);
        match kind {
            "pod" => Some(Self::Pod(key)),
            "podgroup" => Some(Self::Group(key)),
            _ => None,
        }
    }
}

impl std::fmt::Display for EntryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// The identity of an entry: the charged object's uid, or (for objects without one,
/// as in offline replays) its `pod:<ns>/<name>` key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EntryId(String);

impl EntryId {
    /// The id of an entry for an object without a uid: its key.
    pub fn for_key(key: &EntryKey) -> Self {
        Self(key.render())
    }
    fn of(key: &EntryKey, version: &Version) -> Self {
        Self(version.uid.clone().unwrap_or_else(|| key.render()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// False when the id is the object's key (it had no uid); uids have no colon.
    pub fn is_uid(&self) -> bool {
        !self.0.contains(':')
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The record an admitted charge adds or changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// A pod as admitted: pending, or bound when it has a node and charged model.
    Pod(Box<PodRecord>),
    /// A PodGroup with its admitted request.
    Group(Box<PodGroupRecord>),
}

impl Effect {
    pub fn key(&self) -> EntryKey {
        match self {
            Self::Pod(p) => EntryKey::Pod(p.key.clone()),
            Self::Group(g) => EntryKey::Group(g.key.clone()),
        }
    }

    /// The entry's identity: the object's uid when the request carried one.
    pub fn id(&self) -> EntryId {
        let version = match self {
            Self::Pod(p) => &p.version,
            Self::Group(g) => &g.version,
        };
        EntryId::of(&self.key(), version)
    }

    /// The ledger entry recording this effect.
    pub fn entry(&self) -> Entry {
        match self {
            Self::Pod(p) => Entry {
                of: self.key(),
                group: p.group.clone(),
                resources: p.demand.clone().unwrap_or_default(),
                card: p.alternatives().map(|a| a.to_string()),
                charged: p.charged.as_ref().map(|c| c.to_string()),
                node: p.node.clone(),
                allocated: split_allocation(p),
                pinned: p.pinned.clone(),
                excluded: p.excluded.clone(),
                request: Vec::new(),
                phase: None,
                base: None,
                queue: None,
                retried: 0,
            },
            Self::Group(g) => Entry {
                of: self.key(),
                group: None,
                resources: BTreeMap::new(),
                card: None,
                charged: None,
                node: None,
                allocated: BTreeMap::new(),
                pinned: BTreeMap::new(),
                excluded: BTreeMap::new(),
                request: g
                    .live_request()
                    .map(|r| r.0.iter().map(|(a, n)| (a.to_string(), *n)).collect())
                    .unwrap_or_default(),
                phase: g.phase.clone(),
                base: g.version.resource_version,
                queue: None,
                retried: 0,
            },
        }
    }
}

/// How far the caches of the replica that last pruned had come: resourceVersions of
/// the pod, PodGroup and ResourceClaim streams (see the module doc). Claims are a
/// stream of their own: a DRA card's charge shows in the cache as its claim's
/// allocation before its pod is bound. (A ledger written before claims were a stream
/// reads `claims: 0`.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    #[serde(default)]
    pub pods: u64,
    #[serde(default)]
    pub podgroups: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims: u64,
}

impl Watermark {
    /// True when caches at `progress` show everything pruned up to this watermark.
    pub fn reached_by(&self, progress: &Watermark) -> bool {
        progress.pods >= self.pods
            && progress.podgroups >= self.podgroups
            && progress.claims >= self.claims
    }

    /// Each stream's mark raised to `other`'s where that is higher.
    pub fn raise(&mut self, other: &Watermark) {
        self.pods = self.pods.max(other.pods);
        self.podgroups = self.podgroups.max(other.podgroups);
        self.claims = self.claims.max(other.claims);
    }

    /// `stream`'s mark.
    pub fn of(&self, stream: Stream) -> u64 {
        match stream {
            Stream::Pods => self.pods,
            Stream::PodGroups => self.podgroups,
            Stream::Claims => self.claims,
        }
    }

    /// `stream`'s mark, to change.
    pub fn of_mut(&mut self, stream: Stream) -> &mut u64 {
        match stream {
            Stream::Pods => &mut self.pods,
            Stream::PodGroups => &mut self.podgroups,
            Stream::Claims => &mut self.claims,
        }
    }
}

/// What pruning does with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Keep,
    /// Dropped because it no longer counts anywhere (expired, terminal, phantom).
    Drop,
    /// Dropped because the cache shows the object: readers must catch up to here.
    Reflected(Stream, u64),
    /// Dropped because it expired before a [`Fence`] was read: readers must catch up
    /// to the fence, where whatever the charge let in is shown if it exists at all.
    Fenced(Watermark),
}

/// Proof that the deciding replica's caches show every write the API server had made
/// when `mark` was read, `taken_ago` before the decision. Charges that had expired by
/// then may be dropped: what they admitted was stored before the fence (or never),
/// so caches at the fence show it. Without a fence nothing is dropped on a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub mark: Watermark,
    pub taken_ago: Duration,
}

impl Fence {
    /// True when something `age` old with a lifetime of `ttl` had expired when the
    /// fence was read.
    pub fn covers(&self, age: Duration, ttl: Duration) -> bool {
        age.saturating_sub(self.taken_ago) > ttl
    }
}

/// The watch stream an object arrives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Pods,
    PodGroups,
    Claims,
}

impl Stream {
    pub const ALL: [Stream; 3] = [Stream::Pods, Stream::PodGroups, Stream::Claims];
}

/// A queue's ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    entries: BTreeMap<EntryId, Entry>,
    watermark: Watermark,
    holds: BTreeMap<String, Hold>,
    release: u64,
    seals: BTreeMap<String, super::seal::Seal>,
    inbound: BTreeMap<String, super::seal::Inbound>,
}

/// Headroom one replica holds on a queue (escrow): it admits charges within it without
/// writing the ledger, and every other replica counts the whole hold as reserved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Cards held per model: the holder's admissions its caches did not show when it
    /// wrote the hold, plus its spare.
    pub cards: BTreeMap<String, Cards>,
    /// The part of `cards` not yet admitted when the hold was written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spare: BTreeMap<String, Cards>,
    /// Which write of the holder this is: every reader's expiry clock restarts at a new
    /// one.
    pub renewal: u64,
    /// The last release request ([`Ledger::release`]) the holder has answered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub released: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The stored form.
#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    watermark: Watermark,
    #[serde(default)]
    entries: BTreeMap<EntryId, Entry>,
    #[serde(default)]
    holds: BTreeMap<String, Hold>,
    #[serde(default)]
    release: u64,
    #[serde(default)]
    seals: BTreeMap<String, super::seal::Seal>,
    #[serde(default)]
    inbound: BTreeMap<String, super::seal::Inbound>,
}

#[derive(Serialize)]
struct Storing<'a> {
    watermark: Watermark,
    entries: &'a BTreeMap<EntryId, Entry>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    holds: &'a BTreeMap<String, Hold>,
    #[serde(skip_serializing_if = "is_zero")]
    release: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    seals: &'a BTreeMap<String, super::seal::Seal>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    inbound: &'a BTreeMap<String, super::seal::Inbound>,
}

/// Why a stored ledger could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid card-quota ledger of queue {queue}: {problem}")]
pub struct LedgerError {
    pub queue: String,
    pub problem: String,
}

impl Ledger {
    /// Parses a stored ledger; every entry must be well-formed.
    pub fn parse(queue: &QueueName, raw: &str) -> Result<Self, LedgerError> {
        let err = |problem: String| LedgerError {
            queue: queue.to_string(),
            problem,
        };
        let v: serde_json::Value = serde_json::from_str(raw).map_err(|e| err(e.to_string()))?;
        if !v.is_object() {
            return Err(err("expected a JSON object with \"entries\"".into()));
        }
        let doc: Stored = serde_json::from_value(v).map_err(|e| err(e.to_string()))?;
        Ok(Self {
            entries: doc.entries,
            watermark: doc.watermark,
            holds: doc.holds,
            release: doc.release,
            seals: doc.seals,
            inbound: doc.inbound,
        })
    }

    /// The stored form (stable order, so unchanged ledgers render identically).
    pub fn render(&self) -> String {
        let doc = Storing {
            watermark: self.watermark,
            entries: &self.entries,
            holds: &self.holds,
            release: self.release,
            seals: &self.seals,
            inbound: &self.inbound,
        };
        serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_string())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the ledger has neither entries nor holds.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.holds.is_empty()
    }

    pub fn watermark(&self) -> Watermark {
        self.watermark
    }

    pub fn iter(&self) -> impl Iterator<Item = (&EntryId, &Entry)> {
        self.entries.iter()
    }

    pub fn get(&self, id: &EntryId) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// Records (or replaces) the entry of `effect`; returns its id.
    pub fn record(&mut self, effect: &Effect) -> EntryId {
        self.record_for(effect, None)
    }

    /// Records `effect` as a charge of `queue` when that is not the ledger's own queue.
    pub fn record_for(&mut self, effect: &Effect, queue: Option<&QueueName>) -> EntryId {
        let id = effect.id();
        let mut e = effect.entry();
        e.queue = queue.map(ToString::to_string);
        if let Some(old) = self.entries.get_mut(&id) {
            if old.node.is_some() && old.node == e.node && old.of == e.of {
                // The same binding admitted again: the first record stands, and its
                // clocks start again.
                old.retried += 1;
                return id;
            }
        }
        self.entries.insert(id.clone(), e);
        id
    }

    /// Applies `fate` to every entry, raising the watermark past what the cache
    /// shows. Returns how many entries were dropped.
    pub fn prune(&mut self, mut fate: impl FnMut(&EntryId, &Entry) -> Fate) -> usize {
        let before = self.entries.len();
        let mut mark = self.watermark;
        self.entries.retain(|id, e| match fate(id, e) {
            Fate::Keep => true,
            Fate::Drop => false,
            Fate::Reflected(stream, rv) => {
                let at = mark.of_mut(stream);
                *at = (*at).max(rv);
                false
            }
            Fate::Fenced(fence) => {
                mark.raise(&fence);
                false
            }
        });
        self.watermark = mark;
        before - self.entries.len()
    }

    /// Drops one entry.
    pub fn forget(&mut self, id: &EntryId) -> bool {
        self.entries.remove(id).is_some()
    }

    /// The seals on queues whose charges moved to another ledger, by queue.
    pub fn seals(&self) -> &BTreeMap<String, super::seal::Seal> {
        &self.seals
    }

    /// Seals `queue`'s charges here (a later seal replaces an earlier one).
    pub fn seal(&mut self, queue: &crate::cards::QueueName, seal: super::seal::Seal) {
        self.seals.insert(queue.to_string(), seal);
    }

    /// Where queues charged here came from, by queue.
    pub fn inbound(&self) -> &BTreeMap<String, super::seal::Inbound> {
        &self.inbound
    }

    /// Records that `queue`'s charges came here from another ledger (the latest wins).
    pub fn mark_inbound(&mut self, queue: &crate::cards::QueueName, inbound: super::seal::Inbound) {
        self.inbound.insert(queue.to_string(), inbound);
    }

    /// Drops the seal on `queue`; true when there was one.
    pub fn unseal(&mut self, queue: &crate::cards::QueueName) -> bool {
        self.seals.remove(queue.as_str()).is_some()
    }

    /// Takes back `ours`, the seal on `queue` of a change that was refused after it was
    /// written (that change never lands): the seal it replaced, `before`, is put back
    /// (or none). Only while `ours` is still the seal there: a seal written since, of
    /// another change or of a retry of this one, stays. True when taken back.
    pub fn take_back_seal(
        &mut self,
        queue: &crate::cards::QueueName,
        ours: &super::seal::Seal,
        before: Option<&super::seal::Seal>,
    ) -> bool {
        if self.seals.get(queue.as_str()) != Some(ours) {
            return false;
        }
        match before {
            Some(b) => self.seal(queue, b.clone()),
            None => {
                self.unseal(queue);
            }
        }
        true
    }

    /// The replicas' holds, by replica.
    pub fn holds(&self) -> &BTreeMap<String, Hold> {
        &self.holds
    }

    /// Sets (or, with `None`, drops) the hold of `replica`.
    pub fn set_hold(&mut self, replica: &str, hold: Option<Hold>) {
        match hold {
            Some(h) => self.holds.insert(replica.to_string(), h),
            None => self.holds.remove(replica),
        };
    }

    /// Drops the holds `keep` refuses (expired ones); returns how many.
    pub fn retain_holds(&mut self, mut keep: impl FnMut(&str, &Hold) -> bool) -> usize {
        let before = self.holds.len();
        self.holds.retain(|r, h| keep(r, h));
        before - self.holds.len()
    }

    /// The latest release request: a replica refused only because of others' holds
    /// raises it, and each holder answers by writing its hold down to what it admitted.
    pub fn release(&self) -> u64 {
        self.release
    }

    /// Raises the release request; returns the new one.
    pub fn request_release(&mut self) -> u64 {
        self.release += 1;
        self.release
    }

    /// Raises the watermark to `mark` (never lowers it): a hold's writer makes readers
    /// catch up with its caches, which show what its hold no longer covers.
    pub fn raise_watermark(&mut self, mark: Watermark) {
        self.watermark.raise(&mark);
    }

    /// Moves every entry of `other` into this ledger.
    pub fn absorb(&mut self, other: &Ledger) {
        for (id, e) in &other.entries {
            self.entries.insert(id.clone(), e.clone());
        }
    }

    /// Inserts an entry as it is.
    pub fn insert(&mut self, id: EntryId, e: Entry) {
        self.entries.insert(id, e);
    }
}

/// The namespace of the PodGroups a hold is laid over a snapshot as: not a DNS label,
/// so no real namespace can have it.
pub const HOLD_NAMESPACE: &str = "card-quota.hold";

impl Hold {
    /// The entry this hold is counted as by the replicas that do not hold it: a
    /// PodGroup without pods reserving the held cards.
    pub fn entry(&self, replica: &str) -> (EntryId, Entry) {
        let key = ObjectKey::new(HOLD_NAMESPACE, replica);
        let of = EntryKey::Group(key);
        (
            EntryId(of.render()),
            Entry {
                of,
                group: None,
                resources: BTreeMap::new(),
                card: None,
                charged: None,
                node: None,
                allocated: BTreeMap::new(),
                pinned: BTreeMap::new(),
                excluded: BTreeMap::new(),
                request: self
                    .cards
                    .iter()
                    .filter(|(_, n)| !n.is_zero())
                    .map(|(m, n)| (m.clone(), *n))
                    .collect(),
                phase: Some("Inqueue".to_string()),
                base: None,
                queue: None,
                retried: 0,
            },
        )
    }

    /// The hold without its spare: what the holder's admissions carry.
    pub fn carried(&self) -> Hold {
        let mut h = self.clone();
        for (m, n) in &self.spare {
            if let Some(c) = h.cards.get_mut(m) {
                *c = c.saturating_sub(*n);
            }
        }
        h.spare.clear();
        h
    }

    /// True when the hold holds nothing.
    pub fn is_empty(&self) -> bool {
        self.cards.values().all(|n| n.is_zero())
    }
}

impl Entry {
    /// A digest of what the entry records: a rewritten entry is a new charge to
    /// pruning's clock ([`super::clock::EntryClock`]).
    pub fn clock_mark(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }

    /// The identity the entry's record carries: its uid (none when the id is the key).
    fn version(&self, id: &EntryId) -> Version {
        Version {
            uid: id.is_uid().then(|| id.0.clone()),
            resource_version: None,
        }
    }
}

/// The models and cards of `p`'s allocation when it is bound, charged no one model, and
/// its claims' devices are of several models.
fn split_allocation(p: &PodRecord) -> BTreeMap<String, Cards> {
    let mut out: BTreeMap<String, Cards> = BTreeMap::new();
    if p.node.is_none() || p.charged.is_some() {
        return out;
    }
    if let Some(Ok(ClaimCards {
        allocated: Some(allocated),
        ..
    })) = &p.claimed
    {
        for (m, n) in allocated {
            *out.entry(m.to_string()).or_default() += *n;
        }
    }
    if out.len() < 2 {
        out.clear();
    }
    out
}

/// What an entry's several-model allocation reads as on its pod ([`Entry::allocated`]):
/// its claims' cards, allocated. `None` when it has none, or (logged) when a model does
/// not parse: the entry then counts as a binding on its node's model.
fn claimed_of(e: &Entry) -> Option<ClaimCards> {
    if e.allocated.is_empty() {
        return None;
    }
    let resource = e.resources.keys().find(|r| is_claim_resource(r))?.clone();
    let parsed: Result<Vec<(CardName, Cards)>, _> = e
        .allocated
        .iter()
        .map(|(m, n)| CardName::parse(m).map(|m| (m, *n)))
        .collect();
    let allocated = match parsed {
        Ok(a) => a,
        Err(err) => {
            tracing::warn!(
                "ledger entry {}: allocated: {}",
                e.of.to_string().escape_debug(),
                err.to_string().escape_debug()
            );
            return None;
        }
    };
    let models = Alternatives::from_models(allocated.iter().map(|(m, _)| m.clone()).collect())?;
    Some(ClaimCards {
        resource,
        cards: allocated.iter().map(|(_, n)| *n).sum(),
        models,
        per_model: allocated.iter().cloned().collect(),
        allocated: Some(allocated),
        claims: Vec::new(),
    })
}

/// The pod record a pod entry stands for (`None` for a PodGroup entry).
pub fn pod_of(id: &EntryId, queue: &QueueName, e: &Entry, seq: u64) -> Option<PodRecord> {
    let EntryKey::Pod(key) = &e.of else {
        return None;
    };
    Some(PodRecord {
        key: key.clone(),
        subject: Subject::Pod,
        stamped_queue: Some(queue.clone()),
        named_queue: None,
        group: e.group.clone(),
        demand: Ok(e.resources.clone()),
        latent: BTreeMap::new(),
        card_name: e.card.as_ref().map(|c| {
            // The object is named only when the value is refused (a decision lays
            // every unreflected entry, so this runs per entry per decision).
            crate::cards::annotations::parse_card_name_of(|| format!("pod {key}"), c)
                .map_err(Box::new)
        }),
        charged: e.charged.as_deref().and_then(|c| CardName::parse(c).ok()),
        node: e.node.clone(),
        bind_unseen: e.node.is_some(),
        phase: None,
        deletion: None,
        pinned: e.pinned.clone(),
        excluded: e.excluded.clone(),
        scheduler: None,
        claims: Vec::new(),
        claimed: claimed_of(e).map(Ok),
        gated: false,
        created: None,
        seq,
        version: e.version(id),
    })
}

/// The PodGroup record a PodGroup entry stands for (`None` for a pod entry).
pub fn group_of(
    id: &EntryId,
    queue: &QueueName,
    e: &Entry,
    seq: u64,
) -> Option<Result<PodGroupRecord, AnnotationError>> {
    let EntryKey::Group(key) = &e.of else {
        return None;
    };
    let object = format!("podgroup {key}");
    let mut request = Vec::new();
    for (alts, n) in &e.request {
        match Alternatives::parse(alts) {
            Ok(a) => request.push((a, *n)),
            Err(source) => {
                return Some(Err(AnnotationError {
                    object,
                    annotation: crate::cards::annotations::REQUEST,
                    problem: crate::cards::annotations::Problem::BadName(source),
                }))
            }
        }
    }
    Some(Ok(PodGroupRecord {
        key: key.clone(),
        queue: queue.clone(),
        request: Some(Ok(CardRequest(request))),
        derived: false,
        split: false,
        created: None,
        // An entry records a reservation: one without a phase is from before
        // reservations began at the enqueue, when every admitted group reserved.
        phase: Some(e.phase.clone().unwrap_or_else(|| "Inqueue".to_string())),
        seq,
        version: e.version(id),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: Option<&str>, node: Option<&str>) -> PodRecord {
        PodRecord {
            key: ObjectKey::new("ml", name),
            subject: Subject::Pod,
            stamped_queue: Some(QueueName::new("q")),
            named_queue: None,
            group: Some("pg".into()),
            demand: Ok(BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                Cards::new(2),
            )])),
            latent: BTreeMap::new(),
            card_name: Some(Ok(Alternatives::parse("A|B").unwrap())),
            charged: node.map(|_| CardName::parse("B").unwrap()),
            node: node.map(str::to_string),
            bind_unseen: false,
            phase: None,
            deletion: None,
            pinned: BTreeMap::new(),
            excluded: BTreeMap::new(),
            scheduler: None,
            claims: Vec::new(),
            claimed: None,
            gated: false,
            created: None,
            seq: 7,
            version: Version {
                uid: uid.map(str::to_string),
                resource_version: None,
            },
        }
    }

    #[test]
    fn a_ledger_round_trips_through_its_stored_form() {
        let q = QueueName::new("q");
        let mut l = Ledger::default();
        l.record(&Effect::Pod(Box::new(pod("a", Some("uid-a"), None))));
        let b = l.record(&Effect::Pod(Box::new(pod("b", None, Some("n1")))));
        assert_eq!(b.as_str(), "pod:ml/b");
        let text = l.render();
        let back = Ledger::parse(&q, &text).unwrap();
        assert_eq!(back, l);
        let e = back.get(&b).unwrap();
        // Read back, its node is a binding the cache does not show.
        assert_eq!(
            pod_of(&b, &q, e, 7).unwrap(),
            PodRecord {
                bind_unseen: true,
                ..pod("b", None, Some("n1"))
            }
        );
        let a = EntryId("uid-a".into());
        let rec = pod_of(&a, &q, back.get(&a).unwrap(), 7).unwrap();
        assert_eq!(rec, pod("a", Some("uid-a"), None));
        assert!(group_of(&a, &q, back.get(&a).unwrap(), 7).is_none());
    }

    #[test]
    fn a_binding_recorded_again_keeps_its_first_record_and_restarts_its_clock() {
        let q = QueueName::new("q");
        let mut l = Ledger::default();
        let id = l.record(&Effect::Pod(Box::new(pod("a", Some("uid-a"), Some("n1")))));
        let first = l.get(&id).unwrap().clone();
        let mut clock = crate::ledger::clock::EntryClock::default();
        assert_eq!(clock.first_seen(&q, &id, &first, 0), 0);
        // The retry, as the cache shows the pod (its card.name not written yet).
        let mut again = pod("a", Some("uid-a"), Some("n1"));
        again.card_name = None;
        assert_eq!(l.record(&Effect::Pod(Box::new(again))), id);
        let kept = l.get(&id).unwrap().clone();
        assert_eq!(kept.retried, 1);
        assert_eq!(
            Entry {
                retried: 0,
                ..kept.clone()
            },
            first
        );
        assert_eq!(clock.first_seen(&q, &id, &kept, 7), 7, "a rewrite");
        let back = Ledger::parse(&q, &l.render()).unwrap();
        assert_eq!(back.get(&id).unwrap().retried, 1);
        // Onto another node it is another binding: recorded as it is.
        l.record(&Effect::Pod(Box::new(pod("a", Some("uid-a"), Some("n2")))));
        let moved = l.get(&id).unwrap();
        assert_eq!((moved.node.as_deref(), moved.retried), (Some("n2"), 0));
    }

    #[test]
    fn a_recreated_pod_is_a_new_entry_beside_the_old_one() {
        let mut l = Ledger::default();
        l.record(&Effect::Pod(Box::new(pod("a", Some("first"), None))));
        l.record(&Effect::Pod(Box::new(pod("a", Some("second"), None))));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_broken_ledger_names_the_queue_and_the_problem() {
        let e = Ledger::parse(
            &QueueName::new("q"),
            r#"{"entries":{"u1":{"of":"pods/x"}}}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with(
                "invalid card-quota ledger of queue q: \"pods/x\" is not pod:<namespace>/<name> or podgroup:<namespace>/<name>"
            ),
            "{e}"
        );
        assert!(Ledger::parse(&QueueName::new("q"), "[]").is_err());
    }

    #[test]
    fn a_refused_changes_seal_is_taken_back_only_while_it_is_still_there() {
        use crate::ledger::seal::{Seal, SealCause};
        let q = QueueName::new("q");
        let seal = |by: &str, version| Seal {
            by: by.into(),
            version,
            at: jiff::Timestamp::UNIX_EPOCH,
            cause: SealCause::Limits,
        };
        let (older, ours, theirs) = (seal("a", 1), seal("b", 2), seal("c", 3));
        let mut l = Ledger::default();
        l.seal(&q, older.clone());
        l.seal(&q, ours.clone());
        assert!(l.take_back_seal(&q, &ours, Some(&older)));
        assert_eq!(
            l.seals().get("q"),
            Some(&older),
            "the seal it replaced is back"
        );
        // A seal written since stays.
        l.seal(&q, theirs.clone());
        assert!(!l.take_back_seal(&q, &ours, Some(&older)));
        assert_eq!(l.seals().get("q"), Some(&theirs));
        // Replacing nothing, it leaves nothing.
        let mut l = Ledger::default();
        l.seal(&q, ours.clone());
        assert!(l.take_back_seal(&q, &ours, None));
        assert!(l.seals().is_empty());
    }

    #[test]
    fn pruning_raises_the_watermark_to_what_the_cache_showed() {
        let mut l = Ledger::default();
        for (name, uid) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")] {
            l.record(&Effect::Pod(Box::new(pod(name, Some(uid), None))));
        }
        let dropped = l.prune(|id, _| match id.as_str() {
            "1" => Fate::Reflected(Stream::Pods, 40),
            "2" => Fate::Reflected(Stream::Pods, 30),
            "3" => Fate::Drop,
            _ => Fate::Keep,
        });
        assert_eq!(dropped, 3);
        assert_eq!(l.len(), 1);
        assert_eq!(
            l.watermark(),
            Watermark {
                pods: 40,
                podgroups: 0,
                claims: 0,
            }
        );
        // The watermark never goes back.
        l.prune(|_, _| Fate::Reflected(Stream::Pods, 10));
        assert_eq!(l.watermark().pods, 40);
        assert!(!l.watermark().reached_by(&Watermark {
            pods: 39,
            podgroups: 0,
            claims: 0,
        }));
        assert!(l.watermark().reached_by(&Watermark {
            pods: 40,
            podgroups: 0,
            claims: 0,
        }));
    }
}
