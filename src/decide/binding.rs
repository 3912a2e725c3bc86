//! `pods/binding` CREATE: the scheduler's bind, the hard line (docs/decisions.md).

use serde_json::Value;

use crate::cards::annotations::CHARGED;
use crate::cards::{CardName, Cards, ObjectKey, QueueName};
use crate::cluster::PodRecord;
use crate::ledger::Effect;
use crate::snapshot::{Snapshot, UnknownGroup};

use super::messages::{
    gate, unknown_group, unreadable_claims, BAD_REQUEST, INSUFFICIENT, INVALID_DEMAND,
    NOT_ACCEPTED, RETRY,
};
use super::patch::set_annotation;
use super::pod::{allocate_with, card_demand, infer, Source};
use super::review::{AdmissionRequest, Operation};
use super::{object_of, Decision, ObjectRef};

/// What the cache shows of the pod a Binding binds.
pub enum Shown<'a> {
    Pod(&'a PodRecord),
    /// Known, and it asks for no card.
    Cardless,
    /// Not this pod: none under its name, or another one (deleted and made again, the
    /// cache behind).
    Unseen,
}

/// The pod `key` a Binding `obj` binds, as `snap` shows it: by name, and by uid when the
/// Binding names one (kube-scheduler and Volcano's binder set the pod's), so a cache that
/// shows an older pod of that name is not read as this one.
pub fn shown<'a>(snap: &'a Snapshot, key: &ObjectKey, obj: &Value) -> Shown<'a> {
    let uid = obj
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty());
    match snap.pod(key) {
        Some(p) => match (uid, p.version.uid.as_deref()) {
            (Some(want), Some(have)) if want != have => Shown::Unseen,
            _ => Shown::Pod(p),
        },
        None if snap.is_known_cardless_incarnation(key, uid) => Shown::Cardless,
        None => Shown::Unseen,
    }
}

/// The pod a Binding binds and the node it names (`None` when it names none).
pub fn target<'a>(req: &AdmissionRequest, obj: &'a Value) -> (ObjectKey, Option<&'a str>) {
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(req.ns());
    let node = obj
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty());
    (ObjectKey::new(namespace, req.object_name(obj)), node)
}

pub fn decide(
    req: &AdmissionRequest,
    snap: &Snapshot,
    cfg: &super::Config,
    now: jiff::Timestamp,
) -> Decision {
    if req.operation != Operation::Create {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let (key, node) = target(req, obj);
    let Some(node) = node else {
        return Decision::deny(
            BAD_REQUEST,
            format!("binding of pod {key} has no target.name"),
        );
    };
    let pod = match shown(snap, &key, obj) {
        Shown::Pod(p) => p,
        Shown::Cardless => return Decision::allow(),
        Shown::Unseen => {
            // With pins on, every card pod was charged at its CREATE on the one model it is
            // pinned to (the ledger shows it to every replica), so a card pod the cache
            // does not show yet has its charge counted already: its bind never waits on
            // card-quota's cache (the reconciler stamps `card.charged` later).
            if cfg.pin {
                return Decision::allow();
            }
            return Decision::deny(
                RETRY,
                format!("pod {key} is not in card-quota's cache yet; try again"),
            );
        }
    };
    // A scheduler retrying a bind that succeeded (its client timed out) must not replace
    // the first charge: the API server refuses it with 409 anyway, but only after the
    // webhooks ran. The cache, or a ledger entry laid over it, shows the first bind.
    if let Some(bound) = pod.node.as_ref().filter(|_| !pod.bind_unseen) {
        return Decision::deny(
            BAD_REQUEST,
            format!("pod {key} is already bound to node {bound}; a pod is bound once"),
        );
    }
    let queue = match snap.resolve_queue(pod) {
        Ok(q) => q,
        Err(UnknownGroup(g)) => return unknown_group(&key, g),
    };
    if let Some(bound) = &pod.node {
        if let Some(d) = past_a_cut(snap, &queue, pod, now) {
            return d;
        }
        return retried(obj, pod, queue, bound, node);
    }
    // A pod of shared claims pays for them when its binding is the first to put them
    // to use; the sharer that paid while pending then no longer does.
    let (mut rec, sharers) = snap.as_bound(pod, node);
    // A stored pod whose card.name no longer parses is charged by its node's model; so
    // is any pod in warn's second decision (nothing pinned it).
    if matches!(rec.card_name, Some(Err(_))) || cfg.any_model {
        rec.card_name = None;
    }
    let resources = match &rec.demand {
        Ok(d) => d.len(),
        Err(e) => return Decision::deny(INVALID_DEMAND, e.to_string()),
    };
    // Claims that cannot be read leave no card resource to count: never a binding of
    // no cards.
    if let Some(Err(e)) = &rec.claimed {
        return unreadable_claims(e);
    }
    if resources == 0 && rec.card_name.is_none() {
        return Decision::allow();
    }
    if resources <= 1 {
        match card_demand(&rec, snap, Some(&queue)) {
            Ok(Some(d)) => {
                // A pod that names no model (admitted before card-quota named one for
                // it, or unpinned under warn) is charged by its node's model; a named
                // pod that is pinned too, by the models of its pin (found by the live
                // model: an `A|B` pod pinned to B bound onto an A node freed its B
                // card while still pending on B, and B went past its quota).
                if d.source == Source::Pinned {
                    rec.name_models(d.alternatives);
                } else if let Some(pinned) = infer(&rec, &d.resource, snap) {
                    // Named and pinned by a node selector on the product label.
                    let model = snap.node(node).and_then(|n| n.model_for(&d.resource));
                    if let Some(model) =
                        model.filter(|m| d.alternatives.contains(m) && !pinned.contains(m))
                    {
                        // Whatever the quota: the kubelet would refuse the pod there.
                        return Decision::deny(
                            NOT_ACCEPTED,
                            format!(
                                "pod {key} accepts {} but its node selector pins it to {pinned}, and node {node} has {model}: the kubelet would refuse it there",
                                d.alternatives
                            ),
                        )
                        .with_event(Some(regarding(&key)));
                    }
                }
            }
            Ok(None) if rec.card_name.is_none() => {}
            Ok(None) => return Decision::allow(),
            // No name and no pin: the node decides the model.
            Err(_) if rec.card_name.is_none() => {}
            Err(d) => return d,
        }
    } else {
        // Several card resources (stored while card-quota was not gating pods): every
        // one of them is charged by its model on the node; a name cannot cover them all.
        rec.card_name = None;
    }
    let regarding = regarding(&key);
    if let Err(d) = gate(snap, &queue) {
        return d.with_event(Some(regarding));
    }
    match allocate_with(snap, &queue, &rec, &sharers, node, now) {
        Ok(charges) => {
            let mut d = Decision::allow();
            let mut bound = rec;
            bound.node = Some(node.to_string());
            if let ([(model, _)], 1) = (charges.as_slice(), resources) {
                d.patch.push(set_annotation(obj, CHARGED, model.as_str()));
                bound.charged = Some(model.clone());
            }
            d.charging(queue, Effect::Pod(Box::new(bound)))
        }
        Err(d) => d.with_event(Some(regarding)),
    }
}

/// A binding (or allocation) card-quota recorded whose answer was lost is admitted again
/// as that charge when retried, but not past a quota cut since: for the API server the
/// first never happened, so this retry is where the cards are bound, and no binding
/// puts a queue's bound cards past its quota (found by the committer model: a replica
/// crashed after recording an allocation, the quota was cut to 0, and the scheduler's
/// retry was admitted as the charge recorded before the cut). The queue's quota and
/// every card level's cap above it (a subtree's bound cards), each group cap among
/// them. `None`: within them all.
pub(super) fn past_a_cut(
    snap: &Snapshot,
    queue: &QueueName,
    pod: &PodRecord,
    now: jiff::Timestamp,
) -> Option<Decision> {
    let charges = crate::ledger::usage::bound_charges(pod, snap).ok()?;
    let levels = std::iter::once((queue.clone(), snap.usage(queue, now)))
        .chain(super::tree::level_usages(snap, queue, now));
    for (level, u) in levels {
        let bound = |m: &CardName| u.allocated.get(m).copied().unwrap_or_default();
        let whose = if level == *queue {
            ""
        } else {
            " in its subtree"
        };
        let over = charges
            .iter()
            .find_map(|(m, cards)| {
                (bound(m) > u.quota.get(m)).then(|| {
                    (
                        format!("{} {m}", bound(m)),
                        format!("quota of {}", u.quota.get(m)),
                        *cards,
                    )
                })
            })
            .or_else(|| {
                u.quota.caps().iter().find_map(|(p, n)| {
                    let (_, cards) = charges.iter().find(|(m, _)| p.matches(m))?;
                    let under: Cards = u
                        .allocated
                        .iter()
                        .filter(|(a, _)| p.matches(a))
                        .map(|(_, c)| *c)
                        .sum();
                    (under > *n)
                        .then(|| (format!("{under} {p}"), format!("group cap of {n}"), *cards))
                })
            });
        if let Some((have, limit, cards)) = over {
            return Some(
                Decision::deny(
                    INSUFFICIENT,
                    format!(
                        "queue {level} has {have} cards bound{whose}, past its {limit} (lowered since pod {} was admitted for {cards} of them); its binding waits for room: try again later",
                        pod.key
                    ),
                )
                .with_event(Some(regarding(&pod.key))),
            );
        }
    }
    None
}

/// A binding of a pod whose admitted binding the cache does not show yet. Its answer
/// may never have reached the scheduler (the API server's call to the webhook timed
/// out, or the ledger write landed after card-quota answered "try again"), so the
/// scheduler posts it again: onto the same node it is that binding, already charged
/// (recording it again only restarts its grace: the ledger keeps the first record),
/// and the API server binds the pod once. Onto another node it would move a charge
/// the first binding may still use: it waits until the cache shows whether that one
/// landed (or, unlanded, until its entry is dropped).
fn retried(obj: &Value, pod: &PodRecord, queue: QueueName, bound: &str, node: &str) -> Decision {
    if bound == node {
        let mut d = Decision::allow();
        if let Some(model) = &pod.charged {
            d.patch.push(set_annotation(obj, CHARGED, model.as_str()));
        }
        return d.charging(queue, Effect::Pod(Box::new(pod.clone())));
    }
    Decision::deny(
        RETRY,
        format!(
            "pod {} has a binding to node {bound} that card-quota admitted and does not see yet; a pod is bound once, so its binding to node {node} waits until card-quota sees whether that one landed: try again",
            pod.key
        ),
    )
}

/// The pod a binding's Event is about.
pub(super) fn regarding(key: &ObjectKey) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some(key.namespace.clone()),
        name: key.name.clone(),
        uid: None,
    }
}
