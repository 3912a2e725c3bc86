//! The releaser's shell: on the leader, each reconciler pass takes the plan of
//! [`crate::decide::wait::plan`] (pure, under the snapshot's lock) and removes card-quota's
//! scheduling gate from the pods it names, in order. The removal is a pod UPDATE that
//! the webhook decides as the pod's CREATE (pinned, charged, recorded before the
//! answer): the releaser decides nothing itself, so a stale plan costs a refused UPDATE,
//! never a card past the quota. Waiting pods are told why once per reason (an Event
//! on the pod, what `kubectl describe pod` shows).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use crate::cards::annotations::WAIT_GATE;
use crate::cards::ObjectKey;
use crate::decide::wait::{plan, Release, Still};
use crate::decide::{EventIntent, ObjectRef};
use crate::snapshot::Snapshot;

use super::events::EventSink;

/// The reason of a waiting pod's Event.
pub const WAITING: &str = "WaitingForCardQuota";
/// The reason of a released pod's Event.
pub const RELEASED: &str = "CardQuotaReleased";

/// What one pass of the releaser did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Gates removed (the webhook admitted the release).
    pub released: usize,
    /// Releases the webhook refused (the plan was older than the ledger): tried again
    /// on a later pass.
    pub refused: usize,
    pub events: usize,
    pub errors: usize,
    /// Pods waiting after the pass.
    pub waiting: usize,
}

/// The releaser's memory: what each waiting pod was last told.
#[derive(Default)]
pub struct Releaser {
    told: HashMap<ObjectKey, String>,
}

fn pod_ref(pod: &ObjectKey, uid: &Option<String>) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some(pod.namespace.clone()),
        name: pod.name.clone(),
        uid: uid.clone(),
    }
}

/// The patch that removes [`WAIT_GATE`] (and only it: another owner's gate stays) from
/// the pod of `uid` (a pod deleted and made again under its name is not released).
pub fn ungate_patch(uid: Option<&str>) -> serde_json::Value {
    let mut patch = json!({"spec": {"schedulingGates": [{"name": WAIT_GATE, "$patch": "delete"}]}});
    if let Some(uid) = uid {
        patch["metadata"] = json!({ "uid": uid });
    }
    patch
}

/// Removes [`WAIT_GATE`] from one pod.
pub async fn ungate(
    client: &Client,
    pod: &ObjectKey,
    uid: Option<&str>,
) -> Result<(), kube::Error> {
    Api::<Pod>::namespaced(client.clone(), &pod.namespace)
        .patch(
            &pod.name,
            &PatchParams::default(),
            &Patch::Strategic(ungate_patch(uid)),
        )
        .await
        .map(|_| ())
}

impl Releaser {
    /// One pass: releases what the plan says fits, then tells the pods that wait why.
    pub async fn pass(
        &mut self,
        client: &Client,
        snapshot: &Mutex<Snapshot>,
        events: &Arc<EventSink>,
        now: jiff::Timestamp,
    ) -> Released {
        let plan = {
            let snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
            plan(&snap, now)
        };
        let mut out = Released {
            waiting: plan.waiting.len(),
            ..Default::default()
        };
        for Release { pod, uid, queue } in &plan.releases {
            match ungate(client, pod, uid.as_deref()).await {
                Ok(()) => {
                    out.released += 1;
                    self.told.remove(pod);
                    // In the background: the next release does not wait for it.
                    events.publish_in_background(EventIntent {
                        regarding: pod_ref(pod, uid),
                        reason: RELEASED,
                        message: format!("released: queue {queue} has room for it"),
                        warning: false,
                        also: None,
                    });
                    out.events += 1;
                }
                // The webhook refused: the plan counted less than the ledger holds.
                Err(kube::Error::Api(e)) if e.code == 403 || e.code == 400 => {
                    tracing::debug!("release of pod {pod} refused: {}", e.message);
                    out.refused += 1;
                }
                // Gone, or another incarnation: the next plan sees.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!("could not release pod {pod}: {e}");
                    out.errors += 1;
                }
            }
        }
        let waiting: std::collections::HashSet<&ObjectKey> =
            plan.waiting.iter().map(|s| &s.pod).collect();
        self.told.retain(|k, _| waiting.contains(k));
        for s in &plan.waiting {
            if self.told.get(&s.pod) == Some(&s.why) {
                continue;
            }
            if self.tell(events, s).await {
                out.events += 1;
                self.told.insert(s.pod.clone(), s.why.clone());
            }
        }
        out
    }

    async fn tell(&self, events: &EventSink, s: &Still) -> bool {
        let intent = EventIntent {
            regarding: pod_ref(&s.pod, &s.uid),
            reason: WAITING,
            message: s.message(),
            warning: false,
            also: None,
        };
        match events.publish(&intent, "Wait").await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("could not tell waiting pod {} why: {e}", s.pod);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_removes_only_card_quotas_gate_of_that_incarnation() {
        assert_eq!(
            ungate_patch(Some("u1")),
            json!({"metadata": {"uid": "u1"},
                "spec": {"schedulingGates": [{"name": "volcano.sh/card-quota", "$patch": "delete"}]}})
        );
    }
}
