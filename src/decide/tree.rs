//! The admission rule over a tree of queues (docs/hierarchy.md). A charge of a leaf is
//! admitted when, at every card level x above it, the subtree's demand stays feasible
//! under x's cap (quota + borrow: the hard line), and the effective use E(x) (own use
//! plus each card child's max(E, share)) stays within the cap or does not rise (no
//! borrowing beyond x's unassigned pool). A flat cluster skips all of it.

use std::collections::{BTreeMap, BTreeSet};

use crate::cards::{Alternatives, CardName, CardPattern, Cards, QueueName, Quota};

use crate::ledger::flow::{Network, UNLIMITED};
use crate::ledger::{QueueUsage, Row, UsageKey, Verdict};
use crate::snapshot::tree::WALK_LIMIT;
use crate::snapshot::Snapshot;

use super::messages::{quota_text, short_cap};

/// The first card level above a leaf that a charge would break.
#[derive(Debug, Clone)]
pub enum LevelRefusal {
    /// The level's subtree would need more than its cap.
    Cap {
        level: QueueName,
        /// The subtree's usage before the change, under the level's cap.
        before: Box<QueueUsage>,
    },
    /// The charge would borrow more than the level's unassigned pool holds.
    Borrow {
        level: QueueName,
        model: CardName,
        /// The level's quota and borrow on `model`.
        quota: Cards,
        borrow: Cards,
        /// Its card children's shares, and what they use beyond them, on `model`.
        shares: Cards,
        borrowed: Cards,
        /// Its effective use before the change.
        effective: Cards,
    },
    /// The charge would borrow past one of the level's group caps: what its children's
    /// shares hold and they use beyond them, summed over the cap's models, is full.
    BorrowCap {
        level: QueueName,
        pattern: CardPattern,
        /// The cap's cards (with what the level borrows under it).
        cap: Cards,
        /// The level's effective use over the cap's models before the change.
        effective: Cards,
    },
}

impl LevelRefusal {
    /// The message of a refused charge of `requested` cards of `key` to `leaf`.
    pub fn message(&self, leaf: &QueueName, key: &Alternatives, requested: Cards) -> String {
        match self {
            Self::Cap { level, before } => {
                let r = before.competing(key);
                if let Some((p, c)) = short_cap(key, requested, before, &r) {
                    return format!(
                        "queue {leaf} has insufficient {p} quota (a group cap) in ancestor {level}: requested {requested}, {level} in use {} (allocated {}, pending {}, reserved {}), quota {}",
                        c.in_use(),
                        c.allocated,
                        c.pending,
                        c.reserved,
                        c.quota
                    );
                }
                format!(
                    "queue {leaf} has insufficient {key} quota in ancestor {level}: requested {requested}, {level} in use {} (allocated {}, pending {}, reserved {}), quota {}",
                    r.in_use(),
                    r.allocated,
                    r.pending,
                    r.reserved,
                    quota_text(r.quota, key, &before.borrow)
                )
            }
            Self::Borrow {
                level,
                model,
                quota,
                borrow,
                shares,
                borrowed,
                effective,
            } => {
                let cap = *quota + *borrow;
                let free = cap.saturating_sub(*effective);
                let quota = if borrow.is_zero() {
                    quota.to_string()
                } else {
                    format!("{quota} + borrow {borrow}")
                };
                format!(
                    "queue {leaf} cannot borrow {model} from {level}: requested {requested}, {level} free {free} (quota {quota}, shares {shares}, borrowed {borrowed})"
                )
            }
            Self::BorrowCap {
                level,
                pattern,
                cap,
                effective,
            } => format!(
                "queue {leaf} cannot borrow {key} under group cap {pattern} of {level}: requested {requested}, {level} free {} (cap {cap}, its models' shares and what is borrowed beyond them {effective})",
                cap.saturating_sub(*effective)
            ),
        }
    }
}

/// What the tree says about a change that fits its leaf.
#[derive(Debug, Clone, Default)]
pub struct LevelCheck {
    /// Set when some level refuses it.
    pub refusal: Option<LevelRefusal>,
    /// True when the change raises some level's effective use: it borrows.
    pub borrows: bool,
}

/// Checks `leaf`'s usage going from `before` to `after` at every card level above it.
/// Faults of the tree are the gate's to refuse; here they check nothing.
pub fn check_levels(
    snap: &Snapshot,
    leaf: &QueueName,
    before: &QueueUsage,
    after: &QueueUsage,
    touched: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> LevelCheck {
    let mut out = LevelCheck::default();
    // Per model: E of the card level below the one checked, before and after, while
    // the change still raises it (a model whose E stops rising cannot raise any level
    // above: only a borrowing charge pays for an absolute E, O(the level's children)).
    // A change on one model can move the leaf's multi-model demand onto another.
    let own = snap.share_of(leaf);
    let mut rising: Vec<(CardName, Cards, Cards)> = linked_models(touched, [before, after])
        .iter()
        .map(|m| {
            let e = |u: &QueueUsage| u.effective_use(m, &own);
            (m.clone(), e(before), e(after))
        })
        .filter(|(_, b, a)| a > b)
        .collect();
    let mut below = leaf.clone();
    let sums = level_sums(snap, leaf, before, after, now);
    for (level, sum_before, sum_after) in &sums {
        let cap = &sum_after.quota;
        let borrow = &sum_before.borrow;
        // A charge that borrows is named by the pool it cannot take from; one within
        // its shares, by the cap it would pass.
        let mut still = Vec::new();
        for (m, eb, ea) in rising {
            let share = snap.share_of(&below).get(&m);
            let (was, now_) = (eb.max(share), ea.max(share));
            if now_ <= was {
                continue;
            }
            out.borrows = true;
            let e = effective(snap, level, &m, now);
            let e_after = e.total.saturating_sub(was) + now_;
            if e_after > cap.get(&m) {
                out.refusal = Some(LevelRefusal::Borrow {
                    level: level.clone(),
                    quota: snap.share_of(level).get(&m),
                    borrow: borrow.get(&m),
                    model: m,
                    shares: e.shares,
                    borrowed: e.borrowed,
                    effective: e.total,
                });
                return out;
            }
            still.push((m, e.total, e_after));
        }
        rising = still;
        if let Some(r) = borrow_past_cap(snap, level, cap, &rising, sum_before, now) {
            out.refusal = Some(r);
            return out;
        }
        if !fits_cap(sum_after, touched)
            && (fits_cap(sum_before, touched)
                || in_use(sum_after, touched) > in_use(sum_before, touched))
        {
            out.refusal = Some(LevelRefusal::Cap {
                level: level.clone(),
                before: Box::new(sum_before.clone()),
            });
            return out;
        }
        below = level.clone();
    }
    // Each level alone is exact; demand that may use several models (a PodGroup's `A|B`
    // entries) also needs them together: one flow through every level of the tree.
    if let Some((top, top_before, _)) = sums.last() {
        let nested = |u: &QueueUsage| nested_fit(snap, top, leaf, u, touched, now);
        if let (Some(false), b) = (nested(after), nested(before)) {
            if b != Some(false) {
                out.refusal = Some(LevelRefusal::Cap {
                    level: top.clone(),
                    before: Box::new(top_before.clone()),
                });
            }
        }
    }
    out
}

/// A borrowing charge under a group cap of `level`: refused when the level's effective
/// use summed over the cap's models (each child's shares count whole, as per model)
/// would pass the cap. `rising` holds, per model, the level's E before and after.
fn borrow_past_cap(
    snap: &Snapshot,
    level: &QueueName,
    cap: &Quota,
    rising: &[(CardName, Cards, Cards)],
    subtree: &QueueUsage,
    now: jiff::Timestamp,
) -> Option<LevelRefusal> {
    for (p, n) in cap.caps() {
        let rise: Cards = rising
            .iter()
            .filter(|(m, _, _)| p.matches(m))
            .map(|(_, b, a)| a.saturating_sub(*b))
            .sum();
        if rise.is_zero() {
            continue;
        }
        // Every model under the cap the subtree uses or its children hold a share of.
        let mut models: BTreeSet<&CardName> = subtree
            .allocated
            .keys()
            .chain(
                subtree
                    .pending
                    .keys()
                    .chain(subtree.reserved.keys())
                    .flat_map(|a| a.models()),
            )
            .filter(|m| p.matches(m))
            .collect();
        let shares: Vec<Quota> = snap
            .card_children(level)
            .iter()
            .map(|c| snap.share_of(c))
            .collect();
        models.extend(
            shares
                .iter()
                .flat_map(|s| s.entries().keys())
                .filter(|m| p.matches(m)),
        );
        let effective: Cards = models
            .iter()
            .map(|m| effective(snap, level, m, now).total)
            .sum();
        if effective + rise > *n {
            return Some(LevelRefusal::BorrowCap {
                level: level.clone(),
                pattern: p.clone(),
                cap: *n,
                effective,
            });
        }
    }
    None
}

/// `touched` and every model multi-model unbound demand in `usages` links to it.
fn linked_models<'a>(
    touched: &BTreeSet<CardName>,
    usages: impl IntoIterator<Item = &'a QueueUsage> + Clone,
) -> BTreeSet<CardName> {
    let mut models = touched.clone();
    loop {
        let before = models.len();
        for u in usages.clone() {
            for a in u.pending.keys().chain(u.reserved.keys()) {
                if a.models().len() > 1 && a.models().iter().any(|m| models.contains(m)) {
                    models.extend(a.models().iter().cloned());
                }
            }
        }
        if models.len() == before {
            return models;
        }
    }
}

/// The most nodes the nested flow may take (the network is a matrix): beyond it the
/// levels are checked one by one only.
const NESTED_NODES: usize = 600;

/// Does the unbound demand of `top`'s whole tree fit every card level's cap at once,
/// with `leaf`'s usage as `leaf_usage`? `None` when no demand there may use several
/// models (each level's own check is then exact) or the tree is too large to say.
fn nested_fit(
    snap: &Snapshot,
    top: &QueueName,
    leaf: &QueueName,
    leaf_usage: &QueueUsage,
    touched: &BTreeSet<CardName>,
    now: jiff::Timestamp,
) -> Option<bool> {
    let queues = snap.subtree(top);
    let usage_of = |q: &QueueName| -> std::borrow::Cow<'_, QueueUsage> {
        if q == leaf {
            std::borrow::Cow::Borrowed(leaf_usage)
        } else {
            snap.counted(q, now)
        }
    };
    let usages: Vec<(QueueName, std::borrow::Cow<'_, QueueUsage>)> =
        queues.iter().map(|q| (q.clone(), usage_of(q))).collect();
    // The models multi-model demand connects to `touched`.
    let models = linked_models(touched, usages.iter().map(|(_, u)| u.as_ref()));
    let composite = usages.iter().any(|(_, u)| {
        u.pending
            .keys()
            .chain(u.reserved.keys())
            .any(|a| a.models().len() > 1 && a.models().iter().any(|m| models.contains(m)))
    });
    if !composite {
        return None;
    }
    let models: Vec<CardName> = models.into_iter().collect();
    // Card levels of the tree, each with the card level its flow goes up to.
    let levels: Vec<QueueName> = queues
        .iter()
        .filter(|q| snap.is_card_level(q))
        .cloned()
        .collect();
    let level_of = |q: &QueueName| -> Option<usize> {
        let mut at = Some(q.clone());
        let mut steps = 0;
        while let Some(x) = at {
            if let Some(i) = levels.iter().position(|l| *l == x) {
                return Some(i);
            }
            steps += 1;
            if x == *top || steps > WALK_LIMIT {
                return None;
            }
            at = snap.queue(&x).and_then(|r| snap.link(r)).cloned();
        }
        None
    };
    let up: Vec<Option<usize>> = levels
        .iter()
        .map(|l| {
            if l == top {
                return None;
            }
            snap.queue(l).and_then(|r| snap.link(r)).and_then(&level_of)
        })
        .collect();
    let demands: Vec<(usize, &crate::cards::Alternatives, Cards)> = usages
        .iter()
        .filter_map(|(q, u)| Some((level_of(q)?, u)))
        .flat_map(|(at, u)| {
            u.pending
                .iter()
                .chain(&u.reserved)
                .filter(|(a, _)| a.models().iter().any(|m| models.contains(m)))
                .map(move |(a, n)| (at, a, *n))
        })
        .collect();
    let nodes = 2 + demands.len() + levels.len() * models.len();
    if nodes > NESTED_NODES {
        return None;
    }
    let (source, sink) = (0, 1);
    let node = |l: usize, m: usize| 2 + demands.len() + l * models.len() + m;
    let mut g = Network::new(nodes);
    let mut total: u128 = 0;
    for (i, (at, a, n)) in demands.iter().enumerate() {
        g.add(source, 2 + i, n.get());
        total = total.saturating_add(n.get());
        for (mi, m) in models.iter().enumerate() {
            if a.contains(m) {
                g.add(2 + i, node(*at, mi), UNLIMITED);
            }
        }
    }
    // What each level has left for unbound demand: its cap minus what is bound below it.
    let mut allocated: Vec<Vec<Cards>> = vec![vec![Cards::ZERO; models.len()]; levels.len()];
    for (q, u) in &usages {
        let mut at = level_of(q);
        while let Some(l) = at {
            for (mi, m) in models.iter().enumerate() {
                allocated[l][mi] += u.allocated.get(m).copied().unwrap_or_default();
            }
            at = up[l];
        }
    }
    for (l, level) in levels.iter().enumerate() {
        let cap = snap.cap_of(level);
        for (mi, m) in models.iter().enumerate() {
            let room = cap.get(m).saturating_sub(allocated[l][mi]).get();
            let to = up[l].map_or(sink, |p| node(p, mi));
            g.add(node(l, mi), to, room);
        }
    }
    Some(g.push(source, sink, total, |_, _| true) >= total)
}

/// Binding is the hard line at every level: allocated cards of each card level's
/// subtree stay within its cap on the `charged` models, and within each group cap over
/// them (when the change raises them).
pub fn check_allocated(
    snap: &Snapshot,
    leaf: &QueueName,
    before: &QueueUsage,
    after: &QueueUsage,
    charged: &[CardName],
    now: jiff::Timestamp,
) -> Option<LevelRefusal> {
    for (level, sum_before, sum_after) in level_sums(snap, leaf, before, after, now) {
        let over = charged.iter().any(|m| {
            let (b, a) = (allocated(&sum_before, m), allocated(&sum_after, m));
            a > sum_after.quota.get(m) && a > b
        }) || sum_after.quota.caps().iter().any(|(p, n)| {
            let under = |u: &QueueUsage| -> Cards {
                u.allocated
                    .iter()
                    .filter(|(m, _)| p.matches(m))
                    .map(|(_, c)| *c)
                    .sum()
            };
            charged.iter().any(|m| p.matches(m))
                && under(&sum_after) > *n
                && under(&sum_after) > under(&sum_before)
        });
        if over {
            return Some(LevelRefusal::Cap {
                level,
                before: Box::new(sum_before),
            });
        }
    }
    None
}

fn allocated(u: &QueueUsage, m: &CardName) -> Cards {
    u.allocated.get(m).copied().unwrap_or_default()
}

/// For each card level above `leaf`, nearest first: its subtree's usage before and after
/// the leaf goes from `before` to `after`, under the level's cap (and borrow).
fn level_sums(
    snap: &Snapshot,
    leaf: &QueueName,
    before: &QueueUsage,
    after: &QueueUsage,
    now: jiff::Timestamp,
) -> Vec<(QueueName, QueueUsage, QueueUsage)> {
    // The kept subtree sums (the leaf's `before` among them), the leaf swapped for
    // `after`: O(models), whatever the subtree's size.
    level_usages(snap, leaf, now)
        .into_iter()
        .map(|(level, sum_before)| {
            let mut sum_after = sum_before.clone();
            sum_after.remove(before);
            sum_after.absorb(after);
            (level, sum_before, sum_after)
        })
        .collect()
}

/// For each card level above `leaf`, nearest first: its subtree's usage now, under the
/// level's cap (and borrow).
pub fn level_usages(
    snap: &Snapshot,
    leaf: &QueueName,
    now: jiff::Timestamp,
) -> Vec<(QueueName, QueueUsage)> {
    let Ok(ancestry) = snap.ancestry(leaf) else {
        return Vec::new();
    };
    ancestry
        .levels
        .into_iter()
        .map(|level| {
            let mut sum = snap.subtree_usage(&level, now).into_owned();
            sum.quota = snap.cap_of(&level).into_owned();
            sum.borrow = snap.borrow_of(&level).unwrap_or_default();
            (level, sum)
        })
        .collect()
}

/// True when a level's usage `u` on `touched` fits its cap: what is allocated within
/// it, and what is not bound yet assignable to the room left.
///
/// A search that runs out of budget here counts as a fit: it only runs once the
/// relaxation (every pod divisible) has fitted, and the level sums pods of every queue
/// below it, so pending pods one queue crafts to be hard to place would otherwise
/// refuse its siblings' charges. Each leaf's own check stays exact (its queue's
/// undecided charges are refused), and so does binding at every level.
pub fn fits_cap(u: &QueueUsage, touched: &BTreeSet<CardName>) -> bool {
    touched
        .iter()
        .all(|m| u.allocated.get(m).copied().unwrap_or_default() <= u.quota.get(m))
        && crate::ledger::adjusted::Adjusted::new(
            std::borrow::Cow::Borrowed(u),
            std::borrow::Cow::Borrowed(&u.quota),
        )
        .feasible(touched)
            != Verdict::Infeasible
}

/// Cards in use on `touched` models: allocated, and unbound demand that may use them.
fn in_use(u: &QueueUsage, touched: &BTreeSet<CardName>) -> Cards {
    let reaches = |a: &Alternatives| a.models().iter().any(|m| touched.contains(m));
    touched
        .iter()
        .map(|m| u.allocated.get(m).copied().unwrap_or_default())
        .sum::<Cards>()
        + u.pending
            .iter()
            .chain(&u.reserved)
            .filter(|(a, _)| reaches(a))
            .map(|(_, n)| *n)
            .sum::<Cards>()
}

/// A level's effective use on one model, and its parts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effective {
    /// E: own use plus each card child's max(E, share).
    pub total: Cards,
    /// The card children's shares.
    pub shares: Cards,
    /// What the card children use beyond their shares (from this level's pool).
    pub borrowed: Cards,
}

/// E(x) on `m` as the snapshot stands: x's own use plus, per card child c,
/// max(E(c), share(c)). O(the card levels below x).
pub fn effective(snap: &Snapshot, x: &QueueName, m: &CardName, now: jiff::Timestamp) -> Effective {
    effective_at(snap, x, m, now, 0)
}

fn effective_at(
    snap: &Snapshot,
    x: &QueueName,
    m: &CardName,
    now: jiff::Timestamp,
    depth: usize,
) -> Effective {
    let mut e = Effective {
        total: snap.counted(x, now).effective_use(m, &snap.share_of(x)),
        ..Effective::default()
    };
    if depth > WALK_LIMIT {
        return e;
    }
    for c in snap.card_children(x) {
        let share = snap.share_of(&c).get(m);
        let ec = if snap.has_children(&c) {
            effective_at(snap, &c, m, now, depth + 1).total
        } else {
            snap.counted(&c, now).effective_use(m, &snap.share_of(&c))
        };
        e.shares += share;
        e.borrowed += ec.saturating_sub(share);
        e.total += ec.max(share);
    }
    e
}

/// The usage rows of `queue`: its own objects' usage; in a tree, subtree sums on a
/// queue with children, and what it borrows and lends (docs/hierarchy.md).
pub fn queue_rows(
    snap: &Snapshot,
    queue: &QueueName,
    now: jiff::Timestamp,
) -> BTreeMap<UsageKey, Row> {
    let parent = if snap.is_flat() {
        None
    } else {
        snap.card_parent(queue)
    };
    let inner = !snap.is_flat() && snap.has_children(queue);
    if parent.is_none() && !inner {
        return snap.usage(queue, now).rows();
    }
    let share = snap.share_of(queue);
    let mut u = if inner {
        snap.subtree_usage(queue, now).into_owned()
    } else {
        snap.counted(queue, now).into_owned()
    };
    u.quota = share.clone();
    let mut rows = u.rows();
    let borrow = snap.borrow_of(queue).unwrap_or_default();
    let cap = snap.cap_of(queue).into_owned();
    let lends = inner && snap.queue(queue).is_some_and(|r| r.quota.is_some());
    for (m, b) in borrow.entries() {
        if !b.is_zero() {
            rows.entry(UsageKey::Model(m.clone())).or_default();
        }
    }
    for (k, row) in rows.iter_mut() {
        let UsageKey::Model(m) = k else { continue };
        let b = borrow.get(m);
        if !b.is_zero() {
            row.borrow = Some(b);
        }
        let e = effective(snap, queue, m, now);
        if parent.is_some() {
            let over = e.total.saturating_sub(share.get(m));
            if !over.is_zero() || row.borrow.is_some() {
                row.borrowed = Some(over);
            }
        }
        if lends {
            row.shares = Some(e.shares);
            let free = cap.get(m).signed_minus(e.total);
            row.pool_free =
                Some(i64::try_from(free).unwrap_or(if free < 0 { i64::MIN } else { i64::MAX }));
        }
    }
    rows
}
