//! JSON patches the mutating webhook returns.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use serde_json::{json, Value};

/// Adds (or overwrites) one annotation on `obj`, creating the map if needed.
pub fn set_annotation(obj: &Value, key: &str, value: &str) -> PatchOperation {
    let has_meta = obj.get("metadata").map(Value::is_object).unwrap_or(false);
    let has_anns = obj
        .pointer("/metadata/annotations")
        .map(Value::is_object)
        .unwrap_or(false);
    if has_anns {
        PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations", key]),
            value: Value::String(value.to_string()),
        })
    } else if has_meta {
        PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: json!({ key: value }),
        })
    } else {
        PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata"]),
            value: json!({ "annotations": { key: value } }),
        })
    }
}

/// Adds (or overwrites) several annotations on `obj` in one patch.
pub fn set_annotations(obj: &Value, pairs: &[(&str, String)]) -> Vec<PatchOperation> {
    let has_anns = obj
        .pointer("/metadata/annotations")
        .map(Value::is_object)
        .unwrap_or(false);
    if has_anns {
        return pairs
            .iter()
            .map(|(k, v)| set_annotation(obj, k, v))
            .collect();
    }
    let map: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .collect();
    if pairs.is_empty() {
        Vec::new()
    } else if obj.get("metadata").map(Value::is_object).unwrap_or(false) {
        vec![PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: Value::Object(map),
        })]
    } else {
        vec![PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata"]),
            value: json!({ "annotations": map }),
        })]
    }
}

/// Adds `label: value` to the pod's `spec.nodeSelector` (nothing when it is there).
pub fn set_node_selector(obj: &Value, label: &str, value: &str) -> Vec<PatchOperation> {
    match obj.pointer("/spec/nodeSelector") {
        Some(Value::Object(m)) if m.get(label).and_then(Value::as_str) == Some(value) => Vec::new(),
        Some(Value::Object(_)) => vec![PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["spec", "nodeSelector", label]),
            value: Value::String(value.to_string()),
        })],
        _ => vec![PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["spec", "nodeSelector"]),
            value: json!({ label: value }),
        })],
    }
}

/// Sets `spec.replicas`.
pub fn set_replicas(replicas: i32) -> PatchOperation {
    PatchOperation::Replace(ReplaceOperation {
        path: PointerBuf::from_tokens(["spec", "replicas"]),
        value: json!(replicas),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
