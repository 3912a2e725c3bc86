//! The reconciler's metrics: per-queue card gauges under the names of Volcano's
//! capacity-card plugin (so existing dashboards work), passes, usage writes, recount
//! mismatches, and Events the sink had to drop.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::cluster::PodGroupRecord;
use crate::ledger::{Row, UsageKey};
use crate::live::metrics::ResultLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueCardLabels {
    pub queue_name: String,
    pub card_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue_name: String,
}

/// A queue and its parent (`root` at the top), as Kueue's `cohort_info` pairs them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueParentLabels {
    pub queue_name: String,
    pub parent_name: String,
}

/// A node's cards of one resource and model.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeCardLabels {
    pub node: String,
    pub resource: String,
    pub card_name: String,
}

/// What the reconciler measured and did.
pub struct ReconcilerMetrics {
    /// Cards nodes announce of resources the install does not gate (never counted).
    pub unmanaged: Family<NodeCardLabels, Gauge>,
    pub capacity: Family<QueueCardLabels, Gauge>,
    /// A group cap's cards, allocated and requested, per queue and cap key (`*`,
    /// `NVIDIA-*`): families of their own, so sums over the per-model families count
    /// each card once.
    pub cap_capacity: Family<QueueCardLabels, Gauge>,
    pub cap_allocated: Family<QueueCardLabels, Gauge>,
    pub cap_request: Family<QueueCardLabels, Gauge>,
    pub allocated: Family<QueueCardLabels, Gauge>,
    pub request: Family<QueueCardLabels, Gauge>,
    pub pending: Family<QueueCardLabels, Gauge>,
    pub reserved: Family<QueueCardLabels, Gauge>,
    pub reconciles: Family<ModeLabel, Counter>,
    pub reconcile_duration: Family<ModeLabel, Histogram>,
    pub usage_writes: Family<ResultLabel, Counter>,
    /// Waiting pods' releases by outcome (released, refused by the webhook, error).
    pub releases: Family<ResultLabel, Counter>,
    /// Cards of pods waiting behind card-quota's gate per queue and models.
    pub waiting_cards: Family<QueueCardLabels, Gauge>,
    /// Queues whose incremental usage disagreed with a full recount (then rebuilt).
    pub tally_mismatches: Counter,
    /// Jobs held at Volcano's enqueue, per queue and request key.
    pub jobs_waiting: Family<QueueCardLabels, Gauge>,
    /// The longest such wait per queue, in seconds.
    pub longest_wait: Family<QueueLabel, Gauge>,
    /// Cards a queue's subtree uses beyond its quota (from its card parent's pool).
    pub borrowed: Family<QueueCardLabels, Gauge>,
    /// A queue's `card.borrow` per model.
    pub borrow_limit: Family<QueueCardLabels, Gauge>,
    /// 1 per queue, labelled with its parent: joins the per-queue series into a tree.
    pub queue_info: Family<QueueParentLabels, Gauge>,
    /// 1 per queue in deny under an install that fails open (warn).
    pub deny_fail_open: Family<QueueLabel, Gauge>,
    /// Card names published per queue, so gone queues and models are removed.
    published: Mutex<HashMap<String, BTreeSet<String>>>,
    /// The parent published per queue.
    parents: Mutex<HashMap<String, String>>,
}

impl ReconcilerMetrics {
    /// Registers the reconciler's metrics, and `events_dropped` counted by the Event sink.
    pub fn register(registry: &mut Registry, events_dropped: Counter) -> Self {
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<QueueCardLabels, Gauge>::default();
            registry.register(name, help, f.clone());
            f
        };
        let capacity = gauge(
            registry,
            "volcano_queue_card_capacity",
            "Card quota of a queue per model (volcano.sh/card.quota)",
        );
        let allocated = gauge(
            registry,
            "volcano_queue_card_allocated",
            "Cards of bound, non-terminal pods charged to a queue per model",
        );
        let request = gauge(
            registry,
            "volcano_queue_card_request",
            "Cards a queue uses or waits for per model: allocated + pending + reserved",
        );
        let pending = gauge(
            registry,
            "card_quota_queue_card_pending",
            "Cards of admitted, unbound pods per model or alternatives (A|B)",
        );
        let reserved = gauge(
            registry,
            "card_quota_queue_card_reserved",
            "Cards reserved by PodGroup card.request not yet covered by their pods",
        );
        let reconciles = Family::<ModeLabel, Counter>::default();
        registry.register(
            "card_quota_reconciles",
            "Reconciler passes by mode (incremental or full)",
            reconciles.clone(),
        );
        let reconcile_duration = Family::<ModeLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0])
        });
        registry.register(
            "card_quota_reconcile_duration_seconds",
            "Time of one reconciler pass, API writes included",
            reconcile_duration.clone(),
        );
        let releases = Family::<ResultLabel, Counter>::default();
        registry.register(
            "card_quota_pod_releases",
            "Removals of card-quota's scheduling gate from waiting pods by outcome (released, refused: the webhook found no room, error)",
            releases.clone(),
        );
        let waiting_cards = gauge(
            registry,
            "card_quota_queue_card_waiting",
            "Cards of pods waiting behind card-quota's scheduling gate (volcano.sh/card.full: wait) per queue and model or alternatives; they hold no quota",
        );
        let usage_writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "card_quota_usage_writes",
            "Server-side applies of volcano.sh/card.usage by outcome",
            usage_writes.clone(),
        );
        registry.register(
            "card_quota_events_dropped",
            "Admission Events not published because too many were in flight",
            events_dropped,
        );
        let tally_mismatches = Counter::default();
        registry.register(
            "card_quota_usage_recount_mismatches",
            "Queues whose incremental usage differed from the periodic full recount (the tally is then rebuilt)",
            tally_mismatches.clone(),
        );
        let jobs_waiting = Family::<QueueCardLabels, Gauge>::default();
        registry.register(
            "card_quota_jobs_waiting",
            "PodGroups with card demand waiting in line (Pending), per queue and request key",
            jobs_waiting.clone(),
        );
        let longest_wait = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "card_quota_job_longest_wait_seconds",
            "How long the oldest PodGroup with card demand has waited in line, per queue",
            longest_wait.clone(),
        );
        let borrowed = gauge(
            registry,
            "card_quota_queue_card_borrowed",
            "Cards a queue's subtree uses beyond its quota, from its card parent's unassigned pool",
        );
        let borrow_limit = gauge(
            registry,
            "card_quota_queue_card_borrow_limit",
            "A queue's volcano.sh/card.borrow per model",
        );
        let queue_info = Family::<QueueParentLabels, Gauge>::default();
        registry.register(
            "card_quota_queue_info",
            "1 per queue, labelled with its parent queue (root at the top)",
            queue_info.clone(),
        );
        let deny_fail_open = Family::<QueueLabel, Gauge>::default();
        registry.register(
            "card_quota_queue_deny_fail_open",
            "1 per queue in deny under an install in warn, whose webhooks fail open: its quota holds only while card-quota answers",
            deny_fail_open.clone(),
        );
        let cap_capacity = gauge(
            registry,
            "card_quota_queue_cap_capacity",
            "A queue's group cap (a card.quota key ending in *): the most cards the models it matches may use together",
        );
        let cap_allocated = gauge(
            registry,
            "card_quota_queue_cap_allocated",
            "Cards of bound pods on the models a queue's group cap matches",
        );
        let cap_request = gauge(
            registry,
            "card_quota_queue_cap_request",
            "Cards a group cap's models use or wait for: allocated + pending + reserved that can land only under it",
        );
        let unmanaged = Family::<NodeCardLabels, Gauge>::default();
        registry.register(
            "card_quota_unmanaged_cards",
            "Cards a node announces of a resource that is not among the install's card resources (--card-resource): neither counted nor gated",
            unmanaged.clone(),
        );
        Self {
            unmanaged,
            deny_fail_open,
            borrowed,
            borrow_limit,
            queue_info,
            parents: Mutex::new(HashMap::new()),
            jobs_waiting,
            longest_wait,
            capacity,
            cap_capacity,
            cap_allocated,
            cap_request,
            allocated,
            request,
            pending,
            reserved,
            reconciles,
            reconcile_duration,
            usage_writes,
            releases,
            waiting_cards,
            tally_mismatches,
            published: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the gauges of `queue` to `rows`; `None` (a deleted queue) removes them.
    /// Models a queue no longer has are removed too.
    pub fn publish_queue(
        &self,
        queue: &str,
        parent: Option<&str>,
        rows: Option<&BTreeMap<UsageKey, Row>>,
    ) {
        {
            let mut parents = self.parents.lock().unwrap_or_else(|p| p.into_inner());
            let now = rows.map(|_| parent.unwrap_or("root").to_string());
            if let Some(old) = parents.get(queue).filter(|o| Some(*o) != now.as_ref()) {
                self.queue_info.remove(&QueueParentLabels {
                    queue_name: queue.to_string(),
                    parent_name: old.clone(),
                });
            }
            match now {
                Some(p) => {
                    self.queue_info
                        .get_or_create(&QueueParentLabels {
                            queue_name: queue.to_string(),
                            parent_name: p.clone(),
                        })
                        .set(1);
                    parents.insert(queue.to_string(), p);
                }
                None => {
                    parents.remove(queue);
                }
            }
        }
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        let labels = |card: &str| QueueCardLabels {
            queue_name: queue.to_string(),
            card_name: card.to_string(),
        };
        let now: BTreeSet<String> = rows
            .map(|r| r.keys().map(UsageKey::to_string).collect())
            .unwrap_or_default();
        for gone in published
            .get(queue)
            .map(|s| s.difference(&now).cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            let l = labels(&gone);
            for f in [
                &self.capacity,
                &self.cap_capacity,
                &self.cap_allocated,
                &self.cap_request,
                &self.allocated,
                &self.request,
                &self.pending,
                &self.reserved,
                &self.borrowed,
                &self.borrow_limit,
                &self.waiting_cards,
            ] {
                f.remove(&l);
            }
        }
        for (card, r) in rows.into_iter().flatten() {
            let l = labels(&card.to_string());
            let gauge = |v: crate::cards::Cards| v.as_i64_saturating();
            if let UsageKey::Cap(_) = card {
                self.cap_capacity.get_or_create(&l).set(gauge(r.quota));
                self.cap_allocated.get_or_create(&l).set(gauge(r.allocated));
                self.cap_request.get_or_create(&l).set(gauge(r.in_use()));
                continue;
            }
            if card.is_model() {
                self.capacity.get_or_create(&l).set(gauge(r.quota));
                self.allocated.get_or_create(&l).set(gauge(r.allocated));
                self.request.get_or_create(&l).set(gauge(r.in_use()));
            }
            self.pending.get_or_create(&l).set(gauge(r.pending));
            self.reserved.get_or_create(&l).set(gauge(r.reserved));
            match r.waiting {
                Some(w) => {
                    self.waiting_cards.get_or_create(&l).set(gauge(w));
                }
                None => {
                    self.waiting_cards.remove(&l);
                }
            }
            match r.borrowed {
                Some(b) => {
                    self.borrowed.get_or_create(&l).set(gauge(b));
                }
                None => {
                    self.borrowed.remove(&l);
                }
            }
            match r.borrow {
                Some(b) => {
                    self.borrow_limit.get_or_create(&l).set(gauge(b));
                }
                None => {
                    self.borrow_limit.remove(&l);
                }
            }
        }
        if now.is_empty() {
            published.remove(queue);
        } else {
            published.insert(queue.to_string(), now);
        }
    }

    /// Sets the deny-under-fail-open gauge to `queues` (every such queue).
    pub fn publish_deny_fail_open(&self, queues: impl IntoIterator<Item = String>) {
        self.deny_fail_open.clear();
        for queue_name in queues {
            self.deny_fail_open
                .get_or_create(&QueueLabel { queue_name })
                .set(1);
        }
    }

    /// Sets the waiting-job gauges to `waiting` (every waiting group, all queues).
    pub fn publish_waiting<'a>(
        &self,
        waiting: impl IntoIterator<Item = &'a PodGroupRecord>,
        now: jiff::Timestamp,
    ) {
        let mut count: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut longest: BTreeMap<String, i64> = BTreeMap::new();
        for g in waiting {
            let Some(Ok(r)) = &g.request else { continue };
            for (a, _) in &r.0 {
                *count
                    .entry((g.queue.to_string(), a.to_string()))
                    .or_default() += 1;
            }
            let waited = g
                .created
                .map_or(0, |c| now.duration_since(c).as_secs().max(0));
            let e = longest.entry(g.queue.to_string()).or_default();
            *e = (*e).max(waited);
        }
        self.jobs_waiting.clear();
        self.longest_wait.clear();
        for ((queue_name, card_name), n) in count {
            self.jobs_waiting
                .get_or_create(&QueueCardLabels {
                    queue_name,
                    card_name,
                })
                .set(n);
        }
        for (queue_name, s) in longest {
            self.longest_wait
                .get_or_create(&QueueLabel { queue_name })
                .set(s);
        }
    }

    /// Sets the unmanaged-cards gauge to `list` (every node).
    pub fn publish_unmanaged(&self, list: &[crate::controller::plan::Unmanaged]) {
        self.unmanaged.clear();
        for u in list {
            self.unmanaged
                .get_or_create(&NodeCardLabels {
                    node: u.node.clone(),
                    resource: u.resource.clone(),
                    card_name: u.model.clone(),
                })
                .set(i64::try_from(u.cards).unwrap_or(i64::MAX));
        }
    }

    /// Queues whose gauges are published.
    pub fn published_queues(&self) -> Vec<String> {
        let published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        published.keys().cloned().collect()
    }
}
