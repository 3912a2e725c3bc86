//! Strict parsing of card-quota's annotations (docs/annotations.md).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};

use super::names::{shown, Alternatives, CardName, NameError, QueueName};
use super::pattern::{CardPattern, PatternError};
use super::quantity::Cards;

/// Queue annotation holding the per-model quota.
pub const QUOTA: &str = "volcano.sh/card.quota";
/// Queue annotation letting the queue's subtree use up to that many cards per model
/// beyond its quota, taken from its card parent's unassigned pool (same grammar as
/// [`QUOTA`]).
pub const BORROW: &str = "volcano.sh/card.borrow";
/// Job / PodGroup annotation holding the job's total card request.
pub const REQUEST: &str = "volcano.sh/card.request";
/// Written by card-quota on a PodGroup whose Volcano Job has card demand but no
/// `card.request`: the demand of the Job's tasks, in the grammar of `card.request`.
pub const DERIVED_REQUEST: &str = "volcano.sh/card.derived-request";
/// Volcano Job annotation (copied by Volcano to its PodGroup): `"true"` lets the pods of
/// a task that accept several models land on several; by default each such pod set
/// runs on one model, chosen at the enqueue.
pub const SPLIT: &str = "volcano.sh/card.split";
/// Queue annotation choosing the order among Jobs held at Volcano's enqueue:
/// `best-effort` (the default: a Job that fits goes ahead of older held ones) or
/// `strict` (a Job waits while an older Job of the queue is held).
pub const ORDER: &str = "volcano.sh/card.order";
/// Queue annotation choosing what card-quota does with a request that does not fit the
/// queue's quota: `deny` (refuse it) or `warn` (admit it with a warning, an Event and a
/// metric). Absent: the install's `--enforcement`.
pub const ENFORCEMENT: &str = "volcano.sh/card.enforcement";
/// Queue annotation choosing what happens to a pod that does not fit the queue's room
/// now but could fit its quota: `refuse` (the default) or `wait` (admitted behind
/// [`WAIT_GATE`], released in the queue's order as room appears). Absent: the
/// install's `--card-full`.
pub const FULL: &str = "volcano.sh/card.full";
/// The scheduling gate card-quota owns: a pod carrying it waits for room and holds no
/// quota. Removing it is a charge, decided as a CREATE is.
pub const WAIT_GATE: &str = "volcano.sh/card-quota";
/// Pod annotation naming the acceptable models.
pub const CARD_NAME: &str = "volcano.sh/card.name";
/// Pod / Binding annotation recording the model a bound pod is charged for.
pub const CHARGED: &str = "volcano.sh/card.charged";
/// Queue annotation the reconciler writes with the usage.
pub const USAGE: &str = "volcano.sh/card.usage";
/// Pod annotation naming the queue of a pod without a PodGroup.
pub const QUEUE_NAME: &str = "scheduling.volcano.sh/queue-name";
/// Pod label (and annotation) naming a pod's queue; Volcano reads it before
/// [`QUEUE_NAME`].
pub const VOLCANO_QUEUE: &str = "volcano.sh/queue-name";
/// Pod annotation card-quota writes when it pins a pod to a model: which and why.
pub const PINNED: &str = "volcano.sh/card.pinned";
/// Pod annotation card-quota stamps at CREATE: the queue the pod was admitted to and
/// is charged to from then on.
pub const CARD_QUEUE: &str = "volcano.sh/card.queue";
/// Pod annotation naming the pod's PodGroup.
pub const GROUP_NAME: &str = "scheduling.k8s.io/group-name";

/// What is wrong with an annotation value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("not valid JSON ({0})")]
    NotJson(String),
    #[error("expected a JSON object of model name to integer, got {0}")]
    NotObject(&'static str),
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
    #[error("value for {key:?} must be a {expected} integer, got {got}")]
    BadCount {
        key: String,
        expected: &'static str,
        got: String,
    },
    #[error("key {key:?}: {source}")]
    BadKey { key: String, source: NameError },
    #[error("key {key:?}: {source}")]
    BadPattern { key: String, source: PatternError },
    #[error("key {0:?} lists alternatives; a quota names single models")]
    CompositeQuotaKey(String),
    #[error("{0}")]
    BadName(NameError),
    #[error("the object lists no models")]
    Empty,
    #[error("{count} entries; at most {max} are allowed")]
    TooManyEntries { count: usize, max: usize },
    #[error("{count} group caps (keys ending in '*'); at most {MAX_CAPS} are allowed")]
    TooManyCaps { count: usize },
}

/// How many entries one `card.request` may hold: bounds the job-level checks.
pub const MAX_REQUEST_ENTRIES: usize = 64;

/// How many group caps one `card.quota` may hold: every decision on the queue walks
/// them (a tree of caps is a handful of levels in practice).
pub const MAX_CAPS: usize = 64;

/// How many models one `card.quota` may name: far more than any cluster has, and a
/// bound on what reading a hostile quota costs.
pub const MAX_QUOTA_ENTRIES: usize = 1024;

/// A malformed annotation on a named object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {annotation} on {object}: {problem}")]
pub struct AnnotationError {
    /// e.g. `queue team-a` or `pod ml/x`.
    pub object: String,
    pub annotation: &'static str,
    pub problem: Problem,
}

/// A queue's quota: model -> whole cards, and group caps (pattern -> cards over every
/// model it matches). A model neither named nor matched has quota 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quota {
    cards: BTreeMap<CardName, Cards>,
    /// The models in the order the annotation writes them: a pod that names no model
    /// tries its queue's models in this order (the admin's preference).
    written: Vec<CardName>,
    /// Group caps in the order the annotation writes them.
    caps: Vec<(CardPattern, Cards)>,
    /// Every model unlimited: how a `warn` queue is decided once its quota refused a
    /// request (never parsed, never stored).
    unlimited: bool,
}

impl Quota {
    pub fn new(cards: BTreeMap<CardName, Cards>) -> Self {
        Self {
            written: cards.keys().cloned().collect(),
            cards,
            caps: Vec::new(),
            unlimited: false,
        }
    }
    /// A quota from entries in written order (the first of a model counts).
    pub fn in_order(entries: Vec<(CardName, Cards)>) -> Self {
        Self::with_caps(entries, Vec::new())
    }
    /// A quota from models and group caps, each in written order (the first of a key
    /// counts).
    pub fn with_caps(entries: Vec<(CardName, Cards)>, caps: Vec<(CardPattern, Cards)>) -> Self {
        let mut cards = BTreeMap::new();
        let mut written = Vec::with_capacity(entries.len());
        for (m, n) in entries {
            if let std::collections::btree_map::Entry::Vacant(v) = cards.entry(m.clone()) {
                v.insert(n);
                written.push(m);
            }
        }
        let mut kept: Vec<(CardPattern, Cards)> = Vec::with_capacity(caps.len());
        for (p, n) in caps {
            if !kept.iter().any(|(k, _)| *k == p) {
                kept.push((p, n));
            }
        }
        Self {
            cards,
            written,
            caps: kept,
            unlimited: false,
        }
    }
    /// A quota that fits any request.
    pub fn unlimited() -> Self {
        Self {
            cards: BTreeMap::new(),
            written: Vec::new(),
            caps: Vec::new(),
            unlimited: true,
        }
    }
    /// The models the quota names, in the order its annotation writes them.
    pub fn models_in_order(&self) -> &[CardName] {
        &self.written
    }
    /// A model's own limit: its key's cards; for a model only a group cap matches, the
    /// smallest such cap (the caps themselves are checked as caps); else 0.
    pub fn get(&self, m: &CardName) -> Cards {
        if self.unlimited {
            return Cards::new(u64::MAX);
        }
        if let Some(n) = self.cards.get(m) {
            return *n;
        }
        self.caps_over(m)
            .map(|(_, n)| n)
            .min()
            .unwrap_or(Cards::ZERO)
    }
    /// True when the quota names `m`, by its own key or by a group cap: a pod that
    /// names no model may use it.
    pub fn names(&self, m: &CardName) -> bool {
        self.unlimited || self.cards.contains_key(m) || self.caps.iter().any(|(p, _)| p.matches(m))
    }
    /// The models the quota names by their own key, with their cards.
    pub fn entries(&self) -> &BTreeMap<CardName, Cards> {
        &self.cards
    }
    /// The group caps, in written order.
    pub fn caps(&self) -> &[(CardPattern, Cards)] {
        &self.caps
    }
    /// The group caps that count `m`'s cards.
    pub fn caps_over<'q>(
        &'q self,
        m: &'q CardName,
    ) -> impl Iterator<Item = (&'q CardPattern, Cards)> + 'q {
        self.caps
            .iter()
            .filter(move |(p, _)| p.matches(m))
            .map(|(p, n)| (p, *n))
    }
    /// This quota with `other`'s cards added per key (a share plus what it may
    /// borrow). A model one side names and the other only caps gets the other's limit
    /// for it added.
    pub fn plus(&self, other: &Quota) -> Quota {
        if self.unlimited || other.unlimited {
            return Self::unlimited();
        }
        let mut seen: std::collections::BTreeSet<&CardName> = std::collections::BTreeSet::new();
        let mut entries: Vec<(CardName, Cards)> = Vec::new();
        for m in self.written.iter().chain(&other.written) {
            if seen.insert(m) {
                entries.push((m.clone(), self.get(m) + other.get(m)));
            }
        }
        let mut caps: Vec<(CardPattern, Cards)> = Vec::new();
        for (p, _) in self.caps.iter().chain(&other.caps) {
            if !caps.iter().any(|(k, _)| k == p) {
                let of = |q: &Quota| {
                    q.caps
                        .iter()
                        .find(|(k, _)| k == p)
                        .map(|(_, n)| *n)
                        .unwrap_or_default()
                };
                caps.push((p.clone(), of(self) + of(other)));
            }
        }
        Self::with_caps(entries, caps)
    }
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }
}

/// A job's card request: `A` or `A|B` -> positive cards. Entries keep annotation order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CardRequest(pub Vec<(Alternatives, Cards)>);

impl CardRequest {
    pub fn total(&self) -> Cards {
        self.0.iter().map(|(_, n)| *n).sum()
    }
}

enum Raw {
    Int(i128),
    Other(String),
}

/// The entries of a JSON object in order; past `max` entries only counted (skipped
/// unread, so an oversized annotation costs one scan, not a parse of every entry).
struct Entries {
    kept: Vec<(String, Raw)>,
    total: usize,
}

struct EntriesSeed {
    max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for EntriesSeed {
    type Value = Entries;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Entries, D::Error> {
        struct V {
            max: usize,
        }
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                let mut total = 0;
                loop {
                    if total >= self.max {
                        use serde::de::IgnoredAny;
                        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                            total += 1;
                        }
                        break;
                    }
                    let Some(k) = map.next_key::<String>()? else {
                        break;
                    };
                    total += 1;
                    let v: serde_json::Value = map.next_value()?;
                    let raw = match &v {
                        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {
                            match (n.as_i64(), n.as_u64()) {
                                (Some(i), _) => Raw::Int(i128::from(i)),
                                (_, Some(u)) => Raw::Int(i128::from(u)),
                                _ => Raw::Other(v.to_string()),
                            }
                        }
                        other => Raw::Other(other.to_string()),
                    };
                    out.push((k, raw));
                }
                Ok(Entries { kept: out, total })
            }
        }
        d.deserialize_map(V { max: self.max })
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Parses a JSON object of name -> integer, keeping order and catching duplicate keys.
/// More than `max` entries is [`Problem::TooManyEntries`], found in one scan.
fn parse_entries(
    raw: &str,
    min: i128,
    expected: &'static str,
    max: usize,
) -> Result<Vec<(String, u64)>, Problem> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(raw);
    let seed = EntriesSeed { max };
    let parsed = seed.deserialize(&mut de).and_then(|e| de.end().map(|()| e));
    let entries = match parsed {
        Ok(e) => e,
        // Say what it is when it is JSON but not an object.
        Err(e) => {
            return Err(match serde_json::from_str::<serde_json::Value>(raw) {
                Ok(v) if !v.is_object() => Problem::NotObject(json_kind(&v)),
                _ => Problem::NotJson(e.to_string()),
            })
        }
    };
    if entries.total > max {
        return Err(Problem::TooManyEntries {
            count: entries.total,
            max,
        });
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(entries.kept.len());
    for (k, v) in entries.kept {
        if !seen.insert(k.clone()) {
            return Err(Problem::DuplicateKey(shown(&k)));
        }
        let n = match v {
            Raw::Int(i) if i >= min && u64::try_from(i).is_ok() => u64::try_from(i).unwrap_or(0),
            Raw::Int(i) => {
                return Err(Problem::BadCount {
                    key: shown(&k),
                    expected,
                    got: i.to_string(),
                })
            }
            Raw::Other(s) => {
                return Err(Problem::BadCount {
                    key: shown(&k),
                    expected,
                    got: shown(&s),
                })
            }
        };
        out.push((k, n));
    }
    Ok(out)
}

fn err(object: &str, annotation: &'static str, problem: Problem) -> AnnotationError {
    AnnotationError {
        object: object.to_string(),
        annotation,
        problem,
    }
}

/// Parses `volcano.sh/card.quota` of `object` (e.g. `queue team-a`).
pub fn parse_quota(object: &str, raw: &str) -> Result<Quota, AnnotationError> {
    parse_quota_in(object, QUOTA, raw)
}

/// Parses `volcano.sh/card.borrow` of `object`: the grammar of `card.quota`.
pub fn parse_borrow(object: &str, raw: &str) -> Result<Quota, AnnotationError> {
    parse_quota_in(object, BORROW, raw)
}

fn parse_quota_in(
    object: &str,
    annotation: &'static str,
    raw: &str,
) -> Result<Quota, AnnotationError> {
    let entries = parse_entries(raw, 0, "non-negative", MAX_QUOTA_ENTRIES)
        .map_err(|p| err(object, annotation, p))?;
    let mut q = Vec::with_capacity(entries.len());
    let mut caps = Vec::new();
    for (k, n) in entries {
        if CardPattern::is_pattern(&k) {
            let p = CardPattern::parse(&k).map_err(|source| {
                err(
                    object,
                    annotation,
                    Problem::BadPattern {
                        key: shown(&k),
                        source,
                    },
                )
            })?;
            caps.push((p, Cards::new(n)));
            continue;
        }
        if k.contains('|') {
            return Err(err(
                object,
                annotation,
                Problem::CompositeQuotaKey(shown(&k)),
            ));
        }
        let name = CardName::parse(&k).map_err(|source| {
            err(
                object,
                annotation,
                Problem::BadKey {
                    key: shown(&k),
                    source,
                },
            )
        })?;
        q.push((name, Cards::new(n)));
    }
    if caps.len() > MAX_CAPS {
        return Err(err(
            object,
            annotation,
            Problem::TooManyCaps { count: caps.len() },
        ));
    }
    Ok(Quota::with_caps(q, caps))
}

/// Parses `volcano.sh/card.request` of `object` (e.g. `podgroup ml/job-1`).
pub fn parse_request(object: &str, raw: &str) -> Result<CardRequest, AnnotationError> {
    parse_request_in(object, REQUEST, raw)
}

/// Parses a request in the grammar of `card.request` held by `annotation`.
pub fn parse_request_in(
    object: &str,
    annotation: &'static str,
    raw: &str,
) -> Result<CardRequest, AnnotationError> {
    let entries = parse_entries(raw, 1, "positive", MAX_REQUEST_ENTRIES)
        .map_err(|p| err(object, annotation, p))?;
    if entries.is_empty() {
        return Err(err(object, annotation, Problem::Empty));
    }
    let mut out: Vec<(Alternatives, Cards)> = Vec::new();
    for (k, n) in entries {
        let alts = Alternatives::parse(&k).map_err(|source| {
            err(
                object,
                annotation,
                Problem::BadKey {
                    key: shown(&k),
                    source,
                },
            )
        })?;
        out.push((alts, Cards::new(n)));
    }
    Ok(CardRequest(out))
}

/// Parses `volcano.sh/card.name` of `object` (e.g. `pod ml/x`).
pub fn parse_card_name(object: &str, raw: &str) -> Result<Alternatives, AnnotationError> {
    parse_card_name_of(|| object.to_string(), raw)
}

/// [`parse_card_name`] naming the object only when the value is refused.
pub fn parse_card_name_of(
    object: impl FnOnce() -> String,
    raw: &str,
) -> Result<Alternatives, AnnotationError> {
    Alternatives::parse(raw).map_err(|e| err(&object(), CARD_NAME, Problem::BadName(e)))
}

/// The queue a pod names itself, in Volcano's order: label `volcano.sh/queue-name`,
/// then annotation `volcano.sh/queue-name`, then annotation
/// `scheduling.volcano.sh/queue-name`. (Its PodGroup's queue comes before all three.)
pub fn named_queue(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Option<QueueName> {
    [
        labels.get(VOLCANO_QUEUE),
        annotations.get(VOLCANO_QUEUE),
        annotations.get(QUEUE_NAME),
    ]
    .into_iter()
    .flatten()
    .find(|q| !q.is_empty())
    .map(|q| QueueName::new(q.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota_err(raw: &str) -> String {
        parse_quota("queue q1", raw).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_quota_parses_every_model() {
        let q = parse_quota(
            "queue q1",
            r#"{"NVIDIA-H200":3,"NVIDIA-H200/mig-1g.18gb-mixed":4,"X":0}"#,
        )
        .unwrap();
        assert_eq!(
            q.get(&CardName::parse("NVIDIA-H200").unwrap()),
            Cards::new(3)
        );
        assert_eq!(
            q.get(&CardName::parse("NVIDIA-H200/mig-1g.18gb-mixed").unwrap()),
            Cards::new(4)
        );
        assert_eq!(q.get(&CardName::parse("absent").unwrap()), Cards::ZERO);
        assert_eq!(q.entries().len(), 3);
    }

    #[test]
    fn malformed_quotas_name_the_object_the_annotation_and_the_problem() {
        let cases = [
            ("{", "not valid JSON"),
            ("[1]", "got an array"),
            (
                r#"{"A":1.5}"#,
                r#"value for "A" must be a non-negative integer, got 1.5"#,
            ),
            (
                r#"{"A":-1}"#,
                r#"value for "A" must be a non-negative integer, got -1"#,
            ),
            (
                r#"{"A":"3"}"#,
                r#"value for "A" must be a non-negative integer, got "3""#,
            ),
            (r#"{"":1}"#, "empty model name"),
            (r#"{"A":1,"A":2}"#, r#"duplicate key "A""#),
            (r#"{"NVIDIA H200":1}"#, "contains whitespace"),
            (r#"{"A|B":1}"#, "lists alternatives"),
        ];
        for (raw, want) in cases {
            let got = quota_err(raw);
            assert!(
                got.starts_with("invalid volcano.sh/card.quota on queue q1: "),
                "{got}"
            );
            assert!(got.contains(want), "{raw}: {got} should contain {want}");
        }
    }

    #[test]
    fn a_request_keeps_alternatives_and_refuses_zero() {
        let r = parse_request("podgroup ml/j", r#"{"A|B":6,"C":1}"#).unwrap();
        assert_eq!(r.0[0].0.to_string(), "A|B");
        assert_eq!(r.total(), Cards::new(7));
        let e = parse_request("podgroup ml/j", r#"{"A":0}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a positive integer, got 0"), "{e}");
        let e = parse_request("podgroup ml/j", r#"{"A||B":1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty alternative"), "{e}");
        assert!(parse_request("podgroup ml/j", "{}").is_err());
    }

    #[test]
    fn a_huge_bad_count_is_not_echoed_whole() {
        let raw = format!(r#"{{"A":[{}]}}"#, "1,".repeat(5000) + "1");
        let e = quota_err(&raw);
        assert!(e.len() < 200, "{} bytes: {e}", e.len());
        assert!(
            e.contains("must be a non-negative integer, got [1,1,1"),
            "{e}"
        );
    }

    #[test]
    fn card_names_are_parsed_strictly() {
        assert!(parse_card_name("pod ml/x", "A|B").is_ok());
        let e = parse_card_name("pod ml/x", "A||B").unwrap_err().to_string();
        assert_eq!(
            e,
            r#"invalid volcano.sh/card.name on pod ml/x: empty alternative in "A||B" (expected A or A|B|C)"#
        );
    }
}

/// The order among a queue's Jobs held at the enqueue (`volcano.sh/card.order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// A Job that fits is enqueued even while older ones are held (Kueue's BestEffortFIFO).
    #[default]
    BestEffort,
    /// A Job waits while an older Job of the same queue is held (Kueue's StrictFIFO).
    Strict,
}

/// Parses `volcano.sh/card.order` of `object`.
pub fn parse_order(object: &str, raw: &str) -> Result<Order, String> {
    match raw {
        "best-effort" => Ok(Order::BestEffort),
        "strict" => Ok(Order::Strict),
        other => Err(format!(
            "invalid {ORDER} on {object}: expected \"strict\" or \"best-effort\", got {:?}",
            shown(other)
        )),
    }
}

/// What card-quota does with a request that does not fit a queue's quota (the
/// Gatekeeper / Kyverno convention: roll out in `warn`, then enforce).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Enforcement {
    /// Refuse it (and clamp scale-ups under `--scale-policy clamp`).
    #[default]
    Deny,
    /// Admit it as if the quota were unlimited, with a warning, an Event and a metric
    /// saying what `deny` would have done; usage stays exact (it may exceed the quota).
    Warn,
}

impl Enforcement {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Deny => "deny",
            Self::Warn => "warn",
        }
    }
}

impl std::str::FromStr for Enforcement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "deny" => Ok(Self::Deny),
            "warn" => Ok(Self::Warn),
            other => Err(format!(
                "expected \"deny\" or \"warn\", got {:?}",
                shown(other)
            )),
        }
    }
}

/// What a queue does with a pod that does not fit its room now (`volcano.sh/card.full`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Full {
    /// Refuse it (its controller retries with its own backoff).
    #[default]
    Refuse,
    /// Admit it behind card-quota's scheduling gate; release it when room appears.
    Wait,
}

impl Full {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Wait => "wait",
        }
    }
}

impl std::str::FromStr for Full {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "refuse" => Ok(Self::Refuse),
            "wait" => Ok(Self::Wait),
            other => Err(format!(
                "expected \"refuse\" or \"wait\", got {:?}",
                shown(other)
            )),
        }
    }
}

/// Parses `volcano.sh/card.full` of `object`.
pub fn parse_full(object: &str, raw: &str) -> Result<Full, String> {
    raw.parse()
        .map_err(|e| format!("invalid {FULL} on {object}: {e}"))
}

/// Parses `volcano.sh/card.enforcement` of `object`.
pub fn parse_enforcement(object: &str, raw: &str) -> Result<Enforcement, String> {
    raw.parse()
        .map_err(|e| format!("invalid {ENFORCEMENT} on {object}: {e}"))
}

#[cfg(test)]
mod enforcement_tests {
    use super::*;

    #[test]
    fn enforcement_parses_deny_and_warn_and_names_the_rest() {
        assert_eq!(parse_enforcement("queue q", "warn"), Ok(Enforcement::Warn));
        assert_eq!(parse_full("queue q", "wait"), Ok(Full::Wait));
        assert_eq!(parse_full("queue q", "refuse"), Ok(Full::Refuse));
        assert_eq!(
            parse_full("queue q", "queue"),
            Err(r#"invalid volcano.sh/card.full on queue q: expected "refuse" or "wait", got "queue""#.to_string())
        );
        assert_eq!(parse_enforcement("queue q", "deny"), Ok(Enforcement::Deny));
        assert_eq!(
            parse_enforcement("queue q", "Warn"),
            Err(r#"invalid volcano.sh/card.enforcement on queue q: expected "deny" or "warn", got "Warn""#.to_string())
        );
    }
}
