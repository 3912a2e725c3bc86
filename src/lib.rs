//! card-quota: hard per-card-model quotas for Volcano queues.
//!
//! A functional core with no I/O, each module using only those before it: `cards` →
//! `cluster` → `ledger` → `snapshot` → `decide` → `admission` → `routing`; then the shells over it:
//! `live` (the API server) → `controller` → `webhook` → `cli`.
//! `scripts/layers.sh` (run by CI) keeps that order.

pub mod admission;
pub mod cards;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod decide;
pub mod ledger;
pub mod live;
pub mod routing;
pub mod snapshot;
pub mod webhook;
