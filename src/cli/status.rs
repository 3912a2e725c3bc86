//! `card-quota status`: the per-queue, per-model usage table.

use std::collections::{BTreeMap, BTreeSet};

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

/// Which queues `status` shows: every one, the one `--queue` names, and with `-n` only
/// those the namespace's card pods and PodGroups are charged to (and its waiting Jobs).
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub queue: Option<String>,
    /// The namespace and the queues its card workloads use.
    pub namespace: Option<(String, BTreeSet<crate::cards::QueueName>)>,
}

impl Scope {
    /// Every queue, or the one `queue` names.
    pub fn queue(queue: Option<&str>) -> Self {
        Self {
            queue: queue.map(str::to_string),
            namespace: None,
        }
    }

    /// Narrowed to the queues `namespace`'s card pods and PodGroups use in `snap`.
    pub fn in_namespace(self, namespace: &str, snap: &Snapshot) -> Self {
        Self {
            namespace: Some((namespace.to_string(), snap.queues_used_in(namespace))),
            ..self
        }
    }

    fn shows(&self, queue: &str) -> bool {
        self.queue.as_deref().is_none_or(|q| q == queue)
            && self
                .namespace
                .as_ref()
                .is_none_or(|(_, used)| used.iter().any(|u| u.as_str() == queue))
    }

    fn shows_group(&self, g: &crate::cluster::PodGroupRecord) -> bool {
        self.shows(g.queue.as_str())
            && self
                .namespace
                .as_ref()
                .is_none_or(|(ns, _)| *ns == g.key.namespace)
    }

    /// What an empty table says: kubectl's words, with the namespace when one is given.
    pub fn nothing_found(&self) -> String {
        match &self.namespace {
            Some((ns, _)) => format!(
                "No card pod or PodGroup in namespace {ns} is charged to a queue{}\n",
                self.queue
                    .as_deref()
                    .map(|q| format!(" (looked for queue {q})"))
                    .unwrap_or_default()
            ),
            None => "No resources found\n".to_string(),
        }
    }
}

/// What `status` knows of the install beside the queues: read from its webhooks when
/// the reader may (live), else nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Install {
    /// The pod hooks fail open (an install whose default enforcement is warn): a queue
    /// in deny is enforced only while card-quota answers.
    pub fails_open: bool,
}

impl Install {
    /// The install as its validating webhook configurations show it: the pod hook
    /// (`pods.card-quota.volcano.sh`) decides whether card pods go on while card-quota
    /// is down. No such hook: nothing known (`fails_open` false).
    pub fn from_webhooks(
        configs: &[k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration],
    ) -> Self {
        let fails_open = configs
            .iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .any(|h| h.name == POD_HOOK && h.failure_policy.as_deref() == Some("Ignore"));
        Self { fails_open }
    }
}

/// The validating pod hook's name, as the manifests and the chart write it.
pub const POD_HOOK: &str = "pods.card-quota.volcano.sh";

/// The NOTE on a queue in deny under an install that fails open.
pub const DENY_FAILS_OPEN_NOTE: &str =
    "deny, but the install fails open: enforced only while card-quota answers";

/// A queue in deny under an install that fails open: its own `card.enforcement` says
/// deny (under such an install, whose default is warn, nothing else makes one deny).
fn deny_fails_open(q: &crate::cluster::QueueRecord, install: Install) -> bool {
    install.fails_open && q.enforcement == Ok(Some(crate::cards::annotations::Enforcement::Deny))
}

/// `note` with `more` after it.
fn and_note(note: String, more: &str) -> String {
    match (note.is_empty(), more.is_empty()) {
        (true, _) => more.to_string(),
        (false, true) => note,
        (false, false) => format!("{note}; {more}"),
    }
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
    /// Closed, no quota, an annotation that does not parse, enforcement warn; in a
    /// tree, what the queue borrows and lends.
    pub note: String,
    /// The queue's parent (`spec.parent`), in a tree of queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// In a tree: the queue's `card.borrow`, what it borrows, its children's shares and
    /// what its subtree may still take (the fields of `volcano.sh/card.usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrow: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrowed: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shares: Option<u128>,
    #[serde(rename = "subtreeFree", skip_serializing_if = "Option::is_none")]
    pub subtree_free: Option<i64>,
    /// Cards of pods waiting behind card-quota's gate (`card.full: wait`): not in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<u128>,
    /// What does not parse on the queue (`card.quota`, `card.enforcement`,
    /// `card.order`), in full: the table prints it below itself instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// How deep the queue sits in the tree (the table indents by it).
    #[serde(skip)]
    pub depth: usize,
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
            parent: None,
            borrow: r.borrow.map(|c| c.get()),
            borrowed: r.borrowed.map(|c| c.get()),
            shares: r.shares.map(|c| c.get()),
            subtree_free: r.pool_free,
            waiting: r.waiting.map(|c| c.get()),
            problem: None,
            depth: 0,
        }
    }

    /// The tree part of the NOTE column (and the cards waiting behind the gate).
    fn tree_note(&self) -> String {
        let mut parts = Vec::new();
        if let Some(w) = self.waiting {
            parts.push(format!("{w} waiting"));
        }
        if let Some(s) = self.shares {
            parts.push(format!("subtree; children's shares {s}"));
        }
        match self.subtree_free {
            Some(f) if f < 0 => parts.push(format!("over-subscribed by {}", -f)),
            Some(f) => parts.push(format!("subtree may take {f} more")),
            None => {}
        }
        match (self.borrow, self.borrowed) {
            (Some(b), Some(x)) => parts.push(format!("borrow {b}, borrowed {x}")),
            (None, Some(x)) if x > 0 => parts.push(format!("borrowed {x}")),
            (Some(b), None) => parts.push(format!("borrow {b}")),
            _ => {}
        }
        parts.join("; ")
    }

    /// The one row of a queue with no numbers; one that caps nothing (Volcano's root,
    /// an inner queue without `card.quota`) shows no quota, free or over at all.
    fn bare(queue: &str, note: &str, caps: bool) -> Self {
        Self::of(queue, "-".into(), caps, &Row::default(), note)
    }
}

/// What a reader must know about `queue` beside its numbers.
fn note(snap: &Snapshot, queue: &crate::cards::QueueName, install: Install) -> String {
    match snap.queue(queue) {
        Some(q) => queue_note(q, snap.has_children(queue), install),
        None => "no such Queue (charges recorded under its name)".into(),
    }
}

/// Everything on `q` that does not parse, in full (`None` when all does).
fn queue_problem(q: &crate::cluster::QueueRecord) -> Option<String> {
    let errors: Vec<String> = [
        q.quota
            .as_ref()
            .and_then(|r| r.as_ref().err())
            .map(ToString::to_string),
        q.enforcement.as_ref().err().map(ToString::to_string),
        q.order.as_ref().err().map(ToString::to_string),
        q.full.as_ref().err().map(ToString::to_string),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// A queue without `card.quota` that is no card level: Volcano's root (every queue
/// without a parent is below it) or an inner queue. A leaf without it has quota 0.
fn caps_nothing(q: &crate::cluster::QueueRecord, has_children: bool) -> bool {
    q.quota.is_none() && (has_children || q.name.as_str() == crate::cards::QueueName::ROOT)
}

/// What a reader must know about a Queue beside its numbers.
fn queue_note(q: &crate::cluster::QueueRecord, has_children: bool, install: Install) -> String {
    use crate::cards::annotations::Enforcement;
    let mut notes: Vec<String> = Vec::new();
    if q.is_closed() {
        notes.push(q.state.clone().unwrap_or_else(|| "Closed".into()));
    }
    match &q.quota {
        None if caps_nothing(q, has_children) => {
            notes.push("no card.quota: caps nothing below it".into())
        }
        None => notes.push("no card.quota: quota 0 for every model".into()),
        Some(Err(_)) => notes.push("card.quota invalid: quota 0 until fixed".into()),
        Some(Ok(_)) => {}
    }
    match &q.enforcement {
        Ok(Some(Enforcement::Warn)) => notes.push("enforcement warn".into()),
        Err(_) => notes.push("card.enforcement invalid".into()),
        _ => {}
    }
    if q.order.is_err() {
        notes.push("card.order invalid".into());
    }
    match &q.full {
        Ok(Some(crate::cards::annotations::Full::Wait)) => notes.push("full: pods wait".into()),
        Err(_) => notes.push("card.full invalid".into()),
        _ => {}
    }
    if deny_fails_open(q, install) {
        notes.push(DENY_FAILS_OPEN_NOTE.into());
    }
    notes.join("; ")
}

/// The rows of `status`: every queue of the snapshot (or `queue` alone), each model it
/// has a quota for or uses, in name order.
pub fn rows(
    snap: &Snapshot,
    scope: &Scope,
    install: Install,
    now: jiff::Timestamp,
) -> Result<Vec<StatusRow>, StatusError> {
    let report: BTreeMap<String, BTreeMap<UsageKey, Row>> = usage_report(snap, now);
    // FREE as what would be admitted now, where the snapshot holds the objects.
    let rooms = crate::admission::rooms(snap, &report, now);
    let mut names: std::collections::BTreeSet<String> =
        snap.queue_names().iter().map(|q| q.to_string()).collect();
    names.extend(report.keys().cloned());
    if let Some(q) = &scope.queue {
        if !names.contains(q) {
            return Err(StatusError::UnknownQueue {
                queue: q.to_string(),
                known: names.into_iter().collect::<Vec<_>>().join(", "),
            });
        }
    }
    names.retain(|n| scope.shows(n));
    let parent_of = |n: &str| {
        snap.queue(&crate::cards::QueueName::new(n))
            .and_then(|r| snap.link(r))
            .map(ToString::to_string)
    };
    let mut out = Vec::new();
    for (name, depth) in tree_order(names.into_iter().map(|n| (n.clone(), parent_of(&n)))) {
        let note = note(snap, &crate::cards::QueueName::new(name.clone()), install);
        let numbers = report.get(&name).filter(|r| !r.is_empty());
        let mut rows = match numbers {
            None => {
                let q = crate::cards::QueueName::new(name.clone());
                let caps = snap
                    .queue(&q)
                    .is_none_or(|r| !caps_nothing(r, snap.has_children(&q)));
                vec![StatusRow::bare(&name, &note, caps)]
            }
            Some(numbers) => numbers
                .iter()
                .map(|(key, r)| {
                    let cap_note;
                    let note = match key {
                        UsageKey::Cap(_) if note.is_empty() => "group cap",
                        UsageKey::Cap(_) => {
                            cap_note = format!("group cap; {note}");
                            &cap_note
                        }
                        _ => &note,
                    };
                    let mut row = StatusRow::of(&name, key.to_string(), key.has_quota(), r, note);
                    if let (Some(room), Some(_)) =
                        (rooms.get(&(name.clone(), key.clone())), row.free)
                    {
                        row.free = Some(room.get());
                    }
                    row
                })
                .collect(),
        };
        let problem = snap
            .queue(&crate::cards::QueueName::new(name.clone()))
            .and_then(queue_problem);
        for r in &mut rows {
            r.parent = parent_of(&name);
            r.depth = depth;
            r.problem.clone_from(&problem);
        }
        out.extend(rows);
    }
    Ok(out)
}

/// Queue names in tree order: each queue after its parent, children by name, with how
/// deep each sits; names order alone in a flat cluster. Queues no walk from a top
/// reaches (a cycle) come last.
fn tree_order(queues: impl IntoIterator<Item = (String, Option<String>)>) -> Vec<(String, usize)> {
    let queues: BTreeMap<String, Option<String>> = queues.into_iter().collect();
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut tops = Vec::new();
    for (q, p) in &queues {
        match p.as_deref().filter(|p| queues.contains_key(*p)) {
            Some(p) => children.entry(p).or_default().push(q),
            None => tops.push(q.as_str()),
        }
    }
    let mut out: Vec<(String, usize)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut stack: Vec<(&str, usize)> = tops.into_iter().rev().map(|q| (q, 0)).collect();
    while let Some((q, d)) = stack.pop() {
        if !seen.insert(q) {
            continue;
        }
        out.push((q.to_string(), d));
        for c in children.get(q).into_iter().flatten().rev() {
            stack.push((c, d + 1));
        }
    }
    for q in queues.keys() {
        if !seen.contains(q.as_str()) {
            out.push((q.clone(), 0));
        }
    }
    out
}

/// The rows the reconciler wrote on each Queue (`volcano.sh/card.usage`), for a live
/// `status` that needs only to read Queues.
pub fn written_rows(
    queues: &[crate::cluster::QueueRecord],
    scope: &Scope,
    install: Install,
) -> Result<Vec<StatusRow>, StatusError> {
    if let Some(q) = &scope.queue {
        if !queues.iter().any(|r| r.name.as_str() == q) {
            let known: Vec<&str> = queues.iter().map(|r| r.name.as_str()).collect();
            return Err(StatusError::UnknownQueue {
                queue: q.to_string(),
                known: known.join(", "),
            });
        }
    }
    let mut out = Vec::new();
    let by_name: BTreeMap<&str, &crate::cluster::QueueRecord> = queues
        .iter()
        .filter(|r| scope.shows(r.name.as_str()))
        .map(|r| (r.name.as_str(), r))
        .collect();
    let order = tree_order(by_name.values().map(|r| {
        (
            r.name.to_string(),
            r.parent.as_ref().map(ToString::to_string),
        )
    }));
    for (name, depth) in order {
        let Some(q) = by_name.get(name.as_str()).copied() else {
            continue;
        };
        let has_children = queues.iter().any(|r| r.parent.as_ref() == Some(&q.name));
        let mut note = queue_note(q, has_children, install);
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
                let opt = |f: &str| {
                    v.get(f)
                        .and_then(serde_json::Value::as_u64)
                        .map(crate::cards::Cards::new)
                };
                let row = Row {
                    quota: cards("quota"),
                    allocated: cards("allocated"),
                    pending: cards("pending"),
                    reserved: cards("reserved"),
                    borrow: opt("borrow"),
                    borrowed: opt("borrowed"),
                    shares: opt("shares"),
                    pool_free: v.get("free").and_then(serde_json::Value::as_i64),
                    waiting: opt("waiting"),
                };
                // A key ending in '*' is a group cap (a model's name never ends so).
                let note = if k.ends_with('*') { "group cap" } else { "" };
                StatusRow::of(q.name.as_str(), k.clone(), !k.contains('|'), &row, note)
            })
            .collect();
        if written.is_none() {
            let missing = match &q.usage {
                None => "no usage written yet",
                Some(_) => "usage annotation unreadable",
            };
            note = and_note(note, missing);
        }
        if rows.is_empty() {
            rows.push(StatusRow::bare(
                q.name.as_str(),
                "",
                !caps_nothing(q, has_children),
            ));
        }
        for r in &mut rows {
            // A cap's row says so before what the queue's note says.
            r.note = and_note(std::mem::take(&mut r.note), &note);
            r.problem = queue_problem(q);
            r.parent = q.parent.as_ref().map(ToString::to_string);
            r.depth = depth;
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
        let tree = r.tree_note();
        let note = match (r.note.is_empty(), tree.is_empty()) {
            (_, true) => r.note.clone(),
            (true, false) => tree,
            (false, false) => format!("{}; {tree}", r.note),
        };
        lines.push([
            format!("{}{}", "  ".repeat(r.depth), r.queue),
            r.model.clone(),
            dash(r.quota),
            r.allocated.to_string(),
            r.pending.to_string(),
            r.reserved.to_string(),
            dash(r.free),
            dash(r.over),
            note,
        ]);
    }
    crate::admission::padded(&lines)
}

/// Renders the usage of `snap`, optionally for one queue: a table (with the broken
/// annotations and the held Jobs below it), or the rows as a JSON / YAML list.
pub fn render(
    snap: &Snapshot,
    scope: &Scope,
    install: Install,
    format: Format,
    now: jiff::Timestamp,
) -> Result<String, StatusError> {
    let rows = rows(snap, scope, install, now)?;
    let text = render_scoped(&rows, scope, format)?;
    Ok(match format {
        Format::Table if !rows.is_empty() => {
            text + &problems(snap, scope) + &waiting_table(snap, scope, now)
        }
        _ => text,
    })
}

/// The rows as [`render_rows`] writes them, an empty table in the scope's words.
pub fn render_scoped(
    rows: &[StatusRow],
    scope: &Scope,
    format: Format,
) -> Result<String, StatusError> {
    match format {
        Format::Table if rows.is_empty() => Ok(scope.nothing_found()),
        _ => render_rows(rows, format),
    }
}

/// Queues whose `card.quota` does not parse: they count as quota 0 for every model (and
/// refuse every charge) until it is fixed; the table alone would show only the 0.
pub fn problems(snap: &Snapshot, scope: &Scope) -> String {
    let mut out = String::new();
    for name in snap.queue_names() {
        if !scope.shows(name.as_str()) {
            continue;
        }
        let Some(q) = snap.queue(&name) else { continue };
        if let Some(Err(e)) = &q.quota {
            out.push_str(&format!(
                "\nqueue {name}: quota 0 for every model until its annotation is fixed: {e}\n"
            ));
        }
        for e in [
            q.enforcement.as_ref().err(),
            q.order.as_ref().err(),
            q.full.as_ref().err(),
        ]
        .into_iter()
        .flatten()
        {
            out.push_str(&format!("\nqueue {name}: {e}\n"));
        }
    }
    if scope.queue.is_none() && scope.namespace.is_none() {
        for u in crate::controller::plan::unmanaged(snap) {
            out.push_str(&format!("\n{}\n", u.message()));
        }
        for m in crate::controller::plan::modelless(snap) {
            out.push_str(&format!("\n{}\n", m.message()));
        }
    }
    out
}

/// The Jobs held at Volcano's enqueue (PodGroups with card demand still Pending),
/// oldest first; empty when none waits.
pub fn waiting_table(snap: &Snapshot, scope: &Scope, now: jiff::Timestamp) -> String {
    let rows: Vec<[String; 4]> = snap
        .waiting_groups()
        .into_iter()
        .filter(|g| scope.shows_group(g))
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
    fn a_queue_in_deny_under_an_install_that_fails_open_says_so() {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        let config = |policy: &str| -> ValidatingWebhookConfiguration {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "card-quota"},
                "webhooks": [
                    {"name": "queues.card-quota.volcano.sh", "failurePolicy": "Ignore",
                     "clientConfig": {}, "sideEffects": "None", "admissionReviewVersions": ["v1"]},
                    {"name": POD_HOOK, "failurePolicy": policy,
                     "clientConfig": {}, "sideEffects": "None", "admissionReviewVersions": ["v1"]}]
            }))
            .unwrap()
        };
        let open = Install::from_webhooks(&[config("Ignore")]);
        assert!(open.fails_open);
        assert!(!Install::from_webhooks(&[config("Fail")]).fails_open);
        assert!(!Install::from_webhooks(&[]).fails_open);
        let q = |name: &str, enforcement: Option<&str>| {
            let mut annotations =
                serde_json::json!({"volcano.sh/card.quota": r#"{"NVIDIA-H200":2}"#});
            if let Some(e) = enforcement {
                annotations["volcano.sh/card.enforcement"] = e.into();
            }
            queue(
                serde_json::json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                "metadata": {"name": name, "annotations": annotations}}),
            )
        };
        let queues = [
            q("held", Some("deny")),
            q("trial", Some("warn")),
            q("plain", None),
        ];
        let notes = |install: Install| -> Vec<(String, String)> {
            written_rows(&queues, &Scope::default(), install)
                .unwrap()
                .into_iter()
                .map(|r| (r.queue, r.note))
                .collect()
        };
        let none = "no usage written yet";
        assert_eq!(
            notes(open),
            [
                ("held".into(), format!("{DENY_FAILS_OPEN_NOTE}; {none}")),
                ("plain".into(), none.into()),
                ("trial".into(), format!("enforcement warn; {none}")),
            ]
        );
        assert_eq!(notes(Install::default())[0], ("held".into(), none.into()));
        // The same from a snapshot of the objects.
        let objects: String = queues
            .iter()
            .map(|r| format!("---\napiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata:\n  name: {}\n  annotations: {{volcano.sh/card.quota: '{{\"NVIDIA-H200\":2}}'{}}}\n",
                r.name,
                match &r.enforcement { Ok(Some(e)) => format!(", volcano.sh/card.enforcement: {}", e.as_str()), _ => String::new() }))
            .collect();
        let (snap, skipped) = crate::snapshot::load::load(&objects).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        let held = rows(
            &snap,
            &Scope::queue(Some("held")),
            open,
            jiff::Timestamp::now(),
        )
        .unwrap();
        assert_eq!(held[0].note, DENY_FAILS_OPEN_NOTE);
    }

    #[test]
    fn live_rows_are_what_the_reconciler_wrote() {
        let written = serde_json::json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "q", "annotations": {
                "volcano.sh/card.quota": r#"{"NVIDIA-H200":2}"#,
                "volcano.sh/card.usage": r#"{"*":{"quota":4,"allocated":3,"pending":1,"reserved":0},"NVIDIA-H200":{"quota":2,"allocated":3,"pending":0,"reserved":0},"NVIDIA-H200|RTX-4090":{"quota":0,"allocated":0,"pending":1,"reserved":0},"observedAt":"2026-11-26T10:00:00Z"}"#}}});
        let fresh = serde_json::json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "new"}});
        let rows = written_rows(
            &[queue(written), queue(fresh)],
            &Scope::default(),
            Install::default(),
        )
        .unwrap();
        assert_eq!(
            table(&rows),
            "\
QUEUE  MODEL                 QUOTA  ALLOCATED  PENDING  RESERVED  FREE  OVER  NOTE
new    -                     0      0          0        0         0     0     no card.quota: quota 0 for every model; no usage written yet
q      *                     4      3          1        0         0     0     group cap
q      NVIDIA-H200           2      3          0        0         0     1
q      NVIDIA-H200|RTX-4090  -      0          1        0         -     -
"
        );
        let e = written_rows(&[], &Scope::queue(Some("x")), Install::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "queue x is not in the snapshot (queues: )");
        assert_eq!(
            render_rows(&[], Format::Table).unwrap(),
            "No resources found\n"
        );
    }

    #[test]
    fn cards_claimed_through_dra_are_counted_by_the_allocated_device_model() {
        // A DRA node with two H200s and a MIG partition, the NVIDIA classes, a template
        // for one GPU; pods: one bound with its claim allocated (the H200 gpu-1), one
        // pending whose claim is not made yet, and two sharing one claim (paid once, by
        // the pod it is reserved for first).
        let objects = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":4}'}}}
- {apiVersion: v1, kind: Node, metadata: {name: h200-1}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.nvidia.com}
  spec: {selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: h200-1-gpu.nvidia.com}
  spec:
    driver: gpu.nvidia.com
    nodeName: h200-1
    pool: {name: h200-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-1, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}}}
    - {name: gpu-2-mig-0, attributes: {type: {string: mig}, productName: {string: NVIDIA H200}, profile: {string: 1g.18gb}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: one-gpu, namespace: ml}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: a-gpu-x1, namespace: ml}
  spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}
  status:
    allocation: {devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: h200-1, device: gpu-1}]}}
    reservedFor: [{resource: pods, name: a, uid: u-a}]
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: shared, namespace: ml}
  spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}
  status:
    allocation: {devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: h200-1, device: gpu-0}]}}
    reservedFor: [{resource: pods, name: s1, uid: u-s1}, {resource: pods, name: s2, uid: u-s2}]
- apiVersion: v1
  kind: Pod
  metadata: {name: a, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
  spec: {nodeName: h200-1, containers: [{name: c, image: x}], resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]}
  status: {phase: Running, resourceClaimStatuses: [{name: gpu, resourceClaimName: a-gpu-x1}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: b, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
  spec: {containers: [{name: c, image: x}], resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: s1, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
  spec: {nodeName: h200-1, containers: [{name: c, image: x}], resourceClaims: [{name: gpu, resourceClaimName: shared}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: s2, namespace: ml, annotations: {scheduling.volcano.sh/queue-name: q}}
  spec: {nodeName: h200-1, containers: [{name: c, image: x}], resourceClaims: [{name: gpu, resourceClaimName: shared}]}
"#;
        let (mut snap, skipped) = crate::snapshot::load::load(objects).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        let now = jiff::Timestamp::now();
        let q = crate::cards::QueueName::new("q");
        let h200 = crate::cards::CardName::parse("NVIDIA-H200").unwrap();
        let u = snap.usage(&q, now);
        assert_eq!(u.allocated.get(&h200).map(|c| c.get()), Some(2), "{u:?}");
        assert_eq!(
            u.pending.values().map(|c| c.get()).sum::<u128>(),
            1,
            "{u:?}"
        );
        assert!(u.problems.is_empty(), "{:?}", u.problems);
        // The claim's allocation gone (the pod deleted, the devices freed): the usage
        // follows the claim, not only the pod.
        crate::snapshot::load::remove(&mut snap, "ResourceClaim", "ml", "shared");
        let u = snap.usage(&q, now);
        assert_eq!(u.allocated.get(&h200).map(|c| c.get()), Some(1));
        assert_eq!(
            u.problems.values().next().map(String::as_str),
            Some("pod ml/s1: its claim gpu uses ResourceClaim ml/shared, which card-quota does not hold (yet): it cannot tell which cards it asks for; create it first, or try again")
        );
        assert!(plan_unmanaged_is_empty(&snap));
    }

    fn plan_unmanaged_is_empty(snap: &Snapshot) -> bool {
        crate::controller::plan::unmanaged(snap).is_empty()
    }

    #[test]
    fn a_namespace_sees_the_queues_its_card_workloads_use_and_its_waiting_jobs() {
        let objects = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: qa, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: qb, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2}'}}}
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: qc, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2}'}}}
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: team-a, annotations: {scheduling.volcano.sh/queue-name: qa, volcano.sh/card.name: NVIDIA-H200}}
  spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: team-b, annotations: {scheduling.volcano.sh/queue-name: qb, volcano.sh/card.name: NVIDIA-H200}}
  spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]}
- apiVersion: scheduling.volcano.sh/v1beta1
  kind: PodGroup
  metadata: {name: wait-a, namespace: team-a, annotations: {volcano.sh/card.request: '{"NVIDIA-H200":3}'}}
  spec: {queue: qc, minMember: 1}
  status: {phase: Pending}
- apiVersion: scheduling.volcano.sh/v1beta1
  kind: PodGroup
  metadata: {name: wait-b, namespace: team-b, annotations: {volcano.sh/card.request: '{"NVIDIA-H200":3}'}}
  spec: {queue: qc, minMember: 1}
  status: {phase: Pending}
"#;
        let (snap, skipped) = crate::snapshot::load::load(objects).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        let now = jiff::Timestamp::now();
        let queues = |scope: &Scope| -> Vec<String> {
            let mut q: Vec<String> = rows(&snap, scope, Install::default(), now)
                .unwrap()
                .into_iter()
                .map(|r| r.queue)
                .collect();
            q.dedup();
            q
        };
        let a = Scope::default().in_namespace("team-a", &snap);
        assert_eq!(queues(&a), ["qa", "qc"]);
        let text = render(&snap, &a, Install::default(), Format::Table, now).unwrap();
        assert!(text.contains("team-a/wait-a"), "{text}");
        assert!(!text.contains("team-b/wait-b"), "{text}");
        assert_eq!(
            queues(&Scope::queue(Some("qc")).in_namespace("team-b", &snap)),
            ["qc"]
        );
        let none = Scope::queue(Some("qb")).in_namespace("team-a", &snap);
        assert_eq!(
            render(&snap, &none, Install::default(), Format::Table, now).unwrap(),
            "No card pod or PodGroup in namespace team-a is charged to a queue (looked for queue qb)\n"
        );
        // Live, the namespace's own pods and PodGroups alone (no Queue read) say the same.
        let own: String = objects
            .lines()
            .filter(|l| !l.contains("kind: Queue"))
            .collect::<Vec<_>>()
            .join("\n");
        let (alone, _) = crate::snapshot::load::load(&own).unwrap();
        let used: Vec<String> = alone
            .queues_used_in("team-a")
            .iter()
            .map(|q| q.to_string())
            .collect();
        assert_eq!(used, ["qa", "qc"]);
        let empty = Scope::default().in_namespace("nobody", &snap);
        assert_eq!(
            render(&snap, &empty, Install::default(), Format::Table, now).unwrap(),
            "No card pod or PodGroup in namespace nobody is charged to a queue\n"
        );
    }
}
