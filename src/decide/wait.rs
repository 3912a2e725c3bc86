//! Waiting instead of refusal (docs/decisions.md, "Pods that wait for room"). Under
//! `volcano.sh/card.full: wait` a pod that does not fit its queue's room now but could
//! fit its quota is admitted behind card-quota's scheduling gate ([`WAIT_GATE`]) and
//! holds no quota while it waits. Removing the gate (the releaser's write, or anyone's)
//! is a pod UPDATE decided as its CREATE would be: pinned, charged and recorded before
//! the answer (rule R1), or refused, and the pod stays gated. No replica can release
//! past the quota because a release is one more charge through the one commit path.

use json_patch::{AddOperation, PatchOperation};
use serde_json::{json, Value};

use crate::cards::annotations::{Full, Order, WAIT_GATE};
use crate::cards::{Alternatives, Cards, ObjectKey, QueueName};
use crate::cluster::pod_parts::PodParts;
use crate::cluster::PodRecord;
use crate::ledger::usage::Share;
use crate::ledger::{QueueUsage, Verdict};
use crate::snapshot::Snapshot;

use super::fit::{feasible, models_of};
use super::messages::INSUFFICIENT;
use super::patch::pointer;
use super::{Config, Decision};

/// What `queue` does with a pod that does not fit now: its own `card.full`, else the
/// install's. A queue whose annotation does not parse refuses (the Queue hook refuses
/// such a write; one stored before is reported by `status`).
pub fn policy(snap: &Snapshot, cfg: &Config, queue: &QueueName) -> Full {
    match snap.queue(queue).map(|q| &q.full) {
        Some(Ok(Some(f))) => *f,
        Some(Err(_)) => Full::Refuse,
        _ => cfg.full,
    }
}

/// True when a pod of `cards` on one of `alternatives` fits `queue`'s quota (and every
/// card level above it) with nothing else in use: only such a pod may wait; one that
/// never could is refused at once rather than held forever.
pub fn could_ever_fit(
    snap: &Snapshot,
    queue: &QueueName,
    alternatives: &Alternatives,
    cards: Cards,
) -> bool {
    let touched = models_of([alternatives]);
    let alone = |quota: crate::cards::Quota| {
        let mut u = QueueUsage::new(quota);
        u.add_share(
            &ObjectKey::new("", ""),
            &Share::Pending(alternatives.clone(), cards),
        );
        feasible(&u, &touched) == Verdict::Feasible
    };
    if !snap.quota_lifted(queue) && !alone(snap.cap_of(queue).into_owned()) {
        return false;
    }
    let levels = snap.ancestry(queue).map(|a| a.levels).unwrap_or_default();
    levels
        .iter()
        .filter(|l| !snap.quota_lifted(l))
        .all(|l| alone(snap.cap_of(l).into_owned()))
}

/// The order waiting pods of a queue are released in: oldest first (creation time, then
/// the order this replica saw them, then name).
pub fn place(p: &PodRecord) -> (Option<jiff::Timestamp>, u64, &ObjectKey) {
    (p.created, p.seq, &p.key)
}

/// The waiting pods of `queue`, in their order.
pub fn waiting_in<'s>(
    snap: &'s Snapshot,
    queue: &QueueName,
    now: jiff::Timestamp,
) -> Vec<&'s PodRecord> {
    let mut out: Vec<&PodRecord> = snap
        .queue_pods(queue)
        .filter(|p| p.gated && p.node.is_none() && p.is_active(now))
        .collect();
    out.sort_by(|a, b| place(a).cmp(&place(b)));
    out
}

/// Under strict order (`card.order: strict`), the oldest pod of `queue` waiting before
/// `pod` that could fit the quota: `pod` is released only after it. Best-effort order
/// lets a pod that fits go.
pub fn held_behind(
    snap: &Snapshot,
    queue: &QueueName,
    pod: &PodRecord,
    now: jiff::Timestamp,
) -> Option<ObjectKey> {
    let strict = snap
        .queue(queue)
        .is_some_and(|q| q.order == Ok(Order::Strict));
    if !strict {
        return None;
    }
    let mine = place(pod);
    waiting_in(snap, queue, now)
        .into_iter()
        .take_while(|w| place(w) < mine)
        .find(|w| {
            w.key != pod.key
                && w.effective_alternatives()
                    .is_some_and(|a| could_ever_fit(snap, queue, &a, w.cards()))
        })
        .map(|w| w.key.clone())
}

/// Why a new pod of `queue` waits behind pods already waiting, though it may fit: under
/// strict order any waiting pod goes first; under best-effort order a waiting pod goes
/// first when the room is there for it (the room is the older pod's; the releaser is a
/// moment behind the pod that freed it). `None`: nobody waits before it. Costs nothing
/// unless the queue has waiting pods; then one pass over the queue's pods and one fit
/// per distinct waiting demand.
pub fn line_ahead(snap: &Snapshot, queue: &QueueName, now: jiff::Timestamp) -> Option<String> {
    let u = snap.counted(queue, now);
    let waiting = u.gated_pods;
    if waiting == 0 {
        return None;
    }
    let strict = snap
        .queue(queue)
        .is_some_and(|q| q.order == Ok(Order::Strict));
    if strict {
        return Some(format!(
            "queue {queue} releases waiting pods in order ({}: strict): {waiting} pods wait before this one",
            crate::cards::annotations::ORDER
        ));
    }
    // The common case, a full queue, costs one fit per distinct set of models waiting:
    // when not even one card on those models fits, no waiting pod does (more cards and
    // node constraints only make it harder; a pod of a PodGroup draws on its group's
    // reservation, which no newcomer can take).
    let one = Cards::new(1);
    let any_room = u.gated.keys().any(|a| {
        let change = super::fit::Change {
            extra: vec![crate::ledger::Demand::pod(a.clone(), one)],
            ..Default::default()
        };
        super::fit::fit(snap, queue, &change, &models_of([a]), now).verdict == Verdict::Feasible
    });
    if !any_room {
        return None;
    }
    // One pod of each distinct demand (models, cards, constraints, group); no order
    // needed: whichever fits, a waiting pod goes first.
    let mut shapes: Vec<&PodRecord> = Vec::new();
    for p in snap
        .queue_pods(queue)
        .filter(|p| p.gated && p.node.is_none() && p.is_active(now))
    {
        if !shapes.iter().any(|q| Shape::of(q) == Shape::of(p)) {
            shapes.push(p);
        }
    }
    shapes.into_iter().find_map(|p| {
        let a = p.effective_alternatives()?;
        let cards = p.cards();
        let mut released = p.clone();
        released.gated = false;
        let change = super::fit::Change {
            add_pods: vec![released],
            ..Default::default()
        };
        let fits = super::fit::fit(snap, queue, &change, &models_of([&a]), now).verdict
            == Verdict::Feasible;
        fits.then(|| {
            format!(
                "queue {queue} has room for pod {} that waits before this one ({cards} {a}); it goes first",
                p.key
            )
        })
    })
}

/// Adds [`WAIT_GATE`] to a pod's `spec.schedulingGates`.
pub fn add_gate(pod: &PodParts) -> PatchOperation {
    let has_gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some();
    let gate: Value = json!({ "name": WAIT_GATE });
    if has_gates {
        PatchOperation::Add(AddOperation {
            path: pointer(&["spec", "schedulingGates", "-"]),
            value: gate,
        })
    } else {
        PatchOperation::Add(AddOperation {
            path: pointer(&["spec", "schedulingGates"]),
            value: Value::Array(vec![gate]),
        })
    }
}

/// The pod is admitted to wait: `refused` says for what. Charges nothing.
pub fn waiting(refused: &Decision, patch: Vec<PatchOperation>, queue: &QueueName) -> Decision {
    let why = refused
        .message
        .clone()
        .unwrap_or_else(|| format!("queue {queue} has no room"));
    let mut d = Decision::allow();
    d.patch = patch;
    d.warnings.push(super::messages::cap(format!(
        "the pod waits for room (volcano.sh/card.full: wait; gate {WAIT_GATE}): {why}"
    )));
    d
}

/// True when a refusal is only for room: a pod refused so may wait.
pub fn for_room(d: &Decision) -> bool {
    !d.allowed && d.reason == Some(INSUFFICIENT) && !d.undecided
}

/// What decides whether a waiting pod fits: its models, its card resources, its node
/// constraints and the PodGroup whose reservation it may draw on. Waiting pods of one
/// shape fit or do not fit together.
#[derive(Debug, PartialEq)]
struct Shape<'p>(
    &'p Option<Result<Alternatives, Box<crate::cards::AnnotationError>>>,
    &'p Result<crate::cards::demand::ResourceDemand, Box<crate::cards::demand::PodDemandError>>,
    &'p std::collections::BTreeMap<String, Vec<String>>,
    &'p std::collections::BTreeMap<String, Vec<String>>,
    Option<&'p String>,
);

impl<'p> Shape<'p> {
    fn of(p: &'p PodRecord) -> Self {
        Self(
            &p.card_name,
            &p.demand,
            &p.pinned,
            &p.excluded,
            p.group.as_ref(),
        )
    }
}

/// A waiting pod to release now: its room is there (as this snapshot counts it, with
/// the releases before it in the same plan counted too). The release itself is decided
/// by the webhook; the plan only says which UPDATEs are worth sending, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub pod: ObjectKey,
    pub uid: Option<String>,
    pub queue: QueueName,
}

/// A pod that stays waiting, and why (what `kubectl describe pod` shows as its Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Still {
    pub pod: ObjectKey,
    pub uid: Option<String>,
    pub queue: QueueName,
    /// What it waits for (the same while it waits for the same thing).
    pub why: String,
    /// Waiting pods of its queue before it.
    pub ahead: usize,
}

impl Still {
    /// The message of its Event.
    pub fn message(&self) -> String {
        match self.ahead {
            0 => self.why.clone(),
            n => format!("{}; {n} waiting pods ahead", self.why),
        }
    }
}

/// What the releaser does in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub releases: Vec<Release>,
    pub waiting: Vec<Still>,
}

/// Plans the releases of every queue with waiting pods, oldest first: a pod whose room
/// is there is released; under strict order the first that does not fit holds every
/// younger one (a pod that could never fit the quota as it is now holds nobody).
pub fn plan(snap: &Snapshot, now: jiff::Timestamp) -> Plan {
    let mut out = Plan::default();
    for queue in snap.queue_names() {
        if snap.counted(&queue, now).gated_pods == 0 {
            continue;
        }
        let strict = snap
            .queue(&queue)
            .is_some_and(|q| q.order == Ok(Order::Strict));
        let mut change = super::fit::Change::default();
        let mut blocked: Option<&ObjectKey> = None;
        // Demands found without room this pass, with why: releases only take room, so
        // a pod of the same demand and constraints is not checked again (a pass costs
        // one check per distinct demand that does not fit, not one per waiting pod).
        let mut no_room: Vec<(Shape<'_>, String)> = Vec::new();
        let waiting = waiting_in(snap, &queue, now);
        for (ahead, p) in waiting.iter().enumerate() {
            let still = |why: String| Still {
                pod: p.key.clone(),
                uid: p.version.uid.clone(),
                queue: queue.clone(),
                why,
                ahead,
            };
            let Some(alternatives) = p.effective_alternatives() else {
                out.waiting.push(still(format!(
                    "pod {} names no valid card model; it is released when that is fixed",
                    p.key
                )));
                continue;
            };
            let cards = p.cards();
            if let Some(first) = blocked {
                out.waiting.push(still(format!(
                    "waiting for {cards} {alternatives} of queue {queue} in order ({}: strict): pod {first} is released first",
                    crate::cards::annotations::ORDER
                )));
                continue;
            }
            let shape = Shape::of(p);
            if let Some((_, why)) = no_room.iter().find(|(s, _)| *s == shape) {
                out.waiting.push(still(why.clone()));
                continue;
            }
            if !could_ever_fit(snap, &queue, &alternatives, cards) {
                out.waiting.push(still(format!(
                    "waiting for {cards} {alternatives} of queue {queue}: more than its quota allows now; released once the quota is raised"
                )));
                continue;
            }
            let mut released = (*p).clone();
            released.gated = false;
            change.add_pods.push(released);
            let refused = {
                let f = super::fit::fit(snap, &queue, &change, &models_of([&alternatives]), now);
                (f.verdict != Verdict::Feasible).then(|| f.message(&alternatives, cards))
            };
            let Some(why) = refused else {
                out.releases.push(Release {
                    pod: p.key.clone(),
                    uid: p.version.uid.clone(),
                    queue: queue.clone(),
                });
                continue;
            };
            change.add_pods.pop();
            let why = format!("waiting: {why}");
            out.waiting.push(still(why.clone()));
            no_room.push((shape, why));
            if strict {
                blocked = Some(&p.key);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_goes_in_whether_or_not_the_pod_has_gates() {
        let bare: PodParts = serde_json::from_value(json!({"spec": {"containers": []}})).unwrap();
        let gated: PodParts = serde_json::from_value(
            json!({"spec": {"containers": [], "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}),
        )
        .unwrap();
        let apply = |p: &PodParts, doc: Value| {
            let mut doc = doc;
            json_patch::patch(&mut doc, &[add_gate(p)]).unwrap();
            doc["spec"]["schedulingGates"].clone()
        };
        assert_eq!(
            apply(&bare, json!({"spec": {"containers": []}})),
            json!([{"name": "volcano.sh/card-quota"}])
        );
        assert_eq!(
            apply(
                &gated,
                json!({"spec": {"containers": [], "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}})
            ),
            json!([{"name": "kueue.x-k8s.io/admission"}, {"name": "volcano.sh/card-quota"}])
        );
    }
}
