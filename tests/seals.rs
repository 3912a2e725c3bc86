//! R2 for Queues (issue 57 #1): a change that lowers a queue's limits is sealed into its
//! ledger before it is stored, so a replica whose Queue watch has not shown it cannot go
//! on admitting against the limit it replaced, under its hold of headroom or through a
//! write; a quorum read of the Queue (what the live writer does while a seal holds a
//! queue back) brings the replica up to the change.

use std::collections::HashMap;
use std::time::Duration;

use card_quota::cards::QueueName;
use card_quota::decide::batch::{look, plan, plan_held, HoldMove, Outcome, Replica};
use card_quota::decide::escrow::{Escrow, Holding};
use card_quota::decide::review::{read_review, AdmissionRequest, ReviewBuilder as R};
use card_quota::decide::seal::{in_the_way, seals_for, to_confirm};
use card_quota::decide::Config;
use card_quota::ledger::entries::Hold;
use card_quota::ledger::seal::SealCause;
use card_quota::ledger::{Ledger, LedgerRecord};
use card_quota::snapshot::load::{load, upsert};
use card_quota::snapshot::Snapshot;
use serde_json::{json, Value};

const NODES: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {nvidia.com/gpu.product: RTX-4090}}
status: {allocatable: {nvidia.com/gpu: "1000"}}
"#;

fn queue(name: &str, parent: &str, quota: &str, rv: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name, "resourceVersion": rv,
            "annotations": {"volcano.sh/card.quota": quota}},
        "spec": {"parent": parent}, "status": {"state": "Open"}})
}

fn snapshot(queues: &[Value]) -> Snapshot {
    let mut s = load(NODES).unwrap().0;
    for q in queues {
        upsert(&mut s, q).unwrap();
    }
    s
}

fn review(doc: Value) -> AdmissionRequest {
    read_review(&serde_json::to_vec(&doc).unwrap())
        .unwrap()
        .unwrap()
}

fn create(name: &str, queue: &str) -> AdmissionRequest {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
            "annotations": {"scheduling.volcano.sh/queue-name": queue, "volcano.sh/card.name": "RTX-4090"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    review(R::pod("CREATE", pod).build())
}

/// Writes `ledger` into the snapshot as the next version of `key`'s ledger.
fn store(snap: &mut Snapshot, key: &QueueName, ledger: Ledger) {
    let rv = snap
        .ledger(key)
        .resource_version
        .clone()
        .map_or(1, |v| v.parse::<u64>().unwrap() + 1);
    snap.upsert_ledger(LedgerRecord {
        queue: key.clone(),
        resource_version: Some(rv.to_string()),
        ledger,
        problem: None,
    });
}

/// The ledgers as the Queue hook leaves them once it has sealed `req` (seen by `hook`).
fn sealed_by(hook: &Snapshot, req: &AdmissionRequest, into: &mut Snapshot) {
    for (key, seals) in seals_for(hook, req, jiff::Timestamp::now()) {
        let mut l = into.ledger(&key).ledger.clone();
        for (q, s) in seals {
            l.seal(&q, s);
        }
        store(into, &key, l);
    }
}

fn admitted(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Admit(_)))
        .count()
}

fn plan_all(snap: &mut Snapshot, key: &QueueName, reqs: &[AdmissionRequest]) -> Vec<Outcome> {
    let refs: Vec<&AdmissionRequest> = reqs.iter().collect();
    let b = plan(
        snap,
        key,
        &refs,
        &Config::default(),
        jiff::Timestamp::now(),
        |_, _| Duration::ZERO,
        None,
    );
    b.outcomes
}

fn message(o: &Outcome) -> String {
    match o {
        Outcome::Answer(d) | Outcome::Wait(d) | Outcome::Admit(d) => {
            d.message.clone().unwrap_or_default()
        }
    }
}

#[test]
fn a_replica_behind_a_quota_cut_cannot_admit_past_the_new_quota() {
    let q = QueueName::new("q");
    let eight = queue("q", "", r#"{"RTX-4090":8}"#, "10");
    let two = queue("q", "", r#"{"RTX-4090":2}"#, "11");
    let pods: Vec<AdmissionRequest> = (0..8).map(|i| create(&format!("p{i}"), "q")).collect();
    // The replica whose Queue watch stalled still sees 8.
    let mut lagging = snapshot(std::slice::from_ref(&eight));
    assert_eq!(
        admitted(&plan_all(&mut lagging.clone(), &q, &pods)),
        8,
        "the race this test is about"
    );
    // The cut is admitted by the other replica's Queue hook, which seals q first.
    let cut = review(R::queue("UPDATE", two.clone()).old(eight.clone()).build());
    let hook = snapshot(std::slice::from_ref(&eight));
    sealed_by(&hook, &cut, &mut lagging);
    let seal = lagging.ledger(&q).ledger.seals()["q"].clone();
    assert_eq!(
        (seal.by.as_str(), seal.version, seal.cause),
        ("q", 10, SealCause::Limits)
    );
    let out = plan_all(&mut lagging, &q, &pods);
    assert_eq!(admitted(&out), 0);
    assert_eq!(
        message(&out[0]),
        "queue q changed the card limits of queue q's tree (a limit lowered, or a queue moved into it) and card-quota has not seen the change yet; try again"
    );
    // The writer reads the sealing Queue (its cache shows it at the sealed version)...
    let now = jiff::Timestamp::now();
    assert_eq!(
        to_confirm(&lagging, &lagging.ledger(&q).ledger, now),
        vec![q.clone()]
    );
    // A read that fails (or times out) is not tried again within the read gap: a stalled
    // connection would cost every write of the ledger its timeout.
    lagging.queue_read_failed(&q, now);
    let within = now + jiff::SignedDuration::from_millis(500);
    assert!(to_confirm(&lagging, &lagging.ledger(&q).ledger, within).is_empty());
    let past = now + jiff::SignedDuration::from_secs(1);
    assert_eq!(
        to_confirm(&lagging, &lagging.ledger(&q).ledger, past),
        vec![q.clone()]
    );
    // ... and the read brings the cut: 2 admitted, the rest refused with the quota.
    upsert(&mut lagging, &two).unwrap();
    lagging.confirm_queue(&q, Some(11), now);
    assert!(to_confirm(&lagging, &lagging.ledger(&q).ledger, now).is_empty());
    let out = plan_all(&mut lagging, &q, &pods);
    assert_eq!(admitted(&out), 2);
    assert!(
        message(&out[2]).starts_with("queue q has insufficient RTX-4090 quota"),
        "{}",
        message(&out[2])
    );
}

#[test]
fn a_raise_seals_nothing_and_a_borrow_cut_or_a_new_enforcement_seals() {
    let old = queue("q", "", r#"{"RTX-4090":2}"#, "10");
    let hook = snapshot(std::slice::from_ref(&old));
    let seals = |new: Value| {
        let req = review(R::queue("UPDATE", new).old(old.clone()).build());
        seals_for(&hook, &req, jiff::Timestamp::now())
            .into_values()
            .flatten()
            .map(|(q, s)| (q.to_string(), s.cause))
            .collect::<Vec<_>>()
    };
    assert!(seals(queue("q", "", r#"{"RTX-4090":3,"A100":1}"#, "10")).is_empty());
    let limits = vec![("q".to_string(), SealCause::Limits)];
    assert_eq!(seals(queue("q", "", r#"{"A100":2}"#, "10")), limits);
    assert_eq!(seals(queue("q", "", r#"{"RTX-4090":"x"}"#, "10")), limits);
    let mut deny = old.clone();
    deny["metadata"]["annotations"]["volcano.sh/card.enforcement"] = json!("deny");
    assert_eq!(seals(deny), limits);
    let mut borrow = old.clone();
    borrow["metadata"]["annotations"]["volcano.sh/card.borrow"] = json!(r#"{"RTX-4090":2}"#);
    let hook = snapshot(std::slice::from_ref(&borrow));
    let req = review(R::queue("UPDATE", old.clone()).old(borrow).build());
    assert_eq!(seals_for(&hook, &req, jiff::Timestamp::now()).len(), 1);
}

/// Group caps are limits too: a cap lowered, added or removed seals; a raise does not.
#[test]
fn a_group_cap_cut_added_or_removed_seals_and_a_raise_does_not() {
    let old = queue("q", "", r#"{"RTX-4090":8,"*":8}"#, "10");
    let hook = snapshot(std::slice::from_ref(&old));
    let sealed = |quota: &str| {
        let req = review(
            R::queue("UPDATE", queue("q", "", quota, "10"))
                .old(old.clone())
                .build(),
        );
        !seals_for(&hook, &req, jiff::Timestamp::now()).is_empty()
    };
    assert!(!sealed(r#"{"RTX-4090":8,"*":9}"#));
    assert!(sealed(r#"{"RTX-4090":8,"*":2}"#));
    assert!(sealed(r#"{"RTX-4090":8,"*":8,"RTX-*":1}"#));
    assert!(sealed(r#"{"RTX-4090":8}"#));
}

#[test]
fn a_cut_on_a_parent_seals_every_queue_below_it_in_the_trees_ledger() {
    let org = queue("org", "", r#"{"RTX-4090":8}"#, "10");
    let a = queue("a", "org", r#"{"RTX-4090":4}"#, "11");
    let b = queue("b", "org", r#"{"RTX-4090":4}"#, "12");
    let hook = snapshot(&[org.clone(), a, b]);
    let cut = queue("org", "", r#"{"RTX-4090":2}"#, "10");
    let req = review(R::queue("UPDATE", cut).old(org).build());
    let seals = seals_for(&hook, &req, jiff::Timestamp::now());
    let ledger = hook.ledger_key(&QueueName::new("a"));
    assert_eq!(seals.keys().collect::<Vec<_>>(), vec![&ledger]);
    let sealed: Vec<String> = seals[&ledger].iter().map(|(q, _)| q.to_string()).collect();
    assert_eq!(sealed, vec!["a", "b", "org"]);
    assert!(seals[&ledger]
        .iter()
        .all(|(_, s)| s.by == "org" && s.version == 10));
}

#[test]
fn a_replica_holding_spare_takes_none_while_a_cut_it_has_not_seen_is_sealed() {
    let q = QueueName::new("q");
    let big = queue("q", "", r#"{"RTX-4090":1000}"#, "10");
    let mut snap = snapshot(std::slice::from_ref(&big));
    // One write gives replica a its hold (a quarter of what is free, at most 64).
    let mut escrow = Escrow::default();
    let always = |_: &str, _: &Hold| true;
    let b = plan_held(
        &mut snap,
        &q,
        &[&create("first", "q")],
        &Config::default(),
        jiff::Timestamp::now(),
        |_, _| Duration::ZERO,
        None,
        Some(&Holding {
            me: "a",
            live: &always,
            escrow: &escrow,
        }),
        HoldMove::AsNeeded,
        true,
    );
    store(&mut snap, &q, Ledger::parse(&q, &b.text).unwrap());
    escrow = b.renewal.expect("a hold").escrow;
    assert!(!escrow.spare.is_empty());
    let mut escrows = HashMap::from([(q.clone(), escrow)]);
    let mut held = |snap: &mut Snapshot, name: &str| {
        let live = |_: &QueueName, _: &str, _: &Hold| true;
        let mut r = Replica {
            me: "a",
            live: &live,
            escrows: &mut escrows,
        };
        let l = look(
            snap,
            &create(name, "q"),
            &Config::default(),
            jiff::Timestamp::now(),
            Some(&mut r),
            true,
        );
        l.held
    };
    assert!(held(&mut snap, "under-hold"), "admitted under the hold");
    // Another replica's hook cuts q to 1; a's Queue watch has not shown it.
    let cut = review(
        R::queue("UPDATE", queue("q", "", r#"{"RTX-4090":1}"#, "10"))
            .old(big)
            .build(),
    );
    let hook = snap.clone();
    sealed_by(&hook, &cut, &mut snap);
    assert!(
        !held(&mut snap, "after-cut"),
        "a sealed queue takes nothing from spare: the writer answers it"
    );
}

#[test]
fn a_seal_of_another_change_not_seen_yet_is_not_overwritten() {
    let q = QueueName::new("q");
    let old = queue("q", "", r#"{"RTX-4090":4}"#, "10");
    let root = queue("root", "", r#"{"RTX-4090":100}"#, "5");
    let mut plain_root = root.clone();
    plain_root["metadata"]["annotations"] = json!({});
    let mut snap = snapshot(&[old.clone(), plain_root.clone()]);
    // root given a budget (version 5 before it): q is sealed there by root (and root,
    // the tree q moves into, in its own ledger).
    let budget = review(R::queue("UPDATE", root.clone()).old(plain_root).build());
    let mut moved = seals_for(&snap, &budget, jiff::Timestamp::now());
    let root_name = QueueName::new("root");
    assert_eq!(
        moved.keys().collect::<Vec<_>>(),
        vec![&q, &root_name],
        "{moved:?}"
    );
    let mut l = snap.ledger(&q).ledger.clone();
    for (qq, s) in moved.remove(&q).unwrap_or_default() {
        l.seal(&qq, s);
    }
    store(&mut snap, &q, l);
    let cut = review(
        R::queue("UPDATE", queue("q", "", r#"{"RTX-4090":1}"#, "10"))
            .old(old)
            .build(),
    );
    let seals = seals_for(&snap, &cut, jiff::Timestamp::now());
    let (_, new) = &seals[&q][0];
    let ledger = snap.ledger(&q).ledger.clone();
    assert_eq!(
        in_the_way(&snap, &ledger, &q, new).map(|s| s.by.as_str()),
        Some("root")
    );
    // Once the replica sees root's change, the cut may seal q.
    upsert(&mut snap, &queue("root", "", r#"{"RTX-4090":100}"#, "6")).unwrap();
    let ledger = snap.ledger(&q).ledger.clone();
    assert!(in_the_way(&snap, &ledger, &q, new).is_none());
}

/// A refused Queue write's seals are taken back only where they still stand: a ledger
/// whose seal another change replaced since is not written (nothing of this write is
/// left in it), one that still holds it is written with the seal it replaced put back.
#[tokio::test]
async fn a_take_back_writes_only_ledgers_that_still_hold_its_seals() {
    use card_quota::ledger::seal::Seal;
    use card_quota::live::seals::{take_back, Placed};
    use card_quota::live::LedgerApi;
    use http::{Request, Response};
    use kube::client::Body;
    use std::sync::Mutex;

    let q = QueueName::new("q");
    let seal = |by: &str, version| Seal {
        by: by.to_string(),
        version,
        at: jiff::Timestamp::now(),
        cause: SealCause::default(),
    };
    let (ours, before, since) = (seal("q", 10), seal("root", 4), seal("root", 12));
    let placed = || {
        vec![Placed {
            ledger: q.clone(),
            seals: vec![(q.clone(), ours.clone(), Some(before.clone()))],
        }]
    };
    let with_seal = |s: &Seal| {
        let mut snap = snapshot(&[queue("q", "", r#"{"RTX-4090":4}"#, "10")]);
        let mut l = Ledger::default();
        l.seal(&q, s.clone());
        store(&mut snap, &q, l);
        Mutex::new(snap)
    };
    // Takes `placed()` back over a ledger holding `s`, through a scripted API server:
    // the ledger as the snapshot then holds it, and the write sent within 300 ms (if any).
    let take_back_over = |s: &Seal| {
        let (snap, placed, q) = (with_seal(s), placed(), q.clone());
        async move {
            let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let api = LedgerApi::new(kube::Client::new(svc, "default"), "card-quota");
            let written = tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(300), handle.next_request())
                    .await
                    .ok()
                    .flatten()
                    .map(|(r, _)| (r.method().to_string(), r.into_body()))
            });
            take_back(&api, &snap, placed, |_| {}).await;
            let ledger = snap.lock().unwrap().ledger(&q).ledger.clone();
            (ledger, written.await.unwrap())
        }
    };

    // Replaced since by another change: nothing to take back, nothing written.
    let (l, written) = take_back_over(&since).await;
    assert!(
        written.is_none(),
        "a ledger whose seal was replaced since is not written"
    );
    assert_eq!(l.seals().get("q"), Some(&since), "the later seal stays");

    // Still ours: written with the seal ours replaced put back (the write is answered
    // with an error here: best effort, the seal then lifts by time).
    let (_, written) = take_back_over(&ours).await;
    let (method, body) = written.expect("the ledger is written");
    assert_eq!(method, "PUT");
    let cm: Value = serde_json::from_slice(
        &http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes(),
    )
    .unwrap();
    let text = cm["data"]["ledger"].as_str().unwrap();
    let l: Value = serde_json::from_str(text).unwrap();
    assert_eq!(l["seals"]["q"]["by"], "root", "{text}");
    assert_eq!(l["seals"]["q"]["version"], 4, "{text}");
}
