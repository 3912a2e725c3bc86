//! Parsers and decisions survive arbitrary input: annotation values, quantities, ledger
//! text and AdmissionReview bodies (bytes, arbitrary JSON, and real reviews with
//! arbitrary values spliced into the fields card-quota reads). Every one is answered:
//! no panic, no abort, and a refusal carries a message.

use card_quota::admission::review;
use card_quota::cards::annotations::{parse_card_name, parse_quota, parse_request};
use card_quota::cards::quantity::parse_whole;
use card_quota::cards::QueueName;
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::ledger::Ledger;
use card_quota::snapshot::load::load;
use card_quota::snapshot::Snapshot;
use proptest::prelude::*;
use serde_json::{json, Value};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n, labels: {nvidia.com/gpu.product: A}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"A":3}'}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: A}}
spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: A}}
    spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;

fn snapshot() -> Snapshot {
    load(CLUSTER).unwrap().0
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("A"),
            Just("A|B"),
            Just("q"),
            Just("1"),
            Just("18446744073709551616"),
            Just("-1"),
            Just("1e400")
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("metadata".to_string()),
                    Just("annotations".to_string()),
                    Just("spec".to_string()),
                    Just("name".to_string()),
                    Just("volcano.sh/card.name".to_string()),
                    Just("nvidia.com/gpu".to_string()),
                    ".{0,6}".prop_map(String::from),
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn quantity_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[-+]?[0-9]{0,25}(\\.[0-9]{0,5})?([eE][-+]?[0-9]{1,4}|[numkMGTPE]|[KMGTPE]i)?",
        ".{0,12}",
        Just("1e400".to_string()),
        Just("18446744073709551616".to_string()),
        Just("16Ei".to_string()),
    ]
}

/// JSON pointers into a review where card-quota reads something.
const FIELDS: &[&str] = &[
    "/request/uid",
    "/request/operation",
    "/request/resource/resource",
    "/request/subResource",
    "/request/name",
    "/request/namespace",
    "/request/object",
    "/request/object/metadata",
    "/request/object/metadata/name",
    "/request/object/metadata/annotations",
    "/request/object/metadata/labels",
    "/request/object/metadata/ownerReferences",
    "/request/object/metadata/deletionTimestamp",
    "/request/object/spec",
    "/request/object/spec/containers",
    "/request/object/spec/nodeName",
    "/request/object/spec/queue",
    "/request/object/spec/replicas",
    "/request/object/spec/affinity",
    "/request/object/spec/nodeSelector",
    "/request/object/target",
    "/request/object/target/name",
    "/request/oldObject",
    "/request/dryRun",
];

fn bases() -> Vec<Value> {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "x", "namespace": "ml", "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "A"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let pg = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ml", "annotations": {"volcano.sh/card.request": "{\"A\":1}"}},
        "spec": {"queue": "q"}});
    let queue = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q", "annotations": {"volcano.sh/card.quota": "{\"A\":3}"}}});
    vec![
        R::pod("CREATE", pod.clone()).build(),
        R::pod("UPDATE", pod.clone()).old(pod).build(),
        R::binding("ml", "p", "n").build(),
        R::podgroup("CREATE", pg.clone()).build(),
        R::podgroup("UPDATE", pg.clone()).old(pg).build(),
        R::queue("UPDATE", queue.clone()).old(queue).build(),
        R::scale("deployments", "ml", "web", 1, 5).build(),
        R::workload(
            "UPDATE",
            "deployments",
            "Deployment",
            json!({"metadata": {"name": "web", "namespace": "ml"}, "spec": {"replicas": 9}}),
        )
        .build(),
    ]
}

/// Sets `value` at `pointer`, creating objects on the way.
fn splice(doc: &mut Value, pointer: &str, value: Value) {
    let mut cur = doc;
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    for (i, p) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Some(obj) = cur.as_object_mut() else {
            return;
        };
        if i + 1 == parts.len() {
            obj.insert(p.to_string(), value);
            return;
        }
        cur = obj.entry(p.to_string()).or_insert(json!({}));
    }
}

fn answered(doc: &Value, snap: &mut Snapshot) -> Result<(), TestCaseError> {
    for with_patch in [true, false] {
        let r = review(
            doc,
            snap,
            &Config::default(),
            jiff::Timestamp::now(),
            with_patch,
        );
        let resp = r.out.response;
        if !resp.allowed {
            let msg = resp.status.map(|s| s.message).unwrap_or_default();
            prop_assert!(!msg.is_empty(), "a refusal without a message for {doc}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn annotation_parsers_take_any_text(raw in ".{0,60}", json in json_value()) {
        let text = json.to_string();
        let inner = json.as_str().unwrap_or_default().to_string();
        for s in [raw.as_str(), text.as_str(), inner.as_str()] {
            let _ = parse_quota("queue q", s);
            let _ = parse_request("podgroup ml/g", s);
            let _ = parse_card_name("pod ml/p", s);
            let _ = parse_whole(s);
            let _ = Ledger::parse(&QueueName::new("q"), s);
        }
    }

    #[test]
    fn arbitrary_bytes_and_json_bodies_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..200), v in json_value()) {
        let mut snap = snapshot();
        if let Ok(doc) = serde_json::from_slice::<Value>(&bytes) {
            answered(&doc, &mut snap)?;
        }
        answered(&v, &mut snap)?;
        answered(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v}), &mut snap)?;
    }

    #[test]
    fn containers_with_arbitrary_quantities_are_answered(
        base in 0usize..3,
        quantities in proptest::collection::vec((0usize..4, quantity_text()), 1..4),
        init in any::<bool>(),
    ) {
        let mut snap = snapshot();
        let mut doc = bases()[base].clone();
        let names = ["nvidia.com/gpu", "nvidia.com/mig-1g.18gb", "example.com/npu", "rdma/hca"];
        let limits: serde_json::Map<String, Value> = quantities
            .iter()
            .map(|(r, q)| (names[*r].to_string(), json!(q)))
            .collect();
        let container = json!([{"name": "c", "image": "x", "resources": {"limits": limits.clone(), "requests": limits}}]);
        let path = if init { "/request/object/spec/initContainers" } else { "/request/object/spec/containers" };
        if base == 2 {
            // A binding: the stored pod carries the quantities.
            let mut snap = snap;
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ml", "annotations": {"scheduling.volcano.sh/queue-name": "q"}},
                "spec": {"containers": container}});
            let _ = card_quota::snapshot::load::upsert(&mut snap, &pod);
            answered(&doc, &mut snap)?;
        } else {
            splice(&mut doc, path, container);
            answered(&doc, &mut snap)?;
        }
    }

    #[test]
    fn real_reviews_with_arbitrary_fields_are_answered(
        base in 0usize..8,
        edits in proptest::collection::vec((0..FIELDS.len(), json_value()), 1..4),
    ) {
        let mut snap = snapshot();
        let mut doc = bases()[base].clone();
        for (f, v) in edits {
            splice(&mut doc, FIELDS[f], v);
        }
        answered(&doc, &mut snap)?;
    }
}
