//! The cluster as plain data: records parsed from real objects. No I/O here.

pub mod placement;
pub mod pod_parts;
pub mod records;

pub use records::{
    NodeModels, PodGroupRecord, PodRecord, QueueRecord, Version, WorkloadKind, WorkloadRecord,
};
