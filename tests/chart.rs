//! The Helm chart renders the same webhooks, RBAC and dashboard as `manifests/` (and so
//! as `card-quota manifests`): its files/ are copies, kept equal here.

use serde_json::Value;

fn docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    for d in serde_norway::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}"));
        if !v.is_null() {
            out.push(v);
        }
    }
    out
}

fn of_kind(all: &[Value], kind: &str) -> Value {
    all.iter()
        .find(|d| d["kind"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_charts_webhooks_are_the_manifests_webhooks() {
    let manifests = docs("manifests/webhooks/webhooks.yaml");
    for (file, kind) in [
        (
            "charts/card-quota/files/mutating-webhooks.yaml",
            "MutatingWebhookConfiguration",
        ),
        (
            "charts/card-quota/files/validating-webhooks.yaml",
            "ValidatingWebhookConfiguration",
        ),
    ] {
        assert_eq!(
            docs(file),
            vec![of_kind(&manifests, kind)],
            "{file} differs from manifests/webhooks/webhooks.yaml: copy the {kind} over"
        );
    }
}

#[test]
fn the_charts_rbac_is_the_manifests_rbac() {
    let manifests = docs("manifests/base/rbac.yaml");
    for (file, kind) in [
        ("charts/card-quota/files/clusterrole.yaml", "ClusterRole"),
        ("charts/card-quota/files/role.yaml", "Role"),
    ] {
        assert_eq!(
            docs(file),
            vec![of_kind(&manifests, kind)],
            "{file} differs from manifests/base/rbac.yaml: copy the {kind} over"
        );
    }
}

#[test]
fn the_charts_dashboard_is_the_manifests_dashboard() {
    let read =
        |p: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    assert_eq!(
        read("charts/card-quota/files/dashboard.json"),
        read("manifests/monitoring/dashboard.json")
    );
}

#[test]
fn the_chart_is_versioned_with_the_binary() {
    let chart = &docs("charts/card-quota/Chart.yaml")[0];
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
}
