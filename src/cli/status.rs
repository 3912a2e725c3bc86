//! `card-quota status`: the per-queue, per-model usage table.

use std::collections::BTreeMap;

use crate::admission::usage_report;
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

/// One line of `status`: a queue's numbers for one model (or `A|B` demand), or the queue
/// alone when it has none, with what a reader must know about the queue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatusRow {
    pub queue: String,
    /// A model, an `A|B` demand, or `-` for a queue with no numbers.
    pub model: String,
    /// `None` on `A|B` rows (their models' quotas are on the models' own rows).
    pub quota: Option<u128>,
    pub allocated: u128,
    pub pending: u128,
    pub reserved: u128,
    /// Room left, never negative (`None` on `A|B` rows).
    pub free: Option<u128>,
    /// How far usage is past the quota (`None` on `A|B` rows).
    pub over: Option<u128>,
    /// Closed, no quota, an annotation that does not parse, enforcement warn.
    pub note: String,
}

impl StatusRow {
    /// The row of `key` (a model, or an `A|B` demand when `model` is false).
    fn of(queue: &str, key: String, model: bool, r: &Row, note: &str) -> Self {
        let free = r.free();
        Self {
            queue: queue.to_string(),
            model: key,
            quota: model.then(|| r.quota.get()),
            allocated: r.allocated.get(),
            pending: r.pending.get(),
            reserved: r.reserved.get(),
            free: model.then(|| u128::try_from(free.max(0)).unwrap_or(0)),
            over: model.then(|| u128::try_from((-free).max(0)).unwrap_or(0)),
            note: note.to_string(),
        }
    }

    /// The one row of a queue with no numbers.
    fn bare(queue: &str, note: &str) -> Self {
        Self::of(queue, "-".into(), true, &Row::default(), note)
    }
}

/// What a reader must know about `queue` beside its numbers.
fn note(snap: &Snapshot, queue: &crate::cards::QueueName) -> String {
    match snap.queue(queue) {
        Some(q) => queue_note(q),
        None => "no such Queue (charges recorded under its name)".into(),
    }
}

/// What a reader must know about a Queue beside its numbers.
fn queue_note(q: &crate::cluster::QueueRecord) -> String {
    use crate::cards::annotations::Enforcement;
    let mut notes: Vec<String> = Vec::new();
    if q.is_closed() {
        notes.push(q.state.clone().unwrap_or_else(|| "Closed".into()));
    }
    match &q.quota {
        None => notes.push("no card.quota: quota 0 for every model".into()),
        Some(Err(_)) => notes.push("card.quota invalid: quota 0 until fixed (below)".into()),
        Some(Ok(_)) => {}
    }
    match &q.enforcement {
        Ok(Some(Enforcement::Warn)) => notes.push("enforcement warn".into()),
        Err(_) => notes.push("card.enforcement invalid (below)".into()),
        _ => {}
    }
    if q.order.is_err() {
        notes.push("card.order invalid (below)".into());
    }
    notes.join("; ")
}

/// The rows of `status`: every queue of the snapshot (or `queue` alone), each model it
/// has a quota for or uses, in name order.
pub fn rows(
    snap: &Snapshot,
    queue: Option<&str>,
    now: jiff::Timestamp,
) -> Result<Vec<StatusRow>, StatusError> {
    let report: BTreeMap<String, BTreeMap<UsageKey, Row>> = usage_report(snap, now);
    let mut names: std::collections::BTreeSet<String> =
        snap.queue_names().iter().map(|q| q.to_string()).collect();
    names.extend(report.keys().cloned());
    if let Some(q) = queue {
        if !names.contains(q) {
            return Err(StatusError::UnknownQueue {
                queue: q.to_string(),
                known: names.into_iter().collect::<Vec<_>>().join(", "),
            });
        }
        names.retain(|n| n == q);
    }
    let mut out = Vec::new();
    for name in names {
        let note = note(snap, &crate::cards::QueueName::new(name.clone()));
        let numbers = report.get(&name).filter(|r| !r.is_empty());
        let Some(numbers) = numbers else {
            out.push(StatusRow::bare(&name, &note));
            continue;
        };
        for (key, r) in numbers {
            out.push(StatusRow::of(
                &name,
                key.to_string(),
                key.is_model(),
                r,
                &note,
            ));
        }
    }
    Ok(out)
}

/// The rows the reconciler wrote on each Queue (`volcano.sh/card.usage`), for a live
/// `status` that needs only to read Queues.
pub fn written_rows(
    queues: &[crate::cluster::QueueRecord],
    queue: Option<&str>,
) -> Result<Vec<StatusRow>, StatusError> {
    if let Some(q) = queue {
        if !queues.iter().any(|r| r.name.as_str() == q) {
            let known: Vec<&str> = queues.iter().map(|r| r.name.as_str()).collect();
            return Err(StatusError::UnknownQueue {
                queue: q.to_string(),
                known: known.join(", "),
            });
        }
    }
    let mut out = Vec::new();
    let mut queues: Vec<&crate::cluster::QueueRecord> = queues
        .iter()
        .filter(|r| queue.is_none_or(|q| r.name.as_str() == q))
        .collect();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    for q in queues {
        let mut note = queue_note(q);
        let written: Option<BTreeMap<String, serde_json::Value>> = q
            .usage
            .as_deref()
            .and_then(|u| serde_json::from_str(u).ok());
        let numbers = |v: &serde_json::Value, k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_u64)
                .map_or(0, u128::from)
        };
        let mut rows: Vec<StatusRow> = written
            .iter()
            .flatten()
            .filter(|(k, v)| k.as_str() != "observedAt" && v.is_object())
            .map(|(k, v)| {
                let cards = |f: &str| crate::cards::Cards::from_u128(numbers(v, f));
                let row = Row {
                    quota: cards("quota"),
                    allocated: cards("allocated"),
                    pending: cards("pending"),
                    reserved: cards("reserved"),
                };
                StatusRow::of(q.name.as_str(), k.clone(), !k.contains('|'), &row, "")
            })
            .collect();
        if written.is_none() {
            let missing = match &q.usage {
                None => "no usage written yet",
                Some(_) => "usage annotation unreadable",
            };
            note = if note.is_empty() {
                missing.into()
            } else {
                format!("{note}; {missing}")
            };
        }
        if rows.is_empty() {
            rows.push(StatusRow::bare(q.name.as_str(), ""));
        }
        for r in &mut rows {
            r.note = note.clone();
        }
        out.extend(rows);
    }
    Ok(out)
}

/// Renders rows alone (no snapshot behind them): a table, or a JSON / YAML list.
pub fn render_rows(rows: &[StatusRow], format: Format) -> Result<String, StatusError> {
    let encode = |e: String| StatusError::Encode(e);
    Ok(match format {
        Format::Table if rows.is_empty() => "No resources found\n".to_string(),
        Format::Table => table(rows),
        Format::Json => format!(
            "{}\n",
            serde_json::to_string_pretty(rows).map_err(|e| encode(e.to_string()))?
        ),
        Format::Yaml => serde_norway::to_string(rows).map_err(|e| encode(e.to_string()))?,
    })
}

/// The rows as a table, kubectl's way: columns padded, `-` where a number does not apply.
pub fn table(rows: &[StatusRow]) -> String {
    let dash = |n: Option<u128>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    let mut lines = vec![[
        "QUEUE",
        "MODEL",
        "QUOTA",
        "ALLOCATED",
        "PENDING",
        "RESERVED",
        "FREE",
        "OVER",
        "NOTE",
    ]
    .map(String::from)];
    for r in rows {
        lines.push([
            r.queue.clone(),
            r.model.clone(),
            dash(r.quota),
            r.allocated.to_string(),
            r.pending.to_string(),
            r.reserved.to_string(),
            dash(r.free),
            dash(r.over),
            r.note.clone(),
        ]);
    }
    crate::admission::padded(&lines)
}

/// Renders the usage of `snap`, optionally for one queue: a table (with the broken
/// annotations and the held Jobs below it), or the rows as a JSON / YAML list.
pub fn render(
    snap: &Snapshot,
    queue: Option<&str>,
    format: Format,
    now: jiff::Timestamp,
) -> Result<String, StatusError> {
    let rows = rows(snap, queue, now)?;
    let text = render_rows(&rows, format)?;
    Ok(match format {
        Format::Table if !rows.is_empty() => {
            text + &problems(snap, queue) + &waiting_table(snap, queue, now)
        }
        _ => text,
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
        let Some(q) = snap.queue(&name) else { continue };
        if let Some(Err(e)) = &q.quota {
            out.push_str(&format!(
                "\nqueue {name}: quota 0 for every model until its annotation is fixed: {e}\n"
            ));
        }
        for e in [q.enforcement.as_ref().err(), q.order.as_ref().err()]
            .into_iter()
            .flatten()
        {
            out.push_str(&format!("\nqueue {name}: {e}\n"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::records::queue_record;

    fn queue(v: serde_json::Value) -> crate::cluster::QueueRecord {
        queue_record(&v).unwrap()
    }

    #[test]
    fn live_rows_are_what_the_reconciler_wrote() {
        let written = serde_json::json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "q", "annotations": {
                "volcano.sh/card.quota": r#"{"NVIDIA-H200":2}"#,
                "volcano.sh/card.usage": r#"{"NVIDIA-H200":{"quota":2,"allocated":3,"pending":0,"reserved":0},"NVIDIA-H200|RTX-4090":{"quota":0,"allocated":0,"pending":1,"reserved":0},"observedAt":"2026-11-26T10:00:00Z"}"#}}});
        let fresh = serde_json::json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "new"}});
        let rows = written_rows(&[queue(written), queue(fresh)], None).unwrap();
        assert_eq!(
            table(&rows),
            "\
QUEUE  MODEL                 QUOTA  ALLOCATED  PENDING  RESERVED  FREE  OVER  NOTE
new    -                     0      0          0        0         0     0     no card.quota: quota 0 for every model; no usage written yet
q      NVIDIA-H200           2      3          0        0         0     1
q      NVIDIA-H200|RTX-4090  -      0          1        0         -     -
"
        );
        let e = written_rows(&[], Some("x")).unwrap_err().to_string();
        assert_eq!(e, "queue x is not in the snapshot (queues: )");
        assert_eq!(
            render_rows(&[], Format::Table).unwrap(),
            "No resources found\n"
        );
    }
}
