//! `card-quota check` (issue 59 #4): a manifest's objects through the webhook's own
//! decisions, in order, against a copy of the cluster; nothing written.

use std::process::Command;

use card_quota::cli::check::{check, Outcome};
use card_quota::decide::Config;
use card_quota::snapshot::load::load;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: h200-1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: a100-1, labels: {nvidia.com/gpu.product: NVIDIA-A100}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: team-a, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2,"NVIDIA-A100":1}'}}
status: {state: Open}
"#;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer}
spec:
  replicas: 4
  selector: {matchLabels: {app: infer}}
  template:
    metadata: {labels: {app: infer}, annotations: {scheduling.volcano.sh/queue-name: team-a}}
    spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;

const JOB: &str = r#"
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  queue: team-a
  minAvailable: 2
  tasks:
  - name: launcher
    replicas: 1
    template: {spec: {containers: [{name: c, image: x}]}}
  - name: worker
    replicas: 2
    template:
      metadata: {annotations: {volcano.sh/card.name: "NVIDIA-H200|NVIDIA-A100"}}
      spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"#;

fn run(manifest: &str) -> Vec<card_quota::cli::check::Verdict> {
    let (mut snap, skipped) = load(CLUSTER).unwrap();
    assert!(skipped.is_empty());
    check(
        &mut snap,
        manifest,
        "ml",
        &Config::default(),
        jiff::Timestamp::now(),
    )
    .unwrap()
}

#[test]
fn a_deployment_is_checked_replica_by_replica_and_says_where_each_goes() {
    let v = run(DEPLOYMENT);
    assert_eq!(v.len(), 1);
    let d = &v[0];
    assert_eq!(
        (d.kind.as_str(), d.name.as_str()),
        ("Deployment", "ml/infer")
    );
    assert_eq!(d.outcome, Outcome::Partly);
    assert_eq!((d.admitted, d.pods), (3, 4));
    assert_eq!(d.models.get("NVIDIA-H200"), Some(&2));
    assert_eq!(d.models.get("NVIDIA-A100"), Some(&1));
    assert_eq!(
        d.message.as_deref(),
        Some("queue team-a has insufficient NVIDIA-H200|NVIDIA-A100 quota: requested 1, in use 3 (allocated 0, pending 3, reserved 0), quota 3")
    );
}

#[test]
fn a_volcano_job_is_enqueued_as_volcano_would_and_its_pods_land_on_one_model() {
    let v = run(JOB);
    assert_eq!(v[0].kind, "Job.batch.volcano.sh");
    assert_eq!(v[0].outcome, Outcome::Admitted, "{:?}", v[0].message);
    assert_eq!(
        (v[0].admitted, v[0].pods),
        (2, 2),
        "the launcher has no cards"
    );
    assert_eq!(v[0].models.get("NVIDIA-H200"), Some(&2));
    // After one replica took an H200, 1 H200 and 1 A100 are left: the same Job waits at
    // the enqueue, its two workers on one model.
    let one = DEPLOYMENT.replace("replicas: 4", "replicas: 1");
    let v = run(&format!("{one}---{JOB}"));
    assert_eq!(v[1].outcome, Outcome::Waits);
    let m = v[1].message.as_deref().unwrap_or("");
    assert!(
        m.contains("waits: the pods of its Job that accept NVIDIA-H200|NVIDIA-A100 (2 cards) run on one model"),
        "{m}"
    );
}

#[test]
fn objects_card_quota_does_not_decide_are_named_not_dropped() {
    let v = run("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\n");
    assert_eq!(v[0].outcome, Outcome::NotChecked);
    assert_eq!(
        v[0].message.as_deref(),
        Some("v1 ConfigMap is not a workload card-quota decides (Pod, Deployment, ReplicaSet, StatefulSet, batch/v1 Job, Volcano Job)")
    );
    // A cardless Deployment: nothing to decide.
    let v = run(&DEPLOYMENT.replace(r#"resources: {limits: {nvidia.com/gpu: "1"}}"#, ""));
    assert_eq!(v[0].outcome, Outcome::NoCards);
}

#[test]
fn the_command_exits_2_when_something_would_not_run_and_0_when_all_would() {
    let dir = std::env::temp_dir().join(format!("cq-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cluster.yaml"), CLUSTER).unwrap();
    let status = |manifest: &str| {
        std::fs::write(dir.join("m.yaml"), manifest).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
            .args(["check", "-n", "ml", "-f"])
            .arg(dir.join("m.yaml"))
            .arg("--objects")
            .arg(dir.join("cluster.yaml"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = status(DEPLOYMENT);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("Deployment  ml/infer  partly   3/4"),
        "{text}"
    );
    let (code, text) = status(JOB);
    assert_eq!(code, Some(0), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
