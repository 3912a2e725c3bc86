//! PodGroup CREATE / UPDATE: a Job's card demand (`card.request`, or derived from its Volcano
//! Job) waits in line while Pending and is checked whole, then reserved, at its enqueue.

use std::collections::BTreeSet;

use crate::cards::{Alternatives, CardRequest, Cards};
use crate::cluster::records::podgroup_record;
use crate::cluster::{PodGroupRecord, PodRecord};
use crate::ledger::{bound_charges, Effect, QueueUsage, Share, Verdict};
use crate::snapshot::Snapshot;

use super::fit::{adjusted_after, feasible, fit, models_of, Change};
use super::messages::{gate, insufficient, BAD_REQUEST, INSUFFICIENT, INVALID, RETRY};
use super::patch::set_annotation;
use super::pod::{card_demand, owner_ref};
use super::review::{AdmissionRequest, Object, Operation};
use super::{object_of, Decision, ObjectRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Decides a PodGroup write (docs/decisions.md, "Jobs wait at the enqueue"). A PodGroup
/// waiting in line (no phase, or Pending) reserves nothing: its CREATE is only checked
/// for a request that parses and could ever fit. The write that takes it out of Pending
/// (Volcano's enqueue), a CREATE in any other phase, and a change of the request or
/// queue of an enqueued group must fit whole; the group then reserves its request.
/// Refusing the enqueue holds the Job where Volcano itself waits: vc-scheduler retries
/// every cycle, and nothing counts the refusals against the Job.
pub fn decide(req: &AdmissionRequest, snap: &Snapshot, now: jiff::Timestamp) -> Decision {
    if !req.operation.writes() {
        return Decision::allow();
    }
    let obj = match object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let mut rec = match podgroup_record(obj, req.ns(), u64::MAX) {
        Ok(r) => r,
        Err(e) => return Decision::deny(BAD_REQUEST, e.to_string()),
    };
    let old = req
        .old_object
        .as_ref()
        .map(Object::tree)
        .filter(|o| !o.is_null())
        .and_then(|o| podgroup_record(o, req.ns(), 0).ok());
    // A Volcano Job's PodGroup without card.request: its demand is what the Job's tasks
    // will create, written on the group so that later checks (and matchConditions) see it.
    // Derived at the CREATE, or at the enqueue when the CREATE did not reach card-quota;
    // never on a group already running, whose status writes must keep passing.
    let mut derived_patch = None;
    if rec.request.is_none() && old.as_ref().is_none_or(PodGroupRecord::is_waiting) {
        match derive_request(obj, &rec, snap) {
            Derived::None => {}
            // Taken out of line with its demand unknown it would reserve nothing and
            // its pods would start past the quota: it waits for the Job to be seen, as
            // at any refused enqueue (vc-scheduler retries every cycle). In line it
            // reserves nothing yet.
            Derived::Unseen(job) if !rec.is_waiting() => {
                return Decision::deny(
                    RETRY,
                    format!(
                        "podgroup {} waits: its Job {job} is not in card-quota's cache yet, so its card demand is not known; try again",
                        rec.key
                    ),
                );
            }
            Derived::Unseen(_) => {}
            Derived::Request(r) => {
                derived_patch = Some(set_annotation(
                    obj,
                    crate::cards::annotations::DERIVED_REQUEST,
                    &render_request(&r),
                ));
                rec.request = Some(Ok(r));
                rec.derived = true;
            }
            Derived::Unreadable(why) => {
                return Decision::allow().with_warning(format!(
                    "podgroup {}: no card demand derived from its job, whose pods will be checked one by one: {why}",
                    rec.key
                ));
            }
        }
    }
    if let Some(v) = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(crate::cards::annotations::SPLIT))
    {
        if !matches!(v.as_str(), Some("true" | "false")) && old.is_none() {
            return Decision::deny(
                INVALID,
                format!(
                    "invalid {} on podgroup {} (copied from its Job): expected \"true\" or \"false\", got {v}",
                    crate::cards::annotations::SPLIT,
                    rec.key
                ),
            );
        }
    }
    // One model per pod set: taken out of line, a derived demand's alternatives are
    // resolved to one model each, and the group reserves (and its pods are pinned to)
    // that model.
    let enqueues = !rec.is_waiting() && old.as_ref().is_none_or(PodGroupRecord::is_waiting);
    if enqueues && rec.derived && !rec.split && gate(snap, &rec.queue).is_ok() {
        if let Some(Ok(request)) = &rec.request {
            if has_alternatives(request) {
                let (regarding, owner) = regarding(req, obj, &rec);
                match one_model_each(&rec, request, snap, now) {
                    Ok(r) => {
                        derived_patch = Some(set_annotation(
                            obj,
                            crate::cards::annotations::DERIVED_REQUEST,
                            &render_request(&r),
                        ));
                        rec.request = Some(Ok(r));
                    }
                    Err(d) => return d.with_event(regarding).with_event_also(owner),
                }
            }
        }
    }
    let mut d = decide_record(req, obj, rec, old, snap, now);
    if let (Some(p), true) = (derived_patch, d.allowed) {
        d.patch.push(p);
    }
    d
}

/// One model per pod set, for the pods of `g`: the models its resolved derived request
/// holds them to (`None`: a group whose pods may go anywhere their `card.name` allows).
/// The one rule that the pod CREATE and a running Job's raise both apply.
pub(super) fn held_to_models(g: &PodGroupRecord) -> Option<BTreeSet<crate::cards::CardName>> {
    if !g.derived || g.split {
        return None;
    }
    g.live_request().map(|req| {
        req.0
            .iter()
            .flat_map(|(a, _)| a.models().to_vec())
            .collect()
    })
}

/// `alts` narrowed to the models of `held` (unchanged when none of them is one).
pub(super) fn narrowed(
    alts: &Alternatives,
    held: Option<&BTreeSet<crate::cards::CardName>>,
) -> Alternatives {
    let Some(held) = held else {
        return alts.clone();
    };
    Alternatives::from_models(
        alts.models()
            .iter()
            .filter(|m| held.contains(*m))
            .cloned()
            .collect(),
    )
    .unwrap_or_else(|| alts.clone())
}

/// True when an entry of `r` accepts several models.
fn has_alternatives(r: &CardRequest) -> bool {
    r.0.iter().any(|(a, _)| a.models().len() > 1)
}

/// Each entry of `entries` that accepts several models resolved to the first model on
/// which `fits` holds with the rest; `Err` with the entry no model takes whole.
fn resolve_each(
    entries: &[(Alternatives, Cards)],
    fits: impl Fn(&CardRequest) -> bool,
) -> Result<CardRequest, (Alternatives, Cards)> {
    let mut entries = entries.to_vec();
    for i in 0..entries.len() {
        let (alts, n) = entries[i].clone();
        if alts.models().len() < 2 {
            continue;
        }
        let chosen = alts.models().iter().find_map(|m| {
            let mut trial = entries.clone();
            trial[i] = (Alternatives::single(m.clone()), n);
            fits(&merged(trial.clone())).then_some(trial)
        });
        match chosen {
            Some(t) => entries = t,
            None => return Err((alts, n)),
        }
    }
    Ok(merged(entries))
}

/// Whether one model per pod set could ever hold `request` in its queue, with nothing
/// else in use (its quota and what it may borrow): a set larger than every one of its
/// models' limits runs only split, so nobody waits behind it.
fn one_model_could_ever_fit(rec: &PodGroupRecord, request: &CardRequest, snap: &Snapshot) -> bool {
    let quota = &*snap.cap_of(&rec.queue);
    let touched = models_of(request.0.iter().map(|(k, _)| k));
    resolve_each(&request.0, |r| {
        let mut alone = QueueUsage::new(quota.clone());
        alone.add_reservation(&r.0);
        feasible(&alone, &touched) == Verdict::Feasible
    })
    .is_ok()
}

/// Whether `rec` with `request` reserved fits its queue now.
fn fits_with(
    rec: &PodGroupRecord,
    request: CardRequest,
    touched: &BTreeSet<crate::cards::CardName>,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> bool {
    let mut r = rec.clone();
    r.request = Some(Ok(request));
    r.phase = Some("Inqueue".to_string());
    let change = Change {
        add_groups: vec![r],
        ..Default::default()
    };
    fit(snap, &rec.queue, &change, touched, now).verdict == Verdict::Feasible
}

/// `entries` with equal keys added up, in first-seen order (a request names each key once).
fn merged(entries: Vec<(Alternatives, Cards)>) -> CardRequest {
    let mut out: Vec<(Alternatives, Cards)> = Vec::new();
    for (a, n) in entries {
        match out.iter_mut().find(|(k, _)| *k == a) {
            Some((_, m)) => *m += n,
            None => out.push((a, n)),
        }
    }
    CardRequest(out)
}

/// One model per pod set (docs/decisions.md): each entry of a derived request that
/// accepts several models goes whole on the first of them, in its order, on which it
/// fits with the rest of the request; a Job with a pod set that no single model has
/// room for waits at the enqueue.
fn one_model_each(
    rec: &PodGroupRecord,
    request: &CardRequest,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Result<CardRequest, Decision> {
    let touched = models_of(request.0.iter().map(|(k, _)| k));
    // Not even split does it fit: the enqueue's own check says why, in its own words.
    if !fits_with(rec, request.clone(), &touched, snap, now) {
        return Ok(request.clone());
    }
    resolve_each(&request.0, |r| fits_with(rec, r.clone(), &touched, snap, now)).map_err(
        |(alts, n)| {
            let rooms: Vec<String> = alts
                .models()
                .iter()
                .map(|m| format!("{m} {}", super::room::room(snap, &rec.queue, m, n, now)))
                .collect();
            let never = if one_model_could_ever_fit(rec, request, snap) {
                ""
            } else {
                "; no one of them could ever hold it under the queue's quota"
            };
            Decision::deny(
                INSUFFICIENT,
                format!(
                    "podgroup {} waits: the pods of its Job that accept {alts} ({n} cards) run on one model, and none has room for all {n} in queue {} (room now: {}){never}; {}: \"true\" on the Job lets them split across models",
                    rec.key,
                    rec.queue,
                    rooms.join(", "),
                    crate::cards::annotations::SPLIT
                ),
            )
        },
    )
}

/// [`decide`] once the group's request is known.
fn decide_record(
    req: &AdmissionRequest,
    obj: &serde_json::Value,
    rec: PodGroupRecord,
    old: Option<PodGroupRecord>,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    if let Some(old) = &old {
        // Status and condition updates (Volcano's own) charge nothing; nor does a group
        // going back to Pending or finishing. A group that starts to reserve (leaves
        // Pending, or is taken out of Completed) is a new charge.
        let starts = old.live_request().is_none() && rec.live_request().is_some();
        if old.request == rec.request && old.queue == rec.queue && !starts {
            return Decision::allow();
        }
    }
    let (regarding, owner) = regarding(req, obj, &rec);
    decide_charge(rec, old.as_ref(), regarding, snap, now).with_event_also(owner)
}

/// [`decide_record`] past the writes that charge nothing; a refusal's Event goes on
/// `regarding`.
fn decide_charge(
    mut rec: PodGroupRecord,
    old: Option<&PodGroupRecord>,
    regarding: Option<ObjectRef>,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    let enqueued = !rec.is_waiting();
    if let Some(old) = old.filter(|o| o.queue != rec.queue) {
        if let Some(Err(e)) = &rec.request {
            return Decision::deny(INVALID, e.to_string()).with_event(regarding);
        }
        return moved(old, rec, snap, now).with_event(regarding);
    }
    if old.is_none() && !matches!(rec.request, Some(Err(_))) {
        match adopted(&rec, snap, now) {
            Some(d) if !d.allowed => return d.with_event(regarding),
            // Its pods fit, and so does its reservation.
            Some(d) if enqueued => return d.with_event(regarding),
            _ => {}
        }
    }
    let request: CardRequest = match &rec.request {
        None => return Decision::allow(),
        Some(Err(e)) => return Decision::deny(INVALID, e.to_string()).with_event(regarding),
        Some(Ok(r)) => r.clone(),
    };
    if !enqueued {
        // Waiting in line: reserves nothing, so only a request that can never run is
        // refused (at once, rather than held forever). A derived request is not the
        // user's to fix: its Job waits for a larger quota instead.
        if rec.derived {
            return Decision::allow();
        }
        let d = could_ever_fit(&rec, &request, snap, now);
        let d = if d.allowed {
            could_ever_fit_above(&rec, &request, snap, now)
        } else {
            d
        };
        return d.with_event(regarding);
    }
    if rec.live_request().is_none() {
        // Completed.
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
        if let Some(first) = old
            .is_some_and(PodGroupRecord::is_waiting)
            .then(|| held_before(&rec, snap, now))
            .flatten()
        {
            return Decision::deny(
                INSUFFICIENT,
                format!(
                    "queue {} enqueues jobs in order ({}: strict): podgroup {} waits for its cards first",
                    rec.queue,
                    crate::cards::annotations::ORDER,
                    first
                ),
            )
            .with_event(regarding);
        }
        let queue = rec.queue.clone();
        return Decision::allow().charging(queue, Effect::Group(Box::new(rec)));
    }
    // Name the first entry that no longer fits when the entries are added in order.
    let prefix_fits = |len: usize| {
        let mut partial = rec.clone();
        partial.request = Some(Ok(CardRequest(request.0[..len].to_vec())));
        fit(snap, &rec.queue, &change_with(partial), &touched, now).verdict == Verdict::Feasible
    };
    let (key, n) = &request.0[first_failing(request.0.len(), prefix_fits)];
    let mut d = Decision::deny(INSUFFICIENT, f.message(key, *n));
    d.undecided = f.verdict == Verdict::Undecided;
    d.with_event(regarding)
}

/// Under strict order, the oldest group of the queue that waits in line before `rec`
/// and whose request does not fit now but could under the quota (card-quota holds it):
/// `rec` waits behind it.
fn held_before(
    rec: &PodGroupRecord,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Option<crate::cards::ObjectKey> {
    let strict = snap
        .queue(&rec.queue)
        .is_some_and(|q| q.order == Ok(crate::cards::annotations::Order::Strict));
    if !strict {
        return None;
    }
    let mine = (rec.created, &rec.key);
    // Only this queue's groups (its index), oldest first.
    let mut older: Vec<&PodGroupRecord> = snap
        .queue_groups(&rec.queue)
        .filter(|g| g.waits_in_line() && g.key != rec.key && (g.created, &g.key) < mine)
        .collect();
    older.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
    older
        .into_iter()
        .find(|g| {
            let Some(Ok(req)) = &g.request else {
                return false;
            };
            // A group that could never run under the current quota (a derived demand
            // larger than the queue) waits for a larger quota; nobody waits for it.
            if !could_ever_fit(g, req, snap, now).allowed
                || !could_ever_fit_above(g, req, snap, now).allowed
            {
                return false;
            }
            // Held as its own enqueue would be: one model per pod set unless it splits.
            let one_model = g.derived && !g.split && has_alternatives(req);
            if one_model && !one_model_could_ever_fit(g, req, snap) {
                return false;
            }
            let touched = models_of(req.0.iter().map(|(k, _)| k));
            if !fits_with(g, req.clone(), &touched, snap, now) {
                return true;
            }
            one_model && one_model_each(g, req, snap, now).is_err()
        })
        .map(|g| g.key.clone())
}

/// What a PodGroup's Job says about its card demand.
enum Derived {
    /// Not a Volcano Job's group (or a stale one's), or its tasks ask for no cards.
    None,
    /// A Volcano Job's group whose Job the live cache does not show yet (the Job watch
    /// lags, or has not listed since start-up): its demand is unknown.
    Unseen(crate::cards::ObjectKey),
    Request(CardRequest),
    /// A task's pod template has card demand card-quota cannot read (why).
    Unreadable(String),
}

/// The card demand of the Volcano Job that owns `obj`: each task's replicas times its
/// template's cards, under the template's alternatives. Tasks with the same
/// alternatives add up (a request names each key once). The job-level request may
/// split across models; its pods are still checked one by one when they are created.
fn derive_request(obj: &serde_json::Value, rec: &PodGroupRecord, snap: &Snapshot) -> Derived {
    let owners = owners_of(obj);
    let Some(owner) = owners.iter().find(|o| {
        o.kind == "Job"
            && o.api_version.starts_with("batch.volcano.sh/")
            && o.controller == Some(true)
    }) else {
        return Derived::None;
    };
    let key = crate::cards::ObjectKey::new(rec.key.namespace.clone(), owner.name.clone());
    let Some(job) = snap.job(&key) else {
        return if snap.jobs_mirrored() {
            Derived::Unseen(key)
        } else {
            Derived::None
        };
    };
    // Another Job of the same name (deleted and created again) is not this group's.
    if job
        .uid
        .as_deref()
        .is_some_and(|u| !owner.uid.is_empty() && u != owner.uid)
    {
        return Derived::None;
    }
    let mut entries: Vec<(Alternatives, Cards)> = Vec::new();
    for (task, replicas, template) in &job.tasks {
        if *replicas == 0 || !template.is_card_pod() {
            continue;
        }
        let demand = match card_demand(template, snap, Some(&rec.queue)) {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(d) => {
                return Derived::Unreadable(format!(
                    "task {task}: {}",
                    d.message.unwrap_or_default()
                ))
            }
        };
        let cards = demand.cards.times(u64::from(*replicas));
        match entries.iter_mut().find(|(a, _)| *a == demand.alternatives) {
            Some((_, n)) => *n += cards,
            None => entries.push((demand.alternatives, cards)),
        }
    }
    if entries.is_empty() {
        Derived::None
    } else {
        Derived::Request(CardRequest(entries))
    }
}

/// A request in the grammar of `card.request`, entries in order.
fn render_request(r: &CardRequest) -> String {
    let body: Vec<String> =
        r.0.iter()
            .map(|(a, n)| {
                format!(
                    "{}:{}",
                    serde_json::to_string(&a.to_string()).unwrap_or_default(),
                    n.get()
                )
            })
            .collect();
    format!("{{{}}}", body.join(","))
}

/// The index of the entry whose addition first makes a prefix of `len` entries fail,
/// given that the whole does not fit and the empty prefix does. Fitting is monotone in
/// the prefix, so a bisection finds it in O(log len) checks.
fn first_failing(len: usize, prefix_fits: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if prefix_fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi.saturating_sub(1)
}

/// The object's owner references (none when they do not read).
fn owners_of(obj: &serde_json::Value) -> Vec<OwnerReference> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(|o| serde::Deserialize::deserialize(o).ok())
        .unwrap_or_default()
}

/// Where a refusal's Event goes: the PodGroup when it exists (and its Job, which
/// `kubectl describe vcjob` shows), else the Job creating it.
fn regarding(
    req: &AdmissionRequest,
    obj: &serde_json::Value,
    rec: &PodGroupRecord,
) -> (Option<ObjectRef>, Option<ObjectRef>) {
    let owners = owners_of(obj);
    let owner = owner_ref(&owners, &rec.key.namespace);
    if req.operation != Operation::Update {
        return (owner, None);
    }
    let group = Some(ObjectRef {
        api_version: "scheduling.volcano.sh/v1beta1".into(),
        kind: "PodGroup".into(),
        namespace: Some(rec.key.namespace.clone()),
        name: rec.key.name.clone(),
        uid: obj
            .pointer("/metadata/uid")
            .and_then(|u| u.as_str())
            .map(str::to_string),
    });
    (group, owner)
}

/// A waiting PodGroup's request could run some day: it fits the queue's quota with
/// nothing else in use. Unknown queues and broken or missing quotas are left to the
/// enqueue (an admin may create or fix them meanwhile).
fn could_ever_fit(
    rec: &PodGroupRecord,
    request: &CardRequest,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    let Some(q) = snap.queue(&rec.queue) else {
        return Decision::allow();
    };
    let Some(Ok(_)) = &q.quota else {
        return Decision::allow();
    };
    if snap.quota_lifted(&rec.queue) {
        return Decision::allow();
    }
    // What the queue could ever hold: its quota, and what it may borrow in a tree.
    let quota = &*snap.cap_of(&rec.queue);
    let mut alone = QueueUsage::new(quota.clone());
    alone.add_reservation(&request.0);
    let touched = models_of(request.0.iter().map(|(k, _)| k));
    if feasible(&alone, &touched) == Verdict::Feasible {
        return Decision::allow();
    }
    let prefix_fits = |len: usize| {
        let mut u = QueueUsage::new(quota.clone());
        u.add_reservation(&request.0[..len]);
        feasible(&u, &touched) == Verdict::Feasible
    };
    let (key, n) = &request.0[first_failing(request.0.len(), prefix_fits)];
    Decision::deny(
        INSUFFICIENT,
        insufficient(&rec.queue, key, *n, &snap.usage(&rec.queue, now)),
    )
}

/// In a tree, the request must also fit each card level above the queue with nothing
/// else in use: a Job larger than its organisation's cap would wait forever.
fn could_ever_fit_above(
    rec: &PodGroupRecord,
    request: &CardRequest,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    if snap.is_flat() {
        return Decision::allow();
    }
    let Ok(ancestry) = snap.ancestry(&rec.queue) else {
        return Decision::allow();
    };
    let touched = models_of(request.0.iter().map(|(k, _)| k));
    for level in &ancestry.levels {
        if snap.quota_lifted(level) {
            continue;
        }
        let cap = snap.cap_of(level).into_owned();
        let alone = |len: usize| {
            let mut u = QueueUsage::new(cap.clone());
            u.add_reservation(&request.0[..len]);
            feasible(&u, &touched) == Verdict::Feasible
        };
        if alone(request.0.len()) {
            continue;
        }
        let (key, n) = &request.0[first_failing(request.0.len(), alone)];
        let mut before = snap.subtree_usage(level, now).into_owned();
        before.quota = cap;
        before.borrow = snap.borrow_of(level).unwrap_or_default();
        return Decision::deny(
            INSUFFICIENT,
            super::tree::LevelRefusal::Cap {
                level: level.clone(),
                before: Box::new(before),
            }
            .message(&rec.queue, key, *n),
        );
    }
    Decision::allow()
}

/// A PodGroup whose `spec.queue` changes: checked like a new charge, in the new queue,
/// of its request and of every active pod of the group (docs/annotations.md). Pods keep the
/// queue stamped on them; the check keeps a move from carrying more than the new
/// queue could have admitted.
fn moved(
    old: &PodGroupRecord,
    rec: PodGroupRecord,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    let members: Vec<PodRecord> = snap
        .group_pods(&rec.key)
        .filter(|p| p.is_active(now))
        .cloned()
        .collect();
    let what = format!(
        "podgroup {} cannot move from queue {} to {}",
        rec.key, old.queue, rec.queue
    );
    moves(rec, members, snap, now, &what)
}

/// A PodGroup CREATE that pods already name, unstamped (created before card-quota was
/// installed, or while it was not called): their queue is the group's, so the CREATE
/// moves them into its queue, and is checked like a move. Pods stamped with a queue stay
/// there, and pods already counted in the group's queue do not move. `None` when no pod
/// moves.
fn adopted(rec: &PodGroupRecord, snap: &Snapshot, now: jiff::Timestamp) -> Option<Decision> {
    let members: Vec<PodRecord> = snap
        .group_pods(&rec.key)
        .filter(|p| p.is_active(now) && p.stamped_queue.is_none())
        .filter(|p| snap.pod_queue(&p.key) != Some(&rec.queue))
        .cloned()
        .collect();
    let first = members.first()?;
    let from = snap
        .pod_queue(&first.key)
        .map(|q| q.to_string())
        .unwrap_or_else(|| "(none)".into());
    let what = format!(
        "podgroup {} cannot be created in queue {}: it would move pod {} from queue {from}",
        rec.key, rec.queue, first.key
    );
    // A waiting group reserves nothing: only its pods move.
    let mut pods_only = rec.clone();
    if rec.is_waiting() {
        pods_only.request = None;
    }
    Some(moves(pods_only, members, snap, now, &what))
}

/// Checks `members` (and the group's live request) as new charges in `rec`'s queue;
/// a refusal starts with `what`.
fn moves(
    mut rec: PodGroupRecord,
    members: Vec<PodRecord>,
    snap: &Snapshot,
    now: jiff::Timestamp,
    what: &str,
) -> Decision {
    let queue = rec.queue.clone();
    if let Err(d) = gate(snap, &queue) {
        return d;
    }
    if let Some(stored) = snap.group(&rec.key) {
        rec.seq = stored.seq;
    }
    let members: Vec<PodRecord> = members
        .into_iter()
        .map(|mut p| {
            p.stamped_queue = Some(queue.clone());
            p
        })
        .collect();
    // What the move adds to the new queue, item by item (its pods, then its request's
    // entries), so a refusal can name the first one that does not fit. A prefix is
    // built when it is checked: the first failing one is found by bisection, so a move
    // of n pods costs O(n log n), not a copy of every prefix.
    let mut pods: Vec<(Alternatives, Cards, PodRecord)> = Vec::new();
    let mut touched = BTreeSet::new();
    for p in members {
        let key = match (&p.node, p.alternatives()) {
            (Some(_), _) => match bound_charges(&p, snap) {
                Ok(c) => c.into_iter().map(|(m, _)| m).collect::<Vec<_>>(),
                Err(_) => continue,
            },
            (None, Some(a)) => a.models().to_vec(),
            (None, None) => continue,
        };
        let Some(key) = Alternatives::from_models(key) else {
            continue;
        };
        touched.extend(key.models().iter().cloned());
        let cards = p.cards();
        pods.push((key, cards, p));
    }
    let request: Vec<(Alternatives, Cards)> =
        rec.live_request().map(|r| r.0.clone()).unwrap_or_default();
    touched.extend(request.iter().flat_map(|(k, _)| k.models().iter().cloned()));
    let len = pods.len() + request.len();
    if len == 0 {
        // Nothing with cards moves.
        return Decision::allow();
    }
    let prefix = |n: usize| {
        let mut c = Change {
            add_pods: pods[..n.min(pods.len())]
                .iter()
                .map(|(_, _, p)| p.clone())
                .collect(),
            ..Default::default()
        };
        if n > pods.len() {
            let mut partial = rec.clone();
            partial.request = Some(Ok(CardRequest(request[..n - pods.len()].to_vec())));
            c.add_groups = vec![partial];
        }
        c
    };
    let item = |i: usize| -> (&Alternatives, Cards) {
        match pods.get(i) {
            Some((k, n, _)) => (k, *n),
            None => {
                let (k, n) = &request[i - pods.len()];
                (k, *n)
            }
        }
    };
    let fits = |c: &Change| {
        let f = fit(snap, &queue, c, &touched, now);
        let after = f.after.usage();
        let over: Vec<_> = after
            .allocated
            .iter()
            .filter(|(m, a)| **a > after.quota.get(m))
            .collect();
        // Over quota only where the queue already was, and not further.
        let within = over.is_empty() || {
            let before = f.before();
            over.iter()
                .all(|(m, a)| before.allocated.get(*m) >= Some(*a))
        };
        (f.verdict, within, f)
    };
    let (verdict, within, f) = fits(&prefix(len));
    if verdict == Verdict::Feasible && within {
        // The pods stay charged where they are stamped; a request moves with its group.
        return if rec.live_request().is_some() {
            Decision::allow().charging(queue, Effect::Group(Box::new(rec)))
        } else {
            Decision::allow()
        };
    }
    // The first item that does not fit, and what the move asks of its model so far.
    let prefix_fits = |n: usize| {
        let (v, w, _) = fits(&prefix(n));
        v == Verdict::Feasible && w
    };
    let at = if snap.is_flat() {
        // The pods come from other queues and no reservation of this one involves
        // them: each adds its share, in order, and one pass finds the first that breaks
        // the queue (O(n); a tree's levels are bisected instead, O(n log n)).
        let before = f.before();
        let mut u = adjusted_after(snap, &queue, &Change::default(), now);
        let mut first = None;
        for (i, (_, _, p)) in pods.iter().enumerate() {
            if p.is_active(now) {
                u.add_share(&p.key, &Share::of(p, snap));
            }
            // Only the models the move touches can have gone over.
            let within = touched.iter().all(|m| {
                let a = u.allocated(m);
                a <= u.quota().get(m) || before.allocated.get(m).is_some_and(|b| *b >= a)
            });
            if !within || u.feasible(&touched) != Verdict::Feasible {
                first = Some(i);
                break;
            }
        }
        match first {
            Some(i) => i,
            // Every pod fits: an entry of the request does not.
            None => {
                let base = pods.len();
                base + first_failing(len - base, |n| n == 0 || prefix_fits(base + n))
            }
        }
    } else {
        first_failing(len, prefix_fits)
    };
    let key = item(at).0.clone();
    let n: Cards = (0..=at)
        .map(item)
        .filter(|(k, _)| **k == key)
        .map(|(_, n)| n)
        .sum();
    let mut d = Decision::deny(INSUFFICIENT, format!("{what}: {}", f.message(&key, n)));
    d.undecided = verdict == Verdict::Undecided;
    d
}
