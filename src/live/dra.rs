//! The DRA objects card-quota reads (`resource.k8s.io/v1`), on clusters that serve them.

use std::time::Duration;

use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;

/// The API version card-quota reads DRA objects in (Kubernetes 1.34+).
pub const API_VERSION: &str = "resource.k8s.io/v1";

/// The `resource.k8s.io/v1` kinds card-quota reads, with their plurals: the devices
/// drivers publish (ResourceSlice), the classes that select them (DeviceClass), and
/// what pods ask for (ResourceClaimTemplate, ResourceClaim).
pub const KINDS: [(&str, &str); 4] = [
    ("ResourceSlice", "resourceslices"),
    ("DeviceClass", "deviceclasses"),
    ("ResourceClaimTemplate", "resourceclaimtemplates"),
    ("ResourceClaim", "resourceclaims"),
];

/// One of [`KINDS`] as an API resource.
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

/// How long one discovery call may take, and how long to wait before the next after a
/// failure that does not say the API is absent.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
const DISCOVERY_RETRY: Duration = Duration::from_secs(10);

/// Waits until the API server says whether it serves ResourceSlices in
/// [`API_VERSION`]: a cluster older than 1.34 (or with DRA turned off) has none to read,
/// and watching them would only fail again and again. Other failures are retried.
pub async fn serves_slices(client: &Client) -> bool {
    loop {
        let asked = client.list_api_group_resources(API_VERSION);
        match tokio::time::timeout(DISCOVERY_TIMEOUT, asked).await {
            Ok(Ok(list)) => return list.resources.iter().any(|r| r.name == "resourceslices"),
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                tracing::info!("{API_VERSION} is not served: DRA devices are not read");
                return false;
            }
            Ok(Err(e)) => tracing::warn!("discovery of {API_VERSION} failed, retrying: {e}"),
            Err(_) => tracing::warn!("discovery of {API_VERSION} did not answer, retrying"),
        }
        tokio::time::sleep(DISCOVERY_RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response, StatusCode};
    use kube::client::Body;

    async fn answer(code: StatusCode, body: serde_json::Value) -> bool {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "default");
        let api = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a discovery call");
            assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1");
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(bytes))
                    .expect("a response"),
            );
        });
        let served = serves_slices(&client).await;
        api.await.expect("the scripted API server");
        served
    }

    #[tokio::test]
    async fn slices_are_read_only_where_the_api_server_serves_them() {
        let list = serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "resource.k8s.io/v1", "resources": [
                {"name": "resourceslices", "singularName": "resourceslice", "namespaced": false,
                 "kind": "ResourceSlice", "verbs": ["list", "watch"]}]});
        assert!(answer(StatusCode::OK, list).await);
        let absent = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "the server could not find the requested resource", "reason": "NotFound", "code": 404});
        assert!(!answer(StatusCode::NOT_FOUND, absent).await);
    }
}
