//! Knowing that this replica's pod, PodGroup and ResourceClaim caches are current, not
//! assuming it.
//!
//! A watch that delivers nothing may be quiet or stalled; no clock tells the two apart.
//! Two reads of the API server do:
//! - a *fence*: a consistent read of the three collections' resourceVersions. Caches whose
//!   progress has reached it show every write made before it was read. Charges whose
//!   clocks ran out (a dead replica's hold, an entry whose object never appeared) are
//!   dropped only behind a fence read after they expired, and the ledger's watermark
//!   rises to it, so every reader catches up before it decides without them.
//! - a *relist* with a floor: a watcher that has not come as far as a ledger's
//!   watermark and gets no events lists again from a consistent read; the list is at
//!   least as new as a resourceVersion read just before it, which becomes its progress.
//!   A stalled watch is replaced, a quiet one proven current.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use futures::future::BoxFuture;

use crate::ledger::entries::{Stream, Watermark};

/// Reads the three collections' current resourceVersions (a consistent read; a cluster
/// that serves no ResourceClaims reads `claims: 0`).
pub type Probe = Arc<dyn Fn() -> BoxFuture<'static, Result<Watermark, String>> + Send + Sync>;

/// How long a fence's read may take before it is given up (and asked for again).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A watcher is asked to relist at most this often: a relist reads every pod.
const RELIST_GAP: Duration = Duration::from_secs(10);

/// Asks one watcher to list again.
#[derive(Default)]
pub struct Relist {
    notify: tokio::sync::Notify,
    last: Mutex<Option<Instant>>,
}

impl Relist {
    /// Resolves when a relist is asked for.
    pub async fn asked(&self) {
        self.notify.notified().await;
    }
}

#[derive(Default)]
struct State {
    /// The newest fence: when its read was sent, and what it read.
    fence: Option<(Instant, Watermark)>,
    probing: bool,
}

/// Fences and relists of one replica.
pub struct Freshness {
    probe: Probe,
    /// Where a relist connects: a client of its own, so that its read and its new watch
    /// never ride a pooled connection that stalled with the old watch.
    connect: Option<kube::Config>,
    pods: Relist,
    podgroups: Relist,
    claims: Relist,
    state: Mutex<State>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Freshness {
    pub fn new(probe: Probe) -> Arc<Self> {
        Self::connecting(probe, None)
    }

    /// [`Freshness::new`], whose relists connect anew through `config`.
    pub fn connecting(probe: Probe, config: Option<kube::Config>) -> Arc<Self> {
        Arc::new(Self {
            probe,
            connect: config,
            pods: Relist::default(),
            podgroups: Relist::default(),
            claims: Relist::default(),
            state: Mutex::default(),
        })
    }

    /// A client with a pool of its own for one relist (`None`: reuse the watch's).
    pub fn new_client(&self) -> Option<kube::Client> {
        let config = self.connect.clone()?;
        kube::Client::try_from(config)
            .map_err(|e| tracing::warn!("a relist reuses the watch's connections: {e}"))
            .ok()
    }

    /// The relist requests of `stream`'s watcher.
    pub fn relists(&self, stream: Stream) -> &Relist {
        match stream {
            Stream::Pods => &self.pods,
            Stream::PodGroups => &self.podgroups,
            Stream::Claims => &self.claims,
        }
    }

    /// Asks the watchers of the streams `progress` has not brought to `mark` to list
    /// again (each at most every [`RELIST_GAP`]).
    pub fn relist_behind(&self, mark: &Watermark, progress: &Watermark) {
        for stream in Stream::ALL {
            if progress.of(stream) >= mark.of(stream) {
                continue;
            }
            let r = self.relists(stream);
            let mut last = locked(&r.last);
            if last.is_none_or(|t| t.elapsed() >= RELIST_GAP) {
                *last = Some(Instant::now());
                tracing::info!(
                    ?stream,
                    "caches behind a ledger's watermark and idle: listing again"
                );
                r.notify.notify_one();
            }
        }
    }

    /// The newest fence, when caches at `progress` have reached it: when it was read
    /// and its mark.
    pub fn fence(&self, progress: &Watermark) -> Option<(Instant, Watermark)> {
        let st = locked(&self.state);
        let (taken, mark) = st.fence?;
        if mark.reached_by(progress) {
            return Some((taken, mark));
        }
        drop(st);
        // Read and not reached: the caches lag or are quiet; a relist settles it.
        if taken.elapsed() >= Duration::from_secs(1) {
            self.relist_behind(&mark, progress);
        }
        None
    }

    /// Makes sure a fence read after `after` exists or is being read.
    pub fn want(self: &Arc<Self>, after: Instant) {
        {
            let mut st = locked(&self.state);
            if st.probing || st.fence.is_some_and(|(t, _)| t >= after) {
                return;
            }
            st.probing = true;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            let read = tokio::time::timeout(PROBE_TIMEOUT, (me.probe)())
                .await
                .unwrap_or_else(|_| Err("no answer within 5 s".to_string()));
            let mut st = locked(&me.state);
            st.probing = false;
            match read {
                Ok(mark) => {
                    if st.fence.is_none_or(|(t, _)| t < sent) {
                        st.fence = Some((sent, mark));
                    }
                }
                Err(e) => tracing::warn!("reading the current resourceVersions failed: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn counting(n: Arc<AtomicU64>) -> Probe {
        Arc::new(move || {
            let v = n.fetch_add(1, Ordering::SeqCst) + 100;
            Box::pin(async move {
                Ok(Watermark {
                    pods: v,
                    podgroups: v,
                    claims: v,
                })
            })
        })
    }

    #[tokio::test]
    async fn a_fence_counts_only_once_the_caches_reach_it_and_is_read_once_per_expiry() {
        let reads = Arc::new(AtomicU64::new(0));
        let f = Freshness::new(counting(reads.clone()));
        let before = Instant::now();
        assert!(f.fence(&Watermark::default()).is_none());
        f.want(before);
        f.want(before);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one read serves both");
        // Caches short of the fence: no fence yet.
        let short = Watermark {
            pods: 100,
            podgroups: 99,
            claims: 100,
        };
        assert!(f.fence(&short).is_none());
        let claims_short = Watermark {
            claims: 99,
            podgroups: 100,
            ..short
        };
        assert!(
            f.fence(&claims_short).is_none(),
            "the claims' stream counts too"
        );
        let there = Watermark {
            pods: 100,
            podgroups: 100,
            claims: 100,
        };
        let (taken, mark) = f.fence(&there).expect("reached");
        assert!(taken >= before);
        assert_eq!(mark, there);
        // A fence read before a later expiry does not serve it: a new read does.
        let later = Instant::now();
        f.want(later);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn only_streams_behind_are_asked_to_relist_and_not_too_often() {
        let f = Freshness::new(counting(Arc::new(AtomicU64::new(0))));
        let mark = Watermark {
            pods: 10,
            podgroups: 10,
            claims: 10,
        };
        let progress = Watermark {
            pods: 5,
            podgroups: 10,
            claims: 4,
        };
        f.relist_behind(&mark, &progress);
        tokio::time::timeout(Duration::from_millis(50), f.relists(Stream::Pods).asked())
            .await
            .expect("pods asked to relist");
        assert!(
            tokio::time::timeout(
                Duration::from_millis(50),
                f.relists(Stream::PodGroups).asked()
            )
            .await
            .is_err(),
            "PodGroups are not behind"
        );
        tokio::time::timeout(Duration::from_millis(50), f.relists(Stream::Claims).asked())
            .await
            .expect("claims asked to relist");
        f.relist_behind(&mark, &progress);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), f.relists(Stream::Pods).asked())
                .await
                .is_err(),
            "a second request within the gap is not sent"
        );
    }
}
