//! `card-quota status`: the per-queue, per-model usage table.

use std::collections::BTreeMap;

use crate::admission::{usage_report, usage_table};
use crate::cluster::Snapshot;
use crate::ledger::Row;

/// Output format of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// Renders the usage of `snap`, optionally for one queue.
pub fn render(
    snap: &Snapshot,
    queue: Option<&str>,
    format: Format,
    now: jiff::Timestamp,
) -> Result<String, serde_json::Error> {
    let mut report: BTreeMap<String, BTreeMap<String, Row>> = usage_report(snap, now);
    if let Some(q) = queue {
        report.retain(|k, _| k == q);
    }
    Ok(match format {
        Format::Table => usage_table(&report),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
        Format::Yaml => serde_norway::to_string(&report).unwrap_or_default(),
    })
}
