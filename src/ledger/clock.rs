//! The clocks a charge stops counting by (R3, docs/consistency.md): pruning's clock,
//! when a replica first saw each ledger entry as it is now, and the hold clock, when it
//! first saw each renewal of another replica's hold. Each is read on the reader's own
//! clock and never runs longer than the charge it times has existed. Pure: time is
//! passed in, a monotonic `Instant` in `serve`, a `Duration` since the start in the
//! models, which run these same clocks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cards::QueueName;

use super::entries::{Entry, EntryId, Hold, Ledger};

/// How long another replica's hold counts after this replica first saw its renewal: its
/// holder admits under it for [`HOLD_USE`] at most, and what it admitted is stored
/// within [`STORE_LAG`]. Past this, a fence read afterwards is needed before the hold
/// stops counting: a replica that dies holding stops blocking anyone once caches are
/// known to show what it admitted.
pub const HOLD_TTL: Duration = Duration::from_secs(40);
/// How long a holder admits under one write of its hold, from when it sent the write:
/// far inside [`HOLD_TTL`], so what it admitted is in every cache before any reader's
/// clock runs out.
pub const HOLD_USE: Duration = Duration::from_secs(10);
/// The longest an object card-quota admitted may take to be stored after the answer:
/// the other validating webhooks of its request run beside card-quota's, each within
/// the API's maximum timeout of 30 s.
pub const STORE_LAG: Duration = Duration::from_secs(30);

/// A point on a replica's own clock.
pub trait Moment: Copy + Ord {
    /// This moment plus `d`.
    fn plus(self, d: Duration) -> Self;
    /// How long after `earlier` this moment is (zero when it is not after it).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for Instant {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// Time since a start (the models' clock).
impl Moment for Duration {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn since(self, earlier: Self) -> Duration {
        self.saturating_sub(earlier)
    }
}

/// Whether another replica's hold counts now ([`HoldClock::counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldCount<T> {
    /// Within [`HOLD_TTL`] of its first sight.
    Counts,
    /// Past its clock, but no fence read after `expiry` is reached yet: it counts, and
    /// a fence is wanted.
    UntilFence { expiry: T },
    /// Past its clock, behind a fence read after it ran out: it counts no more.
    Expired,
}

impl<T> HoldCount<T> {
    pub fn counts(&self) -> bool {
        !matches!(self, Self::Expired)
    }
}

/// When this replica first saw each renewal of each other replica's hold, per queue.
#[derive(Debug, Clone)]
pub struct HoldClock<T> {
    seen: HashMap<(QueueName, String, u64), T>,
}

impl<T> Default for HoldClock<T> {
    fn default() -> Self {
        Self {
            seen: HashMap::new(),
        }
    }
}

impl<T: Moment> HoldClock<T> {
    /// Whether `replica`'s `hold` on `queue` counts at `now`, starting its clock if this
    /// renewal is new to this reader. `fence`: when the newest fence the caches reached
    /// was read.
    pub fn counts(
        &mut self,
        queue: &QueueName,
        replica: &str,
        hold: &Hold,
        now: T,
        fence: Option<T>,
    ) -> HoldCount<T> {
        let first = *self
            .seen
            .entry((queue.clone(), replica.to_string(), hold.renewal))
            .or_insert(now);
        let expiry = first.plus(HOLD_TTL);
        if now < expiry {
            HoldCount::Counts
        } else if fence.is_some_and(|f| f >= expiry) {
            HoldCount::Expired
        } else {
            HoldCount::UntilFence { expiry }
        }
    }

    /// When the last of the other replicas' holds in `ledger` (of `queue`) that ran out
    /// on this clock did, if any did by `now`. `me`: this replica (its own hold is not
    /// timed here).
    pub fn expired_since(
        &self,
        queue: &QueueName,
        ledger: &Ledger,
        me: Option<&str>,
        now: T,
    ) -> Option<T> {
        ledger
            .holds()
            .iter()
            .filter(|(r, _)| me != Some(r.as_str()))
            .filter_map(|(r, h)| self.seen.get(&(queue.clone(), r.clone(), h.renewal)))
            .map(|first| first.plus(HOLD_TTL))
            .filter(|t| *t <= now)
            .max()
    }

    /// Forgets the renewals `held` says no ledger holds any more (superseded, or the
    /// hold dropped): a renewal still stored keeps its clock, so a dead replica's hold
    /// stays expired.
    pub fn retain_held(&mut self, mut held: impl FnMut(&QueueName, &str, u64) -> bool) {
        self.seen.retain(|(q, r, renewal), _| held(q, r, *renewal));
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Forgets every clock (a replica that restarts knows none).
    pub fn clear(&mut self) {
        self.seen.clear();
    }
}

/// True while a hold written (sent) at `sent` may still be admitted under at `now`.
pub fn hold_usable<T: Moment>(sent: T, now: T) -> bool {
    now.since(sent) < HOLD_USE
}

/// When each entry of each queue was first seen, in the caller's time `T` (a monotonic
/// `Instant` in `serve`, a step in the models).
///
/// An entry rewritten under the same id (a pod's CREATE charge replaced by its binding:
/// both carry the pod's uid) is a new charge and is timed again. Timed from the first
/// version, a binding admitted 30 s after its pod's CREATE was past its grace at once,
/// and a fence read before the bind landed dropped it while the bind was in flight.
#[derive(Debug, Clone)]
pub struct EntryClock<T> {
    seen: HashMap<(QueueName, EntryId), (u64, T)>,
}

impl<T> Default for EntryClock<T> {
    fn default() -> Self {
        Self {
            seen: HashMap::new(),
        }
    }
}

impl<T: Moment> EntryClock<T> {
    /// When the last of `ledger`'s entries (of `queue`) that ran out on this clock did,
    /// if any did by `now`: a binding shown unbound stops counting after its grace
    /// (behind a fence), any other entry after its TTL.
    pub fn expired_since(&self, queue: &QueueName, ledger: &Ledger, now: T) -> Option<T> {
        self.expired_within(queue, ledger, now, |_, e| lifetime(e))
    }

    /// [`EntryClock::expired_since`] with each entry's lifetime given by `limit` (a
    /// caller that knows more of an entry than the ledger says, from its cache).
    pub fn expired_within(
        &self,
        queue: &QueueName,
        ledger: &Ledger,
        now: T,
        limit: impl Fn(&EntryId, &Entry) -> Duration,
    ) -> Option<T> {
        ledger
            .iter()
            .filter_map(|(id, e)| self.get(queue, id, e).map(|first| first.plus(limit(id, e))))
            .filter(|t| *t <= now)
            .max()
    }
}

/// How long an entry counts unshown before it may stop counting behind a fence: a
/// binding shown unbound its grace, any other entry its TTL.
pub fn lifetime(e: &Entry) -> Duration {
    if e.node.is_some() {
        super::entries::UNBOUND_GRACE
    } else {
        super::entries::TTL
    }
}

impl<T: Copy> EntryClock<T> {
    /// When `entry` (as it is now) was first seen, starting its clock at `now` if it
    /// is new or changed.
    pub fn first_seen(&mut self, queue: &QueueName, id: &EntryId, entry: &Entry, now: T) -> T {
        let mark = entry.clock_mark();
        let seen = self
            .seen
            .entry((queue.clone(), id.clone()))
            .or_insert((mark, now));
        if seen.0 != mark {
            *seen = (mark, now);
        }
        seen.1
    }

    /// When `entry` as it is now was first seen, if its clock runs.
    pub fn get(&self, queue: &QueueName, id: &EntryId, entry: &Entry) -> Option<T> {
        self.seen
            .get(&(queue.clone(), id.clone()))
            .filter(|(mark, _)| *mark == entry.clock_mark())
            .map(|(_, t)| *t)
    }

    /// Keeps the clocks `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&QueueName, &EntryId) -> bool) {
        self.seen.retain(|(q, id), _| keep(q, id));
    }

    /// How many clocks run.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when no clock runs.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::ObjectKey;
    use crate::ledger::entries::EntryKey;

    fn entry(node: Option<&str>) -> Entry {
        Entry {
            of: EntryKey::Pod(ObjectKey::new("ml", "p")),
            group: None,
            resources: [(
                "nvidia.com/gpu".to_string(),
                crate::cards::Cards::from(1u64),
            )]
            .into_iter()
            .collect(),
            card: Some("A".into()),
            charged: node.map(|_| "A".to_string()),
            node: node.map(str::to_string),
            allocated: Default::default(),
            pinned: Default::default(),
            excluded: Default::default(),
            request: Vec::new(),
            phase: None,
            base: None,
            queue: None,
            retried: 0,
        }
    }

    fn hold(renewal: u64) -> Hold {
        Hold {
            cards: Default::default(),
            spare: Default::default(),
            renewal,
            released: 0,
        }
    }

    #[test]
    fn another_replicas_hold_counts_for_its_ttl_then_until_a_fence_read_after_it() {
        let q = QueueName::new("q1");
        let secs = Duration::from_secs;
        let mut clock = HoldClock::default();
        let h = hold(3);
        assert_eq!(clock.counts(&q, "r2", &h, secs(5), None), HoldCount::Counts);
        assert_eq!(
            clock.counts(&q, "r2", &h, secs(44), None),
            HoldCount::Counts
        );
        // Timed from its first sight (5 s), not from the last.
        let expiry = secs(45);
        assert_eq!(
            clock.counts(&q, "r2", &h, secs(45), Some(secs(44))),
            HoldCount::UntilFence { expiry },
            "a fence read before it ran out does not show what its holder admitted"
        );
        assert_eq!(
            clock.counts(&q, "r2", &h, secs(50), Some(expiry)),
            HoldCount::Expired
        );
        let mut l = Ledger::default();
        l.set_hold("r2", Some(h.clone()));
        l.set_hold("r1", Some(hold(1)));
        assert_eq!(clock.expired_since(&q, &l, Some("r1"), secs(44)), None);
        assert_eq!(
            clock.expired_since(&q, &l, Some("r1"), secs(50)),
            Some(expiry)
        );
        // A new renewal is timed again.
        assert_eq!(
            clock.counts(&q, "r2", &hold(4), secs(60), Some(secs(60))),
            HoldCount::Counts
        );
        clock.retain_held(|_, _, renewal| renewal == 4);
        assert_eq!(clock.expired_since(&q, &l, Some("r1"), secs(100)), None);
        assert!(hold_usable(secs(0), secs(9)) && !hold_usable(secs(0), secs(10)));
    }

    #[test]
    fn an_entry_rewritten_under_its_id_is_timed_from_the_rewrite() {
        let q = QueueName::new("q1");
        let id = EntryId::for_key(&EntryKey::Pod(ObjectKey::new("ml", "p")));
        let mut clock = EntryClock::default();
        let created = entry(None);
        assert_eq!(clock.first_seen(&q, &id, &created, 0u64), 0);
        assert_eq!(
            clock.first_seen(&q, &id, &created, 40),
            0,
            "unchanged: still timed from 0"
        );
        let bound = entry(Some("a1"));
        assert_eq!(
            clock.get(&q, &id, &bound),
            None,
            "the binding's clock has not started"
        );
        assert_eq!(clock.first_seen(&q, &id, &bound, 40), 40);
        assert_eq!(clock.first_seen(&q, &id, &bound, 75), 40);
        assert_eq!(clock.get(&q, &id, &bound), Some(40));
        clock.retain(|_, _| false);
        assert!(clock.is_empty());
    }
}
