//! What one watch event of each kind card-quota watches costs under the snapshot lock,
//! as the cluster grows (issue 57: "one object's event costs at most O(its own size)
//! under the lock"). Each event is read outside the lock as the watchers read it
//! (`cluster::records`), then stored the way `live::caches` stores it, and only the
//! store is timed: that is what every decision waits behind.
//!
//! The cluster at size N: N bound card pods of one GPU (in 100 queues, 100 namespaces,
//! PodGroups of 4), on N/8 nodes of 8 GPUs of two models. Every event touches a fixed
//! number of objects of its own (a node with 8 pods on it, a PodGroup of 4 pods, a
//! Namespace with 8 pods that take their queue from it), so its cost should not grow
//! with N. The table gives the median and the slowest of REPS events at each size and
//! the median's growth from the smallest size to the largest; a growth over 8x (for a
//! 100x larger cluster) is flagged, and the bench exits non-zero.
//! The ledger ConfigMap is one with no entries (a ledger's event costs O(its entries),
//! which its own bounds cap: 5,000 entries, 900 KiB). DRA kinds have their own bench
//! (`cargo bench --bench dra_events`).
//!
//! `cargo bench --bench watch_events` (`WATCH_BENCH_SIZES=1000,10000,100000`,
//! `WATCH_BENCH_REPS=200` change it).

use std::time::{Duration, Instant};

use card_quota::cards::{CardResources, ObjectKey, QueueName};
use card_quota::cluster::records::{
    job_record, namespace_record, node_record, pod_record, podgroup_record, queue_record,
    workload_record, WorkloadKind,
};
use card_quota::ledger::entries::Ledger;
use card_quota::ledger::ledger_record;
use card_quota::snapshot::load::upsert;
use card_quota::snapshot::Snapshot;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use serde_json::{json, Value};

const QUEUES: usize = 100;
const NAMESPACES: usize = 100;
const GPUS: usize = 8;
const GROUP: usize = 4;
/// Pods in the namespace whose queue annotation flips.
const NS_PODS: usize = 8;
/// Growth of an event's median cost, smallest size to largest, that is flagged.
const MAX_GROWTH: f64 = 8.0;

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

fn model(node: usize) -> &'static str {
    if node.is_multiple_of(2) {
        "NVIDIA-H200"
    } else {
        "NVIDIA-A100"
    }
}

fn node(i: usize, model: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i}"), "labels": {"nvidia.com/gpu.product": model}},
        "status": {"allocatable": {"nvidia.com/gpu": GPUS.to_string(), "cpu": "64"}}})
}

fn queue(i: usize, quota: u64, parent: Option<&str>) -> Value {
    let mut v = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": format!("q{i}"), "resourceVersion": "1",
            "annotations": {"volcano.sh/card.quota":
                json!({"NVIDIA-H200": quota, "NVIDIA-A100": quota}).to_string()}},
        "spec": {"weight": 1}, "status": {"state": "Open"}});
    if let Some(p) = parent {
        v["spec"]["parent"] = json!(p);
    }
    v
}

fn group(i: usize, queue: usize, phase: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": format!("g{i}"), "namespace": format!("ns{}", (i * GROUP) % NAMESPACES),
            "uid": format!("uid-g{i}")},
        "spec": {"queue": format!("q{queue}"), "minMember": GROUP}, "status": {"phase": phase}})
}

/// Pod `i`: bound to its node (`bound`), in PodGroup `i / GROUP` (`grouped`), stamped
/// with its queue unless it takes it from its namespace.
fn pod(
    name: &str,
    ns: &str,
    queue: Option<usize>,
    group: Option<usize>,
    node: Option<usize>,
) -> Value {
    let mut ann = serde_json::Map::new();
    if let Some(q) = queue {
        ann.insert("volcano.sh/card.queue".into(), json!(format!("q{q}")));
    }
    if let Some(g) = group {
        ann.insert(
            "scheduling.k8s.io/group-name".into(),
            json!(format!("g{g}")),
        );
    }
    let mut v = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
            "resourceVersion": "1", "annotations": ann},
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}});
    if let Some(n) = node {
        v["spec"]["nodeName"] = json!(format!("node-{n}"));
        v["status"]["phase"] = json!("Running");
    }
    v
}

fn volcano_job(replicas: usize) -> Value {
    let task = |name: &str| {
        json!({"name": name, "replicas": replicas, "template": {"spec": {"containers": [{"name": "c",
        "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}})
    };
    json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ns0", "uid": "uid-job"},
        "spec": {"queue": "q0", "minAvailable": replicas, "tasks": [task("master"), task("worker")]}})
}

fn deployment(replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": "ns0", "uid": "uid-deploy",
            "annotations": {"volcano.sh/card.queue": "q0"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "serve"}},
            "template": {"metadata": {"labels": {"app": "serve"}}, "spec": {"containers": [{"name": "c",
                "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
}

fn world(n: usize) -> Snapshot {
    let mut s = Snapshot::default();
    let mut add = |v: Value| {
        upsert(&mut s, &v).expect("object");
    };
    let nodes = n.div_ceil(GPUS) + 2;
    for i in 0..nodes {
        add(node(i, model(i)));
    }
    for q in 0..QUEUES {
        add(queue(q, n as u64, None));
    }
    for g in 0..n / GROUP {
        add(group(g, g % QUEUES, "Running"));
    }
    for i in 0..n {
        let g = i / GROUP;
        let ns = format!("ns{}", (g * GROUP) % NAMESPACES);
        add(pod(
            &format!("p{i}"),
            &ns,
            Some(g % QUEUES),
            Some(g),
            Some(i / GPUS),
        ));
    }
    // The namespace whose annotation flips, with pods that take their queue from it.
    add(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "solo",
        "annotations": {"scheduling.volcano.sh/queue-name": "q1"}}}),
    );
    for i in 0..NS_PODS {
        add(pod(
            &format!("solo-{i}"),
            "solo",
            None,
            None,
            Some(nodes - 1),
        ));
    }
    s
}

/// One event's store, prepared outside the lock.
type Store = Box<dyn FnOnce(&mut Snapshot)>;

fn store_of(v: &Value) -> Store {
    let cards = CardResources::defaults().clone();
    match v["kind"].as_str().unwrap_or("") {
        "Pod" => {
            let p: Pod = serde_json::from_value(v.clone()).expect("pod");
            let mut rec = pod_record(&p, "", &cards, 0).expect("pod record");
            Box::new(move |s: &mut Snapshot| {
                rec.reclassify(|r| s.is_card_resource(r));
                rec.seq = s.next_seq();
                s.upsert_pod(rec);
            })
        }
        "Node" => {
            let n: Node = serde_json::from_value(v.clone()).expect("node");
            let (name, cards) = node_record(&n).expect("node record");
            Box::new(move |s: &mut Snapshot| s.upsert_node(name, cards))
        }
        "Queue" => {
            let rec = queue_record(v).expect("queue record");
            Box::new(move |s: &mut Snapshot| s.upsert_queue(rec))
        }
        "PodGroup" => {
            let rec = podgroup_record(v, "", 0).expect("podgroup record");
            Box::new(move |s: &mut Snapshot| s.upsert_group(rec))
        }
        "ConfigMap" => {
            let cm: ConfigMap = serde_json::from_value(v.clone()).expect("configmap");
            let rec = ledger_record(&cm).expect("ledger record");
            Box::new(move |s: &mut Snapshot| s.upsert_ledger(rec))
        }
        "Job" => {
            let mut rec = job_record(v, "", &cards, 0).expect("job record");
            Box::new(move |s: &mut Snapshot| {
                for (_, _, t) in &mut rec.tasks {
                    t.reclassify(|r| s.is_card_resource(r));
                }
                s.upsert_job(rec);
            })
        }
        "Deployment" => {
            let mut rec = workload_record(WorkloadKind::Deployment, v, "", &cards, 0)
                .expect("workload record");
            Box::new(move |s: &mut Snapshot| {
                rec.template.reclassify(|r| s.is_card_resource(r));
                rec.template.seq = s.next_seq();
                s.upsert_workload(rec);
            })
        }
        "Namespace" => {
            let ns: Namespace = serde_json::from_value(v.clone()).expect("namespace");
            let (name, queue) = namespace_record(&ns.metadata).expect("namespace record");
            Box::new(move |s: &mut Snapshot| s.set_namespace_queue(&name, queue))
        }
        k => panic!("no store for {k}"),
    }
}

/// An event: what it is called, and the object of its `i`-th repetition (or a delete).
enum Ev {
    Apply(Value),
    DeletePod(ObjectKey),
    DeleteNode(String),
}

struct Case {
    name: &'static str,
    event: fn(usize, usize) -> Ev,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "Pod created (pending)",
            event: |i, _| Ev::Apply(pod(&format!("new-{i}"), "ns0", Some(0), None, None)),
        },
        Case {
            name: "Pod bound (the same pods)",
            event: |i, _| Ev::Apply(pod(&format!("new-{i}"), "ns0", Some(0), None, Some(i % 64))),
        },
        Case {
            name: "Pod deleted (the same pods)",
            event: |i, _| Ev::DeletePod(ObjectKey::new("ns0", format!("new-{i}"))),
        },
        Case {
            name: "PodGroup phase changed (4 pods)",
            event: |i, _| {
                Ev::Apply(group(
                    0,
                    0,
                    if i.is_multiple_of(2) {
                        "Inqueue"
                    } else {
                        "Running"
                    },
                ))
            },
        },
        Case {
            name: "PodGroup moved to another queue (4 pods)",
            event: |i, _| Ev::Apply(group(0, i % 2, "Running")),
        },
        Case {
            name: "PodGroup created (no pods)",
            event: |i, _| Ev::Apply(group(1_000_000 + i, 3, "Pending")),
        },
        Case {
            name: "Queue quota changed",
            event: |i, n| Ev::Apply(queue(0, (n + i % 2) as u64, None)),
        },
        Case {
            name: "Queue moved under another queue",
            event: |i, n| Ev::Apply(queue(2, n as u64, i.is_multiple_of(2).then_some("q3"))),
        },
        Case {
            name: "Node relabelled to another model (8 pods)",
            event: |i, _| Ev::Apply(node(0, model(i + 1))),
        },
        Case {
            name: "Node joins (no pods)",
            event: |i, _| Ev::Apply(node(10_000_000 + i, "NVIDIA-H200")),
        },
        Case {
            name: "Node leaves (the same nodes)",
            event: |i, _| Ev::DeleteNode(format!("node-{}", 10_000_000 + i)),
        },
        Case {
            name: "ledger ConfigMap written (its queue's)",
            event: |i, _| {
                Ev::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "card-quota-ledger-q0", "namespace": "card-quota",
                        "resourceVersion": (100 + i).to_string(),
                        "labels": {"app.kubernetes.io/name": "card-quota", "app.kubernetes.io/component": "ledger"}},
                    "data": {"queue": "q0", "ledger": Ledger::default().render()}}))
            },
        },
        Case {
            name: "Volcano Job changed (2 tasks)",
            event: |i, _| Ev::Apply(volcano_job(1 + i % 2)),
        },
        Case {
            name: "Deployment scaled",
            event: |i, _| Ev::Apply(deployment(1 + (i % 2) as u32)),
        },
        Case {
            name: "Namespace queue annotation changed (8 pods)",
            event: |i, _| {
                Ev::Apply(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "solo",
                    "annotations": {"scheduling.volcano.sh/queue-name": format!("q{}", 1 + i % 2)}}}),
                )
            },
        },
    ]
}

fn time(s: &mut Snapshot, ev: Ev) -> Duration {
    match ev {
        Ev::Apply(v) => {
            let store = store_of(&v);
            let t = Instant::now();
            store(s);
            t.elapsed()
        }
        Ev::DeletePod(k) => {
            let t = Instant::now();
            s.delete_pod(&k);
            t.elapsed()
        }
        Ev::DeleteNode(n) => {
            let t = Instant::now();
            s.remove_node(&n);
            t.elapsed()
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let sizes = env_list("WATCH_BENCH_SIZES", &[1_000, 10_000, 100_000]);
    let reps = env_list("WATCH_BENCH_REPS", &[200])[0].max(1);
    let cases = cases();
    // medians[case][size]
    let mut medians = vec![Vec::new(); cases.len()];
    let mut slowest = vec![Vec::new(); cases.len()];
    for &n in &sizes {
        let t = Instant::now();
        let mut s = world(n);
        eprintln!(
            "size {n}: world built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        // A tree for the queue move: q3 holds cards too.
        assert!(s.queue(&QueueName::new("q3")).is_some());
        for (c, case) in cases.iter().enumerate() {
            let mut took: Vec<Duration> = (0..reps)
                .map(|i| time(&mut s, (case.event)(i, n)))
                .collect();
            took.sort();
            medians[c].push(took[took.len() / 2]);
            slowest[c].push(took[took.len() - 1]);
        }
    }
    let header: Vec<String> = sizes.iter().map(|n| format!("{n} pods")).collect();
    println!(
        "{:<46} {}  growth",
        "event (median / slowest, µs under the lock)",
        header
            .iter()
            .map(|h| format!("{h:>20}"))
            .collect::<String>()
    );
    let mut flagged = Vec::new();
    for (c, case) in cases.iter().enumerate() {
        let cells: String = medians[c]
            .iter()
            .zip(&slowest[c])
            .map(|(m, s)| format!("{:>20}", format!("{:.1} / {:.1}", us(*m), us(*s))))
            .collect();
        let first = us(medians[c][0]).max(0.1);
        let growth = us(medians[c][medians[c].len() - 1]) / first;
        let flag = if growth > MAX_GROWTH {
            "  <- grows with the cluster"
        } else {
            ""
        };
        if !flag.is_empty() {
            flagged.push(case.name);
        }
        println!("{:<46} {cells}  {growth:.1}x{flag}", case.name);
    }
    if !flagged.is_empty() {
        eprintln!(
            "events whose cost grows with the cluster: {}",
            flagged.join(", ")
        );
        std::process::exit(1);
    }
}
