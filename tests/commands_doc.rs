//! docs/commands.md is the CLI's own `--help`, every subcommand: this test fails when
//! they differ. `CARD_QUOTA_BLESS=1 cargo test --test commands_doc` writes it again.

use std::process::Command;

const SUBCOMMANDS: [&str; 7] = [
    "serve",
    "status",
    "check",
    "replay",
    "certs",
    "manifests",
    "demo",
];

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_card-quota"))
        .args(args)
        .arg("--help")
        .env("COLUMNS", "100")
        .output()
        .expect("running card-quota --help");
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

fn page() -> String {
    let mut page = String::from(
        "# Commands\n\nEvery command and flag, as `card-quota <command> --help` prints them \
         (generated: `CARD_QUOTA_BLESS=1 cargo test --test commands_doc`). What they do in \
         detail: [serve.md](serve.md), [install.md](install.md).\n\n```text\n",
    );
    page.push_str(&help(&[]));
    page.push_str("```\n");
    for sub in SUBCOMMANDS {
        page.push_str(&format!("\n## {sub}\n\n```text\n{}```\n", help(&[sub])));
    }
    page
}

#[test]
fn the_commands_page_is_the_clis_help() {
    let want = page();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md");
    if std::env::var_os("CARD_QUOTA_BLESS").is_some() {
        std::fs::write(path, &want).expect("writing docs/commands.md");
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/commands.md differs from the CLI's help: run CARD_QUOTA_BLESS=1 cargo test --test commands_doc"
    );
}
