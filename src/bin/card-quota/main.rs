//! The `card-quota` binary: parses the command line and dispatches to the library.

mod args;
mod commands;
mod lease;
mod serve;
mod snapshots;

use clap::Parser;

use args::{Cli, Command};

// The webhook allocates a little per request on many threads, and the caches hold
// millions of small objects: mimalloc is faster at the first and keeps the second
// smaller than glibc's malloc (see docs/performance.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The server logs what it does; a command a person runs (status, replay, as a
    // kubectl plugin too) only warnings, so its output stays readable.
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        .init();
    // One process-wide TLS provider: ring (no aws-lc), for the server and kube's client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = match cli.command {
        Command::Serve(a) => return serve::run(a),
        Command::Replay(a) => commands::replay(a),
        Command::Demo => {
            {
                use std::io::IsTerminal;
                // NO_COLOR (no-color.org): any value turns colour off; pipes get none.
                let color =
                    std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal();
                card_quota::cli::demo::run(&mut std::io::stdout().lock(), color).map_err(Into::into)
            }
        }
        Command::Certs(a) => commands::certs(a),
        Command::Manifests(a) => commands::manifests(a),
        Command::Status(a) => commands::status(a),
        Command::Check(a) => commands::check(a),
        Command::Ungate(a) => commands::ungate(a),
    };
    // A reader that stops early (`card-quota status | head`) is not a failure of the
    // command that printed for it.
    match result {
        Err(e) if closed_output(&e) => Ok(()),
        r => r,
    }
}

fn closed_output(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
