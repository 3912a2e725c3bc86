//! Pruning's clock through the pure core, timed as `serve` times it
//! ([`EntryClock`]): an entry stops counting on that clock only behind a fence, and
//! the clock never runs longer than the charge the entry records has existed.

use std::time::Duration;

use card_quota::cards::QueueName;
use card_quota::decide::batch::{plan, Outcome};
use card_quota::decide::review::{read_review, AdmissionRequest, ReviewBuilder as R};
use card_quota::decide::Config;
use card_quota::ledger::clock::EntryClock;
use card_quota::ledger::entries::{Fence, Watermark};
use card_quota::ledger::{Ledger, LedgerRecord};
use card_quota::snapshot::load::{load, upsert};
use card_quota::snapshot::Snapshot;

/// A node of RTX-4090 cards and queue `q` with a quota of 1.
const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {nvidia.com/gpu.product: RTX-4090}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"RTX-4090":1}'}}
status: {state: Open}
"#;

/// A one-card pod of `q`, as created (`uid` u-<name>).
fn pod(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
            "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    })
}

/// The cluster with p1 and p2 created long ago, both in the cache, unbound.
fn with_pods() -> Snapshot {
    let mut snap = load(CLUSTER).unwrap().0;
    for (name, rv) in [("p1", "10"), ("p2", "11")] {
        let mut p = pod(name);
        p["metadata"]["resourceVersion"] = rv.into();
        upsert(&mut snap, &p).unwrap();
    }
    snap
}

fn q() -> QueueName {
    QueueName::new("q")
}

fn request(review: serde_json::Value) -> AdmissionRequest {
    read_review(review.to_string().as_bytes()).unwrap().unwrap()
}

fn bind(pod: &str) -> AdmissionRequest {
    request(R::binding("ml", pod, "n1").build())
}

/// Plans `req` alone with no fence (nothing pruned) and returns the ledger it writes,
/// once the charge is admitted.
fn admitted(snap: &mut Snapshot, req: &AdmissionRequest) -> Ledger {
    let b = plan(
        snap,
        &q(),
        &[req],
        &Config::default(),
        jiff::Timestamp::now(),
        |_, _| Duration::ZERO,
        None,
    );
    assert!(matches!(b.outcomes[0], Outcome::Admit(_)), "admitted");
    b.ledger
}

fn store(snap: &mut Snapshot, ledger: Ledger, rv: u64) {
    snap.upsert_ledger(LedgerRecord {
        queue: q(),
        resource_version: Some(rv.to_string()),
        ledger,
        problem: None,
    });
}

/// Replica B plans `req` at `at` seconds on its clock, behind a fence read just now
/// that its caches reached (they show what the API server had stored then), and
/// writes the ledger it planned.
fn plan_at(
    snap: &mut Snapshot,
    clock: &mut EntryClock<u64>,
    at: u64,
    req: &AdmissionRequest,
    rv: u64,
) -> Outcome {
    let fence = Fence {
        mark: snap.progress(),
        taken_ago: Duration::ZERO,
    };
    let clock = std::cell::RefCell::new(clock);
    let b = plan(
        snap,
        &q(),
        &[req],
        &Config::default(),
        jiff::Timestamp::now(),
        |id, e| Duration::from_secs(at - clock.borrow_mut().first_seen(&q(), id, e, at)),
        Some(&fence),
    );
    store(snap, b.ledger, rv);
    b.outcomes.into_iter().next().unwrap()
}

/// The likely cause of CI's failed two-replica binding burst (more binds than the quota):
/// a pod's CREATE entry and its binding entry share the pod's uid. Replica B saw the
/// CREATE entry, the leader pruned it (B's clock kept it: B wrote nothing since), and
/// 40 s later A admitted the pod's bind. B, planning the next bind behind a fence read
/// before that bind landed (its cache shows the pod unbound, as the fence does), timed
/// the binding entry from the CREATE: 40 s, past the 30 s grace of a bind that failed,
/// and pruned it from the ledger it wrote while the bind was in flight: the next bind,
/// on either replica, was admitted past the quota.
#[test]
fn a_binding_entry_is_timed_from_the_bind_not_from_its_pods_create() {
    let mut b = with_pods();
    let mut clock = EntryClock::default();
    // p1's CREATE was recorded (the entry a plan of its charge writes); B read that
    // ledger at 0 s.
    let created = admitted(
        &mut load(CLUSTER).unwrap().0,
        &request(R::pod("CREATE", pod("p1")).build()),
    );
    for (id, e) in created.iter() {
        clock.first_seen(&q(), id, e, 0);
    }
    assert_eq!(clock.len(), 1, "B's clock times p1's CREATE entry");
    // The caches show p1: the leader prunes its entry; B's clock is not told.
    store(&mut b, Ledger::default(), 2);
    let mut a = with_pods();
    store(&mut a, Ledger::default(), 2);
    // 40 s later A admits p1's bind and records it; B reads that ledger.
    let bound = admitted(&mut a, &bind("p1"));
    assert_eq!(bound.iter().count(), 1);
    store(&mut b, bound, 3);
    // The bind is in flight: B's cache shows p1 unbound, and so would any fence read
    // now. p2's bind is refused, twice (the second time over the ledger B wrote).
    for (at, rv) in [(40, 4), (41, 5)] {
        match plan_at(&mut b, &mut clock, at, &bind("p2"), rv) {
            Outcome::Answer(d) => assert!(
                !d.allowed
                    && d.message
                        .as_deref()
                        .unwrap_or("")
                        .contains("in use 2 (allocated 1, pending 1"),
                "p2's bind at {at} s is refused at the quota of 1: {d:?}"
            ),
            other => panic!("p2's bind at {at} s must be refused (p1's bind counts): {other:?}"),
        }
    }
}

/// R2 kept by the core itself (found by the committer model, 2026-12-04): a replica's
/// writer waited for its caches to reach the ledger's watermark, then, while it read a
/// fence, a newer ledger arrived: another replica had pruned a charge its own cache
/// showed and raised the watermark past this replica's progress. Planned from that
/// ledger, the pruned charge counted nowhere and a CREATE went through on top of it.
/// A batch planned from a ledger its caches are behind decides nothing: each request
/// waits (and is "try again" if the caches never come).
#[test]
fn a_batch_planned_from_a_ledger_the_caches_are_behind_decides_nothing() {
    let mut snap = with_pods();
    let mut progress = snap.progress();
    progress.pods = 11;
    snap.set_progress(progress);
    // Another replica's write: p0 (rv 12, which this cache does not show) pruned.
    let mut ledger = Ledger::default();
    ledger.raise_watermark(Watermark {
        pods: 12,
        podgroups: 0,
        claims: 0,
    });
    store(&mut snap, ledger, 5);
    let create = request(R::pod("CREATE", pod("p3")).build());
    let decide = |snap: &mut Snapshot| {
        plan(
            snap,
            &q(),
            &[&create],
            &Config::default(),
            jiff::Timestamp::now(),
            |_, _| Duration::ZERO,
            None,
        )
    };
    let b = decide(&mut snap);
    match &b.outcomes[0] {
        Outcome::Wait(d) => assert_eq!(
            d.message.as_deref(),
            Some("card-quota's caches are behind queue q's ledger; try again")
        ),
        o => panic!("decided from a ledger the caches are behind: {o:?}"),
    }
    assert!(b.unchanged(), "nothing to write");
    // Caught up, it is decided: refused, p1 and p2 hold more than the quota of 1.
    progress.pods = 12;
    snap.set_progress(progress);
    let b = decide(&mut snap);
    assert!(
        matches!(&b.outcomes[0], Outcome::Answer(d) if !d.allowed && d.message.as_deref().is_some_and(|m| m.starts_with("queue q has insufficient"))),
        "{:?}",
        b.outcomes[0]
    );
}
