//! Admission metrics (OpenMetrics text on `/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
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
}

impl Default for Metrics {
    fn default() -> Self {
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
            "Compare-and-swap writes of Queue ledgers by outcome (written, conflict, error, full, timeout)",
            ledger_writes.clone(),
        );
        Self {
            registry,
            ledger_writes,
            requests,
            latency,
            budget_exhausted,
        }
    }
}

impl Metrics {
    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }
}
