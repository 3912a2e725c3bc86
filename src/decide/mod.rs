//! One pure function per admission kind (docs/decisions.md): each reads the snapshot and a
//! request, and returns allow / deny-with-reason / patch / warnings.

pub mod allocation;
pub mod batch;
pub mod binding;
pub mod candidates;
pub mod claim;
pub mod enforcement;
pub mod escrow;
pub mod fit;
pub mod job;
pub mod messages;
pub mod patch;
pub mod pod;
pub mod podgroup;
pub mod queue;
pub mod queue_tree;
pub mod review;
pub mod room;
pub mod scale;
pub mod seal;
pub mod tree;
pub mod wait;

pub use crate::cards::annotations::Enforcement;
use crate::cards::QueueName;
use crate::ledger::Effect;
use crate::snapshot::Snapshot;
use review::AdmissionRequest;

/// What to do about a scale-up that does not fully fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScalePolicy {
    /// Lower `spec.replicas` to what fits (the HPA then sits at the quota).
    #[default]
    Clamp,
    /// Refuse the scale-up.
    Deny,
}

/// The default of `--max-queue-depth`: levels below `root`.
pub const DEFAULT_MAX_QUEUE_DEPTH: usize = 5;

/// Settings of the decisions.
#[derive(Debug, Clone)]
pub struct Config {
    pub scale_policy: ScalePolicy,
    /// Pin each admitted pod to the model it was admitted for (a nodeSelector on the
    /// model's product label), so that any scheduler places it there.
    pub pin: bool,
    /// The enforcement of queues without `volcano.sh/card.enforcement`.
    pub enforcement: Enforcement,
    /// The deepest a queue may sit below `root` (`--max-queue-depth`).
    pub max_queue_depth: usize,
    /// Per namespace, an enforcement that may only tighten a queue's: a namespace in
    /// deny is refused even in a queue in warn; one in warn never loosens a queue in deny.
    pub namespace_enforcement: NamespaceEnforcement,
    /// A binding takes its node's model whatever its pod names: set only for warn's
    /// second decision of a binding its pod's name refuses (nothing pinned the pod).
    pub any_model: bool,
    /// What a queue without `volcano.sh/card.full` does with a pod that does not fit
    /// its room now (`--card-full`).
    pub full: crate::cards::annotations::Full,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            scale_policy: ScalePolicy::default(),
            pin: true,
            enforcement: Enforcement::default(),
            max_queue_depth: DEFAULT_MAX_QUEUE_DEPTH,
            namespace_enforcement: NamespaceEnforcement::default(),
            any_model: false,
            full: crate::cards::annotations::Full::default(),
        }
    }
}

impl Config {
    /// The `--namespace-enforcement` of `namespace` (empty: cluster-scoped), if any.
    pub fn namespace_mode(&self, namespace: &str) -> Option<Enforcement> {
        self.namespace_enforcement.0.get(namespace).copied()
    }
}

/// `--namespace-enforcement NAMESPACE=MODE` entries (Kyverno's per-namespace
/// `validationFailureActionOverrides`): roll out namespace by namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceEnforcement(std::sync::Arc<std::collections::BTreeMap<String, Enforcement>>);

/// A `--namespace-enforcement` entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --namespace-enforcement {given:?}: {why}")]
pub struct NamespaceEnforcementError {
    given: String,
    why: String,
}

impl NamespaceEnforcement {
    /// Parses `NAMESPACE=deny|warn` entries; a namespace named twice is an error (which
    /// one was meant?).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, NamespaceEnforcementError> {
        let mut map = std::collections::BTreeMap::new();
        for e in entries {
            let given = e.as_ref();
            let err = |why: String| NamespaceEnforcementError {
                given: given.to_string(),
                why,
            };
            let (ns, mode) = given
                .split_once('=')
                .ok_or_else(|| err("expected NAMESPACE=deny or NAMESPACE=warn".into()))?;
            if !is_dns_label(ns) {
                return Err(err(format!(
                    "{ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
                )));
            }
            let mode: Enforcement = mode.parse().map_err(err)?;
            if map.insert(ns.to_string(), mode).is_some() {
                return Err(err(format!("namespace {ns} is named more than once")));
            }
        }
        Ok(Self(std::sync::Arc::new(map)))
    }

    /// The entries, in namespace order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, Enforcement)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// RFC 1123 label: what a namespace name is.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// An object an Event should be attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// Lets `kubectl describe` find the Event.
    pub uid: Option<String>,
}

/// An Event the webhook should emit about a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventIntent {
    pub regarding: ObjectRef,
    pub reason: &'static str,
    pub message: String,
    pub warning: bool,
    /// A second object the same Event is shown on (a held PodGroup's Volcano Job).
    pub also: Option<ObjectRef>,
}

/// What a charging decision adds to a queue (recorded in the consistency ledger).
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    pub queue: QueueName,
    /// The pod or PodGroup as admitted.
    pub effect: Effect,
}

/// The answer to one admission request.
#[derive(Debug, Clone, Default)]
pub struct Decision {
    pub allowed: bool,
    pub message: Option<String>,
    /// Machine-readable reason, also the Event reason.
    pub reason: Option<messages::Reason>,
    pub patch: Vec<json_patch::PatchOperation>,
    pub warnings: Vec<String>,
    pub event: Option<Box<EventIntent>>,
    /// Set on admitted requests that charge a queue.
    pub charge: Option<Box<Charge>>,
    /// The feasibility search ran out of budget.
    pub undecided: bool,
    /// Admitted only because the queue's enforcement is `warn`: why `deny` would
    /// refuse it.
    pub would_refuse: Option<messages::Reason>,
    /// The answer when the patch cannot take effect (the validating call, which sees
    /// the object as the mutating call left it): an admission that holds only with its
    /// patch (a pod let in to wait behind the gate the patch adds) is then this refusal.
    pub unless_patched: Option<Box<Decision>>,
    /// The node label `/mutate` pinned the pod with now (its patch adds it): a pin in
    /// flight until `/validate` charges it (`snapshot::pins_in_flight`).
    pub pinned: Option<Box<crate::snapshot::pins_in_flight::PinLabel>>,
}

impl Decision {
    /// The answer of the validating call: [`Decision::unless_patched`] when there is one.
    pub fn validated(mut self) -> Self {
        match self.unless_patched.take() {
            Some(d) => *d,
            None => self,
        }
    }

    pub fn allow() -> Self {
        Self {
            allowed: true,
            ..Default::default()
        }
    }
    pub fn deny(reason: messages::Reason, message: impl Into<String>) -> Self {
        Self {
            allowed: false,
            reason: Some(reason),
            message: Some(messages::cap(message.into())),
            ..Default::default()
        }
    }
    /// Admitted only because the queue's enforcement is `warn`.
    pub fn warned(&self) -> bool {
        self.would_refuse.is_some()
    }
    pub fn with_warning(mut self, w: impl Into<String>) -> Self {
        self.warnings.push(messages::cap(w.into()));
        self
    }
    /// Attaches a warning Event about a denial to `regarding` (no-op when allowed or
    /// when there is no object to attach it to).
    pub fn with_event(mut self, regarding: Option<ObjectRef>) -> Self {
        if let (false, Some(r), Some(m), Some(reason)) =
            (self.allowed, regarding, self.message.clone(), self.reason)
        {
            self.event = Some(Box::new(EventIntent {
                regarding: r,
                reason: reason.as_str(),
                message: m,
                warning: true,
                also: None,
            }));
        }
        self
    }
    /// Also shows the Event of a denial on `also` (no-op without an Event).
    pub fn with_event_also(mut self, also: Option<ObjectRef>) -> Self {
        if let Some(e) = self.event.as_mut() {
            e.also = also;
        }
        self
    }
    pub fn charging(mut self, queue: QueueName, effect: Effect) -> Self {
        self.charge = Some(Box::new(Charge { queue, effect }));
        self
    }
}

/// What kind of admission request this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Queue,
    PodGroup,
    Pod,
    Binding,
    Scale(crate::cluster::WorkloadKind),
    Workload(crate::cluster::WorkloadKind),
    /// A Volcano Job (`batch.volcano.sh`), not a Kubernetes `batch/v1` Job.
    Job,
    /// A ResourceClaim (`resource.k8s.io`).
    Claim,
    /// A ResourceClaim's status: the allocation a scheduler writes.
    Allocation,
    Other,
}

impl RequestKind {
    pub fn of(req: &AdmissionRequest) -> Self {
        use crate::cluster::WorkloadKind;
        match (req.resource.kind.as_str(), req.sub()) {
            ("queues", "") => Self::Queue,
            ("podgroups", "") => Self::PodGroup,
            ("pods", "") => Self::Pod,
            // The legacy `POST /api/v1/namespaces/{ns}/bindings` binds the same way: the
            // API server admits it as resource `bindings`, which a `pods/binding` rule
            // does not match (found on Kubernetes 1.35).
            ("pods", "binding") | ("bindings", "") => Self::Binding,
            ("jobs", "") if req.resource.group == "batch.volcano.sh" => Self::Job,
            ("resourceclaims", "") if req.resource.group == "resource.k8s.io" => Self::Claim,
            ("resourceclaims", "status") if req.resource.group == "resource.k8s.io" => {
                Self::Allocation
            }
            (r, "scale") => WorkloadKind::from_resource(r)
                .map(Self::Scale)
                .unwrap_or(Self::Other),
            (r, "") => WorkloadKind::from_resource(r)
                .map(Self::Workload)
                .unwrap_or(Self::Other),
            _ => Self::Other,
        }
    }
    /// Label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::PodGroup => "podgroup",
            Self::Pod => "pod",
            Self::Binding => "binding",
            Self::Scale(_) => "scale",
            Self::Workload(_) => "workload",
            Self::Job => "job",
            Self::Claim => "resourceclaim",
            Self::Allocation => "allocation",
            Self::Other => "other",
        }
    }
}

/// Decides one admission request against the snapshot.
pub fn decide(
    req: &AdmissionRequest,
    snap: &Snapshot,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    if !req.operation.writes() {
        // Deletions give quota back; nothing to check.
        return Decision::allow();
    }
    match RequestKind::of(req) {
        RequestKind::Queue => queue::decide(req, snap, cfg, now),
        RequestKind::PodGroup => podgroup::decide(req, snap, now),
        RequestKind::Pod => pod::decide(req, snap, cfg, now),
        RequestKind::Binding => binding::decide(req, snap, cfg, now),
        RequestKind::Scale(k) => scale::decide_scale(req, k, snap, cfg, now),
        RequestKind::Workload(k) => scale::decide_workload(req, k, snap, cfg, now),
        RequestKind::Job => job::decide(req, snap, now),
        RequestKind::Claim => claim::decide(req, snap, cfg),
        RequestKind::Allocation => allocation::decide(req, snap, cfg, now),
        RequestKind::Other => Decision::allow(),
    }
}

/// Reads what deciding `req` needs from its objects alone (no snapshot), so that the
/// webhook does it before it takes the snapshot's lock, and once however many times the
/// request is decided. Deciding without it reads the same.
pub fn read_ahead(req: &AdmissionRequest) {
    if req.operation.writes() && RequestKind::of(req) == RequestKind::Pod {
        pod::read_ahead(req);
    }
}

/// The object of a request as sent, or a denial saying it is missing.
pub(crate) fn raw_object_of(req: &AdmissionRequest) -> Result<&review::Object, Decision> {
    req.object
        .as_ref()
        .filter(|o| !o.is_null())
        .ok_or_else(|| missing_object(req))
}

fn missing_object(req: &AdmissionRequest) -> Decision {
    Decision::deny(
        messages::BAD_REQUEST,
        format!(
            "{} {} request has no object",
            req.operation, req.resource.kind
        ),
    )
}

/// The object of a request, or a denial saying it is missing.
pub(crate) fn object_of(req: &AdmissionRequest) -> Result<&serde_json::Value, Decision> {
    raw_object_of(req).map(review::Object::tree)
}
