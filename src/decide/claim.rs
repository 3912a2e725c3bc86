//! ResourceClaim CREATE: the claim the resourceclaim controller makes for a pod from a
//! template is pinned to the card models the pod was admitted for (a CEL selector on
//! each card request), so that any scheduler allocates there. The binding stays the
//! hard line: it charges the models of the devices actually allocated.

use json_patch::{AddOperation, PatchOperation};
use serde_json::{json, Value};

use crate::cards::annotations::PINNED;
use crate::cards::dra::claims::admin_access;
use crate::cards::dra::pin::pin_expression;
use crate::cards::ObjectKey;
use crate::snapshot::Snapshot;

use super::messages::RETRY;
use super::patch::{pointer, set_annotation};
use super::review::{AdmissionRequest, Operation};
use super::{object_of, Decision};

/// The annotation the resourceclaim controller puts on a claim it makes for a pod: the
/// pod's name for the claim.
pub const POD_CLAIM_NAME: &str = "resource.kubernetes.io/pod-claim-name";

pub fn decide(req: &AdmissionRequest, snap: &Snapshot, cfg: &super::Config) -> Decision {
    // `--no-pin`: a card-aware scheduler chooses.
    if req.operation != Operation::Create || !cfg.pin {
        return Decision::allow();
    }
    let claim = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let Some(pod) = owning_pod(req, claim) else {
        // Made apart from any pod (shared): its pods are checked at CREATE and binding.
        return Decision::allow();
    };
    let Some(rec) = snap.pod(&pod) else {
        if snap.is_known_cardless_pod(&pod) {
            return Decision::allow();
        }
        return Decision::deny(
            RETRY,
            format!("pod {pod}, for which this ResourceClaim is made, is not in card-quota's cache yet; try again"),
        );
    };
    // The models it was admitted for (written as its card.name), else its claims'.
    let Some(models) = rec.alternatives().or_else(|| rec.claimed_models()) else {
        return Decision::allow();
    };
    let dra = snap.dra_objects();
    let Some(expression) = pin_expression(models, dra.devices_of(models), dra.settings()) else {
        return Decision::allow();
    };
    let mut patch = Vec::new();
    let requests = claim
        .pointer("/spec/devices/requests")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, r) in requests.iter().enumerate() {
        let i = i.to_string();
        // A request with admin access takes no card: not pinned.
        if let Some(e) = r
            .get("exactly")
            .filter(|e| is_card(e, snap) && !admin_access(e))
        {
            patch.push(add_selector(
                &["spec", "devices", "requests", &i, "exactly"],
                e,
                &expression,
            ));
        }
        for (j, s) in r
            .get("firstAvailable")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if is_card(s, snap) {
                let j = j.to_string();
                patch.push(add_selector(
                    &["spec", "devices", "requests", &i, "firstAvailable", &j],
                    s,
                    &expression,
                ));
            }
        }
    }
    if patch.is_empty() {
        return Decision::allow();
    }
    patch.push(set_annotation(
        claim,
        PINNED,
        &format!("{models}: the models pod {pod} was admitted for"),
    ));
    let mut d = Decision::allow();
    d.patch = patch;
    d
}

/// The pod a claim is made for: its controlling owner, when the resourceclaim
/// controller made it from a template.
fn owning_pod(req: &AdmissionRequest, claim: &Value) -> Option<ObjectKey> {
    claim
        .pointer("/metadata/annotations")?
        .get(POD_CLAIM_NAME)?;
    let owner = claim
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true && o["kind"] == "Pod" && o["apiVersion"] == "v1")?;
    let namespace = claim
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(req.ns());
    Some(ObjectKey::new(namespace, owner["name"].as_str()?))
}

fn is_card(request: &Value, snap: &Snapshot) -> bool {
    request
        .get("deviceClassName")
        .and_then(Value::as_str)
        .is_some_and(|c| snap.dra_objects().is_card_class(c))
}

/// Adds a CEL selector to a request (or subrequest) at `at`.
fn add_selector(at: &[&str], request: &Value, expression: &str) -> PatchOperation {
    let selector = json!({"cel": {"expression": expression}});
    match request.get("selectors") {
        Some(Value::Array(_)) => {
            let mut path = at.to_vec();
            path.extend(["selectors", "-"]);
            PatchOperation::Add(AddOperation {
                path: pointer(&path),
                value: selector,
            })
        }
        _ => {
            let mut path = at.to_vec();
            path.push("selectors");
            PatchOperation::Add(AddOperation {
                path: pointer(&path),
                value: json!([selector]),
            })
        }
    }
}
