//! Group commit, the imperative half: a replica's charging requests for one queue wait
//! in a slot; one task per busy queue takes everything waiting, decides it as one
//! batch (`decide::batch::plan`), writes the queue's ledger once with a
//! compare-and-swap, and only then answers. On a conflict it reads the ledger again
//! and decides again the requests it had admitted; denials stay denials. Requests that
//! arrive meanwhile form the next batch, so a burst costs one write per round trip,
//! not one per pod (Kubernetes' ResourceQuota admission works the same way).
//!
//! Where each part lives: `writer` (the batch, its write and retries: R1 and R2 of
//! docs/consistency.md), `holds` (admissions under this replica's holds and the keeper),
//! `expiry` (when a charge stops counting: R3, on the pure clocks of `ledger::clock`),
//! `prune` (the reconciler's sweep), `tree_changes` (seals and re-reads when the queue
//! tree changes), `locks` (the one lock order, kept by types). The decisions themselves
//! are the pure core's (`decide::batch`, `decide::escrow`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::oneshot;

use crate::cards::QueueName;
use crate::decide::batch::{look, HoldMove};
use crate::decide::pod::{remember_pin, settle_pin};
use crate::decide::review::{AdmissionRequest, Operation};
use crate::decide::{Config, Decision};
use crate::ledger::clock::{EntryClock, HoldClock};
use crate::ledger::entries::Watermark;
use crate::snapshot::Snapshot;

use super::freshness::Freshness;
use super::ledgers::LedgerApi;

mod expiry;
mod holds;
pub mod locks;
mod prune;
mod tree_changes;
mod writer;

use expiry::Clocks;
use holds::Holds;
use locks::{AtClocks, AtHolds, AtQueue, Held, Level};
use writer::gave_up;

/// What one ledger write attempt came to (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    Conflict,
    Error,
    Full,
    Timeout,
    /// The caches had not caught up with the ledger's watermark in time.
    Behind,
}

impl WriteOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Conflict => "conflict",
            Self::Error => "error",
            Self::Full => "full",
            Self::Timeout => "timeout",
            Self::Behind => "behind",
        }
    }
}

/// Where write outcomes and batch sizes are counted.
pub trait CommitMetrics: Send + Sync + 'static {
    fn write(&self, outcome: WriteOutcome);
    fn batch(&self, size: usize);
    fn pruned(&self, n: usize);
    /// How long one ledger write took (any outcome).
    fn write_time(&self, took: Duration);
    /// A failed write's ledger was read again: from the watch (`true`), or from the
    /// API server.
    fn reread(&self, from_watch: bool);
    /// A charge was admitted under this replica's hold, with no write of its own.
    fn held(&self) {}
}

/// A scheduler binds a pod moments after it is created, often before the watch has
/// delivered the pod (or a new node) to the cache. Waiting a little for them beats
/// refusing with "try again": a refused binding sends the pod into the scheduler's
/// backoff. Returns at `until` at the latest; the decision then says what is missing.
async fn await_binding_objects(snapshot: &Mutex<Snapshot>, req: &AdmissionRequest, until: Instant) {
    if crate::decide::RequestKind::of(req) != crate::decide::RequestKind::Binding
        || req.operation != Operation::Create
    {
        return;
    }
    let Some(obj) = req.object.as_ref() else {
        return;
    };
    let (key, node) = crate::decide::binding::target(req, obj.tree());
    loop {
        {
            let snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
            let pod_known = !matches!(
                crate::decide::binding::shown(&snap, &key, obj.tree()),
                crate::decide::binding::Shown::Unseen
            );
            if pod_known && node.is_none_or(|n| snap.node(n).is_some()) {
                return;
            }
        }
        if Instant::now() >= until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Waiter {
    req: Arc<AdmissionRequest>,
    deadline: Instant,
    answer: oneshot::Sender<Decision>,
    /// Its refusal while it waits for other replicas' holds: the answer at `deadline`.
    refusal: Option<Decision>,
}

impl Waiter {
    fn send(self, d: Decision) {
        // The caller may have gone (the API server timed out); nothing to tell then.
        let _ = self.answer.send(d);
    }
}

#[derive(Default)]
struct Slot {
    waiting: Vec<Waiter>,
    running: bool,
    /// A change of this replica's hold the writer is to make.
    hold_move: Option<HoldMove>,
}

/// Since when a queue's ledger has been ahead of the caches, and the caches' progress
/// then.
struct Behind {
    since: Instant,
    progress: Watermark,
}

/// The group-commit writer of one replica.
///
/// Its locks are taken in one order, kept by their types (`locks`): the snapshot, then
/// `holds`, then `clocks`; `slots` and `behind` alone.
pub struct Committer {
    api: LedgerApi,
    budget: Duration,
    slots: Level<AtQueue, HashMap<QueueName, Slot>>,
    clocks: Level<AtClocks, Clocks>,
    behind: Level<AtQueue, HashMap<QueueName, Behind>>,
    /// Requests take turns here before they lock the snapshot for their preview, so
    /// that one waiting behind another awaits instead of parking a runtime thread; the
    /// watchers lock the snapshot directly and wait for at most one preview or batch.
    turn: tokio::sync::Mutex<()>,
    /// This replica's identity in ledgers' holds (`None`: it takes no holds).
    me: Option<String>,
    holds: Level<AtHolds, Holds>,
    /// Fences and relists; without them nothing stops counting on a clock.
    freshness: Option<Arc<Freshness>>,
    /// One re-read of every ledger at a time after a change of the queue tree.
    reread: tokio::sync::Mutex<()>,
    /// Queues read from the API server to lift seals whose change never landed
    /// (`None`: seals are lifted only by the Queue watch).
    queue_reads: Option<kube::Api<kube::api::DynamicObject>>,
}

/// What [`Committer::preview`] found.
#[derive(Debug)]
pub enum Preview {
    /// The answer: nothing to record.
    Answer(Decision),
    /// Admitted under this replica's hold: nothing to write.
    Held(Decision),
    /// An admitted charge to `queue`, to be recorded before `deadline`.
    Charge { queue: QueueName, deadline: Instant },
}

pub(super) fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Committer {
    /// `budget`: how long one request may take to be recorded before "try again".
    pub fn new(api: LedgerApi, budget: Duration) -> Self {
        Self {
            api,
            budget,
            slots: Level::default(),
            clocks: Level::new(Clocks {
                entries: EntryClock::default(),
                holds: HoldClock::default(),
                swept: Instant::now(),
            }),
            behind: Level::default(),
            turn: tokio::sync::Mutex::new(()),
            me: None,
            holds: Level::default(),
            freshness: None,
            reread: tokio::sync::Mutex::new(()),
            queue_reads: None,
        }
    }

    /// Reads Queues from the API server through `api` to lift seals whose change of the
    /// tree never landed.
    pub fn with_queue_reads(mut self, api: kube::Api<kube::api::DynamicObject>) -> Self {
        self.queue_reads = Some(api);
        self
    }

    /// Proves caches current with reads of the API server (fences, relists): expired
    /// charges may then stop counting.
    pub fn with_freshness(mut self, f: Arc<Freshness>) -> Self {
        self.freshness = Some(f);
        self
    }

    /// The newest fence caches at `progress` have reached: when it was read, its mark.
    fn fence(&self, progress: &Watermark) -> Option<(Instant, Watermark)> {
        self.freshness.as_ref()?.fence(progress)
    }

    /// Takes holds as `me` (an identity no other process uses, this one's incarnation
    /// included): admissions within a hold need no write of their own.
    pub fn with_holds(mut self, me: String) -> Self {
        self.me = Some(me);
        self
    }

    /// True when this replica takes holds of headroom.
    pub fn takes_holds(&self) -> bool {
        self.me.is_some()
    }

    /// Decides `req` from the caches with its queue's ledger laid over them: the
    /// answer, unless it is an admitted charge still to be recorded (`record` set, not
    /// a dry run), which [`Committer::record`] records.
    pub async fn preview(
        &self,
        snapshot: &Mutex<Snapshot>,
        cfg: &Config,
        req: &AdmissionRequest,
        record: bool,
    ) -> Preview {
        let deadline = Instant::now() + self.budget;
        await_binding_objects(snapshot, req, Instant::now() + self.budget / 2).await;
        let consume = record && !req.is_dry_run();
        self.read_ledgers_if_tree_changed(snapshot).await;
        let seen = {
            let _turn = self.turn.lock().await;
            let none = Held::unlocked().await;
            let mut guard = locks::snapshot(snapshot, &none);
            let (snap, at) = guard.split();
            let now = jiff::Timestamp::now();
            let progress = snap.progress();
            let seen = self.as_replica(at, progress, |replica| {
                let consume = consume && replica.is_some();
                look(snap, req, cfg, now, replica, consume)
            });
            // A pin chosen now is in flight until its charge is recorded; a charge held
            // or refused here is as recorded as it will be.
            match (record, &seen.queue) {
                (false, _) => remember_pin(snap, req, &seen.decision, now),
                (true, Some(_)) if !seen.held => {}
                (true, _) => settle_pin(snap, req),
            }
            seen
        };
        if seen.held {
            self.mark_used(&Held::unlocked().await, seen.queue.as_ref());
            return Preview::Held(seen.decision);
        }
        match seen.queue {
            Some(queue) if consume => Preview::Charge { queue, deadline },
            _ => Preview::Answer(seen.decision),
        }
    }

    /// The charge of pod CREATE `req` is recorded (here or by the queue's owner) or
    /// refused: the pin `/mutate` chose for it is no longer in flight.
    pub async fn pin_settled(&self, snapshot: &Mutex<Snapshot>, req: &AdmissionRequest) {
        let none = Held::unlocked().await;
        let mut guard = locks::snapshot(snapshot, &none);
        let (snap, _) = guard.split();
        settle_pin(snap, req);
    }

    /// Records the charge of `req` (admitted by [`Committer::preview`]) in `queue`'s
    /// ledger with the requests waiting beside it, deciding it again over the ledger it
    /// is written into; "try again" at `deadline`.
    pub async fn record(
        self: &Arc<Self>,
        snapshot: &Arc<Mutex<Snapshot>>,
        cfg: &Config,
        metrics: &Arc<dyn CommitMetrics>,
        req: Arc<AdmissionRequest>,
        queue: QueueName,
        deadline: Instant,
    ) -> Decision {
        let (tx, rx) = oneshot::channel();
        let none = Held::unlocked().await;
        let start = {
            let mut slots = self.slots.lock(&none);
            let slot = slots.entry(queue.clone()).or_default();
            slot.waiting.push(Waiter {
                req,
                deadline,
                answer: tx,
                refusal: None,
            });
            !std::mem::replace(&mut slot.running, true)
        };
        if start {
            self.spawn_writer(&queue, snapshot, cfg, metrics);
        }
        match rx.await {
            Ok(d) => d,
            Err(_) => gave_up(&queue, self.budget, "the ledger writer stopped"),
        }
    }

    /// Starts the writer of `queue` (its slot is marked running).
    fn spawn_writer(
        self: &Arc<Self>,
        queue: &QueueName,
        snapshot: &Arc<Mutex<Snapshot>>,
        cfg: &Config,
        metrics: &Arc<dyn CommitMetrics>,
    ) {
        let me = self.clone();
        let (q, snapshot, cfg, metrics) = (
            queue.clone(),
            snapshot.clone(),
            cfg.clone(),
            metrics.clone(),
        );
        tokio::spawn(async move { me.run(q, snapshot, cfg, metrics).await });
    }
}
