//! The DRA objects card-quota reads (`resource.k8s.io/v1`), on clusters that serve them.

use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;

/// The API version card-quota reads DRA objects in (Kubernetes 1.34+).
pub const API_VERSION: &str = "resource.k8s.io/v1";

/// ResourceSlices (cluster-scoped): the devices drivers publish.
pub fn resourceslice_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    ApiResource::from_gvk_with_plural(&gvk, "resourceslices")
}

/// Whether the API server serves ResourceSlices in [`API_VERSION`]: a cluster older
/// than 1.34 (or with DRA turned off) has none to read, and watching them would only
/// fail again and again.
pub async fn serves_slices(client: &Client) -> bool {
    match client.list_api_group_resources(API_VERSION).await {
        Ok(list) => list.resources.iter().any(|r| r.name == "resourceslices"),
        Err(e) => {
            tracing::info!("{API_VERSION} is not served ({e}): DRA devices are not read");
            false
        }
    }
}
