//! `serve`: the webhook server, and in live mode the caches, the ledger writer, the
//! Lease and the reconciler around it.

use std::path::PathBuf;

use anyhow::Context;
use card_quota::decide::Config;

use crate::args::ServeArgs;
use crate::lease;
use crate::snapshots::{snapshot_file, start_caches};

/// The deadline of every API call but watches.
const API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct ServeOptions {
    listen: std::net::SocketAddr,
    metrics_listen: std::net::SocketAddr,
    cert_dir: PathBuf,
    reload_seconds: f64,
    client: Option<card_quota::webhook::tls::ClientAuth>,
    drain: std::time::Duration,
    cards: card_quota::cards::CardResources,
    config: Config,
    ledger_budget: std::time::Duration,
    holds: bool,
    lease_namespace: String,
    lease_name: String,
    reconcile_every: std::time::Duration,
    full_every: std::time::Duration,
    /// Where peers reach this replica, when charges are routed to queue owners.
    advertise: Option<std::net::SocketAddr>,
}

async fn serve(
    opts: ServeOptions,
    snap: Option<card_quota::snapshot::Snapshot>,
) -> anyhow::Result<()> {
    use card_quota::controller::events::EventSink;
    use card_quota::controller::reconciler::Reconciler;
    use card_quota::live::peers::{self, Peers};
    use card_quota::live::{Committer, LedgerApi};
    use card_quota::webhook::forward::Forwarder;
    use card_quota::webhook::{server, tls};
    use std::sync::Arc;
    let resolver = Arc::new(tls::Reloading::new(opts.cert_dir)?);
    let tls_config = tls::server_config(resolver.clone(), opts.client.as_ref())?;
    match &opts.client {
        Some(c) if c.names.is_empty() => tracing::warn!(
            "callers need a certificate from {}; without --client-name any certificate it signed is accepted",
            c.ca.display()
        ),
        Some(c) => tracing::info!("callers need a certificate from {} named one of {:?}", c.ca.display(), c.names),
        None => tracing::warn!("no --client-ca: any caller that reaches the port can send admission reviews"),
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Set when shutdown begins: the peer Lease goes first, so that peers stop sending
    // charges here while this replica drains.
    let (withdraw_tx, withdraw_rx) = tokio::sync::watch::channel(false);
    let mut background = Vec::new();
    let mut lease_task = None;
    let state = match snap {
        Some(snap) => Arc::new(server::State::new(snap, opts.config)),
        None => {
            let config = kube::Config::infer()
                .await
                .context("reading the API server's address (kubeconfig or in-cluster config)")?;
            // Watches wait on the server by design; every other call gets a deadline, so
            // one hung call cannot hold the Lease or a queue's writer.
            let watches =
                kube::Client::try_from(config.clone()).context("connecting to the API server")?;
            let watch_config = config.clone();
            let mut timed = config;
            timed.connect_timeout = Some(std::time::Duration::from_secs(5));
            timed.read_timeout = Some(API_TIMEOUT);
            timed.write_timeout = Some(API_TIMEOUT);
            timed.reset_reader_on_write = true;
            let client = kube::Client::try_from(timed).context("connecting to the API server")?;
            let freshness = card_quota::live::freshness::Freshness::connecting(
                card_quota::live::caches::probe(client.clone()),
                Some(watch_config),
            );
            let (snapshot, synced) = start_caches(
                watches,
                Some(opts.lease_namespace.clone()),
                &opts.cards,
                Some(freshness.clone()),
            );
            let me = lease::identity();
            let mut committer = Committer::new(
                LedgerApi::new(client.clone(), &opts.lease_namespace),
                opts.ledger_budget,
            )
            .with_freshness(freshness)
            .with_queue_reads(kube::Api::all_with(
                client.clone(),
                &card_quota::live::volcano::queue_resource(),
            ));
            if opts.holds {
                // A restarted replica must not take its predecessor's hold for its own.
                let incarnation = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default();
                committer = committer.with_holds(format!("{me}.{incarnation:x}"));
            }
            let committer = Arc::new(committer);
            let events = Arc::new(EventSink::new(client.clone(), Some(me.clone())));
            let routing = match opts.advertise {
                Some(addr) => {
                    let peers =
                        Peers::watch(client.clone(), &opts.lease_namespace, &me, stop_rx.clone());
                    background.push(tokio::spawn(peers::advertise(
                        client.clone(),
                        opts.lease_namespace.clone(),
                        peers::lease_name(&opts.lease_name, &me),
                        me.clone(),
                        addr,
                        synced.clone(),
                        withdraw_rx.clone(),
                    )));
                    Some(server::Routing::new(
                        peers,
                        Forwarder::new(resolver.clone(), &me)?,
                    ))
                }
                None => None,
            };
            let state = Arc::new(server::State::live(
                snapshot.clone(),
                opts.config.clone(),
                server::Live {
                    committer: committer.clone(),
                    synced: synced.clone(),
                    events: Some(events.clone()),
                    routing,
                },
            ));
            let metrics: Arc<dyn card_quota::live::charge::CommitMetrics> =
                state.metrics.ledger.clone();
            background.push(tokio::spawn(committer.clone().keep_holds(
                snapshot.clone(),
                opts.config.clone(),
                metrics,
                stop_rx.clone(),
            )));
            let (leader, task, check) =
                lease::acquire(client.clone(), &opts.lease_namespace, &opts.lease_name, &me)
                    .await?;
            lease_task = Some(task);
            let reconciler = Reconciler::new(
                client,
                snapshot,
                events,
                (
                    state.metrics.reconciler.clone(),
                    state.metrics.ledger.clone(),
                ),
                leader,
                committer,
            )
            .with_lease_check(check)
            .with_fail_open(opts.config.enforcement == card_quota::decide::Enforcement::Warn);
            let reconciling = tokio::spawn(reconciler.run(
                synced.clone(),
                opts.reconcile_every,
                opts.full_every,
                stop_rx.clone(),
            ));
            // The reconciler runs until shutdown; ending earlier (a panic) makes the
            // process unhealthy, so the kubelet restarts it.
            let stopping = stop_rx.clone();
            background.push(tokio::spawn(async move {
                let why = match reconciling.await {
                    Ok(()) => "ended".to_string(),
                    Err(e) => e.to_string(),
                };
                if !*stopping.borrow() {
                    synced.stop(format!("the reconciler stopped ({why})"));
                }
            }));
            state
        }
    };
    let admission = server::bind(opts.listen).await?;
    let health = server::bind(opts.metrics_listen).await?;
    tracing::info!(
        "admission on https://{}, health and metrics on http://{}",
        admission.local_addr()?,
        health.local_addr()?
    );
    state
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let every = std::time::Duration::from_secs_f64(opts.reload_seconds.max(0.05));
    let tasks = vec![
        tokio::spawn(server::serve_tls(
            admission,
            tls_config,
            state.clone(),
            stop_rx.clone(),
        )),
        tokio::spawn(server::serve_health(health, state.clone(), stop_rx.clone())),
        tokio::spawn(server::reload_certs(
            resolver,
            every,
            state.metrics.webhook.certificate_expiry.clone(),
            stop_rx,
        )),
    ];
    shutdown_signal().await;
    // Unready first, and keep serving while endpoints and the API server's connection
    // pool catch up; only then close the listener and finish in-flight requests.
    state
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    state
        .draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = withdraw_tx.send(true);
    tracing::info!("shutting down: unready, serving {:?} more", opts.drain);
    tokio::select! {
        _ = tokio::time::sleep(opts.drain) => {}
        _ = shutdown_signal() => tracing::info!("second signal: not waiting for the drain"),
    }
    tracing::info!("shutting down: finishing in-flight admissions");
    let _ = stop_tx.send(true);
    for t in tasks.into_iter().chain(background) {
        let _ = t.await;
    }
    if let Some(task) = lease_task {
        lease::release(task).await;
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Where peers reach this replica under --peer-routing (`None` without it).
fn advertise_address(a: &ServeArgs) -> anyhow::Result<Option<std::net::SocketAddr>> {
    if !a.peer_routing || a.offline {
        return Ok(None);
    }
    if let Some(addr) = a.advertise_address {
        return Ok(Some(addr));
    }
    let ip = std::env::var("POD_IP").context(
        "--peer-routing needs --advertise-address, or $POD_IP (downward API status.podIP)",
    )?;
    let ip: std::net::IpAddr = ip
        .parse()
        .with_context(|| format!("$POD_IP is {ip:?}, not an IP address"))?;
    Ok(Some(std::net::SocketAddr::new(ip, a.listen.port())))
}

/// Runs `serve` until SIGTERM: offline from `--objects`, else live.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    crate::args::no_scheduler_filter(&a.scheduler_names);
    let advertise = advertise_address(&a)?;
    let opts = ServeOptions {
        listen: a.listen,
        metrics_listen: a.metrics_listen,
        cert_dir: a.cert_dir,
        reload_seconds: a.cert_reload_seconds,
        client: a.client_ca.map(|ca| card_quota::webhook::tls::ClientAuth {
            ca,
            names: a.client_name,
        }),
        drain: std::time::Duration::from_secs_f64(a.drain_seconds.max(0.0)),
        cards: a.cards.settings()?,
        config: Config {
            scale_policy: a.scale_policy.into(),
            pin: !a.no_pin,
            enforcement: a.enforcement.into(),
            full: a.card_full.into(),
            namespace_enforcement: namespace_enforcement(&a.namespace_enforcement)?,
            max_queue_depth: a.max_queue_depth,
            any_model: false,
        },
        ledger_budget: std::time::Duration::from_secs_f64(a.ledger_budget_seconds.max(0.1)),
        holds: !a.no_holds,
        lease_namespace: a.lease_namespace,
        lease_name: a.lease_name,
        reconcile_every: std::time::Duration::from_secs_f64(a.reconcile_seconds.max(0.05)),
        full_every: std::time::Duration::from_secs_f64(a.full_recount_seconds.max(1.0)),
        advertise,
    };
    let rt = tokio::runtime::Runtime::new()?;
    if !a.offline {
        if a.objects.is_some() {
            anyhow::bail!("--objects is only read with --offline");
        }
        return rt.block_on(serve(opts, None));
    }
    let snap = match a.objects {
        Some(path) => snapshot_file(&path, &opts.cards)?,
        None => card_quota::snapshot::Snapshot::new(),
    };
    rt.block_on(serve(opts, Some(snap)))
}

/// `--namespace-enforcement`, saying at start-up that a namespace in warn loosens nothing
/// (namespaces may only tighten a queue's enforcement).
fn namespace_enforcement(
    entries: &[String],
) -> anyhow::Result<card_quota::decide::NamespaceEnforcement> {
    let parsed = card_quota::decide::NamespaceEnforcement::parse(entries)?;
    for (ns, mode) in parsed.entries() {
        if mode == card_quota::decide::Enforcement::Warn {
            tracing::warn!(
                namespace = ns,
                "--namespace-enforcement {ns}=warn loosens nothing: a namespace may only tighten its queues' enforcement (a queue in deny stays deny); give the queue volcano.sh/card.enforcement: warn instead"
            );
        }
    }
    Ok(parsed)
}
