//! A Volcano Job whose task replicas are raised while its PodGroup holds a derived
//! reservation: the pods the raise adds must fit, or the edit is refused. Admitted, they
//! would be refused one by one at their creation, which Volcano's job controller
//! retries and then counts against the Job (docs/decisions.md, "Jobs wait at the
//! enqueue"). A Job still waiting in line is not checked here: its enqueue is.

use serde_json::Value;

use crate::cards::{Cards, ObjectKey};
use crate::cluster::records::job_record;
use crate::cluster::records::JobRecord;
use crate::ledger::{Demand, Verdict};
use crate::snapshot::Snapshot;

use super::fit::{fit, models_of, Change};
use super::messages::{gate, BAD_REQUEST, INSUFFICIENT};
use super::pod::card_demand;
use super::review::{AdmissionRequest, Object, Operation};
use super::{object_of, Decision, ObjectRef};

/// Decides a Volcano Job write (UPDATE only; a CREATE makes no pods before its
/// PodGroup is enqueued).
pub fn decide(req: &AdmissionRequest, snap: &Snapshot, now: jiff::Timestamp) -> Decision {
    if req.operation != Operation::Update {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let Some(old) = req
        .old_object
        .as_ref()
        .map(Object::tree)
        .filter(|o| !o.is_null())
    else {
        return Decision::allow();
    };
    let read = |v: &Value| job_record(v, req.ns(), snap.card_resources(), 0);
    let (new, old) = match (read(obj), read(old)) {
        (Ok(n), Ok(o)) => (n, o),
        (Err(e), _) | (_, Err(e)) => return Decision::deny(BAD_REQUEST, e.to_string()),
    };
    // Volcano names a Job's PodGroup `<job>-<uid>`.
    let Some(uid) = obj.pointer("/metadata/uid").and_then(Value::as_str) else {
        return Decision::allow();
    };
    let key = ObjectKey::new(new.key.namespace.clone(), format!("{}-{uid}", new.key.name));
    let Some(group) = snap.group(&key) else {
        return Decision::allow();
    };
    // Waiting: its enqueue derives the demand again. A request the user wrote governs
    // the reservation, and its pods are checked one by one as before.
    if group.is_waiting() || !group.derived {
        return Decision::allow();
    }
    let queue = group.queue.clone();
    let held = super::podgroup::held_to_models(group);
    let added = match added_pods(&old, &new, snap, &queue, held.as_ref()) {
        Ok(a) => a,
        Err(d) => return d,
    };
    let Some((task, first)) = added.first().map(|(t, d)| (t.clone(), d.models.clone())) else {
        return Decision::allow();
    };
    let regarding = ObjectRef {
        api_version: "batch.volcano.sh/v1alpha1".into(),
        kind: "Job".into(),
        namespace: Some(new.key.namespace.clone()),
        name: new.key.name.clone(),
        uid: Some(uid.to_string()),
    };
    if let Err(d) = gate(snap, &queue) {
        return d.with_event(Some(regarding));
    }
    let extra: Vec<Demand> = added.into_iter().map(|(_, d)| d).collect();
    let touched = models_of(extra.iter().map(|d| &d.models));
    let requested: Cards = extra
        .iter()
        .filter(|d| d.models == first)
        .map(Demand::total)
        .sum();
    let change = Change {
        extra,
        ..Default::default()
    };
    let f = fit(snap, &queue, &change, &touched, now);
    if f.verdict == Verdict::Feasible {
        return Decision::allow();
    }
    let mut d = Decision::deny(
        INSUFFICIENT,
        format!(
            "job {} cannot add replicas to task {task} while it runs: {}",
            new.key,
            f.message(&first, requested)
        ),
    );
    d.undecided = f.verdict == Verdict::Undecided;
    d.with_event(Some(regarding))
}

/// The pods each raised task adds (task name, its added pods), in task order.
fn added_pods(
    old: &JobRecord,
    new: &JobRecord,
    snap: &Snapshot,
    queue: &crate::cards::QueueName,
    held: Option<&std::collections::BTreeSet<crate::cards::CardName>>,
) -> Result<Vec<(String, Demand)>, Decision> {
    let mut out = Vec::new();
    for (task, replicas, template) in &new.tasks {
        let before = old
            .tasks
            .iter()
            .find(|(t, _, _)| t == task)
            .map_or(0, |(_, r, _)| *r);
        if *replicas <= before || !template.is_card_pod() {
            continue;
        }
        let Some(demand) = card_demand(template, snap, Some(queue))? else {
            continue;
        };
        out.push((
            task.clone(),
            // A pod set held to one model adds its pods there (its pods are pinned there).
            Demand::pods(
                super::podgroup::narrowed(&demand.alternatives, held),
                demand.cards,
                u64::from(replicas - before),
            ),
        ));
    }
    Ok(out)
}
