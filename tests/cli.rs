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
