//! Whether a pod's own node constraints (`nodeSelector` and the required node affinity)
//! allow a node, as kube-scheduler's NodeAffinity filter reads them: every
//! `nodeSelector` entry holds, and, when terms are given, at least one term holds (a term
//! holds when all its expressions and fields do). The pin goes only to a model some of
//! whose nodes the pod may run on (docs/decisions.md, "The pin").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, NodeSelectorRequirement, NodeSelectorTerm};

/// A pod's node constraints, borrowed from its spec.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeConstraints<'a> {
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    pub affinity: Option<&'a Affinity>,
}

impl<'a> NodeConstraints<'a> {
    fn terms(&self) -> Option<&'a [NodeSelectorTerm]> {
        self.affinity
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|r| r.node_selector_terms.as_slice())
    }

    /// True when the pod constrains its nodes at all.
    pub fn any(&self) -> bool {
        self.node_selector.is_some_and(|s| !s.is_empty()) || self.terms().is_some()
    }

    /// True when `node` (its name and labels) satisfies the constraints.
    pub fn allow(&self, node: &str, labels: &BTreeMap<String, String>) -> bool {
        if let Some(sel) = self.node_selector {
            if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                return false;
            }
        }
        match self.terms() {
            // An empty list of terms matches no node (the scheduler's reading).
            Some(terms) => terms.iter().any(|t| term_holds(t, node, labels)),
            None => true,
        }
    }

    /// The constraints as a short text for a refusal.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(sel) = self.node_selector.filter(|s| !s.is_empty()) {
            let kv: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
            parts.push(format!("nodeSelector {}", kv.join(",")));
        }
        if let Some(terms) = self.terms() {
            let shown: Vec<String> = terms.iter().map(describe_term).collect();
            parts.push(format!("required node affinity {}", shown.join(" or ")));
        }
        parts.join("; ")
    }
}

fn term_holds(t: &NodeSelectorTerm, node: &str, labels: &BTreeMap<String, String>) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    // A term with neither matches nothing.
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|e| holds(e, labels.get(&e.key).map(String::as_str)))
        && fields.iter().all(|f| {
            let value = (f.key == "metadata.name").then_some(node);
            holds(f, value)
        })
}

fn holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (
            value.and_then(number),
            values.first().and_then(|x| number(x)),
        ) {
            (Some(v), Some(bound)) if r.operator == "Gt" => v > bound,
            (Some(v), Some(bound)) => v < bound,
            _ => false,
        },
        // The API server refuses other operators; a pod carrying one allows no node.
        _ => false,
    }
}

fn describe_term(t: &NodeSelectorTerm) -> String {
    let show = |r: &NodeSelectorRequirement| {
        let values = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "Exists" | "DoesNotExist" => format!("{} {}", r.key, r.operator),
            op => format!("{} {op} [{}]", r.key, values.join(",")),
        }
    };
    let parts: Vec<String> = t
        .match_expressions
        .iter()
        .flatten()
        .chain(t.match_fields.iter().flatten())
        .map(show)
        .collect();
    format!("({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn affinity(terms: serde_json::Value) -> Affinity {
        serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}))
            .unwrap()
    }

    #[test]
    fn selectors_terms_and_operators_read_as_the_scheduler_reads_them() {
        let east = labels(&[("zone", "east"), ("gen", "9")]);
        let west = labels(&[("zone", "west")]);
        let sel = labels(&[("zone", "east")]);
        let c = NodeConstraints {
            node_selector: Some(&sel),
            affinity: None,
        };
        assert!(c.allow("n1", &east) && !c.allow("n2", &west));
        assert_eq!(c.describe(), "nodeSelector zone=east");
        // Terms are ORed; expressions within a term are ANDed.
        let a = affinity(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["west"]}]},
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}, {"key": "zone", "operator": "Exists"}]}
        ]));
        let c = NodeConstraints {
            node_selector: None,
            affinity: Some(&a),
        };
        assert!(c.allow("n1", &east) && c.allow("n2", &west));
        assert!(!c.allow("n3", &labels(&[("gen", "9")])));
        let a = affinity(
            json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["east"]}, {"key": "gpu", "operator": "DoesNotExist"}]}]),
        );
        let c = NodeConstraints {
            node_selector: None,
            affinity: Some(&a),
        };
        assert!(!c.allow("n1", &east) && c.allow("n2", &west));
        assert_eq!(
            c.describe(),
            "required node affinity (zone NotIn [east], gpu DoesNotExist)"
        );
        // Fields name the node.
        let a = affinity(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]),
        );
        let c = NodeConstraints {
            node_selector: None,
            affinity: Some(&a),
        };
        assert!(!c.allow("n1", &east) && c.allow("n2", &west));
        // An empty term, or no terms, match nothing.
        let c = NodeConstraints {
            node_selector: None,
            affinity: Some(&affinity(json!([{}]))),
        };
        assert!(!c.allow("n1", &east));
        let c = NodeConstraints {
            node_selector: None,
            affinity: Some(&affinity(json!([]))),
        };
        assert!(!c.allow("n1", &east));
        assert!(!NodeConstraints::default().any());
    }
}
