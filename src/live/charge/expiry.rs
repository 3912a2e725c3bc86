//! When charges stop counting (R3): pruning's clock and the hold clock on this
//! replica's monotonic clock, and the fence an expired charge is dropped behind.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use crate::cards::QueueName;
use crate::ledger::clock::{lifetime, EntryClock, HoldClock, STORE_LAG};
use crate::ledger::entries::{Entry, EntryId, Ledger, Watermark};
use crate::ledger::EntryKey;
use crate::ledger::LedgerRecord;
use crate::snapshot::overlay::name_taken;
use crate::snapshot::Snapshot;

use super::locks::{self, AtClocks, Before, Held, Unlocked};
use super::Committer;

/// How often pruning's clock drops entries of ledgers that no longer hold them.
pub(super) const CLOCK_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The shell's clock: tokio's, which is the monotonic clock when serving and can be
/// paused and advanced by a test (the committer model jumps past hold and entry TTLs).
impl crate::ledger::clock::Moment for Instant {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// The clocks charges stop counting by, on this replica's monotonic clock.
pub(super) struct Clocks {
    /// When this replica first read each entry as it is now: pruning's clock.
    pub(super) entries: EntryClock<Instant>,
    /// When this replica first saw each renewal of another replica's hold.
    pub(super) holds: HoldClock<Instant>,
    /// When `entries` last lost the entries no ledger holds any more.
    pub(super) swept: Instant,
}

impl Committer {
    /// When the last of the charges of `queue`'s ledger that ran out on this replica's
    /// clocks expired (entries no cache showed, others' holds), if any did. An entry
    /// under a name another stored incarnation holds in this cache runs out a store's
    /// lag after it was first seen (`snapshot::overlay::fate`), any other its
    /// [`lifetime`].
    pub(super) fn expired_since(
        &self,
        snapshot: &Mutex<Snapshot>,
        held: &Held<Unlocked>,
        queue: &QueueName,
    ) -> Option<Instant> {
        let now = Instant::now();
        let snap = locks::snapshot(snapshot, held);
        let ledger = snap.ledger(queue);
        let clocks = self.clocks.lock(snap.held());
        let entries = clocks
            .entries
            .expired_within(queue, &ledger.ledger, now, |id, e| match &e.of {
                EntryKey::Pod(k) if e.node.is_none() && name_taken(&snap, k, id) => STORE_LAG,
                _ => lifetime(e),
            });
        self.with_holds_expiry(&clocks, queue, &ledger.ledger, entries, now)
    }

    fn with_holds_expiry(
        &self,
        clocks: &Clocks,
        queue: &QueueName,
        ledger: &Ledger,
        entries: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        let holds = clocks
            .holds
            .expired_since(queue, ledger, self.me.as_deref(), now);
        entries.max(holds)
    }

    /// The fence a plan of `queue` may drop expired charges behind: asked for when
    /// charges have expired since the newest one, waited for until `until`.
    pub(super) async fn fence_for(
        &self,
        snapshot: &Mutex<Snapshot>,
        queue: &QueueName,
        until: Instant,
    ) -> Option<(Instant, Watermark)> {
        let f = self.freshness.as_ref()?;
        let none = Held::unlocked().await;
        let progress = || locks::snapshot(snapshot, &none).progress();
        let expired = self.expired_since(snapshot, &none, queue);
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

    pub(super) fn age_fn<'a, A: Before<AtClocks>>(
        &'a self,
        held: &'a Held<A>,
        queue: &QueueName,
    ) -> impl Fn(&EntryId, &Entry) -> Duration + 'a {
        let now = Instant::now();
        let q = queue.clone();
        move |id: &EntryId, e: &Entry| {
            let first = self.clocks.lock(held).entries.first_seen(&q, id, e, now);
            now.saturating_duration_since(first)
        }
    }

    /// [`Committer::stored`] for a ledger read or written outside its queue's writer.
    pub(super) fn keep(
        &self,
        held: &Held<Unlocked>,
        snapshot: &Mutex<Snapshot>,
        rec: LedgerRecord,
    ) {
        let q = rec.queue.clone();
        self.stored(held, &q, snapshot, rec);
    }

    /// Takes a ledger this replica wrote into the snapshot; entries it no longer
    /// holds leave pruning's clock.
    pub(super) fn stored(
        &self,
        held: &Held<Unlocked>,
        queue: &QueueName,
        snapshot: &Mutex<Snapshot>,
        rec: LedgerRecord,
    ) {
        let mut snap = locks::snapshot(snapshot, held);
        snap.upsert_ledger(rec);
        let ledger = snap.ledger(queue);
        let mut clocks = self.clocks.lock(snap.held());
        clocks
            .entries
            .retain(|q, id| q != queue || ledger.ledger.get(id).is_some());
        // Entries of ledgers this replica read once and never wrote again leave too
        // (a few times a minute: the sweep is O(the clock) under the snapshot lock). A
        // cached ledger that does not show an entry yet only restarts its clock later.
        if clocks.swept.elapsed() >= CLOCK_SWEEP_EVERY {
            clocks.swept = Instant::now();
            clocks
                .entries
                .retain(|q, id| snap.ledger(q).ledger.get(id).is_some());
        }
    }
}
