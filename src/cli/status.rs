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
        Format::Table => {
            usage_table(&report) + &problems(snap, queue) + &waiting_table(snap, queue, now)
        }
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

/// Queues whose `card.quota` does not parse: they count as quota 0 for every model (and
/// refuse every charge) until it is fixed; the table alone would show only the 0.
pub fn problems(snap: &Snapshot, queue: Option<&str>) -> String {
    let mut out = String::new();
    for name in snap.queue_names() {
        if queue.is_some_and(|q| q != name.as_str()) {
            continue;
        }
        if let Some(Err(e)) = snap.queue(&name).and_then(|q| q.quota.as_ref()) {
            out.push_str(&format!(
                "\nqueue {name}: quota 0 for every model until its annotation is fixed: {e}\n"
            ));
        }
    }
    out
}

/// The Jobs held at Volcano's enqueue (PodGroups with card demand still Pending),
/// oldest first; empty when none waits.
pub fn waiting_table(snap: &Snapshot, queue: Option<&str>, now: jiff::Timestamp) -> String {
    let rows: Vec<[String; 4]> = snap
        .waiting_groups()
        .into_iter()
        .filter(|g| queue.is_none_or(|q| g.queue.as_str() == q))
        .map(|g| {
            let request = match &g.request {
                Some(Ok(r)) => {
                    r.0.iter()
                        .map(|(a, n)| format!("{a}:{n}"))
                        .collect::<Vec<_>>()
                        .join(",")
                }
                _ => String::new(),
            };
            let waited = g
                .created
                .map(|c| format!("{}s", now.duration_since(c).as_secs().max(0)))
                .unwrap_or_else(|| "-".to_string());
            [g.key.to_string(), g.queue.to_string(), request, waited]
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let header = [
        "WAITING PODGROUP".to_string(),
        "QUEUE".into(),
        "REQUEST".into(),
        "WAITING".into(),
    ];
    let all: Vec<&[String; 4]> = std::iter::once(&header).chain(rows.iter()).collect();
    let width = |i: usize| all.iter().map(|r| r[i].len()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2)];
    let mut out = String::from("\n");
    for r in all {
        out.push_str(&format!(
            "{:w0$}  {:w1$}  {:w2$}  {}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        ));
    }
    out
}
