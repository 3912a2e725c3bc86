//! The process's metrics (OpenMetrics text on `/metrics`): the webhook's own
//! (admissions, latency, refused connections), with the ledger's
//! (`live::metrics`) and the reconciler's (`controller::metrics`) in one registry.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::controller::metrics::ReconcilerMetrics;
use crate::live::metrics::LedgerMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub kind: &'static str,
    pub operation: &'static str,
    pub result: &'static str,
}

/// What became of a charge sent to the replica that owns its queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardLabels {
    /// `answered` (the owner's answer was passed on), `failed` (decided here after
    /// trying), `skipped` (decided here: the owner failed a moment ago).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// What the HTTPS server answered.
pub struct WebhookMetrics {
    pub requests: Family<AdmissionLabels, Counter>,
    pub latency: Family<KindLabel, Histogram>,
    pub budget_exhausted: Counter,
    /// Connections closed at once because the server had its maximum open.
    pub connections_refused: Counter,
    /// TLS handshakes that failed (no or wrong client certificate, or not TLS).
    pub handshakes_refused: Counter,
    /// Charges sent to the replica that owns their queue.
    pub forwarded: Family<ForwardLabels, Counter>,
    /// When the served certificate expires (Unix seconds).
    pub certificate_expiry: Gauge,
}

impl WebhookMetrics {
    pub fn register(registry: &mut Registry) -> Self {
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
        let forwarded = Family::<ForwardLabels, Counter>::default();
        registry.register(
            "card_quota_forwarded_charges",
            "Charges sent to the replica that owns their queue, by result",
            forwarded.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "card_quota_serving_certificate_expiry_timestamp_seconds",
            "When the served certificate expires (Unix seconds; alert weeks before)",
            certificate_expiry.clone(),
        );
        Self {
            requests,
            latency,
            budget_exhausted,
            connections_refused,
            handshakes_refused,
            forwarded,
            certificate_expiry,
        }
    }
}

/// Every metric of the process, by group, and their registry.
pub struct Metrics {
    registry: Registry,
    pub webhook: WebhookMetrics,
    pub ledger: Arc<LedgerMetrics>,
    pub reconciler: Arc<ReconcilerMetrics>,
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
        let webhook = WebhookMetrics::register(&mut registry);
        let ledger = Arc::new(LedgerMetrics::register(&mut registry));
        let reconciler = Arc::new(ReconcilerMetrics::register(&mut registry, events_dropped));
        Self {
            registry,
            webhook,
            ledger,
            reconciler,
        }
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
