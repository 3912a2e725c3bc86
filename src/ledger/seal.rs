//! A seal on a queue's charges in a ledger: written by the Queue hook before a change is
//! stored that a replica must see before it charges the queue there again (R2 for
//! Queues, docs/consistency.md). A change of the queue tree seals the queues it moves in
//! the ledger they leave, so that a replica whose Queue watch has not shown the change
//! cannot keep charging the old ledger while others charge the new one; a change that
//! lowers a limit (a quota or borrow cut, a new enforcement) seals the queue and its
//! subtree in their own ledger, so that such a replica cannot go on deciding from the
//! limit the change replaced.

use serde::{Deserialize, Serialize};

/// Why a queue's charges in this ledger wait: the Queue whose change moves them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// The Queue the change was made to (the moved queue, or `root`).
    pub by: String,
    /// `metadata.resourceVersion` of that Queue before the change: a replica whose
    /// cache shows a later version has seen the change (or what came after it).
    pub version: u64,
    /// When the seal was written (RFC 3339, the sealer's clock; for people reading the
    /// ledger: a reader lifts a seal by its own clock, from when it first saw it).
    pub at: jiff::Timestamp,
    /// What the change does to the sealed queue's charges.
    #[serde(default, skip_serializing_if = "SealCause::is_move")]
    pub cause: SealCause,
}

/// Why a queue is sealed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SealCause {
    /// Its charges move to another ledger (a change of the queue tree).
    #[default]
    Move,
    /// A limit its charges are decided against was lowered (quota, borrow, enforcement).
    Limits,
}

impl SealCause {
    pub fn is_move(&self) -> bool {
        *self == Self::Move
    }
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
