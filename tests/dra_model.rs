//! Model-based property test of the invariant on a mixed cluster: device-plugin nodes
//! (cards as `nvidia.com/gpu`, the model from the node's label) and DRA nodes (cards as
//! devices in ResourceSlices, the model from each device's `productName`) under one
//! quota. After every step, "cards bound to model m in queue q <= quota[q][m]" is
//! checked on a recount by an oracle that shares no code with card-quota: its own device
//! and node tables, its own reading of what it generated.
//!
//! Steps are requests as the API server sends them (the mutating call, its patch
//! applied, the validating call; admitted objects stored and fed to the snapshot as a
//! watch would): pod CREATEs of either kind, the claim the resourceclaim controller
//! makes for a claim pod (through card-quota's claim hook), an allocation written by a
//! scheduler that ignores every pin (any free devices, of any model), checked by the
//! allocation hook or not (it fails open), bindings onto any node, and deletions. Pods
//! of either queue may also share one claim made apart from any pod: the scheduler
//! allocates it for the first and reserves it for the others, the claim controller
//! drops a deleted pod from it (sometimes seen a step late, as a stalled claim watch
//! shows it) and deallocates it when no pod is left; its cards count once in each queue
//! while a pod of that queue using it is bound.
//! One template asks with `firstAvailable` (two H200, else one GPU of any model): the
//! scheduler takes either way.
//!
//! Cases: `CARD_QUOTA_DRA_MODEL_CASES` (512 by default: enough that each kind of step
//! counted in `SEEN` happens in every run).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use card_quota::admission::review;
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::snapshot::load::{load, remove, upsert};
use card_quota::snapshot::Snapshot;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{json, Value};

const NS: &str = "ml";
const H200: &str = "NVIDIA-H200";
const RTX: &str = "NVIDIA-GeForce-RTX-4090";
const QUEUES: &[&str] = &["q1", "q2"];
/// Device-plugin nodes and their model (the oracle's table).
const DP_NODES: &[(&str, &str)] = &[("dp-h200", H200), ("dp-rtx", RTX)];
/// DRA devices: (node, device, model).
const DEVICES: &[(&str, &str, &str)] = &[
    ("dra-h200", "gpu-0", H200),
    ("dra-h200", "gpu-1", H200),
    ("dra-h200", "gpu-2", H200),
    ("dra-rtx", "gpu-0", RTX),
    ("dra-rtx", "gpu-1", RTX),
];
/// Templates: (name, cards asked at most). `first-available`: two H200 (`big`), else
/// one GPU of any model (`small`).
const TEMPLATES: &[(&str, u32)] = &[
    ("one", 1),
    ("two", 2),
    ("h200-only", 1),
    ("first-available", 2),
];
const H200_ONLY: &str = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'";
/// Values a device-plugin pod may give `volcano.sh/card.name`.
const NAMES: &[Option<&str>] = &[
    None,
    Some(H200),
    Some(RTX),
    Some("NVIDIA-H200|NVIDIA-GeForce-RTX-4090"),
];
const PODS: usize = 6;

/// What the runs exercised: bindings of claim pods and of device-plugin pods, and
/// allocation writes, let through and refused (each must happen, or the test proves
/// nothing).
static SEEN: [AtomicUsize; 13] = [const { AtomicUsize::new(0) }; 13];
const CLAIM_BOUND: usize = 0;
const CLAIM_REFUSED: usize = 1;
const PLUGIN_BOUND: usize = 2;
const PLUGIN_REFUSED: usize = 3;
const WRITE_ALLOWED: usize = 4;
const WRITE_REFUSED: usize = 5;
/// A pod of the shared claim bound while none of them was, or refused.
const SHARED_BOUND: usize = 6;
const SHARED_REFUSED: usize = 7;
/// A pod of the shared claim bound while another of them was bound already.
const SHARER_BOUND: usize = 8;
/// A firstAvailable claim allocated its first way (two H200), or its second.
const FIRST_WAY: usize = 9;
const SECOND_WAY: usize = 10;
/// A sharer bound while a sharer of the other queue is bound, or refused then.
const ACROSS_BOUND: usize = 11;
const ACROSS_REFUSED: usize = 12;
/// The claim pods of [`Op::CreateShared`] use, made apart from any pod.
const SHARED: &str = "shared";

fn quota(queue: &str, model: &str) -> u32 {
    match (queue, model) {
        ("q1", H200) => 2,
        ("q1", RTX) => 1,
        ("q2", H200) => 1,
        _ => 0,
    }
}

fn cluster() -> String {
    let mut items = vec![
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "q1", "annotations": {"volcano.sh/card.quota": format!(r#"{{"{H200}":2,"{RTX}":1}}"#)}}}),
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "q2", "annotations": {"volcano.sh/card.quota": format!(r#"{{"{H200}":1}}"#)}}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}),
    ];
    for (name, model) in DP_NODES {
        let gpus = json!({"cpu": "64", "pods": "110", "nvidia.com/gpu": "8"});
        items.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model}},
            "status": {"capacity": gpus, "allocatable": gpus}}));
    }
    for node in ["dra-h200", "dra-rtx"] {
        items.push(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
            "status": {"allocatable": {"cpu": "64", "pods": "110"}}}),
        );
        let devices: Vec<Value> = DEVICES
            .iter()
            .filter(|(n, _, _)| *n == node)
            .map(|(_, d, m)| json!({"name": d, "attributes": {"type": {"string": "gpu"}, "productName": {"string": m.replace('-', " ")}}}))
            .collect();
        items.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpu.nvidia.com")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}));
    }
    for (name, _) in TEMPLATES {
        items.push(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [request(name)]}}}}),
        );
    }
    items.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": SHARED, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}));
    serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items})).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A pod asking `cards` nvidia.com/gpu, naming `NAMES[name]`.
    CreatePlugin {
        pod: usize,
        queue: usize,
        cards: u32,
        name: usize,
    },
    /// A pod whose GPUs come from a claim made from `TEMPLATES[template]`.
    CreateClaim {
        pod: usize,
        queue: usize,
        template: usize,
    },
    /// A pod of `QUEUES[queue]` whose GPU comes from the shared claim.
    CreateShared { pod: usize, queue: usize },
    /// The scheduler allocates the pod's claim free devices of one node, starting at the
    /// `pick`-th free device, whatever the claim's selectors and pin say; the write
    /// reaches card-quota's allocation hook when `checked` (else it failed open).
    Allocate {
        pod: usize,
        pick: usize,
        checked: bool,
    },
    /// The scheduler binds the pod: a claim pod on its devices' node, a device-plugin pod
    /// on `DP_NODES[node]`.
    Bind { pod: usize, node: usize },
    /// The scheduler's cycle for one pod: its claim allocated (and reserved), then its
    /// binding, with nothing between (the separate ops above give the interleavings).
    Schedule {
        pod: usize,
        pick: usize,
        checked: bool,
        node: usize,
    },
    /// The pod deleted; with `lag`, the claim controller's write of the shared claim
    /// reaches card-quota one step late (its claim watch stalled).
    Delete { pod: usize, lag: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..PODS, 0..QUEUES.len(), 1..3u32, 0..NAMES.len()).prop_map(
            |(pod, queue, cards, name)| Op::CreatePlugin {
                pod,
                queue,
                cards,
                name
            }
        ),
        3 => (0..PODS, 0..QUEUES.len(), 0..TEMPLATES.len()).prop_map(|(pod, queue, template)| {
            Op::CreateClaim {
                pod,
                queue,
                template,
            }
        }),
        2 => (0..PODS, 0..QUEUES.len()).prop_map(|(pod, queue)| Op::CreateShared { pod, queue }),
        4 => (0..PODS, 0..DEVICES.len(), any::<bool>())
            .prop_map(|(pod, pick, checked)| Op::Allocate { pod, pick, checked }),
        4 => (0..PODS, 0..DP_NODES.len()).prop_map(|(pod, node)| Op::Bind { pod, node }),
        3 => (0..PODS, 0..DEVICES.len(), any::<bool>(), 0..DP_NODES.len()).prop_map(
            |(pod, pick, checked, node)| Op::Schedule {
                pod,
                pick,
                checked,
                node
            }
        ),
        1 => (0..PODS, any::<bool>()).prop_map(|(pod, lag)| Op::Delete { pod, lag }),
    ]
}

/// What the oracle knows of one pod.
#[derive(Debug, Clone)]
struct Truth {
    queue: &'static str,
    /// Device-plugin cards, or the claim pod's template.
    kind: Kind,
    /// The claim's allocated devices (indices into DEVICES; for a sharer, see
    /// [`Cluster::shared`]).
    allocated: Vec<usize>,
    node: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Plugin(u32),
    Claim(usize),
    Shared,
}

struct Cluster {
    snap: Snapshot,
    cfg: Config,
    pods: BTreeMap<String, Value>,
    claims: BTreeMap<String, Value>,
    truth: BTreeMap<String, Truth>,
    /// The shared claim as stored, its allocated devices and the pods it is reserved for.
    shared: Value,
    shared_devices: Vec<usize>,
    reserved: Vec<String>,
    /// Steps until the shared claim as stored reaches the snapshot (0: it has).
    claim_lag: u8,
    now: jiff::Timestamp,
}

fn decode_patch(resp: &Value) -> Option<json_patch::Patch> {
    let p = resp.get("patch")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(p).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The one request of template `name`, named `gpu`.
fn request(name: &str) -> Value {
    let count = TEMPLATES.iter().find(|(t, _)| *t == name).map(|(_, c)| *c);
    match name {
        "first-available" => json!({"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": [{"cel": {"expression": H200_ONLY}}]},
            {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]}),
        "h200-only" => {
            json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count,
            "selectors": [{"cel": {"expression": H200_ONLY}}]}})
        }
        _ => {
            json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}})
        }
    }
}

/// A claim's status: allocated `devices` (indices into DEVICES, all on one node) for
/// `request` (`gpu`, or `gpu/<sub-request>` of a firstAvailable), reserved for `pods`.
fn allocation(devices: &[usize], pods: &[String], request: &str) -> Value {
    let node = DEVICES[devices[0]].0;
    let results: Vec<Value> = devices
        .iter()
        .map(|&i| json!({"request": request, "driver": "gpu.nvidia.com", "pool": DEVICES[i].0, "device": DEVICES[i].1}))
        .collect();
    let reserved: Vec<Value> = pods
        .iter()
        .map(|p| json!({"resource": "pods", "name": p, "uid": format!("u-{p}")}))
        .collect();
    json!({"allocation": {"devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": reserved})
}

fn claim_name(pod: &str) -> String {
    format!("{pod}-gpu-x1")
}

impl Cluster {
    fn new() -> Self {
        let (snap, skipped) = load(&cluster()).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        Self {
            snap,
            cfg: Config::default(),
            pods: BTreeMap::new(),
            claims: BTreeMap::new(),
            truth: BTreeMap::new(),
            shared: json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": SHARED, "namespace": NS},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}),
            shared_devices: Vec::new(),
            reserved: Vec::new(),
            claim_lag: 0,
            now: jiff::Timestamp::now(),
        }
    }

    /// The mutating call, its patch applied, then the validating call: the object as
    /// admitted, or None when refused.
    fn admit(&mut self, doc: Value) -> Option<Value> {
        let m = review(&doc, &mut self.snap, &self.cfg, self.now, true);
        if !m.out.response.allowed {
            return None;
        }
        let resp = serde_json::to_value(&m.out.response).unwrap();
        let mut obj = doc["request"]["object"].clone();
        if let Some(p) = decode_patch(&resp) {
            json_patch::patch(&mut obj, &p).expect("card-quota's own patch applies");
        }
        let mut doc = doc;
        doc["request"]["object"] = obj.clone();
        let v = review(&doc, &mut self.snap, &self.cfg, self.now, false);
        v.out.response.allowed.then_some(obj)
    }

    fn store_pod(&mut self, name: &str, pod: Value) {
        upsert(&mut self.snap, &pod).unwrap();
        self.pods.insert(name.to_string(), pod);
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::CreatePlugin {
                pod,
                queue,
                cards,
                name,
            } => {
                let pname = format!("p{pod}");
                if self.pods.contains_key(&pname) {
                    return;
                }
                let mut annotations = json!({"scheduling.volcano.sh/queue-name": QUEUES[queue]});
                if let Some(n) = NAMES[name] {
                    annotations["volcano.sh/card.name"] = json!(n);
                }
                let p = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pname, "namespace": NS, "annotations": annotations},
                    "spec": {"containers": [{"name": "c", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": cards.to_string()}}}]}});
                if let Some(stored) = self.admit(R::pod("CREATE", p).build()) {
                    self.store_pod(&pname, stored);
                    self.truth.insert(
                        pname,
                        Truth {
                            queue: QUEUES[queue],
                            kind: Kind::Plugin(cards),
                            allocated: vec![],
                            node: None,
                        },
                    );
                }
            }
            Op::CreateClaim {
                pod,
                queue,
                template,
            } => {
                let pname = format!("p{pod}");
                if self.pods.contains_key(&pname) {
                    return;
                }
                let p = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pname, "namespace": NS,
                        "annotations": {"scheduling.volcano.sh/queue-name": QUEUES[queue]}},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATES[template].0}]}});
                let Some(mut stored) = self.admit(R::pod("CREATE", p).build()) else {
                    return;
                };
                self.store_pod(&pname, stored.clone());
                self.truth.insert(
                    pname.clone(),
                    Truth {
                        queue: QUEUES[queue],
                        kind: Kind::Claim(template),
                        allocated: vec![],
                        node: None,
                    },
                );
                // The resourceclaim controller makes its claim (card-quota's hook pins
                // it), then records it on the pod's status.
                let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": claim_name(&pname), "namespace": NS,
                        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pname, "uid": format!("u-{pname}"), "controller": true}]},
                    "spec": {"devices": {"requests": [request(TEMPLATES[template].0)]}}});
                let claim = self
                    .admit(R::claim("CREATE", claim).build())
                    .expect("card-quota never refuses a claim");
                upsert(&mut self.snap, &claim).unwrap();
                self.claims.insert(pname.clone(), claim);
                stored["status"] = json!({"phase": "Pending", "resourceClaimStatuses": [
                    {"name": "gpu", "resourceClaimName": claim_name(&pname)}]});
                self.store_pod(&pname, stored);
            }
            Op::CreateShared { pod, queue } => {
                let pname = format!("p{pod}");
                if self.pods.contains_key(&pname) {
                    return;
                }
                let queue = QUEUES[queue];
                let p = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pname, "namespace": NS,
                        "annotations": {"scheduling.volcano.sh/queue-name": queue}},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": SHARED}]}});
                if let Some(stored) = self.admit(R::pod("CREATE", p).build()) {
                    self.store_pod(&pname, stored);
                    self.truth.insert(
                        pname,
                        Truth {
                            queue,
                            kind: Kind::Shared,
                            allocated: vec![],
                            node: None,
                        },
                    );
                }
            }
            Op::Allocate { pod, pick, checked } => {
                let pname = format!("p{pod}");
                let Some(t) = self.truth.get(&pname).cloned() else {
                    return;
                };
                if matches!(t.kind, Kind::Shared) {
                    return self.allocate_shared(&pname, pick, checked);
                }
                let Kind::Claim(template) = t.kind else {
                    return;
                };
                if !t.allocated.is_empty() {
                    return;
                }
                // Of firstAvailable's two ways, either (the scheduler's choice).
                let (count, request) = match TEMPLATES[template] {
                    ("first-available", _) if pick % 2 == 0 => (2, "gpu/big"),
                    ("first-available", _) => (1, "gpu/small"),
                    (_, count) => (count as usize, "gpu"),
                };
                let Some(unique) = self.free_devices(pick, count) else {
                    return;
                };
                let Some(mut claim) = self.claims.get(&pname).cloned() else {
                    return;
                };
                claim["status"] = allocation(&unique, std::slice::from_ref(&pname), request);
                if checked && !self.allocation_written(&self.claims[&pname].clone(), &claim) {
                    return;
                }
                upsert(&mut self.snap, &claim).unwrap();
                self.claims.insert(pname.clone(), claim);
                match request {
                    "gpu/big" => SEEN[FIRST_WAY].fetch_add(1, Ordering::Relaxed),
                    "gpu/small" => SEEN[SECOND_WAY].fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
                if let Some(t) = self.truth.get_mut(&pname) {
                    t.allocated = unique;
                }
            }
            Op::Bind { pod, node } => {
                let pname = format!("p{pod}");
                let Some(t) = self.truth.get(&pname).cloned() else {
                    return;
                };
                if t.node.is_some() {
                    return;
                }
                let sharers_bound = self
                    .truth
                    .values()
                    .any(|o| matches!(o.kind, Kind::Shared) && o.node.is_some());
                let other_queue_bound = self.truth.values().any(|o| {
                    matches!(o.kind, Kind::Shared) && o.node.is_some() && o.queue != t.queue
                });
                let target = match t.kind {
                    Kind::Plugin(_) => DP_NODES[node].0,
                    // Only once the claim is allocated and reserved for it.
                    Kind::Shared => match self.shared_devices.first() {
                        Some(&i) if self.reserved.contains(&pname) => DEVICES[i].0,
                        _ => return,
                    },
                    // Before its allocation, the scheduler does not bind a claim pod.
                    Kind::Claim(_) => match t.allocated.first() {
                        Some(&i) => DEVICES[i].0,
                        None => return,
                    },
                };
                let r = review(
                    &R::binding(NS, &pname, target).build(),
                    &mut self.snap,
                    &self.cfg,
                    self.now,
                    true,
                );
                if matches!(t.kind, Kind::Shared) && other_queue_bound {
                    let across = if r.out.response.allowed {
                        ACROSS_BOUND
                    } else {
                        ACROSS_REFUSED
                    };
                    SEEN[across].fetch_add(1, Ordering::Relaxed);
                }
                let seen = match (t.kind, r.out.response.allowed) {
                    (Kind::Shared, true) if sharers_bound => SHARER_BOUND,
                    (Kind::Shared, true) => SHARED_BOUND,
                    (Kind::Shared, false) => SHARED_REFUSED,
                    (Kind::Claim(_), true) => CLAIM_BOUND,
                    (Kind::Claim(_), false) => CLAIM_REFUSED,
                    (Kind::Plugin(_), true) => PLUGIN_BOUND,
                    (Kind::Plugin(_), false) => PLUGIN_REFUSED,
                };
                SEEN[seen].fetch_add(1, Ordering::Relaxed);
                if r.out.response.allowed {
                    let mut p = self.pods[&pname].clone();
                    p["spec"]["nodeName"] = json!(target);
                    self.store_pod(&pname, p);
                    if let Some(t) = self.truth.get_mut(&pname) {
                        t.node = Some(target.to_string());
                    }
                }
            }
            Op::Schedule {
                pod,
                pick,
                checked,
                node,
            } => {
                self.step(&Op::Allocate { pod, pick, checked });
                self.step(&Op::Bind { pod, node });
            }
            Op::Delete { pod, lag } => {
                let pname = format!("p{pod}");
                if self.pods.remove(&pname).is_none() {
                    return;
                }
                remove(&mut self.snap, "Pod", NS, &pname);
                // The garbage collector deletes the claim the pod owned.
                if self.claims.remove(&pname).is_some() {
                    remove(&mut self.snap, "ResourceClaim", NS, &claim_name(&pname));
                }
                self.truth.remove(&pname);
                if self.reserved.contains(&pname) {
                    // The claim controller drops the pod from the shared claim's
                    // reservations, and deallocates the claim once none is left.
                    self.reserved.retain(|n| *n != pname);
                    if self.reserved.is_empty() {
                        self.shared_devices.clear();
                        self.shared["status"] = json!({});
                    } else {
                        self.shared["status"] =
                            allocation(&self.shared_devices, &self.reserved, "gpu");
                    }
                    if lag {
                        self.claim_lag = 2;
                    } else {
                        upsert(&mut self.snap, &self.shared).unwrap();
                    }
                }
            }
        }
    }

    /// `count` free devices of one node, from the `pick`-th free device on.
    fn free_devices(&self, pick: usize, count: usize) -> Option<Vec<usize>> {
        let taken: Vec<usize> = self
            .truth
            .values()
            .flat_map(|t| t.allocated.clone())
            .chain(self.shared_devices.iter().copied())
            .collect();
        let free: Vec<usize> = (0..DEVICES.len()).filter(|i| !taken.contains(i)).collect();
        let &first = free.get(pick % free.len().max(1))?;
        let node = DEVICES[first].0;
        let mut unique: Vec<usize> = free
            .iter()
            .copied()
            .filter(|&i| DEVICES[i].0 == node)
            .cycle()
            .skip_while(|&i| i != first)
            .take(count)
            .collect();
        unique.sort_unstable();
        unique.dedup();
        (unique.len() == count).then_some(unique)
    }

    /// The scheduler's allocation write through card-quota's allocation hook: true
    /// when it is let through.
    fn allocation_written(&mut self, old: &Value, claim: &Value) -> bool {
        let doc = R::claim("UPDATE", claim.clone())
            .subresource("status")
            .old(old.clone())
            .build();
        let r = review(&doc, &mut self.snap, &self.cfg, self.now, false);
        let allowed = r.out.response.allowed;
        SEEN[if allowed {
            WRITE_ALLOWED
        } else {
            WRITE_REFUSED
        }]
        .fetch_add(1, Ordering::Relaxed);
        // Refused, the scheduler gives the devices back and tries again later.
        allowed
    }

    /// The scheduler readies the shared claim for `pname`: allocates it when it is not
    /// (a write the allocation hook sees), else adds the pod to its reservations (the
    /// allocation unchanged: the hook's condition lets such writes by).
    fn allocate_shared(&mut self, pname: &str, pick: usize, checked: bool) {
        if self.reserved.iter().any(|n| n == pname) {
            return;
        }
        let mut claim = self.shared.clone();
        let mut reserved = self.reserved.clone();
        reserved.push(pname.to_string());
        if self.shared_devices.is_empty() {
            let Some(devices) = self.free_devices(pick, 1) else {
                return;
            };
            claim["status"] = allocation(&devices, &reserved, "gpu");
            if checked && !self.allocation_written(&self.shared.clone(), &claim) {
                return;
            }
            self.shared_devices = devices;
        } else {
            claim["status"] = allocation(&self.shared_devices, &reserved, "gpu");
        }
        upsert(&mut self.snap, &claim).unwrap();
        self.claim_lag = 0;
        self.shared = claim;
        self.reserved = reserved;
    }

    /// After a step: a shared claim write held back reaches the snapshot a step late.
    fn settle(&mut self) {
        if self.claim_lag > 0 {
            self.claim_lag -= 1;
            if self.claim_lag == 0 {
                upsert(&mut self.snap, &self.shared).unwrap();
            }
        }
    }

    /// The oracle: cards bound per (queue, model), recounted from its own tables.
    fn bound(&self) -> BTreeMap<(&'static str, &'static str), u32> {
        let mut out = BTreeMap::new();
        for t in self.truth.values() {
            let Some(node) = &t.node else { continue };
            match t.kind {
                Kind::Plugin(cards) => {
                    let model = DP_NODES
                        .iter()
                        .find(|(n, _)| n == node)
                        .map(|(_, m)| *m)
                        .unwrap();
                    *out.entry((t.queue, model)).or_default() += cards;
                }
                Kind::Claim(_) => {
                    for &i in &t.allocated {
                        *out.entry((t.queue, DEVICES[i].2)).or_default() += 1;
                    }
                }
                Kind::Shared => {}
            }
        }
        // The shared claim's cards, once in each queue while a pod of that queue using
        // it is bound (the invariant counts a card in every queue with a pod on it).
        for queue in QUEUES {
            if self
                .truth
                .values()
                .any(|t| matches!(t.kind, Kind::Shared) && t.node.is_some() && t.queue == *queue)
            {
                for &i in &self.shared_devices {
                    *out.entry((*queue, DEVICES[i].2)).or_default() += 1;
                }
            }
        }
        out
    }

    fn check(&self, ops: &[Op]) -> Result<(), TestCaseError> {
        for ((queue, model), cards) in self.bound() {
            prop_assert!(
                cards <= quota(queue, model),
                "queue {queue} has {cards} {model} bound, quota {}, after {ops:#?}",
                quota(queue, model)
            );
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("CARD_QUOTA_DRA_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(512)
}

#[test]
fn no_sequence_binds_past_quota_on_device_plugin_and_dra_nodes_together() {
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        let mut c = Cluster::new();
        for (i, o) in ops.iter().enumerate() {
            c.step(o);
            c.settle();
            c.check(&ops[..=i])?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let seen: Vec<usize> = SEEN.iter().map(|s| s.load(Ordering::Relaxed)).collect();
    println!(
        "bindings: claim pods {} bound, {} refused; device-plugin pods {} bound, {} refused; allocation writes {} allowed, {} refused; shared claim: pods {} bound, {} refused, {} bound beside one bound already, beside one of the other queue {} bound and {} refused; firstAvailable claims allocated {} its first way, {} its second",
        seen[0], seen[1], seen[2], seen[3], seen[4], seen[5], seen[6], seen[7], seen[8], seen[11], seen[12], seen[9], seen[10]
    );
    assert!(
        seen.iter().all(|&n| n > 0),
        "every kind of binding and write was tried: {seen:?}"
    );
}

/// The test can fail: with every binding let through, the oracle finds a queue past its
/// quota.
#[test]
fn the_oracle_sees_a_binding_past_quota() {
    let mut c = Cluster::new();
    for pod in 0..3 {
        c.step(&Op::CreatePlugin {
            pod,
            queue: 1,
            cards: 1,
            name: 1,
        });
    }
    // q2 holds one H200: the second pod was refused at CREATE.
    assert_eq!(c.truth.len(), 1);
    c.step(&Op::Bind { pod: 0, node: 0 });
    assert!(c.check(&[]).is_ok());
    // A pod the oracle believes bound without card-quota's say.
    c.truth.insert(
        "forged".into(),
        Truth {
            queue: "q2",
            kind: Kind::Claim(0),
            allocated: vec![0],
            node: Some("dra-h200".into()),
        },
    );
    assert!(c.check(&[]).is_err());
}
