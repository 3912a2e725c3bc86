//! Every admission rule of docs/decisions.md, as table tests through the same path the webhook
//! and replay use (AdmissionReview JSON in, AdmissionResponse out, effects applied).

mod support;

use base64::Engine;
use card_quota::admission::{apply, review, usage_report};
use card_quota::cards::QueueName;
use card_quota::decide::enforcement::decide_enforcing;
use card_quota::decide::review::{parse_review, AdmissionResponse, ReviewBuilder as R};
use card_quota::decide::{Config, Enforcement, ScalePolicy};
use card_quota::snapshot::load::load;
use card_quota::snapshot::Snapshot;
use serde_json::{json, Value};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: h200-1, labels: {nvidia.com/gpu.product: NVIDIA-H200, nvidia.com/gpu.memory: "143771", nvidia.com/gpu.replicas: "2"}}
status: {allocatable: {nvidia.com/gpu: "8", nvidia.com/mig-1g.18gb: "7", nvidia.com/gpu.shared: "4"}}
---
apiVersion: v1
kind: Node
metadata: {name: rtx-1, labels: {nvidia.com/gpu.product: RTX-4090, zone: a}}
status: {allocatable: {nvidia.com/gpu: "4"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":3,"RTX-4090":2,"NVIDIA-H200/mig-1g.18gb-mixed":4}'}}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: closed, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":3}'}}
status: {state: Closed}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: broken, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":'}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}, annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: RTX-4090}}
    spec: {schedulerName: volcano, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web-1
  namespace: ml
  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: web, uid: u, controller: true}]
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}, annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: RTX-4090}}
    spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;

struct World {
    snap: Snapshot,
    cfg: Config,
}

impl World {
    fn new() -> Self {
        Self::with(CLUSTER)
    }
    /// A cluster whose install also gates `example.com/npu` (`--card-resource`).
    fn with_npu(yaml: &str) -> Self {
        let mut cards: Vec<&str> = card_quota::cards::resources::DEFAULT_CARD_RESOURCES.to_vec();
        cards.push("example.com/npu");
        let cards = card_quota::cards::CardResources::parse(&cards).unwrap();
        let (snap, skipped) = card_quota::snapshot::load::load_with(yaml, &cards).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
        }
    }
    fn with(yaml: &str) -> Self {
        let (snap, skipped) = load(yaml).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
        }
    }
    /// Decides and, when admitted, applies the effect.
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
    fn usage(&self, queue: &str, model: &str) -> Value {
        serde_json::to_value(usage_report(&self.snap, jiff::Timestamp::now()))
            .unwrap()
            .pointer(&format!("/{queue}/{}", model.replace('/', "~1")))
            .cloned()
            .unwrap_or(Value::Null)
    }
}

fn pod(name: &str, queue: &str, card: Option<&str>, gpus: &str) -> Value {
    pod_res(name, queue, card, "nvidia.com/gpu", gpus)
}

fn pod_res(name: &str, queue: &str, card: Option<&str>, resource: &str, n: &str) -> Value {
    let b = support::pod(name)
        .queue(queue)
        .scheduler("volcano")
        .resource(resource, n);
    match card {
        Some(c) => b.card(c),
        None => b,
    }
    .build()
}

/// A node of a vendor outside the default prefixes: it announces `example.com` cards.
fn npu_node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "npu-1", "labels": {"example.com/npu.product": "X-NPU"}},
        "status": {"allocatable": {"example.com/npu": "8"}}})
}

fn message(r: &AdmissionResponse) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

fn patch(r: &AdmissionResponse) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r.patch.as_ref().expect("a patch"))
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn a_pod_within_quota_is_admitted_as_pending_and_one_over_is_refused_with_the_design_message() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "2")).build())
            .allowed
    );
    assert_eq!(
        w.usage("q", "NVIDIA-H200"),
        json!({"quota": 3, "allocated": 0, "pending": 2, "reserved": 0})
    );
    let r = w.send(
        R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200"), "2"))
            .uid("u-b")
            .build(),
    );
    assert!(!r.allowed);
    assert_eq!(r.uid, "u-b");
    assert_eq!(r.status.as_ref().unwrap().code, 403);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200 quota: requested 2, in use 2 (allocated 0, pending 2, reserved 0), quota 3"
    );
}

#[test]
fn a_model_missing_from_the_quota_has_quota_zero() {
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-A100"), "1")).build());
    assert!(!r.allowed);
    assert!(message(&r).contains("insufficient NVIDIA-A100 quota: requested 1, in use 0 (allocated 0, pending 0, reserved 0), quota 0"));
}

#[test]
fn a_pod_that_names_a_model_but_requests_none_of_its_resource_is_refused() {
    let mut w = World::new();
    let mut p = pod("x", "q", Some("NVIDIA-H200"), "1");
    p["spec"]["containers"][0]["resources"] = json!({});
    let r = w.send(R::pod("CREATE", p).build());
    assert_eq!(
        message(&r),
        "pod ml/x names NVIDIA-H200 but requests no nvidia.com/gpu"
    );
    let r = w.send(
        R::pod(
            "CREATE",
            pod_res("y", "q", Some("NVIDIA-H200"), "nvidia.com/mig-1g.18gb", "1"),
        )
        .build(),
    );
    assert_eq!(
        message(&r),
        "pod ml/y names NVIDIA-H200 but requests no nvidia.com/gpu"
    );
}

#[test]
fn a_malformed_card_name_is_refused_with_the_annotation_named() {
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", pod("x", "q", Some("NVIDIA-H200||RTX-4090"), "1")).build());
    assert!(
        message(&r).starts_with("invalid volcano.sh/card.name on pod ml/x: empty alternative"),
        "{}",
        message(&r)
    );
}

#[test]
fn a_missing_card_name_is_inferred_from_a_pinning_node_selector() {
    let mut w = World::new();
    let mut p = pod("x", "q", None, "1");
    p["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "RTX-4090"});
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        patch(&r),
        json!([
            {"op": "add", "path": "/metadata/annotations/volcano.sh~1card.queue", "value": "q"},
            {"op": "add", "path": "/metadata/annotations/volcano.sh~1card.name", "value": "RTX-4090"},
            {"op": "add", "path": "/metadata/annotations/volcano.sh~1card.pinned", "value": "RTX-4090: the first of RTX-4090 with room in queue q"}
        ])
    );
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 1);
}

#[test]
fn a_mig_pod_pinned_by_affinity_gets_the_mig_model() {
    let mut w = World::new();
    let mut p = pod_res("m", "q", None, "nvidia.com/mig-1g.18gb", "2");
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}]}]}}});
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200/mig-1g.18gb-mixed")["pending"], 2);
}

/// Issue 45: a GPU pod as most are written (`nvidia.com/gpu: 1`, no annotation) may use
/// every model of its resource its queue's quota names, in the order the quota writes
/// them: pinned to the first with room, then the next, then refused at the quota.
#[test]
fn a_card_pod_that_names_no_model_uses_its_queues_models_in_quota_order() {
    let mut w = World::new();
    let mut pins = Vec::new();
    for i in 0..5 {
        let p = pod(&format!("p{i}"), "q", None, "1");
        let r = w.send(R::pod("CREATE", p.clone()).build());
        assert!(r.allowed, "{}", message(&r));
        let applied = {
            let mut a = p.clone();
            let ops: json_patch::Patch = serde_json::from_value(patch(&r)).unwrap();
            json_patch::patch(&mut a, &ops).unwrap();
            a
        };
        // The models it may use are written on it, in the quota's order.
        assert_eq!(
            applied["metadata"]["annotations"]["volcano.sh/card.name"],
            "NVIDIA-H200|RTX-4090"
        );
        pins.push(pinned_by(&r, &p).0["nvidia.com/gpu.product"].clone());
    }
    assert_eq!(
        pins,
        [
            "NVIDIA-H200",
            "NVIDIA-H200",
            "NVIDIA-H200",
            "RTX-4090",
            "RTX-4090"
        ]
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 3);
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 2);
    let r = w.send(R::pod("CREATE", pod("p5", "q", None, "1")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200|RTX-4090 quota: requested 1, in use 5 (allocated 0, pending 5, reserved 0), quota 5"
    );
}

/// The quota's written order is the preference, not the models' names.
#[test]
fn the_quota_annotation_order_is_the_order_models_are_tried() {
    let mut w = World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: rtx-first, annotations: {volcano.sh/card.quota: '{"RTX-4090":1,"NVIDIA-H200":1}'}}
status: {state: Open}
"#
    ));
    let p = pod("a", "rtx-first", None, "1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert_eq!(pinned_by(&r, &p).0["nvidia.com/gpu.product"], "RTX-4090");
    let p = pod("b", "rtx-first", None, "1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert_eq!(pinned_by(&r, &p).0["nvidia.com/gpu.product"], "NVIDIA-H200");
}

/// A queue whose quota names no model of the pod's resource refuses it as a quota
/// refusal, saying which models exist and how to give the queue one; warn admits it
/// unpinned, charged on its node's model once bound.
#[test]
fn a_pod_whose_queue_names_no_model_of_its_resource_is_told_how_to_get_one() {
    let extra = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: mig-only, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200/mig-1g.18gb-mixed":2}'}}
status: {state: Open}
"#;
    let mut w = World::with(&format!("{CLUSTER}{extra}"));
    let r = w.send(R::pod("CREATE", pod("x", "mig-only", None, "1")).build());
    assert!(!r.allowed);
    assert_eq!(
        r.status.as_ref().and_then(|s| s.reason.clone()).as_deref(),
        Some("InsufficientCardQuota")
    );
    assert_eq!(
        message(&r),
        "pod ml/x requests nvidia.com/gpu but queue mig-only has no quota for any nvidia.com/gpu model (nvidia.com/gpu models: NVIDIA-H200, RTX-4090); give the queue one: volcano.sh/card.quota: '{\"NVIDIA-H200\":1}'"
    );
    // Its MIG pods do get the MIG model.
    let r = w.send(
        R::pod(
            "CREATE",
            pod_res("m", "mig-only", None, "nvidia.com/mig-1g.18gb", "1"),
        )
        .build(),
    );
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        w.usage("mig-only", "NVIDIA-H200/mig-1g.18gb-mixed")["pending"],
        1
    );
    // Under warn: admitted unpinned with the warning, nothing pending; charged once bound.
    let mut w = World::with(&format!("{CLUSTER}{extra}"));
    w.cfg.enforcement = Enforcement::Warn;
    let p = pod("x", "mig-only", None, "1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert!(
        would_refuse(&r).contains("has no quota for any nvidia.com/gpu model"),
        "{:?}",
        r.warnings
    );
    assert_eq!(pinned_by(&r, &p).0, Value::Null, "not pinned");
    assert!(w.usage("mig-only", "NVIDIA-H200").is_null());
    let r = w.send(R::binding("ml", "x", "rtx-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("mig-only", "RTX-4090")["allocated"], 1);
}

/// A pod's own constraints narrow the models it may use; when they rule out every one
/// its queue names, the refusal names the constraint.
#[test]
fn a_pod_that_names_no_model_is_narrowed_by_its_own_constraints() {
    let mut w = World::new();
    let mut p = pod("not-h200", "q", None, "1");
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["NVIDIA-H200"]}]}]}}});
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(pinned_by(&r, &p).0["nvidia.com/gpu.product"], "RTX-4090");
    let mut p = pod("neither", "q", None, "1");
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["NVIDIA-H200", "RTX-4090"]}]}]}}});
    let r = w.send(R::pod("CREATE", p).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/neither requests nvidia.com/gpu; queue q has quota for NVIDIA-H200, RTX-4090 but the pod's node constraints (nvidia.com/gpu.product not in [NVIDIA-H200, RTX-4090]) rule out each of them"
    );
}

/// A pod that names its node (a DaemonSet's `matchFields metadata.name`) is charged on
/// that node's model at its CREATE, never pinned; a `card.name` must include it.
#[test]
fn a_pod_that_names_its_node_by_affinity_is_charged_on_that_nodes_model() {
    let on = |name: &str, card: Option<&str>, node: &str| {
        let mut p = pod(name, "q", card, "1");
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}});
        p
    };
    let mut w = World::new();
    let p = on("ds-1", None, "rtx-1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(pinned_by(&r, &p).0, Value::Null, "never pinned");
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 1);
    // An A|B pod named onto an RTX node is charged RTX, not A|B: the next RTX pod
    // sees the queue's RTX room taken.
    let r = w.send(R::pod("CREATE", on("ds-2", Some("NVIDIA-H200|RTX-4090"), "rtx-1")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 2);
    assert!(w.usage("q", "NVIDIA-H200|RTX-4090").is_null());
    let r = w.send(R::pod("CREATE", on("ds-3", None, "rtx-1")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue q has insufficient RTX-4090 quota"),
        "{}",
        message(&r)
    );
    // Its binding there is the one it was charged for.
    let r = w.send(R::binding("ml", "ds-2", "rtx-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 1);
    let r = w.send(R::pod("CREATE", on("wrong", Some("NVIDIA-H200"), "rtx-1")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/wrong accepts NVIDIA-H200 but names node rtx-1, which has RTX-4090"
    );
}

/// The GPU Operator's validators name their node with `spec.nodeName` and ask for one
/// GPU: charged on that node's model like any pod created on its node.
#[test]
fn a_plain_pod_created_on_its_node_is_charged_on_the_nodes_model() {
    let mut w = World::new();
    let mut p = pod("validator", "q", None, "1");
    p["spec"]["nodeName"] = json!("rtx-1");
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 1);
}

#[test]
fn a_pod_without_cards_is_never_charged() {
    let mut w = World::new();
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1", "rdma/hca": "1"}}}]}});
    let r = w.send(R::pod("CREATE", p).build());
    // rdma/hca is not among the card resources: the pod is left alone.
    assert!(r.allowed && r.patch.is_none());
    assert!(!usage_report(&w.snap, jiff::Timestamp::now()).contains_key("default"));
    // Nor is a NIC's virtual function under a card vendor's prefix (issue 45).
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vf", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/sriov_rdma_vf": "1"}}}]}});
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed && r.patch.is_none());
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}}}]}});
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed && r.patch.is_none());
}

#[test]
fn an_rdma_host_device_beside_a_gpu_is_not_a_second_card() {
    // The NVIDIA Network Operator's GPUDirect RDMA resource lives under the same prefix.
    let mut w = World::with(&format!(
        "{CLUSTER}---\n{}",
        r#"apiVersion: v1
kind: Node
metadata: {name: h200-rdma, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "8", nvidia.com/hostdev: "8"}}"#
    ));
    let p = support::pod("rdma")
        .queue("q")
        .card("NVIDIA-H200")
        .resource("nvidia.com/gpu", "2")
        .resource("nvidia.com/hostdev", "1")
        .build();
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 2);
    let r = w.send(R::binding("ml", "rdma", "h200-rdma").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2);
    // A pod with only the host device asks for no card.
    let p = support::pod("nic")
        .queue("q")
        .resource("nvidia.com/hostdev", "1")
        .build();
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2);
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 0);
}

#[test]
fn binding_charges_the_node_model_and_stamps_card_charged() {
    let mut w = World::new();
    // Unpinned (serve --no-pin), so that the pending pod shows under both models.
    w.cfg.pin = false;
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200|RTX-4090"), "2")).build())
            .allowed
    );
    assert_eq!(w.usage("q", "NVIDIA-H200|RTX-4090")["pending"], 2);
    let r = w.send(R::binding("ml", "a", "rtx-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        patch(&r),
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"volcano.sh/card.charged": "RTX-4090"}}])
    );
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 2);
    assert_eq!(w.usage("q", "NVIDIA-H200|RTX-4090"), Value::Null);
}

/// A Binding names its pod's uid (kube-scheduler and Volcano's binder set it): a cache
/// that shows another pod under that name (deleted and made again, the cache behind) is
/// not read as this one. Unpinned, a pod the cache does not show is "try again"; read
/// as the older pod, this binding was checked (and charged) as that pod's.
#[test]
fn a_binding_of_a_pod_made_again_under_its_name_is_not_read_as_the_older_one() {
    let mut w = World::new();
    w.cfg.pin = false;
    let mut old = pod("a", "q", Some("RTX-4090"), "1");
    old["metadata"]["uid"] = json!("u-old");
    assert!(w.send(R::pod("CREATE", old).build()).allowed);
    let mut bind = R::binding("ml", "a", "rtx-1").build();
    bind["request"]["object"]["metadata"]["uid"] = json!("u-new");
    let r = w.send(bind);
    assert!(!r.allowed, "checked as the older pod of that name");
    assert_eq!(
        message(&r),
        "pod ml/a is not in card-quota's cache yet; try again"
    );
    // The pod the cache shows, by its uid: checked as before.
    let mut bind = R::binding("ml", "a", "rtx-1").build();
    bind["request"]["object"]["metadata"]["uid"] = json!("u-old");
    let r = w.send(bind);
    assert!(r.allowed, "{}", message(&r));
}

/// Issue 32 #2: a retried bind of a bound pod never replaces its charge.
#[test]
fn a_second_binding_of_a_bound_pod_is_refused_and_the_first_charge_stays() {
    let mut w = World::new();
    w.cfg.pin = false;
    let r = w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200|RTX-4090"), "1")).build());
    assert!(r.allowed, "{}", message(&r));
    assert!(w.send(R::binding("ml", "a", "rtx-1").build()).allowed);
    for node in ["h200-1", "rtx-1"] {
        let r = w.send(R::binding("ml", "a", node).build());
        assert_eq!(
            message(&r),
            "pod ml/a is already bound to node rtx-1; a pod is bound once"
        );
    }
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 1);
    assert_eq!(
        w.usage("q", "NVIDIA-H200"),
        json!({"quota": 3, "allocated": 0, "pending": 0, "reserved": 0})
    );
}

/// Issue 32: the legacy `POST /api/v1/namespaces/{ns}/bindings` is checked like the
/// `pods/binding` subresource.
#[test]
fn a_binding_through_the_legacy_bindings_endpoint_is_checked_too() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    let r = w.send(R::legacy_binding("ml", "a", "rtx-1").build());
    assert_eq!(
        message(&r),
        "pod ml/a accepts NVIDIA-H200 but node rtx-1 has RTX-4090"
    );
    let r = w.send(R::legacy_binding("ml", "a", "h200-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
}

#[test]
fn binding_to_a_model_the_pod_does_not_accept_is_refused() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    let r = w.send(R::binding("ml", "a", "rtx-1").build());
    assert_eq!(
        message(&r),
        "pod ml/a accepts NVIDIA-H200 but node rtx-1 has RTX-4090"
    );
}

#[test]
fn binding_that_would_strand_another_pending_pod_is_refused() {
    // RTX-4090 quota 2, H200 quota 3: pod a (2 cards, RTX only) and pod b (2 cards, H200|RTX).
    // Binding b onto RTX would leave a nowhere to go. Unpinned (`--no-pin`): with pins, b
    // is pinned to H200 at its creation (next test).
    let mut w = World::new();
    w.cfg.pin = false;
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("RTX-4090"), "2")).build())
            .allowed
    );
    assert!(
        w.send(R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200|RTX-4090"), "2")).build())
            .allowed
    );
    let r = w.send(R::binding("ml", "b", "rtx-1").build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue q has insufficient RTX-4090 quota: requested 2"),
        "{}",
        message(&r)
    );
    assert!(w.send(R::binding("ml", "b", "h200-1").build()).allowed);
    assert!(w.send(R::binding("ml", "a", "rtx-1").build()).allowed);
}

#[test]
fn a_bind_off_its_pin_is_refused_for_the_pin() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200|RTX-4090"), "2")).build())
            .allowed
    );
    let r = w.send(R::binding("ml", "b", "rtx-1").build());
    assert_eq!(
        message(&r),
        "pod ml/b accepts NVIDIA-H200|RTX-4090 but its node selector pins it to NVIDIA-H200, and node rtx-1 has RTX-4090: the kubelet would refuse it there"
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 2);
    assert!(w.send(R::binding("ml", "b", "h200-1").build()).allowed);
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2);
}

#[test]
fn a_pod_created_with_node_name_is_an_allocation() {
    let mut w = World::new();
    let mut p = pod("static", "q", Some("RTX-4090"), "2");
    p["spec"]["nodeName"] = json!("rtx-1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed);
    assert_eq!(
        patch(&r)[1],
        json!({"op": "add", "path": "/metadata/annotations/volcano.sh~1card.charged", "value": "RTX-4090"})
    );
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 2);
    p["metadata"]["name"] = json!("static-2");
    assert!(!w.send(R::pod("CREATE", p).build()).allowed);
}

#[test]
fn a_pod_update_that_only_adds_the_group_name_is_not_a_new_charge() {
    let mut w = World::new();
    let old = pod("a", "q", Some("RTX-4090"), "2");
    assert!(w.send(R::pod("CREATE", old.clone()).build()).allowed);
    let mut new = old.clone();
    new["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("podgroup-123");
    let r = w.send(R::pod("UPDATE", new).old(old).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 2);
}

#[test]
fn a_pod_update_that_changes_its_card_name_is_refused() {
    // docs/annotations.md: "Pod UPDATEs that change card.queue, card.charged or card.name of a pod
    // with card demand are refused".
    let mut w = World::new();
    let old = pod("a", "q", Some("RTX-4090"), "2");
    assert!(w.send(R::pod("CREATE", old.clone()).build()).allowed);
    let mut new = old.clone();
    new["metadata"]["annotations"]["volcano.sh/card.name"] = json!("NVIDIA-H200");
    let r = w.send(R::pod("UPDATE", new.clone()).old(old.clone()).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        r#"pod ml/a has card demand: volcano.sh/card.name cannot be changed (was "RTX-4090", now "NVIDIA-H200")"#
    );
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 2);
}

/// A PodGroup waiting in line (no phase yet), as Volcano's job controller creates it.
fn waiting_pg(name: &str, queue: &str, request: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "annotations": {"volcano.sh/card.request": request}},
        "spec": {"queue": queue, "minMember": 1}, "status": {}})
}

/// A PodGroup created already enqueued: checked whole at its CREATE, and reserving.
fn pg(name: &str, queue: &str, request: &str) -> Value {
    let mut g = waiting_pg(name, queue, request);
    g["status"] = json!({"phase": "Inqueue"});
    g
}

/// vc-scheduler's enqueue: an UPDATE of the PodGroup itself, Pending -> Inqueue.
fn enqueue(w: &mut World, waiting: &Value) -> AdmissionResponse {
    let mut next = waiting.clone();
    next["status"] = json!({"phase": "Inqueue"});
    w.send(R::podgroup("UPDATE", next).old(waiting.clone()).build())
}

#[test]
fn a_waiting_podgroup_reserves_nothing_and_is_checked_whole_at_its_enqueue() {
    let mut w = World::new();
    let j1 = waiting_pg("j1", "q", r#"{"NVIDIA-H200":3}"#);
    let j2 = waiting_pg("j2", "q", r#"{"NVIDIA-H200":2}"#);
    assert!(w.send(R::podgroup("CREATE", j1.clone()).build()).allowed);
    assert!(w.send(R::podgroup("CREATE", j2.clone()).build()).allowed);
    // Both wait in line: nothing is reserved, a plain pod still fits.
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 0);
    let r = enqueue(&mut w, &j1);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 3);
    // j2 does not fit beside j1: its enqueue is held with the contract's message.
    let r = enqueue(&mut w, &j2);
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200 quota: requested 2, in use 3 (allocated 0, pending 0, reserved 3), quota 3"
    );
    // vc-scheduler's later status writes on j1 charge nothing.
    let mut inq = j1.clone();
    inq["status"] = json!({"phase": "Inqueue"});
    let mut running = j1.clone();
    running["status"] = json!({"phase": "Running"});
    assert!(
        w.send(R::podgroup("UPDATE", running.clone()).old(inq).build())
            .allowed
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 3);
    // j1 completes: its cards are free and j2's next enqueue goes through.
    let mut done = j1.clone();
    done["status"] = json!({"phase": "Completed"});
    assert!(
        w.send(R::podgroup("UPDATE", done).old(running).build())
            .allowed
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 0);
    let r = enqueue(&mut w, &j2);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 2);
}

#[test]
fn a_waiting_podgroup_that_could_never_run_is_refused_at_once_but_one_that_waits_is_not() {
    let mut w = World::new();
    // Quota 3: asking for 4 can never run.
    let r = w.send(R::podgroup("CREATE", waiting_pg("big", "q", r#"{"NVIDIA-H200":4}"#)).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200 quota: requested 4, in use 0 (allocated 0, pending 0, reserved 0), quota 3"
    );
    // Entries that fit one by one but not together can never run either.
    let r = w.send(
        R::podgroup(
            "CREATE",
            waiting_pg("two", "q", r#"{"NVIDIA-H200":2,"NVIDIA-H200|RTX-4090":4}"#),
        )
        .build(),
    );
    assert!(!r.allowed);
    assert!(message(&r).contains("requested 4"), "{}", message(&r));
    // A queue full of other work does not refuse a waiting job: it waits.
    assert!(
        w.send(R::pod("CREATE", pod("p", "q", Some("NVIDIA-H200"), "3")).build())
            .allowed
    );
    let r = w.send(R::podgroup("CREATE", waiting_pg("later", "q", r#"{"NVIDIA-H200":3}"#)).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 0);
    // A malformed request is refused at once.
    let r = w.send(R::podgroup("CREATE", waiting_pg("bad", "q", r#"{"NVIDIA-H200":0}"#)).build());
    assert!(!r.allowed);
    assert!(message(&r).starts_with("invalid volcano.sh/card.request on podgroup ml/bad"));
}

#[test]
fn a_podgroup_created_enqueued_that_does_not_fit_is_refused() {
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", pod("p", "q", Some("NVIDIA-H200"), "2")).build())
            .allowed
    );
    let r = w.send(R::podgroup("CREATE", pg("direct", "q", r#"{"NVIDIA-H200":2}"#)).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200 quota: requested 2, in use 2 (allocated 0, pending 2, reserved 0), quota 3"
    );
    // A request raised on an enqueued group is checked like a new charge.
    let small = pg("small", "q", r#"{"NVIDIA-H200":1}"#);
    assert!(w.send(R::podgroup("CREATE", small.clone()).build()).allowed);
    let mut more = small.clone();
    more["metadata"]["annotations"]["volcano.sh/card.request"] = json!(r#"{"NVIDIA-H200":2}"#);
    assert!(
        !w.send(R::podgroup("UPDATE", more).old(small).build())
            .allowed
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 1);
}

#[test]
fn a_podgroup_taken_out_of_completed_is_checked_like_an_enqueue() {
    let mut w = World::new();
    let mut done = pg("done", "q", r#"{"NVIDIA-H200":1000}"#);
    done["status"] = json!({"phase": "Completed"});
    // Completed reserves nothing, so its CREATE charges nothing...
    assert!(w.send(R::podgroup("CREATE", done.clone()).build()).allowed);
    // ...but bringing it back is a new charge.
    let mut back = done.clone();
    back["status"] = json!({"phase": "Inqueue"});
    let r = w.send(R::podgroup("UPDATE", back).old(done).build());
    assert!(!r.allowed);
    assert!(message(&r).contains("requested 1000"), "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 0);
}

#[test]
fn a_duplicate_create_of_a_waiting_podgroup_leaves_no_reservation() {
    // Volcano's job controller sends a Job's PodGroup CREATE twice within 10 ms (201,
    // then 409): both are admitted, and neither may reserve.
    let mut w = World::new();
    let g = waiting_pg("dup", "q", r#"{"NVIDIA-H200":3}"#);
    let first = w.send(R::podgroup("CREATE", g.clone()).build());
    let second = w.send(R::podgroup("CREATE", g).build());
    assert!(first.allowed && second.allowed);
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 0);
}

/// A Volcano Job of two 1-card H200 workers and a cardless launcher, without
/// `card.request`, in queue `one` (quota 1), as Volcano records it.
const JOB_WORLD: &str = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: one, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}
status: {state: Open}
---
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: train, namespace: ml, uid: job-uid}
spec:
  queue: one
  minAvailable: 3
  tasks:
    - name: launcher
      replicas: 1
      template: {spec: {containers: [{name: c, image: x}]}}
    - name: worker
      replicas: 2
      template:
        metadata: {annotations: {volcano.sh/card.name: NVIDIA-H200}}
        spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;

/// The PodGroup Volcano's job controller creates for Job `train` (no card.request).
fn job_group() -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "train-job-uid", "namespace": "ml", "uid": "pg-uid",
            "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                "name": "train", "uid": "job-uid", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"queue": "one", "minMember": 3}, "status": {}})
}

#[test]
fn a_jobs_podgroup_without_card_request_is_held_for_what_its_tasks_will_create() {
    let mut w = World::with(&format!("{CLUSTER}{JOB_WORLD}"));
    let g = job_group();
    // The CREATE is admitted Pending (2 > quota 1 could be fixed by a raise: it waits),
    // and the mutating answer writes the derived demand on the group.
    let r = w.send(R::podgroup("CREATE", g.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        patch(&r),
        json!([{"op": "add", "path": "/metadata/annotations",
            "value": {"volcano.sh/card.derived-request": "{\"NVIDIA-H200\":2}"}}])
    );
    let mut stored = g.clone();
    stored["metadata"]["annotations"] =
        json!({"volcano.sh/card.derived-request": "{\"NVIDIA-H200\":2}"});
    // vc-scheduler's enqueue is held: the whole Job does not fit.
    let r = enqueue(&mut w, &stored);
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue one has insufficient NVIDIA-H200 quota: requested 2, in use 0 (allocated 0, pending 0, reserved 0), quota 1"
    );
    assert_eq!(w.usage("one", "NVIDIA-H200")["reserved"], 0);
    // The admin raises the quota to 2: the next enqueue goes through and reserves 2.
    let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "one", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":2}"}},
        "status": {"state": "Open"}});
    assert!(w.send(R::queue("UPDATE", q).build()).allowed);
    let r = enqueue(&mut w, &stored);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("one", "NVIDIA-H200")["reserved"], 2);
    // A pod outside the Job no longer fits, but the Job's own pods do.
    assert!(
        !w.send(R::pod("CREATE", pod("outsider", "one", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    for i in 0..2 {
        let mut p = pod(
            &format!("train-worker-{i}"),
            "one",
            Some("NVIDIA-H200"),
            "1",
        );
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("train-job-uid");
        let r = w.send(R::pod("CREATE", p).build());
        assert!(r.allowed, "{}", message(&r));
    }
    assert_eq!(
        w.usage("one", "NVIDIA-H200"),
        json!({"quota": 2, "allocated": 0, "pending": 2, "reserved": 0})
    );
}

#[test]
fn a_jobs_podgroup_whose_create_missed_card_quota_is_derived_at_its_enqueue() {
    let mut w = World::with(&format!("{CLUSTER}{JOB_WORLD}"));
    let g = job_group();
    // Stored without card-quota (it was down): no derived demand on it.
    card_quota::snapshot::load::upsert(&mut w.snap, &g).unwrap();
    let r = enqueue(&mut w, &g);
    assert!(!r.allowed);
    assert!(message(&r).contains("requested 2"), "{}", message(&r));
}

/// Issue 46 #10: a Job the cache does not show yet (its watch lags the job controller,
/// or has not listed since start-up) had no derived demand, so its group's enqueue
/// reserved nothing and its pods started past the quota. The enqueue now waits until
/// the Job is seen; in line, its group passes.
#[test]
fn a_jobs_podgroup_is_not_enqueued_before_its_job_is_seen() {
    let mut w = World::with(&format!("{CLUSTER}{JOB_WORLD}"));
    let key = card_quota::cards::ObjectKey::new("ml", "train");
    let job = w.snap.job(&key).cloned().unwrap();
    // Live, the job controller's group arrives before the Job's watch shows the Job.
    w.snap.mirror_jobs();
    w.snap.remove_job(&key);
    let g = job_group();
    let r = w.send(R::podgroup("CREATE", g.clone()).build());
    assert!(
        r.allowed,
        "waiting in line reserves nothing: {}",
        message(&r)
    );
    assert!(r.patch.is_none(), "no demand to write yet");
    let r = enqueue(&mut w, &g);
    assert!(!r.allowed, "enqueued with its demand unknown");
    assert_eq!(
        message(&r),
        "podgroup ml/train-job-uid waits: its Job ml/train is not in card-quota's cache yet, so its card demand is not known; try again"
    );
    assert_eq!(w.usage("one", "NVIDIA-H200")["reserved"], 0);
    // The Job arrives: the next enqueue is decided on its tasks (2 > quota 1: held).
    w.snap.upsert_job(job);
    let r = enqueue(&mut w, &g);
    assert!(!r.allowed);
    assert!(
        message(&r).contains("insufficient NVIDIA-H200 quota: requested 2"),
        "{}",
        message(&r)
    );
    // Offline (replay), the Jobs given are all there are: no Job, no derived demand.
    let mut w = World::with(&format!("{CLUSTER}{JOB_WORLD}"));
    w.snap.remove_job(&key);
    assert!(enqueue(&mut w, &g).allowed);
}

/// Issue 46 #10: a running Job whose task replicas are raised kept its derived
/// reservation, and its new pods were refused one by one at their creation (which
/// Volcano retries and then counts against the Job). The raise is checked at the Job's
/// UPDATE now: it fits, or the edit is refused and the Job runs on as it was.
#[test]
fn raising_a_running_jobs_replicas_must_fit_or_the_edit_is_refused() {
    let mut w = World::with(&format!("{CLUSTER}{JOB_WORLD}").replace(
        r#"volcano.sh/card.quota: '{"NVIDIA-H200":1}'"#,
        r#"volcano.sh/card.quota: '{"NVIDIA-H200":4}'"#,
    ));
    let job = |workers: u32| {
        json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml", "uid": "job-uid"},
            "spec": {"queue": "one", "minAvailable": 3, "tasks": [
                {"name": "launcher", "replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
                {"name": "worker", "replicas": workers, "template": {
                    "metadata": {"annotations": {"volcano.sh/card.name": "NVIDIA-H200"}},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}})
    };
    let raise = |w: &mut World, from: u32, to: u32| {
        w.send(R::job("UPDATE", job(to)).old(job(from)).build())
    };
    // Waiting in line: the enqueue decides (on the Job as it is then).
    let g = job_group();
    assert!(w.send(R::podgroup("CREATE", g.clone()).build()).allowed);
    assert!(
        raise(&mut w, 2, 9).allowed,
        "a waiting Job's edit is its enqueue's to check"
    );
    let mut stored = g.clone();
    stored["metadata"]["annotations"] =
        json!({"volcano.sh/card.derived-request": "{\"NVIDIA-H200\":2}"});
    let r = enqueue(&mut w, &stored);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("one", "NVIDIA-H200")["reserved"], 2);
    // Running with 2 of 4 reserved: 2 more workers fit, 3 more do not.
    let r = raise(&mut w, 2, 5);
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "job ml/train cannot add replicas to task worker while it runs: queue one has insufficient NVIDIA-H200 quota: requested 3, in use 2 (allocated 0, pending 0, reserved 2), quota 4"
    );
    assert!(raise(&mut w, 2, 4).allowed);
    assert!(raise(&mut w, 4, 1).allowed, "a scale-down gives back");
    // A Kubernetes batch/v1 Job of the same name is not Volcano's.
    let mut k8s = R::job("UPDATE", job(9)).old(job(2)).build();
    k8s["request"]["resource"]["group"] = json!("batch");
    assert!(w.send(k8s).allowed);
}

#[test]
fn under_strict_order_a_job_that_fits_waits_behind_an_older_held_one() {
    let strict = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: fifo, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":3}', volcano.sh/card.order: strict}}
status: {state: Open}
"#;
    for order in ["strict", "best-effort"] {
        let mut w = World::with(&format!(
            "{CLUSTER}{}",
            strict.replace("strict}", &format!("{order}}}"))
        ));
        assert!(
            w.send(R::pod("CREATE", pod("p", "fifo", Some("NVIDIA-H200"), "2")).build())
                .allowed
        );
        let mut big = waiting_pg("big", "fifo", r#"{"NVIDIA-H200":2}"#);
        big["metadata"]["creationTimestamp"] = json!("2026-11-26T08:00:00Z");
        let mut small = waiting_pg("small", "fifo", r#"{"NVIDIA-H200":1}"#);
        small["metadata"]["creationTimestamp"] = json!("2026-11-26T08:00:05Z");
        assert!(w.send(R::podgroup("CREATE", big.clone()).build()).allowed);
        assert!(w.send(R::podgroup("CREATE", small.clone()).build()).allowed);
        assert!(!enqueue(&mut w, &big).allowed);
        let r = enqueue(&mut w, &small);
        if order == "strict" {
            assert!(!r.allowed);
            assert_eq!(
                message(&r),
                "queue fifo enqueues jobs in order (volcano.sh/card.order: strict): podgroup ml/big waits for its cards first"
            );
        } else {
            assert!(r.allowed, "{}", message(&r));
        }
    }
    // Any other value is refused when the queue is applied.
    let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "fifo", "annotations": {"volcano.sh/card.order": "fifo"}}});
    let r = World::new().send(R::queue("CREATE", q).build());
    assert_eq!(
        message(&r),
        r#"invalid volcano.sh/card.order on queue fifo: expected "strict" or "best-effort", got "fifo""#
    );
}

/// Issue 46 #6: a Job whose demand is derived from its tasks and is larger than its
/// queue's quota is admitted to wait (its Job waits for a larger quota). Under strict
/// order it held every later Job of the queue for ever; it holds no line now.
#[test]
fn under_strict_order_a_job_that_can_never_fit_holds_nobody_behind_it() {
    let mut w = World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: fifo, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":3}', volcano.sh/card.order: strict}}
status: {state: Open}
"#
    ));
    let mut huge = waiting_pg("huge", "fifo", "");
    huge["metadata"]["annotations"] =
        json!({"volcano.sh/card.derived-request": r#"{"NVIDIA-H200":4}"#});
    huge["metadata"]["creationTimestamp"] = json!("2026-11-26T08:00:00Z");
    let mut small = waiting_pg("small", "fifo", r#"{"NVIDIA-H200":1}"#);
    small["metadata"]["creationTimestamp"] = json!("2026-11-26T08:00:05Z");
    let r = w.send(R::podgroup("CREATE", huge.clone()).build());
    assert!(r.allowed, "a derived demand waits: {}", message(&r));
    assert!(w.send(R::podgroup("CREATE", small.clone()).build()).allowed);
    let r = enqueue(&mut w, &huge);
    assert!(!r.allowed);
    assert!(message(&r).contains("requested 4"), "{}", message(&r));
    let r = enqueue(&mut w, &small);
    assert!(r.allowed, "{}", message(&r));
}

#[test]
fn oversized_card_names_and_requests_are_refused_with_the_limit() {
    let mut w = World::new();
    let many: Vec<String> = (0..33).map(|i| format!("M{i}")).collect();
    let r = w.send(R::pod("CREATE", pod("wide", "q", Some(&many.join("|")), "1")).build());
    assert_eq!(
        message(&r),
        "invalid volcano.sh/card.name on pod ml/wide: 33 alternatives; at most 32 are allowed"
    );
    let entries: Vec<String> = (0..65).map(|i| format!("\"M{i}\":1")).collect();
    let r = w.send(
        R::podgroup(
            "CREATE",
            waiting_pg("wide", "q", &format!("{{{}}}", entries.join(","))),
        )
        .build(),
    );
    assert_eq!(
        message(&r),
        "invalid volcano.sh/card.request on podgroup ml/wide: 65 entries; at most 64 are allowed"
    );
    let long = "X".repeat(300);
    let r = w.send(R::pod("CREATE", pod("long", "q", Some(&long), "1")).build());
    assert!(
        message(&r).ends_with("is 300 characters long; at most 253 are allowed"),
        "{}",
        message(&r)
    );
    assert!(message(&r).len() < 250, "{}", message(&r));
}

#[test]
fn a_derived_request_larger_than_the_quota_waits_instead_of_being_refused() {
    let mut w = World::new();
    let mut g = waiting_pg("derived", "q", "");
    g["metadata"]["annotations"] =
        json!({"volcano.sh/card.derived-request": r#"{"NVIDIA-H200":4}"#});
    let r = w.send(R::podgroup("CREATE", g.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    let r = enqueue(&mut w, &g);
    assert!(!r.allowed);
    assert!(message(&r).contains("requested 4"), "{}", message(&r));
}

#[test]
fn a_podgroup_reserves_its_request_and_its_pods_draw_on_it() {
    let mut w = World::new();
    assert!(
        w.send(R::podgroup("CREATE", pg("job", "q", r#"{"NVIDIA-H200":3}"#)).build())
            .allowed
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 3);
    // Another pod outside the job does not fit...
    assert!(
        !w.send(R::pod("CREATE", pod("other", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    // ...but the job's own pods do.
    let mut p = pod("job-0", "q", Some("NVIDIA-H200"), "2");
    p["metadata"]["annotations"] =
        json!({"scheduling.k8s.io/group-name": "job", "volcano.sh/card.name": "NVIDIA-H200"});
    assert!(w.send(R::pod("CREATE", p).build()).allowed);
    assert_eq!(
        w.usage("q", "NVIDIA-H200"),
        json!({"quota": 3, "allocated": 0, "pending": 2, "reserved": 1})
    );
}

#[test]
fn a_podgroup_over_quota_is_refused_and_its_status_updates_charge_nothing() {
    let mut w = World::new();
    let r = w.send(R::podgroup("CREATE", pg("big", "q", r#"{"NVIDIA-H200|RTX-4090":6}"#)).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200|RTX-4090 quota: requested 6, in use 0 (allocated 0, pending 0, reserved 0), quota 5"
    );
    let ok = pg("fits", "q", r#"{"NVIDIA-H200|RTX-4090":5}"#);
    assert!(w.send(R::podgroup("CREATE", ok.clone()).build()).allowed);
    let mut status = ok.clone();
    status["status"] = json!({"phase": "Inqueue"});
    assert!(
        w.send(R::podgroup("UPDATE", status).old(ok).build())
            .allowed
    );
}

#[test]
fn a_malformed_card_request_is_refused() {
    let mut w = World::new();
    let r = w.send(R::podgroup("CREATE", pg("bad", "q", r#"{"A":1,"A":2}"#)).build());
    assert_eq!(
        message(&r),
        r#"invalid volcano.sh/card.request on podgroup ml/bad: duplicate key "A""#
    );
}

#[test]
fn a_closed_queue_refuses_charging_requests() {
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", pod("a", "closed", Some("NVIDIA-H200"), "1")).build());
    assert_eq!(
        message(&r),
        "queue closed is Closed and admits no new card requests"
    );
}

#[test]
fn a_queue_with_a_broken_quota_fails_closed_and_says_why() {
    let mut w = World::new();
    let r = w.send(R::pod("CREATE", pod("a", "broken", Some("NVIDIA-H200"), "1")).build());
    assert!(
        message(&r).contains("invalid volcano.sh/card.quota on queue broken"),
        "{}",
        message(&r)
    );
    // Volcano's own status update of that queue still goes through.
    let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "broken", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":"}}});
    let mut q2 = q.clone();
    q2["status"] = json!({"state": "Open"});
    let r = w.send(R::queue("UPDATE", q2).old(q).build());
    assert!(r.allowed);
    assert_eq!(r.warnings.len(), 1);
}

#[test]
fn a_queue_quota_below_usage_or_naming_an_unknown_model_passes_with_warnings() {
    let mut w = World::new();
    let mut p = pod("a", "q", Some("RTX-4090"), "2");
    p["spec"]["nodeName"] = json!("rtx-1");
    assert!(w.send(R::pod("CREATE", p).build()).allowed);
    let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q", "annotations": {"volcano.sh/card.quota": "{\"RTX-4090\":1,\"Tesla-T4\":1}"}}});
    let r = w.send(R::queue("UPDATE", q).build());
    assert!(r.allowed);
    assert_eq!(
        r.warnings,
        vec![
            "queue q: quota for RTX-4090 (1) is below current usage 2 (allocated 2, pending 0, reserved 0)".to_string(),
            "queue q: no node offers card model Tesla-T4".to_string()
        ]
    );
}

#[test]
fn a_scale_up_over_quota_is_clamped_by_default_and_refused_under_deny() {
    let mut w = World::new();
    // The snapshot holds no pod of web yet: 2 of the 4 added replicas fit.
    let r = w.send(R::scale("deployments", "ml", "web", 1, 5).build());
    assert!(r.allowed);
    assert_eq!(
        patch(&r),
        json!([{"op": "replace", "path": "/spec/replicas", "value": 3}])
    );
    assert!(r.warnings[0].starts_with("deployment ml/web scale-up from 1 to 5 replicas clamped to 3: queue q has insufficient RTX-4090 quota: requested 4"));
    w.cfg.scale_policy = ScalePolicy::Deny;
    let r = w.send(R::scale("deployments", "ml", "web", 2, 5).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient RTX-4090 quota: requested 3, in use 0 (allocated 0, pending 0, reserved 0), quota 2"
    );
}

/// A Deployment cached before any node announced its cards' vendor is scaled with the
/// vendors the snapshot knows at the scale-up, not those it knew when it was cached.
#[test]
fn a_scale_up_counts_cards_whose_vendor_a_node_announced_after_the_workload_was_cached() {
    let yaml = r#"
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: npu, annotations: {volcano.sh/card.quota: '{"X-NPU":4}'}}
status: {state: Open}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: train}}
  template:
    metadata: {annotations: {scheduling.volcano.sh/queue-name: npu, volcano.sh/card.name: X-NPU}}
    spec:
      schedulerName: volcano
      containers: [{name: c, image: x, resources: {limits: {example.com/npu: "2"}}}]
"#;
    let mut w = World::with_npu(yaml);
    let node = npu_node();
    card_quota::snapshot::load::upsert(&mut w.snap, &node).unwrap();
    // 2 added replicas of 2 cards fit in 4; 3 would not: the scale-up is clamped to 3.
    let r = w.send(R::scale("deployments", "ml", "train", 1, 3).build());
    assert!(r.allowed && r.patch.is_none(), "{r:?}");
    let r = w.send(R::scale("deployments", "ml", "train", 1, 4).build());
    assert!(r.allowed, "{r:?}");
    assert_eq!(
        patch(&r),
        json!([{"op": "replace", "path": "/spec/replicas", "value": 3}])
    );
}

/// A scale-up of a workload whose template cannot be charged names the template, not a
/// pod that does not exist.
#[test]
fn a_scale_up_of_a_template_with_a_bad_card_demand_names_the_template() {
    let yaml = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: bad, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: bad}}
  template:
    metadata: {annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: RTX-4090}}
    spec:
      schedulerName: volcano
      containers: [{name: c, image: x, resources: {limits: {cpu: "1"}}}]
"#;
    let mut w = World::with(&format!("{CLUSTER}\n---{yaml}"));
    let r = w.send(R::scale("deployments", "ml", "bad", 1, 2).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "the pod template of deployment ml/bad names RTX-4090 but requests no nvidia.com/gpu"
    );
    // A model name or a quantity that does not parse is the template's too.
    for (kind, resource, name, limit, expected) in [
        (
            "StatefulSet",
            "statefulsets",
            "RTX-4090|",
            "1",
            "on the pod template of statefulset ml/broken",
        ),
        (
            "ReplicaSet",
            "replicasets",
            "RTX-4090",
            "1.5",
            "the pod template of replicaset ml/broken: container c",
        ),
    ] {
        let yaml = format!(
            r#"
apiVersion: apps/v1
kind: {kind}
metadata: {{name: broken, namespace: ml}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: broken}}}}
  template:
    metadata: {{annotations: {{scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: "{name}"}}}}
    spec:
      schedulerName: volcano
      containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: "{limit}"}}}}}}]
"#
        );
        let mut w = World::with(&format!("{CLUSTER}\n---{yaml}"));
        let r = w.send(R::scale(resource, "ml", "broken", 1, 2).build());
        assert!(!r.allowed);
        assert!(message(&r).contains(expected), "{}", message(&r));
        assert!(!message(&r).contains("pod ml/"), "{}", message(&r));
    }
}

#[test]
fn a_scale_down_is_always_allowed() {
    let mut w = World::new();
    w.cfg.scale_policy = ScalePolicy::Deny;
    let r = w.send(R::scale("deployments", "ml", "web", 9, 3).build());
    assert!(r.allowed && r.patch.is_none());
}

#[test]
fn replicas_updates_of_a_deployment_are_gated_but_its_replicasets_are_not() {
    let mut w = World::new();
    let dep = |r: i32| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ml"},
        "spec": {"replicas": r, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    };
    let r = w.send(
        R::workload("UPDATE", "deployments", "Deployment", dep(4))
            .old(dep(1))
            .build(),
    );
    assert_eq!(patch(&r)[0]["value"], 3);
    let rs = |r: i32| {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ml",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": true}]},
        "spec": {"replicas": r, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    };
    let r = w.send(
        R::workload("UPDATE", "replicasets", "ReplicaSet", rs(9))
            .old(rs(1))
            .build(),
    );
    assert!(r.allowed && r.patch.is_none());
    let r = w.send(R::scale("replicasets", "ml", "web-1", 1, 9).build());
    assert!(r.allowed && r.patch.is_none());
}

#[test]
fn dry_run_requests_are_answered_but_charge_nothing() {
    let mut w = World::new();
    let r = w.send(
        R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "3"))
            .dry_run()
            .build(),
    );
    assert!(r.allowed);
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 0);
}

#[test]
fn terminal_and_expired_terminating_pods_give_their_cards_back() {
    let past = "2020-01-01T00:00:00Z";
    let future = "2999-01-01T00:00:00Z";
    let mk = |name: &str, phase: &str, deletion: Option<&str>| {
        let mut p = pod(name, "q", Some("NVIDIA-H200"), "1");
        p["spec"]["nodeName"] = json!("h200-1");
        p["status"] = json!({"phase": phase});
        if let Some(d) = deletion {
            p["metadata"]["deletionTimestamp"] = json!(d);
        }
        serde_norway::to_string(&p).unwrap()
    };
    let yaml = format!(
        "{CLUSTER}\n---\n{}\n---\n{}\n---\n{}\n---\n{}",
        mk("done", "Succeeded", None),
        mk("failed", "Failed", None),
        mk("gone", "Running", Some(past)),
        mk("grace", "Running", Some(future))
    );
    let w = World::with(&yaml);
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 1);
}

#[test]
fn a_bound_pod_on_a_vanished_node_is_charged_its_first_alternative() {
    let mut p = pod("orphan", "q", Some("RTX-4090|NVIDIA-H200"), "1");
    p["spec"]["nodeName"] = json!("gone-node");
    let w = World::with(&format!(
        "{CLUSTER}\n---\n{}",
        serde_norway::to_string(&p).unwrap()
    ));
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 1);
}

#[test]
fn a_body_that_is_not_an_admission_review_gets_a_400_answer() {
    let mut w = World::new();
    let r = w.send(json!({"apiVersion": "v1", "kind": "ConfigMap", "request": {"uid": "abc"}}));
    assert!(!r.allowed);
    assert_eq!(r.uid, "abc");
    assert_eq!(r.status.unwrap().code, 400);
}

#[test]
fn a_review_without_operation_or_resource_is_a_bad_request_not_an_allow() {
    let mut w = World::new();
    let r = w.send(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "x"}}));
    assert!(!r.allowed);
    assert_eq!(r.uid, "x");
    assert!(message(&r).contains("request.operation"), "{}", message(&r));
}

// ---- Hostile edits, arithmetic, reservations, huge scale-ups, late vendors ----------

const MORE_QUEUES: &str = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q2, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: default, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":10,"RTX-4090":10}'}}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: unlimited, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":18446744073709551615}'}}
status: {state: Open}
"#;

fn world() -> World {
    World::with(&format!("{CLUSTER}{MORE_QUEUES}"))
}

/// The pod as the API server stores it after the mutating webhook: `extra` annotations added.
fn stored(mut p: Value, extra: &[(&str, &str)]) -> Value {
    for (k, v) in extra {
        p["metadata"]["annotations"][*k] = json!(v);
    }
    p
}

#[test]
fn a_pod_create_is_stamped_with_the_queue_it_is_charged_to() {
    // docs/annotations.md: "The queue a pod was admitted to is stamped on it at CREATE by the
    // mutating webhook (annotation volcano.sh/card.queue)".
    let mut w = world();
    w.cfg.pin = false;
    let r = w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "1")).build());
    assert_eq!(
        patch(&r),
        json!([{"op": "add", "path": "/metadata/annotations/volcano.sh~1card.queue", "value": "q"}])
    );
}

#[test]
fn a_forged_card_queue_at_create_is_refused() {
    let mut w = world();
    let p = stored(
        pod("a", "q", Some("NVIDIA-H200"), "1"),
        &[("volcano.sh/card.queue", "default")],
    );
    let r = w.send(R::pod("CREATE", p).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        r#"pod ml/a sets volcano.sh/card.queue="default" but its queue is q; card-quota writes that annotation, remove it"#
    );
    let p = stored(
        pod("b", "q", Some("NVIDIA-H200"), "1"),
        &[("volcano.sh/card.charged", "Bogus")],
    );
    let r = w.send(R::pod("CREATE", p).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("card-quota writes that annotation when the pod is bound"),
        "{}",
        message(&r)
    );
}

#[test]
fn rewriting_card_charged_on_a_bound_pod_is_refused_and_the_card_still_counts() {
    // docs/annotations.md: "Pod UPDATEs that change card.queue, card.charged or card.name of a pod
    // with card demand are refused (only card-quota writes the first two)."
    let mut w = world();
    let p = pod("a", "q", Some("NVIDIA-H200"), "3");
    assert!(w.send(R::pod("CREATE", p.clone()).build()).allowed);
    assert!(w.send(R::binding("ml", "a", "h200-1").build()).allowed);
    let mut old = stored(
        p,
        &[
            ("volcano.sh/card.queue", "q"),
            ("volcano.sh/card.charged", "NVIDIA-H200"),
        ],
    );
    old["spec"]["nodeName"] = json!("h200-1");
    for (key, forged) in [
        ("volcano.sh/card.charged", json!("Bogus")),
        ("volcano.sh/card.queue", json!("default")),
    ] {
        let mut new = old.clone();
        new["metadata"]["annotations"][key] = forged;
        let r = w.send(R::pod("UPDATE", new).old(old.clone()).build());
        assert!(!r.allowed, "{key}");
        assert!(
            message(&r).starts_with(&format!(
                "pod ml/a has card demand: {key} cannot be changed"
            )),
            "{}",
            message(&r)
        );
    }
    let mut new = old.clone();
    new["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("volcano.sh/card.charged");
    assert!(
        !w.send(R::pod("UPDATE", new).old(old.clone()).build())
            .allowed
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 3);
    assert!(
        !w.send(R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
}

#[test]
fn relabelling_a_bound_pod_into_another_group_does_not_move_its_cards() {
    // docs/annotations.md: "editing the pod's labels or annotations never moves its cards".
    let mut w = world();
    assert!(
        w.send(R::podgroup("CREATE", pg("elsewhere", "default", r#"{"RTX-4090":1}"#)).build())
            .allowed
    );
    let p = pod("a", "q", Some("NVIDIA-H200"), "3");
    assert!(w.send(R::pod("CREATE", p.clone()).build()).allowed);
    assert!(w.send(R::binding("ml", "a", "h200-1").build()).allowed);
    let mut old = stored(
        p,
        &[
            ("volcano.sh/card.queue", "q"),
            ("volcano.sh/card.charged", "NVIDIA-H200"),
        ],
    );
    old["spec"]["nodeName"] = json!("h200-1");
    let mut new = old.clone();
    let anns = new["metadata"]["annotations"].as_object_mut().unwrap();
    anns.remove("scheduling.volcano.sh/queue-name");
    anns.insert("scheduling.k8s.io/group-name".into(), json!("elsewhere"));
    assert!(w.send(R::pod("UPDATE", new).old(old).build()).allowed);
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 3);
    assert_eq!(w.usage("default", "NVIDIA-H200")["allocated"], 0);
    assert!(
        !w.send(R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
}

#[test]
fn a_pod_labelled_only_with_volcano_queue_name_is_charged_to_that_queue() {
    // docs/annotations.md: a pod's queue is "its own label volcano.sh/queue-name, else annotation
    // volcano.sh/queue-name, else annotation scheduling.volcano.sh/queue-name".
    let mut w = world();
    assert!(
        w.send(R::pod("CREATE", pod("a", "q2", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    let labelled = |name: &str| {
        let mut p = pod(name, "x", Some("NVIDIA-H200"), "1");
        p["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("scheduling.volcano.sh/queue-name");
        p["metadata"]["labels"] = json!({"volcano.sh/queue-name": "q2"});
        p
    };
    let r = w.send(R::pod("CREATE", labelled("b")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue q2 has insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
    // The label wins over the annotations, and the PodGroup over all of them.
    let mut p = labelled("c");
    p["metadata"]["annotations"]["volcano.sh/queue-name"] = json!("default");
    p["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = json!("default");
    assert!(!w.send(R::pod("CREATE", p.clone()).build()).allowed);
    assert!(
        w.send(R::podgroup("CREATE", pg("job", "default", r#"{"NVIDIA-H200":1}"#)).build())
            .allowed
    );
    p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("job");
    let r = w.send(R::pod("CREATE", p).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(patch(&r)[0]["value"], "default");
}

#[test]
fn a_volcano_pod_that_names_no_queue_is_charged_to_the_queue_its_namespace_names() {
    // docs/annotations.md: a pod of Volcano's scheduler that names no queue (or `default`)
    // is in the queue its Namespace's scheduling.volcano.sh/queue-name names, as Volcano's
    // PodGroup webhook puts it there; a pod of another scheduler is not.
    let ns = r#"
---
apiVersion: v1
kind: Namespace
metadata: {name: ml, annotations: {scheduling.volcano.sh/queue-name: q2}}
"#;
    let mut w = World::with(&format!("{CLUSTER}{MORE_QUEUES}{ns}"));
    let unnamed = |name: &str, scheduler: &str| {
        support::pod(name)
            .scheduler(scheduler)
            .gpus("1")
            .card("NVIDIA-H200")
            .build()
    };
    let r = w.send(R::pod("CREATE", unnamed("a", "volcano")).build());
    assert!(r.allowed, "{}", message(&r));
    let stamp = patch(&r);
    assert!(
        stamp.as_array().unwrap().iter().any(|op| op["path"]
            == "/metadata/annotations/volcano.sh~1card.queue"
            && op["value"] == "q2"),
        "{stamp}"
    );
    assert_eq!(w.usage("q2", "NVIDIA-H200")["pending"], 1);
    // q2 holds one H200: the next, naming `default` explicitly, goes there too.
    let mut explicit = unnamed("b", "volcano");
    explicit["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = json!("default");
    let r = w.send(R::pod("CREATE", explicit).build());
    assert!(
        message(&r).starts_with("queue q2 has insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
    // A pod of kube-scheduler that names no queue stays in `default`; one naming a
    // queue of its own stays there.
    let r = w.send(R::pod("CREATE", unnamed("c", "default-scheduler")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("default", "NVIDIA-H200")["pending"], 1);
    let r = w.send(R::pod("CREATE", pod("d", "q", Some("NVIDIA-H200"), "1")).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 1);
}

#[test]
fn a_namespace_naming_a_queue_moves_its_unstamped_volcano_pods_and_leaves_stamped_ones() {
    // A pod stored without card-quota's stamp (created before the install) follows its
    // Namespace's queue as Volcano would; a stamped pod keeps the queue it was admitted to.
    let pods = r#"
---
apiVersion: v1
kind: Pod
metadata: {name: old, namespace: ml, annotations: {volcano.sh/card.name: NVIDIA-H200}}
spec: {schedulerName: volcano, nodeName: h200-1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: stamped, namespace: ml, annotations: {volcano.sh/card.name: NVIDIA-H200, volcano.sh/card.queue: default}}
spec: {schedulerName: volcano, nodeName: h200-1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;
    let ns = |q: &str| {
        format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: ml, annotations: {{scheduling.volcano.sh/queue-name: '{q}'}}}}\n"
        )
    };
    let w = World::with(&format!("{CLUSTER}{MORE_QUEUES}{pods}"));
    assert_eq!(w.usage("default", "NVIDIA-H200")["allocated"], 2);
    // The Namespace listed after its pods (a dump's order), or before: the same answer.
    for yaml in [
        format!("{CLUSTER}{MORE_QUEUES}{pods}{}", ns("q2")),
        format!("{CLUSTER}{MORE_QUEUES}{}{pods}", ns("q2")),
    ] {
        let mut w = World::with(&yaml);
        assert_eq!(w.usage("q2", "NVIDIA-H200")["allocated"], 1);
        assert_eq!(w.usage("default", "NVIDIA-H200")["allocated"], 1);
        // The annotation taken off (an empty value names no queue): back to `default`.
        w.snap.set_namespace_queue("ml", None);
        assert_eq!(w.usage("q2", "NVIDIA-H200")["allocated"], 0);
        assert_eq!(w.usage("default", "NVIDIA-H200")["allocated"], 2);
    }
    let w = World::with(&format!("{CLUSTER}{MORE_QUEUES}{pods}{}", ns("")));
    assert_eq!(w.usage("default", "NVIDIA-H200")["allocated"], 2);
}

#[test]
fn moving_a_podgroup_into_a_full_queue_is_checked_like_a_new_charge() {
    // docs/annotations.md: "Changing a PodGroup's spec.queue is checked like a new charge of all
    // its pods' cards in the new queue."
    let mut w = world();
    let group = pg("job", "q", r#"{"NVIDIA-H200":2}"#);
    assert!(w.send(R::podgroup("CREATE", group.clone()).build()).allowed);
    for name in ["p1", "p2"] {
        let mut p = pod(name, "q", Some("NVIDIA-H200"), "1");
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("job");
        assert!(w.send(R::pod("CREATE", p).build()).allowed);
        assert!(w.send(R::binding("ml", name, "h200-1").build()).allowed);
    }
    let mut moved = group.clone();
    moved["spec"]["queue"] = json!("q2");
    let r = w.send(
        R::podgroup("UPDATE", moved.clone())
            .old(group.clone())
            .build(),
    );
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("podgroup ml/job cannot move from queue q to q2: queue q2 has insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
    // Without a request the pods alone are checked, and still do not fit.
    let mut bare = group.clone();
    bare["metadata"]["annotations"] = json!({});
    let mut bare_moved = bare.clone();
    bare_moved["spec"]["queue"] = json!("q2");
    assert!(
        !w.send(R::podgroup("UPDATE", bare_moved).old(bare).build())
            .allowed
    );
    // Into a queue with room it goes.
    moved["spec"]["queue"] = json!("default");
    assert!(
        w.send(R::podgroup("UPDATE", moved).old(group).build())
            .allowed
    );
    // The stamped pods stay charged to q.
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2);
}

const TERMINATING: &str = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: job, namespace: ml}
spec: {queue: q2}
---
apiVersion: v1
kind: Pod
metadata:
  name: stamped
  namespace: ml
  deletionTimestamp: "2999-01-01T00:00:00Z"
  annotations: {scheduling.k8s.io/group-name: job, volcano.sh/card.name: NVIDIA-H200, volcano.sh/card.queue: q2, volcano.sh/card.charged: NVIDIA-H200}
spec: {nodeName: h200-1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;

#[test]
fn deleting_a_podgroup_keeps_its_terminating_pods_charged_to_their_queue() {
    // docs/annotations.md: "deleting its PodGroup ... never moves its cards"; §1: "A terminating
    // pod inside its grace period still holds its card."
    for stamp in [true, false] {
        let yaml = format!("{CLUSTER}{MORE_QUEUES}{TERMINATING}");
        let yaml = if stamp {
            yaml
        } else {
            yaml.replace(", volcano.sh/card.queue: q2", "")
        };
        let mut w = World::with(&yaml);
        assert_eq!(
            w.usage("q2", "NVIDIA-H200")["allocated"],
            1,
            "stamp={stamp}"
        );
        let del = R::podgroup("DELETE", Value::Null)
            .named("ml", "job")
            .build();
        assert!(w.send(del).allowed);
        assert_eq!(
            w.usage("q2", "NVIDIA-H200")["allocated"],
            1,
            "stamp={stamp}"
        );
        assert_eq!(
            w.usage("default", "NVIDIA-H200")["allocated"],
            0,
            "stamp={stamp}"
        );
        assert!(
            !w.send(R::pod("CREATE", pod("next", "q2", Some("NVIDIA-H200"), "1")).build())
                .allowed
        );
    }
}

#[test]
fn a_pod_of_u64_max_cards_on_its_node_cannot_wrap_allocated_back() {
    let mut w = world();
    assert!(
        w.send(R::pod("CREATE", pod("a", "q2", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    assert!(w.send(R::binding("ml", "a", "h200-1").build()).allowed);
    let mut huge = pod("huge", "q2", Some("NVIDIA-H200"), "18446744073709551615");
    huge["spec"]["nodeName"] = json!("h200-1");
    let r = w.send(R::pod("CREATE", huge).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q2 has insufficient NVIDIA-H200 quota: requested 18446744073709551615, in use 1 (allocated 1, pending 0, reserved 0), quota 1"
    );
    let mut next = pod("next", "q2", Some("NVIDIA-H200"), "1");
    next["spec"]["nodeName"] = json!("h200-1");
    assert!(!w.send(R::pod("CREATE", next).build()).allowed);
    // A quantity past u64::MAX is a clear error, in any spelling.
    let r = w.send(R::pod("CREATE", pod("over", "q2", Some("NVIDIA-H200"), "16Ei")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains(r#"quantity "16Ei" is larger than 18446744073709551615 cards"#),
        "{}",
        message(&r)
    );
}

#[test]
fn a_request_near_u64_max_is_not_extra_room() {
    let mut w = world();
    let r = w.send(
        R::podgroup(
            "CREATE",
            pg("big", "q", r#"{"NVIDIA-H200":18446744073709551613}"#),
        )
        .build(),
    );
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with(
            "queue q has insufficient NVIDIA-H200 quota: requested 18446744073709551613"
        ),
        "{}",
        message(&r)
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 0);
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "3")).build())
            .allowed
    );
    assert!(
        !w.send(R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
}

#[test]
fn a_quota_of_u64_max_is_valid_and_admits() {
    let mut w = world();
    for (name, n) in [("a", "18446744073709551615"), ("b", "1")] {
        let r = w.send(R::pod("CREATE", pod(name, "unlimited", Some("NVIDIA-H200"), n)).build());
        assert_eq!(r.allowed, name == "a", "{name}: {}", message(&r));
    }
    assert_eq!(
        w.usage("unlimited", "NVIDIA-H200"),
        json!({"quota": 18446744073709551615u64, "allocated": 0, "pending": 18446744073709551615u64, "reserved": 0})
    );
    let r = w.send(R::queue("UPDATE", json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "unlimited", "annotations": {"volcano.sh/card.quota": r#"{"NVIDIA-H200":18446744073709551615}"#}}})).build());
    assert!(r.allowed);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn a_binding_checks_every_card_resource_of_a_stored_pod() {
    // docs/models.md: "The model a bound pod uses = the model that its requested card resource
    // maps to on its node" - for each resource it requests.
    let yaml = format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: v1
kind: Pod
metadata: {name: mig-user, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: NVIDIA-H200/mig-1g.18gb-mixed}}
spec: {nodeName: h200-1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/mig-1g.18gb: "2"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: mixed, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1", nvidia.com/mig-1g.18gb: "3"}}}]}
"#
    );
    let mut w = World::with(&yaml);
    let r = w.send(R::binding("ml", "mixed", "h200-1").build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient NVIDIA-H200/mig-1g.18gb-mixed quota: requested 3, in use 2 (allocated 2, pending 0, reserved 0), quota 4"
    );
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 0);
}

#[test]
fn a_pod_draws_on_every_entry_of_its_groups_request_that_shares_a_model() {
    // docs/decisions.md: reserved = max(0, request - cards of its pending and allocated pods).
    let yaml = format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: two, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2,"RTX-4090":2}'}}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: four, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4,"RTX-4090":2}'}}
status: {state: Open}
"#
    );
    let member = |name: &str, card: &str, group: &str| {
        let queue = if group == "j1" { "two" } else { "four" };
        let mut p = pod(name, queue, Some(card), "2");
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!(group);
        p
    };
    // {H200:2, 4090:2} with its own H200|4090 pod of 2.
    let mut w = World::with(&yaml);
    assert!(
        w.send(
            R::podgroup(
                "CREATE",
                pg("j1", "two", r#"{"NVIDIA-H200":2,"RTX-4090":2}"#)
            )
            .build()
        )
        .allowed
    );
    let r = w.send(R::pod("CREATE", member("a", "NVIDIA-H200|RTX-4090", "j1")).build());
    assert!(r.allowed, "{}", message(&r));
    let reserved: u64 = ["NVIDIA-H200", "RTX-4090"]
        .iter()
        .map(|m| w.usage("two", m)["reserved"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(reserved, 2);
    // {"H200|4090":2, "H200":2} and two H200 pods of 2 (H200 quota 4).
    let mut w = World::with(&yaml);
    assert!(
        w.send(
            R::podgroup(
                "CREATE",
                pg(
                    "j2",
                    "four",
                    r#"{"NVIDIA-H200|RTX-4090":2,"NVIDIA-H200":2}"#
                )
            )
            .build()
        )
        .allowed
    );
    for name in ["a", "b"] {
        let r = w.send(R::pod("CREATE", member(name, "NVIDIA-H200", "j2")).build());
        assert!(r.allowed, "{name}: {}", message(&r));
        assert!(w.send(R::binding("ml", name, "h200-1").build()).allowed);
    }
    assert_eq!(
        w.usage("four", "NVIDIA-H200|RTX-4090")["reserved"],
        Value::Null
    );
    assert_eq!(w.usage("four", "NVIDIA-H200")["reserved"], 0);
    assert_eq!(w.usage("four", "NVIDIA-H200")["allocated"], 4);
}

#[test]
fn a_scale_to_two_billion_replicas_is_clamped_without_listing_them() {
    let mut w = world();
    let r = w.send(R::scale("deployments", "ml", "web", 1, i32::MAX).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        patch(&r),
        json!([{"op": "replace", "path": "/spec/replicas", "value": 3}])
    );
    assert!(
        r.warnings[0].contains("scale-up from 1 to 2147483647 replicas clamped to 3"),
        "{:?}",
        r.warnings
    );
    let mut w = world();
    w.cfg.scale_policy = ScalePolicy::Deny;
    let r = w.send(R::scale("deployments", "ml", "web", 1, i32::MAX).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("requested 2147483646"),
        "{}",
        message(&r)
    );
}

#[test]
fn a_pod_of_a_configured_vendor_bound_before_its_node_is_known_is_charged_once_it_is() {
    let yaml = r#"
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: npu, annotations: {volcano.sh/card.quota: '{"X-NPU":1}'}}
status: {state: Open}
---
apiVersion: v1
kind: Pod
metadata: {name: early, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: npu}}
spec: {nodeName: npu-1, containers: [{name: c, image: x, resources: {limits: {example.com/npu: "1"}}}]}
"#;
    let mut w = World::with_npu(yaml);
    assert_eq!(w.usage("npu", "X-NPU")["allocated"], 0);
    let node = npu_node();
    card_quota::snapshot::load::upsert(&mut w.snap, &node).unwrap();
    assert_eq!(w.usage("npu", "X-NPU")["allocated"], 1);
    // A status change of the vendor's only node keeps the pod charged.
    let mut changed = node.clone();
    changed["status"]["allocatable"]["example.com/npu"] = json!("7");
    card_quota::snapshot::load::upsert(&mut w.snap, &changed).unwrap();
    assert_eq!(w.usage("npu", "X-NPU")["allocated"], 1);
    let late = pod_res("late", "npu", Some("X-NPU"), "example.com/npu", "1");
    let r = w.send(R::pod("CREATE", late).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue npu has insufficient X-NPU quota: requested 1, in use 1"),
        "{}",
        message(&r)
    );
}

/// The webhook reads a pod before it locks the snapshot, with the default card
/// resources; the snapshot's own list (`--card-resource`) decides what is card demand.
#[test]
fn a_pod_read_before_it_is_decided_is_classified_by_the_installs_card_resources() {
    use card_quota::decide::{decide, read_ahead, review::parse_review};
    let yaml = r#"
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: npu, annotations: {volcano.sh/card.quota: '{"X-NPU":1}'}}
status: {state: Open}
"#;
    let (cfg, now) = (Config::default(), jiff::Timestamp::now());
    let body = R::pod(
        "CREATE",
        pod_res("p", "npu", Some("X-NPU"), "example.com/npu", "1"),
    )
    .build();
    // Not among the default card resources: it names a model but requests no card.
    let plain = World::with(yaml);
    let read = parse_review(&body).unwrap();
    read_ahead(&read);
    let d = decide(&read, &plain.snap, &cfg, now);
    assert!(!d.allowed && d.charge.is_none(), "{d:?}");
    // Configured: the same read is charged, as a fresh read is.
    let mut w = World::with_npu(yaml);
    card_quota::snapshot::load::upsert(&mut w.snap, &npu_node()).unwrap();
    let read = parse_review(&body).unwrap();
    read_ahead(&read);
    let after = decide(&read, &w.snap, &cfg, now);
    let fresh = decide(&parse_review(&body).unwrap(), &w.snap, &cfg, now);
    assert!(after.allowed && after.charge.is_some(), "{after:?}");
    assert_eq!(
        (after.allowed, &after.message, &after.patch, &after.charge),
        (fresh.allowed, &fresh.message, &fresh.patch, &fresh.charge)
    );
}

/// A node that announces cards of a resource the install does not gate: reported, not
/// counted (issue 45: `cambricon.com/mlu` was discovered but never gated).
#[test]
fn a_node_announcing_cards_the_install_does_not_gate_is_reported_not_counted() {
    let mut w = World::new();
    card_quota::snapshot::load::upsert(&mut w.snap, &npu_node()).unwrap();
    let unmanaged: Vec<(String, String, String)> = w
        .snap
        .unmanaged_cards()
        .map(|(n, r, m, _)| (n.to_string(), r.to_string(), m.to_string()))
        .collect();
    assert_eq!(
        unmanaged,
        [(
            "npu-1".to_string(),
            "example.com/npu".to_string(),
            "X-NPU".to_string()
        )]
    );
    assert!(w.snap.models_offering("example.com/npu").is_empty());
}

// ---- Steering: pods pinned to the model they were admitted for ------------------------

/// The `spec.nodeSelector` a CREATE's patch leaves on the pod, and its pin annotation.
fn pinned_by(r: &AdmissionResponse, pod: &Value) -> (Value, Value) {
    let mut p = pod.clone();
    if r.patch.is_some() {
        let ops: json_patch::Patch = serde_json::from_value(patch(r)).unwrap();
        json_patch::patch(&mut p, &ops).unwrap();
    }
    (
        p["spec"]["nodeSelector"].clone(),
        p["metadata"]["annotations"]["volcano.sh/card.pinned"].clone(),
    )
}

fn two_queue_world() -> World {
    World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: mixed, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2,"RTX-4090":6,"NVIDIA-H200/mig-1g.18gb-mixed":2,"NVIDIA-H200/mps-140g*1/2":2}'}}
status: {state: Open}
"#
    ))
}

#[test]
fn a_pod_without_constraints_is_pinned_to_its_first_model_with_room_then_the_next() {
    // docs/decisions.md Steering: "the first of its usable alternatives, in card.name order, that
    // has room once every pending pod is counted on its own pin".
    let mut w = two_queue_world();
    let mut seen = Vec::new();
    for i in 0..4 {
        let p = pod(&format!("p{i}"), "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
        let r = w.send(R::pod("CREATE", p.clone()).build());
        assert!(r.allowed, "{}", message(&r));
        let (sel, why) = pinned_by(&r, &p);
        seen.push(sel["nvidia.com/gpu.product"].as_str().unwrap().to_string());
        assert!(
            why.as_str()
                .unwrap()
                .contains("the first of NVIDIA-H200|RTX-4090 with room in queue mixed"),
            "{why}"
        );
    }
    assert_eq!(seen, ["NVIDIA-H200", "NVIDIA-H200", "RTX-4090", "RTX-4090"]);
    assert_eq!(w.usage("mixed", "NVIDIA-H200")["pending"], 2);
    assert_eq!(w.usage("mixed", "RTX-4090")["pending"], 2);
    assert_eq!(w.usage("mixed", "NVIDIA-H200|RTX-4090"), Value::Null);
}

/// A pod whose models with nodes are full, but which has room on a model no node offers
/// yet, is refused with the numbers of the model it could be placed on (issue 57 #5: it
/// was admitted unpinned, and could bind on the full model with the binding hook down).
#[test]
fn a_pod_with_room_only_on_a_model_no_node_offers_is_refused() {
    let mut w = World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: spill, annotations: {volcano.sh/card.quota: '{"RTX-4090":1,"NVIDIA-A100":2}'}}
status: {state: Open}
"#
    ));
    let first = pod("first", "spill", Some("RTX-4090|NVIDIA-A100"), "1");
    let r = w.send(R::pod("CREATE", first.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        pinned_by(&r, &first).0,
        json!({"nvidia.com/gpu.product": "RTX-4090"})
    );
    let second = pod("second", "spill", Some("RTX-4090|NVIDIA-A100"), "1");
    let r = w.send(R::pod("CREATE", second.clone()).build());
    assert!(!r.allowed, "{:?}", pinned_by(&r, &second));
    assert_eq!(
        message(&r),
        "queue spill has insufficient RTX-4090 quota: requested 1, in use 1 (allocated 0, pending 1, reserved 0), quota 1"
    );
    assert_eq!(w.usage("spill", "RTX-4090")["pending"], 1);
    assert_eq!(w.usage("spill", "RTX-4090|NVIDIA-A100"), Value::Null);
}

#[test]
fn an_agreeing_node_selector_is_kept_and_a_conflicting_one_is_refused() {
    let mut w = two_queue_world();
    let mut p = pod("agree", "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
    p["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "RTX-4090", "zone": "a"});
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        pinned_by(&r, &p).0,
        json!({"nvidia.com/gpu.product": "RTX-4090", "zone": "a"})
    );
    let mut p = pod("clash", "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
    p["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "NVIDIA-A100"});
    let r = w.send(R::pod("CREATE", p).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/clash accepts NVIDIA-H200|RTX-4090 but its node constraints require nvidia.com/gpu.product in [NVIDIA-A100]"
    );
}

#[test]
fn required_terms_on_other_keys_keep_their_own_selector_and_gain_the_pin() {
    let mut w = two_queue_world();
    let mut p = pod("zoned", "mixed", Some("RTX-4090"), "1");
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}});
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    // A nodeSelector is ANDed with every term: no term needs rewriting, no empty In list.
    assert_eq!(
        pinned_by(&r, &p).0,
        json!({"nvidia.com/gpu.product": "RTX-4090"})
    );
}

/// Issue 32 #9: the pin honours every required term, not only `In` lists all terms share.
#[test]
fn a_pin_respects_not_in_and_every_expression_of_every_term() {
    let gpu = "nvidia.com/gpu.product";
    let terms = |t: Value| json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": t}}});
    let cases = [
        // NotIn rules out the preferred model.
        (
            "notin",
            terms(
                json!([{"matchExpressions": [{"key": gpu, "operator": "NotIn", "values": ["NVIDIA-H200"]}]}]),
            ),
        ),
        // Two expressions on the key in one term: both hold.
        (
            "both",
            terms(json!([{"matchExpressions": [
                {"key": gpu, "operator": "In", "values": ["NVIDIA-H200", "RTX-4090"]},
                {"key": gpu, "operator": "In", "values": ["RTX-4090"]}]}])),
        ),
        // ORed terms, one of which excludes nothing but the preferred model.
        (
            "ored",
            terms(json!([
                {"matchExpressions": [{"key": gpu, "operator": "In", "values": ["RTX-4090"]}]},
                {"matchExpressions": [{"key": gpu, "operator": "NotIn", "values": ["NVIDIA-H200", "NVIDIA-A100"]}]}])),
        ),
    ];
    for (name, affinity) in cases {
        let mut w = two_queue_world();
        let mut p = pod(name, "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
        p["spec"]["affinity"] = affinity;
        let r = w.send(R::pod("CREATE", p.clone()).build());
        assert!(r.allowed, "{name}: {}", message(&r));
        assert_eq!(pinned_by(&r, &p).0, json!({gpu: "RTX-4090"}), "{name}");
        assert_eq!(w.usage("mixed", "RTX-4090")["pending"], 1, "{name}");
        assert_eq!(w.usage("mixed", "NVIDIA-H200")["pending"], 0, "{name}");
    }
    // Constraints that rule out every alternative are refused, not pinned.
    let mut w = two_queue_world();
    let mut p = pod("none", "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
    p["spec"]["affinity"] = terms(json!([{"matchExpressions": [
        {"key": gpu, "operator": "NotIn", "values": ["NVIDIA-H200", "RTX-4090"]}]}]));
    let r = w.send(R::pod("CREATE", p).build());
    assert_eq!(
        message(&r),
        "pod ml/none accepts NVIDIA-H200|RTX-4090 but its node constraints rule out each of them (nvidia.com/gpu.product not in [NVIDIA-H200, RTX-4090])"
    );
    let mut p = pod("absent", "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
    p["spec"]["affinity"] =
        terms(json!([{"matchExpressions": [{"key": gpu, "operator": "DoesNotExist"}]}]));
    let r = w.send(R::pod("CREATE", p).build());
    assert_eq!(
        message(&r),
        "pod ml/absent accepts NVIDIA-H200|RTX-4090 but its node constraints require no nvidia.com/gpu.product label"
    );
}

#[test]
fn daemonset_pods_pods_with_a_node_and_updates_are_left_alone() {
    let mut w = two_queue_world();
    let mut ds = pod("ds", "mixed", Some("RTX-4090"), "1");
    ds["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]);
    let r = w.send(R::pod("CREATE", ds.clone()).build());
    assert!(r.allowed);
    assert_eq!(pinned_by(&r, &ds).0, Value::Null);
    let mut named = pod("named", "mixed", Some("RTX-4090"), "1");
    named["spec"]["nodeName"] = json!("rtx-1");
    let r = w.send(R::pod("CREATE", named.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(pinned_by(&r, &named).0, Value::Null);
    let mut fields = pod("fields", "mixed", Some("RTX-4090"), "1");
    fields["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["rtx-1"]}]}]}}});
    let r = w.send(R::pod("CREATE", fields.clone()).build());
    assert_eq!(pinned_by(&r, &fields).0, Value::Null);
    let mut upd = stored(
        pod("ds", "mixed", Some("RTX-4090"), "1"),
        &[("volcano.sh/card.queue", "mixed")],
    );
    upd["metadata"]["ownerReferences"] = ds["metadata"]["ownerReferences"].clone();
    let mut new = upd.clone();
    new["metadata"]["labels"] = json!({"x": "y"});
    let r = w.send(R::pod("UPDATE", new).old(upd).build());
    assert!(r.allowed && r.patch.is_none());
}

#[test]
fn mig_and_mps_pods_are_pinned_by_the_product_label() {
    let mut w = two_queue_world();
    let mig = pod_res(
        "mig",
        "mixed",
        Some("NVIDIA-H200/mig-1g.18gb-mixed"),
        "nvidia.com/mig-1g.18gb",
        "1",
    );
    let r = w.send(R::pod("CREATE", mig.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        pinned_by(&r, &mig).0,
        json!({"nvidia.com/gpu.product": "NVIDIA-H200"})
    );
    // An alternative whose resource the pod does not request is dropped, not refused.
    let mps = pod_res(
        "mps",
        "mixed",
        Some("RTX-4090|NVIDIA-H200/mps-140g*1/2"),
        "nvidia.com/gpu.shared",
        "1",
    );
    let r = w.send(R::pod("CREATE", mps.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    let (sel, why) = pinned_by(&r, &mps);
    assert_eq!(sel, json!({"nvidia.com/gpu.product": "NVIDIA-H200"}));
    assert!(
        why.as_str().unwrap().starts_with(
            "NVIDIA-H200/mps-140g*1/2: the first of NVIDIA-H200/mps-140g*1/2 with room"
        ),
        "{why}"
    );
    assert_eq!(w.usage("mixed", "NVIDIA-H200/mps-140g*1/2")["pending"], 1);
}

#[test]
fn a_pod_drawing_on_its_groups_reservation_is_pinned_where_the_reservation_has_room() {
    let mut w = two_queue_world();
    let mut group = pg("job", "mixed", r#"{"RTX-4090":2}"#);
    group["spec"]["queue"] = json!("mixed");
    assert!(w.send(R::podgroup("CREATE", group).build()).allowed);
    let mut p = pod("member", "mixed", Some("NVIDIA-H200|RTX-4090"), "2");
    p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("job");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        pinned_by(&r, &p).0,
        json!({"nvidia.com/gpu.product": "RTX-4090"})
    );
    assert_eq!(w.usage("mixed", "RTX-4090")["reserved"], 0);
    assert_eq!(w.usage("mixed", "NVIDIA-H200")["pending"], 0);
}

#[test]
fn with_pinning_off_no_pod_is_pinned() {
    let mut w = two_queue_world();
    w.cfg.pin = false;
    let p = pod("free", "mixed", Some("NVIDIA-H200|RTX-4090"), "1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert_eq!(pinned_by(&r, &p), (Value::Null, Value::Null));
    assert_eq!(w.usage("mixed", "NVIDIA-H200|RTX-4090")["pending"], 1);
}

#[test]
fn a_huge_forged_annotation_is_not_echoed_whole() {
    let mut w = world();
    let long = "x".repeat(10_000);
    let p = stored(
        pod("a", "q", Some("NVIDIA-H200"), "1"),
        &[("volcano.sh/card.queue", &long)],
    );
    let r = w.send(R::pod("CREATE", p).build());
    assert!(!r.allowed);
    assert!(message(&r).len() < 250, "{} bytes", message(&r).len());
    assert!(message(&r).contains("(10000 bytes)"), "{}", message(&r));
}

/// Issue 45: every card pod is checked at its CREATE and counted, whatever its
/// scheduler (a second kube-scheduler profile, HAMi's, Yunikorn's): pinned like any, so
/// any scheduler places it on the model it was admitted for.
#[test]
fn pods_of_every_scheduler_are_checked_and_counted() {
    let mut w = World::new();
    let mut other = pod("other", "q", Some("NVIDIA-H200"), "3");
    other["spec"]["schedulerName"] = json!("gpu-binpack");
    let r = w.send(R::pod("CREATE", other.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    let mut p = patch(&r).to_string();
    assert!(p.contains("nvidia.com/gpu.product"), "pinned: {p}");
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 3);
    let mut next = pod("next", "q", Some("NVIDIA-H200"), "1");
    next["spec"]["schedulerName"] = json!("yunikorn");
    let r = w.send(R::pod("CREATE", next).build());
    assert!(!r.allowed, "the other scheduler's pods fill the quota");
    assert!(
        message(&r)
            .starts_with("queue q has insufficient NVIDIA-H200 quota: requested 1, in use 3"),
        "{}",
        message(&r)
    );
    // Its binding by a binder card-quota gates is checked like any other.
    p.clear();
    let r = w.send(R::binding("ml", "other", "rtx-1").build());
    assert!(!r.allowed, "bound on another model than admitted");
}

/// Issue 32 #4: pods without a `card.queue` stamp (created before card-quota was
/// installed) follow their PodGroup's queue; re-creating the group in a full queue is
/// checked like moving it there.
#[test]
fn recreating_the_podgroup_of_unstamped_pods_in_a_full_queue_is_checked_like_a_move() {
    let mut w = World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: small, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}
status: {state: Open}
"#
    ));
    let mut group = waiting_pg("old", "q", "{}");
    group["metadata"]["annotations"] = json!({});
    group["status"] = json!({"phase": "Running"});
    card_quota::snapshot::load::upsert(&mut w.snap, &group).unwrap();
    for name in ["p1", "p2"] {
        let mut p = support::pod(name)
            .card("NVIDIA-H200")
            .gpus("1")
            .stored(&format!("uid-{name}"), "5")
            .build();
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("old");
        p["spec"]["nodeName"] = json!("h200-1");
        card_quota::snapshot::load::upsert(&mut w.snap, &p).unwrap();
    }
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2);
    card_quota::snapshot::load::remove(&mut w.snap, "PodGroup", "ml", "old");
    assert_eq!(w.usage("q", "NVIDIA-H200")["allocated"], 2, "its pods stay");
    let mut again = group.clone();
    again["spec"]["queue"] = json!("small");
    let r = w.send(R::podgroup("CREATE", again.clone()).build());
    assert_eq!(
        message(&r),
        "podgroup ml/old cannot be created in queue small: it would move pod ml/p1 from queue q: queue small has insufficient NVIDIA-H200 quota: requested 2, in use 0 (allocated 0, pending 0, reserved 0), quota 1"
    );
    // Where the pods already are, nothing moves.
    let r = w.send(R::podgroup("CREATE", group).build());
    assert!(r.allowed, "{}", message(&r));
}

/// The reconciler's stamp on a pod from before the install: the queue it is counted in
/// may be added; any other is still refused.
#[test]
fn stamping_an_unstamped_pod_with_the_queue_it_is_counted_in_is_allowed() {
    let mut w = World::new();
    let mut old = support::pod("legacy")
        .queue("q")
        .card("NVIDIA-H200")
        .gpus("1")
        .stored("uid-legacy", "5")
        .build();
    old["spec"]["nodeName"] = json!("h200-1");
    card_quota::snapshot::load::upsert(&mut w.snap, &old).unwrap();
    let mut new = old.clone();
    new["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("q");
    let r = w.send(R::pod("UPDATE", new.clone()).old(old.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    new["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("broken");
    let r = w.send(R::pod("UPDATE", new).old(old).build());
    assert_eq!(
        message(&r),
        "pod ml/legacy has card demand: volcano.sh/card.queue cannot be changed (was unset, now \"broken\")"
    );
}

// ---- enforcement: warn ---------------------------------------------------------------

/// The warning a request admitted in warn mode carries.
fn would_refuse(r: &AdmissionResponse) -> String {
    r.warnings
        .iter()
        .find(|w| w.starts_with("card-quota admitted this"))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn under_warn_an_unpinned_pod_binds_wherever_the_scheduler_puts_it() {
    let mut w = World::new();
    w.cfg.enforcement = Enforcement::Warn;
    // A plain pod: named the queue's models (what counts it while pending), not pinned.
    let plain = support::pod("p")
        .queue("q")
        .scheduler("volcano")
        .gpus("1")
        .build();
    let r = w.send(R::pod("CREATE", plain).build());
    assert!(r.allowed, "{}", message(&r));
    let p = patch(&r).to_string();
    assert!(
        p.contains("card.name") && !p.contains("nodeSelector") && !p.contains("card.pinned"),
        "{p}"
    );
    assert!(w.send(R::binding("ml", "p", "rtx-1").build()).allowed);
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 1);
    // A pod naming H200 that the scheduler put on an RTX-4090 node (nothing pinned it):
    // the binding stands under warn, charged RTX-4090, with what deny would say.
    let r = w.send(R::pod("CREATE", pod("h", "q", Some("NVIDIA-H200"), "1")).build());
    assert!(r.allowed, "{}", message(&r));
    let r = w.send(R::binding("ml", "h", "rtx-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert!(
        would_refuse(&r)
            .contains("under deny: pod ml/h accepts NVIDIA-H200 but node rtx-1 has RTX-4090"),
        "{:?}",
        r.warnings
    );
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 2);
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 0);
    // Under deny the same binding is refused (the pin would have kept it off that node).
    let mut w = World::new();
    assert!(
        w.send(R::pod("CREATE", pod("h", "q", Some("NVIDIA-H200"), "1")).build())
            .allowed
    );
    let r = w.send(R::binding("ml", "h", "rtx-1").build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("accepts NVIDIA-H200 but node rtx-1 has RTX-4090"),
        "{}",
        message(&r)
    );
}

#[test]
fn a_warn_queue_under_a_deny_parent_is_still_pinned() {
    // The parent's deny relies on the pin: only a queue whose whole path is in warn
    // goes unpinned.
    let tree = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: org, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":8}', volcano.sh/card.enforcement: deny}}
spec: {parent: root}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: team, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4}'}}
spec: {parent: org}
status: {state: Open}
"#;
    let mut w = World::with(&format!("{CLUSTER}{tree}"));
    w.cfg.enforcement = Enforcement::Warn;
    let r = w.send(R::pod("CREATE", pod("a", "team", Some("NVIDIA-H200"), "1")).build());
    assert!(r.allowed, "{}", message(&r));
    assert!(
        patch(&r).to_string().contains("nvidia.com/gpu.product"),
        "{}",
        patch(&r)
    );
    // With the parent in warn too, the same pod is left unpinned.
    let mut w = World::with(&format!("{CLUSTER}{}", tree.replace("deny", "warn")));
    w.cfg.enforcement = Enforcement::Warn;
    let r = w.send(R::pod("CREATE", pod("a", "team", Some("NVIDIA-H200"), "1")).build());
    assert!(r.allowed, "{}", message(&r));
    assert!(
        !patch(&r).to_string().contains("nvidia.com/gpu.product"),
        "{}",
        patch(&r)
    );
    // A namespace held to deny is pinned whatever its queues say.
    w.cfg.namespace_enforcement =
        card_quota::decide::NamespaceEnforcement::parse(&["ml=deny"]).unwrap();
    let r = w.send(R::pod("CREATE", pod("b", "team", Some("NVIDIA-H200"), "1")).build());
    assert!(
        patch(&r).to_string().contains("nvidia.com/gpu.product"),
        "{}",
        patch(&r)
    );
}

#[test]
fn under_warn_a_pod_over_quota_is_admitted_unpinned_and_charged_with_a_warning() {
    let mut w = World::new();
    w.cfg.enforcement = Enforcement::Warn;
    assert!(
        w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-H200"), "3")).build())
            .allowed
    );
    let r = w.send(R::pod("CREATE", pod("b", "q", Some("NVIDIA-H200"), "1")).build());
    assert!(r.allowed);
    assert_eq!(
        would_refuse(&r),
        "card-quota admitted this because queue q's enforcement is warn (the install's default); under deny: queue q has insufficient NVIDIA-H200 quota: requested 1, in use 3 (allocated 0, pending 3, reserved 0), quota 3"
    );
    // Warn observes and does not steer: stamped with its queue, never pinned; the
    // warning says where deny would have pinned it.
    let p = patch(&r).to_string();
    assert!(
        p.contains("volcano.sh~1card.queue")
            && !p.contains("nvidia.com/gpu.product")
            && !p.contains("card.pinned"),
        "{p}"
    );
    assert!(
        r.warnings.iter().any(|w| w
            == "card-quota does not pin pods in warn mode; under deny it would pin this one to NVIDIA-H200: the first of NVIDIA-H200 with room in queue q (nodeSelector nvidia.com/gpu.product=NVIDIA-H200)"),
        "{:?}",
        r.warnings
    );
    // Usage stays exact: past the quota.
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 4);
    // A request that fits is not refused by anything: only where deny would pin it.
    let r = w.send(R::pod("CREATE", pod("c", "q", Some("RTX-4090"), "1")).build());
    assert!(r.allowed && would_refuse(&r).is_empty(), "{:?}", r.warnings);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(!patch(&r).to_string().contains("nodeSelector"));
    // The Event is on the pod the CREATE makes (its uid as the validating hook sees it).
    let mut doc = pod("e", "q", Some("NVIDIA-H200"), "1");
    doc["metadata"]["uid"] = json!("uid-e");
    let req = parse_review(&R::pod("CREATE", doc).build()).unwrap();
    let d = decide_enforcing(&req, &mut w.snap, &w.cfg, jiff::Timestamp::now());
    assert!(d.allowed && d.warned());
    let e = d.event.expect("an Event");
    assert_eq!(
        (
            e.reason,
            e.regarding.kind.as_str(),
            e.regarding.name.as_str()
        ),
        ("CardQuotaWouldRefuse", "Pod", "e")
    );
    assert_eq!(e.regarding.uid.as_deref(), Some("uid-e"));
    assert!(
        e.message.starts_with(
            "admitted in warn mode; under deny: queue q has insufficient NVIDIA-H200 quota"
        ),
        "{}",
        e.message
    );
    // Where deny would have pinned it is in the Event too (warn pinned nothing).
    assert!(
        e.message.ends_with(
            "; deny would have pinned it to NVIDIA-H200: the first of NVIDIA-H200 with room in queue q (nodeSelector nvidia.com/gpu.product=NVIDIA-H200)"
        ),
        "{}",
        e.message
    );
    // Under deny the same request is refused, and not marked.
    w.cfg.enforcement = Enforcement::Deny;
    let d = decide_enforcing(&req, &mut w.snap, &w.cfg, jiff::Timestamp::now());
    assert!(!d.allowed && !d.warned());
}

#[test]
fn a_queue_chooses_its_own_enforcement_over_the_installs() {
    let warn_queue = r#"
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: trial, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}', volcano.sh/card.enforcement: warn}}
"#;
    let mut w = World::with(&format!("{CLUSTER}---{warn_queue}"));
    // Install: deny. Queue trial: warn; queue q: the install's deny.
    assert!(
        w.send(R::pod("CREATE", pod("t1", "trial", Some("NVIDIA-H200"), "2")).build())
            .allowed
    );
    assert_eq!(w.usage("trial", "NVIDIA-H200")["pending"], 2);
    let r = w.send(R::pod("CREATE", pod("q1", "q", Some("NVIDIA-H200"), "4")).build());
    assert!(!r.allowed);
    assert!(message(&r).starts_with("queue q has insufficient NVIDIA-H200 quota"));
    // Install: warn; a queue annotated deny still refuses.
    w.cfg.enforcement = Enforcement::Warn;
    let mut strict = w.snap.queue(&QueueName::new("q")).unwrap().clone();
    strict.enforcement = Ok(Some(Enforcement::Deny));
    w.snap.upsert_queue(strict);
    let r = w.send(R::pod("CREATE", pod("q2", "q", Some("NVIDIA-H200"), "4")).build());
    assert!(!r.allowed, "{:?}", r.warnings);
}

/// Issue 45: a namespace's enforcement may only tighten. A namespace in warn never lets
/// its pods take a queue in deny past its quota (they were admitted "in warn mode" into
/// another tenant's queue); a namespace in deny is refused even in a queue in warn.
#[test]
fn namespace_enforcement_only_tightens() {
    let in_ns = |name: &str, ns: &str, n: &str| {
        let mut p = pod(name, "q", Some("NVIDIA-H200"), n);
        p["metadata"]["namespace"] = json!(ns);
        p
    };
    let mut w = World::new();
    w.cfg.namespace_enforcement =
        card_quota::decide::NamespaceEnforcement::parse(&["trial=warn"]).unwrap();
    assert!(
        w.send(R::pod("CREATE", in_ns("a", "trial", "3")).build())
            .allowed
    );
    let r = w.send(R::pod("CREATE", in_ns("b", "trial", "1")).build());
    assert!(!r.allowed, "the queue is in deny: {:?}", r.warnings);
    assert!(message(&r).starts_with("queue q has insufficient NVIDIA-H200 quota"));
    assert_eq!(w.usage("q", "NVIDIA-H200")["pending"], 3);
    // A queue in warn (its own annotation) admits with a warning naming what applied.
    let mut lax = w.snap.queue(&QueueName::new("q")).unwrap().clone();
    lax.enforcement = Ok(Some(Enforcement::Warn));
    w.snap.upsert_queue(lax);
    let r = w.send(R::pod("CREATE", in_ns("c", "trial", "1")).build());
    assert!(r.allowed);
    assert!(
        would_refuse(&r).starts_with("card-quota admitted this because queue q's enforcement is warn (its volcano.sh/card.enforcement annotation); under deny: queue q has insufficient NVIDIA-H200 quota"),
        "{:?}",
        r.warnings
    );
    // A namespace in deny under an install in warn refuses.
    let mut w = World::new();
    w.cfg.enforcement = Enforcement::Warn;
    w.cfg.namespace_enforcement =
        card_quota::decide::NamespaceEnforcement::parse(&["prod=deny"]).unwrap();
    assert!(
        w.send(R::pod("CREATE", in_ns("a", "prod", "3")).build())
            .allowed
    );
    assert!(
        !w.send(R::pod("CREATE", in_ns("b", "prod", "1")).build())
            .allowed
    );
    assert!(
        w.send(R::pod("CREATE", in_ns("c", "ml", "1")).build())
            .allowed
    );
}

#[test]
fn namespace_enforcement_entries_are_checked() {
    use card_quota::decide::NamespaceEnforcement as N;
    let e = |s: &[&str]| N::parse(s).unwrap_err().to_string();
    assert_eq!(
        e(&["ml"]),
        r#"invalid --namespace-enforcement "ml": expected NAMESPACE=deny or NAMESPACE=warn"#
    );
    assert_eq!(
        e(&["ml=audit"]),
        r#"invalid --namespace-enforcement "ml=audit": expected "deny" or "warn", got "audit""#
    );
    assert_eq!(
        e(&["ML=warn"]),
        r#"invalid --namespace-enforcement "ML=warn": "ML" is not a namespace name (lowercase letters, digits and '-', at most 63)"#
    );
    assert_eq!(
        e(&["ml=warn", "ml=deny"]),
        r#"invalid --namespace-enforcement "ml=deny": namespace ml is named more than once"#
    );
    let ok = N::parse(&["b=warn", "a=deny"]).unwrap();
    assert_eq!(
        ok.entries().collect::<Vec<_>>(),
        [("a", Enforcement::Deny), ("b", Enforcement::Warn)]
    );
}

#[test]
fn under_warn_scale_ups_are_not_clamped_enqueues_and_bindings_pass() {
    let mut w = World::new();
    w.cfg.enforcement = Enforcement::Warn;
    let r = w.send(R::scale("deployments", "ml", "web", 1, 5).build());
    assert!(r.allowed);
    assert!(r.patch.is_none(), "no clamp under warn");
    assert!(would_refuse(&r).contains("clamped to 3: queue q has insufficient RTX-4090 quota: requested 4, in use 0 (allocated 0, pending 0, reserved 0), quota 2; "), "{:?}", r.warnings);
    let j = waiting_pg("big", "q", r#"{"NVIDIA-H200":5}"#);
    assert!(w.send(R::podgroup("CREATE", j.clone()).build()).allowed);
    let r = enqueue(&mut w, &j);
    assert!(r.allowed && !would_refuse(&r).is_empty(), "{}", message(&r));
    assert_eq!(w.usage("q", "NVIDIA-H200")["reserved"], 5);
    // A bind past the quota: admitted, charged allocated.
    assert!(
        w.send(R::pod("CREATE", pod("r1", "q", Some("RTX-4090"), "3")).build())
            .allowed
    );
    let r = w.send(R::binding("ml", "r1", "rtx-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("q", "RTX-4090")["allocated"], 3);
}

#[test]
fn warn_admits_nothing_that_is_not_about_a_quota() {
    let mut w = World::new();
    w.cfg.enforcement = Enforcement::Warn;
    // A Closed queue, a malformed card.name. (A bind to a model the pod does not accept
    // stands under warn, which pinned nothing: see
    // under_warn_an_unpinned_pod_binds_wherever_the_scheduler_puts_it.)
    let r = w.send(R::pod("CREATE", pod("c", "closed", Some("NVIDIA-H200"), "1")).build());
    assert!(!r.allowed);
    assert!(
        !w.send(R::pod("CREATE", pod("x", "q", Some("A||B"), "1")).build())
            .allowed
    );
    // A broken quota refuses charges under deny and warns under warn.
    let r = w.send(R::pod("CREATE", pod("b", "broken", Some("NVIDIA-H200"), "1")).build());
    assert!(
        r.allowed
            && would_refuse(&r)
                .contains("queue broken has quota 0 for every model until its annotation is fixed"),
        "{}",
        message(&r)
    );
    // A Queue whose own quota is malformed is refused whatever the enforcement, and so is
    // a malformed enforcement.
    let q = |anns: Value| json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "n", "annotations": anns}});
    assert!(
        !w.send(R::queue("CREATE", q(json!({"volcano.sh/card.quota": "{"}))).build())
            .allowed
    );
    let r = w.send(R::queue("CREATE", q(json!({"volcano.sh/card.enforcement": "audit"}))).build());
    assert_eq!(
        message(&r),
        r#"invalid volcano.sh/card.enforcement on queue n: expected "deny" or "warn", got "audit""#
    );
}

/// Issue 45: the pin respects all of the pod's own node constraints, not only product
/// labels. An `H200|RTX` pod confined to a zone where only RTX nodes run is pinned to
/// RTX (pinned to H200 it would wait for ever, holding an H200 of its queue); confined
/// to a zone with no node of either, it is refused naming the constraint.
#[test]
fn the_pin_goes_to_a_model_whose_nodes_the_pods_constraints_allow() {
    let mut w = World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: v1
kind: Node
metadata: {name: rtx-east, labels: {nvidia.com/gpu.product: RTX-4090, topology.kubernetes.io/zone: east}}
status: {allocatable: {nvidia.com/gpu: "4"}}
"#
    ));
    let in_zone = |name: &str, zone: &str| {
        let mut p = pod(name, "q", None, "1");
        p["spec"]["nodeSelector"] = json!({"topology.kubernetes.io/zone": zone});
        p
    };
    let p = in_zone("east-1", "east");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    let (selector, _) = pinned_by(&r, &p);
    assert_eq!(
        selector,
        json!({"topology.kubernetes.io/zone": "east", "nvidia.com/gpu.product": "RTX-4090"})
    );
    assert_eq!(w.usage("q", "RTX-4090")["pending"], 1);
    let r = w.send(R::pod("CREATE", in_zone("west-1", "west")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/west-1 accepts NVIDIA-H200|RTX-4090 but its node constraints (nodeSelector topology.kubernetes.io/zone=west) allow no node of any of them"
    );
}

/// Issue 46 #8: with pins on, the bind of a pod card-quota's cache does not show yet
/// never waits on card-quota (a cardless pod, or a card pod charged at its CREATE); with
/// pins off the binding is the hard line and says "try again".
#[test]
fn a_bind_of_a_pod_the_cache_does_not_show_fails_open_only_with_pins_on() {
    let mut w = World::new();
    let now = jiff::Timestamp::now();
    let doc = R::binding("ml", "not-seen-yet", "rtx-1").build();
    let r = review(&doc, &mut w.snap, &w.cfg, now, true).out.response;
    assert!(r.allowed, "{}", message(&r));
    w.cfg.pin = false;
    let r = review(&doc, &mut w.snap, &w.cfg, now, true).out.response;
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/not-seen-yet is not in card-quota's cache yet; try again"
    );
}

/// Issue 57 #7: AMD GPU nodes labelled by AMD's node labeller offer their model; a plain
/// `amd.com/gpu` pod is pinned to it on that label and bound there, within its quota.
#[test]
fn an_amd_pod_is_pinned_by_the_node_labellers_product_name_and_bound_on_it() {
    let mut w = World::with(
        r#"
apiVersion: v1
kind: Node
metadata: {name: mi300-1, labels: {amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM}}
status: {allocatable: {amd.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: amd, annotations: {volcano.sh/card.quota: '{"AMD_Instinct_MI300X_OAM":1}'}}
status: {state: Open}
"#,
    );
    let p = pod_res("a", "amd", None, "amd.com/gpu", "1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        pinned_by(&r, &p).0,
        json!({"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"})
    );
    let r = w.send(R::binding("ml", "a", "mi300-1").build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("amd", "AMD_Instinct_MI300X_OAM")["allocated"], 1);
    let r = w.send(R::pod("CREATE", pod_res("b", "amd", None, "amd.com/gpu", "1")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue amd has insufficient AMD_Instinct_MI300X_OAM quota"),
        "{}",
        message(&r)
    );
}

/// Issue 57 #5: every admitted card pod is pinned to a model that fits. A pod whose own
/// constraints allow only a model that is full was admitted unpinned on the other
/// model's room (and bound past the quota while the binding hook, `Ignore`, was down);
/// a pod whose models no node offers yet was admitted unpinned too. Both are refused
/// now, with the numbers of the model they could be placed on; warn still admits them.
#[test]
fn a_card_pod_no_model_can_be_pinned_for_is_refused_not_admitted_unpinned() {
    let mut w = World::new();
    for i in 0..2 {
        let r = w.send(
            R::pod(
                "CREATE",
                pod(&format!("rtx{i}"), "q", Some("RTX-4090"), "1"),
            )
            .build(),
        );
        assert!(r.allowed, "{}", message(&r));
    }
    // Only RTX nodes are in zone a; RTX is full, H200 has room.
    let mut p = pod("zone-a", "q", None, "1");
    p["spec"]["nodeSelector"] = json!({"zone": "a"});
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(!r.allowed, "admitted unpinned: {:?}", pinned_by(&r, &p));
    assert_eq!(
        message(&r),
        "queue q has insufficient RTX-4090 quota: requested 1, in use 2 (allocated 0, pending 2, reserved 0), quota 2"
    );
    // A model the quota names that no node offers yet.
    let mut w = World::with(&format!(
        "{CLUSTER}{}",
        r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: future, annotations: {volcano.sh/card.quota: '{"NVIDIA-B200":2}'}}
status: {state: Open}
"#
    ));
    let r = w.send(R::pod("CREATE", pod("b200", "future", None, "1")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "pod ml/b200 may use NVIDIA-B200 in queue future, but no node offers any of them yet: card-quota places a card pod only on a model a node offers"
    );
    // Warn observes: admitted, unpinned, with the warning.
    w.cfg.enforcement = card_quota::decide::Enforcement::Warn;
    let p = pod("b200-warn", "future", None, "1");
    let r = w.send(R::pod("CREATE", p.clone()).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(pinned_by(&r, &p).0, Value::Null);
    assert!(
        r.warnings.iter().any(|w| w.contains("no node offers")),
        "{:?}",
        r.warnings
    );
}

/// Issue 59 #3: a Volcano Job of two 1-card workers that accept H200 or RTX-4090, in a
/// queue with room for 1 of each: its pod set runs on one model, so it waits; with
/// `volcano.sh/card.split: "true"` it may split; with room for both on RTX-4090 it
/// reserves there and both pods are pinned there, though H200 comes first.
#[test]
fn a_jobs_pod_set_runs_on_one_model_unless_the_job_lets_it_split() {
    let world = |quota: &str| {
        let job = JOB_WORLD
            .replace(r#"'{"NVIDIA-H200":1}'"#, &format!("'{quota}'"))
            .replace(
                "volcano.sh/card.name: NVIDIA-H200}",
                "volcano.sh/card.name: NVIDIA-H200|RTX-4090}",
            );
        World::with(&format!("{CLUSTER}{job}"))
    };
    let created = |w: &mut World, split: Option<&str>| {
        let mut g = job_group();
        if let Some(s) = split {
            g["metadata"]["annotations"] = json!({"volcano.sh/card.split": s});
        }
        let r = w.send(R::podgroup("CREATE", g.clone()).build());
        assert!(r.allowed, "{}", message(&r));
        let mut stored = g;
        stored["metadata"]["annotations"]["volcano.sh/card.derived-request"] =
            json!(r#"{"NVIDIA-H200|RTX-4090":2}"#);
        stored
    };
    let mut w = world(r#"{"NVIDIA-H200":1,"RTX-4090":1}"#);
    let stored = created(&mut w, None);
    let r = enqueue(&mut w, &stored);
    assert!(!r.allowed, "split across models");
    assert_eq!(
        message(&r),
        "podgroup ml/train-job-uid waits: the pods of its Job that accept NVIDIA-H200|RTX-4090 (2 cards) run on one model, and none has room for all 2 in queue one (room now: NVIDIA-H200 1, RTX-4090 1); no one of them could ever hold it under the queue's quota; volcano.sh/card.split: \"true\" on the Job lets them split across models"
    );
    assert_eq!(w.usage("one", "NVIDIA-H200")["reserved"], 0);

    let mut w = world(r#"{"NVIDIA-H200":1,"RTX-4090":1}"#);
    let stored = created(&mut w, Some("true"));
    let r = enqueue(&mut w, &stored);
    assert!(r.allowed, "opted in: {}", message(&r));

    let mut w = world(r#"{"NVIDIA-H200":1,"RTX-4090":2}"#);
    let stored = created(&mut w, None);
    let r = enqueue(&mut w, &stored);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(
        patch(&r),
        json!([{"op": "add", "path": "/metadata/annotations/volcano.sh~1card.derived-request",
            "value": r#"{"RTX-4090":2}"#}]),
        "the group reserves on the one model chosen"
    );
    assert_eq!(w.usage("one", "RTX-4090")["reserved"], 2);
    for i in 0..2 {
        let mut p = pod(
            &format!("train-worker-{i}"),
            "one",
            Some("NVIDIA-H200|RTX-4090"),
            "1",
        );
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("train-job-uid");
        let r = w.send(R::pod("CREATE", p).build());
        assert!(r.allowed, "{}", message(&r));
        let pinned = patch(&r)
            .as_array()
            .unwrap()
            .iter()
            .find(|op| op["path"] == "/spec/nodeSelector")
            .map(|op| op["value"]["nvidia.com/gpu.product"].clone());
        assert_eq!(pinned, Some(json!("RTX-4090")), "worker {i}");
    }
    // A third pod of the set (past its reservation) is not put on H200 beside them.
    let mut p = pod("train-worker-2", "one", Some("NVIDIA-H200|RTX-4090"), "1");
    p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("train-job-uid");
    let r = w.send(R::pod("CREATE", p).build());
    assert!(!r.allowed, "pinned beside the set on another model");
    // Raising the running Job's workers adds pods the set's model must hold: refused,
    // though H200 has room for the third.
    let job = |workers: u32| {
        json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml", "uid": "job-uid"},
            "spec": {"queue": "one", "minAvailable": 3, "tasks": [
                {"name": "worker", "replicas": workers, "template": {
                    "metadata": {"annotations": {"volcano.sh/card.name": "NVIDIA-H200|RTX-4090"}},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}})
    };
    let r = w.send(R::job("UPDATE", job(3)).old(job(2)).build());
    assert!(!r.allowed, "a raise past the set's model");
    assert!(
        message(&r).contains("insufficient RTX-4090 quota"),
        "{}",
        message(&r)
    );
    assert_eq!(
        w.usage("one", "NVIDIA-H200"),
        json!({"quota": 1, "allocated": 0, "pending": 0, "reserved": 0})
    );
}

#[test]
fn a_malformed_split_annotation_is_refused_naming_it() {
    let mut w = World::with(&format!("{CLUSTER}{JOB_WORLD}"));
    let mut g = job_group();
    g["metadata"]["annotations"] = json!({"volcano.sh/card.split": "yes"});
    let r = w.send(R::podgroup("CREATE", g).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "invalid volcano.sh/card.split on podgroup ml/train-job-uid (copied from its Job): expected \"true\" or \"false\", got \"yes\""
    );
}

/// Strict order with pod sets held to one model: an older Job that waits for room it
/// could have (as one model) holds a younger one back, even when it does not fit split
/// either; an older Job whose set no single model could ever hold holds nobody back.
#[test]
fn strict_order_judges_a_held_job_as_its_one_model_enqueue_would() {
    let world = |old_request: &str, busy: bool| {
        let yaml = format!(
            r#"{CLUSTER}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: strict, annotations: {{volcano.sh/card.quota: '{{"NVIDIA-H200":2,"RTX-4090":2}}', volcano.sh/card.order: strict}}}}
status: {{state: Open}}
---
apiVersion: v1
kind: Pod
metadata: {{name: busy-h200, namespace: ml, annotations: {{scheduling.volcano.sh/queue-name: strict, volcano.sh/card.name: NVIDIA-H200}}}}
spec: {{schedulerName: volcano, nodeName: h200-1, containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: "2"}}}}}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: busy-rtx, namespace: ml, annotations: {{scheduling.volcano.sh/queue-name: strict, volcano.sh/card.name: RTX-4090}}}}
spec: {{schedulerName: volcano, nodeName: rtx-1, containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: "1"}}}}}}]}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {{name: old, namespace: ml, creationTimestamp: "2026-12-01T00:00:00Z", annotations: {{volcano.sh/card.derived-request: '{old_request}'}}}}
spec: {{queue: strict, minMember: 1}}
status: {{phase: Pending}}
"#
        );
        let yaml = if busy {
            yaml
        } else {
            yaml.replace("nodeName: h200-1", "nodeName: gone-1")
                .replace("nodeName: rtx-1", "nodeName: gone-2")
        };
        World::with(&yaml)
    };
    let young = || {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "young", "namespace": "ml", "creationTimestamp": "2026-12-02T00:00:00Z",
                "annotations": {"volcano.sh/card.derived-request": "{\"RTX-4090\":1}"}},
            "spec": {"queue": "strict", "minMember": 1}, "status": {"phase": "Pending"}})
    };
    // 1 RTX-4090 free. The old Job's 2 cards fit neither split nor on one model now, but
    // would on one model once room comes: the young Job waits behind it.
    let mut w = world(r#"{"NVIDIA-H200|RTX-4090":2}"#, true);
    assert!(w.send(R::podgroup("CREATE", young()).build()).allowed);
    let r = enqueue(&mut w, &young());
    assert!(!r.allowed, "the young Job went ahead of the old one");
    assert!(
        message(&r).contains("enqueues jobs in order"),
        "{}",
        message(&r)
    );
    // The old Job's 3 cards: no model's quota (2) ever holds them whole (split, they
    // would fit the empty queue now), so it waits for a quota change or the split opt-in
    // and holds nobody back.
    let mut w = world(r#"{"NVIDIA-H200|RTX-4090":3}"#, false);
    assert!(w.send(R::podgroup("CREATE", young()).build()).allowed);
    let r = enqueue(&mut w, &young());
    assert!(r.allowed, "{}", message(&r));
}
