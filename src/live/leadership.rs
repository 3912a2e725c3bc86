//! Leadership confirmed against the Lease object itself. kube-lease-manager keeps
//! saying "leader" while its renewals fail, so a partitioned replica would go on writing
//! usage and Events; the reconciler asks the Lease before each pass's writes instead.

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

/// True when `lease` names `me` as holder and its last renewal plus its duration is
/// still ahead of `now`. The renewal time is written by the holder, that is by this
/// replica's own clock, so the comparison is free of skew.
pub fn lease_is_mine(lease: &Lease, me: &str, now: jiff::Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    if spec.holder_identity.as_deref() != Some(me) {
        return false;
    }
    let (Some(renewed), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return false;
    };
    renewed.0 + jiff::SignedDuration::from_secs(i64::from(secs.max(0))) > now
}

/// Reads the Lease before writing.
#[derive(Clone)]
pub struct LeaseCheck {
    api: Api<Lease>,
    name: String,
    me: String,
}

impl LeaseCheck {
    pub fn new(client: Client, namespace: &str, name: &str, me: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            me: me.to_string(),
        }
    }

    /// Whether this replica holds the Lease now; `false` when the Lease cannot be read.
    pub async fn held(&self) -> bool {
        match self.api.get(&self.name).await {
            Ok(l) => lease_is_mine(&l, &self.me, jiff::Timestamp::now()),
            Err(e) => {
                tracing::warn!(
                    "cannot read Lease {}: {e}; not writing as leader",
                    self.name
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: jiff::Timestamp, secs: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_held_by_its_holder_until_it_expires() {
        let t = jiff::Timestamp::from_second(1_000_000).unwrap();
        let s = jiff::SignedDuration::from_secs;
        assert!(lease_is_mine(&lease("a", t, 15), "a", t + s(14)));
        assert!(!lease_is_mine(&lease("a", t, 15), "a", t + s(15)));
        assert!(!lease_is_mine(&lease("b", t, 15), "a", t));
        assert!(!lease_is_mine(&Lease::default(), "a", t));
    }
}
