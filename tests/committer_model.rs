//! Model-based property test of the committer the replicas run (`live::charge`), over
//! the fake API server, on tokio's paused clock.
//!
//! `tests/live_model.rs` checks the invariant on the pure core (`decide::batch`, the
//! clocks of `ledger::clock`) with a hand-driven shell around it. This test drives the
//! shell itself: two replicas, each a `webhook::server::State` with a real `Committer`
//! (group commit, compare-and-swap writes through a real `kube::Client`, holds of
//! headroom and their keeper, fences and relists through `Freshness`, the reconciler's
//! sweep), answering real AdmissionReview JSON through `handle_review`. Requests are in
//! flight while other steps run; time is tokio's and jumps past every clock (holds'
//! 10 s and 40 s, entries' 30 s store lag, the budget). Faults: each replica's pod,
//! PodGroup, Queue and ledger caches lag in their own time, a pod or PodGroup watch
//! stalls until its replica asks for a relist, admitted pods are never stored, a replica crashes (its answers in
//! flight lost, its writes in flight still landing) and restarts from a relist, and an
//! admin cuts or raises the quota through either replica's Queue hook (which seals the
//! queue before it answers; a replica whose Queue watch lags reads the Queue to lift
//! the seal), and nodes join, each replica's Node watch showing them in its own time (a
//! bind onto a node the binding replica does not show is "try again"). Two queues, `q`
//! and `q2`, share two ResourceClaims: the scheduler allocates, reserves and binds
//! through the replicas' allocation and binding hooks, each replica's claim watch lags
//! in its own time, and the resourceclaim controller releases pods that are gone.
//!
//! The oracle is the API server's pods and claims (a claim's card counts once in each
//! queue with a bound pod using it, and, from its allocation on, in the queue of the
//! pod it was allocated for), checked as each admitted request lands, against
//! the highest quota stored while it was in flight (a raise may admit it; a cut never
//! lets it past the new one once the cut is answered): a binding keeps its model's
//! bound cards within it; a CREATE keeps every stored card pod's cards within it (each
//! is charged at its CREATE) until a cut lands. The two limits docs/consistency.md
//! states are counted, not checked: CREATEs under a hold taken before a cut, and, after
//! a cut, the bind of a pod the binding replica's pod cache does not show (see
//! `check_landed` and the binding's landing). Coverage counters are required at CI's
//! count; two negative controls (a pod watch that shows a bound pod deleted while it
//! is not; a claim watch that shows allocations on the other model) must be caught.
//!
//! Cases: `CARD_QUOTA_COMMITTER_MODEL_CASES` (48 by default; CI runs 2,000).

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use card_quota::cards::QueueName;
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::ledger::entries::{Stream, Watermark};
use card_quota::ledger::ledger_record;
use card_quota::live::caches::Synced;
use card_quota::live::charge::CommitMetrics;
use card_quota::live::freshness::{Freshness, Probe};
use card_quota::live::{Committer, LedgerApi};
use card_quota::snapshot::load::{load, remove, upsert};
use card_quota::webhook::server::{handle_review, Live, State};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{json, Value};
use support::fake_api::FakeApi;

const NS: &str = "card-quota";
/// The queues: `q` (PodGroups are its) and `q2`; pods of both may share a claim.
const QUEUES: [&str; 2] = ["q", "q2"];
/// A queue with a card cap and no pods that either may be moved under (and out of)
/// through the Queue hook: a tree, its ledgers moving (R4).
const PARENT: &str = "org";
/// Every queue: the leaves, then the parent.
const ALL: [&str; 3] = ["q", "q2", PARENT];
/// The parent's cap of each model at first: below what its children's quotas add up to.
const PARENT_CAP: [u64; 2] = [2, 10];
/// (model, its node, the quota of it at first in `q`, in `q2`)
/// One model tight, one with room for holds of headroom in `q` (a write takes a quarter
/// of what is free).
const MODELS: &[(&str, &str, u64, u64)] = &[
    ("NVIDIA-GeForce-RTX-4090", "rtx-1", 2, 1),
    ("NVIDIA-H200", "h200-1", 12, 2),
];
/// ResourceClaims made apart from any pod (`c0`, `c1`), which pods of either queue use.
const CLAIMS: u8 = 2;
/// DRA devices on the slice of each model's first node.
const DEVICES: usize = 3;

fn ledger_path(queue: &str) -> String {
    format!("/api/v1/namespaces/card-quota/configmaps/card-quota-ledger.{queue}")
}

fn queue_path(queue: &str) -> String {
    format!("/apis/scheduling.volcano.sh/v1beta1/queues/{queue}")
}

/// The quota of `model` (by index) in queue `queue` (by index, of [`ALL`]) at first.
fn first_quota(queue: usize, model: usize) -> u64 {
    let (_, _, q, q2) = MODELS[model];
    [q, q2, PARENT_CAP[model]][queue]
}
const PODS: u8 = 12;
/// PodGroups a case may create.
const GROUPS: u8 = 4;
/// How long a replica may take to record a charge before "try again" (`serve`'s
/// `--ledger-budget` is 5 s by default).
const BUDGET: Duration = Duration::from_secs(5);

/// A node of `model`.
fn node_json(name: &str, model: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model}},
        "status": {"allocatable": {"nvidia.com/gpu": "64"}}})
}

/// How many nodes of each model may join during a case.
const JOINS: usize = 2;

type Quota = BTreeMap<&'static str, u64>;

/// Queue `name` with `quota` (under `parent`), as stored at `rv`.
fn queue(name: &str, quota: &Quota, rv: u64, parent: Option<&str>) -> Value {
    let mut q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name, "uid": format!("uid-queue-{name}"), "resourceVersion": rv.to_string(),
            "annotations": {"volcano.sh/card.quota": serde_json::to_string(quota).unwrap()}},
        "spec": {"weight": 1}, "status": {"state": "Open"}});
    if let Some(p) = parent {
        q["spec"]["parent"] = json!(p);
    }
    q
}

/// A Queue's card quota, read back.
fn quota_of(q: &Value) -> Quota {
    let text = q["metadata"]["annotations"]["volcano.sh/card.quota"]
        .as_str()
        .unwrap();
    let read: BTreeMap<String, u64> = serde_json::from_str(text).unwrap();
    MODELS
        .iter()
        .map(|(m, ..)| (*m, read.get(*m).copied().unwrap_or(0)))
        .collect()
}

#[derive(Debug, Clone)]
enum Step {
    /// A pod CREATE at replica `r`; an admitted pod is stored unless `lost` (another
    /// webhook refused it after card-quota admitted it).
    Create {
        r: usize,
        pod: u8,
        model: usize,
        cards: u8,
        lost: bool,
        /// The pod belongs to this PodGroup (by index) when the API server holds it: it
        /// names only its group, whose queue is its queue.
        group: Option<u8>,
        /// Its queue (by index) when it has no group.
        queue: usize,
        /// It asks for its one card through this ResourceClaim (by index), shared with
        /// every other pod that names it, of either queue, instead of `cards`.
        claim: Option<u8>,
        /// It names its model (`card.name`, stamped by hand); else (a pod of
        /// `nvidia.com/gpu` only) it is sent through the mutating call, which names and
        /// pins it, and the patched pod through the validating call, as the API server
        /// does (`model` unused).
        named: bool,
    },
    /// A PodGroup CREATE at replica `r` with a `card.request` of `cards` on one model,
    /// waiting (Pending) or already admitted by Volcano (Inqueue).
    Group {
        r: usize,
        group: u8,
        model: usize,
        cards: u8,
        inqueue: bool,
    },
    /// vc-scheduler's enqueue of a waiting PodGroup: Pending -> Inqueue at replica `r`.
    Enqueue { r: usize, group: u8 },
    /// Replica `r`'s PodGroup watch delivers up to `n` events (none while it is stalled).
    DeliverGroups { r: usize, n: u8 },
    /// Replica `r`'s PodGroup watch stalls: it delivers nothing until a relist.
    StallGroups { r: usize },
    /// The scheduler binds a stored, unbound pod through replica `r`, onto one of the
    /// stored nodes of its model (by index).
    Bind { r: usize, pod: u8, node: u8 },
    /// The scheduler's next write for the `n`-th stored, unbound claim pod (a Bind
    /// step that finds one).
    Schedule { r: usize, n: u8 },
    /// A pod is deleted.
    Delete { pod: u8 },
    /// An admin sets a queue's quota of one model through replica `r`'s Queue hook.
    SetQuota {
        r: usize,
        queue: usize,
        model: usize,
        to: u64,
    },
    /// An admin moves a leaf queue (by index) under the parent, or out of it to the
    /// root, through replica `r`'s Queue hook.
    Reparent { r: usize, queue: usize },
    /// Replica `r`'s Queue watch delivers the stored Queues.
    QueueWatch { r: usize },
    /// A node of a model joins the cluster (stored; no replica's Node watch shows it yet).
    NodeJoin { model: usize },
    /// Replica `r`'s Node watch delivers the stored nodes.
    NodeWatch { r: usize },
    /// Replica `r`'s pod watch delivers up to `n` events (none while it is stalled).
    Deliver { r: usize, n: u8 },
    /// Replica `r`'s ConfigMap watch delivers the stored ledger.
    Ledger { r: usize },
    /// Time passes: requests in flight, writers and keepers run.
    Wait { ms: u64 },
    /// Replica `r`'s pod watch stalls: it delivers nothing until a relist.
    Stall { r: usize },
    /// Replica `r`'s pod watcher lists again, if the replica asked it to.
    Relist { r: usize },
    /// Replica `r`'s ResourceClaim watch delivers up to `n` events.
    DeliverClaims { r: usize, n: u8 },
    /// The resourceclaim controller drops pods that are gone from the claims reserved for
    /// them, and deallocates a claim reserved for none (its own writes, not reviewed).
    ClaimGc,
    /// Replica `r`'s reconciler sweeps the ledgers.
    Sweep { r: usize },
    /// Replica `r` crashes and restarts from a list of every object.
    Crash { r: usize },
    /// Negative control only: replica `r`'s pod watch shows a pod deleted that is not.
    Lie { r: usize, pod: u8 },
    /// Negative control only: replica `r`'s ResourceClaim watch shows every allocated
    /// claim's device on the other model's node, from now until the replica restarts.
    LieClaim { r: usize },
}

/// Which watch lies, in a negative control.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Liar {
    None,
    Pods,
    Claims,
}

fn step(liar: Liar, moves: bool) -> BoxedStrategy<Step> {
    let r = 0..2usize;
    let pod = 0..PODS;
    let steps = prop_oneof![
        6 => (r.clone(), pod.clone(), 0..MODELS.len(), 1..4u8, prop::bool::weighted(0.15), prop::option::weighted(0.3, 0..GROUPS), 0..QUEUES.len(), prop::option::weighted(0.5, 0..CLAIMS), prop::bool::weighted(0.7))
            .prop_map(|(r, pod, model, cards, lost, group, queue, claim, named)| {
                let named = named || claim.is_some();
                Step::Create { r, pod, model, cards, lost, group, queue, claim, named }
            }),
        2 => (r.clone(), 0..GROUPS, 0..MODELS.len(), 1..5u8, any::<bool>())
            .prop_map(|(r, group, model, cards, inqueue)| Step::Group { r, group, model, cards, inqueue }),
        2 => (r.clone(), 0..GROUPS).prop_map(|(r, group)| Step::Enqueue { r, group }),
        4 => (r.clone(), 1..4u8).prop_map(|(r, n)| Step::DeliverGroups { r, n }),
        1 => r.clone().prop_map(|r| Step::StallGroups { r }),
        6 => (r.clone(), pod.clone(), 0..3u8).prop_map(|(r, pod, node)| Step::Bind { r, pod, node }),
        4 => (r.clone(), any::<u8>()).prop_map(|(r, n)| Step::Schedule { r, n }),
        1 => (0..MODELS.len()).prop_map(|model| Step::NodeJoin { model }),
        2 => r.clone().prop_map(|r| Step::NodeWatch { r }),
        3 => pod.clone().prop_map(|pod| Step::Delete { pod }),
        1 => (r.clone(), 0..ALL.len(), 0..MODELS.len(), 0..4u64).prop_map(|(r, queue, model, to)| {
            let to = to * first_quota(queue, model).max(1) / 2;
            Step::SetQuota { r, queue, model, to }
        }),
        3 => (r.clone(), 1..4u8).prop_map(|(r, n)| Step::DeliverClaims { r, n }),
        2 => Just(Step::ClaimGc),
        3 => r.clone().prop_map(|r| Step::QueueWatch { r }),
        8 => (r.clone(), 1..6u8).prop_map(|(r, n)| Step::Deliver { r, n }),
        5 => r.clone().prop_map(|r| Step::Ledger { r }),
        5 => prop::sample::select(vec![1u64, 3, 20, 400, 3_000, 12_000, 45_000])
            .prop_map(|ms| Step::Wait { ms }),
        1 => r.clone().prop_map(|r| Step::Stall { r }),
        2 => r.clone().prop_map(|r| Step::Relist { r }),
        2 => r.clone().prop_map(|r| Step::Sweep { r }),
        1 => r.clone().prop_map(|r| Step::Crash { r }),
    ]
    .boxed();
    // Queues moved under the parent and out, where asked (a property of their own:
    // `queues_moved_under_a_parent_never_bind_past_its_cap`).
    let steps = if moves {
        prop_oneof![
            40 => steps,
            1 => (r.clone(), 0..QUEUES.len()).prop_map(|(r, queue)| Step::Reparent { r, queue }),
        ]
        .boxed()
    } else {
        steps
    };
    match liar {
        Liar::None => steps,
        Liar::Pods => prop_oneof![
            2 => steps,
            1 => (r, pod).prop_map(|(r, pod)| Step::Lie { r, pod }),
        ]
        .boxed(),
        Liar::Claims => prop_oneof![
            8 => steps,
            1 => r.prop_map(|r| Step::LieClaim { r }),
        ]
        .boxed(),
    }
}

/// What the API server holds: the pods, and the events of their watch; the nodes.
#[derive(Default)]
struct Truth {
    rv: u64,
    pods: BTreeMap<String, Value>,
    /// (name, model), the first of each model there from the start.
    nodes: Vec<(String, &'static str)>,
    /// The PodGroups, the events of their watch, and their stream's resourceVersion.
    groups: BTreeMap<String, Value>,
    glog: Vec<(u64, String, Option<Value>)>,
    grv: u64,
    /// (resourceVersion, pod name, the pod or `None` for a deletion)
    log: Vec<(u64, String, Option<Value>)>,
    made: u64,
    /// Per pod uid: where its CREATE is in `log`.
    created: BTreeMap<String, usize>,
    /// The ResourceClaims, the events of their watch, and their stream's resourceVersion.
    claims: BTreeMap<String, Value>,
    clog: Vec<(u64, String, Option<Value>)>,
    crv: u64,
    /// Per allocated claim: the uid and queue of the pod it was allocated for. The
    /// allocation is that pod's binding decided (the bind after it is the same charge),
    /// so its card counts in that queue from the allocation on.
    allocated_for: BTreeMap<String, (Value, &'static str)>,
}

impl Truth {
    fn store(&mut self, name: &str, pod: Value) {
        store_in(&mut self.rv, &mut self.log, &mut self.pods, name, pod);
    }

    fn store_group(&mut self, name: &str, group: Value) {
        store_in(&mut self.grv, &mut self.glog, &mut self.groups, name, group);
    }

    fn store_claim(&mut self, name: &str, claim: Value) {
        store_in(&mut self.crv, &mut self.clog, &mut self.claims, name, claim);
    }

    /// The model of the device allocated to `claim`, if it is allocated.
    fn claim_model(&self, claim: &str) -> Option<&'static str> {
        let pool = self.claims.get(claim)?["status"]["allocation"]["devices"]["results"][0]["pool"]
            .as_str()?;
        self.nodes.iter().find(|(n, _)| n == pool).map(|(_, m)| *m)
    }

    fn delete(&mut self, name: &str) {
        if self.pods.remove(name).is_some() {
            self.rv += 1;
            self.log.push((self.rv, name.to_string(), None));
        }
    }

    /// Cards per queue and model of the stored pods: (bound, all). A claim's card counts
    /// once in each queue with a bound pod using it, and in the queue of the stored pod
    /// it was allocated for (bound only: before its allocation a claim has no model, so
    /// the CREATE line counts `nvidia.com/gpu` pods alone).
    fn cards(&self) -> BTreeMap<(&'static str, &'static str), (u64, u64)> {
        let mut out: BTreeMap<(&'static str, &'static str), (u64, u64)> = BTreeMap::new();
        let mut in_use = std::collections::BTreeSet::new();
        for p in self.pods.values() {
            let queue = queue_of(p);
            if let Some(c) = claim_of(p) {
                if p["spec"]["nodeName"].is_string() {
                    in_use.insert((queue, c));
                }
                continue;
            }
            let model = (queue, model_of(p));
            let n = gpus_of(p);
            let e = out.entry(model).or_default();
            e.1 += n;
            if p["spec"]["nodeName"].is_string() {
                e.0 += n;
            }
        }
        for (c, (uid, queue)) in &self.allocated_for {
            if self.pods.values().any(|p| p["metadata"]["uid"] == *uid) {
                in_use.insert((*queue, c.clone()));
            }
        }
        for (queue, c) in in_use {
            if let Some(model) = self.claim_model(&c) {
                out.entry((queue, model)).or_default().0 += 1;
            }
        }
        out
    }

    /// Bound cards of `model` in `queues` together (a parent's subtree): a claim's card
    /// once, however many of them use it.
    fn bound_in(&self, model: &str, queues: &std::collections::BTreeSet<&'static str>) -> u64 {
        let mut n = 0;
        let mut claims = std::collections::BTreeSet::new();
        for p in self.pods.values() {
            if !p["spec"]["nodeName"].is_string() || !queues.contains(queue_of(p)) {
                continue;
            }
            match claim_of(p) {
                Some(c) => {
                    claims.insert(c);
                }
                None if model_of(p) == model => n += gpus_of(p),
                None => {}
            }
        }
        for (c, (uid, queue)) in &self.allocated_for {
            if queues.contains(queue) && self.pods.values().any(|p| p["metadata"]["uid"] == *uid) {
                claims.insert(c.clone());
            }
        }
        n + claims
            .iter()
            .filter(|c| self.claim_model(c) == Some(model))
            .count() as u64
    }
}

/// The `nvidia.com/gpu` a pod asks for.
fn gpus_of(p: &Value) -> u64 {
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Stores `object` under `name` at its stream's next resourceVersion, with its event.
fn store_in(
    rv: &mut u64,
    log: &mut Vec<(u64, String, Option<Value>)>,
    objects: &mut BTreeMap<String, Value>,
    name: &str,
    mut object: Value,
) {
    *rv += 1;
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    log.push((*rv, name.to_string(), Some(object.clone())));
    objects.insert(name.to_string(), object);
}

/// The queue of a pod of this test: the one it names, else its PodGroup's (`q`).
fn queue_of(p: &Value) -> &'static str {
    let named = p["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"].as_str();
    QUEUES
        .iter()
        .find(|q| Some(**q) == named)
        .copied()
        .unwrap_or(QUEUES[0])
}

/// The ResourceClaim a pod of this test uses, if any.
fn claim_of(p: &Value) -> Option<String> {
    p["spec"]["resourceClaims"][0]["resourceClaimName"]
        .as_str()
        .map(str::to_string)
}

fn claim_name(i: u8) -> String {
    format!("c{i}")
}

/// ResourceClaim `name`: one GPU of NVIDIA's class, made apart from any pod.
fn claim_json(name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
}

/// NVIDIA's DeviceClass of whole GPUs.
fn device_class() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}})
}

/// The ResourceSlice of `node`: `DEVICES` GPUs of `model`.
fn slice_json(node: &str, model: &str) -> Value {
    let product = model.replace('-', " ");
    let devices: Vec<Value> = (0..DEVICES)
        .map(|i| {
            json!({"name": format!("gpu-{i}"),
            "attributes": {"type": {"string": "gpu"}, "productName": {"string": product}}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}})
}

/// One admission call to a replica's webhook: its response.
async fn call(st: &State, review: &Value, mutate: bool) -> Value {
    let body = serde_json::to_vec(review).unwrap();
    let out = handle_review(st, &body, mutate).await.unwrap();
    serde_json::from_slice::<Value>(&out).unwrap()["response"].clone()
}

/// The model a pod of this test runs on: the one it names, else the one card-quota's
/// mutating call pinned it to (its product nodeSelector).
fn model_of(p: &Value) -> &'static str {
    pod_model(p).unwrap_or_else(|| panic!("pod of no model: {p}"))
}

fn pod_model(p: &Value) -> Option<&'static str> {
    let card = p["metadata"]["annotations"]["volcano.sh/card.name"].as_str();
    let pinned = p["spec"]["nodeSelector"]["nvidia.com/gpu.product"].as_str();
    MODELS
        .iter()
        .find(|(m, ..)| Some(*m) == card)
        .or_else(|| MODELS.iter().find(|(m, ..)| Some(*m) == pinned))
        .map(|(m, ..)| *m)
}

fn pod_name(i: u8) -> String {
    format!("p{i}")
}

/// A pod of `model` (none: it names none): of PodGroup `group` (and its queue, `q`) or
/// of `queue`; its cards through `claim` (one, shared) or `cards` of `nvidia.com/gpu`.
fn pod_json(
    name: &str,
    uid: &str,
    model: Option<&str>,
    cards: u8,
    group: Option<&str>,
    queue: &str,
    claim: Option<&str>,
) -> Value {
    let pod = support::pod(name);
    let pod = match group {
        Some(_) => pod,
        None => pod.queue(queue),
    };
    let pod = match model {
        Some(m) => pod.card(m),
        None => pod,
    }
    .scheduler("volcano")
    .stored(uid, "");
    let mut p = match claim {
        Some(_) => pod.build(),
        None => pod.gpus(&cards.to_string()).build(),
    };
    if let Some(c) = claim {
        p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu"}]);
        p["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": c}]);
    }
    if let Some(g) = group {
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!(g);
    }
    // The queue card-quota's mutating call stamps on every card pod it admits (the
    // validating call and the store see the patched pod): a pod counts in it whatever
    // a cache shows of its PodGroup.
    let queue = if group.is_some() { QUEUES[0] } else { queue };
    p["metadata"]["annotations"]["volcano.sh/card.queue"] = json!(queue);
    p
}

fn group_name(i: u8) -> String {
    format!("g{i}")
}

/// PodGroup `name` of queue `q` asking for `cards` of `model`, in `phase` (none: Pending).
fn group_json(name: &str, model: &str, cards: u8, phase: Option<&str>) -> Value {
    let mut g = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "annotations": {"volcano.sh/card.request": json!({model: cards}).to_string()}},
        "spec": {"queue": "q", "minMember": 1}});
    if let Some(p) = phase {
        g["status"] = json!({"phase": p});
    }
    g
}

/// One replica: its caches (the snapshot), how far its watches have come, its committer.
struct Replica {
    state: Arc<State>,
    /// How many pod events of the log its watch has delivered.
    cursor: usize,
    /// How many PodGroup events of theirs its watch has delivered.
    gcursor: usize,
    /// How many ResourceClaim events of theirs its watch has delivered.
    ccursor: usize,
    /// Negative control: its claim watch shows allocations on the wrong model.
    lies_about_claims: bool,
    stalled: bool,
    /// Its PodGroup watch has stalled.
    gstalled: bool,
    asked: Arc<AtomicBool>,
    asked_groups: Arc<AtomicBool>,
    asked_claims: Arc<AtomicBool>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Replica {
    /// Started from a list of every object (a fresh process, or a restart), as
    /// `serve` starts: caches at the API server's resourceVersion, holds taken under an
    /// identity of its own.
    fn start(api: &FakeApi, truth: &Arc<Mutex<Truth>>, me: String) -> Self {
        let (mut snap, skipped) = load("").unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        for q in ALL {
            upsert(&mut snap, &api.object(&queue_path(q)).unwrap()).unwrap();
        }
        upsert(&mut snap, &device_class()).unwrap();
        for (model, node, ..) in MODELS {
            upsert(&mut snap, &slice_json(node, model)).unwrap();
        }
        let (cursor, gcursor, ccursor) = {
            let t = truth.lock().unwrap();
            for (name, model) in &t.nodes {
                upsert(&mut snap, &node_json(name, model)).unwrap();
            }
            for c in t.claims.values() {
                upsert(&mut snap, c).unwrap();
            }
            for p in t.pods.values() {
                upsert(&mut snap, p).unwrap();
            }
            for g in t.groups.values() {
                upsert(&mut snap, g).unwrap();
            }
            snap.set_progress(Watermark {
                pods: t.rv,
                podgroups: t.grv,
                claims: t.crv,
            });
            (t.log.len(), t.glog.len(), t.clog.len())
        };
        for q in ALL {
            if let Some(cm) = api.object(&ledger_path(q)) {
                let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(cm).unwrap();
                snap.upsert_ledger(ledger_record(&cm).unwrap());
            }
        }
        let probe: Probe = {
            let truth = truth.clone();
            Arc::new(move || {
                let (pods, podgroups, claims) = {
                    let t = truth.lock().unwrap();
                    (t.rv, t.grv, t.crv)
                };
                Box::pin(async move {
                    Ok(Watermark {
                        pods,
                        podgroups,
                        claims,
                    })
                })
            })
        };
        let freshness = Freshness::new(probe);
        let committer = Arc::new(
            Committer::new(LedgerApi::new(api.client(), NS), BUDGET)
                .with_freshness(freshness.clone())
                .with_queue_reads(kube::Api::all_with(
                    api.client(),
                    &card_quota::live::volcano::queue_resource(),
                ))
                .with_holds(me),
        );
        let snapshot = Arc::new(Mutex::new(snap));
        let state = Arc::new(State::live(
            snapshot.clone(),
            Config::default(),
            Live {
                committer: committer.clone(),
                synced: Arc::new(Synced::already()),
                events: None,
                routing: None,
            },
        ));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let metrics: Arc<dyn CommitMetrics> = state.metrics.ledger.clone();
        let asked = Arc::new(AtomicBool::new(false));
        let asked_groups = Arc::new(AtomicBool::new(false));
        let asked_claims = Arc::new(AtomicBool::new(false));
        let tasks = vec![
            tokio::spawn(committer.keep_holds(snapshot, Config::default(), metrics, stop_rx)),
            tokio::spawn({
                let asked = asked.clone();
                let freshness = freshness.clone();
                async move {
                    loop {
                        freshness.relists(Stream::Pods).asked().await;
                        asked.store(true, Ordering::SeqCst);
                    }
                }
            }),
            tokio::spawn({
                let asked = asked_groups.clone();
                let freshness = freshness.clone();
                async move {
                    loop {
                        freshness.relists(Stream::PodGroups).asked().await;
                        asked.store(true, Ordering::SeqCst);
                    }
                }
            }),
            tokio::spawn({
                let asked = asked_claims.clone();
                async move {
                    loop {
                        freshness.relists(Stream::Claims).asked().await;
                        asked.store(true, Ordering::SeqCst);
                    }
                }
            }),
        ];
        Self {
            state,
            cursor,
            gcursor,
            ccursor,
            lies_about_claims: false,
            stalled: false,
            gstalled: false,
            asked,
            asked_groups,
            asked_claims,
            stop,
            tasks,
        }
    }

    /// Delivers up to `n` events of `log`, the watch of `stream`.
    fn deliver(&mut self, stream: Stream, log: &[(u64, String, Option<Value>)], n: usize) {
        let (kind, cursor) = match stream {
            Stream::Pods => ("Pod", &mut self.cursor),
            Stream::PodGroups => ("PodGroup", &mut self.gcursor),
            Stream::Claims => return self.deliver_claims(log, n),
        };
        let mut snap = self.state.snapshot.lock().unwrap();
        for (rv, name, object) in log.iter().skip(*cursor).take(n) {
            match object {
                Some(o) => {
                    upsert(&mut snap, o).unwrap();
                }
                None => remove(&mut snap, kind, "ml", name),
            }
            let mut p = snap.progress();
            let at = p.of_mut(stream);
            *at = (*at).max(*rv);
            snap.set_progress(p);
            *cursor += 1;
        }
    }
}

impl Replica {
    /// Its ResourceClaim watch delivers up to `n` events of `log`.
    fn deliver_claims(&mut self, log: &[(u64, String, Option<Value>)], n: usize) {
        let mut snap = self.state.snapshot.lock().unwrap();
        for (rv, name, object) in log.iter().skip(self.ccursor).take(n) {
            match object {
                Some(o) if self.lies_about_claims => {
                    upsert(&mut snap, &lie_about(o)).unwrap();
                }
                Some(o) => {
                    upsert(&mut snap, o).unwrap();
                }
                None => remove(&mut snap, "ResourceClaim", "ml", name),
            }
            let mut p = snap.progress();
            p.claims = p.claims.max(*rv);
            snap.set_progress(p);
            self.ccursor += 1;
        }
    }
}

/// A claim as a lying watch shows it: allocated on the other model's node.
fn lie_about(claim: &Value) -> Value {
    let mut c = claim.clone();
    if c["status"]["allocation"].is_object() {
        let on = &mut c["status"]["allocation"]["devices"]["results"][0]["pool"];
        let other = MODELS.iter().find(|(_, n, ..)| *on != **n).unwrap().1;
        *on = json!(other);
        c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
            ["values"] = json!([other]);
    }
    c
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

enum Asked {
    Create {
        name: String,
        pod: Value,
        lost: bool,
    },
    Bind {
        name: String,
        uid: String,
        node: String,
        /// The binding replica's pod cache showed the pod when the bind was asked.
        seen: bool,
        /// The node joined during the case.
        joined: bool,
    },
    Queue {
        new: Value,
    },
    /// A PodGroup CREATE or its enqueue (an UPDATE to Inqueue).
    Group {
        name: String,
        group: Value,
    },
    /// The scheduler's write of a claim's status: its allocation, or one more pod it is
    /// reserved for; lands only on the version it was read at (`old_rv`).
    Claim {
        name: String,
        new: Value,
        old_rv: Value,
    },
}

/// The highest quota of each queue and model.
type Quotas = BTreeMap<&'static str, Quota>;

struct Flight {
    r: usize,
    asked: Asked,
    /// The answer, and the object as a mutating call's patch left it.
    answer: tokio::task::JoinHandle<(Value, Option<Value>)>,
    /// The highest quota of each queue and model stored while the request was in flight.
    quota: Quotas,
}

#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    creates: [u64; 3],
    /// CREATEs of pods naming no model, past the mutating call (by the validating
    /// call's outcome), and the binds of those pods admitted.
    unnamed: [u64; 3],
    unnamed_binds: u64,
    /// Queue moves under or out of the parent that landed, and bindings checked
    /// against the parent's cap.
    moves: u64,
    parent_binds: u64,
    queue_refusals: u64,
    binds: [u64; 3],
    /// Binds onto a node that joined during the case (by outcome): "try again" while the
    /// binding replica's Node watch has not shown it.
    joined_binds: [u64; 3],
    /// PodGroup CREATEs and enqueues (by outcome); pods asked for as members of one held,
    /// and those stored.
    groups: [u64; 3],
    group_pods_asked: u64,
    group_pods: u64,
    /// PodGroup watches relisted (a replica behind on them asked).
    group_relists: u64,
    /// ResourceClaim watches relisted (a replica behind on them asked).
    claim_relists: u64,
    /// Claim status writes (allocations and reservations) and binds of claim pods, by
    /// outcome; reservations admitted that left a claim reserved for pods of both queues;
    /// claims the resourceclaim controller released.
    claim_writes: [u64; 3],
    claim_binds: [u64; 3],
    shared: u64,
    claim_gcs: u64,
    crashes: u64,
    relists: u64,
    lies: u64,
    /// Steps at which a model's quota was full of bound cards.
    full: u64,
    /// Queue writes admitted that lowered a quota / raised one; refused ("try again").
    cuts: u64,
    raises: u64,
    queue_retries: u64,
    queue_conflicts: u64,
    /// Admitted CREATEs and bindings that landed while the quota was below its highest
    /// in their flight (a cut answered meanwhile).
    after_cut: u64,
    /// Binds admitted, of pods charged before a cut, through a replica whose pod cache
    /// did not show them (not checked: the net fails open there).
    unseen_binds_after_cut: u64,
    /// Ledger writes and conflicts at the fake API server.
    writes: u64,
    conflicts: u64,
    /// Charges admitted under a hold, with no write of their own.
    held: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        for i in 0..3 {
            self.creates[i] += o.creates[i];
            self.unnamed[i] += o.unnamed[i];
            self.binds[i] += o.binds[i];
            self.joined_binds[i] += o.joined_binds[i];
            self.groups[i] += o.groups[i];
            self.claim_writes[i] += o.claim_writes[i];
            self.claim_binds[i] += o.claim_binds[i];
        }
        self.shared += o.shared;
        self.unnamed_binds += o.unnamed_binds;
        self.moves += o.moves;
        self.parent_binds += o.parent_binds;
        self.queue_refusals += o.queue_refusals;
        self.claim_gcs += o.claim_gcs;
        self.crashes += o.crashes;
        self.group_pods_asked += o.group_pods_asked;
        self.group_pods += o.group_pods;
        self.group_relists += o.group_relists;
        self.claim_relists += o.claim_relists;
        self.relists += o.relists;
        self.lies += o.lies;
        self.full += o.full;
        self.cuts += o.cuts;
        self.raises += o.raises;
        self.queue_retries += o.queue_retries;
        self.queue_conflicts += o.queue_conflicts;
        self.after_cut += o.after_cut;
        self.unseen_binds_after_cut += o.unseen_binds_after_cut;
        self.writes += o.writes;
        self.conflicts += o.conflicts;
        self.held += o.held;
    }
}

/// 0 admitted, 1 refused, 2 "try again".
fn outcome(resp: &Value) -> usize {
    if resp["allowed"] == true {
        0
    } else if resp["status"]["reason"] == "TryAgain" {
        2
    } else {
        1
    }
}

fn held(st: &State) -> u64 {
    st.metrics
        .encode()
        .lines()
        .find(|l| l.starts_with("card_quota_ledger_held_charges"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

struct World {
    api: FakeApi,
    truth: Arc<Mutex<Truth>>,
    /// The stored Queues' quotas.
    quota: Quotas,
    /// A cut has landed in this case: from then on the CREATE line is not checked (see
    /// `check_landed`), the binding line is.
    cut: bool,
    replicas: Vec<Replica>,
    incarnations: u64,
    flights: Vec<Flight>,
    sweeps: Vec<tokio::task::JoinHandle<()>>,
    tally: Tally,
    trace: Vec<String>,
}

impl World {
    fn new() -> Self {
        let api = FakeApi::new().with_delay(Duration::from_micros(300));
        let quota: Quotas = ALL
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let q: Quota = MODELS
                    .iter()
                    .enumerate()
                    .map(|(m, (model, ..))| (*model, first_quota(i, m)))
                    .collect();
                api.seed(queue(name, &q, 1, None));
                (*name, q)
            })
            .collect();
        let mut truth = Truth {
            nodes: MODELS
                .iter()
                .map(|(m, n, ..)| (n.to_string(), *m))
                .collect(),
            ..Truth::default()
        };
        for c in 0..CLAIMS {
            let name = claim_name(c);
            truth.store_claim(&name, claim_json(&name));
        }
        let truth = Arc::new(Mutex::new(truth));
        let replicas = (0..2)
            .map(|r| Replica::start(&api, &truth, format!("r{r}.0")))
            .collect();
        Self {
            api,
            truth,
            quota,
            cut: false,
            replicas,
            incarnations: 0,
            flights: Vec::new(),
            sweeps: Vec::new(),
            tally: Tally::default(),
            trace: Vec::new(),
        }
    }

    fn ask(&mut self, r: usize, review: Value, asked: Asked) {
        let st = self.replicas[r].state.clone();
        let answer = tokio::spawn(async move { (call(&st, &review, false).await, None) });
        self.fly(r, asked, answer);
    }

    /// A CREATE through the mutating call at replica `r` and, admitted, the object as
    /// its patch leaves it through the validating call at replica `v`; the answer is the
    /// validating call's (or the mutating call's refusal), with the patched object.
    fn ask_mutated(&mut self, r: usize, v: usize, review: Value, asked: Asked) {
        let (mst, vst) = (
            self.replicas[r].state.clone(),
            self.replicas[v].state.clone(),
        );
        let answer = tokio::spawn(async move {
            let resp = call(&mst, &review, true).await;
            if resp["allowed"] != true {
                return (resp, None);
            }
            let mut obj = review["request"]["object"].clone();
            if let Some(p) = resp["patch"].as_str() {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
                let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
                json_patch::patch(&mut obj, &patch).unwrap();
            }
            let mut validating = review.clone();
            validating["request"]["object"] = obj.clone();
            (call(&vst, &validating, false).await, Some(obj))
        });
        self.fly(r, asked, answer);
    }

    fn fly(
        &mut self,
        r: usize,
        asked: Asked,
        answer: tokio::task::JoinHandle<(Value, Option<Value>)>,
    ) {
        let quota = self.quota.clone();
        self.flights.push(Flight {
            r,
            asked,
            answer,
            quota,
        });
    }

    /// Applies the answers that came back: what the API server does with them.
    async fn land(&mut self) -> Result<(), TestCaseError> {
        let mut i = 0;
        while i < self.flights.len() {
            if !self.flights[i].answer.is_finished() {
                i += 1;
                continue;
            }
            let f = self.flights.swap_remove(i);
            let (resp, patched) = f.answer.await.unwrap();
            let o = outcome(&resp);
            let mut t = self.truth.lock().unwrap();
            match f.asked {
                Asked::Create { name, pod, lost } => {
                    // Stored as the mutating call patched it.
                    if patched.is_some() {
                        self.tally.unnamed[o] += 1;
                    }
                    let pod = patched.unwrap_or(pod);
                    self.tally.creates[o] += 1;
                    self.trace
                        .push(format!("  create {name} at r{}: {}", f.r, brief(&resp)));
                    // The API server refuses a name it holds (AlreadyExists).
                    if o == 0 && !lost && !t.pods.contains_key(&name) {
                        let (queue, model) = (queue_of(&pod), model_of(&pod));
                        if pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"]
                            .is_string()
                        {
                            self.tally.group_pods += 1;
                        }
                        let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
                        let at = t.log.len();
                        t.created.insert(uid, at);
                        t.store(&name, pod);
                        drop(t);
                        self.check_landed(queue, model, &f.quota, None)?;
                        continue;
                    }
                }
                Asked::Group { name, group } => {
                    self.tally.groups[o] += 1;
                    self.trace
                        .push(format!("  group {name} at r{}: {}", f.r, brief(&resp)));
                    let is_create = group["metadata"]["resourceVersion"].is_null();
                    let stored = t.groups.get(&name);
                    // CREATE: AlreadyExists when held; the enqueue: a conflict unless the
                    // group is still as it was read (Pending).
                    let lands = if is_create {
                        stored.is_none()
                    } else {
                        stored.is_some_and(|g| {
                            g.pointer("/status/phase").is_none()
                                && g["metadata"]["resourceVersion"]
                                    == group["metadata"]["resourceVersion"]
                        })
                    };
                    if o == 0 && lands {
                        t.store_group(&name, group);
                    }
                }
                Asked::Bind {
                    name,
                    uid,
                    node,
                    seen,
                    joined,
                } => {
                    self.tally.binds[o] += 1;
                    if joined {
                        self.tally.joined_binds[o] += 1;
                    }
                    if t.pods.get(&name).and_then(claim_of).is_some() {
                        self.tally.claim_binds[o] += 1;
                    }
                    self.trace
                        .push(format!("  bind {name} at r{}: {}", f.r, brief(&resp)));
                    let current = t.pods.get(&name).filter(|p| {
                        p["metadata"]["uid"] == uid.as_str() && !p["spec"]["nodeName"].is_string()
                    });
                    if let (0, Some(p)) = (o, current) {
                        let mut p = p.clone();
                        let queue = queue_of(&p);
                        let cards_before = t.cards();
                        // A claim pod's card is its claim's device.
                        let model = match claim_of(&p) {
                            Some(c) => t.claim_model(&c).unwrap_or_else(|| model_of(&p)),
                            None => model_of(&p),
                        };
                        if p["spec"]["nodeSelector"]["nvidia.com/gpu.product"].is_string() {
                            self.tally.unnamed_binds += 1;
                        }
                        p["spec"]["nodeName"] = json!(node);
                        let before = cards_before.get(&(queue, model)).map_or(0, |c| c.0);
                        let parent_before = t.bound_in(model, &self.under_parent());
                        t.store(&name, p);
                        // With pins on, the bind of a pod the binding replica does not
                        // show is a net that fails open (issue 46 #8): after a cut, a
                        // pod charged before it (or under a hold taken before it) may
                        // be bound past it there. Without a cut, its CREATE's charge
                        // keeps it within the quota all the same (the CREATE line).
                        drop(t);
                        if self.cut && !seen {
                            self.tally.unseen_binds_after_cut += 1;
                            continue;
                        }
                        self.check_landed(queue, model, &f.quota, Some((before, parent_before)))?;
                        continue;
                    }
                }
                Asked::Claim { name, new, old_rv } => {
                    self.tally.claim_writes[o] += 1;
                    self.trace
                        .push(format!("  claim {name} at r{}: {}", f.r, brief(&resp)));
                    let current = t
                        .claims
                        .get(&name)
                        .map(|c| &c["metadata"]["resourceVersion"]);
                    if o == 0 && current == Some(&old_rv) {
                        // Reserved for pods of both queues: a sharer of another queue.
                        let queues: std::collections::BTreeSet<&str> = new["status"]["reservedFor"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|x| {
                                t.pods
                                    .values()
                                    .find(|p| p["metadata"]["uid"] == x["uid"])
                                    .map(queue_of)
                            })
                            .collect();
                        if queues.len() > 1 {
                            self.tally.shared += 1;
                        }
                        let allocating = t.claim_model(&name).is_none();
                        let before = t.cards();
                        let members = self.under_parent();
                        let parent_before: Vec<u64> = MODELS
                            .iter()
                            .map(|(m, ..)| t.bound_in(m, &members))
                            .collect();
                        t.store_claim(&name, new.clone());
                        if allocating {
                            // The allocation is its pod's binding decided: checked as one.
                            let uid = new["status"]["reservedFor"][0]["uid"].clone();
                            let pod = t.pods.values().find(|p| p["metadata"]["uid"] == uid);
                            let queue = pod.map_or(QUEUES[0], queue_of);
                            t.allocated_for.insert(name.clone(), (uid, queue));
                            let model = t.claim_model(&name).unwrap();
                            let before = before.get(&(queue, model)).map_or(0, |c| c.0);
                            let at = MODELS.iter().position(|(m, ..)| *m == model).unwrap();
                            drop(t);
                            let parent_before = parent_before[at];
                            self.check_landed(
                                queue,
                                model,
                                &f.quota,
                                Some((before, parent_before)),
                            )?;
                            continue;
                        }
                    }
                }
                Asked::Queue { new } => {
                    self.trace
                        .push(format!("  queue write at r{}: {}", f.r, brief(&resp)));
                    drop(t);
                    let name = ALL
                        .iter()
                        .copied()
                        .find(|q| new["metadata"]["name"] == *q)
                        .unwrap();
                    let current = self.api.object(&queue_path(name)).unwrap();
                    let stale = current["metadata"]["resourceVersion"]
                        != new["metadata"]["resourceVersion"];
                    match o {
                        // The API server refuses an update of a version it no longer
                        // holds (409 Conflict): another admin's write landed first.
                        0 if stale => self.tally.queue_conflicts += 1,
                        0 => {
                            let members = self.under_parent();
                            let t = self.truth.lock().unwrap();
                            let before: Vec<u64> = MODELS
                                .iter()
                                .map(|(m, ..)| t.bound_in(m, &members))
                                .collect();
                            drop(t);
                            let stored = self.api.store(new);
                            let after = self.under_parent();
                            if after != members {
                                // A move never puts the parent's bound cards past its cap
                                // (the highest stored while it was in flight: a cut
                                // landing meanwhile is the admin's race, as for any
                                // request in flight).
                                self.tally.moves += 1;
                                let t = self.truth.lock().unwrap();
                                for (i, (m, ..)) in MODELS.iter().enumerate() {
                                    let (now, cap) = (t.bound_in(m, &after), f.quota[PARENT][m]);
                                    prop_assert!(
                                        now <= cap.max(before[i]),
                                        "a move put {now} {m} cards bound under {PARENT}, cap {cap}\n{}",
                                        self.trace.join("\n")
                                    );
                                }
                            }
                            let quota = quota_of(&stored);
                            if quota.iter().any(|(m, q)| *q < self.quota[name][m]) {
                                self.tally.cuts += 1;
                                self.cut = true;
                            } else {
                                self.tally.raises += 1;
                            }
                            for other in &mut self.flights {
                                let highest = other.quota.entry(name).or_default();
                                for (m, q) in &quota {
                                    let e = highest.entry(m).or_default();
                                    *e = (*e).max(*q);
                                }
                            }
                            self.quota.insert(name, quota);
                        }
                        2 => self.tally.queue_retries += 1,
                        // A move whose subtree does not fit under the parent.
                        _ => self.tally.queue_refusals += 1,
                    }
                }
            }
        }
        Ok(())
    }

    /// An admitted CREATE or binding of a pod of `model` landed: nothing past `flight`,
    /// the highest quota stored while it was in flight. (Other models may be past a cut
    /// by what was admitted before it.) `binding`: the queue's bound cards of `model`
    /// before a binding (or a claim's allocation, its pod's binding decided) landed; a
    /// binding that adds no card (a claim pod whose allocation counts already) adds
    /// nothing past the quota.
    ///
    /// The binding line is the invariant and is checked whatever happened. The CREATE
    /// line (stored card pods within the quota) only until a cut lands: pods admitted
    /// before a cut may be past it, and a replica admitting under its hold of headroom
    /// does not read the ledger for up to `HOLD_USE`, so its CREATEs meet a cut (its
    /// seal) that much later, within the spare it held; bindings are never held.
    /// An admin's UPDATE of a stored Queue `old` to `quota` under `parent`, through
    /// replica `r`'s Queue hook.
    fn write_queue(&mut self, r: usize, old: Value, quota: &Quota, parent: Option<&str>) {
        let name = old["metadata"]["name"].as_str().unwrap().to_string();
        let rv: u64 = old["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let new = queue(&name, quota, rv, parent);
        let review = R::queue("UPDATE", new.clone())
            .old(old)
            .uid(&format!("queue-{rv}-{}", self.flights.len()))
            .build();
        self.ask(r, review, Asked::Queue { new });
    }

    /// The leaves the API server stores under the parent.
    fn under_parent(&self) -> std::collections::BTreeSet<&'static str> {
        QUEUES
            .iter()
            .copied()
            .filter(|q| {
                self.api.object(&queue_path(q)).unwrap()["spec"]["parent"].as_str() == Some(PARENT)
            })
            .collect()
    }

    fn check_landed(
        &mut self,
        queue: &str,
        model: &str,
        flight: &Quotas,
        binding: Option<(u64, u64)>,
    ) -> Result<(), TestCaseError> {
        // Under the parent, its cap holds at every binding too (bound cards of its
        // subtree, a shared claim's card once), a binding that adds none aside.
        let members = self.under_parent();
        if let (true, Some((_, before))) = (members.contains(queue), binding) {
            let cap = flight[PARENT][model];
            let bound = self.truth.lock().unwrap().bound_in(model, &members);
            self.tally.parent_binds += 1;
            prop_assert!(
                bound <= cap.max(before),
                "{bound} {model} cards bound under {PARENT}, cap {cap}\n{}",
                self.trace.join("\n")
            );
        }
        let binding = binding.map(|(before, _)| before);
        let flight = &flight[queue];
        if self.quota[queue][model] < flight[model] {
            self.tally.after_cut += 1;
        }

        let t = self.truth.lock().unwrap();
        let cards = t.cards();
        for ((queue, model), (bound, all)) in cards
            .into_iter()
            .filter(|((q, m), _)| *q == queue && *m == model)
        {
            let quota = flight[model];
            prop_assert!(
                binding.is_none_or(|before| bound <= quota.max(before)),
                "{bound} {model} cards bound in {queue}, quota {quota}\n{}",
                self.trace.join("\n")
            );
            prop_assert!(
                binding.is_some() || self.cut || all <= quota,
                "{all} {model} cards in stored pods of {queue} (each charged at its CREATE), quota {quota}\n{}",
                self.trace.join("\n")
            );
        }
        Ok(())
    }

    /// Counts steps at which a model's quota is full of bound cards.
    fn note_full(&mut self) {
        let t = self.truth.lock().unwrap();
        for ((queue, model), (bound, _)) in t.cards() {
            if bound == self.quota[queue][model] && bound > 0 {
                self.tally.full += 1;
            }
        }
    }

    /// The scheduler's next write for stored, unbound pod `pod` at replica `r`: a claim
    /// pod's claim allocated (onto a node of the model `node` picks), then reserved for
    /// it, then the binding; another pod's binding onto its model's node `node`.
    fn bind(&mut self, r: usize, pod: u8, node: u8) -> Result<(), TestCaseError> {
        let name = pod_name(pod);
        let t = self.truth.lock().unwrap();
        let Some(p) = t
            .pods
            .get(&name)
            .filter(|p| !p["spec"]["nodeName"].is_string())
        else {
            return Ok(());
        };
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        if let Some(c) = claim_of(p) {
            // The scheduler allocates the claim, then reserves it for the pod,
            // then binds the pod onto the allocation's node: one write a step.
            let old = t.claims[&c].clone();
            let reserved = old["status"]["reservedFor"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x["uid"] == uid.as_str()));
            let write = match t.claim_model(&c) {
                None => {
                    // Mostly on a node of the model the pod names; the third
                    // choice is the other model's (refused: not what it names).
                    let named = model_of(p);
                    let model = match node {
                        2 => MODELS.iter().find(|(m, ..)| *m != named).unwrap().0,
                        _ => named,
                    };
                    let (_, at, ..) = MODELS.iter().find(|(m, ..)| *m == model).unwrap();
                    let taken: Vec<String> = t
                        .claims
                        .values()
                        .filter_map(|c| {
                            let r = &c["status"]["allocation"]["devices"]["results"][0];
                            (r["pool"] == *at).then(|| r["device"].to_string())
                        })
                        .collect();
                    let Some(device) = (0..DEVICES)
                        .map(|i| format!("gpu-{i}"))
                        .find(|d| !taken.contains(&json!(d).to_string()))
                    else {
                        return Ok(());
                    };
                    let mut new = old.clone();
                    new["status"] = json!({"allocation": {
                        "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": at, "device": device}]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [at]}]}]}},
                        "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]});
                    Some(new)
                }
                Some(_) if !reserved => {
                    let mut new = old.clone();
                    new["status"]["reservedFor"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"resource": "pods", "name": name, "uid": uid}));
                    Some(new)
                }
                Some(_) => None,
            };
            if let Some(new) = write {
                drop(t);
                let old_rv = old["metadata"]["resourceVersion"].clone();
                let review = R::claim("UPDATE", new.clone())
                    .subresource("status")
                    .old(old)
                    .uid(&format!("claim-{c}-{}", self.flights.len()))
                    .build();
                self.ask(
                    r,
                    review,
                    Asked::Claim {
                        name: c,
                        new,
                        old_rv,
                    },
                );
                return Ok(());
            }
        }
        let card = match claim_of(p) {
            Some(c) => t.claim_model(&c),
            None => pod_model(p),
        };
        // A claim pod goes where its claim's device is (the first node of its model).
        let of_model: Vec<&str> = t
            .nodes
            .iter()
            .filter(|(_, m)| Some(*m) == card)
            .map(|(n, _)| n.as_str())
            .take(if claim_of(p).is_some() { 1 } else { usize::MAX })
            .collect();
        let node = of_model[node as usize % of_model.len()].to_string();
        let joined = !MODELS.iter().any(|(_, n, ..)| *n == node);
        let seen = t
            .created
            .get(&uid)
            .is_some_and(|at| *at < self.replicas[r].cursor);
        drop(t);
        let n = self.flights.len();
        let review = R::binding("ml", &name, &node)
            .uid(&format!("bind-{uid}-{n}"))
            .build();
        self.ask(
            r,
            review,
            Asked::Bind {
                name,
                uid,
                node,
                seen,
                joined,
            },
        );
        Ok(())
    }
    async fn apply(&mut self, s: &Step) -> Result<(), TestCaseError> {
        self.trace.push(format!("{s:?}"));
        match *s {
            Step::Create {
                r,
                pod,
                model,
                cards,
                lost,
                group,
                queue,
                claim,
                named,
            } => {
                let name = pod_name(pod);
                let mut t = self.truth.lock().unwrap();
                t.made += 1;
                let uid = format!("uid-{name}-{}", t.made);
                let group = group.map(group_name).filter(|g| t.groups.contains_key(g));
                drop(t);
                if group.is_some() {
                    self.tally.group_pods_asked += 1;
                }
                // A pod of a PodGroup takes its cards as `nvidia.com/gpu`.
                let claim = claim.filter(|_| group.is_none()).map(claim_name);
                let p = pod_json(
                    &name,
                    &uid,
                    (named || claim.is_some()).then_some(MODELS[model].0),
                    cards,
                    group.as_deref(),
                    QUEUES[queue],
                    claim.as_deref(),
                );
                let mut sent = p.clone();
                sent["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("resourceVersion");
                let review = R::pod("CREATE", sent).uid(&format!("review-{uid}")).build();
                if named || claim.is_some() {
                    self.ask(r, review, Asked::Create { name, pod: p, lost });
                } else {
                    // The Service spreads the two calls over the replicas.
                    let v = (r + pod as usize + cards as usize) % self.replicas.len();
                    self.ask_mutated(r, v, review, Asked::Create { name, pod: p, lost });
                }
            }
            Step::Bind { r, pod, node } => self.bind(r, pod, node)?,
            Step::Schedule { r, n } => {
                let t = self.truth.lock().unwrap();
                let waiting: Vec<u8> = (0..PODS)
                    .filter(|i| {
                        t.pods.get(&pod_name(*i)).is_some_and(|p| {
                            claim_of(p).is_some() && !p["spec"]["nodeName"].is_string()
                        })
                    })
                    .collect();
                drop(t);
                if !waiting.is_empty() {
                    let pod = waiting[n as usize % waiting.len()];
                    self.bind(r, pod, n % 3)?;
                }
            }
            Step::Delete { pod } => self.truth.lock().unwrap().delete(&pod_name(pod)),
            Step::SetQuota {
                r,
                queue: q,
                model,
                to,
            } => {
                let old = self.api.object(&queue_path(ALL[q])).unwrap();
                let mut quota = quota_of(&old);
                quota.insert(MODELS[model].0, to);
                let parent = old["spec"]["parent"].as_str().map(str::to_string);
                self.write_queue(r, old, &quota, parent.as_deref());
            }
            Step::Reparent { r, queue: q } => {
                let old = self.api.object(&queue_path(QUEUES[q])).unwrap();
                let quota = quota_of(&old);
                let parent = match old["spec"]["parent"].as_str() {
                    Some(_) => None,
                    None => Some(PARENT),
                };
                self.write_queue(r, old, &quota, parent);
            }
            Step::Group {
                r,
                group,
                model,
                cards,
                inqueue,
            } => {
                let name = group_name(group);
                let phase = inqueue.then_some("Inqueue");
                let g = group_json(&name, MODELS[model].0, cards, phase);
                let review = R::podgroup("CREATE", g.clone())
                    .uid(&format!("group-{name}-{}", self.flights.len()))
                    .build();
                self.ask(r, review, Asked::Group { name, group: g });
            }
            Step::Enqueue { r, group } => {
                let name = group_name(group);
                let Some(old) = self
                    .truth
                    .lock()
                    .unwrap()
                    .groups
                    .get(&name)
                    .filter(|g| g.pointer("/status/phase").is_none())
                    .cloned()
                else {
                    return Ok(());
                };
                let mut new = old.clone();
                new["status"] = json!({"phase": "Inqueue"});
                let review = R::podgroup("UPDATE", new.clone())
                    .old(old)
                    .uid(&format!("enqueue-{name}-{}", self.flights.len()))
                    .build();
                self.ask(r, review, Asked::Group { name, group: new });
            }
            Step::DeliverGroups { r, n } => {
                let t = self.truth.lock().unwrap();
                let rep = &mut self.replicas[r];
                if !rep.gstalled {
                    rep.deliver(Stream::PodGroups, &t.glog, n as usize);
                }
            }
            Step::StallGroups { r } => self.replicas[r].gstalled = true,
            Step::NodeJoin { model } => {
                let mut t = self.truth.lock().unwrap();
                let (m, first, ..) = MODELS[model];
                let of_model = t.nodes.iter().filter(|(_, x)| *x == m).count();
                if of_model <= JOINS {
                    t.nodes.push((format!("{first}-{of_model}"), m));
                }
            }
            Step::NodeWatch { r } => {
                let nodes = self.truth.lock().unwrap().nodes.clone();
                let mut snap = self.replicas[r].state.snapshot.lock().unwrap();
                for (name, model) in &nodes {
                    upsert(&mut snap, &node_json(name, model)).unwrap();
                }
            }
            Step::QueueWatch { r } => {
                let mut snap = self.replicas[r].state.snapshot.lock().unwrap();
                for q in ALL {
                    upsert(&mut snap, &self.api.object(&queue_path(q)).unwrap()).unwrap();
                }
            }
            Step::DeliverClaims { r, n } => {
                let t = self.truth.lock().unwrap();
                self.replicas[r].deliver_claims(&t.clog, n as usize);
            }
            Step::ClaimGc => {
                let mut t = self.truth.lock().unwrap();
                let stored: Vec<Value> = t
                    .pods
                    .values()
                    .map(|p| p["metadata"]["uid"].clone())
                    .collect();
                let claims: Vec<(String, Value)> = t.claims.clone().into_iter().collect();
                for (name, c) in claims {
                    let Some(reserved) = c["status"]["reservedFor"].as_array() else {
                        continue;
                    };
                    let kept: Vec<Value> = reserved
                        .iter()
                        .filter(|x| stored.contains(&x["uid"]))
                        .cloned()
                        .collect();
                    if kept.len() == reserved.len() {
                        continue;
                    }
                    let mut new = c.clone();
                    if kept.is_empty() {
                        new.as_object_mut().unwrap().remove("status");
                        t.allocated_for.remove(&name);
                    } else {
                        new["status"]["reservedFor"] = json!(kept);
                    }
                    t.store_claim(&name, new);
                    self.tally.claim_gcs += 1;
                }
            }
            Step::Deliver { r, n } => {
                let t = self.truth.lock().unwrap();
                let rep = &mut self.replicas[r];
                if !rep.stalled {
                    rep.deliver(Stream::Pods, &t.log, n as usize);
                }
            }
            Step::Ledger { r } => {
                for q in ALL {
                    if let Some(cm) = self.api.object(&ledger_path(q)) {
                        let cm: k8s_openapi::api::core::v1::ConfigMap =
                            serde_json::from_value(cm).unwrap();
                        self.replicas[r]
                            .state
                            .snapshot
                            .lock()
                            .unwrap()
                            .upsert_ledger(ledger_record(&cm).unwrap());
                    }
                }
            }
            Step::Wait { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::Stall { r } => self.replicas[r].stalled = true,
            Step::Relist { r } => {
                let rep = &mut self.replicas[r];
                if rep.asked.swap(false, Ordering::SeqCst) {
                    // A consistent list: the API server's pods at its resourceVersion.
                    let t = self.truth.lock().unwrap();
                    let mut snap = rep.state.snapshot.lock().unwrap();
                    for k in snap.pod_keys_picked(&|_| true) {
                        if !t.pods.contains_key(&k.name) {
                            remove(&mut snap, "Pod", &k.namespace, &k.name);
                        }
                    }
                    for p in t.pods.values() {
                        upsert(&mut snap, p).unwrap();
                    }
                    let mut p = snap.progress();
                    p.pods = p.pods.max(t.rv);
                    snap.set_progress(p);
                    rep.cursor = t.log.len();
                    rep.stalled = false;
                    self.tally.relists += 1;
                }
                if rep.asked_groups.swap(false, Ordering::SeqCst) {
                    let t = self.truth.lock().unwrap();
                    let mut snap = rep.state.snapshot.lock().unwrap();
                    for g in t.groups.values() {
                        upsert(&mut snap, g).unwrap();
                    }
                    let mut p = snap.progress();
                    p.podgroups = p.podgroups.max(t.grv);
                    snap.set_progress(p);
                    rep.gcursor = t.glog.len();
                    rep.gstalled = false;
                    self.tally.relists += 1;
                    self.tally.group_relists += 1;
                }
                if rep.asked_claims.swap(false, Ordering::SeqCst) {
                    // A consistent list of the claims (a lying watch's list lies too).
                    let t = self.truth.lock().unwrap();
                    let mut snap = rep.state.snapshot.lock().unwrap();
                    for k in snap.claim_keys() {
                        if !t.claims.contains_key(&k.name) {
                            remove(&mut snap, "ResourceClaim", &k.namespace, &k.name);
                        }
                    }
                    for c in t.claims.values() {
                        match rep.lies_about_claims {
                            true => upsert(&mut snap, &lie_about(c)).unwrap(),
                            false => upsert(&mut snap, c).unwrap(),
                        };
                    }
                    let mut p = snap.progress();
                    p.claims = p.claims.max(t.crv);
                    snap.set_progress(p);
                    rep.ccursor = t.clog.len();
                    self.tally.relists += 1;
                    self.tally.claim_relists += 1;
                }
            }
            Step::Sweep { r } => {
                let st = self.replicas[r].state.clone();
                let committer = st.live.as_ref().unwrap().committer.clone();
                let metrics: Arc<dyn CommitMetrics> = st.metrics.ledger.clone();
                let sweep = tokio::spawn(async move {
                    for q in ALL {
                        let _ = committer
                            .prune(
                                &QueueName::new(q),
                                &st.snapshot,
                                &Config::default(),
                                &metrics,
                            )
                            .await;
                    }
                });
                self.sweeps.push(sweep);
            }
            Step::Crash { r } => {
                // Its answers in flight never reach the API server; its writes in flight
                // may still land.
                self.flights.retain(|f| {
                    if f.r == r {
                        f.answer.abort();
                    }
                    f.r != r
                });
                self.tally.held += held(&self.replicas[r].state);
                self.incarnations += 1;
                let me = format!("r{r}.{}", self.incarnations);
                self.replicas[r] = Replica::start(&self.api, &self.truth, me);
                self.tally.crashes += 1;
            }
            Step::LieClaim { r } => {
                let rep = &mut self.replicas[r];
                if !rep.lies_about_claims {
                    rep.lies_about_claims = true;
                    let t = self.truth.lock().unwrap();
                    let mut snap = rep.state.snapshot.lock().unwrap();
                    for c in t.claims.values() {
                        upsert(&mut snap, &lie_about(c)).unwrap();
                    }
                    self.tally.lies += 1;
                }
            }
            Step::Lie { r, pod } => {
                let name = pod_name(pod);
                let bound = self
                    .truth
                    .lock()
                    .unwrap()
                    .pods
                    .get(&name)
                    .is_some_and(|p| p["spec"]["nodeName"].is_string());
                if bound {
                    let mut snap = self.replicas[r].state.snapshot.lock().unwrap();
                    remove(&mut snap, "Pod", "ml", &name);
                    self.tally.lies += 1;
                }
            }
        }
        // Let what is in flight run for a moment of its own before the next step.
        tokio::time::sleep(Duration::from_micros(500)).await;
        self.land().await?;
        if std::env::var_os("COMMITTER_MODEL_TRACE").is_some() {
            self.trace_state();
        }
        self.note_full();
        Ok(())
    }

    /// The stored ledger and pods, and each replica's progress, in the trace.
    fn trace_state(&mut self) {
        for q in ALL {
            if let Some(cm) = self.api.object(&ledger_path(q)) {
                self.trace.push(format!(
                    "    ledger of {q} rv {}: {}",
                    cm["metadata"]["resourceVersion"], cm["data"]["ledger"]
                ));
            }
        }
        let t = self.truth.lock().unwrap();
        let pods: Vec<String> = t
            .pods
            .iter()
            .map(|(n, p)| {
                format!(
                    "{n}({} {} {}x{} on {})",
                    p["metadata"]["uid"].as_str().unwrap_or_default(),
                    p["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default(),
                    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
                    p["metadata"]["annotations"]["volcano.sh/card.name"],
                    p["spec"]["nodeName"]
                )
            })
            .collect();
        self.trace
            .push(format!("    pods at rv {}: {}", t.rv, pods.join(", ")));
        let claims: Vec<String> = t
            .claims
            .iter()
            .map(|(n, c)| {
                let on = &c["status"]["allocation"]["devices"]["results"][0];
                let reserved: Vec<&str> = c["status"]["reservedFor"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x["uid"].as_str())
                    .collect();
                format!("{n}(on {}/{} for {reserved:?})", on["pool"], on["device"])
            })
            .collect();
        self.trace
            .push(format!("    claims: {}", claims.join(", ")));
        for (r, rep) in self.replicas.iter().enumerate() {
            {
                let snap = rep.state.snapshot.lock().unwrap();
                for q in ALL {
                    let l = snap.ledger(&QueueName::new(q));
                    self.trace.push(format!(
                        "    r{r} sees ledger {q} at {:?}: {:?}",
                        l.resource_version, l.ledger
                    ));
                }
            }
            let progress = rep.state.snapshot.lock().unwrap().progress();
            self.trace.push(format!(
                "    r{r}: pods at {} (event {} of {}){}",
                progress.pods,
                rep.cursor,
                t.log.len(),
                if rep.stalled { ", stalled" } else { "" }
            ));
        }
    }
}

fn brief(resp: &Value) -> String {
    if resp["allowed"] == true {
        "admitted".into()
    } else {
        format!(
            "refused: {}",
            resp["status"]["message"].as_str().unwrap_or("")
        )
    }
}

fn run(steps: &[Step]) -> Result<Tally, TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut w = World::new();
        for s in steps {
            w.apply(s).await?;
        }
        // Everything in flight answers within its budget.
        tokio::time::sleep(BUDGET * 3).await;
        w.land().await?;
        prop_assert!(
            w.flights.is_empty(),
            "requests unanswered past their budget"
        );
        for s in w.sweeps.drain(..) {
            s.await.unwrap();
        }
        // What each request was answered, for a replay that passes (a failing case
        // prints it anyway).
        if std::env::var_os("CARD_QUOTA_COMMITTER_MODEL_TRACE").is_some() {
            eprintln!("{}", w.trace.join("\n"));
        }
        w.tally.writes = w.api.writes() as u64;
        w.tally.conflicts = w.api.conflicts() as u64;
        for rep in &w.replicas {
            w.tally.held += held(&rep.state);
        }
        Ok(w.tally)
    })
}

fn cases(default: u32) -> u32 {
    std::env::var("CARD_QUOTA_COMMITTER_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `cases` generated cases (with queue moves when `moves`): their tallies summed.
fn property(cases: u32, moves: bool) -> Tally {
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let total = Mutex::new(Tally::default());
    runner
        .run(
            &prop::collection::vec(step(Liar::None, moves), 20..120),
            |steps| {
                let t = run(&steps)?;
                total.lock().unwrap().add(&t);
                Ok(())
            },
        )
        .unwrap();
    let t = *total.lock().unwrap();
    t
}

#[test]
fn the_replicas_committer_never_binds_past_a_quota() {
    let cases = cases(48);
    let t = property(cases, false);
    eprintln!("{cases} cases: {t:?}");
    if cases < 500 {
        return;
    }
    // Every path the invariant rests on was taken (CI's count: 2,000).
    assert!(
        t.creates[0] > 0 && t.creates[1] > 0 && t.creates[2] > 0,
        "{t:?}"
    );
    assert!(t.binds[0] > 0, "{t:?}");
    assert!(
        t.unnamed[0] > 0 && t.unnamed[1] > 0 && t.unnamed_binds > 0,
        "pods naming no model admitted and refused past the mutating call, and bound: {t:?}"
    );
    assert!(
        t.joined_binds[0] > 0 && t.joined_binds[2] > 0,
        "binds onto joined nodes, admitted and answered try again: {t:?}"
    );
    assert!(
        t.groups[0] > 0 && t.groups[1] > 0 && t.group_pods > 0 && t.group_relists > 0,
        "PodGroups admitted and refused, pods of them stored, PodGroup watches relisted: {t:?}"
    );
    assert!(
        t.claim_writes[0] > 0
            && t.claim_writes[1] > 0
            && t.claim_binds[0] > 0
            && t.shared > 0
            && t.claim_gcs > 0
            && t.claim_relists > 0,
        "claim allocations admitted and refused, claim pods bound, claims reserved for pods of both queues, claims released, claim watches relisted: {t:?}"
    );
    assert!(t.crashes > 0 && t.relists > 0 && t.full > 0, "{t:?}");
    assert!(t.conflicts > 0 && t.held > 0, "{t:?}");
    assert!(t.cuts > 0 && t.raises > 0 && t.after_cut > 0, "{t:?}");
}

/// The property with queues moved under the parent and out (2026-12-04). It found five
/// holes, closed with the replays below (`found_a_move_under_a_parent_*`,
/// `found_a_queue_cut_decided_before_*`, `found_a_parents_cut_holds_back_*`,
/// `found_a_move_is_checked_over_*`, and a move checked against a tree the replica had
/// not listed); two moves into the parent at once, and a charge beside a move in
/// flight, are replays of their own (`two_moves_into_one_parent_*`,
/// `a_charge_in_a_tree_a_queue_is_moving_into_*`).
#[test]
fn queues_moved_under_a_parent_never_bind_past_its_cap() {
    let cases = cases(48);
    let t = property(cases, true);
    eprintln!("{cases} cases with moves: {t:?}");
    if cases < 500 {
        return;
    }
    assert!(
        t.moves > 0 && t.parent_binds > 0 && t.queue_refusals > 0,
        "queues moved under the parent and out (and refused), bindings checked against its cap: {t:?}"
    );
}

/// A CREATE step (the shrunk cases below end padded with the simplest one: the
/// generator's shortest case is 20 steps).
fn create(r: usize, pod: u8, model: usize, cards: u8, lost: bool) -> Step {
    Step::Create {
        r,
        pod,
        model,
        cards,
        lost,
        group: None,
        queue: 0,
        claim: None,
        named: true,
    }
}

/// Found by the model (2026-12-03): a replay of the shrunk case.
#[test]
fn found_entries_of_pods_never_stored_under_a_taken_name() {
    use Step::*;
    let steps: Vec<Step> = [
        create(0, 0, 0, 3, false),
        create(0, 0, 1, 1, false),
        create(0, 0, 0, 1, false),
        Bind {
            r: 0,
            pod: 0,
            node: 0,
        },
        create(0, 0, 0, 1, false),
        create(0, 0, 0, 1, false),
        Bind {
            r: 0,
            pod: 0,
            node: 0,
        },
        Bind {
            r: 0,
            pod: 0,
            node: 0,
        },
        Bind {
            r: 0,
            pod: 0,
            node: 0,
        },
        create(0, 0, 0, 1, false),
        Deliver { r: 0, n: 1 },
        create(1, 0, 0, 1, false),
        Bind {
            r: 0,
            pod: 0,
            node: 0,
        },
        create(0, 10, 1, 1, true),
        create(1, 1, 0, 1, false),
        create(0, 10, 0, 2, false),
        Deliver { r: 0, n: 1 },
    ]
    .into_iter()
    .chain(std::iter::repeat_n(create(0, 0, 0, 1, false), 3))
    .collect();
    if let Err(e) = run(&steps) {
        panic!("{e}");
    }
}

/// Found by the model (2026-12-03): a pod charged at its CREATE, then its model's
/// quota cut to 0 through the same replica, whose pod watch has not shown the pod yet:
/// its binding was admitted from the cache alone (the pod unseen, so "its CREATE's
/// charge counts") past the new quota, though the replica's ledger held the charge.
#[test]
fn found_a_binding_of_a_pod_the_cache_does_not_show_is_held_to_a_cut() {
    use Step::*;
    let steps = [
        create(0, 3, 1, 1, false),
        create(0, 0, 0, 1, false),
        SetQuota {
            r: 0,
            queue: 0,
            model: 1,
            to: 0,
        },
        Ledger { r: 0 },
        Bind {
            r: 0,
            pod: 3,
            node: 0,
        },
        Wait { ms: 3000 },
    ];
    // The oracle lets an unseen pod's bind past a cut (the net fails open where the
    // charge cannot be seen); here the binding replica knows the charge: refused.
    let t = run(&steps).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.binds, [0, 1, 0], "{t:?}");
}

/// Found by the model (2026-12-03): p3 deleted while replica 0's pod watch stalls,
/// then created again with another model: replica 0 took the new p3's entry for a
/// CREATE the API server refused (its cache still showed the old p3 under the name),
/// counted it nowhere and admitted 2 more RTX cards: 3 of 2 stored.
#[test]
fn found_a_pod_created_again_under_a_name_a_stale_cache_shows_counts() {
    use Step::*;
    let steps: Vec<Step> = [
        create(0, 1, 1, 1, false),
        create(0, 3, 1, 1, false),
        create(0, 1, 0, 1, false),
        create(0, 1, 0, 1, false),
        Bind {
            r: 0,
            pod: 1,
            node: 0,
        },
        Crash { r: 1 },
        Deliver { r: 0, n: 2 },
        Stall { r: 0 },
        Delete { pod: 3 },
        Stall { r: 0 },
        create(0, 3, 0, 1, false),
        create(0, 0, 0, 2, false),
    ]
    .into_iter()
    .chain(std::iter::repeat_n(create(0, 0, 0, 1, false), 8))
    .collect();
    if let Err(e) = run(&steps) {
        panic!("{e}");
    }
}

/// A client's retried CREATE of a pod that exists (answered 409 by the API server
/// after card-quota admitted it) stops counting behind a fence read a store's lag
/// after its entry was first seen, not only at the entry's 120 s TTL.
#[test]
fn a_refused_create_retry_stops_counting_after_the_store_lag() {
    use Step::*;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut w = World::new();
        let create = Create {
            r: 0,
            pod: 0,
            model: 0,
            cards: 1,
            lost: false,
            group: None,
            queue: 0,
            claim: None,
            named: true,
        };
        for s in [
            create.clone(),
            Wait { ms: 100 },
            Deliver { r: 0, n: 5 },
            create,
        ] {
            w.apply(&s).await.unwrap();
        }
        w.apply(&Wait { ms: 100 }).await.unwrap();
        let entries = |w: &World| {
            let cm = w.api.object(&ledger_path("q")).unwrap();
            let l: Value = serde_json::from_str(cm["data"]["ledger"].as_str().unwrap()).unwrap();
            let ids = l["entries"].as_object().cloned().unwrap_or_default();
            ids.keys().cloned().collect::<Vec<_>>()
        };
        // The pod's own charge left once the cache showed it; its retry's stays.
        assert_eq!(entries(&w), ["uid-p0-2"]);
        assert_eq!(w.tally.creates, [2, 0, 0]);
        // The reconciler's sweeps, once a second in `serve`: the first starts the
        // entry's clock, one past the store lag asks for a fence, the next drops the
        // entry behind it (the TTL is 120 s).
        let sweeps = [
            Sweep { r: 0 },
            Wait { ms: 35_000 },
            Sweep { r: 0 },
            Wait { ms: 3_000 },
            Sweep { r: 0 },
            Wait { ms: 3_000 },
        ];
        for s in sweeps {
            w.apply(&s).await.unwrap();
        }
        for s in w.sweeps.drain(..) {
            s.await.unwrap();
        }
        assert_eq!(
            entries(&w),
            Vec::<String>::new(),
            "41 s on, the retry's charge is gone"
        );
    });
}

/// The oracle and the generator can see a violation: a pod watch that shows a bound
/// pod deleted while it is not makes its replica count that pod's cards nowhere. A
/// measurement, run by hand: it stops at the first case caught and says after how
/// many (29 to 1,452 cases in 10 runs at stop 69; 1,486 once on 2026-12-04). CI runs the
/// controls as replays (`a_pod_watch_that_shows_a_bound_pod_deleted_is_caught`, and the
/// claims' below): a search of random length has no bound CI can wait for.
#[test]
#[ignore = "a measurement of the generator (minutes): CI runs the controls as replays"]
fn a_lying_pod_watch_is_caught() {
    caught(Liar::Pods);
}

/// The same for claims: a claim watch that shows an allocated claim's device on the
/// other model makes its replica count that card on the wrong model, so the oracle sees
/// claims' cards. (A claim shown unallocated is no lie card-quota can be caught by: a
/// bound pod whose claim it does not see allocated counts on every model it may have.)
/// Measured 2026-12-04: 4,160 and 13,495 cases at 54e7b7b, 7,248 to 23,193 at c096530,
/// and 329 to 6,313 once the lie starts every case, but once not within 30,000 (a miss
/// CI would fail on). CI runs `a_claim_watch_that_shows_an_allocation_on_the_other_model_is_caught`.
#[test]
#[ignore = "a measurement of the generator (minutes): CI runs the controls as replays"]
fn a_lying_claim_watch_is_caught() {
    caught(Liar::Claims);
}

/// Runs cases with `liar` until one is caught past a quota, and says after how many.
fn caught(liar: Liar) {
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 30_000,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    // Cases run until the first failure (shrinking runs more: they are not counted).
    let until_found = std::cell::Cell::new(None);
    let tried = std::cell::Cell::new(0u32);
    // A claim watch lies from the start (until its replica restarts): the lie is one
    // step of the generator's hundred kinds, and a case catches it only with a claim
    // allocated, the quota cut under it and a charge decided by the liar after it.
    let first = match liar {
        Liar::Claims => vec![Step::LieClaim { r: 1 }],
        _ => Vec::new(),
    };
    let found = runner.run(
        &prop::collection::vec(step(liar, false), 20..120)
            .prop_map(move |steps| first.iter().cloned().chain(steps).collect::<Vec<Step>>()),
        |steps| {
            tried.set(tried.get() + 1);
            let r = run(&steps).map(|_| ());
            if r.is_err() && until_found.get().is_none() {
                until_found.set(Some(tried.get()));
            }
            r
        },
    );
    let Err(e) = found else {
        panic!(
            "a lying watch ({liar:?}) was never caught in {} cases",
            tried.get()
        );
    };
    eprintln!(
        "caught after {} cases",
        until_found.get().unwrap_or(tried.get())
    );
    let e = e.to_string();
    assert!(
        e.contains(" cards bound in ") || e.contains(" cards in stored pods"),
        "{e}"
    );
    eprintln!("{}", e.lines().next().unwrap_or_default());
}

/// Found by the model once it had PodGroups (2026-12-04), a replay of the shrunk case:
/// replica 1's pod watch shows p2 (1 RTX, of PodGroup g0) before its PodGroup watch shows
/// g0. Stored as sent, without the queue card-quota's mutating call stamps on it, p2 was
/// counted in `default` there (its group unknown) and replica 1 admitted 2 RTX more into
/// a quota of 2. With the stamp (as the API server stores an admitted pod) it counts in
/// its queue whatever the cache shows of its group. (Pods card-quota never admitted, from
/// before the install, carry no stamp until the reconciler writes it: docs/consistency.md.)
#[test]
fn a_stamped_pod_of_a_podgroup_a_replica_does_not_show_counts_in_its_queue() {
    use Step::*;
    let steps: Vec<Step> = vec![
        create(0, 1, 1, 1, false),
        Enqueue { r: 0, group: 0 },
        create(0, 0, 0, 3, false),
        Group {
            r: 0,
            group: 0,
            model: 0,
            cards: 1,
            inqueue: false,
        },
        DeliverGroups { r: 0, n: 1 },
        QueueWatch { r: 0 },
        Create {
            r: 0,
            pod: 2,
            model: 0,
            cards: 1,
            lost: false,
            group: Some(0),
            queue: 0,
            claim: None,
            named: true,
        },
        create(1, 0, 0, 2, false),
        Deliver { r: 1, n: 2 },
        QueueWatch { r: 0 },
        Bind {
            r: 0,
            pod: 0,
            node: 0,
        },
        create(0, 1, 1, 1, false),
        QueueWatch { r: 0 },
        create(0, 0, 0, 1, false),
        create(0, 0, 0, 1, false),
    ];
    run(&steps).unwrap_or_else(|e| panic!("{e}"));
}

/// A CREATE of `pod` at replica `r` of `queue` (by index) whose card is claim `claim`'s.
fn claim_create(r: usize, pod: u8, model: usize, queue: usize, claim: u8) -> Step {
    Step::Create {
        r,
        pod,
        model,
        cards: 1,
        lost: false,
        group: None,
        queue,
        claim: Some(claim),
        named: true,
    }
}

/// A CREATE step of a pod of `cards` GPUs with no claim and no PodGroup, naming its
/// model or not.
fn plain(r: usize, pod: u8, model: usize, cards: u8, queue: usize, named: bool) -> Step {
    Step::Create {
        r,
        pod,
        model,
        cards,
        lost: false,
        group: None,
        queue,
        claim: None,
        named,
    }
}

/// Runs a shrunk case, padded as the generator's shortest case is.
fn replay(mut steps: Vec<Step>) {
    let pad = 20usize.saturating_sub(steps.len());
    steps.extend(std::iter::repeat_n(create(0, 0, 0, 1, false), pad));
    if let Err(e) = run(&steps) {
        panic!("{e}");
    }
}

/// Found by the model once it had two queues (2026-12-04), a replay of the shrunk case:
/// replica 0, restarted, admitted p4 (2 RTX of q's 2) and its pod watch stayed behind;
/// replica 1, whose cache showed p4, pruned its charge and raised the watermark. p1's
/// CREATE was planned by replica 0 from that ledger, which arrived after its writer had
/// seen the caches caught up (while it read a fence): p4 counted nowhere, 3 RTX in q.
/// The core now decides nothing from a ledger its caches are behind
/// (`decide::batch::plan_held`).
#[test]
fn found_a_ledger_that_arrives_while_the_writer_reads_a_fence_is_not_decided_from() {
    use Step::*;
    let mut steps = vec![
        create(0, 2, 1, 1, false),
        Create {
            r: 0,
            pod: 0,
            model: 0,
            cards: 1,
            lost: false,
            group: None,
            queue: 1,
            claim: None,
            named: true,
        },
        Group {
            r: 0,
            group: 0,
            model: 0,
            cards: 1,
            inqueue: false,
        },
        Crash { r: 0 },
        create(0, 4, 0, 2, false),
        DeliverClaims { r: 0, n: 1 },
    ];
    steps.extend(std::iter::repeat_n(create(0, 0, 0, 1, false), 3));
    steps.push(DeliverClaims { r: 0, n: 1 });
    steps.extend(std::iter::repeat_n(create(0, 0, 0, 1, false), 2));
    steps.extend([
        Wait { ms: 45_000 },
        Deliver { r: 1, n: 3 },
        Ledger { r: 1 },
        create(0, 1, 0, 1, false),
        Sweep { r: 1 },
        DeliverGroups { r: 0, n: 1 },
        Ledger { r: 0 },
        Enqueue { r: 0, group: 0 },
    ]);
    replay(steps);
}

/// Found by the model once it had claims (2026-12-04), a replay of the shrunk case: p1
/// and p2 of q share claim c1, allocated for p2 through replica 0; replica 1's claim
/// watch never showed the allocation, and its cache showed p2 bound (from the ledger)
/// while p1, pending, paid for c1 as the first by name. After a cut of q's RTX to 1,
/// replica 1 let p0's claim c0 be allocated: the binding's hard line counted bound cards
/// only, and c1 was not among them. A bound sharer pays first, and a bound pod whose
/// claim a cache does not show allocated counts bound on every model it may have.
#[test]
fn found_a_sharer_bound_before_its_claim_is_seen_allocated_counts_bound() {
    use Step::*;
    let mut steps = vec![
        claim_create(1, 1, 0, 0, 1),
        claim_create(1, 2, 0, 0, 1),
        DeliverGroups { r: 0, n: 1 },
        Crash { r: 0 },
        Schedule { r: 0, n: 55 },
        claim_create(0, 0, 0, 0, 0),
        ClaimGc,
        ClaimGc,
        SetQuota {
            r: 0,
            queue: 0,
            model: 0,
            to: 1,
        },
        Deliver { r: 1, n: 3 },
        ClaimGc,
        DeliverClaims { r: 0, n: 1 },
        create(0, 0, 0, 1, false),
        SetQuota {
            r: 0,
            queue: 1,
            model: 0,
            to: 0,
        },
        ClaimGc,
    ];
    steps.extend(std::iter::repeat_n(create(0, 0, 0, 1, false), 4));
    steps.push(Schedule { r: 1, n: 24 });
    replay(steps);
}

/// Found by the model once it had claims (2026-12-04), a replay of the shrunk case: p6,
/// an H200 pod of q, deleted and made again as a claim pod of q2; replica 0's pod cache
/// still showed the first p6 when the scheduler allocated the new one's claim on an
/// RTX (which q2 has no quota of). The allocation was read against the first p6, which
/// uses no claim: admitted uncharged. Its payer is now the pod it is reserved for, by
/// uid (`decide::allocation`).
#[test]
fn found_an_allocation_for_a_pod_made_again_under_its_name_waits_for_the_cache() {
    use Step::*;
    replay(vec![
        create(0, 0, 0, 1, false),
        create(0, 6, 1, 1, false),
        SetQuota {
            r: 0,
            queue: 1,
            model: 0,
            to: 0,
        },
        Deliver { r: 0, n: 2 },
        Delete { pod: 6 },
        claim_create(0, 6, 1, 1, 0),
        Ledger { r: 0 },
        DeliverGroups { r: 0, n: 1 },
        Schedule { r: 0, n: 146 },
    ]);
}

/// Found by the model once it had claims (2026-12-04), a replay of the shrunk case:
/// replica 0 recorded the allocation of p4's claim (an H200 of q2) and crashed before
/// answering; q2's H200 quota was cut to 0; the scheduler's retry of that allocation was
/// admitted as the charge recorded before the cut, and the card was bound past the cut.
/// A retried binding or allocation is held to the quota as it is now
/// (`decide::binding::past_a_cut`).
#[test]
fn found_a_retried_allocation_is_held_to_a_cut_since_it_was_recorded() {
    use Step::*;
    let c = |pod| create(0, pod, 0, 1, false);
    let groups = |n| std::iter::repeat_n(DeliverGroups { r: 0, n: 1 }, n);
    let mut steps = vec![
        claim_create(0, 4, 1, 1, 0),
        DeliverGroups { r: 0, n: 1 },
        Deliver { r: 0, n: 1 },
        c(5),
        c(0),
        Schedule { r: 0, n: 189 },
        Crash { r: 0 },
        c(0),
        c(0),
        DeliverClaims { r: 0, n: 1 },
        SetQuota {
            r: 0,
            queue: 1,
            model: 1,
            to: 0,
        },
    ];
    steps.extend(groups(2));
    steps.extend([c(0), c(0), NodeJoin { model: 0 }]);
    steps.extend(groups(1));
    steps.push(NodeJoin { model: 0 });
    steps.extend(groups(1));
    steps.push(c(0));
    steps.extend(groups(2));
    steps.extend([
        DeliverClaims { r: 0, n: 1 },
        SetQuota {
            r: 0,
            queue: 0,
            model: 0,
            to: 0,
        },
        NodeJoin { model: 0 },
    ]);
    steps.extend(groups(2));
    steps.push(NodeJoin { model: 0 });
    steps.extend(groups(2));
    steps.extend([Wait { ms: 3 }, Schedule { r: 0, n: 189 }]);
    replay(steps);
}

/// Found by the model (2026-12-04): pods of two queues share a claim but name different
/// models. p0 (q, RTX) has c1 allocated on the RTX; p7 (q2) names the H200 and uses c1
/// too. Its reservation of c1 was admitted (a reservation changed no card), and its
/// binding, by a replica whose pod cache did not show it, was taken as its CREATE's
/// charge on the H200: q2 ended with 2 RTX bound in a quota of 1. The reservation of a
/// pod that does not accept the claim's model is now refused.
#[test]
fn found_a_sharer_naming_another_model_is_not_reserved_the_claim() {
    use Step::*;
    let c = |pod| create(0, pod, 0, 1, false);
    replay(vec![
        claim_create(0, 0, 0, 0, 1),
        DeliverClaims { r: 0, n: 1 },
        Deliver { r: 1, n: 1 },
        Schedule { r: 1, n: 123 },
        Ledger { r: 1 },
        DeliverGroups { r: 0, n: 1 },
        Schedule { r: 1, n: 0 },
        DeliverClaims { r: 1, n: 1 },
        claim_create(0, 7, 1, 1, 1),
        Group {
            r: 0,
            group: 0,
            model: 0,
            cards: 2,
            inqueue: false,
        },
        Enqueue { r: 0, group: 0 },
        Deliver { r: 1, n: 1 },
        Create {
            r: 0,
            pod: 0,
            model: 0,
            cards: 1,
            lost: false,
            group: Some(0),
            queue: 0,
            claim: None,
            named: true,
        },
        c(0),
        Wait { ms: 1 },
        c(0),
        claim_create(0, 1, 0, 1, 0),
        Schedule { r: 0, n: 0 },
        Deliver { r: 1, n: 2 },
        Schedule { r: 0, n: 19 },
        Schedule { r: 1, n: 82 },
        Ledger { r: 1 },
        c(0),
        c(0),
        Ledger { r: 0 },
        c(0),
    ]);
}

/// Found by the model once queues could move under a parent (2026-12-04): q2's claim
/// pod had an RTX 4090 allocated; the parent's RTX cap was cut to 0 through replica 0,
/// whose Queue watch did not show the cut yet; q2's move under the parent, through the
/// same replica, was checked against the parent's old cap and admitted: 1 RTX bound
/// under a cap of 0. A move now waits while the ledger it moves to holds a seal of a
/// limit change the replica has not seen.
#[test]
fn found_a_move_under_a_parent_whose_cap_was_cut_waits_for_the_cut() {
    use Step::*;
    let c = |pod| Create {
        r: 0,
        pod,
        model: 0,
        cards: 1,
        lost: false,
        group: None,
        queue: 0,
        claim: None,
        named: false,
    };
    replay(vec![
        claim_create(0, 0, 0, 1, 0),
        DeliverClaims { r: 0, n: 1 },
        SetQuota {
            r: 0,
            queue: 2,
            model: 0,
            to: 0,
        },
        Deliver { r: 0, n: 1 },
        Schedule { r: 0, n: 9 },
        c(0),
        c(0),
        Reparent { r: 0, queue: 1 },
        c(0),
        c(0),
    ]);
}

/// Found by the model once queues could move (2026-12-04): replica 0 moved q under the
/// parent, then cut q's H200 quota to 0 before its own Queue watch showed the move: it
/// sealed the cut in the ledger q had left, and replica 1 (which had read q as moved)
/// bound an H200 in the new one past the cut. A Queue write is now decided only once
/// the replica's cache shows the Queue as stored (read from the API server if not).
#[test]
fn found_a_queue_cut_decided_before_the_cache_shows_its_move_is_sealed_where_it_is() {
    use Step::*;
    replay(vec![
        DeliverClaims { r: 0, n: 1 },
        plain(0, 2, 1, 1, 0, true),
        plain(0, 0, 0, 1, 0, true),
        Deliver { r: 1, n: 1 },
        plain(1, 0, 0, 1, 0, true),
        Reparent { r: 0, queue: 0 },
        Ledger { r: 0 },
        plain(0, 0, 0, 1, 0, false),
        DeliverGroups { r: 0, n: 1 },
        Stall { r: 0 },
        NodeWatch { r: 0 },
        DeliverGroups { r: 0, n: 1 },
        Ledger { r: 0 },
        Deliver { r: 0, n: 1 },
        plain(0, 0, 0, 1, 0, false),
        plain(0, 0, 0, 1, 0, false),
        SetQuota {
            r: 0,
            queue: 0,
            model: 1,
            to: 0,
        },
        DeliverGroups { r: 0, n: 1 },
        Bind {
            r: 1,
            pod: 2,
            node: 0,
        },
        Deliver { r: 0, n: 1 },
    ]);
}

/// Found by the model with queue moves (2026-12-04): q2 moved under the parent, out
/// and in again through the two replicas; replica 0 cut the parent's RTX cap to 0
/// before its cache showed q2 back under it, so it sealed the parent alone; replica 1,
/// whose tree had q2 under the parent but whose cache did not show the cut, admitted an
/// allocation for q2 in the parent's ledger: 1 RTX bound under a cap of 0. A charge now
/// waits for a seal of any queue above it in the ledger, as its own tree has them.
#[test]
fn found_a_parents_cut_holds_back_a_queue_the_sealer_did_not_show_under_it() {
    use Step::*;
    replay(vec![
        Reparent { r: 0, queue: 1 },
        DeliverGroups { r: 0, n: 1 },
        DeliverGroups { r: 0, n: 1 },
        DeliverGroups { r: 0, n: 1 },
        plain(0, 0, 0, 1, 0, false),
        Reparent { r: 1, queue: 1 },
        Wait { ms: 400 },
        Reparent { r: 0, queue: 1 },
        Wait { ms: 400 },
        claim_create(1, 1, 0, 1, 0),
        SetQuota {
            r: 0,
            queue: 2,
            model: 0,
            to: 0,
        },
        Wait { ms: 20 },
        Deliver { r: 1, n: 2 },
        Schedule { r: 1, n: 0 },
        plain(0, 0, 0, 1, 0, false),
        plain(0, 0, 0, 1, 0, false),
        plain(0, 0, 0, 1, 0, false),
        plain(0, 0, 0, 1, 0, false),
        plain(0, 0, 0, 1, 0, false),
        plain(0, 0, 0, 1, 0, false),
    ]);
}

/// Found by the model with queue moves (2026-12-04): replica 0 moved q under the
/// parent, whose RTX cap it had cut to 0, while its claim watch did not show q's claim
/// allocated on an RTX through replica 1 (recorded in q's ledger): it read q's usage as
/// nothing and admitted the move, 1 RTX bound under a cap of 0.
#[test]
fn found_a_move_is_checked_over_the_moving_queues_ledger_as_sealed() {
    replay(a_move_that_does_not_fit_over_the_ledger_as_sealed());
}

/// q's claim allocated through replica 1, whose charge replica 0's claim watch has not
/// shown; org's RTX cap cut to 0; q moved under org through replica 0.
fn a_move_that_does_not_fit_over_the_ledger_as_sealed() -> Vec<Step> {
    use Step::*;
    vec![
        claim_create(1, 0, 0, 0, 0),
        SetQuota {
            r: 0,
            queue: 2,
            model: 0,
            to: 0,
        },
        Deliver { r: 1, n: 1 },
        Schedule { r: 1, n: 0 },
        Wait { ms: 1 },
        Reparent { r: 0, queue: 0 },
        DeliverClaims { r: 0, n: 1 },
        DeliverClaims { r: 0, n: 1 },
    ]
}

/// A move refused after its seals were written (the case above: decided again over the
/// moving queue's ledger as sealed) never lands, so its seals are taken back: the moving
/// queue's next pod and one in the parent's tree are decided at once, not answered "try
/// again" for the minute a seal of a change that never lands takes to lift (by a read
/// of the Queue 60 s on).
#[test]
fn a_move_refused_after_its_seals_takes_them_back() {
    use Step::*;
    let steps = [
        vec![
            Reparent { r: 0, queue: 1 },
            Wait { ms: 50 },
            QueueWatch { r: 0 },
            QueueWatch { r: 1 },
        ],
        a_move_that_does_not_fit_over_the_ledger_as_sealed(),
        vec![
            Wait { ms: 400 },
            Ledger { r: 0 },
            plain(0, 5, 1, 1, 0, true),
            plain(0, 6, 1, 1, 1, true),
            Wait { ms: 400 },
        ],
    ]
    .concat();
    let t = run(&steps).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((t.moves, t.queue_refusals), (1, 1), "{t:?}");
    assert_eq!(
        t.creates,
        [3, 0, 0],
        "q's and q2's H200 pods admitted at once: {t:?}"
    );
}

/// Two moves into the parent at once, through the two replicas (q with 2 RTX bound, q2
/// with 1, under a cap of 2): each alone fits, both do not. The first to seal the
/// parent's tree holds the other back until it is seen (R4: one ledger, one change of
/// its tree at a time).
#[test]
fn two_moves_into_one_parent_at_once_are_checked_one_after_the_other() {
    use Step::*;
    let bind = |r, pod| Bind { r, pod, node: 0 };
    replay(
        [
            vec![
                plain(0, 0, 0, 1, 0, true),
                plain(0, 1, 0, 1, 0, true),
                plain(1, 2, 0, 1, 1, true),
            ],
            settle(),
            vec![bind(0, 0), bind(0, 1), bind(1, 2)],
            settle(),
            vec![
                Ledger { r: 0 },
                Ledger { r: 1 },
                Reparent { r: 0, queue: 0 },
                Reparent { r: 1, queue: 1 },
                Wait { ms: 400 },
                QueueWatch { r: 0 },
                QueueWatch { r: 1 },
            ],
        ]
        .concat(),
    );
}

/// A move into the parent's tree seen by one replica only: q2 already under the parent,
/// its RTX cap cut to 1, q (1 RTX bound) moved under it through replica 0; replica 1,
/// whose Queue watch has not shown the move, charges an RTX of q2 in the parent's
/// ledger. It must count q there, or wait until it sees the move: the move's seal of
/// the parent's tree holds it back.
#[test]
fn a_charge_in_a_tree_a_queue_is_moving_into_waits_for_the_move() {
    use Step::*;
    let bind = |r, pod| Bind { r, pod, node: 0 };
    replay(
        [
            q2_under_org_capped(0, 1),
            vec![plain(0, 0, 0, 1, 0, true)],
            settle(),
            vec![bind(0, 0)],
            settle(),
            vec![
                Ledger { r: 0 },
                Ledger { r: 1 },
                Reparent { r: 0, queue: 0 },
                Wait { ms: 50 },
                plain(1, 1, 0, 1, 1, true),
                Wait { ms: 50 },
                Deliver { r: 1, n: 9 },
                bind(1, 1),
                Wait { ms: 400 },
            ],
        ]
        .concat(),
    );
}

/// org's cap of `model` set to `cap`, and q2 moved under org, as both replicas see it.
fn q2_under_org_capped(model: usize, cap: u64) -> Vec<Step> {
    vec![
        Step::SetQuota {
            r: 0,
            queue: 2,
            model,
            to: cap,
        },
        Step::Reparent { r: 0, queue: 1 },
        Step::Wait { ms: 50 },
        Step::QueueWatch { r: 0 },
        Step::QueueWatch { r: 1 },
    ]
}

/// Time for what is in flight to answer, then both replicas' pod watches deliver.
fn settle() -> Vec<Step> {
    vec![
        Step::Wait { ms: 50 },
        Step::Deliver { r: 0, n: 9 },
        Step::Deliver { r: 1, n: 9 },
    ]
}

/// A negative control as a replay: `steps` pass as they are, and with `lie` inserted at
/// `at` the oracle catches the lying replica past a quota.
fn caught_in(steps: Vec<Step>, at: usize, lie: Step) {
    if let Err(e) = run(&steps) {
        panic!("the case fails without the lie: {e}");
    }
    let mut lying = steps;
    lying.insert(at, lie);
    let Err(e) = run(&lying) else {
        panic!("the lie was not caught");
    };
    let e = e.to_string();
    assert!(
        e.contains(" cards bound in ") || e.contains(" cards in stored pods"),
        "{e}"
    );
}

/// The negative control of the pod watch, as a replay: p9 (1 RTX) bound and pruned from
/// the ledger; replica 0's pod watch shows it deleted; p1 (2 RTX) is admitted into q's
/// quota of 2. Refused without the lie.
#[test]
fn a_pod_watch_that_shows_a_bound_pod_deleted_is_caught() {
    use Step::*;
    caught_in(
        vec![
            create(0, 9, 0, 1, false),
            Wait { ms: 50 },
            Deliver { r: 0, n: 9 },
            Deliver { r: 1, n: 9 },
            Bind {
                r: 0,
                pod: 9,
                node: 0,
            },
            Wait { ms: 50 },
            Deliver { r: 0, n: 9 },
            Deliver { r: 1, n: 9 },
            Sweep { r: 0 },
            Wait { ms: 3_000 },
            Ledger { r: 0 },
            Ledger { r: 1 },
            create(0, 1, 0, 2, false),
            Wait { ms: 50 },
        ],
        12,
        Lie { r: 0, pod: 9 },
    );
}

/// The negative control of the claim watch, as a replay: c0 allocated on an RTX for p0,
/// q's RTX quota cut to 1; replica 1's claim watch shows c0 on an H200, and p10's
/// binding (1 RTX) is admitted. Refused without the lie.
#[test]
fn a_claim_watch_that_shows_an_allocation_on_the_other_model_is_caught() {
    use Step::*;
    caught_in(
        vec![
            claim_create(0, 0, 0, 0, 0),
            create(0, 10, 0, 1, false),
            Wait { ms: 50 },
            Deliver { r: 0, n: 9 },
            Deliver { r: 1, n: 9 },
            Schedule { r: 1, n: 0 },
            Wait { ms: 50 },
            DeliverClaims { r: 0, n: 3 },
            DeliverClaims { r: 1, n: 3 },
            Ledger { r: 1 },
            SetQuota {
                r: 1,
                queue: 0,
                model: 0,
                to: 1,
            },
            Wait { ms: 50 },
            Bind {
                r: 1,
                pod: 10,
                node: 0,
            },
            Wait { ms: 50 },
        ],
        12,
        LieClaim { r: 1 },
    );
}

/// A move is checked against what the queues use, not the headroom replicas hold: q
/// (1 H200 in use, replica 0 holding spare of its quota of 12) moves under the parent
/// (H200 cap cut to 3, q2 there with 1). Counted with the spare, it was refused ("org
/// would have 4 NVIDIA-H200 in use (1 there, 3 moving with q)").
#[test]
fn a_move_is_not_refused_for_the_headroom_replicas_hold() {
    use Step::*;
    let bind = |r, pod| Bind { r, pod, node: 0 };
    let steps = [
        q2_under_org_capped(1, 3),
        vec![plain(0, 0, 1, 1, 0, true), plain(1, 1, 1, 1, 1, true)],
        settle(),
        vec![bind(0, 0), bind(1, 1)],
        settle(),
        vec![
            Ledger { r: 0 },
            Ledger { r: 1 },
            Reparent { r: 0, queue: 0 },
            Wait { ms: 400 },
        ],
    ]
    .concat();
    let t = run(&steps).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((t.moves, t.queue_refusals), (2, 0), "{t:?}");
}

/// Found by the model on 2026-12-04 (aa15780): p2's claim allocated on an RTX through
/// replica 1, which had just restarted; q's RTX quota cut to 1 through replica 0, whose
/// claim watch never showed the allocation; replica 0 bound p1 (1 RTX): 2 bound in 1.
#[test]
fn found_an_allocation_a_claim_watch_never_showed_holds_a_binding_to_a_cut() {
    use Step::*;
    replay(vec![
        claim_create(0, 2, 0, 0, 0),
        Group {
            r: 0,
            group: 0,
            model: 0,
            cards: 1,
            inqueue: false,
        },
        Crash { r: 1 },
        Schedule { r: 1, n: 24 },
        Sweep { r: 1 },
        Wait { ms: 45_000 },
        plain(0, 1, 0, 1, 0, false),
        SetQuota {
            r: 0,
            queue: 0,
            model: 0,
            to: 1,
        },
        DeliverGroups { r: 0, n: 1 },
        ClaimGc,
        Enqueue { r: 0, group: 0 },
        plain(1, 0, 1, 1, 0, true),
        ClaimGc,
        Deliver { r: 0, n: 2 },
        claim_create(0, 3, 0, 0, 0),
        plain(0, 0, 0, 1, 0, false),
        Wait { ms: 20 },
        plain(0, 0, 0, 1, 0, false),
        Bind {
            r: 0,
            pod: 1,
            node: 0,
        },
        plain(0, 0, 0, 1, 0, false),
    ]);
}
