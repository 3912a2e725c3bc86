//! The committer's locks and the one order they are taken in, kept by the types.
//!
//! A std mutex held on two worker threads in opposite orders stops the whole runtime,
//! every hook with it. So: the snapshot, then this replica's holds, then its clocks
//! (each may be taken alone); a queue's slot and stall marks alone, with nothing
//! else held. Every lock is taken with a proof of the innermost level the caller holds
//! ([`Held`]), and only a level before it in [`Before`] is accepted: taking the holds
//! while holding the clocks, or anything while holding a slot, does not compile.
//!
//! The proof of holding nothing comes only from an `.await` ([`Held::unlocked`]):
//! a future that awaits while it holds a std guard is not `Send`, which the tasks
//! that run the committer (tokio's spawn, the webhook's connections) refuse. Code that
//! cannot await is handed the proof of its caller's level.
//!
//! The order compiles:
//! ```no_run
//! use card_quota::live::charge::locks::*;
//! async fn in_order(holds: &Level<AtHolds, u32>, clocks: &Level<AtClocks, u32>) {
//!     let none = Held::unlocked().await;
//!     let h = holds.lock(&none);
//!     let c = clocks.lock(h.held());
//!     let _ = *h + *c;
//! }
//! ```
//! The holds taken while the clocks are held do not:
//! ```compile_fail,E0277
//! use card_quota::live::charge::locks::*;
//! async fn out_of_order(holds: &Level<AtHolds, u32>, clocks: &Level<AtClocks, u32>) {
//!     let none = Held::unlocked().await;
//!     let c = clocks.lock(&none);
//!     let h = holds.lock(c.held());
//!     let _ = *h + *c;
//! }
//! ```
//! Nor does anything taken while a queue's slot is held:
//! ```compile_fail,E0277
//! use card_quota::live::charge::locks::*;
//! async fn under_a_slot(slots: &Level<AtQueue, u32>, clocks: &Level<AtClocks, u32>) {
//!     let none = Held::unlocked().await;
//!     let s = slots.lock(&none);
//!     let c = clocks.lock(s.held());
//!     let _ = *s + *c;
//! }
//! ```
//! And a task that claims to hold nothing while it holds a guard cannot be spawned:
//! ```compile_fail,E0277
//! use card_quota::live::charge::locks::*;
//! fn spawn<F: std::future::Future + Send>(_: F) {}
//! fn across_an_await(holds: &'static Level<AtHolds, u32>) {
//!     spawn(async move {
//!         let none = Held::unlocked().await;
//!         let h = holds.lock(&none);
//!         let _again = Held::unlocked().await;
//!         let _ = *h;
//!     });
//! }
//! ```

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// No lock of the committer's held.
pub struct Unlocked;
/// The snapshot (shared with the watchers and the webhook).
pub struct AtSnapshot;
/// This replica's holds of headroom and their times.
pub struct AtHolds;
/// Pruning's clock and the hold clock.
pub struct AtClocks;
/// A queue's writer slot, or its stall mark.
pub struct AtQueue;

/// `Self` may be held while `L` is taken.
pub trait Before<L> {}
impl Before<AtSnapshot> for Unlocked {}
impl Before<AtHolds> for Unlocked {}
impl Before<AtHolds> for AtSnapshot {}
impl Before<AtClocks> for Unlocked {}
impl Before<AtClocks> for AtSnapshot {}
impl Before<AtClocks> for AtHolds {}
impl Before<AtQueue> for Unlocked {}

/// Proof that the innermost of the committer's locks held is of level `L`.
pub struct Held<L>(PhantomData<L>);

impl Held<Unlocked> {
    /// The proof of holding nothing, had at an await point (see the module's text; it
    /// need not yield: a future is `Send` or not by what it holds across the point).
    pub async fn unlocked() -> Held<Unlocked> {
        Held(PhantomData)
    }

    /// For tests and for the synchronous setup before any task runs.
    #[cfg(test)]
    pub fn for_test() -> Held<Unlocked> {
        Held(PhantomData)
    }
}

/// A mutex of level `L`.
pub struct Level<L, T> {
    inner: Mutex<T>,
    level: PhantomData<fn() -> L>,
}

impl<L, T: Default> Default for Level<L, T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<L, T> Level<L, T> {
    pub fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(value),
            level: PhantomData,
        }
    }

    /// Takes the lock, holding at most a lock of level `A` before it. A panic of
    /// another holder does not poison it for good: the data is plain, and each holder
    /// leaves it whole between statements.
    pub fn lock<A: Before<L>>(&self, _held: &Held<A>) -> Guard<'_, L, T> {
        Guard {
            inner: self.inner.lock().unwrap_or_else(|e| e.into_inner()),
            held: Held(PhantomData),
        }
    }
}

/// The snapshot's mutex is shared with the rest of the process: the committer takes it
/// through this, at its level.
pub fn snapshot<'a, A: Before<AtSnapshot>>(
    m: &'a Mutex<crate::snapshot::Snapshot>,
    _held: &Held<A>,
) -> Guard<'a, AtSnapshot, crate::snapshot::Snapshot> {
    Guard {
        inner: m.lock().unwrap_or_else(|e| e.into_inner()),
        held: Held(PhantomData),
    }
}

/// A lock of level `L`, held.
pub struct Guard<'a, L, T> {
    inner: MutexGuard<'a, T>,
    held: Held<L>,
}

impl<L, T> Guard<'_, L, T> {
    /// The data and the proof of this level, apart (a decision borrows the data
    /// mutably while its callbacks take inner locks with the proof).
    pub fn split(&mut self) -> (&mut T, &Held<L>) {
        (&mut self.inner, &self.held)
    }

    /// The proof of this level.
    pub fn held(&self) -> &Held<L> {
        &self.held
    }
}

impl<L, T> Deref for Guard<'_, L, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<L, T> DerefMut for Guard<'_, L, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_is_taken_after_the_ones_before_it() {
        let holds: Level<AtHolds, u32> = Level::new(1);
        let clocks: Level<AtClocks, u32> = Level::new(2);
        let none = Held::for_test();
        let mut h = holds.lock(&none);
        let c = clocks.lock(h.held());
        *h += *c;
        drop(c);
        assert_eq!(*h, 3);
        // `holds.lock(c.held())` does not compile: the module's compile_fail examples.
    }
}
