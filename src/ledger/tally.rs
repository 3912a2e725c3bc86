//! Usage per queue kept up to date one object change at a time, so a decision reads
//! its queue's numbers in O(models) instead of recounting the queue's pods.
//!
//! Each counted pod's share and each PodGroup's reservation is remembered, so a change
//! takes the old one back and counts the new one. Pods inside their termination grace
//! period stop counting by time alone; they are set aside and counted when a decision
//! asks (there are few of them). [`super::queue_usage`] stays the reference: a
//! periodic recount checks the tally and rebuilds it on a mismatch.

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::cards::hashing::Map;
use crate::cards::{Alternatives, Cards, ObjectKey, QueueName, Quota};
use crate::cluster::{NodeModels, PodGroupRecord, PodRecord};

use super::usage::{merge_members, reservation, Members, QueueUsage, Share};

/// How one pod is counted.
#[derive(Debug, Clone)]
enum Counted {
    /// Its share is in its queue's sums (and its group's members).
    Settled {
        queue: QueueName,
        share: Share,
        /// The PodGroup's name (in the pod's namespace).
        group: Option<String>,
    },
    /// Terminating: counted when asked, while its grace period lasts.
    Terminating { queue: QueueName },
}

/// The incremental usage of every queue.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    sums: Map<QueueName, QueueUsage>,
    pods: Map<ObjectKey, Counted>,
    /// Settled members of each PodGroup, by the queue the members are charged to.
    members: Map<(ObjectKey, QueueName), Members>,
    /// Each PodGroup's counted reservation and the queue it is counted in.
    groups: Map<ObjectKey, (QueueName, Vec<(Alternatives, Cards)>)>,
    terminating: Map<QueueName, BTreeSet<ObjectKey>>,
    /// Take-backs that found nothing to take (bookkeeping errors).
    errors: u64,
    /// Queue -> its `spec.parent`, for the subtree sums.
    parents: Map<QueueName, QueueName>,
    /// Queues some queue names as its parent.
    inner: crate::cards::hashing::Set<QueueName>,
    /// For each queue with children: the sums of its whole subtree, itself included,
    /// kept with every change so a tree decision reads a level in O(models).
    subtree: Map<QueueName, QueueUsage>,
}

fn remove_from<K: std::hash::Hash + Eq>(
    index: &mut Map<K, BTreeSet<ObjectKey>>,
    k: &K,
    key: &ObjectKey,
) {
    if let Some(s) = index.get_mut(k) {
        s.remove(key);
        if s.is_empty() {
            index.remove(k);
        }
    }
}

impl Tally {
    /// Takes something back from `queue`'s sums, counting a bookkeeping error when it
    /// was not there, and forgets a queue that holds nothing any more.
    fn take(&mut self, queue: &QueueName, f: impl Fn(&mut QueueUsage) -> bool) {
        for a in self.inner_chain(queue) {
            if let Some(u) = self.subtree.get_mut(&a) {
                f(u);
            }
        }
        let ok = match self.sums.get_mut(queue) {
            Some(u) => {
                let ok = f(u);
                if is_empty(u) {
                    self.sums.remove(queue);
                }
                ok
            }
            // Nothing counted there: fine as long as nothing is taken.
            None => f(&mut QueueUsage::default()),
        };
        self.errors += u64::from(!ok);
    }

    /// Re-counts one pod. `now_in` is the pod and its queue, or `None` when it no longer
    /// counts anywhere (deleted, or no card pod). Returns the PodGroups whose members
    /// changed: the caller passes each to [`Tally::group`].
    pub fn pod(
        &mut self,
        key: &ObjectKey,
        now_in: Option<(&QueueName, &PodRecord)>,
        nodes: &impl NodeModels,
    ) -> Vec<ObjectKey> {
        let mut touched = Vec::new();
        match self.pods.remove(key) {
            Some(Counted::Settled {
                queue,
                share,
                group,
            }) => {
                self.take(&queue, |u| u.sub_share(key, &share));
                if let Some(g) = group {
                    let mk = (ObjectKey::new(key.namespace.clone(), g), queue);
                    if let Some(m) = self.members.get_mut(&mk) {
                        self.errors += u64::from(!merge_members(m, &share, false));
                        if m.is_empty() {
                            self.members.remove(&mk);
                        }
                    }
                    touched.push(mk.0);
                }
            }
            // Terminating members are not in their group's counted reservation.
            Some(Counted::Terminating { queue }) => remove_from(&mut self.terminating, &queue, key),
            None => {}
        }
        let Some((queue, pod)) = now_in else {
            return touched;
        };
        if pod.is_terminating() {
            self.terminating
                .entry(queue.clone())
                .or_default()
                .insert(key.clone());
            self.pods.insert(
                key.clone(),
                Counted::Terminating {
                    queue: queue.clone(),
                },
            );
            return touched;
        }
        let share = if pod.is_finished() {
            Share::Nothing
        } else {
            Share::of(pod, nodes)
        };
        if share != Share::Nothing {
            self.sums
                .entry(queue.clone())
                .or_default()
                .add_share(key, &share);
            for a in self.inner_chain(queue) {
                self.subtree.entry(a).or_default().add_share(key, &share);
            }
        }
        if let Some(g) = pod.group_key() {
            if !share.members().is_empty() {
                merge_members(
                    self.members.entry((g.clone(), queue.clone())).or_default(),
                    &share,
                    true,
                );
            }
            touched.push(g);
        }
        self.pods.insert(
            key.clone(),
            Counted::Settled {
                queue: queue.clone(),
                share,
                group: pod.group.clone(),
            },
        );
        touched
    }

    /// Re-counts one PodGroup's reservation (`None`: it is gone).
    pub fn group(&mut self, key: &ObjectKey, now: Option<&PodGroupRecord>) {
        if let Some((queue, r)) = self.groups.remove(key) {
            self.take(&queue, |u| u.sub_reservation(&r));
        }
        let Some(g) = now else { return };
        let Some(req) = g.live_request() else { return };
        let none = Members::new();
        let members = self
            .members
            .get(&(key.clone(), g.queue.clone()))
            .unwrap_or(&none);
        let r = reservation(req, members);
        if r.is_empty() {
            return;
        }
        self.sums
            .entry(g.queue.clone())
            .or_default()
            .add_reservation(&r);
        for a in self.inner_chain(&g.queue) {
            self.subtree.entry(a).or_default().add_reservation(&r);
        }
        self.groups.insert(key.clone(), (g.queue.clone(), r));
    }

    /// The queue a card pod is counted in.
    pub fn queue_of(&self, key: &ObjectKey) -> Option<&QueueName> {
        match self.pods.get(key)? {
            Counted::Settled { queue, .. } | Counted::Terminating { queue } => Some(queue),
        }
    }

    /// Bookkeeping errors seen since the tally was built.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// The members `group` has in `queue` at `now`: the settled ones and the
    /// terminating ones still inside their grace period.
    pub fn members_now<'a>(
        &self,
        group: &ObjectKey,
        queue: &QueueName,
        pod: impl Fn(&ObjectKey) -> Option<&'a PodRecord>,
        nodes: &impl NodeModels,
        now: jiff::Timestamp,
    ) -> Members {
        let mut m = self
            .members
            .get(&(group.clone(), queue.clone()))
            .cloned()
            .unwrap_or_default();
        for p in self.terminating_in(queue, pod, now) {
            if p.group_key().as_ref() == Some(group) {
                merge_members(&mut m, &Share::of(p, nodes), true);
            }
        }
        m
    }

    fn terminating_in<'a, 'b>(
        &'b self,
        queue: &QueueName,
        pod: impl Fn(&ObjectKey) -> Option<&'a PodRecord> + 'b,
        now: jiff::Timestamp,
    ) -> impl Iterator<Item = &'a PodRecord> + 'b {
        self.terminating
            .get(queue)
            .into_iter()
            .flatten()
            .filter_map(pod)
            .filter(move |p| p.is_active(now))
    }

    /// The share a pod is counted with, unless it is terminating (counted when asked).
    pub fn settled_share(&self, key: &ObjectKey) -> Option<&Share> {
        match self.pods.get(key)? {
            Counted::Settled { share, .. } => Some(share),
            Counted::Terminating { .. } => None,
        }
    }

    /// The usage of `queue` at `now` under `quota`.
    pub fn usage<'a>(
        &self,
        queue: &QueueName,
        quota: Quota,
        pod: impl Fn(&ObjectKey) -> Option<&'a PodRecord> + Copy,
        group: impl Fn(&ObjectKey) -> Option<&'a PodGroupRecord>,
        nodes: &impl NodeModels,
        now: jiff::Timestamp,
    ) -> QueueUsage {
        let mut u = self.counted(queue, pod, group, nodes, now).into_owned();
        u.quota = quota;
        u
    }

    /// The usage of `queue` at `now`, its quota left empty: borrowed from the sums
    /// unless pods of the queue are terminating (then they are counted into a copy).
    pub fn counted<'a, 's>(
        &'s self,
        queue: &QueueName,
        pod: impl Fn(&ObjectKey) -> Option<&'a PodRecord> + Copy,
        group: impl Fn(&ObjectKey) -> Option<&'a PodGroupRecord>,
        nodes: &impl NodeModels,
        now: jiff::Timestamp,
    ) -> Cow<'s, QueueUsage> {
        if self.terminating_in(queue, pod, now).next().is_none() {
            return match self.sums.get(queue) {
                Some(u) => Cow::Borrowed(u),
                None => Cow::Owned(QueueUsage::default()),
            };
        }
        let mut u = self.sums.get(queue).cloned().unwrap_or_default();
        let mut regroup: BTreeSet<ObjectKey> = BTreeSet::new();
        for p in self.terminating_in(queue, pod, now) {
            u.add_share(&p.key, &Share::of(p, nodes));
            regroup.extend(p.group_key());
        }
        for g in regroup {
            let Some(rec) = group(&g).filter(|r| &r.queue == queue) else {
                continue;
            };
            let Some(req) = rec.live_request() else {
                continue;
            };
            if let Some((q, r)) = self.groups.get(&g) {
                if q == queue {
                    u.sub_reservation(r);
                }
            }
            let members = self.members_now(&g, queue, pod, nodes, now);
            u.add_reservation(&reservation(req, &members));
        }
        Cow::Owned(u)
    }

    /// Queues with anything counted.
    pub fn queues(&self) -> impl Iterator<Item = &QueueName> {
        self.sums.keys()
    }

    /// Sets the tree (queue -> parent) and recounts the subtree sums from the queues'
    /// sums: O(queues), on a change of the tree only.
    pub fn set_parents(&mut self, parents: Map<QueueName, QueueName>) {
        self.inner = parents.values().cloned().collect();
        self.parents = parents;
        self.subtree.clear();
        let inner: Vec<(QueueName, Vec<QueueName>)> = self
            .sums
            .keys()
            .map(|q| (q.clone(), self.inner_chain(q)))
            .collect();
        for (q, chain) in inner {
            let Some(u) = self.sums.get(&q) else { continue };
            for a in chain {
                self.subtree.entry(a).or_default().absorb(u);
            }
        }
    }

    /// `q` when it has children, then each of its ancestors (bounded: a cycle or a
    /// chain beyond the walk limit stops it).
    fn inner_chain(&self, q: &QueueName) -> Vec<QueueName> {
        if self.parents.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.inner.contains(q) {
            out.push(q.clone());
        }
        let mut at = self.parents.get(q);
        while let Some(p) = at {
            if out.contains(p) || out.len() > crate::cards::names::WALK_LIMIT {
                break;
            }
            out.push(p.clone());
            at = self.parents.get(p);
        }
        out
    }

    /// The usage of `x`'s whole subtree at `now` (itself included): the kept sums, with
    /// the queues below that have terminating pods counted as [`Tally::counted`] does.
    pub fn subtree_counted<'a, 's>(
        &'s self,
        x: &QueueName,
        pod: impl Fn(&ObjectKey) -> Option<&'a PodRecord> + Copy,
        group: impl Fn(&ObjectKey) -> Option<&'a PodGroupRecord> + Copy,
        nodes: &impl NodeModels,
        now: jiff::Timestamp,
    ) -> Cow<'s, QueueUsage> {
        let Some(sums) = self.subtree.get(x) else {
            return self.counted(x, pod, group, nodes, now);
        };
        let below: Vec<&QueueName> = self
            .terminating
            .keys()
            .filter(|q| *q == x || self.inner_chain(q).contains(x))
            .collect();
        if below.is_empty() {
            return Cow::Borrowed(sums);
        }
        let mut u = sums.clone();
        for q in below {
            if let Some(s) = self.sums.get(q) {
                u.remove(s);
            }
            u.absorb(&self.counted(q, pod, group, nodes, now));
        }
        Cow::Owned(u)
    }
}

/// The usage a tally and a recount both give, made comparable (quota aside).
pub fn same_usage(a: &QueueUsage, b: &QueueUsage) -> bool {
    a.allocated == b.allocated
        && a.pending == b.pending
        && a.reserved == b.reserved
        && a.waiting == b.waiting
        && a.gated == b.gated
        && a.gated_pods == b.gated_pods
        && a.problems == b.problems
}

/// True when a usage counts nothing.
pub fn is_empty(u: &QueueUsage) -> bool {
    u.allocated.is_empty()
        && u.pending.is_empty()
        && u.reserved.is_empty()
        && u.waiting.is_empty()
        && u.gated.is_empty()
        && u.problems.is_empty()
        && u.planned.is_empty()
}
