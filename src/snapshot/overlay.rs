//! "Cache ∪ ledger": lays a queue's ledger entries over the snapshot for the length of
//! one decision (or one batch of decisions), then takes them off again. Entries the
//! cache already reflects are skipped, so nothing is counted twice.

use std::time::Duration;

use super::gone::Gone;
use super::Snapshot;
use crate::cards::hashing::Map;
use crate::cards::{ObjectKey, QueueName};
use crate::cluster::records::Version;
use crate::cluster::{PodGroupRecord, PodRecord};
use crate::ledger::clock::STORE_LAG;
use crate::ledger::entries::{
    group_of, pod_of, Entry, EntryId, EntryKey, Fate, Fence, Ledger, Stream, TTL, UNBOUND_GRACE,
};

/// True when a cached record is the incarnation the entry charges (by uid when both
/// know one).
fn same(v: &Version, id: &EntryId) -> bool {
    match &v.uid {
        Some(uid) => !id.is_uid() || uid == id.as_str(),
        None => true,
    }
}

fn cached_pod<'a>(snap: &'a Snapshot, id: &EntryId, k: &ObjectKey) -> Option<&'a PodRecord> {
    snap.pod(k).filter(|p| same(&p.version, id))
}

fn cached_group<'a>(snap: &'a Snapshot, id: &EntryId, k: &ObjectKey) -> Option<&'a PodGroupRecord> {
    snap.group(k).filter(|g| same(&g.version, id))
}

fn request_of(g: &PodGroupRecord) -> Vec<(String, crate::cards::Cards)> {
    g.live_request()
        .map(|r| r.0.iter().map(|(a, n)| (a.to_string(), *n)).collect())
        .unwrap_or_default()
}

/// The deletion of the object the entry charges, when a watch showed it (by uid: an
/// entry without one may charge a later incarnation of the name).
fn gone<'a>(snap: &'a Snapshot, id: &EntryId, e: &Entry) -> Option<&'a Gone> {
    if !id.is_uid() {
        return None;
    }
    let (stream, k) = match &e.of {
        EntryKey::Pod(k) => (Stream::Pods, k),
        EntryKey::Group(k) => (Stream::PodGroups, k),
    };
    snap.gone(stream, id.as_str(), k)
}

/// True when the snapshot already shows what the entry records, or shows its object
/// deleted (it holds nothing any more).
pub fn reflected(snap: &Snapshot, id: &EntryId, e: &Entry) -> bool {
    match &e.of {
        EntryKey::Pod(k) => pod_reflected(snap, snap.pod(k), k, id, e),
        EntryKey::Group(k) => match cached_group(snap, id, k) {
            Some(g) => request_of(g) == e.request || superseded(g, e),
            None => gone(snap, id, e).is_some(),
        },
    }
}

/// [`reflected`] for a pod entry, with `held` as the cache's record of its name.
fn pod_reflected(
    snap: &Snapshot,
    held: Option<&PodRecord>,
    k: &ObjectKey,
    id: &EntryId,
    e: &Entry,
) -> bool {
    match held.filter(|p| same(&p.version, id)) {
        Some(p) => shows_entry(p, e),
        None if gone(snap, id, e).is_some() => true,
        // Another incarnation under its name says nothing about the entry's pod: the
        // cache may not show that one's deletion yet (R3: only the entry's own object,
        // its deletion or its end ends a charge).
        None => {
            held.is_none()
                && snap.is_known_cardless_incarnation(k, id.is_uid().then(|| id.as_str()))
        }
    }
}

/// True when the cached pod (the entry's incarnation) shows what the entry records: its
/// node when the entry is a binding, and no wait gate (an entry is always a charge, and
/// a pod behind card-quota's gate holds none: its cache still shows the gate until the
/// release that the entry records reaches it; gates are never added back).
fn shows_entry(p: &PodRecord, e: &Entry) -> bool {
    (e.node.is_none() || p.node.is_some()) && !p.gated
}

/// True when the cache shows another stored incarnation under the entry's name, not
/// finished nor going.
pub fn name_taken(snap: &Snapshot, k: &ObjectKey, id: &EntryId) -> bool {
    snap.pod(k).is_some_and(|p| {
        !same(&p.version, id)
            && p.version.resource_version.is_some()
            && p.deletion.is_none()
            && !p.is_finished()
    })
}

/// True when the cache shows the PodGroup past the version the admitted write was made
/// against, without the reservation the entry records: that write was refused after
/// card-quota admitted it (a resourceVersion conflict, a later webhook), or undone since.
fn superseded(g: &PodGroupRecord, e: &Entry) -> bool {
    match (g.version.resource_version, e.base) {
        (Some(now), Some(base)) => now > base && request_of(g) != e.request,
        _ => false,
    }
}

/// What pruning may do with an entry, given this replica's snapshot and how long
/// this replica has known the entry (its own monotonic clock).
pub fn fate(
    snap: &Snapshot,
    id: &EntryId,
    e: &Entry,
    age: Duration,
    now: jiff::Timestamp,
    fence: Option<&Fence>,
) -> Fate {
    // An entry no cache shows is dropped on its clock only behind a fence read after
    // it expired: a cache that lags (a stalled watch) cannot make it vanish.
    let expired = || match fence {
        Some(f) if f.covers(age, TTL) => Fate::Fenced(f.mark),
        _ => Fate::Keep,
    };
    // Deleted: readers that reach its last version show it or its deletion, and count
    // it from their cache or not at all, never twice and never as a phantom.
    let deleted = |g: &Gone| match g.resource_version {
        Some(rv) => Fate::Reflected(
            match e.of {
                EntryKey::Pod(_) => Stream::Pods,
                EntryKey::Group(_) => Stream::PodGroups,
            },
            rv,
        ),
        None => Fate::Drop,
    };
    match &e.of {
        EntryKey::Pod(k) => match cached_pod(snap, id, k) {
            // A finished pod holds no cards, whether or not another cache shows it.
            Some(p) if !p.is_active(now) => Fate::Drop,
            Some(p) if shows_entry(p, e) => match p.version.resource_version {
                Some(rv) => Fate::Reflected(Stream::Pods, rv),
                None => expired(),
            },
            // Unbound, its claims shown allocated: it counts bound from there
            // (`PodRecord::claims_allocated_unbound`), in every cache that reaches that
            // version of the claims' stream.
            Some(p) if p.claims_allocated_unbound().is_some() => match snap.claims_version(p) {
                Some(rv) => Fate::Reflected(Stream::Claims, rv),
                None => expired(),
            },
            // Claims shown allocated beside card resources of another kind: caches count
            // it pending until it is bound, so its binding's charge is held to its TTL.
            Some(p) if p.node.is_none() && p.claims_allocated() => expired(),
            // Still unbound (or still gated, or its claims unallocated) long after its
            // binding (or release, or allocation) was admitted: the write failed after
            // us (another webhook refused it, or the pod was bound elsewhere). Only
            // behind a fence read after the grace: a cache that lags (a stalled watch)
            // shows the pod unbound too, and dropping the entry then forgot a bind that
            // succeeded (found by the live model: 2 cards bound under a quota of 1). The
            // fence covers the claims' stream: caches at it show an allocation made
            // before it (found by the committer model when it did not: an entry dropped
            // at the grace by a replica whose claim cache showed the allocation was lost
            // to one whose claim watch never did, and a binding went past a cut).
            Some(_) => match fence {
                Some(f) if f.covers(age, UNBOUND_GRACE) => Fate::Fenced(f.mark),
                _ => Fate::Keep,
            },
            None => match gone(snap, id, e) {
                Some(g) => deleted(g),
                // Another incarnation alive under the name in a cache that reached a
                // fence read a store's lag after this entry was first seen: had the
                // entry's pod been stored, that one's deletion would be before the
                // fence. So its CREATE was refused (409, a client's retry) and it drops
                // there rather than at its TTL.
                None if name_taken(snap, k, id) => match fence {
                    Some(f) if f.covers(age, STORE_LAG) => Fate::Fenced(f.mark),
                    _ => expired(),
                },
                None => expired(),
            },
        },
        EntryKey::Group(k) => match cached_group(snap, id, k) {
            // A Completed PodGroup reserves nothing any more.
            Some(g) if g.phase.as_deref() == Some("Completed") => Fate::Drop,
            Some(g) if request_of(g) == e.request => match g.version.resource_version {
                Some(rv) => Fate::Reflected(Stream::PodGroups, rv),
                None => expired(),
            },
            Some(g) if superseded(g, e) => Fate::Drop,
            Some(_) => expired(),
            None => gone(snap, id, e).map_or_else(expired, deleted),
        },
    }
}

enum Undo {
    Pod(ObjectKey, Option<Box<PodRecord>>),
    Group(ObjectKey, Option<Box<PodGroupRecord>>),
}

/// Entries laid over a snapshot for the length of [`Overlay::scoped`], which restores
/// the snapshot exactly, also when a decision panics.
#[derive(Default)]
pub struct Overlay {
    undo: Vec<Undo>,
    /// Pod names laid, with the index of their undo (the cache's record).
    laid: Map<ObjectKey, usize>,
}

impl Overlay {
    /// Runs `f` over `snap` with an overlay, empty at first, that `f` lays entries into;
    /// whatever was laid is taken off again when `f` returns *or panics*. The one way
    /// decisions lay ledgers over the caches: a decision that panics (a request's task
    /// fails alone; the snapshot's lock, poisoned, is taken on by the next request)
    /// leaves no phantom charge behind.
    pub fn scoped<T>(snap: &mut Snapshot, f: impl FnOnce(&mut Snapshot, &mut Overlay) -> T) -> T {
        let mut o = Overlay::default();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(snap, &mut o)));
        o.remove(snap);
        r.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// How many entries changed the snapshot.
    pub fn applied(&self) -> usize {
        self.undo.len()
    }

    /// Lays every entry of `queue`'s ledger over `snap` (see [`apply`]).
    pub fn lay(&mut self, snap: &mut Snapshot, queue: &QueueName, ledger: &Ledger) {
        for (id, e) in ledger.iter() {
            self.add(snap, queue, id, e);
        }
        for f in foreign(snap, queue) {
            for (id, e) in f.ledger.iter() {
                self.add(snap, &f.queue, id, e);
            }
        }
    }

    /// Puts back what the overlay replaced.
    fn remove(self, snap: &mut Snapshot) {
        for u in self.undo.into_iter().rev() {
            match u {
                Undo::Pod(_, Some(p)) => snap.upsert_pod(*p),
                Undo::Pod(k, None) => snap.remove_pod(&k),
                Undo::Group(_, Some(g)) => snap.upsert_group(*g),
                Undo::Group(k, None) => snap.remove_group(&k),
            }
        }
    }

    /// Lays one entry over `snap` unless the snapshot already reflects it.
    pub fn add(&mut self, snap: &mut Snapshot, ledger: &QueueName, id: &EntryId, e: &Entry) {
        if let EntryKey::Pod(k) = &e.of {
            if let Some(&i) = self.laid.get(k) {
                return self.add_beside(snap, ledger, id, e, k, i);
            }
        }
        if reflected(snap, id, e) {
            return;
        }
        let charged;
        let queue = match e.queue.as_deref() {
            Some(q) => {
                charged = QueueName::new(q);
                &charged
            }
            None => ledger,
        };
        match &e.of {
            EntryKey::Pod(k) => {
                let prev = snap.pod(k).cloned();
                // Another incarnation the cache shows, not finished: it counts on its
                // own (it may still exist, or still hold its cards while it terminates),
                // and this entry beside it.
                if prev
                    .as_ref()
                    .is_some_and(|p| !same(&p.version, id) && !p.is_finished())
                {
                    return self.put_beside(snap, queue, id, e, k);
                }
                let seq = prev
                    .as_ref()
                    .map(|p| p.seq)
                    .unwrap_or_else(|| snap.next_seq());
                let Some(mut rec) = pod_of(id, queue, e, seq) else {
                    return;
                };
                if let Some(p) = prev.as_ref().filter(|p| same(&p.version, id)) {
                    // The cache's own view of the pod wins except for the binding. (A
                    // cached pod of another uid that is finished holds no cards: the
                    // charged incarnation takes its name.)
                    let mut bound = p.clone();
                    if p.gated {
                        // A release the cache does not show yet: it counts as released,
                        // on the pin the release wrote.
                        bound.gated = false;
                        bound.pinned = std::mem::take(&mut rec.pinned);
                        bound.excluded = std::mem::take(&mut rec.excluded);
                        if rec.card_name.is_some() {
                            bound.card_name = rec.card_name.take();
                        }
                    }
                    bound.node = rec.node.take();
                    bound.bind_unseen = rec.bind_unseen;
                    bound.charged = rec.charged.take();
                    // An allocation of several models the cache does not show yet: its
                    // cards as admitted, not read again from claims the cache shows
                    // unallocated (a record without claims keeps those it carries).
                    if rec.claimed.is_some() {
                        bound.claimed = rec.claimed.take();
                        bound.demand = std::mem::replace(&mut rec.demand, Ok(Default::default()));
                        bound.claims.clear();
                    }
                    rec = bound;
                }
                snap.upsert_pod(rec);
                self.laid.insert(k.clone(), self.undo.len());
                self.undo.push(Undo::Pod(k.clone(), prev.map(Box::new)));
            }
            EntryKey::Group(k) => {
                let prev = snap.group(k).cloned();
                let seq = prev
                    .as_ref()
                    .map(|g| g.seq)
                    .unwrap_or_else(|| snap.next_seq());
                match group_of(id, queue, e, seq) {
                    Some(Ok(mut g)) => {
                        if let Some(p) = prev.as_ref().filter(|p| same(&p.version, id)) {
                            g.phase = p.phase.clone();
                        }
                        snap.upsert_group(g);
                        self.undo.push(Undo::Group(k.clone(), prev.map(Box::new)));
                    }
                    Some(Err(err)) => tracing::warn!(
                        "ledger entry {} skipped: {}",
                        id.as_str().escape_debug(),
                        err.to_string().escape_debug()
                    ),
                    None => {}
                }
            }
        }
    }
}

impl Overlay {
    /// A second entry for a pod name this overlay laid already: two charges of one name
    /// that the cache does not show (a CREATE retried under a new uid, answered 409 or
    /// not, beside the first). Whether it is reflected is judged against the cache's
    /// record, not the one laid; if not, it is laid beside the first under a name no pod
    /// can have, so both count: at most one lands, and this replica cannot know which.
    fn add_beside(
        &mut self,
        snap: &mut Snapshot,
        ledger: &QueueName,
        id: &EntryId,
        e: &Entry,
        k: &ObjectKey,
        laid: usize,
    ) {
        let held = match &self.undo[laid] {
            Undo::Pod(_, held) => held.as_deref(),
            Undo::Group(..) => None,
        };
        if pod_reflected(snap, held, k, id, e) {
            return;
        }
        let queue = e
            .queue
            .as_deref()
            .map_or_else(|| ledger.clone(), QueueName::new);
        self.put_beside(snap, &queue, id, e, k);
    }

    /// Lays the entry's pod under a name of its own beside the pod its name shows.
    fn put_beside(
        &mut self,
        snap: &mut Snapshot,
        queue: &QueueName,
        id: &EntryId,
        e: &Entry,
        k: &ObjectKey,
    ) {
        let Some(mut rec) = pod_of(id, queue, e, snap.next_seq()) else {
            return;
        };
        // Slashes are not allowed in a pod's name.
        rec.key = ObjectKey::new(k.namespace.clone(), format!("{}/{}", k.name, id));
        if snap.pod(&rec.key).is_some() {
            return;
        }
        let beside = rec.key.clone();
        snap.upsert_pod(rec);
        self.undo.push(Undo::Pod(beside, None));
    }
}

/// Runs `f` with every entry of `queue`'s ledger (and of the other ledgers holding
/// charges of its tree, [`foreign`]) laid over `snap`, taken off again afterwards
/// ([`Overlay::scoped`]).
pub fn with_ledger<T>(
    snap: &mut Snapshot,
    queue: &QueueName,
    ledger: &Ledger,
    f: impl FnOnce(&mut Snapshot, &Overlay) -> T,
) -> T {
    Overlay::scoped(snap, |snap, o| {
        o.lay(snap, queue, ledger);
        f(snap, o)
    })
}

/// The other queues' ledgers that hold charges of `ledger`'s tree: a change of the tree
/// (a root given a card budget, a queue moved under another card parent, a budget
/// taken away) leaves charges in flight in the ledger their queue used to charge, and
/// they count until caches show them. A ledger whose own queue now charges `ledger`
/// brings its holds too. (Laying a charge of a queue outside the tree changes no
/// decision of it: only the cost of looking.)
pub fn foreign(
    snap: &Snapshot,
    ledger: &QueueName,
) -> Vec<std::sync::Arc<crate::ledger::LedgerRecord>> {
    // In a flat cluster every queue is its own ledger's: only charges recorded for
    // another queue can belong elsewhere (O(those ledgers), not O(queues)).
    let candidates: Box<dyn Iterator<Item = &std::sync::Arc<crate::ledger::LedgerRecord>>> =
        if snap.is_flat() {
            Box::new(snap.ledgers_naming_others())
        } else {
            Box::new(snap.ledgers())
        };
    candidates
        .filter(|f| f.queue != *ledger && !(f.ledger.is_empty() && f.ledger.holds().is_empty()))
        .filter(|f| {
            // Entries without a queue charge the ledger's own: one walk covers them.
            snap.ledger_key(&f.queue) == *ledger
                || f.ledger.iter().any(|(_, e)| {
                    e.queue
                        .as_deref()
                        .is_some_and(|q| snap.ledger_key(&QueueName::new(q)) == *ledger)
                })
        })
        .cloned()
        .collect()
}

/// The watermark caches must reach before deciding from `ledger`'s charges: its own,
/// raised by those of the [`foreign`] ledgers laid with it. Once the queues have formed
/// a tree, by every ledger's: a ledger that held a queue's charges before a change of
/// the tree and was pruned empty since names no queue any more, yet its watermark says
/// how far caches must come to show what it held (found by the live model: an empty
/// ledger left out, a replica decided from a cache without the pods pruned from it).
pub fn watermark(snap: &Snapshot, ledger: &QueueName) -> crate::ledger::entries::Watermark {
    let mut mark = snap.ledger(ledger).ledger.watermark();
    let mut raise = |w: crate::ledger::entries::Watermark| {
        mark.pods = mark.pods.max(w.pods);
        mark.podgroups = mark.podgroups.max(w.podgroups);
    };
    if snap.tree_seen() {
        for l in snap.ledgers() {
            raise(l.ledger.watermark());
        }
    } else {
        for f in foreign(snap, ledger) {
            raise(f.ledger.watermark());
        }
        // A ledger that charges moved from (its inbound marks) may have been pruned of
        // them since, into caches at its watermark: a replica that never saw the tree
        // the charges were made under (found by the live model: a root budget given
        // and taken away while its Queue watch lagged) must reach that watermark too.
        for from in snap.ledger(ledger).ledger.inbound().values() {
            raise(
                snap.ledger(&QueueName::new(from.from.clone()))
                    .ledger
                    .watermark(),
            );
        }
    }
    mark
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entries::{Effect, Watermark};
    use crate::snapshot::load::load;

    const SNAP: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {nvidia.com/gpu.product: RTX-4090}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Pod
metadata: {name: seen, namespace: ml, uid: u-seen, resourceVersion: "70", annotations: {volcano.sh/card.queue: q, volcano.sh/card.name: RTX-4090}}
spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: done, namespace: ml, uid: u-done, resourceVersion: "71", annotations: {volcano.sh/card.queue: q, volcano.sh/card.name: RTX-4090}}
spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
status: {phase: Succeeded}
"#;

    fn entry(snap: &Snapshot, name: &str, uid: &str, node: Option<&str>) -> (EntryId, Entry) {
        let key = ObjectKey::new("ml", name);
        let mut p = snap.pod(&key).cloned().unwrap_or_else(|| {
            let mut p = snap.pod(&ObjectKey::new("ml", "seen")).unwrap().clone();
            p.key = key.clone();
            p
        });
        p.version.uid = Some(uid.to_string());
        p.node = node.map(str::to_string);
        let effect = Effect::Pod(Box::new(p));
        (effect.id(), effect.entry())
    }

    #[test]
    fn a_release_counts_until_the_cache_shows_the_pod_without_its_gate() {
        let (mut snap, _) = load(SNAP).unwrap();
        let now = jiff::Timestamp::now();
        let key = ObjectKey::new("ml", "seen");
        // The release of "seen" was admitted and recorded; this cache still shows it
        // behind card-quota's gate (holding nothing).
        let (id, e) = entry(&snap, "seen", "u-seen", None);
        let mut waiting = snap.pod(&key).unwrap().clone();
        waiting.gated = true;
        snap.upsert_pod(waiting);
        assert!(!reflected(&snap, &id, &e));
        let young = Duration::from_secs(1);
        assert_eq!(fate(&snap, &id, &e, young, now, None), Fate::Keep);
        let q = QueueName::new("q");
        let counted = |s: &mut Snapshot| {
            let mut ledger = Ledger::default();
            ledger.insert(id.clone(), e.clone());
            Overlay::scoped(s, |s, o| {
                o.lay(s, &q, &ledger);
                s.usage(&q, now)
                    .pending
                    .values()
                    .map(|n| n.get())
                    .sum::<u128>()
            })
        };
        assert_eq!(
            counted(&mut snap),
            1,
            "the release counts over the gated cache"
        );
        // Released in this cache too: reflected, counted once.
        let mut released = snap.pod(&key).unwrap().clone();
        released.gated = false;
        released.version.resource_version = Some(80);
        snap.upsert_pod(released);
        assert!(reflected(&snap, &id, &e));
        assert_eq!(
            fate(&snap, &id, &e, young, now, None),
            Fate::Reflected(Stream::Pods, 80)
        );
        assert_eq!(counted(&mut snap), 1);
    }

    #[test]
    fn fates_follow_what_this_cache_shows_and_how_long_the_entry_is_known() {
        let (snap, _) = load(SNAP).unwrap();
        let now = jiff::Timestamp::now();
        let young = Duration::from_secs(1);
        let (id, e) = entry(&snap, "seen", "u-seen", None);
        assert_eq!(
            fate(&snap, &id, &e, young, now, None),
            Fate::Reflected(Stream::Pods, 70)
        );
        // The same name under another uid while the cache shows "seen": a CREATE the API
        // server refused (409) after admission, or a pod created again after a deletion
        // this cache does not show yet. It counts (beside "seen") until its clock runs
        // out behind a fence.
        let (id, e) = entry(&snap, "seen", "u-new", None);
        assert!(!reflected(&snap, &id, &e));
        assert_eq!(fate(&snap, &id, &e, young, now, None), Fate::Keep);
        // Expired, it still counts until a fence read after its expiry.
        assert_eq!(fate(&snap, &id, &e, TTL + young, now, None), Fate::Keep);
        let mark = Watermark {
            pods: 90,
            podgroups: 5,
            claims: 0,
        };
        // Behind a fence read a store's lag after it was first seen, with "seen" still
        // there, it was a CREATE the API server refused: dropped before its TTL.
        let after_lag = Fence {
            mark,
            taken_ago: Duration::ZERO,
        };
        assert_eq!(
            fate(&snap, &id, &e, STORE_LAG + young, now, Some(&after_lag)),
            Fate::Fenced(mark)
        );
        let within_lag = Fence {
            mark,
            taken_ago: young * 2,
        };
        assert_eq!(
            fate(&snap, &id, &e, STORE_LAG + young, now, Some(&within_lag)),
            Fate::Keep
        );
        // An entry whose pod no cache shows expires at its TTL, behind a fence read
        // after that.
        let (id_new, e_new) = (id, e);
        let (id, e) = entry(&snap, "unseen", "u-unseen", None);
        assert_eq!(
            fate(&snap, &id, &e, STORE_LAG + young, now, Some(&after_lag)),
            Fate::Keep
        );
        let early = Fence {
            mark,
            taken_ago: young * 2,
        };
        assert_eq!(
            fate(&snap, &id, &e, TTL + young, now, Some(&early)),
            Fate::Keep
        );
        let late = Fence {
            mark,
            taken_ago: Duration::ZERO,
        };
        assert_eq!(
            fate(&snap, &id, &e, TTL + young, now, Some(&late)),
            Fate::Fenced(mark)
        );
        // Once "seen" is terminating, the name may be taken again: the entry counts.
        let mut going = snap.clone();
        let mut p = going.pod(&ObjectKey::new("ml", "seen")).unwrap().clone();
        p.deletion = Some(now + Duration::from_secs(30));
        going.upsert_pod(p);
        assert!(!reflected(&going, &id_new, &e_new));
        assert_eq!(
            fate(
                &going,
                &id_new,
                &e_new,
                STORE_LAG + young,
                now,
                Some(&after_lag)
            ),
            Fate::Keep
        );
        // A binding the cache does not show yet waits; past its grace it is a phantom
        // only behind a fence read after the grace (the cache may just lag).
        let (id, e) = entry(&snap, "seen", "u-seen", Some("n1"));
        assert_eq!(fate(&snap, &id, &e, young, now, None), Fate::Keep);
        assert_eq!(
            fate(&snap, &id, &e, UNBOUND_GRACE + young, now, None),
            Fate::Keep
        );
        assert_eq!(
            fate(&snap, &id, &e, UNBOUND_GRACE + young, now, Some(&early)),
            Fate::Keep
        );
        assert_eq!(
            fate(&snap, &id, &e, UNBOUND_GRACE + young, now, Some(&late)),
            Fate::Fenced(mark)
        );
        // A finished pod holds nothing.
        let (id, e) = entry(&snap, "done", "u-done", None);
        assert_eq!(fate(&snap, &id, &e, young, now, None), Fate::Drop);
    }

    #[test]
    fn a_charge_whose_pod_the_watch_showed_deleted_is_no_phantom() {
        let (mut snap, _) = load(SNAP).unwrap();
        let now = jiff::Timestamp::now();
        let young = Duration::from_secs(1);
        let (id, e) = entry(&snap, "seen", "u-seen", Some("n1"));
        let (other_id, other) = entry(&snap, "seen", "u-other", Some("n1"));
        let key = ObjectKey::new("ml", "seen");
        // Removed by an overlay's undo, the pod is not gone: its charge still counts.
        let mut undone = snap.clone();
        undone.remove_pod(&key);
        assert!(!reflected(&undone, &id, &e));
        assert_eq!(fate(&undone, &id, &e, young, now, None), Fate::Keep);
        // Deleted (the bound pod's charge recorded, the pod gone before a prune saw
        // it): nothing to lay over, and the entry goes once readers reach its version.
        snap.delete_pod(&key);
        assert!(reflected(&snap, &id, &e));
        assert_eq!(
            fate(&snap, &id, &e, young, now, None),
            Fate::Reflected(Stream::Pods, 70)
        );
        Overlay::scoped(&mut snap, |snap, overlay| {
            overlay.add(snap, &QueueName::new("q"), &id, &e);
            assert_eq!(overlay.applied(), 0);
        });
        // Another incarnation's charge under the same name still counts.
        assert!(!reflected(&snap, &other_id, &other));
    }

    #[test]
    fn an_entry_for_a_recreated_pod_replaces_the_old_incarnation_while_laid_over() {
        let (mut snap, _) = load(SNAP).unwrap();
        let before = snap.clone();
        let mut ledger = Ledger::default();
        let mut p = snap.pod(&ObjectKey::new("ml", "done")).unwrap().clone();
        p.version.uid = Some("u-again".into());
        p.phase = None;
        ledger.record(&Effect::Pod(Box::new(p)));
        with_ledger(&mut snap, &QueueName::new("q"), &ledger, |snap, layer| {
            assert_eq!(layer.applied(), 1);
            let shown = snap.pod(&ObjectKey::new("ml", "done")).unwrap();
            assert_eq!(shown.version.uid.as_deref(), Some("u-again"));
            assert!(shown.is_active(jiff::Timestamp::now()));
        });
        assert_eq!(
            snap.pod(&ObjectKey::new("ml", "done")),
            before.pod(&ObjectKey::new("ml", "done"))
        );
    }

    /// Found by tests/committer_model.rs: another incarnation under an entry's name
    /// never hides it. Two CREATEs admitted under one name (a pod created again with
    /// another model while the first is in flight): the second counts beside the
    /// first, also when it is laid by an overlay of its own over the first (a hold's
    /// `added`). And an entry beside a pod a stale cache still shows under its name (a
    /// pod deleted and created again, the deletion not seen yet) counts beside it.
    #[test]
    fn another_incarnation_under_its_name_hides_no_entry() {
        let (mut snap, _) = load(SNAP).unwrap();
        let now = jiff::Timestamp::now();
        let q = QueueName::new("q");
        let (first_id, first) = entry(&snap, "twice", "u-first", None);
        let (second_id, second) = entry(&snap, "twice", "u-second", None);
        let rtx =
            crate::cards::Alternatives::single(crate::cards::CardName::parse("RTX-4090").unwrap());
        let used = |snap: &Snapshot| snap.usage(&q, now).competing(&rtx).in_use().get();
        let base = used(&snap);
        Overlay::scoped(&mut snap, |snap, outer| {
            outer.add(snap, &q, &first_id, &first);
            assert_eq!(used(snap), base + 1);
            assert!(!reflected(snap, &second_id, &second));
            Overlay::scoped(snap, |snap, inner| {
                inner.add(snap, &q, &second_id, &second);
                assert!(used(snap) > base, "the second CREATE counts nothing");
            });
        });
        let (other_id, other) = entry(&snap, "seen", "u-other", None);
        assert!(!reflected(&snap, &other_id, &other));
        let seen = snap.pod(&ObjectKey::new("ml", "seen")).cloned();
        Overlay::scoped(&mut snap, |snap, o| {
            o.add(snap, &q, &other_id, &other);
            assert_eq!(used(snap), base + 1, "both incarnations count");
            assert_eq!(snap.pod(&ObjectKey::new("ml", "seen")).cloned(), seen);
        });
        assert_eq!(used(&snap), base);
        // A terminating "seen" still holds its card until it is gone: the entry beside.
        let mut going = seen.clone().unwrap();
        going.deletion = Some(now + std::time::Duration::from_secs(30));
        snap.upsert_pod(going);
        let base = used(&snap);
        Overlay::scoped(&mut snap, |snap, o| {
            o.add(snap, &q, &other_id, &other);
            assert_eq!(
                used(snap),
                base + 1,
                "the terminating pod and the entry count"
            );
        });
    }

    /// Issue 57: a decision that panics with a ledger laid over the snapshot leaves the
    /// snapshot as it found it (the overlay is taken off on unwind), not with phantom
    /// charges that count for good.
    #[test]
    fn a_decision_that_panics_leaves_the_snapshot_as_it_found_it() {
        let (mut snap, _) = load(SNAP).unwrap();
        let now = jiff::Timestamp::now();
        let q = QueueName::new("q");
        let before = (
            format!("{:?}", snap.usage(&q, now)),
            snap.pod(&ObjectKey::new("ml", "done")).cloned(),
        );
        let mut ledger = Ledger::default();
        let mut p = snap.pod(&ObjectKey::new("ml", "done")).unwrap().clone();
        p.version.uid = Some("u-again".into());
        p.phase = None;
        ledger.record(&Effect::Pod(Box::new(p)));
        let mut fresh = snap.pod(&ObjectKey::new("ml", "seen")).unwrap().clone();
        fresh.key = ObjectKey::new("ml", "fresh");
        fresh.version.uid = Some("u-fresh".into());
        ledger.record(&Effect::Pod(Box::new(fresh)));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_ledger(&mut snap, &q, &ledger, |snap, layer| {
                assert_eq!(layer.applied(), 2);
                assert_ne!(format!("{:?}", snap.usage(&q, now)), before.0);
                panic!("a bug inside a decision");
            })
        }));
        assert!(r.is_err());
        let after = (
            format!("{:?}", snap.usage(&q, now)),
            snap.pod(&ObjectKey::new("ml", "done")).cloned(),
        );
        assert_eq!(after, before);
        assert!(snap.pod(&ObjectKey::new("ml", "fresh")).is_none());
    }
}
