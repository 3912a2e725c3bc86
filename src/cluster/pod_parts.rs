//! The parts of a Pod that card-quota reads, read from JSON text. An API server sends
//! the whole pod in each AdmissionReview: managed fields, environment, volumes, probes.
//! Reading all of it into k8s-openapi's `Pod` allocates every string of it. Here only
//! the fields card-quota reads are kept, and the rest of the text is skipped.
//! [`read_pod`] gives a `Pod` with only those fields set, so callers work with the
//! usual type.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

/// `metadata`, every field but `managedFields` (the largest part of a real object's
/// metadata, which nothing here reads).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

/// A container's name, resources and restart policy (a sidecar's is `Always`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Part {
    name: String,
    resources: Option<ResourceRequirements>,
    restart_policy: Option<String>,
}

/// Where the pod may run, and what its containers request.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Spec {
    affinity: Option<Affinity>,
    containers: Vec<Part>,
    init_containers: Option<Vec<Part>>,
    node_name: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    scheduler_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Status {
    phase: Option<String>,
}

#[derive(Deserialize)]
struct Parts {
    #[serde(default)]
    metadata: Meta,
    spec: Option<Spec>,
    status: Option<Status>,
}

fn container(p: Part) -> Container {
    Container {
        name: p.name,
        resources: p.resources,
        restart_policy: p.restart_policy,
        ..Default::default()
    }
}

/// Reads a Pod's JSON keeping only what card-quota reads (see the module doc).
pub fn read_pod(raw: &str) -> Result<Pod, serde_json::Error> {
    let p: Parts = serde_json::from_str(raw)?;
    let m = p.metadata;
    Ok(Pod {
        metadata: ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        },
        spec: p.spec.map(|s| PodSpec {
            affinity: s.affinity,
            containers: s.containers.into_iter().map(container).collect(),
            init_containers: s
                .init_containers
                .map(|c| c.into_iter().map(container).collect()),
            node_name: s.node_name,
            node_selector: s.node_selector,
            scheduler_name: s.scheduler_name,
            ..Default::default()
        }),
        status: p.status.map(|s| PodStatus {
            phase: s.phase,
            ..Default::default()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::records::pod_record;
    use serde_json::json;

    /// A pod as an API server sends it for admission: defaulted, with managed fields, a
    /// sidecar, environment, volumes, probes, tolerations and a product affinity.
    fn full_pod() -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "train-7d9f-", "namespace": "ml", "uid": "0b1c",
                "resourceVersion": "42", "creationTimestamp": "2026-11-24T10:00:00Z",
                "labels": {"app": "train", "volcano.sh/queue-name": "q1"},
                "annotations": {"volcano.sh/card.name": "NVIDIA-H200|RTX-4090", "scheduling.k8s.io/group-name": "pg1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7d9f", "uid": "9", "controller": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-11-24T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}}}}}}]},
            "spec": {"schedulerName": "volcano", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                "serviceAccountName": "default", "securityContext": {"runAsNonRoot": true},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200", "RTX-4090"]}]}]}}},
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}],
                "initContainers": [
                    {"name": "fetch", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "proxy", "image": "envoy", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "100m"}}}],
                "containers": [{"name": "main", "image": "trainer:1", "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "10"}, {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"limits": {"nvidia.com/gpu": "4", "example.com/fpga": "1"}, "requests": {"cpu": "8"}}}]},
            "status": {"phase": "Pending", "qosClass": "Burstable"}})
    }

    #[test]
    fn the_parts_read_give_the_record_and_fields_a_whole_pod_gives() {
        let raw = full_pod().to_string();
        let whole: Pod = serde_json::from_str(&raw).unwrap();
        let parts = read_pod(&raw).unwrap();
        let prefixes = ["nvidia.com".to_string()];
        assert_eq!(
            pod_record(&parts, "ml", &prefixes, 7).unwrap(),
            pod_record(&whole, "ml", &prefixes, 7).unwrap()
        );
        let mut meta = whole.metadata.clone();
        meta.managed_fields = None;
        assert_eq!(parts.metadata, meta);
        let (p, w) = (parts.spec.unwrap(), whole.spec.unwrap());
        assert_eq!(p.node_selector, w.node_selector);
        assert_eq!(p.affinity, w.affinity);
        assert_eq!(p.scheduler_name, w.scheduler_name);
        let demand = |s: &PodSpec| crate::cards::demand::pod_demand(s, |r| r.contains('/'));
        assert_eq!(demand(&p).unwrap(), demand(&w).unwrap());
        assert_eq!(parts.status.unwrap().phase, whole.status.unwrap().phase);
    }

    #[test]
    fn text_that_is_not_a_pod_is_refused() {
        assert!(read_pod(r#"{"spec": {"containers": "main"}}"#).is_err());
        assert!(read_pod(r#"{"metadata": {"labels": ["a"]}}"#).is_err());
    }
}
