//! The HTTPS admission endpoint (`/mutate`, `/validate`) and the plain-HTTP health and
//! metrics endpoint. `--offline` mode decides from a static snapshot with an in-memory
//! ledger: each admitted request's effect is applied to the snapshot, as in replay.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{apply_spending, bad_review, encode_response};
use crate::cards::QueueName;
use crate::controller::events::EventSink;
use crate::decide::enforcement::decide_enforcing;
use crate::decide::messages::RETRY;
use crate::decide::pod::{remember_pin, settle_pin};
use crate::decide::review::{
    encode_answer, parse_review_owned, read_review, AdmissionRequest, AdmissionResponse, Operation,
};
use crate::decide::{read_ahead, Config, Decision, RequestKind};
use crate::live::caches::Synced;
use crate::live::charge::{CommitMetrics, Preview};
use crate::live::peers::Peers;
use crate::live::Committer;
use crate::routing::{Peer, FORWARDED_HEADER};
use crate::snapshot::Snapshot;

use super::forward::{ForwardError, Forwarder};
use super::metrics::{AdmissionLabels, ForwardLabels, KindLabel, Metrics};

/// Largest AdmissionReview body accepted (the API server caps objects at ~3 MiB).
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// What a live server needs beyond the snapshot: the ledger writer.
pub struct Live {
    /// Records admitted charges (group commit per queue).
    pub committer: Arc<Committer>,
    pub synced: Arc<Synced>,
    /// Where refusal Events go.
    pub events: Option<Arc<EventSink>>,
    /// Sends charges of queues another replica owns to it (`None`: records them all).
    pub routing: Option<Routing>,
}

/// How long a peer that failed is passed over before it is tried again.
const PEER_PAUSE: Duration = Duration::from_secs(5);

/// Charges to queues another replica owns go to that replica.
pub struct Routing {
    pub peers: Arc<Peers>,
    pub forwarder: Forwarder,
    /// Peers that failed lately, and when: their charges are recorded here meanwhile,
    /// so that a hung peer costs one timeout, not one per request.
    failed: Mutex<std::collections::HashMap<String, Instant>>,
}

impl Routing {
    pub fn new(peers: Arc<Peers>, forwarder: Forwarder) -> Self {
        Self {
            peers,
            forwarder,
            failed: Mutex::default(),
        }
    }

    /// Where a charge to `queue` goes.
    fn target(&self, queue: &QueueName) -> Target {
        let Some(peer) = self.peers.route(queue) else {
            return Target::Here;
        };
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        match failed.get(&peer.name) {
            Some(at) if at.elapsed() < PEER_PAUSE => Target::Paused(peer),
            _ => Target::Owner(peer),
        }
    }

    fn failed(&self, peer: &Peer) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        // Replicas come and go under new names: forget the pauses that are over.
        failed.retain(|_, at| at.elapsed() < PEER_PAUSE);
        failed.insert(peer.name.clone(), Instant::now());
    }
}

/// Where a charge goes.
enum Target {
    /// This replica owns the queue (or knows no other replica).
    Here,
    /// Another replica owns it.
    Owner(Peer),
    /// Another replica owns it but failed lately: recorded here meanwhile.
    Paused(Peer),
}

/// Who sent a review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The API server (or any other caller).
    Caller,
    /// Another replica, forwarding a charge to the queue's owner: never forwarded again.
    Peer,
}

/// Shared state of one server process.
pub struct State {
    pub snapshot: Arc<Mutex<Snapshot>>,
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    /// Admissions take turns here before they lock the snapshot: a request waiting for
    /// another's decision yields its runtime thread instead of parking it.
    turn: tokio::sync::Mutex<()>,
    /// Set on SIGTERM: answers close their HTTP/1.1 connections (see `serve_tls`).
    /// Unlike `ready`, false also before start-up completes.
    pub draining: AtomicBool,
    /// `None` offline: admitted effects are applied to the snapshot directly.
    pub live: Option<Live>,
}

impl State {
    /// An offline server deciding from (and updating) `snapshot`.
    pub fn new(snapshot: Snapshot, config: Config) -> Self {
        Self {
            snapshot: Arc::new(Mutex::new(snapshot)),
            config,
            metrics: Arc::new(Metrics::default()),
            ready: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(()),
            draining: AtomicBool::new(false),
            live: None,
        }
    }

    /// A server deciding from informer caches and recording charges in the queues' ledgers.
    pub fn live(snapshot: Arc<Mutex<Snapshot>>, config: Config, live: Live) -> Self {
        let dropped = live
            .events
            .as_ref()
            .map(|e| e.dropped().clone())
            .unwrap_or_default();
        Self {
            snapshot,
            config,
            metrics: Arc::new(Metrics::new(dropped)),
            ready: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(()),
            draining: AtomicBool::new(false),
            live: Some(live),
        }
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
            && self
                .live
                .as_ref()
                .is_none_or(|l| l.synced.all() && l.synced.stopped().is_none())
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn is_named(req: &AdmissionRequest) -> bool {
    req.name.as_deref().is_some_and(|n| !n.is_empty())
        || req
            .object
            .as_ref()
            .and_then(|o| o.metadata_name())
            .is_some_and(|n| !n.is_empty())
}

/// Decides offline: the snapshot is the whole truth and admitted effects go into it.
async fn decide_offline(state: &State, req: &AdmissionRequest, mutate: bool) -> Decision {
    let _turn = state.turn.lock().await;
    let mut snap = state.snapshot.lock().unwrap_or_else(|e| e.into_inner());
    let now = jiff::Timestamp::now();
    let mut d = decide_enforcing(req, &mut snap, &state.config, now);
    // /mutate applies only effects of named objects: generated names appear later. The
    // pin it chose for an unnamed pod is in flight until /validate applies the pod, as
    // on a live replica (`snapshot::pins_in_flight`).
    if !mutate || is_named(req) {
        if let Err(e) = apply_spending(&mut snap, req, &mut d) {
            tracing::warn!("{e}");
        }
    }
    if !mutate {
        settle_pin(&mut snap, req);
    } else if !is_named(req) {
        remember_pin(&mut snap, req, &d, now);
    }
    d
}

/// How long a binding of a pod whose cards come from ResourceClaims waits for the
/// claims' allocation to reach the cache: the scheduler writes it just before it binds,
/// and answering "try again" costs the pod a scheduling cycle and a backoff.
const CLAIM_ALLOCATION_WAIT: Duration = Duration::from_secs(2);

/// Waits (up to [`CLAIM_ALLOCATION_WAIT`]) until the claims of the pod a binding binds
/// are seen allocated; the decision then says whether they are.
async fn claims_seen_allocated(state: &State, req: &AdmissionRequest) {
    if RequestKind::of(req) != RequestKind::Binding || req.operation != Operation::Create {
        return;
    }
    let Some(obj) = req.object.as_ref() else {
        return;
    };
    let (key, _) = crate::decide::binding::target(req, obj.tree());
    wait_while(state, |s| s.claims_unallocated(&key)).await;
}

/// Polls the snapshot (lock released between looks) while `pending` holds, for at most
/// [`CLAIM_ALLOCATION_WAIT`].
async fn wait_while(state: &State, pending: impl Fn(&Snapshot) -> bool) {
    let until = Instant::now() + CLAIM_ALLOCATION_WAIT;
    while pending(&state.snapshot.lock().unwrap_or_else(|e| e.into_inner()))
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (up to [`CLAIM_ALLOCATION_WAIT`]) until the ResourceClaims and templates a new
/// pod names reach the cache: one file often holds a template and the pod that uses it,
/// created a few milliseconds apart. The decision then says whether they are there.
async fn claims_known(state: &State, req: &AdmissionRequest) {
    if RequestKind::of(req) != RequestKind::Pod || req.operation != Operation::Create {
        return;
    }
    // The pod as read ahead of the decision: a pod's admission never builds its JSON
    // tree (`Object::tree`).
    let Some(rec) = crate::decide::pod::object_record(req) else {
        return;
    };
    if rec.claims.is_empty() {
        return;
    }
    wait_while(state, |s| s.claims_missing(rec)).await;
}

/// Decides live: from the caches with the queue's ledger laid over them; `/validate`
/// records admitted charges before answering.
async fn decide_live(
    state: &State,
    live: &Live,
    req: &Arc<AdmissionRequest>,
    mutate: bool,
    body: &[u8],
    origin: Origin,
) -> Answer {
    if !live.synced.all() && req.operation != Operation::Delete {
        return Answer::Decided(Decision::deny(
            RETRY,
            "card-quota's caches are still syncing with the API server; try again",
        ));
    }
    claims_seen_allocated(state, req).await;
    claims_known(state, req).await;
    let queue_write = crate::decide::RequestKind::of(req) == crate::decide::RequestKind::Queue;
    if !mutate && queue_write && !req.is_dry_run() {
        if let Some(wait) = live
            .committer
            .before_queue_write(&state.snapshot, req)
            .await
        {
            return Answer::Decided(wait);
        }
    }
    // Only /validate records charges; what it admits goes to the queue's owner first.
    let (queue, deadline) = match live
        .committer
        .preview(&state.snapshot, &state.config, req, !mutate)
        .await
    {
        Preview::Answer(d) => {
            // A Queue write that moves charges to another ledger seals them in the old
            // one before it is answered (and so before it is stored).
            if d.allowed && !mutate && queue_write && !req.is_dry_run() {
                if let Some(wait) = live
                    .committer
                    .seal_ledgers(&state.snapshot, &state.config, req)
                    .await
                {
                    return Answer::Decided(wait);
                }
            }
            return Answer::Decided(d);
        }
        Preview::Held(d) => {
            crate::live::charge::CommitMetrics::held(state.metrics.ledger.as_ref());
            return Answer::Decided(d);
        }
        Preview::Charge { queue, deadline } => (queue, deadline),
    };
    // A replica that takes holds records its own charges: its hold makes most of them
    // free, and a forward costs a round trip every time.
    if let (Some(routing), Origin::Caller, false) =
        (&live.routing, origin, live.committer.takes_holds())
    {
        if let Some(answer) = forward(state, routing, req, body, &queue, deadline).await {
            live.committer.pin_settled(&state.snapshot, req).await;
            return Answer::Forwarded(answer);
        }
    }
    let metrics: Arc<dyn CommitMetrics> = state.metrics.ledger.clone();
    let d = live
        .committer
        .record(
            &state.snapshot,
            &state.config,
            &metrics,
            req.clone(),
            queue,
            deadline,
        )
        .await;
    live.committer.pin_settled(&state.snapshot, req).await;
    Answer::Decided(d)
}

/// Sends a charge to `queue`'s owner when another replica owns it: the owner's answer,
/// or `None` when the charge is to be recorded here.
async fn forward(
    state: &State,
    routing: &Routing,
    req: &AdmissionRequest,
    body: &[u8],
    queue: &QueueName,
    deadline: Instant,
) -> Option<Vec<u8>> {
    let count = |result| {
        state
            .metrics
            .webhook
            .forwarded
            .get_or_create(&ForwardLabels { result })
            .inc();
    };
    let peer = match routing.target(queue) {
        Target::Here => return None,
        Target::Paused(peer) => {
            count("skipped");
            tracing::debug!(queue = %queue, "owner {} failed lately; recording here", peer.name);
            return None;
        }
        Target::Owner(peer) => peer,
    };
    // Two thirds of the budget: a peer that does not answer leaves time to record the
    // charge here.
    let within = deadline.saturating_duration_since(Instant::now()) * 2 / 3;
    let sent = routing
        .forwarder
        .send(&peer, "/validate", Bytes::copy_from_slice(body), within)
        .await;
    match sent.and_then(|answer| answers(&answer, &req.uid).map(|()| answer)) {
        Ok(answer) => {
            count("answered");
            Some(answer)
        }
        Err(e) => {
            count("failed");
            routing.failed(&peer);
            tracing::warn!(queue = %queue, "forwarding a charge to its owner failed, recording it here (owner passed over for {PEER_PAUSE:?}): {e}");
            None
        }
    }
}

/// Checks that `answer` is an AdmissionReview answering the review `uid` (what the API
/// server will check) before it is passed on as this replica's.
fn answers(answer: &[u8], uid: &str) -> Result<(), ForwardError> {
    #[derive(serde::Deserialize)]
    struct Review<'a> {
        #[serde(borrow)]
        response: Response<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Response<'a> {
        #[serde(borrow)]
        uid: std::borrow::Cow<'a, str>,
        // Required: an answer without a verdict is no answer.
        #[serde(rename = "allowed")]
        _allowed: bool,
    }
    match serde_json::from_slice::<Review>(answer) {
        Ok(r) if r.response.uid == uid => Ok(()),
        Ok(r) => Err(ForwardError::Answer(format!(
            "it answers review {:?}, not {uid:?}",
            r.response.uid
        ))),
        Err(e) => Err(ForwardError::Answer(format!(
            "not an AdmissionReview answer: {e}"
        ))),
    }
}

/// A live answer: decided here, or the owner's answer to a forwarded review.
enum Answer {
    Decided(Decision),
    Forwarded(Vec<u8>),
}

/// A request body that gets no AdmissionReview in answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("body is not an admission.k8s.io/v1 AdmissionReview with a request")]
    NotAReview,
    #[error("the answer cannot be encoded: {0}")]
    Answer(serde_json::Error),
    /// A peer forwarded a charge before this replica's caches synced (it restarted under
    /// a name whose peer Lease is still current): the peer records it itself.
    #[error("this replica's caches are still syncing; record the charge yourself")]
    NotReadyForPeers,
}

/// Decides one admission body. `/mutate` answers with patches; `/validate` sees the
/// final object and is where charges are recorded.
pub async fn handle_review(state: &State, body: &[u8], mutate: bool) -> Result<Vec<u8>, BodyError> {
    handle_review_from(state, body, mutate, Origin::Caller).await
}

/// [`handle_review`] for a review from `origin`.
pub async fn handle_review_from(
    state: &State,
    body: &[u8],
    mutate: bool,
    origin: Origin,
) -> Result<Vec<u8>, BodyError> {
    let start = Instant::now();
    if origin == Origin::Peer && state.live.as_ref().is_some_and(|l| !l.synced.all()) {
        return Err(BodyError::NotReadyForPeers);
    }
    let parsed = match read_review(body) {
        Some(r) => r,
        None => {
            // Not a well-typed review: classify it through the JSON tree.
            let doc: serde_json::Value =
                serde_json::from_slice(body).map_err(BodyError::NotJson)?;
            if doc.get("kind").and_then(|k| k.as_str()) != Some("AdmissionReview")
                || doc.get("request").map(|r| r.is_null()).unwrap_or(true)
            {
                return Err(BodyError::NotAReview);
            }
            let uid = doc
                .pointer("/request/uid")
                .and_then(|u| u.as_str())
                .unwrap_or("")
                .to_string();
            parse_review_owned(doc).map_err(|e| (uid, e))
        }
    };
    let req = match parsed {
        // The API server always sends a uid: a review without one is not from it, and is
        // refused before anything is decided or charged.
        Ok(r) if r.uid.is_empty() => {
            return answer(&bad_review(
                "",
                "AdmissionReview request.uid is empty; refused before any decision".into(),
            ));
        }
        Ok(r) => Arc::new(r),
        Err((uid, e)) => return answer(&bad_review(&uid, e.to_string())),
    };
    // Parsing the objects takes no lock: decisions wait for each other less.
    read_ahead(&req);
    let d = match &state.live {
        None => decide_offline(state, &req, mutate).await,
        Some(live) => match decide_live(state, live, &req, mutate, body, origin).await {
            Answer::Decided(d) => d,
            // The owner counted, logged and published what it decided.
            Answer::Forwarded(answer) => return Ok(answer),
        },
    };
    let d = if mutate { d } else { d.validated() };

    if d.undecided {
        state.metrics.webhook.budget_exhausted.inc();
    }
    if let Some(ev) = &d.event {
        // Debug formatting escapes newlines a hostile name could carry into the log.
        tracing::info!(reason = ev.reason, kind = %ev.regarding.kind, name = ?ev.regarding.name, "{:?}", ev.message);
        // /mutate and /validate may both refuse the same request: the sink folds
        // repeats. Dry runs change nothing, so they say nothing.
        let sink = state.live.as_ref().and_then(|l| l.events.as_ref());
        if let (Some(sink), false) = (sink, req.is_dry_run()) {
            if let Some(also) = &ev.also {
                let mut on_also = (**ev).clone();
                on_also.regarding = also.clone();
                on_also.also = None;
                sink.publish_in_background(on_also);
            }
            sink.publish_in_background((**ev).clone());
        }
    }
    let kind = RequestKind::of(&req).label();
    let result = match (d.allowed, d.warned()) {
        (true, false) => "allowed",
        (true, true) => "warned",
        (false, _) => "denied",
    };
    // Labels are static strings: counting a request allocates nothing.
    let operation = req.operation.as_str();
    let labels = AdmissionLabels {
        kind,
        operation,
        result,
    };
    state.metrics.webhook.requests.get_or_create(&labels).inc();
    state
        .metrics
        .webhook
        .latency
        .get_or_create(&KindLabel { kind })
        .observe(start.elapsed().as_secs_f64());
    encode_response(&req.uid, &d, mutate).map_err(BodyError::Answer)
}

fn answer(response: &AdmissionResponse) -> Result<Vec<u8>, BodyError> {
    encode_answer(response).map_err(BodyError::Answer)
}

async fn admission(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let mutate = match (req.method(), req.uri().path()) {
        (&Method::POST, "/mutate") => true,
        (&Method::POST, "/validate") => false,
        (_, "/healthz") => return Ok(reply(StatusCode::OK, "text/plain", "ok")),
        _ => {
            return Ok(reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                "POST /mutate or /validate",
            ))
        }
    };
    let origin = match req.headers().contains_key(FORWARDED_HEADER) {
        true => Origin::Peer,
        false => Origin::Caller,
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "text/plain",
                format!("body rejected: {e} (limit {MAX_BODY} bytes)"),
            ));
        }
    };
    Ok(
        match handle_review_from(&state, &body, mutate, origin).await {
            Ok(json) => reply(StatusCode::OK, "application/json", json),
            Err(reason @ BodyError::NotReadyForPeers) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                reason.to_string(),
            ),
            Err(reason) => reply(StatusCode::BAD_REQUEST, "text/plain", reason.to_string()),
        },
    )
}

async fn health(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let stopped = state.live.as_ref().and_then(|l| l.synced.stopped());
    Ok(match (req.uri().path(), stopped) {
        ("/healthz" | "/readyz", Some(what)) => {
            reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", what)
        }
        ("/healthz", None) => reply(StatusCode::OK, "text/plain", "ok"),
        ("/readyz", None) if state.is_ready() => reply(StatusCode::OK, "text/plain", "ready"),
        ("/readyz", None) => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "caches not synced",
        ),
        ("/metrics", _) => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.encode(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "/healthz /readyz /metrics",
        ),
    })
}

/// Serves admission over TLS until `shutdown` resolves; in-flight connections finish.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = shutdown.clone();
    let mut backoff = AcceptBackoff::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(c) => { backoff.reset(); c }
                    Err(e) => { backoff.wait(&e).await; continue }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "connection refused: {MAX_CONNECTIONS} connections open");
                    state.metrics.webhook.connections_refused.inc();
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let state = state.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _slot = slot;
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                            state.metrics.webhook.handshakes_refused.inc();
                            return;
                        }
                        Err(_) => return,
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move {
                            let http1 = req.version() < hyper::Version::HTTP_2;
                            let draining = state.draining.load(Ordering::Relaxed);
                            let mut r = match tokio::time::timeout(REQUEST_DEADLINE, admission(state, req)).await {
                                Ok(Ok(r)) => r,
                                Ok(Err(e)) => match e {},
                                Err(_) => reply(
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "text/plain",
                                    format!("no answer within {REQUEST_DEADLINE:?}; try again"),
                                ),
                            };
                            // Draining: each keep-alive connection is closed after its
                            // answer, so the client opens its next one elsewhere instead
                            // of racing the listener's close with a new request.
                            if draining && http1 {
                                r.headers_mut().insert(
                                    hyper::header::CONNECTION,
                                    hyper::header::HeaderValue::from_static("close"),
                                );
                            }
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let mut builder = auto::Builder::new(TokioExecutor::new());
                    builder
                        .http1()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT);
                    builder
                        .http2()
                        .timer(TokioTimer::new())
                        .max_concurrent_streams(H2_STREAMS);
                    let conn = builder.serve_connection(TokioIo::new(tls), svc);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(%peer, "connection ended: {e}");
                    }
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(25), graceful.shutdown()).await;
}

/// Connections served at once; more are closed as they arrive. The API server keeps a
/// small pool per webhook, so this is only reached by something else.
pub const MAX_CONNECTIONS: usize = 512;
/// Time for a client to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for a client to send a request's headers (slowloris). hyper starts it as soon
/// as an HTTP/1.1 connection waits for its next request, so it is also how long an idle
/// keep-alive connection stays open.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to answer one request: below the shortest webhook timeout (5 s), so a stuck
/// request ends here, not in the API server's failure policy. The ledger's time budget
/// (3 s by default) answers "try again" first.
pub const REQUEST_DEADLINE: Duration = Duration::from_millis(4500);
/// Concurrent HTTP/2 streams per connection.
pub const H2_STREAMS: u32 = 32;

/// A pause after a failed accept (EMFILE, ENFILE...): without it the loop spins on
/// the error at full speed. Doubles from 10 ms to 1 s; reset by a good accept.
#[derive(Debug, Default)]
struct AcceptBackoff {
    delay: Duration,
}

impl AcceptBackoff {
    async fn wait(&mut self, e: &std::io::Error) {
        self.delay = (self.delay * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        tracing::warn!("accept failed: {e}; pausing {:?}", self.delay);
        tokio::time::sleep(self.delay).await;
    }
    fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` over plain HTTP.
pub async fn serve_health(
    listener: TcpListener,
    state: Arc<State>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = AcceptBackoff::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let tcp = match accepted {
                    Ok((tcp, _)) => { backoff.reset(); tcp }
                    Err(e) => { backoff.wait(&e).await; continue }
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| health(state.clone(), req));
                    let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(tcp), svc).await;
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// Polls the certificate files and swaps the served certificate when they change.
/// `expiry` shows when the served certificate expires (Unix seconds).
pub async fn reload_certs(
    resolver: Arc<super::tls::Reloading>,
    every: Duration,
    expiry: prometheus_client::metrics::gauge::Gauge,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        expiry.set(resolver.not_after().unwrap_or(0));
        tokio::select! {
            _ = tokio::time::sleep(every) => match resolver.reload() {
                Ok(true) => tracing::info!("serving a rotated certificate"),
                Ok(false) => {}
                Err(e) => tracing::warn!("keeping the current certificate: {e}"),
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Binds a listener, naming the address on failure.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::{answers, claims_known, State};
    use crate::decide::review::{read_review, ReviewBuilder};

    #[tokio::test]
    async fn a_pod_without_claims_is_not_held_for_them_nor_read_as_a_tree() {
        let (snap, _) = crate::snapshot::load::load(include_str!("../cli/demo/snapshot.yaml"))
            .expect("the demo snapshot loads");
        let state = State::new(snap, crate::decide::Config::default());
        let review = ReviewBuilder::pod(
            "CREATE",
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "serving"},
                "spec": {"containers": [{"name": "c", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        )
        .uid("u")
        .build();
        let body = serde_json::to_vec(&review).expect("encodes");
        let req = read_review(&body).expect("a review").expect("a request");
        crate::decide::read_ahead(&req);
        let start = std::time::Instant::now();
        claims_known(&state, &req).await;
        assert!(start.elapsed() < super::CLAIM_ALLOCATION_WAIT / 2);
        // Every pod CREATE passes here: building the pod's JSON tree took 6% of the
        // replica's CPU in a burst (2026-12-05).
        let obj = req.object.as_ref().expect("an object");
        assert!(!obj.tree_built(), "the pod was read as a JSON tree");
    }

    #[test]
    fn only_an_answer_to_the_same_review_is_passed_on() {
        let ok = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true}}"#;
        assert!(answers(ok, "u1").is_ok());
        let other = answers(ok, "u2").unwrap_err().to_string();
        assert!(
            other.contains(r#"it answers review "u1", not "u2""#),
            "{other}"
        );
        for bad in [
            &br#"{"response":{"uid":"u1"}}"#[..],
            br#"{"request":{"uid":"u1"}}"#,
            b"upstream connect error",
        ] {
            assert!(
                answers(bad, "u1").is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
