//! What pods waiting for room (`volcano.sh/card.full: wait`) cost under the snapshot
//! lock: the releaser's plan of one pass (the leader, every second) and a new pod's
//! CREATE in a queue with WAITING pods waiting behind the gate, BOUND pods bound (the
//! queue full) and the same WAITING pods spread over DEMANDS distinct demands (models and
//! cards). The plan checks one fit per distinct demand without room, not per pod; the
//! CREATE walks the queue's pods once (best-effort order: does a waiting pod fit first?).
//!
//! `cargo bench --bench waiting` (prints a table; `WAIT_BENCH_PODS`, `WAIT_BENCH_DEMANDS`
//! change the size).

use std::time::Instant;

use card_quota::admission::review;
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::snapshot::load::upsert;
use card_quota::snapshot::Snapshot;
use serde_json::{json, Value};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(name: &str, cards: usize, card: &str, node: Option<&str>, gated: bool) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
            "creationTimestamp": "2026-12-02T10:00:00Z",
            "annotations": {"scheduling.volcano.sh/queue-name": "wq", "volcano.sh/card.queue": "wq", "volcano.sh/card.name": card}},
        "spec": {"containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    if gated {
        p["spec"]["schedulingGates"] = json!([{"name": "volcano.sh/card-quota"}]);
    }
    p
}

fn world(waiting: usize, demands: usize, bound: usize) -> Snapshot {
    let mut s = Snapshot::default();
    let mut add = |v: Value| upsert(&mut s, &v).expect("object");
    for (n, model) in [("h200", "NVIDIA-H200"), ("a100", "NVIDIA-A100")] {
        add(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n, "labels": {"nvidia.com/gpu.product": model}},
            "status": {"allocatable": {"nvidia.com/gpu": "100000"}}}));
    }
    add(
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "wq", "annotations": {
            "volcano.sh/card.quota": format!("{{\"NVIDIA-H200\":{bound},\"NVIDIA-A100\":0}}"),
            "volcano.sh/card.full": "wait"}},
        "status": {"state": "Open"}}),
    );
    for i in 0..bound {
        add(pod(&format!("b{i}"), 1, "NVIDIA-H200", Some("h200"), false));
    }
    let cards = ["NVIDIA-H200", "NVIDIA-H200|NVIDIA-A100"];
    for i in 0..waiting {
        let d = i % demands.max(1);
        add(pod(&format!("w{i}"), 1 + d / 2, cards[d % 2], None, true));
    }
    s
}

fn main() {
    let waiting = env("WAIT_BENCH_PODS", 5_000);
    let demands = env("WAIT_BENCH_DEMANDS", 4);
    let bound = 1_000;
    let mut snap = world(waiting, demands, bound);
    let now = jiff::Timestamp::now();
    let t = Instant::now();
    let rounds = 20;
    let mut plan = card_quota::decide::wait::plan(&snap, now);
    for _ in 1..rounds {
        plan = card_quota::decide::wait::plan(&snap, now);
    }
    let plan_ms = t.elapsed().as_secs_f64() * 1e3 / rounds as f64;
    assert!(
        plan.releases.is_empty() && plan.waiting.len() == waiting,
        "{} releases, {} waiting: {:?}",
        plan.releases.len(),
        plan.waiting.len(),
        plan.waiting.first()
    );
    let cfg = Config::default();
    let t = Instant::now();
    let creates = 200;
    for i in 0..creates {
        let doc = R::pod(
            "CREATE",
            pod(&format!("new{i}"), 1, "NVIDIA-H200", None, false),
        )
        .build();
        let r = review(&doc, &mut snap, &cfg, now, true);
        assert!(r.out.response.allowed);
    }
    let create_ms = t.elapsed().as_secs_f64() * 1e3 / creates as f64;
    println!("waiting pods: {waiting} over {demands} demands, {bound} bound (queue full)");
    println!("{:<48} {:>10}", "what", "ms");
    println!(
        "{:<48} {:>10.3}",
        "release plan, one pass (no room)", plan_ms
    );
    println!(
        "{:<48} {:>10.3}",
        "a new pod's CREATE (it waits too)", create_ms
    );
}
