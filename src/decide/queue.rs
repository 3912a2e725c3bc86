//! Queue CREATE / UPDATE: the quota annotation must parse; warn when a quota is below
//! current usage or names a model no node offers.

use serde_json::Value;

use crate::cards::annotations::QUOTA;
use crate::cluster::records::queue_record;
use crate::snapshot::Snapshot;

use super::fit::usage_of;
use super::messages::{BAD_REQUEST, INVALID};
use super::review::{AdmissionRequest, Object, Operation};
use super::{object_of, Decision};

fn raw_quota(v: Option<&Value>) -> Option<&str> {
    v?.pointer("/metadata/annotations")?.get(QUOTA)?.as_str()
}

pub fn decide(req: &AdmissionRequest, snap: &Snapshot, now: jiff::Timestamp) -> Decision {
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
        if snap.resources_of(m).is_none() {
            d.warnings
                .push(format!("queue {}: no node offers card model {m}", rec.name));
        }
    }
    d
}
