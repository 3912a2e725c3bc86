//! The reconciler's sweep of quiet queues: a ledger pruned when no batch runs for it,
//! and the ledger of a deleted queue removed once empty.

use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use crate::cards::QueueName;
use crate::decide::batch::{behind, plan};
use crate::decide::Config;
use crate::live::ledgers::WriteError;
use crate::snapshot::Snapshot;

use super::locks::{self, Held};
use super::writer::plan_fence;
use super::{CommitMetrics, Committer};

impl Committer {
    /// Prunes `queue`'s ledger when no batch is running for it (the reconciler's
    /// sweep of quiet queues). Returns the entries dropped.
    pub async fn prune(
        self: &Arc<Self>,
        queue: &QueueName,
        snapshot: &Arc<Mutex<Snapshot>>,
        cfg: &Config,
        metrics: &Arc<dyn CommitMetrics>,
    ) -> Result<usize, WriteError> {
        let none = Held::unlocked().await;
        {
            let mut slots = self.slots.lock(&none);
            let slot = slots.entry(queue.clone()).or_default();
            if slot.running {
                return Ok(0);
            }
            slot.running = true;
        }
        let out = async {
            let fenced = self.fence_for(snapshot, queue, Instant::now()).await;
            let none = Held::unlocked().await;
            let batch = {
                let mut guard = locks::snapshot(snapshot, &none);
                let (snap, at) = guard.split();
                if behind(snap, queue).is_some() {
                    return Ok(0);
                }
                let fence = fenced
                    .filter(|(_, m)| m.reached_by(&snap.progress()))
                    .map(plan_fence);
                plan(
                    snap,
                    queue,
                    &[],
                    cfg,
                    jiff::Timestamp::now(),
                    self.age_fn(at, queue),
                    fence.as_ref(),
                )
            };
            if batch.pruned == 0 {
                return Ok(0);
            }
            let rec = self
                .api
                .write(queue, batch.resource_version.as_deref(), &batch.text)
                .await?;
            self.stored(&none, queue, snapshot, rec);
            Ok(batch.pruned)
        }
        .await;
        let waiting = {
            let mut slots = self.slots.lock(&none);
            let waiting = slots.get(queue).is_some_and(|s| !s.waiting.is_empty());
            if !waiting {
                slots.remove(queue);
            }
            waiting
        };
        if waiting {
            // Requests that queued behind the sweep get the writer (still marked running).
            self.spawn_writer(queue, snapshot, cfg, metrics);
        }
        out
    }

    /// Deletes the ledger object of a queue that no longer exists, once it is empty.
    pub async fn delete_orphan(
        &self,
        queue: &QueueName,
        resource_version: &str,
    ) -> Result<(), WriteError> {
        self.api.delete(queue, resource_version).await?;
        // The queue is gone: nothing of it is kept here either.
        let none = Held::unlocked().await;
        self.behind.lock(&none).remove(queue);
        self.clocks.lock(&none).entries.retain(|q, _| q != queue);
        Ok(())
    }
}
