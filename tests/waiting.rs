//! Pods that wait for room instead of being refused (`volcano.sh/card.full: wait`),
//! through the path the API server drives: the mutating webhook, its patch applied, the
//! validating webhook on the patched object, the effect stored.

mod support;

use base64::Engine;
use card_quota::admission::{apply, review, usage_report};
use card_quota::decide::review::{AdmissionResponse, ReviewBuilder as R};
use card_quota::decide::Config;
use card_quota::snapshot::load::load;
use card_quota::snapshot::Snapshot;
use serde_json::{json, Value};

const GATE: &str = "volcano.sh/card-quota";

fn cluster(queue_annotations: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Node
metadata: {{name: h200-1, labels: {{nvidia.com/gpu.product: NVIDIA-H200}}}}
status: {{allocatable: {{nvidia.com/gpu: "8"}}}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: wq, annotations: {{volcano.sh/card.quota: '{{"NVIDIA-H200":2}}'{queue_annotations}}}}}
status: {{state: Open}}
"#
    )
}

struct World {
    snap: Snapshot,
    cfg: Config,
}

impl World {
    fn new(queue_annotations: &str) -> Self {
        let (snap, skipped) = load(&cluster(queue_annotations)).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
        }
    }

    /// One hook's answer; applies the effect when `validate`.
    fn hook(&mut self, doc: &Value, mutate: bool) -> AdmissionResponse {
        let now = jiff::Timestamp::now();
        let r = review(doc, &mut self.snap, &self.cfg, now, mutate);
        if !mutate {
            if let (Some(req), Some(d)) = (&r.request, &r.decision) {
                apply(&mut self.snap, req, d).unwrap();
            }
        }
        r.out.response
    }

    /// A write as the API server makes it: /mutate, its patch, then /validate. Returns
    /// the validating answer (or the mutating refusal) and the object as stored.
    fn write(
        &mut self,
        op: &str,
        object: Value,
        old: Option<&Value>,
    ) -> (AdmissionResponse, Value) {
        let build = |o: Value| {
            let b = R::pod(op, o);
            match old {
                Some(old) => b.old(old.clone()).build(),
                None => b.build(),
            }
        };
        let m = self.hook(&build(object.clone()), true);
        if !m.allowed {
            return (m, object);
        }
        let mut patched = object;
        if let Some(p) = &m.patch {
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
            let ops: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut patched, &ops).unwrap();
        }
        let mut v = self.hook(&build(patched.clone()), false);
        v.warnings.extend(m.warnings);
        (v, patched)
    }

    fn create(&mut self, name: &str, gpus: &str) -> (AdmissionResponse, Value) {
        let p = support::pod(name)
            .queue("wq")
            .gpus(gpus)
            .stored(&format!("uid-{name}"), "1")
            .build();
        self.write("CREATE", p, None)
    }

    /// The UPDATE that removes card-quota's gate from a stored pod.
    fn release(&mut self, stored: &Value) -> (AdmissionResponse, Value) {
        let mut new = stored.clone();
        let gates: Vec<Value> = new["spec"]["schedulingGates"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|g| g["name"] != GATE)
            .collect();
        new["spec"]["schedulingGates"] = Value::Array(gates);
        self.write("UPDATE", new, Some(stored))
    }

    fn delete(&mut self, name: &str) {
        card_quota::snapshot::load::remove(&mut self.snap, "Pod", "ml", name);
    }

    fn usage(&self) -> Value {
        serde_json::to_value(usage_report(&self.snap, jiff::Timestamp::now())).unwrap()["wq"]
            .clone()
    }
}

fn gated(p: &Value) -> bool {
    p["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| g.iter().any(|g| g["name"] == GATE))
}

fn message(r: &AdmissionResponse) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

const WAIT: &str = ", volcano.sh/card.full: wait";

#[test]
fn a_pod_past_the_room_waits_behind_the_gate_and_holds_no_quota() {
    let mut w = World::new(WAIT);
    for name in ["a", "b"] {
        let (r, p) = w.create(name, "1");
        assert!(r.allowed && !gated(&p), "{name}: {r:?}");
        assert_eq!(
            p["spec"]["nodeSelector"]["nvidia.com/gpu.product"],
            "NVIDIA-H200"
        );
    }
    let (r, p) = w.create("c", "1");
    assert!(r.allowed, "{r:?}");
    assert!(gated(&p), "{p}");
    assert!(
        p["spec"].get("nodeSelector").is_none(),
        "pinned at its release, not now: {p}"
    );
    assert_eq!(p["metadata"]["annotations"]["volcano.sh/card.queue"], "wq");
    assert!(
        r.warnings.iter().any(|x| x.contains("waits for room")
            && x.contains("queue wq has insufficient NVIDIA-H200 quota: requested 1, in use 2")),
        "{:?}",
        r.warnings
    );
    let u = w.usage();
    assert_eq!(u["NVIDIA-H200"]["pending"], 2, "{u}");
    assert_eq!(u["NVIDIA-H200"]["waiting"], 1, "{u}");
    use card_quota::cli::status::{render, Format, Install, Scope};
    let table = render(
        &w.snap,
        &Scope::queue(Some("wq")),
        Install::default(),
        Format::Table,
        jiff::Timestamp::now(),
    )
    .unwrap();
    assert!(table.contains("1 waiting"), "{table}");
    let json = render(
        &w.snap,
        &Scope::queue(Some("wq")),
        Install::default(),
        Format::Json,
        jiff::Timestamp::now(),
    )
    .unwrap();
    assert!(json.contains("\"waiting\": 1"), "{json}");
}

#[test]
fn refuse_is_the_default_and_a_pod_that_could_never_fit_is_refused_under_wait() {
    let mut w = World::new("");
    w.create("a", "2");
    let (r, p) = w.create("b", "1");
    assert!(!r.allowed && !gated(&p), "{r:?}");
    let mut w = World::new(WAIT);
    let (r, _) = w.create("big", "3");
    assert!(!r.allowed, "{r:?}");
    assert!(message(&r).contains("requested 3"), "{}", message(&r));
}

#[test]
fn removing_the_gate_is_decided_as_a_create_pinned_and_charged() {
    let mut w = World::new(WAIT);
    w.create("a", "1");
    w.create("b", "1");
    let (_, c) = w.create("c", "1");
    assert!(gated(&c));
    // No room: the release is refused, the pod stays as it was.
    let (r, _) = w.release(&c);
    assert!(!r.allowed, "{r:?}");
    assert!(
        message(&r).contains("insufficient NVIDIA-H200 quota"),
        "{}",
        message(&r)
    );
    assert_eq!(w.usage()["NVIDIA-H200"]["waiting"], 1);
    w.delete("a");
    let (r, released) = w.release(&c);
    assert!(r.allowed, "{r:?}");
    assert!(!gated(&released));
    assert_eq!(
        released["spec"]["nodeSelector"]["nvidia.com/gpu.product"],
        "NVIDIA-H200"
    );
    let u = w.usage();
    assert_eq!(u["NVIDIA-H200"]["pending"], 2, "{u}");
    assert!(u["NVIDIA-H200"].get("waiting").is_none(), "{u}");
    // The queue is full again: the next waiting pod's release is refused.
    let (_, d) = w.create("d", "1");
    assert!(gated(&d));
    assert!(!w.release(&d).0.allowed);
}

#[test]
fn strict_order_releases_the_oldest_first_and_best_effort_lets_one_that_fits_go() {
    for (order, younger_goes) in [("strict", false), ("best-effort", true)] {
        let mut w = World::new(&format!("{WAIT}, volcano.sh/card.order: {order}"));
        w.create("a", "1");
        w.create("b", "1");
        let (_, big) = w.create("big", "2");
        let (_, small) = w.create("small", "1");
        assert!(gated(&big) && gated(&small), "{order}");
        w.delete("a");
        // One card free: the older pod needs two.
        let (r, _) = w.release(&small);
        assert_eq!(r.allowed, younger_goes, "{order}: {r:?}");
        if !younger_goes {
            assert!(
                message(&r).contains("pod ml/big waits for its cards first"),
                "{}",
                message(&r)
            );
        }
    }
}

#[test]
fn a_new_pod_in_a_strict_queue_waits_behind_pods_already_waiting_even_with_room() {
    let mut w = World::new(&format!("{WAIT}, volcano.sh/card.order: strict"));
    w.create("a", "1");
    w.create("b", "1");
    let (_, big) = w.create("big", "2");
    assert!(gated(&big));
    w.delete("a");
    let (r, p) = w.create("late", "1");
    assert!(r.allowed && gated(&p), "{r:?} {p}");
    // Best-effort: it fits, so it goes.
    let mut w = World::new(WAIT);
    w.create("a", "1");
    w.create("b", "1");
    w.create("big", "2");
    w.delete("a");
    let (r, p) = w.create("late", "1");
    assert!(r.allowed && !gated(&p), "{r:?} {p}");
}

#[test]
fn warn_admits_at_once_what_would_wait() {
    let mut w = World::new(&format!("{WAIT}, volcano.sh/card.enforcement: warn"));
    w.create("a", "1");
    w.create("b", "1");
    let (r, p) = w.create("c", "1");
    assert!(r.allowed && !gated(&p), "{r:?} {p}");
    assert!(!r.warnings.is_empty());
}

#[test]
fn a_pod_created_with_the_gate_waits_whatever_the_queue_and_charges_nothing() {
    let mut w = World::new("");
    let mut p = support::pod("g")
        .queue("wq")
        .gpus("1")
        .stored("uid-g", "1")
        .build();
    p["spec"]["schedulingGates"] = json!([{"name": GATE}]);
    let (r, stored) = w.write("CREATE", p, None);
    assert!(r.allowed && gated(&stored), "{r:?}");
    assert_eq!(w.usage()["NVIDIA-H200"]["pending"], 0);
    let (r, _) = w.release(&stored);
    assert!(r.allowed, "{r:?}");
    assert_eq!(w.usage()["NVIDIA-H200"]["pending"], 1);
}

#[test]
fn an_invalid_card_full_is_refused_naming_it() {
    let mut w = World::new("");
    let q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "wq", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":2}", "volcano.sh/card.full": "queue"}}});
    let r = review(
        &R::queue("UPDATE", q.clone()).old(q).build(),
        &mut w.snap,
        &w.cfg,
        jiff::Timestamp::now(),
        false,
    )
    .out
    .response;
    assert!(!r.allowed);
    assert_eq!(
        message(&r),
        r#"invalid volcano.sh/card.full on queue wq: expected "refuse" or "wait", got "queue""#
    );
}

#[test]
fn a_new_pod_waits_when_the_room_is_a_waiting_pods() {
    let mut w = World::new(WAIT);
    w.create("a", "1");
    w.create("b", "1");
    let (_, c) = w.create("c", "1");
    assert!(gated(&c));
    // c's room appears; the releaser is a moment behind: a newcomer does not take it.
    w.delete("a");
    let (r, d) = w.create("d", "1");
    assert!(r.allowed && gated(&d), "{r:?}");
    assert!(
        r.warnings
            .iter()
            .any(|x| x.contains("queue wq has room for pod ml/c that waits before this one")),
        "{:?}",
        r.warnings
    );
    assert!(w.release(&c).0.allowed);
}

#[test]
fn the_release_plan_takes_waiting_pods_oldest_first_within_the_room() {
    let now = jiff::Timestamp::now();
    let mut w = World::new(WAIT);
    w.create("a", "1");
    w.create("b", "1");
    for name in ["c", "d", "e"] {
        assert!(gated(&w.create(name, "1").1));
    }
    let plan = card_quota::decide::wait::plan(&w.snap, now);
    assert!(plan.releases.is_empty());
    assert_eq!(plan.waiting.len(), 3);
    assert_eq!(
        plan.waiting[2].message(),
        "waiting: queue wq has insufficient NVIDIA-H200 quota: requested 1, in use 2 (allocated 0, pending 2, reserved 0), quota 2; 2 waiting pods ahead"
    );
    w.delete("a");
    w.delete("b");
    let plan = card_quota::decide::wait::plan(&w.snap, now);
    let released: Vec<String> = plan.releases.iter().map(|r| r.pod.name.clone()).collect();
    assert_eq!(released, ["c", "d"]);
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(plan.waiting[0].pod.name, "e");
}

#[test]
fn under_strict_order_the_plan_holds_younger_pods_behind_one_that_does_not_fit() {
    let now = jiff::Timestamp::now();
    for (order, small_released) in [("strict", false), ("best-effort", true)] {
        let mut w = World::new(&format!("{WAIT}, volcano.sh/card.order: {order}"));
        w.create("a", "1");
        w.create("b", "1");
        assert!(gated(&w.create("big", "2").1));
        assert!(gated(&w.create("small", "1").1));
        w.delete("a");
        let plan = card_quota::decide::wait::plan(&w.snap, now);
        let released: Vec<&str> = plan.releases.iter().map(|r| r.pod.name.as_str()).collect();
        assert_eq!(
            released.contains(&"small"),
            small_released,
            "{order}: {plan:?}"
        );
        assert!(!released.contains(&"big"));
        if !small_released {
            let small = plan.waiting.iter().find(|s| s.pod.name == "small").unwrap();
            assert!(
                small.why.contains("pod ml/big is released first"),
                "{}",
                small.why
            );
        }
    }
}

#[test]
fn a_pod_created_with_the_gate_that_could_never_fit_is_refused() {
    let mut w = World::new("");
    let mut p = support::pod("g")
        .queue("wq")
        .gpus("3")
        .stored("uid-g", "1")
        .build();
    p["spec"]["schedulingGates"] = json!([{"name": GATE}]);
    let m = w.hook(&R::pod("CREATE", p.clone()).build(), true);
    assert!(!m.allowed, "mutate: {m:?}");
    let (r, _) = w.write("CREATE", p, None);
    assert!(!r.allowed, "{r:?}");
    assert!(message(&r).contains("requested 3"), "{}", message(&r));
}

#[test]
fn a_pod_without_the_gate_at_the_validating_call_is_refused_when_it_does_not_fit() {
    // The mutating call saw room and pinned it; the room went before the validating
    // call, which cannot add the gate: the pod is refused (its controller retries, and
    // waits then), never admitted unmarked and uncharged.
    let mut w = World::new(WAIT);
    w.create("a", "1");
    w.create("b", "1");
    let late = support::pod("late")
        .queue("wq")
        .gpus("1")
        .stored("uid-late", "1")
        .build();
    let mutate = w.hook(&R::pod("CREATE", late.clone()).build(), true);
    assert!(mutate.allowed, "the mutating call lets it wait: {mutate:?}");
    let validate = w.hook(&R::pod("CREATE", late).build(), false);
    assert!(!validate.allowed, "{validate:?}");
    assert!(message(&validate).contains("insufficient NVIDIA-H200 quota"));
    assert_eq!(w.usage()["NVIDIA-H200"]["pending"], 2);
}
