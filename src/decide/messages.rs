//! The texts users read in kubectl and Events: short, complete, every number.

use crate::cards::{Alternatives, Cards, QueueName};
use crate::cluster::QueueRecord;
use crate::ledger::QueueUsage;
use crate::snapshot::Snapshot;

use super::Decision;

/// Event / denial reason for a request over quota.
pub const INSUFFICIENT: &str = "InsufficientCardQuota";
/// Reason for a malformed annotation.
pub const INVALID: &str = "InvalidCardQuota";
/// Reason for a queue that is not open.
pub const CLOSED: &str = "QueueClosed";
/// Reason for a request that could not be decided from the cache.
pub const RETRY: &str = "TryAgain";
/// Reason for a pod whose card demand cannot be charged.
pub const INVALID_DEMAND: &str = "InvalidCardDemand";
/// Reason for a binding to a model the pod does not accept.
pub const NOT_ACCEPTED: &str = "CardModelNotAccepted";
/// Reason for a change to an annotation only card-quota (or the pod's creator) writes.
pub const IMMUTABLE: &str = "CardAnnotationImmutable";

/// `queue <q> has insufficient <model> quota: requested <n>, in use <u> (allocated <a>,
/// pending <p>, reserved <r>), quota <c>` (docs/decisions.md), from the usage before the request.
pub fn insufficient(
    queue: &QueueName,
    key: &Alternatives,
    requested: Cards,
    before: &QueueUsage,
) -> String {
    let r = before.competing(key);
    format!(
        "queue {queue} has insufficient {key} quota: requested {requested}, in use {} (allocated {}, pending {}, reserved {}), quota {}",
        r.in_use(),
        r.allocated,
        r.pending,
        r.reserved,
        r.quota
    )
}

/// Refuses charging requests to a queue that is Closed/Closing or whose quota is broken.
pub fn gate(snap: &Snapshot, queue: &QueueName) -> Result<(), Decision> {
    let Some(q) = snap.queue(queue) else {
        return Ok(());
    };
    gate_record(q)
}

fn gate_record(q: &QueueRecord) -> Result<(), Decision> {
    if q.is_closed() {
        return Err(Decision::deny(
            CLOSED,
            format!(
                "queue {} is {} and admits no new card requests",
                q.name,
                q.state.as_deref().unwrap_or("Closed")
            ),
        ));
    }
    if let Some(Err(e)) = &q.quota {
        return Err(Decision::deny(
            INVALID,
            format!(
                "queue {} has quota 0 for every model until its annotation is fixed: {e}",
                q.name
            ),
        ));
    }
    Ok(())
}
