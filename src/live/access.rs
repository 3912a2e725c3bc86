//! Every API call card-quota makes with its service account, by resource and verb: the
//! RBAC in `manifests/base/rbac.yaml` must grant exactly these (a test compares them).

/// Where a permission is granted: cluster-wide, or in card-quota's own namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Cluster,
    OwnNamespace,
}

/// (scope, API group, resource, verbs).
pub type Access = (Scope, &'static str, &'static str, &'static [&'static str]);

/// The calls, next to the code that makes them.
pub const ACCESS: &[Access] = &[
    // live/caches.rs: informer caches (list + watch only).
    (Scope::Cluster, "", "nodes", &["list", "watch"]),
    (Scope::Cluster, "", "namespaces", &["list", "watch"]),
    (Scope::Cluster, "", "pods", &["list", "watch", "patch"]),
    (Scope::Cluster, "apps", "deployments", &["list", "watch"]),
    (Scope::Cluster, "apps", "replicasets", &["list", "watch"]),
    (Scope::Cluster, "apps", "statefulsets", &["list", "watch"]),
    (
        Scope::Cluster,
        "scheduling.volcano.sh",
        "podgroups",
        &["list", "watch"],
    ),
    // live/caches.rs: Volcano Jobs, to derive the demand of a PodGroup without card.request.
    (
        Scope::Cluster,
        "batch.volcano.sh",
        "jobs",
        &["list", "watch"],
    ),
    // live/caches.rs: DRA, the cards drivers publish and the claims pods make (read only).
    (
        Scope::Cluster,
        "resource.k8s.io",
        "resourceslices",
        &["list", "watch"],
    ),
    (
        Scope::Cluster,
        "resource.k8s.io",
        "deviceclasses",
        &["list", "watch"],
    ),
    (
        Scope::Cluster,
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["list", "watch"],
    ),
    (
        Scope::Cluster,
        "resource.k8s.io",
        "resourceclaims",
        &["list", "watch"],
    ),
    // ... live/seals.rs: a quorum read of a Queue whose sealed change the watch has not
    // shown yet; and controller/reconciler.rs: the usage annotation (server-side apply).
    (
        Scope::Cluster,
        "scheduling.volcano.sh",
        "queues",
        &["get", "list", "watch", "patch"],
    ),
    // controller/events.rs: kube-runtime's Recorder creates Events and patches series.
    (
        Scope::Cluster,
        "events.k8s.io",
        "events",
        &["create", "patch"],
    ),
    // live/caches.rs and live/ledgers.rs: the ledgers (get, create, replace, delete).
    (
        Scope::OwnNamespace,
        "",
        "configmaps",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    // kube-lease-manager (get, create, patch), live/leadership.rs (get), and
    // live/peers.rs: each replica's peer Lease (server-side apply: create, patch;
    // delete) and everyone's (list, watch).
    (
        Scope::OwnNamespace,
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    type Grants = BTreeSet<(Scope, String, String, String)>;

    fn granted() -> Grants {
        let text = include_str!("../../manifests/base/rbac.yaml");
        let mut out = Grants::new();
        for doc in crate::snapshot::load::documents(text).unwrap() {
            let scope = match doc["kind"].as_str() {
                Some("ClusterRole") => Scope::Cluster,
                Some("Role") => Scope::OwnNamespace,
                _ => continue,
            };
            for rule in doc["rules"].as_array().unwrap() {
                for g in rule["apiGroups"].as_array().unwrap() {
                    for r in rule["resources"].as_array().unwrap() {
                        for v in rule["verbs"].as_array().unwrap() {
                            out.insert((
                                scope,
                                g.as_str().unwrap().into(),
                                r.as_str().unwrap().into(),
                                v.as_str().unwrap().into(),
                            ));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_rbac_manifest_grants_exactly_the_calls_the_code_makes() {
        let needed: Grants = ACCESS
            .iter()
            .flat_map(|(s, g, r, verbs)| {
                verbs
                    .iter()
                    .map(move |v| (*s, g.to_string(), r.to_string(), v.to_string()))
            })
            .collect();
        let granted = granted();
        let extra: Vec<_> = granted.difference(&needed).collect();
        let missing: Vec<_> = needed.difference(&granted).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "granted but not called: {extra:?}\ncalled but not granted: {missing:?}"
        );
    }
}
