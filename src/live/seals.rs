//! The shell of seals ([`crate::decide::seal`]): the Queue hook writes them into the
//! ledgers a change of the tree moves charges out of, before it answers; a writer reads
//! the Queue of an old seal from the API server to learn whether its change landed.

use std::sync::Mutex;
use std::time::Duration;

use kube::api::{Api, DynamicObject};

use crate::cards::QueueName;
use crate::decide::review::AdmissionRequest;
use crate::decide::seal::{seals_for, to_confirm};
use crate::ledger::LedgerRecord;
use crate::snapshot::Snapshot;

use super::ledgers::{LedgerApi, WriteError};

/// Compare-and-swap attempts per ledger before the Queue write is answered "try again".
const ATTEMPTS: u32 = 5;

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seals, in every ledger `req` (an admitted Queue write) moves charges out of, the
/// queues it moves. `store` keeps each ledger as written. An error says which ledger
/// could not be sealed: the Queue write must then wait ("try again").
pub async fn seal_ledgers(
    api: &LedgerApi,
    snapshot: &Mutex<Snapshot>,
    req: &AdmissionRequest,
    store: impl Fn(LedgerRecord),
) -> Result<(), WriteError> {
    let plan = seals_for(&locked(snapshot), req, jiff::Timestamp::now());
    for (ledger, seals) in plan {
        let mut rec = (*locked(snapshot).ledger(&ledger)).clone();
        let mut attempt = 0;
        loop {
            let mut sealed = rec.ledger.clone();
            for (q, s) in &seals {
                sealed.seal(q, s.clone());
            }
            match api
                .write(&ledger, rec.resource_version.as_deref(), &sealed.render())
                .await
            {
                Ok(stored) => {
                    store(stored);
                    break;
                }
                Err(WriteError::Conflict(_)) if attempt + 1 < ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                    rec = api.get(&ledger).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Reads from the API server (a quorum read) the Queues of `ledger`'s seals whose
/// change may never have landed, and records what it found in the snapshot. A failed
/// read is logged: the seal then keeps its queue waiting.
pub async fn confirm_seals(
    queues: &Api<DynamicObject>,
    snapshot: &Mutex<Snapshot>,
    ledger: &QueueName,
) {
    let need = {
        let snap = locked(snapshot);
        to_confirm(&snap, &snap.ledger(ledger).ledger, jiff::Timestamp::now())
    };
    for by in need {
        // The time the read was asked for: what it shows is at least that recent.
        let at = jiff::Timestamp::now();
        match queues.get_opt(by.as_str()).await {
            Ok(found) => {
                let version = found
                    .and_then(|q| q.metadata.resource_version)
                    .and_then(|v| v.parse::<u64>().ok());
                locked(snapshot).confirm_queue(&by, version, at);
            }
            Err(e) => tracing::warn!(
                queue = %by,
                "reading Queue {by} to lift an old seal in the ledger of {ledger} failed: {e}"
            ),
        }
    }
}
