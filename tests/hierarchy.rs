//! Hierarchical card quota (docs/hierarchy.md): each rule and message as a table test,
//! through the path the webhook and replay use.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use card_quota::admission::{apply, review, usage_report};
use card_quota::decide::review::{AdmissionResponse, ReviewBuilder as R};
use card_quota::decide::Config;
use card_quota::snapshot::load::load;
use card_quota::snapshot::Snapshot;
use serde_json::{json, Value};

const NODES: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: h200-1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "16"}}
---
apiVersion: v1
kind: Node
metadata: {name: rtx-1, labels: {nvidia.com/gpu.product: RTX-4090}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: root}
"#;

/// A Queue: name, parent ("" for none), quota and borrow JSON ("" for none).
fn queue(name: &str, parent: &str, quota: &str, borrow: &str) -> Value {
    let mut q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name, "annotations": {}}, "spec": {"weight": 1},
        "status": {"state": "Open"}});
    if !parent.is_empty() {
        q["spec"]["parent"] = json!(parent);
    }
    if !quota.is_empty() {
        q["metadata"]["annotations"]["volcano.sh/card.quota"] = json!(quota);
    }
    if !borrow.is_empty() {
        q["metadata"]["annotations"]["volcano.sh/card.borrow"] = json!(borrow);
    }
    q
}

fn yaml(queues: &[Value]) -> String {
    let mut s = NODES.to_string();
    for q in queues {
        s.push_str("---\n");
        s.push_str(&serde_json::to_string(q).unwrap());
        s.push('\n');
    }
    s
}

struct World {
    snap: Snapshot,
    cfg: Config,
    n: u32,
}

impl World {
    fn with(queues: &[Value]) -> Self {
        let (snap, skipped) = load(&yaml(queues)).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
            n: 0,
        }
    }
    /// The org of the worked example: org 8 H200; team-a 4 (+ borrow 2), team-b 2; a
    /// pool of 2.
    fn org() -> Self {
        Self::with(&[
            queue("org", "root", r#"{"NVIDIA-H200":8}"#, ""),
            queue(
                "team-a",
                "org",
                r#"{"NVIDIA-H200":4}"#,
                r#"{"NVIDIA-H200":2}"#,
            ),
            queue(
                "team-b",
                "org",
                r#"{"NVIDIA-H200":2}"#,
                r#"{"NVIDIA-H200":2}"#,
            ),
        ])
    }
    fn send(&mut self, doc: Value) -> AdmissionResponse {
        let r = review(
            &doc,
            &mut self.snap,
            &self.cfg,
            jiff::Timestamp::now(),
            true,
        );
        if let (Some(req), Some(d)) = (&r.request, &r.decision) {
            apply(&mut self.snap, req, d).unwrap();
        }
        r.out.response
    }
    /// A one-model pod of `n` cards in `queue`.
    fn pod(&mut self, queue: &str, card: &str, n: &str) -> AdmissionResponse {
        self.n += 1;
        let name = format!("p{}", self.n);
        self.send(R::pod("CREATE", pod(&name, queue, card, n)).build())
    }
    fn admit(&mut self, queue: &str, card: &str, n: &str) {
        let r = self.pod(queue, card, n);
        assert!(r.allowed, "{}", message(&r));
    }
    fn refused(&mut self, queue: &str, card: &str, n: &str) -> String {
        let r = self.pod(queue, card, n);
        assert!(!r.allowed, "admitted {card} x{n} in {queue}");
        message(&r)
    }
    fn apply_queue(&mut self, op: &str, q: Value, old: Option<Value>) -> AdmissionResponse {
        let mut b = R::queue(op, q);
        if let Some(o) = old {
            b = b.old(o);
        }
        self.send(b.build())
    }
    /// vc-scheduler's enqueue of `waiting` (Pending -> Inqueue).
    fn enqueue(&mut self, waiting: &Value) -> AdmissionResponse {
        let mut next = waiting.clone();
        next["status"] = json!({"phase": "Inqueue"});
        self.send(R::podgroup("UPDATE", next).old(waiting.clone()).build())
    }
    fn usage(&self, queue: &str, model: &str) -> Value {
        serde_json::to_value(usage_report(&self.snap, jiff::Timestamp::now()))
            .unwrap()
            .pointer(&format!("/{queue}/{model}"))
            .cloned()
            .unwrap_or(Value::Null)
    }
}

fn pod(name: &str, queue: &str, card: &str, n: &str) -> Value {
    support::pod(name)
        .queue(queue)
        .scheduler("volcano")
        .card(card)
        .gpus(n)
        .build()
}

/// A waiting PodGroup of `queue` asking for `request` (`card.request`).
fn pg(name: &str, queue: &str, request: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "annotations": {"volcano.sh/card.request": request}},
        "spec": {"queue": queue, "minMember": 1}, "status": {}})
}

fn message(r: &AdmissionResponse) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

#[test]
fn a_flat_cluster_answers_byte_for_byte_as_before_also_under_root() {
    let flat = |parent: &str| {
        let mut w = World::with(&[
            queue("a", parent, r#"{"NVIDIA-H200":2,"RTX-4090":1}"#, ""),
            queue("b", parent, "", ""),
        ]);
        let mut out = Vec::new();
        for (q, c, n) in [
            ("a", "NVIDIA-H200", "1"),
            ("a", "NVIDIA-H200|RTX-4090", "1"),
            ("a", "NVIDIA-H200|RTX-4090", "1"),
            ("a", "RTX-4090", "1"),
            ("b", "NVIDIA-H200", "1"),
        ] {
            let mut r = w.pod(q, c, n);
            r.uid.clear();
            out.push(serde_json::to_string(&r).unwrap());
        }
        out.push(serde_json::to_string(&usage_report(&w.snap, jiff::Timestamp::now())).unwrap());
        out
    };
    assert_eq!(flat(""), flat("root"));
}

#[test]
fn a_share_stays_available_while_a_sibling_borrows_the_pool() {
    let mut w = World::org();
    for _ in 0..6 {
        w.admit("team-a", "NVIDIA-H200", "1");
    }
    // team-a's own cap: 4 + borrow 2.
    assert_eq!(
        w.refused("team-a", "NVIDIA-H200", "1"),
        "queue team-a has insufficient NVIDIA-H200 quota: requested 1, in use 6 (allocated 0, pending 6, reserved 0), quota 4 + borrow 2"
    );
    // team-b's share of 2 is still there.
    w.admit("team-b", "NVIDIA-H200", "2");
    // The pool is gone: team-b cannot borrow.
    assert_eq!(
        w.refused("team-b", "NVIDIA-H200", "1"),
        "queue team-b cannot borrow NVIDIA-H200 from org: requested 1, org free 0 (quota 8, shares 6, borrowed 2)"
    );
    assert_eq!(w.usage("team-a", "NVIDIA-H200")["pending"], 6);
    assert_eq!(w.usage("team-b", "NVIDIA-H200")["pending"], 2);
}

#[test]
fn the_pool_runs_out_between_borrowing_siblings() {
    let mut w = World::org();
    w.admit("team-b", "NVIDIA-H200", "3"); // borrows 1
    w.admit("team-a", "NVIDIA-H200", "5"); // borrows 1: the pool of 2 is gone
    assert_eq!(
        w.refused("team-a", "NVIDIA-H200", "1"),
        "queue team-a cannot borrow NVIDIA-H200 from org: requested 1, org free 0 (quota 8, shares 6, borrowed 2)"
    );
}

#[test]
fn without_borrow_a_queue_stays_within_its_share_whatever_the_pool() {
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":8}"#, ""),
        queue("team-a", "org", r#"{"NVIDIA-H200":2}"#, ""),
    ]);
    w.admit("team-a", "NVIDIA-H200", "2");
    assert_eq!(
        w.refused("team-a", "NVIDIA-H200", "1"),
        "queue team-a has insufficient NVIDIA-H200 quota: requested 1, in use 2 (allocated 0, pending 2, reserved 0), quota 2"
    );
}

#[test]
fn a_parent_quota_cut_below_usage_evicts_nothing_and_refuses_what_raises_it() {
    let mut w = World::org();
    w.admit("team-a", "NVIDIA-H200", "3");
    w.admit("team-b", "NVIDIA-H200", "2");
    let r = w.apply_queue(
        "UPDATE",
        queue("org", "root", r#"{"NVIDIA-H200":4}"#, ""),
        Some(queue("org", "root", r#"{"NVIDIA-H200":8}"#, "")),
    );
    assert!(r.allowed, "{}", message(&r));
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("below the current usage of its subtree (5)")),
        "{:?}",
        r.warnings
    );
    // Within team-a's share, but org is over its cap.
    assert_eq!(
        w.refused("team-a", "NVIDIA-H200", "1"),
        "queue team-a has insufficient NVIDIA-H200 quota in ancestor org: requested 1, org in use 5 (allocated 0, pending 5, reserved 0), quota 4"
    );
    // Beyond team-b's share: borrowing, from a pool that is not there.
    assert_eq!(
        w.refused("team-b", "NVIDIA-H200", "1"),
        "queue team-b cannot borrow NVIDIA-H200 from org: requested 1, org free 0 (quota 4, shares 6, borrowed 0)"
    );
    // Nothing was evicted; a charge that lowers org's use passes.
    assert_eq!(w.usage("team-a", "NVIDIA-H200")["pending"], 3);
    let r = w.send(R::pod("DELETE", json!(null)).named("ml", "p1").build());
    assert!(r.allowed);
}

#[test]
fn a_binding_is_refused_at_an_ancestor_over_its_cap() {
    let mut w = World::org();
    w.admit("team-a", "NVIDIA-H200", "1");
    w.admit("team-a", "NVIDIA-H200", "1");
    w.apply_queue(
        "UPDATE",
        queue("org", "root", r#"{"NVIDIA-H200":1}"#, ""),
        Some(queue("org", "root", r#"{"NVIDIA-H200":8}"#, "")),
    );
    assert!(w.send(R::binding("ml", "p1", "h200-1").build()).allowed);
    let r = w.send(R::binding("ml", "p2", "h200-1").build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue team-a has insufficient NVIDIA-H200 quota in ancestor org: requested 1, org in use 2 (allocated 1, pending 1, reserved 0), quota 1"
    );
}

/// Binding holds an ancestor's group cap too (the hard line at every level).
#[test]
fn a_binding_is_refused_at_an_ancestor_over_its_group_cap() {
    let org = |cap: &str| {
        queue(
            "org",
            "root",
            &format!(r#"{{"NVIDIA-H200":8,"RTX-4090":8,"*":{cap}}}"#),
            "",
        )
    };
    let mut w = World::with(&[
        org("8"),
        queue("team-a", "org", r#"{"NVIDIA-H200":4,"RTX-4090":4}"#, ""),
    ]);
    w.admit("team-a", "NVIDIA-H200", "1");
    w.admit("team-a", "RTX-4090", "1");
    w.apply_queue("UPDATE", org("1"), Some(org("8")));
    assert!(w.send(R::binding("ml", "p1", "h200-1").build()).allowed);
    let r = w.send(R::binding("ml", "p2", "rtx-1").build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue team-a has insufficient * quota (a group cap) in ancestor org: requested 1, org in use 2 (allocated 1, pending 1, reserved 0), quota 1"
    );
}

#[test]
fn alternatives_take_their_own_share_before_borrowing_and_a_full_parent_refuses() {
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":4,"RTX-4090":1}"#, ""),
        queue(
            "team-a",
            "org",
            r#"{"NVIDIA-H200":1,"RTX-4090":1}"#,
            r#"{"NVIDIA-H200":2}"#,
        ),
        queue("team-b", "org", r#"{"NVIDIA-H200":1}"#, ""),
    ]);
    let pinned = |r: &AdmissionResponse| {
        let p = r.patch.clone().unwrap_or_default();
        let p = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, p)
            .unwrap_or_default();
        let p = String::from_utf8(p).unwrap_or_default();
        if p.contains("\"NVIDIA-H200\"") {
            "NVIDIA-H200"
        } else if p.contains("\"RTX-4090\"") {
            "RTX-4090"
        } else {
            "none"
        }
    };
    let both = "NVIDIA-H200|RTX-4090";
    let r = w.pod("team-a", both, "1");
    assert_eq!(pinned(&r), "NVIDIA-H200", "own share of H200 first");
    let r = w.pod("team-a", both, "1");
    assert_eq!(
        pinned(&r),
        "RTX-4090",
        "own share of RTX before borrowing H200"
    );
    let r = w.pod("team-a", both, "1");
    assert_eq!(pinned(&r), "NVIDIA-H200", "then H200 by borrowing");
    w.admit("team-a", both, "1");
    // 3 of 3 H200 team-a may use, RTX full: nothing fits.
    assert!(w
        .refused("team-a", both, "1")
        .starts_with("queue team-a has insufficient NVIDIA-H200|RTX-4090 quota"));
}

#[test]
fn charges_go_to_leaves_and_a_closed_ancestor_refuses_below_it() {
    let mut w = World::org();
    assert_eq!(
        w.refused("org", "NVIDIA-H200", "1"),
        "queue org has child queues (team-a, team-b): submit card workloads to a leaf queue"
    );
    let mut closed = queue("org", "root", r#"{"NVIDIA-H200":8}"#, "");
    closed["status"]["state"] = json!("Closed");
    let (snap, _) = load(&yaml(&[
        closed,
        queue("team-a", "org", r#"{"NVIDIA-H200":4}"#, ""),
    ]))
    .unwrap();
    w.snap = snap;
    assert_eq!(
        w.refused("team-a", "NVIDIA-H200", "1"),
        "queue team-a is under queue org, which is Closed and admits no new card requests"
    );
}

#[test]
fn transparent_orphaned_and_broken_ancestors() {
    // mid has no card.quota: team's card parent is org.
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":2}"#, ""),
        queue("mid", "org", "", ""),
        queue("team", "mid", r#"{"NVIDIA-H200":4}"#, ""),
        queue(
            "orphan",
            "gone",
            r#"{"NVIDIA-H200":1}"#,
            r#"{"NVIDIA-H200":3}"#,
        ),
        queue("bad", "", r#"{"NVIDIA-H200":"#, ""),
        queue("under-bad", "bad", r#"{"NVIDIA-H200":1}"#, ""),
    ]);
    w.admit("team", "NVIDIA-H200", "2");
    assert_eq!(
        w.refused("team", "NVIDIA-H200", "1"),
        "queue team has insufficient NVIDIA-H200 quota in ancestor org: requested 1, org in use 2 (allocated 0, pending 2, reserved 0), quota 2"
    );
    // A missing parent: a top level, its own quota binds, no borrowing.
    w.admit("orphan", "NVIDIA-H200", "1");
    assert_eq!(
        w.refused("orphan", "NVIDIA-H200", "1"),
        "queue orphan has insufficient NVIDIA-H200 quota: requested 1, in use 1 (allocated 0, pending 1, reserved 0), quota 1 (its parent queue gone does not exist: nothing can be borrowed)"
    );
    assert!(w
        .refused("under-bad", "NVIDIA-H200", "1")
        .starts_with("queue under-bad is under queue bad, whose card quota does not parse: fix it (invalid volcano.sh/card.quota on queue bad"));
}

#[test]
fn a_cycle_already_stored_refuses_its_own_queues_only() {
    let mut w = World::with(&[
        queue("a", "b", r#"{"NVIDIA-H200":4}"#, ""),
        queue("b", "a", r#"{"NVIDIA-H200":4}"#, ""),
        queue("c", "", r#"{"NVIDIA-H200":4}"#, ""),
        queue("d", "a", r#"{"NVIDIA-H200":4}"#, ""),
    ]);
    w.admit("c", "NVIDIA-H200", "1");
    assert_eq!(
        w.refused("d", "NVIDIA-H200", "1"),
        "queue d is in a cycle of parents (a -> b -> a): set spec.parent of one of them to a queue outside it"
    );
}

#[test]
fn kubectl_apply_refuses_self_parents_cycles_depth_and_parents_with_pods() {
    let mut w = World::org();
    let r = w.apply_queue("CREATE", queue("x", "x", "", ""), None);
    assert_eq!(
        message(&r),
        "queue x cannot be its own parent (spec.parent: x)"
    );
    // org under its own child: Volcano's check reads the old object and misses it.
    let r = w.apply_queue(
        "UPDATE",
        queue("org", "team-a", r#"{"NVIDIA-H200":8}"#, ""),
        Some(queue("org", "root", r#"{"NVIDIA-H200":8}"#, "")),
    );
    assert_eq!(
        message(&r),
        "queue org cannot have parent team-a: team-a is below org, which would make a cycle (org -> team-a -> org)"
    );
    // Depth: org (1) > l2 > l3 > l4 > l5 fits; l6 does not.
    let mut parent = "team-a".to_string();
    for d in 3..=5 {
        let name = format!("l{d}");
        let r = w.apply_queue("CREATE", queue(&name, &parent, "", ""), None);
        assert!(r.allowed, "{}", message(&r));
        parent = name;
    }
    let r = w.apply_queue("CREATE", queue("l6", &parent, "", ""), None);
    assert_eq!(
        message(&r),
        "queue l6 under l5 would make the tree 6 levels deep below root; at most 5 (--max-queue-depth)"
    );
    // team-b has pods of its own: it cannot become a parent.
    w.admit("team-b", "NVIDIA-H200", "1");
    let r = w.apply_queue("CREATE", queue("sub", "team-b", "", ""), None);
    assert_eq!(
        message(&r),
        "queue team-b has card workloads of its own (1 cards in use): it cannot get child queue sub until they finish; submit card workloads to leaf queues"
    );
    let r = w.apply_queue(
        "CREATE",
        queue("y", "org", "", r#"{"NVIDIA-H200":-1}"#),
        None,
    );
    assert!(
        message(&r).starts_with("invalid volcano.sh/card.borrow on queue y:"),
        "{}",
        message(&r)
    );
}

#[test]
fn a_re_parent_is_refused_until_it_fits_then_usage_moves_and_pods_keep_their_stamp() {
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":3}"#, ""),
        queue("team-a", "org", r#"{"NVIDIA-H200":3}"#, ""),
        queue("solo", "", r#"{"NVIDIA-H200":2}"#, ""),
    ]);
    w.admit("team-a", "NVIDIA-H200", "2");
    w.admit("solo", "NVIDIA-H200", "2");
    let moved = queue("solo", "org", r#"{"NVIDIA-H200":2}"#, "");
    let old = queue("solo", "", r#"{"NVIDIA-H200":2}"#, "");
    let r = w.apply_queue("UPDATE", moved.clone(), Some(old.clone()));
    assert_eq!(
        message(&r),
        "queue solo cannot move under org: org would have 4 NVIDIA-H200 in use (2 there, 2 moving with solo), quota 3"
    );
    w.apply_queue(
        "UPDATE",
        queue("org", "", r#"{"NVIDIA-H200":4}"#, ""),
        Some(queue("org", "", r#"{"NVIDIA-H200":3}"#, "")),
    );
    let r = w.apply_queue("UPDATE", moved, Some(old));
    assert!(r.allowed, "{}", message(&r));
    // Usage moved with the queue: org is full.
    assert!(w
        .refused("team-a", "NVIDIA-H200", "1")
        .contains("in ancestor org"));
    assert_eq!(w.usage("solo", "NVIDIA-H200")["pending"], 2);
}

#[test]
fn shares_above_the_parent_a_child_above_its_parent_and_a_borrow_with_no_lender_warn() {
    let mut w = World::org();
    let r = w.apply_queue(
        "CREATE",
        queue("team-c", "org", r#"{"NVIDIA-H200":9}"#, ""),
        None,
    );
    assert!(r.allowed);
    assert_eq!(
        r.warnings,
        vec![
            "queue team-c: its quota for NVIDIA-H200 (9) is above its parent org's (8)".to_string(),
            "queue org: the shares of its children (team-a 4, team-b 2, team-c 9) add up to 15 NVIDIA-H200, above its quota 8: nothing can be borrowed there and shares are first come, first served".to_string(),
        ]
    );
    let r = w.apply_queue(
        "CREATE",
        queue("lone", "", r#"{"NVIDIA-H200":1}"#, r#"{"NVIDIA-H200":1}"#),
        None,
    );
    assert_eq!(
        r.warnings,
        vec!["queue lone: volcano.sh/card.borrow has no effect: no ancestor carries volcano.sh/card.quota to borrow from".to_string()]
    );
}

/// Two replicas, each with its own caches, admit borrowing pods into sibling leaves at
/// the same time. The charges of a tree share its top level's ledger, so the second
/// writer loses the compare-and-swap, reads the winner's ledger and decides again:
/// exactly the pool is lent, however the race goes.
#[test]
fn two_replicas_racing_for_the_last_pool_cards_lend_exactly_the_pool() {
    use card_quota::cards::QueueName;
    use card_quota::decide::batch::{decide_with_ledger, plan, Outcome};
    use card_quota::decide::review::{read_review, AdmissionRequest};
    use card_quota::ledger::ledger_record;

    let objects = yaml(&[
        queue("org", "", r#"{"NVIDIA-H200":8}"#, ""),
        queue(
            "team-a",
            "org",
            r#"{"NVIDIA-H200":4}"#,
            r#"{"NVIDIA-H200":4}"#,
        ),
        queue(
            "team-b",
            "org",
            r#"{"NVIDIA-H200":2}"#,
            r#"{"NVIDIA-H200":4}"#,
        ),
    ]);
    let cfg = Config::default();
    let now = jiff::Timestamp::now();
    let request = |name: &str, q: &str| -> AdmissionRequest {
        let doc = R::pod("CREATE", pod(name, q, "NVIDIA-H200", "1")).build();
        read_review(&serde_json::to_vec(&doc).unwrap())
            .unwrap()
            .unwrap()
    };
    let configmap = |q: &QueueName, rv: u64, text: &str| {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("card-quota-ledger.{q}"), "namespace": "card-quota", "resourceVersion": rv.to_string()},
            "data": {"queue": q.to_string(), "ledger": text}});
        ledger_record(&serde_json::from_value(cm).unwrap()).unwrap()
    };
    // Both teams at their shares already (in both caches): only the pool of 2 is left.
    let mut base = load(&objects).unwrap().0;
    for (i, q, n) in [(0, "team-a", "4"), (1, "team-b", "2")] {
        let doc = pod(&format!("s{i}"), q, "NVIDIA-H200", n);
        card_quota::snapshot::load::upsert(&mut base, &doc).unwrap();
    }
    let mut replicas = [base.clone(), base];
    let a: Vec<AdmissionRequest> = (0..10)
        .map(|i| request(&format!("a{i}"), "team-a"))
        .collect();
    let b: Vec<AdmissionRequest> = (0..10)
        .map(|i| request(&format!("b{i}"), "team-b"))
        .collect();
    // The preview names the tree's ledger for both teams.
    let key = |snap: &mut Snapshot, req: &AdmissionRequest| {
        let d = decide_with_ledger(snap, req, &cfg, now);
        snap.ledger_key(&d.charge.expect("a charge").queue)
    };
    let keys = [key(&mut replicas[0], &a[0]), key(&mut replicas[1], &b[0])];
    // The API server's ledgers: name -> (resourceVersion, text).
    let mut store: BTreeMap<QueueName, (u64, String)> = BTreeMap::new();
    let mut admitted = 0;
    // Both plan on the same (empty) ledger; replica 0 writes first, replica 1 loses.
    let batches: Vec<_> = [(0, &a), (1, &b)]
        .into_iter()
        .map(|(r, reqs)| {
            let refs: Vec<&AdmissionRequest> = reqs.iter().collect();
            (
                r,
                plan(
                    &mut replicas[r],
                    &keys[r],
                    &refs,
                    &cfg,
                    now,
                    |_, _| std::time::Duration::ZERO,
                    None,
                ),
            )
        })
        .collect();
    for (r, mut batch) in batches {
        let reqs: Vec<&AdmissionRequest> = if r == 0 {
            a.iter().collect()
        } else {
            b.iter().collect()
        };
        let k = &keys[r];
        loop {
            let current = store.get(k).map(|(rv, _)| rv.to_string());
            if current == batch.resource_version {
                let rv = store.get(k).map_or(1, |(rv, _)| rv + 1);
                store.insert(k.clone(), (rv, batch.text.clone()));
                replicas[r].upsert_ledger(configmap(k, rv, &batch.text));
                admitted += batch
                    .outcomes
                    .iter()
                    .filter(|o| matches!(o, Outcome::Admit(_)))
                    .count();
                break;
            }
            // Lost the race: read the winner's ledger and decide again.
            let (rv, text) = store[k].clone();
            replicas[r].upsert_ledger(configmap(k, rv, &text));
            batch = plan(
                &mut replicas[r],
                k,
                &reqs,
                &cfg,
                now,
                |_, _| std::time::Duration::ZERO,
                None,
            );
        }
    }
    assert_eq!(admitted, 2, "the pool of 2 lent exactly once");
    assert_eq!(keys, [QueueName::new("org"), QueueName::new("org")]);
}

#[test]
fn usage_is_written_on_every_level_with_what_is_borrowed_and_lent() {
    use card_quota::cards::QueueName;
    use card_quota::controller::plan::{queue_rows, queue_state, usage_text};
    let mut w = World::org();
    w.admit("team-a", "NVIDIA-H200", "5");
    w.admit("team-b", "NVIDIA-H200", "1");
    let now = jiff::Timestamp::now();
    let text = |q: &str| {
        let rows = queue_rows(&w.snap, &QueueName::new(q), now);
        let t = usage_text(&rows, now);
        t[..t.find(",\"observedAt\"").unwrap()].to_string()
    };
    assert_eq!(
        text("org"),
        r#"{"NVIDIA-H200":{"quota":8,"allocated":0,"pending":6,"reserved":0,"shares":6,"free":1}"#
    );
    assert_eq!(
        text("team-a"),
        r#"{"NVIDIA-H200":{"quota":4,"allocated":0,"pending":5,"reserved":0,"borrow":2,"borrowed":1}"#
    );
    assert_eq!(
        text("team-b"),
        r#"{"NVIDIA-H200":{"quota":2,"allocated":0,"pending":1,"reserved":0,"borrow":2,"borrowed":0}"#
    );
    // A flat queue's usage is written as it always was.
    let mut flat = World::with(&[queue(
        "solo",
        "",
        r#"{"NVIDIA-H200":2}"#,
        r#"{"NVIDIA-H200":1}"#,
    )]);
    flat.admit("solo", "NVIDIA-H200", "1");
    let rows = queue_rows(&flat.snap, &QueueName::new("solo"), now);
    let t = usage_text(&rows, now);
    assert!(
        t.starts_with(
            r#"{"NVIDIA-H200":{"quota":2,"allocated":0,"pending":1,"reserved":0},"observedAt""#
        ),
        "{t}"
    );
    // Over-subscription and a missing parent are reported on the queue.
    let w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":2}"#, ""),
        queue("a", "org", r#"{"NVIDIA-H200":2}"#, ""),
        queue("b", "org", r#"{"NVIDIA-H200":1}"#, ""),
        queue("lost", "gone", r#"{"NVIDIA-H200":1}"#, ""),
    ]);
    assert_eq!(
        queue_state(&w.snap, &QueueName::new("org"), now).tree.as_deref(),
        Some("the shares of queue org's children over-subscribe it (NVIDIA-H200 shares 3 > quota 2): nothing can be borrowed there and shares are first come, first served")
    );
    assert_eq!(
        queue_state(&w.snap, &QueueName::new("lost"), now).tree.as_deref(),
        Some("queue lost's parent queue gone does not exist: lost is a top level, its own quota binds and nothing can be borrowed")
    );
    assert_eq!(queue_state(&w.snap, &QueueName::new("a"), now).tree, None);
}

#[test]
fn status_prints_the_tree() {
    let mut w = World::org();
    w.admit("team-a", "NVIDIA-H200", "5");
    let out = card_quota::cli::status::render(
        &w.snap,
        &card_quota::cli::status::Scope::default(),
        card_quota::cli::status::Install::default(),
        card_quota::cli::status::Format::Table,
        jiff::Timestamp::now(),
    )
    .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[1].starts_with("org "), "{out}");
    assert!(
        lines[1].ends_with("subtree; children's shares 6; subtree may take 1 more"),
        "{out}"
    );
    assert!(lines[2].starts_with("  team-a "), "{out}");
    assert!(
        lines[2].contains(" 1     0     borrow 2, borrowed 1"),
        "{out}"
    );
    assert!(lines[3].starts_with("  team-b "), "{out}");
}

#[test]
fn root_with_a_card_quota_is_a_cluster_budget_over_every_top_queue() {
    let mut w = World::with(&[
        queue("a", "root", r#"{"NVIDIA-H200":4}"#, ""),
        queue("b", "", r#"{"NVIDIA-H200":4}"#, ""),
    ]);
    assert!(w.snap.is_flat(), "an unannotated root is transparent");
    w.admit("a", "NVIDIA-H200", "3");
    // An admin makes root a budget of 5: a and b (under root, written or not) share it.
    let r = w.apply_queue(
        "UPDATE",
        queue("root", "", r#"{"NVIDIA-H200":5}"#, ""),
        Some(queue("root", "", "", "")),
    );
    assert!(r.allowed, "{}", message(&r));
    assert!(
        r.warnings
            .iter()
            .any(|x| x.contains("the shares of its children (a 4, b 4) add up to 8")),
        "{:?}",
        r.warnings
    );
    w.admit("b", "NVIDIA-H200", "2");
    assert_eq!(
        w.refused("b", "NVIDIA-H200", "1"),
        "queue b has insufficient NVIDIA-H200 quota in ancestor root: requested 1, root in use 5 (allocated 0, pending 5, reserved 0), quota 5"
    );
    // Taken off again: flat, b gets its own 4.
    w.apply_queue(
        "UPDATE",
        queue("root", "", "", ""),
        Some(queue("root", "", r#"{"NVIDIA-H200":5}"#, "")),
    );
    assert!(w.snap.is_flat());
    w.admit("b", "NVIDIA-H200", "2");
}

#[test]
fn a_job_in_a_team_waits_at_its_enqueue_until_the_org_has_room() {
    let mut w = World::org();
    let enqueue = |w: &mut World, waiting: &Value| w.enqueue(waiting);
    w.admit("team-b", "NVIDIA-H200", "2");
    w.admit("team-a", "NVIDIA-H200", "4");
    // A Job of 6 in team-a could run one day only by borrowing: it is created and waits.
    let six = pg("six", "team-a", r#"{"NVIDIA-H200":6}"#);
    let r = w.send(R::podgroup("CREATE", six).build());
    assert!(r.allowed, "{}", message(&r));
    // A Job of 9 could never run under the org's 8: refused at once, with the org named.
    let r = w.send(R::podgroup("CREATE", pg("nine", "team-a", r#"{"NVIDIA-H200":9}"#)).build());
    assert!(!r.allowed);
    assert!(
        message(&r).starts_with("queue team-a has insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
    // team-a's Job of 3 would borrow 3 from a pool of 2: it waits, reserving nothing.
    let big = pg("big", "team-a", r#"{"NVIDIA-H200":3}"#);
    assert!(w.send(R::podgroup("CREATE", big.clone()).build()).allowed);
    let r = enqueue(&mut w, &big);
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue team-a has insufficient NVIDIA-H200 quota: requested 3, in use 4 (allocated 0, pending 4, reserved 0), quota 4 + borrow 2"
    );
    // A Job of 2 borrows the pool: enqueued, reserving 2 in team-a and in org's sums.
    let two = pg("two", "team-a", r#"{"NVIDIA-H200":2}"#);
    assert!(w.send(R::podgroup("CREATE", two.clone()).build()).allowed);
    let r = enqueue(&mut w, &two);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("org", "NVIDIA-H200")["reserved"], 2);
    // team-b's Job of 1 would borrow from the empty pool: held with the pool's numbers.
    let one = pg("one", "team-b", r#"{"NVIDIA-H200":1}"#);
    assert!(w.send(R::podgroup("CREATE", one.clone()).build()).allowed);
    let r = enqueue(&mut w, &one);
    assert_eq!(
        message(&r),
        "queue team-b cannot borrow NVIDIA-H200 from org: requested 1, org free 0 (quota 8, shares 6, borrowed 2)"
    );
}

#[test]
fn a_job_that_may_use_several_models_fits_every_level_at_once() {
    // team takes RTX only from its own share, org gives H200 only: each level alone
    // could hold 3 cards of "either", together they hold 1.
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":0,"RTX-4090":3}"#, ""),
        queue("team", "org", r#"{"NVIDIA-H200":3,"RTX-4090":1}"#, ""),
    ]);
    let pg = |name: &str, request: &str| {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                "annotations": {"volcano.sh/card.request": request}},
            "spec": {"queue": "team", "minMember": 1}, "status": {"phase": "Inqueue"}})
    };
    let r = w.send(R::podgroup("CREATE", pg("three", r#"{"NVIDIA-H200|RTX-4090":3}"#)).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue team has insufficient NVIDIA-H200|RTX-4090 quota in ancestor org: requested 3, org in use 0 (allocated 0, pending 0, reserved 0), quota 3"
    );
    let r = w.send(R::podgroup("CREATE", pg("one", r#"{"NVIDIA-H200|RTX-4090":1}"#)).build());
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("org", "NVIDIA-H200|RTX-4090")["reserved"], 1);
}

/// Issue 47: the FREE column said 2 right after a refusal of 1 (the parent's pool
/// empty). It is now what a request would be admitted: `room` cards of the model fit,
/// one more does not.
#[test]
fn free_is_what_would_be_admitted_now() {
    use card_quota::admission::rooms;
    use card_quota::ledger::UsageKey;

    let mut w = World::org();
    w.admit("team-a", "NVIDIA-H200", "6");
    w.admit("team-b", "NVIDIA-H200", "1");
    let now = jiff::Timestamp::now();
    let report = usage_report(&w.snap, now);
    let rooms = rooms(&w.snap, &report, now);
    let key = |q: &str| {
        (
            q.to_string(),
            UsageKey::Model(card_quota::cards::CardName::parse("NVIDIA-H200").unwrap()),
        )
    };
    // team-b: quota 2 + borrow 2, 1 in use, but org's pool went to team-a: 1 left.
    assert_eq!(report["team-b"][&key("team-b").1].free(), 3);
    assert_eq!(rooms[&key("team-b")].get(), 1);
    assert_eq!(rooms[&key("team-a")].get(), 0);
    assert!(
        !rooms.contains_key(&key("org")),
        "charges go to leaves only"
    );
    let mut probe = World::org();
    probe.admit("team-a", "NVIDIA-H200", "6");
    probe.admit("team-b", "NVIDIA-H200", "1");
    probe.refused("team-b", "NVIDIA-H200", "2");
    probe.admit("team-b", "NVIDIA-H200", "1");
}

/// Issue 46 #9: a job's `A|B` cards counted all on A for the tree's effective use, so a
/// job was held borrowing A from a full parent while B had room in its queue's own
/// share (the same pods one by one were admitted on B). They now count on each model
/// in order up to the queue's share, as its pods would be placed.
#[test]
fn a_job_that_may_use_several_models_takes_each_share_before_borrowing() {
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":3,"RTX-4090":4}"#, ""),
        queue(
            "team-a",
            "org",
            r#"{"NVIDIA-H200":1,"RTX-4090":2}"#,
            r#"{"NVIDIA-H200":1}"#,
        ),
        queue(
            "team-b",
            "org",
            r#"{"NVIDIA-H200":1}"#,
            r#"{"NVIDIA-H200":1}"#,
        ),
    ]);
    let pg = |name: &str, request: &str| pg(name, "team-a", request);
    let enqueue = |w: &mut World, waiting: &Value| w.enqueue(waiting);
    // team-b takes its H200 share and org's whole H200 pool.
    w.admit("team-b", "NVIDIA-H200", "1");
    w.admit("team-b", "NVIDIA-H200", "1");
    let both = "NVIDIA-H200|RTX-4090";
    // 1 H200 and 2 RTX fit team-a's own shares: enqueued.
    let three = pg("three", &format!(r#"{{"{both}":3}}"#));
    assert!(w.send(R::podgroup("CREATE", three.clone()).build()).allowed);
    let r = enqueue(&mut w, &three);
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(w.usage("team-a", both)["reserved"], 3);
    // One more could only borrow H200 (team-a borrows no RTX), and org's pool is empty.
    let one = pg("one", &format!(r#"{{"{both}":1}}"#));
    assert!(w.send(R::podgroup("CREATE", one.clone()).build()).allowed);
    let r = enqueue(&mut w, &one);
    assert_eq!(
        message(&r),
        "queue team-a cannot borrow NVIDIA-H200 from org: requested 1, org free 0 (quota 3, shares 2, borrowed 1)"
    );
}

#[test]
fn a_job_larger_than_an_ancestors_cap_is_refused_at_its_creation() {
    let mut w = World::with(&[
        queue("org", "", r#"{"NVIDIA-H200":3}"#, ""),
        queue("team", "org", r#"{"NVIDIA-H200":4}"#, ""),
    ]);
    let pg = |name: &str, request: &str| {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                "annotations": {"volcano.sh/card.request": request}},
            "spec": {"queue": "team", "minMember": 1}, "status": {}})
    };
    let r = w.send(R::podgroup("CREATE", pg("four", r#"{"NVIDIA-H200":4}"#)).build());
    assert_eq!(
        message(&r),
        "queue team has insufficient NVIDIA-H200 quota in ancestor org: requested 4, org in use 0 (allocated 0, pending 0, reserved 0), quota 3"
    );
    assert!(
        w.send(R::podgroup("CREATE", pg("three", r#"{"NVIDIA-H200":3}"#)).build())
            .allowed
    );
}

/// Issue 46 #3: charges in flight in a queue's ledger (admitted, in no cache yet) were
/// read by nobody once the tree changed under them: a root given a card budget, or the
/// queue moved under a card parent, sends its charges to another ledger. 8 pods got
/// into a queue of 4. The old ledger's charges now count in the new tree's decisions.
#[test]
fn charges_in_flight_count_across_a_change_of_the_tree() {
    use card_quota::cards::QueueName;
    use card_quota::decide::batch::{behind, decide_with_ledger, plan, Outcome};
    use card_quota::decide::review::{read_review, AdmissionRequest};
    use card_quota::ledger::ledger_record;

    let request = |name: &str| -> AdmissionRequest {
        let doc = R::pod("CREATE", pod(name, "q1", "NVIDIA-H200", "1")).build();
        read_review(&serde_json::to_vec(&doc).unwrap())
            .unwrap()
            .unwrap()
    };
    let cfg = Config::default();
    let now = jiff::Timestamp::now();
    for change in [
        queue("root", "", r#"{"NVIDIA-H200":100}"#, ""),
        queue("q1", "org", r#"{"NVIDIA-H200":4}"#, ""),
    ] {
        let mut snap = load(&yaml(&[
            queue("q1", "", r#"{"NVIDIA-H200":4}"#, ""),
            queue("org", "", r#"{"NVIDIA-H200":100}"#, ""),
        ]))
        .unwrap()
        .0;
        let q1 = QueueName::new("q1");
        assert_eq!(snap.ledger_key(&q1), q1);
        let reqs: Vec<AdmissionRequest> = (0..4).map(|i| request(&format!("p{i}"))).collect();
        let refs: Vec<&AdmissionRequest> = reqs.iter().collect();
        let batch = plan(
            &mut snap,
            &q1,
            &refs,
            &cfg,
            now,
            |_, _| Duration::ZERO,
            None,
        );
        assert!(batch
            .outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Admit(_))));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "card-quota-ledger.q1", "namespace": "card-quota", "resourceVersion": "7"},
            "data": {"queue": "q1", "ledger": batch.text}});
        snap.upsert_ledger(ledger_record(&serde_json::from_value(cm).unwrap()).unwrap());
        // The tree changes; the 4 pods are still in no cache.
        card_quota::snapshot::load::upsert(&mut snap, &change).unwrap();
        assert_ne!(snap.ledger_key(&q1), q1, "{change}");
        let d = decide_with_ledger(&mut snap, &request("p9"), &cfg, now);
        assert!(!d.allowed, "admitted past 4 in flight after {change}");
        let msg = d.message.clone().unwrap_or_default();
        assert!(msg.contains("requested 1, in use 4"), "{msg}");
        let key = snap.ledger_key(&q1);
        let batch = plan(
            &mut snap,
            &key,
            &[&request("p9")],
            &cfg,
            now,
            |_, _| Duration::ZERO,
            None,
        );
        assert!(
            matches!(batch.outcomes[0], Outcome::Answer(_)),
            "the batch refuses too"
        );
        assert!(behind(&snap, &key).is_none());
    }
}

/// Issue 46 #3, second half: a replica whose Queue watch has not shown a change of the
/// tree keeps charging the queue's old ledger while a replica that has seen it charges
/// the new one, and two ledgers share no compare-and-swap (5 pods in a queue of 4
/// below). The Queue hook now seals the queue in the old ledger before the change is
/// stored: the lagging replica's write there conflicts, and read again, the seal
/// answers "try again" until its cache shows the change, or a read of the Queue 60 s
/// later shows that the change never landed.
#[test]
fn a_replica_behind_a_change_of_the_tree_cannot_charge_the_old_ledger() {
    use card_quota::cards::QueueName;
    use card_quota::decide::batch::{plan, Outcome};
    use card_quota::decide::review::{read_review, AdmissionRequest};
    use card_quota::decide::seal::seals_for;
    use card_quota::ledger::ledger_record;

    let review = |doc: Value| -> AdmissionRequest {
        read_review(&serde_json::to_vec(&doc).unwrap())
            .unwrap()
            .unwrap()
    };
    let request =
        |name: &str| review(R::pod("CREATE", pod(name, "q1", "NVIDIA-H200", "1")).build());
    let versioned = |mut q: Value, rv: &str| {
        q["metadata"]["resourceVersion"] = json!(rv);
        q
    };
    let flat = versioned(queue("q1", "", r#"{"NVIDIA-H200":4}"#, ""), "10");
    let moved = versioned(queue("q1", "org", r#"{"NVIDIA-H200":4}"#, ""), "11");
    let queues = [flat.clone(), queue("org", "", r#"{"NVIDIA-H200":100}"#, "")];
    let cfg = Config::default();
    let t0 = jiff::Timestamp::now();
    let q1 = QueueName::new("q1");
    let org = QueueName::new("org");
    let store = |snap: &mut Snapshot, key: &QueueName, rv: &str, text: &str| {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("card-quota-ledger.{key}"), "namespace": "card-quota", "resourceVersion": rv},
            "data": {"queue": key.to_string(), "ledger": text}});
        snap.upsert_ledger(ledger_record(&serde_json::from_value(cm).unwrap()).unwrap());
    };
    let admitted = |b: &card_quota::decide::batch::Batch| {
        b.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Admit(_)))
            .count()
    };
    // The hook of the move (old object at resourceVersion 10) seals q1 in its own ledger,
    // and the tree it moves into at its root (org's limits, for org's other charges).
    let hook_view = load(&yaml(&queues)).unwrap().0;
    let seals = seals_for(
        &hook_view,
        &review(R::queue("UPDATE", moved.clone()).old(flat.clone()).build()),
        t0,
    );
    assert_eq!(
        seals.keys().collect::<Vec<_>>(),
        vec![&org, &q1],
        "{seals:?}"
    );
    let into: Vec<_> = seals[&org]
        .iter()
        .map(|(q, s)| (q, s.by.as_str(), s.version, s.cause))
        .collect();
    assert_eq!(
        into,
        vec![(&org, "q1", 10, card_quota::ledger::seal::SealCause::Limits)]
    );
    let mut sealed = hook_view.ledger(&q1).ledger.clone();
    for (q, s) in &seals[&q1] {
        assert_eq!((q, s.by.as_str(), s.version), (&q1, "q1", 10));
        sealed.seal(q, s.clone());
    }
    // A replica that has seen the move fills q1 in org's ledger.
    let mut r1 = load(&yaml(&queues)).unwrap().0;
    card_quota::snapshot::load::upsert(&mut r1, &moved).unwrap();
    let four: Vec<AdmissionRequest> = (0..4).map(|i| request(&format!("a{i}"))).collect();
    let b = plan(
        &mut r1,
        &org,
        &four.iter().collect::<Vec<_>>(),
        &cfg,
        t0,
        |_, _| Duration::ZERO,
        None,
    );
    assert_eq!(admitted(&b), 4);
    // The lagging replica still sees q1 flat. Without the seal it admits a fifth.
    let mut r2 = load(&yaml(&queues)).unwrap().0;
    let fifth = request("b0");
    let b = plan(
        &mut r2,
        &q1,
        &[&fifth],
        &cfg,
        t0,
        |_, _| Duration::ZERO,
        None,
    );
    assert_eq!(admitted(&b), 1, "the race this test is about");
    // Its write conflicts with the seal; read again, the seal answers "try again".
    store(&mut r2, &q1, "2", &sealed.render());
    // The writer notes when it first saw the seal (its own clock lifts it).
    card_quota::decide::seal::note_seals(&mut r2, &q1, t0);
    let b = plan(
        &mut r2,
        &q1,
        &[&fifth],
        &cfg,
        t0,
        |_, _| Duration::ZERO,
        None,
    );
    assert_eq!(admitted(&b), 0);
    let Outcome::Answer(d) = &b.outcomes[0] else {
        panic!("{:?}", b.outcomes[0])
    };
    assert_eq!(
        d.message.as_deref(),
        Some("queue q1's charges are moving to another ledger (queue q1 changed the queue tree) and card-quota has not seen the change yet; try again")
    );
    // A read of the Queue before the lift time, or one that shows the change, lifts nothing.
    let later = t0 + jiff::SignedDuration::from_secs(61);
    r2.confirm_queue(&q1, Some(10), t0 + jiff::SignedDuration::from_secs(30));
    assert_eq!(
        admitted(&plan(
            &mut r2,
            &q1,
            &[&fifth],
            &cfg,
            later,
            |_, _| Duration::ZERO,
            None
        )),
        0
    );
    r2.confirm_queue(&q1, Some(11), later);
    assert_eq!(
        admitted(&plan(
            &mut r2,
            &q1,
            &[&fifth],
            &cfg,
            later,
            |_, _| Duration::ZERO,
            None
        )),
        0
    );
    // Once its cache shows the move, it charges org's ledger like everyone else.
    let mut caught_up = r2.clone();
    card_quota::snapshot::load::upsert(&mut caught_up, &moved).unwrap();
    assert_eq!(caught_up.ledger_key(&q1), org);
    // A move that never landed (refused by another webhook): a read 60 s after the
    // seal still shows the old version, and q1 charges its own ledger again.
    r2.confirm_queue(&q1, Some(10), later);
    assert_eq!(
        admitted(&plan(
            &mut r2,
            &q1,
            &[&fifth],
            &cfg,
            later,
            |_, _| Duration::ZERO,
            None
        )),
        1
    );
}

/// Issue 46 #10 (suspected, confirmed): a re-parent was checked against the caches
/// alone, so pods admitted a moment before (in the queue's ledger, in no cache yet)
/// moved under a parent without room. The check now counts every ledger's charges.
#[test]
fn a_re_parent_counts_charges_in_flight() {
    use card_quota::cards::QueueName;
    use card_quota::decide::batch::{decide_with_ledger, plan};
    use card_quota::decide::review::read_review;
    use card_quota::ledger::ledger_record;

    let mut snap = load(&yaml(&[
        queue("org", "", r#"{"NVIDIA-H200":3}"#, ""),
        queue("team-a", "org", r#"{"NVIDIA-H200":3}"#, ""),
        queue("solo", "", r#"{"NVIDIA-H200":2}"#, ""),
    ]))
    .unwrap()
    .0;
    let cfg = Config::default();
    let now = jiff::Timestamp::now();
    let reqs: Vec<_> = ["t1", "t2", "s1", "s2"]
        .iter()
        .map(|n| {
            let q = if n.starts_with('t') { "team-a" } else { "solo" };
            let doc = R::pod("CREATE", pod(n, q, "NVIDIA-H200", "1")).build();
            read_review(&serde_json::to_vec(&doc).unwrap())
                .unwrap()
                .unwrap()
        })
        .collect();
    // Admitted and recorded, in no cache yet: team-a's 2 in org's ledger, solo's 2 in its own.
    for (key, range) in [("org", 0..2), ("solo", 2..4)] {
        let key = QueueName::new(key);
        let refs: Vec<_> = reqs[range].iter().collect();
        let batch = plan(
            &mut snap,
            &key,
            &refs,
            &cfg,
            now,
            |_, _| Duration::ZERO,
            None,
        );
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("card-quota-ledger.{key}"), "namespace": "card-quota", "resourceVersion": "3"},
            "data": {"queue": key.to_string(), "ledger": batch.text}});
        snap.upsert_ledger(ledger_record(&serde_json::from_value(cm).unwrap()).unwrap());
    }
    let moved = queue("solo", "org", r#"{"NVIDIA-H200":2}"#, "");
    let old = queue("solo", "", r#"{"NVIDIA-H200":2}"#, "");
    let doc = R::queue("UPDATE", moved).old(old).build();
    let req = read_review(&serde_json::to_vec(&doc).unwrap())
        .unwrap()
        .unwrap();
    let d = decide_with_ledger(&mut snap, &req, &cfg, now);
    assert!(!d.allowed, "moved 2 in flight under a parent with 1 free");
    assert_eq!(
        d.message.as_deref(),
        Some("queue solo cannot move under org: org would have 4 NVIDIA-H200 in use (2 there, 2 moving with solo), quota 3")
    );
}

/// Issue 46 #10: the exact search of a level above the leaf sums the pending pods of
/// every queue below it, so pods one team made hard to place (unpinned, many cards,
/// eight models each) ran it out of budget, and a sibling's one-card pod within its
/// share was refused. A level now takes the relaxation (which the search only runs
/// after) when its search is undecided; each leaf's own check stays exact.
#[test]
fn a_teams_hard_to_place_pods_cannot_refuse_a_siblings_pod_within_its_share() {
    let models: Vec<String> = (0..8).map(|i| format!("M{i}")).collect();
    let quota = |n: u32| {
        let q: serde_json::Map<String, Value> =
            models.iter().map(|m| (m.clone(), json!(n))).collect();
        Value::Object(q).to_string()
    };
    // team-a's share is the whole org (shares over-subscribe it by team-b's 2: a warning).
    let mut w = World::with(&[
        queue("org", "", &quota(50), ""),
        queue("team-a", "org", &quota(50), ""),
        queue("team-b", "org", &quota(2), ""),
    ]);
    // Pending pods of team-a that any of the eight models may take, 398 cards in sizes
    // a random fill admitted one by one (each time the queue stayed feasible).
    for m in &models {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{m}"), "labels": {"nvidia.com/gpu.product": m}},
            "status": {"allocatable": {"nvidia.com/gpu": "64"}}});
        card_quota::snapshot::load::upsert(&mut w.snap, &node).unwrap();
    }
    let all = models.join("|");
    let sizes = [
        36, 39, 33, 37, 38, 13, 25, 12, 29, 6, 5, 15, 3, 37, 15, 13, 18, 8, 9, 7,
    ];
    for (i, n) in sizes.iter().enumerate() {
        let p = pod(&format!("a{i}"), "team-a", &all, &n.to_string());
        card_quota::snapshot::load::upsert(&mut w.snap, &p).unwrap();
    }
    let r = w.pod("team-b", "M0", "1");
    assert!(r.allowed, "team-b's pod within its share: {}", message(&r));
    // team-b's own quota still holds exactly.
    w.admit("team-b", "M0", "1");
    assert!(w
        .refused("team-b", "M0", "1")
        .starts_with("queue team-b has insufficient M0 quota"));
}

/// Issue 57 #5: a plain GPU pod of a leaf in warn whose quota names no model of its
/// resource, under a parent in deny: warn would admit it unpinned, charging nothing, and
/// the parent's deny cap was never consulted (it could bind on the parent's full H200).
/// A queue in deny is never exceeded, whoever charges it: refused.
#[test]
fn a_plain_pod_of_a_warn_leaf_under_a_deny_parent_is_checked_against_the_parent() {
    let mut org = queue("org", "root", r#"{"NVIDIA-H200":2}"#, "");
    org["metadata"]["annotations"]["volcano.sh/card.enforcement"] = json!("deny");
    let mut leaf = queue("team-a", "org", r#"{"NVIDIA-H200":2}"#, "");
    leaf["metadata"]["annotations"]["volcano.sh/card.enforcement"] = json!("warn");
    let mut other = queue("team-b", "org", r#"{"RTX-4090":1}"#, "");
    other["metadata"]["annotations"]["volcano.sh/card.enforcement"] = json!("warn");
    let mut w = World::with(&[org, leaf, other]);
    w.admit("team-a", "NVIDIA-H200", "2");
    let plain = support::pod("plain-b")
        .queue("team-b")
        .scheduler("volcano")
        .gpus("1")
        .build();
    let r = w.send(R::pod("CREATE", plain).build());
    assert!(
        !r.allowed,
        "admitted unpinned under org's deny: {:?}",
        r.warnings
    );
    assert!(
        message(&r).contains("queue team-b has no quota for any nvidia.com/gpu model"),
        "{}",
        message(&r)
    );
    // Without a deny level above, warn admits it (with the warning), as before.
    let mut flat = queue("solo", "", r#"{"RTX-4090":1}"#, "");
    flat["metadata"]["annotations"]["volcano.sh/card.enforcement"] = json!("warn");
    let mut w = World::with(&[flat]);
    let plain = support::pod("plain")
        .queue("solo")
        .scheduler("volcano")
        .resource("nvidia.com/mig-1g.18gb", "1")
        .build();
    let r = w.send(R::pod("CREATE", plain).build());
    assert!(r.allowed, "{}", message(&r));
    assert!(!r.warnings.is_empty());
}

/// A binding card-quota recorded whose answer was lost, retried after an ancestor's
/// cap was cut below what its subtree has bound: for the API server the first never
/// happened, so the retry is where the card is bound, and no binding puts a level's
/// bound cards past its cap. The retry was held to the queue's own quota only.
#[test]
fn a_retried_binding_is_held_to_an_ancestors_cap_cut_since_it_was_recorded() {
    use card_quota::decide::batch::{decide_with_ledger, plan, Outcome};
    use card_quota::decide::review::read_review;
    use card_quota::ledger::LedgerRecord;
    let mut w = World::org();
    w.admit("team-a", "NVIDIA-H200", "1");
    let now = jiff::Timestamp::now();
    let doc = R::binding("ml", "p1", "h200-1").build();
    let bind = read_review(doc.to_string().as_bytes()).unwrap().unwrap();
    let key = w
        .snap
        .ledger_key(&card_quota::cards::QueueName::new("team-a"));
    let b = plan(
        &mut w.snap,
        &key,
        &[&bind],
        &w.cfg,
        now,
        |_, _| std::time::Duration::ZERO,
        None,
    );
    assert!(
        matches!(&b.outcomes[0], Outcome::Admit(_)),
        "{:?}",
        b.outcomes[0]
    );
    // Recorded; the answer lost.
    w.snap.upsert_ledger(LedgerRecord {
        queue: key.clone(),
        resource_version: Some("1".into()),
        ledger: b.ledger,
        problem: None,
    });
    // The pod watch behind (a restarted replica): the cache does not show p1.
    card_quota::snapshot::load::remove(&mut w.snap, "Pod", "ml", "p1");
    // Retried before any cut: the same charge.
    let d = decide_with_ledger(&mut w.snap, &bind, &w.cfg, now);
    assert!(d.allowed && d.charge.is_some(), "{:?}", d.message);
    w.apply_queue(
        "UPDATE",
        queue("org", "root", r#"{"NVIDIA-H200":0}"#, ""),
        Some(queue("org", "root", r#"{"NVIDIA-H200":8}"#, "")),
    );
    let r = decide_with_ledger(&mut w.snap, &bind, &w.cfg, now);
    assert!(!r.allowed, "a retried binding past org's cut was admitted");
    assert_eq!(
        r.message.as_deref().unwrap_or_default(),
        "queue org has 1 NVIDIA-H200 cards bound in its subtree, past its quota of 0 (lowered since pod ml/p1 was admitted for 1 of them); its binding waits for room: try again later"
    );
    // A group cap of org's cut the same way.
    w.apply_queue(
        "UPDATE",
        queue("org", "root", r#"{"NVIDIA-H200":8,"NVIDIA-*":0}"#, ""),
        Some(queue("org", "root", r#"{"NVIDIA-H200":0}"#, "")),
    );
    let r = decide_with_ledger(&mut w.snap, &bind, &w.cfg, now);
    assert_eq!(
        r.message.as_deref().unwrap_or_default(),
        "queue org has 1 NVIDIA-* cards bound in its subtree, past its group cap of 0 (lowered since pod ml/p1 was admitted for 1 of them); its binding waits for room: try again later"
    );
}
