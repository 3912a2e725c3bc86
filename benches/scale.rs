//! Worst input per hook as a PodGroup or a queue grows (issue 46): each decision the
//! webhook makes under the snapshot lock, at 1,000, 10,000 and 100,000 pods in the
//! PodGroup or queue it touches, with the time it takes and the memory it adds.
//! Targets: no hook above 100 ms or 256 MiB at 10,000 pods.
//!
//! `cargo bench --bench scale` (prints a table; exits non-zero when a target is missed;
//! `SCALE_MAX=10000` stops before 100,000). Memory is the process's peak resident set
//! during the decision above what it held before (Linux: `VmHWM`, reset through
//! `/proc/self/clear_refs`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use card_quota::decide::review::{read_review, AdmissionRequest, ReviewBuilder as R};
use card_quota::decide::{decide, Config};
use card_quota::snapshot::load::upsert;
use card_quota::snapshot::Snapshot;

#[path = "support/proc_status.rs"]
mod proc_status;

const MODEL: &str = "NVIDIA-H200";
const NODES: usize = 100;

fn queue(name: &str, quota: usize, order: Option<&str>) -> Value {
    let mut anns = json!({"volcano.sh/card.quota": json!({MODEL: quota}).to_string()});
    if let Some(o) = order {
        anns["volcano.sh/card.order"] = json!(o);
    }
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name, "annotations": anns}, "status": {"state": "Open"}})
}

fn group(name: &str, queue: &str, request: Option<usize>, phase: &str) -> Value {
    let mut g = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"), "resourceVersion": "5",
            "creationTimestamp": "2026-11-26T08:00:00Z"},
        "spec": {"queue": queue, "minMember": 1}, "status": {"phase": phase}});
    if let Some(n) = request {
        g["metadata"]["annotations"] =
            json!({"volcano.sh/card.request": json!({MODEL: n}).to_string()});
    }
    g
}

/// A pod of 1 card: of `group` (its queue is the group's) or of `queue`; bound when
/// `bound`.
fn pod(name: &str, group: Option<&str>, queue: Option<&str>, bound: Option<usize>) -> Value {
    let mut anns = json!({"volcano.sh/card.name": MODEL});
    if let Some(g) = group {
        anns["scheduling.k8s.io/group-name"] = json!(g);
    }
    if let Some(q) = queue {
        anns["scheduling.volcano.sh/queue-name"] = json!(q);
    }
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"), "annotations": anns},
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}});
    if let Some(n) = bound {
        p["spec"]["nodeName"] = json!(format!("n{}", n % NODES));
        p["metadata"]["annotations"]["volcano.sh/card.charged"] = json!(MODEL);
        p["status"]["phase"] = json!("Running");
    }
    p
}

/// Queues `src` (room for everything), `full` (room for half of `n`), `room` (room
/// for twice `n`) and `strict` (strict order, `n / 100` waiting groups that each fit
/// now); PodGroup `big` in `src` with `n` bound pods; `n` unstamped pending pods of a
/// PodGroup `late` not created yet; `n` pending pods in `room`.
fn world(n: usize) -> Snapshot {
    let mut s = Snapshot::new();
    for i in 0..NODES {
        upsert(
            &mut s,
            &json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("n{i}"), "labels": {"nvidia.com/gpu.product": MODEL}},
            "status": {"allocatable": {"nvidia.com/gpu": (4 * n / NODES + 8).to_string()}}}),
        )
        .expect("node");
    }
    for q in [
        queue("src", 4 * n, None),
        queue("full", n / 2, None),
        queue("room", 2 * n, None),
        queue("strict", n / 100 + 2, Some("strict")),
    ] {
        upsert(&mut s, &q).expect("queue");
    }
    upsert(&mut s, &group("big", "src", None, "Running")).expect("group");
    for i in 0..n {
        upsert(
            &mut s,
            &pod(&format!("big-{i}"), Some("big"), None, Some(i)),
        )
        .expect("pod");
        upsert(&mut s, &pod(&format!("late-{i}"), Some("late"), None, None)).expect("pod");
        upsert(&mut s, &pod(&format!("room-{i}"), None, Some("room"), None)).expect("pod");
    }
    // The strict queue's waiting groups all fit: an enqueue checks each of them (none
    // holds it up) before its own.
    upsert(&mut s, &group("holder", "strict", Some(1), "Inqueue")).expect("group");
    for g in 0..n / 100 {
        let mut w = group(&format!("w{g:06}"), "strict", Some(1), "Pending");
        w["metadata"]["creationTimestamp"] = json!("2026-11-26T08:00:01Z");
        upsert(&mut s, &w).expect("group");
    }
    s
}

fn request(doc: &Value) -> AdmissionRequest {
    read_review(&serde_json::to_vec(doc).expect("JSON"))
        .expect("a review")
        .expect("a valid review")
}

fn cases() -> Vec<(&'static str, Value)> {
    let moved = |to: &str| {
        let old = group("big", "src", None, "Running");
        let mut new = old.clone();
        new["spec"]["queue"] = json!(to);
        R::podgroup("UPDATE", new).old(old).build()
    };
    let mut last = group("zz-last", "strict", Some(1), "Pending");
    last["metadata"]["creationTimestamp"] = json!("2026-11-26T09:00:00Z");
    let mut enq = last.clone();
    enq["status"]["phase"] = json!("Inqueue");
    vec![
        ("PodGroup moved, its n bound pods refused", moved("full")),
        ("PodGroup moved, its n bound pods admitted", moved("room")),
        (
            "PodGroup created over n unstamped pods, refused",
            R::podgroup("CREATE", group("late", "full", None, "Pending")).build(),
        ),
        (
            "pod CREATE into a queue of n pods",
            R::pod("CREATE", pod("new", None, Some("room"), None)).build(),
        ),
        (
            "binding in a queue of n pods",
            R::binding("ml", "room-0", "n1").build(),
        ),
        (
            "enqueue after n/100 waiting groups (strict)",
            R::podgroup("UPDATE", enq).old(last).build(),
        ),
    ]
}

fn main() {
    let max: usize = std::env::var("SCALE_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let cfg = Config::default();
    let mut missed = Vec::new();
    println!("| hook, worst input | n | decision | added memory | answer |");
    println!("|---|---|---|---|---|");
    for n in [1_000, 10_000, 100_000].into_iter().filter(|n| *n <= max) {
        let snap = world(n);
        let only = std::env::var("SCALE_ONLY").unwrap_or_default();
        for (name, doc) in cases().into_iter().filter(|(n, _)| n.contains(&only)) {
            let req = request(&doc);
            let now = jiff::Timestamp::now();
            // Once to warm up, then the slowest of three.
            let _ = decide(&req, &snap, &cfg, now);
            let mut slowest = Duration::ZERO;
            let mut added = 0;
            let mut allowed = false;
            let rounds = std::env::var("SCALE_ROUNDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(3);
            for _ in 0..rounds {
                proc_status::reset_peak();
                let before = proc_status::bytes("VmRSS").unwrap_or(0);
                let t = Instant::now();
                let d = decide(&req, &snap, &cfg, now);
                slowest = slowest.max(t.elapsed());
                let peak = proc_status::bytes("VmHWM").unwrap_or(0);
                added = added.max(peak.saturating_sub(before));
                allowed = d.allowed;
            }
            let answer = if allowed { "allowed" } else { "refused" };
            println!(
                "| {name} | {n} | {:.2} ms | {:.1} MiB | {answer} |",
                slowest.as_secs_f64() * 1e3,
                added as f64 / (1 << 20) as f64
            );
            if n <= 10_000 && (slowest > Duration::from_millis(100) || added > 256 << 20) {
                missed.push(format!("{name} at {n}"));
            }
        }
    }
    if !missed.is_empty() {
        eprintln!("targets missed: {missed:?}");
        std::process::exit(1);
    }
}
