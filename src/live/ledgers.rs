//! Where ledgers live: one ConfigMap per queue in card-quota's own namespace, written
//! with a resourceVersion precondition. Keeping them off the Queue means a charge
//! never wakes Volcano's Queue watchers and never races Volcano's status writes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::Client;

use crate::cards::QueueName;
use crate::ledger::record::{ledger_record, LEDGER_KEY, LEDGER_LABELS, LEDGER_QUEUE_KEY};
use crate::ledger::LedgerRecord;

/// The label selector of ledger objects (the cache watches exactly these).
pub fn selector() -> String {
    LEDGER_LABELS
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The ConfigMap name of a queue's ledger: readable when the queue's name allows,
/// otherwise a digest (Queue names need not be DNS subdomains).
pub fn object_name(queue: &QueueName) -> String {
    const PREFIX: &str = "card-quota-ledger.";
    let q = queue.as_str();
    let dns = !q.is_empty()
        && q.len() + PREFIX.len() <= 253
        && q.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && q.split('.')
            .all(|part| !part.is_empty() && !part.starts_with('-') && !part.ends_with('-'));
    if dns {
        return format!("{PREFIX}{q}");
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, q.as_bytes());
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{PREFIX}sha256-{hex}")
}

/// Why a ledger write did not land.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Someone changed (or created, or deleted) the ledger since we read it: read it
    /// again and decide again.
    #[error("the ledger of queue {0} changed since it was read (resourceVersion conflict)")]
    Conflict(QueueName),
    #[error("ledger of queue {queue}: {source}")]
    Api {
        queue: QueueName,
        #[source]
        source: kube::Error,
    },
    #[error("ledger of queue {queue}: the API server returned an unreadable ConfigMap: {message}")]
    Decode { queue: QueueName, message: String },
    #[error(
        "ledger of queue {queue}: namespace {namespace} (card-quota's --namespace) does not exist"
    )]
    NoNamespace { queue: QueueName, namespace: String },
}

/// Ledgers through the API server.
#[derive(Clone)]
pub struct LedgerApi {
    api: Api<ConfigMap>,
    namespace: String,
}

impl LedgerApi {
    /// Ledgers in `namespace` (card-quota's own).
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    fn record(queue: &QueueName, cm: &ConfigMap) -> Result<LedgerRecord, WriteError> {
        let rec = ledger_record(cm).map_err(|e| WriteError::Decode {
            queue: queue.clone(),
            message: e.to_string(),
        })?;
        if &rec.queue != queue {
            return Err(WriteError::Decode {
                queue: queue.clone(),
                message: format!("it holds the ledger of queue {}", rec.queue),
            });
        }
        Ok(rec)
    }

    fn classify(queue: &QueueName, e: kube::Error) -> WriteError {
        match &e {
            // 409: changed or already created; 404: deleted since we read it.
            kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() || s.is_not_found() => {
                WriteError::Conflict(queue.clone())
            }
            _ => WriteError::Api {
                queue: queue.clone(),
                source: e,
            },
        }
    }

    /// Every stored ledger, from a consistent list (not from a cache). A ConfigMap that
    /// is no ledger is logged and left out, as the watch leaves it out.
    pub async fn list(&self) -> Result<Vec<LedgerRecord>, kube::Error> {
        let lp = kube::api::ListParams::default().labels(&selector());
        let list = self.api.list(&lp).await?;
        Ok(list
            .items
            .iter()
            .filter_map(|cm| match ledger_record(cm) {
                Ok(rec) => Some(rec),
                Err(e) => {
                    tracing::warn!(
                        "ConfigMap {}/{} is no ledger: {e}",
                        self.namespace,
                        cm.metadata.name.as_deref().unwrap_or_default()
                    );
                    None
                }
            })
            .collect())
    }

    /// A fresh read (not from a cache); an absent object is an empty ledger.
    pub async fn get(&self, queue: &QueueName) -> Result<LedgerRecord, WriteError> {
        match self.api.get_opt(&object_name(queue)).await {
            Ok(Some(cm)) => Self::record(queue, &cm),
            Ok(None) => Ok(LedgerRecord::empty(queue.clone())),
            Err(e) => Err(WriteError::Api {
                queue: queue.clone(),
                source: e,
            }),
        }
    }

    /// Stores `text` as the queue's ledger if the stored object is still at
    /// `resource_version` (`None`: if there is none yet). Creating and replacing are
    /// both compare-and-swap: the API server answers 409 when someone was first.
    pub async fn write(
        &self,
        queue: &QueueName,
        resource_version: Option<&str>,
        text: &str,
    ) -> Result<LedgerRecord, WriteError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(object_name(queue)),
                labels: Some(
                    LEDGER_LABELS
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                resource_version: resource_version.map(str::to_string),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (LEDGER_QUEUE_KEY.to_string(), queue.to_string()),
                (LEDGER_KEY.to_string(), text.to_string()),
            ])),
            ..Default::default()
        };
        let pp = PostParams {
            field_manager: Some(super::FIELD_MANAGER.into()),
            ..Default::default()
        };
        let out = match resource_version {
            // Creating answers 404 only when the namespace itself is missing.
            None => self.api.create(&pp, &cm).await.map_err(|e| match &e {
                kube::Error::Api(s) if s.is_not_found() => WriteError::NoNamespace {
                    queue: queue.clone(),
                    namespace: self.namespace.clone(),
                },
                _ => Self::classify(queue, e),
            }),
            Some(_) => self
                .api
                .replace(&object_name(queue), &pp, &cm)
                .await
                .map_err(|e| Self::classify(queue, e)),
        }?;
        Self::record(queue, &out)
    }

    /// Deletes the ledger of a deleted queue if it is still at `resource_version`.
    pub async fn delete(
        &self,
        queue: &QueueName,
        resource_version: &str,
    ) -> Result<(), WriteError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(resource_version.to_string()),
                uid: None,
            }),
            ..Default::default()
        };
        match self.api.delete(&object_name(queue), &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(Self::classify(queue, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_objects_are_named_after_their_queue_or_its_digest() {
        assert_eq!(
            object_name(&QueueName::new("team-a")),
            "card-quota-ledger.team-a"
        );
        let odd = object_name(&QueueName::new("Team_A"));
        assert!(odd.starts_with("card-quota-ledger.sha256-"), "{odd}");
        assert_eq!(odd.len(), "card-quota-ledger.sha256-".len() + 32);
        assert_ne!(odd, object_name(&QueueName::new("Team_B")));
        let long = "a".repeat(250);
        assert!(object_name(&QueueName::new(long)).len() <= 253);
    }
}
