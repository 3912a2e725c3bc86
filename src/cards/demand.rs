//! A pod's card demand from its containers (the Kubernetes effective-request rule) and
//! the card products its scheduling constraints pin it to.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Affinity, Container, ResourceRequirements};

use super::quantity::{parse_whole, Cards, QuantityError};

/// Whole cards per card resource that a pod needs.
pub type ResourceDemand = BTreeMap<String, Cards>;

/// A container asks for a card resource in a quantity that is not whole cards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: {resource}: {problem}")]
pub struct DemandError {
    pub container: String,
    pub resource: String,
    pub problem: QuantityError,
}

/// A pod whose card demand cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {source}", .subject.named(.pod))]
pub struct PodDemandError {
    /// A pod, or the pod template of the workload `pod` names.
    pub subject: super::Subject,
    pub pod: super::ObjectKey,
    pub source: DemandError,
}

/// What the demand formula reads of a container: k8s-openapi's `Container` (watched
/// pods, workload templates) or the few parts an admission reads from a review.
pub trait ContainerResources {
    fn name(&self) -> &str;
    fn resources(&self) -> Option<&ResourceRequirements>;
    /// `Always` for a sidecar (an init container that keeps running).
    fn restart_policy(&self) -> Option<&str>;
}

impl ContainerResources for Container {
    fn name(&self) -> &str {
        &self.name
    }
    fn resources(&self) -> Option<&ResourceRequirements> {
        self.resources.as_ref()
    }
    fn restart_policy(&self) -> Option<&str> {
        self.restart_policy.as_deref()
    }
}

fn container_request<C: ContainerResources>(c: &C, resource: &str) -> Result<Cards, DemandError> {
    let Some(res) = c.resources() else {
        return Ok(Cards::ZERO);
    };
    let q = res
        .requests
        .as_ref()
        .and_then(|r| r.get(resource))
        .or_else(|| res.limits.as_ref().and_then(|l| l.get(resource)));
    match q {
        Some(q) => parse_whole(&q.0)
            .map(Cards::new)
            .map_err(|problem| DemandError {
                container: c.name().to_string(),
                resource: resource.to_string(),
                problem,
            }),
        None => Ok(Cards::ZERO),
    }
}

fn resource_names<'c, C: ContainerResources>(c: &'c C, out: &mut Vec<&'c str>) {
    if let Some(res) = c.resources() {
        for m in [&res.requests, &res.limits].into_iter().flatten() {
            out.extend(m.keys().map(String::as_str));
        }
    }
}

/// Card demand of a pod's containers: for each card resource, `max(sum(app) +
/// sum(sidecars), max(init_i + sidecars started before i))`. Requests default to limits.
pub fn containers_demand<C: ContainerResources>(
    containers: &[C],
    init_containers: &[C],
    is_card: impl Fn(&str) -> bool,
) -> Result<ResourceDemand, DemandError> {
    let mut names = Vec::new();
    for c in containers.iter().chain(init_containers) {
        resource_names(c, &mut names);
    }
    names.sort();
    names.dedup();
    let mut out = ResourceDemand::new();
    // Borrowed until a card resource is found: most of a pod's resources are not.
    for r in names.into_iter().filter(|r| is_card(r)) {
        let mut sidecars = Cards::ZERO;
        let mut init_peak = Cards::ZERO;
        for c in init_containers {
            let n = container_request(c, r)?;
            if c.restart_policy() == Some("Always") {
                sidecars += n;
                init_peak = init_peak.max(sidecars);
            } else {
                init_peak = init_peak.max(sidecars + n);
            }
        }
        let mut app = sidecars;
        for c in containers {
            app += container_request(c, r)?;
        }
        let n = app.max(init_peak);
        if !n.is_zero() {
            out.insert(r.to_string(), n);
        }
    }
    Ok(out)
}

/// What a pod's required scheduling constraints allow of one product label's values.
/// Sets, not lists: a hostile pod may send 100,000 values in one expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProductRule {
    /// Only these values (empty: no node with the label at all).
    Only(BTreeSet<String>),
    /// Any value but these (empty: no constraint).
    AllBut(BTreeSet<String>),
}

impl ProductRule {
    const ANY: Self = Self::AllBut(BTreeSet::new());

    /// True when a node whose label has value `v` is allowed.
    pub fn allows(&self, v: &str) -> bool {
        match self {
            Self::Only(vs) => vs.contains(v),
            Self::AllBut(vs) => !vs.contains(v),
        }
    }

    /// Both rules hold (expressions of one term, or a nodeSelector beside affinity).
    fn and(self, other: Self) -> Self {
        use ProductRule::*;
        match (self, other) {
            (Only(a), Only(b)) => Only(a.intersection(&b).cloned().collect()),
            (Only(a), AllBut(b)) | (AllBut(b), Only(a)) => Only(&a - &b),
            (AllBut(mut a), AllBut(mut b)) => {
                a.append(&mut b);
                AllBut(a)
            }
        }
    }

    /// Either rule holds (ORed node-selector terms).
    fn or(self, other: Self) -> Self {
        use ProductRule::*;
        match (self, other) {
            (Only(mut a), Only(mut b)) => {
                a.append(&mut b);
                Only(a)
            }
            (Only(a), AllBut(b)) | (AllBut(b), Only(a)) => AllBut(&b - &a),
            (AllBut(a), AllBut(b)) => AllBut(a.intersection(&b).cloned().collect()),
        }
    }

    /// One expression's rule. `Gt`/`Lt` on a product name are left unconstrained.
    fn of_expression(operator: &str, values: &[String]) -> Self {
        match operator {
            "In" => Self::Only(values.iter().cloned().collect()),
            "NotIn" => Self::AllBut(values.iter().cloned().collect()),
            "DoesNotExist" => Self::Only(BTreeSet::new()),
            _ => Self::ANY,
        }
    }
}

/// What a pod's required scheduling constraints allow, per product label
/// (`<prefix>/<type>.product` or `.product-name`): its nodeSelector, and every `requiredDuringScheduling`
/// node-affinity term (ORed; the expressions of a term ANDed; `In`, `NotIn`, `Exists`,
/// `DoesNotExist`). Labels without a constraint are absent. Each label is judged on its
/// own: a value allowed here may still be ruled out by another label's constraint.
/// One pass over the expressions, whatever the number of terms and labels.
pub fn product_rules(
    node_selector: Option<&BTreeMap<String, String>>,
    affinity: Option<&Affinity>,
) -> BTreeMap<String, ProductRule> {
    let mut out: BTreeMap<String, ProductRule> = BTreeMap::new();
    for (k, v) in node_selector.into_iter().flatten() {
        if super::nodes::is_product_label(k) {
            out.insert(k.clone(), ProductRule::Only(BTreeSet::from([v.clone()])));
        }
    }
    let terms = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or(&[]);
    // label -> (rule of each term that names it, in term order).
    let mut per_key: BTreeMap<&str, BTreeMap<usize, ProductRule>> = BTreeMap::new();
    for (t, term) in terms.iter().enumerate() {
        for e in term.match_expressions.iter().flatten() {
            if !super::nodes::is_product_label(&e.key) {
                continue;
            }
            let rule = ProductRule::of_expression(&e.operator, e.values.as_deref().unwrap_or(&[]));
            let slot = per_key.entry(e.key.as_str()).or_default();
            let joined = match slot.remove(&t) {
                Some(r) => r.and(rule),
                None => rule,
            };
            slot.insert(t, joined);
        }
    }
    for (key, rules) in per_key {
        // A term that does not name the label does not constrain it.
        if rules.len() < terms.len() {
            continue;
        }
        let Some(rule) = rules.into_values().reduce(ProductRule::or) else {
            continue;
        };
        if rule == ProductRule::ANY {
            continue;
        }
        let rule = match out.remove(key) {
            Some(selector) => selector.and(rule),
            None => rule,
        };
        out.insert(key.to_string(), rule);
    }
    out
}

/// Product values a pod's required scheduling constraints pin it to, per product label,
/// and the values they exclude (split from [`product_rules`], the shapes a pod record
/// and a ledger entry keep).
pub type ProductPins = (BTreeMap<String, Vec<String>>, BTreeMap<String, Vec<String>>);

/// [`product_rules`] as (pinned values, excluded values) per label.
pub fn pinned_products(
    node_selector: Option<&BTreeMap<String, String>>,
    affinity: Option<&Affinity>,
) -> ProductPins {
    let mut pinned = BTreeMap::new();
    let mut excluded = BTreeMap::new();
    for (k, rule) in product_rules(node_selector, affinity) {
        match rule {
            ProductRule::Only(vs) => {
                pinned.insert(k, vs.into_iter().collect());
            }
            ProductRule::AllBut(vs) => {
                excluded.insert(k, vs.into_iter().collect());
            }
        }
    }
    (pinned, excluded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn pod_demand(s: &PodSpec, is_card: fn(&str) -> bool) -> Result<ResourceDemand, DemandError> {
        let init = s.init_containers.as_deref().unwrap_or_default();
        containers_demand(&s.containers, init, is_card)
    }

    fn pinned(s: &PodSpec) -> BTreeMap<String, Vec<String>> {
        pinned_products(s.node_selector.as_ref(), s.affinity.as_ref()).0
    }

    fn rules(terms: serde_json::Value) -> BTreeMap<String, ProductRule> {
        let s = spec(json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}));
        product_rules(s.node_selector.as_ref(), s.affinity.as_ref())
    }

    fn expr(op: &str, values: &[&str]) -> serde_json::Value {
        json!({"key": "nvidia.com/gpu.product", "operator": op, "values": values})
    }

    #[test]
    fn every_operator_and_term_shape_is_read() {
        let key = "nvidia.com/gpu.product";
        let only = |v: &[&str]| ProductRule::Only(v.iter().map(|s| s.to_string()).collect());
        let all_but = |v: &[&str]| ProductRule::AllBut(v.iter().map(|s| s.to_string()).collect());
        // NotIn alone.
        let r = rules(json!([{"matchExpressions": [expr("NotIn", &["A"])]}]));
        assert_eq!(r[key], all_but(&["A"]));
        assert!(!r[key].allows("A") && r[key].allows("B"));
        // Two expressions in one term: both hold.
        let r = rules(
            json!([{"matchExpressions": [expr("In", &["A", "B"]), expr("In", &["B", "C"])]}]),
        );
        assert_eq!(r[key], only(&["B"]));
        let r =
            rules(json!([{"matchExpressions": [expr("In", &["A", "B"]), expr("NotIn", &["A"])]}]));
        assert_eq!(r[key], only(&["B"]));
        // ORed terms: either holds.
        let r = rules(json!([
            {"matchExpressions": [expr("In", &["A"])]},
            {"matchExpressions": [expr("NotIn", &["A", "B"])]}
        ]));
        assert_eq!(r[key], all_but(&["B"]));
        // Exists constrains nothing about the value; DoesNotExist allows none.
        let r = rules(json!([{"matchExpressions": [{"key": key, "operator": "Exists"}]}]));
        assert!(r.is_empty());
        let r = rules(json!([{"matchExpressions": [{"key": key, "operator": "DoesNotExist"}]}]));
        assert_eq!(r[key], only(&[]));
        // A term without the key leaves the key free.
        let r = rules(json!([
            {"matchExpressions": [expr("NotIn", &["A"])]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}
        ]));
        assert!(r.is_empty());
        // nodeSelector and affinity together.
        let s = spec(json!({"containers": [], "nodeSelector": {key: "A"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expr("NotIn", &["A"])]}]}}}}));
        assert_eq!(
            product_rules(s.node_selector.as_ref(), s.affinity.as_ref())[key],
            only(&[])
        );
    }

    fn gpu(r: &str) -> bool {
        r.starts_with("nvidia.com/")
    }

    #[test]
    fn containers_add_up_and_init_containers_take_the_max() {
        let s = spec(json!({
            "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        }));
        assert_eq!(
            pod_demand(&s, gpu).unwrap(),
            BTreeMap::from([("nvidia.com/gpu".to_string(), Cards::new(3))])
        );
    }

    #[test]
    fn sidecars_add_to_the_app_containers() {
        let s = spec(json!({
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ],
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }));
        // init peak = 1 (sidecar) + 2 = 3; app = 1 + 1 = 2
        assert_eq!(
            pod_demand(&s, gpu).unwrap()["nvidia.com/gpu"],
            Cards::new(3)
        );
    }

    #[test]
    fn a_fractional_card_request_is_an_error() {
        let s = spec(
            json!({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}),
        );
        assert!(pod_demand(&s, gpu).is_err());
    }

    #[test]
    fn node_selector_and_affinity_pin_products() {
        let s = spec(json!({
            "containers": [],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}
        }));
        assert_eq!(pinned(&s)["nvidia.com/gpu.product"], vec!["NVIDIA-H200"]);
        let s = spec(json!({
            "containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A", "B"]}]}
            ]}}}
        }));
        assert_eq!(pinned(&s)["nvidia.com/gpu.product"], vec!["A", "B"]);
        let s = spec(json!({
            "containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}
            ]}}}
        }));
        assert!(
            pinned(&s).is_empty(),
            "a term without the key leaves it unpinned"
        );
    }
}
