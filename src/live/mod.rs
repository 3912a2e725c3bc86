//! The imperative shell against a real API server: informer caches feeding the
//! snapshot, and the ledgers' compare-and-swap writes.

pub mod caches;
pub mod charge;
pub mod ledgers;
pub mod volcano;

pub use charge::Committer;
pub use ledgers::{LedgerApi, WriteError};
