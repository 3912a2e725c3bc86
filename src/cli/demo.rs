//! `card-quota demo`: a narrated run on an embedded snapshot, no cluster needed.

use std::io::Write;

use serde_json::{json, Value};

use crate::admission::{apply, review, usage_report, usage_table};
use crate::decide::review::ReviewBuilder as R;
use crate::decide::{Config, ScalePolicy};
use crate::snapshot::load::load;

const SNAPSHOT: &str = include_str!("demo/snapshot.yaml");

fn pod(ns: &str, name: &str, card_name: Option<&str>, group: Option<&str>, gpus: u32) -> Value {
    let mut anns = serde_json::Map::new();
    if let Some(c) = card_name {
        anns.insert("volcano.sh/card.name".into(), json!(c));
    }
    match group {
        Some(g) => anns.insert("scheduling.k8s.io/group-name".into(), json!(g)),
        None => anns.insert("scheduling.volcano.sh/queue-name".into(), json!("research")),
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": anns},
        "spec": {"schedulerName": "volcano", "containers": [
            {"name": "main", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}
        ]}
    })
}

fn podgroup(ns: &str, name: &str, request: &str) -> Value {
    json!({
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns, "annotations": {"volcano.sh/card.request": request},
                     "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": name, "uid": "j", "controller": true}]},
        "spec": {"queue": "research", "minMember": 1}
    })
}

/// vc-scheduler's enqueue of a waiting PodGroup: an UPDATE of the PodGroup itself.
fn enqueue(waiting: Value) -> Value {
    let mut next = waiting.clone();
    next["status"] = json!({"phase": "Inqueue"});
    R::podgroup("UPDATE", next).old(waiting).build()
}

/// Runs the demo, narrating to `out`.
pub fn run(out: &mut impl Write) -> std::io::Result<()> {
    let (mut snap, skipped) = load(SNAPSHOT).map_err(|e| std::io::Error::other(e.to_string()))?;
    for s in skipped {
        writeln!(out, "  (snapshot: {s})")?;
    }
    let clamp = Config::default();
    let deny = Config {
        scale_policy: ScalePolicy::Deny,
        ..Config::default()
    };
    writeln!(out, "card-quota demo: 3 nodes (8 H200, 14+4 H200 MIG slices, 4 RTX-4090), queues research and serving.\n")?;
    writeln!(
        out,
        "{}",
        usage_table(&usage_report(&snap, jiff::Timestamp::now()))
    )?;
    let steps: Vec<(&str, Value, &Config)> = vec![
        (
            "An admin applies a malformed quota (a negative count) to queue research",
            R::queue("UPDATE", json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                "metadata": {"name": "research", "annotations": {"volcano.sh/card.quota": "{\"NVIDIA-H200\":-1}"}}})).build(),
            &clamp,
        ),
        (
            "Volcano creates the PodGroup of job train-a asking for 5 cards of H200 or RTX-4090 (job level: may split): it waits in line, reserving nothing",
            R::podgroup("CREATE", podgroup("ml", "train-a", r#"{"NVIDIA-H200|NVIDIA-GeForce-RTX-4090":5}"#)).build(),
            &clamp,
        ),
        (
            "Volcano's scheduler enqueues train-a (Pending -> Inqueue): it fits, and now reserves 5",
            enqueue(podgroup("ml", "train-a", r#"{"NVIDIA-H200|NVIDIA-GeForce-RTX-4090":5}"#)),
            &clamp,
        ),
        (
            "A second job, train-b, asks for 2 H200: its PodGroup is created and waits",
            R::podgroup("CREATE", podgroup("ml", "train-b", r#"{"NVIDIA-H200":2}"#)).build(),
            &clamp,
        ),
        (
            "Its enqueue is held: train-a's reservation leaves 1 (the Job waits; Volcano retries every cycle)",
            enqueue(podgroup("ml", "train-b", r#"{"NVIDIA-H200":2}"#)),
            &clamp,
        ),
        (
            "train-a's first pod (2 cards, H200 or RTX-4090) is created: it draws on the job's reservation",
            R::pod("CREATE", pod("ml", "train-a-0", Some("NVIDIA-H200|NVIDIA-GeForce-RTX-4090"), Some("train-a"), 2)).build(),
            &clamp,
        ),
        (
            "The scheduler binds it to rtx-1: it is charged RTX-4090 (the webhook stamps volcano.sh/card.charged)",
            R::binding("ml", "train-a-0", "rtx-1").build(),
            &clamp,
        ),
        (
            "A pod that accepts only H200 is created in research",
            R::pod("CREATE", pod("ml", "probe", Some("NVIDIA-H200"), None, 1)).build(),
            &clamp,
        ),
        (
            "The scheduler tries to bind it to the RTX-4090 node: refused, the pod does not accept that model",
            R::binding("ml", "probe", "rtx-1").build(),
            &clamp,
        ),
        (
            "A pod asks for nvidia.com/gpu without naming a model or pinning a product",
            R::pod("CREATE", pod("ml", "anonymous", None, None, 1)).build(),
            &clamp,
        ),
        (
            "The HPA scales Deployment serving/infer from 1 to 4 replicas (RTX-4090 quota 2, 1 in use): clamped",
            R::scale("deployments", "serving", "infer", 1, 4).build(),
            &clamp,
        ),
        (
            "The same scale-up under --scale-policy deny (dry run, nothing charged): refused",
            R::scale("deployments", "serving", "infer", 2, 4).dry_run().build(),
            &deny,
        ),
        (
            "The HPA scales back down to 1: always allowed",
            R::scale("deployments", "serving", "infer", 2, 1).build(),
            &clamp,
        ),
    ];
    for (i, (text, doc, cfg)) in steps.into_iter().enumerate() {
        let r = review(&doc, &mut snap, cfg, jiff::Timestamp::now(), true);
        writeln!(out, "{}. {text}", i + 1)?;
        let resp = &r.out.response;
        if resp.allowed {
            writeln!(out, "   -> allowed")?;
        } else if let Some(s) = &resp.status {
            writeln!(out, "   -> refused: {}", s.message)?;
        }
        for w in &resp.warnings {
            writeln!(out, "   -> warning: {w}")?;
        }
        if let Some(d) = &r.decision {
            for p in &d.patch {
                writeln!(
                    out,
                    "   -> patch: {}",
                    serde_json::to_string(p).unwrap_or_default()
                )?;
            }
            if let Some(e) = &d.event {
                writeln!(
                    out,
                    "   -> Event {} on {} {}",
                    e.reason, e.regarding.kind, e.regarding.name
                )?;
                if let Some(a) = &e.also {
                    writeln!(out, "   -> and on {} {}", a.kind, a.name)?;
                }
            }
            if let Some(req) = &r.request {
                if let Err(e) = apply(&mut snap, req, d) {
                    writeln!(out, "   (not applied: {e})")?;
                }
            }
        }
    }
    writeln!(
        out,
        "\nUsage at the end:\n{}",
        usage_table(&usage_report(&snap, jiff::Timestamp::now()))
    )?;
    Ok(())
}
