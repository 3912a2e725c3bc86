//! The ledger's metrics: writes by outcome, their duration, batch sizes, pruning.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::charge::{CommitMetrics, WriteOutcome};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// What the group-commit writer and the ledger pruning did.
pub struct LedgerMetrics {
    pub writes: Family<ResultLabel, Counter>,
    pub pruned: Counter,
    /// Requests per group commit (one ledger write each).
    pub batch: Histogram,
    pub write_seconds: Histogram,
    /// Ledgers read again after a failed write, by where from.
    pub rereads: Family<SourceLabel, Counter>,
    /// Charges admitted under this replica's hold, with no write of their own.
    pub held: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

impl LedgerMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "card_quota_ledger_writes",
            "Ledger writes and refused charges by outcome (written, conflict, error; full, timeout, behind count requests)",
            writes.clone(),
        );
        let pruned = Counter::default();
        registry.register(
            "card_quota_ledger_pruned_entries",
            "Ledger entries dropped once caches show them, or expired",
            pruned.clone(),
        );
        let batch = Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]);
        let write_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 12));
        registry.register(
            "card_quota_ledger_write_duration_seconds",
            "Time of one ledger write (compare-and-swap) through the API server",
            write_seconds.clone(),
        );
        registry.register(
            "card_quota_ledger_batch_requests",
            "Charging requests decided together and recorded with one ledger write",
            batch.clone(),
        );
        let rereads = Family::<SourceLabel, Counter>::default();
        registry.register(
            "card_quota_ledger_rereads",
            "Ledgers read again after a write lost its compare-and-swap or failed (source: watch, when the cache already held a newer one; api otherwise)",
            rereads.clone(),
        );
        let held = Counter::default();
        registry.register(
            "card_quota_ledger_held_charges",
            "Charges admitted under this replica's hold of headroom, with no ledger write of their own",
            held.clone(),
        );
        Self {
            writes,
            pruned,
            batch,
            write_seconds,
            rereads,
            held,
        }
    }
}

impl CommitMetrics for LedgerMetrics {
    fn write(&self, outcome: WriteOutcome) {
        self.writes
            .get_or_create(&ResultLabel {
                result: outcome.label().to_string(),
            })
            .inc();
    }
    fn batch(&self, size: usize) {
        self.batch.observe(size as f64);
    }
    fn pruned(&self, n: usize) {
        self.pruned.inc_by(n as u64);
    }
    fn write_time(&self, took: std::time::Duration) {
        self.write_seconds.observe(took.as_secs_f64());
    }
    fn held(&self) {
        self.held.inc();
    }
    fn reread(&self, from_watch: bool) {
        let source = if from_watch { "watch" } else { "api" };
        self.rereads.get_or_create(&SourceLabel { source }).inc();
    }
}
