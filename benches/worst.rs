//! The worst inputs we could construct (issue 32), each up to the API server's 3 MiB
//! request limit, decided against a queue already full of multi-model demand, the way
//! the webhook does it: the review read and its objects parsed with no lock held, then
//! decided under the snapshot's one lock. Prints the slowest read and decision of each,
//! the process's peak memory, and how long an innocent pod CREATE takes while the
//! slowest input is sent again and again. Targets: every decision (under the lock)
//! under 50 ms, the process under 256 MiB, the innocent request under 1 s.
//!
//! `cargo bench --bench worst` (prints a table; exits non-zero when a target is missed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use card_quota::decide::review::{read_review, AdmissionRequest, ReviewBuilder as R};
use card_quota::decide::{decide, read_ahead, Config};
use card_quota::snapshot::load::upsert;
use card_quota::snapshot::Snapshot;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "support/proc_status.rs"]
mod proc_status;

const MIB: usize = 1 << 20;
/// What the API server accepts in one request body.
const LIMIT: usize = 3 * MIB;
const MODELS: usize = 32;

/// 32 model names of 253 characters (the longest allowed).
fn models() -> Vec<String> {
    (0..MODELS)
        .map(|i| format!("M{i:02}-{}", "X".repeat(249)))
        .collect()
}

/// Queue `q` with 4 cards of each long model (128), 90 pending pods of 1 card each accepting
/// every model (unpinned), and 8 enqueued PodGroups reserving 4 cards each over every
/// model: every decision meets exact multi-model feasibility at its largest.
fn world() -> Snapshot {
    let models = models();
    let mut s = queue_of(&models, 8, 4);
    let all = models.join("|");
    for g in 0..8 {
        upsert(
            &mut s,
            &json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": format!("g{g}"), "namespace": "ml", "uid": format!("uid-g{g}"),
                "annotations": {"volcano.sh/card.request": json!({&all: 4}).to_string()}},
            "spec": {"queue": "q", "minMember": 1}, "status": {"phase": "Inqueue"}}),
        )
        .unwrap();
    }
    for p in 0..90 {
        upsert(&mut s, &pod(&format!("pending-{p}"), &all, 1)).unwrap();
    }
    s
}

/// A node of `cards` cards per model, and queue `q` with a quota of `quota` of each.
fn queue_of(models: &[String], cards: u32, quota: u32) -> Snapshot {
    let mut s = Snapshot::new();
    for (i, m) in models.iter().enumerate() {
        upsert(
            &mut s,
            &json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("n{i}"), "labels": {"nvidia.com/gpu.product": m}},
            "status": {"allocatable": {"nvidia.com/gpu": cards.to_string()}}}),
        )
        .unwrap();
    }
    let quota: serde_json::Map<String, Value> =
        models.iter().map(|m| (m.clone(), json!(quota))).collect();
    upsert(&mut s, &json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q", "annotations": {"volcano.sh/card.quota": Value::Object(quota).to_string()}},
        "status": {"state": "Open"}}))
    .unwrap();
    s
}

fn pod(name: &str, card: &str, cards: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": card}},
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]}})
}

fn waiting_group(request: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "worst", "namespace": "ml", "uid": "uid-worst", "resourceVersion": "5",
            "annotations": {"volcano.sh/card.request": request}},
        "spec": {"queue": "q", "minMember": 1}, "status": {"phase": "Pending"}})
}

/// Volcano's enqueue of a waiting group: the UPDATE Pending -> Inqueue.
fn enqueue(request: &str) -> Value {
    let old = waiting_group(request);
    let mut new = old.clone();
    new["status"]["phase"] = json!("Inqueue");
    R::podgroup("UPDATE", new).old(old).build()
}

/// Repeats `unit` (a JSON fragment with `{i}`) until the body nears the limit.
fn fill(unit: impl Fn(usize) -> Value, per: usize) -> Vec<Value> {
    (0..(LIMIT - 64 * 1024) / per).map(unit).collect()
}

/// Each worst input as the bytes the API server sends (built one at a time, so the
/// trees that make them are gone before anything is decided).
fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let models = models();
    let all = models.join("|");
    let mut out = Bodies::default();
    // The largest legal card.name and card.request, against the busy queue.
    out.push((
        "pod, 32 alternatives, fits",
        R::pod("CREATE", pod("p32", &all, 1)).build(),
    ));
    out.push((
        "pod, 32 alternatives, 100 cards",
        R::pod("CREATE", pod("p100", &all, 100)).build(),
    ));
    let request: serde_json::Map<String, Value> = (0..64)
        .map(|i| {
            let rotated: Vec<&str> = (0..MODELS)
                .map(|k| models[(i + k) % MODELS].as_str())
                .collect();
            (rotated.join("|"), json!(1 + i % 3))
        })
        .collect();
    let request = Value::Object(request).to_string();
    out.push(("enqueue, 64 entries x 32 alternatives", enqueue(&request)));
    out.push((
        "create waiting, 64 x 32",
        R::podgroup("CREATE", waiting_group(&request)).build(),
    ));
    // Past the caps, up to 3 MiB.
    let many: Vec<String> = (0..LIMIT / 12).map(|i| format!("A{i:09}")).collect();
    out.push((
        "pod, 3 MiB card.name",
        R::pod("CREATE", pod("huge-name", &many.join("|"), 1)).build(),
    ));
    // Each entry costs ~20 bytes once quoted inside the annotation.
    let entries: serde_json::Map<String, Value> = many[..LIMIT / 22]
        .iter()
        .map(|m| (m.clone(), json!(1)))
        .collect();
    let mut enqueued = waiting_group(&Value::Object(entries).to_string());
    enqueued["status"]["phase"] = json!("Inqueue");
    out.push((
        "create enqueued, 3 MiB card.request",
        R::podgroup("CREATE", enqueued).build(),
    ));
    let key = "nvidia.com/gpu.product";
    let mut terms = pod("terms", &all, 1);
    terms["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": fill(|i| json!({"matchExpressions": [
            {"key": key, "operator": "NotIn", "values": [format!("V{i}"), &models[i % MODELS]]},
            {"key": format!("k{i}.example.com/gpu.product"), "operator": "In", "values": ["x"]}]}), 450)}}});
    out.push((
        "pod, 3 MiB of affinity terms",
        R::pod("CREATE", terms).build(),
    ));
    let mut values = pod("values", &all, 1);
    values["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "NotIn", "values": fill(|i| json!(format!("V{i:010}")), 30)},
            {"key": key, "operator": "In", "values": fill(|i| json!(format!("W{i:010}")), 30)}]}]}}});
    out.push(("pod, 3 MiB of values", R::pod("CREATE", values).build()));
    let mut containers = pod("containers", &all, 1);
    containers["spec"]["containers"] = Value::Array(fill(
        |i| json!({"name": format!("c{i}"), "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}),
        80,
    ));
    out.push((
        "pod, 3 MiB of containers",
        R::pod("CREATE", containers).build(),
    ));
    let mut resources = pod("resources", &all, 1);
    let res: serde_json::Map<String, Value> = (0..(LIMIT - 64 * 1024) / 40)
        .map(|i| (format!("example{i}.com/dev{i}"), json!("1")))
        .collect();
    resources["spec"]["containers"][0]["resources"]["limits"] = Value::Object(res);
    out.push((
        "pod, 3 MiB of resources",
        R::pod("CREATE", resources).build(),
    ));
    let quota: serde_json::Map<String, Value> = (0..(LIMIT - 64 * 1024) / 24)
        .map(|i| (format!("Q{i:012}"), json!(1)))
        .collect();
    let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q2", "annotations": {"volcano.sh/card.quota": Value::Object(quota).to_string()}}});
    out.push(("queue, 3 MiB card.quota", R::queue("CREATE", q).build()));
    out.0
}

#[derive(Default)]
struct Bodies(Vec<(&'static str, Vec<u8>)>);

impl Bodies {
    fn push(&mut self, (name, doc): (&'static str, Value)) {
        let body = serde_json::to_vec(&doc).expect("JSON");
        assert!(body.len() <= LIMIT, "{name}: {} bytes", body.len());
        self.0.push((name, body));
    }
}

/// The process's peak resident memory (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    proc_status::bytes("VmHWM").map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64)
}

/// What the webhook does before it takes the lock: read the review, parse the objects.
fn read(body: &[u8]) -> AdmissionRequest {
    let req = read_review(body)
        .expect("an AdmissionReview")
        .expect("a valid review");
    read_ahead(&req);
    req
}

/// A flat queue of 8 models x 50 whose pending pods (unpinned, 3 to 39 cards, any of
/// the 8 models) were each admitted while the queue stayed feasible, and a one-card
/// pod on M0 that makes the exact search run out of budget: the longest a decision can
/// search. The answer is the queue's own refusal ("could not prove...").
fn hard_to_place() -> (Snapshot, Vec<u8>) {
    let models: Vec<String> = (0..8).map(|i| format!("M{i}")).collect();
    let mut s = queue_of(&models, 64, 50);
    let all = models.join("|");
    let sizes = [
        36, 39, 33, 37, 38, 13, 25, 12, 29, 6, 5, 15, 3, 37, 15, 13, 18, 8, 9, 7,
    ];
    for (i, n) in sizes.iter().enumerate() {
        upsert(&mut s, &pod(&format!("hard-{i}"), &all, *n)).unwrap();
    }
    let body = serde_json::to_vec(&R::pod("CREATE", pod("victim", "M0", 1)).build()).expect("JSON");
    (s, body)
}

/// What it does under the lock.
fn decided(req: &AdmissionRequest, snap: &Snapshot) -> (bool, String) {
    let d = decide(req, snap, &Config::default(), jiff::Timestamp::now());
    (d.allowed, d.message.unwrap_or_default())
}

fn main() {
    let snap = world();
    let cases = cases();
    println!(
        "{:<40} {:>9} {:>9} {:>9} {:>8} {:>7}",
        "worst input", "body", "read", "decide", "answer", "message"
    );
    let mut slowest = (Duration::ZERO, "");
    let mut slowest_read = Duration::ZERO;
    for (name, body) in &cases {
        let (mut worst_read, mut worst) = (Duration::ZERO, Duration::ZERO);
        let mut answer = (false, String::new());
        for _ in 0..3 {
            let t = Instant::now();
            let req = read(body);
            let t1 = Instant::now();
            answer = decided(&req, &snap);
            worst_read = worst_read.max(t1 - t);
            worst = worst.max(t1.elapsed());
        }
        if worst > slowest.0 {
            slowest = (worst, name);
        }
        slowest_read = slowest_read.max(worst_read);
        println!(
            "{name:<40} {:>7.2}MB {:>7.1}ms {:>7.1}ms {:>8} {:>6}c",
            body.len() as f64 / 1e6,
            worst_read.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3,
            if answer.0 { "allowed" } else { "refused" },
            answer.1.chars().count()
        );
    }
    let (hard, victim) = hard_to_place();
    let mut search = Duration::ZERO;
    let mut answer = (false, String::new());
    for _ in 0..5 {
        let req = read(&victim);
        let t = Instant::now();
        answer = decided(&req, &hard);
        search = search.max(t.elapsed());
    }
    println!(
        "{:<40} {:>9} {:>9} {:>7.1}ms {:>8} {:>6}c",
        "search out of budget (hard-to-place pods)",
        "-",
        "-",
        search.as_secs_f64() * 1e3,
        if answer.0 { "allowed" } else { "refused" },
        answer.1.chars().count()
    );
    // An innocent pod CREATE while the slowest input is decided again and again.
    let shared = Arc::new(Mutex::new(snap));
    let stop = Arc::new(AtomicBool::new(false));
    let worst_body = cases
        .iter()
        .find(|(n, _)| *n == slowest.1)
        .map(|(_, b)| b.clone())
        .unwrap_or_default();
    // Two senders of the worst input back to back (the machine's two cores).
    let hammers: Vec<_> = (0..2)
        .map(|_| {
            let (shared, stop, body) = (shared.clone(), stop.clone(), worst_body.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let req = read(&body);
                    let snap = shared.lock().unwrap_or_else(|e| e.into_inner());
                    decided(&req, &snap);
                }
            })
        })
        .collect();
    let innocent =
        serde_json::to_vec(&R::pod("CREATE", pod("innocent", "M00-X", 1)).build()).expect("JSON");
    let mut waits = Vec::new();
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        let t = Instant::now();
        let req = read(&innocent);
        {
            let snap = shared.lock().unwrap_or_else(|e| e.into_inner());
            decided(&req, &snap);
        }
        waits.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for h in hammers {
        let _ = h.join();
    }
    waits.sort();
    let innocent_max = waits.last().copied().unwrap_or_default();
    let peak = peak_rss_mib();
    println!(
        "slowest read (no lock): {:.1} ms; slowest decision (under the lock): {:.1} ms ({}); innocent pod CREATE beside it: p50 {:.1} ms, max {:.1} ms ({} tries); peak memory {peak:.0} MiB",
        slowest_read.as_secs_f64() * 1e3,
        slowest.0.as_secs_f64() * 1e3,
        slowest.1,
        waits[waits.len() / 2].as_secs_f64() * 1e3,
        innocent_max.as_secs_f64() * 1e3,
        waits.len()
    );
    let ok = slowest.0 < Duration::from_millis(50)
        && search < Duration::from_millis(50)
        && innocent_max < Duration::from_secs(1)
        && peak < 256.0;
    println!(
        "targets (decision < 50 ms, innocent < 1 s, memory < 256 MiB): {}",
        if ok { "met" } else { "MISSED" }
    );
    if !ok {
        std::process::exit(1);
    }
}
