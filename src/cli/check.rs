//! `card-quota check`: would the objects of a manifest be admitted now, on which models,
//! and if not, what do they wait for? Each object goes through the webhook's own
//! decisions against a copy of the cluster (live, or a snapshot file), in the order of
//! the manifest, the way its controller would create its pods: a Deployment's replicas
//! one by one, a Volcano Job's PodGroup, its enqueue, then its pods. Nothing is written.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::admission::{apply, review};
use crate::cards::annotations::{GROUP_NAME, PINNED, QUEUE_NAME};
use crate::decide::review::ReviewBuilder as R;
use crate::decide::Config;
use crate::snapshot::load::{documents, upsert, LoadError};
use crate::snapshot::Snapshot;

/// What would happen to one object of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// `Deployment`, `Job.batch.volcano.sh`, `Pod`, ...
    pub kind: String,
    /// `namespace/name`.
    pub name: String,
    pub outcome: Outcome,
    /// Card pods the object would create now, and how many of them would be admitted.
    pub pods: u64,
    pub admitted: u64,
    /// Admitted pods per model they would be pinned to (`unpinned`: no pin, as under
    /// warn).
    pub models: BTreeMap<String, u64>,
    /// The first refusal (or hold, or warning), word for word.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// Every card pod would be admitted (a Job: enqueued, and its pods admitted).
    Admitted,
    /// Some of its pods would be admitted, the rest refused.
    Partly,
    Refused,
    /// A Volcano Job held at its enqueue: it waits, it is not refused.
    Waits,
    /// No card demand: card-quota lets it through untouched.
    NoCards,
    /// A kind card-quota does not decide.
    NotChecked,
}

impl Outcome {
    /// True when the object would not run whole now.
    pub fn holds_back(self) -> bool {
        matches!(self, Self::Partly | Self::Refused | Self::Waits)
    }
}

/// The most pods one object may stand for (a Deployment of 10^6 replicas is checked up
/// to here, and says so).
pub const MAX_PODS: u64 = 1000;

/// Checks the objects of `manifest` against `snap` (which ends holding what they
/// would have created). Objects without a namespace go into `namespace`.
pub fn check(
    snap: &mut Snapshot,
    manifest: &str,
    namespace: &str,
    cfg: &Config,
    now: jiff::Timestamp,
) -> Result<Vec<Verdict>, LoadError> {
    let mut out = Vec::new();
    for (i, mut obj) in documents(manifest)?.into_iter().enumerate() {
        if obj.pointer("/metadata/namespace").is_none() && obj.get("metadata").is_some() {
            obj["metadata"]["namespace"] = json!(namespace);
        }
        let mut c = Checker {
            snap,
            cfg,
            now,
            index: i,
        };
        out.push(c.object(&obj));
    }
    Ok(out)
}

struct Checker<'a> {
    snap: &'a mut Snapshot,
    cfg: &'a Config,
    now: jiff::Timestamp,
    index: usize,
}

fn str_at<'v>(v: &'v Value, p: &str) -> Option<&'v str> {
    v.pointer(p).and_then(Value::as_str)
}

/// The model a pod was admitted on: its pin (`card.pinned: "M: why"`), else its only
/// model, else `unpinned`.
fn model_of(pod: &Value) -> String {
    let ann = |k: &str| {
        pod.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    if let Some(p) = ann(PINNED) {
        return p.split(':').next().unwrap_or(p).trim().to_string();
    }
    match ann(crate::cards::annotations::CARD_NAME) {
        Some(n) if !n.contains('|') => n.to_string(),
        _ => "unpinned".to_string(),
    }
}

impl Checker<'_> {
    /// One request through the mutating call; admitted, its patched object is stored.
    /// `Ok((object as admitted, its first warning, whether it charges a queue))`, or
    /// `Err(message)`.
    fn send(&mut self, doc: Value) -> Result<(Value, Option<String>, bool), String> {
        let r = review(&doc, self.snap, self.cfg, self.now, true);
        let resp = &r.out.response;
        if !resp.allowed {
            return Err(resp
                .status
                .as_ref()
                .map(|s| s.message.clone())
                .unwrap_or_default());
        }
        let mut obj = doc["request"]["object"].clone();
        let charged = r.decision.as_ref().is_some_and(|d| d.charge.is_some());
        if let (Some(req), Some(d)) = (&r.request, &r.decision) {
            if json_patch::patch(&mut obj, &d.patch).is_err() {
                return Err("card-quota's own patch does not apply".to_string());
            }
            if let Err(e) = apply(self.snap, req, d) {
                return Err(e.to_string());
            }
        }
        Ok((obj, resp.warnings.first().cloned(), charged))
    }

    fn object(&mut self, obj: &Value) -> Verdict {
        let kind = str_at(obj, "/kind").unwrap_or("").to_string();
        let api = str_at(obj, "/apiVersion").unwrap_or("");
        let name = format!(
            "{}/{}",
            str_at(obj, "/metadata/namespace").unwrap_or(""),
            str_at(obj, "/metadata/name").unwrap_or("")
        );
        let verdict = |kind: &str, outcome| Verdict {
            kind: kind.to_string(),
            name: name.clone(),
            outcome,
            pods: 0,
            admitted: 0,
            models: BTreeMap::new(),
            message: None,
        };
        let replicas =
            |p: &str, default: u64| obj.pointer(p).and_then(Value::as_u64).unwrap_or(default);
        match (api, kind.as_str()) {
            ("v1", "Pod") => {
                let mut v = verdict("Pod", Outcome::NoCards);
                self.pods(&mut v, vec![obj.clone()]);
                v
            }
            ("apps/v1", "Deployment" | "ReplicaSet" | "StatefulSet") => {
                let mut v = verdict(&kind, Outcome::NoCards);
                let n = replicas("/spec/replicas", 1);
                let pods = self.template_pods(obj, "/spec/template", n, &mut v, &[]);
                self.pods(&mut v, pods);
                v
            }
            ("batch/v1", "Job") => {
                let mut v = verdict("Job", Outcome::NoCards);
                let n =
                    replicas("/spec/parallelism", 1).min(replicas("/spec/completions", u64::MAX));
                let pods = self.template_pods(obj, "/spec/template", n, &mut v, &[]);
                self.pods(&mut v, pods);
                v
            }
            (a, "Job") if a.starts_with("batch.volcano.sh/") => {
                let mut v = verdict("Job.batch.volcano.sh", Outcome::NoCards);
                self.volcano_job(obj, &mut v);
                v
            }
            _ => {
                let mut v = verdict(&kind, Outcome::NotChecked);
                v.message = Some(format!(
                    "{} {kind} is not a workload card-quota decides (Pod, Deployment, ReplicaSet, StatefulSet, batch/v1 Job, Volcano Job)",
                    if api.is_empty() { "(no apiVersion)" } else { api }
                ));
                v
            }
        }
    }

    /// `n` pods from the template at `at` (capped at [`MAX_PODS`], said in `v`), named
    /// `<name>-<i>`, with `extra` annotations.
    fn template_pods(
        &self,
        obj: &Value,
        at: &str,
        n: u64,
        v: &mut Verdict,
        extra: &[(&str, &str)],
    ) -> Vec<Value> {
        let name = str_at(obj, "/metadata/name").unwrap_or("x");
        let ns = str_at(obj, "/metadata/namespace").unwrap_or("default");
        let t = obj.pointer(at).cloned().unwrap_or(Value::Null);
        if n > MAX_PODS {
            v.message = Some(format!("checked the first {MAX_PODS} of {n} pods"));
        }
        (0..n.min(MAX_PODS))
            .map(|i| {
                let mut meta = t.get("metadata").cloned().unwrap_or_else(|| json!({}));
                meta["name"] = json!(format!("{name}-{i}"));
                meta["namespace"] = json!(ns);
                for (k, val) in extra {
                    meta["annotations"][*k] = json!(val);
                }
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                    "spec": t.get("spec").cloned().unwrap_or_else(|| json!({}))})
            })
            .collect()
    }

    /// Each pod's CREATE in turn; tallied into `v` (a pod that charges no queue has no
    /// cards). The first refusal is the message, else the first warning.
    fn pods(&mut self, v: &mut Verdict, pods: Vec<Value>) {
        let (mut refusal, mut warning) = (None, None);
        for p in pods {
            match self.send(R::pod("CREATE", p).build()) {
                Ok((admitted, w, true)) => {
                    v.pods += 1;
                    v.admitted += 1;
                    *v.models.entry(model_of(&admitted)).or_default() += 1;
                    warning = warning.or(w);
                }
                Ok((_, _, false)) => {}
                Err(m) => {
                    v.pods += 1;
                    refusal = refusal.or(Some(m));
                }
            }
        }
        if let Some(m) = refusal.or(warning) {
            v.message = Some(match v.message.take() {
                Some(capped) => format!("{capped}; {m}"),
                None => m,
            });
        }
        v.outcome = match (v.pods, v.admitted) {
            (0, _) => Outcome::NoCards,
            (p, a) if a == p => Outcome::Admitted,
            (_, 0) => Outcome::Refused,
            _ => Outcome::Partly,
        };
    }

    /// Volcano's part: the Job stored, its PodGroup created as the job controller does
    /// (`<job>-<uid>`, the Job's annotations), enqueued as vc-scheduler does, then every
    /// task's pods in the group.
    fn volcano_job(&mut self, job: &Value, v: &mut Verdict) {
        let mut job = job.clone();
        let name = str_at(&job, "/metadata/name").unwrap_or("x").to_string();
        let ns = str_at(&job, "/metadata/namespace")
            .unwrap_or("default")
            .to_string();
        if job.pointer("/metadata/uid").is_none() {
            job["metadata"]["uid"] = json!(format!("check-{}", self.index));
        }
        let uid = str_at(&job, "/metadata/uid").unwrap_or("").to_string();
        if let Err(e) = upsert(self.snap, &job) {
            v.outcome = Outcome::Refused;
            v.message = Some(e.to_string());
            return;
        }
        let queue = str_at(&job, "/spec/queue")
            .filter(|q| !q.is_empty())
            .unwrap_or("default")
            .to_string();
        let group = format!("{name}-{uid}");
        let mut pg = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": group, "namespace": ns,
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                    "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"queue": queue, "minMember": job.pointer("/spec/minAvailable").cloned().unwrap_or(json!(1))},
            "status": {}});
        if let Some(a) = job.pointer("/metadata/annotations") {
            pg["metadata"]["annotations"] = a.clone();
        }
        let created = match self.send(R::podgroup("CREATE", pg).build()) {
            Ok((o, _, _)) => o,
            Err(m) => {
                v.outcome = Outcome::Refused;
                v.message = Some(m);
                return;
            }
        };
        let mut enqueued = created.clone();
        enqueued["status"] = json!({"phase": "Inqueue"});
        if let Err(m) = self.send(R::podgroup("UPDATE", enqueued).old(created).build()) {
            v.outcome = Outcome::Waits;
            v.message = Some(m);
            return;
        }
        let tasks = job
            .pointer("/spec/tasks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut pods = Vec::new();
        for (i, t) in tasks.iter().enumerate() {
            let task = str_at(t, "/name").unwrap_or("task").to_string();
            let n = t.pointer("/replicas").and_then(Value::as_u64).unwrap_or(1);
            let mut named = job.clone();
            named["metadata"]["name"] = json!(format!("{name}-{task}"));
            let at = format!("/spec/tasks/{i}/template");
            pods.extend(self.template_pods(
                &named,
                &at,
                n,
                v,
                &[
                    (GROUP_NAME, &group),
                    (QUEUE_NAME, &queue),
                    ("volcano.sh/task-spec", &task),
                ],
            ));
        }
        self.pods(v, pods);
    }
}

/// The verdicts as a table: one line per object, then why, indented under it.
pub fn table(verdicts: &[Verdict]) -> String {
    let mut rows = vec![[
        "KIND".to_string(),
        "NAME".into(),
        "OUTCOME".into(),
        "ADMITTED".into(),
        "MODELS".into(),
    ]];
    for v in verdicts {
        let models: Vec<String> = v.models.iter().map(|(m, n)| format!("{m}:{n}")).collect();
        rows.push([
            v.kind.clone(),
            v.name.clone(),
            serde_json::to_value(v.outcome)
                .ok()
                .and_then(|o| o.as_str().map(str::to_string))
                .unwrap_or_default(),
            format!("{}/{}", v.admitted, v.pods),
            if models.is_empty() {
                "-".to_string()
            } else {
                models.join(",")
            },
        ]);
    }
    // The padded rows, each object's message indented under its own.
    let mut out = String::new();
    for (i, line) in crate::admission::padded(&rows).lines().enumerate() {
        out.push_str(line);
        out.push('\n');
        if let Some(m) = i.checked_sub(1).and_then(|j| verdicts[j].message.as_ref()) {
            out.push_str(&format!("  {m}\n"));
        }
    }
    out
}
