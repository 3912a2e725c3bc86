//! Publishing Events (`events.k8s.io/v1`) through kube-runtime's Recorder, which folds
//! repeats into a series. Webhook refusals are also rate-limited here: a ReplicaSet
//! retrying a refused pod with backoff should not write an Event per attempt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

use crate::decide::{EventIntent, ObjectRef};

/// The same Event (object, reason, message) is sent at most once per this window.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// Where Events go.
pub struct EventSink {
    recorder: Recorder,
    recent: Mutex<HashMap<String, Instant>>,
}

fn reference(r: &ObjectRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(r.api_version.clone()),
        kind: Some(r.kind.clone()),
        namespace: r.namespace.clone(),
        name: Some(r.name.clone()),
        uid: r.uid.clone(),
        ..Default::default()
    }
}

/// True when an Event with `key` was not sent within the window (and records it).
pub fn first_in_window(
    recent: &mut HashMap<String, Instant>,
    key: String,
    now: Instant,
    window: Duration,
) -> bool {
    recent.retain(|_, t| now.duration_since(*t) < window);
    if recent.contains_key(&key) {
        return false;
    }
    recent.insert(key, now);
    true
}

impl EventSink {
    pub fn new(client: Client, instance: Option<String>) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "card-quota".into(),
                    instance,
                },
            ),
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes one Event now.
    pub async fn publish(&self, e: &EventIntent, action: &str) -> Result<(), kube::Error> {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(e.message.clone()),
            action: action.to_string(),
            secondary: None,
        };
        self.recorder.publish(&ev, &reference(&e.regarding)).await
    }

    /// Publishes a webhook decision's Event without delaying the answer; repeats
    /// within [`REPEAT_WINDOW`] are dropped.
    pub fn publish_in_background(self: &Arc<Self>, e: EventIntent) {
        let key = format!(
            "{}/{}/{}/{}|{}|{}",
            e.regarding.api_version,
            e.regarding.kind,
            e.regarding.namespace.as_deref().unwrap_or(""),
            e.regarding.name,
            e.reason,
            e.message
        );
        let fresh = {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            first_in_window(&mut recent, key, Instant::now(), REPEAT_WINDOW)
        };
        if !fresh {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(err) = me.publish(&e, "Admission").await {
                tracing::warn!(
                    "could not publish Event {} on {} {}: {err}",
                    e.reason,
                    e.regarding.kind,
                    e.regarding.name
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_repeats_only_after_its_window() {
        let mut recent = HashMap::new();
        let t0 = Instant::now();
        let w = Duration::from_secs(60);
        assert!(first_in_window(&mut recent, "a".into(), t0, w));
        assert!(!first_in_window(
            &mut recent,
            "a".into(),
            t0 + Duration::from_secs(59),
            w
        ));
        assert!(first_in_window(&mut recent, "b".into(), t0, w));
        assert!(first_in_window(
            &mut recent,
            "a".into(),
            t0 + Duration::from_secs(61),
            w
        ));
    }
}
