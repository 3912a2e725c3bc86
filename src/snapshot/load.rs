//! Filling a snapshot from real Kubernetes objects (YAML/JSON streams, `kind: List`).

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use serde_json::Value;

use crate::cards::{ObjectKey, QueueName};

use crate::cluster::records::{
    job_record, namespace_record, node_record, pod_record, podgroup_record, queue_record,
    workload_record, RecordError,
};
use crate::cluster::WorkloadKind;
use crate::ledger::record::{is_ledger, ledger_record};

use super::Snapshot;

/// Why an input stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("document {index}: not valid YAML/JSON: {message}")]
    Syntax { index: usize, message: String },
}

/// Splits a YAML (or JSON) stream into documents, expanding `kind: List`.
pub fn documents(text: &str) -> Result<Vec<Value>, LoadError> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for (index, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(doc).map_err(|e| LoadError::Syntax {
            index: index + 1,
            message: e.to_string(),
        })?;
        if v.is_null() {
            continue;
        }
        expand(v, &mut out);
    }
    Ok(out)
}

fn expand(v: Value, out: &mut Vec<Value>) {
    let is_list = v
        .get("kind")
        .and_then(Value::as_str)
        .map(|k| k == "List" || k.ends_with("List"))
        .unwrap_or(false);
    match (is_list, v.get("items").and_then(Value::as_array)) {
        (true, Some(items)) => {
            for i in items.clone() {
                expand(i, out);
            }
        }
        _ => out.push(v),
    }
}

/// `v` read as the typed Kubernetes object of `kind`.
fn decode<T: serde::de::DeserializeOwned>(v: &Value, kind: &'static str) -> Result<T, RecordError> {
    serde::Deserialize::deserialize(v).map_err(|source| RecordError::Decode { kind, source })
}

/// Adds or replaces one object. Returns the kind it was stored as, or an error that
/// names the object and what is wrong; kinds card-quota does not read are `Ok(None)`.
pub fn upsert(snap: &mut Snapshot, v: &Value) -> Result<Option<&'static str>, RecordError> {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    let seq = snap.next_seq();
    match kind {
        "Node" => {
            let n: Node = decode(v, "Node")?;
            let (name, cards) = node_record(&n)?;
            for p in &cards.problems {
                tracing::warn!("{p}");
            }
            snap.upsert_node(name, cards);
            Ok(Some("Node"))
        }
        "Queue" => {
            snap.upsert_queue(queue_record(v)?);
            Ok(Some("Queue"))
        }
        "ConfigMap" => {
            let cm: ConfigMap = decode(v, "ConfigMap")?;
            if !is_ledger(&cm.metadata) {
                return Ok(None);
            }
            snap.upsert_ledger(ledger_record(&cm)?);
            Ok(Some("ConfigMap"))
        }
        "Namespace" => {
            let ns: Namespace = decode(v, "Namespace")?;
            let (name, queue) = namespace_record(&ns.metadata)?;
            snap.set_namespace_queue(&name, queue);
            Ok(Some("Namespace"))
        }
        "PodGroup" => {
            snap.upsert_group(podgroup_record(v, "default", seq)?);
            Ok(Some("PodGroup"))
        }
        k if super::dra::DRA_KINDS.contains(&k) => {
            snap.store_dra(v, "default")?;
            Ok(Some(
                super::dra::DRA_KINDS
                    .iter()
                    .find(|d| **d == k)
                    .copied()
                    .unwrap_or("DRA"),
            ))
        }
        "Pod" => {
            let p: Pod = decode(v, "Pod")?;
            let cards = snap.card_resources().clone();
            snap.upsert_pod(pod_record(&p, "default", &cards, seq)?);
            Ok(Some("Pod"))
        }
        "Job" if is_volcano_job(v) => {
            let cards = snap.card_resources().clone();
            snap.upsert_job(job_record(v, "default", &cards, seq)?);
            Ok(Some("Job"))
        }
        other => match WorkloadKind::from_kind(other) {
            Some(k) => {
                let cards = snap.card_resources().clone();
                snap.upsert_workload(workload_record(k, v, "default", &cards, seq)?);
                Ok(Some(k.kind()))
            }
            None => Ok(None),
        },
    }
}

/// True for a Volcano Job (`batch.volcano.sh`), not a Kubernetes `batch/v1` Job.
fn is_volcano_job(v: &Value) -> bool {
    v.get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|a| a.starts_with("batch.volcano.sh/"))
}

/// Removes one object by kind and key.
pub fn remove(snap: &mut Snapshot, kind: &str, namespace: &str, name: &str) {
    let key = ObjectKey::new(namespace, name);
    if snap.remove_dra(kind, &key) {
        return;
    }
    match kind {
        "Node" => snap.remove_node(name),
        "Queue" => snap.remove_queue(&QueueName::new(name)),
        "PodGroup" => snap.delete_group(&key),
        "Pod" => snap.delete_pod(&key),
        "Job" => snap.remove_job(&key),
        other => {
            if let Some(k) = WorkloadKind::from_kind(other) {
                snap.remove_workload(k, &key);
            }
        }
    }
}

/// Loads a whole stream. Nodes go first so pods see every card vendor prefix.
/// Returns the snapshot and one line per object that was skipped, and why.
pub fn load(text: &str) -> Result<(Snapshot, Vec<String>), LoadError> {
    load_with(text, &crate::cards::CardResources::default())
}

/// [`load`] with the install's card resources (`--card-resource`).
pub fn load_with(
    text: &str,
    cards: &crate::cards::CardResources,
) -> Result<(Snapshot, Vec<String>), LoadError> {
    let docs = documents(text)?;
    let mut snap = Snapshot::new();
    snap.set_card_resources(cards.clone());
    let mut skipped = Vec::new();
    let rank = |v: &Value| match v.get("kind").and_then(Value::as_str) {
        Some("Node") => 0,
        Some("Queue") => 1,
        Some("PodGroup") => 2,
        _ => 3,
    };
    let mut ordered: Vec<&Value> = docs.iter().collect();
    ordered.sort_by_key(|v| rank(v));
    for v in ordered {
        let what = describe(v);
        match upsert(&mut snap, v) {
            Ok(Some(_)) => {}
            Ok(None) => skipped.push(format!("{what}: kind not read by card-quota, skipped")),
            Err(e) => skipped.push(format!("{what}: {e}")),
        }
    }
    Ok((snap, skipped))
}

/// `Kind namespace/name` for messages.
pub fn describe(v: &Value) -> String {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("<no kind>");
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<no name>");
    match v.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}
