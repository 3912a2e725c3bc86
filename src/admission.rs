//! The webhook without the network: decide an AdmissionReview against a snapshot and,
//! when admitted, apply its effect the way the API server would. `replay`, `demo` and
//! `serve --offline` all go through here.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cards::{Cards, ObjectKey, QueueName};
use crate::cluster::{PodRecord, WorkloadKind};
use crate::decide::enforcement::decide_enforcing;
use crate::decide::review::{
    encode_patch, parse_review, AdmissionRequest, AdmissionResponse, Operation, ReviewOut, Status,
};
use crate::decide::{Config, Decision, RequestKind};
use crate::ledger::{Effect, Row, UsageKey};
use crate::snapshot::load;
use crate::snapshot::Snapshot;

/// Builds the AdmissionResponse of a decision. `with_patch` is false on `/validate`.
pub fn response(uid: &str, d: &Decision, with_patch: bool) -> AdmissionResponse {
    let patch = (with_patch && d.allowed && !d.patch.is_empty()).then(|| encode_patch(&d.patch));
    AdmissionResponse {
        uid: uid.to_string(),
        allowed: d.allowed,
        status: (!d.allowed).then(|| status_of(d)),
        patch_type: patch.as_ref().map(|_| "JSONPatch".to_string()),
        patch,
        warnings: d.warnings.clone(),
    }
}

/// The `status` of a denial.
fn status_of(d: &Decision) -> Status {
    Status {
        code: 403,
        message: d.message.clone().unwrap_or_else(|| "denied".to_string()),
        reason: d.reason.map(|r| r.as_str().to_string()),
    }
}

/// The whole AdmissionReview answer of a decision: the bytes of
/// `encode_answer(&response(uid, d, with_patch))`, written straight into one buffer
/// (the webhook's hot path). The patch goes from its JSON to base64 in place: no
/// intermediate string, and no second pass escaping base64, which needs none.
pub fn encode_response(uid: &str, d: &Decision, with_patch: bool) -> serde_json::Result<Vec<u8>> {
    use base64::Engine;
    let patch = match with_patch && d.allowed && !d.patch.is_empty() {
        true => Some(serde_json::to_vec(&d.patch).unwrap_or_else(|_| b"[]".to_vec())),
        false => None,
    };
    let encoded = patch
        .as_ref()
        .map_or(0, |p| base64::encoded_len(p.len(), true).unwrap_or(0));
    let message = d.message.as_ref().map_or(0, String::len);
    let warnings: usize = d.warnings.iter().map(|w| w.len() + 4).sum();
    let mut buf = Vec::with_capacity(192 + uid.len() + encoded + message + warnings);
    buf.extend_from_slice(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#,
    );
    serde_json::to_writer(&mut buf, uid)?;
    buf.extend_from_slice(match d.allowed {
        true => br#","allowed":true"#.as_slice(),
        false => br#","allowed":false"#.as_slice(),
    });
    if !d.allowed {
        buf.extend_from_slice(br#","status":"#);
        serde_json::to_writer(&mut buf, &status_of(d))?;
    }
    if let Some(patch) = &patch {
        buf.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
        let start = buf.len();
        buf.resize(start + encoded, 0);
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(patch, &mut buf[start..])
            .map_err(|e| serde_json::Error::io(std::io::Error::other(e)))?;
        buf.truncate(start + written);
        buf.push(b'"');
    }
    if !d.warnings.is_empty() {
        buf.extend_from_slice(br#","warnings":"#);
        serde_json::to_writer(&mut buf, &d.warnings)?;
    }
    buf.extend_from_slice(b"}}");
    Ok(buf)
}

/// A denial for a body that is not a usable AdmissionReview.
pub fn bad_review(uid: &str, message: String) -> AdmissionResponse {
    AdmissionResponse {
        uid: uid.to_string(),
        allowed: false,
        status: Some(Status {
            code: 400,
            message,
            reason: Some(crate::decide::messages::BAD_REQUEST.as_str().to_string()),
        }),
        patch_type: None,
        patch: None,
        warnings: Vec::new(),
    }
}

/// The outcome of one review: the request (when it parsed), the decision and the answer.
pub struct Reviewed {
    pub request: Option<AdmissionRequest>,
    pub decision: Option<Decision>,
    pub out: ReviewOut,
}

/// Decides one AdmissionReview document.
pub fn review(
    doc: &Value,
    snap: &mut Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
    with_patch: bool,
) -> Reviewed {
    let uid = doc
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match parse_review(doc) {
        Ok(req) => {
            let d = decide_enforcing(&req, snap, cfg, now);
            let d = if with_patch { d } else { d.validated() };
            let out = ReviewOut::new(response(&req.uid, &d, with_patch));
            Reviewed {
                request: Some(req),
                decision: Some(d),
                out,
            }
        }
        Err(e) => Reviewed {
            request: None,
            decision: None,
            out: ReviewOut::new(bad_review(&uid, e.to_string())),
        },
    }
}

fn patched(obj: &Value, d: &Decision) -> Value {
    let mut o = obj.clone();
    if !d.patch.is_empty() {
        if let Err(e) = json_patch::patch(&mut o, &d.patch) {
            tracing::warn!("could not apply own patch: {e}");
        }
    }
    o
}

fn with_defaults(mut o: Value, req: &AdmissionRequest, kind: &str, seq: u64) -> Value {
    if let Some(m) = o.as_object_mut() {
        m.entry("kind")
            .or_insert_with(|| Value::String(kind.to_string()));
        let meta = m
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(meta) = meta.as_object_mut() {
            if !req.ns().is_empty() {
                meta.entry("namespace")
                    .or_insert_with(|| Value::String(req.ns().to_string()));
            }
            let has_name = meta
                .get("name")
                .and_then(Value::as_str)
                .map(|n| !n.is_empty())
                .unwrap_or(false);
            if !has_name {
                let name = match (&req.name, meta.get("generateName").and_then(Value::as_str)) {
                    (Some(n), _) if !n.is_empty() => n.clone(),
                    (_, Some(g)) => format!("{g}{seq:05}"),
                    _ => format!("unnamed-{seq:05}"),
                };
                meta.insert("name".into(), Value::String(name));
            }
        }
    }
    o
}

/// Why an admitted request's effect could not be applied to the snapshot.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Object(#[from] crate::cluster::records::RecordError),
    #[error("binding of unknown pod {0} not applied")]
    UnknownPod(ObjectKey),
    #[error("scale of unknown {kind} {key} not applied")]
    UnknownWorkload { kind: &'static str, key: ObjectKey },
}

/// Applies an admitted request's effect to the snapshot, as the API server would.
pub fn apply(snap: &mut Snapshot, req: &AdmissionRequest, d: &Decision) -> Result<(), ApplyError> {
    if !d.allowed || req.is_dry_run() {
        return Ok(());
    }
    let name = req.name.clone().unwrap_or_default();
    let kind_name = match RequestKind::of(req) {
        RequestKind::Queue => "Queue",
        RequestKind::PodGroup => "PodGroup",
        RequestKind::Pod => "Pod",
        RequestKind::Job => "Job",
        // A status write stores the claim as it now reads, as a watch would bring it.
        RequestKind::Claim | RequestKind::Allocation => "ResourceClaim",
        RequestKind::Workload(k) => k.kind(),
        RequestKind::Binding => return bind(snap, req, d),
        RequestKind::Scale(k) => return scale(snap, req, d, k),
        RequestKind::Other => return Ok(()),
    };
    if req.operation == Operation::Delete {
        load::remove(snap, kind_name, req.ns(), &name);
        return Ok(());
    }
    if !req.operation.writes() {
        return Ok(());
    }
    if let Some(p) = admitted_record(req, d) {
        store_admitted(snap, p.clone());
        return Ok(());
    }
    apply_object(snap, req, d, kind_name)
}

/// The pod record an admitted pod write stores as it is. A charged pod's decision
/// already holds the pod as admitted (patch included), as live mode lays it over the
/// caches; only a pod still without a name goes through its object, to get the name
/// the API server would give.
fn admitted_record<'d>(req: &AdmissionRequest, d: &'d Decision) -> Option<&'d PodRecord> {
    if !d.allowed
        || req.is_dry_run()
        || RequestKind::of(req) != RequestKind::Pod
        || !req.operation.writes()
    {
        return None;
    }
    match d.charge.as_ref().map(|c| &c.effect) {
        Some(Effect::Pod(p)) if !p.key.name.is_empty() => Some(p),
        _ => None,
    }
}

/// [`apply`], moving an admitted pod's record out of the decision instead of copying
/// it (the offline webhook, which answers without the charge).
pub fn apply_spending(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    d: &mut Decision,
) -> Result<(), ApplyError> {
    if admitted_record(req, d).is_some() {
        if let Some(Effect::Pod(p)) = d.charge.take().map(|c| c.effect) {
            store_admitted(snap, *p);
            return Ok(());
        }
    }
    apply(snap, req, d)
}

/// Stores an admitted pod's record, numbered as the object path numbers it.
fn store_admitted(snap: &mut Snapshot, mut p: PodRecord) {
    // The same two numbers the object path takes (a generated name, the record).
    snap.next_seq();
    p.seq = snap.next_seq();
    snap.upsert_pod(p);
}

/// Stores the request's object, patched and defaulted, as the API server would.
fn apply_object(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    d: &Decision,
    kind_name: &str,
) -> Result<(), ApplyError> {
    let Some(obj) = req.object.as_ref() else {
        return Ok(());
    };
    let seq = snap.next_seq();
    let o = with_defaults(patched(obj.tree(), d), req, kind_name, seq);
    load::upsert(snap, &o)?;
    Ok(())
}

fn bind(snap: &mut Snapshot, req: &AdmissionRequest, d: &Decision) -> Result<(), ApplyError> {
    if req.operation != Operation::Create {
        return Ok(());
    }
    let Some(obj) = req.object.as_ref() else {
        return Ok(());
    };
    let b = patched(obj.tree(), d);
    let name = req.object_name(&b);
    let key = ObjectKey::new(req.ns(), name);
    let node = b
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(mut pod) = snap.pod(&key).cloned() else {
        return if snap.is_known_cardless_pod(&key) {
            Ok(())
        } else {
            Err(ApplyError::UnknownPod(key))
        };
    };
    pod.node = Some(node);
    let anns: BTreeMap<String, String> = b
        .pointer("/metadata/annotations")
        .and_then(|a| serde::Deserialize::deserialize(a).ok())
        .unwrap_or_default();
    if let Some(c) = anns.get(crate::cards::annotations::CHARGED) {
        pod.charged = crate::cards::CardName::parse(c).ok();
    }
    snap.upsert_pod(pod);
    Ok(())
}

fn scale(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    d: &Decision,
    kind: WorkloadKind,
) -> Result<(), ApplyError> {
    if req.operation != Operation::Update {
        return Ok(());
    }
    let Some(obj) = req.object.as_ref() else {
        return Ok(());
    };
    let s = patched(obj.tree(), d);
    let key = ObjectKey::new(req.ns(), req.name.clone().unwrap_or_default());
    let Some(r) = s.pointer("/spec/replicas").and_then(Value::as_i64) else {
        return Ok(());
    };
    match snap.workload(kind, &key).cloned() {
        Some(mut w) => {
            w.replicas = i32::try_from(r).unwrap_or(i32::MAX);
            snap.upsert_workload(w);
            Ok(())
        }
        None => Err(ApplyError::UnknownWorkload {
            kind: kind.lower(),
            key,
        }),
    }
}

/// Usage of every queue with a quota annotation or any usage, per model / composite key.
pub fn usage_report(
    snap: &Snapshot,
    now: jiff::Timestamp,
) -> BTreeMap<String, BTreeMap<UsageKey, Row>> {
    let mut out = BTreeMap::new();
    for q in snap.queue_names() {
        let u = crate::decide::fit::usage_of(snap, &q, now);
        for p in u.problems.values() {
            tracing::warn!("queue {}: {}", q.as_str().escape_debug(), p.escape_debug());
        }
        let rows = crate::decide::tree::queue_rows(snap, &q, now);
        let annotated = snap.queue(&q).map(|r| r.quota.is_some()).unwrap_or(false);
        if annotated || rows.values().any(|r| !r.in_use().is_zero()) {
            out.insert(q.to_string(), rows);
        }
    }
    out
}

/// How many more cards of each model each leaf queue with a quota would be admitted
/// now ([`crate::decide::room`]), by queue and model: what the tables show as FREE.
pub fn rooms(
    snap: &Snapshot,
    report: &BTreeMap<String, BTreeMap<UsageKey, Row>>,
    now: jiff::Timestamp,
) -> BTreeMap<(String, UsageKey), Cards> {
    let mut out = BTreeMap::new();
    for (q, rows) in report {
        let queue = QueueName::new(q.clone());
        let annotated = snap.queue(&queue).is_some_and(|r| r.quota.is_some());
        if !annotated || snap.has_children(&queue) {
            continue;
        }
        for (k, r) in rows {
            let UsageKey::Model(m) = k else { continue };
            let upper = Cards::from_u128(u128::try_from(r.free().max(0)).unwrap_or(0));
            out.insert(
                (q.clone(), k.clone()),
                crate::decide::room::room(snap, &queue, m, upper, now),
            );
        }
    }
    out
}

/// The usage table for people; FREE from `rooms` where it has the row (else quota and
/// borrow less usage).
pub fn usage_table(
    report: &BTreeMap<String, BTreeMap<UsageKey, Row>>,
    rooms: &BTreeMap<(String, UsageKey), Cards>,
) -> String {
    let mut lines = vec![[
        "QUEUE".to_string(),
        "MODEL".into(),
        "QUOTA".into(),
        "ALLOCATED".into(),
        "PENDING".into(),
        "RESERVED".into(),
        "FREE".into(),
    ]];
    for (q, rows) in report {
        for (m, r) in rows {
            let composite = !m.has_quota();
            let free = if composite {
                "-".to_string()
            } else if r.free() < 0 {
                format!("{} OVER", r.free())
            } else if let Some(room) = rooms.get(&(q.clone(), m.clone())) {
                room.to_string()
            } else {
                r.free().to_string()
            };
            lines.push([
                q.clone(),
                m.to_string(),
                if composite {
                    "-".into()
                } else {
                    r.quota.to_string()
                },
                r.allocated.to_string(),
                r.pending.to_string(),
                r.reserved.to_string(),
                free,
            ]);
        }
    }
    padded(&lines)
}

/// Rows of cells as text: each column padded to its widest cell, two spaces apart.
pub fn padded<const N: usize>(lines: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for l in lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        s.push_str(cells.join("  ").trim_end());
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::review::ReviewBuilder as R;
    use serde_json::json;

    const SNAP: &str = include_str!("cli/demo/snapshot.yaml");

    fn pod(name: &str, annotations: Value, spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "research", "uid": format!("u-{name}"),
                "annotations": annotations},
            "spec": spec})
    }

    /// The hot path's answer is byte for byte the answer built as an AdmissionResponse:
    /// admitted with and without a patch, refused with a message that needs escaping,
    /// and with warnings.
    #[test]
    fn a_decision_encoded_directly_reads_as_its_response() {
        use crate::decide::messages::INSUFFICIENT;
        use crate::decide::review::encode_answer;
        let mut patched = Decision::allow().with_warning("a \"quoted\" warning\n");
        patched.patch = crate::decide::patch::annotations_at(
            crate::decide::patch::AnnotationsAt::NoMetadata,
            vec![("volcano.sh/card.queue", "q/ü\u{1}".to_string())],
        );
        assert!(!patched.patch.is_empty());
        let decisions = [
            Decision::allow(),
            patched,
            Decision::deny(INSUFFICIENT, "queue \"q\" is full\t<tab>"),
            Decision::deny(INSUFFICIENT, "x")
                .with_warning("w1")
                .with_warning("w2"),
            Decision {
                allowed: false,
                ..Default::default()
            },
        ];
        for d in &decisions {
            for with_patch in [true, false] {
                for uid in ["", "u-1", "weird \"uid\"\\"] {
                    let direct = encode_response(uid, d, with_patch).unwrap();
                    let built = encode_answer(&response(uid, d, with_patch)).unwrap();
                    assert_eq!(
                        String::from_utf8_lossy(&direct),
                        String::from_utf8_lossy(&built),
                        "{d:?} with_patch={with_patch}"
                    );
                }
            }
        }
    }

    /// Storing a charged pod's record (the shortcut) must leave the snapshot exactly as
    /// storing its patched object would.
    #[test]
    fn a_charged_pod_is_stored_as_its_patched_object_would_be() {
        let (base, _) = load::load(SNAP).unwrap();
        let gpu = |n: &str| json!({"limits": {"nvidia.com/gpu": n}});
        let q = "scheduling.volcano.sh/queue-name";
        let reviews = [
            // Named model: stamp and pin.
            R::pod(
                "CREATE",
                pod(
                    "named",
                    json!({q: "research", "volcano.sh/card.name": "NVIDIA-H200"}),
                    json!({"schedulerName": "volcano", "containers": [{"name": "c", "image": "x", "resources": gpu("1")}]}),
                ),
            ),
            // Alternatives: the first with room is pinned.
            R::pod(
                "CREATE",
                pod(
                    "alts",
                    json!({q: "research", "volcano.sh/card.name": "NVIDIA-GeForce-RTX-4090|NVIDIA-H200"}),
                    json!({"schedulerName": "volcano", "containers": [{"name": "c", "image": "x", "resources": gpu("2")}]}),
                ),
            ),
            // Model inferred from a nodeSelector on the product label.
            R::pod(
                "CREATE",
                pod(
                    "inferred",
                    json!({q: "research"}),
                    json!({"schedulerName": "volcano", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                    "containers": [{"name": "c", "image": "x", "resources": gpu("1")}]}),
                ),
            ),
            // Created on its node: charged the node's model.
            R::pod(
                "CREATE",
                pod(
                    "bound",
                    json!({q: "research", "volcano.sh/card.name": "NVIDIA-H200"}),
                    json!({"schedulerName": "volcano", "nodeName": "h200-a",
                    "containers": [{"name": "c", "image": "x", "resources": gpu("1")}]}),
                ),
            ),
            // MIG slices.
            R::pod(
                "CREATE",
                pod(
                    "mig",
                    json!({q: "research", "volcano.sh/card.name": "NVIDIA-H200/mig-1g.18gb-mixed"}),
                    json!({"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
                    "resources": {"limits": {"nvidia.com/mig-1g.18gb": "2"}}}]}),
                ),
            ),
        ];
        let (mut shortcut, mut spent, mut object) = (base.clone(), base.clone(), base);
        let cfg = Config::default();
        let now = jiff::Timestamp::now();
        for r in reviews {
            let req = parse_review(&r.build()).unwrap();
            let d = crate::decide::decide(&req, &shortcut, &cfg, now);
            assert!(d.allowed && d.charge.is_some(), "{:?}", d.message);
            assert!(!d.patch.is_empty());
            apply(&mut shortcut, &req, &d).unwrap();
            let mut taken = d.clone();
            apply_spending(&mut spent, &req, &mut taken).unwrap();
            assert!(taken.charge.is_none(), "the record was moved, not copied");
            apply_object(&mut object, &req, &d, "Pod").unwrap();
            let key = ObjectKey::new("research", req.name.clone().unwrap());
            assert_eq!(shortcut.pod(&key), object.pod(&key), "{key}");
            assert_eq!(spent.pod(&key), object.pod(&key), "{key}");
            assert!(shortcut.pod(&key).is_some());
        }
        assert_eq!(usage_report(&shortcut, now), usage_report(&object, now));
        assert_eq!(usage_report(&spent, now), usage_report(&object, now));
    }
}
