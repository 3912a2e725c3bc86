//! Where a snapshot comes from: a file of objects, or the cluster's informer caches.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use card_quota::cards::CardResources;
use card_quota::live::caches;
use card_quota::snapshot::Snapshot;

use crate::args::ClusterArgs;

/// The text of an objects file, or of stdin for `-`.
pub fn read_objects(path: &std::path::Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading objects from stdin")
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// A snapshot from a YAML/JSON stream of objects; objects it cannot read are logged.
pub fn snapshot_file(path: &std::path::Path, cards: &CardResources) -> anyhow::Result<Snapshot> {
    let text = read_objects(path)?;
    let (snap, skipped) = card_quota::snapshot::load::load_with(&text, cards)?;
    for s in skipped {
        tracing::warn!("{}: {s}", path.display());
    }
    Ok(snap)
}

/// Informer caches feeding a new snapshot, as `serve` and `status` both use them.
/// `own_namespace` holds the ledgers.
pub fn start_caches(
    client: kube::Client,
    own_namespace: Option<String>,
    cards: &CardResources,
    freshness: Option<Arc<card_quota::live::freshness::Freshness>>,
) -> (Arc<Mutex<Snapshot>>, Arc<caches::Synced>) {
    let mut empty = Snapshot::new();
    empty.set_card_resources(cards.clone());
    let snapshot = Arc::new(Mutex::new(empty));
    let synced = Arc::new(caches::Synced::default());
    tokio::spawn(caches::start(
        client,
        own_namespace,
        snapshot.clone(),
        synced.clone(),
        freshness,
    ));
    (snapshot, synced)
}

/// A client for the cluster `c` names (kubectl's defaults otherwise).
pub async fn client_for(c: &ClusterArgs) -> anyhow::Result<kube::Client> {
    let config = match (&c.kubeconfig, &c.context) {
        (None, None) => kube::Config::infer()
            .await
            .context("reading the kubeconfig or the in-cluster config")?,
        (path, context) => {
            let options = kube::config::KubeConfigOptions {
                context: context.clone(),
                ..Default::default()
            };
            match path {
                Some(p) => {
                    let file = kube::config::Kubeconfig::read_from(p)
                        .with_context(|| format!("reading --kubeconfig {}", p.display()))?;
                    kube::Config::from_custom_kubeconfig(file, &options).await
                }
                None => kube::Config::from_kubeconfig(&options).await,
            }
            .with_context(|| match context {
                Some(ctx) => format!("loading kubeconfig context {ctx}"),
                None => "loading the kubeconfig".to_string(),
            })?
        }
    };
    kube::Client::try_from(config).context("connecting to the API server")
}

/// The cluster as the webhook sees it: the same informer caches, synced once.
pub async fn live_snapshot(
    cards: &CardResources,
    cluster: &ClusterArgs,
) -> anyhow::Result<Snapshot> {
    let client = client_for(cluster).await?;
    let (snapshot, synced) = start_caches(client, None, cards, None);
    tokio::time::timeout(std::time::Duration::from_secs(60), synced.wait())
        .await
        .context("listing Nodes, Queues, PodGroups, Pods and workloads took over 60s")?;
    let snap = snapshot.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(snap)
}

/// Every Queue of the cluster as card-quota reads it (usage annotation included).
pub async fn live_queues(
    cluster: &ClusterArgs,
) -> anyhow::Result<Vec<card_quota::cluster::QueueRecord>> {
    use kube::api::{Api, DynamicObject, ListParams};
    let client = client_for(cluster).await?;
    let api = Api::<DynamicObject>::all_with(client, &card_quota::live::volcano::queue_resource());
    let list = api
        .list(&ListParams::default())
        .await
        .context("listing Volcano Queues")?;
    let mut out = Vec::new();
    for q in list.items {
        let name = q.metadata.name.clone().unwrap_or_default();
        let mut v = serde_json::to_value(&q).context("encoding a Queue")?;
        v["apiVersion"] = "scheduling.volcano.sh/v1beta1".into();
        v["kind"] = "Queue".into();
        match card_quota::cluster::records::queue_record(&v) {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!("queue {name}: {e}"),
        }
    }
    Ok(out)
}

/// What the install's webhook configurations say (whether its pod hooks fail open), for
/// a reader allowed to list them; for one who is not (a team user), nothing.
pub async fn live_install(
    cluster: &ClusterArgs,
) -> anyhow::Result<card_quota::cli::status::Install> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::api::{Api, ListParams};
    let client = client_for(cluster).await?;
    match Api::<ValidatingWebhookConfiguration>::all(client)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(card_quota::cli::status::Install::from_webhooks(&list.items)),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::debug!("cannot list ValidatingWebhookConfigurations: the install's failure policy is not shown");
            Ok(Default::default())
        }
        Err(e) => Err(e).context("listing ValidatingWebhookConfigurations"),
    }
}

/// The card pods and PodGroups of one namespace, as a snapshot: which queues that
/// namespace is charged to. Lists in that namespace only (a tenant's own rights suffice).
pub async fn namespace_snapshot(
    cards: &CardResources,
    cluster: &ClusterArgs,
    namespace: &str,
) -> anyhow::Result<Snapshot> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DynamicObject, ListParams};
    let client = client_for(cluster).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing pods in namespace {namespace}"))?;
    let groups = Api::<DynamicObject>::namespaced_with(
        client,
        namespace,
        &card_quota::live::volcano::podgroup_resource(),
    )
    .list(&ListParams::default())
    .await
    .with_context(|| format!("listing PodGroups in namespace {namespace}"))?;
    let mut items = Vec::new();
    for p in pods.items {
        let mut v = serde_json::to_value(&p).context("encoding a Pod")?;
        v["apiVersion"] = "v1".into();
        v["kind"] = "Pod".into();
        items.push(v);
    }
    for g in groups.items {
        let mut v = serde_json::to_value(&g).context("encoding a PodGroup")?;
        v["apiVersion"] = "scheduling.volcano.sh/v1beta1".into();
        v["kind"] = "PodGroup".into();
        items.push(v);
    }
    let text = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let (snap, skipped) = card_quota::snapshot::load::load_with(&text, cards)?;
    for s in skipped {
        tracing::warn!("namespace {namespace}: {s}");
    }
    Ok(snap)
}
