//! Cards allocated through Dynamic Resource Allocation (`resource.k8s.io/v1`): a device's
//! model from the attributes its driver publishes, and a claim's card demand from its
//! requests, DeviceClasses and CEL selectors. Pure: the objects come in as JSON.

pub mod claims;
pub mod cost;
pub mod devices;
pub mod matches;
pub mod pin;
pub mod pods;
pub mod selectors;
pub mod settings;

pub use claims::{
    allocated_models, allocation, claim_demand, claim_spec, device_class, reserved_for, Allocated,
    ClaimRecord, ClaimSpec, DeviceClass, RequestDemand, Reservation,
};
pub use devices::{slice_devices, Device, DeviceId};
pub use pods::{
    claim_resource, is_claim_resource, pod_claims, ClaimCards, ClaimSource, DraObjects, DraView,
    PodClaim, Prepared,
};
pub use settings::{DraSettings, DriverModel};

/// Why a DRA object's cards cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraError {
    #[error("ResourceSlice {slice}: {field}: expected {expected}")]
    Slice {
        slice: String,
        field: String,
        expected: String,
    },
    #[error("device {device} has no attribute {attribute} to name its card model")]
    DeviceModel { device: String, attribute: String },
    #[error("device {device}: its model name is not valid: {reason}")]
    ModelName { device: String, reason: String },
    #[error("{object}: {field}: expected {expected}")]
    Claim {
        object: String,
        field: String,
        expected: String,
    },
    #[error("{origin}: selector {expression:?} does not compile: {reason}")]
    Selector {
        origin: String,
        expression: String,
        reason: String,
    },
    #[error("{origin}: selector {expression:?} costs about {cost} per device, past card-quota's limit of {limit} (card-quota reads every selector against every card device of the cluster; Kubernetes' own limit is 1,000,000 per device): simplify it")]
    SelectorCost {
        origin: String,
        expression: String,
        cost: u64,
        limit: u64,
    },
    #[error("{object} request {request} asks for every device of DeviceClass {class} (allocationMode: All): card-quota cannot bound its cards; ask for a count")]
    AllDevices {
        object: String,
        request: String,
        class: String,
    },
    #[error(
        "{object} request {request}: no published card device matches it (DeviceClass {classes})"
    )]
    NoDevice {
        object: String,
        request: String,
        classes: String,
    },
    #[error("{object}: status.allocation.devices.results[{index}] names device {device}, which no ResourceSlice publishes")]
    UnknownDevice {
        object: String,
        index: usize,
        device: String,
    },
    #[error("pod {pod}: its claim {claim} uses {object}, which card-quota does not hold (yet): it cannot tell which cards it asks for; create it first, or try again")]
    Missing {
        pod: String,
        claim: String,
        object: String,
    },
    #[error("pod {pod}: its claims' card requests share no model ({models}); a pod runs on one card model")]
    NoCommonModel { pod: String, models: String },
    #[error("DRA setting {value:?}: expected {expected}")]
    Setting { value: String, expected: String },
}
