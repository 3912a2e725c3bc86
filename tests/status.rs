//! `card-quota status --objects`: the table (pinned), JSON and the unknown-queue error.

use std::process::Command;

/// `card-quota status --objects -` with `objects` on stdin: what it prints (it must
/// succeed).
fn status_of(objects: &str, args: &[&str]) -> String {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .args(["status", "--objects", "-"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(objects.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn status(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .arg("status")
        .arg("--objects")
        .arg("tests/fixtures/status-objects.yaml")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_table_is_sorted_and_marks_queues_over_quota() {
    let out = status(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "\
QUEUE     MODEL                          QUOTA  ALLOCATED  PENDING  RESERVED  FREE  OVER  NOTE
research  NVIDIA-H200                    2      3          0        0         0     1
research  NVIDIA-H200/mig-1g.18gb-mixed  4      0          1        2         1     0
serving   NVIDIA-H200                    1      0          0        0         1     0
serving   RTX-4090                       2      0          0        0         2     0
serving   RTX-4090|NVIDIA-H200           -      0          1        0         -     -

WAITING PODGROUP  QUEUE    REQUEST        WAITING
ml/queued         serving  NVIDIA-H200:1  -
"
    );
}

#[test]
fn json_is_a_list_of_every_column_and_filters_by_queue() {
    let out = status(&["-o", "json", "--queue", "research"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!([
            {"queue": "research", "model": "NVIDIA-H200", "quota": 2, "allocated": 3, "pending": 0,
             "reserved": 0, "free": 0, "over": 1, "note": ""},
            {"queue": "research", "model": "NVIDIA-H200/mig-1g.18gb-mixed", "quota": 4, "allocated": 0,
             "pending": 1, "reserved": 2, "free": 1, "over": 0, "note": ""}
        ])
    );
}

#[test]
fn an_unknown_queue_is_an_error_not_an_empty_table() {
    let out = status(&["--queue", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("queue nope is not in the snapshot (queues: research, serving)"),
        "{err}"
    );
}

/// Issue 32 #14: a broken quota is named with its problem. Issue 45: every card pod
/// counts whatever its scheduler; `--scheduler-name` no longer narrows the count (it is
/// accepted, with a warning, so that older scripts still run).
#[test]
fn a_broken_quota_is_named_and_every_scheduler_counts() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
            .args([
                "status",
                "--objects",
                "tests/fixtures/status-scoped-objects.yaml",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (all, _) = run(&[]);
    assert!(
        all.ends_with("queue bad: quota 0 for every model until its annotation is fixed: invalid volcano.sh/card.quota on queue bad: value for \"NVIDIA-H200\" must be a non-negative integer, got \"3\"\n"),
        "{all}"
    );
    assert!(all.contains("bad    NVIDIA-H200  0      2"), "{all}");
    assert!(
        all.contains("card.quota invalid: quota 0 until fixed\n"),
        "{all}"
    );
    assert!(
        all.contains("good   RTX-4090     1      0          1"),
        "{all}"
    );
    let (scoped, warned) = run(&["--scheduler-name", "volcano"]);
    assert_eq!(scoped, all, "the same count");
    assert!(
        warned.contains("--scheduler-name volcano is ignored"),
        "{warned}"
    );
}

/// Every queue shows, even with no numbers (no quota, Closed, enforcement warn, a
/// quota that does not parse), with a note; objects come from stdin with `-`; a queue
/// filter that matches a queue without rows still shows it.
#[test]
fn every_queue_shows_with_a_note_and_objects_come_from_stdin() {
    let objects = r#"
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: bare}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: trial, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}', volcano.sh/card.enforcement: warn}}
status: {state: Closed}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: typo, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":'}}
"#;
    let run = |args: &[&str]| status_of(objects, args);
    let table = run(&[]);
    assert!(
        table.starts_with(
            "\
QUEUE  MODEL        QUOTA  ALLOCATED  PENDING  RESERVED  FREE  OVER  NOTE
bare   -            0      0          0        0         0     0     no card.quota: quota 0 for every model
trial  NVIDIA-H200  1      0          0        0         1     0     Closed; enforcement warn
typo   -            0      0          0        0         0     0     card.quota invalid: quota 0 until fixed
"
        ),
        "{table}"
    );
    let one: serde_json::Value =
        serde_json::from_str(&run(&["--queue", "bare", "-o", "json"])).unwrap();
    assert_eq!(one[0]["note"], "no card.quota: quota 0 for every model");
    // The table prints a broken annotation below itself; json and yaml carry it on the
    // row (issue 47: they pointed to a "below" they do not have).
    assert!(
        table.contains("\nqueue typo: quota 0 for every model until its annotation is fixed: "),
        "{table}"
    );
    let typo: serde_json::Value =
        serde_json::from_str(&run(&["--queue", "typo", "-o", "json"])).unwrap();
    assert_eq!(typo[0]["note"], "card.quota invalid: quota 0 until fixed");
    assert!(
        typo[0]["problem"]
            .as_str()
            .unwrap()
            .contains("volcano.sh/card.quota"),
        "{typo}"
    );
    assert!(!run(&["-o", "yaml"]).contains("below"));
    // Volcano's root without card.quota caps nothing: no quota, free or over is shown.
    let root = status_of(
        "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {name: root}\n",
        &[],
    );
    assert!(
        root.contains("root   -      -      0          0        0         -     -     no card.quota: caps nothing below it"),
        "{root}"
    );
}

#[test]
fn an_empty_cluster_says_no_resources_found() {
    let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .args(["status", "--objects", "/dev/null"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "No resources found\n");
}

/// The pre-flight lists what enforcement would refuse in a dump, and says so when
/// nothing would be.
#[test]
fn would_refuse_lists_the_objects_enforcement_would_refuse() {
    let out = status(&["--would-refuse"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "KIND  NAME    REASON                 WARN  WOULD BE REFUSED WITH\nPod   ml/big  InsufficientCardQuota  adm.  queue research has insufficient NVIDIA-H200 quota: requested 3, in use 0 (allocated 0, pending 0, reserved 0), quota 2\nWARN: what warn does with it (adm.: admits it with a warning; ref.: refuses it too)\n\nQuotas under which nothing above is refused (today's, each model and group cap raised to its cards in use; a pod that accepts several models counted on its first):\n  kubectl annotate queue research volcano.sh/card.quota='{\"NVIDIA-H200\":3,\"NVIDIA-H200/mig-1g.18gb-mixed\":4}' --overwrite   # now {\"NVIDIA-H200\":2,\"NVIDIA-H200/mig-1g.18gb-mixed\":4}\n"
    );
    let json = status(&["--would-refuse", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v[0]["name"], "ml/big");
    assert_eq!(v[0]["reason"], "InsufficientCardQuota");
    assert_eq!(v[0]["warnAdmits"], true);
}

/// Issue 45: a node that announces cards of a resource outside the install's card
/// resources is named under the table; with the resource listed, its cards count.
#[test]
fn status_names_nodes_whose_cards_the_install_does_not_gate() {
    let objects = r#"
apiVersion: v1
kind: Node
metadata: {name: mlu-1, labels: {cambricon.com/mlu.product: MLU370}}
status: {allocatable: {cambricon.com/mlu: "4"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: mlu, annotations: {volcano.sh/card.quota: '{"MLU370":1}'}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: mlu}}
spec: {nodeName: mlu-1, containers: [{name: c, image: x, resources: {limits: {cambricon.com/mlu: "2"}}}]}
"#;
    let run = |args: &[&str]| status_of(objects, args);
    let plain = run(&[]);
    assert!(
        plain.contains("\nnode mlu-1 announces 4 cambricon.com/mlu cards (MLU370) but cambricon.com/mlu is not among card-quota's card resources: they are neither counted nor gated; add it with --card-resource"),
        "{plain}"
    );
    assert!(
        plain.contains("mlu    MLU370  1      0"),
        "not counted: {plain}"
    );
    let listed = run(&[
        "--card-resource",
        "nvidia.com/gpu",
        "--card-resource",
        "cambricon.com/mlu",
    ]);
    assert!(!listed.contains("announces"), "{listed}");
    assert!(
        listed.contains("mlu    MLU370  1      2"),
        "counted: {listed}"
    );
}

/// Issue 57 #7: AMD GPU nodes labelled by AMD's node labeller (`amd.com/gpu.product-name`)
/// offer their model (a pod of the queue is counted there), and a GPU node with no
/// product label at all is named under the table instead of being left out in silence.
#[test]
fn status_reads_amds_product_name_label_and_names_card_nodes_without_a_model() {
    let objects = r#"
apiVersion: v1
kind: Node
metadata: {name: mi300-1, labels: {amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM}}
status: {allocatable: {amd.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: mi300-2}
status: {allocatable: {amd.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: amd, annotations: {volcano.sh/card.quota: '{"AMD_Instinct_MI300X_OAM":4}'}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: amd}}
spec: {nodeName: mi300-1, containers: [{name: c, image: x, resources: {limits: {amd.com/gpu: "2"}}}]}
"#;
    let plain = status_of(objects, &[]);
    assert!(
        plain.contains("amd    AMD_Instinct_MI300X_OAM  4      2"),
        "counted on its model: {plain}"
    );
    assert!(
        plain.contains("\nnode mi300-2 offers 8 amd.com/gpu but no <prefix>/<type>.product or .product-name label names their model"),
        "{plain}"
    );
    assert!(!plain.contains("node mi300-1 offers"), "{plain}");
}

/// A group cap is a row of its own, marked as one, with its room under the cap.
#[test]
fn a_group_cap_is_a_row_marked_as_a_cap() {
    let objects = r#"
apiVersion: v1
kind: Node
metadata: {name: h200-1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4,"*":3}'}}
status: {state: Open}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
spec: {nodeName: h200-1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "2"}}}]}
status: {phase: Running}
"#;
    let out = status_of(objects, &[]);
    let cap = out
        .lines()
        .find(|l| l.starts_with("q ") && l.contains(" * "))
        .unwrap_or_else(|| panic!("no row for the cap:\n{out}"));
    let cells: Vec<&str> = cap.split_whitespace().collect();
    // QUEUE MODEL QUOTA ALLOCATED PENDING RESERVED FREE OVER NOTE...
    assert_eq!(
        &cells[..8],
        ["q", "*", "3", "2", "0", "0", "1", "0"],
        "{out}"
    );
    assert!(cap.ends_with("group cap"), "{out}");
}
