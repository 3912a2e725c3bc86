//! The writer of one queue: takes every request waiting in the queue's slot, decides
//! them as one batch over the caches at the ledger's watermark (R2), writes the ledger
//! once with a compare-and-swap and only then answers (R1). On a conflict it decides
//! again over the winner's ledger; denials stay denials.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use crate::cards::QueueName;
use crate::decide::batch::{behind, look, plan, plan_held, HoldMove, Outcome};
use crate::decide::escrow::{self, Escrow, Holding};
use crate::decide::messages::RETRY;
use crate::decide::review::AdmissionRequest;
use crate::decide::{Config, Decision};
use crate::ledger::entries::{Fence, Hold, Watermark};
use crate::live::ledgers::WriteError;
use crate::snapshot::Snapshot;

use super::holds::{HoldTimes, HOLD_COOLDOWN};
use super::locks::{self, Held, Unlocked};
use super::{Behind, CommitMetrics, Committer, Waiter, WriteOutcome};

/// How long a write that lost a compare-and-swap waits for the winner's watch event
/// before it reads the ledger from the API server instead.
pub(super) const WATCH_REREAD: Duration = Duration::from_millis(3);

pub(super) fn gave_up(queue: &QueueName, budget: Duration, why: &str) -> Decision {
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
pub(super) const STALL: Duration = Duration::from_secs(1);

/// How long a batch waits for a fence its expired charges need; past it the batch is
/// decided with them still counted.
pub(super) const FENCE_WAIT: Duration = Duration::from_secs(2);

/// A pause before retrying after conflicts, spread so racing replicas do not collide
/// again in lockstep.
pub(super) fn jitter(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let cap = 5u64 << attempt.min(4);
    Duration::from_millis(u64::from(nanos) % cap)
}

/// The fence a plan is given: the mark read at `taken`, and how long ago that was.
pub(super) fn plan_fence((taken, mark): (Instant, Watermark)) -> Fence {
    Fence {
        mark,
        taken_ago: taken.elapsed(),
    }
}

impl Committer {
    /// Commits batches for `queue` until nothing waits.
    pub(super) async fn run(
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
            none: Held<Unlocked>,
        }
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                if self.armed {
                    self.committer.slots.lock(&self.none).remove(self.queue);
                }
            }
        }
        let mut release = Release {
            committer: &self,
            queue: &queue,
            armed: true,
            none: Held::unlocked().await,
        };
        loop {
            let none = Held::unlocked().await;
            let (batch, hold_move) = {
                let mut slots = self.slots.lock(&none);
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
    pub(super) async fn caught_up(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        until: Instant,
    ) -> bool {
        loop {
            self.read_ledgers_if_tree_changed(snapshot).await;
            let none = Held::unlocked().await;
            let (mark, progress) = {
                let snap = locks::snapshot(snapshot, &none);
                (behind(&snap, queue), snap.progress())
            };
            let Some(mark) = mark else {
                self.behind.lock(&none).remove(queue);
                return true;
            };
            {
                let mut b = self.behind.lock(&none);
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

    pub(super) async fn commit(
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
            let none = Held::unlocked().await;
            undecided = self.admit_held(&none, snapshot, cfg, undecided, metrics);
            if undecided.is_empty() && !moving {
                return;
            }
            // The ledgers its queues' charges moved from first: their watermarks are
            // part of what the caches must reach.
            let store = |rec| self.keep(&none, snapshot, rec);
            crate::live::seals::read_sources(&self.api, snapshot, queue, store).await;
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
                crate::live::seals::confirm_seals(api, snapshot, queue).await;
            }
            let none = Held::unlocked().await;
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
                let mut guard = locks::snapshot(snapshot, &none);
                let (snap, at_snapshot) = guard.split();
                let now = jiff::Timestamp::now();
                let fenced = fenced.filter(|(_, m)| m.reached_by(&snap.progress()));
                let fence = fenced.map(plan_fence);
                match &self.me {
                    Some(me) => {
                        let mut holds = self.holds.lock(at_snapshot);
                        let (holds, at_holds) = holds.split();
                        let cooling = holds
                            .times
                            .get(queue)
                            .and_then(|t| t.cooldown_until)
                            .is_some_and(|t| t > Instant::now());
                        let escrow = holds.escrows.entry(queue.clone()).or_default();
                        let at = fenced.map(|(t, _)| t);
                        let live = |r: &str, h: &Hold| self.hold_counts(at_holds, queue, r, h, at);
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
                            snap,
                            queue,
                            &reqs,
                            cfg,
                            now,
                            self.age_fn(at_holds, queue),
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
                        snap,
                        queue,
                        &reqs,
                        cfg,
                        now,
                        self.age_fn(at_snapshot, queue),
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
                until,
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
                    let none = Held::unlocked().await;
                    self.stored(&none, queue, snapshot, rec);
                    if let Some(r) = batch.renewal {
                        let answered = r.escrow.released;
                        let mut holds = self.holds.lock(&none);
                        let kept = match (&planned, holds.escrows.get(queue)) {
                            (Some(p), Some(now)) => escrow::landed(r.escrow, p, now),
                            _ => r.escrow,
                        };
                        let granted: u128 = kept.spare.values().map(|c| c.get()).sum();
                        holds.escrows.insert(queue.clone(), kept);
                        let tm = holds.times.entry(queue.clone()).or_insert(HoldTimes {
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
                        drop(holds);
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
            match tokio::time::timeout_at(until, self.api.get(queue)).await {
                Ok(Ok(rec)) => {
                    locks::snapshot(snapshot, &Held::unlocked().await).upsert_ledger(rec)
                }
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
    pub(super) async fn watched_past(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        tried: Option<&str>,
    ) -> bool {
        let until = Instant::now() + WATCH_REREAD;
        let none = Held::unlocked().await;
        loop {
            if locks::snapshot(snapshot, &none)
                .ledger(queue)
                .resource_version
                .as_deref()
                != tried
            {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Answers the waiters whose charges fit this replica's hold; returns the others.
    pub(super) fn admit_held(
        &self,
        none: &Held<Unlocked>,
        snapshot: &Mutex<Snapshot>,
        cfg: &Config,
        waiters: Vec<Waiter>,
        metrics: &dyn CommitMetrics,
    ) -> Vec<Waiter> {
        if self.me.is_none() || waiters.is_empty() {
            return waiters;
        }
        let mut guard = locks::snapshot(snapshot, none);
        let (snap, at) = guard.split();
        let progress = snap.progress();
        let (held, rest): (Vec<_>, Vec<_>) = self.as_replica(at, progress, |replica| {
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
                let seen = look(snap, &w.req, cfg, now, Some(&mut *replica), true);
                if seen.held {
                    held.push((w, seen));
                } else {
                    rest.push(w);
                }
            }
            (held, rest)
        });
        drop(guard);
        for (w, seen) in held {
            metrics.held();
            self.mark_used(none, seen.queue.as_ref());
            w.send(seen.decision);
        }
        rest
    }

    /// Waits up to `most` for the cache to hold a ledger of `queue` other than the one
    /// at `seen` (the current one when `None`).
    pub(super) async fn ledger_changed(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        seen: Option<&str>,
        most: Duration,
    ) {
        let none = Held::unlocked().await;
        let seen = match seen {
            Some(s) => Some(s.to_string()),
            None => locks::snapshot(snapshot, &none)
                .ledger(queue)
                .resource_version
                .clone(),
        };
        let until = Instant::now() + most;
        while Instant::now() < until {
            if locks::snapshot(snapshot, &none)
                .ledger(queue)
                .resource_version
                != seen
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
