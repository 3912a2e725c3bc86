//! Group caps (`"*":16`, `"NVIDIA-*":4`): quota keys ending in `*` cap the sum over the
//! models they match, in every decision (docs/annotations.md, "Group caps"), through the
//! same AdmissionReview path the webhook and replay use.

mod support;

use base64::Engine;
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
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: a100-1, labels: {nvidia.com/gpu.product: NVIDIA-A100}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: l40s-1, labels: {nvidia.com/gpu.product: NVIDIA-L40S}}
status: {allocatable: {nvidia.com/gpu: "8"}}
"#;

fn queue(name: &str, quota: &str) -> String {
    format!(
        "---\napiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {{name: {name}, annotations: {{volcano.sh/card.quota: '{quota}'}}}}\nstatus: {{state: Open}}\n"
    )
}

struct World {
    snap: Snapshot,
    cfg: Config,
}

impl World {
    fn with(queues: &[(&str, &str)]) -> Self {
        Self::with_yaml(queues, "")
    }
    fn with_yaml(queues: &[(&str, &str)], extra: &str) -> Self {
        let yaml = queues
            .iter()
            .fold(NODES.to_string(), |y, (n, q)| y + &queue(n, q))
            + extra;
        let (snap, skipped) = load(&yaml).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
        }
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
    fn usage(&self, queue: &str, key: &str) -> Value {
        serde_json::to_value(usage_report(&self.snap, jiff::Timestamp::now()))
            .unwrap()
            .pointer(&format!("/{queue}/{}", key.replace('/', "~1")))
            .cloned()
            .unwrap_or(Value::Null)
    }
}

fn pod(name: &str, queue: &str, card: Option<&str>, gpus: &str) -> Value {
    let b = support::pod(name)
        .queue(queue)
        .scheduler("volcano")
        .resource("nvidia.com/gpu", gpus);
    match card {
        Some(c) => b.card(c),
        None => b,
    }
    .build()
}

fn message(r: &AdmissionResponse) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

/// The model a pod was pinned to (its nodeSelector's product label).
fn pin(r: &AdmissionResponse, pod: &Value) -> Value {
    let mut p = pod.clone();
    if let Some(b64) = &r.patch {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let ops: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut p, &ops).unwrap();
    }
    p["spec"]["nodeSelector"]["nvidia.com/gpu.product"].clone()
}

fn waiting_pg(name: &str, queue: &str, request: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "annotations": {"volcano.sh/card.request": request}},
        "spec": {"queue": queue, "minMember": 1}, "status": {}})
}

fn enqueue(w: &mut World, waiting: &Value) -> AdmissionResponse {
    let mut next = waiting.clone();
    next["status"] = json!({"phase": "Inqueue"});
    w.send(R::podgroup("UPDATE", next).old(waiting.clone()).build())
}

#[test]
fn plain_pods_stop_at_the_star_cap_with_room_left_on_each_model() {
    // 3 + 3 + 3 per model, 5 in all.
    let mut w = World::with(&[(
        "q",
        r#"{"NVIDIA-H200":3,"NVIDIA-A100":3,"NVIDIA-L40S":3,"*":5}"#,
    )]);
    let mut pins = Vec::new();
    for i in 0..5 {
        let p = pod(&format!("p{i}"), "q", None, "1");
        let r = w.send(R::pod("CREATE", p.clone()).build());
        assert!(r.allowed, "{}", message(&r));
        pins.push(pin(&r, &p));
    }
    assert_eq!(
        pins,
        [
            "NVIDIA-H200",
            "NVIDIA-H200",
            "NVIDIA-H200",
            "NVIDIA-A100",
            "NVIDIA-A100"
        ]
    );
    let r = w.send(R::pod("CREATE", pod("p5", "q", None, "1")).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient * quota (a group cap): requested 1, in use 5 (allocated 0, pending 5, reserved 0), quota 5"
    );
    // A pod naming a model with room of its own is refused by the cap too.
    let r = w.send(R::pod("CREATE", pod("l", "q", Some("NVIDIA-L40S"), "1")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("insufficient * quota (a group cap)"),
        "{}",
        message(&r)
    );
    assert_eq!(
        w.usage("q", "*"),
        json!({"quota": 5, "allocated": 0, "pending": 5, "reserved": 0})
    );
}

#[test]
fn a_model_only_a_pattern_names_is_usable_after_the_named_ones() {
    // H200 is named; A100 and L40S only through NVIDIA-*; by name after the named ones.
    let mut w = World::with(&[("q", r#"{"NVIDIA-H200":1,"NVIDIA-*":3}"#)]);
    let mut pins = Vec::new();
    for i in 0..3 {
        let p = pod(&format!("p{i}"), "q", None, "1");
        let r = w.send(R::pod("CREATE", p.clone()).build());
        assert!(r.allowed, "{}", message(&r));
        pins.push(pin(&r, &p));
    }
    assert_eq!(pins, ["NVIDIA-H200", "NVIDIA-A100", "NVIDIA-A100"]);
    assert!(
        !w.send(R::pod("CREATE", pod("p3", "q", None, "1")).build())
            .allowed
    );
    // A model no key matches still has quota 0.
    let mut w = World::with(&[("q", r#"{"NVIDIA-H*":2}"#)]);
    assert!(
        w.send(R::pod("CREATE", pod("h", "q", Some("NVIDIA-H200"), "2")).build())
            .allowed
    );
    let r = w.send(R::pod("CREATE", pod("a", "q", Some("NVIDIA-A100"), "1")).build());
    assert!(!r.allowed);
    assert!(
        message(&r).contains("insufficient NVIDIA-A100 quota"),
        "{}",
        message(&r)
    );
}

#[test]
fn a_job_that_may_split_is_held_at_the_enqueue_by_a_cap_and_goes_when_room_appears() {
    let mut w = World::with(&[("q", r#"{"NVIDIA-H200":4,"NVIDIA-A100":4,"*":6}"#)]);
    let j1 = waiting_pg("j1", "q", r#"{"NVIDIA-H200|NVIDIA-A100":4}"#);
    let j2 = waiting_pg("j2", "q", r#"{"NVIDIA-H200|NVIDIA-A100":3}"#);
    for j in [&j1, &j2] {
        assert!(w.send(R::podgroup("CREATE", j.clone()).build()).allowed);
    }
    assert!(enqueue(&mut w, &j1).allowed);
    // 8 cards of room on the models, 2 under the cap.
    let r = enqueue(&mut w, &j2);
    assert!(!r.allowed);
    assert!(
        message(&r).contains("insufficient * quota (a group cap): requested 3, in use 4"),
        "{}",
        message(&r)
    );
    // j1 ends: j2 goes.
    let mut inq = j1.clone();
    inq["status"] = json!({"phase": "Inqueue"});
    let mut done = j1.clone();
    done["status"] = json!({"phase": "Completed"});
    assert!(w.send(R::podgroup("UPDATE", done).old(inq).build()).allowed);
    assert!(enqueue(&mut w, &j2).allowed);
}

#[test]
fn a_scale_up_is_clamped_to_what_fits_under_every_cap() {
    let deployment = r#"
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}, annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: NVIDIA-H200}}
    spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;
    let mut w = World::with_yaml(&[("q", r#"{"NVIDIA-H200":8,"*":3}"#)], deployment);
    let r = w.send(R::scale("deployments", "ml", "web", 1, 10).build());
    assert!(r.allowed, "{}", message(&r));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r.patch.as_ref().expect("a clamp"))
        .unwrap();
    let ops: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        ops,
        json!([{"op": "replace", "path": "/spec/replicas", "value": 4}])
    );
    assert!(
        r.warnings[0].contains("insufficient * quota (a group cap)"),
        "{:?}",
        r.warnings
    );
}

#[test]
fn malformed_patterns_are_refused_naming_the_key() {
    let mut w = World::with(&[]);
    let q = |quota: &str| {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "bad", "annotations": {"volcano.sh/card.quota": quota}},
            "spec": {"weight": 1}})
    };
    for (quota, want) in [
        (
            r#"{"**":1}"#,
            r#"key "**": a group cap ends in one '*' after a prefix"#,
        ),
        (
            r#"{"NVIDIA-**":1}"#,
            r#"key "NVIDIA-**": a group cap ends in one '*'"#,
        ),
        (
            r#"{"/mig-*":1}"#,
            r#"key "/mig-*": pattern "/mig-*" has an empty model before its '/'"#,
        ),
        (
            r#"{"*":-1}"#,
            r#"value for "*" must be a non-negative integer, got -1"#,
        ),
        (r#"{"*":1,"*":2}"#, r#"duplicate key "*""#),
    ] {
        let r = w.send(R::queue("CREATE", q(quota)).build());
        assert!(!r.allowed, "{quota}");
        let m = message(&r);
        assert!(
            m.starts_with("invalid volcano.sh/card.quota on queue bad: "),
            "{m}"
        );
        assert!(m.contains(want), "{quota}: {m}");
    }
    let many: String = (0..65)
        .map(|i| format!("\"M{i}-*\":1"))
        .collect::<Vec<_>>()
        .join(",");
    let r = w.send(R::queue("CREATE", q(&format!("{{{many}}}"))).build());
    assert_eq!(
        message(&r),
        "invalid volcano.sh/card.quota on queue bad: 65 group caps (keys ending in '*'); at most 64 are allowed"
    );
    let r = w.send(R::queue("CREATE", q(r#"{"NVIDIA-*":4,"*":16}"#)).build());
    assert!(r.allowed, "{}", message(&r));
    // A pattern no node's model matches is admitted with a warning.
    let r = w.send(R::queue("CREATE", q(r#"{"AMD-*":4}"#)).build());
    assert!(r.allowed);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("group cap AMD-* matches no card model any node offers")),
        "{:?}",
        r.warnings
    );
}

/// A parent's cap bounds its subtree: a child borrowing within every model's pool stops
/// where the parent's `*` is full (its sibling's share counts whole).
#[test]
fn a_parents_cap_bounds_what_a_child_may_borrow() {
    let tree = |org_quota: &str| {
        format!(
            r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: root}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: org, annotations: {{volcano.sh/card.quota: '{org_quota}'}}}}
spec: {{parent: root}}
status: {{state: Open}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: team-a, annotations: {{volcano.sh/card.quota: '{{"NVIDIA-H200":2}}'}}}}
spec: {{parent: org}}
status: {{state: Open}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: team-b, annotations: {{volcano.sh/card.quota: '{{"NVIDIA-A100":2}}', volcano.sh/card.borrow: '{{"NVIDIA-A100":2}}'}}}}
spec: {{parent: org}}
status: {{state: Open}}
"#
        )
    };
    let admitted = |org_quota: &str| {
        let mut w = World::with_yaml(&[], &tree(org_quota));
        (0..4)
            .take_while(|i| {
                let r = w.send(
                    R::pod(
                        "CREATE",
                        pod(&format!("b{i}"), "team-b", Some("NVIDIA-A100"), "1"),
                    )
                    .build(),
                );
                r.allowed
            })
            .count()
    };
    // Without the cap team-b borrows both pool A100s; with "*":5 only one (2 + 3 = 5).
    assert_eq!(admitted(r#"{"NVIDIA-H200":4,"NVIDIA-A100":4}"#), 4);
    assert_eq!(admitted(r#"{"NVIDIA-H200":4,"NVIDIA-A100":4,"*":5}"#), 3);
    let mut w = World::with_yaml(&[], &tree(r#"{"NVIDIA-H200":4,"NVIDIA-A100":4,"*":5}"#));
    for i in 0..3 {
        let p = pod(&format!("b{i}"), "team-b", Some("NVIDIA-A100"), "1");
        assert!(w.send(R::pod("CREATE", p).build()).allowed);
    }
    let r = w.send(R::pod("CREATE", pod("b3", "team-b", Some("NVIDIA-A100"), "1")).build());
    assert_eq!(
        message(&r),
        "queue team-b cannot borrow NVIDIA-A100 under group cap * of org: requested 1, org free 0 (cap 5, its models' shares and what is borrowed beyond them 5)"
    );
    // Within its own share a child is held only by the caps' hard line: team-a's 2 H200.
    for i in 0..2 {
        let p = pod(&format!("a{i}"), "team-a", Some("NVIDIA-H200"), "1");
        let r = w.send(R::pod("CREATE", p).build());
        assert!(r.allowed, "{}", message(&r));
    }
}

/// Found by tests/model.rs: a bound charge (a binding, or a pod created on its node)
/// passes the per-model line but not the cap's; the feasibility check sees only
/// unbound demand, so the cap is held as a hard line of its own.
#[test]
fn a_binding_or_a_pod_on_its_node_past_a_cap_is_refused() {
    let mut w = World::with(&[("q", r#"{"NVIDIA-H200":3,"NVIDIA-A100":2,"*":4}"#)]);
    let p = pod("p1", "q", Some("NVIDIA-H200"), "3");
    assert!(w.send(R::pod("CREATE", p).build()).allowed);
    assert!(w.send(R::binding("ml", "p1", "h200-1").build()).allowed);
    let mut on_node = pod("p2", "q", Some("NVIDIA-A100"), "2");
    on_node["spec"]["nodeName"] = json!("a100-1");
    let r = w.send(R::pod("CREATE", on_node).build());
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        "queue q has insufficient * quota (a group cap): requested 2, in use 3 (allocated 3, pending 0, reserved 0), quota 4"
    );
}

/// Bindings that fill a cap exactly are admitted; one more card is not.
#[test]
fn bindings_fill_a_cap_exactly() {
    let mut w = World::with(&[("q", r#"{"NVIDIA-H200":3,"NVIDIA-A100":2,"*":4}"#)]);
    for (name, model, n, node) in [
        ("p1", "NVIDIA-H200", "3", "h200-1"),
        ("p2", "NVIDIA-A100", "1", "a100-1"),
    ] {
        let r = w.send(R::pod("CREATE", pod(name, "q", Some(model), n)).build());
        assert!(r.allowed, "{}", message(&r));
        let r = w.send(R::binding("ml", name, node).build());
        assert!(r.allowed, "{}", message(&r));
    }
    assert_eq!(w.usage("q", "*")["allocated"], 4);
    let r = w.send(R::pod("CREATE", pod("p3", "q", Some("NVIDIA-A100"), "1")).build());
    assert!(!r.allowed);
}

/// A parent's cap, written as a Queue: warned when its children's shares together pass it
/// (a child's own cap bounds its part) and when its subtree already uses more.
#[test]
fn a_parent_cap_under_its_childrens_shares_or_usage_is_warned() {
    let tree = r#"
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: root}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: org, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4,"NVIDIA-A100":4}'}}
spec: {parent: root}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: team-a, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2,"NVIDIA-A100":2}'}}
spec: {parent: org}
status: {state: Open}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: team-b, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2,"NVIDIA-A100":2,"*":1}'}}
spec: {parent: org}
status: {state: Open}
"#;
    let org = |quota: &str| {
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "org", "annotations": {"volcano.sh/card.quota": quota}},
            "spec": {"parent": "root"}, "status": {"state": "Open"}})
    };
    let mut w = World::with_yaml(&[], tree);
    for i in 0..3 {
        let p = pod(&format!("a{i}"), "team-a", None, "1");
        let r = w.send(R::pod("CREATE", p).build());
        assert!(r.allowed, "{}", message(&r));
    }
    // Shares under "*": team-a 4, team-b 1 (its own "*":1): 5 fit a cap of 5.
    let r = w.send(R::queue("UPDATE", org(r#"{"NVIDIA-H200":4,"NVIDIA-A100":4,"*":5}"#)).build());
    assert!(r.allowed);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let r = w.send(R::queue("UPDATE", org(r#"{"NVIDIA-H200":4,"NVIDIA-A100":4,"*":2}"#)).build());
    assert!(r.allowed, "a warning, not a refusal");
    assert_eq!(
        r.warnings,
        vec![
            "queue org: the shares of its children (team-a 4, team-b 1) add up to 5 cards under its group cap *, above the cap (2): nothing can be borrowed there and shares are first come, first served",
            "queue org: group cap * (2) is below the current usage of its subtree (3); nothing is evicted, charges that raise it are refused",
        ]
    );
    // A cap over one family counts only the shares of its models (team-b's "*":1 holds
    // its part to 1); the subtree's 2 H200 in use are within it.
    let r = w.send(
        R::queue(
            "UPDATE",
            org(r#"{"NVIDIA-H200":4,"NVIDIA-A100":4,"NVIDIA-H*":2}"#),
        )
        .build(),
    );
    assert_eq!(
        r.warnings,
        vec!["queue org: the shares of its children (team-a 2, team-b 1) add up to 3 cards under its group cap NVIDIA-H*, above the cap (2): nothing can be borrowed there and shares are first come, first served"],
    );
}
