//! Deciding a request against "cache ∪ ledger" and recording an admitted charge with
//! a compare-and-swap write on its Queue (DESIGN §5, the ResourceQuota plugin's
//! scheme). On conflict the Queue is read again and the request decided again: an old
//! answer is never reused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cards::QueueName;
use crate::cluster::{QueueRecord, Snapshot};
use crate::decide::messages::RETRY;
use crate::decide::review::AdmissionRequest;
use crate::decide::{decide, Config, Decision};
use crate::ledger::entries::MAX_ENTRIES;
use crate::ledger::overlay;

use super::queues::{QueueApi, WriteError};

/// What one ledger write attempt came to (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    Conflict,
    Error,
    Full,
    Timeout,
}

impl WriteOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Conflict => "conflict",
            Self::Error => "error",
            Self::Full => "full",
            Self::Timeout => "timeout",
        }
    }
}

/// A decision and, when it must be recorded, the ledger write that records it.
pub struct Prepared {
    pub decision: Decision,
    pub write: Option<PlannedWrite>,
    /// The charge was refused because the Queue's ledger is full.
    pub ledger_full: bool,
}

/// The compare-and-swap write of one charge.
pub struct PlannedWrite {
    pub queue: QueueName,
    pub resource_version: String,
    pub ledger: String,
}

fn seconds(now: jiff::Timestamp) -> i64 {
    now.as_second()
}

/// Decides `req` against the snapshot with the charged queue's ledger laid over it and,
/// when `record` is set and the decision charges, plans the ledger write. Pure: the
/// snapshot is left exactly as it was found.
pub fn prepare(
    snap: &mut Snapshot,
    req: &AdmissionRequest,
    cfg: &Config,
    now: jiff::Timestamp,
    record: bool,
) -> Prepared {
    let first = decide(req, snap, cfg, now);
    let Some(queue) = first.charge.as_ref().map(|c| c.queue.clone()) else {
        return Prepared {
            decision: first,
            write: None,
            ledger_full: false,
        };
    };
    let Some(rec) = snap.queue(&queue).cloned() else {
        return Prepared {
            decision: first,
            write: None,
            ledger_full: false,
        };
    };
    let t = seconds(now);
    let layer = overlay::apply(snap, &queue, &rec.ledger, t);
    let decision = if layer.applied() == 0 {
        first
    } else {
        decide(req, snap, cfg, now)
    };
    layer.remove(snap);
    let charge = match (&decision.charge, record && !req.is_dry_run()) {
        (Some(c), true) if decision.allowed => c.clone(),
        _ => {
            return Prepared {
                decision,
                write: None,
                ledger_full: false,
            }
        }
    };
    if charge.queue != queue {
        // The ledger laid over the cache moved the request to another queue; only a
        // fresh round can decide it consistently.
        return Prepared {
            decision: Decision::deny(
                RETRY,
                format!(
                    "queue of this request changed while it was decided ({queue} -> {}); try again",
                    charge.queue
                ),
            ),
            write: None,
            ledger_full: false,
        };
    }
    let Some(rv) = rec.resource_version.clone() else {
        return Prepared {
            decision: Decision::deny(
                RETRY,
                format!(
                    "queue {queue} has no resourceVersion in card-quota's cache yet; try again"
                ),
            ),
            write: None,
            ledger_full: false,
        };
    };
    let mut ledger = rec.ledger.clone();
    ledger.prune(t, |k, e| overlay::reflected(snap, k, e));
    ledger.record(&charge.effect, t);
    if ledger.len() > MAX_ENTRIES {
        return Prepared {
            decision: full(&queue),
            write: None,
            ledger_full: true,
        };
    }
    Prepared {
        decision,
        write: Some(PlannedWrite {
            queue,
            resource_version: rv,
            ledger: ledger.render(),
        }),
        ledger_full: false,
    }
}

fn full(queue: &QueueName) -> Decision {
    Decision::deny(
        RETRY,
        format!("queue {queue}'s ledger holds {MAX_ENTRIES} charges that caches do not show yet; try again in a few seconds"),
    )
}

fn gave_up(queue: &QueueName, budget: Duration, why: &str) -> Decision {
    Decision::deny(
        RETRY,
        format!(
            "card-quota could not record this charge on queue {queue} within {:.1}s ({why}); try again",
            budget.as_secs_f64()
        ),
    )
}

/// Stores a Queue read from the API server unless the cache already holds a newer one.
pub fn remember(snap: &mut Snapshot, rec: QueueRecord) {
    let newer = |a: &Option<String>, b: &Option<String>| match (a, b) {
        (Some(a), Some(b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(a), Ok(b)) => a > b,
            _ => false,
        },
        _ => false,
    };
    if let Some(cur) = snap.queue(&rec.name) {
        if newer(&cur.resource_version, &rec.resource_version) {
            return;
        }
    }
    snap.upsert_queue(rec);
}

/// A scheduler binds a pod moments after it is created, often before the watch has
/// delivered the pod (or a new node) to the cache. Waiting a little for them beats
/// refusing with "try again": a refused binding sends the pod into the scheduler's
/// backoff. Returns at `until` at the latest; the decision then says what is missing.
async fn await_binding_objects(snapshot: &Mutex<Snapshot>, req: &AdmissionRequest, until: Instant) {
    if crate::decide::RequestKind::of(req) != crate::decide::RequestKind::Binding
        || req.operation != "CREATE"
    {
        return;
    }
    let Some(obj) = req.object.as_ref() else {
        return;
    };
    let (key, node) = crate::decide::binding::target(req, obj);
    loop {
        {
            let snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
            let pod_known = snap.pod(&key).is_some() || snap.is_known_cardless_pod(&key);
            if pod_known && node.is_none_or(|n| snap.node(n).is_some()) {
                return;
            }
        }
        if Instant::now() >= until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One lock per Queue: a replica writes one ledger at a time per queue, so its own
/// requests never conflict with each other (only with other replicas and admins).
#[derive(Default)]
pub struct QueueLocks {
    locks: Mutex<HashMap<QueueName, Arc<tokio::sync::Mutex<()>>>>,
}

impl QueueLocks {
    fn of(&self, q: &QueueName) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() > 64 {
            // Locks no request holds or waits for (queues deleted, or idle) go.
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry(q.clone()).or_default().clone()
    }

    /// How many queues have a lock now.
    pub fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A pause before retrying after a conflict, spread so racing replicas do not collide
/// again in lockstep.
fn jitter(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let cap = 5u64 << attempt.min(4);
    Duration::from_millis(u64::from(nanos) % cap)
}

/// Decides `req` and, when it charges and `record` is set, records the charge before
/// answering, deciding again after every conflict. A charge that cannot be recorded
/// within `budget` is refused with "try again".
#[allow(clippy::too_many_arguments)]
pub async fn decide_and_record(
    snapshot: &Mutex<Snapshot>,
    cfg: &Config,
    queues: &QueueApi,
    locks: &QueueLocks,
    req: &AdmissionRequest,
    record: bool,
    budget: Duration,
    mut on_write: impl FnMut(WriteOutcome),
) -> Decision {
    let deadline = Instant::now() + budget;
    await_binding_objects(snapshot, req, Instant::now() + budget / 2).await;
    let decide_now = |snapshot: &Mutex<Snapshot>| {
        let mut snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
        prepare(&mut snap, req, cfg, jiff::Timestamp::now(), record)
    };
    let first = decide_now(snapshot);
    let Some(queue) = first.write.as_ref().map(|w| w.queue.clone()) else {
        if first.ledger_full {
            on_write(WriteOutcome::Full);
        }
        return first.decision;
    };
    // Serialize this replica's writes to the queue; decide again once it is our turn,
    // from the ledger our previous write left in the cache.
    let lock = locks.of(&queue);
    let Ok(_turn) = tokio::time::timeout_at(deadline.into(), lock.lock()).await else {
        on_write(WriteOutcome::Timeout);
        return gave_up(&queue, budget, "too many charges for this queue at once");
    };
    let mut backoff = Duration::from_millis(20);
    let mut last_error = String::from("no attempt finished");
    let mut attempt = 0u32;
    loop {
        let prepared = decide_now(snapshot);
        let Some(w) = prepared.write else {
            if prepared.ledger_full {
                on_write(WriteOutcome::Full);
            }
            return prepared.decision;
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            on_write(WriteOutcome::Timeout);
            return gave_up(&w.queue, budget, &last_error);
        }
        let written = tokio::time::timeout(
            remaining,
            queues.write_ledger(&w.queue, &w.resource_version, &w.ledger),
        )
        .await;
        match written {
            Ok(Ok(rec)) => {
                on_write(WriteOutcome::Written);
                let mut snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
                remember(&mut snap, rec);
                return prepared.decision;
            }
            Ok(Err(WriteError::Conflict(_))) => {
                on_write(WriteOutcome::Conflict);
                last_error = "the queue kept changing".into();
                attempt += 1;
                tokio::time::sleep(
                    jitter(attempt).min(deadline.saturating_duration_since(Instant::now())),
                )
                .await;
            }
            Ok(Err(WriteError::NotFound(q))) => {
                on_write(WriteOutcome::Error);
                return Decision::deny(
                    RETRY,
                    format!("queue {q} no longer exists; the request cannot be charged to it"),
                );
            }
            Ok(Err(e)) => {
                on_write(WriteOutcome::Error);
                tracing::warn!("ledger write failed: {e}");
                last_error = e.to_string();
                tokio::time::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())))
                    .await;
                backoff = (backoff * 2).min(Duration::from_millis(400));
            }
            Err(_) => {
                on_write(WriteOutcome::Timeout);
                return gave_up(&w.queue, budget, "the API server did not answer in time");
            }
        }
        // Re-read the Queue itself (not the cache) and decide again.
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, queues.get(&w.queue)).await {
            Ok(Ok(rec)) => {
                let mut snap = snapshot.lock().unwrap_or_else(|e| e.into_inner());
                remember(&mut snap, rec);
            }
            Ok(Err(e)) => {
                tracing::warn!("re-reading queue failed: {e}");
                last_error = e.to_string();
            }
            Err(_) => {
                on_write(WriteOutcome::Timeout);
                return gave_up(&w.queue, budget, "the API server did not answer in time");
            }
        }
    }
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn idle_queue_locks_are_dropped_once_there_are_many() {
        let locks = QueueLocks::default();
        let held = locks.of(&QueueName::new("busy"));
        for i in 0..200 {
            drop(locks.of(&QueueName::new(format!("q{i}"))));
        }
        assert!(locks.len() <= 66, "{}", locks.len());
        // A held lock survives pruning: the same lock is handed out again.
        assert!(Arc::ptr_eq(&held, &locks.of(&QueueName::new("busy"))));
    }
}
