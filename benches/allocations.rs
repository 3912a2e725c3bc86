//! Heap allocations per admission request, stage by stage: reading the review, reading
//! the pod, deciding, storing the admitted pod in the offline snapshot, encoding the
//! answer, and the whole handler. Counts, unlike times, do not move with the host: on a
//! busy machine the handler's cost is mostly the memory it touches, and every allocation
//! is some of it. Same three workloads as `cargo bench --bench load`.
//!
//! `cargo bench --bench allocations`. The counting wraps the system allocator (the
//! counts do not depend on which allocator serves them).

use card_quota::admission::{apply_spending, encode_response};
use card_quota::decide::review::{read_review, ReviewBuilder as R};
use card_quota::decide::{decide, read_ahead, Config};
use card_quota::snapshot::load::load;
use card_quota::webhook::server::{handle_review, State};
use serde_json::{json, Value};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

#[path = "support/full_pod.rs"]
mod full_pod;

const OBJECTS: &str = include_str!("../src/cli/demo/snapshot.yaml");
const APISERVER_POD_REVIEW: &str =
    include_str!("../tests/fixtures/apiserver-pod-create-review.json");
const ROUNDS: usize = 1000;

/// Allocations and bytes per run of `f`, over `ROUNDS` runs.
fn per_run(mut f: impl FnMut()) -> (f64, f64) {
    f();
    let region = Region::new(GLOBAL);
    for _ in 0..ROUNDS {
        f();
    }
    let s = region.change();
    let n = ROUNDS as f64;
    (
        (s.allocations + s.reallocations) as f64 / n,
        s.bytes_allocated as f64 / n,
    )
}

fn main() {
    let minimal = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "load-0", "namespace": "serving",
            "annotations": {"scheduling.volcano.sh/queue-name": "serving", "volcano.sh/card.name": "NVIDIA-GeForce-RTX-4090"}},
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let review = |pod: Value| serde_json::to_vec(&R::pod("CREATE", pod).uid("load").build());
    let workloads = [
        ("minimal pod", review(minimal.clone()).expect("encodes")),
        (
            "full-size pod",
            review(full_pod::full_pod(minimal)).expect("encodes"),
        ),
        ("apiserver pod", APISERVER_POD_REVIEW.as_bytes().to_vec()),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let cfg = Config::default();
    println!("heap allocations (and reallocations) per request, mean of {ROUNDS}");
    for (name, body) in &workloads {
        let (snap, _) = load(OBJECTS).expect("the demo snapshot loads");
        let state = State::new(snap.clone(), cfg.clone());
        let out = rt
            .block_on(handle_review(&state, body, true))
            .expect("answered");
        let v: Value = serde_json::from_slice(&out).expect("JSON");
        assert_eq!(v["response"]["allowed"], true, "{name}: {v}");

        let read = || match read_review(body) {
            Some(Ok(r)) => r,
            other => panic!("{name}: not a typed review: {:?}", other.map(|r| r.err())),
        };
        let req = read();
        read_ahead(&req);
        let now = jiff::Timestamp::now();
        // Stages that cannot run alone are measured with what comes before them, less
        // that.
        let read_only = per_run(|| drop(read()));
        let decided = per_run(|| drop(decide(&req, &snap, &cfg, now)));
        let mut spent = snap.clone();
        let d = decide(&req, &snap, &cfg, now);
        let stages = [
            ("read the review", read_only),
            (
                "read the pod",
                less(
                    per_run(|| {
                        let r = read();
                        read_ahead(&r);
                    }),
                    read_only,
                ),
            ),
            ("decide", decided),
            (
                "encode the answer",
                per_run(|| drop(encode_response(&req.uid, &d, true))),
            ),
            (
                "store in the offline snapshot",
                less(
                    per_run(|| {
                        let mut d = decide(&req, &spent, &cfg, now);
                        apply_spending(&mut spent, &req, &mut d).expect("applies");
                    }),
                    decided,
                ),
            ),
            (
                "whole handler",
                per_run(|| drop(rt.block_on(handle_review(&state, body, true)))),
            ),
        ];
        println!("{name} ({} bytes of review):", body.len());
        for (stage, (n, bytes)) in stages {
            println!("  {stage:<30} {n:>7.1} allocations {bytes:>9.0} bytes");
        }
    }
}

fn less(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    (a.0 - b.0, a.1 - b.1)
}
