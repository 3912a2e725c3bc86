//! The webhook without the network: decide an AdmissionReview against a snapshot and,
//! when admitted, apply its effect the way the API server would. `replay`, `demo` and
//! `serve --offline` all go through here.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cards::ObjectKey;
use crate::cluster::WorkloadKind;
use crate::decide::review::{
    encode_patch, parse_review, AdmissionRequest, AdmissionResponse, ReviewOut, Status,
};
use crate::decide::{decide, Config, Decision, RequestKind};
use crate::ledger::{Effect, Row, UsageKey};
use crate::snapshot::load;
use crate::snapshot::Snapshot;

/// Builds the AdmissionResponse of a decision. `with_patch` is false on `/validate`.
pub fn response(uid: &str, d: &Decision, with_patch: bool) -> AdmissionResponse {
    let patch = (with_patch && d.allowed && !d.patch.is_empty()).then(|| encode_patch(&d.patch));
    AdmissionResponse {
        uid: uid.to_string(),
        allowed: d.allowed,
        status: (!d.allowed).then(|| Status {
            code: 403,
            message: d.message.clone().unwrap_or_else(|| "denied".to_string()),
            reason: d.reason.map(|r| r.as_str().to_string()),
        }),
        patch_type: patch.as_ref().map(|_| "JSONPatch".to_string()),
        patch,
        warnings: d.warnings.clone(),
    }
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
    snap: &Snapshot,
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
            let d = decide(&req, snap, cfg, now);
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
        RequestKind::Workload(k) => k.kind(),
        RequestKind::Binding => return bind(snap, req, d),
        RequestKind::Scale(k) => return scale(snap, req, d, k),
        RequestKind::Other => return Ok(()),
    };
    if req.operation == "DELETE" {
        load::remove(snap, kind_name, req.ns(), &name);
        return Ok(());
    }
    if req.operation != "CREATE" && req.operation != "UPDATE" {
        return Ok(());
    }
    // A charged pod's decision already holds the pod as admitted (patch included): it
    // is the record stored, as live mode lays it over the caches. Only a pod still
    // without a name goes through its object, to get the name the API server would give.
    if let Some(Effect::Pod(p)) = d.charge.as_ref().map(|c| &c.effect) {
        if !p.key.name.is_empty() {
            // The same two numbers the object path takes (a generated name, the record).
            snap.next_seq();
            let mut p = (**p).clone();
            p.seq = snap.next_seq();
            snap.upsert_pod(p);
            return Ok(());
        }
    }
    apply_object(snap, req, d, kind_name)
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
    if req.operation != "CREATE" {
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
    if req.operation != "UPDATE" {
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
        let rows = u.rows();
        let annotated = snap.queue(&q).map(|r| r.quota.is_some()).unwrap_or(false);
        if annotated || rows.values().any(|r| !r.in_use().is_zero()) {
            out.insert(q.to_string(), rows);
        }
    }
    out
}

/// The usage table for people.
pub fn usage_table(report: &BTreeMap<String, BTreeMap<UsageKey, Row>>) -> String {
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
            let composite = !m.is_model();
            let free = if composite {
                "-".to_string()
            } else if r.free() < 0 {
                format!("{} OVER", r.free())
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
    let widths: Vec<usize> = (0..7)
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for l in &lines {
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
        let (mut shortcut, mut object) = (base.clone(), base);
        let cfg = Config::default();
        let now = jiff::Timestamp::now();
        for r in reviews {
            let req = parse_review(&r.build()).unwrap();
            let d = decide(&req, &shortcut, &cfg, now);
            assert!(d.allowed && d.charge.is_some(), "{:?}", d.message);
            assert!(!d.patch.is_empty());
            apply(&mut shortcut, &req, &d).unwrap();
            apply_object(&mut object, &req, &d, "Pod").unwrap();
            let key = ObjectKey::new("research", req.name.clone().unwrap());
            assert_eq!(shortcut.pod(&key), object.pod(&key), "{key}");
            assert!(shortcut.pod(&key).is_some());
        }
        assert_eq!(usage_report(&shortcut, now), usage_report(&object, now));
    }
}
