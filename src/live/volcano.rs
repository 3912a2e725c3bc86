//! Volcano's resources, as the API server serves them.

use kube::api::{ApiResource, GroupVersionKind};

/// Volcano's Queue resource (cluster-scoped).
pub fn queue_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "Queue");
    ApiResource::from_gvk_with_plural(&gvk, "queues")
}

/// Volcano's PodGroup resource (namespaced).
pub fn podgroup_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup");
    ApiResource::from_gvk_with_plural(&gvk, "podgroups")
}

/// Volcano's Job resource (namespaced).
pub fn job_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job");
    ApiResource::from_gvk_with_plural(&gvk, "jobs")
}
