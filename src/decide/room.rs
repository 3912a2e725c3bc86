//! How many more cards of one model a queue would be admitted now: what the FREE
//! columns of `demo`, `replay` and `status` show. Found by the check a request meets
//! (a queue's quota less its usage can overstate it: jobs that may use several models,
//! and in a tree the levels above), so the column never promises what is refused.

use std::collections::BTreeSet;

use crate::cards::{Alternatives, CardName, Cards, QueueName};
use crate::ledger::{Demand, Verdict};
use crate::snapshot::Snapshot;

use super::fit::{fit, Change};

/// The most cards of `m` (up to `upper`) a job of `queue` asking for `m` alone would be
/// admitted with now. O(log upper) fit checks.
pub fn room(
    snap: &Snapshot,
    queue: &QueueName,
    m: &CardName,
    upper: Cards,
    now: jiff::Timestamp,
) -> Cards {
    let touched = BTreeSet::from([m.clone()]);
    let fits = |k: u128| {
        let change = Change {
            extra: vec![Demand::job(
                Alternatives::single(m.clone()),
                Cards::from_u128(k),
            )],
            ..Change::default()
        };
        fit(snap, queue, &change, &touched, now).verdict == Verdict::Feasible
    };
    // The largest k in [0, upper] that fits (fitting is monotone in k).
    let (mut lo, mut hi) = (0u128, upper.get());
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Cards::from_u128(lo)
}
