//! Pod CREATE / UPDATE (task level) and the allocation check shared with bindings.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::cards::annotations::{Full, CARD_NAME, CARD_QUEUE, CHARGED, PINNED, QUOTA};
use crate::cards::dra::is_claim_resource;
use crate::cards::names::shown;
use crate::cards::nodes::product_of;
use crate::cards::{Alternatives, CardName, Cards, QueueName};
use crate::cluster::placement::NodeConstraints;
use crate::cluster::pod_parts::{read_pod, PodParts};
use crate::cluster::PodRecord;
use crate::ledger::feasibility::Demand;
use crate::ledger::usage::reservation;
use crate::ledger::usage::Share;
use crate::ledger::{Effect, Verdict};
use crate::snapshot::pins_in_flight::{InFlight, PinOrigin};
use crate::snapshot::{Snapshot, UnknownGroup};

use super::candidates::{allowed_by_constraints, none_usable, queue_models, resource_serves};
use super::fit::{feasible, fit, fit_leaf, models_of, Change};
use super::messages::{
    gate, insufficient, short_list, unknown_group, unreadable_claims, BAD_REQUEST, IMMUTABLE,
    INSUFFICIENT, INVALID, INVALID_DEMAND, NOT_ACCEPTED, RETRY,
};
use super::patch::{annotations_at, set_node_selector, AnnotationsAt};
use super::review::{AdmissionRequest, Object, Operation};
use super::tree::check_allocated;
use super::{raw_object_of, wait, Config, Decision, ObjectRef};

/// What a card pod asks for, once parsed and checked.
#[derive(Debug, Clone)]
pub struct CardDemand {
    pub resource: String,
    pub cards: Cards,
    pub alternatives: Alternatives,
    /// Where the alternatives come from.
    pub source: Source,
}

/// Where a pod's alternatives come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Its `volcano.sh/card.name`.
    Named,
    /// Its node constraints on a product label (the mutating webhook writes them as
    /// `card.name`).
    Pinned,
    /// It names no model: the models of its resource its queue's quota names, in the
    /// quota's order (the mutating webhook writes them as `card.name`).
    Quota,
}

impl CardDemand {
    /// The alternatives are card-quota's reading, not the pod's own `card.name`: the
    /// mutating webhook writes them on the pod.
    pub fn is_inferred(&self) -> bool {
        self.source != Source::Named
    }
}

pub fn decide(
    req: &AdmissionRequest,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    match req.operation {
        Operation::Create => create(req, snap, cfg, now),
        Operation::Update => update(req, snap, cfg, now),
        Operation::Delete | Operation::Connect => Decision::allow(),
    }
}

/// A pod object as read from a request: the pod's parts and its record, with every
/// extended resource outside the default card types still latent (the snapshot's
/// announced types are applied per decision).
#[derive(Debug, Clone)]
pub struct ReadPod {
    pod: PodParts,
    record: PodRecord,
}

/// A request's pod objects, each read at most once: a request may be decided several
/// times (the ledger's re-checks, a batch), and is read before the snapshot is locked.
#[derive(Debug, Clone, Default)]
pub struct PodReads {
    // Boxed: the parts are most of a kilobyte, and the request moves between tasks.
    object: OnceLock<Result<Box<ReadPod>, Decision>>,
    old: OnceLock<Result<Box<ReadPod>, Decision>>,
}

/// The record of a pod request's object, read once (by [`read_ahead`] or now);
/// `None` when it has none or it is not a valid Pod.
pub fn object_record(req: &AdmissionRequest) -> Option<&PodRecord> {
    let obj = req.object.as_ref().filter(|o| !o.is_null())?;
    let read = req.pods.object.get_or_init(|| read(req, obj));
    read.as_ref().ok().map(|r| &r.record)
}

/// What names the pod of a pod CREATE at both of its calls (`/mutate` of a pod made from
/// `generateName` has no name yet).
fn pin_origin(req: &AdmissionRequest) -> Option<(PinOrigin, &PodParts)> {
    if req.operation != Operation::Create
        || req.is_dry_run()
        || super::RequestKind::of(req) != super::RequestKind::Pod
    {
        return None;
    }
    let obj = req.object.as_ref().filter(|o| !o.is_null())?;
    let read = req
        .pods
        .object
        .get_or_init(|| read(req, obj))
        .as_ref()
        .ok()?;
    let meta = &read.pod.metadata;
    let name = [&meta.generate_name, &meta.name, &req.name]
        .into_iter()
        .flatten()
        .find(|n| !n.is_empty())?;
    let origin = PinOrigin {
        namespace: read.record.key.namespace.clone(),
        name: name.clone(),
    };
    Some((origin, &read.pod))
}

/// `/mutate` admitted pod CREATE `req` with `d`: remembers the pin it chose, if any,
/// until `/validate` charges it ([`settle_pin`]). Only an order of preference for the
/// pins chosen meanwhile (`snapshot::pins_in_flight`).
pub fn remember_pin(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    d: &Decision,
    now: jiff::Timestamp,
) {
    let (Some(label), Some(charge), true) = (&d.pinned, &d.charge, d.allowed) else {
        return;
    };
    let (Effect::Pod(rec), Some((origin, _))) = (&charge.effect, pin_origin(req)) else {
        return;
    };
    // As `fit` would lay the pod (`Change::add_pods`), read once.
    let counts = match (rec.group_key(), Share::of(rec, snap)) {
        (None, Share::Pending(a, n)) => InFlight::Pending(a, n),
        _ => InFlight::Pod(rec.clone()),
    };
    snap.pins_in_flight_mut()
        .add(&charge.queue, origin, (**label).clone(), counts, now);
}

/// The pins in flight `pins` as a change lays them beside a pod: the pending pods as
/// counted demands, one per models and cards, any other as itself. The same usage as
/// laying every pod, at a cost that does not grow with each candidate model tried.
fn beside(pins: Vec<&InFlight>) -> (Vec<Demand>, Vec<PodRecord>) {
    let mut counted: std::collections::BTreeMap<(&Alternatives, Cards), u64> = Default::default();
    let mut pods = Vec::new();
    for pin in pins {
        match pin {
            InFlight::Pending(a, n) => *counted.entry((a, *n)).or_default() += 1,
            InFlight::Pod(rec) => pods.push((**rec).clone()),
        }
    }
    let demands = counted
        .into_iter()
        .map(|((a, n), count)| Demand::pods(a.clone(), n, count))
        .collect();
    (demands, pods)
}

/// `/validate` of pod CREATE `req` was answered, its charge recorded or refused: the pin
/// `/mutate` chose for it is no longer in flight.
pub fn settle_pin(snap: &mut Snapshot, req: &AdmissionRequest) {
    if snap.pins_in_flight().is_empty() {
        return;
    }
    let Some((origin, pod)) = pin_origin(req) else {
        return;
    };
    let none = std::collections::BTreeMap::new();
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .unwrap_or(&none);
    snap.pins_in_flight_mut().settle(&origin, selector);
}

/// Which of a request's objects.
#[derive(Debug, Clone, Copy)]
enum Side {
    Object,
    Old,
}

fn read(req: &AdmissionRequest, obj: &Object) -> Result<Box<ReadPod>, Decision> {
    let pod = obj.read_with::<_, Pod>(read_pod).map_err(|e| {
        Decision::deny(
            BAD_REQUEST,
            format!("request object is not a valid Pod: {e}"),
        )
    })?;
    let mut record = pod
        .record(req.ns(), crate::cards::CardResources::defaults(), u64::MAX)
        .map_err(|e| Decision::deny(BAD_REQUEST, e.to_string()))?;
    if pod.metadata.name.as_deref().unwrap_or("").is_empty() {
        if let Some(n) = req.name.as_ref().filter(|n| !n.is_empty()) {
            record.key.name = n.clone();
        }
    }
    Ok(Box::new(ReadPod { pod, record }))
}

/// Reads a pod request's objects into records, so that deciding it later under the
/// snapshot's lock does not.
pub(super) fn read_ahead(req: &AdmissionRequest) {
    if let Some(obj) = req.object.as_ref().filter(|o| !o.is_null()) {
        let _ = req.pods.object.get_or_init(|| read(req, obj));
    }
    if req.operation == Operation::Update {
        if let Some(old) = req.old_object.as_ref().filter(|o| !o.is_null()) {
            let _ = req.pods.old.get_or_init(|| read(req, old));
        }
    }
}

/// The pod of one of the request's objects and its record as `snap` sees it (its
/// vendor prefixes decide which resources are card demand).
fn record<'r>(
    req: &'r AdmissionRequest,
    side: Side,
    obj: &Object,
    snap: &Snapshot,
) -> Result<(&'r PodParts, PodRecord), Decision> {
    let cell = match side {
        Side::Object => &req.pods.object,
        Side::Old => &req.pods.old,
    };
    let read = cell
        .get_or_init(|| read(req, obj))
        .as_ref()
        .map_err(Clone::clone)?;
    let mut rec = read.record.clone();
    rec.reclassify(|r| snap.is_card_resource(r));
    Ok((&read.pod, snap.with_claims(rec)))
}

/// The controller that owns an object, for Events about a refused one (which has no
/// object of its own yet).
pub fn owner_ref(owners: &[OwnerReference], namespace: &str) -> Option<ObjectRef> {
    let o = owners.iter().find(|o| o.controller == Some(true))?;
    Some(ObjectRef {
        api_version: o.api_version.clone(),
        kind: o.kind.clone(),
        namespace: Some(namespace.to_string()),
        name: o.name.clone(),
        uid: Some(o.uid.clone()).filter(|u| !u.is_empty()),
    })
}

/// Infers alternatives from node-affinity / nodeSelector pins on the product label.
pub(super) fn infer(rec: &PodRecord, resource: &str, snap: &Snapshot) -> Option<Alternatives> {
    let prefix = resource.split('/').next().unwrap_or("");
    let suffix = resource.split_once('/').map(|(_, s)| s).unwrap_or("");
    let mut models = Vec::new();
    for (label, values) in &rec.pinned {
        if label.split('/').next() != Some(prefix) {
            continue;
        }
        for v in values {
            let found = snap.models_for_product(label, v, resource);
            if found.is_empty() {
                // No node shows it yet: derive the name the node would give.
                let derived = if let Some(profile) = suffix.strip_prefix("mig-") {
                    Some(crate::cards::nodes::mig_model(v, profile))
                } else if suffix.ends_with(".shared") {
                    None
                } else {
                    Some(v.clone())
                };
                models.extend(derived.and_then(|d| CardName::parse(&d).ok()));
            } else {
                models.extend(found);
            }
        }
    }
    Alternatives::from_models(models)
}

/// Checks a card pod's demand: one card resource, valid names matching that resource,
/// or alternatives inferred from its pins. `queue` is for the hint listing models.
pub fn card_demand(
    rec: &PodRecord,
    snap: &Snapshot,
    queue: Option<&QueueName>,
) -> Result<Option<CardDemand>, Decision> {
    if let Some(Err(e)) = &rec.claimed {
        return Err(unreadable_claims(e));
    }
    let demand = rec
        .demand
        .as_ref()
        .map_err(|e| Decision::deny(INVALID_DEMAND, e.to_string()))?;
    let named = match &rec.card_name {
        Some(Err(e)) => return Err(Decision::deny(INVALID, e.to_string())),
        Some(Ok(a)) => Some(a.clone()),
        None => None,
    };
    let subject = rec.subject.named(&rec.key);
    let resource_name_of = |m: &CardName| {
        snap.resources_of(m)
            .and_then(|r| r.keys().next().cloned())
            .unwrap_or_else(|| "card resource of that model".to_string())
    };
    let (resource, cards) = match demand.len() {
        0 => match named {
            Some(a) => {
                return Err(Decision::deny(
                    INVALID_DEMAND,
                    format!(
                        "{subject} names {} but requests no {}",
                        a.first(),
                        resource_name_of(a.first())
                    ),
                ))
            }
            None => return Ok(None),
        },
        1 => demand
            .iter()
            .next()
            .map(|(r, n)| (r.clone(), *n))
            .unwrap_or_default(),
        _ => {
            let list: Vec<&str> = demand.keys().map(String::as_str).collect();
            return Err(Decision::deny(
                INVALID_DEMAND,
                format!(
                    "{subject} requests several card resources ({}); a pod runs on one card model",
                    list.join(", ")
                ),
            ));
        }
    };
    if let Some(claimed) = rec.claimed_models() {
        return claim_demand(rec, snap, queue, resource, cards, named, claimed);
    }
    if let Some(a) = named {
        // Alternatives whose card resource the pod does not request are dropped; only
        // when none is left is the pod refused.
        let usable: Vec<CardName> = a
            .models()
            .iter()
            .filter(|m| resource_serves(snap, &resource, m))
            .cloned()
            .collect();
        return match Alternatives::from_models(usable) {
            Some(alternatives) => Ok(Some(CardDemand {
                resource,
                cards,
                alternatives,
                source: Source::Named,
            })),
            None => Err(Decision::deny(
                INVALID_DEMAND,
                format!(
                    "{subject} names {} but requests no {}",
                    a.first(),
                    resource_name_of(a.first())
                ),
            )),
        };
    }
    if let Some(a) = infer(rec, &resource, snap) {
        return Ok(Some(CardDemand {
            resource,
            cards,
            alternatives: a,
            source: Source::Pinned,
        }));
    }
    // No name and no product pin: every model of the resource its queue's quota names,
    // in the quota's order, that the pod's own constraints allow.
    let q = queue.cloned().unwrap_or_else(QueueName::default_queue);
    let named = queue_models(snap, &q, &resource);
    let usable = allowed_by_constraints(rec, &resource, &named);
    match Alternatives::from_models(usable) {
        Some(alternatives) => Ok(Some(CardDemand {
            resource,
            cards,
            alternatives,
            source: Source::Quota,
        })),
        // Under warn a quota refusal is a warning: admitted unpinned, charged on its
        // node's model once bound. Not below a card level in deny: a queue in deny is
        // never exceeded, whoever charges it, and a pod with no model cannot be checked
        // against its cap.
        None if named.is_empty() && snap.quota_lifted(&q) && !under_deny(snap, &q) => Ok(None),
        None => {
            let message = none_usable(snap, &subject.to_string(), &q, &resource, &named, rec);
            // A quota that names no model of the resource is a quota refusal (warn admits
            // it); the pod's own constraints ruling out every model is the pod's to fix.
            let reason = if named.is_empty() {
                INSUFFICIENT
            } else {
                INVALID_DEMAND
            };
            Err(Decision::deny(reason, message))
        }
    }
}

/// True when a card level above `queue` enforces its quota (its quota is not lifted).
fn under_deny(snap: &Snapshot, queue: &QueueName) -> bool {
    snap.ancestors_of(queue)
        .iter()
        .filter(|a| snap.queue(a).is_some_and(|r| r.quota.is_some()))
        .any(|a| !snap.quota_lifted(a))
}

/// The demand of a pod whose cards come from claims: the models its claims allow,
/// narrowed by its `card.name`, else by its queue's quota (in the quota's order).
fn claim_demand(
    rec: &PodRecord,
    snap: &Snapshot,
    queue: Option<&QueueName>,
    resource: String,
    cards: Cards,
    named: Option<Alternatives>,
    claimed: &Alternatives,
) -> Result<Option<CardDemand>, Decision> {
    let subject = rec.subject.named(&rec.key);
    let allowed = |models: &[CardName]| -> Vec<CardName> {
        models
            .iter()
            .filter(|m| claimed.contains(m))
            .cloned()
            .collect()
    };
    // Counted on the models it may still use: a `firstAvailable` way larger than any
    // those models can take is no demand of this pod.
    let cards_on = |a: &Alternatives| match &rec.claimed {
        Some(Ok(c)) => c.cards_on(Some(a)),
        _ => cards,
    };
    if let Some(a) = named {
        return match Alternatives::from_models(allowed(a.models())) {
            Some(alternatives) => Ok(Some(CardDemand {
                resource,
                cards: cards_on(&alternatives),
                alternatives,
                source: Source::Named,
            })),
            None => Err(Decision::deny(
                INVALID_DEMAND,
                format!("{subject} names {a} but its ResourceClaims allow only {claimed}"),
            )),
        };
    }
    let q = queue.cloned().unwrap_or_else(QueueName::default_queue);
    let usable = allowed(&queue_models(snap, &q, &resource));
    match Alternatives::from_models(usable) {
        Some(alternatives) => Ok(Some(CardDemand {
            resource,
            cards: cards_on(&alternatives),
            alternatives,
            source: Source::Quota,
        })),
        None if snap.quota_lifted(&q) => Ok(None),
        None => {
            let example = format!("'{{\"{}\":1}}'", claimed.first());
            Err(Decision::deny(
                INSUFFICIENT,
                format!(
                    "{subject} claims {cards} card(s) of {claimed} through ResourceClaims but queue {q} has no quota for any of them; give the queue one: {QUOTA}: {example}"
                ),
            ))
        }
    }
}

/// The refusal of a card pod no model can be pinned for: the models it could be placed
/// on (a node offers them, its constraints allow one) have no room, with their numbers,
/// or no node offers any model it may use yet (when its quota has room for them). A
/// refusal a quota makes: under warn the pod is admitted, unpinned, with the warning.
fn unplaceable(
    rec: &PodRecord,
    demand: &CardDemand,
    queue: &QueueName,
    snap: &Snapshot,
    now: jiff::Timestamp,
    placeable: Vec<CardName>,
) -> Decision {
    let first = placeable.first().cloned();
    let refusal = |key: Alternatives| {
        let mut pod = rec.clone();
        pod.name_models(key.clone());
        let change = Change {
            add_pods: vec![pod],
            ..Default::default()
        };
        let f = fit(snap, queue, &change, &models_of([&key]), now);
        match f.verdict {
            Verdict::Feasible => None,
            Verdict::Infeasible => {
                Some(Decision::deny(INSUFFICIENT, f.message(&key, demand.cards)))
            }
            Verdict::Undecided => Some(undecided(queue, &key, demand.cards, &f.before())),
        }
    };
    let key = Alternatives::from_models(placeable).unwrap_or_else(|| demand.alternatives.clone());
    let none_offered = first.is_none();
    // Offered with nothing to pin to: nodes that serve the model without a product
    // label (DRA-backed extended resources on unlabelled nodes).
    let unlabelled: Vec<&str> = demand
        .alternatives
        .models()
        .iter()
        .filter(|m| snap.pin_of(m).is_none())
        .filter(|m| {
            snap.resources_of(m)
                .is_some_and(|r| r.contains_key(&demand.resource))
        })
        .map(|m| m.as_str())
        .collect();
    let unlabelled_note = (!unlabelled.is_empty()).then(|| {
        format!(
            "the nodes that offer {} for {} carry no product label ({}.product) to place it with: card-quota places a card pod only where it can pin it (GPU Feature Discovery writes the label)",
            unlabelled.join(", "),
            demand.resource,
            demand.resource
        )
    });
    let mut d = refusal(key)
        .or_else(|| first.and_then(|m| refusal(Alternatives::single(m))))
        .unwrap_or_else(|| {
            let why = match (&unlabelled_note, none_offered) {
                (Some(_), true) => None,
                (_, true) => Some("no node offers any of them yet"),
                (_, false) => Some("none of the models it can be placed on has room"),
            };
            let tail = why.map(|w| {
                format!("{w}: card-quota places a card pod only on a model a node offers")
            });
            Decision::deny(
                INSUFFICIENT,
                format!(
                    "pod {} may use {} in queue {queue}, but {}",
                    rec.key,
                    demand.alternatives,
                    tail.or(unlabelled_note.clone()).unwrap_or_default()
                ),
            )
        });
    if let Some(note) = &unlabelled_note {
        if let Some(m) = d.message.as_mut().filter(|m| !m.contains(note.as_str())) {
            *m = super::messages::cap(format!("{m}; {note}"));
        }
    }
    d
}

fn undecided(
    queue: &QueueName,
    key: &Alternatives,
    n: Cards,
    before: &crate::ledger::QueueUsage,
) -> Decision {
    let mut d = Decision::deny(
        INSUFFICIENT,
        format!("{} (could not prove the request fits within the search budget; refused rather than over-admitted)", insufficient(queue, key, n, before)),
    );
    d.undecided = true;
    d
}

/// Allocating `rec` on `node`: for every card resource the pod requests, the node's
/// model must be one the pod accepts (a pod naming `card.name` requests one resource),
/// allocated must stay within quota on each model, and the other pending demand must
/// stay feasible. Returns the charged model per resource.
pub fn allocate(
    snap: &Snapshot,
    queue: &QueueName,
    rec: &PodRecord,
    node: &str,
    now: jiff::Timestamp,
) -> Result<Vec<(CardName, Cards)>, Decision> {
    allocate_with(snap, queue, rec, &[], node, now)
}

/// [`allocate`], with `sharers` (pods of `rec`'s shared claims, read as they pay once
/// `rec` is bound) replacing their records in the check.
pub fn allocate_with(
    snap: &Snapshot,
    queue: &QueueName,
    rec: &PodRecord,
    sharers: &[PodRecord],
    node: &str,
    now: jiff::Timestamp,
) -> Result<Vec<(CardName, Cards)>, Decision> {
    let Some(n) = snap.node(node) else {
        return Err(Decision::deny(
            RETRY,
            format!("node {node} is not in card-quota's cache yet; try again"),
        ));
    };
    // Claims that cannot be read charge nothing: never admitted as a binding of no
    // cards (found by a test of the claims' stream: an allocation onto a device of a
    // node whose slice the cache did not hold yet was admitted, charged nothing).
    if let Some(Err(e)) = &rec.claimed {
        return Err(unreadable_claims(e));
    }
    let demand = rec
        .demand
        .as_ref()
        .map_err(|e| Decision::deny(INVALID_DEMAND, e.to_string()))?;
    let mut charges: Vec<(CardName, Cards)> = Vec::new();
    let mut add =
        |model: CardName, cards: Cards| match charges.iter_mut().find(|(m, _)| *m == model) {
            Some((_, total)) => *total += cards,
            None => charges.push((model, cards)),
        };
    for (resource, cards) in demand {
        if is_claim_resource(resource) {
            // Cards from claims: the models of the devices the scheduler allocated.
            match &rec.claimed {
                Some(Ok(c)) => match &c.allocated {
                    Some(allocated) => allocated.iter().for_each(|(m, n)| add(m.clone(), *n)),
                    None => {
                        return Err(Decision::deny(
                            RETRY,
                            format!(
                                "pod {} uses ResourceClaim {}, whose allocation card-quota has not seen yet; try again",
                                rec.key,
                                c.claims.join(", ")
                            ),
                        ))
                    }
                },
                Some(Err(e)) => return Err(unreadable_claims(e)),
                // Its admitted record (a ledger entry the pod cache has not caught up
                // with): its claims are not read yet.
                None => {
                    return Err(Decision::deny(
                        RETRY,
                        format!("pod {} is not in card-quota's cache with its ResourceClaims yet; try again", rec.key),
                    ))
                }
            }
            continue;
        }
        let Some(model) = n.model_for(resource).cloned() else {
            return Err(Decision::deny(
                INVALID_DEMAND,
                format!("node {node} offers no card model for {resource} (no <prefix>/<type>.product or .product-name label, or no such allocatable resource)"),
            ));
        };
        add(model, *cards);
    }
    if charges.is_empty() {
        return Ok(charges);
    }
    if let (Some(a), [(model, _)]) = (rec.alternatives(), charges.as_slice()) {
        if !a.contains(model) {
            return Err(Decision::deny(
                NOT_ACCEPTED,
                format!("pod {} accepts {a} but node {node} has {model}", rec.key),
            ));
        }
    }
    let mut bound = rec.clone();
    bound.node = Some(node.to_string());
    // One model is recorded on the pod; a pod of several resources is charged by its
    // node's models.
    bound.charged = match charges.as_slice() {
        [(m, _)] if demand.len() == 1 => Some(m.clone()),
        _ => None,
    };
    // Sharers of another queue pay less there: nothing this queue's check counts.
    let others = sharers
        .iter()
        .filter(|p| snap.pod_queue(&p.key) == Some(queue))
        .cloned();
    let change = Change {
        add_pods: std::iter::once(bound).chain(others).collect(),
        ..Default::default()
    };
    let mut touched: BTreeSet<CardName> = rec
        .alternatives()
        .map(|a| models_of([a]))
        .unwrap_or_default();
    touched.extend(charges.iter().map(|(m, _)| m.clone()));
    let f = fit_leaf(snap, queue, &change, &touched, now);
    for (model, cards) in &charges {
        if f.after.allocated(model) > f.after.quota().get(model) {
            return Err(Decision::deny(
                INSUFFICIENT,
                f.message(&Alternatives::single(model.clone()), *cards),
            ));
        }
    }
    // The same hard line under every group cap over a charged model (the feasibility
    // check below sees only unbound demand).
    for cap in f.after.cap_rooms() {
        if cap.room >= 0 {
            continue;
        }
        if let Some((model, cards)) = charges.iter().find(|(m, _)| cap.pattern.matches(m)) {
            return Err(Decision::deny(
                INSUFFICIENT,
                f.message(&Alternatives::single(model.clone()), *cards),
            ));
        }
    }
    if !snap.is_flat() {
        let models: Vec<CardName> = charges.iter().map(|(m, _)| m.clone()).collect();
        let before = f.before();
        if let Some(r) = check_allocated(snap, queue, &before, &f.after.usage(), &models, now) {
            let (model, cards) = &charges[0];
            return Err(Decision::deny(
                INSUFFICIENT,
                r.message(queue, &Alternatives::single(model.clone()), *cards),
            ));
        }
    }
    // The model named in a refusal: the pod's first charge (there is at least one).
    let (model, cards) = charges[0].clone();
    let single = Alternatives::single(model);
    match f.verdict {
        Verdict::Feasible => Ok(charges),
        // Binding never makes a broken queue worse than the hard line allows.
        _ if feasible(&f.before(), &touched) != Verdict::Feasible => Ok(charges),
        Verdict::Undecided => Err(undecided(queue, &single, cards, &f.before())),
        Verdict::Infeasible => Err(Decision::deny(INSUFFICIENT, f.message(&single, cards))),
    }
}

fn annotation<'a>(pod: &'a PodParts, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A pod card-quota's `/mutate` pinned, refused at `/validate` because pods admitted at
/// the same moment (through another replica) took its model's room while another of its
/// models has room: the refusal says so, since the pod created again is pinned there.
/// Only the message changes.
fn where_it_would_go(
    mut d: Decision,
    pod: &PodParts,
    rec: &PodRecord,
    demand: &CardDemand,
    queue: &QueueName,
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> Decision {
    if annotation(pod, PINNED).is_none() || d.reason != Some(INSUFFICIENT) {
        return d;
    }
    let prefix = demand.resource.split('/').next().unwrap_or_default();
    let ours = |label: &str| label.split('/').next() == Some(prefix);
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref());
    let Some(pinned) = selector.and_then(|s| s.iter().find(|(l, _)| ours(l))) else {
        return d;
    };
    // The pod as `/mutate` saw it: without the pin it added.
    let unpinned: std::collections::BTreeMap<String, String> = selector
        .into_iter()
        .flatten()
        .filter(|(l, _)| *l != pinned.0)
        .map(|(l, v)| (l.clone(), v.clone()))
        .collect();
    let mut free = rec.clone();
    free.pinned.remove(pinned.0);
    let constraints = NodeConstraints {
        node_selector: Some(&unpinned),
        affinity: pod.spec.as_ref().and_then(|s| s.affinity.as_ref()),
    };
    let Ok((_, Some((model, pin)))) = choose_pin(free, demand, queue, snap, now, &constraints)
    else {
        return d;
    };
    if pin.1 == *pinned.1 {
        return d;
    }
    if let Some(m) = d.message.as_mut() {
        *m = super::messages::cap(format!(
            "{m}; card-quota pinned this pod to {} as it was created, and pods admitted at the same moment took that room: {model} has room for it, and the pod created again is pinned there",
            pinned.1
        ));
    }
    d
}

/// How the warning on a pod warn leaves unpinned begins.
pub const NOT_PINNED: &str = "card-quota does not pin pods in warn mode";

/// Whether a pending pod is steered onto the model it is admitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steer {
    /// Not at all (`--no-pin`, a pod on its node, a pod of claims or of a DaemonSet).
    Off,
    /// Pinned: a nodeSelector on the model's product label, the model stamped.
    Pin,
    /// Warn observes and does not act: no nodeSelector and no `card.pinned` (an
    /// inferred `card.name` still counts it while pending), and the warning says what
    /// deny would pin.
    Advise,
}

/// Decides a card pod that is new to `queue` (CREATE, or an UPDATE that changes its
/// demand): pending, or allocated when it names its node. `stamp` adds the queue stamp;
/// `steer` says whether a pending pod is pinned to the model it is admitted for.
fn admit(
    pod: &PodParts,
    mut rec: PodRecord,
    queue: QueueName,
    snap: &Snapshot,
    now: jiff::Timestamp,
    stamp: bool,
    steer: Steer,
) -> Decision {
    let owner = pod
        .metadata
        .owner_references
        .as_deref()
        .and_then(|o| owner_ref(o, &rec.key.namespace));
    let at = AnnotationsAt::of_meta(&pod.metadata);
    let demand = match card_demand(&rec, snap, Some(&queue)) {
        Ok(Some(d)) => d,
        // Nothing to charge now (under warn, a pod whose queue names no model of its
        // resource): still stamped, so that its cards count in this queue once bound.
        Ok(None) => {
            let mut d = Decision::allow();
            if stamp {
                d.patch = annotations_at(at, vec![(CARD_QUEUE, queue.to_string())]);
            }
            return d;
        }
        Err(d) => return d.with_event(owner),
    };
    if let Err(d) = gate(snap, &queue) {
        return d.with_event(owner);
    }
    let mut annotations: Vec<(&str, String)> = Vec::new();
    if stamp {
        annotations.push((CARD_QUEUE, queue.to_string()));
        rec.stamped_queue = Some(queue.clone());
    }
    if demand.is_inferred() {
        // Under warn too: the name is what counts a pending pod; it steers nothing there,
        // as warn's binding takes any model (see `enforcement`).
        annotations.push((CARD_NAME, demand.alternatives.to_string()));
        rec.name_models(demand.alternatives.clone());
    }
    if let Some(node) = rec.node.clone() {
        // Created on its node: charged on that node's model, whatever its queue names.
        if demand.source == Source::Quota {
            annotations.retain(|(k, _)| *k != CARD_NAME);
            rec.card_name = None;
        }
        return match allocate(snap, &queue, &rec, &node, now) {
            Ok(charges) => {
                let mut bound = rec.clone();
                if let [(model, _)] = charges.as_slice() {
                    annotations.push((CHARGED, model.to_string()));
                    bound.charged = Some(model.clone());
                }
                let mut d = Decision::allow().charging(queue, Effect::Pod(Box::new(bound)));
                d.patch = annotations_at(at, annotations);
                d
            }
            Err(d) => d.with_event(owner),
        };
    }
    if let Some(node) = node_named_by_affinity(pod) {
        return charge_on_named_node(pod, rec, queue, snap, now, &demand, &node, annotations)
            .with_event(owner);
    }
    let mut node_selector = None;
    let mut fits_pinned = false;
    let mut advice = None;
    if steer != Steer::Off {
        let constraints = NodeConstraints {
            node_selector: pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()),
            affinity: pod.spec.as_ref().and_then(|s| s.affinity.as_ref()),
        };
        let pinned = match choose_pin(rec.clone(), &demand, &queue, snap, now, &constraints) {
            Err(d) => {
                let d = where_it_would_go(d, pod, &rec, &demand, &queue, snap, now);
                return d.with_event(owner);
            }
            Ok((r, pinned)) => {
                if steer == Steer::Pin {
                    rec = r;
                }
                pinned
            }
        };
        if let Some((model, (label, product))) = pinned {
            let why = format!(
                "{model}: the first of {} with room in queue {queue}",
                demand.alternatives
            );
            if steer == Steer::Pin {
                annotations.push((PINNED, why));
                node_selector = Some((label, product));
                // choose_pin checked exactly this pod (pinned) against the queue.
                fits_pinned = true;
            } else {
                advice = Some(format!(
                    "{NOT_PINNED}; under deny it would pin this one to {why} (nodeSelector {label}={product})"
                ));
            }
        }
    }
    let mut patch = annotations_at(at, annotations);
    let mut pinned_now = None;
    if let Some((label, product)) = node_selector {
        let selector = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref());
        if selector.and_then(|s| s.get(label)) != Some(product) {
            pinned_now = Some(Box::new((label.clone(), product.clone())));
        }
        patch.extend(set_node_selector(selector, label, product));
    }
    if fits_pinned {
        let mut d = Decision::allow().charging(queue, Effect::Pod(Box::new(rec)));
        d.patch = patch;
        d.pinned = pinned_now;
        return d;
    }
    let touched = models_of([&demand.alternatives]);
    let change = Change {
        add_pods: vec![rec.clone()],
        ..Default::default()
    };
    let f = fit(snap, &queue, &change, &touched, now);
    if steer != Steer::Off
        && advice.is_none()
        && f.verdict == Verdict::Feasible
        && in_a_tree(snap, &queue)
    {
        // Below card levels a pod goes only on a model it fits on along its whole path:
        // each level's check of unbound multi-model demand alone is a relaxation.
        let first = Alternatives::single(demand.alternatives.first().clone());
        let mut one = rec.clone();
        one.name_models(first.clone());
        let change = Change {
            add_pods: vec![one],
            ..Default::default()
        };
        let f1 = fit(snap, &queue, &change, &models_of([&first]), now);
        return Decision::deny(INSUFFICIENT, f1.message(&first, demand.cards)).with_event(owner);
    }
    let d = match f.verdict {
        Verdict::Feasible => {
            let mut d = Decision::allow().charging(queue, Effect::Pod(Box::new(rec)));
            d.patch = patch;
            d.warnings.extend(advice);
            d
        }
        Verdict::Infeasible => {
            Decision::deny(INSUFFICIENT, f.message(&demand.alternatives, demand.cards))
        }
        Verdict::Undecided => undecided(&queue, &demand.alternatives, demand.cards, &f.before()),
    };
    d.with_event(owner)
}

/// How a pending pod of `queue` is steered. A pod whose cards come from claims is not
/// pinned by node labels: its devices' models are its claims' to say, and a DRA node
/// need not carry the product label.
fn steer_of(
    pod: &PodParts,
    rec: &PodRecord,
    queue: &QueueName,
    snap: &Snapshot,
    cfg: &Config,
) -> Steer {
    if !cfg.pin
        || rec.node.is_some()
        || rec.claimed.is_some()
        || names_its_node(pod)
        || owned_by_daemonset(pod)
    {
        Steer::Off
    } else if super::enforcement::observed_only(snap, cfg, &rec.key.namespace, queue) {
        Steer::Advise
    } else {
        Steer::Pin
    }
}

/// A pod CREATE that may wait (its queue's `card.full` is `wait`, or it carries the
/// gate already): `Some` when it waits behind the gate, charging nothing; `None` when it
/// is decided as any pod (it fits and nobody waits before it).
fn wait_at_create(
    pod: &PodParts,
    rec: &PodRecord,
    queue: &QueueName,
    snap: &Snapshot,
    now: jiff::Timestamp,
    steer: Steer,
) -> Option<Decision> {
    let demand = match card_demand(rec, snap, Some(queue)) {
        Ok(Some(d)) => d,
        // Nothing to charge, or a demand refused for what it is: decided as any pod.
        _ => return None,
    };
    let first = if rec.gated {
        // Gated already: the pod waits whatever its room, for its release; decided as
        // released (a gated record counts nothing) only to tell room from never.
        let mut released = rec.clone();
        released.gated = false;
        admit(pod, released, queue.clone(), snap, now, true, Steer::Off)
    } else if let Some(why) = wait::line_ahead(snap, queue, now) {
        Decision::deny(INSUFFICIENT, why)
    } else {
        let d = admit(pod, rec.clone(), queue.clone(), snap, now, true, steer);
        if d.allowed {
            return Some(d);
        }
        d
    };
    let waits = first.allowed
        || (wait::for_room(&first)
            && wait::could_ever_fit(snap, queue, &demand.alternatives, demand.cards));
    if !waits {
        return Some(first);
    }
    let mut annotations: Vec<(&str, String)> = vec![(CARD_QUEUE, queue.to_string())];
    if demand.is_inferred() {
        annotations.push((CARD_NAME, demand.alternatives.to_string()));
    }
    let mut patch = annotations_at(AnnotationsAt::of_meta(&pod.metadata), annotations);
    if !rec.gated {
        patch.push(wait::add_gate(pod));
    }
    if first.allowed {
        let mut d = Decision::allow();
        d.patch = patch;
        return Some(d);
    }
    let mut d = wait::waiting(&first, patch, queue);
    if !rec.gated {
        // Only the mutating call can add the gate: a pod that reaches the validating
        // call without it (the mutating call saw room that is gone) is refused.
        d.unless_patched = Some(Box::new(first));
    }
    Some(d)
}

/// True when card levels lie above `queue`.
fn in_a_tree(snap: &Snapshot, queue: &QueueName) -> bool {
    !snap.is_flat() && snap.ancestry(queue).is_ok_and(|a| !a.levels.is_empty())
}

fn create(req: &AdmissionRequest, snap: &Snapshot, cfg: &Config, now: jiff::Timestamp) -> Decision {
    let obj = match raw_object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let (pod, rec) = match record(req, Side::Object, obj, snap) {
        Ok(r) => r,
        Err(d) => return d,
    };
    // Only the install's card resources are cards: a NIC's virtual function under a
    // card vendor's prefix is not.
    if !rec.is_card_pod() {
        return Decision::allow();
    }
    let key = rec.key.clone();
    // docs/annotations.md: the queue Volcano will schedule the pod in is the queue it is charged
    // to, stamped on it now so that nothing done to its PodGroup or labels later moves
    // its cards.
    let queue = match snap.volcano_queue(&rec) {
        Ok(q) => q,
        Err(UnknownGroup(g)) => return unknown_group(&key, g),
    };
    if let Some(stamped) = annotation(pod, CARD_QUEUE) {
        if stamped != queue.as_str() {
            let stamped = shown(stamped);
            return Decision::deny(
                IMMUTABLE,
                format!(
                    "pod {key} sets {CARD_QUEUE}={stamped:?} but its queue is {queue}; card-quota writes that annotation, remove it"
                ),
            );
        }
    }
    if let Some(charged) = annotation(pod, CHARGED) {
        if rec.node.is_none() {
            let charged = shown(charged);
            return Decision::deny(
                IMMUTABLE,
                format!(
                    "pod {key} sets {CHARGED}={charged:?}; card-quota writes that annotation when the pod is bound, remove it"
                ),
            );
        }
    }
    let steer = steer_of(pod, &rec, &queue, snap, cfg);
    let may_wait = rec.node.is_none()
        && rec.claimed.is_none()
        && !names_its_node(pod)
        && !owned_by_daemonset(pod)
        && (rec.gated
            || (wait::policy(snap, cfg, &queue) == Full::Wait
                && !super::enforcement::observed_only(snap, cfg, &key.namespace, &queue)));
    if may_wait {
        if let Some(d) = wait_at_create(pod, &rec, &queue, snap, now, steer) {
            return d;
        }
    }
    let d = admit(pod, rec, queue, snap, now, true, steer);
    // A pod created on its node is charged its node's model, whatever it claims.
    if let (true, Some(claimed)) = (d.allowed, annotation(pod, CHARGED)) {
        if let Some(Effect::Pod(p)) = d.charge.as_ref().map(|c| &c.effect) {
            if p.charged.as_ref().map(CardName::as_str) != Some(claimed) {
                let claimed = shown(claimed);
                return Decision::deny(
                    IMMUTABLE,
                    format!(
                        "pod {key} sets {CHARGED}={claimed:?} but is charged {}; card-quota writes that annotation, remove it",
                        p.charged.as_ref().map(CardName::as_str).unwrap_or("by its node's models")
                    ),
                );
            }
        }
    }
    d
}

/// Annotations that only card-quota (or the pod's creator, for `card.name`) writes and
/// that no UPDATE may change on a pod with card demand (docs/annotations.md).
const IMMUTABLE_ANNOTATIONS: [&str; 3] = [CARD_QUEUE, CHARGED, CARD_NAME];

fn update(req: &AdmissionRequest, snap: &Snapshot, cfg: &Config, now: jiff::Timestamp) -> Decision {
    let obj = match raw_object_of(req) {
        Ok(o) => o,
        Err(d) => return d,
    };
    let (pod, new) = match record(req, Side::Object, obj, snap) {
        Ok(r) => r,
        Err(d) => return d,
    };
    let Some(old_obj) = req.old_object.as_ref().filter(|o| !o.is_null()) else {
        return Decision::deny(
            BAD_REQUEST,
            format!("UPDATE of pod {} has no oldObject", new.key),
        );
    };
    let (old_pod, old) = match record(req, Side::Old, old_obj, snap) {
        Ok(r) => r,
        Err(d) => return d,
    };
    let may_hold_cards = |p: &PodRecord| p.is_card_pod();
    if may_hold_cards(&old) || may_hold_cards(&new) {
        // The stamp a pod from before the install gets from the reconciler: the queue
        // it is counted in already, so nothing moves.
        let counted_in = snap
            .pod_queue(&old.key)
            .cloned()
            .or_else(|| snap.volcano_queue(&old).ok());
        for a in IMMUTABLE_ANNOTATIONS {
            let (was, now_) = (annotation(old_pod, a), annotation(pod, a));
            let stamping = a == CARD_QUEUE
                && was.is_none()
                && now_.is_some_and(|q| counted_in.as_ref().is_some_and(|c| c.as_str() == q));
            if was != now_ && !stamping {
                let show =
                    |v: Option<&str>| v.map_or("unset".to_string(), |v| format!("{:?}", shown(v)));
                return Decision::deny(
                    IMMUTABLE,
                    format!(
                        "pod {} has card demand: {a} cannot be changed (was {}, now {})",
                        new.key,
                        show(was),
                        show(now_)
                    ),
                );
            }
        }
    }
    if !new.is_card_pod() {
        return Decision::allow();
    }
    if old.gated && !new.gated && new.node.is_none() {
        return release(pod, new, snap, cfg, now);
    }
    let same_demand = new.demand == old.demand && new.card_name == old.card_name;
    let queue = match &old.stamped_queue {
        // Stamped: its queue is fixed; only a changed demand is a new charge.
        Some(q) => {
            if same_demand {
                return Decision::allow();
            }
            q.clone()
        }
        // Admitted before card-quota stamped pods: Volcano's queue, as it resolves now.
        None => {
            // A group name added by Volcano's PodGroup controller is not a new charge;
            // when the group is not cached yet, the old queue stands.
            let (before, after) = (snap.volcano_queue(&old), snap.volcano_queue(&new));
            // While the old group is unknown the pod stays in the queue it is counted
            // in: a new queue that resolves is a move from there.
            let counted = snap.pod_queue(&old.key);
            let same_queue = match (&before, &after) {
                (Ok(a), Ok(b)) => a == b,
                (Err(_), Ok(b)) => counted.is_none_or(|c| c == b),
                _ => true,
            };
            if same_demand && same_queue {
                return Decision::allow();
            }
            match after.or(before) {
                Ok(q) => q,
                Err(g) => return unknown_group(&new.key, g),
            }
        }
    };
    // Keep the stored pod's place (age) in the queue and its node.
    let mut changed = new;
    if let Some(stored) = snap.pod(&changed.key) {
        changed.seq = stored.seq;
    }
    admit(pod, changed, queue, snap, now, false, Steer::Off)
}

/// The UPDATE that removes card-quota's gate from a waiting pod: decided as its CREATE
/// would be (pinned, charged, recorded before the answer), in its queue's order. A
/// refusal leaves the pod gated; the releaser tries again when room appears.
fn release(
    pod: &PodParts,
    mut rec: PodRecord,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    let queue = match rec.stamped_queue.clone() {
        Some(q) => q,
        None => match snap.volcano_queue(&rec) {
            Ok(q) => q,
            Err(UnknownGroup(g)) => return unknown_group(&rec.key, g),
        },
    };
    if let Some(stored) = snap.pod(&rec.key) {
        rec.seq = stored.seq;
    }
    if let Some(first) = wait::held_behind(snap, &queue, &rec, now) {
        return Decision::deny(
            INSUFFICIENT,
            format!(
                "queue {queue} releases waiting pods in order ({}: strict): pod {first} waits for its cards first",
                crate::cards::annotations::ORDER
            ),
        );
    }
    let steer = steer_of(pod, &rec, &queue, snap, cfg);
    admit(pod, rec, queue, snap, now, false, steer)
}

/// A pod that names its node (`nodeName`, or a required `matchFields metadata.name`
/// term) is placed there whatever a pin says: it is left alone.
fn names_its_node(pod: &PodParts) -> bool {
    required_terms(pod)
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .any(|f| f.key == "metadata.name")
}

fn required_terms(pod: &PodParts) -> &[k8s_openapi::api::core::v1::NodeSelectorTerm] {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
}

/// The one node a pod's required node affinity allows by `metadata.name` (as every
/// DaemonSet pod's does): each term names that node and only it.
fn node_named_by_affinity(pod: &PodParts) -> Option<String> {
    let terms = required_terms(pod);
    let mut named: Option<&String> = None;
    for t in terms {
        let mut in_term: Option<&String> = None;
        for f in t.match_fields.iter().flatten() {
            if f.key != "metadata.name" || f.operator != "In" {
                continue;
            }
            match f.values.as_deref() {
                Some([one]) if in_term.is_none_or(|n| n == one) => in_term = Some(one),
                _ => return None,
            }
        }
        match (in_term, named) {
            (None, _) => return None,
            (Some(n), None) => named = Some(n),
            (Some(n), Some(m)) if n == m => {}
            _ => return None,
        }
    }
    named.cloned()
}

/// A pod whose affinity names its node is charged at CREATE on that node's model (it
/// can run nowhere else), never pinned: pending on that one model.
#[allow(clippy::too_many_arguments)]
fn charge_on_named_node(
    pod: &PodParts,
    mut rec: PodRecord,
    queue: QueueName,
    snap: &Snapshot,
    now: jiff::Timestamp,
    demand: &CardDemand,
    node: &str,
    mut annotations: Vec<(&str, String)>,
) -> Decision {
    let Some(n) = snap.node(node) else {
        return Decision::deny(
            RETRY,
            format!(
                "pod {} names node {node}, which is not in card-quota's cache yet; try again",
                rec.key
            ),
        );
    };
    let Some(model) = n.model_for(&demand.resource).cloned() else {
        return Decision::deny(
            INVALID_DEMAND,
            format!(
                "pod {} names node {node}, which offers no card model for {} (no <prefix>/<type>.product or .product-name label, or no such allocatable resource)",
                rec.key, demand.resource
            ),
        );
    };
    if demand.source != Source::Quota && !demand.alternatives.contains(&model) {
        return Decision::deny(
            NOT_ACCEPTED,
            format!(
                "pod {} accepts {} but names node {node}, which has {model}",
                rec.key, demand.alternatives
            ),
        );
    }
    let only = Alternatives::single(model.clone());
    annotations.retain(|(k, _)| *k != CARD_NAME);
    if rec.alternatives() != Some(&only) {
        annotations.push((CARD_NAME, only.to_string()));
    }
    rec.name_models(only.clone());
    let change = Change {
        add_pods: vec![rec.clone()],
        ..Default::default()
    };
    let f = fit(snap, &queue, &change, &models_of([&only]), now);
    match f.verdict {
        Verdict::Feasible => {
            let mut d = Decision::allow().charging(queue, Effect::Pod(Box::new(rec)));
            d.patch = annotations_at(AnnotationsAt::of_meta(&pod.metadata), annotations);
            d
        }
        Verdict::Infeasible => Decision::deny(INSUFFICIENT, f.message(&only, demand.cards)),
        Verdict::Undecided => undecided(&queue, &only, demand.cards, &f.before()),
    }
}

/// DaemonSet pods go to every node of their selector; pinning them is not ours to do.
fn owned_by_daemonset(pod: &PodParts) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet")
}

/// A chosen model and the node label (key, value) that places a pod on it.
type Pin<'s> = (CardName, &'s (String, String));

/// The model a pending pod is pinned to: the first of its usable alternatives, in
/// `card.name` order, that some node offers and that still has room once every pending
/// pod counts on its own pin (Kueue's flavor assignment). `None` when none has room on
/// its own (the pod is then decided unpinned). A pod whose own node constraints allow
/// none of its models is refused, naming both.
///
/// The record is checked as it is (no copy) and given back: pinned to the chosen model,
/// or as it came when there is none.
fn choose_pin<'s>(
    mut rec: PodRecord,
    demand: &CardDemand,
    queue: &QueueName,
    snap: &'s Snapshot,
    now: jiff::Timestamp,
    constraints: &NodeConstraints<'_>,
) -> Result<(PodRecord, Option<Pin<'s>>), Decision> {
    let prefix = demand.resource.split('/').next().unwrap_or_default();
    let ours = |label: &str| label.split('/').next() == Some(prefix);
    let models = demand.alternatives.models();
    let products: BTreeSet<&str> = models.iter().map(product_of).collect();
    // Each label on its own: a pin on a model any label rules out is never placed.
    for (label, values) in rec.pinned.iter().filter(|(l, _)| ours(l)) {
        if !values.iter().any(|v| products.contains(v.as_str())) {
            let need = match values.as_slice() {
                [] => format!("no {label} label"),
                _ => format!("{label} in [{}]", short_list(values)),
            };
            return Err(Decision::deny(
                INVALID_DEMAND,
                format!(
                    "pod {} accepts {} but its node constraints require {need}",
                    rec.key, demand.alternatives
                ),
            ));
        }
    }
    if !rec.constraints_allow(models, ours).contains(&true) {
        let ruled_out: Vec<String> = rec
            .excluded
            .iter()
            .filter(|(l, _)| ours(l))
            .map(|(l, vs)| format!("{l} not in [{}]", short_list(vs)))
            .collect();
        return Err(Decision::deny(
            INVALID_DEMAND,
            format!(
                "pod {} accepts {} but its node constraints rule out each of them ({})",
                rec.key,
                demand.alternatives,
                ruled_out.join("; ")
            ),
        ));
    }
    // The pod as it would be charged: under the alternatives its demand was read with.
    let card_name = rec.card_name.replace(Ok(demand.alternatives.clone()));
    let Some(candidates) = rec.effective_alternatives() else {
        rec.card_name = card_name;
        return Ok((rec, None));
    };
    let touched = models_of([&demand.alternatives]);
    // A pod of a PodGroup with a card.request goes first to the models its group's
    // reservation still holds room on: it then draws on the reservation.
    let group = rec
        .group
        .as_ref()
        .map(|g| crate::cards::ObjectKey::new(rec.key.namespace.clone(), g.clone()))
        .and_then(|key| snap.group(&key).filter(|r| &r.queue == queue));
    let reserved: BTreeSet<CardName> = match group {
        Some(r) => r
            .live_request()
            .map(|req| reservation(req, &snap.group_members(&r.key, queue, now)))
            .unwrap_or_default()
            .into_iter()
            .flat_map(|(a, _)| a.models().to_vec())
            .collect(),
        None => BTreeSet::new(),
    };
    // A pod of a Job's pod set that runs on one model (a derived request resolved at
    // the enqueue, docs/decisions.md) goes only to the models its group's request names.
    let held = group.and_then(super::podgroup::held_to_models);
    let candidates = super::podgroup::narrowed(&candidates, held.as_ref());
    let models = candidates.models();
    // Reserved models first, then the others, each in `card.name` order.
    let order = models
        .iter()
        .filter(|m| reserved.contains(*m))
        .chain(models.iter().filter(|m| !reserved.contains(*m)));
    // One change, its pod re-pinned for each candidate in turn.
    let own_pins = rec.pinned.clone();
    // The models the pod may be pinned to (a node offers them and its constraints allow
    // one), whether they fit or not: what a refusal names. Models whose nodes the pod's
    // own constraints all rule out (a zone, a rack, a named node) are left out: pinned
    // there, it would wait for ever holding the queue's cards.
    let (mut offered, mut allowed) = (0, 0);
    let mut placeable: Vec<(CardName, &'s (String, String))> = Vec::new();
    for m in order {
        let Some(pin) = snap.pin_of(m) else {
            continue;
        };
        if constraints.any() {
            let (o, a) = snap.model_nodes_allowed(m, &demand.resource, constraints);
            offered += usize::from(o);
            allowed += usize::from(a);
            if !a {
                continue;
            }
        }
        placeable.push((m.clone(), pin));
    }
    // The pins this replica chose for pods admitted at the same moment, whose charges
    // are not recorded yet: the pod goes first where there is room beside them too, so
    // that a burst spreads over the models instead of all but one being refused at
    // `/validate`. Only an order of preference: when no model has room beside them,
    // the choice is as without them. A pod pinned already (its own label, or
    // `/validate` of the pod `/mutate` pinned), or one with a single model to go to, has
    // no choice to make.
    let in_flight = match placeable.len() > 1 && !own_pins.keys().any(|l| ours(l)) {
        true => snap.pins_in_flight().of(queue, now),
        false => Vec::new(),
    };
    let mut change = Change {
        add_pods: vec![rec],
        ..Default::default()
    };
    // The first model that fits without borrowing; else the first that fits by
    // borrowing from a card parent's pool.
    let pick = |change: &mut Change| {
        let mut borrowing = None;
        for (m, pin) in &placeable {
            let pod = &mut change.add_pods[0];
            pod.pinned.clone_from(&own_pins);
            pod.pinned.insert(pin.0.clone(), vec![pin.1.clone()]);
            let f = fit(snap, queue, change, &touched, now);
            if f.verdict == Verdict::Feasible {
                if !f.levels.borrows {
                    return Some((m.clone(), *pin));
                }
                borrowing = borrowing.or(Some((m.clone(), *pin)));
            }
        }
        borrowing
    };
    let mut chosen = None;
    if !in_flight.is_empty() {
        let (demands, pods) = beside(in_flight);
        change.extra = demands;
        change.add_pods.extend(pods);
        chosen = pick(&mut change);
        change.add_pods.truncate(1);
        change.extra.clear();
    }
    let chosen = chosen.or_else(|| pick(&mut change));
    let placeable: Vec<CardName> = placeable.into_iter().map(|(m, _)| m).collect();
    if offered > 0 && allowed == 0 {
        return Err(Decision::deny(
            INVALID_DEMAND,
            format!(
                "pod {} accepts {} but its node constraints ({}) allow no node of any of them",
                change.add_pods[0].key,
                demand.alternatives,
                constraints.describe()
            ),
        ));
    }
    // Not pinned, a card pod could bind on any node of its resource, with only the
    // Ignore binding hook behind it: every admitted card pod is pinned to a model that
    // fits (or refused), so the charge at CREATE stays the line. Under warn (the quota
    // lifted) it is admitted unpinned, with the warning of the refusal.
    if chosen.is_none() && !snap.quota_lifted(queue) {
        let mut pod = change.add_pods.swap_remove(0);
        pod.pinned = own_pins;
        return Err(unplaceable(&pod, demand, queue, snap, now, placeable));
    }
    if let Some((_, pin)) = &chosen {
        let pod = &mut change.add_pods[0];
        pod.pinned.clone_from(&own_pins);
        pod.pinned.insert(pin.0.clone(), vec![pin.1.clone()]);
    }
    let mut rec = change.add_pods.swap_remove(0);
    rec.card_name = card_name;
    if chosen.is_none() {
        rec.pinned = own_pins;
    }
    Ok((rec, chosen))
}
