//! The `card-quota` binary: wires subcommands to the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use card_quota::cli::{demo, replay, status};
use card_quota::decide::{Config, ScalePolicy};

#[derive(Parser)]
#[command(
    name = "card-quota",
    version,
    about = "Hard per-card-model quotas for Volcano queues"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay AdmissionReviews against a snapshot of objects, offline.
    Replay {
        /// YAML/JSON stream of Nodes, Queues, PodGroups, Pods, Deployments, ReplicaSets, StatefulSets.
        #[arg(long)]
        objects: PathBuf,
        /// YAML/JSON stream of admission.k8s.io/v1 AdmissionReviews.
        #[arg(long)]
        requests: PathBuf,
        /// Final usage as a JSON line instead of a table.
        #[arg(long, value_enum, default_value = "table")]
        output: replay::Output,
        #[arg(long, value_enum, default_value = "clamp")]
        scale_policy: ScalePolicy,
    },
    /// A narrated scenario on an embedded snapshot; needs no cluster.
    Demo,
    /// Per-queue, per-model usage table.
    Status {
        /// Read a snapshot file (same input as replay) instead of the live cluster.
        #[arg(long)]
        objects: Option<PathBuf>,
        #[arg(long)]
        queue: Option<String>,
        #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
        output: status::Format,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Replay {
            objects,
            requests,
            output,
            scale_policy,
        } => {
            let cfg = Config { scale_policy };
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            replay::run(&objects, &requests, output, &cfg, &mut lock)?;
        }
        Command::Demo => demo::run(&mut std::io::stdout().lock())?,
        Command::Status {
            objects,
            queue,
            output,
        } => {
            let Some(path) = objects else {
                anyhow::bail!("status without --objects reads the live cluster: not built yet (see issue 4); pass --objects <snapshot.yaml>");
            };
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let (snap, skipped) = card_quota::cluster::load::load(&text)?;
            for s in skipped {
                tracing::warn!("{}: {s}", path.display());
            }
            print!(
                "{}",
                status::render(&snap, queue.as_deref(), output, jiff::Timestamp::now())?
            );
        }
    }
    Ok(())
}
