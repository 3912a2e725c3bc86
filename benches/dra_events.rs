//! What one DRA object's event costs under the snapshot lock, at cluster size: a node
//! joining (its ResourceSlice of 8 GPUs), the same slice written again with one device's
//! attribute changed, the node leaving, the first node of a model an admin's own
//! DeviceClass selects (the class comes to select cards), one new ResourceClaim with
//! selectors and an admin's change of the DeviceClass every claim asks through, each
//! applied to a snapshot of NODES nodes of 8 H200s (NVIDIA's driver's attributes: a
//! `uuid` per device, so no two devices look alike), CLAIMS claims with selectors
//! (allocated, each used by a pod) and TEMPLATES templates. Issue 57 #6: one slice's
//! event must not cost every claim against every device.
//!
//! `cargo bench --bench dra_events` (prints a table; `DRA_BENCH_NODES`, `DRA_BENCH_CLAIMS`
//! change the size).

use std::time::Instant;

use card_quota::snapshot::load::{remove, upsert};
use card_quota::snapshot::{DraRecord, Snapshot};
use serde_json::{json, Value};

const GPUS: usize = 8;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn slice(node: usize, product: &str) -> Value {
    let devices: Vec<Value> = (0..GPUS)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"}, "productName": {"string": product},
                "uuid": {"string": format!("GPU-{node:04}-{i}")}, "index": {"int": i}},
                "capacity": {"memory": {"value": "141Gi"}}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("node-{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": format!("node-{node}"),
            "pool": {"name": format!("node-{node}"), "generation": 1, "resourceSliceCount": 1},
            "devices": devices}})
}

/// A claim whose selector names its memory and product (different per claim: no two
/// claims share a requirement).
fn claim(i: usize, nodes: usize) -> Value {
    let node = i % nodes;
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("c{i}"), "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": format!(
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200' && device.attributes['gpu.nvidia.com'].index != {}", 100 + i)}}]}}]}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
            "pool": format!("node-{node}"), "device": format!("gpu-{}", i % GPUS)}]}},
            "reservedFor": [{"resource": "pods", "name": format!("p{i}"), "uid": format!("u{i}")}]}})
}

fn world(nodes: usize, claims: usize, templates: usize) -> Snapshot {
    let mut s = Snapshot::default();
    let mut add = |v: Value| {
        upsert(&mut s, &v).expect("object");
    };
    add(
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q", "annotations": {"volcano.sh/card.quota": format!("{{\"NVIDIA-H200\":{}}}", nodes * GPUS)}}}),
    );
    add(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}),
    );
    // An admin's class for B200s, which no node has yet: it asks for no card until one joins.
    add(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "b200.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"}}]}}),
    );
    for n in 0..nodes {
        add(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("node-{n}")}}));
        add(slice(n, "NVIDIA H200"));
    }
    for t in 0..templates {
        add(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": format!("t{t}"), "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": format!("device.attributes['gpu.nvidia.com'].index != {}", 1000 + t)}}]}}]}}}}),
        );
    }
    for i in 0..claims {
        add(claim(i, nodes));
        add(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": "ml", "uid": format!("u{i}"),
                "annotations": {"scheduling.volcano.sh/queue-name": "q"}},
            "spec": {"nodeName": format!("node-{}", i % nodes),
                "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": format!("c{i}")}]},
            "status": {"phase": "Running"}}));
    }
    s
}

fn ms(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let nodes = env("DRA_BENCH_NODES", 128);
    let claims = env("DRA_BENCH_CLAIMS", 1000);
    let templates = claims / 10;
    let t = Instant::now();
    let mut s = world(nodes, claims, templates);
    println!(
        "{nodes} nodes of {GPUS} H200 (a uuid each), {claims} allocated claims with selectors and their pods, {templates} templates: built in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let joined = slice(nodes, "NVIDIA H200");
    let mut changed = joined.clone();
    changed["spec"]["devices"][3]["attributes"]["uuid"] = json!({"string": "GPU-replaced"});
    let other = slice(nodes + 1, "NVIDIA GeForce RTX 4090");
    let first_b200 = slice(nodes + 2, "NVIDIA B200");
    let new_claim = claim(claims, nodes);
    let leaving = format!("node-{nodes}-gpu.nvidia.com");
    // An admin narrows NVIDIA's class (every claim's requirements are of it).
    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && device.attributes['gpu.nvidia.com'].index < 64"}}]}});
    // The same events twice: all under the lock (`replay`, `load`), and as `serve`'s
    // watchers store them (read and prepared against a view without the lock, then
    // stored under it).
    let mut served = s.clone();
    let events: [(&str, Option<&serde_json::Value>); 7] = [
        ("a node joins (its slice of 8 GPUs)", Some(&joined)),
        (
            "its slice written again, one device changed",
            Some(&changed),
        ),
        ("the node leaves (its slice deleted)", None),
        ("a slice of another model joins (RTX 4090)", Some(&other)),
        (
            "the first B200 node joins (a class selects cards)",
            Some(&first_b200),
        ),
        ("one new claim with its own selector", Some(&new_claim)),
        ("the card DeviceClass's selector changed", Some(&class)),
    ];
    let mut rows = Vec::new();
    for (what, event) in events {
        let (under, without, stored) = match event {
            Some(v) => {
                let under = ms(|| {
                    upsert(&mut s, v).unwrap();
                });
                let t = Instant::now();
                let view = served.dra_view();
                let record = DraRecord::read(v, "", view.settings()).unwrap().unwrap();
                let prepared = record.prepare(&view);
                let without = t.elapsed().as_secs_f64() * 1e3;
                let stored = ms(|| served.store_dra_record(record, prepared.as_ref()).unwrap());
                (under, without, stored)
            }
            None => {
                let under = ms(|| remove(&mut s, "ResourceSlice", "", &leaving));
                let t = Instant::now();
                let view = served.dra_view();
                let record = DraRecord::SliceGone(leaving.clone());
                let prepared = record.prepare(&view);
                let without = t.elapsed().as_secs_f64() * 1e3;
                let stored = ms(|| served.store_dra_record(record, prepared.as_ref()).unwrap());
                (under, without, stored)
            }
        };
        rows.push((what, under, without, stored));
    }
    println!(
        "{:<48} {:>16} {:>26}",
        "event", "all under lock", "serve: without / under"
    );
    for (what, under, without, stored) in rows {
        println!("{what:<48} {under:>13.2} ms {without:>13.2} / {stored:>6.2} ms");
    }
}
