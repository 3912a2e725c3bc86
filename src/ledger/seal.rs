//! A seal on a queue's charges in a ledger the queue is leaving: written by the Queue
//! hook before a change of the queue tree is stored, so that a replica whose Queue
//! watch has not shown the change yet cannot keep charging the old ledger while others
//! charge the new one (docs/consistency.md).

use serde::{Deserialize, Serialize};

/// Why a queue's charges in this ledger wait: the Queue whose change moves them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// The Queue the change was made to (the moved queue, or `root`).
    pub by: String,
    /// `metadata.resourceVersion` of that Queue before the change: a replica whose
    /// cache shows a later version has seen the change (or what came after it).
    pub version: u64,
    /// When the seal was written (RFC 3339): a change that never landed (refused by
    /// another webhook, or timed out) is known by a read of the Queue this long after.
    pub at: jiff::Timestamp,
}

/// How long after a seal a change it was written for can no longer land: the API
/// server's default request timeout (a request's admission comes before its storage).
pub const SEAL_LIFT_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The other half of a move, in the ledger a queue's charges move to: they were charged
/// in `from` until its seal, written at `version` of that ledger. A replica charges the
/// queue here only once it has read `from` at that version or later (it may never have
/// seen the tree the charges there were made under).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbound {
    pub from: String,
    pub version: u64,
}
