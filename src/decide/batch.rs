//! Group commit, the pure half: the charging requests one replica holds for a queue are
//! decided in arrival order against one snapshot with the queue's ledger laid over it,
//! each on top of the ones admitted before it, and come out as one new ledger to write
//! with one compare-and-swap (the scheme of Kubernetes' ResourceQuota admission).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::cards::QueueName;
use crate::ledger::entries::{
    Entry, EntryId, Fate, Fence, Hold, Ledger, Watermark, MAX_BYTES, MAX_ENTRIES,
};
use crate::ledger::EntryKey;
use crate::snapshot::overlay::{self, Overlay};
use crate::snapshot::Snapshot;

use super::enforcement::decide_enforcing;
use super::escrow::{self, Escrow, Holding, Holds, Renewal};
use super::messages::{INSUFFICIENT, RETRY};
use super::review::AdmissionRequest;
use super::{Config, Decision};

/// What became of one request of a batch.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Final now: a denial, an admission that charges nothing, or "try again".
    Answer(Decision),
    /// Admitted, answered once the ledger write lands.
    Admit(Decision),
    /// Refused (or warned) only because of other replicas' holds: waits for them to
    /// be released, and is this refusal if they are not (a warned admission is decided
    /// again without waiting instead).
    Wait(Decision),
}

/// What a batch does with this replica's hold on its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldMove {
    /// Renewed when the batch admits charges under it, or a release is asked for.
    AsNeeded,
    /// As needed, but without spare (the queue was near its quota lately).
    NoSpare,
    /// Renewed, with spare on the models it had spare on.
    Renew,
    /// Written down to what it carries (no spare).
    Shrink,
    /// Given up: its admissions in flight become entries (a graceful stop).
    Drop,
}

/// A batch, decided.
#[derive(Debug, Clone)]
pub struct Batch {
    /// One per request, in the order given.
    pub outcomes: Vec<Outcome>,
    /// The ledger to store: what was there, pruned, plus the admitted charges.
    pub ledger: Ledger,
    /// Its stored form.
    pub text: String,
    /// The precondition of the write (`None`: the ledger object does not exist yet).
    pub resource_version: Option<String>,
    /// Entries pruning dropped.
    pub pruned: usize,
    /// Requests refused because the ledger is at its cap.
    pub full: usize,
    /// This replica's hold as the write sets it, and its escrow once the write lands.
    pub renewal: Option<Renewal>,
    /// True when the write changes holds or asks for a release.
    pub holds_changed: bool,
}

impl Batch {
    /// True when the write can be skipped: nothing admitted, nothing pruned.
    pub fn unchanged(&self) -> bool {
        self.pruned == 0
            && !self.holds_changed
            && !self.outcomes.iter().any(|o| matches!(o, Outcome::Admit(_)))
    }
}

/// How one replica takes part in holds: its identity, which of the others' holds
/// still count on its clock, and its escrow per queue.
pub struct Replica<'a> {
    pub me: &'a str,
    pub live: &'a dyn Fn(&QueueName, &str, &Hold) -> bool,
    pub escrows: &'a mut HashMap<QueueName, Escrow>,
}

/// The watermark this snapshot's caches must reach before deciding from `queue`'s
/// ledger, when they have not reached it yet.
pub fn behind(snap: &Snapshot, queue: &QueueName) -> Option<Watermark> {
    let mark = overlay::watermark(snap, queue);
    (!mark.reached_by(&snap.progress())).then_some(mark)
}

/// The answer, if it comes to that, to a request of a batch planned from a ledger whose
/// watermark the caches have not reached (R2).
fn caches_behind(queue: &QueueName) -> Decision {
    Decision::deny(
        RETRY,
        format!("card-quota's caches are behind queue {queue}'s ledger; try again"),
    )
}

fn full(queue: &QueueName) -> Decision {
    Decision::deny(
        RETRY,
        format!("queue {queue} has {MAX_ENTRIES} charges in flight that card-quota's caches do not show yet; try again in a few seconds"),
    )
}

fn moved(queue: &QueueName, to: &QueueName) -> Decision {
    Decision::deny(
        RETRY,
        format!("queue of this request changed while it was decided ({queue} -> {to}); try again"),
    )
}

/// The answer while [`Snapshot::ledgers_behind_tree`]: the charges of a queue whose
/// ledger changed may sit in a ledger this replica's watch has not delivered.
pub fn ledgers_unread() -> Decision {
    Decision::deny(
        RETRY,
        "the queue tree changed and card-quota is reading its ledgers again; try again".to_string(),
    )
}

/// Decides `reqs` (all charging `queue`, in arrival order) and plans the ledger write.
/// `age` is how long this replica has known an entry as it is now (pruning's clock,
/// [`crate::ledger::clock::EntryClock`]). The snapshot is left exactly as it was found.
pub fn plan(
    snap: &mut Snapshot,
    queue: &QueueName,
    reqs: &[&AdmissionRequest],
    cfg: &Config,
    now: jiff::Timestamp,
    age: impl Fn(&EntryId, &Entry) -> Duration,
    fence: Option<&Fence>,
) -> Batch {
    plan_held(
        snap,
        queue,
        reqs,
        cfg,
        now,
        age,
        fence,
        None,
        HoldMove::AsNeeded,
        false,
    )
}

/// [`plan`] for a replica that takes holds: pod charges of a holdable queue go under
/// its hold (renewed by the write) instead of into entries, and a charge refused while
/// other replicas hold spare waits for them to give it back. With `warned_wait`, so
/// does a charge that warn admits only because of that spare: its warning would tell
/// of a refusal `deny` would not make once the spare is back.
#[allow(clippy::too_many_arguments)]
pub fn plan_held(
    snap: &mut Snapshot,
    queue: &QueueName,
    reqs: &[&AdmissionRequest],
    cfg: &Config,
    now: jiff::Timestamp,
    age: impl Fn(&EntryId, &Entry) -> Duration,
    fence: Option<&Fence>,
    holding: Option<&Holding<'_>>,
    hold_move: HoldMove,
    warned_wait: bool,
) -> Batch {
    // Spare is a share of what is free, which ledgers not read since a change of the
    // tree may count short: none is taken until they are.
    // Nor while the queue is sealed here: its next charges belong to another ledger, or
    // to limits this replica has not seen.
    let stored = snap.ledger(queue);
    let sealed = super::seal::blocks(snap, &stored.ledger, queue).is_some();
    // R2, kept here whatever the shell waited for: a ledger that arrived after the
    // writer saw its caches caught up (while it read a fence or a seal) may say they must
    // come further. Nothing is decided from it, and no spare taken, until they have
    // (found by the committer model: a prune that raised the watermark past a pod the
    // deciding replica's cache did not show let a CREATE through on top of it).
    let behind = behind(snap, queue).is_some();
    let hold_move = match hold_move {
        HoldMove::AsNeeded | HoldMove::Renew if snap.ledgers_behind_tree() || sealed || behind => {
            HoldMove::NoSpare
        }
        m => m,
    };
    let mut ledger = stored.ledger.clone();
    let mut holds_changed = false;
    if let Some(h) = holding {
        let dropped = ledger.retain_holds(|r, hold| r == h.me || (h.live)(r, hold));
        if dropped > 0 {
            holds_changed = true;
            // A dead holder's admissions are no entries: readers find them in their
            // caches once caught up to the fence its hold was dropped behind.
            if let Some(f) = fence {
                ledger.raise_watermark(f.mark);
            }
        }
    }
    let holdable = holding.is_some() && escrow::holdable_queue(snap, queue);
    let mut in_flight = holding
        .map(|h| h.escrow.in_flight.clone())
        .unwrap_or_default();
    let mut held_models = BTreeSet::new();
    let mut admitted: Vec<(usize, EntryId)> = Vec::new();
    let mut outcomes = Vec::with_capacity(reqs.len());
    let mut refused_full = 0;
    let mut want_release = false;
    let unread = snap.ledgers_behind_tree();
    // Each request is decided on top of those admitted before it: their entries are laid
    // over the snapshot with the ledger's, and all taken off at the end (or on a panic).
    Overlay::scoped(snap, |snap, layer| {
        escrow::lay(
            layer,
            snap,
            queue,
            &ledger,
            holding,
            Some(&in_flight),
            Holds::Full,
        );
        for (i, req) in reqs.iter().enumerate() {
            if behind {
                // Decided again once the caches reach the watermark; this if they do not.
                outcomes.push(Outcome::Wait(caches_behind(queue)));
                continue;
            }
            let d = if unread {
                ledgers_unread()
            } else {
                decide_enforcing(req, snap, cfg, now)
            };
            // Refused (or warned) while other replicas hold spare: they give it back
            // first, so that a refusal counts only what was admitted (its numbers included).
            let over = if d.allowed {
                warned_wait && d.would_refuse == Some(INSUFFICIENT)
            } else {
                d.reason == Some(INSUFFICIENT)
            };
            let blocked = over
                && holding.is_some()
                && !req.is_dry_run()
                && escrow::others_spare(&ledger, holding);
            let charge = match (&d.charge, d.allowed && !req.is_dry_run()) {
                (Some(c), true) if !blocked => c.clone(),
                _ => {
                    if blocked {
                        want_release = true;
                        outcomes.push(Outcome::Wait(d));
                    } else {
                        outcomes.push(Outcome::Answer(d));
                    }
                    continue;
                }
            };
            if snap.ledger_key(&charge.queue) != *queue {
                outcomes.push(Outcome::Answer(moved(queue, &charge.queue)));
                continue;
            }
            if let Some(d) = super::seal::blocks(snap, &ledger, &charge.queue)
                .or_else(|| super::seal::unread_source(snap, &ledger, &charge.queue))
            {
                outcomes.push(Outcome::Answer(d));
                continue;
            }
            if holdable && charge.queue == *queue {
                if let Some(m) = escrow::held_model(&charge.effect) {
                    let id = in_flight.record(&charge.effect);
                    if let Some(e) = in_flight.get(&id) {
                        layer.add(snap, queue, &id, e);
                    }
                    held_models.insert(m);
                    outcomes.push(Outcome::Admit(d));
                    continue;
                }
            }
            if ledger.len() >= MAX_ENTRIES {
                refused_full += 1;
                outcomes.push(Outcome::Answer(full(queue)));
                continue;
            }
            let id = ledger.record_for(
                &charge.effect,
                (&charge.queue != queue).then_some(&charge.queue),
            );
            if let Some(e) = ledger.get(&id) {
                layer.add(snap, queue, &id, e);
            }
            admitted.push((i, id));
            outcomes.push(Outcome::Admit(d));
        }
    });
    let fresh: std::collections::HashSet<&EntryId> = admitted.iter().map(|(_, id)| id).collect();
    let pruned = ledger.prune(|id, e| {
        if fresh.contains(id) {
            Fate::Keep
        } else {
            overlay::fate(snap, id, e, age(id, e), now, fence)
        }
    });
    let mut renewal = None;
    if let Some(h) = holding {
        let answer = escrow::release_asked(&ledger, h.escrow);
        let mut mv = hold_move;
        if answer || !held_models.is_empty() {
            mv = match mv {
                HoldMove::AsNeeded => HoldMove::Renew,
                HoldMove::NoSpare => HoldMove::Shrink,
                other => other,
            };
        }
        // What its caches show now needs no hold: the readers catch up to them first.
        let fresh_held: BTreeSet<EntryId> = in_flight
            .iter()
            .map(|(id, _)| id.clone())
            .filter(|id| h.escrow.in_flight.get(id).is_none())
            .collect();
        // Admissions the caches show leave the hold; the watermark rises to the
        // resourceVersions they were shown at (never to this replica's whole progress:
        // a quiet watch of another replica may never get that far).
        in_flight.prune(|id, e| {
            if fresh_held.contains(id) {
                Fate::Keep
            } else {
                overlay::fate(snap, id, e, age(id, e), now, fence)
            }
        });
        if !matches!(mv, HoldMove::AsNeeded | HoldMove::NoSpare) {
            // Written with the hold: what is in flight becomes entries, one per pod (a
            // reader whose cache already shows a pod counts it once; a count carried in
            // the hold would count it twice), and readers catch up to what settled.
            ledger.absorb(&in_flight);
            ledger.raise_watermark(in_flight.watermark());
            holds_changed = true;
        }
        match mv {
            HoldMove::AsNeeded | HoldMove::NoSpare => {}
            HoldMove::Drop => {
                ledger.set_hold(h.me, None);
                renewal = Some(Renewal {
                    hold: None,
                    escrow: Escrow {
                        renewal: h.escrow.renewal + 1,
                        released: ledger.release(),
                        ..Escrow::default()
                    },
                });
            }
            HoldMove::Renew | HoldMove::Shrink => {
                let wanted = if mv == HoldMove::Renew && !answer {
                    let mut w = held_models.clone();
                    w.extend(h.escrow.models.iter().cloned());
                    w
                } else {
                    BTreeSet::new()
                };
                let r = escrow::renew(snap, queue, &ledger, h, &wanted, answer, now);
                ledger.set_hold(h.me, r.hold.clone());
                renewal = Some(r);
            }
        }
    }
    if want_release && !escrow::release_pending(&ledger, holding) {
        ledger.request_release();
        holds_changed = true;
    }
    // Past the object size limit, the latest admissions wait for pruning to catch up.
    let mut text = ledger.render();
    while text.len() > MAX_BYTES {
        let Some((i, id)) = admitted.pop() else { break };
        ledger.forget(&id);
        outcomes[i] = Outcome::Answer(full(queue));
        refused_full += 1;
        text = ledger.render();
    }
    Batch {
        outcomes,
        ledger,
        text,
        resource_version: stored.resource_version.clone(),
        pruned,
        full: refused_full,
        renewal,
        holds_changed,
    }
}

/// What [`look`] found for one request.
#[derive(Debug)]
pub struct Look {
    pub decision: Decision,
    /// The ledger its admitted charge goes to.
    pub queue: Option<QueueName>,
    /// True when the charge was admitted under this replica's hold (recorded in its
    /// escrow, nothing to write).
    pub held: bool,
}

/// Decides one request from "cache ∪ ledger ∪ holds" as `replica` counts them; with
/// `consume`, an admitted pod charge that fits the replica's spare is taken from it
/// and kept in its escrow.
pub fn look(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    cfg: &Config,
    now: jiff::Timestamp,
    replica: Option<&mut Replica<'_>>,
    consume: bool,
) -> Look {
    let Some(replica) = replica else {
        let d = decide_with_ledger(snap, req, cfg, now);
        let queue = d
            .charge
            .as_ref()
            .filter(|_| d.allowed)
            .map(|c| snap.ledger_key(&c.queue));
        return Look {
            decision: d,
            queue,
            held: false,
        };
    };
    let first = decide_enforcing(req, snap, cfg, now);
    if snap.ledgers_behind_tree() && first.allowed && first.charge.is_some() {
        // Never admitted under a hold from ledgers that may be missing charges.
        return Look {
            decision: ledgers_unread(),
            queue: None,
            held: false,
        };
    }
    let charged = match first.charge.as_ref() {
        Some(c) => Some(snap.ledger_key(&c.queue)),
        None => charge_of_unseen_pod(snap, req, &first, Some(&*replica.escrows)),
    };
    let Some(queue) = charged else {
        return Look {
            decision: over_every_ledger(snap, req, cfg, now, first),
            queue: None,
            held: false,
        };
    };
    let stored = snap.ledger(&queue);
    let none = Escrow::default();
    let escrow = replica.escrows.get(&queue).unwrap_or(&none);
    let live = |r: &str, h: &Hold| (replica.live)(&queue, r, h);
    let holding = Holding {
        me: replica.me,
        live: &live,
        escrow,
    };
    let others_spare = escrow::others_spare(&stored.ledger, Some(&holding));
    let (d, add) = if stored.ledger.is_empty()
        && escrow.in_flight.is_empty()
        && escrow.spare.is_empty()
        && overlay::foreign(snap, &queue).is_empty()
    {
        (first, None)
    } else {
        // Decided over "cache ∪ ledger ∪ holds"; what is laid is taken off after (or on
        // a panic).
        let decide_over = |snap: &mut Snapshot, holds: Holds| {
            Overlay::scoped(snap, |snap, layer| {
                escrow::lay(
                    layer,
                    snap,
                    &queue,
                    &stored.ledger,
                    Some(&holding),
                    Some(&escrow.in_flight),
                    holds,
                );
                let d = decide_enforcing(req, snap, cfg, now);
                // A sealed queue takes nothing from spare: the writer answers it (R2
                // for Queues).
                let add = match &d.charge {
                    Some(c)
                        if consume
                            && d.allowed
                            && !req.is_dry_run()
                            && c.queue == queue
                            && !escrow.spare.is_empty()
                            && escrow::holdable_queue(snap, &queue)
                            && super::seal::blocks(snap, &stored.ledger, &c.queue).is_none() =>
                    {
                        escrow::held_model(&c.effect).map(|m| {
                            let models = BTreeSet::from([m]);
                            escrow::added(snap, &queue, &c.effect, &models, now)
                        })
                    }
                    _ => None,
                };
                (d, add)
            })
        };
        // The pin (no charge taken) goes where there is room counting the others'
        // spare, as the check will; only when there is none anywhere, to where spare
        // would be given back on request (a dead holder's never is).
        match decide_over(snap, Holds::Full) {
            (d, _) if !consume && !d.allowed && others_spare => decide_over(snap, Holds::Carried),
            full => full,
        }
    };
    let d = match &d.charge {
        Some(c) if d.allowed && snap.ledger_key(&c.queue) != queue => moved(&queue, &c.queue),
        _ => d,
    };
    let mut held = false;
    if let (Some(add), Some(c)) = (add, d.charge.as_ref()) {
        if let Some(e) = replica.escrows.get_mut(&queue) {
            if escrow::take(&mut e.spare, &add) {
                e.in_flight.record(&c.effect);
                held = true;
            }
        }
    }
    // Refused while other replicas hold spare: recorded like a charge, so that the
    // writer asks them to give it back and decides again.
    let waits = consume
        && !d.allowed
        && !req.is_dry_run()
        && d.reason == Some(INSUFFICIENT)
        && others_spare;
    let queue = (waits || (d.allowed && d.charge.is_some())).then_some(queue);
    Look {
        decision: d,
        queue,
        held,
    }
}

/// Decides one request against "cache ∪ ledger" without recording it (`/mutate`, dry
/// runs, and the first look that tells which queue a request charges).
pub fn decide_with_ledger(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Decision {
    let first = decide_enforcing(req, snap, cfg, now);
    let charged = match first.charge.as_ref() {
        Some(c) => Some(snap.ledger_key(&c.queue)),
        None => charge_of_unseen_pod(snap, req, &first, None),
    };
    let Some(queue) = charged else {
        return over_every_ledger(snap, req, cfg, now, first);
    };
    let stored = snap.ledger(&queue);
    if stored.ledger.is_empty() && overlay::foreign(snap, &queue).is_empty() {
        return first;
    }
    let d = overlay::with_ledger(snap, &queue, &stored.ledger, |snap, layer| {
        if layer.applied() == 0 {
            first
        } else {
            decide_enforcing(req, snap, cfg, now)
        }
    });
    match &d.charge {
        Some(c) if d.allowed && snap.ledger_key(&c.queue) != queue => moved(&queue, &c.queue),
        _ => d,
    }
}

/// A binding admitted from the cache alone because the cache does not show its pod
/// (with pins on, a card pod's CREATE charge counts already: issue 46 #8, such a bind
/// never waits on card-quota's cache) is still the hard line over a charge this replica
/// knows of (a quota cut since its CREATE): the queue whose ledger (or this replica's
/// escrow) holds the pod's charge, to decide it again over that ledger. A charge this
/// replica cannot see (pruned behind a watermark its cache has not reached, or under
/// another replica's hold) stays unchecked: the binding is a net with pins on
/// (docs/consistency.md). O(charges in flight), for bindings of pods not cached only.
/// (Found by tests/committer_model.rs: a pod charged before a cut to 0 was bound
/// through a replica whose pod watch lagged.)
fn charge_of_unseen_pod(
    snap: &Snapshot,
    req: &AdmissionRequest,
    first: &Decision,
    escrows: Option<&HashMap<QueueName, Escrow>>,
) -> Option<QueueName> {
    if !first.allowed || super::RequestKind::of(req) != super::RequestKind::Binding {
        return None;
    }
    let obj = req.object.as_ref()?;
    let (key, _) = super::binding::target(req, obj.tree());
    if !matches!(
        super::binding::shown(snap, &key, obj.tree()),
        super::binding::Shown::Unseen
    ) {
        return None;
    }
    let of = EntryKey::Pod(key.clone());
    let holds = |l: &Ledger| l.iter().any(|(_, e)| e.of == of);
    snap.ledgers()
        .find(|l| holds(&l.ledger))
        .map(|l| l.queue.clone())
        .or_else(|| {
            escrows?
                .iter()
                .find(|(_, e)| holds(&e.in_flight))
                .map(|(q, _)| q.clone())
        })
}

/// A Queue write that charges nothing may still move charges (a re-parent brings the
/// queue's usage under another parent's cap): admitted from the caches alone, it is
/// decided again with every ledger's charges in flight and what the holds carry laid
/// over them. Not the holds' spare: a move lowers the limits of the tree it goes into
/// as a cut does (it seals them so), and a cut reaches CREATEs admitted under a hold
/// within its spare up to the hold's 10 s late (docs/consistency.md, assumptions);
/// bindings are never held. Counted whole, spare refused moves into a tree with room
/// (seen in a committer-model replay: "3 moving with q" for a queue with 1 card in use).
/// Queue writes are rare; the cost is the charges in flight, all queues together.
fn over_every_ledger(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    cfg: &Config,
    now: jiff::Timestamp,
    first: Decision,
) -> Decision {
    if !first.allowed || super::RequestKind::of(req) != super::RequestKind::Queue {
        return first;
    }
    if snap.ledgers_behind_tree() {
        return ledgers_unread();
    }
    let ledgers: Vec<_> = snap
        .ledgers()
        .filter(|l| !(l.ledger.is_empty() && l.ledger.holds().is_empty()))
        .cloned()
        .collect();
    if ledgers.is_empty() {
        return first;
    }
    Overlay::scoped(snap, |snap, layer| {
        for l in &ledgers {
            escrow::lay(layer, snap, &l.queue, &l.ledger, None, None, Holds::Carried);
        }
        decide_enforcing(req, snap, cfg, now)
    })
}
