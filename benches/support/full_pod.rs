//! A full-size pod for the benches: what an API server sends, not a minimal object.

use serde_json::{json, Value};

/// `p` (a pod with one container) as an API server sends it for admission: defaulted,
/// with managed fields, a sidecar, environment, volumes and probes (about 3 KB).
pub fn full_pod(mut p: Value) -> Value {
    p["metadata"]["generateName"] = json!("train-7d9f-");
    p["metadata"]["uid"] = json!("0b1c2d3e-0000-4000-8000-000000000001");
    p["metadata"]["labels"] = json!({"app": "train", "pod-template-hash": "7d9f"});
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "train-7d9f", "uid": "0b1c2d3e-0000-4000-8000-000000000002", "controller": true, "blockOwnerDeletion": true}]);
    p["metadata"]["managedFields"] = json!([{"manager": "kube-controller-manager", "operation": "Update",
        "apiVersion": "v1", "time": "2026-11-24T10:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
            "f:ownerReferences": {".": {}, "k:{\"uid\":\"0b1c2d3e-0000-4000-8000-000000000002\"}": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:command": {}, "f:env": {".": {},
                "k:{\"name\":\"EPOCHS\"}": {".": {}, "f:name": {}, "f:value": {}}}, "f:image": {}, "f:imagePullPolicy": {},
                "f:name": {}, "f:resources": {".": {}, "f:limits": {".": {}, "f:nvidia.com/gpu": {}}},
                "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}, "f:volumeMounts": {}}},
                "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}, "f:volumes": {}}}}]);
    let spec = &mut p["spec"];
    spec["containers"][0]["command"] = json!(["python", "train.py", "--epochs", "10"]);
    spec["containers"][0]["env"] = json!([{"name": "EPOCHS", "value": "10"}, {"name": "DATA", "value": "/data"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}]);
    spec["containers"][0]["ports"] = json!([{"containerPort": 8080, "protocol": "TCP"}]);
    spec["containers"][0]["readinessProbe"] = json!({"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
        "periodSeconds": 5, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3});
    spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"},
        {"name": "kube-api-access-x1", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]);
    spec["containers"][0]["terminationMessagePath"] = json!("/dev/termination-log");
    spec["containers"][0]["terminationMessagePolicy"] = json!("File");
    spec["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    spec["initContainers"] = json!([{"name": "proxy", "image": "envoy:1", "restartPolicy": "Always",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]);
    spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]);
    spec["tolerations"] = json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
    spec["dnsPolicy"] = json!("ClusterFirst");
    spec["restartPolicy"] = json!("Always");
    spec["serviceAccountName"] = json!("default");
    spec["securityContext"] = json!({});
    spec["terminationGracePeriodSeconds"] = json!(30);
    spec["enableServiceLinks"] = json!(true);
    spec["priority"] = json!(0);
    spec["preemptionPolicy"] = json!("PreemptLowerPriority");
    p["status"] = json!({"phase": "Pending", "qosClass": "Burstable"});
    p
}
