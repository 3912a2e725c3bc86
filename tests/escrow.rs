//! Holds of headroom (escrow) through the pure core: a replica admits pod charges within
//! its hold without a write, counts the others' holds as reserved, and a charge refused
//! only because of another replica's hold waits for its release.

use std::collections::HashMap;
use std::time::Duration;

use card_quota::cards::QueueName;
use card_quota::decide::batch::{look, plan_held, HoldMove, Outcome, Replica};
use card_quota::decide::escrow::{Escrow, Holding};
use card_quota::decide::review::{read_review, AdmissionRequest, ReviewBuilder as R};
use card_quota::decide::Config;
use card_quota::ledger::entries::Hold;
use card_quota::ledger::{Ledger, LedgerRecord};
use card_quota::snapshot::load::load;
use card_quota::snapshot::Snapshot;
use serde_json::json;

const SNAP: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {nvidia.com/gpu.product: RTX-4090}}
status: {allocatable: {nvidia.com/gpu: "1000"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"RTX-4090":QUOTA}'}}
status: {state: Open}
"#;

fn snapshot(quota: u64) -> Snapshot {
    load(&SNAP.replace("QUOTA", &quota.to_string())).unwrap().0
}

fn create(name: &str) -> AdmissionRequest {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
            "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    read_review(R::pod("CREATE", pod).build().to_string().as_bytes())
        .unwrap()
        .unwrap()
}

fn q() -> QueueName {
    QueueName::new("q")
}

fn always(_: &str, _: &Hold) -> bool {
    true
}

/// One replica's batch: its outcomes, and the ledger (stored in the snapshot) and
/// escrow as they are once the write lands.
fn batch(
    snap: &mut Snapshot,
    me: &str,
    escrow: &mut Escrow,
    reqs: &[AdmissionRequest],
    mv: HoldMove,
) -> Vec<Outcome> {
    batch_with(snap, me, escrow, reqs, mv, true)
}

/// [`batch`], where a warned charge may wait for others' spare (`warned_wait`) or not.
fn batch_with(
    snap: &mut Snapshot,
    me: &str,
    escrow: &mut Escrow,
    reqs: &[AdmissionRequest],
    mv: HoldMove,
    warned_wait: bool,
) -> Vec<Outcome> {
    let holding = Holding {
        me,
        live: &always,
        escrow,
    };
    let refs: Vec<&AdmissionRequest> = reqs.iter().collect();
    let b = plan_held(
        snap,
        &q(),
        &refs,
        &Config::default(),
        jiff::Timestamp::now(),
        |_, _| Duration::ZERO,
        None,
        Some(&holding),
        mv,
        warned_wait,
    );
    let rv = snap
        .ledger(&q())
        .resource_version
        .clone()
        .map_or(1, |v| v.parse::<u64>().unwrap() + 1);
    snap.upsert_ledger(LedgerRecord {
        queue: q(),
        resource_version: Some(rv.to_string()),
        ledger: Ledger::parse(&q(), &b.text).unwrap(),
        problem: None,
    });
    if let Some(r) = b.renewal {
        *escrow = r.escrow;
    }
    b.outcomes
}

fn held(
    snap: &mut Snapshot,
    me: &str,
    escrows: &mut HashMap<QueueName, Escrow>,
    req: &AdmissionRequest,
) -> (bool, bool) {
    let live = |_: &QueueName, _: &str, _: &Hold| true;
    let mut r = Replica {
        me,
        live: &live,
        escrows,
    };
    let l = look(
        snap,
        req,
        &Config::default(),
        jiff::Timestamp::now(),
        Some(&mut r),
        true,
    );
    (l.decision.allowed, l.held)
}

#[test]
fn after_one_write_a_replica_admits_within_its_hold_without_writing() {
    let mut snap = snapshot(1000);
    let mut e = Escrow::default();
    let out = batch(&mut snap, "a", &mut e, &[create("p0")], HoldMove::AsNeeded);
    assert!(matches!(out[0], Outcome::Admit(_)));
    let hold = snap
        .ledger(&q())
        .ledger
        .holds()
        .get("a")
        .cloned()
        .expect("a hold is written");
    // A quarter of what is free, at most a chunk; the pod admitted is an entry of its
    // own, which a reader whose cache shows the pod counts once.
    assert_eq!(hold.cards["RTX-4090"].get(), 64, "{hold:?}");
    assert_eq!(hold.spare["RTX-4090"].get(), 64, "{hold:?}");
    assert_eq!(snap.ledger(&q()).ledger.len(), 1, "the pod is an entry");
    let mut escrows = HashMap::from([(q(), e)]);
    for i in 1..=64 {
        assert_eq!(
            held(&mut snap, "a", &mut escrows, &create(&format!("p{i}"))),
            (true, true),
            "pod {i}"
        );
    }
    // The spare is spent: the next charge goes through a write.
    assert_eq!(
        held(&mut snap, "a", &mut escrows, &create("p65")),
        (true, false)
    );
}

#[test]
fn a_charge_refused_while_another_replica_holds_spare_waits_for_its_release() {
    // Quota 9: a's first pod (an entry) leaves 8 free, so a holds 2 spare.
    let mut snap = snapshot(9);
    let mut a = Escrow::default();
    batch(&mut snap, "a", &mut a, &[create("a0")], HoldMove::AsNeeded);
    assert_eq!(
        snap.ledger(&q()).ledger.holds()["a"].spare["RTX-4090"].get(),
        2
    );
    // b fills what a does not hold: 9 - 3 = 6 pods.
    let mut b = Escrow::default();
    let reqs: Vec<AdmissionRequest> = (0..6).map(|i| create(&format!("b{i}"))).collect();
    let out = batch(&mut snap, "b", &mut b, &reqs, HoldMove::NoSpare);
    assert!(
        out.iter().all(|o| matches!(o, Outcome::Admit(_))),
        "{out:?}"
    );
    // The next one fits only if a gives its spare back: it waits, and asks.
    let out = batch(&mut snap, "b", &mut b, &[create("b6")], HoldMove::NoSpare);
    assert!(matches!(out[0], Outcome::Wait(_)), "{out:?}");
    assert_eq!(snap.ledger(&q()).ledger.release(), 1);
    // a answers: its hold, all spare, is written down to nothing.
    batch(&mut snap, "a", &mut a, &[], HoldMove::AsNeeded);
    assert_eq!(snap.ledger(&q()).ledger.holds().get("a"), None);
    assert_eq!(a.released, 1, "a answered the request");
    // Decided again, b's pod takes the card a gave back.
    let out = batch(&mut snap, "b", &mut b, &[create("b6")], HoldMove::NoSpare);
    assert!(matches!(out[0], Outcome::Admit(_)), "{out:?}");
    // One card is left (a's pod and b's 7): b7 takes it. The queue is full then, and
    // the next one is refused outright, with the numbers (every pod admitted counted
    // once, as pending).
    let out = batch(&mut snap, "b", &mut b, &[create("b7")], HoldMove::NoSpare);
    assert!(matches!(out[0], Outcome::Admit(_)), "{out:?}");
    let out = batch(&mut snap, "b", &mut b, &[create("b8")], HoldMove::NoSpare);
    match &out[0] {
        Outcome::Answer(d) => assert_eq!(
            d.message.as_deref(),
            Some("queue q has insufficient RTX-4090 quota: requested 1, in use 9 (allocated 0, pending 9, reserved 0), quota 9")
        ),
        other => panic!("{other:?}"),
    }
}

/// Issue 46 #10: under warn, a charge over the quota only because another replica
/// holds spare was admitted at once with a warning that deny would refuse it, though
/// deny waits for that spare and admits it. It waits the same way now; out of patience
/// (the holder may be dead) it is admitted with its warning, and recorded.
#[test]
fn under_warn_a_charge_blocked_only_by_others_spare_waits_instead_of_a_false_warning() {
    let warn = SNAP.replace("QUOTA", "9").replace(
        "annotations: {",
        "annotations: {volcano.sh/card.enforcement: warn, ",
    );
    let mut snap = load(&warn).unwrap().0;
    let mut a = Escrow::default();
    batch(&mut snap, "a", &mut a, &[create("a0")], HoldMove::AsNeeded);
    let mut b = Escrow::default();
    let reqs: Vec<AdmissionRequest> = (0..6).map(|i| create(&format!("b{i}"))).collect();
    let out = batch(&mut snap, "b", &mut b, &reqs, HoldMove::NoSpare);
    assert!(
        out.iter()
            .all(|o| matches!(o, Outcome::Admit(d) if !d.warned())),
        "{out:?}"
    );
    let out = batch(&mut snap, "b", &mut b, &[create("b6")], HoldMove::NoSpare);
    assert!(matches!(out[0], Outcome::Wait(_)), "{out:?}");
    assert_eq!(snap.ledger(&q()).ledger.release(), 1);
    let out = batch_with(
        &mut snap,
        "b",
        &mut b,
        &[create("b6")],
        HoldMove::NoSpare,
        false,
    );
    match &out[0] {
        Outcome::Admit(d) => assert!(d.warned(), "{d:?}"),
        other => panic!("{other:?}"),
    }
    assert!(
        snap.ledger(&q()).ledger.len() >= 7,
        "recorded like any admission"
    );
    // With a's spare given back, the same charge fits: no warning at all.
    let mut snap = load(&warn).unwrap().0;
    let (mut a, mut b) = (Escrow::default(), Escrow::default());
    batch(&mut snap, "a", &mut a, &[create("a0")], HoldMove::AsNeeded);
    batch(&mut snap, "b", &mut b, &reqs, HoldMove::NoSpare);
    batch(&mut snap, "b", &mut b, &[create("b6")], HoldMove::NoSpare);
    batch(&mut snap, "a", &mut a, &[], HoldMove::AsNeeded);
    let out = batch(&mut snap, "b", &mut b, &[create("b6")], HoldMove::NoSpare);
    assert!(
        matches!(&out[0], Outcome::Admit(d) if !d.warned()),
        "{out:?}"
    );
}

/// A pod admitted under a hold is written as an entry at the holder's next write, so a
/// replica whose cache already shows the pod counts it once. (Carried as a count in
/// the hold, it was counted twice there: as the pod, and as what the hold carries.)
#[test]
fn a_held_pod_another_replica_already_sees_counts_once() {
    // Quota 9: a0 leaves 8 free, so a holds 2 spare and admits a1 and a2 under it.
    let mut snap = snapshot(9);
    let mut a = Escrow::default();
    batch(&mut snap, "a", &mut a, &[create("a0")], HoldMove::AsNeeded);
    let mut escrows = HashMap::from([(q(), a)]);
    for p in ["a1", "a2"] {
        assert_eq!(held(&mut snap, "a", &mut escrows, &create(p)), (true, true));
    }
    let mut a = escrows.remove(&q()).unwrap();
    batch(&mut snap, "a", &mut a, &[], HoldMove::Shrink);
    assert_eq!(
        snap.ledger(&q()).ledger.len(),
        3,
        "a0, a1 and a2 are entries"
    );
    // The pods reach the cache; a's caches may lag, b's do not.
    for (i, p) in ["a0", "a1", "a2"].iter().enumerate() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p, "namespace": "ml", "uid": format!("u-{p}"),
                "resourceVersion": (10 + i).to_string(),
                "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        });
        card_quota::snapshot::load::upsert(&mut snap, &pod).unwrap();
    }
    // b gets all 6 cards left, and its refusal counts 9 pods, each once.
    let mut b = Escrow::default();
    let reqs: Vec<AdmissionRequest> = (0..7).map(|i| create(&format!("b{i}"))).collect();
    let out = batch(&mut snap, "b", &mut b, &reqs, HoldMove::NoSpare);
    let admitted = out
        .iter()
        .filter(|o| matches!(o, Outcome::Admit(_)))
        .count();
    assert_eq!(admitted, 6, "{out:?}");
    match &out[6] {
        Outcome::Answer(d) => assert_eq!(
            d.message.as_deref(),
            Some("queue q has insufficient RTX-4090 quota: requested 1, in use 9 (allocated 0, pending 9, reserved 0), quota 9")
        ),
        other => panic!("{other:?}"),
    }
}

/// Issue 46 #4: the pin was chosen counting only what other replicas' holds carry, the
/// check counted their spare too. With another replica's spare filling model A (its
/// holder dead, say: it never gives it back), an `A|B` pod was pinned to A, waited,
/// and was refused, though B had all its room. The pin now counts what the check
/// counts, and falls back to "as if given back" only where nothing has room.
#[test]
fn the_pin_counts_others_spare_as_the_check_does() {
    let two = r#"
apiVersion: v1
kind: Node
metadata: {name: a1, labels: {nvidia.com/gpu.product: RTX-4090}}
status: {allocatable: {nvidia.com/gpu: "1000"}}
---
apiVersion: v1
kind: Node
metadata: {name: b1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "1000"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"RTX-4090":9,"NVIDIA-H200":4}'}}
status: {state: Open}
"#;
    let mut snap = load(two).unwrap().0;
    // a holds 2 spare RTX-4090 after its first pod; b fills the rest of RTX-4090.
    let mut a = Escrow::default();
    batch(&mut snap, "a", &mut a, &[create("a0")], HoldMove::AsNeeded);
    assert_eq!(
        snap.ledger(&q()).ledger.holds()["a"].spare["RTX-4090"].get(),
        2
    );
    let mut b = Escrow::default();
    let reqs: Vec<AdmissionRequest> = (0..6).map(|i| create(&format!("b{i}"))).collect();
    batch(&mut snap, "b", &mut b, &reqs, HoldMove::NoSpare);
    let either = {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ab", "namespace": "ml", "uid": "u-ab",
                "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090|NVIDIA-H200"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        });
        read_review(R::pod("CREATE", pod).build().to_string().as_bytes())
            .unwrap()
            .unwrap()
    };
    let live = |_: &QueueName, _: &str, _: &Hold| true;
    let mut escrows = HashMap::from([(q(), b)]);
    let mut r = Replica {
        me: "b",
        live: &live,
        escrows: &mut escrows,
    };
    // /mutate: no charge taken.
    let l = look(
        &mut snap,
        &either,
        &Config::default(),
        jiff::Timestamp::now(),
        Some(&mut r),
        false,
    );
    assert!(l.decision.allowed);
    let patch = serde_json::to_string(&l.decision.patch).unwrap();
    assert!(
        patch.contains("NVIDIA-H200") && !patch.contains(r#""RTX-4090""#),
        "pinned where the check finds room: {patch}"
    );
}
