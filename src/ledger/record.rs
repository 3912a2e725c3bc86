//! A queue's ledger as stored: one ConfigMap per queue in card-quota's namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cards::QueueName;
use crate::cluster::records::RecordError;

use super::{Ledger, LedgerError};

/// A queue's ledger as stored in card-quota's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerRecord {
    pub queue: QueueName,
    /// `metadata.resourceVersion` of the stored object, the precondition of the next
    /// write; `None` when no object exists yet (the next write creates it).
    pub resource_version: Option<String>,
    /// Charges recorded by the webhook that caches may not show yet.
    pub ledger: Ledger,
    /// Why the stored ledger could not be read. It then counts as empty (logged when it
    /// arrives) and the next write replaces it.
    pub problem: Option<LedgerError>,
}

impl LedgerRecord {
    /// The ledger of a queue that has none stored yet.
    pub fn empty(queue: QueueName) -> Self {
        Self {
            queue,
            resource_version: None,
            ledger: Ledger::default(),
            problem: None,
        }
    }

    /// True when `self` is a newer version of the same object than `other`.
    pub fn is_newer_than(&self, other: &LedgerRecord) -> bool {
        match (&self.resource_version, &other.resource_version) {
            (Some(a), Some(b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) => a > b,
                _ => a != b,
            },
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// Labels every ledger object carries.
pub const LEDGER_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "card-quota"),
    ("app.kubernetes.io/component", "ledger"),
];

/// True for a ConfigMap that holds a ledger.
pub fn is_ledger(meta: &ObjectMeta) -> bool {
    let labels = meta.labels.clone().unwrap_or_default();
    LEDGER_LABELS
        .iter()
        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
}

/// The ConfigMap data key that holds a ledger, and the one that names its queue.
pub const LEDGER_KEY: &str = "ledger";
pub const LEDGER_QUEUE_KEY: &str = "queue";

/// Builds a ledger record from its ConfigMap.
pub fn ledger_record(
    cm: &k8s_openapi::api::core::v1::ConfigMap,
) -> Result<LedgerRecord, RecordError> {
    let data = cm.data.clone().unwrap_or_default();
    let queue = data
        .get(LEDGER_QUEUE_KEY)
        .filter(|q| !q.is_empty())
        .map(|q| QueueName::new(q.clone()))
        .ok_or(RecordError::NoName("ledger (data.queue)"))?;
    let (ledger, problem) = match data.get(LEDGER_KEY).map(|raw| Ledger::parse(&queue, raw)) {
        None => (Ledger::default(), None),
        Some(Ok(l)) => (l, None),
        Some(Err(e)) => (Ledger::default(), Some(e)),
    };
    Ok(LedgerRecord {
        queue,
        resource_version: cm.metadata.resource_version.clone(),
        ledger,
        problem,
    })
}
