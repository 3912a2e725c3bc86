//! Property tests: (b) no sequence of admitted requests lets bound cards exceed quota;
//! (c) malformed annotations are refused with a message, never a panic.

use card_quota::admission::{apply, review};
use card_quota::cards::annotations::{parse_card_name, parse_quota, parse_request};
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::snapshot::load::load;
use proptest::prelude::*;
use serde_json::json;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: a, labels: {nvidia.com/gpu.product: A}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: b, labels: {nvidia.com/gpu.product: B}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: c, labels: {nvidia.com/gpu.product: C}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q1, annotations: {volcano.sh/card.quota: '{"A":3,"B":2,"C":1}'}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q2, annotations: {volcano.sh/card.quota: '{"A":1,"C":4}'}}
"#;

const ALTS: &[&str] = &["A", "B", "C", "A|B", "B|C", "C|A", "A|B|C"];
const NODES: &[&str] = &["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Create {
        pod: usize,
        queue: usize,
        alts: usize,
        cards: u32,
        group: bool,
    },
    Bind {
        pod: usize,
        node: usize,
    },
    Delete {
        pod: usize,
    },
    Group {
        queue: usize,
        alts: usize,
        cards: u32,
    },
    DeleteGroup {
        queue: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..12usize, 0..2usize, 0..ALTS.len(), 1u32..4, any::<bool>()).prop_map(
            |(pod, queue, alts, cards, group)| Op::Create {
                pod,
                queue,
                alts,
                cards,
                group
            }
        ),
        (0..12usize, 0..3usize).prop_map(|(pod, node)| Op::Bind { pod, node }),
        (0..12usize).prop_map(|pod| Op::Delete { pod }),
        (0..2usize, 0..ALTS.len(), 1u32..5).prop_map(|(queue, alts, cards)| Op::Group {
            queue,
            alts,
            cards
        }),
        (0..2usize).prop_map(|queue| Op::DeleteGroup { queue }),
    ]
}

fn request(op: &Op) -> serde_json::Value {
    match op {
        Op::Create { pod, queue, alts, cards, group } => {
            let anns = if *group {
                json!({"scheduling.k8s.io/group-name": format!("job-q{}", queue + 1), "volcano.sh/card.name": ALTS[*alts]})
            } else {
                json!({"scheduling.volcano.sh/queue-name": format!("q{}", queue + 1), "volcano.sh/card.name": ALTS[*alts]})
            };
            R::pod("CREATE", json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{pod}"), "namespace": "ml", "annotations": anns},
                "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]}}))
            .build()
        }
        Op::Bind { pod, node } => R::binding("ml", &format!("p{pod}"), NODES[*node]).build(),
        Op::Delete { pod } => {
            let mut r = R::pod("DELETE", json!(null)).named("ml", &format!("p{pod}")).build();
            r["request"]["object"] = serde_json::Value::Null;
            r
        }
        Op::Group { queue, alts, cards } => R::podgroup("CREATE", json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": format!("job-q{}", queue + 1), "namespace": "ml",
                "annotations": {"volcano.sh/card.request": format!("{{\"{}\":{cards}}}", ALTS[*alts])}},
            "spec": {"queue": format!("q{}", queue + 1)}}))
        .build(),
        Op::DeleteGroup { queue } => {
            let mut r = R::podgroup("DELETE", json!(null)).named("ml", &format!("job-q{}", queue + 1)).build();
            r["request"]["object"] = serde_json::Value::Null;
            r
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_sequence_of_requests_lets_bound_cards_exceed_quota(ops in proptest::collection::vec(op(), 1..40)) {
        let (mut snap, _) = load(CLUSTER).unwrap();
        let cfg = Config::default();
        let now = jiff::Timestamp::now();
        for o in &ops {
            let r = review(&request(o), &mut snap, &cfg, now, true);
            if let (Some(req), Some(d)) = (&r.request, &r.decision) {
                let _ = apply(&mut snap, req, d);
            }
            for q in ["q1", "q2"] {
                let queue = card_quota::cards::QueueName::new(q);
                let u = card_quota::decide::fit::usage_of(&snap, &queue, now);
                for (m, a) in &u.allocated {
                    prop_assert!(*a <= u.quota.get(m), "{q}/{m}: allocated {a} > quota {} after {:?}", u.quota.get(m), o);
                }
            }
        }
    }

    /// `warn` changes only what a quota refuses, and steers nothing: a request `deny`
    /// admits gets the same answer under `warn` but for the pin (no nodeSelector, no
    /// `card.pinned`, no inferred `card.name`: said in a warning instead), a quota
    /// refusal becomes an admission marked warned, and every other refusal stands.
    #[test]
    fn warn_admits_exactly_what_only_a_quota_refuses(ops in proptest::collection::vec(op(), 1..40)) {
        let (mut snap, _) = load(CLUSTER).unwrap();
        let deny = Config::default();
        let warn = Config { enforcement: card_quota::decide::Enforcement::Warn, ..Config::default() };
        let now = jiff::Timestamp::now();
        for o in &ops {
            let doc = request(o);
            let d = review(&doc, &mut snap, &deny, now, true).decision;
            let r = review(&doc, &mut snap, &warn, now, true);
            let (Some(d), Some(w)) = (d, r.decision.clone()) else { continue };
            let quota = d.reason == Some(card_quota::decide::messages::Reason::InsufficientCardQuota);
            if d.allowed && !quota {
                prop_assert!(w.allowed && !w.warned(), "{o:?}");
                let steering = |op: &serde_json::Value| {
                    let path = op["path"].as_str().unwrap_or_default();
                    path.ends_with("card.pinned") || path.ends_with("card.name") || path.starts_with("/spec/nodeSelector")
                };
                let ops = |p: &[json_patch::PatchOperation]| -> Vec<serde_json::Value> {
                    p.iter().map(|op| serde_json::to_value(op).unwrap()).collect()
                };
                let unsteered: Vec<serde_json::Value> = ops(&d.patch).into_iter().filter(|op| !steering(op)).collect();
                prop_assert_eq!(ops(&w.patch), unsteered.clone(), "{:?}", o);
                if unsteered.len() == d.patch.len() {
                    prop_assert_eq!(&w.charge, &d.charge, "{:?}", o);
                } else {
                    prop_assert_eq!(w.charge.as_ref().map(|c| &c.queue), d.charge.as_ref().map(|c| &c.queue), "{:?}", o);
                    prop_assert!(w.warnings.iter().any(|x| x.starts_with("card-quota does not pin pods in warn mode")), "{o:?}: {:?}", w.warnings);
                }
            } else if quota {
                prop_assert!(w.allowed && w.warned() && w.reason.is_none(), "{o:?}: {:?}", w.message);
                prop_assert!(w.warnings.iter().any(|x| x.contains(d.message.as_deref().unwrap_or("clamped"))), "{o:?}: {:?}", w.warnings);
            } else if d.reason == Some(card_quota::decide::messages::Reason::CardModelNotAccepted)
                && matches!(o, Op::Bind { .. })
            {
                // Nothing pinned the pod under warn: the scheduler's node stands.
                prop_assert!(w.allowed && w.warned(), "{o:?}: {:?}", w.message);
                prop_assert!(w.warnings.iter().any(|x| x.contains(d.message.as_deref().unwrap_or_default())), "{o:?}: {:?}", w.warnings);
            } else {
                prop_assert!(!w.allowed && !w.warned(), "{o:?}");
                prop_assert_eq!(&w.message, &d.message);
            }
            if let (Some(req), Some(dec)) = (&r.request, &r.decision) {
                let _ = apply(&mut snap, req, dec);
            }
        }
    }

    #[test]
    fn arbitrary_annotation_text_never_panics_and_errors_name_the_object(raw in "[{}\\[\\]\":,|A-C0-9 .-]{0,24}") {
        for (r, prefix) in [
            (parse_quota("queue q", &raw).err(), "invalid volcano.sh/card.quota on queue q: "),
            (parse_request("podgroup ml/j", &raw).err(), "invalid volcano.sh/card.request on podgroup ml/j: "),
            (parse_card_name("pod ml/p", &raw).err(), "invalid volcano.sh/card.name on pod ml/p: "),
        ] {
            if let Some(e) = r {
                prop_assert!(e.to_string().starts_with(prefix), "{e}");
            }
        }
    }

    #[test]
    fn generated_malformed_quotas_are_all_refused(
        key in "[A-Z]{1,5}",
        bad in prop_oneof![
            Just("-1".to_string()), Just("1.5".to_string()), Just("\"2\"".to_string()),
            Just("null".to_string()), Just("true".to_string()), Just("[1]".to_string()),
            Just("1e3".to_string()), Just("18446744073709551616".to_string())
        ],
        shape in 0..4usize,
    ) {
        let raw = match shape {
            0 => format!("{{\"{key}\":{bad}}}"),
            1 => format!("{{\"{key}\":1,\"{key}\":2}}"),
            2 => format!("{{\"{key} x\":1}}"),
            _ => format!("{{\"\":1,\"{key}\":{bad}}}"),
        };
        let e = parse_quota("queue q", &raw);
        prop_assert!(e.is_err(), "{raw} should be refused");
    }
}
