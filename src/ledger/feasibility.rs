//! The exact feasibility check of DESIGN §4: can every demand be assigned to one of
//! its models within each model's room? Whole pods are indivisible (an assignment
//! search with a budget); job-level requests are divisible (a max-flow).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::cards::{Alternatives, CardName};

/// One demand on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub models: Alternatives,
    pub cards: u64,
    /// A pod's cards must all land on one model; a job-level request may split.
    pub divisible: bool,
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

/// Search budget in visited states; a few milliseconds at worst.
pub const DEFAULT_BUDGET: u64 = 200_000;

#[derive(Debug, Clone)]
struct Group {
    models: Vec<usize>,
    size: u64,
    count: u64,
}

/// Checks whether `demands` fit in `rooms` (quota minus allocated, per model; may be
/// negative after a quota cut). A model absent from `rooms` has room 0.
pub fn check(rooms: &BTreeMap<CardName, i64>, demands: &[Demand], budget: u64) -> Verdict {
    // Index the models the demands touch.
    let mut index: HashMap<&CardName, usize> = HashMap::new();
    let mut room: Vec<i64> = Vec::new();
    for d in demands {
        for m in d.models.models() {
            index.entry(m).or_insert_with(|| {
                room.push(rooms.get(m).copied().unwrap_or(0));
                room.len() - 1
            });
        }
    }
    let mut single = vec![false; room.len()];
    let mut wholes: HashMap<(Vec<usize>, u64), u64> = HashMap::new();
    let mut divisibles: HashMap<Vec<usize>, u64> = HashMap::new();
    for d in demands {
        if d.cards == 0 {
            continue;
        }
        let idx: Vec<usize> = d.models.models().iter().map(|m| index[m]).collect();
        if idx.len() == 1 {
            room[idx[0]] -= d.cards as i64;
            single[idx[0]] = true;
        } else if d.divisible || d.cards == 1 {
            // A one-card pod is as divisible as a unit of a job request.
            *divisibles.entry(idx).or_default() += d.cards;
        } else {
            *wholes.entry((idx, d.cards)).or_default() += 1;
        }
    }
    // Over quota (a quota cut) only matters where a demand is pinned to the model;
    // alternatives simply cannot use it.
    if room.iter().zip(&single).any(|(r, s)| *s && *r < 0) {
        return Verdict::Infeasible;
    }
    let room: Vec<u64> = room.into_iter().map(|r| r.max(0) as u64).collect();
    if wholes.is_empty() && divisibles.is_empty() {
        return Verdict::Feasible;
    }
    let divisibles: Vec<(Vec<usize>, u64)> = {
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
    relaxed.extend(groups.iter().map(|g| (g.models.clone(), g.size * g.count)));
    if !flow_fits(&room, &relaxed) {
        return Verdict::Infeasible;
    }
    if groups.is_empty() {
        return Verdict::Feasible;
    }
    if greedy(&room, &groups, &divisibles) {
        return Verdict::Feasible;
    }
    let mut s = Search {
        groups: &groups,
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

fn greedy(room: &[u64], groups: &[Group], divisibles: &[(Vec<usize>, u64)]) -> bool {
    let mut r = room.to_vec();
    for g in groups {
        for _ in 0..g.count {
            // Best fit: the alternative with the least room that still fits.
            let pick = g
                .models
                .iter()
                .copied()
                .filter(|m| r[*m] >= g.size)
                .min_by_key(|m| r[*m]);
            match pick {
                Some(m) => r[m] -= g.size,
                None => return false,
            }
        }
    }
    flow_fits(&r, divisibles)
}

struct Search<'a> {
    groups: &'a [Group],
    divisibles: &'a [(Vec<usize>, u64)],
    failed: HashSet<(usize, u64, usize, Vec<u64>)>,
    budget: u64,
}

impl Search<'_> {
    /// Places the remaining `left` pods of group `g`, each on a model at position >= `from`
    /// (pods of a group are interchangeable, so only non-decreasing positions are tried).
    /// `None` when the budget runs out.
    fn place(&mut self, g: usize, left: u64, from: usize, room: &mut Vec<u64>) -> Option<bool> {
        if self.budget == 0 {
            return None;
        }
        self.budget -= 1;
        if left == 0 {
            return if g + 1 == self.groups.len() {
                Some(flow_fits(room, self.divisibles))
            } else {
                let next = self.groups[g + 1].count;
                self.place(g + 1, next, 0, room)
            };
        }
        let key = (g, left, from, room.clone());
        if self.failed.contains(&key) {
            return Some(false);
        }
        let group = &self.groups[g];
        let size = group.size;
        for pos in from..group.models.len() {
            let m = group.models[pos];
            if room[m] < size {
                continue;
            }
            room[m] -= size;
            let r = self.place(g, left - 1, pos, room);
            room[m] += size;
            match r {
                Some(true) => return Some(true),
                Some(false) => {}
                None => return None,
            }
        }
        self.failed.insert(key);
        Some(false)
    }
}

/// Max-flow: can every divisible demand be split over its models within `room`?
fn flow_fits(room: &[u64], items: &[(Vec<usize>, u64)]) -> bool {
    if items.is_empty() {
        return true;
    }
    let need: u64 = items.iter().map(|(_, n)| n).sum();
    let have: u64 = room.iter().sum();
    if need > have {
        return false;
    }
    // Nodes: 0 = source, 1..=items, then models, then sink.
    let n_items = items.len();
    let n = 2 + n_items + room.len();
    let sink = n - 1;
    let mut cap = vec![vec![0u64; n]; n];
    for (i, (models, amount)) in items.iter().enumerate() {
        cap[0][1 + i] = *amount;
        for m in models {
            cap[1 + i][1 + n_items + m] = u64::MAX / 4;
        }
    }
    for (m, r) in room.iter().enumerate() {
        cap[1 + n_items + m][sink] = *r;
    }
    let mut flow = 0u64;
    loop {
        // BFS for an augmenting path (Edmonds-Karp; graphs here are tiny).
        let mut prev = vec![usize::MAX; n];
        prev[0] = 0;
        let mut queue = std::collections::VecDeque::from([0usize]);
        while let Some(u) = queue.pop_front() {
            for v in 0..n {
                if prev[v] == usize::MAX && cap[u][v] > 0 {
                    prev[v] = u;
                    queue.push_back(v);
                }
            }
        }
        if prev[sink] == usize::MAX {
            break;
        }
        let mut push = u64::MAX;
        let mut v = sink;
        while v != 0 {
            let u = prev[v];
            push = push.min(cap[u][v]);
            v = u;
        }
        let mut v = sink;
        while v != 0 {
            let u = prev[v];
            cap[u][v] -= push;
            cap[v][u] = cap[v][u].saturating_add(push);
            v = u;
        }
        flow += push;
        if flow >= need {
            return true;
        }
    }
    flow >= need
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> CardName {
        CardName::parse(s).unwrap()
    }

    fn rooms(kv: &[(&str, i64)]) -> BTreeMap<CardName, i64> {
        kv.iter().map(|(k, v)| (name(k), *v)).collect()
    }

    fn pod(models: &str, cards: u64) -> Demand {
        Demand {
            models: Alternatives::parse(models).unwrap(),
            cards,
            divisible: false,
        }
    }

    fn job(models: &str, cards: u64) -> Demand {
        Demand {
            models: Alternatives::parse(models).unwrap(),
            cards,
            divisible: true,
        }
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
    fn brute(room: &[i64], items: &[(Vec<usize>, u64)]) -> bool {
        fn go(room: &mut Vec<i64>, items: &[(Vec<usize>, u64)]) -> bool {
            let Some(((models, size), rest)) = items.split_first() else {
                return room.iter().all(|r| *r >= 0);
            };
            for &m in models {
                room[m] -= *size as i64;
                let ok = room[m] >= 0 && go(room, rest);
                room[m] += *size as i64;
                if ok {
                    return true;
                }
            }
            false
        }
        go(&mut room.to_vec(), items)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn feasibility_agrees_with_brute_force_on_small_instances(
            room in proptest::collection::vec(0i64..6, 1..5),
            raw in proptest::collection::vec((1u8..16, 1u64..4, any::<bool>()), 0..6),
        ) {
            let names: Vec<CardName> = (0..room.len()).map(|i| name(&format!("M{i}"))).collect();
            let rooms: BTreeMap<CardName, i64> = names.iter().cloned().zip(room.iter().copied()).collect();
            let mut demands = Vec::new();
            let mut brute_items = Vec::new();
            for (mask, cards, divisible) in raw {
                let idx: Vec<usize> = (0..room.len()).filter(|i| mask & (1 << i) != 0).collect();
                if idx.is_empty() { continue; }
                let models = Alternatives::from_models(idx.iter().map(|i| names[*i].clone()).collect()).unwrap();
                demands.push(Demand { models, cards, divisible });
                if divisible {
                    for _ in 0..cards { brute_items.push((idx.clone(), 1)); }
                } else {
                    brute_items.push((idx.clone(), cards));
                }
            }
            let want = brute(&room, &brute_items);
            let got = check(&rooms, &demands, DEFAULT_BUDGET);
            prop_assert_eq!(got == Verdict::Feasible, want, "{:?} {:?}", rooms, demands);
        }
    }
}
