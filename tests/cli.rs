//! The binary as a person runs it in a shell.

use std::process::{Command, Stdio};

/// `card-quota demo | head`: the reader is gone before the demo has printed; the demo
/// ends quietly and successfully instead of reporting a broken pipe.
#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .arg("demo")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("card-quota runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "stderr: {stderr}");
}

/// The demo reads in a 100-column terminal, marks every verdict, says patches in words,
/// and writes no colour into a pipe.
#[test]
fn the_demo_fits_100_columns_and_marks_every_verdict() {
    let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .arg("demo")
        .output()
        .expect("card-quota runs");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for line in text.lines() {
        assert!(line.chars().count() <= 100, "{line}");
    }
    assert!(!text.contains('\x1b'), "colour in a pipe");
    let steps = text
        .lines()
        .filter(|l| l.starts_with(char::is_numeric))
        .count();
    let verdicts = text
        .lines()
        .filter(|l| l.starts_with("   ✓ allowed") || l.starts_with("   ✗ refused: "))
        .count();
    assert_eq!(steps, verdicts, "{text}");
    assert!(text.contains("patch: pins to nodes with nvidia.com/gpu.product=NVIDIA-H200"));
    assert!(!text.contains("\"op\""), "a raw JSON Patch: {text}");
    assert!(text.contains("usage: research NVIDIA-H200 allocated +2"));
    // The group cap refuses with room left on the model (issue 60).
    assert!(
        text.contains("queue inference has insufficient * quota (a group cap)"),
        "{text}"
    );
}

/// `status` reads the cluster kubectl would, or the one `--kubeconfig` and `--context`
/// name (issue 47): a context the file does not have is named in the error.
#[test]
fn status_takes_kubectls_kubeconfig_and_context() {
    let dir = std::env::temp_dir().join(format!("cq-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("config");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    // The error of `status` in `context` (it always fails here).
    let failure = |context: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
            .args(["status", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--context", context])
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = failure("production");
    assert!(
        err.contains("loading kubeconfig context production"),
        "{err}"
    );
    // The named context is the one used: its server (nothing listens there) is called.
    let err = failure("a");
    assert!(err.contains("listing Volcano Queues"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
