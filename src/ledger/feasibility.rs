//! The exact feasibility check of docs/decisions.md: can every demand be assigned to one of
//! its models within each model's room? Whole pods are indivisible (an assignment
//! search with a budget); job-level requests are divisible (a max-flow).
//!
//! Identical pods are counted, not listed: a scale-up to 2^31 replicas is one demand
//! with a count, and both the greedy pass and the search place pods in bulk, so time
//! and memory depend on the number of distinct demands and models only.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::cards::{Alternatives, CardName, CardPattern, Cards};

use super::flow::{Network, UNLIMITED};

/// One demand on a queue: `count` identical pods (or one job-level request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub models: Alternatives,
    /// Cards of one of the `count` identical demands.
    pub cards: Cards,
    /// A pod's cards must all land on one model; a job-level request may split.
    pub divisible: bool,
    /// How many identical demands this stands for.
    pub count: u64,
}

impl Demand {
    /// One pod of `cards` cards.
    pub fn pod(models: Alternatives, cards: Cards) -> Self {
        Self {
            models,
            cards,
            divisible: false,
            count: 1,
        }
    }

    /// A job-level request of `cards` cards that may split across models.
    pub fn job(models: Alternatives, cards: Cards) -> Self {
        Self {
            models,
            cards,
            divisible: true,
            count: 1,
        }
    }

    /// `count` identical pods (replicas a scale-up would add).
    pub fn pods(models: Alternatives, cards: Cards, count: u64) -> Self {
        Self {
            count,
            ..Self::pod(models, cards)
        }
    }

    /// Cards of all `count` demands together.
    pub fn total(&self) -> Cards {
        self.cards.times(self.count)
    }
}

/// The answer of a feasibility check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// An assignment exists (the search found one).
    Feasible,
    /// No assignment exists (proved by a Hall violation or an exhaustive search).
    Infeasible,
    /// The search budget ran out before an answer: callers refuse.
    Undecided,
}

/// Search budget in visited states. A state costs about 1 µs, so a decision's search
/// takes 10 ms at most (8 ms on the bench host, `cargo bench --bench worst`); 20 times
/// more budget decided only a tenth of the instances this one leaves undecided, at 30
/// times the time (random packings of 15–20 multi-card pods over 8 models).
pub const DEFAULT_BUDGET: u64 = 10_000;

/// Positions of the models a check touches. Usually a handful, where a linear search
/// beats hashing their names; a hash map takes over for large components.
#[derive(Default)]
struct ModelIndex<'a> {
    list: Vec<&'a CardName>,
    map: HashMap<&'a CardName, usize>,
}

impl<'a> ModelIndex<'a> {
    const LINEAR: usize = 16;

    /// The position of `m`, given by `new` the first time `m` is seen.
    fn at(&mut self, m: &'a CardName, new: impl FnOnce() -> usize) -> usize {
        if self.list.len() < Self::LINEAR {
            if let Some(i) = self.list.iter().position(|k| *k == m) {
                return i;
            }
            let i = new();
            self.list.push(m);
            if self.list.len() == Self::LINEAR {
                self.map = self.list.iter().copied().zip(0..).collect();
            }
            return i;
        }
        *self.map.entry(m).or_insert_with(new)
    }
}

#[derive(Debug, Clone)]
struct Group {
    models: Vec<usize>,
    size: u128,
    count: u128,
}

/// A borrowed [`Demand`]: what the check reads, so a caller can list a queue's
/// demands without copying them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need<'a> {
    pub models: &'a Alternatives,
    pub cards: Cards,
    pub divisible: bool,
    pub count: u64,
}

impl Need<'_> {
    fn total(&self) -> Cards {
        self.cards.times(self.count)
    }
}

impl Demand {
    /// This demand, borrowed.
    pub fn need(&self) -> Need<'_> {
        Need {
            models: &self.models,
            cards: self.cards,
            divisible: self.divisible,
            count: self.count,
        }
    }
}

/// A group cap's room: its cards minus what the models it matches have allocated
/// (negative after a cut).
#[derive(Debug, Clone, Copy)]
pub struct CapRoom<'a> {
    pub pattern: &'a CardPattern,
    pub room: i128,
}

/// Checks whether `demands` fit in `rooms` (quota minus allocated, per model; may be
/// negative after a quota cut). A model absent from `rooms` has room 0.
pub fn check(rooms: &BTreeMap<CardName, i128>, demands: &[Demand], budget: u64) -> Verdict {
    check_capped(rooms, &[], demands, budget)
}

/// [`check`] under group caps too: the cards placed on the models a cap matches stay
/// within its room.
pub fn check_capped(
    rooms: &BTreeMap<CardName, i128>,
    caps: &[CapRoom<'_>],
    demands: &[Demand],
    budget: u64,
) -> Verdict {
    let needs: Vec<Need<'_>> = demands.iter().map(Demand::need).collect();
    check_needs(|m| rooms.get(m).copied().unwrap_or(0), caps, &needs, budget)
}

/// Where each model's cards count: the model itself and every cap over it, and the
/// tree of caps a flow goes through (model -> its innermost cap -> the next cap up ...).
struct Counted {
    /// Resources: the models, then the caps over at least one of them.
    models: usize,
    /// Per model, the resources its cards count against (itself first).
    over: Vec<Vec<usize>>,
    /// Per resource, the resource its flow goes to next (`None`: the sink).
    up: Vec<Option<usize>>,
}

impl Counted {
    fn new(names: &[&CardName], caps: &[CapRoom<'_>], room: &mut Vec<i128>) -> Self {
        let models = names.len();
        let used: Vec<&CapRoom<'_>> = caps
            .iter()
            .filter(|c| names.iter().any(|m| c.pattern.matches(m)))
            .collect();
        room.extend(used.iter().map(|c| c.room));
        // The innermost of the caps that contain `p` other than itself: patterns nest
        // or are disjoint, so those containing it form a chain.
        let parent = |p: &CardPattern| {
            used.iter()
                .enumerate()
                .filter(|(_, c)| c.pattern != p && c.pattern.contains(p))
                .max_by_key(|(_, c)| c.pattern.specificity())
                .map(|(j, _)| models + j)
        };
        let mut over = Vec::with_capacity(models);
        let mut up = Vec::with_capacity(models + used.len());
        for m in names {
            let mine: Vec<(usize, &CardPattern)> = used
                .iter()
                .enumerate()
                .filter(|(_, c)| c.pattern.matches(m))
                .map(|(j, c)| (models + j, c.pattern))
                .collect();
            up.push(
                mine.iter()
                    .max_by_key(|(_, p)| p.specificity())
                    .map(|(r, _)| *r),
            );
            let mut list = Vec::with_capacity(1 + mine.len());
            list.push(over.len());
            list.extend(mine.iter().map(|(r, _)| *r));
            over.push(list);
        }
        up.extend(used.iter().map(|c| parent(c.pattern)));
        Self { models, over, up }
    }

    /// How much of `size` model `m` can still take: the least room over it.
    fn room_of(&self, room: &[u128], m: usize) -> u128 {
        self.over[m].iter().map(|r| room[*r]).min().unwrap_or(0)
    }

    fn take(&self, room: &mut [u128], m: usize, n: u128) {
        for r in &self.over[m] {
            room[*r] -= n;
        }
    }

    fn give(&self, room: &mut [u128], m: usize, n: u128) {
        for r in &self.over[m] {
            room[*r] += n;
        }
    }
}

/// [`check`] over borrowed demands, with each model's room from `room_of`, under `caps`.
pub fn check_needs(
    room_of: impl Fn(&CardName) -> i128,
    caps: &[CapRoom<'_>],
    demands: &[Need<'_>],
    budget: u64,
) -> Verdict {
    let mut index = ModelIndex::default();
    let mut room: Vec<i128> = Vec::new();
    let mut names: Vec<&CardName> = Vec::new();
    let mut idx_of: Vec<Vec<usize>> = Vec::with_capacity(demands.len());
    for d in demands {
        let idx = d
            .models
            .models()
            .iter()
            .map(|m| {
                index.at(m, || {
                    room.push(room_of(m));
                    names.push(m);
                    room.len() - 1
                })
            })
            .collect();
        idx_of.push(idx);
    }
    let counted = Counted::new(&names, caps, &mut room);
    let mut single = vec![false; room.len()];
    let mut wholes: HashMap<(Vec<usize>, u128), u128> = HashMap::new();
    let mut divisibles: HashMap<Vec<usize>, u128> = HashMap::new();
    for (d, idx) in demands.iter().zip(idx_of) {
        let total = d.total().get();
        if total == 0 {
            continue;
        }
        if idx.len() == 1 {
            for r in &counted.over[idx[0]] {
                room[*r] = room[*r].saturating_sub(i128::try_from(total).unwrap_or(i128::MAX));
                single[*r] = true;
            }
        } else if d.divisible || d.cards.get() == 1 {
            // A one-card pod is as divisible as a unit of a job request.
            let e = divisibles.entry(idx).or_default();
            *e = e.saturating_add(total);
        } else {
            let e = wholes.entry((idx, d.cards.get())).or_default();
            *e = e.saturating_add(u128::from(d.count));
        }
    }
    // Over quota (a quota cut) only matters where a demand is pinned to the model;
    // alternatives simply cannot use it.
    if room.iter().zip(&single).any(|(r, s)| *s && *r < 0) {
        return Verdict::Infeasible;
    }
    let room: Vec<u128> = room
        .into_iter()
        .map(|r| u128::try_from(r.max(0)).unwrap_or(0))
        .collect();
    if wholes.is_empty() && divisibles.is_empty() {
        return Verdict::Feasible;
    }
    let divisibles: Vec<(Vec<usize>, u128)> = {
        let mut v: Vec<_> = divisibles.into_iter().collect();
        v.sort();
        v
    };
    let mut groups: Vec<Group> = wholes
        .into_iter()
        .map(|((models, size), count)| Group {
            models,
            size,
            count,
        })
        .collect();
    // Big pods first: they are the hardest to place and prune the search soonest.
    groups.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.models.cmp(&b.models)));

    // Relaxation: treat whole pods as divisible. If even that fails, Hall's condition
    // is violated somewhere and no assignment exists.
    let mut relaxed = divisibles.clone();
    relaxed.extend(
        groups
            .iter()
            .map(|g| (g.models.clone(), g.size.saturating_mul(g.count))),
    );
    if !flow_fits(&room, &counted, &relaxed) {
        return Verdict::Infeasible;
    }
    if groups.is_empty() {
        return Verdict::Feasible;
    }
    if greedy(&room, &counted, &groups, &divisibles) {
        return Verdict::Feasible;
    }
    let mut s = Search {
        groups: &groups,
        counted: &counted,
        divisibles: &divisibles,
        failed: HashSet::new(),
        budget,
    };
    let mut r = room;
    let first = groups[0].count;
    match s.place(0, first, 0, &mut r) {
        Some(true) => Verdict::Feasible,
        Some(false) => Verdict::Infeasible,
        None => Verdict::Undecided,
    }
}

fn greedy(
    room: &[u128],
    counted: &Counted,
    groups: &[Group],
    divisibles: &[(Vec<usize>, u128)],
) -> bool {
    let mut r = room.to_vec();
    for g in groups {
        let mut left = g.count;
        while left > 0 {
            // Best fit: the alternative with the least room that still fits, filled
            // with as many pods as it holds.
            let pick = g
                .models
                .iter()
                .map(|m| (*m, counted.room_of(&r, *m)))
                .filter(|(_, room)| *room >= g.size)
                .min_by_key(|(_, room)| *room);
            let Some((m, fits)) = pick else {
                return false;
            };
            let k = left.min(fits / g.size);
            counted.take(&mut r, m, k * g.size);
            left -= k;
        }
    }
    flow_fits(&r, counted, divisibles)
}

struct Search<'a> {
    groups: &'a [Group],
    counted: &'a Counted,
    divisibles: &'a [(Vec<usize>, u128)],
    failed: HashSet<(usize, u128, usize, Vec<u128>)>,
    budget: u64,
}

impl Search<'_> {
    /// Places the remaining `left` pods of group `g` on its models at positions >=
    /// `from`, choosing how many go on each model (pods of a group are
    /// interchangeable). The depth is the number of models, not of pods. `None` when
    /// the budget runs out.
    fn place(&mut self, g: usize, left: u128, from: usize, room: &mut Vec<u128>) -> Option<bool> {
        if self.budget == 0 {
            return None;
        }
        self.budget -= 1;
        if left == 0 {
            return if g + 1 == self.groups.len() {
                Some(flow_fits(room, self.counted, self.divisibles))
            } else {
                let next = self.groups[g + 1].count;
                self.place(g + 1, next, 0, room)
            };
        }
        let group = &self.groups[g];
        if from >= group.models.len() {
            return Some(false);
        }
        let key = (g, left, from, room.clone());
        if self.failed.contains(&key) {
            return Some(false);
        }
        let size = group.size;
        let m = group.models[from];
        // Pods the later models can hold at most: this model must take the rest.
        // An upper bound (caps shared by later models are counted once per model).
        let rest: u128 = group.models[from + 1..].iter().fold(0u128, |a, r| {
            a.saturating_add(self.counted.room_of(room, *r) / size)
        });
        let most = left.min(self.counted.room_of(room, m) / size);
        let fewest = left.saturating_sub(rest);
        let mut k = most;
        while k >= fewest && fewest <= most {
            self.counted.take(room, m, k * size);
            let r = self.place(g, left - k, from + 1, room);
            self.counted.give(room, m, k * size);
            match r {
                Some(true) => return Some(true),
                Some(false) => {}
                None => return None,
            }
            if k == 0 {
                break;
            }
            k -= 1;
        }
        self.failed.insert(key);
        Some(false)
    }
}

/// Max-flow: can every divisible demand be split over its models within `room` (the
/// models' rooms, then the caps')? Each model's flow goes up through the caps over it.
fn flow_fits(room: &[u128], counted: &Counted, items: &[(Vec<usize>, u128)]) -> bool {
    if items.is_empty() {
        return true;
    }
    let need = items.iter().fold(0u128, |a, (_, n)| a.saturating_add(*n));
    let have = room[..counted.models]
        .iter()
        .fold(0u128, |a, r| a.saturating_add(*r));
    if need > have {
        return false;
    }
    // Nodes: 0 = source, 1..=items, then models and caps, then sink.
    let n_items = items.len();
    let sink = 1 + n_items + room.len();
    let mut net = Network::new(sink + 1);
    for (i, (models, amount)) in items.iter().enumerate() {
        net.add(0, 1 + i, *amount);
        for m in models {
            net.add(1 + i, 1 + n_items + m, UNLIMITED);
        }
    }
    for (i, (r, up)) in room.iter().zip(&counted.up).enumerate() {
        net.add(1 + n_items + i, up.map_or(sink, |u| 1 + n_items + u), *r);
    }
    net.push(0, sink, need, |_, _| true) >= need
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> CardName {
        CardName::parse(s).unwrap()
    }

    fn rooms(kv: &[(&str, i128)]) -> BTreeMap<CardName, i128> {
        kv.iter().map(|(k, v)| (name(k), *v)).collect()
    }

    fn pod(models: &str, cards: u64) -> Demand {
        Demand::pod(Alternatives::parse(models).unwrap(), Cards::new(cards))
    }

    fn job(models: &str, cards: u64) -> Demand {
        Demand::job(Alternatives::parse(models).unwrap(), Cards::new(cards))
    }

    #[test]
    fn two_billion_identical_pods_are_decided_at_once() {
        let many = |n: u64| Demand::pods(Alternatives::parse("A|B").unwrap(), Cards::new(2), n);
        let r = rooms(&[("A", 3_000_000_001), ("B", 1_294_967_295)]);
        // 2^31 - 1 pods of 2 cards need 4_294_967_294 cards; A holds 1.5e9 pods, B the rest.
        assert_eq!(
            check(&r, &[many(2_147_483_647)], DEFAULT_BUDGET),
            Verdict::Feasible
        );
        assert_eq!(
            check(&r, &[many(2_147_483_648)], DEFAULT_BUDGET),
            Verdict::Infeasible
        );
        let huge = rooms(&[("A", i128::from(u64::MAX)), ("B", 0)]);
        let max = Demand::pods(
            Alternatives::parse("A|B").unwrap(),
            Cards::new(u64::MAX),
            u64::MAX,
        );
        assert_eq!(check(&huge, &[max], DEFAULT_BUDGET), Verdict::Infeasible);
    }

    #[test]
    fn a_job_may_split_across_models_but_a_pod_may_not() {
        let r = rooms(&[("A", 2), ("B", 2)]);
        assert_eq!(
            check(&r, &[job("A|B", 4)], DEFAULT_BUDGET),
            Verdict::Feasible
        );
        assert_eq!(
            check(&r, &[pod("A|B", 4)], DEFAULT_BUDGET),
            Verdict::Infeasible
        );
    }

    #[test]
    fn a_plain_sum_would_over_admit_but_the_exact_check_does_not() {
        // Sum of rooms is 4 and each pod alone fits, but two 2-card pods and a 1-card
        // pod pinned to A cannot all fit.
        let r = rooms(&[("A", 3), ("B", 1)]);
        let d = [pod("A|B", 2), pod("A|B", 2)];
        assert_eq!(check(&r, &d, DEFAULT_BUDGET), Verdict::Infeasible);
    }

    #[test]
    fn the_worked_example_of_the_capacity_card_design_is_admitted() {
        // A100=5, H100=3, 3 A100 allocated: a 4-card A100|H100 job fits (2 + 2 or 1 + 3).
        let r = rooms(&[("A100", 2), ("H100", 3)]);
        assert_eq!(
            check(&r, &[job("A100|H100", 4)], DEFAULT_BUDGET),
            Verdict::Feasible
        );
        assert_eq!(
            check(&r, &[job("A100|H100", 6)], DEFAULT_BUDGET),
            Verdict::Infeasible
        );
    }

    #[test]
    fn a_chain_of_forty_models_is_indexed_past_the_linear_search() {
        // Pods on M_i|M_i+1 (i < 40), one card of room per model: 40 pods fit, 41 do
        // not. The models outnumber the index's linear part, so its map is used too.
        let mut r: BTreeMap<CardName, i128> =
            (0..40).map(|i| (name(&format!("M{i}")), 1)).collect();
        let chain = |n: usize| -> Vec<Demand> {
            (0..n)
                .map(|i| pod(&format!("M{}|M{}", i % 40, (i + 1) % 40), 1))
                .collect()
        };
        assert_eq!(check(&r, &chain(40), DEFAULT_BUDGET), Verdict::Feasible);
        assert_eq!(check(&r, &chain(41), DEFAULT_BUDGET), Verdict::Infeasible);
        // A room past the linear part read at its own position: M30 holds 3.
        r.insert(name("M30"), 3);
        let mut d = chain(40);
        d.push(pod("M30", 2));
        assert_eq!(check(&r, &d, DEFAULT_BUDGET), Verdict::Feasible);
        d.push(pod("M30", 1));
        assert_eq!(check(&r, &d, DEFAULT_BUDGET), Verdict::Infeasible);
    }

    #[test]
    fn negative_room_on_a_used_model_is_infeasible() {
        let r = rooms(&[("A", -1), ("B", 5)]);
        assert_eq!(check(&r, &[pod("B", 1)], DEFAULT_BUDGET), Verdict::Feasible);
        assert_eq!(
            check(&r, &[pod("A", 1)], DEFAULT_BUDGET),
            Verdict::Infeasible
        );
        assert_eq!(
            check(&r, &[pod("A|B", 2)], DEFAULT_BUDGET),
            Verdict::Feasible
        );
    }

    #[test]
    fn a_tiny_budget_leaves_a_hard_instance_undecided_rather_than_admitted() {
        // Needs search: greedy best-fit fails here (it puts the 3 on C, the smallest fit).
        let r = rooms(&[("A", 3), ("B", 3), ("C", 4)]);
        let d = [pod("A|C", 3), pod("B|C", 3), pod("C", 1), pod("A|B|C", 3)];
        let full = check(&r, &d, DEFAULT_BUDGET);
        let tiny = check(&r, &d, 1);
        assert!(full != Verdict::Undecided);
        assert!(tiny == full || tiny == Verdict::Undecided);
    }

    /// Brute force: try every assignment of every pod (divisible demands become unit pods).
    fn brute(room: &[i128], items: &[(Vec<usize>, u64)]) -> bool {
        fn go(room: &mut Vec<i128>, items: &[(Vec<usize>, u64)]) -> bool {
            let Some(((models, size), rest)) = items.split_first() else {
                return room.iter().all(|r| *r >= 0);
            };
            for &m in models {
                room[m] -= i128::from(*size);
                let ok = room[m] >= 0 && go(room, rest);
                room[m] += i128::from(*size);
                if ok {
                    return true;
                }
            }
            false
        }
        go(&mut room.to_vec(), items)
    }

    #[test]
    fn a_group_cap_bounds_the_sum_over_its_models() {
        let r = rooms(&[("NVIDIA-A", 4), ("NVIDIA-B", 4), ("AMD-C", 4)]);
        let star = CardPattern::parse("*").unwrap();
        let nv = CardPattern::parse("NVIDIA-*").unwrap();
        let caps = [
            CapRoom {
                pattern: &star,
                room: 5,
            },
            CapRoom {
                pattern: &nv,
                room: 3,
            },
        ];
        let c = |d: &[Demand]| check_capped(&r, &caps, d, DEFAULT_BUDGET);
        assert_eq!(c(&[pod("NVIDIA-A", 3)]), Verdict::Feasible);
        assert_eq!(
            c(&[pod("NVIDIA-A", 2), pod("NVIDIA-B", 2)]),
            Verdict::Infeasible
        );
        // NVIDIA-* holds 3, * holds 5: the other 2 go to AMD.
        assert_eq!(c(&[job("NVIDIA-A|AMD-C", 5)]), Verdict::Feasible);
        assert_eq!(c(&[job("NVIDIA-A|AMD-C", 6)]), Verdict::Infeasible);
        assert_eq!(
            c(&[pod("NVIDIA-A|AMD-C", 3), pod("NVIDIA-B|AMD-C", 2)]),
            Verdict::Feasible
        );
        assert_eq!(
            c(&[pod("NVIDIA-A|AMD-C", 3), pod("NVIDIA-B|AMD-C", 3)]),
            Verdict::Infeasible
        );
        // A cap over quota only refuses what must land under it.
        let cut = [CapRoom {
            pattern: &nv,
            room: -1,
        }];
        assert_eq!(
            check_capped(&r, &cut, &[pod("AMD-C", 1)], DEFAULT_BUDGET),
            Verdict::Feasible
        );
        assert_eq!(
            check_capped(&r, &cut, &[pod("NVIDIA-B", 1)], DEFAULT_BUDGET),
            Verdict::Infeasible
        );
        assert_eq!(
            check_capped(&r, &cut, &[pod("NVIDIA-B|AMD-C", 1)], DEFAULT_BUDGET),
            Verdict::Feasible
        );
    }

    /// The demands `raw` (model mask, cards, divisible, count) describe over `names`,
    /// and the same as the brute force's items (a divisible demand as one-card items).
    #[allow(clippy::type_complexity)]
    fn instance(
        names: &[CardName],
        raw: Vec<(u8, u64, bool, u64)>,
    ) -> (Vec<Demand>, Vec<(Vec<usize>, u64)>) {
        let mut demands = Vec::new();
        let mut items = Vec::new();
        for (mask, cards, divisible, count) in raw {
            let idx: Vec<usize> = (0..names.len()).filter(|i| mask & (1 << i) != 0).collect();
            if idx.is_empty() {
                continue;
            }
            let models =
                Alternatives::from_models(idx.iter().map(|i| names[*i].clone()).collect()).unwrap();
            demands.push(Demand {
                models,
                cards: Cards::new(cards),
                divisible,
                count,
            });
            for _ in 0..count {
                if divisible {
                    items.extend((0..cards).map(|_| (idx.clone(), 1)));
                } else {
                    items.push((idx.clone(), cards));
                }
            }
        }
        (demands, items)
    }

    /// Brute force under caps: `caps` lists, per cap, its room and the models it covers.
    fn brute_capped(
        room: &[i128],
        caps: &[(i128, Vec<usize>)],
        items: &[(Vec<usize>, u64)],
    ) -> bool {
        fn go(
            room: &mut Vec<i128>,
            caps: &mut Vec<(i128, Vec<usize>)>,
            items: &[(Vec<usize>, u64)],
        ) -> bool {
            let Some(((models, size), rest)) = items.split_first() else {
                return room.iter().all(|r| *r >= 0) && caps.iter().all(|(r, _)| *r >= 0);
            };
            for &m in models {
                let n = i128::from(*size);
                room[m] -= n;
                for c in caps.iter_mut().filter(|c| c.1.contains(&m)) {
                    c.0 -= n;
                }
                // Rooms only shrink further down: prune as soon as one is short.
                let ok = room[m] >= 0 && caps.iter().all(|(r, _)| *r >= 0) && go(room, caps, rest);
                room[m] += n;
                for c in caps.iter_mut().filter(|c| c.1.contains(&m)) {
                    c.0 += n;
                }
                if ok {
                    return true;
                }
            }
            false
        }
        go(&mut room.to_vec(), &mut caps.to_vec(), items)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn feasibility_under_caps_agrees_with_brute_force(
            room in proptest::collection::vec(0i128..6, 4),
            cap_rooms in proptest::collection::vec(proptest::option::of(0i128..8), 4),
            raw in proptest::collection::vec((1u8..16, 1u64..4, any::<bool>(), 1u64..3), 0..6),
        ) {
            // Models A0 A1 B0 B1; caps *, A*, B*, A1* (a laminar family, as patterns are).
            let names: Vec<CardName> = ["A0", "A1", "B0", "B1"].iter().map(|s| name(s)).collect();
            let rooms: BTreeMap<CardName, i128> = names.iter().cloned().zip(room.iter().copied()).collect();
            let patterns: Vec<CardPattern> = ["*", "A*", "B*", "A1*"].iter().map(|p| CardPattern::parse(p).unwrap()).collect();
            let mut caps = Vec::new();
            let mut brute_caps = Vec::new();
            for (p, r) in patterns.iter().zip(&cap_rooms) {
                if let Some(r) = r {
                    caps.push(CapRoom { pattern: p, room: *r });
                    brute_caps.push((*r, (0..4).filter(|i| p.matches(&names[*i])).collect::<Vec<usize>>()));
                }
            }
            let (demands, brute_items) = instance(&names, raw);
            // Only the models some demand names are checked by the code under test;
            // the brute force is given the same (others' rooms are not its business).
            let used: Vec<bool> = (0..4).map(|i| brute_items.iter().any(|(m, _)| m.contains(&i))).collect();
            let brute_caps: Vec<(i128, Vec<usize>)> = brute_caps
                .into_iter()
                .filter(|(_, ms)| ms.iter().any(|m| used[*m]))
                .collect();
            let want = brute_capped(&room, &brute_caps, &brute_items);
            let got = check_capped(&rooms, &caps, &demands, DEFAULT_BUDGET);
            prop_assert_eq!(got == Verdict::Feasible, want, "{:?} {:?} {:?}", rooms, cap_rooms, demands);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn feasibility_agrees_with_brute_force_on_small_instances(
            room in proptest::collection::vec(0i128..6, 1..5),
            raw in proptest::collection::vec((1u8..16, 1u64..4, any::<bool>(), 1u64..3), 0..6),
        ) {
            let names: Vec<CardName> = (0..room.len()).map(|i| name(&format!("M{i}"))).collect();
            let rooms: BTreeMap<CardName, i128> = names.iter().cloned().zip(room.iter().copied()).collect();
            let (demands, brute_items) = instance(&names, raw);
            let want = brute(&room, &brute_items);
            let got = check(&rooms, &demands, DEFAULT_BUDGET);
            prop_assert_eq!(got == Verdict::Feasible, want, "{:?} {:?}", rooms, demands);
        }
    }
}
