//! `card-quota replay` on fixtures: the worked examples of docs/ and of the upstream
//! capacity-card design, through the real binary.

use std::process::Command;

use serde_json::Value;

fn replay(objects: &str, requests: &str, extra: &[&str]) -> (Vec<Value>, std::process::Output) {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .args([
            "replay",
            "--objects",
            &format!("{dir}/{objects}"),
            "--requests",
            &format!("{dir}/{requests}"),
        ])
        .args(extra)
        .output()
        .expect("run card-quota");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("each stdout line is JSON"))
        .collect();
    (lines, out)
}

#[test]
fn the_capacity_card_worked_example_admits_a_four_card_job_and_refuses_zero_quota() {
    let (lines, out) = replay(
        "tests/fixtures/capacity-card-objects.yaml",
        "tests/fixtures/capacity-card-requests.yaml",
        &["--output", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines.len(), 6, "five answers and the usage line");
    let allowed: Vec<bool> = lines[..5]
        .iter()
        .map(|l| l["response"]["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, vec![true, true, false, false, false]);
    assert_eq!(lines[0]["response"]["uid"], "job-4");
    assert_eq!(lines[0]["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(lines[0]["kind"], "AdmissionReview");
    assert_eq!(
        lines[2]["response"]["status"]["message"],
        "queue q1 has insufficient NVIDIA-H100 quota: requested 1, in use 5 (allocated 0, pending 0, reserved 5), quota 3"
    );
    assert_eq!(lines[2]["response"]["status"]["code"], 403);
    assert_eq!(
        lines[3]["response"]["status"]["message"],
        "queue q1 has insufficient Tesla-V100 quota: requested 1, in use 0 (allocated 0, pending 0, reserved 0), quota 0"
    );
    assert_eq!(lines[4]["response"]["uid"], "");
    assert_eq!(lines[4]["response"]["status"]["code"], 400);
    let usage = &lines[5]["usage"]["q1"];
    assert_eq!(
        usage["NVIDIA-A100"],
        serde_json::json!({"quota": 5, "allocated": 3, "pending": 0, "reserved": 0})
    );
    assert_eq!(
        usage["NVIDIA-H100"],
        serde_json::json!({"quota": 3, "allocated": 0, "pending": 0, "reserved": 0})
    );
    assert_eq!(usage["NVIDIA-A100|NVIDIA-H100"]["reserved"], 5);
}

#[test]
fn warn_admits_what_only_the_quota_refuses_and_a_bad_entry_stops_replay() {
    // A namespace in warn cannot loosen a queue in deny (issue 45): the same refusals.
    let (lines, out) = replay(
        "tests/fixtures/capacity-card-objects.yaml",
        "tests/fixtures/capacity-card-requests.yaml",
        &["--output", "json", "--namespace-enforcement", "ml=warn"],
    );
    assert!(out.status.success());
    let allowed: Vec<bool> = lines[..5]
        .iter()
        .map(|l| l["response"]["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, vec![true, true, false, false, false]);
    let (lines, out) = replay(
        "tests/fixtures/capacity-card-objects.yaml",
        "tests/fixtures/capacity-card-requests.yaml",
        &["--output", "json", "--enforcement", "warn"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let allowed: Vec<bool> = lines[..5]
        .iter()
        .map(|l| l["response"]["allowed"].as_bool().unwrap())
        .collect();
    // The two quota refusals pass with a warning; the malformed review is still refused.
    assert_eq!(allowed, vec![true, true, true, true, false]);
    assert_eq!(
        lines[2]["response"]["warnings"][0],
        "card-quota admitted this because queue q1's enforcement is warn (the install's default); under deny: queue q1 has insufficient NVIDIA-H100 quota: requested 1, in use 5 (allocated 0, pending 0, reserved 5), quota 3"
    );
    let (_, out) = replay(
        "tests/fixtures/capacity-card-objects.yaml",
        "tests/fixtures/capacity-card-requests.yaml",
        &["--namespace-enforcement", "ml"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            r#"invalid --namespace-enforcement "ml": expected NAMESPACE=deny or NAMESPACE=warn"#
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_tree_of_queues_lends_its_pool_once_and_sums_usage_on_the_parent() {
    let (lines, out) = replay(
        "tests/fixtures/tree-objects.yaml",
        "tests/fixtures/tree-requests.yaml",
        &["--output", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let allowed: Vec<bool> = lines[..5]
        .iter()
        .map(|l| l["response"]["allowed"].as_bool().unwrap())
        .collect();
    // team-a: its share of 4, then 2 borrowed from org's pool; team-b: its share of 2,
    // nothing to borrow with; team-a at its own cap.
    assert_eq!(allowed, vec![true, true, true, false, false]);
    assert_eq!(
        lines[4]["response"]["status"]["message"],
        "queue team-a has insufficient NVIDIA-H200 quota: requested 1, in use 6 (allocated 0, pending 6, reserved 0), quota 4 + borrow 2"
    );
    let usage = &lines[5]["usage"];
    assert_eq!(
        usage["org"]["NVIDIA-H200"],
        serde_json::json!({"quota": 8, "allocated": 0, "pending": 8, "reserved": 0, "shares": 6, "free": 0})
    );
    assert_eq!(usage["team-a"]["NVIDIA-H200"]["borrowed"], 2);
}

#[test]
fn decoded_patches_are_the_json_patch_the_base64_carries() {
    use base64::Engine;
    let objects = "tests/fixtures/tree-objects.yaml";
    let requests = "tests/fixtures/tree-requests.yaml";
    let (plain, _) = replay(objects, requests, &["--output", "json"]);
    let (decoded, out) = replay(objects, requests, &["--output", "json", "--decode-patches"]);
    assert!(out.status.success());
    assert_eq!(plain.len(), decoded.len());
    let mut patches = 0;
    for (p, d) in plain.iter().zip(&decoded) {
        match p["response"]["patch"].as_str() {
            Some(b64) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .expect("base64");
                let patch: Value = serde_json::from_slice(&bytes).expect("a JSON patch");
                assert_eq!(d["response"]["patch"], patch);
                assert_eq!(d["response"]["patchType"], "JSONPatch");
                patches += 1;
            }
            None => assert_eq!(p, d, "lines without a patch are unchanged"),
        }
    }
    assert_eq!(patches, 3, "{decoded:?}");
    assert_eq!(
        decoded[0]["response"]["patch"][2],
        serde_json::json!({"op": "add", "path": "/spec/nodeSelector", "value": {"nvidia.com/gpu.product": "NVIDIA-H200"}})
    );
}

#[test]
fn an_empty_requests_file_prints_only_the_usage_line() {
    let (lines, out) = replay(
        "tests/fixtures/capacity-card-objects.yaml",
        "tests/fixtures/empty.yaml",
        &["--output", "json"],
    );
    assert!(out.status.success());
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["usage"]["q1"]["NVIDIA-A100"]["allocated"], 3);
}

#[test]
fn an_unreadable_input_file_is_the_only_non_zero_exit() {
    let (_, out) = replay(
        "tests/fixtures/does-not-exist.yaml",
        "tests/fixtures/empty.yaml",
        &[],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does-not-exist.yaml"));
}

#[test]
fn the_demo_runs_without_a_cluster_and_shows_refusals_and_the_table() {
    let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .arg("demo")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refused: queue research has insufficient NVIDIA-H200 quota"),
        "{text}"
    );
    assert!(text.contains("clamped to 2"), "{text}");
    assert!(text.contains("QUEUE"), "{text}");
}

#[test]
fn version_names_the_crate_version_and_the_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let want = format!("card-quota {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&want), "{text}");
    assert!(text.trim_end().ends_with(')'), "{text}");
}
