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
