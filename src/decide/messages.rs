//! The texts users read in kubectl and Events: short, complete, every number.

use crate::cards::{Alternatives, Cards, QueueName};
use crate::cluster::QueueRecord;
use crate::ledger::QueueUsage;
use crate::snapshot::Snapshot;

use super::Decision;
use crate::snapshot::tree::{TreeFault, WALK_LIMIT};

/// Why a request was refused: the `reason` of the AdmissionReview status and of the
/// Event that tells the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Over quota.
    InsufficientCardQuota,
    /// A malformed annotation.
    InvalidCardQuota,
    /// The queue is not open.
    QueueClosed,
    /// Could not be decided from the cache or recorded in time.
    TryAgain,
    /// A pod whose card demand cannot be charged.
    InvalidCardDemand,
    /// A binding to a model the pod does not accept.
    CardModelNotAccepted,
    /// A change to an annotation only card-quota (or the pod's creator) writes.
    CardAnnotationImmutable,
    /// The request itself is not a valid object of its kind.
    BadRequest,
    /// A charge to a queue that has child queues (charges go to leaves).
    QueueHasChildQueues,
    /// A queue whose parents form a cycle, or a chain too long to follow.
    QueueTreeInvalid,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InsufficientCardQuota => "InsufficientCardQuota",
            Self::InvalidCardQuota => "InvalidCardQuota",
            Self::QueueClosed => "QueueClosed",
            Self::TryAgain => "TryAgain",
            Self::InvalidCardDemand => "InvalidCardDemand",
            Self::CardModelNotAccepted => "CardModelNotAccepted",
            Self::CardAnnotationImmutable => "CardAnnotationImmutable",
            Self::BadRequest => "BadRequest",
            Self::QueueHasChildQueues => "QueueHasChildQueues",
            Self::QueueTreeInvalid => "QueueTreeInvalid",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest message card-quota writes (AdmissionReview status, warnings, Events):
/// an HPA's `FailedRescale` event quotes it verbatim after its own ~150 characters, and
/// an Event's note holds 1 KB. Long enough that a refusal quoted in a warn warning keeps
/// its suggested fix (at 300 it was cut there).
pub const MESSAGE_CAP: usize = 640;

/// Keeps a message within [`MESSAGE_CAP`] characters whatever the input: first each word
/// longer than 48 characters (a hostile name or value) is cut to its ends, so the numbers
/// after it survive; then, if still too long, the tail is cut.
pub fn cap(message: String) -> String {
    if message.chars().count() <= MESSAGE_CAP {
        return message;
    }
    let shortened: String = message
        .split(' ')
        .map(|w| {
            let n = w.chars().count();
            if n <= 48 {
                w.to_string()
            } else {
                let head: String = w.chars().take(20).collect();
                let tail: String = w.chars().skip(n - 20).collect();
                format!("{head}…{tail}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    if shortened.chars().count() <= MESSAGE_CAP {
        return shortened;
    }
    let mut cut: String = shortened.chars().take(MESSAGE_CAP - 1).collect();
    cut.push('…');
    cut
}

/// A list of names for a message: the first three, then how many more.
pub fn short_list(items: &[impl AsRef<str>]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(AsRef::as_ref).collect();
    match items.len().saturating_sub(3) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

// Short names the decisions use.
pub const INSUFFICIENT: Reason = Reason::InsufficientCardQuota;
pub const INVALID: Reason = Reason::InvalidCardQuota;
pub const CLOSED: Reason = Reason::QueueClosed;
pub const RETRY: Reason = Reason::TryAgain;
pub const INVALID_DEMAND: Reason = Reason::InvalidCardDemand;
pub const NOT_ACCEPTED: Reason = Reason::CardModelNotAccepted;
pub const IMMUTABLE: Reason = Reason::CardAnnotationImmutable;
pub const BAD_REQUEST: Reason = Reason::BadRequest;
pub const NOT_LEAF: Reason = Reason::QueueHasChildQueues;
pub const BAD_TREE: Reason = Reason::QueueTreeInvalid;

/// `queue <q> has insufficient <model> quota: requested <n>, in use <u> (allocated <a>,
/// pending <p>, reserved <r>), quota <c>` (docs/decisions.md), from the usage before the request.
pub fn insufficient(
    queue: &QueueName,
    key: &Alternatives,
    requested: Cards,
    before: &QueueUsage,
) -> String {
    let r = before.competing(key);
    if let Some((p, c)) = short_cap(key, requested, before, &r) {
        let b = before
            .borrow
            .caps()
            .iter()
            .find(|(k, _)| k == p)
            .map(|(_, n)| *n)
            .unwrap_or_default();
        let quota = if b.is_zero() {
            c.quota.to_string()
        } else {
            format!("{} + borrow {b}", c.quota.saturating_sub(b))
        };
        return format!(
            "queue {queue} has insufficient {p} quota (a group cap): requested {requested}, in use {} (allocated {}, pending {}, reserved {}), quota {quota}",
            c.in_use(),
            c.allocated,
            c.pending,
            c.reserved,
        );
    }
    format!(
        "queue {queue} has insufficient {key} quota: requested {requested}, in use {} (allocated {}, pending {}, reserved {}), quota {}",
        r.in_use(),
        r.allocated,
        r.pending,
        r.reserved,
        quota_text(r.quota, key, &before.borrow)
    )
}

/// The group cap to name in a refusal of `requested` cards on `key`: of the caps over
/// its models, the one with the least room, when that room is short of the request and
/// no more than the models' own.
pub(crate) fn short_cap<'u>(
    key: &Alternatives,
    requested: Cards,
    before: &'u QueueUsage,
    models: &crate::ledger::usage::Row,
) -> Option<(&'u crate::cards::CardPattern, crate::ledger::usage::Row)> {
    let need = requested.signed_minus(Cards::ZERO);
    before
        .quota
        .caps()
        .iter()
        .filter(|(p, _)| key.models().iter().any(|m| p.matches(m)))
        .map(|(p, n)| (p, before.cap_row(p, *n)))
        .min_by_key(|(_, row)| row.free())
        .filter(|(_, row)| row.free() < need && row.free() <= models.free())
}

/// `<quota>`, or `<share> + borrow <b>` when part of `cap` is borrowed.
pub fn quota_text(cap: Cards, key: &Alternatives, borrow: &crate::cards::Quota) -> String {
    let b: Cards = key.models().iter().map(|m| borrow.get(m)).sum();
    if b.is_zero() {
        cap.to_string()
    } else {
        format!("{} + borrow {b}", cap.saturating_sub(b))
    }
}

/// A pod whose PodGroup the cache does not hold yet: asked again, it is decided.
pub fn unknown_group(pod: &crate::cards::ObjectKey, group: impl std::fmt::Display) -> Decision {
    Decision::deny(
        RETRY,
        format!(
            "pod {pod} belongs to PodGroup {}/{group}, which card-quota has not seen yet; try again",
            pod.namespace
        ),
    )
}

/// The answer for claims that cannot be read: a device no slice in the cache publishes
/// means the cache lags the node's slice (R2: "try again"); anything else is the
/// claim's own fault.
pub fn unreadable_claims(e: &crate::cards::dra::DraError) -> Decision {
    match e {
        crate::cards::dra::DraError::UnknownDevice { .. } => {
            Decision::deny(RETRY, format!("{e}; try again"))
        }
        _ => Decision::deny(INVALID_DEMAND, e.to_string()),
    }
}

/// Refuses charging requests to a queue that is Closed/Closing or whose quota is broken.
pub fn gate(snap: &Snapshot, queue: &QueueName) -> Result<(), Decision> {
    if !snap.is_flat() {
        gate_tree(snap, queue)?;
    }
    let Some(q) = snap.queue(queue) else {
        return Ok(());
    };
    if snap.quota_lifted(queue) && !q.is_closed() {
        // A `warn` queue's broken quota refuses nothing; the first decision said why.
        return Ok(());
    }
    gate_record(q)
}

/// Charges go to leaf queues, below no Closed queue, in a tree without cycles; a fault
/// refuses the charges of its own subtree only (docs/hierarchy.md).
fn gate_tree(snap: &Snapshot, queue: &QueueName) -> Result<(), Decision> {
    if snap.has_children(queue) {
        let children: Vec<&str> = snap.children_of(queue).map(QueueName::as_str).collect();
        return Err(Decision::deny(
            NOT_LEAF,
            format!(
                "queue {queue} has child queues ({}): submit card workloads to a leaf queue",
                short_list(&children)
            ),
        ));
    }
    match snap.ancestry(queue) {
        Ok(_) => Ok(()),
        Err(fault) => {
            let reason = match &fault {
                TreeFault::ClosedAncestor { .. } => CLOSED,
                TreeFault::BrokenAncestor { .. } if snap.quota_lifted(queue) => return Ok(()),
                TreeFault::BrokenAncestor { .. } => INVALID,
                TreeFault::Cycle(_) | TreeFault::TooDeep => BAD_TREE,
            };
            Err(Decision::deny(reason, fault_message(queue, &fault)))
        }
    }
}

fn gate_record(q: &QueueRecord) -> Result<(), Decision> {
    if q.is_closed() {
        return Err(Decision::deny(
            CLOSED,
            format!(
                "queue {} is {} and admits no new card requests",
                q.name,
                q.state.as_deref().unwrap_or("Closed")
            ),
        ));
    }
    if let Some(Err(e)) = &q.quota {
        return Err(Decision::deny(
            INVALID,
            format!(
                "queue {} has quota 0 for every model until its annotation is fixed: {e}",
                q.name
            ),
        ));
    }
    Ok(())
}

/// The message of a charge refused because of where its queue sits in the tree.
pub fn fault_message(queue: &QueueName, fault: &TreeFault) -> String {
    match fault {
        TreeFault::Cycle(path) => {
            let names: Vec<&str> = path.iter().map(QueueName::as_str).collect();
            format!(
                "queue {queue} is in a cycle of parents ({}): set spec.parent of one of them to a queue outside it",
                names.join(" -> ")
            )
        }
        TreeFault::TooDeep => format!(
            "queue {queue} has more than {WALK_LIMIT} ancestors: shorten its chain of spec.parent"
        ),
        TreeFault::BrokenAncestor { ancestor, error } => format!(
            "queue {queue} is under queue {ancestor}, whose card quota does not parse: fix it ({error})"
        ),
        TreeFault::ClosedAncestor { ancestor, state } => format!(
            "queue {queue} is under queue {ancestor}, which is {state} and admits no new card requests"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_stays_within_the_cap_and_keeps_its_numbers() {
        let long = "q".repeat(253);
        let m =
            format!("queue {long} has insufficient {long} quota: requested 2, in use 3, quota 4");
        let c = cap(m);
        assert!(c.chars().count() <= MESSAGE_CAP, "{}", c.len());
        assert!(c.ends_with("requested 2, in use 3, quota 4"), "{c}");
        let one_word = "x".repeat(10_000);
        assert_eq!(cap(one_word).chars().count(), 41);
        let words = "abc ".repeat(1_000);
        let c = cap(words);
        assert_eq!(c.chars().count(), MESSAGE_CAP);
        assert!(c.ends_with('…'));
        assert_eq!(cap("short".into()), "short");
    }

    #[test]
    fn lists_show_three_names_and_a_count() {
        assert_eq!(short_list(&["a", "b"]), "a, b");
        assert_eq!(short_list(&["a", "b", "c", "d", "e"]), "a, b, c and 2 more");
    }
}
