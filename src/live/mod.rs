//! The imperative shell against a real API server: informer caches feeding the
//! snapshot, the ledgers' compare-and-swap writes, and leadership checks.

pub mod access;
pub mod caches;
pub mod charge;
pub mod dra;
pub mod freshness;
pub mod leadership;
pub mod ledgers;
pub mod metrics;
pub mod peers;
pub mod seals;
pub mod volcano;

pub use charge::Committer;
pub use ledgers::{LedgerApi, WriteError};

/// The field manager of every write card-quota makes (server-side apply).
pub const FIELD_MANAGER: &str = "card-quota";
