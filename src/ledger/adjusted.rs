//! A queue's usage after a hypothetical change, read without copying the queue's
//! usage: the usage as counted (borrowed) with the change's few differences on top. A
//! decision reads the room and the competing demand of the models it can affect;
//! [`Adjusted::usage`] builds every number only when a caller needs them all.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::cards::{Alternatives, CardName, CardPattern, Cards, ObjectKey, Quota};

use super::feasibility::{check_needs, CapRoom, Demand, Need, Verdict, DEFAULT_BUDGET};
use super::usage::{QueueUsage, Share};

/// What a change adds to and takes from one entry. The entry after it is
/// `max(0, before - taken) + added`: take-backs come first, as in the tally.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Moved<T> {
    added: T,
    taken: T,
}

/// Which side of a [`Moved`] a change counts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Added,
    Taken,
}

impl Side {
    fn of<T>(self, m: &mut Moved<T>) -> &mut T {
        match self {
            Self::Added => &mut m.added,
            Self::Taken => &mut m.taken,
        }
    }
}

/// The entry of `k` in a short list of moves (a change touches a few entries).
fn moved<'v, K: PartialEq + Clone, T: Default>(
    list: &'v mut Vec<(K, Moved<T>)>,
    k: &K,
) -> &'v mut Moved<T> {
    let i = match list.iter().position(|(x, _)| x == k) {
        Some(i) => i,
        None => {
            list.push((k.clone(), Moved::default()));
            list.len() - 1
        }
    };
    &mut list[i].1
}

fn find<'v, K: PartialEq, T>(list: &'v [(K, Moved<T>)], k: &K) -> Option<&'v Moved<T>> {
    list.iter().find(|(x, _)| x == k).map(|(_, m)| m)
}

fn cards_after(before: Cards, m: Option<&Moved<Cards>>) -> Cards {
    match m {
        Some(m) => before.saturating_sub(m.taken) + m.added,
        None => before,
    }
}

fn count_after(before: u64, m: Option<&Moved<u64>>) -> u64 {
    match m {
        Some(m) => before.saturating_sub(m.taken).saturating_add(m.added),
        None => before,
    }
}

/// The differences a change makes, per entry of [`QueueUsage`].
#[derive(Debug, Clone, Default)]
struct Diff {
    allocated: Vec<(CardName, Moved<Cards>)>,
    pending: Vec<(Alternatives, Moved<Cards>)>,
    reserved: Vec<(Alternatives, Moved<Cards>)>,
    waiting: Vec<((Alternatives, Cards), Moved<u64>)>,
    planned: Vec<Demand>,
    /// Problems set (`Some`) or cleared (`None`), in order.
    problems: Vec<(ObjectKey, Option<String>)>,
}

/// A queue's usage, as counted, with a change's differences on top.
#[derive(Debug, Clone)]
pub struct Adjusted<'a> {
    base: Cow<'a, QueueUsage>,
    quota: Cow<'a, Quota>,
    diff: Diff,
}

impl<'a> Adjusted<'a> {
    /// `base` unchanged, under `quota` (the base's own quota field is not read).
    pub fn new(base: Cow<'a, QueueUsage>, quota: Cow<'a, Quota>) -> Self {
        Self {
            base,
            quota,
            diff: Diff::default(),
        }
    }

    /// Counts a pod's share, as [`QueueUsage::add_share`] does.
    pub fn add_share(&mut self, key: &ObjectKey, share: &Share) {
        self.move_share(key, share, Side::Added);
    }

    /// Takes back a counted share, as [`QueueUsage::sub_share`] does.
    pub fn sub_share(&mut self, key: &ObjectKey, share: &Share) {
        self.move_share(key, share, Side::Taken);
    }

    fn move_share(&mut self, key: &ObjectKey, share: &Share, side: Side) {
        match share {
            Share::Nothing => {}
            Share::Allocated(c) => {
                for (m, n) in c {
                    *side.of(moved(&mut self.diff.allocated, m)) += *n;
                }
            }
            Share::Pending(a, n) => {
                *side.of(moved(&mut self.diff.pending, a)) += *n;
                let w = side.of(moved(&mut self.diff.waiting, &(a.clone(), *n)));
                *w = w.saturating_add(1);
            }
            // Waiting behind the gate holds no quota: no decision's room changes.
            Share::Gated(..) => {}
            Share::Problem(e) => {
                let set = (side == Side::Added).then(|| e.clone());
                self.diff.problems.push((key.clone(), set));
            }
        }
    }

    /// Counts a PodGroup's reservation.
    pub fn add_reservation(&mut self, r: &[(Alternatives, Cards)]) {
        self.move_reservation(r, Side::Added);
    }

    /// Takes back a counted reservation.
    pub fn sub_reservation(&mut self, r: &[(Alternatives, Cards)]) {
        self.move_reservation(r, Side::Taken);
    }

    fn move_reservation(&mut self, r: &[(Alternatives, Cards)], side: Side) {
        for (a, n) in r {
            *side.of(moved(&mut self.diff.reserved, a)) += *n;
        }
    }

    /// Adds a demand with no object yet (replicas a scale-up would add).
    pub fn add_planned(&mut self, d: &Demand) {
        moved(&mut self.diff.pending, &d.models).added += d.total();
        self.diff.planned.push(d.clone());
    }

    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Cards allocated on `m` after the change.
    pub fn allocated(&self, m: &CardName) -> Cards {
        let before = self.base.allocated.get(m).copied().unwrap_or_default();
        cards_after(before, find(&self.diff.allocated, m))
    }

    /// Room on `m` after the change: quota minus allocated (negative after a quota cut).
    pub fn room(&self, m: &CardName) -> i128 {
        self.quota
            .get(m)
            .signed_minus(Cards::ZERO)
            .saturating_sub(self.allocated(m).signed_minus(Cards::ZERO))
    }

    /// Every open demand after the change, borrowed: reservations, pending pods,
    /// planned replicas (the order of [`QueueUsage::demands`]).
    fn needs(&self) -> Vec<Need<'_>> {
        let b = &*self.base;
        let d = &self.diff;
        let mut out = Vec::with_capacity(b.reserved.len() + b.waiting.len() + b.planned.len() + 4);
        for (a, n) in merged(&b.reserved, &d.reserved, cards_after) {
            out.push(Need {
                models: a,
                cards: n,
                divisible: true,
                count: 1,
            });
        }
        for ((a, n), count) in merged(&b.waiting, &d.waiting, count_after) {
            out.push(Need {
                models: a,
                cards: *n,
                divisible: false,
                count,
            });
        }
        out.extend(b.planned.iter().chain(&d.planned).map(Demand::need));
        out
    }

    /// Room under each group cap after the change: its cards minus what the models it
    /// matches have allocated (negative after a cut).
    pub fn cap_rooms(&self) -> Vec<CapRoom<'_>> {
        let caps = self.quota.caps();
        if caps.is_empty() {
            return Vec::new();
        }
        let models: BTreeSet<&CardName> = self
            .base
            .allocated
            .keys()
            .chain(self.diff.allocated.iter().map(|(m, _)| m))
            .collect();
        caps.iter()
            .map(|(p, n)| {
                let used: Cards = models
                    .iter()
                    .filter(|m| p.matches(m))
                    .map(|m| self.allocated(m))
                    .sum();
                CapRoom {
                    pattern: p,
                    room: n.signed_minus(used),
                }
            })
            .collect()
    }

    /// Is the demand that can reach `touched` feasible after the change? Only the
    /// models connected to `touched` through some demand or some group cap are checked.
    pub fn feasible(&self, touched: &BTreeSet<CardName>) -> Verdict {
        let needs = self.needs();
        let part = component(&needs, touched, self.quota.caps());
        check_needs(|m| self.room(m), &self.cap_rooms(), &part, DEFAULT_BUDGET)
    }

    /// The whole usage after the change.
    pub fn usage(&self) -> QueueUsage {
        let mut u = self.base.clone().into_owned();
        u.quota = self.quota.clone().into_owned();
        let d = &self.diff;
        for (m, mv) in &d.allocated {
            apply(&mut u.allocated, m, cards_after, mv);
        }
        for (a, mv) in &d.pending {
            apply(&mut u.pending, a, cards_after, mv);
        }
        for (a, mv) in &d.reserved {
            apply(&mut u.reserved, a, cards_after, mv);
        }
        for (k, mv) in &d.waiting {
            apply(&mut u.waiting, k, count_after, mv);
        }
        u.planned.extend(d.planned.iter().cloned());
        if !d.problems.is_empty() {
            let p = Arc::make_mut(&mut u.problems);
            for (k, e) in &d.problems {
                match e {
                    Some(e) => p.insert(k.clone(), e.clone()),
                    None => p.remove(k),
                };
            }
        }
        u
    }
}

/// The non-zero entries of `base` with `diff` applied, those only in `diff` included.
fn merged<'m, K: Ord + PartialEq, T: Copy + Default + PartialEq>(
    base: &'m BTreeMap<K, T>,
    diff: &'m [(K, Moved<T>)],
    after: fn(T, Option<&Moved<T>>) -> T,
) -> impl Iterator<Item = (&'m K, T)> {
    let changed = base.iter().map(move |(k, v)| (k, after(*v, find(diff, k))));
    let new = diff
        .iter()
        .filter(|(k, _)| !base.contains_key(k))
        .map(move |(k, m)| (k, after(T::default(), Some(m))));
    changed.chain(new).filter(|(_, v)| *v != T::default())
}

/// Sets `k` in `map` to its value after `mv`, dropping it at zero.
fn apply<K: Ord + Clone, T: Copy + Default + PartialEq>(
    map: &mut BTreeMap<K, T>,
    k: &K,
    after: fn(T, Option<&Moved<T>>) -> T,
    mv: &Moved<T>,
) {
    let v = after(map.get(k).copied().unwrap_or_default(), Some(mv));
    if v == T::default() {
        map.remove(k);
    } else {
        map.insert(k.clone(), v);
    }
}

/// The demands in the component of models reachable from `touched`: two models are
/// linked by a demand that may use both, or by a group cap over both.
fn component<'n>(
    needs: &[Need<'n>],
    touched: &BTreeSet<CardName>,
    caps: &[(CardPattern, Cards)],
) -> Vec<Need<'n>> {
    let mut models: BTreeSet<&CardName> = touched.iter().collect();
    let mut taken = vec![false; needs.len()];
    // The caps reached so far (patterns nest, so a cap over a reached model links
    // every model under it).
    let mut reached = vec![false; caps.len()];
    let reach = |models: &BTreeSet<&CardName>, reached: &mut Vec<bool>| {
        for (j, (p, _)) in caps.iter().enumerate() {
            if !reached[j] && models.iter().any(|m| p.matches(m)) {
                reached[j] = true;
            }
        }
    };
    let under_reached = |m: &CardName, reached: &[bool]| {
        caps.iter()
            .zip(reached)
            .any(|((p, _), r)| *r && p.matches(m))
    };
    loop {
        let mut grew = false;
        reach(&models, &mut reached);
        for (i, d) in needs.iter().enumerate() {
            if !taken[i]
                && d.models
                    .models()
                    .iter()
                    .any(|m| models.contains(m) || under_reached(m, &reached))
            {
                taken[i] = true;
                for m in d.models.models() {
                    grew |= models.insert(m);
                }
            }
        }
        if !grew {
            break;
        }
    }
    needs
        .iter()
        .zip(taken)
        .filter(|(_, t)| *t)
        .map(|(d, _)| *d)
        .collect()
}
