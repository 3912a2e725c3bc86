//! JSON patches the mutating webhook returns.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

/// The JSON pointer to `tokens`, escaped (RFC 6901), built in one allocation: a patch
/// is built on every admitted request, and `PointerBuf::from_tokens` grows its string
/// token by token.
pub fn pointer(tokens: &[&str]) -> PointerBuf {
    let escapes = |t: &str| t.bytes().filter(|b| matches!(b, b'~' | b'/')).count();
    let len = tokens.iter().map(|t| 1 + t.len() + escapes(t)).sum();
    let mut s = String::with_capacity(len);
    for t in tokens {
        s.push('/');
        for c in t.chars() {
            match c {
                '~' => s.push_str("~0"),
                '/' => s.push_str("~1"),
                c => s.push(c),
            }
        }
    }
    // Escaped as above, it always parses; `from_tokens` would build the same.
    PointerBuf::parse(s).unwrap_or_else(|_| PointerBuf::from_tokens(tokens.iter().copied()))
}

/// What an object has of `metadata.annotations`: it decides the patch that sets one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnotationsAt {
    Map,
    NoMap,
    NoMetadata,
}

impl AnnotationsAt {
    pub fn of(obj: &Value) -> Self {
        match obj.get("metadata") {
            Some(Value::Object(m)) if m.get("annotations").is_some_and(Value::is_object) => {
                Self::Map
            }
            Some(Value::Object(_)) => Self::NoMap,
            _ => Self::NoMetadata,
        }
    }

    /// Of a typed object's metadata. An empty one counts as none: adding a whole
    /// `metadata` in its place gives the same object.
    pub fn of_meta(meta: &ObjectMeta) -> Self {
        if meta.annotations.is_some() {
            Self::Map
        } else if *meta == ObjectMeta::default() {
            Self::NoMetadata
        } else {
            Self::NoMap
        }
    }
}

/// Adds (or overwrites) one annotation on `obj`, creating the map if needed.
pub fn set_annotation(obj: &Value, key: &str, value: &str) -> PatchOperation {
    let (path, value) = match AnnotationsAt::of(obj) {
        AnnotationsAt::Map => return add_annotation(key, value.to_string()),
        AnnotationsAt::NoMap => (&["metadata", "annotations"][..], json!({ key: value })),
        AnnotationsAt::NoMetadata => (&["metadata"][..], json!({"annotations": { key: value }})),
    };
    PatchOperation::Add(AddOperation {
        path: pointer(path),
        value,
    })
}

fn add_annotation(key: &str, value: String) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: pointer(&["metadata", "annotations", key]),
        value: Value::String(value),
    })
}

/// Adds (or overwrites) several annotations on `obj` in one patch.
pub fn set_annotations(obj: &Value, pairs: &[(&str, String)]) -> Vec<PatchOperation> {
    annotations_at(AnnotationsAt::of(obj), pairs.to_vec())
}

/// Adds (or overwrites) annotations on an object whose annotations are `at`; the
/// values move into the patch.
pub fn annotations_at(at: AnnotationsAt, pairs: Vec<(&str, String)>) -> Vec<PatchOperation> {
    if pairs.is_empty() {
        return Vec::new();
    }
    let map = |pairs: Vec<(&str, String)>| -> serde_json::Map<String, Value> {
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::String(v)))
            .collect()
    };
    match at {
        AnnotationsAt::Map => pairs
            .into_iter()
            .map(|(k, v)| add_annotation(k, v))
            .collect(),
        AnnotationsAt::NoMap => vec![PatchOperation::Add(AddOperation {
            path: pointer(&["metadata", "annotations"]),
            value: Value::Object(map(pairs)),
        })],
        AnnotationsAt::NoMetadata => vec![PatchOperation::Add(AddOperation {
            path: pointer(&["metadata"]),
            value: json!({ "annotations": map(pairs) }),
        })],
    }
}

/// Adds `label: value` to a pod's `spec.nodeSelector`, `selector` (nothing when it is
/// there).
pub fn set_node_selector(
    selector: Option<&BTreeMap<String, String>>,
    label: &str,
    value: &str,
) -> Vec<PatchOperation> {
    match selector {
        Some(m) if m.get(label).map(String::as_str) == Some(value) => Vec::new(),
        Some(_) => vec![PatchOperation::Add(AddOperation {
            path: pointer(&["spec", "nodeSelector", label]),
            value: Value::String(value.to_string()),
        })],
        None => vec![PatchOperation::Add(AddOperation {
            path: pointer(&["spec", "nodeSelector"]),
            value: json!({ label: value }),
        })],
    }
}

/// Sets `spec.replicas`.
pub fn set_replicas(replicas: i32) -> PatchOperation {
    PatchOperation::Replace(ReplaceOperation {
        path: pointer(&["spec", "replicas"]),
        value: json!(replicas),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_are_escaped_as_from_tokens_escapes_them() {
        for tokens in [
            &["metadata", "annotations", "volcano.sh/card.name"][..],
            &["a~b", "/", "~1", ""],
            &["spec", "nodeSelector", "nvidia.com/gpu.product"],
            &[],
        ] {
            let p = pointer(tokens);
            assert_eq!(
                p,
                PointerBuf::from_tokens(tokens.iter().copied()),
                "{tokens:?}"
            );
        }
    }

    #[test]
    fn annotation_keys_with_slashes_are_escaped() {
        let p = set_annotation(
            &json!({"metadata": {"annotations": {}}}),
            "volcano.sh/card.charged",
            "A",
        );
        let s = serde_json::to_string(&p).unwrap();
        assert_eq!(
            s,
            r#"{"op":"add","path":"/metadata/annotations/volcano.sh~1card.charged","value":"A"}"#
        );
    }

    #[test]
    fn several_annotations_land_together_when_the_map_is_missing() {
        for mut doc in [
            json!({"metadata": {"name": "x"}}),
            json!({}),
            json!({"metadata": {"annotations": {"a": "b"}}}),
        ] {
            let ops = set_annotations(&doc, &[("k1", "v1".into()), ("k2", "v2".into())]);
            json_patch::patch(&mut doc, &ops).unwrap();
            assert_eq!(doc["metadata"]["annotations"]["k1"], "v1");
            assert_eq!(doc["metadata"]["annotations"]["k2"], "v2");
        }
    }

    /// A pod read typed gets the patch its JSON gets, whatever it has of metadata.
    #[test]
    fn a_typed_pod_is_patched_as_its_json_is() {
        for meta in [
            json!({"name": "x"}),
            json!({}),
            json!({"annotations": {"a": "b"}}),
            json!({"annotations": null, "name": "x"}),
            Value::Null,
        ] {
            let mut doc = json!({"apiVersion": "v1", "kind": "Pod"});
            if !meta.is_null() {
                doc["metadata"] = meta;
            }
            let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(doc.clone()).unwrap();
            let pairs = [("k", "v".to_string()), ("k2", "v2".to_string())];
            let (mut typed, mut tree) = (doc.clone(), doc.clone());
            json_patch::patch(
                &mut typed,
                &annotations_at(AnnotationsAt::of_meta(&pod.metadata), pairs.to_vec()),
            )
            .unwrap();
            json_patch::patch(&mut tree, &set_annotations(&doc, &pairs)).unwrap();
            assert_eq!(typed, tree, "{doc}");
            assert_eq!(typed["metadata"]["annotations"]["k2"], "v2");
        }
    }

    #[test]
    fn a_missing_annotation_map_is_created() {
        let mut doc = json!({"metadata": {"name": "x"}});
        let p = set_annotation(&doc, "k", "v");
        json_patch::patch(&mut doc, &[p]).unwrap();
        assert_eq!(doc["metadata"]["annotations"]["k"], "v");
        let mut doc = json!({});
        let p = set_annotation(&doc, "k", "v");
        json_patch::patch(&mut doc, &[p]).unwrap();
        assert_eq!(doc["metadata"]["annotations"]["k"], "v");
    }
}
