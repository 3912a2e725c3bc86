//! Model-based test of hierarchical card quota (docs/hierarchy.md). Trees of up to 6
//! queues and depth 4 (random shares, borrow limits, over-subscription, queues without
//! `card.quota`), then random steps through the webhook's path: pod creations (one
//! model, `A|B`, or none: the models its queue and levels allow), bindings, deletions, quota cuts and raises, re-parents. After every
//! step an oracle that shares no code with card-quota checks:
//!
//! - the extended invariant: for every card level x and model m, the cards of bound pods
//!   in x's subtree stay within quota(x, m) + borrow(x, m), or at least did not grow in
//!   that step (a quota cut evicts nothing);
//! - that a pod asking within its leaf's own share is admitted whenever the tree above
//!   it is sound (shares fit every parent, every level's effective use within its cap).
//!
//! Cases: `CARD_QUOTA_MODEL_CASES` (256 by default).

use std::collections::BTreeMap;

use base64::Engine;
use card_quota::admission::{apply, review};
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::snapshot::load::load;
use card_quota::snapshot::Snapshot;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::{json, Value};

const MODELS: [&str; 2] = ["A", "B"];

#[derive(Debug, Clone)]
struct QueueSpec {
    parent: Option<usize>,
    quota: Option<[u64; 2]>,
    borrow: Option<[u64; 2]>,
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        queue: usize,
        card: u8,
        cards: u64,
    },
    Bind {
        pod: usize,
    },
    Delete {
        pod: usize,
    },
    SetQuota {
        queue: usize,
        quota: Option<[u64; 2]>,
    },
    Move {
        queue: usize,
        parent: Option<usize>,
    },
}

fn name(i: usize) -> String {
    format!("q{i}")
}

fn pair(max: u64) -> impl Strategy<Value = [u64; 2]> {
    (0..=max, 0..=max).prop_map(|(a, b)| [a, b])
}

fn tree() -> impl Strategy<Value = Vec<QueueSpec>> {
    proptest::collection::vec(
        (
            any::<prop::sample::Index>(),
            any::<bool>(),
            proptest::option::weighted(0.8, pair(6)),
            proptest::option::weighted(0.4, pair(3)),
        ),
        2..=6,
    )
    .prop_map(|raw| {
        let mut out: Vec<QueueSpec> = Vec::new();
        for (i, (pick, top, quota, borrow)) in raw.into_iter().enumerate() {
            let mut parent = (i > 0 && !top).then(|| pick.index(i));
            if let Some(p) = parent {
                if depth(&out, p) >= 4 {
                    parent = None;
                }
            }
            out.push(QueueSpec {
                parent,
                quota,
                borrow,
            });
        }
        out
    })
}

fn depth(qs: &[QueueSpec], i: usize) -> usize {
    let mut d = 1;
    let mut at = qs[i].parent;
    while let Some(p) = at {
        d += 1;
        at = qs[p].parent;
    }
    d
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..6usize, 0..4u8, 1..=3u64).prop_map(|(queue, card, cards)| Op::Create { queue, card, cards }),
        4 => (0..20usize).prop_map(|pod| Op::Bind { pod }),
        1 => (0..20usize).prop_map(|pod| Op::Delete { pod }),
        1 => (0..6usize, proptest::option::weighted(0.8, pair(6))).prop_map(|(queue, quota)| Op::SetQuota { queue, quota }),
        1 => (0..6usize, proptest::option::of(0..6usize)).prop_map(|(queue, parent)| Op::Move { queue, parent }),
    ]
}

fn queue_json(i: usize, q: &QueueSpec) -> Value {
    let mut v = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name(i), "annotations": {}}, "spec": {"weight": 1},
        "status": {"state": "Open"}});
    if let Some(p) = q.parent {
        v["spec"]["parent"] = json!(name(p));
    }
    let text = |x: [u64; 2]| json!(format!(r#"{{"A":{},"B":{}}}"#, x[0], x[1]));
    if let Some(x) = q.quota {
        v["metadata"]["annotations"]["volcano.sh/card.quota"] = text(x);
    }
    if let Some(x) = q.borrow {
        v["metadata"]["annotations"]["volcano.sh/card.borrow"] = text(x);
    }
    v
}

#[derive(Debug, Clone)]
struct Pod {
    name: String,
    queue: usize,
    /// The model it is pinned to (read from the admission patch), or bound to.
    model: usize,
    /// Not pinned: the models it accepts (bound to the one a Bind picks).
    open: Vec<usize>,
    cards: u64,
    bound: bool,
}

struct World {
    snap: Snapshot,
    cfg: Config,
    queues: Vec<QueueSpec>,
    pods: Vec<Pod>,
    next: usize,
}

impl World {
    fn new(queues: Vec<QueueSpec>) -> Self {
        let mut text = String::new();
        for (i, m) in MODELS.iter().enumerate() {
            text.push_str(&format!(
                "---\n{}\n",
                json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": format!("node-{i}"), "labels": {"nvidia.com/gpu.product": m}},
                    "status": {"allocatable": {"nvidia.com/gpu": "1000"}}})
            ));
        }
        for (i, q) in queues.iter().enumerate() {
            text.push_str(&format!("---\n{}\n", queue_json(i, q)));
        }
        let (snap, skipped) = load(&text).expect("the tree loads");
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
            queues,
            pods: Vec::new(),
            next: 0,
        }
    }

    fn send(&mut self, doc: Value) -> (bool, Value) {
        let r = review(
            &doc,
            &mut self.snap,
            &self.cfg,
            jiff::Timestamp::now(),
            true,
        );
        if let (Some(req), Some(d)) = (&r.request, &r.decision) {
            apply(&mut self.snap, req, d).expect("an admitted request applies");
        }
        let v = serde_json::to_value(&r.out.response).expect("a response");
        (r.out.response.allowed, v)
    }

    fn has_children(&self, i: usize) -> bool {
        self.queues.iter().any(|q| q.parent == Some(i))
    }

    /// The nearest ancestor with `card.quota`.
    fn card_parent(&self, i: usize) -> Option<usize> {
        let mut at = self.queues[i].parent;
        while let Some(p) = at {
            if self.queues[p].quota.is_some() {
                return Some(p);
            }
            at = self.queues[p].parent;
        }
        None
    }

    fn is_card_level(&self, i: usize) -> bool {
        self.queues[i].quota.is_some() || !self.has_children(i)
    }

    fn in_subtree(&self, i: usize, x: usize) -> bool {
        let mut at = Some(i);
        while let Some(q) = at {
            if q == x {
                return true;
            }
            at = self.queues[q].parent;
        }
        false
    }

    fn share(&self, i: usize, m: usize) -> u64 {
        self.queues[i].quota.map_or(0, |q| q[m])
    }

    fn cap(&self, i: usize, m: usize) -> u64 {
        let borrow = match (self.queues[i].borrow, self.card_parent(i)) {
            (Some(b), Some(_)) => b[m],
            _ => 0,
        };
        self.share(i, m) + borrow
    }

    /// Cards of pods in `x`'s subtree on `m`: bound only, or all.
    fn used(&self, x: usize, m: usize, bound_only: bool) -> u64 {
        self.pods
            .iter()
            .filter(|p| p.model == m && (p.bound || !bound_only) && self.in_subtree(p.queue, x))
            .map(|p| p.cards)
            .sum()
    }

    fn own_use(&self, x: usize, m: usize) -> u64 {
        self.pods
            .iter()
            .filter(|p| p.model == m && p.queue == x)
            .map(|p| p.cards)
            .sum()
    }

    /// Card children: card levels whose nearest card-level ancestor is `x`.
    fn card_children(&self, x: usize) -> Vec<usize> {
        (0..self.queues.len())
            .filter(|&c| {
                self.is_card_level(c) && {
                    let mut at = self.queues[c].parent;
                    loop {
                        match at {
                            Some(p) if p == x => break true,
                            Some(p) if self.is_card_level(p) => break false,
                            Some(p) => at = self.queues[p].parent,
                            None => break false,
                        }
                    }
                }
            })
            .collect()
    }

    /// E(x) on m: own use plus max(E(c), share(c)) over card children.
    fn effective(&self, x: usize, m: usize) -> u64 {
        self.own_use(x, m)
            + self
                .card_children(x)
                .into_iter()
                .map(|c| self.effective(c, m).max(self.share(c, m)))
                .sum::<u64>()
    }

    /// Every card level above `i` has children's shares within its quota and its
    /// effective use within its cap.
    fn sound_above(&self, i: usize, m: usize) -> bool {
        let mut at = self.card_parent(i);
        while let Some(x) = at {
            let shares: u64 = self
                .card_children(x)
                .iter()
                .map(|c| self.share(*c, m))
                .sum();
            if shares > self.share(x, m) || self.effective(x, m) > self.cap(x, m) {
                return false;
            }
            at = self.card_parent(x);
        }
        true
    }

    /// Per (queue, model): cards bound in its subtree, cards of pods on that model
    /// (bound, or pinned to it) in its subtree, and its effective use E.
    fn bound_levels(&self) -> BTreeMap<(usize, usize), (u64, u64, u64)> {
        let mut out = BTreeMap::new();
        for x in 0..self.queues.len() {
            for m in 0..MODELS.len() {
                let held: u64 = self
                    .pods
                    .iter()
                    .filter(|p| {
                        p.model == m
                            && (p.bound || p.open.is_empty())
                            && self.in_subtree(p.queue, x)
                    })
                    .map(|p| p.cards)
                    .sum();
                out.insert((x, m), (self.used(x, m, true), held, self.effective(x, m)));
            }
        }
        out
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let n = self.queues.len();
        match *op {
            Op::Create { queue, card, cards } => {
                let queue = queue % n;
                // 3: a GPU pod that names no model (the models its queue and levels allow).
                let card_name = ["A", "B", "A|B", "(none)"][usize::from(card)];
                self.next += 1;
                let pod_name = format!("p{}", self.next);
                let mut doc = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": "ml", "annotations": {
                        "scheduling.volcano.sh/queue-name": name(queue),
                        "volcano.sh/card.name": card_name}},
                    "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]}});
                if card == 3 {
                    if let Some(a) = doc["metadata"]["annotations"].as_object_mut() {
                        a.remove("volcano.sh/card.name");
                    }
                }
                // Within its leaf's own share, in a sound tree: must be admitted.
                let single = usize::from(card).min(2);
                let must = single < 2
                    && !self.has_children(queue)
                    && self.queues[queue].quota.is_some()
                    && self.own_use(queue, single) + cards <= self.share(queue, single)
                    && self.sound_above(queue, single);
                let (ok, resp) = self.send(R::pod("CREATE", doc).build());
                prop_assert!(
                    ok || !must,
                    "refused within its leaf's share in a sound tree: {card_name} x{cards} in {}: {}",
                    name(queue),
                    resp["status"]["message"]
                );
                if ok {
                    let open: Vec<usize> = match single {
                        2 => vec![0, 1],
                        m => vec![m],
                    };
                    let (model, open) = match pinned(&resp) {
                        Some(m) => (m, Vec::new()),
                        None => (open[0], open),
                    };
                    self.pods.push(Pod {
                        name: pod_name,
                        queue,
                        model,
                        open,
                        cards,
                        bound: false,
                    });
                }
            }
            Op::Bind { pod } => {
                let Some(i) = self.pending(pod) else {
                    return Ok(());
                };
                let p = self.pods[i].clone();
                let model = match p.open.as_slice() {
                    [] => p.model,
                    open => open[pod % open.len()],
                };
                let (ok, _) =
                    self.send(R::binding("ml", &p.name, &format!("node-{model}")).build());
                if ok {
                    self.pods[i].bound = true;
                    self.pods[i].model = model;
                }
            }
            Op::Delete { pod } => {
                if self.pods.is_empty() {
                    return Ok(());
                }
                let i = pod % self.pods.len();
                let p = self.pods.remove(i);
                self.send(R::pod("DELETE", json!(null)).named("ml", &p.name).build());
            }
            Op::SetQuota { queue, quota } => {
                let queue = queue % n;
                let old = queue_json(queue, &self.queues[queue]);
                let mut spec = self.queues[queue].clone();
                spec.quota = quota;
                let (ok, _) = self.send(
                    R::queue("UPDATE", queue_json(queue, &spec))
                        .old(old)
                        .build(),
                );
                if ok {
                    self.queues[queue] = spec;
                }
            }
            Op::Move { queue, parent } => {
                let queue = queue % n;
                let old = queue_json(queue, &self.queues[queue]);
                let mut spec = self.queues[queue].clone();
                spec.parent = parent.map(|p| p % n);
                let (ok, _) = self.send(
                    R::queue("UPDATE", queue_json(queue, &spec))
                        .old(old)
                        .build(),
                );
                if ok {
                    self.queues[queue] = spec;
                    let mut seen = 0;
                    let mut at = Some(queue);
                    while let Some(q) = at {
                        seen += 1;
                        prop_assert!(seen <= n, "a cycle was admitted: {:?}", self.queues);
                        at = self.queues[q].parent;
                    }
                }
            }
        }
        Ok(())
    }

    fn pending(&self, pick: usize) -> Option<usize> {
        let pending: Vec<usize> = (0..self.pods.len())
            .filter(|i| !self.pods[*i].bound)
            .collect();
        (!pending.is_empty()).then(|| pending[pick % pending.len()])
    }

    /// `charge`: the step was a pod creation (quota changes and moves may over-subscribe
    /// a level on purpose: they warn).
    fn check(
        &self,
        before: &BTreeMap<(usize, usize), (u64, u64, u64)>,
        charge: bool,
    ) -> Result<(), TestCaseError> {
        for ((x, m), (used, held, e)) in self.bound_levels() {
            if !self.is_card_level(x) {
                continue;
            }
            let (was, held_before, e_before) = before.get(&(x, m)).copied().unwrap_or((0, 0, 0));
            // Borrowing only from the pool: where the children's shares fit, a level's
            // effective use stays within its cap, or does not grow.
            let shares: u64 = self
                .card_children(x)
                .iter()
                .map(|c| self.share(*c, m))
                .sum();
            prop_assert!(
                !charge
                    || !self.has_children(x)
                    || shares > self.share(x, m)
                    || e <= self.cap(x, m)
                    || e <= e_before,
                "{} has effective use {e} {} (was {e_before}), cap {}: {:?}",
                name(x),
                MODELS[m],
                self.cap(x, m),
                self.queues
            );
            // Admission: the pods a level holds on a model (pinned or bound) stay within its
            // cap, or do not grow.
            prop_assert!(
                held <= self.cap(x, m) || held <= held_before,
                "{} holds {held} {} in its subtree (was {held_before}), cap {}: {:?}",
                name(x),
                MODELS[m],
                self.cap(x, m),
                self.queues
            );
            prop_assert!(
                used <= self.cap(x, m) || used <= was,
                "{} binds {used} {} in its subtree (was {was}), cap {}: {:?}",
                name(x),
                MODELS[m],
                self.cap(x, m),
                self.queues
            );
        }
        Ok(())
    }
}

/// The model an admitted pod is pinned to, from its patch's nodeSelector.
fn pinned(resp: &Value) -> Option<usize> {
    let patch = resp["patch"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .ok()?;
    let ops: Value = serde_json::from_slice(&bytes).ok()?;
    let text = ops.to_string();
    MODELS.iter().position(|m| {
        text.contains(&format!(r#""nvidia.com/gpu.product":"{m}""#))
            || text.contains(&format!(r#"gpu.product","value":"{m}""#))
    })
}

fn cases() -> u32 {
    std::env::var("CARD_QUOTA_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

#[test]
fn no_sequence_binds_past_a_level_or_refuses_a_share_in_a_sound_tree() {
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let strategy = (tree(), proptest::collection::vec(op(), 1..40));
    let result = runner.run(&strategy, |(queues, ops)| {
        let mut w = World::new(queues.clone());
        for (i, o) in ops.iter().enumerate() {
            let before = w.bound_levels();
            w.step(o)
                .and_then(|()| w.check(&before, matches!(o, Op::Create { .. })))
                .map_err(|e| {
                    TestCaseError::fail(format!("{e}\ntree {queues:?}\nsteps {:?}", &ops[..=i]))
                })?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
