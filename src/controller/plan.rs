//! What the reconciler should write, computed from the snapshot alone (no I/O): the
//! usage annotation of each Queue and the Events its state calls for. (Ledger
//! pruning is `decide::batch::plan` with no requests.)

use std::collections::{BTreeMap, HashMap};

use crate::cards::{ObjectKey, QueueName};
pub use crate::decide::tree::queue_rows;
use crate::ledger::tally::same_usage;
use crate::ledger::{queue_usage, Row, UsageKey};
use crate::snapshot::Snapshot;

/// Event reason for a queue whose allocated cards exceed its quota.
pub const EXCEEDED: &str = "CardQuotaExceeded";
/// Event reason for a queue in deny under an install whose webhooks fail open (warn).
pub const DENY_FAILS_OPEN: &str = "CardQuotaDenyFailsOpen";

/// The `CardQuotaDenyFailsOpen` message: what the queue's deny holds and what does not.
pub fn deny_fails_open_message(queue: &QueueName) -> String {
    format!(
        "queue {queue} is in deny, but card-quota is installed in warn and its webhooks fail open: its quota is enforced only while card-quota answers (a pod created while it is down is not checked); install in deny (Helm enforcement=deny) to enforce it during an outage too"
    )
}

/// Event reason for a queue whose quota annotation does not parse.
pub const INVALID: &str = crate::decide::messages::INVALID.as_str();

/// One queue as the reconciler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    pub queue: QueueName,
    /// `spec.parent` (`None`: under root).
    pub parent: Option<QueueName>,
    /// Usage rows per model and composite key (the table of `status`).
    pub rows: BTreeMap<UsageKey, Row>,
    /// The queue object exists (usage of queues without one is not written).
    pub exists: bool,
    pub uid: Option<String>,
    /// The usage annotation as stored.
    pub stored_usage: Option<String>,
    /// The quota annotation's problem, when it does not parse.
    pub invalid: Option<String>,
    /// What is wrong with the queue's place in the tree (a cycle, a missing parent,
    /// children's shares above its quota).
    pub tree: Option<String>,
}

/// Event reason for a node that announces cards of a resource the install does not gate.
pub const UNMANAGED: &str = "UnmanagedCardResource";

/// A node's cards of a resource that is not among the install's card resources: never
/// counted nor gated, so said aloud (status, a metric, an Event on the node).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unmanaged {
    pub node: String,
    pub resource: String,
    pub model: String,
    pub cards: u64,
}

impl Unmanaged {
    /// The Event's message, and `status`'s line.
    pub fn message(&self) -> String {
        format!(
            "node {} announces {} {} cards ({}) but {} is not among card-quota's card resources: they are neither counted nor gated; add it with --card-resource (Helm: cardResources) to give queues a quota for {}",
            self.node, self.cards, self.resource, self.model, self.resource, self.model
        )
    }
}

/// Every node's cards the install does not gate.
pub fn unmanaged(snap: &Snapshot) -> Vec<Unmanaged> {
    snap.unmanaged_cards()
        .map(|(node, resource, model, cards)| Unmanaged {
            node: node.to_string(),
            resource: resource.to_string(),
            model: model.to_string(),
            cards,
        })
        .collect()
}

/// Event reason for a node whose card resources no product label names a model for.
pub const MODELLESS: &str = "CardsWithoutModel";

/// A node's cards of a card resource that no product label names a model for: no pod
/// can be pinned to or charged on them (a card pod that can only go there is admitted
/// nowhere, its binding there refused), so said aloud (status, an Event on the node).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Modelless {
    pub node: String,
    pub resource: String,
    pub cards: u64,
}

impl Modelless {
    /// The Event's message, and `status`'s line.
    pub fn message(&self) -> String {
        format!(
            "node {} offers {} {} but no <prefix>/<type>.product or .product-name label names their model: no pod can be pinned to or charged on them; label the node (GPU Feature Discovery, AMD's node labeller)",
            self.node, self.cards, self.resource
        )
    }
}

/// Every node's card resources without a model.
pub fn modelless(snap: &Snapshot) -> Vec<Modelless> {
    snap.modelless_cards()
        .map(|(node, resource, cards)| Modelless {
            node: node.to_string(),
            resource: resource.to_string(),
            cards,
        })
        .collect()
}

/// What is told about nodes in Events, once each: (node, reason, message).
pub fn node_reports(snap: &Snapshot) -> Vec<(String, &'static str, String)> {
    let unmanaged = unmanaged(snap)
        .into_iter()
        .map(|u| (u.node.clone(), UNMANAGED, u.message()));
    let modelless = modelless(snap)
        .into_iter()
        .map(|m| (m.node.clone(), MODELLESS, m.message()));
    unmanaged.chain(modelless).collect()
}

/// Event reason for a queue whose place in the tree needs an admin.
pub const TREE: &str = "CardQuotaTreeProblem";

/// What an admin should fix about `queue`'s place in the tree, if anything.
pub fn tree_problem(
    snap: &Snapshot,
    queue: &QueueName,
    rows: &BTreeMap<UsageKey, Row>,
) -> Option<String> {
    if snap.is_flat() || snap.queue(queue).is_none() {
        return None;
    }
    let mut out = Vec::new();
    match snap.ancestry(queue) {
        Err(f) => out.push(crate::decide::messages::fault_message(queue, &f)),
        Ok(a) => {
            if let Some(p) = a.missing {
                out.push(format!(
                    "queue {queue}'s parent queue {p} does not exist: {queue} is a top level, its own quota binds and nothing can be borrowed"
                ));
            }
        }
    }
    let over: Vec<String> = rows
        .iter()
        .filter_map(|(k, r)| {
            let s = r.shares?;
            (s > r.quota).then(|| format!("{k} shares {s} > quota {}", r.quota))
        })
        .collect();
    if !over.is_empty() {
        out.push(format!(
            "the shares of queue {queue}'s children over-subscribe it ({}): nothing can be borrowed there and shares are first come, first served",
            crate::decide::messages::short_list(&over)
        ));
    }
    (!out.is_empty()).then(|| crate::decide::messages::cap(out.join("; ")))
}

/// A pod to stamp with the queue it is counted in: (pod, queue, its resourceVersion).
pub type Stamp = (ObjectKey, QueueName, Option<u64>);

/// Card pods without a `volcano.sh/card.queue` stamp (created before card-quota was
/// installed, or while it was not called), with the queue each is counted in, at most
/// `limit`. Stamped, their queue no longer follows their PodGroup: deleting it and
/// creating one of the same name in another queue cannot move their cards.
pub fn unstamped(snap: &Snapshot, now: jiff::Timestamp, limit: usize) -> Vec<Stamp> {
    let mut out = Vec::new();
    for q in snap.queue_names() {
        for p in snap.queue_pods(&q) {
            if out.len() >= limit {
                return out;
            }
            if p.stamped_queue.is_none() && p.is_active(now) && p.version.uid.is_some() {
                out.push((p.key.clone(), q.clone(), p.version.resource_version));
            }
        }
    }
    out
}

/// Computes the state of `queue`.
pub fn queue_state(snap: &Snapshot, queue: &QueueName, now: jiff::Timestamp) -> QueueState {
    let rec = snap.queue(queue);
    let rows = queue_rows(snap, queue, now);
    QueueState {
        queue: queue.clone(),
        parent: rec.and_then(|r| r.parent.clone()),
        tree: tree_problem(snap, queue, &rows),
        rows,
        exists: rec.is_some(),
        uid: rec.and_then(|r| r.uid.clone()),
        stored_usage: rec.and_then(|r| r.usage.clone()),
        invalid: rec.and_then(|r| match &r.quota {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        }),
    }
}

/// The queues a full recount check covers: every Queue object and every queue the
/// tally counts (a queue deleted with pods still charged to it included).
pub fn recount_queues(snap: &Snapshot) -> Vec<QueueName> {
    snap.queue_names()
        .into_iter()
        .chain(snap.tally().queues().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Recounts queues from the front of `queues` until at least `pods` pods and PodGroups
/// were recounted (a queue is never split: its tally and its recount must be read at
/// one moment). Returns how many queues it checked and those whose tally disagrees.
/// The reconciler calls it slice by slice and lets go of the snapshot in between, so
/// an admission never waits for a whole recount.
pub fn recount_slice(
    snap: &Snapshot,
    queues: &[QueueName],
    pods: usize,
    now: jiff::Timestamp,
) -> (usize, Vec<QueueName>) {
    let mut counted = 0usize;
    let mut checked = 0usize;
    let mut wrong = Vec::new();
    for q in queues {
        if checked > 0 && counted >= pods {
            break;
        }
        checked += 1;
        counted += snap.queue_size(q);
        let recount = queue_usage(
            Default::default(),
            snap.queue_pods(q),
            snap.queue_groups(q),
            snap,
            now,
        );
        if !same_usage(&snap.usage(q, now), &recount) {
            wrong.push(q.clone());
        }
    }
    (checked, wrong)
}

/// Queues whose incremental usage differs from a full recount of their objects, and
/// whether the tally saw bookkeeping errors: [`recount_slice`] over every queue at once.
pub fn recount_check(snap: &Snapshot, now: jiff::Timestamp) -> (Vec<QueueName>, u64) {
    let (_, wrong) = recount_slice(snap, &recount_queues(snap), usize::MAX, now);
    (wrong, snap.tally().errors())
}

/// The `volcano.sh/card.usage` text: rows per model plus `observedAt`.
pub fn usage_text(rows: &BTreeMap<UsageKey, Row>, observed_at: jiff::Timestamp) -> String {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        #[serde(flatten)]
        rows: &'a BTreeMap<UsageKey, Row>,
        #[serde(rename = "observedAt")]
        observed_at: String,
    }
    let doc = Doc {
        rows,
        observed_at: observed_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    };
    serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_string())
}

/// True when `stored` already says `rows` (its `observedAt` aside).
pub fn usage_matches(stored: Option<&str>, rows: &BTreeMap<UsageKey, Row>) -> bool {
    let Some(text) = stored else {
        return false;
    };
    let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str::<serde_json::Value>(text)
    else {
        return false;
    };
    m.remove("observedAt");
    let Ok(stored_rows) =
        serde_json::from_value::<BTreeMap<UsageKey, Row>>(serde_json::Value::Object(m))
    else {
        return false;
    };
    &stored_rows == rows
}

/// The usage annotation to write, or `None` when the stored one is current (no-op
/// writes would wake every Queue watcher, Volcano's scheduler included).
pub fn usage_write(s: &QueueState, now: jiff::Timestamp) -> Option<String> {
    if !s.exists || (s.rows.is_empty() && s.stored_usage.is_none()) {
        return None;
    }
    if usage_matches(s.stored_usage.as_deref(), &s.rows) {
        return None;
    }
    Some(usage_text(&s.rows, now))
}

/// The `CardQuotaExceeded` message when allocated cards exceed the quota of a model.
pub fn exceeded_message(s: &QueueState) -> Option<String> {
    let over: Vec<String> = s
        .rows
        .iter()
        .filter(|(k, r)| k.has_quota() && r.allocated > r.cap())
        .map(|(k, r)| match r.borrow {
            Some(b) => format!(
                "{k} allocated {} > quota {} + borrow {b}",
                r.allocated, r.quota
            ),
            None => format!("{k} allocated {} > quota {}", r.allocated, r.quota),
        })
        .collect();
    if over.is_empty() {
        return None;
    }
    let mut msg = format!("queue {} is over its card quota: ", s.queue);
    let mut shown = 0;
    for o in &over {
        // Keep Events short (docs/outputs.md: under ~250 characters).
        if msg.len() + o.len() > 230 {
            break;
        }
        if shown > 0 {
            msg.push_str("; ");
        }
        msg.push_str(o);
        shown += 1;
    }
    if shown < over.len() {
        msg.push_str(&format!("; and {} more models", over.len() - shown));
    }
    Some(msg)
}

/// The `InvalidCardQuota` message for a quota annotation that does not parse.
pub fn invalid_message(s: &QueueState) -> Option<String> {
    s.invalid
        .as_ref()
        .map(|e| format!("{e}; the queue has quota 0 for every model until it is fixed"))
}

/// Remembers the last condition reported per queue and reason, so Events are sent
/// when a condition appears or changes, not on every resync.
#[derive(Debug, Default)]
pub struct EventMemory {
    last: HashMap<(QueueName, &'static str), String>,
}

impl EventMemory {
    /// The message to publish now, if any. `None` clears the condition.
    pub fn note(
        &mut self,
        queue: &QueueName,
        reason: &'static str,
        message: Option<String>,
    ) -> Option<String> {
        let key = (queue.clone(), reason);
        match message {
            None => {
                self.last.remove(&key);
                None
            }
            Some(m) if self.last.get(&key) == Some(&m) => None,
            Some(m) => {
                self.last.insert(key, m.clone());
                Some(m)
            }
        }
    }

    /// Forgets a condition whose Event could not be published, so it is tried again.
    pub fn forget(&mut self, queue: &QueueName, reason: &'static str) {
        self.last.remove(&(queue.clone(), reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::load::load;

    const SNAP: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: h1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, uid: u-q, resourceVersion: "5", annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: bad, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":-1}'}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
spec: {nodeName: h1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "2"}}}]}
"#;

    fn now() -> jiff::Timestamp {
        "2026-11-22T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn usage_is_written_once_and_not_again_when_unchanged() {
        let (snap, _) = load(SNAP).unwrap();
        let s = queue_state(&snap, &QueueName::new("q"), now());
        let text = usage_write(&s, now()).unwrap();
        assert_eq!(
            text,
            r#"{"NVIDIA-H200":{"quota":1,"allocated":2,"pending":0,"reserved":0},"observedAt":"2026-11-22T10:00:00Z"}"#
        );
        let mut again = s.clone();
        again.stored_usage = Some(text);
        assert_eq!(usage_write(&again, now()), None);
    }

    #[test]
    fn an_over_quota_queue_and_a_broken_quota_get_their_messages_once() {
        let (snap, _) = load(SNAP).unwrap();
        let s = queue_state(&snap, &QueueName::new("q"), now());
        let over = exceeded_message(&s).unwrap();
        assert_eq!(
            over,
            "queue q is over its card quota: NVIDIA-H200 allocated 2 > quota 1"
        );
        let bad = queue_state(&snap, &QueueName::new("bad"), now());
        assert!(invalid_message(&bad)
            .unwrap()
            .starts_with("invalid volcano.sh/card.quota on queue bad: "));
        let mut mem = EventMemory::default();
        let q = QueueName::new("q");
        assert!(mem.note(&q, EXCEEDED, Some(over.clone())).is_some());
        assert!(mem.note(&q, EXCEEDED, Some(over.clone())).is_none());
        assert!(mem.note(&q, EXCEEDED, None).is_none());
        assert!(mem.note(&q, EXCEEDED, Some(over)).is_some());
    }

    #[test]
    fn a_recount_in_slices_checks_every_queue_once_and_finds_what_a_whole_one_finds() {
        let mut text = String::from(SNAP);
        for (q, pods) in [("q1", 3), ("q2", 1), ("q3", 2)] {
            text += &format!(
                "---\napiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {{name: {q}}}\n"
            );
            for i in 0..pods {
                text += &format!(
                    "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {q}-{i}, namespace: ml, annotations: {{scheduling.volcano.sh/queue-name: {q}}}}}\nspec: {{nodeName: h1, containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: \"1\"}}}}}}]}}\n"
                );
            }
        }
        let (mut snap, _) = load(&text).unwrap();
        assert_eq!(recount_check(&snap, now()), (Vec::new(), 0));
        snap.forget_in_tally(&crate::cards::ObjectKey::new("ml", "q3-1"));
        let queues = recount_queues(&snap);
        let names: Vec<&str> = queues.iter().map(QueueName::as_str).collect();
        assert_eq!(names, ["bad", "q", "q1", "q2", "q3"]);
        // Two pods a slice: a queue is never split, and a slice ends once it has read
        // its two pods ("bad" holds none, "q" one, "q1" three).
        let mut slices = Vec::new();
        let mut wrong = Vec::new();
        let mut at = 0;
        while at < queues.len() {
            let (checked, w) = recount_slice(&snap, &queues[at..], 2, now());
            slices.push(names[at..at + checked].join(","));
            at += checked;
            wrong.extend(w);
        }
        assert_eq!(slices, ["bad,q,q1", "q2,q3"]);
        assert_eq!(wrong, [QueueName::new("q3")]);
        assert_eq!(recount_check(&snap, now()).0, wrong);
        snap.rebuild_tally();
        assert_eq!(recount_check(&snap, now()), (Vec::new(), 0));
    }
}
