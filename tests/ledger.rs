//! The consistency ledger against a mock API server: scripted (tower-test) for
//! conflicts, a full ledger and an API outage; an in-process fake with real
//! compare-and-swap semantics for races between replicas.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use card_quota::cluster::load::load;
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::decide::Config;
use card_quota::live::caches::Synced;
use card_quota::live::QueueApi;
use card_quota::webhook::server::{handle_review, Live, State};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{json, Value};

const QUEUE_PATH: &str = "/apis/scheduling.volcano.sh/v1beta1/queues/q";

fn objects(quota: u64, pods: usize, ledger: Option<&str>) -> String {
    let mut anns = format!(r#"volcano.sh/card.quota: '{{"RTX-4090":{quota}}}'"#);
    if let Some(l) = ledger {
        anns.push_str(&format!(", volcano.sh/card.ledger: '{l}'"));
    }
    let mut s = format!(
        r#"
apiVersion: v1
kind: Node
metadata: {{name: rtx-1, labels: {{nvidia.com/gpu.product: RTX-4090}}}}
status: {{allocatable: {{nvidia.com/gpu: "1000"}}}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {{name: q, resourceVersion: "1", annotations: {{{anns}}}}}
status: {{state: Open}}
"#
    );
    for i in 0..pods {
        s.push_str(&format!(
            r#"---
apiVersion: v1
kind: Pod
metadata: {{name: p{i:03}, namespace: ml, annotations: {{scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: RTX-4090}}}}
spec: {{schedulerName: volcano, containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: "1"}}}}}}]}}
"#
        ));
    }
    s
}

fn queue_json(quota: u64, rv: u64, ledger: Option<&str>) -> Value {
    let mut anns = json!({"volcano.sh/card.quota": format!(r#"{{"RTX-4090":{quota}}}"#)});
    if let Some(l) = ledger {
        anns["volcano.sh/card.ledger"] = json!(l);
    }
    json!({
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "q", "resourceVersion": rv.to_string(), "annotations": anns},
        "spec": {"weight": 1},
        "status": {"state": "Open"}
    })
}

fn state(text: &str, client: kube::Client, budget: Duration) -> Arc<State> {
    let (snap, skipped) = load(text).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    Arc::new(State::live(
        Arc::new(Mutex::new(snap)),
        Config::default(),
        Live {
            queues: QueueApi::new(client),
            budget,
            synced: Arc::new(Synced::already()),
            events: None,
            locks: Default::default(),
        },
    ))
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

async fn answer(st: &State, review: Value, mutate: bool) -> Value {
    let body = serde_json::to_vec(&review).unwrap();
    let out = handle_review(st, &body, mutate).await.unwrap();
    serde_json::from_slice::<Value>(&out).unwrap()["response"].clone()
}

fn bind(i: usize) -> Value {
    R::binding("ml", &format!("p{i:03}"), "rtx-1")
        .uid(&format!("u{i}"))
        .build()
}

async fn body_json(req: Request<Body>) -> Value {
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

// ---- scripted API (tower-test) ----------------------------------------------------

#[tokio::test]
async fn a_conflict_makes_the_webhook_read_the_queue_again_and_decide_again() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let st = state(&objects(1, 2, None), client, Duration::from_secs(3));
    let api = tokio::spawn(async move {
        // 1. Our write, based on resourceVersion 1, loses to another replica.
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), "PATCH");
        assert_eq!(req.uri().path(), QUEUE_PATH);
        let patch = body_json(req).await;
        assert_eq!(patch["metadata"]["resourceVersion"], "1");
        assert!(patch["metadata"]["annotations"]["volcano.sh/card.ledger"]
            .as_str()
            .unwrap()
            .contains("pod:ml/p001"));
        send.send_response(json_response(
            StatusCode::CONFLICT,
            &status(409, "Conflict", "the object has been modified"),
        ));
        // 2. The re-read shows the other replica's charge of the last card.
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), "GET");
        assert_eq!(req.uri().path(), QUEUE_PATH);
        let now = jiff::Timestamp::now().as_second();
        let other = format!(
            r#"{{"pod:ml/p000":{{"at":{now},"resources":{{"nvidia.com/gpu":1}},"card":"RTX-4090","charged":"RTX-4090","node":"rtx-1"}}}}"#
        );
        send.send_response(json_response(
            StatusCode::OK,
            &queue_json(1, 2, Some(&other)),
        ));
        // 3. Nothing else: a denial is not written.
        tokio::time::timeout(Duration::from_millis(300), handle.next_request())
            .await
            .ok()
            .flatten()
            .map(|(r, _)| format!("{} {}", r.method(), r.uri()))
    });
    let resp = answer(&st, bind(1), false).await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        "queue q has insufficient RTX-4090 quota: requested 1, in use 2 (allocated 1, pending 1, reserved 0), quota 1"
    );
    assert_eq!(api.await.unwrap(), None, "no request after the denial");
}

#[tokio::test]
async fn a_full_ledger_refuses_with_try_again_and_writes_nothing() {
    let now = jiff::Timestamp::now().as_second();
    let entries: Vec<String> = (0..512)
        .map(|i| {
            format!(
                r#""pod:other/x{i}":{{"at":{now},"resources":{{"nvidia.com/gpu":1}},"card":"RTX-4090"}}"#
            )
        })
        .collect();
    let ledger = format!("{{{}}}", entries.join(","));
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let st = state(
        &objects(10_000, 1, Some(&ledger)),
        client,
        Duration::from_secs(3),
    );
    let resp = answer(&st, bind(0), false).await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        "queue q's ledger holds 512 charges that caches do not show yet; try again in a few seconds"
    );
    let next = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
    assert!(
        matches!(next, Err(_) | Ok(None)),
        "no write may be attempted"
    );
    assert!(st
        .metrics
        .encode()
        .contains(r#"card_quota_ledger_writes_total{result="full"} 1"#));
}

#[tokio::test]
async fn when_the_api_server_is_down_the_charge_is_refused_within_its_budget() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let st = state(&objects(5, 1, None), client, Duration::from_millis(600));
    let calls = Arc::new(Mutex::new(0usize));
    let c2 = calls.clone();
    tokio::spawn(async move {
        while let Some((_, send)) = handle.next_request().await {
            *c2.lock().unwrap() += 1;
            send.send_response(json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &status(503, "ServiceUnavailable", "etcd is down"),
            ));
        }
    });
    let t = Instant::now();
    let resp = answer(&st, bind(0), false).await;
    let took = t.elapsed();
    assert_eq!(resp["allowed"], false, "{resp}");
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("card-quota could not record this charge on queue q within 0.6s (")
            && msg.ends_with("; try again"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    assert!(*calls.lock().unwrap() >= 2, "retried before giving up");
}

#[tokio::test]
async fn dry_runs_and_mutate_calls_are_decided_but_write_nothing() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let st = state(&objects(5, 1, None), client, Duration::from_secs(3));
    let dry = R::binding("ml", "p000", "rtx-1").uid("d").dry_run().build();
    assert_eq!(answer(&st, dry, false).await["allowed"], true);
    assert_eq!(answer(&st, bind(0), true).await["allowed"], true);
    let next = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
    assert!(matches!(next, Err(_) | Ok(None)), "nothing may be written");
}

// ---- a fake API server with compare-and-swap ----------------------------------------

/// One Queue behind GET and merge-PATCH with the API server's resourceVersion check.
#[derive(Clone)]
struct FakeApi {
    queue: Arc<Mutex<(Value, u64)>>,
    conflicts: Arc<Mutex<usize>>,
}

impl FakeApi {
    fn new(queue: Value) -> Self {
        Self {
            queue: Arc::new(Mutex::new((queue, 1))),
            conflicts: Arc::new(Mutex::new(0)),
        }
    }

    async fn handle(self, req: Request<Body>) -> Response<Body> {
        assert_eq!(req.uri().path(), QUEUE_PATH, "unexpected {}", req.uri());
        let method = req.method().clone();
        // Let other requests interleave, as a real server would.
        tokio::time::sleep(Duration::from_micros(200)).await;
        if method == "GET" {
            let q = self.queue.lock().unwrap().0.clone();
            return json_response(StatusCode::OK, &q);
        }
        assert_eq!(method, "PATCH");
        let patch = body_json(req).await;
        let mut g = self.queue.lock().unwrap();
        let rv = g.1;
        if patch["metadata"]["resourceVersion"] != json!(rv.to_string()) {
            *self.conflicts.lock().unwrap() += 1;
            return json_response(
                StatusCode::CONFLICT,
                &status(409, "Conflict", "the object has been modified"),
            );
        }
        if let Some(anns) = patch["metadata"]["annotations"].as_object() {
            for (k, v) in anns {
                g.0["metadata"]["annotations"][k] = v.clone();
            }
        }
        g.1 += 1;
        g.0["metadata"]["resourceVersion"] = json!(g.1.to_string());
        json_response(StatusCode::OK, &g.0)
    }

    fn client(&self) -> kube::Client {
        let me = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let me = me.clone();
            async move { Ok::<_, Infallible>(me.handle(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    fn ledger_len(&self) -> usize {
        let g = self.queue.lock().unwrap();
        g.0["metadata"]["annotations"]["volcano.sh/card.ledger"]
            .as_str()
            .map(|l| {
                serde_json::from_str::<serde_json::Map<String, Value>>(l)
                    .unwrap()
                    .len()
            })
            .unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_requests_racing_for_the_last_card_on_two_replicas_admit_exactly_one() {
    for round in 0..10 {
        let api = FakeApi::new(queue_json(1, 1, None));
        let a = state(&objects(1, 0, None), api.client(), Duration::from_secs(10));
        let b = state(&objects(1, 0, None), api.client(), Duration::from_secs(10));
        let pod = |n: &str| {
            R::pod(
                "CREATE",
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": n, "namespace": "ml",
                        "annotations": {"scheduling.volcano.sh/queue-name": "q", "volcano.sh/card.name": "RTX-4090"}},
                    "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
            )
            .uid(n)
            .build()
        };
        let (ra, rb) = tokio::join!(
            answer(&a, pod("first"), false),
            answer(&b, pod("second"), false)
        );
        let admitted = [&ra, &rb].iter().filter(|r| r["allowed"] == true).count();
        assert_eq!(admitted, 1, "round {round}: {ra} / {rb}");
        assert_eq!(api.ledger_len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_admit_exactly_ten_of_200_concurrent_binds_for_ten_free_cards() {
    let api = FakeApi::new(queue_json(10, 1, None));
    let text = objects(10, 200, None);
    let replicas = [
        state(&text, api.client(), Duration::from_secs(30)),
        state(&text, api.client(), Duration::from_secs(30)),
    ];
    let t = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let st = replicas[i % 2].clone();
        tasks.push(tokio::spawn(
            async move { answer(&st, bind(i), false).await },
        ));
    }
    let mut admitted = 0;
    let mut retry = 0;
    for t in tasks {
        let r = t.await.unwrap();
        if r["allowed"] == true {
            admitted += 1;
        } else if r["status"]["reason"] == "TryAgain" {
            retry += 1;
        } else {
            assert!(
                r["status"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("queue q has insufficient RTX-4090 quota: requested 1, in use"),
                "{r}"
            );
        }
    }
    eprintln!(
        "200 binds on 2 replicas: {admitted} admitted, {retry} try-again, {} conflicts, {:?}",
        api.conflicts.lock().unwrap(),
        t.elapsed()
    );
    assert_eq!(admitted, 10);
    assert_eq!(api.ledger_len(), 10);
}
