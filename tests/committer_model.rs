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
//! bind onto a node the binding replica does not show is "try again").
//!
//! The oracle is the API server's pods, checked as each admitted request lands, against
//! the highest quota stored while it was in flight (a raise may admit it; a cut never
//! lets it past the new one once the cut is answered): a binding keeps its model's
//! bound cards within it; a CREATE keeps every stored card pod's cards within it (each
//! is charged at its CREATE) until a cut lands. The two limits docs/consistency.md
//! states are counted, not checked: CREATEs under a hold taken before a cut, and, after
//! a cut, the bind of a pod the binding replica's pod cache does not show (see
//! `check_landed` and the binding's landing). Coverage counters are required at CI's
//! count; a negative control (a pod watch that shows a bound pod deleted while it is
//! not) must be caught.
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
const LEDGER: &str = "/api/v1/namespaces/card-quota/configmaps/card-quota-ledger.q";
const QUEUE: &str = "/apis/scheduling.volcano.sh/v1beta1/queues/q";
/// (model, its node, the queue's quota of it at first)
/// One model tight, one with room for holds of headroom (a write takes a quarter of
/// what is free).
const MODELS: &[(&str, &str, u64)] = &[("RTX-4090", "rtx-1", 2), ("NVIDIA-H200", "h200-1", 12)];
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

/// Queue `q` with `quota`, as stored at `rv`.
fn queue(quota: &Quota, rv: u64) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q", "uid": "uid-queue-q", "resourceVersion": rv.to_string(),
            "annotations": {"volcano.sh/card.quota": serde_json::to_string(quota).unwrap()}},
        "spec": {"weight": 1}, "status": {"state": "Open"}})
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
    /// A pod is deleted.
    Delete { pod: u8 },
    /// An admin sets the queue's quota of one model through replica `r`'s Queue hook.
    SetQuota { r: usize, model: usize, to: u64 },
    /// Replica `r`'s Queue watch delivers the stored Queue.
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
    /// Replica `r`'s reconciler sweeps the ledger.
    Sweep { r: usize },
    /// Replica `r` crashes and restarts from a list of every object.
    Crash { r: usize },
    /// Negative control only: replica `r`'s pod watch shows a pod deleted that is not.
    Lie { r: usize, pod: u8 },
}

fn step(control: bool) -> BoxedStrategy<Step> {
    let r = 0..2usize;
    let pod = 0..PODS;
    let steps = prop_oneof![
        6 => (r.clone(), pod.clone(), 0..MODELS.len(), 1..4u8, prop::bool::weighted(0.15), prop::option::weighted(0.3, 0..GROUPS))
            .prop_map(|(r, pod, model, cards, lost, group)| Step::Create { r, pod, model, cards, lost, group }),
        2 => (r.clone(), 0..GROUPS, 0..MODELS.len(), 1..5u8, any::<bool>())
            .prop_map(|(r, group, model, cards, inqueue)| Step::Group { r, group, model, cards, inqueue }),
        2 => (r.clone(), 0..GROUPS).prop_map(|(r, group)| Step::Enqueue { r, group }),
        4 => (r.clone(), 1..4u8).prop_map(|(r, n)| Step::DeliverGroups { r, n }),
        1 => r.clone().prop_map(|r| Step::StallGroups { r }),
        6 => (r.clone(), pod.clone(), 0..3u8).prop_map(|(r, pod, node)| Step::Bind { r, pod, node }),
        1 => (0..MODELS.len()).prop_map(|model| Step::NodeJoin { model }),
        2 => r.clone().prop_map(|r| Step::NodeWatch { r }),
        3 => pod.clone().prop_map(|pod| Step::Delete { pod }),
        1 => (r.clone(), 0..MODELS.len(), 0..4u64).prop_map(|(r, model, to)| {
            let to = to * MODELS[model].2 / 2;
            Step::SetQuota { r, model, to }
        }),
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
    if !control {
        return steps;
    }
    prop_oneof![
        2 => steps,
        1 => (r, pod).prop_map(|(r, pod)| Step::Lie { r, pod }),
    ]
    .boxed()
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
}

impl Truth {
    fn store(&mut self, name: &str, mut pod: Value) {
        self.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.log
            .push((self.rv, name.to_string(), Some(pod.clone())));
        self.pods.insert(name.to_string(), pod);
    }

    fn store_group(&mut self, name: &str, mut group: Value) {
        self.grv += 1;
        group["metadata"]["resourceVersion"] = json!(self.grv.to_string());
        self.glog
            .push((self.grv, name.to_string(), Some(group.clone())));
        self.groups.insert(name.to_string(), group);
    }

    fn delete(&mut self, name: &str) {
        if self.pods.remove(name).is_some() {
            self.rv += 1;
            self.log.push((self.rv, name.to_string(), None));
        }
    }

    /// Cards per model of the stored pods: (bound, all).
    fn cards(&self) -> BTreeMap<&'static str, (u64, u64)> {
        let mut out: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for p in self.pods.values() {
            let model = model_of(p);
            let n: u64 = p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
                .as_str()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let e = out.entry(model).or_default();
            e.1 += n;
            if p["spec"]["nodeName"].is_string() {
                e.0 += n;
            }
        }
        out
    }
}

/// The model a pod of this test names (one each).
fn model_of(p: &Value) -> &'static str {
    let card = p["metadata"]["annotations"]["volcano.sh/card.name"].as_str();
    MODELS
        .iter()
        .find(|(m, ..)| Some(*m) == card)
        .map(|(m, ..)| *m)
        .unwrap()
}

fn pod_name(i: u8) -> String {
    format!("p{i}")
}

fn pod_json(name: &str, uid: &str, model: &str, cards: u8, group: Option<&str>) -> Value {
    let pod = support::pod(name);
    let mut p = match group {
        Some(_) => pod,
        None => pod.queue("q"),
    }
    .card(model)
    .gpus(&cards.to_string())
    .scheduler("volcano")
    .stored(uid, "")
    .build();
    if let Some(g) = group {
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!(g);
    }
    // The queue card-quota's mutating call stamps on every card pod it admits (the
    // validating call and the store see the patched pod): a pod counts in it whatever
    // a cache shows of its PodGroup.
    p["metadata"]["annotations"]["volcano.sh/card.queue"] = json!("q");
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
    stalled: bool,
    /// Its PodGroup watch has stalled.
    gstalled: bool,
    asked: Arc<AtomicBool>,
    asked_groups: Arc<AtomicBool>,
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
        upsert(&mut snap, &api.object(QUEUE).unwrap()).unwrap();
        let (cursor, gcursor) = {
            let t = truth.lock().unwrap();
            for (name, model) in &t.nodes {
                upsert(&mut snap, &node_json(name, model)).unwrap();
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
            });
            (t.log.len(), t.glog.len())
        };
        if let Some(cm) = api.object(LEDGER) {
            let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(cm).unwrap();
            snap.upsert_ledger(ledger_record(&cm).unwrap());
        }
        let probe: Probe = {
            let truth = truth.clone();
            Arc::new(move || {
                let (pods, podgroups) = {
                    let t = truth.lock().unwrap();
                    (t.rv, t.grv)
                };
                Box::pin(async move { Ok(Watermark { pods, podgroups }) })
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
                async move {
                    loop {
                        freshness.relists(Stream::PodGroups).asked().await;
                        asked.store(true, Ordering::SeqCst);
                    }
                }
            }),
        ];
        Self {
            state,
            cursor,
            gcursor,
            stalled: false,
            gstalled: false,
            asked,
            asked_groups,
            stop,
            tasks,
        }
    }

    /// Delivers up to `n` events of `log`, the watch of `stream`.
    fn deliver(&mut self, stream: Stream, log: &[(u64, String, Option<Value>)], n: usize) {
        let (kind, cursor) = match stream {
            Stream::Pods => ("Pod", &mut self.cursor),
            Stream::PodGroups => ("PodGroup", &mut self.gcursor),
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
            match stream {
                Stream::Pods => p.pods = p.pods.max(*rv),
                Stream::PodGroups => p.podgroups = p.podgroups.max(*rv),
            }
            snap.set_progress(p);
            *cursor += 1;
        }
    }
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
}

struct Flight {
    r: usize,
    asked: Asked,
    answer: tokio::task::JoinHandle<Value>,
    /// The highest quota of each model stored while the request was in flight.
    quota: Quota,
}

#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    creates: [u64; 3],
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
            self.binds[i] += o.binds[i];
            self.joined_binds[i] += o.joined_binds[i];
            self.groups[i] += o.groups[i];
        }
        self.crashes += o.crashes;
        self.group_pods_asked += o.group_pods_asked;
        self.group_pods += o.group_pods;
        self.group_relists += o.group_relists;
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
    /// The stored Queue's quota.
    quota: Quota,
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
        let quota: Quota = MODELS.iter().map(|(m, _, q)| (*m, *q)).collect();
        api.seed(queue(&quota, 1));
        let truth = Arc::new(Mutex::new(Truth {
            nodes: MODELS.iter().map(|(m, n, _)| (n.to_string(), *m)).collect(),
            ..Truth::default()
        }));
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
        let answer = tokio::spawn(async move {
            let body = serde_json::to_vec(&review).unwrap();
            let out = handle_review(&st, &body, false).await.unwrap();
            serde_json::from_slice::<Value>(&out).unwrap()["response"].clone()
        });
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
            let resp = f.answer.await.unwrap();
            let o = outcome(&resp);
            let mut t = self.truth.lock().unwrap();
            match f.asked {
                Asked::Create { name, pod, lost } => {
                    self.tally.creates[o] += 1;
                    self.trace
                        .push(format!("  create {name} at r{}: {}", f.r, brief(&resp)));
                    // The API server refuses a name it holds (AlreadyExists).
                    if o == 0 && !lost && !t.pods.contains_key(&name) {
                        let model = model_of(&pod);
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
                        self.check_landed(model, &f.quota, false)?;
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
                    self.trace
                        .push(format!("  bind {name} at r{}: {}", f.r, brief(&resp)));
                    let current = t.pods.get(&name).filter(|p| {
                        p["metadata"]["uid"] == uid.as_str() && !p["spec"]["nodeName"].is_string()
                    });
                    if let (0, Some(p)) = (o, current) {
                        let mut p = p.clone();
                        let model = model_of(&p);
                        p["spec"]["nodeName"] = json!(node);
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
                        self.check_landed(model, &f.quota, true)?;
                        continue;
                    }
                }
                Asked::Queue { new } => {
                    self.trace
                        .push(format!("  queue write at r{}: {}", f.r, brief(&resp)));
                    drop(t);
                    let current = self.api.object(QUEUE).unwrap();
                    let stale = current["metadata"]["resourceVersion"]
                        != new["metadata"]["resourceVersion"];
                    match o {
                        // The API server refuses an update of a version it no longer
                        // holds (409 Conflict): another admin's write landed first.
                        0 if stale => self.tally.queue_conflicts += 1,
                        0 => {
                            let stored = self.api.store(new);
                            let quota = quota_of(&stored);
                            if quota.iter().any(|(m, q)| *q < self.quota[m]) {
                                self.tally.cuts += 1;
                                self.cut = true;
                            } else {
                                self.tally.raises += 1;
                            }
                            for other in &mut self.flights {
                                for (m, q) in &quota {
                                    let e = other.quota.entry(m).or_default();
                                    *e = (*e).max(*q);
                                }
                            }
                            self.quota = quota;
                        }
                        2 => self.tally.queue_retries += 1,
                        _ => prop_assert!(false, "a Queue write refused: {resp}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// An admitted CREATE or binding of a pod of `model` landed: nothing past `flight`,
    /// the highest quota stored while it was in flight. (Other models may be past a cut
    /// by what was admitted before it.)
    ///
    /// The binding line is the invariant and is checked whatever happened. The CREATE
    /// line (stored card pods within the quota) only until a cut lands: pods admitted
    /// before a cut may be past it, and a replica admitting under its hold of headroom
    /// does not read the ledger for up to `HOLD_USE`, so its CREATEs meet a cut (its
    /// seal) that much later, within the spare it held; bindings are never held.
    fn check_landed(
        &mut self,
        model: &str,
        flight: &Quota,
        binding: bool,
    ) -> Result<(), TestCaseError> {
        if self.quota[model] < flight[model] {
            self.tally.after_cut += 1;
        }

        let t = self.truth.lock().unwrap();
        for (model, (bound, all)) in t.cards().into_iter().filter(|(m, _)| *m == model) {
            let quota = flight[model];
            prop_assert!(
                !binding || bound <= quota,
                "{bound} {model} cards bound, quota {quota}\n{}",
                self.trace.join("\n")
            );
            prop_assert!(
                binding || self.cut || all <= quota,
                "{all} {model} cards in stored pods (each charged at its CREATE), quota {quota}\n{}",
                self.trace.join("\n")
            );
        }
        Ok(())
    }

    /// Counts steps at which a model's quota is full of bound cards.
    fn note_full(&mut self) {
        let t = self.truth.lock().unwrap();
        for (model, (bound, _)) in t.cards() {
            if bound == self.quota[model] && bound > 0 {
                self.tally.full += 1;
            }
        }
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
                let p = pod_json(&name, &uid, MODELS[model].0, cards, group.as_deref());
                let mut sent = p.clone();
                sent["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("resourceVersion");
                let review = R::pod("CREATE", sent).uid(&format!("review-{uid}")).build();
                self.ask(r, review, Asked::Create { name, pod: p, lost });
            }
            Step::Bind { r, pod, node } => {
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
                let card = p["metadata"]["annotations"]["volcano.sh/card.name"].as_str();
                let of_model: Vec<&str> = t
                    .nodes
                    .iter()
                    .filter(|(_, m)| Some(*m) == card)
                    .map(|(n, _)| n.as_str())
                    .collect();
                let node = of_model[node as usize % of_model.len()].to_string();
                let joined = !MODELS.iter().any(|(_, n, _)| *n == node);
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
            }
            Step::Delete { pod } => self.truth.lock().unwrap().delete(&pod_name(pod)),
            Step::SetQuota { r, model, to } => {
                let old = self.api.object(QUEUE).unwrap();
                let mut quota = quota_of(&old);
                quota.insert(MODELS[model].0, to);
                let rv: u64 = old["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let new = queue(&quota, rv);
                let review = R::queue("UPDATE", new.clone())
                    .old(old)
                    .uid(&format!("queue-{rv}-{}", self.flights.len()))
                    .build();
                self.ask(r, review, Asked::Queue { new });
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
                let (m, first, _) = MODELS[model];
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
                let q = self.api.object(QUEUE).unwrap();
                let mut snap = self.replicas[r].state.snapshot.lock().unwrap();
                upsert(&mut snap, &q).unwrap();
            }
            Step::Deliver { r, n } => {
                let t = self.truth.lock().unwrap();
                let rep = &mut self.replicas[r];
                if !rep.stalled {
                    rep.deliver(Stream::Pods, &t.log, n as usize);
                }
            }
            Step::Ledger { r } => {
                if let Some(cm) = self.api.object(LEDGER) {
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
            }
            Step::Sweep { r } => {
                let st = self.replicas[r].state.clone();
                let committer = st.live.as_ref().unwrap().committer.clone();
                let metrics: Arc<dyn CommitMetrics> = st.metrics.ledger.clone();
                let sweep = tokio::spawn(async move {
                    let _ = committer
                        .prune(
                            &QueueName::new("q"),
                            &st.snapshot,
                            &Config::default(),
                            &metrics,
                        )
                        .await;
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
        if let Some(cm) = self.api.object(LEDGER) {
            self.trace.push(format!(
                "    ledger rv {}: {}",
                cm["metadata"]["resourceVersion"], cm["data"]["ledger"]
            ));
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
        for (r, rep) in self.replicas.iter().enumerate() {
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

#[test]
fn the_replicas_committer_never_binds_past_a_quota() {
    let cases = cases(48);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let total = Mutex::new(Tally::default());
    runner
        .run(&prop::collection::vec(step(false), 20..120), |steps| {
            let t = run(&steps)?;
            total.lock().unwrap().add(&t);
            Ok(())
        })
        .unwrap();
    let t = *total.lock().unwrap();
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
        t.joined_binds[0] > 0 && t.joined_binds[2] > 0,
        "binds onto joined nodes, admitted and answered try again: {t:?}"
    );
    assert!(
        t.groups[0] > 0 && t.groups[1] > 0 && t.group_pods > 0 && t.group_relists > 0,
        "PodGroups admitted and refused, pods of them stored, PodGroup watches relisted: {t:?}"
    );
    assert!(t.crashes > 0 && t.relists > 0 && t.full > 0, "{t:?}");
    assert!(t.conflicts > 0 && t.held > 0, "{t:?}");
    assert!(t.cuts > 0 && t.raises > 0 && t.after_cut > 0, "{t:?}");
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
            let cm = w.api.object(LEDGER).unwrap();
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
/// pod deleted while it is not makes its replica count that pod's cards nowhere.
/// It stops at the first case caught: measured 29 to 1,452 cases (10 runs, 2026-12-04),
/// so the bound of 10,000 misses only if the oracle or the generator went blind.
#[test]
fn a_lying_pod_watch_is_caught() {
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 10_000,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    // Cases run until the first failure (shrinking runs more: they are not counted).
    let until_found = std::cell::Cell::new(None);
    let tried = std::cell::Cell::new(0u32);
    let found = runner.run(&prop::collection::vec(step(true), 20..120), |steps| {
        tried.set(tried.get() + 1);
        let r = run(&steps).map(|_| ());
        if r.is_err() && until_found.get().is_none() {
            until_found.set(Some(tried.get()));
        }
        r
    });
    let Err(e) = found else {
        panic!(
            "a lying pod watch was never caught in {} cases",
            tried.get()
        );
    };
    eprintln!(
        "caught after {} cases",
        until_found.get().unwrap_or(tried.get())
    );
    let e = e.to_string();
    assert!(
        e.contains(" cards bound, quota ") || e.contains(" cards in stored pods"),
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
