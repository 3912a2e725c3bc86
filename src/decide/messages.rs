//! The texts users read in kubectl and Events: short, complete, every number.

use crate::cards::{Alternatives, Cards, QueueName};
use crate::cluster::QueueRecord;
use crate::ledger::QueueUsage;
use crate::snapshot::Snapshot;

use super::Decision;

/// Why a request was refused: the `reason` of the AdmissionReview status and of the
/// Event that tells the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Over quota.
    InsufficientCardQuota,
    /// A malformed annotation.
    InvalidCardQuota,
    /// The queue is not open.
    QueueClosed,
    /// Could not be decided from the cache or recorded in time.
    TryAgain,
    /// A pod whose card demand cannot be charged.
    InvalidCardDemand,
    /// A binding to a model the pod does not accept.
    CardModelNotAccepted,
    /// A change to an annotation only card-quota (or the pod's creator) writes.
    CardAnnotationImmutable,
    /// The request itself is not a valid object of its kind.
    BadRequest,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InsufficientCardQuota => "InsufficientCardQuota",
            Self::InvalidCardQuota => "InvalidCardQuota",
            Self::QueueClosed => "QueueClosed",
            Self::TryAgain => "TryAgain",
            Self::InvalidCardDemand => "InvalidCardDemand",
            Self::CardModelNotAccepted => "CardModelNotAccepted",
            Self::CardAnnotationImmutable => "CardAnnotationImmutable",
            Self::BadRequest => "BadRequest",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// Short names the decisions use.
pub const INSUFFICIENT: Reason = Reason::InsufficientCardQuota;
pub const INVALID: Reason = Reason::InvalidCardQuota;
pub const CLOSED: Reason = Reason::QueueClosed;
pub const RETRY: Reason = Reason::TryAgain;
pub const INVALID_DEMAND: Reason = Reason::InvalidCardDemand;
pub const NOT_ACCEPTED: Reason = Reason::CardModelNotAccepted;
pub const IMMUTABLE: Reason = Reason::CardAnnotationImmutable;
pub const BAD_REQUEST: Reason = Reason::BadRequest;

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
