//! This replica's holds of headroom (the imperative half of `decide::escrow`): when
//! others' holds count (the hold clock, `ledger::clock`), admissions under its own
//! hold, and the keeper that renews, writes down and gives back holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use crate::cards::QueueName;
use crate::decide::batch::{HoldMove, Replica};
use crate::decide::escrow::{self, Escrow};
use crate::decide::Config;
use crate::ledger::clock::{hold_usable, HoldCount};
use crate::ledger::entries::{Hold, Watermark};
use crate::snapshot::Snapshot;

use super::locks::{self, AtClocks, AtSnapshot, Before, Held, Unlocked};
use super::{CommitMetrics, Committer};

/// A hold with spare that nothing used for this long is written down.
pub(super) const HOLD_IDLE: Duration = Duration::from_secs(1);

/// After answering a release request, a holder takes no spare on that queue for this
/// long (the queue is near its quota).
pub(super) const HOLD_COOLDOWN: Duration = Duration::from_secs(5);

/// How often the keeper looks at this replica's holds.
pub(super) const KEEPER_EVERY: Duration = Duration::from_millis(20);

/// When this replica wrote and used its hold on a queue (its monotonic clock).
#[derive(Debug, Clone, Copy)]
pub(super) struct HoldTimes {
    pub(super) sent: Instant,
    pub(super) used: Instant,
    pub(super) cooldown_until: Option<Instant>,
    /// When the keeper last asked for a change not yet written.
    pub(super) asked: Option<Instant>,
    /// Spare cards the last renewal left this replica, all models together.
    pub(super) granted: u128,
}

/// This replica's holds of headroom, per queue, and when it wrote and used them.
#[derive(Default)]
pub(super) struct Holds {
    pub(super) escrows: HashMap<QueueName, Escrow>,
    pub(super) times: HashMap<QueueName, HoldTimes>,
}

impl Holds {
    /// A hold is used for `HOLD_USE` after its write was sent, whatever the keeper
    /// managed meanwhile: readers' clocks run out after that.
    pub(super) fn freeze_stale(&mut self, now: Instant) {
        for (q, e) in self.escrows.iter_mut() {
            let stale = self.times.get(q).is_none_or(|t| !hold_usable(t.sent, now));
            if stale && !e.spare.is_empty() {
                e.spare.clear();
            }
        }
    }
}

impl Committer {
    /// True when another replica's hold still counts (`HoldClock::counts`); past its
    /// clock, a fence read after it ran out is asked for.
    pub(super) fn hold_counts(
        &self,
        held: &Held<impl Before<AtClocks>>,
        queue: &QueueName,
        replica: &str,
        hold: &Hold,
        fence: Option<Instant>,
    ) -> bool {
        let count =
            self.clocks
                .lock(held)
                .holds
                .counts(queue, replica, hold, Instant::now(), fence);
        if let (HoldCount::UntilFence { expiry }, Some(f)) = (count, &self.freshness) {
            f.want(expiry);
        }
        count.counts()
    }

    /// Runs `f` with this replica's holds (`None` when it takes none), stale spare
    /// frozen first.
    /// `progress`: how far the caches the decision reads have come.
    pub(super) fn as_replica<T>(
        &self,
        held: &Held<AtSnapshot>,
        progress: Watermark,
        f: impl FnOnce(Option<&mut Replica<'_>>) -> T,
    ) -> T {
        let Some(me) = &self.me else {
            return f(None);
        };
        let mut holds = self.holds.lock(held);
        let (holds, at_holds) = holds.split();
        holds.freeze_stale(Instant::now());
        let fence = self.fence(&progress).map(|(t, _)| t);
        let live = |q: &QueueName, r: &str, h: &Hold| self.hold_counts(at_holds, q, r, h, fence);
        let mut replica = Replica {
            me,
            live: &live,
            escrows: &mut holds.escrows,
        };
        f(Some(&mut replica))
    }

    /// Notes that `queue`'s hold admitted a charge just now (the keeper's idle clock).
    pub(super) fn mark_used(&self, held: &Held<Unlocked>, queue: Option<&QueueName>) {
        let Some(q) = queue else { return };
        if let Some(t) = self.holds.lock(held).times.get_mut(q) {
            t.used = Instant::now();
        }
    }

    /// Asks the writer of `queue` to change this replica's hold.
    pub(super) fn request_move(
        self: &Arc<Self>,
        held: &Held<Unlocked>,
        queue: &QueueName,
        mv: HoldMove,
        snapshot: &Arc<Mutex<Snapshot>>,
        cfg: &Config,
        metrics: &Arc<dyn CommitMetrics>,
    ) {
        let start = {
            let mut slots = self.slots.lock(held);
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
            let none = Held::unlocked().await;
            for (queue, mv) in self.due_moves(&none, &me, &snapshot) {
                self.request_move(&none, &queue, mv, &snapshot, &cfg, &metrics);
            }
            self.forget_old_renewals(&none, &snapshot);
        }
        // A graceful stop: what is held goes back, what is in flight becomes entries.
        let none = Held::unlocked().await;
        let queues: Vec<QueueName> = self.holds.lock(&none).escrows.keys().cloned().collect();
        for q in &queues {
            self.request_move(&none, q, HoldMove::Drop, &snapshot, &cfg, &metrics);
        }
        let until = Instant::now() + self.budget;
        while Instant::now() < until {
            let left = {
                let snap = locks::snapshot(&snapshot, &none);
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
    pub(super) fn forget_old_renewals(&self, held: &Held<Unlocked>, snapshot: &Mutex<Snapshot>) {
        if self.clocks.lock(held).holds.is_empty() {
            return;
        }
        // The snapshot first: a plan asks for the clocks under the snapshot.
        let snap = locks::snapshot(snapshot, held);
        self.clocks
            .lock(snap.held())
            .holds
            .retain_held(|q, r, renewal| {
                snap.ledger(q)
                    .ledger
                    .holds()
                    .get(r)
                    .is_some_and(|h| h.renewal == renewal)
            });
    }

    /// The hold changes due now.
    pub(super) fn due_moves(
        &self,
        held: &Held<Unlocked>,
        me: &str,
        snapshot: &Mutex<Snapshot>,
    ) -> Vec<(QueueName, HoldMove)> {
        let now = Instant::now();
        let snap = locks::snapshot(snapshot, held);
        let mut holds = self.holds.lock(snap.held());
        let Holds { escrows, times } = &mut *holds;
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
}
