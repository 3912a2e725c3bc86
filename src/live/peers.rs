//! The replicas that record charges, found through their peer Leases (see
//! [`crate::routing`]): this replica's own Lease, held while its caches are synced, and
//! a reflector over everyone's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;
use tokio::sync::watch;

use crate::cards::QueueName;
use crate::routing::{live_peers, route, Peer, ADDRESS_ANNOTATION, PEER_LABEL};

use super::caches::Synced;

/// How long a peer Lease lasts without renewal, and how often it is renewed.
const DURATION: Duration = Duration::from_secs(30);
const RENEW: Duration = Duration::from_secs(10);
/// Clock difference tolerated between replicas (a Lease's renewal is its holder's time).
const SKEW: jiff::SignedDuration = jiff::SignedDuration::from_secs(10);
const MANAGER: &str = "card-quota";

/// The name of the peer Lease of replica `me`: a DNS subdomain whatever `me` is.
pub fn lease_name(prefix: &str, me: &str) -> String {
    let cleaned: String = me
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let mut name = format!(
        "{prefix}-peer-{}",
        cleaned.trim_matches(|c| c == '-' || c == '.')
    );
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_string()
}

/// The other replicas, as their peer Leases say.
pub struct Peers {
    me: String,
    store: Store<Lease>,
}

impl Peers {
    /// Watches the peer Leases in `namespace`; the reflector runs until `stop`.
    pub fn watch(
        client: Client,
        namespace: &str,
        me: &str,
        stop: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let (store, writer) = reflector::store();
        let cfg = watcher::Config::default().labels(&format!("{PEER_LABEL}=true"));
        let stream = reflector::reflector(writer, watcher(api, cfg))
            .default_backoff()
            .applied_objects();
        tokio::spawn(async move {
            let mut stop = stop;
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::warn!("watching peer Leases: {e}"),
                        None => return,
                    },
                }
            }
        });
        Arc::new(Self {
            me: me.to_string(),
            store,
        })
    }

    /// The replica that records charges to `queue`, when it is another one.
    pub fn route(&self, queue: &QueueName) -> Option<Peer> {
        let leases = self.store.state();
        let peers = live_peers(
            leases.iter().map(AsRef::as_ref),
            jiff::Timestamp::now(),
            SKEW,
        );
        route(queue, &peers, &self.me).cloned()
    }
}

/// Holds this replica's peer Lease while its caches are synced, renewing it every
/// [`RENEW`], and deletes it at `stop` once synced (so that peers stop forwarding
/// before the listener closes).
pub async fn advertise(
    client: Client,
    namespace: String,
    name: String,
    me: String,
    addr: SocketAddr,
    synced: Arc<Synced>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let params = PatchParams::apply(MANAGER).force();
    let mut held = false;
    tokio::select! {
        _ = stop.wait_for(|s| *s) => return,
        _ = synced.wait() => {}
    }
    loop {
        if synced.all() && synced.stopped().is_none() {
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "labels": {PEER_LABEL: "true"},
                    "annotations": {ADDRESS_ANNOTATION: addr.to_string()},
                },
                "spec": {
                    "holderIdentity": me,
                    "leaseDurationSeconds": DURATION.as_secs(),
                    "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                },
            });
            match api.patch(&name, &params, &Patch::Apply(&lease)).await {
                Ok(_) => {
                    if !held {
                        tracing::info!("peer Lease {namespace}/{name} held: charges of the queues this replica owns come here ({addr})");
                    }
                    held = true;
                }
                Err(e) => tracing::warn!("renewing peer Lease {namespace}/{name}: {e}"),
            }
        } else if held {
            held = !withdraw(&api, &name).await;
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(RENEW) => {}
        }
    }
    // Also when no renewal was confirmed: one that timed out may still have been applied.
    withdraw(&api, &name).await;
}

/// Deletes the peer Lease; true when it is gone.
async fn withdraw(api: &Api<Lease>, name: &str) -> bool {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!("peer Lease {name} released");
            true
        }
        Err(kube::Error::Api(e)) if e.code == 404 => true,
        Err(e) => {
            tracing::warn!("releasing peer Lease {name}: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_lease_name_is_a_dns_subdomain_whatever_the_identity() {
        assert_eq!(
            lease_name("card-quota", "card-quota-7d9f-abcde"),
            "card-quota-peer-card-quota-7d9f-abcde"
        );
        assert_eq!(
            lease_name("cq", "Build_Host-4242"),
            "cq-peer-build-host-4242"
        );
        let long = lease_name("cq", &"x".repeat(400));
        assert_eq!(long.len(), 253);
    }
}
