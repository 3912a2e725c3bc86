//! The usage the snapshot keeps up to date as Nodes, Namespaces, PodGroups and pods
//! change one event at a time (a node's own pods counted again when its cards change, a
//! namespace's own pods filed again when its queue annotation changes: the indexes that
//! keep one event's work to the object's own size) equals the usage of a snapshot loaded
//! from scratch with the objects as they end up. DRA kinds: `tests/dra.rs`, `incremental`.

use std::collections::BTreeMap;

use card_quota::cards::QueueName;
use card_quota::snapshot::load::{load, remove, upsert};
use card_quota::snapshot::Snapshot;
use proptest::prelude::*;
use serde_json::{json, Value};

const QUEUES: [&str; 3] = ["q0", "q1", "q2"];
const MODELS: [&str; 2] = ["NVIDIA-H200", "NVIDIA-A100"];
const NAMESPACES: [&str; 2] = ["ml", "team"];

const BASE: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q0, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4,"NVIDIA-A100":4}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q1, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4,"NVIDIA-A100":4}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q2, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4,"NVIDIA-A100":4}'}}}
"#;

#[derive(Debug, Clone)]
enum Ev {
    /// Node `node` offers `model` (`None`: it has no product label; its GPUs are cards
    /// of no model).
    Node {
        node: usize,
        model: Option<usize>,
    },
    DeleteNode {
        node: usize,
    },
    /// A Namespace naming queue `queue` (`None`: naming none).
    Namespace {
        ns: usize,
        queue: Option<usize>,
    },
    /// PodGroup `group` (namespace `ml`) moves to queue `queue`. (PodGroups are never
    /// deleted here: a pod naming a PodGroup that is gone keeps the queue it was counted
    /// in, on purpose, which a snapshot loaded from scratch cannot know.)
    Group {
        group: usize,
        queue: usize,
    },
    /// Pod `pod` of namespace `ns`: stamped with `queue`, or naming `group`, or neither
    /// (its queue is its namespace's); bound to `node` or pending.
    Pod {
        pod: usize,
        ns: usize,
        queue: Option<usize>,
        group: Option<usize>,
        node: Option<usize>,
    },
    DeletePod {
        pod: usize,
        ns: usize,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0..3usize, prop::option::of(0..2usize)).prop_map(|(node, model)| Ev::Node { node, model }),
        (0..3usize).prop_map(|node| Ev::DeleteNode { node }),
        (0..2usize, prop::option::of(0..3usize))
            .prop_map(|(ns, queue)| Ev::Namespace { ns, queue }),
        (0..2usize, 0..3usize).prop_map(|(group, queue)| Ev::Group { group, queue }),
        (
            0..5usize,
            0..2usize,
            prop::option::of(0..3usize),
            prop::option::of(0..2usize),
            prop::option::of(0..3usize)
        )
            .prop_map(|(pod, ns, queue, group, node)| Ev::Pod {
                pod,
                ns,
                queue,
                group,
                node
            }),
        (0..5usize, 0..2usize).prop_map(|(pod, ns)| Ev::DeletePod { pod, ns }),
    ]
}

/// (kind, namespace, name) -> the object.
type World = BTreeMap<(&'static str, String, String), Value>;

fn object(e: &Ev) -> (&'static str, String, String, Option<Value>) {
    match e {
        Ev::Node { node, model } => {
            let mut labels = serde_json::Map::new();
            if let Some(m) = model {
                labels.insert("nvidia.com/gpu.product".into(), json!(MODELS[*m]));
            }
            let v = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": format!("n{node}"), "labels": labels},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}}});
            ("Node", String::new(), format!("n{node}"), Some(v))
        }
        Ev::DeleteNode { node } => ("Node", String::new(), format!("n{node}"), None),
        Ev::Namespace { ns, queue } => {
            let mut ann = serde_json::Map::new();
            if let Some(q) = queue {
                ann.insert("scheduling.volcano.sh/queue-name".into(), json!(QUEUES[*q]));
            }
            let v = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NAMESPACES[*ns], "annotations": ann}});
            (
                "Namespace",
                String::new(),
                NAMESPACES[*ns].to_string(),
                Some(v),
            )
        }
        Ev::Group { group, queue } => {
            let v = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": format!("g{group}"), "namespace": "ml", "uid": format!("uid-g{group}")},
                "spec": {"queue": QUEUES[*queue], "minMember": 1}, "status": {"phase": "Running"}});
            ("PodGroup", "ml".into(), format!("g{group}"), Some(v))
        }
        Ev::Pod {
            pod,
            ns,
            queue,
            group,
            node,
        } => {
            let ns = NAMESPACES[*ns];
            let mut ann = serde_json::Map::new();
            if let Some(q) = queue {
                ann.insert("volcano.sh/card.queue".into(), json!(QUEUES[*q]));
            }
            // PodGroups live in `ml`: a pod of another namespace names none.
            if let Some(g) = group.filter(|_| ns == "ml") {
                ann.insert(
                    "scheduling.k8s.io/group-name".into(),
                    json!(format!("g{g}")),
                );
            }
            let mut v = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{pod}"), "namespace": ns, "uid": format!("uid-{ns}-p{pod}"),
                    "annotations": ann},
                "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Pending"}});
            if let Some(n) = node {
                v["spec"]["nodeName"] = json!(format!("n{n}"));
                v["status"]["phase"] = json!("Running");
            }
            ("Pod", ns.to_string(), format!("p{pod}"), Some(v))
        }
        Ev::DeletePod { pod, ns } => ("Pod", NAMESPACES[*ns].to_string(), format!("p{pod}"), None),
    }
}

/// The objects in the order a fresh start lists them.
fn fresh(world: &World) -> Snapshot {
    let (mut s, _) = load(BASE).expect("base");
    for kind in ["Node", "Namespace", "PodGroup", "Pod"] {
        for (_, v) in world.iter().filter(|((k, _, _), _)| *k == kind) {
            upsert(&mut s, v).expect("object");
        }
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("CARD_QUOTA_MODEL_CASES").ok().and_then(|c| c.parse::<u32>().ok()).map_or(256, |c| c.min(3_000))
    ))]
    #[test]
    fn usage_kept_up_to_date_equals_usage_counted_from_scratch(
        events in proptest::collection::vec(ev(), 1..40),
    ) {
        let (mut s, _) = load(BASE).expect("base");
        let mut world = World::new();
        for group in 0..2 {
            let (kind, ns, name, v) = object(&Ev::Group { group, queue: group });
            let v = v.expect("a PodGroup");
            upsert(&mut s, &v).expect("PodGroup");
            world.insert((kind, ns, name), v);
        }
        let now = jiff::Timestamp::now();
        for e in &events {
            let (kind, ns, name, obj) = object(e);
            match obj {
                Some(v) => {
                    upsert(&mut s, &v).expect("object");
                    world.insert((kind, ns, name), v);
                }
                None => {
                    remove(&mut s, kind, &ns, &name);
                    world.remove(&(kind, ns, name));
                }
            }
            let f = fresh(&world);
            for q in QUEUES {
                let q = QueueName::new(q);
                prop_assert_eq!(s.usage(&q, now), f.usage(&q, now), "queue {} after {:?}", q, e);
            }
        }
    }
}
