//! The burst benchmark's floor: an HTTPS admission webhook that decides nothing and
//! records nothing. `/validate` allows; `/mutate` allows and, for a Pod CREATE, answers
//! with the patch the contract makes card-quota return for an admitted card pod (the
//! `card.queue` stamp, the `card.pinned` reason and the model's nodeSelector). What
//! the API server spends on this webhook is the least any implementation of the
//! contract costs it per pod; card-quota's own cost is what it adds on top.
//!
//!   cargo run --release --example floor_webhook -- --cert-dir DIR --listen 127.0.0.1:19600
//!
//! `--watch-pods` (a diagnostic, not the floor the burst compares with by default) also
//! watches every pod of the cluster (`$KUBECONFIG`) and keeps each one's record, as
//! card-quota's own watcher reads them, deciding nothing with them: what knowing the
//! cluster's usage costs any implementation, apart from deciding and recording.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use card_quota::webhook::tls;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Directory with tls.crt and tls.key (as written by `card-quota certs`).
    #[arg(long)]
    cert_dir: PathBuf,
    #[arg(long)]
    listen: SocketAddr,
    /// The node label a model is discovered from.
    #[arg(long, default_value = "nvidia.com/gpu.product")]
    product_label: String,
    /// Also watch every pod of the cluster and keep its record (see the module doc).
    #[arg(long)]
    watch_pods: bool,
}

/// Every pod of the cluster, watched and kept as its record until it goes.
async fn watch_pods() -> anyhow::Result<()> {
    use card_quota::cards::{CardResources, ObjectKey};
    use card_quota::cluster::pod_parts::PodParts;
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let api = kube::Api::<PodParts>::all(kube::Client::try_default().await?);
    let mut pods = std::collections::HashMap::new();
    let key = |p: &PodParts| {
        ObjectKey::new(
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        )
    };
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                match p.record("", CardResources::defaults(), 0) {
                    Ok(r) => pods.insert(key(&p), r),
                    Err(_) => pods.remove(&key(&p)),
                };
            }
            Ok(watcher::Event::Delete(p)) => {
                pods.remove(&key(&p));
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => eprintln!("pod watch: {e}"),
        }
    }
    Ok(())
}

/// JSON Pointer escaping of one path segment.
fn segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// The three operations card-quota's mutating webhook adds to an admitted card pod.
fn pin_patch(pod: &Value, label: &str) -> Option<Value> {
    let ann = pod.pointer("/metadata/annotations")?;
    let queue = ann.get("scheduling.volcano.sh/queue-name")?.as_str()?;
    let card = ann.get("volcano.sh/card.name")?.as_str()?;
    let model = card.split('|').next()?;
    Some(json!([
        {"op": "add", "path": format!("/metadata/annotations/{}", segment("volcano.sh/card.queue")), "value": queue},
        {"op": "add", "path": format!("/metadata/annotations/{}", segment("volcano.sh/card.pinned")),
            "value": format!("{model}: the first of {card} with room in queue {queue}")},
        {"op": "add", "path": "/spec/nodeSelector", "value": {label: model}},
    ]))
}

fn answer(body: &[u8], mutate: bool, label: &str) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let uid = v.pointer("/request/uid").cloned().unwrap_or(json!(""));
    let mut response = json!({"uid": uid, "allowed": true});
    let is_pod_create = v.pointer("/request/kind/kind") == Some(&json!("Pod"))
        && v.pointer("/request/operation") == Some(&json!("CREATE"));
    if mutate && is_pod_create {
        if let Some(patch) = v
            .pointer("/request/object")
            .and_then(|pod| pin_patch(pod, label))
        {
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD
                .encode(serde_json::to_vec(&patch).unwrap_or_default()));
        }
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

async fn handle(
    req: Request<Incoming>,
    label: Arc<str>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let mutate = req.uri().path() == "/mutate";
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let out = serde_json::to_vec(&answer(&body, mutate, &label)).unwrap_or_default();
    Ok(Response::new(Full::new(Bytes::from(out))))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let resolver = Arc::new(tls::Reloading::new(args.cert_dir.clone())?);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls::server_config(resolver, None)?);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let label: Arc<str> = args.product_label.into();
    if args.watch_pods {
        tokio::spawn(async {
            if let Err(e) = watch_pods().await {
                eprintln!("pod watch: {e}");
            }
        });
    }
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, label) = (acceptor.clone(), label.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |r| handle(r, label.clone()));
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use card_quota::decide::review::ReviewBuilder;
    use card_quota::decide::Config;
    use card_quota::snapshot::load::load;
    use card_quota::webhook::server;

    fn ops(review_out: &[u8]) -> Value {
        let v: Value = serde_json::from_slice(review_out).unwrap();
        let patch = base64::engine::general_purpose::STANDARD
            .decode(v["response"]["patch"].as_str().unwrap())
            .unwrap();
        serde_json::from_slice(&patch).unwrap()
    }

    #[tokio::test]
    async fn the_floor_answers_a_card_pod_with_card_quotas_own_patch() {
        let objects = include_str!("../src/cli/demo/snapshot.yaml");
        let review = ReviewBuilder::pod(
            "CREATE",
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "serving", "annotations": {
                    "scheduling.volcano.sh/queue-name": "serving",
                    "volcano.sh/card.name": "NVIDIA-GeForce-RTX-4090"}},
                "spec": {"containers": [{"name": "c", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        )
        .uid("u")
        .build();
        let body = serde_json::to_vec(&review).unwrap();
        let (snap, _) = load(objects).unwrap();
        let state = server::State::new(snap, Config::default());
        let card_quota = server::handle_review(&state, &body, true).await.unwrap();
        let floor = serde_json::to_vec(&answer(&body, true, "nvidia.com/gpu.product")).unwrap();
        assert_eq!(ops(&floor), ops(&card_quota));
        let validated = answer(&body, false, "nvidia.com/gpu.product");
        assert!(validated["response"].get("patch").is_none());
    }
}
