//! `card-quota status --would-refuse`: what enforcement would refuse in a cluster as it
//! is today, before card-quota enforces (not installed yet, or running in `warn`). The
//! card pods and PodGroups of a dump are created again, oldest first, through the same
//! decisions as the webhook under `deny`; each that would be refused is listed, and
//! counted anyway (it exists), so that the ones after it in a full queue are listed too.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::admission::apply;
use crate::decide::enforcement::refused_by_quota;
use crate::decide::review::{parse_review, ReviewBuilder};
use crate::decide::{decide, Config, Enforcement};
use crate::ledger::UsageKey;
use crate::snapshot::load::{describe, documents, upsert, LoadError};
use crate::snapshot::Snapshot;

/// One object enforcement would refuse, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WouldRefuse {
    pub kind: String,
    /// `namespace/name`.
    pub name: String,
    /// The refusal's reason (the Event reason: `InsufficientCardQuota`, ...).
    pub reason: String,
    /// True when `warn` admits it (with a warning): a quota refuses it, not a fault
    /// of the object itself, which is refused in every mode.
    #[serde(rename = "warnAdmits")]
    pub warn_admits: bool,
    pub message: String,
}

/// A quota per queue under which nothing in the dump is refused: today's, each model
/// and group cap raised to its cards in use once every card pod and PodGroup is counted
/// (pods that accept several models and are not bound yet counted on their first), and
/// the models in use it does not name added. Never lower than today's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Suggestion {
    pub queue: String,
    /// The `volcano.sh/card.quota` to write.
    pub quota: BTreeMap<String, u128>,
    /// What the queue has today (`None`: no `card.quota`).
    pub current: Option<BTreeMap<String, u128>>,
    /// Today's quota (its models and group caps) already holds what is in use.
    pub holds: bool,
}

impl Suggestion {
    /// The annotation's value.
    pub fn annotation(&self) -> String {
        serde_json::to_string(&self.quota).unwrap_or_default()
    }
}

/// The suggestions of a snapshot in which every card pod and PodGroup is counted.
fn suggestions(snap: &Snapshot, now: jiff::Timestamp) -> Vec<Suggestion> {
    let report = crate::admission::usage_report(snap, now);
    let mut out = Vec::new();
    for (queue, rows) in report {
        // Charges go to leaves; a parent's rows sum its subtree.
        let q = crate::cards::QueueName::new(&queue);
        if snap.has_children(&q) {
            continue;
        }
        let mut used: BTreeMap<String, u128> = BTreeMap::new();
        for (k, r) in &rows {
            let n = r.in_use().get();
            if n == 0 {
                continue;
            }
            let key = match k {
                UsageKey::Model(m) => m.to_string(),
                UsageKey::Alternatives(a) => a.first().to_string(),
                UsageKey::Cap(p) => p.to_string(),
            };
            *used.entry(key).or_default() += n;
        }
        if used.is_empty() {
            continue;
        }
        let holds = rows
            .iter()
            .filter(|(k, _)| k.has_quota())
            .all(|(_, r)| r.in_use() <= r.quota);
        let current = snap
            .queue(&q)
            .and_then(|r| r.quota.as_ref())
            .and_then(|q| q.as_ref().ok())
            .map(|q| {
                q.entries()
                    .iter()
                    .map(|(m, n)| (m.to_string(), n.get()))
                    .chain(q.caps().iter().map(|(p, n)| (p.to_string(), n.get())))
                    .collect::<BTreeMap<String, u128>>()
            });
        let mut quota = current.clone().unwrap_or_default();
        for (k, n) in used {
            let q = quota.entry(k).or_default();
            *q = (*q).max(n);
        }
        out.push(Suggestion {
            holds: holds && current.is_some(),
            queue,
            quota,
            current,
        });
    }
    out
}

/// When an object was created, for the replay's order (RFC 3339 sorts as text; objects
/// without one keep their place after those with one).
fn created(v: &Value) -> &str {
    v.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .unwrap_or("~")
}

/// What the pre-flight found: what would be refused, a quota per queue that would
/// refuse nothing, and the objects that could not be read.
#[derive(Debug, Clone, Default)]
pub struct Preflight {
    pub refused: Vec<WouldRefuse>,
    pub suggestions: Vec<Suggestion>,
    pub skipped: Vec<String>,
}

/// Lists what enforcement (`deny`, whatever `cfg` and the queues say) would refuse among
/// the Pods and PodGroups of `text`, and suggests per queue a quota that would not.
pub fn preflight(
    text: &str,
    cards: &crate::cards::CardResources,
    cfg: &Config,
) -> Result<Preflight, LoadError> {
    let docs = documents(text)?;
    let kind = |v: &Value| {
        v.get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (mut charges, rest): (Vec<&Value>, Vec<&Value>) = docs
        .iter()
        .partition(|v| matches!(kind(v).as_str(), "Pod" | "PodGroup"));
    let mut snap = Snapshot::new();
    snap.set_card_resources(cards.clone());
    let mut skipped = Vec::new();
    let mut rest = rest;
    rest.sort_by_key(|v| match kind(v).as_str() {
        "Node" => 0,
        "Queue" => 1,
        _ => 2,
    });
    for v in rest {
        match upsert(&mut snap, v) {
            Ok(_) => {}
            Err(e) => skipped.push(format!("{}: {e}", describe(v))),
        }
    }
    // Oldest first; a PodGroup before the pods created with it.
    charges.sort_by(|a, b| {
        created(a)
            .cmp(created(b))
            .then_with(|| (kind(a) == "Pod").cmp(&(kind(b) == "Pod")))
    });
    let deny = Config {
        enforcement: Enforcement::Deny,
        namespace_enforcement: Default::default(),
        ..cfg.clone()
    };
    // A queue's own `warn` is what this lists past: decide as `deny` everywhere.
    for q in snap.queues().cloned().collect::<Vec<_>>() {
        if q.enforcement.is_ok() {
            let mut strict = q;
            strict.enforcement = Ok(Some(Enforcement::Deny));
            snap.upsert_queue(strict);
        }
    }
    let now = jiff::Timestamp::now();
    let mut refused = Vec::new();
    for v in charges {
        let k = kind(v);
        let builder = if k == "Pod" {
            ReviewBuilder::pod("CREATE", v.clone())
        } else {
            ReviewBuilder::podgroup("CREATE", v.clone())
        };
        let req = match parse_review(&builder.build()) {
            Ok(r) => r,
            Err(e) => {
                skipped.push(format!("{}: {e}", describe(v)));
                continue;
            }
        };
        let d = decide(&req, &snap, &deny, now);
        if d.allowed {
            if let Err(e) = apply(&mut snap, &req, &d) {
                skipped.push(format!("{}: {e}", describe(v)));
            }
            continue;
        }
        refused.push(WouldRefuse {
            kind: k,
            reason: d.reason.map(|r| r.as_str().to_string()).unwrap_or_default(),
            warn_admits: refused_by_quota(&req, &d),
            name: format!(
                "{}/{}",
                req.ns(),
                v.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            ),
            message: d.message.unwrap_or_default(),
        });
        // It exists: it counts, as it will once card-quota enforces.
        if let Err(e) = upsert(&mut snap, v) {
            skipped.push(format!("{}: {e}", describe(v)));
        }
    }
    Ok(Preflight {
        refused,
        suggestions: suggestions(&snap, now),
        skipped,
    })
}

/// [`preflight`]'s refusals and unreadable objects alone.
pub fn would_refuse(
    text: &str,
    cards: &crate::cards::CardResources,
    cfg: &Config,
) -> Result<(Vec<WouldRefuse>, Vec<String>), LoadError> {
    preflight(text, cards, cfg).map(|p| (p.refused, p.skipped))
}

/// The suggestions as lines to run: only queues whose quota does not hold their usage.
pub fn suggestions_table(s: &[Suggestion]) -> String {
    let short: Vec<&Suggestion> = s.iter().filter(|s| !s.holds).collect();
    if short.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nQuotas under which nothing above is refused (today's, each model and group cap raised to its cards in use; a pod that accepts several models counted on its first):\n",
    );
    for s in short {
        let now = match &s.current {
            Some(c) => format!("now {}", serde_json::to_string(c).unwrap_or_default()),
            None => "no card.quota now".to_string(),
        };
        out.push_str(&format!(
            "  kubectl annotate queue {} volcano.sh/card.quota='{}' --overwrite   # {now}\n",
            s.queue,
            s.annotation()
        ));
    }
    out
}

/// The list as a table, or a sentence when nothing would be refused.
pub fn table(refused: &[WouldRefuse]) -> String {
    if refused.is_empty() {
        return "Nothing would be refused: every card pod and PodGroup fits its queue's quota\n"
            .into();
    }
    let width = |field: fn(&WouldRefuse) -> &str, header: &str| {
        refused
            .iter()
            .map(|r| field(r).len())
            .fold(header.len(), usize::max)
    };
    let w0 = width(|r| &r.kind, "KIND");
    let w1 = width(|r| &r.name, "NAME");
    let w2 = width(|r| &r.reason, "REASON");
    let mut s = format!(
        "{:w0$}  {:w1$}  {:w2$}  {:4}  WOULD BE REFUSED WITH\n",
        "KIND", "NAME", "REASON", "WARN"
    );
    for r in refused {
        let warn = if r.warn_admits { "adm." } else { "ref." };
        s.push_str(&format!(
            "{:w0$}  {:w1$}  {:w2$}  {warn:4}  {}\n",
            r.kind, r.name, r.reason, r.message
        ));
    }
    s.push_str(
        "WARN: what warn does with it (adm.: admits it with a warning; ref.: refuses it too)\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {nvidia.com/gpu.product: NVIDIA-H200}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":2}', volcano.sh/card.enforcement: warn}}
---
apiVersion: v1
kind: Pod
metadata: {name: late, namespace: ml, creationTimestamp: "2026-11-02T00:00:00Z",
  annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: NVIDIA-H200}}
spec: {schedulerName: volcano, containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: early, namespace: ml, creationTimestamp: "2026-11-01T00:00:00Z",
  annotations: {scheduling.volcano.sh/queue-name: q, volcano.sh/card.name: NVIDIA-H200}}
spec: {schedulerName: volcano, nodeName: n1, containers: [{name: c, resources: {limits: {nvidia.com/gpu: "2"}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: ml, creationTimestamp: "2026-11-03T00:00:00Z"}
spec: {containers: [{name: c}]}
"#;

    #[test]
    fn the_pod_that_came_last_into_a_full_queue_is_listed_even_under_warn() {
        let (refused, skipped) =
            would_refuse(DUMP, &Default::default(), &Config::default()).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(
            refused,
            vec![WouldRefuse {
                kind: "Pod".into(),
                name: "ml/late".into(),
                reason: "InsufficientCardQuota".into(),
                warn_admits: true,
                message: "queue q has insufficient NVIDIA-H200 quota: requested 1, in use 2 (allocated 2, pending 0, reserved 0), quota 2".into(),
            }]
        );
        assert!(table(&refused)
            .starts_with("KIND  NAME     REASON                 WARN  WOULD BE REFUSED WITH\nPod   ml/late  InsufficientCardQuota  adm.  queue q has"));
        let fits = DUMP.replace(r#"'{"NVIDIA-H200":2}'"#, r#"'{"NVIDIA-H200":3}'"#);
        let (refused, _) = would_refuse(&fits, &Default::default(), &Config::default()).unwrap();
        assert!(refused.is_empty());
        assert!(table(&refused).starts_with("Nothing would be refused"));
    }

    #[test]
    fn a_quota_that_refuses_nothing_is_suggested_per_queue() {
        let p = preflight(DUMP, &Default::default(), &Config::default()).unwrap();
        assert_eq!(
            p.suggestions,
            vec![Suggestion {
                queue: "q".into(),
                quota: BTreeMap::from([("NVIDIA-H200".to_string(), 3)]),
                current: Some(BTreeMap::from([("NVIDIA-H200".to_string(), 2)])),
                holds: false,
            }]
        );
        assert!(suggestions_table(&p.suggestions).contains(
            r#"  kubectl annotate queue q volcano.sh/card.quota='{"NVIDIA-H200":3}' --overwrite   # now {"NVIDIA-H200":2}"#
        ));
        // A quota that holds it: nothing to suggest.
        let fits = DUMP.replace(r#"'{"NVIDIA-H200":2}'"#, r#"'{"NVIDIA-H200":3}'"#);
        let p = preflight(&fits, &Default::default(), &Config::default()).unwrap();
        assert!(p.suggestions.iter().all(|s| s.holds));
        assert_eq!(suggestions_table(&p.suggestions), "");
        // A group cap below the usage does not hold it either.
        let capped = DUMP.replace(r#"'{"NVIDIA-H200":2}'"#, r#"'{"NVIDIA-H200":3,"*":2}'"#);
        let p = preflight(&capped, &Default::default(), &Config::default()).unwrap();
        assert!(!p.suggestions[0].holds);
    }
}
