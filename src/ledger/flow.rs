//! A small max-flow (Edmonds-Karp over an adjacency matrix). The graphs here have a
//! node per distinct demand and per model, so tens of nodes at most.

use std::collections::VecDeque;

/// Capacity that never limits a path.
pub const UNLIMITED: u128 = u128::MAX / 4;

/// A flow network with residual capacities.
#[derive(Debug, Clone)]
pub struct Network {
    cap: Vec<Vec<u128>>,
    orig: Vec<Vec<u128>>,
}

impl Network {
    pub fn new(nodes: usize) -> Self {
        Self {
            cap: vec![vec![0; nodes]; nodes],
            orig: vec![vec![0; nodes]; nodes],
        }
    }

    pub fn add(&mut self, from: usize, to: usize, cap: u128) {
        self.cap[from][to] = self.cap[from][to].saturating_add(cap);
        self.orig[from][to] = self.orig[from][to].saturating_add(cap);
    }

    /// Pushes flow from `source` to `sink` along edges `usable` accepts (residual
    /// back-edges are always usable) until none is left or `limit` is reached.
    /// Returns the flow added.
    pub fn push(
        &mut self,
        source: usize,
        sink: usize,
        limit: u128,
        usable: impl Fn(usize, usize) -> bool,
    ) -> u128 {
        let n = self.cap.len();
        let mut total: u128 = 0;
        while total < limit {
            let mut prev = vec![usize::MAX; n];
            prev[source] = source;
            let mut queue = VecDeque::from([source]);
            while let Some(u) = queue.pop_front() {
                for (v, seen) in prev.iter_mut().enumerate() {
                    let back = self.orig[u][v] == 0;
                    if *seen == usize::MAX && self.cap[u][v] > 0 && (back || usable(u, v)) {
                        *seen = u;
                        queue.push_back(v);
                    }
                }
            }
            if prev[sink] == usize::MAX {
                break;
            }
            let mut amount = limit - total;
            let mut v = sink;
            while v != source {
                let u = prev[v];
                amount = amount.min(self.cap[u][v]);
                v = u;
            }
            let mut v = sink;
            while v != source {
                let u = prev[v];
                self.cap[u][v] -= amount;
                self.cap[v][u] = self.cap[v][u].saturating_add(amount);
                v = u;
            }
            total = total.saturating_add(amount);
        }
        total
    }

    /// Flow currently on the edge `from -> to`.
    pub fn flow(&self, from: usize, to: usize) -> u128 {
        self.orig[from][to].saturating_sub(self.cap[from][to])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flow_reroutes_through_back_edges() {
        // s=0, a=1, b=2, x=3, y=4, t=5; a->x, a->y, b->x; x,y -> t with 1 each.
        let mut g = Network::new(6);
        g.add(0, 1, 1);
        g.add(0, 2, 1);
        g.add(1, 3, UNLIMITED);
        g.add(1, 4, UNLIMITED);
        g.add(2, 3, UNLIMITED);
        g.add(3, 5, 1);
        g.add(4, 5, 1);
        assert_eq!(g.push(0, 5, u128::MAX, |_, _| true), 2);
        assert_eq!(g.flow(2, 3), 1);
        assert_eq!(g.flow(1, 4), 1);
    }
}
