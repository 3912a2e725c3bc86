//! A fake API server for integration tests, behind a real `kube::Client`: objects kept
//! by path with the API server's rules a test can reach. GET of a missing object is a
//! 404; POST of an existing name is AlreadyExists; PUT and DELETE with a
//! resourceVersion precondition are compare-and-swap (409 Conflict on a stale one);
//! PATCH (server-side apply) merges the labels and annotations it sets. Every write
//! gets the next resourceVersion, and every request is recorded.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{json, Value};

/// One request as the fake API server received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub content_type: String,
    pub body: Value,
}

#[derive(Default)]
struct Store {
    objects: HashMap<String, Value>,
    rv: u64,
    writes: usize,
    conflicts: usize,
    seen: Vec<Seen>,
}

#[derive(Clone, Default)]
pub struct FakeApi {
    store: Arc<Mutex<Store>>,
    /// How long each request waits before it is served, so that concurrent ones
    /// interleave as they would on a real server.
    delay: Duration,
}

/// Where the API server keeps `obj` (its kind, namespace and name).
pub fn path_of(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
    match kind {
        "Queue" => format!("/apis/scheduling.volcano.sh/v1beta1/queues/{name}"),
        "ConfigMap" => format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
        "Pod" => format!("/api/v1/namespaces/{ns}/pods/{name}"),
        "Lease" => format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"),
        other => panic!("the fake API server does not keep {other} objects"),
    }
}

/// A JSON answer.
pub fn reply(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// A `Status` failure, as the API server sends one.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    reply(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "code": code.as_u16(), "message": message}),
    )
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// Each request waits `d` before it is served.
    pub fn with_delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap()
    }

    /// Stores `obj` as it is (its resourceVersion included), as if it had been written
    /// before the test.
    pub fn seed(&self, obj: Value) {
        let mut g = self.lock();
        let rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        g.rv = g.rv.max(rv);
        g.objects.insert(path_of(&obj), obj);
    }

    /// Seeds every Queue, ConfigMap and Pod of a YAML/JSON stream.
    pub fn seed_objects(&self, text: &str) {
        for d in card_quota::snapshot::load::documents(text).unwrap() {
            if d["kind"] == "Queue" || d["kind"] == "ConfigMap" || d["kind"] == "Pod" {
                self.seed(d);
            }
        }
    }

    /// Stores `obj` with the next resourceVersion, as a write by another client would;
    /// returns it as stored.
    pub fn store(&self, obj: Value) -> Value {
        self.lock().write(&path_of(&obj), obj)
    }

    /// Removes the object at `path` (as if deleted behind the test's back).
    pub fn remove(&self, path: &str) {
        self.lock().objects.remove(path);
    }

    pub fn object(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// Successful writes (create, replace, patch, delete).
    pub fn writes(&self) -> usize {
        self.lock().writes
    }

    /// Writes refused for a stale resourceVersion or an existing name.
    pub fn conflicts(&self) -> usize {
        self.lock().conflicts
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    pub fn client(&self) -> kube::Client {
        let me = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let me = me.clone();
            async move { Ok::<_, Infallible>(me.handle(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    async fn handle(self, req: Request<Body>) -> Response<Body> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let method = req.method().to_string();
        let uri = req.uri().to_string();
        let path = req.uri().path().to_string();
        let content_type = req
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let mut g = self.lock();
        g.seen.push(Seen {
            method: method.clone(),
            uri,
            content_type: content_type.clone(),
            body: body.clone(),
        });
        let not_found = || {
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{path} not found"),
            )
        };
        let conflict = |g: &mut Store, reason: &str| {
            g.conflicts += 1;
            status(StatusCode::CONFLICT, reason, "the object has been modified")
        };
        match method.as_str() {
            "GET" => match g.objects.get(&path) {
                Some(o) => reply(StatusCode::OK, o),
                None => {
                    // A collection's path: its objects, as a list (a quorum read).
                    let prefix = format!("{path}/");
                    let items: Vec<Value> = g
                        .objects
                        .iter()
                        .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|r| !r.contains('/')))
                        .map(|(_, o)| o.clone())
                        .collect();
                    if items.is_empty() {
                        return not_found();
                    }
                    let list = serde_json::json!({"apiVersion": "v1", "kind": "List",
                        "metadata": {"resourceVersion": g.rv.to_string()}, "items": items});
                    reply(StatusCode::OK, &list)
                }
            },
            "POST" => {
                // Events and other fire-and-forget objects are answered, not kept.
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                if path.ends_with("/events") || name.is_empty() {
                    return reply(StatusCode::CREATED, &body);
                }
                let at = format!("{path}/{name}");
                if g.objects.contains_key(&at) {
                    return conflict(&mut g, "AlreadyExists");
                }
                let stored = g.write(&at, body);
                reply(StatusCode::CREATED, &stored)
            }
            "PUT" => {
                let current = match g.objects.get(&path) {
                    Some(o) => o["metadata"]["resourceVersion"].clone(),
                    None => return not_found(),
                };
                if body["metadata"]["resourceVersion"] != current {
                    return conflict(&mut g, "Conflict");
                }
                let stored = g.write(&path, body);
                reply(StatusCode::OK, &stored)
            }
            "PATCH" => {
                let merge = content_type == "application/merge-patch+json";
                let mut o = match g.objects.get(&path) {
                    Some(o) => o.clone(),
                    // Server-side apply creates; a merge patch needs the object.
                    None if merge => return not_found(),
                    None => body.clone(),
                };
                // A merge patch naming a resourceVersion is a precondition.
                let wanted = &body["metadata"]["resourceVersion"];
                if !wanted.is_null() && *wanted != o["metadata"]["resourceVersion"] {
                    return conflict(&mut g, "Conflict");
                }
                for field in ["labels", "annotations"] {
                    if let Some(m) = body["metadata"][field].as_object() {
                        for (k, v) in m {
                            o["metadata"][field][k] = v.clone();
                        }
                    }
                }
                let stored = g.write(&path, o);
                reply(StatusCode::OK, &stored)
            }
            "DELETE" => {
                let Some(o) = g.objects.get(&path) else {
                    return not_found();
                };
                let wanted = &body["preconditions"]["resourceVersion"];
                if !wanted.is_null() && *wanted != o["metadata"]["resourceVersion"] {
                    return conflict(&mut g, "Conflict");
                }
                g.objects.remove(&path);
                g.writes += 1;
                reply(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                )
            }
            other => panic!("the fake API server does not answer {other}"),
        }
    }
}

impl Store {
    /// Stores `obj` at `path` with the next resourceVersion; returns it as stored.
    fn write(&mut self, path: &str, mut obj: Value) -> Value {
        self.rv += 1;
        self.writes += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if let Some(ns) = path
            .split("/namespaces/")
            .nth(1)
            .and_then(|r| r.split('/').next())
        {
            obj["metadata"]["namespace"] = json!(ns);
        }
        self.objects.insert(path.to_string(), obj.clone());
        obj
    }
}
