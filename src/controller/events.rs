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
    client: Client,
    instance: Option<String>,
    recent: Mutex<HashMap<String, Instant>>,
    in_flight: Arc<tokio::sync::Semaphore>,
    dropped: prometheus_client::metrics::counter::Counter,
}

/// Admission Events being published at once; more are dropped and counted.
pub const MAX_IN_FLIGHT: usize = 64;

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
                client.clone(),
                Reporter {
                    controller: "card-quota".into(),
                    instance: instance.clone(),
                },
            ),
            client,
            instance,
            recent: Mutex::new(HashMap::new()),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            dropped: prometheus_client::metrics::counter::Counter::default(),
        }
    }

    /// Counts Events dropped because [`MAX_IN_FLIGHT`] were being published.
    pub fn dropped(&self) -> &prometheus_client::metrics::counter::Counter {
        &self.dropped
    }

    /// API servers before 1.22 accept `events.k8s.io/v1` Events about cluster-scoped
    /// objects (Queues) only in kube-system; the Recorder writes them to default.
    async fn publish_in_kube_system(&self, ev: &Event, e: &EventIntent) -> Result<(), kube::Error> {
        use k8s_openapi::api::events::v1::Event as K8sEvent;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        let now = jiff::Timestamp::now();
        let event = K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference(&e.regarding)),
            metadata: ObjectMeta {
                namespace: Some("kube-system".into()),
                name: Some(format!("{}.{:x}", e.regarding.name, now.as_nanosecond())),
                ..Default::default()
            },
            reporting_controller: Some("card-quota".into()),
            reporting_instance: Some(self.instance.clone().unwrap_or_else(|| "card-quota".into())),
            type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        };
        kube::Api::<K8sEvent>::namespaced(self.client.clone(), "kube-system")
            .create(&kube::api::PostParams::default(), &event)
            .await
            .map(|_| ())
    }

    /// Publishes one Event now (its note cut to what the API server accepts).
    pub async fn publish(&self, e: &EventIntent, action: &str) -> Result<(), kube::Error> {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(note(&e.message)),
            action: action.to_string(),
            secondary: None,
        };
        match self.recorder.publish(&ev, &reference(&e.regarding)).await {
            Err(kube::Error::Api(s)) if s.code == 422 && e.regarding.namespace.is_none() => {
                self.publish_in_kube_system(&ev, e).await
            }
            other => other,
        }
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
        // A flood of refusals must not become a flood of tasks: past the cap, an Event
        // is dropped and counted (the refusal itself still reaches the client).
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.dropped.inc();
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
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

/// The API server refuses Event notes over 1 KiB; a message quoting user input is cut
/// at a character boundary rather than lost.
pub fn note(message: &str) -> String {
    const MAX: usize = 1024;
    if message.len() <= MAX {
        return message.to_string();
    }
    let mut cut = MAX - 3;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &message[..cut])
}

#[cfg(test)]
mod note_tests {
    #[test]
    fn notes_fit_in_one_kib() {
        let long = "é".repeat(2000);
        let n = super::note(&long);
        assert!(n.len() <= 1024 && n.ends_with("..."), "{}", n.len());
        assert_eq!(super::note("short"), "short");
    }
}
