//! Objects the integration tests build, in one place: real Kubernetes JSON as the API
//! server sends it, with only what a test names set.
#![allow(dead_code)] // each test binary uses a different part

use serde_json::{json, Value};

pub mod fake_api;
pub mod replica;

/// A Pod in namespace `ml` with one container `c`.
pub struct PodBuilder(Value);

/// `pod("a").queue("q").card("RTX-4090").gpus("1").build()`
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": {}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}))
}

impl PodBuilder {
    /// `scheduling.volcano.sh/queue-name`.
    pub fn queue(mut self, q: &str) -> Self {
        self.0["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = json!(q);
        self
    }
    /// `volcano.sh/card.name`.
    pub fn card(mut self, c: &str) -> Self {
        self.0["metadata"]["annotations"]["volcano.sh/card.name"] = json!(c);
        self
    }
    /// A limit of `n` on `resource` (requests default to limits).
    pub fn resource(mut self, resource: &str, n: &str) -> Self {
        self.0["spec"]["containers"][0]["resources"]["limits"][resource] = json!(n);
        self
    }
    /// A limit of `n` `nvidia.com/gpu`.
    pub fn gpus(self, n: &str) -> Self {
        self.resource("nvidia.com/gpu", n)
    }
    pub fn scheduler(mut self, s: &str) -> Self {
        self.0["spec"]["schedulerName"] = json!(s);
        self
    }
    /// As stored: a uid and a resourceVersion.
    pub fn stored(mut self, uid: &str, rv: &str) -> Self {
        self.0["metadata"]["uid"] = json!(uid);
        self.0["metadata"]["resourceVersion"] = json!(rv);
        self
    }
    pub fn build(self) -> Value {
        self.0
    }
}
