//! Reading Volcano Queues and writing their ledger with a resourceVersion precondition.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use crate::cards::annotations::LEDGER;
use crate::cards::QueueName;
use crate::cluster::records::queue_record;
use crate::cluster::QueueRecord;

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

/// Why a ledger write did not land.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Someone changed the Queue since we read it: re-read and decide again.
    #[error("queue {0} changed since it was read (resourceVersion conflict)")]
    Conflict(QueueName),
    #[error("queue {0} does not exist")]
    NotFound(QueueName),
    #[error("queue {queue}: {source}")]
    Api {
        queue: QueueName,
        #[source]
        source: kube::Error,
    },
    #[error("queue {queue}: the API server returned an unreadable Queue: {message}")]
    Decode { queue: QueueName, message: String },
}

/// Queues through the API server.
#[derive(Clone)]
pub struct QueueApi {
    api: Api<DynamicObject>,
}

impl QueueApi {
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::all_with(client, &queue_resource()),
        }
    }

    fn record(queue: &QueueName, o: DynamicObject) -> Result<QueueRecord, WriteError> {
        let mut v = serde_json::to_value(&o).map_err(|e| WriteError::Decode {
            queue: queue.clone(),
            message: e.to_string(),
        })?;
        if let Some(m) = v.as_object_mut() {
            m.insert("kind".into(), json!("Queue"));
        }
        queue_record(&v).map_err(|e| WriteError::Decode {
            queue: queue.clone(),
            message: e.to_string(),
        })
    }

    fn classify(queue: &QueueName, e: kube::Error) -> WriteError {
        match &e {
            kube::Error::Api(s) if s.is_conflict() => WriteError::Conflict(queue.clone()),
            kube::Error::Api(s) if s.is_not_found() => WriteError::NotFound(queue.clone()),
            _ => WriteError::Api {
                queue: queue.clone(),
                source: e,
            },
        }
    }

    /// A fresh read (not from a cache).
    pub async fn get(&self, queue: &QueueName) -> Result<QueueRecord, WriteError> {
        let o = self
            .api
            .get(queue.as_str())
            .await
            .map_err(|e| Self::classify(queue, e))?;
        Self::record(queue, o)
    }

    /// Replaces the ledger annotation if the Queue is still at `resource_version`.
    /// A merge patch carrying `metadata.resourceVersion` is a compare-and-swap: the
    /// API server answers 409 Conflict when the Queue moved on.
    pub async fn write_ledger(
        &self,
        queue: &QueueName,
        resource_version: &str,
        ledger: &str,
    ) -> Result<QueueRecord, WriteError> {
        let patch = json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": { LEDGER: ledger },
            }
        });
        let o = self
            .api
            .patch(
                queue.as_str(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| Self::classify(queue, e))?;
        Self::record(queue, o)
    }
}
