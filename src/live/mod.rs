//! The imperative shell against a real API server: informer caches feeding the
//! snapshot, and the Queue ledger's compare-and-swap writes.

pub mod caches;
pub mod charge;
pub mod queues;

pub use queues::{QueueApi, WriteError};
