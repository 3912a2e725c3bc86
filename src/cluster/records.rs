//! Plain, trimmed records of the cluster objects the decisions read, parsed once at
//! the boundary from real Kubernetes objects.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, Pod, PodResourceClaim, PodResourceClaimStatus, PodSchedulingGate,
    PodSpec, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::cards::annotations::{
    self, AnnotationError, CARD_NAME, CARD_QUEUE, CHARGED, GROUP_NAME, QUOTA, REQUEST, USAGE,
};
use crate::cards::demand::{
    containers_demand, pinned_products, ContainerResources, PodDemandError, ResourceDemand,
};
use crate::cards::dra::{is_claim_resource, pod_claims, ClaimCards, DraError, PodClaim};
use crate::cards::nodes::{discover, product_of, resource_fits_model_shape};
pub use crate::cards::WorkloadKind;
use crate::cards::{
    Alternatives, CardName, CardRequest, CardResources, Cards, NodeCards, ObjectKey, QueueName,
    Quota, Subject,
};

/// A Queue as card-quota sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRecord {
    pub name: QueueName,
    /// `None` when the queue has no quota annotation (quota 0 for every model).
    pub quota: Option<Result<Quota, AnnotationError>>,
    /// `status.state`; `None` counts as Open.
    pub state: Option<String>,
    /// `metadata.uid`, for Events about the queue.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// The `volcano.sh/card.usage` annotation as stored (the reconciler's last write).
    pub usage: Option<String>,
    /// `volcano.sh/card.order`, or why it does not parse.
    pub order: Result<annotations::Order, String>,
    /// `volcano.sh/card.enforcement` (`None`: the install's default), or why it does
    /// not parse.
    pub enforcement: Result<Option<annotations::Enforcement>, String>,
    /// `volcano.sh/card.full` (`None`: the install's default), or why it does not parse.
    pub full: Result<Option<annotations::Full>, String>,
    /// `spec.parent`; `None` when empty or `root` (the queue is under `root`).
    pub parent: Option<QueueName>,
    /// `volcano.sh/card.borrow`: cards per model the queue's subtree may use beyond its
    /// quota, from its card parent's unassigned pool.
    pub borrow: Option<Result<Quota, AnnotationError>>,
}

/// Where a bound pod's model comes from when it carries no `card.charged`.
pub trait NodeModels {
    /// `None` when the node is unknown; `Some(None)` when it has no model for `resource`.
    fn node_model(&self, node: &str, resource: &str) -> Option<Option<&CardName>>;
}

impl QueueRecord {
    /// The quota in force: a broken annotation fails closed (0 everywhere).
    pub fn effective_quota(&self) -> Quota {
        match &self.quota {
            Some(Ok(q)) => q.clone(),
            _ => Quota::default(),
        }
    }
    pub fn is_closed(&self) -> bool {
        matches!(self.state.as_deref(), Some("Closed") | Some("Closing"))
    }
}

/// Which incarnation of an object a record shows, and at which resourceVersion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Version {
    /// `metadata.uid`: a pod deleted and created again under the same name is another
    /// object.
    pub uid: Option<String>,
    /// `metadata.resourceVersion` when it is a number (the API server's etcd revision).
    pub resource_version: Option<u64>,
}

impl Version {
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            uid: meta.uid.clone().filter(|u| !u.is_empty()),
            resource_version: meta
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok()),
        }
    }
}

/// A PodGroup: its queue and admitted card request.
#[derive(Debug, Clone, PartialEq)]
pub struct PodGroupRecord {
    pub key: ObjectKey,
    pub queue: QueueName,
    pub request: Option<Result<CardRequest, AnnotationError>>,
    /// The request is card-quota's `card.derived-request` (from the Job's tasks), not
    /// one the user wrote.
    pub derived: bool,
    /// `volcano.sh/card.split: "true"`: a derived demand may split across models.
    pub split: bool,
    pub phase: Option<String>,
    /// `metadata.creationTimestamp`: how long a waiting group has waited.
    pub created: Option<jiff::Timestamp>,
    pub seq: u64,
    /// `metadata.uid` and `metadata.resourceVersion`: which incarnation of the object
    /// this is, and how far the cache that holds it has come (ledger pruning).
    pub version: Version,
}

impl PodGroupRecord {
    /// True while the PodGroup waits in line: no phase yet, or `Pending`. Such a group
    /// reserves nothing; it is checked when it leaves Pending (Volcano's enqueue).
    pub fn is_waiting(&self) -> bool {
        matches!(self.phase.as_deref(), None | Some("") | Some("Pending"))
    }

    /// A group with a readable card demand that waits in line: a Job held at the enqueue.
    pub fn waits_in_line(&self) -> bool {
        self.is_waiting() && matches!(self.request, Some(Ok(_)))
    }

    /// The request that reserves cards: parsed, enqueued (left Pending: Inqueue,
    /// Running, Unknown...), and not Completed.
    pub fn live_request(&self) -> Option<&CardRequest> {
        if self.is_waiting() || self.phase.as_deref() == Some("Completed") {
            return None;
        }
        match &self.request {
            Some(Ok(r)) => Some(r),
            _ => None,
        }
    }
}

/// A Pod: what it asks for, where it runs, and whether it still holds cards.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    pub key: ObjectKey,
    /// A pod, or the pod template of the workload `key` names.
    pub subject: Subject,
    /// `volcano.sh/card.queue`: the queue the pod was admitted to (stamped at CREATE);
    /// its queue for charging from then on.
    pub stamped_queue: Option<QueueName>,
    /// The queue the pod names by label or annotation (Volcano's order).
    pub named_queue: Option<QueueName>,
    pub group: Option<String>,
    /// Card resources requested (effective request), or why they could not be read.
    /// Boxed: a parse error is rare, and a pod record is kept for every pod.
    pub demand: Result<ResourceDemand, Box<PodDemandError>>,
    /// Extended resources of no known card type (yet): they become card demand when
    /// a node labels their type (`<prefix>/<type>.product`).
    pub latent: ResourceDemand,
    /// `volcano.sh/card.name`, or why it does not parse (boxed: rare, and large).
    pub card_name: Option<Result<Alternatives, Box<AnnotationError>>>,
    pub charged: Option<CardName>,
    pub node: Option<String>,
    /// True when `node` is a binding card-quota admitted (a ledger entry laid over the
    /// cache) that the cache does not show yet: its answer may have been lost, and the
    /// scheduler's retry of it is the same binding.
    pub bind_unseen: bool,
    pub phase: Option<String>,
    pub deletion: Option<jiff::Timestamp>,
    /// Product label -> values the pod's required constraints allow.
    pub pinned: BTreeMap<String, Vec<String>>,
    /// Product label -> values the pod's required constraints rule out (`NotIn`).
    pub excluded: BTreeMap<String, Vec<String>>,
    /// `spec.schedulerName` (Kubernetes' `default-scheduler` when unset); `None` for a
    /// pod known only from a ledger entry, which is counted whatever the filter.
    pub scheduler: Option<std::sync::Arc<str>>,
    /// `spec.resourceClaims`, with the claims made for it from templates.
    pub claims: Vec<PodClaim>,
    /// What its claims add up to, as the snapshot read them (`None`: no claim asks for
    /// a card, or they have not been read). Their cards are in `demand` under
    /// [`ClaimCards::resource`].
    pub claimed: Option<Result<ClaimCards, Box<DraError>>>,
    /// Carries card-quota's scheduling gate ([`annotations::WAIT_GATE`]): waits for
    /// room and holds no quota until it is released.
    pub gated: bool,
    /// `metadata.creationTimestamp`: a waiting pod's place in its queue's order.
    pub created: Option<jiff::Timestamp>,
    pub seq: u64,
    pub version: Version,
}

/// The `spec.schedulerName` of Volcano's scheduler (its chart's default).
pub const VOLCANO_SCHEDULER: &str = "volcano";

impl PodRecord {
    /// True for a pod of Volcano's scheduler: Volcano gives it a PodGroup of its own.
    pub fn volcano_scheduled(&self) -> bool {
        self.scheduler.as_deref() == Some(VOLCANO_SCHEDULER)
    }

    /// Still holds (or waits for) its cards: not Succeeded/Failed and not past its
    /// deletion deadline (the ResourceQuota rule).
    pub fn is_active(&self, now: jiff::Timestamp) -> bool {
        if self.is_finished() {
            return false;
        }
        match self.deletion {
            Some(t) => t > now,
            None => true,
        }
    }

    /// The pod's parsed alternatives, when it names valid ones.
    pub fn alternatives(&self) -> Option<&Alternatives> {
        match &self.card_name {
            Some(Ok(a)) => Some(a),
            _ => None,
        }
    }

    /// For each of `models`, whether the pod's own required product constraints on the
    /// labels `ours` picks allow it. One pass over each label's values, which a hostile
    /// pod may make 100,000 long.
    pub fn constraints_allow(&self, models: &[CardName], ours: impl Fn(&str) -> bool) -> Vec<bool> {
        let mut at: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
        for (i, m) in models.iter().enumerate() {
            at.entry(product_of(m)).or_default().push(i);
        }
        let mut ok = vec![true; models.len()];
        let named = |values: &[String]| {
            let mut hit = vec![false; models.len()];
            for v in values {
                for &i in at.get(v.as_str()).into_iter().flatten() {
                    hit[i] = true;
                }
            }
            hit
        };
        for (_, values) in self.pinned.iter().filter(|(l, _)| ours(l)) {
            for (o, h) in ok.iter_mut().zip(named(values)) {
                *o &= h;
            }
        }
        for (_, values) in self.excluded.iter().filter(|(l, _)| ours(l)) {
            for (o, h) in ok.iter_mut().zip(named(values)) {
                *o &= !h;
            }
        }
        ok
    }

    /// The models this pod can end up on: its alternatives, narrowed by its own
    /// required product pins (a pod pinned by card-quota's steering counts on its pin).
    pub fn effective_alternatives(&self) -> Option<Alternatives> {
        // A pod not admitted by card-quota's webhook (no `card.name` written) may get
        // what its claims allow.
        let a = self.alternatives().or_else(|| self.claimed_models())?;
        let Ok(demand) = &self.demand else {
            return Some(a.clone());
        };
        let fits_shape = |m: &CardName| demand.keys().all(|r| resource_fits_model_shape(r, m));
        let prefix_pinned = |label: &str| {
            let lp = label.split('/').next().unwrap_or_default();
            demand.keys().any(|r| r.split('/').next() == Some(lp))
        };
        // Models whose resource the pod does not request cannot be used (an MPS model
        // for a pod requesting whole cards).
        let shaped = narrowed(a, fits_shape);
        let a = shaped.as_ref().unwrap_or(a);
        // Then the pins on the resource's vendor.
        if self.pinned.is_empty() && self.excluded.is_empty() {
            return Some(a.clone());
        }
        let models = a.models();
        let ok = self.constraints_allow(models, prefix_pinned);
        let allows = |m: &CardName| models.iter().position(|x| x == m).is_some_and(|i| ok[i]);
        // Nothing narrower (or a conflict, refused at admission): as named.
        Some(narrowed(a, allows).unwrap_or_else(|| a.clone()))
    }

    /// The PodGroup the pod names, as a key in the pod's namespace.
    pub fn group_key(&self) -> Option<ObjectKey> {
        self.group
            .as_ref()
            .map(|g| ObjectKey::new(self.key.namespace.clone(), g.clone()))
    }

    /// Succeeded or Failed: it holds nothing any more.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded") | Some("Failed"))
    }

    /// True while the pod may stop counting by time alone (terminating within its
    /// grace period): such pods are counted when a decision asks, not in advance.
    pub fn is_terminating(&self) -> bool {
        self.deletion.is_some() && !self.is_finished()
    }

    /// Total cards over all card resources (0 when unreadable).
    pub fn cards(&self) -> Cards {
        self.demand
            .as_ref()
            .map(|d| d.values().sum())
            .unwrap_or_default()
    }

    /// Moves requested resources between card demand and latent demand so that
    /// exactly those `is_card` accepts are card demand. True when anything moved.
    pub fn reclassify(&mut self, is_card: impl Fn(&str) -> bool) -> bool {
        let Ok(demand) = &mut self.demand else {
            return false;
        };
        let to_card: Vec<String> = self.latent.keys().filter(|r| is_card(r)).cloned().collect();
        // Cards from claims are the snapshot's to set, not a node's to announce.
        let to_latent: Vec<String> = demand
            .keys()
            .filter(|r| !is_card(r) && !is_claim_resource(r))
            .cloned()
            .collect();
        for r in &to_card {
            if let Some(n) = self.latent.remove(r) {
                demand.insert(r.clone(), n);
            }
        }
        for r in &to_latent {
            if let Some(n) = demand.remove(r) {
                self.latent.insert(r.clone(), n);
            }
        }
        !(to_card.is_empty() && to_latent.is_empty())
    }

    /// True when the pod involves cards at all.
    /// A pod with ResourceClaims is held as one even when they ask for no card now: a
    /// shared claim another pod pays for becomes its own to pay when that pod goes.
    pub fn is_card_pod(&self) -> bool {
        self.card_name.is_some()
            || !self.claims.is_empty()
            || self.demand.as_ref().map(|d| !d.is_empty()).unwrap_or(true)
    }

    /// Names the models it may run on (its `card.name`): its claims' cards are then
    /// counted on those models only ([`Self::count_claimed`]).
    pub fn name_models(&mut self, models: Alternatives) {
        self.card_name = Some(Ok(models));
        self.count_claimed();
    }

    /// Puts its claims' cards in `demand`: the most they take on a model it may run on
    /// ([`ClaimCards::cards_on`] its card name).
    pub fn count_claimed(&mut self) {
        let named = match &self.card_name {
            Some(Ok(a)) => Some(a),
            _ => None,
        };
        if let (Some(Ok(c)), Ok(d)) = (&self.claimed, &mut self.demand) {
            d.insert(c.resource.clone(), c.cards_on(named));
        }
    }

    /// The cards its claims were allocated, while it is not bound yet and they are all
    /// its cards. A DRA card is taken at its allocation (the scheduler binds the pod
    /// there next), and its allocation is the charge point that records it bound (R1):
    /// caches count it bound from the moment they show the allocation, so the charge
    /// can stop counting there (R3) with nothing lost in between.
    pub fn claims_allocated_unbound(&self) -> Option<&[(CardName, Cards)]> {
        if self.node.is_some() {
            return None;
        }
        let Some(Ok(c)) = &self.claimed else {
            return None;
        };
        let allocated = c.allocated.as_deref()?;
        let demand = self.demand.as_ref().ok()?;
        (demand.len() == 1 && demand.contains_key(&c.resource)).then_some(allocated)
    }

    /// True when its card claims are all shown allocated.
    pub fn claims_allocated(&self) -> bool {
        matches!(&self.claimed, Some(Ok(c)) if c.allocated.is_some())
    }

    /// The models its card claims may get, when it has any.
    pub fn claimed_models(&self) -> Option<&Alternatives> {
        match &self.claimed {
            Some(Ok(c)) => Some(&c.models),
            _ => None,
        }
    }
}

/// A Deployment / ReplicaSet / StatefulSet: its replicas and the pod it stamps out.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRecord {
    pub kind: WorkloadKind,
    pub key: ObjectKey,
    pub replicas: i32,
    /// The pod the template makes (as a record with no node).
    pub template: PodRecord,
    /// A ReplicaSet controlled by a Deployment (its resizes are the Deployment's).
    pub owned_by_deployment: bool,
}

/// Errors turning an object into a record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{kind} is not a valid object: {source}")]
    Decode {
        kind: &'static str,
        source: serde_json::Error,
    },
    #[error("{0} has no metadata.name")]
    NoName(&'static str),
    #[error(transparent)]
    Dra(#[from] crate::cards::dra::DraError),
}

fn anns(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations.clone().unwrap_or_default()
}

static NO_STRINGS: BTreeMap<String, String> = BTreeMap::new();

/// Builds a pod record; `cards` says which extended resources are card demand.
pub fn pod_record(
    pod: &Pod,
    namespace_hint: &str,
    cards: &CardResources,
    seq: u64,
) -> Result<PodRecord, RecordError> {
    pod_record_of(
        &pod.metadata,
        pod.spec.as_ref().map(|s| {
            SpecView::of(s).with_claims_made(
                pod.status
                    .as_ref()
                    .and_then(|s| s.resource_claim_statuses.as_deref())
                    .unwrap_or_default(),
            )
        }),
        pod.status.as_ref().and_then(|s| s.phase.clone()),
        namespace_hint,
        cards,
        seq,
    )
}

/// The parts of a pod spec a record reads, borrowed from a k8s-openapi `PodSpec` or
/// from the parts an admission reads of a review's pod.
#[derive(Debug)]
pub struct SpecView<'a, C> {
    pub containers: &'a [C],
    pub init_containers: &'a [C],
    pub node_name: Option<&'a str>,
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    pub affinity: Option<&'a Affinity>,
    pub scheduler_name: Option<&'a str>,
    /// `spec.resourceClaims`.
    pub resource_claims: &'a [PodResourceClaim],
    /// `status.resourceClaimStatuses`: the claims made for the pod from templates.
    pub claims_made: &'a [PodResourceClaimStatus],
    /// `spec.schedulingGates`.
    pub scheduling_gates: &'a [PodSchedulingGate],
}

// By hand: derived, they would ask `C: Copy` of the borrowed containers.
impl<C> Clone for SpecView<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for SpecView<'_, C> {}

impl<'a> SpecView<'a, Container> {
    /// The parts of a whole `PodSpec`.
    pub fn of(s: &'a PodSpec) -> Self {
        Self {
            containers: &s.containers,
            init_containers: s.init_containers.as_deref().unwrap_or_default(),
            node_name: s.node_name.as_deref(),
            node_selector: s.node_selector.as_ref(),
            affinity: s.affinity.as_ref(),
            scheduler_name: s.scheduler_name.as_deref(),
            resource_claims: s.resource_claims.as_deref().unwrap_or_default(),
            claims_made: &[],
            scheduling_gates: s.scheduling_gates.as_deref().unwrap_or_default(),
        }
    }
}

impl<'a, C> SpecView<'a, C> {
    /// The same parts, with the claims the pod's status says were made for it.
    pub fn with_claims_made(self, made: &'a [PodResourceClaimStatus]) -> Self {
        Self {
            claims_made: made,
            ..self
        }
    }

    /// The pod's claims.
    fn claims(&self) -> Vec<PodClaim> {
        let made: BTreeMap<&str, &str> = self
            .claims_made
            .iter()
            .filter_map(|m| Some((m.name.as_str(), m.resource_claim_name.as_deref()?)))
            .collect();
        pod_claims(
            self.resource_claims.iter().map(|c| {
                (
                    c.name.as_str(),
                    c.resource_claim_name.as_deref(),
                    c.resource_claim_template_name.as_deref(),
                )
            }),
            &made,
        )
    }
}

/// A pod's record from its metadata, the parts of its spec and its phase (see
/// [`pod_record`]).
pub fn pod_record_of<C: ContainerResources>(
    meta: &ObjectMeta,
    spec: Option<SpecView<'_, C>>,
    phase: Option<String>,
    namespace_hint: &str,
    cards: &CardResources,
    seq: u64,
) -> Result<PodRecord, RecordError> {
    let name = meta
        .name
        .clone()
        .or_else(|| meta.generate_name.clone())
        .ok_or(RecordError::NoName("pod"))?;
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| namespace_hint.to_string());
    let key = ObjectKey::new(namespace, name);
    Ok(record_from_parts(
        Subject::Pod,
        &key,
        meta,
        spec,
        phase,
        cards,
        seq,
    ))
}

fn record_from_parts<C: ContainerResources>(
    subject: Subject,
    key: &ObjectKey,
    meta: &ObjectMeta,
    spec: Option<SpecView<'_, C>>,
    phase: Option<String>,
    cards: &CardResources,
    seq: u64,
) -> PodRecord {
    // Read in place: records are built for every pod event and admission.
    let a = meta.annotations.as_ref().unwrap_or(&NO_STRINGS);
    let labels = meta.labels.as_ref().unwrap_or(&NO_STRINGS);
    let object = || subject.named(key).to_string();
    let is_card = |r: &str| cards.matches(r);
    // Every extended resource is read; those of no known card type wait as latent
    // demand for a node to announce their type.
    let mut demand = match spec {
        Some(s) => containers_demand(s.containers, s.init_containers, |r| r.contains('/')).map_err(
            |source| {
                Box::new(PodDemandError {
                    subject,
                    pod: key.clone(),
                    source,
                })
            },
        ),
        None => Ok(ResourceDemand::new()),
    };
    let mut latent = ResourceDemand::new();
    if let Ok(d) = &mut demand {
        d.retain(|r, n| {
            let card = is_card(r);
            if !card {
                latent.insert(r.clone(), *n);
            }
            card
        });
    }
    let (pinned, excluded) = spec
        .map(|s| pinned_products(s.node_selector, s.affinity))
        .unwrap_or_default();
    PodRecord {
        key: key.clone(),
        subject,
        stamped_queue: a
            .get(CARD_QUEUE)
            .filter(|q| !q.is_empty())
            .map(|q| QueueName::new(q.clone())),
        named_queue: annotations::named_queue(labels, a),
        latent,
        group: a.get(GROUP_NAME).filter(|g| !g.is_empty()).cloned(),
        demand,
        card_name: a
            .get(CARD_NAME)
            .map(|v| annotations::parse_card_name_of(object, v).map_err(Box::new)),
        charged: a.get(CHARGED).and_then(|v| CardName::parse(v).ok()),
        node: spec
            .and_then(|s| s.node_name)
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        bind_unseen: false,
        phase,
        deletion: meta.deletion_timestamp.as_ref().map(|t| t.0),
        pinned,
        excluded,
        scheduler: Some(scheduler_name(
            spec.and_then(|s| s.scheduler_name)
                .filter(|n| !n.is_empty())
                .unwrap_or("default-scheduler"),
        )),
        claims: spec.map(|s| s.claims()).unwrap_or_default(),
        claimed: None,
        gated: spec.is_some_and(|s| {
            s.scheduling_gates
                .iter()
                .any(|g| g.name == annotations::WAIT_GATE)
        }),
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        seq,
        version: Version::of(meta),
    }
}

/// A scheduler name, shared for the common ones: every pod holds one, and 100k copies
/// of "default-scheduler" are memory for nothing.
fn scheduler_name(name: &str) -> std::sync::Arc<str> {
    use std::sync::{Arc, LazyLock};
    static DEFAULT: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("default-scheduler"));
    static VOLCANO: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(VOLCANO_SCHEDULER));
    match name {
        "default-scheduler" => DEFAULT.clone(),
        VOLCANO_SCHEDULER => VOLCANO.clone(),
        other => Arc::from(other),
    }
}

/// Builds a node's card record.
pub fn node_record(node: &Node) -> Result<(String, NodeCards), RecordError> {
    let name = node
        .metadata
        .name
        .clone()
        .ok_or(RecordError::NoName("node"))?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let alloc: BTreeMap<String, String> = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default();
    let cards = discover(&name, &labels, &alloc);
    Ok((name, cards))
}

fn meta_of(v: &Value, kind: &'static str) -> Result<ObjectMeta, RecordError> {
    serde::Deserialize::deserialize(v.get("metadata").unwrap_or(&Value::Null))
        .map_err(|source| RecordError::Decode { kind, source })
}

/// A Namespace's name and the queue its `scheduling.volcano.sh/queue-name` annotation
/// names (an empty value names none, as in Volcano).
pub fn namespace_record(meta: &ObjectMeta) -> Result<(String, Option<QueueName>), RecordError> {
    let name = meta.name.clone().ok_or(RecordError::NoName("namespace"))?;
    let queue = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::QUEUE_NAME))
        .filter(|q| !q.is_empty())
        .map(QueueName::new);
    Ok((name, queue))
}

/// Builds a Queue record from its JSON (scheduling.volcano.sh/v1beta1 Queue).
pub fn queue_record(v: &Value) -> Result<QueueRecord, RecordError> {
    let meta = meta_of(v, "Queue")?;
    let name = meta.name.clone().ok_or(RecordError::NoName("queue"))?;
    let a = anns(&meta);
    let object = format!("queue {name}");
    Ok(QueueRecord {
        resource_version: meta.resource_version.clone(),
        uid: meta.uid.clone(),
        usage: a.get(USAGE).cloned(),
        order: a
            .get(annotations::ORDER)
            .map_or(Ok(annotations::Order::default()), |raw| {
                annotations::parse_order(&object, raw)
            }),
        enforcement: a
            .get(annotations::ENFORCEMENT)
            .map(|raw| annotations::parse_enforcement(&object, raw))
            .transpose(),
        full: a
            .get(annotations::FULL)
            .map(|raw| annotations::parse_full(&object, raw))
            .transpose(),
        quota: a
            .get(QUOTA)
            .map(|raw| annotations::parse_quota(&object, raw)),
        borrow: a
            .get(annotations::BORROW)
            .map(|raw| annotations::parse_borrow(&object, raw)),
        parent: v
            .pointer("/spec/parent")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty() && *p != QueueName::ROOT)
            .filter(|_| name != QueueName::ROOT)
            .map(QueueName::new),
        state: v
            .pointer("/status/state")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        name: QueueName::new(name),
    })
}

/// Builds a PodGroup record from its JSON (scheduling.volcano.sh/v1beta1 PodGroup).
pub fn podgroup_record(
    v: &Value,
    namespace_hint: &str,
    seq: u64,
) -> Result<PodGroupRecord, RecordError> {
    let meta = meta_of(v, "PodGroup")?;
    let name = meta.name.clone().ok_or(RecordError::NoName("podgroup"))?;
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| namespace_hint.to_string());
    let key = ObjectKey::new(namespace, name);
    let a = anns(&meta);
    let object = format!("podgroup {key}");
    let queue = v
        .pointer("/spec/queue")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .map(QueueName::new)
        .unwrap_or_else(QueueName::default_queue);
    let (request, derived) = match (a.get(REQUEST), a.get(annotations::DERIVED_REQUEST)) {
        (Some(raw), _) => (Some(annotations::parse_request(&object, raw)), false),
        (None, Some(raw)) => (
            Some(annotations::parse_request_in(
                &object,
                annotations::DERIVED_REQUEST,
                raw,
            )),
            true,
        ),
        (None, None) => (None, false),
    };
    Ok(PodGroupRecord {
        request,
        derived,
        split: a.get(annotations::SPLIT).map(String::as_str) == Some("true"),
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        phase: v
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .map(str::to_string),
        queue,
        key,
        seq,
        version: Version::of(&meta),
    })
}

fn template_record(
    kind: WorkloadKind,
    key: &ObjectKey,
    t: Option<&PodTemplateSpec>,
    cards: &CardResources,
    seq: u64,
) -> PodRecord {
    let meta = t.and_then(|t| t.metadata.clone()).unwrap_or_default();
    record_from_parts(
        Subject::Template(kind),
        key,
        &meta,
        t.and_then(|t| t.spec.as_ref()).map(SpecView::of),
        None,
        cards,
        seq,
    )
}

/// A Volcano Job (`batch.volcano.sh/v1alpha1`): what its tasks will create. Read only
/// to derive the card demand of a PodGroup that carries no `card.request`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub key: ObjectKey,
    pub uid: Option<String>,
    /// Each task's replicas and pod template (keyed by the Job, named by the task).
    pub tasks: Vec<(String, u32, PodRecord)>,
}

/// Builds a Volcano Job record from its JSON.
pub fn job_record(
    v: &Value,
    namespace_hint: &str,
    cards: &CardResources,
    seq: u64,
) -> Result<JobRecord, RecordError> {
    let meta = meta_of(v, "Job")?;
    let name = meta.name.clone().ok_or(RecordError::NoName("job"))?;
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| namespace_hint.to_string());
    let key = ObjectKey::new(namespace, name);
    let mut tasks = Vec::new();
    for (i, t) in v
        .pointer("/spec/tasks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let task = t
            .get("name")
            .and_then(Value::as_str)
            .map_or_else(|| format!("task-{i}"), str::to_string);
        // Volcano defaults a task's replicas to 1 (its CRD's default is 0 only when
        // written); negative counts never pass Volcano's own webhook.
        let replicas = t
            .get("replicas")
            .and_then(Value::as_i64)
            .map_or(1, |r| u32::try_from(r.max(0)).unwrap_or(u32::MAX));
        let template: Option<PodTemplateSpec> =
            match t.get("template") {
                Some(tv) => Some(serde::Deserialize::deserialize(tv).map_err(|source| {
                    RecordError::Decode {
                        kind: "Job",
                        source,
                    }
                })?),
                None => None,
            };
        let meta = template
            .as_ref()
            .and_then(|t| t.metadata.clone())
            .unwrap_or_default();
        let rec = record_from_parts(
            Subject::JobTask,
            &key,
            &meta,
            template
                .as_ref()
                .and_then(|t| t.spec.as_ref())
                .map(SpecView::of),
            None,
            cards,
            seq,
        );
        tasks.push((task, replicas, rec));
    }
    Ok(JobRecord {
        uid: meta.uid.clone().filter(|u| !u.is_empty()),
        key,
        tasks,
    })
}

/// Builds a workload record from a Deployment, ReplicaSet or StatefulSet JSON.
pub fn workload_record(
    kind: WorkloadKind,
    v: &Value,
    namespace_hint: &str,
    cards: &CardResources,
    seq: u64,
) -> Result<WorkloadRecord, RecordError> {
    let decode = |source| RecordError::Decode {
        kind: kind.kind(),
        source,
    };
    let (meta, replicas, template) = match kind {
        WorkloadKind::Deployment => {
            let d: Deployment = serde::Deserialize::deserialize(v).map_err(decode)?;
            let s = d.spec.unwrap_or_default();
            (d.metadata, s.replicas, Some(s.template))
        }
        WorkloadKind::ReplicaSet => {
            let d: ReplicaSet = serde::Deserialize::deserialize(v).map_err(decode)?;
            let s = d.spec.unwrap_or_default();
            (d.metadata, s.replicas, s.template)
        }
        WorkloadKind::StatefulSet => {
            let d: StatefulSet = serde::Deserialize::deserialize(v).map_err(decode)?;
            let s = d.spec.unwrap_or_default();
            (d.metadata, s.replicas, Some(s.template))
        }
    };
    let name = meta.name.clone().ok_or(RecordError::NoName("workload"))?;
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| namespace_hint.to_string());
    let key = ObjectKey::new(namespace, name);
    let owned_by_deployment = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Deployment" && o.controller == Some(true));
    Ok(WorkloadRecord {
        kind,
        template: template_record(kind, &key, template.as_ref(), cards, seq),
        key,
        replicas: replicas.unwrap_or(1),
        owned_by_deployment,
    })
}

/// The models of `a` that `keep` keeps, when that is fewer than all and more than none.
/// Allocates nothing when every model is kept: usage is recomputed over every pending
/// pod of a queue.
fn narrowed(a: &Alternatives, keep: impl Fn(&CardName) -> bool) -> Option<Alternatives> {
    if a.models().iter().all(&keep) {
        return None;
    }
    let kept: Vec<CardName> = a.models().iter().filter(|m| keep(m)).cloned().collect();
    Alternatives::from_models(kept).filter(|k| k.models().len() < a.models().len())
}
