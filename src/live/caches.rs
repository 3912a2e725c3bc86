//! Informer caches: kube-runtime watchers (with their relist and backoff) feeding the
//! trimmed snapshot. Objects are turned into records on arrival and dropped, so the
//! cache holds only what decisions read.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
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
use crate::cluster::WorkloadKind;
use crate::ledger::entries::Stream;
use crate::ledger::ledger_record;
use crate::snapshot::Snapshot;

use super::ledgers::{object_name, selector};
use super::volcano::{podgroup_resource, queue_resource};

/// How many kinds have listed everything at least once.
#[derive(Debug, Default)]
pub struct Synced {
    done: AtomicUsize,
    notify: tokio::sync::Notify,
    /// The background task that stopped, when one did: the process is then unready and
    /// unhealthy, so the kubelet restarts it.
    stopped: std::sync::Mutex<Option<String>>,
}

/// The kinds mirrored into the snapshot.
pub const KINDS: usize = 8;

impl Synced {
    /// A state that counts as synced (tests and tools that fill the snapshot themselves).
    pub fn already() -> Self {
        Self {
            done: AtomicUsize::new(KINDS),
            notify: tokio::sync::Notify::new(),
            stopped: std::sync::Mutex::new(None),
        }
    }

    /// Records that a background task stopped (it never should).
    pub fn stop(&self, what: String) {
        tracing::error!("{what}: card-quota is now unhealthy and waits to be restarted");
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
        self.notify.notify_waiters();
    }

    /// The background task that stopped, if any.
    pub fn stopped(&self) -> Option<String> {
        self.stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

/// Why a watched object could not be stored in the snapshot.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(transparent)]
    Record(#[from] crate::cluster::records::RecordError),
    #[error("cannot re-encode the {kind}: {source}")]
    Encode {
        kind: String,
        source: serde_json::Error,
    },
}

/// How one kind is stored in the snapshot.
struct Mirror<K> {
    kind: &'static str,
    upsert: fn(&mut Snapshot, &K) -> Result<(), MirrorError>,
    keys: fn(&Snapshot) -> Vec<ObjectKey>,
    remove: fn(&mut Snapshot, &ObjectKey),
    /// The stream whose progress ledger watermarks are compared with.
    stream: Option<Stream>,
    /// The object's key as `keys` lists it.
    key: fn(&K) -> ObjectKey,
}

fn version_of<K: Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Records how far a stream has come. After a relist, the cache holds the list's
/// state, which is at least as new as the newest object in it.
fn advance(s: &mut Snapshot, stream: Option<Stream>, rv: u64, relisted: bool) {
    let Some(stream) = stream else { return };
    let mut p = s.progress();
    let slot = match stream {
        Stream::Pods => &mut p.pods,
        Stream::PodGroups => &mut p.podgroups,
    };
    *slot = if relisted { rv } else { (*slot).max(rv) };
    s.set_progress(p);
}

fn key_of<K: Resource>(o: &K) -> ObjectKey {
    ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any())
}

fn as_value<K: Serialize>(o: &K, kind: &str) -> Result<Value, MirrorError> {
    let mut v = serde_json::to_value(o).map_err(|source| MirrorError::Encode {
        kind: kind.to_string(),
        source,
    })?;
    if let Some(m) = v.as_object_mut() {
        m.insert("kind".into(), Value::String(kind.to_string()));
    }
    Ok(v)
}

fn upsert_node(s: &mut Snapshot, n: &Node) -> Result<(), MirrorError> {
    let (name, cards) = node_record(n)?;
    for p in &cards.problems {
        tracing::warn!("{p}");
    }
    s.upsert_node(name, cards);
    Ok(())
}

fn upsert_pod(s: &mut Snapshot, p: &Pod) -> Result<(), MirrorError> {
    let prefixes = s.card_prefixes();
    let seq = s.next_seq();
    let rec = pod_record(p, "", &prefixes, seq)?;
    s.upsert_pod(rec);
    Ok(())
}

fn upsert_queue(s: &mut Snapshot, q: &DynamicObject) -> Result<(), MirrorError> {
    let rec = queue_record(&as_value(q, "Queue")?)?;
    s.remember_queue(rec);
    Ok(())
}

fn upsert_ledger(s: &mut Snapshot, cm: &ConfigMap) -> Result<(), MirrorError> {
    let rec = ledger_record(cm)?;
    if let Some(p) = &rec.problem {
        tracing::warn!("{p}; the next write replaces it");
    }
    s.upsert_ledger(rec);
    Ok(())
}

fn ledger_keys(s: &Snapshot) -> Vec<ObjectKey> {
    s.ledgers()
        .map(|l| ObjectKey::new("", object_name(&l.queue)))
        .collect()
}

fn remove_ledger(s: &mut Snapshot, k: &ObjectKey) {
    let gone: Vec<QueueName> = s
        .ledgers()
        .filter(|l| object_name(&l.queue) == k.name)
        .map(|l| l.queue.clone())
        .collect();
    for q in gone {
        s.remove_ledger(&q);
    }
}

fn upsert_group(s: &mut Snapshot, g: &DynamicObject) -> Result<(), MirrorError> {
    let seq = s
        .group(&key_of(g))
        .map(|old| old.seq)
        .unwrap_or_else(|| s.next_seq());
    let rec = podgroup_record(&as_value(g, "PodGroup")?, "", seq)?;
    s.upsert_group(rec);
    Ok(())
}

fn upsert_workload<K: Serialize + Resource>(
    kind: WorkloadKind,
    s: &mut Snapshot,
    o: &K,
) -> Result<(), MirrorError> {
    let prefixes = s.card_prefixes();
    let seq = s.next_seq();
    let rec = workload_record(kind, &as_value(o, kind.kind())?, "", &prefixes, seq)?;
    s.upsert_workload(rec);
    Ok(())
}

fn cluster_keys(names: Vec<String>) -> Vec<ObjectKey> {
    names.into_iter().map(|n| ObjectKey::new("", n)).collect()
}

async fn run<K>(
    api: Api<K>,
    config: watcher::Config,
    m: Mirror<K>,
    snapshot: Arc<Mutex<Snapshot>>,
    synced: Arc<Synced>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut listed: Option<std::collections::HashSet<ObjectKey>> = None;
    let mut listed_version = 0u64;
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
            Event::Init => {
                listed = Some(Default::default());
                listed_version = 0;
            }
            Event::InitApply(o) | Event::Apply(o) => {
                if let Some(seen) = listed.as_mut() {
                    seen.insert((m.key)(&o));
                    listed_version = listed_version.max(version_of(&o));
                } else {
                    advance(&mut snap, m.stream, version_of(&o), false);
                }
                if let Err(e) = (m.upsert)(&mut snap, &o) {
                    tracing::warn!(
                        kind = m.kind,
                        "{} not cached: {}",
                        (m.key)(&o),
                        e.to_string().escape_debug()
                    );
                }
            }
            Event::Delete(o) => {
                (m.remove)(&mut snap, &(m.key)(&o));
                advance(&mut snap, m.stream, version_of(&o), false);
            }
            Event::InitDone => {
                // Whatever the relist did not return was deleted while we were away.
                let seen = listed.take().unwrap_or_default();
                for k in (m.keys)(&snap) {
                    if !seen.contains(&k) {
                        (m.remove)(&mut snap, &k);
                    }
                }
                advance(&mut snap, m.stream, listed_version, true);
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

/// Starts the watchers; ledgers are read from `namespace` (`None`: no ledgers, for
/// read-only tools). Nodes sync first so pods see every card vendor prefix.
pub async fn start(
    client: Client,
    namespace: Option<String>,
    snapshot: Arc<Mutex<Snapshot>>,
    synced: Arc<Synced>,
) {
    let all = watcher::Config::default;
    supervise(
        &synced,
        "Node",
        run(
            Api::<Node>::all(client.clone()),
            all(),
            Mirror {
                kind: "Node",
                upsert: upsert_node,
                keys: |s| cluster_keys(s.node_names()),
                remove: |s, k| s.remove_node(&k.name),
                stream: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    while synced.done.load(Ordering::Acquire) == 0 {
        let n = synced.notify.notified();
        if synced.done.load(Ordering::Acquire) > 0 || synced.stopped().is_some() {
            break;
        }
        n.await;
    }
    match namespace {
        None => synced.mark(),
        Some(ns) => supervise(
            &synced,
            "ledger ConfigMap",
            run(
                Api::<ConfigMap>::namespaced(client.clone(), &ns),
                watcher::Config::default().labels(&selector()),
                Mirror {
                    kind: "ledger ConfigMap",
                    upsert: upsert_ledger,
                    keys: ledger_keys,
                    remove: remove_ledger,
                    stream: None,
                    // Ledgers are kept by queue; the namespace is always card-quota's own.
                    key: |o| ObjectKey::new("", o.name_any()),
                },
                snapshot.clone(),
                synced.clone(),
            ),
        ),
    }
    supervise(
        &synced,
        "Queue",
        run(
            Api::<DynamicObject>::all_with(client.clone(), &queue_resource()),
            all(),
            Mirror {
                kind: "Queue",
                upsert: upsert_queue,
                keys: |s| cluster_keys(s.queues().map(|q| q.name.to_string()).collect()),
                remove: |s, k| s.remove_queue(&QueueName::new(k.name.clone())),
                stream: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "PodGroup",
        run(
            Api::<DynamicObject>::all_with(client.clone(), &podgroup_resource()),
            all(),
            Mirror {
                kind: "PodGroup",
                upsert: upsert_group,
                keys: Snapshot::group_keys,
                remove: |s, k| s.remove_group(k),
                stream: Some(Stream::PodGroups),
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "Pod",
        run(
            Api::<Pod>::all(client.clone()),
            all(),
            Mirror {
                kind: "Pod",
                upsert: upsert_pod,
                keys: Snapshot::pod_keys,
                remove: |s, k| s.remove_pod(k),
                stream: Some(Stream::Pods),
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "Deployment",
        run(
            Api::<Deployment>::all(client.clone()),
            all(),
            Mirror {
                kind: "Deployment",
                upsert: |s, o| upsert_workload(WorkloadKind::Deployment, s, o),
                keys: |s| s.workload_keys(WorkloadKind::Deployment),
                remove: |s, k| s.remove_workload(WorkloadKind::Deployment, k),
                stream: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "ReplicaSet",
        run(
            Api::<ReplicaSet>::all(client.clone()),
            all(),
            Mirror {
                kind: "ReplicaSet",
                upsert: |s, o| upsert_workload(WorkloadKind::ReplicaSet, s, o),
                keys: |s| s.workload_keys(WorkloadKind::ReplicaSet),
                remove: |s, k| s.remove_workload(WorkloadKind::ReplicaSet, k),
                stream: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "StatefulSet",
        run(
            Api::<StatefulSet>::all(client),
            all(),
            Mirror {
                kind: "StatefulSet",
                upsert: |s, o| upsert_workload(WorkloadKind::StatefulSet, s, o),
                keys: |s| s.workload_keys(WorkloadKind::StatefulSet),
                remove: |s, k| s.remove_workload(WorkloadKind::StatefulSet, k),
                stream: None,
                key: key_of,
            },
            snapshot,
            synced.clone(),
        ),
    );
}

/// Runs a watcher that should run forever; if it ends (a panic), says so in `synced`.
fn supervise(
    synced: &Arc<Synced>,
    kind: &'static str,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let task = tokio::spawn(task);
    let synced = synced.clone();
    tokio::spawn(async move {
        let why = match task.await {
            Ok(()) => "ended".to_string(),
            Err(e) => e.to_string(),
        };
        synced.stop(format!("the {kind} watcher stopped ({why})"));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watcher_that_dies_makes_the_process_unhealthy() {
        let synced = Arc::new(Synced::already());
        assert!(synced.stopped().is_none());
        supervise(&synced, "Pod", async { panic!("bug in an upsert") });
        for _ in 0..100 {
            if synced.stopped().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let why = synced.stopped().expect("the death is noticed");
        assert!(why.starts_with("the Pod watcher stopped"), "{why}");
        assert!(why.contains("panicked"), "{why}");
    }
}
