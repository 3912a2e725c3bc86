//! The process's metrics (OpenMetrics text on `/metrics`): admission counters and
//! latency, ledger writes, and the reconciler's per-queue gauges under the names of
//! Volcano's capacity-card plugin so existing dashboards work.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use prometheus_client::metrics::gauge::Gauge;

use crate::ledger::{Row, UsageKey};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub kind: String,
    pub operation: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueCardLabels {
    pub queue_name: String,
    pub card_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// The webhook's metrics and their registry.
pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<AdmissionLabels, Counter>,
    pub latency: Family<KindLabel, Histogram>,
    pub budget_exhausted: Counter,
    pub ledger_writes: Family<ResultLabel, Counter>,
    pub capacity: Family<QueueCardLabels, Gauge>,
    pub allocated: Family<QueueCardLabels, Gauge>,
    pub request: Family<QueueCardLabels, Gauge>,
    pub pending: Family<QueueCardLabels, Gauge>,
    pub reserved: Family<QueueCardLabels, Gauge>,
    pub reconciles: Family<ModeLabel, Counter>,
    pub reconcile_duration: Family<ModeLabel, Histogram>,
    pub usage_writes: Family<ResultLabel, Counter>,
    pub ledger_pruned: Counter,
    /// Connections closed at once because the server had its maximum open.
    pub connections_refused: Counter,
    /// TLS handshakes that failed (no or wrong client certificate, or not TLS).
    pub handshakes_refused: Counter,
    /// Queues whose incremental usage disagreed with a full recount (then rebuilt).
    pub tally_mismatches: Counter,
    /// Requests per group commit (one ledger write each).
    pub ledger_batch: Histogram,
    pub ledger_write_seconds: Histogram,
    /// Card names published per queue, so gone queues and models are removed.
    published: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Counter::default())
    }
}

impl Metrics {
    /// The metrics, with `events_dropped` counted by the Event sink.
    pub fn new(events_dropped: Counter) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<AdmissionLabels, Counter>::default();
        let latency = Family::<KindLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0,
            ])
        });
        let budget_exhausted = Counter::default();
        registry.register(
            "card_quota_admission_requests",
            "Admission requests by kind, operation and result",
            requests.clone(),
        );
        registry.register(
            "card_quota_admission_duration_seconds",
            "Time to decide one admission request",
            latency.clone(),
        );
        registry.register(
            "card_quota_feasibility_budget_exhausted",
            "Requests refused because the exact feasibility search ran out of budget",
            budget_exhausted.clone(),
        );
        let ledger_writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "card_quota_ledger_writes",
            "Ledger writes and refused charges by outcome (written, conflict, error; full, timeout, behind count requests)",
            ledger_writes.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<QueueCardLabels, Gauge>::default();
            registry.register(name, help, f.clone());
            f
        };
        let capacity = gauge(
            &mut registry,
            "volcano_queue_card_capacity",
            "Card quota of a queue per model (volcano.sh/card.quota)",
        );
        let allocated = gauge(
            &mut registry,
            "volcano_queue_card_allocated",
            "Cards of bound, non-terminal pods charged to a queue per model",
        );
        let request = gauge(
            &mut registry,
            "volcano_queue_card_request",
            "Cards a queue uses or waits for per model: allocated + pending + reserved",
        );
        let pending = gauge(
            &mut registry,
            "card_quota_queue_card_pending",
            "Cards of admitted, unbound pods per model or alternatives (A|B)",
        );
        let reserved = gauge(
            &mut registry,
            "card_quota_queue_card_reserved",
            "Cards reserved by PodGroup card.request not yet covered by their pods",
        );
        let reconciles = Family::<ModeLabel, Counter>::default();
        registry.register(
            "card_quota_reconciles",
            "Reconciler passes by mode (incremental or full)",
            reconciles.clone(),
        );
        let reconcile_duration = Family::<ModeLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0])
        });
        registry.register(
            "card_quota_reconcile_duration_seconds",
            "Time of one reconciler pass, API writes included",
            reconcile_duration.clone(),
        );
        let usage_writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "card_quota_usage_writes",
            "Server-side applies of volcano.sh/card.usage by outcome",
            usage_writes.clone(),
        );
        let ledger_pruned = Counter::default();
        registry.register(
            "card_quota_ledger_pruned_entries",
            "Ledger entries dropped once caches show them, or expired",
            ledger_pruned.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "card_quota_connections_refused",
            "Connections closed on arrival because the server had its maximum open",
            connections_refused.clone(),
        );
        let handshakes_refused = Counter::default();
        registry.register(
            "card_quota_tls_handshakes_failed",
            "TLS handshakes that failed: no or unaccepted client certificate, or not TLS",
            handshakes_refused.clone(),
        );
        registry.register(
            "card_quota_events_dropped",
            "Admission Events not published because too many were in flight",
            events_dropped,
        );
        let tally_mismatches = Counter::default();
        registry.register(
            "card_quota_usage_recount_mismatches",
            "Queues whose incremental usage differed from the periodic full recount (the tally is then rebuilt)",
            tally_mismatches.clone(),
        );
        let ledger_batch =
            Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]);
        let ledger_write_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 12));
        registry.register(
            "card_quota_ledger_write_duration_seconds",
            "Time of one ledger write (compare-and-swap) through the API server",
            ledger_write_seconds.clone(),
        );
        registry.register(
            "card_quota_ledger_batch_requests",
            "Charging requests decided together and recorded with one ledger write",
            ledger_batch.clone(),
        );
        Self {
            registry,
            ledger_writes,
            capacity,
            allocated,
            request,
            pending,
            reserved,
            reconciles,
            reconcile_duration,
            usage_writes,
            ledger_pruned,
            tally_mismatches,
            connections_refused,
            handshakes_refused,
            ledger_batch,
            ledger_write_seconds,
            published: Mutex::new(HashMap::new()),
            requests,
            latency,
            budget_exhausted,
        }
    }
}

impl Metrics {
    /// Sets the gauges of `queue` to `rows`; `None` (a deleted queue) removes them.
    /// Models a queue no longer has are removed too.
    pub fn publish_queue(&self, queue: &str, rows: Option<&BTreeMap<UsageKey, Row>>) {
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        let labels = |card: &str| QueueCardLabels {
            queue_name: queue.to_string(),
            card_name: card.to_string(),
        };
        let now: BTreeSet<String> = rows
            .map(|r| r.keys().map(UsageKey::to_string).collect())
            .unwrap_or_default();
        for gone in published
            .get(queue)
            .map(|s| s.difference(&now).cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            let l = labels(&gone);
            for f in [
                &self.capacity,
                &self.allocated,
                &self.request,
                &self.pending,
                &self.reserved,
            ] {
                f.remove(&l);
            }
        }
        for (card, r) in rows.into_iter().flatten() {
            let l = labels(&card.to_string());
            let gauge = |v: crate::cards::Cards| v.as_i64_saturating();
            if card.is_model() {
                self.capacity.get_or_create(&l).set(gauge(r.quota));
                self.allocated.get_or_create(&l).set(gauge(r.allocated));
                self.request.get_or_create(&l).set(gauge(r.in_use()));
            }
            self.pending.get_or_create(&l).set(gauge(r.pending));
            self.reserved.get_or_create(&l).set(gauge(r.reserved));
        }
        if now.is_empty() {
            published.remove(queue);
        } else {
            published.insert(queue.to_string(), now);
        }
    }

    /// Queues whose gauges are published.
    pub fn published_queues(&self) -> Vec<String> {
        let published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        published.keys().cloned().collect()
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }
}

impl crate::live::charge::CommitMetrics for Metrics {
    fn write(&self, outcome: crate::live::charge::WriteOutcome) {
        self.ledger_writes
            .get_or_create(&ResultLabel {
                result: outcome.label().to_string(),
            })
            .inc();
    }
    fn batch(&self, size: usize) {
        self.ledger_batch.observe(size as f64);
    }
    fn pruned(&self, n: usize) {
        self.ledger_pruned.inc_by(n as u64);
    }
    fn write_time(&self, took: std::time::Duration) {
        self.ledger_write_seconds.observe(took.as_secs_f64());
    }
}
