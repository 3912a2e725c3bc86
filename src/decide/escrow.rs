//! Escrow, the pure half: a replica holds headroom on a queue, written once in the
//! queue's ledger, and admits pod charges within it with no write of their own. Every
//! other replica counts the whole hold as reserved until the holder writes it again or
//! it expires, so "cache ∪ ledger ∪ others' holds" never counts less than exists.
//!
//! The rules (docs/consistency.md):
//! - A hold is written as `spare` per model: headroom. At each write of its hold, what
//!   the holder admitted under it and its caches do not show yet becomes ledger
//!   entries (each pod counted once by a reader whose cache shows it); the watermark
//!   rises to where its caches showed the rest. (A hold's `cards` beyond its spare, as
//!   the first version wrote them, are read as pending pods.)
//! - Between two writes the holder admits at most `spare` more; what settles into its
//!   caches meanwhile is not given back until the next write.
//! - Spare is a quarter of what is free, at most [`HOLD_CHUNK`] cards, and nothing when
//!   a release was asked for: holds shrink to nothing near the quota.
//! - A charge refused only because of others' holds asks them to release (the
//!   ledger's release request); each holder answers by writing its hold down to
//!   nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::cards::{Alternatives, CardName, Cards, ObjectKey, QueueName};
use crate::ledger::entries::{Entry, EntryId, EntryKey, Hold, Ledger, HOLD_NAMESPACE};
use crate::ledger::Effect;
use crate::snapshot::overlay::{self, Overlay};
use crate::snapshot::Snapshot;

/// The most spare cards one write of a hold takes per model.
pub const HOLD_CHUNK: u64 = 64;

/// One replica's hold on one queue, as the replica itself keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Escrow {
    /// The renewal last written (0: never).
    pub renewal: u64,
    /// What may still be admitted under the written hold, per model.
    pub spare: BTreeMap<CardName, Cards>,
    /// This replica's admissions under its holds, kept until its caches show them.
    pub in_flight: Ledger,
    /// The release request the last write answered.
    pub released: u64,
    /// The models the last write took spare on (kept while the spare is frozen).
    pub models: BTreeSet<CardName>,
}

/// How one replica counts a queue's holds.
pub struct Holding<'a> {
    /// This replica's identity in `holds`.
    pub me: &'a str,
    /// Whether another replica's hold still counts (not expired on this replica's clock).
    pub live: &'a dyn Fn(&str, &Hold) -> bool,
    /// This replica's own hold.
    pub escrow: &'a Escrow,
}

/// True when holds may be taken on `queue`: one with no card level above or below it
/// (a tree's charges are serialized through its top level's ledger instead).
pub fn holdable_queue(snap: &Snapshot, queue: &QueueName) -> bool {
    snap.is_flat() || (snap.ledger_key(queue) == *queue && snap.card_children(queue).is_empty())
}

/// The one model a pod charge is pending on, when it is a pod not yet bound that can
/// end up on one model only (pinned, or naming one) and belongs to no PodGroup. (A
/// pod of a group may draw on the group's reservation: that adds no usage a hold
/// could carry, yet uses the reservation up for the other replicas.)
pub fn held_model(effect: &Effect) -> Option<CardName> {
    let Effect::Pod(p) = effect else {
        return None;
    };
    if p.node.is_some() || p.group.is_some() {
        return None;
    }
    let a = p.effective_alternatives()?;
    match a.models() {
        [m] => Some(m.clone()),
        _ => None,
    }
}

/// How other replicas' holds are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// Whole: what they carry and their spare (the line every charge is held to).
    Full,
    /// Only what they carry (a pod's pin is chosen as if spare were given back on
    /// request, which it is).
    Carried,
}

/// Lays over `snap` what `queue`'s ledger adds for this replica: the entries of
/// `stored`, the holds of other replicas that still count (all of them without
/// `holding`) as `holds` says, and `own` (its admissions in flight).
pub fn lay(
    o: &mut Overlay,
    snap: &mut Snapshot,
    queue: &QueueName,
    stored: &Ledger,
    holding: Option<&Holding<'_>>,
    own: Option<&Ledger>,
    holds: Holds,
) {
    o.lay(snap, queue, stored);
    lay_holds(o, snap, queue, stored, holding, holds == Holds::Carried);
    // Holds left in the ledger of a queue that now charges this one (the tree
    // changed under them): this replica's own included, whose escrow is that queue's.
    let anyone = holding.map(|h| Holding {
        me: "",
        live: h.live,
        escrow: h.escrow,
    });
    for f in overlay::foreign(snap, queue) {
        if snap.ledger_key(&f.queue) == *queue {
            lay_holds(
                o,
                snap,
                &f.queue,
                &f.ledger,
                anyone.as_ref(),
                holds == Holds::Carried,
            );
        }
    }
    for (id, e) in own.into_iter().flat_map(Ledger::iter) {
        o.add(snap, queue, id, e);
    }
}

fn lay_holds(
    o: &mut Overlay,
    snap: &mut Snapshot,
    queue: &QueueName,
    stored: &Ledger,
    holding: Option<&Holding<'_>>,
    carried_only: bool,
) {
    for (replica, hold) in stored.holds() {
        let counts = match holding {
            Some(h) => replica != h.me && (h.live)(replica, hold),
            None => true,
        };
        if !counts || hold.is_empty() {
            continue;
        }
        // What a hold carries is pods its holder admitted: laid as pending pods, so
        // that a refusal counts them as pending. Its spare is a reservation.
        let carried = hold.carried();
        for (model, cards) in &carried.cards {
            let resource = CardName::parse(model)
                .ok()
                .and_then(|m| snap.resources_of(&m).and_then(|r| r.keys().next().cloned()));
            match resource {
                Some(r) if !cards.is_zero() => {
                    let (id, e) = carried_pod(replica, model, &r, *cards);
                    o.add(snap, queue, &id, &e);
                }
                _ => {}
            }
        }
        if !carried_only {
            let mut spare = hold.clone();
            spare.cards = hold.spare.clone();
            // A model no node offers yet: its carried cards are reserved too.
            for (model, cards) in &carried.cards {
                let offered = CardName::parse(model)
                    .ok()
                    .is_some_and(|m| snap.resources_of(&m).is_some());
                if !offered {
                    *spare.cards.entry(model.clone()).or_default() += *cards;
                }
            }
            if !spare.is_empty() {
                let (id, e) = spare.entry(replica);
                o.add(snap, queue, &id, &e);
            }
        }
    }
}

/// The pending pod standing for what `replica`'s hold carries on `model`.
fn carried_pod(replica: &str, model: &str, resource: &str, cards: Cards) -> (EntryId, Entry) {
    let key = ObjectKey::new(HOLD_NAMESPACE, format!("{replica}/{model}"));
    let of = EntryKey::Pod(key);
    (
        EntryId::for_key(&of),
        Entry {
            of,
            group: None,
            resources: BTreeMap::from([(resource.to_string(), cards)]),
            card: Some(model.to_string()),
            charged: None,
            node: None,
            allocated: BTreeMap::new(),
            pinned: BTreeMap::new(),
            excluded: BTreeMap::new(),
            request: Vec::new(),
            phase: None,
            base: None,
            queue: None,
            retried: 0,
        },
    )
}

/// Cards in use per model in `queue` as the snapshot shows it now, and what is free.
pub fn in_use(
    snap: &Snapshot,
    queue: &QueueName,
    models: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> BTreeMap<CardName, (Cards, i128)> {
    let u = snap.counted(queue, now);
    let cap = snap.cap_of(queue);
    models
        .iter()
        .map(|m| {
            let used = u.competing(&Alternatives::single(m.clone())).in_use();
            (m.clone(), (used, cap.get(m).signed_minus(used)))
        })
        .collect()
}

/// The models the entries of `ledger` may charge.
pub fn models_of(ledger: &Ledger) -> BTreeSet<CardName> {
    ledger.iter().flat_map(|(_, e)| entry_models(e)).collect()
}

fn entry_models(e: &Entry) -> Vec<CardName> {
    let named = e
        .card
        .as_deref()
        .and_then(|c| Alternatives::parse(c).ok())
        .map(|a| a.models().to_vec())
        .unwrap_or_default();
    let charged = e.charged.as_deref().and_then(|c| CardName::parse(c).ok());
    named.into_iter().chain(charged).collect()
}

/// What an admitted charge adds to each of `models` in the queue: the usage with its
/// entry laid over the snapshot, less the usage without.
pub fn added(
    snap: &mut Snapshot,
    queue: &QueueName,
    effect: &Effect,
    models: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> BTreeMap<CardName, Cards> {
    let before = in_use(snap, queue, models, now);
    let mut scratch = Ledger::default();
    let id = scratch.record(effect);
    let after = Overlay::scoped(snap, |snap, o| {
        if let Some(e) = scratch.get(&id) {
            o.add(snap, queue, &id, e);
        }
        in_use(snap, queue, models, now)
    });
    after
        .into_iter()
        .map(|(m, (a, _))| {
            let b = before.get(&m).map(|x| x.0).unwrap_or_default();
            (m, a.saturating_sub(b))
        })
        .collect()
}

/// Takes `add` from the spare when it all fits; false (and nothing taken) otherwise.
pub fn take(spare: &mut BTreeMap<CardName, Cards>, add: &BTreeMap<CardName, Cards>) -> bool {
    let fits = add
        .iter()
        .all(|(m, n)| n.is_zero() || spare.get(m).is_some_and(|s| s.get() >= n.get()));
    if fits {
        for (m, n) in add {
            if let Some(s) = spare.get_mut(m) {
                *s = s.saturating_sub(*n);
            }
        }
    }
    fits
}

/// The spare one write takes on a model with `free` cards free.
pub fn spare_for(free: i128) -> Cards {
    let quarter = (free.max(0) / 4) as u128;
    Cards::from_u128(quarter.min(u128::from(HOLD_CHUNK)))
}

/// The hold a replica writes, and the escrow it keeps once the write lands.
#[derive(Debug, Clone, PartialEq)]
pub struct Renewal {
    /// `None`: the replica holds nothing any more (its hold is dropped).
    pub hold: Option<Hold>,
    pub escrow: Escrow,
}

/// The renewal of this replica's hold on `queue` over a snapshot *without* any
/// overlay: `stored` is the ledger about to be written (entries, among them what this
/// replica admitted under its hold, and others' holds), `wanted` the models to keep
/// spare on (none: write the hold down to nothing).
pub fn renew(
    snap: &mut Snapshot,
    queue: &QueueName,
    stored: &Ledger,
    holding: &Holding<'_>,
    wanted: &BTreeSet<CardName>,
    answer_release: bool,
    now: jiff::Timestamp,
) -> Renewal {
    let free = Overlay::scoped(snap, |snap, base| {
        base.lay(snap, queue, stored);
        lay_holds(base, snap, queue, stored, Some(holding), false);
        in_use(snap, queue, wanted, now)
    });
    let mut spare = BTreeMap::new();
    for (m, (_, free)) in &free {
        // A renewal written while admissions go on under the old spare keeps what is
        // left of it: those admissions land under the new hold.
        let left = holding.escrow.spare.get(m).copied().unwrap_or_default();
        let most = Cards::from_u128(u128::try_from((*free).max(0)).unwrap_or(u128::MAX));
        let s = spare_for(*free);
        let s = if left.get() > s.get() {
            Cards::from_u128(left.get().min(most.get()))
        } else {
            s
        };
        if !s.is_zero() {
            spare.insert(m.clone(), s);
        }
    }
    let cards: BTreeMap<String, Cards> = spare.iter().map(|(m, n)| (m.to_string(), *n)).collect();
    let released = if answer_release {
        stored.release()
    } else {
        holding.escrow.released
    };
    let renewal = holding.escrow.renewal + 1;
    let hold = (!cards.is_empty()).then(|| Hold {
        spare: cards.clone(),
        cards,
        renewal,
        released,
    });
    Renewal {
        hold,
        escrow: Escrow {
            renewal,
            models: spare.keys().cloned().collect(),
            spare,
            in_flight: Ledger::default(),
            released,
        },
    }
}

/// The escrow to keep once a renewal written from `planned` (this replica's escrow when
/// the batch was planned) lands, while `now` is the escrow as admissions left it during
/// the write: what they took from the old spare comes off the new one, and what they
/// admitted stays in flight.
pub fn landed(mut renewed: Escrow, planned: &Escrow, now: &Escrow) -> Escrow {
    for (m, before) in &planned.spare {
        let after = now.spare.get(m).copied().unwrap_or_default();
        let taken = before.saturating_sub(after);
        if let Some(s) = renewed.spare.get_mut(m) {
            *s = s.saturating_sub(taken);
        }
    }
    for (id, e) in now.in_flight.iter() {
        if planned.in_flight.get(id).is_none() {
            renewed.in_flight.insert(id.clone(), e.clone());
        }
    }
    renewed
}

/// True when a release request is waiting for this replica's answer.
pub fn release_asked(stored: &Ledger, escrow: &Escrow) -> bool {
    stored.release() > escrow.released
}

/// True when some hold that counts still has spare and has not answered the latest
/// release request (a new request would only repeat it).
pub fn release_pending(stored: &Ledger, holding: Option<&Holding<'_>>) -> bool {
    counted(stored, holding).any(|h| !h.spare.is_empty() && h.released < stored.release())
}

/// True when a hold of another replica that counts has spare.
pub fn others_spare(stored: &Ledger, holding: Option<&Holding<'_>>) -> bool {
    counted(stored, holding).any(|h| !h.spare.is_empty())
}

fn counted<'l>(
    stored: &'l Ledger,
    holding: Option<&'l Holding<'_>>,
) -> impl Iterator<Item = &'l Hold> + 'l {
    stored
        .holds()
        .iter()
        .filter(move |(r, h)| !h.is_empty() && holding.is_none_or(|x| *r != x.me && (x.live)(r, h)))
        .map(|(_, h)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_during_a_renewal_come_off_the_new_spare_and_stay_in_flight() {
        let a = CardName::parse("A").unwrap();
        let planned = Escrow {
            spare: BTreeMap::from([(a.clone(), Cards::new(10))]),
            ..Escrow::default()
        };
        // Three admitted while the write was on its way.
        let mut now = planned.clone();
        now.spare.insert(a.clone(), Cards::new(7));
        let effect = crate::ledger::Effect::Pod(Box::new(crate::cluster::PodRecord {
            key: ObjectKey::new("ml", "p"),
            subject: crate::cards::Subject::Pod,
            stamped_queue: None,
            named_queue: None,
            group: None,
            demand: Ok(BTreeMap::new()),
            latent: BTreeMap::new(),
            card_name: None,
            charged: None,
            node: None,
            bind_unseen: false,
            phase: None,
            deletion: None,
            pinned: BTreeMap::new(),
            excluded: BTreeMap::new(),
            scheduler: None,
            claims: Vec::new(),
            claimed: None,
            gated: false,
            created: None,
            seq: 0,
            version: Default::default(),
        }));
        now.in_flight.record(&effect);
        let renewed = Escrow {
            spare: BTreeMap::from([(a.clone(), Cards::new(12))]),
            renewal: 2,
            ..Escrow::default()
        };
        let kept = landed(renewed, &planned, &now);
        assert_eq!(kept.spare[&a], Cards::new(9));
        assert_eq!(kept.in_flight.len(), 1);
        assert_eq!(kept.renewal, 2);
    }

    #[test]
    fn spare_is_a_quarter_of_what_is_free_up_to_a_chunk() {
        assert_eq!(spare_for(-5), Cards::ZERO);
        assert_eq!(spare_for(3), Cards::ZERO);
        assert_eq!(spare_for(8), Cards::new(2));
        assert_eq!(spare_for(1_000_000), Cards::new(HOLD_CHUNK));
    }

    #[test]
    fn taking_from_the_spare_is_all_or_nothing() {
        let a = CardName::parse("A").unwrap();
        let b = CardName::parse("B").unwrap();
        let mut spare = BTreeMap::from([(a.clone(), Cards::new(2))]);
        assert!(take(
            &mut spare,
            &BTreeMap::from([(a.clone(), Cards::new(2))])
        ));
        assert_eq!(spare[&a], Cards::ZERO);
        assert!(!take(
            &mut spare,
            &BTreeMap::from([(a.clone(), Cards::new(1))])
        ));
        assert!(!take(
            &mut spare,
            &BTreeMap::from([(b.clone(), Cards::new(1))])
        ));
        // Nothing added takes nothing.
        assert!(take(&mut spare, &BTreeMap::from([(b, Cards::ZERO)])));
    }
}
