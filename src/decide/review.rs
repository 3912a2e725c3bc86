//! AdmissionReview v1 in and out, as the API server sends and expects them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `group/version/kind` or `group/version/resource` of a request.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Gvk {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default, alias = "resource")]
    pub kind: String,
}

/// An object of a review, kept as the JSON text the API server sent. A decision reads
/// it typed straight from that text, or as a JSON tree, built once, when it asks for
/// one: a pod's admission never builds the tree.
#[derive(Debug, Clone)]
pub struct Object {
    raw: Box<serde_json::value::RawValue>,
    tree: std::sync::OnceLock<Value>,
}

impl Object {
    /// An object from a tree (tests, builders, documents already parsed).
    pub fn new(tree: Value) -> Self {
        let raw = serde_json::value::to_raw_value(&tree)
            .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned());
        Self {
            raw,
            tree: tree.into(),
        }
    }

    /// The object as a JSON tree.
    pub fn tree(&self) -> &Value {
        // The text is JSON the parser already checked, so this cannot fail.
        self.tree
            .get_or_init(|| serde_json::from_str(self.raw.get()).unwrap_or(Value::Null))
    }

    /// True once the tree was built (a pod's admission never builds it).
    #[cfg(test)]
    pub(crate) fn tree_built(&self) -> bool {
        self.tree.get().is_some()
    }

    /// The object read as `T`. Errors read the same as reading the tree would: the
    /// text is read again through the tree to say what is wrong.
    pub fn typed<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        if let Some(tree) = self.tree.get() {
            return T::deserialize(tree);
        }
        serde_json::from_str(self.raw.get()).or_else(|_| T::deserialize(self.tree()))
    }

    /// The object read by `read`, a reader that keeps only the parts a decision needs
    /// (such as [`crate::cluster::pod_parts::read_pod`]). Text `read` refuses is read
    /// whole as `W` (the whole type, such as `Pod`) through the tree, so errors read as
    /// [`Object::typed`]'s.
    pub fn read_with<T, W: serde::de::DeserializeOwned + Into<T>>(
        &self,
        read: impl FnOnce(&str) -> Result<T, serde_json::Error>,
    ) -> Result<T, serde_json::Error> {
        read(self.raw.get()).or_else(|_| W::deserialize(self.tree()).map(Into::into))
    }

    /// `metadata.name`, when the object has one.
    pub fn metadata_name(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct Named {
            metadata: Option<Meta>,
        }
        #[derive(Deserialize)]
        struct Meta {
            name: Option<String>,
        }
        if let Some(tree) = self.tree.get() {
            return tree
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        serde_json::from_str::<Named>(self.raw.get())
            .ok()?
            .metadata?
            .name
    }

    /// Is it JSON `null`?
    pub fn is_null(&self) -> bool {
        self.raw.get() == "null"
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self {
            raw: Deserialize::deserialize(d)?,
            tree: std::sync::OnceLock::new(),
        })
    }
}

/// `request.operation`: what the API server is about to do with the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    /// The name the API server uses (`CREATE`...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }

    /// A write that leaves an object behind: CREATE or UPDATE.
    pub fn writes(self) -> bool {
        matches!(self, Self::Create | Self::Update)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Operation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Operation;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("request.operation: CREATE, UPDATE, DELETE or CONNECT")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Operation, E> {
                Ok(match s {
                    "CREATE" => Operation::Create,
                    "UPDATE" => Operation::Update,
                    "DELETE" => Operation::Delete,
                    "CONNECT" => Operation::Connect,
                    _ => return Err(E::custom(bad_operation(s))),
                })
            }
        }
        d.deserialize_str(V)
    }
}

fn bad_operation(got: &str) -> String {
    format!("request.operation must be CREATE, UPDATE, DELETE or CONNECT, got {got:?}")
}

/// The `request` of an AdmissionReview, with the objects left as JSON text.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub kind: Gvk,
    #[serde(default)]
    pub resource: Gvk,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub object: Option<Object>,
    #[serde(default)]
    pub old_object: Option<Object>,
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// The pod objects, once read (see [`crate::decide::read_ahead`]). A request's
    /// objects are what the API server sent and are never changed after parsing: the
    /// reads stay theirs.
    #[serde(skip)]
    pub(crate) pods: crate::decide::pod::PodReads,
}

impl AdmissionRequest {
    pub fn is_dry_run(&self) -> bool {
        self.dry_run == Some(true)
    }
    pub fn sub(&self) -> &str {
        self.sub_resource.as_deref().unwrap_or("")
    }
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }
    /// The request's name, else `metadata.name` of `obj` (subresource requests carry the
    /// parent's name in the request).
    pub fn object_name(&self, obj: &Value) -> String {
        self.name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                obj.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_default()
    }
}

/// Why a body is not an AdmissionReview we can answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("body is not valid JSON or YAML: {0}")]
    Syntax(String),
    #[error("expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got {0}")]
    NotAReview(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request is malformed: {0}")]
    BadRequest(String),
}

/// Parses one AdmissionReview document (already decoded into JSON).
pub fn parse_review(v: &Value) -> Result<AdmissionRequest, ReviewError> {
    check_envelope(v)?;
    let req = v
        .get("request")
        .filter(|r| !r.is_null())
        .ok_or(ReviewError::NoRequest)?;
    missing_operation(req)?;
    validate(
        serde::Deserialize::deserialize(req).map_err(|e| ReviewError::BadRequest(e.to_string()))?,
    )
}

/// [`parse_review`] taking the document, so the objects are moved, not copied (the
/// webhook's hot path).
pub fn parse_review_owned(mut v: Value) -> Result<AdmissionRequest, ReviewError> {
    check_envelope(&v)?;
    let req = v
        .get_mut("request")
        .map(Value::take)
        .filter(|r| !r.is_null())
        .ok_or(ReviewError::NoRequest)?;
    missing_operation(&req)?;
    validate(serde_json::from_value(req).map_err(|e| ReviewError::BadRequest(e.to_string()))?)
}

/// An AdmissionReview read straight into its typed fields.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

/// Reads an AdmissionReview body without building a JSON tree of the whole document
/// (the webhook's hot path). `None` when the body is not a well-typed AdmissionReview
/// with a request: the caller then classifies it through the tree, so that malformed
/// bodies get exactly the answers [`parse_review_owned`] gives. An error comes with the
/// request's uid, to answer it with.
pub fn read_review(body: &[u8]) -> Option<Result<AdmissionRequest, (String, ReviewError)>> {
    let e: Envelope = serde_json::from_slice(body).ok()?;
    if e.kind != "AdmissionReview" {
        return None;
    }
    let req = e.request?;
    if !e.api_version.starts_with("admission.k8s.io/") {
        let error =
            ReviewError::NotAReview(format!("apiVersion {:?} kind {:?}", e.api_version, e.kind));
        return Some(Err((req.uid, error)));
    }
    Some(match check(&req) {
        Ok(()) => Ok(req),
        Err(e) => Err((req.uid, e)),
    })
}

fn check_envelope(v: &Value) -> Result<(), ReviewError> {
    let api = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "AdmissionReview" || !api.starts_with("admission.k8s.io/") {
        return Err(ReviewError::NotAReview(format!(
            "apiVersion {api:?} kind {kind:?}"
        )));
    }
    Ok(())
}

fn validate(r: AdmissionRequest) -> Result<AdmissionRequest, ReviewError> {
    check(&r).map(|()| r)
}

/// A request without an operation is named as such, not as serde's missing field.
fn missing_operation(req: &Value) -> Result<(), ReviewError> {
    match req.get("operation") {
        None | Some(Value::Null) => Err(ReviewError::BadRequest(
            "request.operation is missing: it must be CREATE, UPDATE, DELETE or CONNECT".into(),
        )),
        Some(_) => Ok(()),
    }
}

fn check(r: &AdmissionRequest) -> Result<(), ReviewError> {
    if r.resource.kind.is_empty() {
        return Err(ReviewError::BadRequest(
            "request.resource.resource is missing".into(),
        ));
    }
    Ok(())
}

/// The `response` of an AdmissionReview. `patch` is base64 (kube-core 5 would write
/// a byte array, which the API server rejects: kube-rs#1781).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub warnings: Vec<String>,
}

/// `metav1.Status` of a denial.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub code: u16,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A whole AdmissionReview answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    pub api_version: String,
    pub kind: String,
    pub response: AdmissionResponse,
}

impl ReviewOut {
    pub fn new(response: AdmissionResponse) -> Self {
        Self {
            api_version: "admission.k8s.io/v1".to_string(),
            kind: "AdmissionReview".to_string(),
            response,
        }
    }
}

/// Encodes a whole AdmissionReview answer around `response`, into a buffer sized for
/// the usual answer so that it is allocated once.
pub fn encode_answer(response: &AdmissionResponse) -> serde_json::Result<Vec<u8>> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        api_version: &'static str,
        kind: &'static str,
        response: &'a AdmissionResponse,
    }
    let size = 160
        + response.uid.len()
        + response.patch.as_ref().map_or(0, String::len)
        + response.status.as_ref().map_or(0, |s| s.message.len() + 64)
        + response.warnings.iter().map(|w| w.len() + 4).sum::<usize>();
    let mut buf = Vec::with_capacity(size);
    serde_json::to_writer(
        &mut buf,
        &Out {
            api_version: "admission.k8s.io/v1",
            kind: "AdmissionReview",
            response,
        },
    )?;
    Ok(buf)
}

/// Encodes a JSON patch for the response (base64 of its JSON).
pub fn encode_patch(patch: &[json_patch::PatchOperation]) -> String {
    use base64::Engine;
    let bytes = serde_json::to_vec(patch).unwrap_or_else(|_| b"[]".to_vec());
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Builds AdmissionReview requests the way the API server shapes them (demo, tests,
/// benchmarks).
#[derive(Debug, Clone)]
pub struct ReviewBuilder {
    value: Value,
}

impl ReviewBuilder {
    fn new(operation: &str, group: &str, version: &str, resource: &str, kind: &str) -> Self {
        // Every review the API server sends has a uid; so does every one built here.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let uid = format!("00000000-0000-4000-8000-{n:012}");
        Self {
            value: serde_json::json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": uid,
                    "kind": {"group": group, "version": version, "kind": kind},
                    "resource": {"group": group, "version": version, "resource": resource},
                    "operation": operation,
                    "userInfo": {"username": "system:serviceaccount:volcano-system:volcano-scheduler"},
                    "dryRun": false
                }
            }),
        }
    }
    pub fn pod(operation: &str, pod: Value) -> Self {
        Self::new(operation, "", "v1", "pods", "Pod").object(pod)
    }
    /// A bind through the legacy `POST /api/v1/namespaces/{ns}/bindings`.
    pub fn legacy_binding(namespace: &str, pod: &str, node: &str) -> Self {
        Self::new("CREATE", "", "v1", "bindings", "Binding")
            .named(namespace, pod)
            .object(serde_json::json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}
            }))
    }
    pub fn binding(namespace: &str, pod: &str, node: &str) -> Self {
        Self::new("CREATE", "", "v1", "pods", "Binding")
            .subresource("binding")
            .named(namespace, pod)
            .object(serde_json::json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}
            }))
    }
    /// `<resource>/scale` UPDATE from `from` to `to` replicas (what `kubectl scale` and the HPA send).
    pub fn scale(resource: &str, namespace: &str, name: &str, from: i32, to: i32) -> Self {
        let scale = |r: i32| {
            serde_json::json!({
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": r}
            })
        };
        let mut b = Self::new("UPDATE", "apps", "v1", resource, "Scale")
            .subresource("scale")
            .named(namespace, name)
            .object(scale(to));
        b.value["request"]["kind"] =
            serde_json::json!({"group": "autoscaling", "version": "v1", "kind": "Scale"});
        b.value["request"]["oldObject"] = scale(from);
        b
    }
    pub fn podgroup(operation: &str, pg: Value) -> Self {
        Self::new(
            operation,
            "scheduling.volcano.sh",
            "v1beta1",
            "podgroups",
            "PodGroup",
        )
        .object(pg)
    }
    pub fn queue(operation: &str, q: Value) -> Self {
        Self::new(
            operation,
            "scheduling.volcano.sh",
            "v1beta1",
            "queues",
            "Queue",
        )
        .object(q)
    }
    /// A Volcano Job write (`batch.volcano.sh/v1alpha1`).
    pub fn job(operation: &str, job: Value) -> Self {
        Self::new(operation, "batch.volcano.sh", "v1alpha1", "jobs", "Job").object(job)
    }
    /// A ResourceClaim write (`resource.k8s.io/v1`).
    pub fn claim(operation: &str, claim: Value) -> Self {
        Self::new(
            operation,
            "resource.k8s.io",
            "v1",
            "resourceclaims",
            "ResourceClaim",
        )
        .object(claim)
    }
    pub fn workload(operation: &str, resource: &str, kind: &str, obj: Value) -> Self {
        Self::new(operation, "apps", "v1", resource, kind).object(obj)
    }
    pub fn uid(mut self, uid: &str) -> Self {
        self.value["request"]["uid"] = Value::String(uid.to_string());
        self
    }
    pub fn subresource(mut self, sub: &str) -> Self {
        self.value["request"]["subResource"] = Value::String(sub.to_string());
        self
    }
    pub fn named(mut self, namespace: &str, name: &str) -> Self {
        self.value["request"]["namespace"] = Value::String(namespace.to_string());
        self.value["request"]["name"] = Value::String(name.to_string());
        self
    }
    pub fn object(mut self, obj: Value) -> Self {
        if let Some(ns) = obj.pointer("/metadata/namespace").and_then(Value::as_str) {
            self.value["request"]["namespace"] = Value::String(ns.to_string());
        }
        if let Some(n) = obj.pointer("/metadata/name").and_then(Value::as_str) {
            self.value["request"]["name"] = Value::String(n.to_string());
        }
        self.value["request"]["object"] = obj;
        self
    }
    pub fn old(mut self, obj: Value) -> Self {
        self.value["request"]["oldObject"] = obj;
        self
    }
    pub fn dry_run(mut self) -> Self {
        self.value["request"]["dryRun"] = Value::Bool(true);
        self
    }
    pub fn build(self) -> Value {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tree(body: &[u8]) -> Option<Result<AdmissionRequest, (String, ReviewError)>> {
        let doc: Value = serde_json::from_slice(body).ok()?;
        if doc.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
            || doc.get("request").is_none_or(Value::is_null)
        {
            return None;
        }
        let uid = doc
            .pointer("/request/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        Some(parse_review_owned(doc).map_err(|e| (uid, e)))
    }

    /// An operation outside the four the API server sends, or none, is refused naming
    /// the field and the four it may be; the four are read as themselves.
    #[test]
    fn operations_are_read_at_the_boundary() {
        let review = |op: Option<Value>| {
            let mut r = ReviewBuilder::pod("CREATE", json!({"metadata": {"name": "p"}})).build();
            match op {
                Some(v) => r["request"]["operation"] = v,
                None => {
                    r["request"].as_object_mut().unwrap().remove("operation");
                }
            }
            serde_json::to_vec(&r).unwrap()
        };
        let read = |body: &[u8]| match read_review(body) {
            Some(r) => r.map_err(|(_, e)| e.to_string()),
            None => tree(body).unwrap().map_err(|(_, e)| e.to_string()),
        };
        for (text, op) in [
            ("CREATE", Operation::Create),
            ("UPDATE", Operation::Update),
            ("DELETE", Operation::Delete),
            ("CONNECT", Operation::Connect),
        ] {
            assert_eq!(read(&review(Some(json!(text)))).unwrap().operation, op);
            assert_eq!(op.to_string(), text);
        }
        assert_eq!(
            read(&review(Some(json!("PATCH")))).unwrap_err(),
            "AdmissionReview request is malformed: request.operation must be CREATE, UPDATE, DELETE or CONNECT, got \"PATCH\""
        );
        assert_eq!(
            read(&review(Some(json!("create")))).unwrap_err(),
            "AdmissionReview request is malformed: request.operation must be CREATE, UPDATE, DELETE or CONNECT, got \"create\""
        );
        for missing in [None, Some(Value::Null)] {
            assert_eq!(
                read(&review(missing)).unwrap_err(),
                "AdmissionReview request is malformed: request.operation is missing: it must be CREATE, UPDATE, DELETE or CONNECT"
            );
        }
        assert!(read(&review(Some(json!(7))))
            .unwrap_err()
            .contains("expected request.operation: CREATE, UPDATE, DELETE or CONNECT"));
    }

    /// Whenever the direct read answers, it answers as the tree does.
    #[test]
    fn reading_a_body_directly_agrees_with_the_json_tree() {
        let good = ReviewBuilder::pod(
            "CREATE",
            json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}),
        )
        .uid("u1")
        .build();
        let mut cases = vec![good.clone()];
        for (pointer, value) in [
            ("/apiVersion", json!("admission.k8s.io/v1beta1")),
            ("/apiVersion", json!("v1")),
            ("/kind", json!("Pod")),
            ("/request", Value::Null),
            ("/request/operation", json!("PATCH")),
            ("/request/resource", json!({})),
            ("/request/uid", json!(7)),
            ("/request/object", Value::Null),
            ("/request/dryRun", json!("yes")),
            ("/response", json!({"allowed": true})),
        ] {
            let mut c = good.clone();
            match c.pointer_mut(pointer) {
                Some(slot) => *slot = value,
                None => {
                    c["response"] = value;
                }
            }
            cases.push(c);
        }
        let mut direct = 0;
        for c in &cases {
            let body = serde_json::to_vec(c).unwrap();
            let Some(fast) = read_review(&body) else {
                continue;
            };
            direct += 1;
            let slow = tree(&body).expect("the tree reads what the direct read reads");
            match (fast, slow) {
                (Ok(a), Ok(b)) => {
                    let tree = |o: Option<Object>| o.map(|o| o.tree().clone());
                    assert_eq!(
                        (a.uid, a.operation, tree(a.object)),
                        (b.uid, b.operation, tree(b.object))
                    )
                }
                (Err((ua, a)), Err((ub, b))) => {
                    assert_eq!((ua, a.to_string()), (ub, b.to_string()))
                }
                (a, b) => panic!("{c}: direct {:?} vs tree {:?}", a.is_ok(), b.is_ok()),
            }
        }
        // The good body, the v1beta1 one, the missing resource, the null object and the
        // extra response are all read directly (an unknown operation goes through the
        // tree, to be named in its error).
        assert!(direct >= 5, "{direct}");
        assert!(read_review(b"{").is_none());
    }
}
