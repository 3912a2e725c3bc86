//! The reconciler's shell: each pass plans from the snapshot (pure, under the lock),
//! publishes gauges, and — only while this replica holds the Lease — applies the
//! usage annotations (server-side apply, field manager `card-quota`, at most one write
//! per queue per [`USAGE_EVERY`]), raises Events, prunes quiet ledgers and deletes the
//! ledgers of deleted queues.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::Client;
use serde_json::json;
use tokio::sync::watch;

use crate::cards::annotations::{CARD_QUEUE, USAGE};
use crate::cards::QueueName;
use crate::cluster::records::queue_record;
use crate::decide::{Config, Enforcement, EventIntent, ObjectRef};
use crate::live::caches::Synced;
use crate::live::charge::CommitMetrics;
use crate::live::leadership::LeaseCheck;
use crate::live::metrics::{LedgerMetrics, ResultLabel};
use crate::live::volcano::queue_resource;
use crate::live::Committer;

use super::metrics::{ModeLabel, ReconcilerMetrics};
use crate::snapshot::{Dirty, Snapshot};

use super::events::EventSink;
use super::plan::{
    deny_fails_open_message, exceeded_message, invalid_message, queue_state, recount_queues,
    recount_slice, unstamped, usage_write, EventMemory, QueueState, Stamp, DENY_FAILS_OPEN,
    EXCEEDED, INVALID, TREE,
};
use super::releaser::Releaser;

use crate::live::FIELD_MANAGER;

/// Unstamped pods stamped per full pass: pods from before the install are stamped over a
/// few passes instead of in one burst of writes.
pub const STAMPS_PER_PASS: usize = 100;

/// The least time between two usage writes to one Queue: a burst changes usage with
/// every pod, and every Queue write wakes Volcano's scheduler and controllers.
pub const USAGE_EVERY: Duration = Duration::from_secs(1);
/// Pods a full recount reads per hold of the snapshot (about 0.2 ms).
pub const RECOUNT_SLICE: usize = 256;
/// Queue states read per hold of the snapshot (each reads its tally, O(models)).
pub const STATE_SLICE: usize = 256;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub queues: usize,
    pub usage_written: usize,
    pub events: usize,
    pub ledger_entries_pruned: usize,
    /// Pods stamped with the queue they are counted in.
    pub stamped: usize,
    /// Waiting pods released (their gate removed, the webhook admitting it).
    pub released: usize,
    pub errors: usize,
    pub leader: bool,
}

/// The reconciler of one process.
pub struct Reconciler {
    snapshot: Arc<Mutex<Snapshot>>,
    client: Client,
    api: Api<DynamicObject>,
    committer: Arc<Committer>,
    events: Arc<EventSink>,
    metrics: Arc<ReconcilerMetrics>,
    ledger_metrics: Arc<LedgerMetrics>,
    leader: watch::Receiver<bool>,
    memory: EventMemory,
    /// What was told about nodes in Events: unmanaged cards, cards without a model
    /// (node, reason, message; told again after a restart).
    told_nodes: std::collections::BTreeSet<(String, &'static str, String)>,
    /// The snapshot's count of card changes when they were last reported.
    reported_changes: Option<u64>,
    /// When each queue's usage was last written.
    written: HashMap<QueueName, Instant>,
    /// Queues whose last usage writes failed: how many in a row, and until when the
    /// next one waits.
    failing: HashMap<QueueName, (u32, Instant)>,
    /// Confirms leadership against the Lease before writing.
    lease: Option<LeaseCheck>,
    /// The install fails open (its enforcement is warn): a queue in deny is enforced
    /// only while card-quota answers, which the metrics say per queue.
    fail_open: bool,
    /// Releases waiting pods (on the leader).
    releaser: Releaser,
}

/// The wait after `n` failed usage writes in a row: 1 s doubling to a minute.
pub fn write_backoff(n: u32) -> Duration {
    (USAGE_EVERY * 2u32.saturating_pow(n.saturating_sub(1))).min(Duration::from_secs(60))
}

fn queue_ref(s: &QueueState) -> ObjectRef {
    ObjectRef {
        api_version: "scheduling.volcano.sh/v1beta1".into(),
        kind: "Queue".into(),
        namespace: None,
        name: s.queue.to_string(),
        uid: s.uid.clone(),
    }
}

/// Why writing a queue's usage annotation failed.
#[derive(Debug, thiserror::Error)]
enum UsageWriteError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("the written Queue cannot be re-encoded: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Record(#[from] crate::cluster::records::RecordError),
}

impl Reconciler {
    pub fn new(
        client: Client,
        snapshot: Arc<Mutex<Snapshot>>,
        events: Arc<EventSink>,
        (metrics, ledger_metrics): (Arc<ReconcilerMetrics>, Arc<LedgerMetrics>),
        leader: watch::Receiver<bool>,
        committer: Arc<Committer>,
    ) -> Self {
        Self {
            snapshot,
            api: Api::all_with(client.clone(), &queue_resource()),
            client,
            committer,
            events,
            metrics,
            ledger_metrics,
            leader,
            memory: EventMemory::default(),
            told_nodes: Default::default(),
            reported_changes: None,
            written: HashMap::new(),
            fail_open: false,
            failing: HashMap::new(),
            lease: None,
            releaser: Releaser::default(),
        }
    }

    /// Writes only while the Lease object itself says this replica holds it.
    pub fn with_lease_check(mut self, check: LeaseCheck) -> Self {
        self.lease = Some(check);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn apply_usage(&self, queue: &QueueName, text: &str) -> Result<(), UsageWriteError> {
        let patch = json!({
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": { "name": queue.as_str(), "annotations": { USAGE: text } },
        });
        let o = self
            .api
            .patch(
                queue.as_str(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        let mut v = serde_json::to_value(&o)?;
        v["kind"] = json!("Queue");
        let rec = queue_record(&v)?;
        self.lock().remember_queue(rec);
        Ok(())
    }

    /// Stamps a pod with the queue it is counted in, against the version it was read at
    /// (a pod changed since is stamped on a later pass, from its new version).
    async fn stamp(&self, (pod, queue, rv): &Stamp) -> Result<(), kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace);
        let mut meta = json!({ "annotations": { CARD_QUEUE: queue.as_str() } });
        if let Some(rv) = rv {
            meta["resourceVersion"] = json!(rv.to_string());
        }
        api.patch(
            &pod.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": meta })),
        )
        .await
        .map(|_| ())
    }

    async fn event(
        &mut self,
        s: &QueueState,
        reason: &'static str,
        message: Option<String>,
    ) -> bool {
        let Some(message) = self.memory.note(&s.queue, reason, message) else {
            return false;
        };
        let intent = EventIntent {
            regarding: queue_ref(s),
            reason,
            message,
            warning: true,
            also: None,
        };
        match self.events.publish(&intent, "Reconcile").await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "could not publish {reason} on queue {}: {e}",
                    s.queue.as_str().escape_debug()
                );
                self.memory.forget(&s.queue, reason);
                false
            }
        }
    }

    /// Publishes the cards nodes announce of resources the install does not gate, and
    /// tells each of those, and each node's card resources without a model, once in an
    /// Event on its node. Returns the Events published.
    async fn report_unmanaged(&mut self) -> usize {
        let (list, reports) = {
            let snap = self.lock();
            (
                super::plan::unmanaged(&snap),
                super::plan::node_reports(&snap),
            )
        };
        self.metrics.publish_unmanaged(&list);
        self.told_nodes.retain(|r| reports.contains(r));
        let mut published = 0;
        for r in reports {
            let (node, reason, message) = &r;
            // DRA devices of no single node have no Node to tell it on: status and the
            // metric say it.
            if self.told_nodes.contains(&r) || node.is_empty() {
                continue;
            }
            let intent = EventIntent {
                regarding: ObjectRef {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    namespace: None,
                    name: node.clone(),
                    uid: None,
                },
                reason,
                message: crate::decide::messages::cap(message.clone()),
                warning: true,
                also: None,
            };
            match self.events.publish(&intent, "Reconcile").await {
                Ok(()) => {
                    published += 1;
                    self.told_nodes.insert(r);
                }
                Err(e) => tracing::warn!("could not publish {reason} on node {node}: {e}"),
            }
        }
        published
    }

    /// Recounts every queue and rebuilds the tally if any disagrees. The recount goes
    /// in slices of about [`RECOUNT_SLICE`] pods with the snapshot let go in between:
    /// at 100k pods a whole recount holds it for tens of milliseconds, and every
    /// admission waits for it.
    async fn check_tally(&self, now: jiff::Timestamp) {
        let queues = recount_queues(&self.lock());
        let mut wrong = Vec::new();
        let mut at = 0;
        while at < queues.len() {
            let (checked, w) = recount_slice(&self.lock(), &queues[at..], RECOUNT_SLICE, now);
            at += checked;
            wrong.extend(w);
            tokio::task::yield_now().await;
        }
        let mut snap = self.lock();
        let errors = snap.tally().errors();
        if !wrong.is_empty() || errors > 0 {
            tracing::warn!(
                queues = ?wrong,
                errors,
                "incremental usage disagreed with a full recount; rebuilt it"
            );
            self.metrics
                .tally_mismatches
                .inc_by(wrong.len().max(1) as u64);
            snap.rebuild_tally();
        }
    }

    /// The state of each of `names`, [`STATE_SLICE`] queues per hold of the snapshot.
    async fn states(&self, names: &[QueueName], now: jiff::Timestamp) -> Vec<QueueState> {
        let mut states = Vec::with_capacity(names.len());
        for slice in names.chunks(STATE_SLICE) {
            {
                let snap = self.lock();
                states.extend(slice.iter().map(|q| queue_state(&snap, q, now)));
            }
            if names.len() > STATE_SLICE {
                tokio::task::yield_now().await;
            }
        }
        states
    }

    /// Says the install fails open (`--enforcement warn`: its webhooks are rendered with
    /// `failurePolicy: Ignore`).
    pub fn with_fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// One pass: every queue when `full`, else the queues whose objects changed.
    pub async fn pass(&mut self, full: bool) -> Pass {
        let start = Instant::now();
        let now = jiff::Timestamp::now();
        let mut leader = *self.leader.borrow();
        if leader {
            if let Some(check) = &self.lease {
                leader = check.held().await;
            }
        }
        let (names, ledgers) = {
            let mut snap = self.lock();
            let dirty = snap.take_dirty();
            let names: Vec<QueueName> = match (full, dirty) {
                (true, _) | (_, Dirty::All) => {
                    let mut all = snap.queue_names();
                    all.extend(
                        self.metrics
                            .published_queues()
                            .into_iter()
                            .map(QueueName::new),
                    );
                    all.into_iter().collect()
                }
                (false, Dirty::Queues(s)) => s.into_iter().collect(),
                (false, Dirty::None) => Vec::new(),
            };
            // Ledgers with entries are pruned; empty ones of deleted queues go.
            let ledgers: Vec<(QueueName, Option<String>, bool)> = if leader {
                snap.ledgers()
                    .filter(|l| !l.ledger.is_empty() || snap.queue(&l.queue).is_none())
                    .map(|l| {
                        let orphan = l.ledger.is_empty() && snap.queue(&l.queue).is_none();
                        (l.queue.clone(), l.resource_version.clone(), orphan)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (names, ledgers)
        };
        if full {
            self.check_tally(now).await;
        }
        let states = self.states(&names, now).await;
        let mut pass = Pass {
            queues: states.len(),
            leader,
            ..Default::default()
        };
        for s in &states {
            let keep = s.exists || !s.rows.is_empty();
            self.metrics.publish_queue(
                s.queue.as_str(),
                s.parent.as_ref().map(|p| p.as_str()),
                keep.then_some(&s.rows),
            );
        }
        // Queues in deny under an install that fails open: their quota holds only while
        // card-quota answers (a metric and an Event on each).
        let deny_fail_open: std::collections::BTreeSet<QueueName> = {
            let snap = self.lock();
            self.metrics
                .publish_waiting(snap.waiting_groups_unordered(), now);
            let queues: std::collections::BTreeSet<QueueName> = if self.fail_open {
                snap.queues()
                    .filter(|q| {
                        snap.enforcement_of(&q.name, Enforcement::Warn) == Enforcement::Deny
                    })
                    .map(|q| q.name.clone())
                    .collect()
            } else {
                Default::default()
            };
            if self.fail_open {
                self.metrics
                    .publish_deny_fail_open(queues.iter().map(ToString::to_string));
            }
            queues
        };
        if leader {
            // Releases first: a waiting pod's room is there now.
            let r = self
                .releaser
                .pass(&self.client, &self.snapshot, &self.events, now)
                .await;
            pass.released += r.released;
            pass.events += r.events;
            pass.errors += r.errors;
            for (result, n) in [
                ("released", r.released),
                ("refused", r.refused),
                ("error", r.errors),
            ] {
                if n > 0 {
                    self.metrics
                        .releases
                        .get_or_create(&ResultLabel {
                            result: result.into(),
                        })
                        .inc_by(n as u64);
                }
            }
            for s in &states {
                if let Some(text) = usage_write(s, now) {
                    let waiting = self
                        .failing
                        .get(&s.queue)
                        .is_some_and(|(_, until)| Instant::now() < *until);
                    if waiting
                        || self
                            .written
                            .get(&s.queue)
                            .is_some_and(|t| t.elapsed() < USAGE_EVERY)
                    {
                        // Written a moment ago: the next pass writes the latest.
                        self.lock().mark_dirty(&s.queue);
                        continue;
                    }
                    self.written.insert(s.queue.clone(), Instant::now());
                    let result = match self.apply_usage(&s.queue, &text).await {
                        Ok(()) => {
                            self.failing.remove(&s.queue);
                            pass.usage_written += 1;
                            "applied"
                        }
                        Err(e) => {
                            let n = self.failing.get(&s.queue).map_or(1, |(n, _)| n + 1);
                            let wait = write_backoff(n);
                            self.failing
                                .insert(s.queue.clone(), (n, Instant::now() + wait));
                            tracing::warn!(
                                "could not apply usage of queue {} ({n} in a row; next try in {wait:?}): {e}",
                                s.queue.as_str().escape_debug()
                            );
                            self.lock().mark_dirty(&s.queue);
                            pass.errors += 1;
                            "error"
                        }
                    };
                    self.metrics
                        .usage_writes
                        .get_or_create(&ResultLabel {
                            result: result.into(),
                        })
                        .inc();
                }
                if !s.exists {
                    // A deleted queue's conditions end with it.
                    self.memory.note(&s.queue, EXCEEDED, None);
                    self.memory.note(&s.queue, INVALID, None);
                    self.memory.note(&s.queue, TREE, None);
                    self.memory.note(&s.queue, DENY_FAILS_OPEN, None);
                    continue;
                }
                let fails_open = deny_fail_open
                    .contains(&s.queue)
                    .then(|| deny_fails_open_message(&s.queue));
                if self.event(s, DENY_FAILS_OPEN, fails_open).await {
                    pass.events += 1;
                }
                if self.event(s, TREE, s.tree.clone()).await {
                    pass.events += 1;
                }
                if self.event(s, EXCEEDED, exceeded_message(s)).await {
                    pass.events += 1;
                }
                if self.event(s, INVALID, invalid_message(s)).await {
                    pass.events += 1;
                }
            }
            // Unmanaged cards are told as soon as a node changes them
            // (and every full pass, for Events that could not be published).
            let changes = self.lock().cards_changes();
            if full || self.reported_changes != Some(changes) {
                self.reported_changes = Some(changes);
                pass.events += self.report_unmanaged().await;
            }
            if full {
                let stamps = unstamped(&self.lock(), now, STAMPS_PER_PASS);
                for s in &stamps {
                    match self.stamp(s).await {
                        Ok(()) => {
                            pass.stamped += 1;
                            // Not stamped again before the watch brings the pod back.
                            let mut snap = self.lock();
                            if let Some(mut p) = snap.pod(&s.0).cloned() {
                                p.stamped_queue = Some(s.1.clone());
                                snap.upsert_pod(p);
                            }
                        }
                        // Changed or gone since the cache read it: a later pass sees.
                        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                        Err(e) => {
                            tracing::warn!(
                                "could not stamp pod {} with queue {}: {e}",
                                s.0,
                                s.1.as_str().escape_debug()
                            );
                            pass.errors += 1;
                        }
                    }
                }
            }
            let metrics: Arc<dyn CommitMetrics> = self.ledger_metrics.clone();
            for (queue, rv, orphan) in ledgers {
                let done = match (orphan, rv) {
                    (true, Some(rv)) => self.committer.delete_orphan(&queue, &rv).await.map(|_| 0),
                    (true, None) => Ok(0),
                    (false, _) => {
                        self.committer
                            .prune(&queue, &self.snapshot, &Config::default(), &metrics)
                            .await
                    }
                };
                match done {
                    Ok(n) => {
                        pass.ledger_entries_pruned += n;
                        if n > 0 {
                            self.ledger_metrics.pruned.inc_by(n as u64);
                        }
                    }
                    // A webhook wrote first; the next pass prunes from its version.
                    Err(crate::live::WriteError::Conflict(_)) => {}
                    Err(e) => {
                        tracing::warn!("could not prune ledger: {e}");
                        pass.errors += 1;
                    }
                }
            }
            self.written.retain(|_, t| t.elapsed() < USAGE_EVERY * 2);
            // A queue deleted while its writes failed is not tried again: forget it.
            self.failing
                .retain(|_, (_, until)| until.elapsed() < Duration::from_secs(600));
        }
        let mode = ModeLabel {
            mode: if full { "full" } else { "incremental" }.into(),
        };
        self.metrics.reconciles.get_or_create(&mode).inc();
        self.metrics
            .reconcile_duration
            .get_or_create(&mode)
            .observe(start.elapsed().as_secs_f64());
        pass
    }

    /// Runs passes every `every` (a full recount every `full_every`, and whenever this
    /// replica becomes leader) until `shutdown`. Waits for the caches first: usage
    /// written from half-synced caches would be wrong.
    pub async fn run(
        mut self,
        synced: Arc<Synced>,
        every: Duration,
        full_every: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        tokio::select! {
            _ = synced.wait() => {}
            _ = shutdown.changed() => return,
        }
        let mut last_full: Option<Instant> = None;
        let mut was_leader = false;
        let mut lease_open = true;
        loop {
            let is_leader = *self.leader.borrow();
            let full =
                last_full.is_none_or(|t| t.elapsed() >= full_every) || (is_leader && !was_leader);
            let p = self.pass(full).await;
            // Leader only once the Lease itself confirmed it: a pass the Lease refused took
            // the changed queues without writing them, so the next confirmed pass is full.
            was_leader = p.leader;
            if full {
                last_full = Some(Instant::now());
            }
            if p.usage_written
                + p.events
                + p.ledger_entries_pruned
                + p.stamped
                + p.released
                + p.errors
                > 0
            {
                tracing::info!(?p, "reconciled");
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                changed = self.leader.changed(), if lease_open => {
                    if changed.is_err() {
                        lease_open = false;
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_usage_writes_back_off_from_a_second_to_a_minute() {
        let secs: Vec<u64> = (1..=8).map(|n| write_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(write_backoff(u32::MAX), Duration::from_secs(60));
    }
}
