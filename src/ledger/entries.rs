//! The consistency ledger of DESIGN §5: charges admitted a moment ago that informer
//! caches may not show yet, stored as the `volcano.sh/card.ledger` annotation of their
//! Queue and written with a resourceVersion precondition.
//!
//! Entries are keyed by object (`pod:<ns>/<name>`, `podgroup:<ns>/<name>`) and hold
//! the record as it looks once admitted, so "cache ∪ ledger" counts each object once:
//! an entry is skipped as soon as the cache reflects it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cards::{
    Alternatives, AnnotationError, CardName, CardRequest, Cards, ObjectKey, QueueName,
};
use crate::cluster::{PodGroupRecord, PodRecord};

/// How many entries one Queue's ledger may hold (each is ~150 bytes; all annotations
/// of an object must stay under 256 KiB).
pub const MAX_ENTRIES: usize = 512;
/// An entry the cache reflects is kept this long, so replicas whose caches lag a
/// little behind still count it.
pub const OBSERVED_GRACE_SECONDS: i64 = 30;
/// An entry whose object never shows up (the API server refused it after us, or the
/// client gave up) stops counting after this long.
pub const TTL_SECONDS: i64 = 120;

/// One recorded charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unix seconds when the charge was admitted.
    pub at: i64,
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
    /// Product pins of the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned: BTreeMap<String, Vec<String>>,
    /// A PodGroup's `card.request`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request: Vec<(String, Cards)>,
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

    /// The ledger entry recording this effect at `at` (unix seconds).
    pub fn entry(&self, at: i64) -> Entry {
        match self {
            Self::Pod(p) => Entry {
                at,
                group: p.group.clone(),
                resources: p.demand.clone().unwrap_or_default(),
                card: p.alternatives().map(|a| a.to_string()),
                charged: p.charged.as_ref().map(|c| c.to_string()),
                node: p.node.clone(),
                pinned: p.pinned.clone(),
                request: Vec::new(),
            },
            Self::Group(g) => Entry {
                at,
                group: None,
                resources: BTreeMap::new(),
                card: None,
                charged: None,
                node: None,
                pinned: BTreeMap::new(),
                request: g
                    .live_request()
                    .map(|r| r.0.iter().map(|(a, n)| (a.to_string(), *n)).collect())
                    .unwrap_or_default(),
            },
        }
    }
}

/// A Queue's ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    entries: BTreeMap<EntryKey, Entry>,
}

/// Why a ledger annotation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid volcano.sh/card.ledger on queue {queue}: {problem}")]
pub struct LedgerError {
    pub queue: String,
    pub problem: String,
}

impl Ledger {
    /// Parses the annotation; every key and entry must be well-formed.
    pub fn parse(queue: &QueueName, raw: &str) -> Result<Self, LedgerError> {
        let err = |problem: String| LedgerError {
            queue: queue.to_string(),
            problem,
        };
        let map: BTreeMap<String, Entry> =
            serde_json::from_str(raw).map_err(|e| err(e.to_string()))?;
        let mut entries = BTreeMap::new();
        for (k, v) in map {
            let key = EntryKey::parse(&k).ok_or_else(|| {
                err(format!(
                    "key {k:?} is not pod:<namespace>/<name> or podgroup:<namespace>/<name>"
                ))
            })?;
            entries.insert(key, v);
        }
        Ok(Self { entries })
    }

    /// The annotation value (stable order, so unchanged ledgers render identically).
    pub fn render(&self) -> String {
        let map: BTreeMap<String, &Entry> =
            self.entries.iter().map(|(k, v)| (k.render(), v)).collect();
        serde_json::to_string(&map).unwrap_or_else(|_| "{}".to_string())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&EntryKey, &Entry)> {
        self.entries.iter()
    }

    pub fn get(&self, key: &EntryKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Records (or replaces) the entry of `effect`.
    pub fn record(&mut self, effect: &Effect, at: i64) {
        self.entries.insert(effect.key(), effect.entry(at));
    }

    /// Drops entries that no longer need to count: expired ones, and ones the cache
    /// has reflected for longer than the grace period. Returns how many were dropped.
    pub fn prune(&mut self, now: i64, reflected: impl Fn(&EntryKey, &Entry) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, e| {
            let age = now - e.at;
            !(age > TTL_SECONDS || (age > OBSERVED_GRACE_SECONDS && reflected(k, e)))
        });
        before - self.entries.len()
    }

    /// Keeps only the entries `keep` accepts; returns how many were dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&EntryKey, &Entry) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, e| keep(k, e));
        before - self.entries.len()
    }

    /// Drops one entry (its object is gone or terminal).
    pub fn forget(&mut self, key: &EntryKey) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Entries still counting at `now`.
    pub fn live(&self, now: i64) -> impl Iterator<Item = (&EntryKey, &Entry)> {
        self.entries
            .iter()
            .filter(move |(_, e)| now - e.at <= TTL_SECONDS)
    }
}

/// The pod record an entry stands for.
pub fn pod_of(key: &ObjectKey, queue: &QueueName, e: &Entry, seq: u64) -> PodRecord {
    let object = format!("pod {key}");
    PodRecord {
        key: key.clone(),
        stamped_queue: Some(queue.clone()),
        named_queue: None,
        group: e.group.clone(),
        demand: Ok(e.resources.clone()),
        latent: BTreeMap::new(),
        card_name: e
            .card
            .as_ref()
            .map(|c| crate::cards::annotations::parse_card_name(&object, c)),
        charged: e.charged.as_deref().and_then(|c| CardName::parse(c).ok()),
        node: e.node.clone(),
        phase: None,
        deletion: None,
        pinned: e.pinned.clone(),
        seq,
    }
}

/// The PodGroup record an entry stands for.
pub fn group_of(
    key: &ObjectKey,
    queue: &QueueName,
    e: &Entry,
    seq: u64,
) -> Result<PodGroupRecord, AnnotationError> {
    let object = format!("podgroup {key}");
    let mut request = Vec::new();
    for (alts, n) in &e.request {
        let a = Alternatives::parse(alts).map_err(|source| AnnotationError {
            object: object.clone(),
            annotation: crate::cards::annotations::REQUEST,
            problem: crate::cards::annotations::Problem::BadName(source),
        })?;
        request.push((a, *n));
    }
    Ok(PodGroupRecord {
        key: key.clone(),
        queue: queue.clone(),
        request: Some(Ok(CardRequest(request))),
        phase: None,
        seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>) -> PodRecord {
        PodRecord {
            key: ObjectKey::new("ml", name),
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
            phase: None,
            deletion: None,
            pinned: BTreeMap::new(),
            seq: 7,
        }
    }

    #[test]
    fn a_ledger_round_trips_through_its_annotation() {
        let q = QueueName::new("q");
        let mut l = Ledger::default();
        l.record(&Effect::Pod(Box::new(pod("a", None))), 100);
        l.record(&Effect::Pod(Box::new(pod("b", Some("n1")))), 101);
        let text = l.render();
        let back = Ledger::parse(&q, &text).unwrap();
        assert_eq!(back, l);
        let (k, e) = back.iter().nth(1).unwrap();
        let EntryKey::Pod(key) = k else { panic!("{k}") };
        let rec = pod_of(key, &q, e, 7);
        assert_eq!(rec, pod("b", Some("n1")));
    }

    #[test]
    fn a_broken_ledger_names_the_queue_and_the_key() {
        let e = Ledger::parse(&QueueName::new("q"), r#"{"pods/x":{"at":1}}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid volcano.sh/card.ledger on queue q: key \"pods/x\" is not pod:<namespace>/<name> or podgroup:<namespace>/<name>"
        );
        assert!(Ledger::parse(&QueueName::new("q"), "[]").is_err());
    }

    #[test]
    fn pruning_keeps_fresh_entries_and_drops_expired_or_long_observed_ones() {
        let mut l = Ledger::default();
        l.record(&Effect::Pod(Box::new(pod("fresh-seen", None))), 1000);
        l.record(&Effect::Pod(Box::new(pod("old-seen", None))), 1000 - 31);
        l.record(&Effect::Pod(Box::new(pod("old-unseen", None))), 1000 - 60);
        l.record(&Effect::Pod(Box::new(pod("expired", None))), 1000 - 121);
        let seen = |k: &EntryKey, _: &Entry| k.to_string().contains("-seen");
        assert_eq!(l.prune(1000, seen), 2);
        let left: Vec<String> = l.iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(left, vec!["pod:ml/fresh-seen", "pod:ml/old-unseen"]);
    }
}
