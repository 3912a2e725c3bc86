//! Pins chosen at `/mutate` whose charge this replica has not recorded yet.
//!
//! `/mutate` pins a pod to the first model with room and records nothing; `/validate`
//! charges the pinned model. Pods admitted at the same moment were all pinned to the
//! same first model, and every one but the first was then refused at `/validate` while
//! the queue had room on its other models (a burst of 20 plain GPU pods in a queue of
//! one RTX 4090 and one H200 created one pod). A replica therefore remembers the pins
//! it chose until their charge is recorded, and `/mutate` prefers a model that also
//! has room for them.
//!
//! A preference, never a decision: a pin in flight only orders the models `/mutate`
//! tries (`decide::pod::choose_pin` falls back to the choice without them); what is
//! admitted or refused, and what is charged, is as without them. None of the four rules
//! (docs/consistency.md) rests on this table, so it may forget: each pin lives
//! [`PIN_IN_FLIGHT_TTL`] at most, a queue keeps [`MAX_PER_QUEUE`], and a relist that
//! rebuilds the snapshot drops them all.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::cards::{Alternatives, Cards, ObjectKey, QueueName};
use crate::cluster::records::PodRecord;

/// How long a pin waits for its `/validate`, which usually follows `/mutate` within
/// milliseconds. A pin whose `/validate` went to another replica (a Service spreads the
/// two calls) is never settled here: it counts twice in this replica's choices (beside
/// the charge the other recorded) until then, so the time is kept short. Past it the
/// pin is forgotten and choices are as without it.
pub const PIN_IN_FLIGHT_TTL: Duration = Duration::from_secs(2);

/// Pins kept per queue; past it the oldest go (a burst that large spreads its pins
/// over the models long before).
pub const MAX_PER_QUEUE: usize = 256;

/// What names the pod of a pin at both calls: `/mutate` of a pod made from
/// `generateName` has no name yet, `/validate` has the generated one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PinOrigin {
    pub namespace: String,
    /// `metadata.generateName` when set, else `metadata.name`.
    pub name: String,
}

/// The node label (key, value) a pin adds to the pod's `nodeSelector`.
pub type PinLabel = (String, String);

/// How a pod pinned in flight counts beside a choice, read once when it is pinned: a
/// choice then costs the same beside 256 pins as beside a few.
#[derive(Debug, Clone)]
pub enum InFlight {
    /// A pending pod of no PodGroup (nearly all): one of the identical demands of its
    /// models (its pin) and cards, which a choice lays counted.
    Pending(Alternatives, Cards),
    /// Any other pod (its group's reservation, a claim allocated), laid as itself as it
    /// would be charged, under a key no real pod can have.
    Pod(Box<PodRecord>),
}

#[derive(Debug, Clone)]
struct Pin {
    origin: PinOrigin,
    label: PinLabel,
    counts: InFlight,
    at: jiff::Timestamp,
}

/// The pins in flight of one replica, by queue.
#[derive(Debug, Default, Clone)]
pub struct PinsInFlight {
    /// In the order they were made, so the oldest are at the front.
    by_queue: BTreeMap<QueueName, VecDeque<Pin>>,
    seq: u64,
}

impl PinsInFlight {
    /// Remembers that `/mutate` pinned a pod (of `origin`, counting as `counts`) with
    /// `label` in `queue` at `now`.
    pub fn add(
        &mut self,
        queue: &QueueName,
        origin: PinOrigin,
        label: PinLabel,
        mut counts: InFlight,
        now: jiff::Timestamp,
    ) {
        self.seq += 1;
        // '#' is not allowed in a pod's name: the record is never taken for a real pod.
        if let InFlight::Pod(record) = &mut counts {
            record.key = ObjectKey::new(
                origin.namespace.clone(),
                format!("{}#pin-in-flight-{}", origin.name, self.seq),
            );
        }
        // Every queue now and then (a queue no pod comes to again keeps its pins until
        // then); this one always, from the front, where the oldest are.
        if self.seq.is_multiple_of(MAX_PER_QUEUE as u64) {
            self.expire(now);
        }
        let pins = self.by_queue.entry(queue.clone()).or_default();
        while pins.front().is_some_and(|p| !live(p, now)) || pins.len() >= MAX_PER_QUEUE {
            pins.pop_front();
        }
        pins.push_back(Pin {
            origin,
            label,
            counts,
            at: now,
        });
    }

    /// `/validate` of a pod of `origin` whose `nodeSelector` is `selector` was answered
    /// (its charge is recorded, or it was refused): forgets the oldest pin of that pod.
    pub fn settle(&mut self, origin: &PinOrigin, selector: &BTreeMap<String, String>) -> bool {
        let mut found = None;
        for (queue, pins) in &self.by_queue {
            let at = pins
                .iter()
                .position(|p| &p.origin == origin && selector.get(&p.label.0) == Some(&p.label.1));
            if let Some(i) = at {
                found = Some((queue.clone(), i));
                break;
            }
        }
        let Some((queue, i)) = found else {
            return false;
        };
        if let Some(pins) = self.by_queue.get_mut(&queue) {
            pins.remove(i);
            if pins.is_empty() {
                self.by_queue.remove(&queue);
            }
        }
        true
    }

    /// The pods pinned in `queue` whose charge is not recorded yet, as of `now`.
    pub fn of(&self, queue: &QueueName, now: jiff::Timestamp) -> Vec<&InFlight> {
        self.by_queue
            .get(queue)
            .into_iter()
            .flatten()
            .filter(|p| live(p, now))
            .map(|p| &p.counts)
            .collect()
    }

    /// Forgets every pin past its time (any queue).
    pub fn expire(&mut self, now: jiff::Timestamp) {
        self.by_queue.retain(|_, pins| {
            pins.retain(|p| live(p, now));
            !pins.is_empty()
        });
    }

    pub fn len(&self) -> usize {
        self.by_queue.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_queue.is_empty()
    }
}

fn live(p: &Pin, now: jiff::Timestamp) -> bool {
    let ttl = jiff::SignedDuration::try_from(PIN_IN_FLIGHT_TTL).unwrap_or_default();
    now.duration_since(p.at) < ttl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn origin(name: &str) -> PinOrigin {
        PinOrigin {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    fn label(product: &str) -> PinLabel {
        ("nvidia.com/gpu.product".into(), product.into())
    }

    fn selector(product: &str) -> BTreeMap<String, String> {
        BTreeMap::from([label(product), ("pool".into(), "a".into())])
    }

    fn as_pod() -> InFlight {
        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        pod.metadata.name = Some("x".into());
        pod.metadata.namespace = Some("ml".into());
        let rec = crate::cluster::records::pod_record(&pod, "ml", &Default::default(), 0);
        InFlight::Pod(Box::new(rec.unwrap()))
    }

    fn key(counts: &InFlight) -> &ObjectKey {
        match counts {
            InFlight::Pod(r) => &r.key,
            InFlight::Pending(..) => panic!("a record was added"),
        }
    }

    #[test]
    fn a_pin_counts_until_its_validate_is_answered_or_its_time_is_up() {
        let q = QueueName::new("q");
        let rtx = label("RTX-4090");
        let mut pins = PinsInFlight::default();
        pins.add(&q, origin("web-"), rtx.clone(), as_pod(), at(0));
        pins.add(&q, origin("web-"), rtx.clone(), as_pod(), at(1));
        let seen = pins.of(&q, at(1));
        assert_eq!(seen.len(), 2);
        // Under keys no pod can have, one per pin.
        assert!(seen
            .iter()
            .all(|r| key(r).name.starts_with("web-#pin-in-flight-")));
        assert_ne!(key(seen[0]), key(seen[1]));
        // Another model's validate, or another pod's, settles nothing.
        let h200 = selector("NVIDIA-H200");
        assert!(!pins.settle(&origin("web-"), &h200));
        assert!(!pins.settle(&origin("db-"), &selector("RTX-4090")));
        assert!(pins.settle(&origin("web-"), &selector("RTX-4090")));
        assert_eq!(pins.of(&q, at(2)).len(), 1);
        // The other is forgotten at its time.
        let ttl = PIN_IN_FLIGHT_TTL.as_secs() as i64;
        assert_eq!(pins.of(&q, at(1 + ttl - 1)).len(), 1);
        assert!(pins.of(&q, at(1 + ttl)).is_empty());
        pins.expire(at(1 + ttl));
        assert!(pins.is_empty());
    }

    #[test]
    fn a_queue_keeps_its_latest_pins_only() {
        let q = QueueName::new("q");
        let mut pins = PinsInFlight::default();
        for i in 0..MAX_PER_QUEUE + 10 {
            pins.add(
                &q,
                origin(&format!("p{i}")),
                label("RTX-4090"),
                as_pod(),
                at(0),
            );
        }
        assert_eq!(pins.len(), MAX_PER_QUEUE);
        let rtx = selector("RTX-4090");
        assert!(!pins.settle(&origin("p0"), &rtx));
        assert!(pins.settle(&origin(&format!("p{}", MAX_PER_QUEUE + 9)), &rtx));
    }
}
