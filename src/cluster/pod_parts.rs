//! The parts of a Pod that card-quota reads, read from JSON text. An API server sends
//! the whole pod in each AdmissionReview: managed fields, environment, volumes, probes.
//! Reading all of it into k8s-openapi's `Pod` allocates every string of it, and the
//! `Pod` and each `Container` are over 2 KB each even when empty. Here only the fields
//! card-quota reads are kept ([`PodParts`]), and the rest of the text is skipped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Pod, PodResourceClaim, PodResourceClaimStatus, PodSchedulingGate,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

use crate::cards::demand::ContainerResources;

use super::records::{pod_record_of, RecordError, SpecView};
use super::PodRecord;

/// A Pod as an admission or a watch reads it: its metadata (all but managed fields), the
/// parts of its spec a decision reads, and its phase.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "Parts")]
pub struct PodParts {
    pub metadata: ObjectMeta,
    pub spec: Option<SpecParts>,
    pub phase: Option<String>,
    /// `status.resourceClaimStatuses`.
    pub claims_made: Vec<PodResourceClaimStatus>,
}

/// Where the pod may run, and what its containers request.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SpecParts {
    pub affinity: Option<Affinity>,
    pub containers: Vec<ContainerParts>,
    pub init_containers: Option<Vec<ContainerParts>>,
    pub node_name: Option<String>,
    pub node_selector: Option<BTreeMap<String, String>>,
    pub scheduler_name: Option<String>,
    pub resource_claims: Option<Vec<PodResourceClaim>>,
    pub scheduling_gates: Option<Vec<PodSchedulingGate>>,
}

/// A container's name, resources and restart policy (a sidecar's is `Always`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerParts {
    pub name: String,
    pub resources: Option<ResourceRequirements>,
    pub restart_policy: Option<String>,
}

impl ContainerResources for ContainerParts {
    fn name(&self) -> &str {
        &self.name
    }
    fn resources(&self) -> Option<&ResourceRequirements> {
        self.resources.as_ref()
    }
    fn restart_policy(&self) -> Option<&str> {
        self.restart_policy.as_deref()
    }
}

impl SpecParts {
    fn view(&self) -> SpecView<'_, ContainerParts> {
        SpecView {
            containers: &self.containers,
            init_containers: self.init_containers.as_deref().unwrap_or_default(),
            node_name: self.node_name.as_deref(),
            node_selector: self.node_selector.as_ref(),
            affinity: self.affinity.as_ref(),
            scheduler_name: self.scheduler_name.as_deref(),
            resource_claims: self.resource_claims.as_deref().unwrap_or_default(),
            claims_made: &[],
            scheduling_gates: self.scheduling_gates.as_deref().unwrap_or_default(),
        }
    }
}

impl PodParts {
    /// The pod's record, as [`super::records::pod_record`] gives it for the whole pod.
    pub fn record(
        &self,
        namespace_hint: &str,
        cards: &crate::cards::CardResources,
        seq: u64,
    ) -> Result<PodRecord, RecordError> {
        pod_record_of(
            &self.metadata,
            self.spec
                .as_ref()
                .map(|s| s.view().with_claims_made(&self.claims_made)),
            self.phase.clone(),
            namespace_hint,
            cards,
            seq,
        )
    }
}

fn parts_of(c: Container) -> ContainerParts {
    ContainerParts {
        name: c.name,
        resources: c.resources,
        restart_policy: c.restart_policy,
    }
}

/// The parts of a whole `Pod` (one read some other way than [`read_pod`]).
impl From<Pod> for PodParts {
    fn from(p: Pod) -> Self {
        let mut metadata = p.metadata;
        metadata.managed_fields = None;
        Self {
            metadata,
            spec: p.spec.map(|s| SpecParts {
                affinity: s.affinity,
                containers: s.containers.into_iter().map(parts_of).collect(),
                init_containers: s
                    .init_containers
                    .map(|c| c.into_iter().map(parts_of).collect()),
                node_name: s.node_name,
                node_selector: s.node_selector,
                scheduler_name: s.scheduler_name,
                resource_claims: s.resource_claims,
                scheduling_gates: s.scheduling_gates,
            }),
            claims_made: p
                .status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.clone())
                .unwrap_or_default(),
            phase: p.status.and_then(|s| s.phase),
        }
    }
}

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

#[derive(Deserialize, Default)]
#[serde(default)]
#[serde(rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    resource_claim_statuses: Option<Vec<PodResourceClaimStatus>>,
}

#[derive(Deserialize)]
struct Parts {
    #[serde(default)]
    metadata: Meta,
    spec: Option<SpecParts>,
    status: Option<Status>,
}

/// Reads a Pod's JSON keeping only what card-quota reads (see the module doc).
pub fn read_pod(raw: &str) -> Result<PodParts, serde_json::Error> {
    serde_json::from_str(raw)
}

impl From<Parts> for PodParts {
    fn from(p: Parts) -> Self {
        let m = p.metadata;
        PodParts {
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
            spec: p.spec,
            claims_made: p
                .status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.clone())
                .unwrap_or_default(),
            phase: p.status.and_then(|s| s.phase),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::demand::containers_demand;
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
        let cards = crate::cards::CardResources::default();
        assert_eq!(
            parts.record("ml", &cards, 7).unwrap(),
            pod_record(&whole, "ml", &cards, 7).unwrap()
        );
        // The parts of a whole pod (the path for text only the tree reads) are the same.
        assert_eq!(PodParts::from(whole.clone()), parts);
        let mut meta = whole.metadata.clone();
        meta.managed_fields = None;
        assert_eq!(parts.metadata, meta);
        let (p, w) = (parts.spec.unwrap(), whole.spec.unwrap());
        assert_eq!(p.node_selector, w.node_selector);
        assert_eq!(p.affinity, w.affinity);
        assert_eq!(p.scheduler_name, w.scheduler_name);
        let is_card = |r: &str| r.contains('/');
        assert_eq!(
            containers_demand(
                &p.containers,
                p.init_containers.as_deref().unwrap(),
                is_card
            )
            .unwrap(),
            containers_demand(
                &w.containers,
                w.init_containers.as_deref().unwrap(),
                is_card
            )
            .unwrap()
        );
        assert_eq!(parts.phase, whole.status.unwrap().phase);
    }

    #[test]
    fn text_that_is_not_a_pod_is_refused() {
        assert!(read_pod(r#"{"spec": {"containers": "main"}}"#).is_err());
        assert!(read_pod(r#"{"metadata": {"labels": ["a"]}}"#).is_err());
    }
}
