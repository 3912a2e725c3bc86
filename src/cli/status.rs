//! `card-quota status`: the per-queue, per-model usage table.

use std::collections::BTreeMap;

use crate::admission::{usage_report, usage_table};
use crate::ledger::{Row, UsageKey};
use crate::snapshot::Snapshot;

/// Output format of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// Why the table could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("queue {queue} is not in the snapshot (queues: {known})")]
    UnknownQueue { queue: String, known: String },
    #[error("encoding the usage: {0}")]
    Encode(String),
}

/// Renders the usage of `snap`, optionally for one queue.
pub fn render(
    snap: &Snapshot,
    queue: Option<&str>,
    format: Format,
    now: jiff::Timestamp,
) -> Result<String, StatusError> {
    let mut report: BTreeMap<String, BTreeMap<UsageKey, Row>> = usage_report(snap, now);
    if let Some(q) = queue {
        if !report.contains_key(q) {
            let known: Vec<String> = snap.queue_names().iter().map(|q| q.to_string()).collect();
            return Err(StatusError::UnknownQueue {
                queue: q.to_string(),
                known: known.join(", "),
            });
        }
        report.retain(|k, _| k == q);
    }
    Ok(match format {
        Format::Table => usage_table(&report),
        Format::Json => format!(
            "{}\n",
            serde_json::to_string_pretty(&report)
                .map_err(|e| StatusError::Encode(e.to_string()))?
        ),
        Format::Yaml => {
            serde_norway::to_string(&report).map_err(|e| StatusError::Encode(e.to_string()))?
        }
    })
}
