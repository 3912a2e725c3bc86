//! Informer caches: kube-runtime watchers (with their relist and backoff) feeding the
//! trimmed snapshot. Objects are turned into records on arrival (before the snapshot is
//! locked) and dropped, so the cache holds only what decisions read.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};

use crate::cards::CardResources;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::cards::dra::{DraError, Prepared};
use crate::cards::{NodeCards, ObjectKey, QueueName};
use crate::cluster::pod_parts::PodParts;
use crate::cluster::records::{
    job_record, namespace_record, node_record, podgroup_record, queue_record, workload_record,
    JobRecord, QueueRecord, WorkloadRecord,
};
use crate::cluster::{PodGroupRecord, PodRecord, WorkloadKind};
use crate::ledger::entries::{Stream, Watermark};
use crate::ledger::{ledger_record, LedgerRecord};
use crate::snapshot::{DraRecord, KeyPick, Snapshot};

use super::freshness::{Freshness, Probe};
use super::ledgers::{object_name, selector};
use super::volcano::{job_resource, podgroup_resource, queue_resource};

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
pub const KINDS: usize = 9;

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

/// Reads an object's record with no lock held.
type ReadFn<K, R> = fn(&K) -> Result<R, MirrorError>;

/// How one kind is stored in the snapshot. An object is read into its record before
/// the snapshot is locked; the lock is held only to store the record, so a watcher
/// never makes a decision wait while it decodes an object.
struct Mirror<K, R> {
    kind: &'static str,
    /// The object's record, read from the object alone (no lock held).
    read: ReadFn<K, R>,
    /// Stores a record, adjusting it to what the snapshot knows (under the lock).
    store: fn(&mut Snapshot, R),
    /// The keys held that the predicate picks: only those are copied, so a relist's
    /// sweep of 100k pods copies the deleted ones, not every key.
    keys: fn(&Snapshot, KeyPick<'_>) -> Vec<ObjectKey>,
    remove: fn(&mut Snapshot, &ObjectKey),
    /// Work on the record that needs what the snapshot holds but not the lock held while
    /// it runs (it takes the lock for a moment to copy what it needs).
    prepare: Option<fn(&mut R, &Mutex<Snapshot>)>,
    /// The record a deletion is stored as, prepared like a read (`None`: `remove` it
    /// under the lock). A ResourceSlice's deletion is `DraRecord::SliceGone`: what its
    /// devices meant to every requirement is worked out without the lock; a DeviceClass's
    /// is `DraRecord::ClassGone`. (A relist's
    /// sweep of objects it no longer returns removes them under the lock.)
    removal: Option<ReadFn<K, R>>,
    /// The stream whose progress ledger watermarks are compared with.
    stream: Option<Stream>,
    /// The object's key as `keys` lists it.
    key: fn(&K) -> ObjectKey,
}

impl<K, R> Mirror<K, R> {
    /// Runs `prepare` on `r` (CPU work: a claim's selectors against every device, a
    /// slice's devices against every requirement) off the runtime's worker, so the
    /// webhook's tasks move to another.
    fn prepare_off_worker(&self, r: &mut R, snapshot: &Mutex<Snapshot>) {
        let Some(prepare) = self.prepare else { return };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| prepare(r, snapshot))
            }
            _ => prepare(r, snapshot),
        }
    }
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
    let slot = p.of_mut(stream);
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

fn read_node(n: &Node) -> Result<(String, NodeCards), MirrorError> {
    let (name, cards) = node_record(n)?;
    for p in &cards.problems {
        tracing::warn!("{p}");
    }
    Ok((name, cards))
}

fn store_node(s: &mut Snapshot, (name, cards): (String, NodeCards)) {
    s.upsert_node(name, cards);
}

/// A pod's record with only the default vendors' resources as card demand: which other
/// vendors count is the snapshot's to say, when it is stored.
/// Pods are watched as [`PodParts`]: a watch event carries the whole pod (managed
/// fields, environment, volumes), and reading only what card-quota uses costs a
/// fraction of a whole `Pod` for every event of every pod in the cluster.
impl Resource for PodParts {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as Resource>::kind(&())
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as Resource>::group(&())
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as Resource>::version(&())
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as Resource>::plural(&())
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.metadata
    }
}

fn read_pod(p: &PodParts) -> Result<PodRecord, MirrorError> {
    Ok(p.record("", CardResources::defaults(), 0)?)
}

fn store_pod(s: &mut Snapshot, mut rec: PodRecord) {
    rec.reclassify(|r| s.is_card_resource(r));
    // A new pod's arrival order; a known pod keeps its own (upsert_pod).
    rec.seq = s.next_seq();
    s.upsert_pod(rec);
}

/// A DRA object as its watcher brings it, read (and a claim's or template's requirements
/// counted against every device) without the lock when the snapshot's devices could be
/// had ([`prepare_dra`]): a tenant's costly selectors hold back no decision.
struct DraEvent {
    value: Value,
    read: Option<(DraRead, Option<Prepared>)>,
}

/// [`DraRecord::read`]'s answer.
type DraRead = Result<Option<DraRecord>, DraError>;

fn dra_event(o: &DynamicObject, kind: &str) -> Result<DraEvent, MirrorError> {
    Ok(DraEvent {
        value: as_value(o, kind)?,
        read: None,
    })
}

fn prepare_dra(ev: &mut DraEvent, snapshot: &Mutex<Snapshot>) {
    let view = snapshot
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .dra_view();
    let record = match ev.read.take() {
        // Read already (a slice's deletion).
        Some((record, _)) => record,
        None => DraRecord::read(&ev.value, "", view.settings()),
    };
    let prepared = match &record {
        Ok(Some(r)) => r.prepare(&view),
        _ => None,
    };
    ev.read = Some((record, prepared));
}

fn store_dra(s: &mut Snapshot, ev: DraEvent) {
    let stored = match ev.read {
        // Counted at an older generation (a slice or class changed since), the
        // requirements are counted here again: `store_dra_record` checks.
        Some((Ok(Some(r)), prepared)) => s.store_dra_record(r, prepared.as_ref()),
        Some((Ok(None), _)) => Ok(()),
        Some((Err(e), _)) => Err(e),
        None => s.store_dra(&ev.value, "").map(|_| ()),
    };
    if let Err(e) = stored {
        // What it said before is no longer what it says: forgotten by store_dra.
        tracing::warn!(
            "{} not cached: {e}",
            crate::snapshot::load::describe(&ev.value)
        );
    }
}

/// The mirror of one DRA kind (see [`super::dra::KINDS`]).
fn dra_mirror(kind: &'static str) -> Mirror<DynamicObject, DraEvent> {
    let mirror = |read, keys, remove, removal| Mirror {
        kind,
        read,
        store: store_dra,
        keys,
        remove,
        // A claim's allocation is where a DRA card's charge shows before its pod is
        // bound: ledger watermarks carry the claims' stream (R2).
        stream: (kind == "ResourceClaim").then_some(Stream::Claims),
        prepare: Some(prepare_dra),
        removal,
        key: key_of,
    };
    match kind {
        "ResourceSlice" => mirror(
            |o| dra_event(o, "ResourceSlice"),
            |s, pick| cluster_keys(s.slice_names(), pick),
            |s, k| s.remove_slice(&k.name, None),
            Some(|o: &DynamicObject| {
                Ok(DraEvent {
                    value: Value::Null,
                    read: Some((Ok(Some(DraRecord::SliceGone(o.name_any()))), None)),
                })
            }),
        ),
        "DeviceClass" => mirror(
            |o| dra_event(o, "DeviceClass"),
            |s, pick| cluster_keys(s.class_names(), pick),
            |s, k| s.remove_class(&k.name, None),
            Some(|o: &DynamicObject| {
                Ok(DraEvent {
                    value: Value::Null,
                    read: Some((Ok(Some(DraRecord::ClassGone(o.name_any()))), None)),
                })
            }),
        ),
        "ResourceClaimTemplate" => mirror(
            |o| dra_event(o, "ResourceClaimTemplate"),
            |s, pick| s.template_keys().into_iter().filter(|k| pick(k)).collect(),
            |s, k| s.remove_template(k),
            None,
        ),
        // ResourceClaim, the last of KINDS.
        _ => mirror(
            |o| dra_event(o, "ResourceClaim"),
            |s, pick| s.claim_keys().into_iter().filter(|k| pick(k)).collect(),
            |s, k| s.remove_claim(k),
            None,
        ),
    }
}

pub(crate) fn read_queue(q: &DynamicObject) -> Result<QueueRecord, MirrorError> {
    Ok(queue_record(&as_value(q, "Queue")?)?)
}

fn read_ledger(cm: &ConfigMap) -> Result<LedgerRecord, MirrorError> {
    let rec = ledger_record(cm)?;
    if let Some(p) = &rec.problem {
        tracing::warn!("{p}; the next write replaces it");
    }
    Ok(rec)
}

fn ledger_keys(s: &Snapshot, pick: KeyPick<'_>) -> Vec<ObjectKey> {
    s.ledgers()
        .map(|l| ObjectKey::new("", object_name(&l.queue)))
        .filter(|k| pick(k))
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

fn read_group(g: &DynamicObject) -> Result<PodGroupRecord, MirrorError> {
    Ok(podgroup_record(&as_value(g, "PodGroup")?, "", 0)?)
}

fn store_group(s: &mut Snapshot, mut rec: PodGroupRecord) {
    rec.seq = s
        .group(&rec.key)
        .map(|old| old.seq)
        .unwrap_or_else(|| s.next_seq());
    s.upsert_group(rec);
}

fn read_workload<K: Serialize + Resource>(
    kind: WorkloadKind,
    o: &K,
) -> Result<WorkloadRecord, MirrorError> {
    Ok(workload_record(
        kind,
        &as_value(o, kind.kind())?,
        "",
        CardResources::defaults(),
        0,
    )?)
}

fn read_job(j: &DynamicObject) -> Result<JobRecord, MirrorError> {
    Ok(job_record(
        &as_value(j, "Job")?,
        "",
        CardResources::defaults(),
        0,
    )?)
}

fn store_job(s: &mut Snapshot, mut rec: JobRecord) {
    for (_, _, t) in &mut rec.tasks {
        t.reclassify(|r| s.is_card_resource(r));
    }
    s.upsert_job(rec);
}

fn store_workload(s: &mut Snapshot, mut rec: WorkloadRecord) {
    rec.template.reclassify(|r| s.is_card_resource(r));
    rec.template.seq = s.next_seq();
    s.upsert_workload(rec);
}

fn cluster_keys(names: Vec<String>, pick: KeyPick<'_>) -> Vec<ObjectKey> {
    names
        .into_iter()
        .map(|n| ObjectKey::new("", n))
        .filter(|k| pick(k))
        .collect()
}

fn pod_mirror() -> Mirror<PodParts, PodRecord> {
    Mirror {
        kind: "Pod",
        read: read_pod,
        store: store_pod,
        keys: Snapshot::pod_keys_picked,
        remove: |s, k| s.delete_pod(k),
        stream: Some(Stream::Pods),
        prepare: None,
        removal: None,
        key: key_of,
    }
}

/// One kind's cache as its watch stream feeds it, event by event.
struct Follower<K, R> {
    m: Mirror<K, R>,
    /// The keys a relist in progress has returned so far.
    listed: Option<crate::cards::hashing::Set<ObjectKey>>,
    listed_version: u64,
    /// A resourceVersion read just before the relist in progress was asked for: the
    /// list (a consistent read) is at least as new.
    floor: Option<u64>,
}

impl<K: Resource, R> Follower<K, R> {
    fn new(m: Mirror<K, R>) -> Self {
        Self {
            m,
            listed: None,
            listed_version: 0,
            floor: None,
        }
    }

    /// Applies one watch event to the snapshot; true when it ends a (re)list.
    fn apply(&mut self, ev: Event<K>, snapshot: &Mutex<Snapshot>) -> bool {
        let m = &self.m;
        let lock = || snapshot.lock().unwrap_or_else(|e| e.into_inner());
        match ev {
            Event::Init => {
                self.listed = Some(Default::default());
                self.listed_version = 0;
            }
            Event::InitApply(o) | Event::Apply(o) => {
                let version = version_of(&o);
                if let Some(seen) = self.listed.as_mut() {
                    seen.insert((m.key)(&o));
                    self.listed_version = self.listed_version.max(version);
                }
                let mut read = (m.read)(&o);
                if let Ok(r) = read.as_mut() {
                    m.prepare_off_worker(r, snapshot);
                }
                let mut snap = lock();
                if self.listed.is_none() {
                    advance(&mut snap, m.stream, version, false);
                }
                match read {
                    Ok(rec) => (m.store)(&mut snap, rec),
                    Err(e) => {
                        drop(snap);
                        tracing::warn!(
                            kind = m.kind,
                            "{} not cached: {}",
                            (m.key)(&o),
                            e.to_string().escape_debug()
                        );
                    }
                }
            }
            Event::Delete(o) => {
                let removal = m.removal.map(|removal| {
                    let mut record = removal(&o);
                    if let Ok(r) = record.as_mut() {
                        m.prepare_off_worker(r, snapshot);
                    }
                    record
                });
                let mut snap = lock();
                match removal {
                    Some(Ok(record)) => (m.store)(&mut snap, record),
                    _ => (m.remove)(&mut snap, &(m.key)(&o)),
                }
                advance(&mut snap, m.stream, version_of(&o), false);
            }
            Event::InitDone => {
                // Whatever the relist did not return was deleted while we were away.
                let seen = self.listed.take().unwrap_or_default();
                let mut snap = lock();
                for k in (m.keys)(&snap, &|k| !seen.contains(k)) {
                    (m.remove)(&mut snap, &k);
                }
                match self.floor.take() {
                    Some(floor) => {
                        // A consistent list asked for after `floor` was read: it is at
                        // least that new, and newer than anything watched before it.
                        advance(&mut snap, m.stream, self.listed_version.max(floor), false)
                    }
                    None => advance(&mut snap, m.stream, self.listed_version, true),
                }
                return true;
            }
        }
        false
    }
}

async fn run<K, R>(
    api: Api<K>,
    config: watcher::Config,
    m: Mirror<K, R>,
    snapshot: Arc<Mutex<Snapshot>>,
    synced: Arc<Synced>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    run_relisting(api, config, m, snapshot, synced, None).await;
}

/// What a watcher needs to list again: whom to ask, its stream, and how to reach its
/// kind through a new client.
type RelistBy<K> = (Arc<Freshness>, Stream, fn(Client) -> Api<K>);

/// [`run`], listing again from a consistent read whenever `relist` asks.
async fn run_relisting<K, R>(
    api: Api<K>,
    config: watcher::Config,
    m: Mirror<K, R>,
    snapshot: Arc<Mutex<Snapshot>>,
    synced: Arc<Synced>,
    relist: Option<RelistBy<K>>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut api = api;
    let mut stream = watcher::watcher(api.clone(), config.clone())
        .default_backoff()
        .boxed();
    let kind = m.kind;
    let mut follower = Follower::new(m);
    let mut first = true;
    loop {
        let asked = async {
            match &relist {
                Some((f, s, _)) => f.relists(*s).asked().await,
                None => std::future::pending().await,
            }
        };
        let ev = tokio::select! {
            ev = stream.next() => ev,
            () = asked => {
                // A stalled watch's client may hold more stalled connections in its
                // pool, idle, each of which a read would wait on: the relist goes
                // through a client of its own. Watches have no read timeout (they
                // wait by design); a read that hangs anyway is dropped and the next
                // ask retries.
                let fresh = relist
                    .as_ref()
                    .and_then(|(f, _, reach)| f.new_client().map(reach))
                    .unwrap_or_else(|| api.clone());
                let read = tokio::time::timeout(PROBE_TIMEOUT, current_version(&fresh)).await;
                match read.unwrap_or_else(|_| Err("no answer within 5 s".to_string())) {
                    Ok(floor) => {
                        // The old stream (stalled, perhaps) is dropped with its watch.
                        api = fresh;
                        stream = watcher::watcher(
                            api.clone(),
                            config.clone().list_semantic(watcher::ListSemantic::MostRecent),
                        )
                        .default_backoff()
                        .boxed();
                        follower.floor = Some(floor);
                    }
                    Err(e) => tracing::warn!(kind, "not listing again: reading the current resourceVersion failed: {e}"),
                }
                continue;
            }
        };
        let Some(ev) = ev else { break };
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(kind, "watch failed, retrying with backoff: {e}");
                continue;
            }
        };
        if follower.apply(ev, &snapshot) && first {
            first = false;
            tracing::info!(kind, "cache synced");
            synced.mark();
        }
    }
}

/// How long a read of a collection's current resourceVersion may take.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The collection's current resourceVersion, from a consistent read of one object.
async fn current_version<K>(api: &Api<K>) -> Result<u64, String>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    served_version(api)
        .await?
        .ok_or_else(|| "the API server does not serve this collection".to_string())
}

/// [`current_version`], or `None` when the API server does not serve the collection
/// (404: ResourceClaims before Kubernetes 1.34, or DRA turned off).
async fn served_version<K>(api: &Api<K>) -> Result<Option<u64>, String>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let list = match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(list) => list,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    list.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or_else(|| "the list carried no numeric resourceVersion".to_string())
}

/// The fence read of this cluster: the pod, PodGroup and ResourceClaim collections'
/// resourceVersions (claims: 0 where they are not served, as the claims' progress
/// stays there).
pub fn probe(client: Client) -> Probe {
    let pods = Api::<PodParts>::all(client.clone());
    let groups = Api::<DynamicObject>::all_with(client.clone(), &podgroup_resource());
    let claims = Api::<DynamicObject>::all_with(client, &claim_resource());
    Arc::new(move || {
        let (pods, groups, claims) = (pods.clone(), groups.clone(), claims.clone());
        Box::pin(async move {
            Ok(Watermark {
                pods: current_version(&pods).await?,
                podgroups: current_version(&groups).await?,
                claims: served_version(&claims).await?.unwrap_or(0),
            })
        })
    })
}

fn claim_resource() -> kube::core::ApiResource {
    let (kind, plural) = super::dra::KINDS[3];
    super::dra::resource(kind, plural)
}

/// Starts the watchers; ledgers are read from `namespace` (`None`: no ledgers, for
/// read-only tools). Nodes sync first so pods see every card vendor prefix.
pub async fn start(
    client: Client,
    namespace: Option<String>,
    snapshot: Arc<Mutex<Snapshot>>,
    synced: Arc<Synced>,
    freshness: Option<Arc<Freshness>>,
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
                read: read_node,
                store: store_node,
                keys: |s, pick| cluster_keys(s.node_names(), pick),
                remove: |s, k| s.remove_node(&k.name),
                stream: None,
                prepare: None,
                removal: None,
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
        Some(ns) => {
            // A change of the queue tree now has every ledger read again before the
            // next charge (see `Committer`).
            snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .watch_ledgers();
            supervise(
                &synced,
                "ledger ConfigMap",
                run(
                    Api::<ConfigMap>::namespaced(client.clone(), &ns),
                    watcher::Config::default().labels(&selector()),
                    Mirror {
                        kind: "ledger ConfigMap",
                        read: read_ledger,
                        store: Snapshot::upsert_ledger,
                        keys: ledger_keys,
                        remove: remove_ledger,
                        stream: None,
                        prepare: None,
                        removal: None,
                        // Ledgers are kept by queue; the namespace is always card-quota's own.
                        key: |o| ObjectKey::new("", o.name_any()),
                    },
                    snapshot.clone(),
                    synced.clone(),
                ),
            )
        }
    }
    // Which queue a pod of Volcano's scheduler lands in may be its Namespace's.
    supervise(
        &synced,
        "Namespace",
        run(
            Api::<Namespace>::all(client.clone()),
            all(),
            Mirror {
                kind: "Namespace",
                read: |n: &Namespace| Ok(namespace_record(&n.metadata)?),
                store: |s, (name, queue)| s.set_namespace_queue(&name, queue),
                keys: |s, pick| cluster_keys(s.namespaces_naming_queues(), pick),
                remove: |s, k| s.set_namespace_queue(&k.name, None),
                stream: None,
                prepare: None,
                removal: None,
                key: |o| ObjectKey::new("", o.name_any()),
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "Queue",
        run(
            Api::<DynamicObject>::all_with(client.clone(), &queue_resource()),
            all(),
            Mirror {
                kind: "Queue",
                read: read_queue,
                store: Snapshot::remember_queue,
                keys: |s, pick| {
                    cluster_keys(s.queues().map(|q| q.name.to_string()).collect(), pick)
                },
                remove: |s, k| s.remove_queue(&QueueName::new(k.name.clone())),
                stream: None,
                prepare: None,
                removal: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    supervise(
        &synced,
        "PodGroup",
        run_relisting(
            Api::<DynamicObject>::all_with(client.clone(), &podgroup_resource()),
            all(),
            Mirror {
                kind: "PodGroup",
                read: read_group,
                store: store_group,
                keys: Snapshot::group_keys,
                remove: |s, k| s.delete_group(k),
                stream: Some(Stream::PodGroups),
                prepare: None,
                removal: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
            freshness.clone().map(|f| {
                let reach: fn(Client) -> Api<DynamicObject> =
                    |c| Api::all_with(c, &podgroup_resource());
                (f, Stream::PodGroups, reach)
            }),
        ),
    );
    supervise(
        &synced,
        "Pod",
        run_relisting(
            Api::<PodParts>::all(client.clone()),
            all(),
            pod_mirror(),
            snapshot.clone(),
            synced.clone(),
            freshness.clone().map(|f| {
                let reach: fn(Client) -> Api<PodParts> = Api::all;
                (f, Stream::Pods, reach)
            }),
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
                read: |o| read_workload(WorkloadKind::Deployment, o),
                store: store_workload,
                keys: |s, pick| s.workload_keys(WorkloadKind::Deployment, pick),
                remove: |s, k| s.remove_workload(WorkloadKind::Deployment, k),
                stream: None,
                prepare: None,
                removal: None,
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
                read: |o| read_workload(WorkloadKind::ReplicaSet, o),
                store: store_workload,
                keys: |s, pick| s.workload_keys(WorkloadKind::ReplicaSet, pick),
                remove: |s, k| s.remove_workload(WorkloadKind::ReplicaSet, k),
                stream: None,
                prepare: None,
                removal: None,
                key: key_of,
            },
            snapshot.clone(),
            synced.clone(),
        ),
    );
    // Volcano Jobs are read only to derive a PodGroup's demand, and a cluster may lack
    // their CRD: readiness does not wait for them (a PodGroup whose Job is not cached
    // yet gets its demand at its enqueue instead, which waits until the Job is seen).
    snapshot
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .mirror_jobs();
    tokio::spawn(run(
        Api::<DynamicObject>::all_with(client.clone(), &job_resource()),
        all(),
        Mirror {
            kind: "Job",
            read: read_job,
            store: store_job,
            keys: Snapshot::job_keys,
            remove: |s, k| s.remove_job(k),
            stream: None,
            prepare: None,
            removal: None,
            key: key_of,
        },
        snapshot.clone(),
        Arc::new(Synced::already()),
    ));
    // DRA objects: the devices drivers publish and the claims pods make. A cluster may
    // not serve them (before 1.34): nothing waits for them, not even the other watches.
    // (Decisions from a ledger whose watermark names a claims' version wait for the
    // claim cache instead: R2.)
    let (dra_client, dra_snapshot) = (client.clone(), snapshot.clone());
    tokio::spawn(async move {
        if !super::dra::serves_slices(&dra_client).await {
            return;
        }
        for (kind, plural) in super::dra::KINDS {
            let mirror = dra_mirror(kind);
            let relist = match (mirror.stream, &freshness) {
                (Some(stream), Some(f)) => {
                    let reach: fn(Client) -> Api<DynamicObject> =
                        |c| Api::all_with(c, &claim_resource());
                    Some((f.clone(), stream, reach))
                }
                _ => None,
            };
            tokio::spawn(run_relisting(
                Api::<DynamicObject>::all_with(
                    dra_client.clone(),
                    &super::dra::resource(kind, plural),
                ),
                watcher::Config::default(),
                mirror,
                dra_snapshot.clone(),
                Arc::new(Synced::already()),
                relist,
            ));
        }
    });
    supervise(
        &synced,
        "StatefulSet",
        run(
            Api::<StatefulSet>::all(client),
            all(),
            Mirror {
                kind: "StatefulSet",
                read: |o| read_workload(WorkloadKind::StatefulSet, o),
                store: store_workload,
                keys: |s, pick| s.workload_keys(WorkloadKind::StatefulSet, pick),
                remove: |s, k| s.remove_workload(WorkloadKind::StatefulSet, k),
                stream: None,
                prepare: None,
                removal: None,
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
    use serde_json::json;

    /// A watched object read before the lock and stored after is stored as the offline
    /// loader stores it, with the card resources of the snapshot it is stored in.
    #[test]
    fn objects_read_outside_the_lock_are_stored_as_the_loader_stores_them() {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "npu-1", "labels": {"example.com/npu.product": "X-NPU"}},
            "status": {"allocatable": {"example.com/npu": "8"}}});
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "resourceVersion": "7",
                "annotations": {"scheduling.volcano.sh/queue-name": "npu", "volcano.sh/card.name": "X-NPU"}},
            "spec": {"schedulerName": "volcano", "containers": [{"name": "c",
                "resources": {"limits": {"example.com/npu": "2", "nvidia.com/gpu": "1"}}}]}});
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"replicas": 3, "selector": {}, "template": pod.clone()}});
        let group = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ml", "annotations": {"volcano.sh/card.request": "{\"X-NPU\":2}"}},
            "spec": {"queue": "npu", "minMember": 1}});
        let queue = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "npu", "annotations": {"volcano.sh/card.quota": "{\"X-NPU\":4}"}}});
        let cards = CardResources::parse(&["nvidia.com/gpu", "example.com/npu"]).unwrap();
        let mut loaded = Snapshot::new();
        loaded.set_card_resources(cards.clone());
        for o in [&node, &queue, &group, &pod, &deployment] {
            crate::snapshot::load::upsert(&mut loaded, o).unwrap();
        }
        // The pod and the Deployment are read with the default card resources: their
        // npu request is not card demand until stored.
        let p = read_pod(&serde_json::from_value(pod).unwrap()).unwrap();
        let d = read_workload::<Deployment>(
            WorkloadKind::Deployment,
            &serde_json::from_value(deployment).unwrap(),
        )
        .unwrap();
        assert!(!p.demand.as_ref().unwrap().contains_key("example.com/npu"));
        let g = read_group(&serde_json::from_value(group).unwrap()).unwrap();
        let q = read_queue(&serde_json::from_value(queue).unwrap()).unwrap();
        let mut watched = Snapshot::new();
        watched.set_card_resources(cards);
        store_node(
            &mut watched,
            read_node(&serde_json::from_value(node).unwrap()).unwrap(),
        );
        Snapshot::remember_queue(&mut watched, q);
        store_group(&mut watched, g);
        store_pod(&mut watched, p);
        store_workload(&mut watched, d);
        // Arrival numbers differ with the order of arrival; everything else is equal.
        let pod_of = |s: &Snapshot| {
            let mut p = s.pod(&ObjectKey::new("ml", "p")).cloned();
            p.iter_mut().for_each(|p| p.seq = 0);
            p
        };
        let stored = pod_of(&watched).expect("the pod is stored as a card pod");
        assert_eq!(Some(&stored), pod_of(&loaded).as_ref());
        assert!(stored
            .demand
            .as_ref()
            .unwrap()
            .contains_key("example.com/npu"));
        let group_of = |s: &Snapshot| {
            let mut g = s.group(&ObjectKey::new("ml", "g")).cloned();
            g.iter_mut().for_each(|g| g.seq = 0);
            g
        };
        assert!(group_of(&watched).is_some());
        assert_eq!(group_of(&watched), group_of(&loaded));
        let workload_of = |s: &Snapshot| {
            let mut w = s
                .workload(WorkloadKind::Deployment, &ObjectKey::new("ml", "d"))
                .cloned();
            w.iter_mut().for_each(|w| w.template.seq = 0);
            w
        };
        assert!(workload_of(&watched).is_some());
        assert_eq!(workload_of(&watched), workload_of(&loaded));
        let name = QueueName::new("npu".to_string());
        assert_eq!(watched.queue(&name), loaded.queue(&name));
    }

    /// The slim pod type is watched at the same URLs as a whole Pod.
    #[test]
    fn pod_parts_are_read_where_pods_are() {
        for ns in [None, Some("ml")] {
            assert_eq!(PodParts::url_path(&(), ns), Pod::url_path(&(), ns));
        }
        assert_eq!(PodParts::api_version(&()), "v1");
        assert_eq!(PodParts::kind(&()), "Pod");
    }

    /// A relist deletes exactly what it did not return: card pods and pods without
    /// cards alike, and nothing it returned.
    #[test]
    fn a_relist_sweeps_out_the_pods_it_did_not_return() {
        // A "-0" pod requests no cards and names no model.
        let pod = |name: &str| -> PodParts {
            let (limits, annotations) = if name.ends_with("-0") {
                (json!({"cpu": "1"}), json!({}))
            } else {
                (
                    json!({"nvidia.com/gpu": "1"}),
                    json!({"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}),
                )
            };
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml", "resourceVersion": "9", "annotations": annotations},
                "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}))
            .unwrap()
        };
        let snapshot = Mutex::new(Snapshot::new());
        let mut f = Follower::new(pod_mirror());
        for name in ["kept", "gone", "kept-0", "gone-0"] {
            assert!(!f.apply(Event::Apply(pod(name)), &snapshot));
        }
        let held = |s: &Mutex<Snapshot>| {
            let mut k: Vec<String> = s
                .lock()
                .unwrap()
                .pod_keys()
                .iter()
                .map(|k| k.name.clone())
                .collect();
            k.sort();
            k
        };
        assert_eq!(held(&snapshot), ["gone", "gone-0", "kept", "kept-0"]);
        assert!(!f.apply(Event::Init, &snapshot));
        assert!(!f.apply(Event::InitApply(pod("kept")), &snapshot));
        assert!(!f.apply(Event::InitApply(pod("kept-0")), &snapshot));
        assert!(f.apply(Event::InitDone, &snapshot));
        assert_eq!(held(&snapshot), ["kept", "kept-0"]);
        let q = QueueName::new("q".to_string());
        let s = snapshot.lock().unwrap();
        assert_eq!(s.queue_pods(&q).count(), 1);
        assert!(s.is_known_cardless_pod(&ObjectKey::new("ml", "kept-0")));
    }

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
