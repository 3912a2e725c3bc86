//! The cluster as plain data: records parsed from real objects, and the snapshot that
//! indexes them. No I/O here; `serve` and `replay` fill it.

pub mod load;
pub mod records;
pub mod snapshot;

pub use records::{
    LedgerRecord, PodGroupRecord, PodRecord, QueueRecord, Version, WorkloadKind, WorkloadRecord,
};
pub use snapshot::{Dirty, NodeModels, Snapshot};
