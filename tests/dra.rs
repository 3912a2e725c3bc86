//! Cards through Dynamic Resource Allocation, through the path the webhook and replay
//! use: pods whose GPUs come from ResourceClaims are refused past their queue's quota at
//! CREATE, and their bindings are charged the model of the devices allocated.

mod support;

use base64::Engine;
use card_quota::admission::{apply, review, usage_report};
use card_quota::decide::review::{AdmissionResponse, ReviewBuilder as R};
use card_quota::decide::Config;
use card_quota::snapshot::load::{load, upsert};
use card_quota::snapshot::Snapshot;
use serde_json::{json, Value};

/// Two DRA nodes (no card labels, no extended resources): h200-1 publishes two H200s and
/// a MIG partition, rtx-1 one RTX 4090; NVIDIA's two classes; a template for one GPU and
/// one for a NIC.
const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: both, annotations: {volcano.sh/card.quota: '{"NVIDIA-GeForce-RTX-4090":1,"NVIDIA-H200":1}'}}}
- {apiVersion: v1, kind: Node, metadata: {name: h200-1}}
- {apiVersion: v1, kind: Node, metadata: {name: rtx-1}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.nvidia.com}
  spec: {selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: mig.nvidia.com}
  spec: {selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: h200-1-gpu.nvidia.com}
  spec:
    driver: gpu.nvidia.com
    nodeName: h200-1
    pool: {name: h200-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-1, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-2-mig-0, attributes: {type: {string: mig}, productName: {string: NVIDIA H200}, profile: {string: 1g.18gb}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: rtx-1-gpu.nvidia.com}
  spec:
    driver: gpu.nvidia.com
    nodeName: rtx-1
    pool: {name: rtx-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA GeForce RTX 4090}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: one-gpu, namespace: ml}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: one-nic, namespace: ml}
  spec: {spec: {devices: {requests: [{name: nic, exactly: {deviceClassName: nic.example.com}}]}}}
"#;

struct World {
    snap: Snapshot,
    cfg: Config,
}

impl World {
    fn new() -> Self {
        Self::of(CLUSTER)
    }
    fn of(cluster: &str) -> Self {
        let (snap, skipped) = load(cluster).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
        }
    }
    fn send(&mut self, doc: Value) -> AdmissionResponse {
        let r = review(
            &doc,
            &mut self.snap,
            &self.cfg,
            jiff::Timestamp::now(),
            true,
        );
        if let (Some(req), Some(d)) = (&r.request, &r.decision) {
            apply(&mut self.snap, req, d).unwrap();
        }
        r.out.response
    }
    /// An object as a watch would bring it.
    fn seen(&mut self, v: Value) {
        upsert(&mut self.snap, &v).unwrap();
    }
    /// A DRA record as the watcher stores it: counted against a view without the lock,
    /// then stored. How many requirements were counted under the lock.
    fn seen_as_the_watcher(&mut self, record: card_quota::snapshot::DraRecord) -> u64 {
        let prepared = record.prepare(&self.snap.dra_view());
        let before = self.snap.dra_objects().requirements_counted_here();
        self.snap
            .store_dra_record(record, prepared.as_ref())
            .unwrap();
        self.snap.dra_objects().requirements_counted_here() - before
    }
    fn usage(&self, queue: &str, model: &str) -> Value {
        self.usage_at(queue, model, jiff::Timestamp::now())
    }

    fn usage_at(&self, queue: &str, model: &str, at: jiff::Timestamp) -> Value {
        serde_json::to_value(usage_report(&self.snap, at))
            .unwrap()
            .pointer(&format!("/{queue}/{}", model.replace('/', "~1")))
            .cloned()
            .unwrap_or(Value::Null)
    }
}

/// A pod whose only GPU comes from a claim made from `template`.
fn claim_pod(name: &str, queue: &str, template: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": {"scheduling.volcano.sh/queue-name": queue}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}})
}

/// A pod of `queue` whose GPU comes from the claim `shared`.
fn sharer(name: &str, queue: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": {"scheduling.volcano.sh/queue-name": queue}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]}})
}

/// The claim `shared` (one GPU, made apart from any pod), allocated device `device` of
/// h200-1 and reserved for `pods` in their order when given.
fn shared_claim(allocated: Option<(&str, &[&str])>) -> Value {
    let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
    if let Some((device, pods)) = allocated {
        let reserved: Vec<Value> = pods
            .iter()
            .map(|n| json!({"resource": "pods", "name": n, "uid": format!("u-{n}")}))
            .collect();
        c["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": device}]}},
            "reservedFor": reserved});
    }
    c
}

/// The claim the resourceclaim controller makes for `pod` from `one-gpu`, allocated to
/// `device` on `pool` when given.
fn made_claim(pod: &str, allocated: Option<(&str, &str)>) -> Value {
    let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("{pod}-gpu-x1"), "namespace": "ml",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
    if let Some((pool, device)) = allocated {
        c["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("u-{pod}")}]});
    }
    c
}

/// `pod` as the watch shows it once the claim is made: its status names the claim.
fn with_claim_made(w: &World, pod: &str) -> Value {
    let rec = w
        .snap
        .pod(&card_quota::cards::ObjectKey::new("ml", pod))
        .expect("the admitted pod");
    let mut p = claim_pod(pod, "q", "one-gpu");
    if let Some(Ok(a)) = &rec.card_name {
        p["metadata"]["annotations"]["volcano.sh/card.name"] = json!(a.to_string());
    }
    if let Some(q) = &rec.stamped_queue {
        p["metadata"]["annotations"]["volcano.sh/card.queue"] = json!(q.to_string());
    }
    p["status"] = json!({"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": format!("{pod}-gpu-x1")}]});
    p
}

fn message(r: &AdmissionResponse) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

/// The `card.name` the response's patch writes.
fn card_name_written(r: &AdmissionResponse) -> Option<String> {
    let p = patch(r);
    p.as_array()?
        .iter()
        .find(|op| op["path"] == "/metadata/annotations/volcano.sh~1card.name")
        .and_then(|op| op["value"].as_str())
        .map(str::to_string)
}

fn patch(r: &AdmissionResponse) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r.patch.as_ref().expect("a patch"))
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn claim_pods_fill_the_queue_and_the_next_is_refused_at_create() {
    let mut w = World::new();
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "q", "one-gpu")).build());
        assert!(r.allowed, "{}", message(&r));
        // The models its claim allows that its queue names (not the RTX 4090 the class
        // also selects), written as its card.name; no node pin.
        assert_eq!(card_name_written(&r).as_deref(), Some("NVIDIA-H200"));
        assert!(!patch(&r).to_string().contains("nodeSelector"));
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 2);
    let r = w.send(R::pod("CREATE", claim_pod("c", "q", "one-gpu")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200 quota: requested 1, in use 2 (allocated 0, pending 2, reserved 0), quota 2"
    );
}

/// A claim with admin access (`adminAccess: true`, which the API server allows only in
/// namespaces an admin labelled for it: a monitoring agent reading every GPU of its node)
/// takes no device from any claim. Its pod asks for no cards, even of every device
/// (`allocationMode: All`, refused for a claim that takes them), in a full queue; its
/// allocation and binding charge nothing.
#[test]
fn a_claim_with_admin_access_takes_no_cards() {
    let mut w = World::new();
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "every-gpu-admin", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": true}}]}}}}));
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "q", "one-gpu")).build());
        assert!(r.allowed, "{}", message(&r));
    }
    let r = w.send(R::pod("CREATE", claim_pod("mon", "q", "every-gpu-admin")).build());
    assert!(r.allowed, "{}", message(&r));
    let mut pod = claim_pod("mon", "q", "every-gpu-admin");
    pod["status"] = json!({"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "mon-gpu-x1"}]});
    w.seen(pod);
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "mon-gpu-x1", "namespace": "ml", "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": true}}]}}});
    w.seen(claim.clone());
    let mut allocated = claim.clone();
    allocated["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": "gpu-0", "adminAccess": true},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": "gpu-1", "adminAccess": true}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h200-1"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "mon", "uid": "u-mon"}]});
    let r = w.send(status_write(allocated.clone(), claim));
    assert!(r.allowed, "{}", message(&r));
    w.seen(allocated);
    let r = w.send(R::binding("ml", "mon", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        w.usage("q", "NVIDIA-H200"),
        json!({"quota": 2, "allocated": 0, "pending": 2, "reserved": 0})
    );
}

#[test]
fn a_binding_is_charged_the_allocated_device_model_and_must_be_one_admitted() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", claim_pod("a", "q", "one-gpu")).build())
            .allowed
    );
    // The scheduler's allocation not seen yet: try again, nothing charged.
    w.seen(with_claim_made(&w, "a"));
    w.seen(made_claim("a", None));
    let r = w.send(R::binding("ml", "a", "h200-1").build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/a uses ResourceClaim a-gpu-x1, whose allocation card-quota has not seen yet; try again"
    );
    // Allocated to an H200: bound and charged it.
    w.seen(made_claim("a", Some(("h200-1", "gpu-1"))));
    let r = w.send(R::binding("ml", "a", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 0);

    // A pod admitted for the H200 whose claim is allocated an RTX 4090 is refused.
    assert!(
        w.send(R::pod("CREATE", claim_pod("b", "q", "one-gpu")).build())
            .allowed
    );
    w.seen(with_claim_made(&w, "b"));
    w.seen(made_claim("b", Some(("rtx-1", "gpu-0"))));
    let r = w.send(R::binding("ml", "b", "rtx-1").build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/b accepts NVIDIA-H200 but node rtx-1 has NVIDIA-GeForce-RTX-4090"
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
}

#[test]
fn a_claim_that_allows_several_models_may_use_each_its_queue_names() {
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", claim_pod("a", "both", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    // In the quota's order.
    assert_eq!(
        card_name_written(&r).as_deref(),
        Some("NVIDIA-GeForce-RTX-4090|NVIDIA-H200")
    );
    assert!(
        w.send(R::pod("CREATE", claim_pod("b", "both", "one-gpu")).build())
            .allowed
    );
    let r = w.send(R::pod("CREATE", claim_pod("c", "both", "one-gpu")).build());
    assert!(!r.allowed, "two cards of quota, a third pod");
}

/// Issue 57 #7: a `firstAvailable` claim (two H200, else one GPU of any model) is
/// counted by its largest way on the models the pod may use, not by its largest way on
/// every model: one card in a queue whose quota names only the RTX 4090 (refused as two
/// before), two in a queue of H200s. The claim made for the pod is pinned to those
/// models, so the two-H200 way cannot be allocated to the first.
#[test]
fn a_first_available_claim_counts_its_largest_way_on_the_models_the_pod_may_use() {
    let mut w = World::new();
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "fallback", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "two-h200", "deviceClassName": "gpu.nvidia.com", "count": 2,
             "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]},
            {"name": "any", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]}}}}));
    w.seen(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "rtx", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-GeForce-RTX-4090\":1}"}}}));
    let r = w.send(R::pod("CREATE", claim_pod("a", "rtx", "fallback")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        card_name_written(&r).as_deref(),
        Some("NVIDIA-GeForce-RTX-4090")
    );
    assert_eq!(w.usage("rtx", "NVIDIA-GeForce-RTX-4090")["pending"], 1);
    let r = w.send(R::pod("CREATE", claim_pod("b", "rtx", "fallback")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("requested 1, in use 1"),
        "{}",
        message(&r)
    );
    // Where the H200s are allowed, the larger way counts.
    let r = w.send(R::pod("CREATE", claim_pod("c", "q", "fallback")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 2);
    let r = w.send(R::pod("CREATE", claim_pod("d", "q", "fallback")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("requested 2, in use 2"),
        "{}",
        message(&r)
    );
}

/// Issue 57 #6: a tenant's selector that Kubernetes accepts (its cost is under
/// Kubernetes' 1,000,000 per device) but would cost card-quota's watchers seconds over the
/// cluster's devices is refused before it runs: its pods are refused with the reason, and
/// nobody else's decisions wait on it.
#[test]
fn a_selector_past_the_cost_limit_is_refused_with_its_cost() {
    let mut w = World::new();
    let list = format!(
        "[{}]",
        (0..100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let expression = format!(
        "{list}.all(i, {list}.all(j, device.attributes['gpu.nvidia.com'].productName.size() + i + j >= 0))"
    );
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "costly", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": expression}}]}}]}}}}));
    let r = w.send(R::pod("CREATE", claim_pod("costly", "q", "costly")).build());
    assert!(!r.allowed);
    let m = message(&r);
    assert!(
        m.starts_with("ResourceClaimTemplate ml/costly request gpu: selector ")
            && m.contains("costs about 350803 per device, past card-quota's limit of 10000")
            && m.ends_with("simplify it"),
        "{m}"
    );
    // Others' pods are decided as before.
    let r = w.send(R::pod("CREATE", claim_pod("plain", "q", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
}

#[test]
fn claims_of_no_card_class_and_unreadable_claims() {
    let mut w = World::new();
    // A NIC only: not a card pod, nothing charged.
    let r = w.send(R::pod("CREATE", claim_pod("nic", "q", "one-nic")).build());
    assert!(r.allowed, "{}", message(&r));
    // Stamped with its queue (a shared claim it uses may become its to pay), no model.
    assert_eq!(card_name_written(&r), None);
    // A template card-quota does not hold: refused, naming it.
    let r = w.send(R::pod("CREATE", claim_pod("x", "q", "nowhere")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/x: its claim gpu uses ResourceClaimTemplate ml/nowhere, which card-quota does not hold (yet): it cannot tell which cards it asks for; create it first, or try again"
    );
    // Every device of a class: refused, it cannot be bounded.
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "all-gpus", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}}));
    let r = w.send(R::pod("CREATE", claim_pod("all", "q", "all-gpus")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "ResourceClaimTemplate ml/all-gpus request gpu asks for every device of DeviceClass gpu.nvidia.com (allocationMode: All): card-quota cannot bound its cards; ask for a count"
    );
}

#[test]
fn under_warn_a_claim_pod_past_the_quota_is_admitted_with_a_warning() {
    let mut w = World::new();
    w.cfg.enforcement = card_quota::decide::Enforcement::Warn;
    for name in ["a", "b", "c"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "q", "one-gpu")).build());
        assert!(r.allowed, "{}", message(&r));
        let warned = r
            .warnings
            .iter()
            .any(|w| w.contains("insufficient NVIDIA-H200 quota: requested 1, in use 2"));
        assert_eq!(warned, name == "c", "{name}: {:?}", r.warnings);
    }
}

#[test]
fn the_claim_made_for_an_admitted_pod_is_pinned_to_its_models() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", claim_pod("a", "q", "one-gpu")).build())
            .allowed
    );
    let mut claim = made_claim("a", None);
    claim["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
        "name": "a", "uid": "u-a", "controller": true, "blockOwnerDeletion": true}]);
    // Beside it, a request with admin access: it takes no card, so it is not pinned.
    claim["spec"]["devices"]["requests"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "mon",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": true}}));
    let r = w.send(R::claim("CREATE", claim.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    let mut pinned = claim.clone();
    let ops: json_patch::Patch = serde_json::from_value(patch(&r)).unwrap();
    json_patch::patch(&mut pinned, &ops).unwrap();
    assert_eq!(
        pinned["spec"]["devices"]["requests"][0]["exactly"]["selectors"],
        json!([{"cel": {"expression": "(device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com']['productName'] == 'NVIDIA H200')"}}])
    );
    assert_eq!(
        pinned["spec"]["devices"]["requests"][1]["exactly"].get("selectors"),
        None
    );
    assert_eq!(
        pinned["metadata"]["annotations"]["volcano.sh/card.pinned"],
        "NVIDIA-H200: the models pod ml/a was admitted for"
    );
    // A claim of no pod, and one of a pod card-quota has not seen: left alone / retried.
    let r = w.send(
        R::claim(
            "CREATE",
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "apart", "namespace": "ml"}, "spec": claim["spec"].clone()}),
        )
        .build(),
    );
    assert!(r.allowed && r.patch.is_none());
    claim["metadata"]["ownerReferences"][0]["name"] = json!("unseen");
    claim["metadata"]["name"] = json!("unseen-gpu-x1");
    let r = w.send(R::claim("CREATE", claim).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/unseen, for which this ResourceClaim is made, is not in card-quota's cache yet; try again"
    );
}

#[test]
fn a_claim_shared_by_two_pods_is_counted_once() {
    let mut w = World::new();
    w.seen(shared_claim(None));
    for name in ["s1", "s2"] {
        let r = w.send(R::pod("CREATE", sharer(name, "q")).build());
        assert!(r.allowed, "{}", message(&r));
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 1);
    // Allocated once, reserved for both: both bind, one card allocated.
    w.seen(shared_claim(Some(("gpu-0", &["s1", "s2"]))));
    for name in ["s1", "s2"] {
        let r = w.send(R::binding("ml", name, "h200-1").build());
        assert!(r.allowed, "{}", message(&r));
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 0);
    // The first pod gone: the second pays for the claim, still one card.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "s1");
    w.seen(shared_claim(Some(("gpu-0", &["s2"]))));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
}

#[test]
fn a_parent_queue_caps_its_childrens_claim_pods() {
    let mut w = World::new();
    w.seen(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "org", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":1}"}},
        "spec": {"parent": "root"}}));
    w.seen(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "team", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":2}"}},
        "spec": {"parent": "org"}}));
    let r = w.send(R::pod("CREATE", claim_pod("a", "team", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    let r = w.send(R::pod("CREATE", claim_pod("b", "team", "one-gpu")).build());
    assert!(!r.allowed, "the org holds one H200");
    assert!(message(&r).contains("org"), "{}", message(&r));
}

/// A ledger entry's pod (what another replica admitted, laid over the caches) has no
/// claims to read: it keeps the claims' cards it was admitted with.
#[test]
fn an_admitted_claim_pod_known_only_from_its_ledger_entry_keeps_its_cards() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", claim_pod("a", "q", "one-gpu")).build())
            .allowed
    );
    let mut entry = w
        .snap
        .pod(&card_quota::cards::ObjectKey::new("ml", "a"))
        .unwrap()
        .clone();
    entry.key.name = "b".into();
    entry.claims.clear();
    entry.claimed = None;
    w.snap.upsert_pod(entry);
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 2);
    let r = w.send(R::pod("CREATE", claim_pod("c", "q", "one-gpu")).build());
    assert!(!r.allowed, "two admitted, a quota of two");
    // Its binding waits for the pod itself, with its claims.
    let r = w.send(R::binding("ml", "b", "h200-1").build());
    assert_eq!(
        message(&r),
        "pod ml/b is not in card-quota's cache with its ResourceClaims yet; try again"
    );
}

#[test]
fn a_quota_for_a_model_only_dra_devices_offer_is_not_warned_about() {
    let mut w = World::new();
    let q = |quota: &str| {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "new", "annotations": {"volcano.sh/card.quota": quota}}})
    };
    let r = w.send(R::queue("CREATE", q(r#"{"NVIDIA-H200":1}"#)).build());
    assert!(r.allowed && r.warnings.is_empty(), "{:?}", r.warnings);
    let r = w.send(R::queue("CREATE", q(r#"{"NVIDIA-B200":1}"#)).build());
    assert_eq!(
        r.warnings,
        ["queue new: no node offers card model NVIDIA-B200"]
    );
}

mod incremental {
    //! The usage the snapshot keeps up to date as DRA objects and pods change, one event
    //! at a time (claims read again when a claim, template, class or slice moves), equals
    //! the usage of a snapshot loaded from scratch with the objects as they end up.

    use std::collections::BTreeMap;

    use card_quota::cards::QueueName;
    use card_quota::snapshot::load::{load, remove, upsert};
    use card_quota::snapshot::DraRecord;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const PRODUCTS: [&str; 2] = ["NVIDIA H200", "NVIDIA GeForce RTX 4090"];

    #[derive(Debug, Clone)]
    enum Ev {
        /// A pod whose claim comes from template `template`; `made`: its status names the
        /// claim made for it (`p<pod>-c`).
        TemplatePod {
            pod: usize,
            queue: usize,
            template: usize,
            node: Option<usize>,
            made: bool,
        },
        /// A pod of queue q1 using the claim `shared`.
        SharedPod {
            pod: usize,
            node: Option<usize>,
        },
        DeletePod {
            pod: usize,
        },
        /// Claim `p<which>-c` (which < 6) or `shared` (6): allocated to a device of a
        /// node, reserved for pods in the given order.
        Claim {
            which: usize,
            alloc: Option<(usize, usize)>,
            reserved: Vec<usize>,
        },
        DeleteClaim {
            which: usize,
        },
        Slice {
            node: usize,
            product: usize,
        },
        /// Node `node`'s slice deleted (`serve` stores it as a slice publishing nothing,
        /// judged without the lock).
        DeleteSlice {
            node: usize,
        },
        Class {
            h200_only: bool,
        },
        /// The DeviceClass deleted (its name then selects what the install's defaults
        /// say of it).
        DeleteClass,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            3 => (0..6usize, 0..2usize, 0..3usize, proptest::option::of(0..2usize), any::<bool>())
                .prop_map(|(pod, queue, template, node, made)| Ev::TemplatePod { pod, queue, template, node, made }),
            2 => (6..9usize, proptest::option::of(0..2usize)).prop_map(|(pod, node)| Ev::SharedPod { pod, node }),
            1 => (0..9usize).prop_map(|pod| Ev::DeletePod { pod }),
            3 => (0..7usize, proptest::option::of((0..2usize, 0..2usize)), proptest::collection::vec(0..9usize, 0..3))
                .prop_map(|(which, alloc, reserved)| Ev::Claim { which, alloc, reserved }),
            1 => (0..7usize).prop_map(|which| Ev::DeleteClaim { which }),
            1 => (0..2usize, 0..2usize).prop_map(|(node, product)| Ev::Slice { node, product }),
            1 => (0..2usize).prop_map(|node| Ev::DeleteSlice { node }),
            1 => any::<bool>().prop_map(|h200_only| Ev::Class { h200_only }),
            1 => Just(Ev::DeleteClass),
        ]
    }

    fn claim_name(which: usize) -> String {
        if which == 6 {
            "shared".into()
        } else {
            format!("p{which}-c")
        }
    }

    const BASE: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q0, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2,"NVIDIA-GeForce-RTX-4090":1}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q1, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}}
- {apiVersion: v1, kind: Node, metadata: {name: n0}}
- {apiVersion: v1, kind: Node, metadata: {name: n1}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: t0, namespace: ml}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: t1, namespace: ml}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 2,
    selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: h200.example.com}
  spec: {selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: t2, namespace: ml}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: h200.example.com}}]}}}
"#;

    /// (kind, name) -> the object as it stands.
    type World = BTreeMap<(&'static str, String), Value>;

    fn object(e: &Ev) -> Option<(&'static str, String, Option<Value>)> {
        let pod = |name: String, queue: &str, claim: Value, node: &Option<usize>, status: Value| {
            let mut spec = json!({"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [claim]});
            if let Some(n) = node {
                spec["nodeName"] = json!(format!("n{n}"));
            }
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml", "annotations": {"scheduling.volcano.sh/queue-name": queue}},
                "spec": spec, "status": status})
        };
        Some(match e {
            Ev::TemplatePod {
                pod: p,
                queue,
                template,
                node,
                made,
            } => {
                let status = if *made {
                    json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": format!("p{p}-c")}]})
                } else {
                    json!({})
                };
                let claim =
                    json!({"name": "gpu", "resourceClaimTemplateName": format!("t{template}")});
                (
                    "Pod",
                    format!("p{p}"),
                    Some(pod(
                        format!("p{p}"),
                        &format!("q{queue}"),
                        claim,
                        node,
                        status,
                    )),
                )
            }
            Ev::SharedPod { pod: p, node } => {
                let claim = json!({"name": "gpu", "resourceClaimName": "shared"});
                (
                    "Pod",
                    format!("p{p}"),
                    Some(pod(format!("p{p}"), "q1", claim, node, json!({}))),
                )
            }
            Ev::DeletePod { pod } => ("Pod", format!("p{pod}"), None),
            Ev::Claim {
                which,
                alloc,
                reserved,
            } => {
                // Claims p1-c, p3-c, p5-c ask through an admin's class that selects
                // cards only while an H200 slice is published; p5-c's own selector
                // allows none of them (what it may get never changes, whether it asks
                // for cards does).
                let mut request = json!({"deviceClassName": "gpu.nvidia.com"});
                if which % 2 == 1 {
                    request["deviceClassName"] = json!("h200.example.com");
                }
                if *which == 5 {
                    request["selectors"] = json!([{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'nic'"}}]);
                }
                let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": claim_name(*which), "namespace": "ml"},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}});
                if let Some((node, dev)) = alloc {
                    let reserved: Vec<Value> = reserved.iter().map(|p| json!({"resource": "pods", "name": format!("p{p}"), "uid": format!("u{p}")})).collect();
                    c["status"] = json!({"allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": format!("n{node}"), "device": format!("gpu-{dev}")}]}},
                        "reservedFor": reserved});
                }
                ("ResourceClaim", claim_name(*which), Some(c))
            }
            Ev::DeleteClaim { which } => ("ResourceClaim", claim_name(*which), None),
            Ev::Slice { node, product } => {
                let devices: Vec<Value> = (0..2).map(|d| json!({"name": format!("gpu-{d}"),
                    "attributes": {"type": {"string": "gpu"}, "productName": {"string": PRODUCTS[*product]}}})).collect();
                (
                    "ResourceSlice",
                    format!("n{node}-gpu"),
                    Some(
                        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": format!("n{node}-gpu")},
                    "spec": {"driver": "gpu.nvidia.com", "nodeName": format!("n{node}"), "pool": {"name": format!("n{node}")}, "devices": devices}}),
                    ),
                )
            }
            Ev::DeleteSlice { node } => ("ResourceSlice", format!("n{node}-gpu"), None),
            Ev::DeleteClass => ("DeviceClass", "gpu.nvidia.com".into(), None),
            Ev::Class { h200_only } => {
                let expr = if *h200_only {
                    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
                } else {
                    "device.driver == 'gpu.nvidia.com'"
                };
                (
                    "DeviceClass",
                    "gpu.nvidia.com".into(),
                    Some(
                        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}),
                    ),
                )
            }
        })
    }

    /// The objects in the order a fresh start lists them: DRA objects, then pods.
    fn fresh(world: &World) -> card_quota::snapshot::Snapshot {
        let (mut s, _) = load(BASE).unwrap();
        for kind in ["DeviceClass", "ResourceSlice", "ResourceClaim", "Pod"] {
            for (_, v) in world.iter().filter(|((k, _), _)| *k == kind) {
                upsert(&mut s, v).unwrap();
            }
        }
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("CARD_QUOTA_DRA_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(120)
        ))]
        #[test]
        fn usage_kept_up_to_date_equals_usage_counted_from_scratch(
            events in proptest::collection::vec(ev(), 1..40),
        ) {
            let (mut s, _) = load(BASE).unwrap();
            let mut world = World::new();
            let now = jiff::Timestamp::now();
            // What a watcher works out without the lock (`serve`): against the devices
            // and requirements as they are, or as they were one event before (another
            // watcher's event landed meanwhile); `replay`'s way, everything under the lock.
            let mut earlier = s.dra_view();
            for (i, e) in events.iter().enumerate() {
                let view_before = s.dra_view();
                if let Some((kind, name, obj)) = object(e) {
                    match obj {
                        Some(v) => {
                            let view = match i % 3 {
                                0 => None,
                                1 => Some(s.dra_view()),
                                _ => Some(earlier.clone()),
                            };
                            match view {
                                None => {
                                    upsert(&mut s, &v).unwrap();
                                }
                                Some(view) => match DraRecord::read(&v, "ml", view.settings()).unwrap() {
                                    Some(r) => {
                                        let prepared = r.prepare(&view);
                                        s.store_dra_record(r, prepared.as_ref()).unwrap();
                                    }
                                    None => {
                                        upsert(&mut s, &v).unwrap();
                                    }
                                },
                            }
                            world.insert((kind, name), v);
                        }
                        None => {
                            let gone = match kind {
                                "ResourceSlice" => Some(DraRecord::SliceGone(name.clone())),
                                "DeviceClass" => Some(DraRecord::ClassGone(name.clone())),
                                _ => None,
                            };
                            if let Some(r) = gone.filter(|_| i % 3 != 0) {
                                // As the slice and class watchers store a deletion: worked
                                // out through a view (maybe a stale one).
                                let view = if i % 3 == 1 { s.dra_view() } else { earlier.clone() };
                                let prepared = r.prepare(&view);
                                s.store_dra_record(r, prepared.as_ref()).unwrap();
                            } else {
                                remove(&mut s, kind, "ml", &name);
                            }
                            world.remove(&(kind, name));
                        }
                    }
                }
                earlier = view_before;
                let f = fresh(&world);
                for q in ["q0", "q1"] {
                    let q = QueueName::new(q);
                    prop_assert_eq!(s.usage(&q, now), f.usage(&q, now), "queue {} after {:?}", q, e);
                }
            }
        }
    }
}

/// A driver card-quota does not know, named by `--dra-driver` and `--dra-class`.
const OTHER_DRIVER: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q, annotations: {volcano.sh/card.quota: '{"Acme-X1":1}'}}}
- {apiVersion: v1, kind: Node, metadata: {name: acme-1}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.acme.example}
  spec: {selectors: [{cel: {expression: "device.driver == 'gpu.acme.example'"}}]}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: acme-1-gpu.acme.example}
  spec:
    driver: gpu.acme.example
    nodeName: acme-1
    pool: {name: acme-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {model: {string: Acme X1}}}
    - {name: gpu-1, attributes: {model: {string: Acme X1}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: one-gpu, namespace: ml}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.acme.example}}]}}}
"#;

#[test]
fn another_drivers_cards_count_once_its_driver_and_class_are_given() {
    use card_quota::cards::dra::DraSettings;
    use card_quota::cards::CardResources;
    let given = CardResources::default()
        .with_dra(DraSettings::parse(&["gpu.acme.example=model"], &["gpu.acme.example"]).unwrap());
    let world = |cards: &CardResources| {
        let (snap, skipped) = card_quota::snapshot::load::load_with(OTHER_DRIVER, cards).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        World {
            snap,
            cfg: Config::default(),
        }
    };
    // With the defaults the class is not a card class: nothing is charged.
    let mut w = world(&CardResources::default());
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "q", "one-gpu")).build());
        assert!(r.allowed, "{}", message(&r));
        assert_eq!(card_name_written(&r), None);
    }
    // Given, its devices are cards named by their `model` attribute, and the second
    // pod is past the quota of one.
    let mut w = world(&given);
    let r = w.send(R::pod("CREATE", claim_pod("a", "q", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(card_name_written(&r).as_deref(), Some("Acme-X1"));
    let r = w.send(R::pod("CREATE", claim_pod("b", "q", "one-gpu")).build());
    assert_eq!(
        message(&r),
        "queue q has insufficient Acme-X1 quota: requested 1, in use 1 (allocated 0, pending 1, reserved 0), quota 1"
    );
}

/// `made_claim` allocated as kube-scheduler writes it: with the node's selector.
fn allocated_on(pod: &str, node: &str, pool: &str, device: &str) -> Value {
    let mut c = made_claim(pod, Some((pool, device)));
    c["status"]["allocation"]["nodeSelector"] = json!({"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]});
    c
}

fn status_write(new: Value, old: Value) -> Value {
    R::claim("UPDATE", new)
        .subresource("status")
        .old(old)
        .build()
}

#[test]
fn an_allocation_is_checked_when_the_scheduler_writes_it() {
    let mut w = World::new();
    for name in ["a", "b", "c"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "both", "one-gpu")).build());
        assert!(r.allowed || name == "c", "{}", message(&r));
    }
    // `both` holds one RTX 4090 and one H200; a and b were admitted for RTX|H200.
    for name in ["a", "b"] {
        w.seen(with_claim_made(&w, name));
        w.seen(made_claim(name, None));
    }
    // a is allocated an RTX and bound: its queue's RTX is taken.
    let r = w.send(status_write(
        allocated_on("a", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("a", None),
    ));
    assert!(r.allowed, "{}", message(&r));
    w.seen(allocated_on("a", "rtx-1", "rtx-1", "gpu-0"));
    assert!(w.send(R::binding("ml", "a", "rtx-1").build()).allowed);
    // b's allocation of another RTX (one the pin would have kept it from) is refused at
    // the write, before any binding: the RTX quota is used.
    w.seen(rtx_2_slice());
    let r = w.send(status_write(
        allocated_on("b", "rtx-1", "rtx-2", "gpu-0"),
        made_claim("b", None),
    ));
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue both has insufficient NVIDIA-GeForce-RTX-4090 quota: requested 1, in use 2 (allocated 1, pending 1, reserved 0), quota 1"
    );
    // An H200 fits.
    let r = w.send(status_write(
        allocated_on("b", "h200-1", "h200-1", "gpu-0"),
        made_claim("b", None),
    ));
    assert!(r.allowed, "{}", message(&r));
    // A write that leaves the allocation and its reservations as they were, and a
    // deallocation, change no card; a pod newly reserved must be one card-quota sees.
    let r = w.send(status_write(
        allocated_on("b", "h200-1", "h200-1", "gpu-0"),
        allocated_on("b", "h200-1", "h200-1", "gpu-0"),
    ));
    assert!(r.allowed, "{}", message(&r));
    let mut reserved_twice = allocated_on("b", "h200-1", "h200-1", "gpu-0");
    reserved_twice["status"]["reservedFor"]
        .as_array_mut()
        .unwrap()
        .push(json!({"resource": "pods", "name": "z", "uid": "z"}));
    let r = w.send(status_write(
        reserved_twice,
        allocated_on("b", "h200-1", "h200-1", "gpu-0"),
    ));
    assert_eq!(
        message(&r),
        "pod ml/z, for which ResourceClaim ml/b-gpu-x1 is reserved, is not in card-quota's cache yet; try again"
    );
    let r = w.send(status_write(
        made_claim("b", None),
        allocated_on("b", "h200-1", "h200-1", "gpu-0"),
    ));
    assert!(r.allowed, "{}", message(&r));
}

/// Found by the committer model (2026-12-04): a pod deleted and made again under its
/// name with a claim, on a replica whose pod cache still shows the first (an H200 pod of
/// no claim). The allocation reserved for the second was read against the first, which
/// uses no claim: admitted uncharged, on a model the new pod does not name, into a queue
/// with no room for it. The payer is the pod reserved for, by uid: until the cache shows
/// it, "try again".
#[test]
fn an_allocation_for_a_pod_made_again_under_its_name_waits_for_the_cache_to_show_it() {
    let mut w = World::new();
    w.seen(
        support::pod("x")
            .queue("q")
            .card("NVIDIA-H200")
            .gpus("1")
            .stored("u-first", "7")
            .build(),
    );
    // Reserved for x of uid u-x: the second x, which the cache does not show.
    let r = w.send(status_write(
        allocated_on("x", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("x", None),
    ));
    assert!(!r.allowed, "admitted against another pod of that name");
    assert_eq!(
        message(&r),
        "pod ml/x, for which ResourceClaim ml/x-gpu-x1 is allocated, is not in card-quota's cache yet; try again"
    );
    // A cardless pod of that name says nothing about the second either.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "x");
    w.seen(support::pod("x").queue("q").stored("u-first", "8").build());
    let r = w.send(status_write(
        allocated_on("x", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("x", None),
    ));
    assert!(!r.allowed, "admitted as the cardless pod of that name");
}

/// Found by the committer model (2026-12-04): a pod reserved a claim allocated for
/// another pod runs on that allocation's model. A sharer pinned to another model at its
/// CREATE had its reservation admitted (it changed no card) and its binding taken as
/// that CREATE's charge, so its card was bound on a model its queue never checked. A
/// reservation of a pod that does not accept the allocated model is refused; one of a
/// pod the cache does not show waits.
#[test]
fn a_claim_is_reserved_only_for_pods_that_accept_its_allocated_model() {
    let mut w = World::new();
    let named = |name: &str, model: &str| {
        let mut p = sharer(name, "q");
        p["metadata"]["uid"] = json!(format!("u-{name}"));
        p["metadata"]["annotations"]["volcano.sh/card.name"] = json!(model);
        p["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("q");
        p
    };
    w.seen(named("s1", "NVIDIA-H200"));
    w.seen(named("rtx", "NVIDIA-GeForce-RTX-4090"));
    w.seen(named("s2", "NVIDIA-H200|NVIDIA-GeForce-RTX-4090"));
    let reserve = |w: &mut World, who: &[&str]| {
        let mut before = who.to_vec();
        before.pop();
        w.send(status_write(
            shared_claim(Some(("gpu-0", who))),
            shared_claim(Some(("gpu-0", &before))),
        ))
    };
    // The claim holds an H200, allocated for s1.
    let r = reserve(&mut w, &["s1", "rtx"]);
    assert!(
        !r.allowed,
        "a pod that accepts only the RTX 4090 reserved an H200"
    );
    assert_eq!(
        message(&r),
        "pod ml/rtx accepts NVIDIA-GeForce-RTX-4090 but ResourceClaim ml/shared is allocated on NVIDIA-H200: the pod would run on a card model it does not accept"
    );
    let r = reserve(&mut w, &["s1", "s2"]);
    assert!(r.allowed, "{}", message(&r));
    // A pod the cache does not show: it may name any model; it waits.
    let r = reserve(&mut w, &["s1", "s2", "s3"]);
    assert!(!r.allowed);
    assert!(
        message(&r).ends_with("is not in card-quota's cache yet; try again"),
        "{}",
        message(&r)
    );
}

/// A reservation of a claim allocated on a device no slice in card-quota's cache
/// publishes yet (its node's slice behind): the model cannot be told, and the cache is
/// what lags, so the reservation is "try again" (R2), not a refusal of the claim.
#[test]
fn a_reservation_of_a_claim_on_a_device_not_seen_yet_is_try_again() {
    let mut w = World::new();
    let mut p = sharer("s1", "q");
    p["metadata"]["uid"] = json!("u-s1");
    p["metadata"]["annotations"]["volcano.sh/card.name"] = json!("NVIDIA-H200");
    p["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("q");
    w.seen(p.clone());
    p["metadata"]["name"] = json!("s2");
    p["metadata"]["uid"] = json!("u-s2");
    w.seen(p);
    let r = w.send(status_write(
        shared_claim(Some(("gpu-9", &["s1", "s2"]))),
        shared_claim(Some(("gpu-9", &["s1"]))),
    ));
    assert!(!r.allowed);
    assert_eq!(
        r.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("TryAgain"),
        "{}",
        message(&r)
    );
    assert!(message(&r).ends_with("try again"), "{}", message(&r));
}

/// Issue 57: an allocation of devices of two models (a claim of two GPUs that allows
/// both, on a node with one of each) is charged each model's devices before any cache
/// shows it. It was charged as the pod bound there on one model (its first), so the
/// other model's quota looked free until the allocation reached the cache: an RTX pod
/// was admitted into an RTX quota the allocation had used.
#[test]
fn an_allocation_of_two_models_is_charged_each_of_them() {
    use card_quota::decide::batch::{decide_with_ledger, plan, Outcome};
    use card_quota::decide::review::read_review;
    use card_quota::ledger::LedgerRecord;
    let mut w = World::new();
    w.seen(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "mixed-1"}}));
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "mixed-1-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "mixed-1",
            "pool": {"name": "mixed-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}}},
                {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA GeForce RTX 4090"}}}]}}));
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpu", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}}));
    w.seen(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "wide", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":2,\"NVIDIA-GeForce-RTX-4090\":1}"}}}));
    let r = w.send(R::pod("CREATE", claim_pod("a", "wide", "two-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    let mut a = claim_pod("a", "wide", "two-gpu");
    a["metadata"]["annotations"]["volcano.sh/card.name"] = json!(card_name_written(&r).unwrap());
    a["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("wide");
    a["status"] = json!({"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "a-gpu-x1"}]});
    w.seen(a);
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "a-gpu-x1", "namespace": "ml",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}});
    w.seen(claim.clone());
    let mut allocated = claim.clone();
    allocated["status"] = json!({"allocation": {
        "devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "mixed-1", "device": "gpu-0"},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "mixed-1", "device": "gpu-1"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["mixed-1"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "a", "uid": "u-a"}]});
    let req = |doc: Value| read_review(doc.to_string().as_bytes()).unwrap().unwrap();
    let alloc = req(status_write(allocated, claim));
    let wide = card_quota::cards::QueueName::new("wide");
    let now = jiff::Timestamp::now();
    let b = plan(
        &mut w.snap,
        &wide,
        &[&alloc],
        &w.cfg,
        now,
        |_, _| std::time::Duration::ZERO,
        None,
    );
    assert!(
        matches!(&b.outcomes[0], Outcome::Admit(_)),
        "{:?}",
        b.outcomes[0]
    );
    let (_, entry) = b.ledger.iter().next().expect("a's charge");
    assert_eq!(entry.node.as_deref(), Some("mixed-1"));
    let each: Vec<(String, u128)> = entry
        .allocated
        .iter()
        .map(|(m, n)| (m.clone(), n.get()))
        .collect();
    assert_eq!(
        each,
        [
            ("NVIDIA-GeForce-RTX-4090".to_string(), 1),
            ("NVIDIA-H200".to_string(), 1)
        ]
    );
    w.snap.upsert_ledger(LedgerRecord {
        queue: wide.clone(),
        resource_version: Some("1".into()),
        ledger: b.ledger,
        problem: None,
    });
    // Laid over the cache, which shows the claim unallocated: one card of each model.
    let l = w.snap.ledger(&wide).ledger.clone();
    let rows = card_quota::snapshot::overlay::with_ledger(&mut w.snap, &wide, &l, |snap, _| {
        serde_json::to_value(usage_report(snap, now)).unwrap()["wide"].clone()
    });
    for model in ["NVIDIA-H200", "NVIDIA-GeForce-RTX-4090"] {
        assert_eq!(rows[model]["allocated"], 1, "{model}: {rows}");
        assert_eq!(rows[model]["pending"], 0, "{model}: {rows}");
    }
    // The cache shows the claim unallocated: the RTX is taken by the charge alone.
    let mut rtx = claim_pod("b", "wide", "one-gpu");
    rtx["metadata"]["annotations"]["volcano.sh/card.name"] = json!("NVIDIA-GeForce-RTX-4090");
    let d = decide_with_ledger(
        &mut w.snap,
        &req(R::pod("CREATE", rtx).build()),
        &w.cfg,
        now,
    );
    assert!(!d.allowed, "the RTX quota is used by a's allocation");
    assert_eq!(
        d.message.as_deref(),
        Some("queue wide has insufficient NVIDIA-GeForce-RTX-4090 quota: requested 1, in use 1 (allocated 1, pending 0, reserved 0), quota 1")
    );
}

/// R1 for DRA cards: the allocation is where a claim pod's model is chosen, whoever binds
/// the pod after it (a scheduler outside `--binder`, whose bindings no hook checks), so
/// an admitted allocation is a charge recorded before the answer. Two pods admitted for
/// RTX|H200 into a queue with one of each, allocated the RTX of two nodes in one batch,
/// neither bound: the second is refused over the first's charge. (Before, the
/// allocation charged nothing: both were admitted and both bound past the quota by a
/// scheduler whose bindings are not checked.)
#[test]
fn an_allocation_is_a_charge_whoever_binds_the_pod_after_it() {
    use card_quota::decide::batch::{decide_with_ledger, plan, Outcome};
    use card_quota::decide::review::read_review;
    use card_quota::ledger::LedgerRecord;
    let mut w = two_claim_pods_of_both();
    w.seen(rtx_2_slice());
    let req = |doc: Value| read_review(doc.to_string().as_bytes()).unwrap().unwrap();
    let alloc_a = req(status_write(
        allocated_on("a", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("a", None),
    ));
    let alloc_b = req(status_write(
        allocated_on("b", "rtx-1", "rtx-2", "gpu-0"),
        made_claim("b", None),
    ));
    let both = card_quota::cards::QueueName::new("both");
    let now = jiff::Timestamp::now();
    let b = plan(
        &mut w.snap,
        &both,
        &[&alloc_a, &alloc_b],
        &w.cfg,
        now,
        |_, _| std::time::Duration::ZERO,
        None,
    );
    assert!(
        matches!(&b.outcomes[0], Outcome::Admit(_)),
        "{:?}",
        b.outcomes[0]
    );
    let Outcome::Answer(refused) = &b.outcomes[1] else {
        panic!("{:?}", b.outcomes[1]);
    };
    assert!(!refused.allowed);
    assert_eq!(
        refused.message.as_deref(),
        Some("queue both has insufficient NVIDIA-GeForce-RTX-4090 quota: requested 1, in use 2 (allocated 1, pending 1, reserved 0), quota 1")
    );
    // The charge is the pod bound on the allocation's node, charged its model.
    let (_, entry) = b.ledger.iter().next().expect("a's charge");
    assert_eq!(entry.node.as_deref(), Some("rtx-1"));
    assert_eq!(entry.charged.as_deref(), Some("NVIDIA-GeForce-RTX-4090"));
    w.snap.upsert_ledger(LedgerRecord {
        queue: both.clone(),
        resource_version: Some("1".into()),
        ledger: b.ledger,
        problem: None,
    });
    // Over that ledger, the allocation stored: a's binding onto rtx-1 is that charge
    // again; the same allocation written again too; an allocation of a on another node
    // waits until card-quota sees whether the first landed; b fits on the H200.
    w.seen(allocated_on("a", "rtx-1", "rtx-1", "gpu-0"));
    let bind_a = req(R::binding("ml", "a", "rtx-1").build());
    let d = decide_with_ledger(&mut w.snap, &bind_a, &w.cfg, now);
    assert!(d.allowed && d.charge.is_some(), "{:?}", d.message);
    let d = decide_with_ledger(&mut w.snap, &alloc_a, &w.cfg, now);
    assert!(d.allowed && d.charge.is_some(), "{:?}", d.message);
    let elsewhere = req(status_write(
        allocated_on("a", "h200-1", "h200-1", "gpu-0"),
        made_claim("a", None),
    ));
    let d = decide_with_ledger(&mut w.snap, &elsewhere, &w.cfg, now);
    assert!(!d.allowed);
    assert!(
        d.message
            .as_deref()
            .is_some_and(|m| m.ends_with("try again")),
        "{:?}",
        d.message
    );
    let b_h200 = req(status_write(
        allocated_on("b", "h200-1", "h200-1", "gpu-0"),
        made_claim("b", None),
    ));
    let d = decide_with_ledger(&mut w.snap, &b_h200, &w.cfg, now);
    assert!(d.allowed, "{:?}", d.message);
    // a bound by a scheduler whose binding no hook saw: the cache shows it and the
    // charge stops counting there (counted once, by the pod).
    let mut bound = with_claim_made(&w, "a");
    bound["spec"]["nodeName"] = json!("rtx-1");
    bound["metadata"]["resourceVersion"] = json!("50");
    w.seen(bound);
    w.seen(allocated_on("a", "rtx-1", "rtx-1", "gpu-0"));
    let d = decide_with_ledger(&mut w.snap, &b_h200, &w.cfg, now);
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(w.usage("both", "NVIDIA-GeForce-RTX-4090")["allocated"], 1);
}

/// R3 for an allocation's charge, under R2 for the claims' stream: the charge (the pod
/// recorded bound on the allocation's node) stops counting where a cache shows the
/// claim allocated, at the claim's resourceVersion (readers reach it before they decide
/// without the charge), because from there the cache counts the pod bound, unbound as it
/// still is; without the allocation shown, only behind a fence read past the grace (the
/// fence covers claims). Before, such an entry was held to its 120 s TTL, as claims were
/// no stream of the watermark.
#[test]
fn an_allocations_charge_stops_counting_where_the_claim_cache_shows_it() {
    use card_quota::decide::batch::{plan, Outcome};
    use card_quota::decide::review::read_review;
    use card_quota::ledger::entries::{Fate, Fence, Stream, Watermark, UNBOUND_GRACE};
    use card_quota::snapshot::overlay::fate;
    use std::time::Duration;
    let mut w = two_claim_pods_of_both();
    let req = |doc: Value| read_review(doc.to_string().as_bytes()).unwrap().unwrap();
    let alloc_a = req(status_write(
        allocated_on("a", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("a", None),
    ));
    let both = card_quota::cards::QueueName::new("both");
    let now = jiff::Timestamp::now();
    let b = plan(
        &mut w.snap,
        &both,
        &[&alloc_a],
        &w.cfg,
        now,
        |_, _| Duration::ZERO,
        None,
    );
    assert!(
        matches!(&b.outcomes[0], Outcome::Admit(_)),
        "{:?}",
        b.outcomes[0]
    );
    let (id, entry) = b.ledger.iter().next().expect("a's charge");
    let young = Duration::from_secs(1);
    let past_grace = UNBOUND_GRACE + young;
    let fence = Fence {
        mark: Watermark {
            pods: 60,
            podgroups: 7,
            claims: 61,
        },
        taken_ago: Duration::ZERO,
    };
    // The claim shown unallocated: kept, past the grace too, unless behind a fence.
    assert_eq!(
        fate(&w.snap, id, entry, young, now, Some(&fence)),
        Fate::Keep
    );
    assert_eq!(fate(&w.snap, id, entry, past_grace, now, None), Fate::Keep);
    assert_eq!(
        fate(&w.snap, id, entry, past_grace, now, Some(&fence)),
        Fate::Fenced(fence.mark)
    );
    // The claim shown allocated (the pod still unbound): the pod counts bound there, and
    // the charge is reflected at the claim's version, young as it is.
    let mut shown = allocated_on("a", "rtx-1", "rtx-1", "gpu-0");
    shown["metadata"]["resourceVersion"] = json!("41");
    w.seen(shown);
    assert_eq!(
        fate(&w.snap, id, entry, young, now, None),
        Fate::Reflected(Stream::Claims, 41)
    );
    assert_eq!(
        w.usage("both", "NVIDIA-GeForce-RTX-4090"),
        json!({"quota": 1, "allocated": 1, "pending": 0, "reserved": 0}),
        "a, unbound, counts bound on its claim's RTX"
    );
    // With no ledger at all, b's allocation onto another RTX node meets a's card.
    w.seen(rtx_2_slice());
    let alloc_b = req(status_write(
        allocated_on("b", "rtx-1", "rtx-2", "gpu-0"),
        made_claim("b", None),
    ));
    let d = card_quota::decide::batch::decide_with_ledger(&mut w.snap, &alloc_b, &w.cfg, now);
    assert!(!d.allowed, "b's RTX would be the queue's second");
    assert_eq!(
        d.message.as_deref(),
        Some("queue both has insufficient NVIDIA-GeForce-RTX-4090 quota: requested 1, in use 2 (allocated 1, pending 1, reserved 0), quota 1")
    );
}

/// Pods a and b of queue `both` (one RTX, one H200), each admitted for RTX|H200 with its
/// claim made, unallocated.
fn two_claim_pods_of_both() -> World {
    let mut w = World::new();
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "both", "one-gpu")).build());
        assert!(r.allowed, "{}", message(&r));
        w.seen(with_claim_made(&w, name));
        w.seen(made_claim(name, None));
    }
    w
}

/// A second RTX 4090 node's slice (pool rtx-2, on node rtx-1 for the test's nodes).
fn rtx_2_slice() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "rtx-2-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "rtx-1",
            "pool": {"name": "rtx-2", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA GeForce RTX 4090"}}}]}})
}

/// R2 for slices at the allocation: a device no slice in the cache publishes (a node
/// whose slice the watch has not brought yet) is "try again", never a charge of nothing
/// (found writing the test above: the allocation was admitted, charged no card, and the
/// pod's binding after it would have been that charge again).
#[test]
fn an_allocation_on_a_device_not_seen_yet_is_try_again() {
    use card_quota::decide::review::read_review;
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", claim_pod("b", "both", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    w.seen(with_claim_made(&w, "b"));
    w.seen(made_claim("b", None));
    let alloc = read_review(
        status_write(
            allocated_on("b", "rtx-1", "rtx-1", "gpu-7"),
            made_claim("b", None),
        )
        .to_string()
        .as_bytes(),
    )
    .unwrap()
    .unwrap();
    let now = jiff::Timestamp::now();
    let d = card_quota::decide::batch::decide_with_ledger(&mut w.snap, &alloc, &w.cfg, now);
    assert!(!d.allowed && d.charge.is_none(), "{d:?}");
    assert_eq!(
        d.message.as_deref(),
        Some("ResourceClaim ml/b-gpu-x1: status.allocation.devices.results[0] names device gpu.nvidia.com/rtx-1/gpu-7, which no ResourceSlice publishes; try again")
    );
    // Its binding too, the cache showing the claim so allocated.
    w.seen(allocated_on("b", "rtx-1", "rtx-1", "gpu-7"));
    let r = w.send(R::binding("ml", "b", "rtx-1").build());
    assert!(!r.allowed);
    assert!(message(&r).ends_with("; try again"), "{}", message(&r));
}

/// R2 for slices where a pod is counted: a pod bound with its claim allocated a device
/// this cache's slices do not publish yet (its node's slice behind) counts bound on
/// every model it may have got until the slice comes, never on none (it counted nothing
/// before: a pod that cannot be charged, and another pod's binding fitted beside it).
#[test]
fn a_pod_bound_on_a_device_no_slice_shows_yet_counts_on_every_model_it_may_have_got() {
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", claim_pod("a", "both", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    let mut bound = with_claim_made(&w, "a");
    bound["spec"]["nodeName"] = json!("rtx-1");
    w.seen(bound);
    w.seen(allocated_on("a", "rtx-1", "rtx-2", "gpu-0"));
    let in_use = |w: &World| {
        (
            w.usage("both", "NVIDIA-GeForce-RTX-4090")["allocated"].clone(),
            w.usage("both", "NVIDIA-H200")["allocated"].clone(),
        )
    };
    assert_eq!(in_use(&w), (json!(1), json!(1)));
    w.seen(rtx_2_slice());
    assert_eq!(in_use(&w), (json!(1), json!(0)));
}

#[test]
fn an_allocation_of_a_model_the_pod_was_not_admitted_for_is_refused_at_the_write() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", claim_pod("a", "q", "one-gpu")).build())
            .allowed
    );
    w.seen(with_claim_made(&w, "a"));
    w.seen(made_claim("a", None));
    let r = w.send(status_write(
        allocated_on("a", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("a", None),
    ));
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/a accepts NVIDIA-H200 but node rtx-1 has NVIDIA-GeForce-RTX-4090"
    );
}

/// Under warn nothing is pinned, so the scheduler's choice of devices stands: an
/// allocation (or a reservation of a shared claim) on a model the pod's inferred
/// `card.name` does not list is admitted with what deny would have said, and charged
/// the devices' models.
#[test]
fn under_warn_an_allocation_on_a_model_the_pod_was_not_named_for_is_admitted() {
    let mut w = World::new();
    w.cfg.enforcement = card_quota::decide::Enforcement::Warn;
    let r = w.send(R::pod("CREATE", claim_pod("a", "q", "one-gpu")).build());
    assert_eq!(card_name_written(&r).as_deref(), Some("NVIDIA-H200"));
    let mut a = with_claim_made(&w, "a");
    a["metadata"]["annotations"]["volcano.sh/card.name"] = json!("NVIDIA-H200");
    a["metadata"]["uid"] = json!("u-a");
    w.seen(a);
    w.seen(made_claim("a", None));
    let r = w.send(status_write(
        allocated_on("a", "rtx-1", "rtx-1", "gpu-0"),
        made_claim("a", None),
    ));
    assert!(r.allowed, "{}", message(&r));
    assert!(
        r.warnings.iter().any(|x| x.contains(
            "under deny: pod ml/a accepts NVIDIA-H200 but node rtx-1 has NVIDIA-GeForce-RTX-4090"
        )),
        "{:?}",
        r.warnings
    );
    // A sharer named for the H200 reserved an RTX 4090 allocated for another pod.
    let mut s = sharer("s", "q");
    s["metadata"]["uid"] = json!("u-s");
    s["metadata"]["annotations"]["volcano.sh/card.name"] = json!("NVIDIA-H200");
    w.seen(s);
    let on_rtx = |pods: &[&str]| {
        let mut c = shared_claim(Some(("gpu-0", pods)));
        c["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("rtx-1");
        c
    };
    let reviewed = review(
        &status_write(on_rtx(&["x", "s"]), on_rtx(&["x"])),
        &mut w.snap,
        &w.cfg,
        jiff::Timestamp::now(),
        true,
    );
    let r = reviewed.out.response;
    assert!(r.allowed, "{}", message(&r));
    assert!(
        r.warnings.iter().any(|x| x.contains("under deny: pod ml/s accepts NVIDIA-H200 but ResourceClaim ml/shared is allocated on NVIDIA-GeForce-RTX-4090")),
        "{:?}",
        r.warnings
    );
    // The scheduler reads no warning: the admin sees it on the pod, as a Warning Event.
    let d = reviewed.decision.expect("decided");
    assert!(d.warned());
    let e = d.event.expect("an Event for the pod");
    assert_eq!(
        (e.reason, e.regarding.name.as_str(), e.warning),
        ("CardQuotaWouldRefuse", "s", true)
    );
    assert_eq!(
        e.message,
        "admitted in warn mode; under deny: pod ml/s accepts NVIDIA-H200 but ResourceClaim ml/shared is allocated on NVIDIA-GeForce-RTX-4090: the pod would run on a card model it does not accept"
    );
}

/// Found by tests/dra_model.rs: a shared claim paid by a sharer still pending went into
/// use unchecked when another sharer bound first. The pod whose binding puts the claim's
/// cards to use pays for them, and its binding is checked for them.
#[test]
fn the_sharer_bound_first_pays_for_the_claim_and_its_binding_is_checked() {
    let mut w = World::new();
    w.seen(shared_claim(None));
    for name in ["s1", "s2"] {
        let r = w.send(R::pod("CREATE", sharer(name, "both")).build());
        assert!(r.allowed, "{}", message(&r));
    }
    // t takes an H200 and is bound: the queue's one H200 is allocated.
    let r = w.send(R::pod("CREATE", claim_pod("t", "both", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    let mut t = claim_pod("t", "both", "one-gpu");
    t["metadata"]["annotations"]["volcano.sh/card.name"] = json!(card_name_written(&r));
    t["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("both");
    t["status"] = json!({"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "t-gpu-x1"}]});
    w.seen(t);
    w.seen(made_claim("t", Some(("h200-1", "gpu-0"))));
    let r = w.send(R::binding("ml", "t", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    // A scheduler that reads no pin allocates the shared claim an H200 too, reserved
    // for s1 then s2 (no hook saw it); s2 is bound first. An allocated claim's card is
    // taken: it counts allocated for its payer before any sharer is bound.
    w.seen(shared_claim(Some(("gpu-1", &["s1", "s2"]))));
    assert_eq!(w.usage("both", "NVIDIA-H200")["allocated"], 2);
    let r = w.send(R::binding("ml", "s2", "h200-1").build());
    assert!(!r.allowed, "the claim's H200 would be the queue's second");
    assert_eq!(
        message(&r),
        "queue both has insufficient NVIDIA-H200 quota: requested 1, in use 2 (allocated 2, pending 0, reserved 0), quota 1"
    );
    assert_eq!(w.usage("both", "NVIDIA-H200")["allocated"], 2);
    // t gone, s2's binding fits: s2 pays now, s1 (pending) no longer does.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "t");
    let r = w.send(R::binding("ml", "s2", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        w.usage("both", "NVIDIA-H200"),
        json!({"quota": 1, "allocated": 1, "pending": 0, "reserved": 0})
    );
    // s1 bound beside it adds nothing; s2 gone, s1 pays the same card.
    let r = w.send(R::binding("ml", "s1", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("both", "NVIDIA-H200")["allocated"], 1);
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "s2");
    w.seen(shared_claim(Some(("gpu-1", &["s1"]))));
    assert_eq!(
        w.usage("both", "NVIDIA-H200"),
        json!({"quota": 1, "allocated": 1, "pending": 0, "reserved": 0})
    );
}

/// Queue `one`: one H200.
fn queue_one() -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "one", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":1}"}}})
}

/// Issue 57 #3: a claim shared by pods of two queues was paid in one of them; when its
/// payer went, the cards landed in the other, full queue (2 of 1) and nothing was
/// refused. Who pays is decided per queue: every queue with a user of the claim counts
/// its cards once, so a queue's sharer is charged, and checked, like any claim pod.
#[test]
fn a_claim_shared_across_queues_is_paid_in_each_queue_that_uses_it() {
    let mut w = World::new();
    w.seen(queue_one());
    w.seen(shared_claim(None));
    // s1 of q takes the claim; z of `one` takes `one`'s one H200.
    let r = w.send(R::pod("CREATE", sharer("s1", "q")).build());
    assert!(r.allowed, "{}", message(&r));
    let r = w.send(R::pod("CREATE", claim_pod("z", "one", "one-gpu")).build());
    assert!(r.allowed, "{}", message(&r));
    // s2 of the full `one` asks for the same claim: it would be `one`'s second H200.
    let r = w.send(R::pod("CREATE", sharer("s2", "one")).build());
    assert!(!r.allowed, "the shared claim's H200 would be one's second");
    assert!(
        message(&r)
            .starts_with("queue one has insufficient NVIDIA-H200 quota: requested 1, in use 1"),
        "{}",
        message(&r)
    );
    // z gone, s2 fits: admitted, and paid in one as well as in q.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "z");
    let r = w.send(R::pod("CREATE", sharer("s2", "one")).build());
    assert!(r.allowed, "{}", message(&r));
    w.seen(shared_claim(Some(("gpu-0", &["s1", "s2"]))));
    for name in ["s1", "s2"] {
        let r = w.send(R::binding("ml", name, "h200-1").build());
        assert!(r.allowed, "{}", message(&r));
    }
    let one = json!({"quota": 1, "allocated": 1, "pending": 0, "reserved": 0});
    assert_eq!(w.usage("one", "NVIDIA-H200"), one);
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
    // q's sharer gone: one still counts the card once, and q no more.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "s1");
    w.seen(shared_claim(Some(("gpu-0", &["s2"]))));
    assert_eq!(w.usage("one", "NVIDIA-H200"), one);
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 0);
}

/// A sharer whose PodGroup moves to another queue pays for the claim there (and its
/// old queue, with a sharer left, still does): shared claims are paid per queue.
#[test]
fn a_sharer_moved_to_another_queue_pays_for_the_claim_there() {
    let mut w = World::new();
    w.seen(queue_one());
    let group = |name: &str, queue: &str| {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
            "spec": {"queue": queue, "minMember": 1}, "status": {"phase": "Running"}})
    };
    w.seen(group("g1", "q"));
    w.seen(group("g2", "q"));
    w.seen(shared_claim(Some(("gpu-0", &["s1", "s2"]))));
    // Bound as a watch shows them (made while card-quota was away: not stamped).
    for (name, g) in [("s1", "g1"), ("s2", "g2")] {
        let mut p = sharer(name, "q");
        p["metadata"]["annotations"] = json!({"scheduling.k8s.io/group-name": g});
        p["spec"]["nodeName"] = json!("h200-1");
        p["status"] = json!({"phase": "Running"});
        w.seen(p);
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
    assert_eq!(w.usage("one", "NVIDIA-H200")["allocated"], 0);
    w.seen(group("g2", "one"));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
    assert_eq!(w.usage("one", "NVIDIA-H200")["allocated"], 1);
    // And back: counted once, in q.
    w.seen(group("g2", "q"));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
    assert_eq!(w.usage("one", "NVIDIA-H200")["allocated"], 0);
}

/// Found by the committer model (2026-12-04): a sharer shown bound while the claim
/// watch lags (the claim not reserved for it, not even allocated, as far as the cache
/// shows) paid nothing; the pending sharer first by name paid instead, as a pending
/// card. After a quota cut, another claim pod's allocation passed the binding's hard
/// line (bound cards within the quota) beside the bound sharer's card. A bound sharer
/// pays first.
#[test]
fn a_sharer_bound_before_the_claim_shows_it_reserved_pays_as_bound() {
    let mut w = World::new();
    w.seen(queue_one());
    w.seen(shared_claim(None));
    w.seen(sharer("s1", "one"));
    let mut s2 = sharer("s2", "one");
    s2["spec"]["nodeName"] = json!("h200-1");
    s2["status"] = json!({"phase": "Running"});
    w.seen(s2);
    assert_eq!(w.usage("one", "NVIDIA-H200")["allocated"], 1);
    assert_eq!(w.usage("one", "NVIDIA-H200")["pending"], 0);
    // z of `one`, made while card-quota was away: its allocation would be one's second
    // bound H200.
    let mut z = claim_pod("z", "one", "one-gpu");
    z["status"] = json!({"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "z-gpu-x1"}]});
    w.seen(z);
    w.seen(made_claim("z", None));
    let r = w.send(status_write(
        allocated_on("z", "h200-1", "h200-1", "gpu-1"),
        made_claim("z", None),
    ));
    assert!(!r.allowed, "a second bound H200 in a quota of 1");
}

/// Issue 57 #2: a claim as a stalled ResourceClaim watch shows it, still reserved for a
/// pod the pod watch shows deleted: the gone pod named as the payer left the claim's
/// cards counted nowhere, and another pod of the full queue was admitted. A payer is a
/// pod held, of the queue, not finished.
#[test]
fn a_claim_reserved_for_a_pod_gone_is_paid_by_a_sharer_held() {
    let mut w = World::new();
    w.seen(queue_one());
    w.seen(shared_claim(None));
    for name in ["s1", "s2"] {
        let r = w.send(R::pod("CREATE", sharer(name, "one")).build());
        assert!(r.allowed, "{}", message(&r));
    }
    // Allocated for s1 and bound; s2 not bound yet.
    w.seen(shared_claim(Some(("gpu-0", &["s1", "s2"]))));
    let r = w.send(R::binding("ml", "s1", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    // s1 deleted; the claim's watch stalls before the claim controller's write.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "s1");
    let r = w.send(R::pod("CREATE", claim_pod("t", "one", "one-gpu")).build());
    assert!(
        !r.allowed,
        "one's one H200 is in use through the claim s2 uses"
    );
}

#[test]
fn a_terminating_sharer_hands_the_claim_to_one_that_stays_when_it_is_deleted() {
    let mut w = World::new();
    w.seen(shared_claim(None));
    for name in ["s1", "s2"] {
        let r = w.send(R::pod("CREATE", sharer(name, "both")).build());
        assert!(r.allowed, "{}", message(&r));
    }
    w.seen(shared_claim(Some(("gpu-1", &["s1", "s2"]))));
    for name in ["s1", "s2"] {
        let r = w.send(R::binding("ml", name, "h200-1").build());
        assert!(r.allowed, "{}", message(&r));
    }
    // s1 is deleted with 30 s of grace; s2 keeps the claim's card in use.
    let now = jiff::Timestamp::now();
    let deadline = now + jiff::SignedDuration::from_secs(30);
    let mut s1 = sharer("s1", "both");
    s1["spec"]["nodeName"] = json!("h200-1");
    s1["metadata"]["deletionTimestamp"] =
        json!(deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    s1["status"] = json!({"phase": "Running"});
    w.seen(s1);
    let counted = json!({"quota": 1, "allocated": 1, "pending": 0, "reserved": 0});
    assert_eq!(w.usage_at("both", "NVIDIA-H200", now), counted);
    // Past s1's deadline no event comes, and s1 counts no more (the ResourceQuota rule);
    // the card s2 uses still counts, once.
    let later = now + jiff::SignedDuration::from_secs(60);
    assert_eq!(w.usage_at("both", "NVIDIA-H200", later), counted);
}

/// Issue 57 #6: a watcher counts a claim's requirements against every device without the
/// lock, on a view of the snapshot's devices; stored after a slice changed, the count is
/// of an older generation and the claim is counted again, so a node that joined between
/// is not missed.
#[test]
fn a_claim_counted_without_the_lock_is_counted_again_when_devices_changed_since() {
    use card_quota::snapshot::DraRecord;
    let mut w = World::new();
    w.seen(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "b200", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-B200\":1}"}}}));
    // Selectors of their own: requirements no other object holds yet.
    let claim = |name: &str| {
        let selector = format!("device.attributes['gpu.nvidia.com'].type != '{name}'");
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": selector}}]}}]}}})
    };
    let pod = |name: &str, claim: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "annotations": {"scheduling.volcano.sh/queue-name": "b200"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}})
    };
    let read = |v: &Value, w: &World| DraRecord::read(v, "", w.snap.dra()).unwrap().unwrap();
    // Both counted before a B200 node joins; "fresh" counted again after it.
    let (stale, fresh) = (read(&claim("stale"), &w), read(&claim("fresh"), &w));
    let before = w.snap.dra_view();
    let stale_count = stale.prepare(&before);
    w.seen(b200_slice());
    let fresh_count = fresh.prepare(&w.snap.dra_view());
    let here = |w: &World| w.snap.dra_objects().requirements_counted_here();
    let before = here(&w);
    w.snap
        .store_dra_record(stale, stale_count.as_ref())
        .unwrap();
    assert_eq!(
        here(&w),
        before + 1,
        "a count of an older generation is counted again"
    );
    w.snap
        .store_dra_record(fresh, fresh_count.as_ref())
        .unwrap();
    assert_eq!(
        here(&w),
        before + 1,
        "a count of this generation is taken as it is"
    );
    // A status write (an allocation) of a held claim counts nothing again: its
    // requirement is held before the old record lets it go.
    let mut allocated = claim("fresh");
    allocated["status"] = json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "b200-1", "device": "gpu-0"}]}}});
    w.seen(allocated);
    assert_eq!(
        here(&w),
        before + 1,
        "a status write counts no requirement again"
    );
    // Each may get a B200: a pod of the B200-only queue is admitted with either.
    for (p, c) in [("p1", "stale"), ("p2", "fresh")] {
        let r = w.send(R::pod("CREATE", pod(p, c)).build());
        assert!(
            r.allowed || message(&r).contains("insufficient NVIDIA-B200"),
            "{p}: {}",
            message(&r)
        );
        assert!(!message(&r).contains("allow only"), "{p}: {}", message(&r));
    }
}

/// Issue 57 #6: an admin's change of the DeviceClass every claim asks through is counted
/// without the lock (the class's requirements held, with its new selectors, against
/// every device), so no decision waits on it; under the lock nothing is counted again
/// when no device or class changed since, and the answer is the one counted there.
#[test]
fn a_device_class_change_is_counted_without_the_lock() {
    use card_quota::snapshot::DraRecord;
    let class = |expression: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}})
    };
    let h200_only = class("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'");
    let read = |v: &Value, w: &World| DraRecord::read(v, "", w.snap.dra()).unwrap().unwrap();
    let here = |w: &World| w.snap.dra_objects().requirements_counted_here();
    // The same change stored twice: counted without the lock, and under it.
    let mut served = World::new();
    served.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "fallback", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "h200", "deviceClassName": "gpu.nvidia.com",
             "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]},
            {"name": "any", "deviceClassName": "gpu.nvidia.com"}]}]}}}}));
    let mut locked = World::of(CLUSTER);
    locked.snap = served.snap.clone();
    let record = read(&h200_only, &served);
    assert_eq!(
        served.seen_as_the_watcher(record),
        0,
        "nothing counted under the lock"
    );
    let before_locked = here(&locked);
    locked.seen(h200_only.clone());
    assert!(here(&locked) > before_locked, "counted under the lock");
    // Both now read the RTX 4090 out of every request of the class.
    for w in [&mut served, &mut locked] {
        let r = w.send(R::pod("CREATE", claim_pod("a", "both", "one-gpu")).build());
        assert_eq!(
            card_name_written(&r).as_deref(),
            Some("NVIDIA-H200"),
            "{}",
            message(&r)
        );
        let r = w.send(R::pod("CREATE", claim_pod("b", "both", "fallback")).build());
        assert!(!r.allowed, "the one H200 is taken: {}", message(&r));
    }
    // A count of an older generation (a slice changed since) is counted again here;
    // the class deleted is counted without the lock too.
    let gone = DraRecord::ClassGone("gpu.nvidia.com".into());
    let stale = gone.prepare(&served.snap.dra_view());
    served.seen(b200_slice());
    let before = here(&served);
    served.snap.store_dra_record(gone, stale.as_ref()).unwrap();
    assert!(here(&served) > before, "a stale count is not taken");
}

/// The slice of a node with one B200 (the first of its model to join).
fn b200_slice() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "b200-1-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "b200-1", "pool": {"name": "b200-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA B200"}}}]}})
}

/// Issue 57 #6: a class that comes to select cards (the first node of its model joining
/// an autoscaled pool) or stops changes which claims ask for cards, and nothing is
/// counted against every device under the lock: the requirements of every class are
/// held and counted as devices come and go, card class or not yet.
#[test]
fn a_class_that_comes_to_select_cards_counts_nothing_under_the_lock() {
    use card_quota::snapshot::DraRecord;
    let mut served = World::new();
    for v in [
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "b200", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-B200\":1}"}}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "b200.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"}}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "own-b200", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "b200.example.com",
                "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}]}}}}),
    ] {
        served.seen(v);
    }
    // No B200 anywhere: the class selects no card, so its requests ask for none.
    let r = served.send(R::pod("CREATE", claim_pod("before", "b200", "own-b200")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(card_name_written(&r), None);
    let mut locked = World::of(CLUSTER);
    locked.snap = served.snap.clone();
    let slice = b200_slice();
    // The first B200 node joins, judged without the lock as the watcher does.
    let record = DraRecord::read(&slice, "", served.snap.dra())
        .unwrap()
        .unwrap();
    assert_eq!(
        served.seen_as_the_watcher(record),
        0,
        "nothing counted under the lock"
    );
    locked.seen(slice);
    // Both now read the class's requests as B200s: the pod admitted before takes the
    // queue's one B200 (its claims are read again), and the next does not fit.
    for w in [&mut served, &mut locked] {
        assert_eq!(w.usage("b200", "NVIDIA-B200")["pending"], 1);
        let r = w.send(R::pod("CREATE", claim_pod("a", "b200", "own-b200")).build());
        assert!(
            message(&r).starts_with("queue b200 has insufficient NVIDIA-B200 quota"),
            "{}",
            message(&r)
        );
    }
    // The node leaves: the class stops selecting cards, and again nothing is counted.
    let gone = DraRecord::SliceGone("b200-1-gpu.nvidia.com".into());
    assert_eq!(
        served.seen_as_the_watcher(gone),
        0,
        "nothing counted under the lock"
    );
    let r = served.send(R::pod("CREATE", claim_pod("after", "b200", "own-b200")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(card_name_written(&r), None);
}

/// Issue 57 #4: cards asked for through a DeviceClass the install does not list (an
/// admin's own class selecting the NVIDIA driver's H200s) are cards all the same: the
/// class's selectors match a card driver's devices. A class that selects only another
/// driver's devices (a NIC) still asks for none.
#[test]
fn an_admins_own_class_selecting_a_card_drivers_devices_asks_for_cards() {
    let mut w = World::new();
    for v in [
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "h200.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "own-h200", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "h200.example.com"}}]}}}}),
    ] {
        w.seen(v);
    }
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "q", "own-h200")).build());
        assert!(r.allowed, "{}", message(&r));
        assert_eq!(card_name_written(&r).as_deref(), Some("NVIDIA-H200"));
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 2);
    let r = w.send(R::pod("CREATE", claim_pod("c", "q", "own-h200")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue q has insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
    let r = w.send(R::pod("CREATE", claim_pod("nic", "q", "one-nic")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(card_name_written(&r), None);
}

/// Kubernetes 1.37's DRA-backed extended resources: NVIDIA's class serves
/// `nvidia.com/gpu` (`extendedResourceName`) on nodes whose allocatable does not list it.
/// h200-dra carries GPU Feature Discovery's product label, rtx-dra none; mixed publishes
/// two models.
const EXTENDED: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: both, annotations: {volcano.sh/card.quota: '{"NVIDIA-GeForce-RTX-4090":1,"NVIDIA-H200":2}'}}}
- {apiVersion: v1, kind: Node, metadata: {name: h200-dra, labels: {nvidia.com/gpu.product: NVIDIA-H200}}, status: {allocatable: {cpu: "8", pods: "110"}}}
- {apiVersion: v1, kind: Node, metadata: {name: rtx-dra}, status: {allocatable: {cpu: "8", pods: "110"}}}
- {apiVersion: v1, kind: Node, metadata: {name: mixed}, status: {allocatable: {cpu: "8", pods: "110"}}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.nvidia.com}
  spec:
    extendedResourceName: nvidia.com/gpu
    selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: h200-dra-gpu}
  spec:
    driver: gpu.nvidia.com
    nodeName: h200-dra
    pool: {name: h200-dra, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-1, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-2-mig-0, attributes: {type: {string: mig}, productName: {string: NVIDIA H200}, profile: {string: 1g.18gb}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: rtx-dra-gpu}
  spec:
    driver: gpu.nvidia.com
    nodeName: rtx-dra
    pool: {name: rtx-dra, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA GeForce RTX 4090}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: mixed-gpu}
  spec:
    driver: gpu.nvidia.com
    nodeName: mixed
    pool: {name: mixed, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-1, attributes: {type: {string: gpu}, productName: {string: NVIDIA A100}}}
"#;

/// The claim kube-scheduler makes for `pod`'s `nvidia.com/gpu`, allocated device
/// `device` of `node` (its pool) and reserved for the pod.
fn extended_claim(pod: &str, allocated: Option<(&str, &str)>) -> Value {
    let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("{pod}-extended-resources-x1"), "namespace": "ml",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": format!("u-{pod}"), "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}});
    if let Some((node, device)) = allocated {
        c["status"] = json!({"allocation": {
            "devices": {"results": [{"request": "container-0-request-0", "driver": "gpu.nvidia.com", "pool": node, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("u-{pod}")}]});
    }
    c
}

#[test]
fn a_plain_gpu_pod_served_through_dra_is_pinned_at_create_and_charged_once() {
    let mut w = World::of(EXTENDED);
    // The node's DRA devices of the class are its nvidia.com/gpu; two models behind
    // one resource name no model.
    let n = w.snap.node("h200-dra").unwrap();
    assert_eq!(
        n.model_for("nvidia.com/gpu").map(|m| m.as_str()),
        Some("NVIDIA-H200")
    );
    let mixed = w.snap.node("mixed").unwrap();
    assert_eq!(mixed.model_for("nvidia.com/gpu"), None);
    assert_eq!(mixed.extended_problems, vec!["nvidia.com/gpu is served through DRA by devices of several models (1 NVIDIA-A100, 1 NVIDIA-H200): card-quota cannot tell which a pod gets".to_string()]);
    let r = w.send(R::pod("CREATE", support::pod("a").queue("q").gpus("1").build()).build());
    assert!(r.allowed, "{}", message(&r));
    assert!(
        patch(&r)
            .as_array()
            .unwrap()
            .iter()
            .any(|op| op["path"] == "/spec/nodeSelector"
                && op["value"]["nvidia.com/gpu.product"] == "NVIDIA-H200"),
        "{}",
        patch(&r)
    );
    let r = w.send(R::pod("CREATE", support::pod("b").queue("q").gpus("1").build()).build());
    assert!(!r.allowed);
    assert!(message(&r).contains("quota 1"), "{}", message(&r));
    // kube-scheduler's claim for a: its allocation is checked as a's binding will be,
    // and the cards are a's, counted once.
    let r = w.send(status_write(
        extended_claim("a", Some(("h200-dra", "gpu-0"))),
        extended_claim("a", None),
    ));
    assert!(r.allowed, "{}", message(&r));
    w.seen(extended_claim("a", Some(("h200-dra", "gpu-0"))));
    let r = w.send(R::binding("ml", "a", "h200-dra").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        w.usage("q", "NVIDIA-H200")["allocated"],
        1,
        "{:?}",
        w.usage("q", "NVIDIA-H200")
    );
}

#[test]
fn an_extended_resource_allocation_is_refused_before_the_binding() {
    let mut w = World::of(EXTENDED);
    // Admitted for the H200s of `both` (pinned by the product label).
    for name in ["a", "b"] {
        let pod = support::pod(name)
            .queue("both")
            .card("NVIDIA-H200")
            .gpus("1")
            .build();
        let r = w.send(R::pod("CREATE", pod).build());
        assert!(r.allowed, "{}", message(&r));
    }
    // A device of another model than a was admitted for: refused at the write.
    let r = w.send(status_write(
        extended_claim("a", Some(("rtx-dra", "gpu-0"))),
        extended_claim("a", None),
    ));
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/a accepts NVIDIA-H200 but node rtx-dra has NVIDIA-GeForce-RTX-4090"
    );
    // The queue's H200s filled behind the pods' backs (the quota cut to 1 and a bound):
    // b's allocation finds no room.
    let r = w.send(status_write(
        extended_claim("a", Some(("h200-dra", "gpu-0"))),
        extended_claim("a", None),
    ));
    assert!(r.allowed, "{}", message(&r));
    w.seen(extended_claim("a", Some(("h200-dra", "gpu-0"))));
    assert!(w.send(R::binding("ml", "a", "h200-dra").build()).allowed);
    w.seen(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "both", "annotations": {"volcano.sh/card.quota": r#"{"NVIDIA-GeForce-RTX-4090":1,"NVIDIA-H200":1}"#}}}));
    let r = w.send(status_write(
        extended_claim("b", Some(("h200-dra", "gpu-1"))),
        extended_claim("b", None),
    ));
    assert!(!r.allowed);
    assert!(
        message(&r).contains("insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
}

#[test]
fn without_a_product_label_a_dra_served_model_cannot_be_pinned_and_is_refused_at_create() {
    let mut w = World::of(EXTENDED);
    let pod = support::pod("r")
        .queue("both")
        .card("NVIDIA-GeForce-RTX-4090")
        .gpus("1")
        .build();
    let r = w.send(R::pod("CREATE", pod).build());
    assert!(!r.allowed);
    assert_eq!(message(&r), "pod ml/r may use NVIDIA-GeForce-RTX-4090 in queue both, but the nodes that offer NVIDIA-GeForce-RTX-4090 for nvidia.com/gpu carry no product label (nvidia.com/gpu.product) to place it with: card-quota places a card pod only where it can pin it (GPU Feature Discovery writes the label)");
    // A plain pod whose labelled models are full: the refusal says why the unlabelled
    // one is no way out.
    for name in ["h1", "h2"] {
        let pod = support::pod(name)
            .queue("both")
            .card("NVIDIA-H200")
            .gpus("1")
            .build();
        assert!(w.send(R::pod("CREATE", pod).build()).allowed);
    }
    let r = w.send(R::pod("CREATE", support::pod("p").queue("both").gpus("1").build()).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue both has insufficient NVIDIA-H200 quota: requested 1, in use 2")
            && message(&r).ends_with("; the nodes that offer NVIDIA-GeForce-RTX-4090 for nvidia.com/gpu carry no product label (nvidia.com/gpu.product) to place it with: card-quota places a card pod only where it can pin it (GPU Feature Discovery writes the label)"),
        "{}",
        message(&r)
    );
}

/// Kubernetes 1.36's partitionable devices (counters in a slice of their own, each MIG
/// partition a device that consumes them) and consumable capacity (one device allocated
/// to several claims, each result with a `shareID`): every device is read with its
/// model, and every allocation is charged one card of it.
#[test]
fn partitions_and_shared_devices_of_kubernetes_1_36_are_charged_per_allocation() {
    let mut w = World::new();
    let pool = json!({"name": "h200-1-p", "generation": 1, "resourceSliceCount": 2});
    let counters = json!([{"counterSet": "gpu-3", "counters": {"memory": {"value": "18Gi"}}}]);
    w.seen(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "h200-1-counters"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "h200-1", "pool": pool,
            "sharedCounters": [{"name": "gpu-3", "counters": {"memory": {"value": "141Gi"}}}]}}),
    );
    w.seen(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "h200-1-partitions"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "h200-1", "pool": pool, "devices": [
            {"name": "gpu-3-mig-1g", "consumesCounters": counters,
             "attributes": {"type": {"string": "mig"}, "productName": {"string": "NVIDIA H200"}, "profile": {"string": "1g.18gb"}}},
            {"name": "gpu-3", "allowMultipleAllocations": true, "consumesCounters": counters,
             "capacity": {"memory": {"value": "141Gi", "requestPolicy": {"default": "18Gi"}}},
             "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}}}]}}));
    let models: Vec<String> = w.snap.dra_objects().slices()["h200-1-partitions"]
        .iter()
        .map(|d| match &d.model {
            Some(Ok(m)) => m.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(models, ["NVIDIA-H200/mig-1g.18gb-mixed", "NVIDIA-H200"]);
    assert!(w.snap.dra_objects().slices()["h200-1-counters"].is_empty());
    // gpu-3 shared by a's and b's claims: two allocations, two cards of q's two.
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", claim_pod(name, "q", "one-gpu")).build());
        assert!(r.allowed, "{}", message(&r));
        w.seen(with_claim_made(&w, name));
        let mut claim = made_claim(name, Some(("h200-1-p", "gpu-3")));
        claim["status"]["allocation"]["devices"]["results"][0]["shareID"] =
            json!(format!("share-{name}"));
        claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] =
            json!({"memory": "18Gi"});
        w.seen(claim);
        let r = w.send(R::binding("ml", name, "h200-1").build());
        assert!(r.allowed, "{}", message(&r));
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2);
    let r = w.send(R::pod("CREATE", claim_pod("c", "q", "one-gpu")).build());
    assert!(!r.allowed);
}
