//! Seals (R2 for Queues): a Queue write that changes what a replica must know before it
//! charges a queue is sealed into the ledgers before it is stored.
//! - A change of the queue tree sends some queues' charges to another ledger: the Queue
//!   hook seals each such queue in the ledger it leaves, so a replica whose Queue watch
//!   has not shown the change yet, and would go on charging the old ledger while others
//!   charge the new one, finds the seal in the old ledger's compare-and-swap.
//! - A change that lowers a limit (a quota or borrow cut on any model, a change of
//!   enforcement) seals the queue and every queue below it in their own ledger, so a
//!   replica whose Queue watch lags cannot admit against the limit the change replaced.
//!
//! A sealed queue's charges are answered "try again" until the replica's cache (or its
//! own quorum read of the Queue) shows the change, or a read made [`SEAL_LIFT_AFTER`]
//! after this replica first saw the seal shows that the change never landed
//! (docs/consistency.md). Every clock a seal is lifted by is the reader's own.

use std::collections::BTreeMap;

use crate::cards::{Cards, QueueName};
use crate::cluster::records::queue_record;
use crate::cluster::QueueRecord;
use crate::ledger::seal::{Inbound, Seal, SealCause, SEAL_LIFT_AFTER};
use crate::ledger::Ledger;
use crate::snapshot::Snapshot;

use super::messages::RETRY;
use super::review::{AdmissionRequest, Object, Operation};
use super::Decision;

/// How often a replica held back by a seal reads the sealing Queue from the API server
/// (its own clock): the read brings a lagging Queue cache up to the change.
pub const SEAL_READ_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// The queues whose charges `req` (a Queue write, admitted) seals, by the ledger they
/// are sealed in, with the seal each gets there. Empty for anything else, and for a
/// Queue whose stored version has no resourceVersion (an offline review: nothing lags).
pub fn seals_for(
    snap: &Snapshot,
    req: &AdmissionRequest,
    now: jiff::Timestamp,
) -> BTreeMap<QueueName, Vec<(QueueName, Seal)>> {
    let mut out: BTreeMap<QueueName, Vec<(QueueName, Seal)>> = BTreeMap::new();
    let Some(change) = change_of(snap, req) else {
        return out;
    };
    let seal = |cause| Seal {
        by: change.name.to_string(),
        version: change.version,
        at: now,
        cause,
    };
    // (ledger, queue) pairs sealed: a ledger keeps one seal per queue.
    let mut sealed = std::collections::BTreeSet::new();
    let mut into = std::collections::BTreeSet::new();
    for (q, from, to) in moves(snap, change.old.as_ref(), change.new.as_ref(), &change.name) {
        sealed.insert((from.clone(), q.clone()));
        out.entry(from)
            .or_default()
            .push((q, seal(SealCause::Move)));
        into.insert(to);
    }
    // The tree a queue moves into gets its cards under every level above its new place:
    // for whoever charges that tree, its limits went down. Its root is sealed in its
    // ledger (every charge there is below it) until the move is seen, and a second move
    // into the tree finds that seal in its way and waits: two moves are never checked
    // each without the other.
    for to in into {
        if sealed.insert((to.clone(), to.clone())) {
            out.entry(to.clone())
                .or_default()
                .push((to, seal(SealCause::Limits)));
        }
    }
    if lowers_limits(change.old.as_ref(), change.new.as_ref()) {
        for q in snap.subtree(&change.name) {
            let ledger = snap.ledger_key(&q);
            if sealed.insert((ledger.clone(), q.clone())) {
                out.entry(ledger)
                    .or_default()
                    .push((q, seal(SealCause::Limits)));
            }
        }
    }
    out
}

/// The other half of [`seals_for`]: by the ledger they move to, each moved queue and
/// the ledger it leaves (whose version after its seal the [`Inbound`] mark carries).
pub fn inbound_for(
    snap: &Snapshot,
    req: &AdmissionRequest,
) -> BTreeMap<QueueName, Vec<(QueueName, QueueName)>> {
    let mut out: BTreeMap<QueueName, Vec<(QueueName, QueueName)>> = BTreeMap::new();
    let Some(c) = change_of(snap, req) else {
        return out;
    };
    for (q, from, to) in moves(snap, c.old.as_ref(), c.new.as_ref(), &c.name) {
        out.entry(to).or_default().push((q, from));
    }
    out
}

/// A Queue write as seals see it: the Queue, its version before the write (0 when
/// created), and its record before and after.
struct Change {
    name: QueueName,
    version: u64,
    old: Option<QueueRecord>,
    new: Option<QueueRecord>,
}

fn change_of(snap: &Snapshot, req: &AdmissionRequest) -> Option<Change> {
    let record = |v: Option<&Object>| v.map(Object::tree).and_then(|o| queue_record(o).ok());
    let old = record(req.old_object.as_ref());
    let new = match req.operation {
        Operation::Delete => None,
        _ => record(req.object.as_ref()),
    };
    let name = new.as_ref().or(old.as_ref()).map(|r| r.name.clone())?;
    let old = old.or_else(|| snap.queue(&name).cloned());
    // A Queue created (root given a budget where it did not exist): any version of it
    // shows the change, and a read that finds none shows it never landed.
    let version = match &old {
        None => 0,
        Some(r) => r.resource_version.as_deref()?.parse::<u64>().ok()?,
    };
    Some(Change {
        name,
        version,
        old,
        new,
    })
}

/// True when going from `old` to `new` lowers a limit the queue's charges are decided
/// against: a model's quota or borrow goes down (a malformed annotation is 0 for every
/// model), a group cap goes down, comes or goes, the queue goes, or its enforcement changes (warn to deny, or the install's
/// default to either). A raise needs no seal: a replica that has not seen it yet refuses
/// what it would admit, never the reverse.
pub fn lowers_limits(old: Option<&QueueRecord>, new: Option<&QueueRecord>) -> bool {
    let Some(old) = old else { return false };
    let Some(new) = new else { return true };
    // Group caps: a cap added, removed (its models may lose their only limit and so
    // their quota) or lowered counts as lowering.
    let lower = |a: &crate::cards::Quota, b: &crate::cards::Quota| {
        a.entries()
            .iter()
            .any(|(m, n)| *n > Cards::ZERO && b.get(m) < *n)
            || a.caps().len() != b.caps().len()
            || a.caps().iter().any(|(p, n)| {
                b.caps()
                    .iter()
                    .find(|(q, _)| q == p)
                    .is_none_or(|(_, m)| m < n)
            })
    };
    let borrow = |r: &QueueRecord| match &r.borrow {
        Some(Ok(b)) => b.clone(),
        _ => crate::cards::Quota::default(),
    };
    lower(&old.effective_quota(), &new.effective_quota())
        || lower(&borrow(old), &borrow(new))
        || old.enforcement != new.enforcement
}

/// True when going from `old` to `new` may move a queue's charges to another ledger:
/// the parent, or whether the queue carries `card.quota`, changes.
fn shapes_tree(old: Option<&QueueRecord>, new: Option<&QueueRecord>) -> bool {
    let parent = |r: Option<&QueueRecord>| r.and_then(|r| r.parent.clone());
    let level = |r: Option<&QueueRecord>| r.is_some_and(|r| r.quota.is_some());
    parent(old) != parent(new) || level(old) != level(new) || old.is_none() != new.is_none()
}

/// Every queue whose ledger differs once `name` goes from `old` to `new`: (queue, the
/// ledger it had, the one it gets). O(queues × depth), on the Queue writes that shape
/// the tree only.
fn moves(
    snap: &Snapshot,
    old: Option<&QueueRecord>,
    new: Option<&QueueRecord>,
    name: &QueueName,
) -> Vec<(QueueName, QueueName, QueueName)> {
    if !shapes_tree(old, new) {
        return Vec::new();
    }
    let mut before = Snapshot::default();
    for q in snap.queues().filter(|q| q.name != *name) {
        before.upsert_queue(q.clone());
    }
    if let Some(o) = old {
        before.upsert_queue(o.clone());
    }
    let mut after = before.clone();
    match new {
        Some(n) => after.upsert_queue(n.clone()),
        None => after.remove_queue(name),
    }
    let mut out = Vec::new();
    for q in before.queues() {
        let (from, to) = (before.ledger_key(&q.name), after.ledger_key(&q.name));
        if from != to {
            out.push((q.name.clone(), from, to));
        }
    }
    out
}

/// True when `ledger` says `queue`'s charges came from a ledger this snapshot has not
/// read as far as the move: charged here, the queue could miss what is still in flight
/// there (charged under a tree this replica never saw). "Try again" until it is read.
pub fn unread_source(snap: &Snapshot, ledger: &Ledger, queue: &QueueName) -> Option<Decision> {
    let inbound = ledger.inbound().get(queue.as_str())?;
    let from = &inbound.from;
    let why = if behind_source(snap, inbound) {
        "card-quota is reading it"
    } else if !source_reached(snap, inbound) {
        "card-quota's caches have not caught up with it"
    } else {
        return None;
    };
    Some(Decision::deny(
        RETRY,
        format!(
            "queue {queue}'s charges moved here from the ledger of {from} and {why}; try again"
        ),
    ))
}

/// True when the caches have reached the watermark of the ledger `inbound` names: the
/// charges pruned from it (the moved queue's among them) are in the caches.
fn source_reached(snap: &Snapshot, inbound: &Inbound) -> bool {
    let from = QueueName::new(inbound.from.clone());
    snap.ledger(&from)
        .ledger
        .watermark()
        .reached_by(&snap.progress())
}

fn behind_source(snap: &Snapshot, inbound: &Inbound) -> bool {
    let from = QueueName::new(inbound.from.clone());
    let read = snap
        .ledger(&from)
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok());
    read.is_none_or(|v| v < inbound.version)
}

/// The ledgers to read before charging `ledger`: sources of its inbound marks this
/// snapshot has not read as far as the move.
pub fn sources_to_read(snap: &Snapshot, ledger: &Ledger) -> Vec<QueueName> {
    let mut out: Vec<QueueName> = ledger
        .inbound()
        .values()
        .filter(|i| behind_source(snap, i))
        .map(|i| QueueName::new(i.from.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// True when a seal in `ledger` stops a charge of `queue` there: the seal's Queue is
/// not shown past the version it was sealed at, and no read of the API server made
/// [`SEAL_LIFT_AFTER`] after this replica first saw the seal shows that the change
/// never landed.
pub fn blocks(snap: &Snapshot, ledger: &Ledger, queue: &QueueName) -> Option<Decision> {
    // The queue's own seal, or one of a queue above it as this replica's tree has it: a
    // charge is checked against every level's limits, and the sealer may not have seen
    // this queue under the level it sealed (found by the committer model: a parent's cap
    // cut by a replica that did not show a queue moved under it sealed the parent only,
    // and a charge of that queue went past the cut).
    let seal = std::iter::once(queue.clone())
        .chain(snap.ancestors_of(queue))
        .filter_map(|q| ledger.seals().get(q.as_str()))
        .find(|s| holds_back(snap, s))?;
    let by = &seal.by;
    Some(Decision::deny(
        RETRY,
        match seal.cause {
            SealCause::Move => format!(
                "queue {queue}'s charges are moving to another ledger (queue {by} changed the queue tree) and card-quota has not seen the change yet; try again"
            ),
            SealCause::Limits => format!(
                "queue {by} changed the card limits of queue {queue}'s tree (a limit lowered, or a queue moved into it) and card-quota has not seen the change yet; try again"
            ),
        },
    ))
}

/// The Queue a write changes, when this replica's cache shows it older than the
/// request's old object (its Queue watch behind this very Queue): the write would be
/// decided, and its seals placed, from a tree and limits that are no longer stored
/// (found by the committer model: a replica cut a queue's quota before its cache
/// showed the queue's move under a parent it had admitted itself, and sealed the cut in
/// the ledger the queue had left; another replica bound past the cut in the new one).
pub fn queue_behind(snap: &Snapshot, req: &AdmissionRequest) -> Option<QueueName> {
    let old = req.old_object.as_ref().map(Object::tree)?;
    let stored: u64 = old
        .pointer("/metadata/resourceVersion")?
        .as_str()?
        .parse()
        .ok()?;
    let name = QueueName::new(old.pointer("/metadata/name")?.as_str()?);
    snap.queue_version(&name)
        .is_none_or(|seen| seen < stored)
        .then_some(name)
}

/// A seal in `ledger` that still holds a queue back here: a limit of its tree changed in
/// a way this replica has not seen. A Queue moved into that tree is checked against
/// those limits, so the move waits too (found by the committer model: a queue moved
/// under a parent whose cap had just been cut to 0 was checked against the old cap by
/// a replica whose Queue watch lagged).
pub fn any_holding_back<'l>(snap: &Snapshot, ledger: &'l Ledger) -> Option<&'l Seal> {
    ledger.seals().values().find(|s| holds_back(snap, s))
}

/// A seal of another change that still holds a queue back here, which a new seal for
/// that queue would overwrite (a ledger keeps one seal per queue): the Queue write that
/// wants the new one waits ("try again") until this replica has seen the other change.
pub fn in_the_way<'l>(
    snap: &Snapshot,
    ledger: &'l Ledger,
    queue: &QueueName,
    new: &Seal,
) -> Option<&'l Seal> {
    ledger
        .seals()
        .get(queue.as_str())
        .filter(|s| (s.by != new.by || s.version > new.version) && holds_back(snap, s))
}

/// True while `seal` holds its queue's charges back on this replica.
fn holds_back(snap: &Snapshot, seal: &Seal) -> bool {
    let by = QueueName::new(seal.by.clone());
    if snap.queue_version(&by).is_some_and(|v| v > seal.version) {
        return false;
    }
    !never_landed(snap, seal)
}

fn never_landed(snap: &Snapshot, seal: &Seal) -> bool {
    let by = QueueName::new(seal.by.clone());
    let Some(seen) = snap.seal_seen(seal) else {
        return false;
    };
    let lift = seen + span(SEAL_LIFT_AFTER);
    snap.queue_confirmed(&by)
        .is_some_and(|(v, read)| read >= lift && v.is_none_or(|v| v == seal.version))
}

fn span(d: std::time::Duration) -> jiff::SignedDuration {
    jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX)
}

/// Notes, on this replica's clock, when it first saw each seal of `ledger` that holds
/// a queue back (the clock a seal whose change never landed is lifted by). The writer
/// notes them before each write of the ledger, not every decision: O(seals) per batch.
pub fn note_seals(snap: &mut Snapshot, ledger: &QueueName, now: jiff::Timestamp) {
    let held = snap.ledger(ledger);
    for s in held.ledger.seals().values() {
        if holds_back(snap, s) {
            snap.note_seal(s, now);
        }
    }
}

/// The Queues to read from the API server before charging `ledger`: those of seals that
/// hold charges back here and that this replica has not read, nor tried to, for
/// [`SEAL_READ_GAP`] (a read brings a lagging cache up to the change, or in time shows it
/// never landed).
pub fn to_confirm(snap: &Snapshot, ledger: &Ledger, now: jiff::Timestamp) -> Vec<QueueName> {
    let mut out: Vec<QueueName> = ledger
        .seals()
        .values()
        .filter(|s| holds_back(snap, s))
        .map(|s| QueueName::new(s.by.clone()))
        .filter(|by| {
            let last = snap.queue_confirmed(by).map(|(_, read)| read);
            let tried = snap.queue_read_failure(by);
            last.max(tried)
                .is_none_or(|read| read + span(SEAL_READ_GAP) <= now)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::review::{read_review, ReviewBuilder};
    use serde_json::{json, Value};

    fn queue(name: &str, parent: &str, quota: Option<&str>, rv: &str) -> Value {
        let mut q = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": name, "resourceVersion": rv, "annotations": {}},
            "spec": {"parent": parent}});
        if let Some(quota) = quota {
            q["metadata"]["annotations"]["volcano.sh/card.quota"] = json!(quota);
        }
        q
    }

    fn snapshot(queues: &[Value]) -> Snapshot {
        let mut s = Snapshot::default();
        for q in queues {
            s.upsert_queue(queue_record(q).expect("queue"));
        }
        s
    }

    fn seals(snap: &Snapshot, new: Value, old: Value) -> Vec<(String, Vec<String>)> {
        let doc = ReviewBuilder::queue("UPDATE", new).old(old).build();
        let req = read_review(&serde_json::to_vec(&doc).expect("json"))
            .expect("review")
            .expect("request");
        seals_for(snap, &req, jiff::Timestamp::now())
            .into_iter()
            .map(|(l, qs)| {
                (
                    l.to_string(),
                    qs.into_iter().map(|(q, _)| q.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_root_budget_seals_every_top_queue_in_its_own_ledger_and_root_in_its_own() {
        let q = |n: &str| queue(n, "root", Some(r#"{"A":1}"#), "5");
        let root = queue("root", "", None, "3");
        let snap = snapshot(&[q("a"), q("b"), root.clone()]);
        let budget = queue("root", "", Some(r#"{"A":2}"#), "3");
        assert_eq!(
            seals(&snap, budget, root),
            vec![
                ("a".to_string(), vec!["a".to_string()]),
                ("b".to_string(), vec!["b".to_string()]),
                ("root".to_string(), vec!["root".to_string()]),
            ]
        );
    }

    #[test]
    fn a_root_created_with_a_budget_seals_at_version_zero() {
        let snap = snapshot(&[queue("a", "root", Some(r#"{"A":1}"#), "5")]);
        let doc = ReviewBuilder::queue("CREATE", queue("root", "", Some(r#"{"A":2}"#), "")).build();
        let req = read_review(&serde_json::to_vec(&doc).expect("json"))
            .expect("review")
            .expect("request");
        let seals = seals_for(&snap, &req, jiff::Timestamp::now());
        let a = QueueName::new("a");
        let (q, seal) = &seals[&a][0];
        assert_eq!((q, seal.by.as_str(), seal.version), (&a, "root", 0));
    }

    /// Charges of a moved queue pruned from the ledger it left are in caches at that
    /// ledger's watermark: until the caches reach it, the queue's ledger is behind and
    /// a charge of it is "try again" (found by the live model).
    #[test]
    fn a_queue_moved_from_a_ledger_waits_for_caches_at_that_ledgers_watermark() {
        use crate::ledger::entries::Watermark;
        use crate::ledger::LedgerRecord;
        let mut snap = snapshot(&[queue("q2", "root", Some(r#"{"B":2}"#), "5")]);
        let (root, q2) = (QueueName::new("root"), QueueName::new("q2"));
        let mut left = Ledger::default();
        left.raise_watermark(Watermark {
            pods: 108,
            podgroups: 0,
            claims: 0,
        });
        let mut record = |queue: &QueueName, ledger: Ledger, rv: &str| {
            let mut rec = LedgerRecord::empty(queue.clone());
            rec.resource_version = Some(rv.to_string());
            rec.ledger = ledger;
            snap.upsert_ledger(rec);
        };
        record(&root, left, "110");
        let mut moved = Ledger::default();
        let from = "root".to_string();
        moved.mark_inbound(&q2, Inbound { from, version: 110 });
        record(&q2, moved, "111");
        snap.set_progress(Watermark {
            pods: 107,
            podgroups: 0,
            claims: 0,
        });
        let ledger = snap.ledger(&q2).ledger.clone();
        let waits = unread_source(&snap, &ledger, &q2).expect("try again");
        assert!(
            waits
                .message
                .as_deref()
                .is_some_and(|m| m.contains("caught up")),
            "{waits:?}"
        );
        assert_eq!(
            crate::decide::batch::behind(&snap, &q2).map(|m| m.pods),
            Some(108)
        );
        snap.set_progress(Watermark {
            pods: 108,
            podgroups: 0,
            claims: 0,
        });
        assert!(unread_source(&snap, &ledger, &q2).is_none());
        assert!(crate::decide::batch::behind(&snap, &q2).is_none());
    }

    #[test]
    fn a_write_that_shapes_no_tree_seals_nothing() {
        let a = queue("a", "root", Some(r#"{"A":1}"#), "5");
        let snap = snapshot(std::slice::from_ref(&a));
        let raised = queue("a", "root", Some(r#"{"A":4}"#), "5");
        assert!(seals(&snap, raised, a).is_empty());
    }
}
