//! `card-quota status --objects`: the table (pinned), JSON and the unknown-queue error.

use std::process::Command;

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
QUEUE     MODEL                          QUOTA  ALLOCATED  PENDING  RESERVED  FREE
research  NVIDIA-H200                    2      3          0        0         -1 OVER
research  NVIDIA-H200/mig-1g.18gb-mixed  4      0          1        2         1
serving   NVIDIA-H200                    1      0          0        0         1
serving   RTX-4090                       2      0          0        0         2
serving   RTX-4090|NVIDIA-H200           -      0          1        0         -

WAITING PODGROUP  QUEUE    REQUEST        WAITING
ml/queued         serving  NVIDIA-H200:1  -
"
    );
}

#[test]
fn json_is_shaped_like_replays_usage_and_filters_by_queue() {
    let out = status(&["-o", "json", "--queue", "research"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"research": {
            "NVIDIA-H200": {"quota": 2, "allocated": 3, "pending": 0, "reserved": 0},
            "NVIDIA-H200/mig-1g.18gb-mixed": {"quota": 4, "allocated": 0, "pending": 1, "reserved": 2}
        }})
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

/// Issue 32 #14: a broken quota is named with its problem, and `--scheduler-name` counts
/// what `serve` with the same flags counts (a bound pod whatever its scheduler; a
/// pending one only of a gated scheduler).
#[test]
fn a_broken_quota_is_named_and_scheduler_names_scope_the_count() {
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
        String::from_utf8(out.stdout).unwrap()
    };
    let all = run(&[]);
    assert!(
        all.ends_with("queue bad: quota 0 for every model until its annotation is fixed: invalid volcano.sh/card.quota on queue bad: value for \"NVIDIA-H200\" must be a non-negative integer, got \"3\"\n"),
        "{all}"
    );
    assert!(
        all.contains("good   RTX-4090     1      0          1"),
        "{all}"
    );
    let scoped = run(&["--scheduler-name", "volcano"]);
    assert!(scoped.contains("bad    NVIDIA-H200  0      2"), "{scoped}");
    assert!(
        !scoped.contains("RTX-4090     1      0          1"),
        "{scoped}"
    );
}
