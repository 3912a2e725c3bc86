//! Incremental usage (recompute only the queues the snapshot marked dirty) agrees with a
//! full recount after any sequence of pod, node, queue and PodGroup events.

use std::collections::{BTreeMap, BTreeSet};

use card_quota::cards::QueueName;
use card_quota::cards::{CardName, ObjectKey};
use card_quota::controller::plan::{queue_state, recount_check};
use card_quota::decide::fit::{fit, usage_after, Change};
use card_quota::ledger::{check, queue_usage, QueueUsage, Row, UsageKey, DEFAULT_BUDGET};
use card_quota::snapshot::load::{remove, upsert};
use card_quota::snapshot::{Dirty, Snapshot};
use proptest::prelude::*;
use serde_json::{json, Value};

const QUEUES: &[&str] = &["q1", "q2", "q3"];
const PRODUCTS: &[&str] = &["A", "B", "C"];
const ALTS: &[&str] = &["A", "B", "C", "A|B", "C|A"];

#[derive(Debug, Clone)]
enum Ev {
    Pod {
        pod: usize,
        queue: usize,
        alts: usize,
        cards: u32,
        node: Option<usize>,
        /// The PodGroup it names (a pod may move between groups).
        group: Option<usize>,
        /// 0-1 running or pending, 2 Succeeded, 3 terminating (grace left), 4
        /// terminating (grace over).
        state: u8,
        /// Stamped at admission into a queue (maybe not its group's).
        stamp: Option<usize>,
    },
    DeletePod {
        pod: usize,
    },
    Node {
        node: usize,
        product: usize,
        gpus: u32,
    },
    DeleteNode {
        node: usize,
    },
    Quota {
        queue: usize,
        a: u32,
        b: u32,
    },
    DeleteQueue {
        queue: usize,
    },
    Group {
        group: usize,
        queue: usize,
        alts: usize,
        cards: u32,
    },
    DeleteGroup {
        group: usize,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => (0..12usize, 0..3usize, 0..5usize, 1..4u32, proptest::option::of(0..4usize), proptest::option::of(0..3usize), 0..5u8, proptest::option::weighted(0.2, 0..3usize))
            .prop_map(|(pod, queue, alts, cards, node, group, state, stamp)| Ev::Pod { pod, queue, alts, cards, node, group, state, stamp }),
        1 => (0..12usize).prop_map(|pod| Ev::DeletePod { pod }),
        1 => (0..4usize, 0..3usize, 0..9u32).prop_map(|(node, product, gpus)| Ev::Node { node, product, gpus }),
        1 => (0..4usize).prop_map(|node| Ev::DeleteNode { node }),
        1 => (0..3usize, 0..5u32, 0..5u32).prop_map(|(queue, a, b)| Ev::Quota { queue, a, b }),
        1 => (0..3usize).prop_map(|queue| Ev::DeleteQueue { queue }),
        1 => (0..3usize, 0..3usize, 0..5usize, 1..6u32)
            .prop_map(|(group, queue, alts, cards)| Ev::Group { group, queue, alts, cards }),
        1 => (0..3usize).prop_map(|group| Ev::DeleteGroup { group }),
    ]
}

fn apply(s: &mut Snapshot, e: &Ev) {
    let obj: Option<Value> = match e {
        Ev::Pod {
            pod,
            queue,
            alts,
            cards,
            node,
            group,
            state,
            stamp,
        } => {
            let mut anns = json!({"volcano.sh/card.name": ALTS[*alts]});
            if let Some(q) = stamp {
                anns["volcano.sh/card.queue"] = json!(QUEUES[*q]);
            }
            if let Some(g) = group {
                anns["scheduling.k8s.io/group-name"] = json!(format!("g{g}"));
            } else {
                anns["scheduling.volcano.sh/queue-name"] = json!(QUEUES[*queue]);
            }
            let mut spec = json!({"containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]});
            if let Some(n) = node {
                spec["nodeName"] = json!(format!("n{n}"));
            }
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{pod}"), "namespace": "ml", "annotations": anns},
                "spec": spec});
            let at = |secs: i64| (now() + jiff::SignedDuration::from_secs(secs)).to_string();
            match state {
                2 => pod["status"] = json!({"phase": "Succeeded"}),
                3 => pod["metadata"]["deletionTimestamp"] = json!(at(30)),
                4 => pod["metadata"]["deletionTimestamp"] = json!(at(-30)),
                _ => {}
            }
            Some(pod)
        }
        Ev::DeletePod { pod } => {
            remove(s, "Pod", "ml", &format!("p{pod}"));
            None
        }
        Ev::Node {
            node,
            product,
            gpus,
        } => Some(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("n{node}"), "labels": {"nvidia.com/gpu.product": PRODUCTS[*product]}},
            "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string()}}})),
        Ev::DeleteNode { node } => {
            remove(s, "Node", "", &format!("n{node}"));
            None
        }
        Ev::Quota { queue, a, b } => Some(
            json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": QUEUES[*queue], "annotations":
                {"volcano.sh/card.quota": format!(r#"{{"A":{a},"B":{b}}}"#)}}}),
        ),
        Ev::DeleteQueue { queue } => {
            remove(s, "Queue", "", QUEUES[*queue]);
            None
        }
        Ev::Group {
            group,
            queue,
            alts,
            cards,
        } => Some(json!({"apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": format!("g{group}"), "namespace": "ml",
                "annotations": {"volcano.sh/card.request": format!(r#"{{"{}":{cards}}}"#, ALTS[*alts])}},
            "spec": {"queue": QUEUES[*queue]}})),
        Ev::DeleteGroup { group } => {
            remove(s, "PodGroup", "ml", &format!("g{group}"));
            None
        }
    };
    if let Some(o) = obj {
        upsert(s, &o).unwrap();
    }
}

/// One fixed "now" for a whole test run, so grace periods do not move under it.
fn now() -> jiff::Timestamp {
    static NOW: std::sync::OnceLock<jiff::Timestamp> = std::sync::OnceLock::new();
    *NOW.get_or_init(jiff::Timestamp::now)
}

fn recount(s: &Snapshot, q: &QueueName, now: jiff::Timestamp) -> QueueUsage {
    let quota = s.queue(q).map(|r| r.effective_quota()).unwrap_or_default();
    queue_usage(quota, s.queue_pods(q), s.queue_groups(q), s, now)
}

fn full(s: &Snapshot, now: jiff::Timestamp) -> BTreeMap<QueueName, BTreeMap<UsageKey, Row>> {
    s.queue_names()
        .into_iter()
        .map(|q| {
            let rows = queue_state(s, &q, now).rows;
            (q, rows)
        })
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

/// Each PodGroup's card pods as the snapshot's index lists them.
fn group_index(s: &Snapshot) -> BTreeMap<String, BTreeSet<String>> {
    (0..3)
        .map(|g| {
            let key = ObjectKey::new("ml", format!("g{g}"));
            let pods = s.group_pods(&key).map(|p| p.key.name.clone()).collect();
            (format!("g{g}"), pods)
        })
        .collect()
}

/// The same, found by looking at every pod.
fn group_scan(s: &Snapshot) -> BTreeMap<String, BTreeSet<String>> {
    let mut by: BTreeMap<String, BTreeSet<String>> =
        (0..3).map(|g| (format!("g{g}"), BTreeSet::new())).collect();
    for k in s.pod_keys() {
        if let Some(g) = s.pod(&k).and_then(|p| p.group.clone()) {
            by.entry(g).or_default().insert(k.name.clone());
        }
    }
    by
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn incremental_usage_equals_a_fresh_recount(events in proptest::collection::vec(ev(), 1..60)) {
        let now = now();
        let mut s = Snapshot::new();
        let mut kept: BTreeMap<QueueName, BTreeMap<UsageKey, Row>> = BTreeMap::new();
        for e in &events {
            apply(&mut s, e);
            let dirty: Vec<QueueName> = match s.take_dirty() {
                Dirty::None => Vec::new(),
                Dirty::Queues(q) => q.into_iter().collect(),
                Dirty::All => s.queue_names().into_iter().chain(kept.keys().cloned()).collect(),
            };
            for q in dirty {
                let rows = queue_state(&s, &q, now).rows;
                if rows.is_empty() { kept.remove(&q); } else { kept.insert(q, rows); }
            }
            prop_assert_eq!(&kept, &full(&s, now), "after {:?}", e);
            prop_assert_eq!(group_index(&s), group_scan(&s), "after {:?}", e);
        }
    }
}

/// The pod `p9` as an admission would add it to `q`, for the "after a change" check.
fn newcomer(
    s: &Snapshot,
    q: &QueueName,
    alts: usize,
    cards: u32,
    group: bool,
) -> card_quota::cluster::PodRecord {
    let mut probe = Snapshot::new();
    for name in s.node_names() {
        if let Some(n) = s.node(&name) {
            probe.upsert_node(name.clone(), n.clone());
        }
    }
    let mut anns =
        json!({"volcano.sh/card.name": ALTS[alts], "volcano.sh/card.queue": q.to_string()});
    if group {
        anns["scheduling.k8s.io/group-name"] = json!("g1");
    }
    upsert(
        &mut probe,
        &json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p9", "namespace": "ml", "annotations": anns},
        "spec": {"containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]}}),
    )
    .unwrap();
    probe.pod(&ObjectKey::new("ml", "p9")).unwrap().clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn the_tally_equals_a_recount_after_any_events_and_changes(
        events in proptest::collection::vec(ev(), 1..60),
        alts in 0..5usize, cards in 1..4u32, group in any::<bool>(),
    ) {
        let now = now();
        let mut s = Snapshot::new();
        for e in &events {
            apply(&mut s, e);
            prop_assert_eq!(s.tally().errors(), 0, "bookkeeping error after {:?}", e);
            for q in s.queue_names() {
                prop_assert_eq!(s.usage(&q, now), recount(&s, &q, now), "queue {} after {:?}", q, e);
            }
        }
        prop_assert_eq!(recount_check(&s, now), (Vec::new(), 0));
        // A decision's "after" view equals a recount of the snapshot with the change made.
        for q in s.queue_names() {
            let p = newcomer(&s, &q, alts, cards, group);
            let change = Change { add_pods: vec![p.clone()], ..Default::default() };
            let mut with = s.clone();
            with.upsert_pod(p);
            let after = usage_after(&s, &q, &change, now);
            prop_assert_eq!(&after, &recount(&with, &q, now), "queue {}", q);
            // The verdict read in place agrees with a check of the whole usage copied,
            // and so do the numbers a binding reads.
            let models: BTreeSet<CardName> = PRODUCTS.iter().map(|m| CardName::parse(m).unwrap()).collect();
            let f = fit(&s, &q, &change, &models, now);
            prop_assert_eq!(f.verdict, check(&after.rooms(), &after.demands(), DEFAULT_BUDGET), "queue {}", q);
            for m in &models {
                prop_assert_eq!(f.after.allocated(m), after.allocated.get(m).copied().unwrap_or_default());
            }
            let gone = ObjectKey::new("ml", "p3");
            let change = Change { remove_pods: vec![gone.clone()], ..Default::default() };
            let mut without = s.clone();
            without.remove_pod(&gone);
            prop_assert_eq!(usage_after(&s, &q, &change, now), recount(&without, &q, now), "queue {} without p3", q);
        }
    }
}
