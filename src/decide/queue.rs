//! Queue CREATE / UPDATE: the quota annotation must parse; warn when a quota is below
//! current usage or names a model no node offers.

use serde_json::Value;

use crate::cards::annotations::QUOTA;
use crate::cluster::records::queue_record;
use crate::cluster::QueueRecord;
use crate::snapshot::Snapshot;

use super::fit::usage_of;
use super::messages::{cap, BAD_REQUEST, INVALID};
use super::queue_tree;
use super::review::{AdmissionRequest, Object, Operation};
use super::{object_of, Config, Decision, EventIntent, ObjectRef};

fn raw_quota(v: Option<&Value>) -> Option<&str> {
    v?.pointer("/metadata/annotations")?.get(QUOTA)?.as_str()
}

pub fn decide(
    req: &AdmissionRequest,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    if !req.operation.writes() {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let rec = match queue_record(obj) {
        Ok(r) => r,
        Err(e) => return Decision::deny(BAD_REQUEST, e.to_string()),
    };
    if let Err(e) = &rec.order {
        return Decision::deny(INVALID, e.clone());
    }
    if let Err(e) = &rec.enforcement {
        return Decision::deny(INVALID, e.clone());
    }
    if let Err(e) = &rec.full {
        return Decision::deny(INVALID, e.clone());
    }
    let old = match req.operation {
        Operation::Update => req
            .old_object
            .as_ref()
            .map(Object::tree)
            .and_then(|o| queue_record(o).ok()),
        _ => None,
    };
    if let Some(Err(e)) = &rec.borrow {
        if old.as_ref().map(|o| &o.borrow) != Some(&rec.borrow) {
            return Decision::deny(INVALID, e.to_string());
        }
    }
    let tree_warnings = match queue_tree::check(snap, &rec, old.as_ref(), cfg.max_queue_depth, now)
    {
        Ok(w) => w,
        Err(d) => return d,
    };
    let d = quota_checks(req, obj, &rec, snap, now);
    with_tree_warnings(d, &rec, obj, tree_warnings)
}

/// Tree warnings ride on the answer (kubectl prints them) and in an Event on the Queue.
fn with_tree_warnings(
    mut d: Decision,
    rec: &QueueRecord,
    obj: &Value,
    warnings: Vec<String>,
) -> Decision {
    if !d.allowed || warnings.is_empty() {
        return d;
    }
    let message = cap(warnings.join("; "));
    d.warnings.extend(warnings.into_iter().map(cap));
    d.event = Some(Box::new(EventIntent {
        regarding: ObjectRef {
            api_version: "scheduling.volcano.sh/v1beta1".into(),
            kind: "Queue".into(),
            namespace: None,
            name: rec.name.to_string(),
            uid: obj
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .filter(|u| !u.is_empty())
                .map(str::to_string),
        },
        reason: TREE_WARNING,
        message,
        warning: true,
        also: None,
    }));
    d
}

/// The Event reason of a Queue admitted with warnings about its place in the tree.
pub const TREE_WARNING: &str = "CardQuotaTreeWarning";

fn quota_checks(
    req: &AdmissionRequest,
    obj: &Value,
    rec: &QueueRecord,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    let quota = match &rec.quota {
        None => return Decision::allow(),
        Some(Ok(q)) => q,
        Some(Err(e)) => {
            // A stored broken quota must not block Volcano's own status updates.
            if req.operation == Operation::Update
                && raw_quota(req.old_object.as_ref().map(Object::tree)) == raw_quota(Some(obj))
            {
                return Decision::allow().with_warning(format!(
                    "{e}; the queue has quota 0 for every model until fixed"
                ));
            }
            return Decision::deny(INVALID, e.to_string());
        }
    };
    let mut d = Decision::allow();
    let usage = usage_of(snap, &rec.name, now);
    for (m, c) in quota.entries() {
        let key = crate::cards::Alternatives::single(m.clone());
        let a = usage.allocated.get(m).copied().unwrap_or_default();
        let p = usage.pending.get(&key).copied().unwrap_or_default();
        let r = usage.reserved.get(&key).copied().unwrap_or_default();
        if *c < a + p + r {
            d.warnings.push(format!(
                "queue {}: quota for {m} ({c}) is below current usage {} (allocated {a}, pending {p}, reserved {r})",
                rec.name,
                a + p + r
            ));
        }
        if snap.resources_of(m).is_none() && !snap.dra_offers(m) {
            d.warnings
                .push(format!("queue {}: no node offers card model {m}", rec.name));
        }
    }
    for (p, c) in quota.caps() {
        let row = usage.cap_row(p, *c);
        if *c < row.in_use() {
            d.warnings.push(format!(
                "queue {}: group cap {p} ({c}) is below current usage {} (allocated {}, pending {}, reserved {})",
                rec.name,
                row.in_use(),
                row.allocated,
                row.pending,
                row.reserved
            ));
        }
        if !snap.known_models().any(|m| p.matches(m)) && !snap.dra_models().any(|m| p.matches(m)) {
            d.warnings.push(format!(
                "queue {}: group cap {p} matches no card model any node offers",
                rec.name
            ));
        }
    }
    d
}
