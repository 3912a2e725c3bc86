//! Pods admitted at the same moment spread over the models of their queue: a replica's
//! `/mutate` counts the pins it chose whose `/validate` has not recorded them yet
//! (`snapshot::pins_in_flight`), through the live path (`handle_review`, the replica's
//! committer, ledger writes to an in-process API server with compare-and-swap).

mod support;

use support::fake_api::FakeApi;
use support::replica::live_state;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use card_quota::decide::review::ReviewBuilder as R;
use card_quota::live::{Committer, LedgerApi};
use card_quota::webhook::server::{handle_review, State};
use serde_json::{json, Value};

const OBJECTS: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: scheduling.volcano.sh/v1beta1, kind: Queue, metadata: {name: q, resourceVersion: "1", annotations: {volcano.sh/card.quota: '{"RTX-4090":1,"NVIDIA-H200":1}'}}, status: {state: Open}}
- {apiVersion: v1, kind: Node, metadata: {name: rtx-1, labels: {nvidia.com/gpu.product: RTX-4090}}, status: {allocatable: {nvidia.com/gpu: "4"}}}
- {apiVersion: v1, kind: Node, metadata: {name: h200-1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}, status: {allocatable: {nvidia.com/gpu: "4"}}}
"#;

fn replica(api: &FakeApi) -> Arc<State> {
    let committer = Committer::new(
        LedgerApi::new(api.client(), "card-quota"),
        Duration::from_secs(3),
    );
    live_state(OBJECTS, committer)
}

/// A plain GPU pod of a ReplicaSet as `/mutate` sees it: no name yet, no annotation.
fn made_from_template() -> Value {
    let mut p = support::pod("").queue("q").gpus("1").build();
    let meta = p["metadata"].as_object_mut().unwrap();
    meta.remove("name");
    meta.insert("generateName".into(), json!("web-"));
    p
}

async fn call(st: &State, review: &Value, mutate: bool) -> Value {
    let body = serde_json::to_vec(review).unwrap();
    let out = handle_review(st, &body, mutate).await.unwrap();
    serde_json::from_slice::<Value>(&out).unwrap()["response"].clone()
}

/// `/mutate`: the pod as patched, with its generated name, and the model it was pinned to.
async fn mutate(st: &State, n: usize) -> (Value, String) {
    let pod = made_from_template();
    let resp = call(
        st,
        &R::pod("CREATE", pod.clone()).uid(&format!("m{n}")).build(),
        true,
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = pod;
    json_patch::patch(&mut pod, &patch).unwrap();
    pod["metadata"]["name"] = json!(format!("web-{n}"));
    let pin = pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
        .as_str()
        .unwrap()
        .to_string();
    (pod, pin)
}

async fn validate(st: &State, pod: &Value, n: usize) -> Value {
    call(
        st,
        &R::pod("CREATE", pod.clone()).uid(&format!("v{n}")).build(),
        false,
    )
    .await
}

fn in_flight(st: &State) -> usize {
    st.snapshot.lock().unwrap().pins_in_flight().len()
}

/// Both `/mutate` calls before either `/validate`, as in a burst: without the first pin
/// in flight, the second is pinned to the RTX 4090 too and refused at `/validate`.
async fn two_pods_at_once(st: &State) -> (Value, Value) {
    let (a, pin_a) = mutate(st, 1).await;
    let (b, pin_b) = mutate(st, 2).await;
    assert_eq!(
        (pin_a.as_str(), pin_b.as_str()),
        ("RTX-4090", "NVIDIA-H200")
    );
    assert_eq!(in_flight(st), 2);
    // A dry run, admitted (pinned as without the pins in flight), remembers nothing.
    let dry = R::pod("CREATE", made_from_template())
        .uid("dry")
        .dry_run()
        .build();
    assert_eq!(call(st, &dry, true).await["allowed"], true);
    assert_eq!(in_flight(st), 2, "a dry run remembers nothing");
    (a, b)
}

#[tokio::test]
async fn pods_admitted_at_once_are_pinned_beside_each_other_and_all_fit() {
    let api = FakeApi::new();
    let st = replica(&api);
    let (a, b) = two_pods_at_once(&st).await;
    let ra = validate(&st, &a, 1).await;
    assert_eq!(ra["allowed"], true, "{ra}");
    assert_eq!(
        in_flight(&st),
        1,
        "a's pin is settled once its charge is recorded"
    );
    let rb = validate(&st, &b, 2).await;
    assert_eq!(rb["allowed"], true, "{rb}");
    assert_eq!(in_flight(&st), 0);
    // Both charges are in the ledger the API server holds.
    let ledger = api
        .object("/api/v1/namespaces/card-quota/configmaps/card-quota-ledger.q")
        .unwrap();
    let text = ledger["data"]["ledger"].as_str().unwrap();
    assert!(text.contains("web-1") && text.contains("web-2"), "{text}");
}

#[tokio::test]
async fn pins_in_flight_only_order_the_choice_never_refuse() {
    let api = FakeApi::new();
    let st = replica(&api);
    let (a, _) = mutate(&st, 1).await;
    let (b, _) = mutate(&st, 2).await;
    assert_eq!(validate(&st, &a, 1).await["allowed"], true);
    // The RTX 4090 is charged and the H200 is b's, in flight: no model has room beside
    // them, so c is pinned as without them (the H200, free until b's charge lands) and
    // admitted at `/mutate`, as it would be without pins in flight.
    let (c, pin_c) = mutate(&st, 3).await;
    assert_eq!(pin_c, "NVIDIA-H200");
    assert_eq!(validate(&st, &b, 2).await["allowed"], true);
    // Then c's own `/validate` refuses it: both cards are taken.
    let rc = validate(&st, &c, 3).await;
    assert_eq!(rc["allowed"], false, "{rc}");
    assert!(
        rc["status"]["message"]
            .as_str()
            .unwrap()
            .contains("insufficient NVIDIA-H200 quota"),
        "{rc}"
    );
    assert_eq!(in_flight(&st), 0, "a refusal settles the pin too");
}

/// Two replicas pin two pods to the last RTX 4090 at the same moment (neither knows the
/// other's pin): the second `/validate` is refused, and says that the H200 has room and
/// that the pod created again goes there. Created again, it does.
#[tokio::test]
async fn a_pod_refused_for_a_pin_another_replica_took_is_told_where_it_would_go() {
    let api = FakeApi::new();
    let (r1, r2) = (replica(&api), replica(&api));
    let (a, pin_a) = mutate(&r1, 1).await;
    let (b, pin_b) = mutate(&r2, 2).await;
    assert_eq!((pin_a.as_str(), pin_b.as_str()), ("RTX-4090", "RTX-4090"));
    assert_eq!(validate(&r1, &a, 1).await["allowed"], true);
    let rb = validate(&r2, &b, 2).await;
    assert_eq!(rb["allowed"], false, "{rb}");
    let msg = rb["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("queue q has insufficient RTX-4090 quota: requested 1, in use 1")
            && msg.ends_with("; card-quota pinned this pod to RTX-4090 as it was created, and pods admitted at the same moment took that room: NVIDIA-H200 has room for it, and the pod created again is pinned there"),
        "{msg}"
    );
    let (again, pin) = mutate(&r2, 3).await;
    assert_eq!(pin, "NVIDIA-H200");
    assert_eq!(validate(&r2, &again, 3).await["allowed"], true);
}

/// `serve --offline` keeps pins in flight as a live replica does: its `/mutate` records
/// a named pod at once, but a pod of a ReplicaSet has no name yet and is recorded only
/// at `/validate`, so a burst of them was pinned to one model and refused there.
#[tokio::test]
async fn an_offline_server_pins_a_burst_beside_each_other_too() {
    let (snap, skipped) = card_quota::snapshot::load::load(OBJECTS).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let st = State::new(snap, card_quota::decide::Config::default());
    let (a, b) = two_pods_at_once(&st).await;
    for (pod, n) in [(&a, 1), (&b, 2)] {
        let r = validate(&st, pod, n).await;
        assert_eq!(r["allowed"], true, "{r}");
    }
    assert_eq!(in_flight(&st), 0, "each validate settles its pin");
    // Both are recorded: a third finds no room on either model.
    let c = R::pod("CREATE", made_from_template()).uid("m3").build();
    let rc = call(&st, &c, true).await;
    assert_eq!(rc["allowed"], false, "{rc}");
    assert_eq!(in_flight(&st), 0, "a refused pod pins nothing");
}

/// Pins in flight count as many times as there are pods (they are laid as counted
/// demands, one per model and size), and under a group cap too: a queue of two RTX 4090,
/// two H200 and three of either (`"*":3`) spreads four pods made at once RTX, RTX, H200,
/// and the fourth, with no room beside the three, is pinned as without them.
#[tokio::test]
async fn pins_in_flight_count_each_pod_and_the_group_cap() {
    let (rtx, h200) = ("RTX-4090", "NVIDIA-H200");
    for (quota, want) in [
        (
            r#"{"RTX-4090":2,"NVIDIA-H200":2}"#,
            [rtx, rtx, h200, h200, rtx],
        ),
        (
            r#"{"RTX-4090":2,"NVIDIA-H200":2,"*":3}"#,
            [rtx, rtx, h200, rtx, rtx],
        ),
    ] {
        let objects = OBJECTS.replace(r#"{"RTX-4090":1,"NVIDIA-H200":1}"#, quota);
        let (snap, skipped) = card_quota::snapshot::load::load(&objects).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        let st = State::new(snap, card_quota::decide::Config::default());
        let mut pins = Vec::new();
        for n in 1..=want.len() {
            pins.push(mutate(&st, n).await.1);
        }
        assert_eq!(pins, want, "quota {quota}");
    }
}
