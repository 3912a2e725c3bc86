//! `card-quota demo`: a narrated run on an embedded snapshot, no cluster needed.

use std::io::Write;

use serde_json::{json, Value};

use crate::admission::{apply, review, rooms, usage_report, usage_table};
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

/// A one-model pod of `gpus` cards in `queue`.
fn pod_in(ns: &str, name: &str, queue: &str, card: &str, gpus: u32) -> Value {
    let mut p = pod(ns, name, Some(card), None, gpus);
    p["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = json!(queue);
    p
}

/// A plain GPU pod (no card annotation) of `gpus` cards in `queue`.
fn plain_in(ns: &str, name: &str, queue: &str, gpus: u32) -> Value {
    let mut p = pod(ns, name, None, None, gpus);
    p["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = json!(queue);
    p
}

/// A top-level Queue with a quota.
fn queue(name: &str, quota: &str) -> Value {
    json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name, "annotations": {"volcano.sh/card.quota": quota}},
        "spec": {"weight": 1}})
}

/// A Queue under `parent` with a quota and, if given, a borrow limit.
fn tree_queue(name: &str, parent: &str, quota: &str, borrow: Option<&str>) -> Value {
    let mut q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name, "annotations": {"volcano.sh/card.quota": quota}},
        "spec": {"parent": parent}});
    if let Some(b) = borrow {
        q["metadata"]["annotations"]["volcano.sh/card.borrow"] = json!(b);
    }
    q
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

/// The widest line the demo writes.
const WIDTH: usize = 100;

/// Writes `text` after `lead`, wrapped at [`WIDTH`] with continuation lines indented
/// under the text.
fn write_wrapped(out: &mut impl Write, lead: &str, text: &str) -> std::io::Result<()> {
    let indent = " ".repeat(lead.chars().count().min(12));
    let mut line = lead.to_string();
    let mut len = line.chars().count();
    let mut first = true;
    for word in text.split(' ') {
        let w = word.chars().count();
        if !first && len + 1 + w > WIDTH {
            writeln!(out, "{line}")?;
            line = format!("{indent}{word}");
            len = indent.len() + w;
            continue;
        }
        if !first {
            line.push(' ');
            len += 1;
        }
        line.push_str(word);
        len += w;
        first = false;
    }
    writeln!(out, "{line}")
}

/// A JSON Patch operation as a sentence.
fn patch_in_words(p: &json_patch::PatchOperation) -> String {
    let v = serde_json::to_value(p).unwrap_or_default();
    let path = v["path"].as_str().unwrap_or_default();
    let unescape = |s: &str| s.replace("~1", "/").replace("~0", "~");
    let pairs = |m: &Value| -> String {
        m.as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    match path {
        "/metadata/annotations" => format!("annotates {}", pairs(&v["value"])),
        "/spec/nodeSelector" => format!(
            "pins to nodes with {} (any scheduler places it there)",
            pairs(&v["value"])
        ),
        "/spec/replicas" => format!("sets spec.replicas to {}", v["value"]),
        p if p.starts_with("/metadata/annotations/") => format!(
            "annotates {}={}",
            unescape(&p["/metadata/annotations/".len()..]),
            v["value"].as_str().unwrap_or_default()
        ),
        p if p.starts_with("/spec/nodeSelector/") => format!(
            "pins to nodes with {}={} (any scheduler places it there)",
            unescape(&p["/spec/nodeSelector/".len()..]),
            v["value"].as_str().unwrap_or_default()
        ),
        _ => v.to_string(),
    }
}

/// What changed in the usage, in one line: `research NVIDIA-H200 reserved +5`.
fn usage_delta(
    before: &std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<crate::ledger::UsageKey, crate::ledger::Row>,
    >,
    after: &std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<crate::ledger::UsageKey, crate::ledger::Row>,
    >,
) -> String {
    let mut changes = Vec::new();
    let zero = crate::ledger::Row::default();
    for (q, rows) in after {
        for (k, r) in rows {
            let b = before.get(q).and_then(|m| m.get(k)).unwrap_or(&zero);
            for (field, now, was) in [
                ("allocated", r.allocated, b.allocated),
                ("pending", r.pending, b.pending),
                ("reserved", r.reserved, b.reserved),
            ] {
                let d = now.signed_minus(was);
                if d != 0 {
                    changes.push(format!("{q} {k} {field} {d:+}"));
                }
            }
        }
    }
    changes.join(", ")
}

/// Runs the demo, narrating to `out`; `color` marks verdicts in green and red.
pub fn run(out: &mut impl Write, color: bool) -> std::io::Result<()> {
    let (mut snap, skipped) = load(SNAPSHOT).map_err(|e| std::io::Error::other(e.to_string()))?;
    for s in skipped {
        writeln!(out, "  (snapshot: {s})")?;
    }
    let clamp = Config::default();
    let deny = Config {
        scale_policy: ScalePolicy::Deny,
        ..Config::default()
    };
    writeln!(
        out,
        "card-quota demo: 3 nodes (8 H200, 14+4 H200 MIG slices, 4 RTX-4090),\nqueues research and serving, then a group cap and a tree of queues.\n"
    )?;
    writeln!(out, "{}", table(&snap))?;
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
            "The scheduler binds it to h200-a, a node of the model it is pinned to: it is charged H200 (the webhook stamps volcano.sh/card.charged)",
            R::binding("ml", "train-a-0", "h200-a").build(),
            &clamp,
        ),
        (
            "A pod that accepts only H200 is created in research",
            R::pod("CREATE", pod("ml", "probe", Some("NVIDIA-H200"), None, 1)).build(),
            &clamp,
        ),
        (
            "A scheduler that ignores the pin binds it to the RTX-4090 node: refused, the pod does not accept that model",
            R::binding("ml", "probe", "rtx-1").build(),
            &clamp,
        ),
        (
            "A GPU pod written as most are (nvidia.com/gpu: 1, no card annotation) may use research's nvidia.com/gpu models in its quota's order: all are full",
            R::pod("CREATE", pod("ml", "plain", None, None, 1)).build(),
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
        (
            "A group cap: queue inference may use 5 cards in all, whatever the model, and at most 4 of them H200 (\"*\":5 beside the per-model caps)",
            R::queue("CREATE", queue("inference", r#"{"NVIDIA-H200":4,"NVIDIA-GeForce-RTX-4090":4,"*":5}"#)).build(),
            &clamp,
        ),
        (
            "A plain 3-card GPU pod in inference: H200 first, in the order of the quota",
            R::pod("CREATE", plain_in("serving", "chat-0", "inference", 3)).build(),
            &clamp,
        ),
        (
            "Another plain pod asks for 3: RTX-4090 has room for 4, but the * cap leaves 2",
            R::pod("CREATE", plain_in("serving", "chat-1", "inference", 3)).build(),
            &clamp,
        ),
        (
            "A 2-card plain pod fits under the cap: inference is at 5 of 5 cards",
            R::pod("CREATE", plain_in("serving", "chat-2", "inference", 2)).build(),
            &clamp,
        ),
        (
            "A tree: queue lab holds 8 H200 for its teams (under root, as Volcano sets every queue)",
            R::queue("CREATE", tree_queue("lab", "root", r#"{"NVIDIA-H200":8}"#, None)).build(),
            &clamp,
        ),
        (
            "Team vision gets a share of 4 H200 in lab and may borrow 2 more from lab's pool",
            R::queue("CREATE", tree_queue("vision", "lab", r#"{"NVIDIA-H200":4}"#, Some(r#"{"NVIDIA-H200":2}"#))).build(),
            &clamp,
        ),
        (
            "Team speech gets a share of 2 and may borrow 2: lab's pool is 8 - (4 + 2) = 2",
            R::queue("CREATE", tree_queue("speech", "lab", r#"{"NVIDIA-H200":2}"#, Some(r#"{"NVIDIA-H200":2}"#))).build(),
            &clamp,
        ),
        (
            "vision runs a 6-card job pod: its 4 and, borrowed, lab's whole pool of 2",
            R::pod("CREATE", pod_in("ml", "vision-0", "vision", "NVIDIA-H200", 6)).build(),
            &clamp,
        ),
        (
            "speech asks for its own share of 2: admitted, shares are never lent",
            R::pod("CREATE", pod_in("ml", "speech-0", "speech", "NVIDIA-H200", 2)).build(),
            &clamp,
        ),
        (
            "speech asks for one more: it would borrow, and lab's pool is empty",
            R::pod("CREATE", pod_in("ml", "speech-1", "speech", "NVIDIA-H200", 1)).build(),
            &clamp,
        ),
        (
            "A pod submitted to lab itself: charges go to leaf queues",
            R::pod("CREATE", pod_in("ml", "lab-0", "lab", "NVIDIA-H200", 1)).build(),
            &clamp,
        ),
    ];
    let mark = |ok: bool| match (ok, color) {
        (true, true) => "\x1b[32m✓\x1b[0m",
        (false, true) => "\x1b[31m✗\x1b[0m",
        (true, false) => "✓",
        (false, false) => "✗",
    };
    for (i, (text, doc, cfg)) in steps.into_iter().enumerate() {
        let before = usage_report(&snap, jiff::Timestamp::now());
        let r = review(&doc, &mut snap, cfg, jiff::Timestamp::now(), true);
        write_wrapped(out, &format!("{}. ", i + 1), text)?;
        let resp = &r.out.response;
        if resp.allowed {
            writeln!(out, "   {} allowed", mark(true))?;
        } else if let Some(s) = &resp.status {
            write_wrapped(out, &format!("   {} refused: ", mark(false)), &s.message)?;
        }
        for w in &resp.warnings {
            write_wrapped(out, "     warning: ", w)?;
        }
        if let Some(d) = &r.decision {
            for p in &d.patch {
                write_wrapped(out, "     patch: ", &patch_in_words(p))?;
            }
            if let Some(e) = &d.event {
                let also = e
                    .also
                    .as_ref()
                    .map(|a| format!(" and on {} {}", a.kind, a.name))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "     Event {} on {} {}{also}",
                    e.reason, e.regarding.kind, e.regarding.name
                )?;
            }
            if let Some(req) = &r.request {
                if let Err(e) = apply(&mut snap, req, d) {
                    writeln!(out, "   (not applied: {e})")?;
                }
            }
        }
        let delta = usage_delta(&before, &usage_report(&snap, jiff::Timestamp::now()));
        if !delta.is_empty() {
            write_wrapped(out, "     usage: ", &delta)?;
        }
    }
    writeln!(out, "\nUsage at the end:\n{}", table(&snap))?;
    Ok(())
}

/// The usage table of `snap`, FREE as what would be admitted now.
fn table(snap: &crate::snapshot::Snapshot) -> String {
    let now = jiff::Timestamp::now();
    let report = usage_report(snap, now);
    usage_table(&report, &rooms(snap, &report, now))
}
