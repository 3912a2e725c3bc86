//! Load benchmark of the HTTPS webhook: real AdmissionReview POSTs over TLS from 64
//! concurrent connections against `serve --offline` (the decision core on a snapshot),
//! next to the same harness against a floor server that only parses the review and
//! allows it. Prints requests/s, p50 and p99 of each and their ratios to the floor.
//!
//! A third server, the bound, shows what the host leaves for a decision: the floor's
//! serving loop running card-quota's own reads of the review and the pod (with its
//! record), then sending card-quota's answer to that review, computed once. Any
//! implementation of the contract does at least that, so where the bound's ratio is
//! under the goal, no decision reaches it on that host.
//!
//! Interleaved A B C A B C: each round drives the floor, card-quota and the bound, at 64 connections
//! (throughput) and at 4 (latency), one second each by default, the clock started once
//! every connection has shaken hands; the ratios printed are the medians over rounds
//! (seven by default: short slices, many of them, so that a host whose speed drifts
//! gives every server the same share of it), with their range.
//! Three workloads, each with its ratios: a minimal pod (670 bytes of review); the same
//! pod as kube-apiserver sent it (2.5 KB, captured); and a full-size pod with a sidecar,
//! environment, volumes and probes (3.5 KB).
//!
//! `cargo bench --bench load` (LOAD_SECONDS, LOAD_ROUNDS, LOAD_CONNECTIONS,
//! LOAD_FEW_CONNECTIONS override the defaults; LOAD_ONLY=floor, card-quota or bound drives one;
//! LOAD_POD=minimal, apiserver or full runs one workload).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use card_quota::cluster::pod_parts::read_pod;
use card_quota::decide::review::{read_review, ReviewBuilder as R};
use card_quota::decide::Config;
use card_quota::snapshot::load::load;
use card_quota::webhook::{server, tls};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

const OBJECTS: &str = include_str!("../src/cli/demo/snapshot.yaml");

/// The same minimal pod as kube-apiserver v1.20.2 sent it for `kubectl create`
/// (defaulted, managed fields, service-account volume, tolerations; 2.5 KB), captured
/// from the control plane `e2e/` runs against.
const APISERVER_POD_REVIEW: &str =
    include_str!("../tests/fixtures/apiserver-pod-create-review.json");

#[path = "support/full_pod.rs"]
mod full_pod;

// The allocator the card-quota binary uses, so that both servers here run on it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A request's body (empty if it breaks off).
async fn body_of(req: Request<Incoming>) -> Bytes {
    req.into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

/// The floor: parse the review, allow it.
async fn floor(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = body_of(req).await;
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let uid = v.pointer("/request/uid").cloned().unwrap_or(json!(""));
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true}});
    Ok(Response::new(Full::new(Bytes::from(
        serde_json::to_vec(&out).unwrap_or_default(),
    ))))
}

/// The bound: card-quota's reads of the review and of the pod with its record, then
/// `answer` (card-quota's own answer to this review) sent as is. Nothing decided or stored.
async fn bound(req: Request<Incoming>, answer: Bytes) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = body_of(req).await;
    if let Some(Ok(review)) = read_review(&body) {
        let pod = review
            .object
            .as_ref()
            .map(|o| o.read_with::<_, Pod>(read_pod));
        if let Some(Ok(pod)) = &pod {
            std::hint::black_box(
                pod.record(review.ns(), card_quota::cards::CardResources::defaults(), 0)
                    .ok(),
            );
        }
        std::hint::black_box((&review, &pod));
    }
    Ok(Response::new(Full::new(answer)))
}

/// Serves `handler` over TLS with hyper's defaults: the floor's and the bound's loop.
async fn serve_plain<F, Fut>(
    listener: tokio::net::TcpListener,
    cfg: Arc<rustls::ServerConfig>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(tls),
                        hyper::service::service_fn(handler),
                    )
                    .await;
        });
    }
}

/// CPU time this process has used (user + system), from /proc/self/stat; `None` off Linux.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis(ticks * 10))
}

struct Result_ {
    rps: f64,
    /// Cores busy on average (client and server together), when known.
    cores: Option<f64>,
    p50: Duration,
    p99: Duration,
    errors: usize,
}

async fn drive(
    port: u16,
    client: Arc<rustls::ClientConfig>,
    body: Bytes,
    conns: usize,
    secs: u64,
) -> Result_ {
    // The clock starts once every connection has shaken hands: the handshakes are not
    // part of the requests' cost, and with short slices they would weigh.
    let ready = Arc::new(tokio::sync::Barrier::new(conns + 1));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let client = client.clone();
        let body = body.clone();
        let ready = ready.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            let connected = async {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
                let tls = tokio_rustls::TlsConnector::from(client)
                    .connect(name, tcp)
                    .await?;
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(std::io::Error::other)
            }
            .await;
            // Every task reaches the barrier, connected or not, or the others would wait
            // for it forever.
            ready.wait().await;
            let (mut send, conn) = match connected {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("connecting to 127.0.0.1:{port}: {e}");
                    return (lat, 1);
                }
            };
            tokio::spawn(conn);
            let deadline = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < deadline {
                let req = Request::post("/mutate")
                    .header("content-type", "application/json")
                    .header("host", "card-quota.card-quota.svc")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let t = Instant::now();
                match send.send_request(req).await {
                    Ok(resp) if resp.status() == 200 => {
                        let ok = resp.into_body().collect().await.is_ok();
                        if ok {
                            lat.push(t.elapsed());
                        } else {
                            errors += 1;
                        }
                    }
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    ready.wait().await;
    let start = Instant::now();
    let cpu_start = cpu_time();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cores = cpu_start
        .zip(cpu_time())
        .map(|(a, b)| (b - a).as_secs_f64() / elapsed);
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Result_ {
        rps: all.len() as f64 / elapsed,
        cores,
        p50: pct(0.50),
        p99: pct(0.99),
        errors,
    }
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let secs = env_or("LOAD_SECONDS", 1);
    let conns = env_or("LOAD_CONNECTIONS", 64) as usize;
    let few = env_or("LOAD_FEW_CONNECTIONS", 4) as usize;
    let rounds = env_or("LOAD_ROUNDS", 7);
    let dir = std::env::temp_dir().join(format!("card-quota-load-{}", std::process::id()));
    tls::generate(
        "card-quota",
        "card-quota",
        &[],
        &["127.0.0.1".parse().unwrap()],
        &dir,
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let resolver = Arc::new(tls::Reloading::new(dir.clone()).unwrap());
        let server_cfg = tls::server_config(resolver, None).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(dir.join("ca.crt")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let client = Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        // A card pod the demo's serving queue admits (the same name each time, so the
        // offline snapshot does not grow).
        let minimal = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "load-0", "namespace": "serving",
                "annotations": {"scheduling.volcano.sh/queue-name": "serving", "volcano.sh/card.name": "NVIDIA-GeForce-RTX-4090"}},
            "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        // Three workloads: a minimal pod; the same pod as kube-apiserver sent it; a
        // full-size pod (managed fields, sidecar, environment, volumes, probes).
        // LOAD_POD=minimal, apiserver or full runs one.
        let which = std::env::var("LOAD_POD").unwrap_or_default();
        let built = [
            ("minimal pod", minimal.clone()),
            ("full-size pod", full_pod::full_pod(minimal)),
        ]
        .map(|(name, pod)| {
            let review = R::pod("CREATE", pod).uid("load").build();
            (name, Bytes::from(serde_json::to_vec(&review).unwrap()))
        });
        let workloads: Vec<(&str, Bytes)> = built
            .into_iter()
            .chain([("apiserver pod", Bytes::from_static(APISERVER_POD_REVIEW.as_bytes()))])
            .filter(|(name, _)| which.is_empty() || name.starts_with(which.as_str()))
            .collect();

        let (snap, _) = load(OBJECTS).unwrap();
        let state = Arc::new(server::State::new(snap, Config::default()));
        let mut answers = Vec::new();
        for (_, body) in &workloads {
            let out = server::handle_review(&state, body, true).await.unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["response"]["allowed"], true, "the load request must be admitted: {v}");
            assert!(v["response"]["patch"].is_string(), "the load request must be patched: {v}");
            answers.push(Bytes::from(out));
        }
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let l1 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p1 = l1.local_addr().unwrap().port();
        tokio::spawn(server::serve_tls(l1, server_cfg.clone(), state, stop_rx));
        let l2 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p2 = l2.local_addr().unwrap().port();
        tokio::spawn(serve_plain(l2, server_cfg.clone(), floor));

        let show = |name: &str, n: usize, r: &Result_| {
            println!(
                "  {name:<28} {n:>2} conns {:>9.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  errors {}  cores busy {}",
                r.rps,
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.errors,
                r.cores.map_or("?".to_string(), |c| format!("{c:.2}")),
            );
        };
        // LOAD_ONLY=floor, card-quota or bound drives one server (for profiling it alone).
        let only = std::env::var("LOAD_ONLY").unwrap_or_default();
        for ((workload, body), answer) in workloads.iter().zip(answers) {
            let l3 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let p3 = l3.local_addr().unwrap().port();
            let bound_server = tokio::spawn(serve_plain(l3, server_cfg.clone(), move |r| bound(r, answer.clone())));
            let servers: Vec<(&str, u16)> = [
                ("floor (parse + allow)", p2),
                ("card-quota serve --offline", p1),
                ("bound (reads, fixed answer)", p3),
            ]
            .into_iter()
            .filter(|(name, _)| only.is_empty() || name.starts_with(only.as_str()))
            .collect();
            println!(
                "load, {workload}: AdmissionReview POST /mutate over TLS ({} bytes), {rounds} rounds of A B C A B C at {conns} and {few} connections, {secs} s each",
                body.len()
            );
            // Interleaved, so that every server sees the same machine state. Per server
            // after the floor: its ratios to the floor, one per round.
            let mut ratios: Vec<(Vec<f64>, Vec<f64>)> = vec![Default::default(); servers.len()];
            let mut errors = 0;
            for round in 1..=rounds {
                println!("round {round}");
                let mut by_conns = Vec::new();
                for n in [conns, few] {
                    let mut results = Vec::new();
                    for (name, port) in &servers {
                        let r = drive(*port, client.clone(), body.clone(), n, secs).await;
                        show(name, n, &r);
                        errors += r.errors;
                        results.push(r);
                    }
                    by_conns.push(results);
                }
                let [many, few_] = [&by_conns[0], &by_conns[1]];
                if servers.len() > 1 && servers[0].1 == p2 {
                    for i in 1..servers.len() {
                        ratios[i].0.push(many[i].rps / many[0].rps);
                        ratios[i].1.push(few_[i].p99.as_secs_f64() / few_[0].p99.as_secs_f64());
                    }
                }
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                let n = v.len();
                (v[(n - 1) / 2] + v[n / 2]) / 2.0
            };
            let range = |v: &[f64]| {
                format!("{:.2}-{:.2}", v.first().copied().unwrap_or_default(), v.last().copied().unwrap_or_default())
            };
            for ((name, _), (throughput, tail)) in servers.iter().zip(&mut ratios).skip(1) {
                if throughput.is_empty() {
                    continue;
                }
                // The bound's ratios are a ceiling, not a goal: the most any decision
                // could reach on this host.
                let (who, goal) = if name.starts_with("card-quota") {
                    ("card-quota", ["goal >= 0.80", "goal <= 1.25"])
                } else {
                    ("bound", ["no decision does better here"; 2])
                };
                let (t, p) = (median(throughput), median(tail));
                println!(
                    "{workload}: ratio {who} / floor, requests/s at {conns} connections: {t:.2} (median of {rounds}, rounds {}; {})",
                    range(throughput),
                    goal[0]
                );
                println!(
                    "{workload}: ratio {who} / floor, p99 at {few} connections: {p:.2} (median of {rounds}, rounds {}; {})",
                    range(tail),
                    goal[1]
                );
            }
            assert_eq!(errors, 0, "failed requests: the ratios mean nothing");
            bound_server.abort();
        }
    });
    let _ = std::fs::remove_dir_all(dir);
}
