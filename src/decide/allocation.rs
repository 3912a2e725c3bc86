//! `resourceclaims/status` UPDATE: the allocation a scheduler writes on a claim before
//! it binds the claim's pod, checked as that binding will be (docs/dra.md). The devices'
//! models must be ones the pod was admitted for and fit its queue; refused, the
//! scheduler gives the devices back and tries again, before any binding.
//!
//! R1 (docs/consistency.md): the allocation is where a DRA card's model is chosen,
//! whoever binds the pod after it (a scheduler whose bindings no hook checks too), so an
//! admitted allocation is charged here, as the pod bound on the allocation's node: the
//! charge is recorded before the answer, and the pod's binding onto that node is the
//! same charge again (`binding::retried`). It stops counting as a binding's does (R3):
//! once a cache shows the pod bound or gone, or behind a fence past `UNBOUND_GRACE`
//! when the bind never came.

use serde_json::Value;

use crate::cards::dra::{reserved_for, ClaimRecord, Reservation};
use crate::cards::ObjectKey;
use crate::ledger::Effect;
use crate::snapshot::{Snapshot, UnknownGroup};

use super::binding::regarding;
use super::enforcement::{observed_only, would_refuse_event, would_refuse_message};
use super::messages::{
    gate, unknown_group, unreadable_claims, INVALID_DEMAND, NOT_ACCEPTED, RETRY,
};
use super::pod::allocate;
use super::review::{AdmissionRequest, Operation};
use super::{object_of, Config, Decision, EventIntent};

pub fn decide(
    req: &AdmissionRequest,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    if req.operation != Operation::Update {
        return Decision::allow();
    }
    let claim = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let allocation = claim.pointer("/status/allocation").filter(|a| !a.is_null());
    let before = req
        .old_object
        .as_ref()
        .and_then(|o| o.tree().pointer("/status/allocation"))
        .filter(|a| !a.is_null());
    // A deallocation gives back.
    if allocation.is_none() {
        return Decision::allow();
    }
    let record = match ClaimRecord::parse(claim) {
        Ok(r) => r,
        Err(e) => return Decision::deny(INVALID_DEMAND, e.to_string()),
    };
    // A write that leaves the allocation as it was (a reservation added or dropped, a
    // device's status) changes no card; a pod it newly reserves must accept the models.
    // A new allocation's payer is checked below, as its binding.
    let payer = (allocation != before)
        .then(|| record.reserved_for.first())
        .flatten();
    let warned = match newly_reserved(req, &record, payer, snap, cfg) {
        Ok(w) => w,
        Err(d) => return d,
    };
    let mut d = match allocation {
        Some(a) if allocation != before => charged(record, a, snap, cfg, now),
        _ => Decision::allow(),
    };
    for (warning, event) in warned {
        d.warnings.push(warning);
        // The scheduler that writes the claim reads no warning: the pod's Event is where
        // an admin sees what deny would have refused (the first, if several).
        if d.allowed && d.event.is_none() {
            d.event = Some(event);
            d.would_refuse = Some(NOT_ACCEPTED);
        }
    }
    d
}

/// A new or changed allocation, checked and charged as its payer's binding onto the
/// allocation's node.
fn charged(
    record: ClaimRecord,
    allocation: &Value,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    // The pod that pays for it: the first it is reserved for. Reserved for none yet,
    // it charges no one; each pod's binding checks it.
    let Some(payer) = record.reserved_for.first() else {
        return Decision::allow();
    };
    let key = ObjectKey::new(record.key.namespace.clone(), payer.name.clone());
    // By uid: a cache that shows another pod under the payer's name (deleted and made
    // again, the cache behind) does not show the payer (found by the committer model:
    // the old pod, of no claim, let the allocation through uncharged).
    let cached = snap.pod(&key);
    let Some(pod) = cached.filter(|p| payer.is(p.version.uid.as_deref())) else {
        if cached.is_none() && snap.is_known_cardless_incarnation(&key, payer.uid.as_deref()) {
            return Decision::allow();
        }
        return Decision::deny(
            RETRY,
            format!("pod {key}, for which ResourceClaim {} is allocated, is not in card-quota's cache yet; try again", record.key),
        );
    };
    // Node-local devices: the allocation names its node. Devices reachable from several
    // nodes leave the node to the binding, which checks again.
    let Some(node) = allocated_node(allocation) else {
        return Decision::allow();
    };
    if let Some(bound) = &pod.node {
        // Bound in the cache: the claim's cards count by the pod already.
        if !pod.bind_unseen {
            return Decision::allow();
        }
        // An admitted allocation or binding of the pod the cache does not show yet.
        let queue = match snap.resolve_queue(pod) {
            Ok(q) => q,
            Err(UnknownGroup(g)) => return unknown_group(&key, g),
        };
        if bound == node {
            // The same allocation written again (a scheduler's retry): that charge,
            // within the quota as it is now.
            if let Some(d) = super::binding::past_a_cut(snap, &queue, pod, now) {
                return d;
            }
            return Decision::allow().charging(queue, Effect::Pod(Box::new(pod.clone())));
        }
        return Decision::deny(
            RETRY,
            format!(
                "pod {key} has an allocation or binding on node {bound} that card-quota admitted and does not see yet; its allocation on node {node} waits until card-quota sees whether that one landed: try again"
            ),
        )
        .with_event(Some(regarding(&key)));
    }
    // Devices the cache cannot read (a slice not seen yet: "try again").
    if let Some(Err(e)) = snap.dra_objects().allocation_models(&record) {
        return unreadable_claims(&e);
    }
    // The claim kube-scheduler made for the pod's DRA-backed extended resources: its
    // devices are the pod's own card resource, served on the allocation's node; checked
    // as the pod's binding there will be.
    let extended = record.for_extended_resources;
    let mut rec = if extended {
        pod.clone()
    } else {
        // The pod as it reads with this allocation; without card claims it is not charged.
        let Some(rec) = snap.with_claim_as(pod, record) else {
            return Decision::allow();
        };
        if rec.claimed.is_none() {
            return Decision::allow();
        }
        rec
    };
    // Warn's second decision: nothing pinned the pod, so the devices' models stand.
    if cfg.any_model {
        rec.card_name = None;
    }
    let queue = match snap.resolve_queue(&rec) {
        Ok(q) => q,
        Err(UnknownGroup(g)) => return unknown_group(&key, g),
    };
    let regarding = regarding(&key);
    if let Err(d) = gate(snap, &queue) {
        return d.with_event(Some(regarding));
    }
    match allocate(snap, &queue, &rec, node, now) {
        Ok(charges) => {
            // Charged as the pod bound there, read with this allocation, as its binding
            // would charge it.
            let resources = rec.demand.as_ref().map_or(0, |d| d.len());
            let mut bound = rec;
            bound.node = Some(node.to_string());
            if let ([(model, _)], 1) = (charges.as_slice(), resources) {
                bound.charged = Some(model.clone());
            }
            Decision::allow().charging(queue, Effect::Pod(Box::new(bound)))
        }
        Err(d) => d.with_event(Some(regarding)),
    }
}

/// The pods a write newly reserves an allocated claim for run on its devices, whose
/// models the allocation chose (for another pod, when the claim is shared): each must
/// accept them. A pod of a shared claim was charged at its CREATE on the model it was
/// pinned to, and its binding, the cache behind, is taken as that charge; on another
/// model its cards would be bound where nothing counted them (found by the committer
/// model: a sharer pinned to the H200 bound on a claim's RTX 4090, past its queue's
/// quota there). Refused (or "try again" while the cache does not show the pod), the
/// scheduler gives the reservation back before any binding. `Ok`: every one accepts, or
/// is let through by a queue in warn (a warning and the pod's Event for each).
fn newly_reserved(
    req: &AdmissionRequest,
    record: &ClaimRecord,
    payer: Option<&Reservation>,
    snap: &Snapshot,
    cfg: &Config,
) -> Result<Vec<(String, Box<EventIntent>)>, Decision> {
    let old = req
        .old_object
        .as_ref()
        .map(|o| reserved_for(o.tree()))
        .unwrap_or_default();
    let mut added = record
        .reserved_for
        .iter()
        .filter(|r| !old.contains(r) && Some(*r) != payer)
        .peekable();
    let mut warnings = Vec::new();
    if added.peek().is_none() || cfg.any_model {
        return Ok(warnings);
    }
    let models = match snap.dra_objects().allocation_models(record) {
        None => return Ok(warnings),
        Some(Ok(m)) => m,
        Some(Err(e)) => return Err(unreadable_claims(&e)),
    };
    for r in added {
        let key = ObjectKey::new(record.key.namespace.clone(), r.name.clone());
        let cached = snap.pod(&key);
        let Some(pod) = cached.filter(|p| r.is(p.version.uid.as_deref())) else {
            if cached.is_none() && snap.is_known_cardless_incarnation(&key, r.uid.as_deref()) {
                continue;
            }
            return Err(Decision::deny(
                RETRY,
                format!("pod {key}, for which ResourceClaim {} is reserved, is not in card-quota's cache yet; try again", record.key),
            ));
        };
        let Some(accepts) = pod.alternatives() else {
            continue;
        };
        let Some(model) = models.iter().find(|m| !accepts.contains(m)) else {
            continue;
        };
        let said = format!(
            "pod {key} accepts {accepts} but ResourceClaim {} is allocated on {model}: the pod would run on a card model it does not accept",
            record.key
        );
        // Under warn nothing pinned the pod: the scheduler's choice stands.
        match snap.resolve_queue(pod) {
            Ok(q) if observed_only(snap, cfg, &key.namespace, &q) => warnings.push((
                format!("card-quota admitted this because queue {q} and every queue above it are in warn, which pins nothing; under deny: {said}"),
                would_refuse_event(regarding(&key), would_refuse_message(&said)),
            )),
            _ => return Err(Decision::deny(NOT_ACCEPTED, said).with_event(Some(regarding(&key)))),
        }
    }
    Ok(warnings)
}

/// The one node an allocation's `nodeSelector` names by `metadata.name`, as a scheduler
/// writes it for node-local devices.
fn allocated_node(allocation: &Value) -> Option<&str> {
    let terms = allocation
        .pointer("/nodeSelector/nodeSelectorTerms")?
        .as_array()?;
    let [term] = terms.as_slice() else {
        return None;
    };
    let fields = term.get("matchFields")?.as_array()?;
    let [field] = fields.as_slice() else {
        return None;
    };
    let values = field.get("values")?.as_array()?;
    match (
        field.get("key")?.as_str()?,
        field.get("operator")?.as_str()?,
        values.as_slice(),
    ) {
        ("metadata.name", "In", [v]) => v.as_str(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_node_is_read_from_a_single_name_selector_only() {
        let on = |terms: Value| json!({"nodeSelector": {"nodeSelectorTerms": terms}});
        let by_name = json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]);
        assert_eq!(allocated_node(&on(by_name)), Some("n1"));
        let two = json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}]);
        assert_eq!(allocated_node(&on(two)), None);
        let label =
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]);
        assert_eq!(allocated_node(&on(label)), None);
        assert_eq!(allocated_node(&json!({})), None);
    }
}
