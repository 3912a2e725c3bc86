//! The reconciler against a scripted API server (tower-test): what it writes, with
//! which field manager, and when it must write nothing.

mod support;

use support::fake_api::{FakeApi, Seen};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use card_quota::controller::events::EventSink;
use card_quota::controller::reconciler::Reconciler;
use card_quota::live::{Committer, LedgerApi};
use card_quota::snapshot::load::load;
use card_quota::webhook::metrics::Metrics;
use serde_json::{json, Value};

const OBJECTS: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: h1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: good, uid: u-good, resourceVersion: "7", annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":3}'}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: bad, uid: u-bad, resourceVersion: "3", annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":"3"}'}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ml, uid: uid-a, resourceVersion: "41", annotations: {scheduling.volcano.sh/queue-name: good, volcano.sh/card.charged: NVIDIA-H200}}
spec: {nodeName: h1, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "2"}}}]}
"#;

/// A fake API server holding the Queues and ledger ConfigMaps of `objects`.
fn api(objects: &str) -> (kube::Client, FakeApi) {
    let api = FakeApi::new();
    api.seed_objects(objects);
    (api.client(), api)
}

type Harness = (
    Reconciler,
    FakeApi,
    Arc<Metrics>,
    tokio::sync::watch::Sender<bool>,
    Arc<Mutex<card_quota::snapshot::Snapshot>>,
);

fn reconciler(text: &str, leader: bool) -> Harness {
    let (client, seen) = api(text);
    let (snap, skipped) = load(text).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::watch::channel(leader);
    let events = Arc::new(EventSink::new(client.clone(), Some("test".into())));
    let snap = Arc::new(Mutex::new(snap));
    let committer = Arc::new(Committer::new(
        LedgerApi::new(client.clone(), "card-quota"),
        Duration::from_secs(3),
    ));
    let r = Reconciler::new(
        client,
        snap.clone(),
        events,
        (metrics.reconciler.clone(), metrics.ledger.clone()),
        rx,
        committer,
    );
    (r, seen, metrics, tx, snap)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn usage_is_server_side_applied_with_only_our_annotation_and_not_rewritten_when_unchanged() {
    let (mut r, seen, _, _tx, _) = reconciler(OBJECTS, true);
    let first = r.pass(true).await;
    settle().await;
    let log = seen.seen().clone();
    let applies: Vec<&Seen> = log
        .iter()
        .filter(|s| s.method == "PATCH" && s.uri.starts_with("/apis/scheduling"))
        .collect();
    assert_eq!(applies.len(), 1, "{log:#?}");
    let a = applies[0];
    assert!(
        a.uri
            .starts_with("/apis/scheduling.volcano.sh/v1beta1/queues/good?"),
        "{}",
        a.uri
    );
    assert!(a.uri.contains("fieldManager=card-quota"), "{}", a.uri);
    assert!(a.uri.contains("force=true"), "{}", a.uri);
    assert_eq!(a.content_type, "application/apply-patch+yaml");
    // Only our annotation: no spec, no status, no other annotation.
    let mut body = a.body.clone();
    let usage = body["metadata"]["annotations"]["volcano.sh/card.usage"]
        .as_str()
        .unwrap()
        .to_string();
    body["metadata"]["annotations"]["volcano.sh/card.usage"] = json!("<usage>");
    assert_eq!(
        body,
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
               "metadata": {"name": "good", "annotations": {"volcano.sh/card.usage": "<usage>"}}})
    );
    let usage: Value = serde_json::from_str(&usage).unwrap();
    assert_eq!(
        usage["NVIDIA-H200"],
        json!({"quota": 3, "allocated": 2, "pending": 0, "reserved": 0})
    );
    assert!(usage["observedAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(first.usage_written, 1);

    // A second full recount finds nothing to change and writes nothing.
    let before = seen.seen().len();
    let second = r.pass(true).await;
    settle().await;
    assert_eq!(second.usage_written, 0);
    let after = seen.seen().clone();
    assert_eq!(after.len(), before, "{:#?}", &after[before..]);
}

#[tokio::test]
async fn a_broken_quota_gets_one_event_and_the_other_queues_are_still_written() {
    let (mut r, seen, _, _tx, _) = reconciler(OBJECTS, true);
    r.pass(true).await;
    r.pass(true).await;
    settle().await;
    let log = seen.seen().clone();
    let events: Vec<&Seen> = log
        .iter()
        .filter(|s| s.method == "POST" && s.uri.contains("/apis/events.k8s.io/v1/"))
        .collect();
    assert_eq!(events.len(), 1, "deduplicated across passes: {log:#?}");
    let e = &events[0].body;
    assert_eq!(e["reason"], "InvalidCardQuota");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["regarding"]["kind"], "Queue");
    assert_eq!(e["regarding"]["name"], "bad");
    assert_eq!(e["regarding"]["uid"], "u-bad");
    assert_eq!(e["reportingController"], "card-quota");
    assert!(e["note"]
        .as_str()
        .unwrap()
        .starts_with("invalid volcano.sh/card.quota on queue bad: "));
    assert!(log
        .iter()
        .any(|s| s.method == "PATCH" && s.uri.contains("/queues/good?")));
}

#[tokio::test]
async fn a_queue_over_its_quota_raises_card_quota_exceeded_once() {
    let text = OBJECTS.replace(r#"'{"NVIDIA-H200":3}'"#, r#"'{"NVIDIA-H200":1}'"#);
    let (mut r, seen, _, _tx, _) = reconciler(&text, true);
    r.pass(true).await;
    r.pass(true).await;
    settle().await;
    let log = seen.seen().clone();
    let exceeded: Vec<&Value> = log
        .iter()
        .filter(|s| s.method == "POST")
        .map(|s| &s.body)
        .filter(|b| b["reason"] == "CardQuotaExceeded")
        .collect();
    assert_eq!(exceeded.len(), 1, "{log:#?}");
    assert_eq!(
        exceeded[0]["note"],
        "queue good is over its card quota: NVIDIA-H200 allocated 2 > quota 1"
    );
}

/// Issue 59: a queue in deny under an install in warn (its webhooks fail open) is told
/// once, by an Event on the Queue beside the metric; under a deny install it is not.
#[tokio::test]
async fn a_queue_in_deny_under_a_fail_open_install_gets_one_event() {
    let text = OBJECTS.replace(
        "annotations: {volcano.sh/card.quota: '{\"NVIDIA-H200\":3}'}",
        "annotations: {volcano.sh/card.quota: '{\"NVIDIA-H200\":3}', volcano.sh/card.enforcement: deny}",
    );
    assert_ne!(text, OBJECTS);
    for fail_open in [true, false] {
        let (r, seen, metrics, _tx, _) = reconciler(&text, true);
        let mut r = r.with_fail_open(fail_open);
        r.pass(true).await;
        r.pass(true).await;
        settle().await;
        let told: Vec<Value> = seen
            .seen()
            .iter()
            .filter(|s| s.method == "POST" && s.body["reason"] == "CardQuotaDenyFailsOpen")
            .map(|s| s.body.clone())
            .collect();
        if !fail_open {
            assert!(told.is_empty(), "{told:#?}");
            continue;
        }
        assert_eq!(told.len(), 1, "deduplicated across passes: {told:#?}");
        assert_eq!(told[0]["regarding"]["name"], "good");
        assert_eq!(told[0]["type"], "Warning");
        assert!(told[0]["note"]
            .as_str()
            .unwrap()
            .starts_with("queue good is in deny, but card-quota is installed in warn"));
        assert!(metrics
            .encode()
            .contains(r#"card_quota_queue_deny_fail_open{queue_name="good"} 1"#));
    }
}

/// OBJECTS plus the ledger ConfigMap of `queue`.
fn with_ledger(queue: &str, rv: &str, ledger: &str) -> String {
    format!(
        r#"{OBJECTS}---
apiVersion: v1
kind: ConfigMap
metadata: {{name: card-quota-ledger.{queue}, namespace: card-quota, resourceVersion: "{rv}",
  labels: {{app.kubernetes.io/name: card-quota, app.kubernetes.io/component: ledger}}}}
data: {{queue: {queue}, ledger: '{ledger}'}}
"#
    )
}

#[tokio::test]
async fn ledger_entries_the_cache_shows_are_pruned_with_a_compare_and_swap_write() {
    let ledger = r#"{"entries":{"uid-a":{"of":"pod:ml/a","resources":{"nvidia.com/gpu":2},"card":"NVIDIA-H200","charged":"NVIDIA-H200","node":"h1"},"uid-fresh":{"of":"pod:ml/fresh","resources":{"nvidia.com/gpu":1},"card":"NVIDIA-H200"}}}"#;
    let text = with_ledger("good", "9", ledger);
    let (mut r, seen, metrics, _tx, _) = reconciler(&text, true);
    let p = r.pass(true).await;
    settle().await;
    assert_eq!(p.ledger_entries_pruned, 1);
    let log = seen.seen().clone();
    let cas: Vec<&Seen> = log.iter().filter(|s| s.method == "PUT").collect();
    assert_eq!(cas.len(), 1, "{log:#?}");
    assert!(cas[0]
        .uri
        .starts_with("/api/v1/namespaces/card-quota/configmaps/card-quota-ledger.good"));
    assert_eq!(cas[0].body["metadata"]["resourceVersion"], "9");
    let written: Value =
        serde_json::from_str(cas[0].body["data"]["ledger"].as_str().unwrap()).unwrap();
    let keys: Vec<&String> = written["entries"].as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["uid-fresh"]);
    // Pod a was pruned because the cache showed it at resourceVersion 41: replicas
    // decide from this ledger only once their caches have come that far.
    assert_eq!(written["watermark"]["pods"], 41);
    assert!(metrics
        .encode()
        .contains("card_quota_ledger_pruned_entries_total 1"));
    // No Queue was written for the ledger.
    assert!(log
        .iter()
        .filter(|s| s.uri.contains("/queues/"))
        .all(|s| s.body["metadata"]["annotations"]
            .as_object()
            .is_some_and(|a| a.keys().all(|k| k == "volcano.sh/card.usage"))));
}

#[tokio::test]
async fn the_empty_ledger_of_a_deleted_queue_is_deleted() {
    let text = with_ledger("gone", "12", r#"{"entries":{}}"#);
    let (mut r, seen, _, _tx, _) = reconciler(&text, true);
    r.pass(true).await;
    settle().await;
    let log = seen.seen().clone();
    let deletes: Vec<&Seen> = log.iter().filter(|s| s.method == "DELETE").collect();
    assert_eq!(deletes.len(), 1, "{log:#?}");
    assert!(deletes[0]
        .uri
        .starts_with("/api/v1/namespaces/card-quota/configmaps/card-quota-ledger.gone"));
    assert_eq!(deletes[0].body["preconditions"]["resourceVersion"], "12");
}

#[tokio::test]
async fn a_replica_without_the_lease_writes_nothing_but_still_exports_gauges() {
    let (mut r, seen, metrics, tx, snap) = reconciler(OBJECTS, false);
    let p = r.pass(true).await;
    settle().await;
    assert!(!p.leader);
    assert!(seen.seen().is_empty());
    let text = metrics.encode();
    assert!(
        text.contains(
            r#"volcano_queue_card_allocated{queue_name="good",card_name="NVIDIA-H200"} 2"#
        ),
        "{text}"
    );
    assert!(text
        .contains(r#"volcano_queue_card_capacity{queue_name="good",card_name="NVIDIA-H200"} 3"#));
    // Gaining the Lease starts the writes; losing it stops them again.
    tx.send(true).unwrap();
    assert_eq!(r.pass(true).await.usage_written, 1);
    tx.send(false).unwrap();
    let before = seen.seen().len();
    // The pod goes away: usage changes, but a replica without the Lease stays silent.
    snap.lock()
        .unwrap()
        .remove_pod(&card_quota::cards::ObjectKey::new("ml", "a"));
    r.pass(true).await;
    settle().await;
    assert_eq!(seen.seen().len(), before);
    assert!(metrics
        .encode()
        .contains(r#"volcano_queue_card_allocated{queue_name="good",card_name="NVIDIA-H200"} 0"#));
}

#[tokio::test]
async fn gauges_of_a_deleted_queue_are_removed() {
    let (mut r, _seen, metrics, _tx, snap) = reconciler(OBJECTS, false);
    r.pass(true).await;
    assert!(metrics.encode().contains(r#"queue_name="good""#));
    {
        let mut s = snap.lock().unwrap();
        s.remove_pod(&card_quota::cards::ObjectKey::new("ml", "a"));
        s.remove_queue(&card_quota::cards::QueueName::new("good"));
    }
    r.pass(false).await;
    let text = metrics.encode();
    assert!(!text.contains(r#"queue_name="good""#), "{text}");
}

#[tokio::test]
async fn a_queue_whose_usage_keeps_changing_is_written_at_most_once_a_second() {
    let (mut r, seen, _, _tx, snap) = reconciler(OBJECTS, true);
    let applies = |seen: &FakeApi| {
        seen.seen()
            .iter()
            .filter(|s| s.method == "PATCH" && s.uri.contains("/queues/good?"))
            .count()
    };
    r.pass(true).await;
    settle().await;
    assert_eq!(applies(&seen), 1);
    // A burst: a new pending pod arrives before every pass.
    for i in 0..5 {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("burst-{i}"), "namespace": "ml",
                "annotations": {"scheduling.volcano.sh/queue-name": "good", "volcano.sh/card.name": "NVIDIA-H200"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        card_quota::snapshot::load::upsert(&mut snap.lock().unwrap(), &pod).unwrap();
        r.pass(false).await;
    }
    settle().await;
    assert_eq!(applies(&seen), 1, "usage changed 5 times within a second");
    // The last change is not lost: once the second is over, it is written.
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let p = r.pass(false).await;
    settle().await;
    assert_eq!(p.usage_written, 1);
    assert_eq!(applies(&seen), 2);
    let last = seen
        .seen()
        .iter()
        .rev()
        .find(|s| s.method == "PATCH" && s.uri.contains("/queues/good?"))
        .cloned()
        .unwrap();
    let usage: Value = serde_json::from_str(
        last.body["metadata"]["annotations"]["volcano.sh/card.usage"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(usage["NVIDIA-H200"]["pending"], 5);
}

#[tokio::test]
async fn a_replica_whose_lease_has_expired_stops_writing_though_the_manager_says_leader() {
    use card_quota::live::leadership::LeaseCheck;
    let (client, seen) = api(OBJECTS);
    const LEASE: &str =
        "/apis/coordination.k8s.io/v1/namespaces/card-quota/leases/card-quota-reconciler";
    let (snap, _) = load(OBJECTS).unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(true);
    let committer = Arc::new(Committer::new(
        LedgerApi::new(client.clone(), "card-quota"),
        Duration::from_secs(3),
    ));
    let mut r = Reconciler::new(
        client.clone(),
        Arc::new(Mutex::new(snap)),
        Arc::new(EventSink::new(client.clone(), Some("me".into()))),
        {
            let m = Metrics::default();
            (m.reconciler, m.ledger)
        },
        rx,
        committer,
    )
    .with_lease_check(LeaseCheck::new(
        client,
        "card-quota",
        "card-quota-reconciler",
        "me",
    ));
    let doc = |holder: &str, renewed: jiff::Timestamp| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "card-quota-reconciler", "namespace": "card-quota"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}})
    };
    let now = jiff::Timestamp::now();
    let patches = |seen: &FakeApi| seen.seen().iter().filter(|s| s.method == "PATCH").count();
    // Renewed 16 s ago with a 15 s duration: expired, whatever the manager believes.
    seen.seed(doc("me", now - jiff::SignedDuration::from_secs(16)));
    let p = r.pass(true).await;
    assert!(!p.leader);
    assert_eq!(patches(&seen), 0);
    // Another holder: still nothing.
    seen.seed(doc("other", now));
    assert!(!r.pass(true).await.leader);
    assert_eq!(patches(&seen), 0);
    // No Lease readable: nothing.
    seen.remove(LEASE);
    assert!(!r.pass(true).await.leader);
    // Renewed a moment ago by this replica: it writes.
    seen.seed(doc("me", now));
    let p = r.pass(true).await;
    assert!(p.leader);
    assert_eq!(p.usage_written, 1);
}

/// Issue 32 #4: a card pod without `card.queue` (from before the install) is stamped with
/// the queue it is counted in, once, against the version it was read at.
#[tokio::test]
async fn a_card_pod_without_a_queue_stamp_is_stamped_with_the_queue_it_is_counted_in() {
    let (mut r, seen, _, _tx, _) = reconciler(OBJECTS, true);
    let pass = r.pass(true).await;
    settle().await;
    assert_eq!(pass.stamped, 1, "{pass:?}");
    let log = seen.seen().clone();
    let stamps: Vec<&Seen> = log
        .iter()
        .filter(|s| s.method == "PATCH" && s.uri.starts_with("/api/v1/namespaces/ml/pods/a"))
        .collect();
    assert_eq!(stamps.len(), 1, "{log:#?}");
    assert_eq!(stamps[0].content_type, "application/merge-patch+json");
    assert_eq!(
        stamps[0].body,
        json!({"metadata": {"resourceVersion": "41", "annotations": {"volcano.sh/card.queue": "good"}}})
    );
    assert_eq!(
        seen.object("/api/v1/namespaces/ml/pods/a").unwrap()["metadata"]["annotations"]
            ["volcano.sh/card.queue"],
        "good"
    );
    // A pod changed since the cache read it is left for a later pass (409, no error).
    let (mut r, seen, _, _tx, _) = reconciler(OBJECTS, true);
    let mut newer = seen.object("/api/v1/namespaces/ml/pods/a").unwrap();
    newer["metadata"]["resourceVersion"] = json!("99");
    seen.seed(newer);
    let pass = r.pass(true).await;
    assert_eq!((pass.stamped, pass.errors), (0, 0), "{pass:?}");
}
