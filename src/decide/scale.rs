//! Scale-ups: the `scale` subresource (HPA, kubectl scale) and `spec.replicas` updates
//! of Deployments, ReplicaSets and StatefulSets. Clamp (default) or deny; scale-downs pass.

use super::fit::with_missing_parent;
use super::tree::check_levels;
use std::borrow::Cow;

use serde_json::Value;

use crate::cards::ObjectKey;
use crate::cluster::records::workload_record;
use crate::cluster::{PodRecord, WorkloadKind};
use crate::ledger::{Adjusted, Demand, Verdict};
use crate::snapshot::Snapshot;

use super::fit::{models_of, usage_of};
use super::messages::{gate, insufficient, BAD_REQUEST, INSUFFICIENT, RETRY};
use super::patch::set_replicas;
use super::pod::card_demand;
use super::review::{AdmissionRequest, Object, Operation};
use super::{object_of, Config, Decision, EventIntent, ObjectRef, ScalePolicy};

fn replicas(v: Option<&Value>) -> Option<i32> {
    v?.pointer("/spec/replicas")?
        .as_i64()
        .and_then(|r| i32::try_from(r).ok())
}

fn workload_ref(kind: WorkloadKind, key: &ObjectKey, obj: Option<&Value>) -> ObjectRef {
    ObjectRef {
        api_version: "apps/v1".into(),
        kind: kind.kind().into(),
        namespace: Some(key.namespace.clone()),
        name: key.name.clone(),
        // A Scale carries its workload's uid.
        uid: obj
            .and_then(|o| o.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// UPDATE of `<kind>/scale` (an `autoscaling/v1` Scale; the template comes from the cache).
pub fn decide_scale(
    req: &AdmissionRequest,
    kind: WorkloadKind,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    if req.operation != Operation::Update {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let name = req.object_name(obj);
    let key = ObjectKey::new(req.ns(), name);
    let Some(r1) = replicas(Some(obj)) else {
        return Decision::allow();
    };
    let cached = snap.workload(kind, &key);
    let Some(r0) =
        replicas(req.old_object.as_ref().map(Object::tree)).or(cached.map(|w| w.replicas))
    else {
        return Decision::deny(
            RETRY,
            format!(
                "{} {key} is not in card-quota's cache yet; try again",
                kind.lower()
            ),
        );
    };
    if r1 <= r0 {
        return Decision::allow();
    }
    let Some(w) = cached else {
        return Decision::deny(
            RETRY,
            format!(
                "{} {key} is not in card-quota's cache yet; try again",
                kind.lower()
            ),
        );
    };
    if w.owned_by_deployment {
        return Decision::allow();
    }
    let regarding = workload_ref(kind, &key, Some(obj));
    // The template was read when the workload was cached; a node may have announced its
    // cards' vendor since.
    let mut template = w.template.clone();
    template.reclassify(|r| snap.is_card_resource(r));
    resize(kind, regarding, &template, r0, r1, snap, cfg, now)
}

/// UPDATE of a Deployment / ReplicaSet / StatefulSet that raises `spec.replicas`.
pub fn decide_workload(
    req: &AdmissionRequest,
    kind: WorkloadKind,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    if req.operation != Operation::Update {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let cards = snap.card_resources();
    let new = match workload_record(kind, obj, req.ns(), cards, 0) {
        Ok(w) => w,
        Err(e) => return Decision::deny(BAD_REQUEST, e.to_string()),
    };
    if new.owned_by_deployment {
        // The Deployment was gated; its controller's resizes must not stall rollouts.
        return Decision::allow();
    }
    let r0 = match req
        .old_object
        .as_ref()
        .map(Object::tree)
        .filter(|o| !o.is_null())
    {
        Some(old) => match workload_record(kind, old, req.ns(), cards, 0) {
            Ok(w) => w.replicas,
            Err(e) => return Decision::deny(BAD_REQUEST, e.to_string()),
        },
        None => match snap.workload(kind, &new.key) {
            Some(w) => w.replicas,
            None => return Decision::allow(),
        },
    };
    let regarding = workload_ref(kind, &new.key, Some(obj));
    resize(
        kind,
        regarding,
        &new.template,
        r0,
        new.replicas,
        snap,
        cfg,
        now,
    )
}

#[allow(clippy::too_many_arguments)]
fn resize(
    kind: WorkloadKind,
    regarding: ObjectRef,
    template: &PodRecord,
    r0: i32,
    r1: i32,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    if r1 <= r0 || !template.is_card_pod() {
        return Decision::allow();
    }
    let event = |d: Decision| d.with_event(Some(regarding.clone()));
    let queue = snap
        .resolve_queue(template)
        .unwrap_or_else(|_| crate::cards::QueueName::default_queue());
    let demand = match card_demand(template, snap, Some(&queue)) {
        Ok(Some(d)) => d,
        Ok(None) => return Decision::allow(),
        Err(d) => return event(d),
    };
    if let Err(d) = gate(snap, &queue) {
        return event(d);
    }
    // r1 > r0 here, so the difference is positive and at most 2^32.
    let added = u64::try_from(i64::from(r1) - i64::from(r0)).unwrap_or(0);
    let touched = models_of([&demand.alternatives]);
    // The queue's usage is computed once; only the count of added replicas varies.
    let before = usage_of(snap, &queue, now);
    let tree = |k: u64| {
        let mut u = Adjusted::new(Cow::Borrowed(&before), Cow::Borrowed(&before.quota));
        u.add_planned(&Demand::pods(demand.alternatives.clone(), demand.cards, k));
        match u.feasible(&touched) {
            Verdict::Feasible if !snap.is_flat() => {
                match check_levels(snap, &queue, &before, &u.usage(), &touched, now).refusal {
                    Some(r) => (Verdict::Infeasible, Some(r)),
                    None => (Verdict::Feasible, None),
                }
            }
            v => (v, None),
        }
    };
    let fits = |k: u64| tree(k).0;
    // No more replicas fit than the room of the models they may use holds: beyond
    // that the answer is known without a search.
    let room: u128 = demand
        .alternatives
        .models()
        .iter()
        .map(|m| u128::try_from(before.room(m).max(0)).unwrap_or(0))
        .fold(0, u128::saturating_add);
    let most = u64::try_from(room / demand.cards.get().max(1)).unwrap_or(u64::MAX);
    let (full, level) = if added > most {
        (Verdict::Infeasible, None)
    } else {
        tree(added)
    };
    if full == Verdict::Feasible {
        return Decision::allow();
    }
    let requested = demand.cards.times(added);
    let message = match level {
        Some(r) => r.message(&queue, &demand.alternatives, requested),
        None => with_missing_parent(
            snap,
            &queue,
            insufficient(&queue, &demand.alternatives, requested, &before),
        ),
    };
    if cfg.scale_policy == ScalePolicy::Deny {
        let mut d = Decision::deny(INSUFFICIENT, message);
        d.undecided = full == Verdict::Undecided;
        return event(d);
    }
    // Largest k that fits: fitting is monotone in k, so bisect.
    let (mut lo, mut hi) = (0u64, added.min(most.saturating_add(1)));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) == Verdict::Feasible {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let to = r0.saturating_add(i32::try_from(lo).unwrap_or(i32::MAX));
    let text = format!(
        "{} {}/{} scale-up from {r0} to {r1} replicas clamped to {to}: {message}; a HorizontalPodAutoscaler that asked for {r1} keeps showing {r1} desired while spec.replicas is {to}",
        kind.lower(),
        regarding.namespace.as_deref().unwrap_or_default(),
        regarding.name
    );
    let mut d = Decision::allow().with_warning(text.clone());
    d.patch.push(set_replicas(to));
    d.reason = Some(INSUFFICIENT);
    d.event = Some(Box::new(EventIntent {
        regarding,
        reason: INSUFFICIENT.as_str(),
        message: text,
        warning: true,
        also: None,
    }));
    d
}
