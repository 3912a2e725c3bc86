//! `warn` enforcement. A request that a `warn` queue's quota would refuse or clamp is
//! decided again with that quota unlimited, and admitted as that second decision says
//! (the same patch, the same charge: usage stays exact and may pass the quota), with a
//! warning, an Event and a metric that say what `deny` would have done.

use super::messages::{cap, Reason};
use super::{decide, Config, Decision, Enforcement, EventIntent, ObjectRef, RequestKind};
use crate::cards::annotations::ENFORCEMENT;
use crate::cards::QueueName;
use crate::snapshot::Snapshot;

use super::review::{AdmissionRequest, Operation};

/// The Event reason of a request admitted in `warn` that `deny` would have refused.
pub const WOULD_REFUSE: &str = "CardQuotaWouldRefuse";

/// True when nothing a pod of `namespace` does in `queue` is enforced: the queue and
/// every queue above it are in warn, and the namespace is not held to deny. Only then
/// is the pod left unpinned and its binding free to take any model (a deny level above
/// relies on both).
pub fn observed_only(snap: &Snapshot, cfg: &Config, namespace: &str, queue: &QueueName) -> bool {
    cfg.namespace_mode(namespace) != Some(Enforcement::Deny)
        && std::iter::once(queue.clone())
            .chain(snap.ancestors_of(queue))
            .all(|q| snap.enforcement_of(&q, cfg.enforcement) == Enforcement::Warn)
}

/// Decides `req`, admitting under `warn` what only a `warn` queue's quota refuses.
/// Requests that fit, and every refusal that is not about a quota, cost one decision.
pub fn decide_enforcing(
    req: &AdmissionRequest,
    snap: &mut Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    let d = decide(req, snap, cfg, now);
    if d.reason == Some(Reason::CardModelNotAccepted)
        && matches!(
            RequestKind::of(req),
            RequestKind::Binding | RequestKind::Allocation
        )
    {
        return unsteered_binding(req, snap, cfg, now, d);
    }
    if !refused_by_quota(req, &d) {
        return d;
    }
    // A namespace may only tighten: one in deny is refused whatever its queue says, and
    // one in warn cannot loosen a queue in deny (one tenant's rollout never breaches
    // another's quota).
    if cfg.namespace_mode(req.ns()) == Some(Enforcement::Deny) {
        return d;
    }
    let default = cfg.enforcement;
    if !snap.any_warn(default) {
        return d;
    }
    let relaxed = snap.lifted(default, |s| decide(req, s, cfg, now));
    // Still refused (or clamped) with the `warn` queues lifted: a `deny` queue's quota,
    // or something else, refuses it.
    if !relaxed.allowed || relaxed.reason.is_some() {
        return d;
    }
    let why = match relaxed.charge.as_ref().map(|c| &c.queue) {
        Some(q) => {
            let source = match snap.queue(q).map(|r| &r.enforcement) {
                Some(Ok(Some(_))) => format!("its {ENFORCEMENT} annotation"),
                _ => "the install's default".to_string(),
            };
            format!("queue {q}'s enforcement is warn ({source})")
        }
        None => "the queue's enforcement is warn".to_string(),
    };
    warned(relaxed, d, created_pod(req), &why)
}

/// A binding or allocation onto a model its pod does not accept: under warn nothing
/// pinned the pod, so the scheduler's choice stands, charged by the node's (or the
/// devices') model (and past a quota only as far as warn lets anything), with what deny
/// would have said.
fn unsteered_binding(
    req: &AdmissionRequest,
    snap: &mut Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
    refused: Decision,
) -> Decision {
    if !snap.any_warn(cfg.enforcement) || cfg.namespace_mode(req.ns()) == Some(Enforcement::Deny) {
        return refused;
    }
    let any = Config {
        any_model: true,
        ..cfg.clone()
    };
    let mut relaxed = decide(req, snap, &any, now);
    if refused_by_quota(req, &relaxed) && snap.any_warn(cfg.enforcement) {
        relaxed = snap.lifted(cfg.enforcement, |s| decide(req, s, &any, now));
    }
    let Some(queue) = relaxed.charge.as_ref().map(|c| c.queue.clone()) else {
        return refused;
    };
    if !relaxed.allowed || relaxed.reason.is_some() || !observed_only(snap, cfg, req.ns(), &queue) {
        return refused;
    }
    let why = format!("queue {queue} and every queue above it are in warn, which pins nothing");
    warned(relaxed, refused, None, &why)
}

/// The pod a CREATE makes, when its name is known: an admitted pod will exist, so the
/// Event belongs on it (`kubectl describe pod`), not on its owner.
fn created_pod(req: &AdmissionRequest) -> Option<ObjectRef> {
    if RequestKind::of(req) != RequestKind::Pod || req.operation != Operation::Create {
        return None;
    }
    let obj = req.object.as_ref()?.tree();
    let name = req.object_name(obj);
    if name.is_empty() {
        return None;
    }
    Some(ObjectRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some(req.ns().to_string()),
        name,
        uid: obj
            .pointer("/metadata/uid")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    })
}

/// An admission in warn's Event message: what deny would have said.
pub(super) fn would_refuse_message(said: &str) -> String {
    cap(format!("admitted in warn mode; under deny: {said}"))
}

/// The Warning Event of an admission in warn, on `regarding` (`kubectl describe`).
pub(super) fn would_refuse_event(regarding: ObjectRef, message: String) -> Box<EventIntent> {
    Box::new(EventIntent {
        regarding,
        reason: WOULD_REFUSE,
        message,
        warning: true,
        also: None,
    })
}

/// True for a refusal, or a clamp, that a quota makes: what `warn` admits instead.
pub fn refused_by_quota(req: &AdmissionRequest, d: &Decision) -> bool {
    match d.reason {
        Some(Reason::InsufficientCardQuota) => true,
        // A broken quota refuses a queue's charges; on the Queue itself it is the
        // admin's typo, refused whatever the enforcement.
        Some(Reason::InvalidCardQuota) => !d.allowed && RequestKind::of(req) != RequestKind::Queue,
        _ => false,
    }
}

/// `admitted`, saying what `refused` says.
fn warned(
    mut admitted: Decision,
    refused: Decision,
    pod: Option<ObjectRef>,
    why: &str,
) -> Decision {
    let said = refused
        .message
        .clone()
        .or_else(|| refused.event.as_ref().map(|e| e.message.clone()))
        .unwrap_or_default();
    // First: what deny would have done matters more than where it would have pinned.
    admitted.warnings.insert(
        0,
        cap(format!(
            "card-quota admitted this because {why}; under deny: {said}"
        )),
    );
    // Where deny would have pinned the pod goes into the Event too.
    let pin = admitted
        .warnings
        .iter()
        .find_map(|w| w.strip_prefix(super::pod::NOT_PINNED))
        .and_then(|w| w.strip_prefix("; under deny it would pin this one to "))
        .map(|w| format!("; deny would have pinned it to {w}"))
        .unwrap_or_default();
    let message = would_refuse_message(&format!("{said}{pin}"));
    admitted.event = match (pod, refused.event) {
        (Some(regarding), _) => Some(would_refuse_event(regarding, message)),
        (None, Some(e)) => Some(Box::new(EventIntent {
            reason: WOULD_REFUSE,
            message,
            ..*e
        })),
        (None, None) => None,
    };
    admitted.would_refuse = refused.reason;
    admitted
}
