//! Group commit, the imperative half: a replica's charging requests for one queue wait
//! in a slot; one task per busy queue takes everything waiting, decides it as one
//! batch (`decide::batch::plan`), writes the queue's ledger once with a
//! compare-and-swap, and only then answers. On a conflict it reads the ledger again
//! and decides again the requests it had admitted; denials stay denials. Requests that
//! arrive meanwhile form the next batch, so a burst costs one write per round trip,
//! not one per pod (Kubernetes' ResourceQuota admission works the same way).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::cards::QueueName;
use crate::decide::batch::{behind, look, plan, plan_held, HoldMove, Outcome, Replica};
use crate::decide::escrow::{self, Escrow, Holding};
use crate::decide::messages::RETRY;
use crate::decide::review::{AdmissionRequest, Operation};
use crate::decide::{Config, Decision};
use crate::ledger::clock::{hold_usable, EntryClock, HoldClock, HoldCount};
use crate::ledger::entries::{Entry, EntryId, Fence, Hold, Ledger, Watermark};
use crate::ledger::LedgerRecord;
use crate::snapshot::Snapshot;

use super::freshness::Freshness;
use super::ledgers::{LedgerApi, WriteError};

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

/// A hold with spare that nothing used for this long is written down.
const HOLD_IDLE: Duration = Duration::from_secs(1);
/// After answering a release request, a holder takes no spare on that queue for this
/// long (the queue is near its quota).
const HOLD_COOLDOWN: Duration = Duration::from_secs(5);
/// How often the keeper looks at this replica's holds.
const KEEPER_EVERY: Duration = Duration::from_millis(20);

/// When this replica wrote and used its hold on a queue (its monotonic clock).
#[derive(Debug, Clone, Copy)]
struct HoldTimes {
    sent: Instant,
    used: Instant,
    cooldown_until: Option<Instant>,
    /// When the keeper last asked for a change not yet written.
    asked: Option<Instant>,
    /// Spare cards the last renewal left this replica, all models together.
    granted: u128,
}

/// How long a write that lost a compare-and-swap waits for the winner's watch event
/// before it reads the ledger from the API server instead.
const WATCH_REREAD: Duration = Duration::from_millis(3);

fn gave_up(queue: &QueueName, budget: Duration, why: &str) -> Decision {
    Decision::deny(
        RETRY,
        format!(
            "card-quota could not record this charge on queue {queue} within {:.1}s ({why}); try again",
            budget.as_secs_f64()
        ),
    )
}

/// A watch that delivered nothing for this long while a ledger's watermark is ahead of
/// it is listed again from a consistent read (it may be stalled, or quiet after a relist
/// that left it short of a watermark set by an object deleted meanwhile). Until it
/// catches up, requests are answered "try again": never from a cache that may be stale.
const STALL: Duration = Duration::from_secs(1);
/// How long a batch waits for a fence its expired charges need; past it the batch is
/// decided with them still counted.
const FENCE_WAIT: Duration = Duration::from_secs(2);

/// How often pruning's clock drops entries of ledgers that no longer hold them.
const CLOCK_SWEEP_EVERY: Duration = Duration::from_secs(10);

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
            let pod_known = snap.pod(&key).is_some() || snap.is_known_cardless_pod(&key);
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
/// Its locks are taken in one order, never the reverse: the snapshot, then `escrows`,
/// then `times`, `clock` and `hold_clock` (each alone). `slots` and `behind` are taken
/// alone. A std mutex held across two worker threads in opposite orders stops the
/// whole runtime, every hook with it.
pub struct Committer {
    api: LedgerApi,
    budget: Duration,
    slots: Mutex<HashMap<QueueName, Slot>>,
    /// When this replica first read each entry as it is now: pruning's clock.
    clock: Mutex<EntryClock<Instant>>,
    /// When `clock` last lost the entries no ledger holds any more.
    swept: Mutex<Instant>,
    behind: Mutex<HashMap<QueueName, Behind>>,
    /// Requests take turns here before they lock the snapshot for their preview, so
    /// that one waiting behind another awaits instead of parking a runtime thread; the
    /// watchers lock the snapshot directly and wait for at most one preview or batch.
    turn: tokio::sync::Mutex<()>,
    /// This replica's identity in ledgers' holds (`None`: it takes no holds).
    me: Option<String>,
    escrows: Mutex<HashMap<QueueName, Escrow>>,
    times: Mutex<HashMap<QueueName, HoldTimes>>,
    /// When this replica first saw each renewal of another replica's hold.
    hold_clock: Mutex<HoldClock<Instant>>,
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
            slots: Mutex::default(),
            clock: Mutex::default(),
            swept: Mutex::new(Instant::now()),
            behind: Mutex::default(),
            turn: tokio::sync::Mutex::new(()),
            me: None,
            escrows: Mutex::default(),
            times: Mutex::default(),
            hold_clock: Mutex::default(),
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

    /// Before an admitted Queue write is answered: seals the queues it moves to another
    /// ledger in the ledgers they leave, and the queues whose limits it lowers in their
    /// own ([`crate::decide::seal`]). "Try again" when a ledger could not be sealed.
    pub async fn seal_ledgers(
        &self,
        snapshot: &Mutex<Snapshot>,
        req: &AdmissionRequest,
    ) -> Option<Decision> {
        let store = |rec| self.keep(snapshot, rec);
        match super::seals::seal_ledgers(&self.api, snapshot, req, store).await {
            Ok(()) => None,
            Err(e) => Some(Decision::deny(
                RETRY,
                format!(
                    "card-quota could not seal the queues this change affects ({e}); try again"
                ),
            )),
        }
    }

    /// After a change of the queue tree, reads every ledger from the API server before
    /// anything is decided: a queue's charges may now go to a ledger beside one whose
    /// watch has not delivered the charges recorded before the change. When the read
    /// fails, the core answers "try again" (the snapshot still says the tree changed).
    async fn read_ledgers_if_tree_changed(&self, snapshot: &Mutex<Snapshot>) {
        if !locked(snapshot).ledgers_behind_tree() {
            return;
        }
        let _one = self.reread.lock().await;
        let epoch = {
            let snap = locked(snapshot);
            if !snap.ledgers_behind_tree() {
                return;
            }
            snap.tree_epoch()
        };
        // The list starts after the tree's change was seen: it shows every ledger write
        // stored before that change.
        match tokio::time::timeout(self.budget, self.api.list()).await {
            Ok(Ok(ledgers)) => {
                let mut snap = locked(snapshot);
                let n = ledgers.len();
                for l in ledgers {
                    snap.upsert_ledger(l);
                }
                snap.ledgers_read_at(epoch);
                tracing::info!(
                    ledgers = n,
                    "the queue tree changed: every ledger read again"
                );
            }
            Ok(Err(e)) => {
                tracing::warn!("reading the ledgers again after a change of the queue tree: {e}");
                // Held, so that the requests waiting do not read again at once.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => {
                tracing::warn!(
                    "reading the ledgers again after a change of the queue tree timed out"
                );
            }
        }
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

    /// A hold is used for `HOLD_USE` after its write was sent, whatever the keeper
    /// managed meanwhile: readers' clocks run out after that.
    fn freeze_stale(&self, escrows: &mut HashMap<QueueName, Escrow>) {
        let times = locked(&self.times);
        let now = Instant::now();
        for (q, e) in escrows.iter_mut() {
            let stale = times.get(q).is_none_or(|t| !hold_usable(t.sent, now));
            if stale && !e.spare.is_empty() {
                e.spare.clear();
            }
        }
    }

    /// True when this replica takes holds of headroom.
    pub fn takes_holds(&self) -> bool {
        self.me.is_some()
    }

    /// True when another replica's hold still counts (`HoldClock::counts`); past its
    /// clock, a fence read after it ran out is asked for.
    fn hold_counts(
        &self,
        queue: &QueueName,
        replica: &str,
        hold: &Hold,
        fence: Option<Instant>,
    ) -> bool {
        let count = locked(&self.hold_clock).counts(queue, replica, hold, Instant::now(), fence);
        if let (HoldCount::UntilFence { expiry }, Some(f)) = (count, &self.freshness) {
            f.want(expiry);
        }
        count.counts()
    }

    /// When the last of the charges in `ledger` (of `queue`) that ran out on this
    /// replica's clocks expired (entries no cache showed, others' holds), if any did.
    fn expired_since(&self, queue: &QueueName, ledger: &Ledger) -> Option<Instant> {
        let now = Instant::now();
        let entries = locked(&self.clock).expired_since(queue, ledger, now);
        let holds = locked(&self.hold_clock).expired_since(queue, ledger, self.me.as_deref(), now);
        entries.max(holds)
    }

    /// The fence a plan of `queue` may drop expired charges behind: asked for when
    /// charges have expired since the newest one, waited for until `until`.
    async fn fence_for(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        until: Instant,
    ) -> Option<(Instant, Watermark)> {
        let f = self.freshness.as_ref()?;
        let progress = || locked(snapshot).progress();
        let expired = {
            let ledger = locked(snapshot).ledger(queue);
            self.expired_since(queue, &ledger.ledger)
        };
        let Some(expired) = expired else {
            return self.fence(&progress());
        };
        f.want(expired);
        loop {
            let fence = self.fence(&progress());
            if fence.is_some_and(|(t, _)| t >= expired) || Instant::now() >= until {
                // An older fence still serves the charges that expired before it.
                return fence;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn age_fn(&self, queue: &QueueName) -> impl Fn(&EntryId, &Entry) -> Duration + '_ {
        let now = Instant::now();
        let q = queue.clone();
        move |id: &EntryId, e: &Entry| {
            let first = locked(&self.clock).first_seen(&q, id, e, now);
            now.saturating_duration_since(first)
        }
    }

    /// [`Committer::stored`] for a ledger read or written outside its queue's writer.
    fn keep(&self, snapshot: &Mutex<Snapshot>, rec: LedgerRecord) {
        let q = rec.queue.clone();
        self.stored(&q, snapshot, rec);
    }

    /// Takes a ledger this replica wrote into the snapshot; entries it no longer
    /// holds leave pruning's clock.
    fn stored(&self, queue: &QueueName, snapshot: &Mutex<Snapshot>, rec: LedgerRecord) {
        let mut snap = locked(snapshot);
        snap.upsert_ledger(rec);
        let ledger = snap.ledger(queue);
        let mut clock = locked(&self.clock);
        clock.retain(|q, id| q != queue || ledger.ledger.get(id).is_some());
        // Entries of ledgers this replica read once and never wrote again leave too
        // (a few times a minute: the sweep is O(the clock) under the snapshot lock). A
        // cached ledger that does not show an entry yet only restarts its clock later.
        let mut swept = locked(&self.swept);
        if swept.elapsed() >= CLOCK_SWEEP_EVERY {
            *swept = Instant::now();
            clock.retain(|q, id| snap.ledger(q).ledger.get(id).is_some());
        }
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
            let mut snap = locked(snapshot);
            let now = jiff::Timestamp::now();
            self.as_replica(snap.progress(), |replica| {
                let consume = consume && replica.is_some();
                look(&mut snap, req, cfg, now, replica, consume)
            })
        };
        if seen.held {
            self.mark_used(seen.queue.as_ref());
            return Preview::Held(seen.decision);
        }
        match seen.queue {
            Some(queue) if consume => Preview::Charge { queue, deadline },
            _ => Preview::Answer(seen.decision),
        }
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
        let start = {
            let mut slots = locked(&self.slots);
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

    /// Commits batches for `queue` until nothing waits.
    async fn run(
        self: Arc<Self>,
        queue: QueueName,
        snapshot: Arc<Mutex<Snapshot>>,
        cfg: Config,
        metrics: Arc<dyn CommitMetrics>,
    ) {
        /// Should the writer ever stop early (a panic), its slot is freed so that the
        /// next request starts a new writer; whoever waited is told to try again.
        struct Release<'a> {
            committer: &'a Committer,
            queue: &'a QueueName,
            armed: bool,
        }
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                if self.armed {
                    locked(&self.committer.slots).remove(self.queue);
                }
            }
        }
        let mut release = Release {
            committer: &self,
            queue: &queue,
            armed: true,
        };
        loop {
            let (batch, hold_move) = {
                let mut slots = locked(&self.slots);
                match slots.get_mut(&queue) {
                    Some(slot) if !slot.waiting.is_empty() || slot.hold_move.is_some() => (
                        std::mem::take(&mut slot.waiting),
                        slot.hold_move.take().unwrap_or(HoldMove::AsNeeded),
                    ),
                    _ => {
                        slots.remove(&queue);
                        release.armed = false;
                        return;
                    }
                }
            };
            if !batch.is_empty() {
                metrics.batch(batch.len());
            }
            self.commit(&queue, batch, hold_move, &snapshot, &cfg, metrics.as_ref())
                .await;
        }
    }

    /// Waits until the caches have reached the ledger's watermark; false at `until`.
    async fn caught_up(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        until: Instant,
    ) -> bool {
        loop {
            self.read_ledgers_if_tree_changed(snapshot).await;
            let (mark, progress) = {
                let snap = locked(snapshot);
                (behind(&snap, queue), snap.progress())
            };
            let Some(mark) = mark else {
                locked(&self.behind).remove(queue);
                return true;
            };
            {
                let mut b = locked(&self.behind);
                let entry = b.entry(queue.clone()).or_insert(Behind {
                    since: Instant::now(),
                    progress,
                });
                if entry.progress != progress {
                    entry.progress = progress;
                    entry.since = Instant::now();
                } else if entry.since.elapsed() >= STALL {
                    if let Some(f) = &self.freshness {
                        f.relist_behind(&mark, &progress);
                    }
                }
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn commit(
        &self,
        queue: &QueueName,
        mut undecided: Vec<Waiter>,
        mut hold_move: HoldMove,
        snapshot: &Mutex<Snapshot>,
        cfg: &Config,
        metrics: &dyn CommitMetrics,
    ) {
        let mut backoff = Duration::from_millis(20);
        let mut attempt = 0u32;
        let mut last_error = String::from("the ledger kept changing");
        // A change of the hold alone gets the budget of a request.
        let hold_until = Instant::now() + self.budget;
        loop {
            let now = Instant::now();
            let (live, late): (Vec<_>, Vec<_>) =
                undecided.into_iter().partition(|w| w.deadline > now);
            for mut w in late {
                match w.refusal.take() {
                    // A warned admission is only an answer once recorded.
                    Some(d) if !d.allowed => w.send(d),
                    _ => {
                        metrics.write(WriteOutcome::Timeout);
                        w.send(gave_up(queue, self.budget, &last_error));
                    }
                }
            }
            undecided = live;
            let moving =
                !matches!(hold_move, HoldMove::AsNeeded | HoldMove::NoSpare) && now < hold_until;
            let Some(until) = undecided
                .iter()
                .map(|w| w.deadline)
                .chain(moving.then_some(hold_until))
                .max()
            else {
                return;
            };
            // Requests that waited behind a renewal may fit the hold it wrote.
            undecided = self.admit_held(snapshot, cfg, undecided, metrics);
            if undecided.is_empty() && !moving {
                return;
            }
            if !self.caught_up(snapshot, queue, until).await {
                for w in undecided {
                    metrics.write(WriteOutcome::Behind);
                    w.send(gave_up(
                        queue,
                        self.budget,
                        "card-quota's caches are behind the queue's ledger",
                    ));
                }
                return;
            }
            let fenced = self
                .fence_for(snapshot, queue, until.min(Instant::now() + FENCE_WAIT))
                .await;
            if let Some(api) = &self.queue_reads {
                super::seals::confirm_seals(api, snapshot, queue).await;
            }
            let store = |rec| self.keep(snapshot, rec);
            super::seals::read_sources(&self.api, snapshot, queue, store).await;
            // A warned admission waits for others' spare half its budget at most, then
            // is recorded with its warning (a dead holder's spare never comes back).
            let warned_wait = undecided.iter().all(|w| {
                w.refusal.as_ref().is_none_or(|d| !d.allowed)
                    || Instant::now() + self.budget / 2 < w.deadline
            });
            let mut planned: Option<Escrow> = None;
            let batch = {
                let reqs: Vec<&AdmissionRequest> =
                    undecided.iter().map(|w| w.req.as_ref()).collect();
                let mut snap = locked(snapshot);
                let now = jiff::Timestamp::now();
                let fenced = fenced.filter(|(_, m)| m.reached_by(&snap.progress()));
                let fence = fenced.map(plan_fence);
                match &self.me {
                    Some(me) => {
                        let mut escrows = locked(&self.escrows);
                        let escrow = escrows.entry(queue.clone()).or_default();
                        let at = fenced.map(|(t, _)| t);
                        let live = |r: &str, h: &Hold| self.hold_counts(queue, r, h, at);
                        let cooling = locked(&self.times)
                            .get(queue)
                            .and_then(|t| t.cooldown_until)
                            .is_some_and(|t| t > Instant::now());
                        let mv = match hold_move {
                            HoldMove::Renew if cooling => HoldMove::Shrink,
                            HoldMove::AsNeeded if cooling => HoldMove::NoSpare,
                            other => other,
                        };
                        let holding = Holding {
                            me,
                            live: &live,
                            escrow,
                        };
                        let batch = plan_held(
                            &mut snap,
                            queue,
                            &reqs,
                            cfg,
                            now,
                            self.age_fn(queue),
                            fence.as_ref(),
                            Some(&holding),
                            mv,
                            warned_wait,
                        );
                        // A hold written down or given back admits nothing more; one
                        // renewed goes on admitting under its old spare meanwhile.
                        match &batch.renewal {
                            Some(r) if r.escrow.spare.is_empty() => escrow.spare.clear(),
                            _ => {}
                        }
                        planned = Some(escrow.clone());
                        batch
                    }
                    None => plan(
                        &mut snap,
                        queue,
                        &reqs,
                        cfg,
                        now,
                        self.age_fn(queue),
                        fence.as_ref(),
                    ),
                }
            };
            for _ in 0..batch.full {
                metrics.write(WriteOutcome::Full);
            }
            let write_needed = !batch.unchanged();
            let mut admitted = Vec::new();
            let mut waiting = Vec::new();
            for (mut w, o) in undecided.into_iter().zip(batch.outcomes) {
                match o {
                    Outcome::Answer(d) => w.send(d),
                    Outcome::Admit(d) => admitted.push((w, d)),
                    Outcome::Wait(d) => {
                        w.refusal = Some(d);
                        waiting.push(w);
                    }
                }
            }
            if !write_needed {
                if waiting.is_empty() {
                    return;
                }
                // Other replicas' holds are being released: decide again when the
                // ledger changes.
                let rv = batch.resource_version.clone();
                self.ledger_changed(snapshot, queue, rv.as_deref(), Duration::from_millis(50))
                    .await;
                undecided = waiting;
                hold_move = HoldMove::AsNeeded;
                continue;
            }
            let t = Instant::now();
            let written = tokio::time::timeout_at(
                until.into(),
                self.api
                    .write(queue, batch.resource_version.as_deref(), &batch.text),
            )
            .await;
            metrics.write_time(t.elapsed());
            let lost_race = matches!(written, Ok(Err(WriteError::Conflict(_))));
            let retry: Vec<Waiter> = match written {
                Ok(Ok(rec)) => {
                    metrics.write(WriteOutcome::Written);
                    metrics.pruned(batch.pruned);
                    // The written ledger first: until the escrow below drops what the
                    // write turned into entries, those pods count twice, never zero times.
                    self.stored(queue, snapshot, rec);
                    if let Some(r) = batch.renewal {
                        let answered = r.escrow.released;
                        let granted: u128;
                        {
                            let mut escrows = locked(&self.escrows);
                            let kept = match (&planned, escrows.get(queue)) {
                                (Some(p), Some(now)) => escrow::landed(r.escrow, p, now),
                                _ => r.escrow,
                            };
                            granted = kept.spare.values().map(|c| c.get()).sum();
                            escrows.insert(queue.clone(), kept);
                        }
                        let mut times = locked(&self.times);
                        let tm = times.entry(queue.clone()).or_insert(HoldTimes {
                            sent: t,
                            used: t,
                            cooldown_until: None,
                            asked: None,
                            granted,
                        });
                        tm.sent = t;
                        tm.asked = None;
                        tm.granted = granted;
                        if answered > 0 && r.hold.as_ref().is_none_or(|h| h.spare.is_empty()) {
                            tm.cooldown_until = Some(Instant::now() + HOLD_COOLDOWN);
                        }
                    }
                    for (w, d) in admitted {
                        w.send(d);
                    }
                    if waiting.is_empty() {
                        return;
                    }
                    self.ledger_changed(snapshot, queue, None, Duration::from_millis(50))
                        .await;
                    undecided = waiting;
                    hold_move = HoldMove::AsNeeded;
                    continue;
                }
                Ok(Err(WriteError::Conflict(_))) => {
                    metrics.write(WriteOutcome::Conflict);
                    attempt += 1;
                    admitted
                        .into_iter()
                        .map(|(w, _)| w)
                        .chain(waiting)
                        .collect()
                }
                Ok(Err(e)) => {
                    metrics.write(WriteOutcome::Error);
                    tracing::warn!("ledger write failed: {e}");
                    last_error = e.to_string();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(400));
                    admitted
                        .into_iter()
                        .map(|(w, _)| w)
                        .chain(waiting)
                        .collect()
                }
                Err(_) => {
                    // Say whether the API server was slow or other writers used the budget.
                    let why = match attempt {
                        0 => "the API server did not answer the ledger write in time".to_string(),
                        n => format!(
                            "the API server did not answer the ledger write in time, \
                             after {n} earlier write(s) lost to other writers"
                        ),
                    };
                    for (w, _) in admitted {
                        metrics.write(WriteOutcome::Timeout);
                        w.send(gave_up(queue, self.budget, &why));
                    }
                    for mut w in waiting {
                        if let Some(d) = w.refusal.take() {
                            w.send(d);
                        }
                    }
                    return;
                }
            };
            undecided = retry;
            let hold_retry = !matches!(hold_move, HoldMove::AsNeeded | HoldMove::NoSpare)
                && batch.renewal.is_some();
            if undecided.is_empty() && !hold_retry {
                // Only pruning was lost; the next batch or pass prunes again.
                return;
            }
            if attempt > 1 {
                tokio::time::sleep(jitter(attempt)).await;
            }
            // Decide again over the ledger as it is now. Another replica's write made
            // ours fail, and its watch event often arrives as soon as our 409: then the
            // cache already holds that ledger, and reading it again would cost a round
            // trip for nothing. Either way the next write is compare-and-swap again.
            if lost_race
                && self
                    .watched_past(snapshot, queue, batch.resource_version.as_deref())
                    .await
            {
                metrics.reread(true);
                continue;
            }
            metrics.reread(false);
            match tokio::time::timeout_at(until.into(), self.api.get(queue)).await {
                Ok(Ok(rec)) => locked(snapshot).upsert_ledger(rec),
                Ok(Err(e)) => tracing::warn!(
                    "re-reading the ledger of queue {} failed: {e}",
                    queue.as_str().escape_debug()
                ),
                Err(_) => {}
            }
        }
    }

    /// Waits up to [`WATCH_REREAD`] for the cache to hold a ledger of `queue` other than
    /// the one at `tried` (the version a write just failed against). The cache keeps
    /// only newer ledgers, so another one is the newer one.
    async fn watched_past(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        tried: Option<&str>,
    ) -> bool {
        let until = Instant::now() + WATCH_REREAD;
        loop {
            if locked(snapshot).ledger(queue).resource_version.as_deref() != tried {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Answers the waiters whose charges fit this replica's hold; returns the others.
    fn admit_held(
        &self,
        snapshot: &Mutex<Snapshot>,
        cfg: &Config,
        waiters: Vec<Waiter>,
        metrics: &dyn CommitMetrics,
    ) -> Vec<Waiter> {
        if self.me.is_none() || waiters.is_empty() {
            return waiters;
        }
        let mut snap = locked(snapshot);
        let progress = snap.progress();
        let (held, rest): (Vec<_>, Vec<_>) = self.as_replica(progress, |replica| {
            let Some(replica) = replica else {
                return (Vec::new(), waiters);
            };
            let mut held = Vec::new();
            let mut rest = Vec::new();
            for w in waiters {
                if w.refusal.is_some() {
                    rest.push(w);
                    continue;
                }
                let now = jiff::Timestamp::now();
                let seen = look(&mut snap, &w.req, cfg, now, Some(&mut *replica), true);
                if seen.held {
                    held.push((w, seen));
                } else {
                    rest.push(w);
                }
            }
            (held, rest)
        });
        for (w, seen) in held {
            metrics.held();
            self.mark_used(seen.queue.as_ref());
            w.send(seen.decision);
        }
        rest
    }

    /// Runs `f` with this replica's holds (`None` when it takes none), stale spare
    /// frozen first.
    /// `progress`: how far the caches the decision reads have come.
    fn as_replica<T>(
        &self,
        progress: Watermark,
        f: impl FnOnce(Option<&mut Replica<'_>>) -> T,
    ) -> T {
        let Some(me) = &self.me else {
            return f(None);
        };
        let mut escrows = locked(&self.escrows);
        self.freeze_stale(&mut escrows);
        let fence = self.fence(&progress).map(|(t, _)| t);
        let live = |q: &QueueName, r: &str, h: &Hold| self.hold_counts(q, r, h, fence);
        let mut replica = Replica {
            me,
            live: &live,
            escrows: &mut escrows,
        };
        f(Some(&mut replica))
    }

    /// Notes that `queue`'s hold admitted a charge just now (the keeper's idle clock).
    fn mark_used(&self, queue: Option<&QueueName>) {
        let Some(q) = queue else { return };
        if let Some(t) = locked(&self.times).get_mut(q) {
            t.used = Instant::now();
        }
    }

    /// Waits up to `most` for the cache to hold a ledger of `queue` other than the one
    /// at `seen` (the current one when `None`).
    async fn ledger_changed(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        seen: Option<&str>,
        most: Duration,
    ) {
        let seen = match seen {
            Some(s) => Some(s.to_string()),
            None => locked(snapshot).ledger(queue).resource_version.clone(),
        };
        let until = Instant::now() + most;
        while Instant::now() < until {
            if locked(snapshot).ledger(queue).resource_version != seen {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Asks the writer of `queue` to change this replica's hold.
    fn request_move(
        self: &Arc<Self>,
        queue: &QueueName,
        mv: HoldMove,
        snapshot: &Arc<Mutex<Snapshot>>,
        cfg: &Config,
        metrics: &Arc<dyn CommitMetrics>,
    ) {
        let start = {
            let mut slots = locked(&self.slots);
            let slot = slots.entry(queue.clone()).or_default();
            slot.hold_move = Some(match (slot.hold_move, mv) {
                (Some(HoldMove::Drop), _) | (_, HoldMove::Drop) => HoldMove::Drop,
                (Some(HoldMove::Shrink), _) | (_, HoldMove::Shrink) => HoldMove::Shrink,
                _ => mv,
            });
            !std::mem::replace(&mut slot.running, true)
        };
        if start {
            self.spawn_writer(queue, snapshot, cfg, metrics);
        }
    }

    /// Keeps this replica's holds: answers release requests, writes down holds that
    /// sit idle, renews those still in use before they may no longer be used, and
    /// drops them all when `stop` turns true (a graceful stop), before returning.
    pub async fn keep_holds(
        self: Arc<Self>,
        snapshot: Arc<Mutex<Snapshot>>,
        cfg: Config,
        metrics: Arc<dyn CommitMetrics>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let Some(me) = self.me.clone() else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(KEEPER_EVERY) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                break;
            }
            for (queue, mv) in self.due_moves(&me, &snapshot) {
                self.request_move(&queue, mv, &snapshot, &cfg, &metrics);
            }
            self.forget_old_renewals(&snapshot);
        }
        // A graceful stop: what is held goes back, what is in flight becomes entries.
        let queues: Vec<QueueName> = locked(&self.escrows).keys().cloned().collect();
        for q in &queues {
            self.request_move(q, HoldMove::Drop, &snapshot, &cfg, &metrics);
        }
        let until = Instant::now() + self.budget;
        while Instant::now() < until {
            let left = {
                let snap = locked(&snapshot);
                queues
                    .iter()
                    .filter(|q| snap.ledger(q).ledger.holds().contains_key(&me))
                    .count()
            };
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::info!("holds given back on {} queue(s)", queues.len());
    }

    /// Forgets the first sight of renewals no ledger holds any more (superseded, or
    /// the hold dropped): one clock per renewal would otherwise pile up for good. A
    /// renewal still stored keeps its clock, so a dead replica's hold stays expired.
    fn forget_old_renewals(&self, snapshot: &Mutex<Snapshot>) {
        if locked(&self.hold_clock).is_empty() {
            return;
        }
        // The snapshot first, as everywhere (see [`Committer`]): the other order
        // deadlocked against a plan, which asks for `hold_clock` under the snapshot.
        let snap = locked(snapshot);
        locked(&self.hold_clock).retain_held(|q, r, renewal| {
            snap.ledger(q)
                .ledger
                .holds()
                .get(r)
                .is_some_and(|h| h.renewal == renewal)
        });
    }

    /// The hold changes due now.
    fn due_moves(&self, me: &str, snapshot: &Mutex<Snapshot>) -> Vec<(QueueName, HoldMove)> {
        let now = Instant::now();
        let snap = locked(snapshot);
        let escrows = locked(&self.escrows);
        let mut times = locked(&self.times);
        let mut out = Vec::new();
        for (q, e) in escrows.iter() {
            let stored = snap.ledger(q);
            let holds = stored.ledger.holds().get(me);
            let Some(t) = times.get_mut(q) else { continue };
            if t.asked
                .is_some_and(|a| now.saturating_duration_since(a) < self.budget)
            {
                continue;
            }
            let age = now.saturating_duration_since(t.sent);
            if escrow::release_asked(&stored.ledger, e) && holds.is_some_and(|h| !h.is_empty()) {
                out.push((q.clone(), HoldMove::Shrink));
            } else if !hold_usable(t.sent, now) && !e.spare.is_empty() {
                // No more admissions under this write: its spare is spent or renewed.
                out.push((
                    q.clone(),
                    if now.saturating_duration_since(t.used) < HOLD_IDLE {
                        HoldMove::Renew
                    } else {
                        HoldMove::Shrink
                    },
                ));
            } else if now.saturating_duration_since(t.used) < HOLD_IDLE
                && t.granted >= 8
                && e.spare.values().map(|c| c.get()).sum::<u128>() * 4 < t.granted
                && t.cooldown_until.is_none_or(|c| c <= now)
            {
                // In use and three quarters spent: renewed before admissions must wait
                // for a write.
                out.push((q.clone(), HoldMove::Renew));
            } else if !e.spare.is_empty() && now.saturating_duration_since(t.used) >= HOLD_IDLE {
                out.push((q.clone(), HoldMove::Shrink));
            } else if e.spare.is_empty() && holds.is_some() && age >= HOLD_IDLE {
                // Written down but still carrying admissions: again once they settle,
                // and before readers' clocks run out.
                out.push((q.clone(), HoldMove::Shrink));
            }
        }
        for (q, _) in &out {
            if let Some(t) = times.get_mut(q) {
                t.asked = Some(now);
            }
        }
        out
    }

    /// Prunes `queue`'s ledger when no batch is running for it (the reconciler's
    /// sweep of quiet queues). Returns the entries dropped.
    pub async fn prune(
        self: &Arc<Self>,
        queue: &QueueName,
        snapshot: &Arc<Mutex<Snapshot>>,
        cfg: &Config,
        metrics: &Arc<dyn CommitMetrics>,
    ) -> Result<usize, WriteError> {
        {
            let mut slots = locked(&self.slots);
            let slot = slots.entry(queue.clone()).or_default();
            if slot.running {
                return Ok(0);
            }
            slot.running = true;
        }
        let out = async {
            let fenced = self.fence_for(snapshot, queue, Instant::now()).await;
            let batch = {
                let mut snap = locked(snapshot);
                if behind(&snap, queue).is_some() {
                    return Ok(0);
                }
                let fence = fenced
                    .filter(|(_, m)| m.reached_by(&snap.progress()))
                    .map(plan_fence);
                plan(
                    &mut snap,
                    queue,
                    &[],
                    cfg,
                    jiff::Timestamp::now(),
                    self.age_fn(queue),
                    fence.as_ref(),
                )
            };
            if batch.pruned == 0 {
                return Ok(0);
            }
            let rec = self
                .api
                .write(queue, batch.resource_version.as_deref(), &batch.text)
                .await?;
            self.stored(queue, snapshot, rec);
            Ok(batch.pruned)
        }
        .await;
        let waiting = {
            let mut slots = locked(&self.slots);
            let waiting = slots.get(queue).is_some_and(|s| !s.waiting.is_empty());
            if !waiting {
                slots.remove(queue);
            }
            waiting
        };
        if waiting {
            // Requests that queued behind the sweep get the writer (still marked running).
            self.spawn_writer(queue, snapshot, cfg, metrics);
        }
        out
    }

    /// Deletes the ledger object of a queue that no longer exists, once it is empty.
    pub async fn delete_orphan(
        &self,
        queue: &QueueName,
        resource_version: &str,
    ) -> Result<(), WriteError> {
        self.api.delete(queue, resource_version).await?;
        // The queue is gone: nothing of it is kept here either.
        locked(&self.behind).remove(queue);
        locked(&self.clock).retain(|q, _| q != queue);
        Ok(())
    }
}

/// The fence a plan is given: the mark read at `taken`, and how long ago that was.
fn plan_fence((taken, mark): (Instant, Watermark)) -> Fence {
    Fence {
        mark,
        taken_ago: taken.elapsed(),
    }
}

/// A pause before retrying after conflicts, spread so racing replicas do not collide
/// again in lockstep.
fn jitter(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let cap = 5u64 << attempt.min(4);
    Duration::from_millis(u64::from(nanos) % cap)
}
