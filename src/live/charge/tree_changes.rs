//! Changes of the queue tree: an admitted Queue write seals the ledgers it affects
//! before it is answered, and every ledger is read again before anything is decided
//! after the tree changed.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::decide::batch::decide_with_ledger;
use crate::decide::messages::RETRY;
use crate::decide::review::AdmissionRequest;
use crate::decide::{Config, Decision};
use crate::snapshot::Snapshot;

use super::locks::{self, Held};
use super::Committer;

impl Committer {
    /// Before an admitted Queue write is answered: seals the queues it moves to another
    /// ledger in the ledgers they leave, and the queues whose limits it lowers in their
    /// own ([`crate::decide::seal`]); then decides a move again over those ledgers as the
    /// seals' writes found them, with the caches at their watermarks (R1 and R2 for a
    /// Queue write: a charge recorded in a moving queue's ledger before its seal, which
    /// this replica's caches did not show, is counted where the queue goes; found by the
    /// committer model, a move admitted under a parent's cap of 0 with an allocation of
    /// the queue recorded through the other replica). Its refusal, or "try again" when a
    /// ledger could not be sealed or the caches do not reach it within half the budget.
    pub async fn seal_ledgers(
        &self,
        snapshot: &Mutex<Snapshot>,
        cfg: &Config,
        req: &AdmissionRequest,
    ) -> Option<Decision> {
        let none = Held::unlocked().await;
        // Only a move is decided by usage (a limit cut is never refused for it).
        let moves =
            !crate::decide::seal::inbound_for(&locks::snapshot(snapshot, &none), req).is_empty();
        let store = |rec| self.keep(&none, snapshot, rec);
        let mut placed = Vec::new();
        let sealed =
            crate::live::seals::seal_ledgers(&self.api, snapshot, req, store, &mut placed).await;
        let refusal = match sealed {
            Err(e) => Some(Decision::deny(
                RETRY,
                format!(
                    "card-quota could not seal the queues this change affects ({e}); try again"
                ),
            )),
            Ok(written) if moves && !written.is_empty() => {
                self.decide_move_again(snapshot, cfg, req, &written).await
            }
            Ok(_) => None,
        };
        // Refused, the write never lands: its seals are taken back, so the queues they
        // hold back do not wait for it (R2 holds: what they waited for never happens).
        if refusal.is_some() && !placed.is_empty() {
            let none = Held::unlocked().await;
            let store = |rec| self.keep(&none, snapshot, rec);
            crate::live::seals::take_back(&self.api, snapshot, placed, store).await;
        }
        refusal
    }

    /// A move decided again over the ledgers `written` as its seals stored them, once the
    /// caches reach their watermarks (within half the budget, else "try again"): its
    /// refusal, if it no longer fits.
    async fn decide_move_again(
        &self,
        snapshot: &Mutex<Snapshot>,
        cfg: &Config,
        req: &AdmissionRequest,
        written: &[crate::cards::QueueName],
    ) -> Option<Decision> {
        let until = Instant::now() + self.budget / 2;
        for ledger in written {
            if !self.caught_up(snapshot, ledger, until).await {
                return Some(Decision::deny(
                    RETRY,
                    format!("card-quota's caches are behind queue {ledger}'s ledger; try again"),
                ));
            }
        }
        let none = Held::unlocked().await;
        let mut guard = locks::snapshot(snapshot, &none);
        let (snap, _) = guard.split();
        let again = decide_with_ledger(snap, req, cfg, jiff::Timestamp::now());
        (!again.allowed).then_some(again)
    }

    /// Before a Queue write is decided (R2, R4): the cache must show the Queue as stored
    /// ([`crate::decide::seal::queue_behind`]; read from the API server at once when it
    /// does not), and a move is checked against the tree it goes into as stored (every
    /// Queue listed first) and waits while a ledger it moves to holds a seal of a limit
    /// change this replica has not seen ([`crate::live::seals::moves_wait`]). "Try
    /// again" when either cannot be had.
    pub async fn before_queue_write(
        &self,
        snapshot: &Mutex<Snapshot>,
        req: &AdmissionRequest,
    ) -> Option<Decision> {
        let retry = |why: String| Some(Decision::deny(RETRY, format!("{why}; try again")));
        let none = Held::unlocked().await;
        let (behind, moves) = {
            let snap = locks::snapshot(snapshot, &none);
            let moves = !crate::decide::seal::inbound_for(&snap, req).is_empty();
            (crate::decide::seal::queue_behind(&snap, req), moves)
        };
        if let (true, Some(api)) = (moves, &self.queue_reads) {
            if !crate::live::seals::read_all_queues(api, snapshot).await {
                return retry("card-quota could not read the queue tree this move changes".into());
            }
        }
        if let Some(behind) = behind {
            if let Some(api) = &self.queue_reads {
                crate::live::seals::read_queue(api, snapshot, &behind).await;
            }
            let none = Held::unlocked().await;
            if let Some(q) =
                crate::decide::seal::queue_behind(&locks::snapshot(snapshot, &none), req)
            {
                return retry(format!(
                    "card-quota's cache does not show queue {q} as stored yet"
                ));
            }
        }
        if !moves {
            return None;
        }
        match crate::live::seals::moves_wait(&self.api, snapshot, req).await {
            Ok(()) => None,
            Err(e) => retry(format!(
                "card-quota must see a change of the queues this one moves under first ({e})"
            )),
        }
    }

    /// After a change of the queue tree, reads every ledger from the API server before
    /// anything is decided: a queue's charges may now go to a ledger beside one whose
    /// watch has not delivered the charges recorded before the change. When the read
    /// fails, the core answers "try again" (the snapshot still says the tree changed).
    pub(super) async fn read_ledgers_if_tree_changed(&self, snapshot: &Mutex<Snapshot>) {
        let none = Held::unlocked().await;
        if !locks::snapshot(snapshot, &none).ledgers_behind_tree() {
            return;
        }
        let _one = self.reread.lock().await;
        let none = Held::unlocked().await;
        let epoch = {
            let snap = locks::snapshot(snapshot, &none);
            if !snap.ledgers_behind_tree() {
                return;
            }
            snap.tree_epoch()
        };
        // The list starts after the tree's change was seen: it shows every ledger write
        // stored before that change.
        match tokio::time::timeout(self.budget, self.api.list()).await {
            Ok(Ok(ledgers)) => {
                let mut snap = locks::snapshot(snapshot, &none);
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
}
