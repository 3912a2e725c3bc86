//! card-quota: hard per-card-model quotas for Volcano queues.
//!
//! A functional core (`cards`, `ledger`, `cluster`, `decide`) with no I/O, and thin
//! shells over it (`replay`, `demo`, the webhook server and the reconciler).

pub mod admission;
pub mod cards;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod decide;
pub mod ledger;
pub mod live;
pub mod webhook;
