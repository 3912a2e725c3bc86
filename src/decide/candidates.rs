//! The models a card pod that names none may use (docs/decisions.md, "Pods that name no
//! model"): those of the card resource it requests that its queue's quota names, in the
//! order the quota's annotation writes them, narrowed by the pod's own constraints.

use crate::cards::annotations::QUOTA;
use crate::cards::dra::is_claim_resource;
use crate::cards::nodes::resource_fits_model_shape;
use crate::cards::{CardName, QueueName};
use crate::cluster::PodRecord;
use crate::snapshot::Snapshot;

use super::messages::short_list;

/// True when a pod requesting `resource` may run on `model`: some node offers the model
/// for that resource, or (no node offers the model yet: nodes that scale from zero) the
/// model's shape matches the resource's (whole card, MIG profile, MPS share).
pub fn resource_serves(snap: &Snapshot, resource: &str, model: &CardName) -> bool {
    // A claim's models are its selectors' to say (`PodRecord::claimed_models`).
    if is_claim_resource(resource) {
        return true;
    }
    match snap.resources_of(model) {
        Some(r) => r.contains_key(resource),
        None => resource_fits_model_shape(resource, model),
    }
}

/// Models of `resource` that `queue` may use, in the order its `card.quota` writes them
/// (then the models only its `card.borrow` names, then those only a group cap matches),
/// keeping those every card level above it names too: a level that does not name a
/// model has quota 0 for it.
pub fn queue_models(snap: &Snapshot, queue: &QueueName, resource: &str) -> Vec<CardName> {
    let Some(q) = snap.queue(queue) else {
        return Vec::new();
    };
    // A queue's own quota, borrowed; a copy only with a borrow to add.
    let empty = crate::cards::Quota::default();
    let own = match &q.quota {
        Some(Ok(quota)) => quota,
        _ => &empty,
    };
    let quota = match &q.borrow {
        Some(Ok(b)) => std::borrow::Cow::Owned(own.plus(b)),
        _ => std::borrow::Cow::Borrowed(own),
    };
    let levels: Vec<crate::cards::Quota> = if snap.is_flat() {
        Vec::new()
    } else {
        snap.ancestry(queue)
            .map(|a| a.levels)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| snap.queue(l).map(|r| r.effective_quota()))
            .collect()
    };
    // The models the quota names by key, then those only its group caps match, cap by
    // cap in written order and by name within a cap: the admin's order first, and a
    // deterministic one (not the order nodes joined) for the rest.
    let mut out: Vec<CardName> = quota.models_in_order().to_vec();
    for (p, _) in quota.caps() {
        for m in snap.known_models().filter(|m| p.matches(m)) {
            if !out.contains(m) {
                out.push(m.clone());
            }
        }
    }
    out.retain(|m| resource_serves(snap, resource, m) && levels.iter().all(|l| l.names(m)));
    out
}

/// The models among `models` that the pod's own required product constraints (on the
/// labels of `resource`'s vendor) allow, in order.
pub fn allowed_by_constraints(
    rec: &PodRecord,
    resource: &str,
    models: &[CardName],
) -> Vec<CardName> {
    let prefix = resource.split('/').next().unwrap_or_default();
    let ours = |label: &str| label.split('/').next() == Some(prefix);
    let ok = rec.constraints_allow(models, ours);
    models
        .iter()
        .zip(ok)
        .filter(|(_, ok)| *ok)
        .map(|(m, _)| m.clone())
        .collect()
}

/// Why a pod that names no model has none to use, and how to give it one: its queue's
/// quota names no model of `resource` (`named` empty), or the pod's own constraints
/// rule out every one it names.
pub fn none_usable(
    snap: &Snapshot,
    subject: &str,
    queue: &QueueName,
    resource: &str,
    named: &[CardName],
    rec: &PodRecord,
) -> String {
    let exist = snap.models_offering(resource);
    let exist_text = if exist.is_empty() {
        format!("no node offers {resource} yet")
    } else {
        format!("{resource} models: {}", short_list(&exist))
    };
    if named.is_empty() {
        let example = exist
            .first()
            .map(|m| format!("'{{\"{m}\":1}}'"))
            .unwrap_or_else(|| "'{\"<model>\":1}'".to_string());
        return format!(
            "{subject} requests {resource} but queue {queue} has no quota for any {resource} model ({exist_text}); give the queue one: {QUOTA}: {example}"
        );
    }
    let prefix = resource.split('/').next().unwrap_or_default();
    let ours = |l: &&String| l.split('/').next() == Some(prefix);
    let mut constraints: Vec<String> = rec
        .pinned
        .iter()
        .filter(|(l, _)| ours(l))
        .map(|(l, vs)| format!("{l} in [{}]", short_list(vs)))
        .collect();
    constraints.extend(
        rec.excluded
            .iter()
            .filter(|(l, _)| ours(l))
            .map(|(l, vs)| format!("{l} not in [{}]", short_list(vs))),
    );
    format!(
        "{subject} requests {resource}; queue {queue} has quota for {} but the pod's node constraints ({}) rule out each of them",
        short_list(named),
        constraints.join("; ")
    )
}
