//! The real HTTPS server (`serve --offline`) with freshly generated certificates, talked
//! to by a client that trusts only that CA.

mod support;

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use card_quota::decide::review::ReviewBuilder as R;
use http_body_util::{BodyExt, Full};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_card-quota");

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn certs(dir: &Path) {
    certs_with(dir, &[]);
}

fn certs_with(dir: &Path, extra: &[&str]) {
    let out = Command::new(BIN)
        .args([
            "certs",
            "--service",
            "card-quota",
            "--namespace",
            "card-quota",
            "--ip",
            "127.0.0.1",
            "--out",
        ])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundle = String::from_utf8_lossy(&out.stdout);
    let pem = base64::engine::general_purpose::STANDARD
        .decode(bundle.trim())
        .unwrap();
    // The caBundle: the CA, then during a rotation the previous one.
    let mut want = std::fs::read(dir.join("ca.crt")).unwrap();
    if let Ok(previous) = std::fs::read(dir.join("ca-previous.crt")) {
        want.extend(previous);
    }
    assert_eq!(pem, want, "stdout is the caBundle");
}

struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `serve --offline`; free ports are picked by the OS and may be taken again
    /// before the server binds them, so a server that exits early is started again.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let objects = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cli/demo/snapshot.yaml");
        for _attempt in 0..5 {
            let (port, health) = (free_port(), free_port());
            let mut child = Command::new(BIN)
                .args([
                    "serve",
                    "--offline",
                    "--objects",
                    objects,
                    "--cert-reload-seconds",
                    "0.2",
                ])
                .args([
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--metrics-listen",
                    &format!("127.0.0.1:{health}"),
                ])
                .arg("--cert-dir")
                .arg(dir)
                .args(extra)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                let up = |p: u16| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
                if up(port) && up(health) {
                    return Server {
                        child,
                        port,
                        dir: dir.to_path_buf(),
                    };
                }
                assert!(Instant::now() < deadline, "server did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("server exited on start five times");
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
        post(self.port, &self.dir.join("ca.crt"), path, body).await
    }

    async fn review(&self, path: &str, doc: Value) -> Value {
        let (status, body) = self
            .post(path, serde_json::to_vec(&doc).unwrap())
            .await
            .unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }
}

/// A client certificate and its key (PEM), as the API server would present.
type Identity = (String, String);

async fn connect(
    port: u16,
    ca: &Path,
    me: Option<&Identity>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = match me {
        Some((crt, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(crt.as_bytes()).unwrap()],
                rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())
}

async fn post(port: u16, ca: &Path, path: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    post_as(port, ca, None, path, body).await
}

async fn post_as(
    port: u16,
    ca: &Path,
    me: Option<&Identity>,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), String> {
    let tls = connect(port, ca, me).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("content-type", "application/json")
        .header("host", "card-quota.card-quota.svc")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes.to_vec()))
}

fn patch_of(v: &Value) -> Value {
    let b = base64::engine::general_purpose::STANDARD
        .decode(
            v["response"]["patch"]
                .as_str()
                .expect("patch is a base64 string"),
        )
        .unwrap();
    serde_json::from_slice(&b).unwrap()
}

fn pod(name: &str, card: &str, gpus: &str) -> Value {
    support::pod(name)
        .queue("research")
        .card(card)
        .gpus(gpus)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_https_webhook_decides_patches_and_survives_a_certificate_rotation() {
    let tmp = tempdir("webhook");
    certs(&tmp);
    let server = Server::start(&tmp, &[]);

    // Pod create: allowed, then denied with the documented message.
    let ok = server
        .review(
            "/validate",
            R::pod("CREATE", pod("a", "NVIDIA-H200", "3"))
                .uid("u1")
                .build(),
        )
        .await;
    assert_eq!(ok["response"]["uid"], "u1");
    assert_eq!(ok["response"]["allowed"], true);
    let no = server
        .review(
            "/validate",
            R::pod("CREATE", pod("b", "NVIDIA-H200", "2"))
                .uid("u2")
                .build(),
        )
        .await;
    assert_eq!(no["response"]["allowed"], false);
    assert_eq!(no["response"]["status"]["code"], 403);
    assert_eq!(
        no["response"]["status"]["message"],
        "queue research has insufficient NVIDIA-H200 quota: requested 2, in use 3 (allocated 0, pending 3, reserved 0), quota 4"
    );

    // Binding: the charged-model patch.
    let b = server
        .review("/mutate", R::binding("ml", "a", "h200-a").build())
        .await;
    assert_eq!(b["response"]["patchType"], "JSONPatch");
    assert_eq!(
        patch_of(&b),
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"volcano.sh/card.charged": "NVIDIA-H200"}}])
    );

    // Scale-up over quota: clamped (serving has RTX-4090 quota 2, 1 in use).
    let s = server
        .review(
            "/mutate",
            R::scale("deployments", "serving", "infer", 1, 5).build(),
        )
        .await;
    assert_eq!(s["response"]["allowed"], true);
    assert_eq!(
        patch_of(&s),
        json!([{"op": "replace", "path": "/spec/replicas", "value": 2}])
    );

    // A body that is not an AdmissionReview: 400 with a reason.
    let (status, body) = server
        .post("/validate", b"{\"kind\":\"Pod\"}".to_vec())
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("AdmissionReview"));

    // Rotation: new CA and certificate in place; a client trusting only the new CA gets through.
    let old_ca = std::fs::read(tmp.join("ca.crt")).unwrap();
    certs_with(&tmp, &["--rotate-ca"]);
    assert_ne!(old_ca, std::fs::read(tmp.join("ca.crt")).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = server
            .post(
                "/validate",
                serde_json::to_vec(&R::pod("CREATE", pod("c", "NVIDIA-H200", "1")).build())
                    .unwrap(),
            )
            .await;
        if r.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rotated certificate not served: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_deny_policy_a_scale_up_over_quota_is_refused_with_the_design_message() {
    let tmp = tempdir("deny");
    certs(&tmp);
    let server = Server::start(&tmp, &["--scale-policy", "deny"]);
    let s = server
        .review(
            "/validate",
            R::scale("deployments", "serving", "infer", 1, 5).build(),
        )
        .await;
    assert_eq!(s["response"]["allowed"], false);
    assert_eq!(
        s["response"]["status"]["message"],
        "queue serving has insufficient NVIDIA-GeForce-RTX-4090 quota: requested 4, in use 1 (allocated 1, pending 0, reserved 0), quota 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_without_a_uid_is_refused_before_any_decision() {
    let tmp = tempdir("nouid");
    certs(&tmp);
    let server = Server::start(&tmp, &[]);
    let r = server
        .review(
            "/validate",
            R::pod("CREATE", pod("a", "NVIDIA-H200", "1"))
                .uid("")
                .build(),
        )
        .await;
    assert_eq!(r["response"]["allowed"], false);
    assert_eq!(r["response"]["status"]["code"], 400);
    assert_eq!(
        r["response"]["status"]["message"],
        "AdmissionReview request.uid is empty; refused before any decision"
    );
    // The same pod with a uid is admitted: nothing was charged by the first request.
    let ok = server
        .review(
            "/validate",
            R::pod("CREATE", pod("a", "NVIDIA-H200", "4"))
                .uid("u")
                .build(),
        )
        .await;
    assert_eq!(ok["response"]["allowed"], true, "{ok}");
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("card-quota-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A CA for the API server's client certificates, and certificates it signs.
struct ClientCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl ClientCa {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = p.self_signed(&key).unwrap().pem();
        Self {
            issuer: rcgen::Issuer::new(p, key),
            pem,
        }
    }

    fn client(&self, cn: &str) -> Identity {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let crt = p.signed_by(&key, &self.issuer).unwrap();
        (crt.pem(), key.serialize_pem())
    }
}

/// A server that takes only client certificates a new cluster CA signed for the API
/// server's name (`--client-ca`, `--client-name`), and that CA.
fn guarded(dir: &Path) -> (Server, ClientCa) {
    let cluster = ClientCa::new("cluster CA");
    let ca = dir.join("client-ca.crt");
    std::fs::write(&ca, &cluster.pem).unwrap();
    let server = Server::start(
        dir,
        &[
            "--client-ca",
            ca.to_str().unwrap(),
            "--client-name",
            "kube-apiserver-webhook-client",
        ],
    );
    (server, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_api_servers_client_certificate_gets_past_the_handshake() {
    let tmp = tempdir("mtls");
    certs(&tmp);
    let (server, cluster) = guarded(&tmp);
    let review =
        || serde_json::to_vec(&R::pod("CREATE", pod("a", "NVIDIA-H200", "1")).build()).unwrap();
    let api_server = cluster.client("kube-apiserver-webhook-client");
    let (status, _) = post_as(
        server.port,
        &tmp.join("ca.crt"),
        Some(&api_server),
        "/validate",
        review(),
    )
    .await
    .expect("the API server's certificate is accepted");
    assert_eq!(status, 200);
    // No certificate, another client of the same CA, and the right name from another CA.
    let someone = cluster.client("system:admin");
    let forged = ClientCa::new("other CA").client("kube-apiserver-webhook-client");
    for (who, me) in [
        ("no certificate", None),
        ("another name", Some(&someone)),
        ("another CA", Some(&forged)),
    ] {
        let r = post_as(server.port, &tmp.join("ca.crt"), me, "/validate", review()).await;
        assert!(r.is_err(), "{who}: refused at the handshake, got {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dribbling_headers_is_cut_off_while_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tmp = tempdir("slowloris");
    certs(&tmp);
    let server = Server::start(&tmp, &[]);
    let mut slow = connect(server.port, &tmp.join("ca.crt"), None)
        .await
        .unwrap();
    slow.write_all(b"POST /validate HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let dribble = async {
        for i in 0.. {
            if slow
                .write_all(format!("x-{i}: y\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
            let mut buf = [0u8; 256];
            match tokio::time::timeout(Duration::from_millis(500), slow.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => break,
                Err(_) => {}
            }
            assert!(start.elapsed() < Duration::from_secs(30), "never cut off");
        }
        start.elapsed()
    };
    let fast = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        server
            .review(
                "/validate",
                R::pod("CREATE", pod("a", "NVIDIA-H200", "1")).build(),
            )
            .await
    };
    let (took, answer) = tokio::join!(dribble, fast);
    assert_eq!(answer["response"]["allowed"], true, "served meanwhile");
    eprintln!("slowloris cut off after {took:?}");
    assert!(
        took < card_quota::webhook::server::HEADER_TIMEOUT + Duration::from_secs(2),
        "cut off after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tmp = tempdir("idle");
    certs(&tmp);
    let server = Server::start(&tmp, &[]);
    let mut conn = connect(server.port, &tmp.join("ca.crt"), None)
        .await
        .unwrap();
    let body = serde_json::to_vec(&R::pod("CREATE", pod("a", "NVIDIA-H200", "1")).build()).unwrap();
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&body).await.unwrap();
    let sent = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer comes at once; then the connection sits idle until the server ends it.
    let closed_after = loop {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .expect("an idle connection must not stay open 30 s");
        match n {
            Ok(0) | Err(_) => break sent.elapsed(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let limit = card_quota::webhook::server::HEADER_TIMEOUT;
    assert!(
        closed_after >= limit - Duration::from_millis(500)
            && closed_after < limit + Duration::from_secs(2),
        "closed after {closed_after:?}"
    );
}

/// A pod-create review as kube-apiserver v1.20.2 sent it for `kubectl create` of a
/// one-container pod (defaulted, with managed fields, the service-account volume,
/// default tolerations, `options`, `oldObject: null`): captured from the control plane
/// of `e2e/`, not built here.
const APISERVER_POD_REVIEW: &str = include_str!("fixtures/apiserver-pod-create-review.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_review_as_an_api_server_sends_it_is_pinned_then_admitted() {
    let tmp = tempdir("apiserver-review");
    certs(&tmp);
    let server = Server::start(&tmp, &[]);
    let review: Value = serde_json::from_str(APISERVER_POD_REVIEW).unwrap();
    let m = server.review("/mutate", review.clone()).await;
    assert_eq!(m["response"]["uid"], "318f167d-aec1-4d72-b994-8fee54410d71");
    assert_eq!(m["response"]["allowed"], true, "{m}");
    let patch = patch_of(&m);
    assert_eq!(
        patch,
        json!([
            {"op": "add", "path": "/metadata/annotations/volcano.sh~1card.queue", "value": "serving"},
            {"op": "add", "path": "/metadata/annotations/volcano.sh~1card.pinned",
             "value": "NVIDIA-GeForce-RTX-4090: the first of NVIDIA-GeForce-RTX-4090 with room in queue serving"},
            {"op": "add", "path": "/spec/nodeSelector", "value": {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090"}},
        ])
    );
    // The API server then sends the patched pod to /validate, where it is charged:
    // serving's RTX-4090 quota is 2 with 1 in use, so a second such pod is refused.
    let mut patched = review.clone();
    let ops: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(&mut patched["request"]["object"], &ops).unwrap();
    let v = server.review("/validate", patched.clone()).await;
    assert_eq!(v["response"]["allowed"], true, "{v}");
    let mut second = patched;
    second["request"]["uid"] = json!("second");
    second["request"]["name"] = json!("load-1");
    second["request"]["object"]["metadata"]["name"] = json!("load-1");
    let v = server.review("/validate", second).await;
    assert_eq!(v["response"]["allowed"], false, "{v}");
    assert_eq!(
        v["response"]["status"]["message"],
        "queue serving has insufficient NVIDIA-GeForce-RTX-4090 quota: requested 1, in use 2 (allocated 1, pending 1, reserved 0), quota 2"
    );
}

/// A charge forwarded to the replica that owns its queue: the peer is trusted only when
/// it serves the very certificate the forwarder serves, and its answer comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_review_gets_the_owners_answer_from_a_peer_serving_the_same_certificate() {
    use card_quota::routing::Peer;
    use card_quota::webhook::forward::{ForwardError, Forwarder};
    use card_quota::webhook::tls::Reloading;

    let ours = tempdir("forward-ours");
    certs(&ours);
    let other = tempdir("forward-other");
    certs(&other);
    let owner = Server::start(&ours, &[]);
    let peer = Peer {
        name: "owner".into(),
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], owner.port)),
    };
    let review = R::pod("CREATE", pod("fwd", "NVIDIA-H200", "3"))
        .uid("u-fwd")
        .build();
    let body = Bytes::from(serde_json::to_vec(&review).unwrap());
    let within = Duration::from_secs(5);

    let same = Forwarder::new(Arc::new(Reloading::new(ours.clone()).unwrap()), "me").unwrap();
    let answer = same
        .send(&peer, "/validate", body.clone(), within)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["response"]["uid"], "u-fwd", "{v}");
    assert_eq!(v["response"]["allowed"], true, "{v}");
    // The owner applied the charge: the same pod again (another uid) no longer fits the
    // queue's three H200s, and the owner says so through the forwarder.
    let again = R::pod("CREATE", pod("fwd2", "NVIDIA-H200", "3"))
        .uid("u-fwd2")
        .build();
    let answer = same
        .send(
            &peer,
            "/validate",
            Bytes::from(serde_json::to_vec(&again).unwrap()),
            within,
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["response"]["allowed"], false, "{v}");

    // A forwarder serving another certificate does not trust the peer.
    let stranger = Forwarder::new(Arc::new(Reloading::new(other.clone()).unwrap()), "me").unwrap();
    match stranger
        .send(&peer, "/validate", body.clone(), within)
        .await
    {
        Err(ForwardError::Request { .. }) => {}
        other => panic!("a peer with another certificate was trusted: {other:?}"),
    }
    // Under --client-ca the owner takes the forwarder's client certificate, the
    // certificate both serve, and still refuses callers the CA did not sign.
    let (guarded, _cluster) = guarded(&ours);
    let guarded_peer = Peer {
        name: "guarded".into(),
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], guarded.port)),
    };
    let answer = same
        .send(&guarded_peer, "/validate", body.clone(), within)
        .await
        .expect("a replica's own certificate passes the client check");
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["response"]["uid"], "u-fwd", "{v}");
    let r = post_as(
        guarded.port,
        &ours.join("ca.crt"),
        None,
        "/validate",
        body.to_vec(),
    )
    .await;
    assert!(
        r.is_err(),
        "a caller without a certificate got past the handshake: {r:?}"
    );

    // Nobody listening: an error at once, not at the deadline.
    let gone = Peer {
        name: "gone".into(),
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], free_port())),
    };
    let t = Instant::now();
    assert!(same.send(&gone, "/validate", body, within).await.is_err());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}
