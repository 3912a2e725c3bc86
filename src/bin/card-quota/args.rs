//! The command line: one struct of flags per subcommand.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use card_quota::cli::{replay, status};
use card_quota::cli::{EnforcementArg, FullArg, ScalePolicyArg};

#[derive(Parser)]
#[command(
    name = "card-quota",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CARD_QUOTA_COMMIT"), ")"),
    about = "Hard per-card-model quotas for Volcano queues"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Replay AdmissionReviews against a snapshot of objects, offline.
    #[command(
        after_help = "Prints one AdmissionReview answer per request (patches in base64, as the API server takes them; --decode-patches writes them as JSON to read), then the final usage. RUST_LOG=info also logs each patch and each Event."
    )]
    Replay(ReplayArgs),
    /// A narrated scenario on an embedded snapshot; needs no cluster.
    Demo,
    /// Generate a CA and a serving certificate for the webhook Service.
    Certs(CertsArgs),
    /// Print the install YAML (manifests/ with the caBundle and TLS Secret filled in).
    Manifests(ManifestsArgs),
    /// Serve the admission webhook over HTTPS.
    Serve(ServeArgs),
    /// Per-queue, per-model usage table.
    Status(StatusArgs),
    /// Would a manifest's Pods, Deployments, Jobs or Volcano Jobs be admitted now, on
    /// which models, and if not, why? Nothing is written to the cluster.
    #[command(
        after_help = "Exit status: 0 when every object would run whole now, 2 when one would be refused (or partly), or would wait at Volcano's enqueue, 1 on an error."
    )]
    Check(CheckArgs),
    /// Remove card-quota's scheduling gate (volcano.sh/card-quota) from every pod that
    /// waits behind it: run it when uninstalling, after removing the webhooks (pods then
    /// go to the scheduler as if card-quota had never held them). Other owners' gates
    /// stay.
    Ungate(UngateArgs),
}

#[derive(Args)]
pub struct UngateArgs {
    /// Only pods of this namespace (default: every namespace).
    #[arg(short = 'n', long = "namespace")]
    pub namespace: Option<String>,
    /// List the pods that wait, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The kubeconfig file to read (default: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

#[derive(Args)]
pub struct CheckArgs {
    /// The manifest (YAML or JSON, several documents) to check; `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    pub filename: PathBuf,
    /// The namespace of objects that name none (as kubectl's -n).
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    /// Check against a snapshot file (same input as replay) instead of the live cluster.
    #[arg(long)]
    pub objects: Option<PathBuf>,
    /// What a queue without volcano.sh/card.enforcement does: the install's
    /// --enforcement (a warn install admits with a warning what deny refuses).
    #[arg(long, value_enum, default_value = "deny")]
    pub enforcement: EnforcementArg,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: status::Format,
    #[command(flatten)]
    pub cards: CardArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// YAML/JSON stream of Nodes, Queues, PodGroups, Pods, Deployments, ReplicaSets, StatefulSets.
    #[arg(long)]
    pub objects: PathBuf,
    /// YAML/JSON stream of admission.k8s.io/v1 AdmissionReviews.
    #[arg(long)]
    pub requests: PathBuf,
    /// Final usage as a JSON line instead of a table.
    #[arg(long, value_enum, default_value = "table")]
    pub output: replay::Output,
    /// Write each response's `patch` as the JSON patch itself instead of base64, to
    /// read it (the API server takes base64 only).
    #[arg(long)]
    pub decode_patches: bool,
    /// A scale-up that does not fully fit: clamp (lower spec.replicas to what fits) or
    /// deny.
    #[arg(long, value_enum, default_value = "clamp")]
    pub scale_policy: ScalePolicyArg,
    /// What a queue without `volcano.sh/card.enforcement` does with a request that does
    /// not fit its quota: refuse it (deny), or admit it with a warning, an Event and a
    /// metric (warn: roll out first in warn, then switch).
    #[arg(long, value_enum, default_value = "deny")]
    pub enforcement: EnforcementArg,
    /// What a queue without `volcano.sh/card.full` does with a pod that does not fit its
    /// room now but could fit its quota: refuse it, or admit it behind card-quota's
    /// scheduling gate and release it in the queue's order when room appears (wait).
    #[arg(long = "card-full", value_enum, default_value = "refuse")]
    pub card_full: FullArg,
    /// Per namespace (repeatable NAMESPACE=deny|warn): may only tighten. A namespace in
    /// deny is refused even in a queue in warn (roll out namespace by namespace); warn
    /// never loosens a queue in deny, whoever charges it.
    #[arg(long = "namespace-enforcement", value_name = "NAMESPACE=MODE")]
    pub namespace_enforcement: Vec<String>,
    /// The deepest a queue may sit below Volcano's root queue; a Queue apply that would
    /// go deeper is refused.
    #[arg(long, default_value_t = card_quota::decide::DEFAULT_MAX_QUEUE_DEPTH)]
    pub max_queue_depth: usize,
    /// Do not pin admitted pods to their model with a nodeSelector (for schedulers
    /// that already place pods by card model).
    #[arg(long)]
    pub no_pin: bool,
    #[command(flatten)]
    pub cards: CardArgs,
    /// Ignored (kept for older installs): every card pod is checked and counted
    /// whatever its spec.schedulerName.
    #[arg(long = "scheduler-name", hide = true)]
    pub scheduler_names: Vec<String>,
}

#[derive(Args)]
pub struct CertsArgs {
    /// The webhook Service's name (the certificate is for <service>.<namespace>.svc).
    #[arg(long, default_value = "card-quota")]
    pub service: String,
    /// The namespace card-quota runs in (give `manifests --namespace` the same).
    #[arg(long, default_value = "card-quota")]
    pub namespace: String,
    /// Where ca.crt, ca.key, tls.crt and tls.key go (and, during a CA rotation,
    /// ca-previous.crt).
    #[arg(long, default_value = "certs")]
    pub out: PathBuf,
    /// Extra DNS SANs.
    #[arg(long)]
    pub dns: Vec<String>,
    /// Extra IP SANs (e.g. 127.0.0.1 for a local API server).
    #[arg(long)]
    pub ip: Vec<std::net::IpAddr>,
    /// A new serving certificate under the CA kept in --out (the caBundle stays).
    #[arg(long, group = "mode")]
    pub renew: bool,
    /// A new CA; the old one stays in the caBundle (ca-previous.crt) until
    /// --drop-previous-ca, so replicas still serving the old certificate are trusted.
    #[arg(long, group = "mode")]
    pub rotate_ca: bool,
    /// Ends a CA rotation once every replica serves the new certificate.
    #[arg(long, group = "mode")]
    pub drop_previous_ca: bool,
    /// Replace the CA and certificate that are there (an outage until both the new
    /// caBundle and the new certificate are in place).
    #[arg(long, group = "mode")]
    pub force: bool,
}

#[derive(Args)]
pub struct ManifestsArgs {
    /// Directory holding ca.crt, tls.crt and tls.key (from `card-quota certs`).
    #[arg(long, default_value = "certs")]
    pub cert_dir: PathBuf,
    /// Point the webhooks at this base URL (e.g. https://127.0.0.1:8443) instead of
    /// the in-cluster Service; prints only the webhook configurations.
    #[arg(long)]
    pub url: Option<String>,
    /// Leave out matchConditions (API servers before Kubernetes 1.30).
    #[arg(long)]
    pub without_match_conditions: bool,
    /// For `serve --no-pin` (a card-aware scheduler chooses the model): the binding
    /// check is then the hard line and its hooks fail closed, and the Deployment runs
    /// `serve --no-pin`. Default: pins on, binding hooks fail open (a safety net).
    #[arg(long)]
    pub no_pin: bool,
    /// The Deployment's `serve --enforcement` (deny or warn).
    #[arg(long, value_enum, default_value = "deny")]
    pub enforcement: EnforcementArg,
    /// Per namespace (repeatable NAMESPACE=deny|warn): may only tighten. A namespace in
    /// deny is refused even in a queue in warn (roll out namespace by namespace); warn
    /// never loosens a queue in deny, whoever charges it.
    #[arg(long = "namespace-enforcement", value_name = "NAMESPACE=MODE")]
    pub namespace_enforcement: Vec<String>,
    /// The Deployment's image (default: ghcr.io/card-quota/card-quota:<this version>).
    #[arg(long)]
    pub image: Option<String>,
    /// Name of the webhook configurations.
    #[arg(long)]
    pub name: Option<String>,
    /// Only namespaces with this label (key=value) reach the webhooks (opt-in).
    #[arg(long, value_parser = parse_label)]
    pub namespace_label: Option<(String, String)>,
    /// card-quota's namespace (match the `certs --namespace` of the certificates).
    #[arg(long, default_value = "card-quota")]
    pub namespace: String,
    /// card-quota's service account.
    #[arg(long, default_value = "card-quota")]
    pub service_account: String,
    #[command(flatten)]
    pub cards: CardArgs,
    /// Ignored (kept for older scripts): every card pod is checked at its CREATE
    /// whatever its spec.schedulerName.
    #[arg(long = "scheduler-name", hide = true)]
    pub scheduler_names: Vec<String>,
    /// User whose pods/binding requests are gated (repeatable; default Volcano's
    /// scheduler service account in volcano-system and system:kube-scheduler).
    #[arg(long = "binder")]
    pub binders: Vec<String>,
}

#[derive(Args)]
pub struct ServeArgs {
    /// The HTTPS admission address (/mutate, /validate).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    /// The plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_listen: std::net::SocketAddr,
    /// Directory holding tls.crt and tls.key (a mounted TLS Secret).
    #[arg(long, default_value = "certs")]
    pub cert_dir: PathBuf,
    /// How often to look for a rotated certificate, in seconds.
    #[arg(long, default_value = "10")]
    pub cert_reload_seconds: f64,
    /// Require callers to present a client certificate signed by this CA (PEM): the
    /// certificate the API server presents to webhooks (AdmissionConfiguration
    /// `kubeConfigFile`). Others are refused at the TLS handshake.
    #[arg(long, env = "CARD_QUOTA_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// With --client-ca: accept only certificates with this common name or DNS name
    /// (repeatable). A cluster CA signs many clients; name the API server's.
    #[arg(long, requires = "client_ca")]
    pub client_name: Vec<String>,
    /// On SIGTERM, seconds to keep serving while unready, so the Service stops
    /// sending new requests before the listener closes.
    #[arg(long, default_value = "5")]
    pub drain_seconds: f64,
    #[command(flatten)]
    pub cards: CardArgs,
    /// Ignored (kept for older installs): every card pod is checked and counted
    /// whatever its spec.schedulerName.
    #[arg(long = "scheduler-name", hide = true)]
    pub scheduler_names: Vec<String>,
    /// A scale-up that does not fully fit: clamp (lower spec.replicas to what fits) or
    /// deny.
    #[arg(long, value_enum, default_value = "clamp")]
    pub scale_policy: ScalePolicyArg,
    /// What a queue without `volcano.sh/card.enforcement` does with a request that does
    /// not fit its quota: refuse it (deny), or admit it with a warning, an Event and a
    /// metric (warn: roll out first in warn, then switch).
    #[arg(long, value_enum, default_value = "deny")]
    pub enforcement: EnforcementArg,
    /// What a queue without `volcano.sh/card.full` does with a pod that does not fit its
    /// room now but could fit its quota: refuse it, or admit it behind card-quota's
    /// scheduling gate and release it in the queue's order when room appears (wait).
    #[arg(long = "card-full", value_enum, default_value = "refuse")]
    pub card_full: FullArg,
    /// Per namespace (repeatable NAMESPACE=deny|warn): may only tighten. A namespace in
    /// deny is refused even in a queue in warn (roll out namespace by namespace); warn
    /// never loosens a queue in deny, whoever charges it.
    #[arg(long = "namespace-enforcement", value_name = "NAMESPACE=MODE")]
    pub namespace_enforcement: Vec<String>,
    /// The deepest a queue may sit below Volcano's root queue; a Queue apply that would
    /// go deeper is refused.
    #[arg(long, default_value_t = card_quota::decide::DEFAULT_MAX_QUEUE_DEPTH)]
    pub max_queue_depth: usize,
    /// Do not pin admitted pods to their model with a nodeSelector (for schedulers
    /// that already place pods by card model).
    #[arg(long)]
    pub no_pin: bool,
    /// Decide from a static snapshot with an in-memory ledger (no API server).
    #[arg(long)]
    pub offline: bool,
    /// The snapshot for --offline (same input as replay).
    #[arg(long)]
    pub objects: Option<PathBuf>,
    /// Time allowed to record one charge in its Queue's ledger (conflicts and
    /// retries included) before the request is refused with "try again".
    #[arg(long, default_value = "3")]
    pub ledger_budget_seconds: f64,
    /// Take no holds of headroom: record every pod charge with a ledger write of its
    /// own. By default each replica holds spare cards per queue and model in the
    /// queue's ledger and admits within them without a write (docs/consistency.md).
    #[arg(long)]
    pub no_holds: bool,
    /// card-quota's own namespace, where the reconciler's Lease and the queues'
    /// ledgers (ConfigMaps) live (default: $POD_NAMESPACE, else card-quota).
    #[arg(
        long,
        visible_alias = "namespace",
        env = "POD_NAMESPACE",
        default_value = "card-quota"
    )]
    pub lease_namespace: String,
    /// The Lease the reconciler's leader holds (in --lease-namespace).
    #[arg(long, default_value = "card-quota-reconciler")]
    pub lease_name: String,
    /// Send each charge to the replica that owns its queue, found through peer Leases
    /// in --namespace, so that one replica writes each queue's ledger (fewer, larger
    /// writes and no conflicts between replicas). A replica that cannot reach the
    /// owner records the charge itself. Peers present the serving certificate as their
    /// client certificate, which --client-ca accepts from them.
    #[arg(long)]
    pub peer_routing: bool,
    /// With --peer-routing: host:port where the other replicas reach this one's webhook
    /// (default: $POD_IP and the --listen port).
    #[arg(long, requires = "peer_routing")]
    pub advertise_address: Option<std::net::SocketAddr>,
    /// Seconds between incremental reconciler passes.
    #[arg(long, default_value = "1")]
    pub reconcile_seconds: f64,
    /// Seconds between full recounts (the safety net for missed events).
    #[arg(long, default_value = "300")]
    pub full_recount_seconds: f64,
}

#[derive(Args)]
pub struct StatusArgs {
    /// Read a snapshot file (same input as replay) instead of the live cluster.
    #[arg(long)]
    pub objects: Option<PathBuf>,
    #[arg(long)]
    pub queue: Option<String>,
    /// Only the queues this namespace's card pods and PodGroups are charged to, and the
    /// Jobs waiting in it. Live, it lists pods and PodGroups in that namespace alone.
    #[arg(short = 'n', long = "namespace", conflicts_with = "would_refuse")]
    pub namespace: Option<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: status::Format,
    #[command(flatten)]
    pub cards: CardArgs,
    /// Ignored (kept for older scripts): every card pod is counted whatever its
    /// spec.schedulerName.
    #[arg(long = "scheduler-name", hide = true)]
    pub scheduler_names: Vec<String>,
    /// Pre-flight: list the card pods and PodGroups of --objects (a dump of the cluster,
    /// docs/operations.md) that enforcement (deny) would refuse today, oldest first.
    #[arg(long, requires = "objects")]
    pub would_refuse: bool,
    /// Live: count every pod from the cluster's objects (the webhook's own caches; needs
    /// list rights on pods and workloads cluster-wide) instead of reading the usage the
    /// reconciler wrote on each Queue.
    #[arg(long, conflicts_with = "objects")]
    pub recount: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Which cluster a live command reads, as kubectl picks it.
#[derive(Args, Clone, Default)]
pub struct ClusterArgs {
    /// The kubeconfig file to read (default: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster config).
    #[arg(long, value_name = "PATH", conflicts_with = "objects")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME", conflicts_with = "objects")]
    pub context: Option<String>,
}

/// `--scheduler-name` no longer limits anything: every card pod is checked at its
/// CREATE and counted, whatever its scheduler (a card pod of an unlisted scheduler used
/// to bypass the quota). Accepted so that older installs still start, and said aloud.
pub fn no_scheduler_filter(names: &[String]) {
    if !names.is_empty() {
        tracing::warn!(
            "--scheduler-name {} is ignored: every card pod is checked and counted whatever its spec.schedulerName; the binders (manifests --binder) say whose bindings are checked",
            names.join(",")
        );
    }
}

/// Which resources and DRA devices are cards: the same on every command that reads
/// the cluster and on the install it renders.
#[derive(Args)]
pub struct CardArgs {
    /// A card resource: an extended resource name (nvidia.com/gpu) or a pattern ending
    /// in '*' (nvidia.com/mig-*); repeatable. Pods requesting one are card pods; a node's
    /// cards count only under these. Default: nvidia.com/gpu, nvidia.com/gpu.shared,
    /// nvidia.com/mig-*, amd.com/gpu, huawei.com/Ascend*, huawei.com/npu.
    #[arg(long = "card-resource", value_name = "NAME|PREFIX*")]
    pub card_resources: Vec<String>,
    /// A DRA driver whose devices are cards (repeatable): DRIVER=ATTRIBUTE, the
    /// attribute naming a device's product (gpu.example.com=productName), or a driver
    /// known by name. Default: gpu.nvidia.com (MIG devices by profile),
    /// hami-core-gpu.project-hami.io.
    #[arg(long = "dra-driver", value_name = "DRIVER[=ATTRIBUTE]")]
    pub dra_drivers: Vec<String>,
    /// A DeviceClass whose requests ask for cards (repeatable); requests of other
    /// classes are not charged. Default: gpu.nvidia.com, mig.nvidia.com,
    /// hami-core-gpu.project-hami.io.
    #[arg(long = "dra-class", value_name = "CLASS")]
    pub dra_classes: Vec<String>,
}

impl CardArgs {
    /// The settings these flags give (the defaults for each list left empty).
    pub fn settings(&self) -> anyhow::Result<card_quota::cards::CardResources> {
        let resources = if self.card_resources.is_empty() {
            card_quota::cards::CardResources::default()
        } else {
            card_quota::cards::CardResources::parse(&self.card_resources)
                .context("--card-resource")?
        };
        let dra = card_quota::cards::dra::DraSettings::parse(&self.dra_drivers, &self.dra_classes)
            .context("--dra-driver/--dra-class")?;
        Ok(resources.with_dra(dra))
    }
}

pub fn parse_label(s: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(anyhow::anyhow!("expected key=value, got {s:?}")),
    }
}
