//! The `card-quota` binary: wires subcommands to the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use card_quota::cli::ScalePolicyArg;
use card_quota::cli::{demo, replay, status};
use card_quota::decide::Config;

#[derive(Parser)]
#[command(
    name = "card-quota",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CARD_QUOTA_COMMIT"), ")"),
    about = "Hard per-card-model quotas for Volcano queues"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay AdmissionReviews against a snapshot of objects, offline.
    Replay {
        /// YAML/JSON stream of Nodes, Queues, PodGroups, Pods, Deployments, ReplicaSets, StatefulSets.
        #[arg(long)]
        objects: PathBuf,
        /// YAML/JSON stream of admission.k8s.io/v1 AdmissionReviews.
        #[arg(long)]
        requests: PathBuf,
        /// Final usage as a JSON line instead of a table.
        #[arg(long, value_enum, default_value = "table")]
        output: replay::Output,
        #[arg(long, value_enum, default_value = "clamp")]
        scale_policy: ScalePolicyArg,
        /// Do not pin admitted pods to their model with a nodeSelector (for schedulers
        /// that already place pods by card model).
        #[arg(long)]
        no_pin: bool,
    },
    /// A narrated scenario on an embedded snapshot; needs no cluster.
    Demo,
    /// Generate a CA and a serving certificate for the webhook Service.
    Certs {
        #[arg(long, default_value = "card-quota")]
        service: String,
        #[arg(long, default_value = "card-quota")]
        namespace: String,
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// Extra DNS SANs.
        #[arg(long)]
        dns: Vec<String>,
        /// Extra IP SANs (e.g. 127.0.0.1 for a local API server).
        #[arg(long)]
        ip: Vec<std::net::IpAddr>,
    },
    /// Print the install YAML (manifests/ with the caBundle and TLS Secret filled in).
    Manifests {
        /// Directory holding ca.crt, tls.crt and tls.key (from `card-quota certs`).
        #[arg(long, default_value = "certs")]
        cert_dir: PathBuf,
        /// Point the webhooks at this base URL (e.g. https://127.0.0.1:8443) instead of
        /// the in-cluster Service; prints only the webhook configurations.
        #[arg(long)]
        url: Option<String>,
        /// Leave out matchConditions (API servers before Kubernetes 1.30).
        #[arg(long)]
        without_match_conditions: bool,
        /// Name of the webhook configurations.
        #[arg(long)]
        name: Option<String>,
        /// Only namespaces with this label (key=value) reach the webhooks (opt-in).
        #[arg(long, value_parser = parse_label)]
        namespace_label: Option<(String, String)>,
        /// card-quota's namespace (match the `certs --namespace` of the certificates).
        #[arg(long, default_value = "card-quota")]
        namespace: String,
        /// card-quota's service account.
        #[arg(long, default_value = "card-quota")]
        service_account: String,
        /// spec.schedulerName of the pods card-quota gates (repeatable; default
        /// volcano and default-scheduler). Give `serve` the same list.
        #[arg(long = "scheduler-name")]
        scheduler_names: Vec<String>,
        /// User whose pods/binding requests are gated (repeatable; default Volcano's
        /// scheduler service account in volcano-system and system:kube-scheduler).
        #[arg(long = "binder")]
        binders: Vec<String>,
    },
    /// Serve the admission webhook over HTTPS.
    Serve {
        #[arg(long, default_value = "0.0.0.0:8443")]
        listen: std::net::SocketAddr,
        #[arg(long, default_value = "0.0.0.0:8080")]
        metrics_listen: std::net::SocketAddr,
        /// Directory holding tls.crt and tls.key (a mounted TLS Secret).
        #[arg(long, default_value = "certs")]
        cert_dir: PathBuf,
        /// How often to look for a rotated certificate, in seconds.
        #[arg(long, default_value = "10")]
        cert_reload_seconds: f64,
        /// Require callers to present a client certificate signed by this CA (PEM): the
        /// certificate the API server presents to webhooks (AdmissionConfiguration
        /// `kubeConfigFile`). Others are refused at the TLS handshake.
        #[arg(long, env = "CARD_QUOTA_CLIENT_CA")]
        client_ca: Option<PathBuf>,
        /// With --client-ca: accept only certificates with this common name or DNS name
        /// (repeatable). A cluster CA signs many clients; name the API server's.
        #[arg(long, requires = "client_ca")]
        client_name: Vec<String>,
        /// On SIGTERM, seconds to keep serving while unready, so the Service stops
        /// sending new requests before the listener closes.
        #[arg(long, default_value = "5")]
        drain_seconds: f64,
        /// Gate and count only pods with this spec.schedulerName (repeatable; the same
        /// list as `manifests --scheduler-name`). Default: every pod.
        #[arg(long = "scheduler-name")]
        scheduler_names: Vec<String>,
        #[arg(long, value_enum, default_value = "clamp")]
        scale_policy: ScalePolicyArg,
        /// Do not pin admitted pods to their model with a nodeSelector (for schedulers
        /// that already place pods by card model).
        #[arg(long)]
        no_pin: bool,
        /// Decide from a static snapshot with an in-memory ledger (no API server).
        #[arg(long)]
        offline: bool,
        /// The snapshot for --offline (same input as replay).
        #[arg(long)]
        objects: Option<PathBuf>,
        /// Time allowed to record one charge in its Queue's ledger (conflicts and
        /// retries included) before the request is refused with "try again".
        #[arg(long, default_value = "3")]
        ledger_budget_seconds: f64,
        /// card-quota's own namespace, where the reconciler's Lease and the queues'
        /// ledgers (ConfigMaps) live (default: $POD_NAMESPACE, else card-quota).
        #[arg(
            long,
            visible_alias = "namespace",
            env = "POD_NAMESPACE",
            default_value = "card-quota"
        )]
        lease_namespace: String,
        #[arg(long, default_value = "card-quota-reconciler")]
        lease_name: String,
        /// Seconds between incremental reconciler passes.
        #[arg(long, default_value = "1")]
        reconcile_seconds: f64,
        /// Seconds between full recounts (the safety net for missed events).
        #[arg(long, default_value = "300")]
        full_recount_seconds: f64,
    },
    /// Per-queue, per-model usage table.
    Status {
        /// Read a snapshot file (same input as replay) instead of the live cluster.
        #[arg(long)]
        objects: Option<PathBuf>,
        #[arg(long)]
        queue: Option<String>,
        #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
        output: status::Format,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The server logs what it does; a command a person runs (status, replay, as a
    // kubectl plugin too) only warnings, so its output stays readable.
    let default_level = match cli.command {
        Command::Serve { .. } => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        .init();
    // One process-wide TLS provider: ring (no aws-lc), for the server and kube's client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Replay {
            objects,
            requests,
            output,
            scale_policy,
            no_pin,
        } => {
            let cfg = Config {
                scale_policy: scale_policy.into(),
                pin: !no_pin,
            };
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            replay::run(&objects, &requests, output, &cfg, &mut lock)?;
        }
        Command::Demo => demo::run(&mut std::io::stdout().lock())?,
        Command::Certs {
            service,
            namespace,
            out,
            dns,
            ip,
        } => {
            use base64::Engine;
            let ca = card_quota::webhook::tls::generate(&service, &namespace, &dns, &ip, &out)?;
            eprintln!("wrote {0}/ca.crt, {0}/tls.crt, {0}/tls.key", out.display());
            println!("{}", base64::engine::general_purpose::STANDARD.encode(ca));
        }
        Command::Manifests {
            cert_dir,
            url,
            without_match_conditions,
            name,
            namespace_label,
            namespace,
            service_account,
            scheduler_names,
            binders,
        } => {
            let default = card_quota::cli::manifests::Scope::default();
            let scope = card_quota::cli::manifests::Scope {
                namespace,
                service_account,
                schedulers: if scheduler_names.is_empty() {
                    default.schedulers
                } else {
                    scheduler_names
                },
                binders: if binders.is_empty() {
                    default.binders
                } else {
                    binders
                },
            };
            print!(
                "{}",
                card_quota::cli::manifests::render(&card_quota::cli::manifests::Options {
                    scope,
                    cert_dir: &cert_dir,
                    url: url.as_deref(),
                    without_match_conditions,
                    name: name.as_deref(),
                    namespace_label: namespace_label
                        .as_ref()
                        .map(|(k, v)| (k.as_str(), v.as_str())),
                })?
            );
        }
        Command::Serve {
            listen,
            metrics_listen,
            cert_dir,
            cert_reload_seconds,
            client_ca,
            client_name,
            drain_seconds,
            scheduler_names,
            scale_policy,
            no_pin,
            offline,
            objects,
            ledger_budget_seconds,
            lease_namespace,
            lease_name,
            reconcile_seconds,
            full_recount_seconds,
        } => {
            let opts = ServeOptions {
                listen,
                metrics_listen,
                cert_dir,
                reload_seconds: cert_reload_seconds,
                client: client_ca.map(|ca| card_quota::webhook::tls::ClientAuth {
                    ca,
                    names: client_name,
                }),
                drain: std::time::Duration::from_secs_f64(drain_seconds.max(0.0)),
                schedulers: (!scheduler_names.is_empty())
                    .then(|| scheduler_names.into_iter().collect()),
                config: Config {
                    scale_policy: scale_policy.into(),
                    pin: !no_pin,
                },
                ledger_budget: std::time::Duration::from_secs_f64(ledger_budget_seconds.max(0.1)),
                lease_namespace,
                lease_name,
                reconcile_every: std::time::Duration::from_secs_f64(reconcile_seconds.max(0.05)),
                full_every: std::time::Duration::from_secs_f64(full_recount_seconds.max(1.0)),
            };
            let rt = tokio::runtime::Runtime::new()?;
            if !offline {
                if objects.is_some() {
                    anyhow::bail!("--objects is only read with --offline");
                }
                return rt.block_on(serve(opts, None));
            }
            let snap = match objects {
                Some(path) => snapshot_file(&path)?,
                None => card_quota::snapshot::Snapshot::new(),
            };
            rt.block_on(serve(opts, Some(snap)))?;
        }
        Command::Status {
            objects,
            queue,
            output,
        } => {
            let snap = match objects {
                Some(path) => snapshot_file(&path)?,
                None => tokio::runtime::Runtime::new()?.block_on(live_snapshot())?,
            };
            print!(
                "{}",
                status::render(&snap, queue.as_deref(), output, jiff::Timestamp::now())?
            );
        }
    }
    Ok(())
}

/// A snapshot from a YAML/JSON stream of objects; objects it cannot read are logged.
fn snapshot_file(path: &std::path::Path) -> anyhow::Result<card_quota::snapshot::Snapshot> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (snap, skipped) = card_quota::snapshot::load::load(&text)?;
    for s in skipped {
        tracing::warn!("{}: {s}", path.display());
    }
    Ok(snap)
}

/// The cluster as the webhook sees it: the same informer caches, synced once.
async fn live_snapshot() -> anyhow::Result<card_quota::snapshot::Snapshot> {
    use card_quota::live::caches;
    use std::sync::{Arc, Mutex};
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server (kubeconfig or in-cluster config)")?;
    let snapshot = Arc::new(Mutex::new(card_quota::snapshot::Snapshot::new()));
    let synced = Arc::new(caches::Synced::default());
    tokio::spawn(caches::start(
        client,
        None,
        snapshot.clone(),
        synced.clone(),
    ));
    tokio::time::timeout(std::time::Duration::from_secs(60), synced.wait())
        .await
        .context("listing Nodes, Queues, PodGroups, Pods and workloads took over 60s")?;
    let snap = snapshot.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(snap)
}

/// The deadline of every API call but watches.
const API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

struct ServeOptions {
    listen: std::net::SocketAddr,
    metrics_listen: std::net::SocketAddr,
    cert_dir: PathBuf,
    reload_seconds: f64,
    client: Option<card_quota::webhook::tls::ClientAuth>,
    drain: std::time::Duration,
    schedulers: Option<std::collections::BTreeSet<String>>,
    config: Config,
    ledger_budget: std::time::Duration,
    lease_namespace: String,
    lease_name: String,
    reconcile_every: std::time::Duration,
    full_every: std::time::Duration,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected key=value, got {s:?}")),
    }
}

/// This replica's name in the Lease: the pod name in a cluster, else host and pid.
fn identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "card-quota".into());
        format!("{host}-{}", std::process::id())
    })
}

/// Serves offline from `snap`, or live from informer caches when `snap` is `None`.
async fn serve(
    opts: ServeOptions,
    snap: Option<card_quota::snapshot::Snapshot>,
) -> anyhow::Result<()> {
    use card_quota::controller::events::EventSink;
    use card_quota::controller::reconciler::Reconciler;
    use card_quota::live::{caches, Committer, LedgerApi};
    use card_quota::webhook::{server, tls};
    use std::sync::{Arc, Mutex};
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
            let mut timed = config;
            timed.connect_timeout = Some(std::time::Duration::from_secs(5));
            timed.read_timeout = Some(API_TIMEOUT);
            timed.write_timeout = Some(API_TIMEOUT);
            timed.reset_reader_on_write = true;
            let client = kube::Client::try_from(timed).context("connecting to the API server")?;
            let mut empty = card_quota::snapshot::Snapshot::new();
            empty.set_gated_schedulers(opts.schedulers.clone());
            let snapshot = Arc::new(Mutex::new(empty));
            let synced = Arc::new(caches::Synced::default());
            tokio::spawn(caches::start(
                watches,
                Some(opts.lease_namespace.clone()),
                snapshot.clone(),
                synced.clone(),
            ));
            let committer = Arc::new(Committer::new(
                LedgerApi::new(client.clone(), &opts.lease_namespace),
                opts.ledger_budget,
            ));
            let me = identity();
            let events = Arc::new(EventSink::new(client.clone(), Some(me.clone())));
            let state = Arc::new(server::State::live(
                snapshot.clone(),
                opts.config,
                server::Live {
                    committer: committer.clone(),
                    synced: synced.clone(),
                    events: Some(events.clone()),
                },
            ));
            let lease =
                kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &opts.lease_name)
                    .with_namespace(&opts.lease_namespace)
                    .with_identity(&me)
                    .build()
                    .await
                    .with_context(|| {
                        format!(
                            "setting up Lease {}/{}",
                            opts.lease_namespace, opts.lease_name
                        )
                    })?;
            let (leader, task) = lease.watch().await;
            lease_task = Some(task);
            let check = card_quota::live::leadership::LeaseCheck::new(
                client.clone(),
                &opts.lease_namespace,
                &opts.lease_name,
                &me,
            );
            let reconciler = Reconciler::new(
                client,
                snapshot,
                events,
                state.metrics.clone(),
                leader,
                committer,
            )
            .with_lease_check(check);
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
        tokio::spawn(server::reload_certs(resolver, every, stop_rx)),
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
    // The reconciler held the Lease's receiver; with it gone the manager releases the
    // Lease so the other replica takes over at once.
    if let Some(task) = lease_task {
        match tokio::time::timeout(std::time::Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("Lease released"),
            Ok(Ok(Err(e))) => tracing::warn!("releasing the Lease: {e}"),
            Ok(Err(e)) => tracing::warn!("Lease task: {e}"),
            Err(_) => tracing::warn!("Lease not released within 5s"),
        }
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
