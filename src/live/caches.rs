//! Informer caches: kube-runtime watchers (with their relist and backoff) feeding the
//! trimmed snapshot. Objects are turned into records on arrival and dropped, so the
//! cache holds only what decisions read.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::cards::{ObjectKey, QueueName};
use crate::cluster::records::{
    node_record, pod_record, podgroup_record, queue_record, workload_record,
};
use crate::cluster::{Snapshot, WorkloadKind};

use super::charge::remember;
use super::queues::{podgroup_resource, queue_resource};

/// How many kinds have listed everything at least once.
#[derive(Debug, Default)]
pub struct Synced {
    done: AtomicUsize,
    notify: tokio::sync::Notify,
}

/// The kinds mirrored into the snapshot.
pub const KINDS: usize = 7;

impl Synced {
    /// A state that counts as synced (tests and tools that fill the snapshot themselves).
    pub fn already() -> Self {
        Self {
            done: AtomicUsize::new(KINDS),
            notify: tokio::sync::Notify::new(),
        }
    }
    pub fn all(&self) -> bool {
        self.done.load(Ordering::Acquire) >= KINDS
    }
    fn mark(&self) {
        self.done.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }
    /// Waits until every kind has synced once.
    pub async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            if self.all() {
                return;
            }
            n.await;
        }
    }
}

/// How one kind is stored in the snapshot.
struct Mirror<K> {
    kind: &'static str,
    upsert: fn(&mut Snapshot, &K) -> Result<(), String>,
    keys: fn(&Snapshot) -> Vec<ObjectKey>,
    remove: fn(&mut Snapshot, &ObjectKey),
}

fn key_of<K: Resource>(o: &K) -> ObjectKey {
    ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any())
}

fn as_value<K: Serialize>(o: &K, kind: &str) -> Result<Value, String> {
    let mut v = serde_json::to_value(o).map_err(|e| e.to_string())?;
    if let Some(m) = v.as_object_mut() {
        m.insert("kind".into(), Value::String(kind.to_string()));
    }
    Ok(v)
}

fn upsert_node(s: &mut Snapshot, n: &Node) -> Result<(), String> {
    let (name, cards) = node_record(n).map_err(|e| e.to_string())?;
    for p in &cards.problems {
        tracing::warn!("{p}");
    }
    s.upsert_node(name, cards);
    Ok(())
}

fn upsert_pod(s: &mut Snapshot, p: &Pod) -> Result<(), String> {
    let prefixes = s.card_prefixes();
    let seq = s.next_seq();
    let rec = pod_record(p, "", &prefixes, seq).map_err(|e| e.to_string())?;
    s.upsert_pod(rec);
    Ok(())
}

fn upsert_queue(s: &mut Snapshot, q: &DynamicObject) -> Result<(), String> {
    let rec = queue_record(&as_value(q, "Queue")?).map_err(|e| e.to_string())?;
    if let Some(p) = &rec.ledger_problem {
        tracing::warn!("{p}; treating it as empty until the next write replaces it");
    }
    remember(s, rec);
    Ok(())
}

fn upsert_group(s: &mut Snapshot, g: &DynamicObject) -> Result<(), String> {
    let seq = s
        .group(&key_of(g))
        .map(|old| old.seq)
        .unwrap_or_else(|| s.next_seq());
    let rec = podgroup_record(&as_value(g, "PodGroup")?, "", seq).map_err(|e| e.to_string())?;
    s.upsert_group(rec);
    Ok(())
}

fn upsert_workload<K: Serialize + Resource>(
    kind: WorkloadKind,
    s: &mut Snapshot,
    o: &K,
) -> Result<(), String> {
    let prefixes = s.card_prefixes();
    let seq = s.next_seq();
    let rec = workload_record(kind, &as_value(o, kind.kind())?, "", &prefixes, seq)
        .map_err(|e| e.to_string())?;
    s.upsert_workload(rec);
    Ok(())
}

fn cluster_keys(names: Vec<String>) -> Vec<ObjectKey> {
    names.into_iter().map(|n| ObjectKey::new("", n)).collect()
}

async fn run<K>(api: Api<K>, m: Mirror<K>, snapshot: Arc<Mutex<Snapshot>>, synced: Arc<Synced>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listed: Option<std::collections::HashSet<ObjectKey>> = None;
    let mut first = true;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(kind = m.kind, "watch failed, retrying with backoff: {e}");
                continue;
            }
        };
        let mut snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
        match ev {
            Event::Init => listed = Some(Default::default()),
            Event::InitApply(o) | Event::Apply(o) => {
                if let Some(seen) = listed.as_mut() {
                    seen.insert(key_of(&o));
                }
                if let Err(e) = (m.upsert)(&mut snap, &o) {
                    tracing::warn!(kind = m.kind, "{} not cached: {e}", key_of(&o));
                }
            }
            Event::Delete(o) => (m.remove)(&mut snap, &key_of(&o)),
            Event::InitDone => {
                // Whatever the relist did not return was deleted while we were away.
                let seen = listed.take().unwrap_or_default();
                for k in (m.keys)(&snap) {
                    if !seen.contains(&k) {
                        (m.remove)(&mut snap, &k);
                    }
                }
                drop(snap);
                if first {
                    first = false;
                    tracing::info!(kind = m.kind, "cache synced");
                    synced.mark();
                }
            }
        }
    }
}

/// Starts the watchers. Nodes sync first so pods see every card vendor prefix.
pub async fn start(client: Client, snapshot: Arc<Mutex<Snapshot>>, synced: Arc<Synced>) {
    let nodes = tokio::spawn(run(
        Api::<Node>::all(client.clone()),
        Mirror {
            kind: "Node",
            upsert: upsert_node,
            keys: |s| cluster_keys(s.node_names()),
            remove: |s, k| s.remove_node(&k.name),
        },
        snapshot.clone(),
        synced.clone(),
    ));
    while synced.done.load(Ordering::Acquire) == 0 {
        let n = synced.notify.notified();
        if synced.done.load(Ordering::Acquire) > 0 || nodes.is_finished() {
            break;
        }
        n.await;
    }
    tokio::spawn(run(
        Api::<DynamicObject>::all_with(client.clone(), &queue_resource()),
        Mirror {
            kind: "Queue",
            upsert: upsert_queue,
            keys: |s| cluster_keys(s.queues().map(|q| q.name.to_string()).collect()),
            remove: |s, k| s.remove_queue(&QueueName::new(k.name.clone())),
        },
        snapshot.clone(),
        synced.clone(),
    ));
    tokio::spawn(run(
        Api::<DynamicObject>::all_with(client.clone(), &podgroup_resource()),
        Mirror {
            kind: "PodGroup",
            upsert: upsert_group,
            keys: Snapshot::group_keys,
            remove: |s, k| s.remove_group(k),
        },
        snapshot.clone(),
        synced.clone(),
    ));
    tokio::spawn(run(
        Api::<Pod>::all(client.clone()),
        Mirror {
            kind: "Pod",
            upsert: upsert_pod,
            keys: Snapshot::pod_keys,
            remove: |s, k| s.remove_pod(k),
        },
        snapshot.clone(),
        synced.clone(),
    ));
    tokio::spawn(run(
        Api::<Deployment>::all(client.clone()),
        Mirror {
            kind: "Deployment",
            upsert: |s, o| upsert_workload(WorkloadKind::Deployment, s, o),
            keys: |s| s.workload_keys(WorkloadKind::Deployment),
            remove: |s, k| s.remove_workload(WorkloadKind::Deployment, k),
        },
        snapshot.clone(),
        synced.clone(),
    ));
    tokio::spawn(run(
        Api::<ReplicaSet>::all(client.clone()),
        Mirror {
            kind: "ReplicaSet",
            upsert: |s, o| upsert_workload(WorkloadKind::ReplicaSet, s, o),
            keys: |s| s.workload_keys(WorkloadKind::ReplicaSet),
            remove: |s, k| s.remove_workload(WorkloadKind::ReplicaSet, k),
        },
        snapshot.clone(),
        synced.clone(),
    ));
    tokio::spawn(run(
        Api::<StatefulSet>::all(client),
        Mirror {
            kind: "StatefulSet",
            upsert: |s, o| upsert_workload(WorkloadKind::StatefulSet, s, o),
            keys: |s| s.workload_keys(WorkloadKind::StatefulSet),
            remove: |s, k| s.remove_workload(WorkloadKind::StatefulSet, k),
        },
        snapshot,
        synced,
    ));
}
