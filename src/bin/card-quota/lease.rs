//! The reconciler's Lease: who this replica is, taking part in the election, and
//! handing the Lease over at shutdown.

use anyhow::Context;
use card_quota::live::leadership::LeaseCheck;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The task that renews (and at the end releases) the Lease.
pub type LeaseTask = JoinHandle<Result<LeaseManager, LeaseManagerError>>;

/// This replica's name in the Lease: the pod name in a cluster, else host and pid.
pub fn identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "card-quota".into());
        format!("{host}-{}", std::process::id())
    })
}

/// Serves offline from `snap`, or live from informer caches when `snap` is `None`.
/// Joins the election for Lease `namespace/name` as `me`: whether this replica leads,
/// the renewing task, and the check the reconciler runs before each write.
pub async fn acquire(
    client: kube::Client,
    namespace: &str,
    name: &str,
    me: &str,
) -> anyhow::Result<(watch::Receiver<bool>, LeaseTask, LeaseCheck)> {
    let manager = LeaseManagerBuilder::new(client.clone(), name)
        .with_namespace(namespace)
        .with_identity(me)
        .build()
        .await
        .with_context(|| format!("setting up Lease {namespace}/{name}"))?;
    let (leader, task) = manager.watch().await;
    Ok((leader, task, LeaseCheck::new(client, namespace, name, me)))
}

/// Waits (5 s at most) for the Lease to be released. The reconciler held the leader
/// receiver; with it gone the manager releases the Lease, so the other replica takes
/// over at once.
pub async fn release(task: LeaseTask) {
    match tokio::time::timeout(std::time::Duration::from_secs(5), task).await {
        Ok(Ok(Ok(_))) => tracing::info!("Lease released"),
        Ok(Ok(Err(e))) => tracing::warn!("releasing the Lease: {e}"),
        Ok(Err(e)) => tracing::warn!("Lease task: {e}"),
        Err(_) => tracing::warn!("Lease not released within 5s"),
    }
}
