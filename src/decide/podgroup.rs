//! PodGroup CREATE / UPDATE with `volcano.sh/card.request` (job level; becomes reserved).

use crate::cards::CardRequest;
use crate::cluster::records::podgroup_record;
use crate::cluster::{PodGroupRecord, Snapshot};
use crate::ledger::{Effect, Verdict};

use super::fit::{fit, models_of, Change};
use super::messages::{gate, insufficient, INSUFFICIENT, INVALID};
use super::pod::owner_ref;
use super::review::AdmissionRequest;
use super::{object_of, Decision, ObjectRef};

pub fn decide(req: &AdmissionRequest, snap: &Snapshot, now: jiff::Timestamp) -> Decision {
    if req.operation != "CREATE" && req.operation != "UPDATE" {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let mut rec = match podgroup_record(obj, req.ns(), u64::MAX) {
        Ok(r) => r,
        Err(e) => return Decision::deny("BadRequest", e.to_string()),
    };
    let old = req
        .old_object
        .as_ref()
        .filter(|o| !o.is_null())
        .and_then(|o| podgroup_record(o, req.ns(), 0).ok());
    if let Some(old) = &old {
        // Status and phase updates (Volcano's own) charge nothing.
        if old.request == rec.request && old.queue == rec.queue {
            return Decision::allow();
        }
    }
    // Events go on the PodGroup when it exists, else on the Job that creates it.
    let regarding = if req.operation == "UPDATE" {
        Some(ObjectRef {
            api_version: "scheduling.volcano.sh/v1beta1".into(),
            kind: "PodGroup".into(),
            namespace: Some(rec.key.namespace.clone()),
            name: rec.key.name.clone(),
            uid: obj
                .pointer("/metadata/uid")
                .and_then(|u| u.as_str())
                .map(str::to_string),
        })
    } else {
        owner_ref(obj, &rec.key.namespace)
    };
    let request: CardRequest = match &rec.request {
        None => return Decision::allow(),
        Some(Err(e)) => return Decision::deny(INVALID, e.to_string()).with_event(regarding),
        Some(Ok(r)) => r.clone(),
    };
    if rec.live_request().is_none() {
        return Decision::allow();
    }
    if let Err(d) = gate(snap, &rec.queue) {
        return d.with_event(regarding);
    }
    if let Some(stored) = snap.group(&rec.key) {
        rec.seq = stored.seq;
    }
    let touched = models_of(request.0.iter().map(|(k, _)| k));
    let change_with = |r: PodGroupRecord| Change {
        add_groups: vec![r],
        ..Default::default()
    };
    let f = fit(snap, &rec.queue, &change_with(rec.clone()), &touched, now);
    if f.verdict == Verdict::Feasible {
        let queue = rec.queue.clone();
        return Decision::allow().charging(queue, Effect::Group(Box::new(rec)));
    }
    // Name the first entry that no longer fits when the entries are added in order.
    let mut failing = request.0.len() - 1;
    for i in 0..request.0.len() - 1 {
        let mut partial = rec.clone();
        partial.request = Some(Ok(CardRequest(request.0[..=i].to_vec())));
        if fit(snap, &rec.queue, &change_with(partial), &touched, now).verdict != Verdict::Feasible
        {
            failing = i;
            break;
        }
    }
    let (key, n) = &request.0[failing];
    let mut d = Decision::deny(INSUFFICIENT, insufficient(&rec.queue, key, *n, &f.before()));
    d.undecided = f.verdict == Verdict::Undecided;
    d.with_event(regarding)
}
