//! The quota reconciler: keeps each Queue's `volcano.sh/card.usage` true, prunes the
//! ledger, raises Events and exports per-queue metrics. `plan` is the pure core;
//! `reconciler` and `events` talk to the API server.

pub mod events;
pub mod metrics;
pub mod plan;
pub mod reconciler;
pub mod releaser;
