//! Which replica records a queue's charges. Replicas that record charges of one queue
//! all write its one ledger, and every write but one of each round loses its
//! compare-and-swap and is decided again. When each queue's charges go to one replica
//! (its *owner*), that replica batches them all into few writes and nothing conflicts.
//! Routing is an optimisation, never a condition of correctness: a replica that cannot
//! reach the owner records the charge itself, and compare-and-swap keeps that exact.
//!
//! Replicas find each other through Leases: each one holds a Lease labelled
//! [`PEER_LABEL`] naming itself and, in [`ADDRESS_ANNOTATION`], the address its webhook
//! answers on (Leases exist on every API server; EndpointSlice v1 does not before 1.21).

use std::net::SocketAddr;

use k8s_openapi::api::coordination::v1::Lease;

use crate::cards::QueueName;

/// Label on every replica's peer Lease (value: `"true"`).
pub const PEER_LABEL: &str = "card-quota.volcano.sh/peer";
/// Annotation on a peer Lease: `host:port` of the replica's admission webhook.
pub const ADDRESS_ANNOTATION: &str = "card-quota.volcano.sh/address";
/// Header on a review one replica forwards to another; a forwarded review is never
/// forwarded again, whatever its receiver thinks of ownership.
pub const FORWARDED_HEADER: &str = "card-quota-forwarded-by";

/// A replica that records charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The replica's identity (its pod name in a cluster).
    pub name: String,
    /// Where its webhook answers.
    pub addr: SocketAddr,
}

/// The replicas whose peer Leases are current at `now`, sorted by name. A Lease is
/// current until its renewal plus its duration plus `skew` (the renewal time is the
/// holder's clock, the comparison this replica's). A Lease without a holder, a
/// renewal, a duration or a parseable address names no peer.
pub fn live_peers<'l>(
    leases: impl IntoIterator<Item = &'l Lease>,
    now: jiff::Timestamp,
    skew: jiff::SignedDuration,
) -> Vec<Peer> {
    let mut peers: Vec<Peer> = leases
        .into_iter()
        .filter_map(|l| {
            let spec = l.spec.as_ref()?;
            let name = spec.holder_identity.clone().filter(|n| !n.is_empty())?;
            let renewed = spec.renew_time.as_ref()?.0;
            let secs = spec.lease_duration_seconds?;
            if renewed + jiff::SignedDuration::from_secs(i64::from(secs.max(0))) + skew <= now {
                return None;
            }
            let addr = l
                .metadata
                .annotations
                .as_ref()?
                .get(ADDRESS_ANNOTATION)?
                .parse()
                .ok()?;
            Some(Peer { name, addr })
        })
        .collect();
    peers.sort_by(|a, b| a.name.cmp(&b.name));
    peers.dedup_by(|a, b| a.name == b.name);
    peers
}

/// FNV-1a with a finaliser: the score must be the same on every replica, also across
/// releases (a rolling upgrade runs two), which std's hasher does not promise.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV mixes its last bytes poorly, and peers' names often differ only there:
    // MurmurHash3's finaliser spreads every input bit over the score.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The owner of `queue` among `peers`: highest random weight (rendezvous) hashing, so
/// a replica joining or leaving moves only the queues it gains or held.
pub fn owner<'p>(queue: &QueueName, peers: &'p [Peer]) -> Option<&'p Peer> {
    peers.iter().max_by(|a, b| {
        let score = |p: &Peer| fnv1a(&[queue.as_str().as_bytes(), p.name.as_bytes()]);
        score(a).cmp(&score(b)).then_with(|| b.name.cmp(&a.name))
    })
}

/// Where a replica named `me` sends a charge to `queue`: `None` when it records it
/// itself (it owns the queue, or no peer is known).
pub fn route<'p>(queue: &QueueName, peers: &'p [Peer], me: &str) -> Option<&'p Peer> {
    owner(queue, peers).filter(|p| p.name != me)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(name: &str, addr: Option<&str>, renewed: jiff::Timestamp, secs: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: addr.map(|a| [(ADDRESS_ANNOTATION.to_string(), a.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.into()),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
        }
    }

    fn peer(name: &str, port: u16) -> Peer {
        Peer {
            name: name.into(),
            addr: SocketAddr::from(([10, 0, 0, 1], port)),
        }
    }

    #[test]
    fn only_current_leases_with_an_address_name_peers() {
        let t = jiff::Timestamp::from_second(1_000_000).unwrap();
        let s = jiff::SignedDuration::from_secs;
        let leases = [
            lease("b", Some("10.0.0.2:8443"), t, 30),
            lease("a", Some("10.0.0.1:8443"), t - s(20), 30),
            lease("expired", Some("10.0.0.3:8443"), t - s(40), 30),
            lease("no-address", None, t, 30),
            lease("bad-address", Some("card-quota:8443"), t, 30),
        ];
        let names: Vec<String> = live_peers(&leases, t, s(0))
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        // Within the allowed skew an expired-looking Lease still counts.
        assert_eq!(live_peers(&leases, t, s(15)).len(), 3);
    }

    #[test]
    fn every_replica_picks_the_same_owner_whatever_order_it_lists_peers_in() {
        let peers = [peer("a", 1), peer("b", 2), peer("c", 3)];
        let mut reversed = peers.clone();
        reversed.reverse();
        for i in 0..200 {
            let q = QueueName::new(format!("q{i}"));
            assert_eq!(owner(&q, &peers), owner(&q, &reversed));
        }
    }

    #[test]
    fn queues_spread_over_replicas_and_a_leaving_one_moves_only_its_own() {
        let three = [peer("a", 1), peer("b", 2), peer("c", 3)];
        let two = [peer("a", 1), peer("c", 3)];
        let mut held = std::collections::BTreeMap::<String, usize>::new();
        for i in 0..3000 {
            let q = QueueName::new(format!("queue-{i}"));
            let o = owner(&q, &three).unwrap();
            *held.entry(o.name.clone()).or_default() += 1;
            if o.name != "b" {
                assert_eq!(
                    owner(&q, &two),
                    Some(o),
                    "queue {q} moved though its owner stayed"
                );
            }
        }
        for (name, n) in &held {
            assert!((800..1200).contains(n), "{name} owns {n} of 3000 queues");
        }
    }

    #[test]
    fn a_replica_forwards_only_what_another_owns() {
        let peers = [peer("a", 1), peer("b", 2)];
        let q = QueueName::new("q");
        let o = owner(&q, &peers).unwrap().name.clone();
        let other = if o == "a" { "b" } else { "a" };
        assert_eq!(route(&q, &peers, &o), None);
        assert_eq!(
            route(&q, &peers, other).map(|p| p.name.as_str()),
            Some(o.as_str())
        );
        assert_eq!(route(&q, &[], "a"), None);
    }
}
