//! The shell of seals ([`crate::decide::seal`]): the Queue hook writes them into the
//! ledgers a change of the tree moves charges out of, before it answers; a writer reads
//! the Queue of an old seal from the API server to learn whether its change landed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::api::{Api, DynamicObject};

use crate::cards::QueueName;
use crate::decide::review::AdmissionRequest;
use crate::decide::seal::{
    any_holding_back, in_the_way, inbound_for, note_seals, seals_for, sources_to_read, to_confirm,
};
use crate::ledger::seal::{Inbound, Seal};
use crate::ledger::LedgerRecord;
use crate::snapshot::Snapshot;

use super::charge::locked;
use super::ledgers::{LedgerApi, WriteError};

/// How long a read of a sealing Queue may take before the charge waiting on it is
/// answered "try again" (a read on a stalled connection never answers).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Compare-and-swap attempts per ledger before the Queue write is answered "try again".
const ATTEMPTS: u32 = 5;

/// Why a Queue write could not be sealed into the ledgers (it is answered "try again").
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(
        "queue {queue} is still sealed by a change of queue {by} that card-quota has not seen yet"
    )]
    Sealed { queue: QueueName, by: String },
}

/// The seals one Queue write placed in one ledger, each with the seal it replaced: what
/// [`take_back`] puts back when the write is refused after all.
#[derive(Debug, Clone)]
pub struct Placed {
    pub ledger: QueueName,
    pub seals: Vec<(QueueName, Seal, Option<Seal>)>,
}

/// Seals, in every ledger `req` (an admitted Queue write) moves charges out of, the
/// queues it moves, and in their own ledger the queues whose limits it lowers; then
/// marks the moved queues in the ledgers they move to with the version each source had
/// after its seal. `store` keeps each ledger as written; the names of those written are
/// returned, and `placed` gets every seal written (also when a later ledger fails). An
/// error says which ledger could not be written: the Queue write must then wait ("try
/// again").
pub async fn seal_ledgers(
    api: &LedgerApi,
    snapshot: &Mutex<Snapshot>,
    req: &AdmissionRequest,
    store: impl Fn(LedgerRecord),
    placed: &mut Vec<Placed>,
) -> Result<Vec<QueueName>, SealError> {
    let (plan, marks) = {
        let snap = locked(snapshot);
        let plan = seals_for(&snap, req, jiff::Timestamp::now());
        // As this replica read them, first: a change in the way is then met before any
        // seal of this one is written (the check inside each compare-and-swap is the one
        // that holds against seals written since).
        for (ledger, seals) in &plan {
            none_in_the_way(&snap, &snap.ledger(ledger).ledger, seals)?;
        }
        (plan, inbound_for(&snap, req))
    };
    let mut sealed_at: BTreeMap<QueueName, u64> = BTreeMap::new();
    let mut written = Vec::new();
    for (ledger, seals) in plan {
        // Checked against the ledger each compare-and-swap is made on: a seal of another
        // change written since this replica's read (a concurrent move into the same
        // tree) is never overwritten; this change waits for it.
        // What the stored attempt replaced (each attempt starts over).
        let replaced: Mutex<Vec<(QueueName, Seal, Option<Seal>)>> = Mutex::default();
        let stored = update(api, snapshot, &ledger, &store, |l| {
            none_in_the_way(&locked(snapshot), l, &seals)?;
            let mut r = locked(&replaced);
            r.clear();
            for (q, s) in &seals {
                r.push((q.clone(), s.clone(), l.seals().get(q.as_str()).cloned()));
                l.seal(q, s.clone());
            }
            Ok(Write::Changed)
        })
        .await?;
        placed.push(Placed {
            ledger: ledger.clone(),
            seals: replaced.into_inner().unwrap_or_else(|e| e.into_inner()),
        });
        let version = stored
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        written.push(ledger.clone());
        sealed_at.insert(ledger, version);
    }
    for (ledger, moved) in marks {
        written.push(ledger.clone());
        update(
            api,
            snapshot,
            &ledger,
            &store,
            |l| -> Result<Write, SealError> {
                for (q, from) in &moved {
                    let version = sealed_at.get(from).copied().unwrap_or(u64::MAX);
                    l.mark_inbound(
                        q,
                        Inbound {
                            from: from.to_string(),
                            version,
                        },
                    );
                }
                Ok(Write::Changed)
            },
        )
        .await?;
    }
    Ok(written)
}

/// Takes back the seals `placed` of a Queue write card-quota refused after writing them
/// (that write never lands, so nothing waits for it: without this, charges of the
/// sealed queues waited up to a minute, until a read of the Queue 60 s on showed no
/// change). A seal written since stays ([`crate::ledger::Ledger::take_back_seal`]).
/// Best effort: a ledger that cannot be written keeps the seal until it lifts by time.
pub async fn take_back(
    api: &LedgerApi,
    snapshot: &Mutex<Snapshot>,
    placed: Vec<Placed>,
    store: impl Fn(LedgerRecord),
) {
    for p in placed {
        let taken = update(api, snapshot, &p.ledger, &store, |l| {
            // Each seal here is this write's own (its time and change are unique): a
            // ledger read without one of them, however late the read, will never have
            // it again, so there is nothing to take back and nothing to write.
            let mut took = false;
            for (q, ours, before) in &p.seals {
                took |= l.take_back_seal(q, ours, before.as_ref());
            }
            Ok(if took { Write::Changed } else { Write::Nothing })
        })
        .await;
        if let Err(e) = taken {
            tracing::warn!(ledger = %p.ledger, "a refused Queue write's seals stay until they lift: {e}");
        }
    }
}

/// `Err` naming the first of `seals` that a seal of another change, still holding its
/// queue back in `ledger` here, is in the way of ([`in_the_way`]).
fn none_in_the_way(
    snap: &Snapshot,
    ledger: &crate::ledger::Ledger,
    seals: &[(QueueName, Seal)],
) -> Result<(), SealError> {
    match seals
        .iter()
        .find_map(|(q, s)| in_the_way(snap, ledger, q, s).map(|other| (q, other)))
    {
        Some((q, other)) => Err(SealError::Sealed {
            queue: q.clone(),
            by: other.by.clone(),
        }),
        None => Ok(()),
    }
}

/// Before a Queue write that moves queues into another tree is decided: the ledgers
/// they move to, as stored now, hold no seal of a limit change this replica has not
/// seen (the move is checked against those limits). Read before the decision, so the
/// decision's caches are at least as new as what this read found held back.
pub async fn moves_wait(
    api: &LedgerApi,
    snapshot: &Mutex<Snapshot>,
    req: &AdmissionRequest,
) -> Result<(), SealError> {
    let targets: Vec<QueueName> = inbound_for(&locked(snapshot), req).into_keys().collect();
    for ledger in targets {
        let fresh = api.get(&ledger).await?;
        let snap = locked(snapshot);
        if let Some(s) = any_holding_back(&snap, &fresh.ledger) {
            return Err(SealError::Sealed {
                queue: ledger,
                by: s.by.clone(),
            });
        }
    }
    Ok(())
}

/// What a change made of the ledger it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Changed,
    /// Nothing to write (only a change that can tell it from any later read says so).
    Nothing,
}

/// Changes `ledger` by `change` with compare-and-swap, read again (and changed again)
/// on a conflict; the resourceVersion it was stored at (the one read, when `change`
/// finds nothing to write). `change` may refuse the ledger it is given.
async fn update(
    api: &LedgerApi,
    snapshot: &Mutex<Snapshot>,
    ledger: &QueueName,
    store: &impl Fn(LedgerRecord),
    change: impl Fn(&mut crate::ledger::Ledger) -> Result<Write, SealError>,
) -> Result<Option<String>, SealError> {
    let mut rec = (*locked(snapshot).ledger(ledger)).clone();
    let mut attempt = 0;
    loop {
        let mut next = rec.ledger.clone();
        if change(&mut next)? == Write::Nothing {
            return Ok(rec.resource_version);
        }
        match api
            .write(ledger, rec.resource_version.as_deref(), &next.render())
            .await
        {
            Ok(stored) => {
                let version = stored.resource_version.clone();
                store(stored);
                return Ok(version);
            }
            Err(WriteError::Conflict(_)) if attempt + 1 < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                rec = api.get(ledger).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads from the API server the ledgers `ledger`'s inbound marks name, where the
/// snapshot has not read them as far as the move ([`sources_to_read`]).
pub async fn read_sources(
    api: &LedgerApi,
    snapshot: &Mutex<Snapshot>,
    ledger: &QueueName,
    store: impl Fn(LedgerRecord),
) {
    let need = {
        let snap = locked(snapshot);
        sources_to_read(&snap, &snap.ledger(ledger).ledger)
    };
    for from in need {
        match api.get(&from).await {
            Ok(rec) => store(rec),
            Err(e) => tracing::warn!(
                "reading the ledger of {from}, which queues charged in {ledger} moved from, failed: {e}"
            ),
        }
    }
}

/// Reads Queue `name` from the API server (a quorum read) into the snapshot; a failed
/// read is logged and leaves the snapshot as it was.
pub async fn read_queue(queues: &Api<DynamicObject>, snapshot: &Mutex<Snapshot>, name: &QueueName) {
    match tokio::time::timeout(READ_TIMEOUT, queues.get_opt(name.as_str())).await {
        Ok(Ok(Some(found))) => match super::caches::read_queue(&found) {
            Ok(rec) => locked(snapshot).remember_queue(rec),
            Err(e) => tracing::warn!(queue = %name, "Queue {name} as read: {e}"),
        },
        Ok(Ok(None)) => {}
        Ok(Err(e)) => tracing::warn!(queue = %name, "reading Queue {name} failed: {e}"),
        Err(_) => tracing::warn!(queue = %name, "reading Queue {name} took over {READ_TIMEOUT:?}"),
    }
}

/// Reads every Queue from the API server (a quorum read) into the snapshot: the tree a
/// move is checked against, as stored. False when the read failed.
pub async fn read_all_queues(queues: &Api<DynamicObject>, snapshot: &Mutex<Snapshot>) -> bool {
    let listed =
        tokio::time::timeout(READ_TIMEOUT, queues.list(&kube::api::ListParams::default())).await;
    match listed {
        Ok(Ok(list)) => {
            let records: Vec<_> = list
                .items
                .iter()
                .filter_map(|q| super::caches::read_queue(q).ok())
                .collect();
            let mut snap = locked(snapshot);
            for rec in records {
                snap.remember_queue(rec);
            }
            true
        }
        Ok(Err(e)) => {
            tracing::warn!("listing the Queues before a move failed: {e}");
            false
        }
        Err(_) => {
            tracing::warn!("listing the Queues before a move took over {READ_TIMEOUT:?}");
            false
        }
    }
}

/// Reads from the API server (a quorum read) the Queues of `ledger`'s seals that hold
/// its charges back on this replica, stores each in the snapshot (a Queue watch that
/// lags or stalled is brought up to the change it was sealed for), and records what it
/// found (the read that, in time, shows a change that never landed). A failed or slow
/// read is logged: the seal then keeps its queue waiting ("try again").
pub async fn confirm_seals(
    queues: &Api<DynamicObject>,
    snapshot: &Mutex<Snapshot>,
    ledger: &QueueName,
) {
    let need = {
        let mut snap = locked(snapshot);
        let now = jiff::Timestamp::now();
        note_seals(&mut snap, ledger, now);
        to_confirm(&snap, &snap.ledger(ledger).ledger, now)
    };
    for by in need {
        // The time the read was asked for: what it shows is at least that recent.
        let at = jiff::Timestamp::now();
        match tokio::time::timeout(READ_TIMEOUT, queues.get_opt(by.as_str())).await {
            Ok(Ok(found)) => {
                let version = found
                    .as_ref()
                    .and_then(|q| q.metadata.resource_version.as_deref())
                    .and_then(|v| v.parse::<u64>().ok());
                let record = found.as_ref().map(super::caches::read_queue).transpose();
                let mut snap = locked(snapshot);
                match record {
                    Ok(Some(rec)) => snap.remember_queue(rec),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(queue = %by, "Queue {by} as read: {e}"),
                }
                snap.confirm_queue(&by, version, at);
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    queue = %by,
                    "reading Queue {by}, which sealed charges in the ledger of {ledger}, failed: {e}"
                );
                locked(snapshot).queue_read_failed(&by, at);
            }
            Err(_) => {
                tracing::warn!(
                    queue = %by,
                    "reading Queue {by}, which sealed charges in the ledger of {ledger}, took over {READ_TIMEOUT:?}"
                );
                locked(snapshot).queue_read_failed(&by, at);
            }
        }
    }
}
