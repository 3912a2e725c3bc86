//! Card model discovery from a node's labels and allocatable resources (docs/models.md).

use std::collections::{BTreeMap, BTreeSet};

use super::names::CardName;
use super::quantity::parse_whole;

/// The model name of a MIG profile of a product (the GPU operator's mixed strategy):
/// `NVIDIA-H200/mig-1g.18gb-mixed`.
pub fn mig_model(product: &str, profile: &str) -> String {
    format!("{product}/mig-{profile}-mixed")
}

/// The model name of an MPS share of a product: memory in GiB (rounded) over the
/// number of replicas, `NVIDIA-H200/mps-140g*1/2`.
pub fn mps_model(product: &str, memory_mib: u64, replicas: u64) -> String {
    let gib = (memory_mib + 512) / 1024;
    format!("{product}/mps-{gib}g*1/{replicas}")
}

/// One product label: `<prefix>/<type>.product` (GPU Feature Discovery, Ascend's
/// labeller) or `<prefix>/<type>.product-name` (AMD's node labeller).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Product {
    prefix: String,
    kind: String,
    product: String,
    /// The label's key: what a pin names.
    label: String,
}

/// The card models a node offers, keyed by the extended resource that requests them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCards {
    /// resource name -> (model, allocatable whole cards)
    pub resources: BTreeMap<String, (CardName, u64)>,
    /// Vendor prefixes that carry a product label on this node.
    pub prefixes: Vec<String>,
    /// Card types (`<prefix>/<type>`) that carry a product label on this node.
    pub kinds: Vec<String>,
    /// Products named by product labels (`<prefix>/<type>.product` or `.product-name`).
    pub products: Vec<String>,
    /// resource -> the product label its model was discovered from (key, value): what
    /// a pod's nodeSelector names to be placed on this model.
    pub pins: BTreeMap<String, (String, String)>,
    /// Things that could not be mapped, for logs and warnings.
    pub problems: Vec<String>,
    /// Cards of resources the install does not gate (not among its card resources):
    /// reported, never counted.
    pub unmanaged: BTreeMap<String, (CardName, u64)>,
    /// The node's labels, kept for nodes with a product label only: a pin goes to a model
    /// some of whose nodes the pod's own constraints allow.
    pub labels: BTreeMap<String, String>,
    /// Allocatable card resources no product label names a model for (a GPU node before
    /// its labeller ran, or labelled in a way card-quota does not read): no pod can be
    /// pinned to or charged on them, so they are reported, never silently left out.
    pub modelless: BTreeMap<String, u64>,
    /// Resources in `resources` served through DRA (a DeviceClass's
    /// `extendedResourceName` and the node's ResourceSlices), not its allocatable;
    /// and why others could not be (several models behind one resource).
    pub extended: BTreeSet<String>,
    pub extended_problems: Vec<String>,
}

impl NodeCards {
    /// Moves the resources `manages` rejects from `resources` to `unmanaged`.
    pub fn keep_managed(&mut self, manages: impl Fn(&str) -> bool) {
        let out: Vec<String> = self
            .resources
            .keys()
            .filter(|r| !manages(r))
            .cloned()
            .collect();
        for r in out {
            if let Some(v) = self.resources.remove(&r) {
                self.pins.remove(&r);
                self.unmanaged.insert(r, v);
            }
        }
        self.modelless.retain(|r, _| manages(r));
    }

    /// Adds what the node offers through DRA-backed extended resources
    /// ([`crate::cards::dra::DraObjects::extended_cards`]), replacing what was added
    /// before. A resource its allocatable lists stays the device plugin's (kube-scheduler
    /// serves it from there); one `manages` rejects is not a card. The pin is the node's
    /// product label for the resource when it names the devices' product.
    pub fn set_extended(
        &mut self,
        got: BTreeMap<String, Result<(CardName, u64), String>>,
        manages: impl Fn(&str) -> bool,
    ) {
        for r in std::mem::take(&mut self.extended) {
            self.resources.remove(&r);
            self.pins.remove(&r);
        }
        self.extended_problems.clear();
        for (resource, got) in got {
            if !manages(&resource) || self.resources.contains_key(&resource) {
                continue;
            }
            let (model, cards) = match got {
                Ok(g) => g,
                Err(problem) => {
                    self.extended_problems.push(problem);
                    continue;
                }
            };
            let product = product_of(&model).to_string();
            let pin = PRODUCT_SUFFIXES.iter().find_map(|s| {
                let key = format!("{resource}{s}");
                (self.labels.get(&key) == Some(&product)).then_some((key, product.clone()))
            });
            if let Some(pin) = pin {
                self.pins.insert(resource.clone(), pin);
            }
            self.resources.insert(resource.clone(), (model, cards));
            self.extended.insert(resource);
        }
    }

    /// The model a pod requesting `resource` uses on this node.
    pub fn model_for(&self, resource: &str) -> Option<&CardName> {
        self.resources.get(resource).map(|(m, _)| m)
    }
}

/// The suffixes of a product label: GPU Feature Discovery's (`nvidia.com/gpu.product`,
/// and Ascend's labeller) and AMD's node labeller's (`amd.com/gpu.product-name`).
const PRODUCT_SUFFIXES: [&str; 2] = [".product", ".product-name"];

/// Matches `^(.+?)/(\w+)\.product(-name)?$`: (prefix, type).
fn product_label(key: &str) -> Option<(&str, &str)> {
    let rest = PRODUCT_SUFFIXES.iter().find_map(|s| key.strip_suffix(s))?;
    let slash = rest.find('/')?;
    let (prefix, kind) = (&rest[..slash], &rest[slash + 1..]);
    let word = |c: char| c.is_alphanumeric() || c == '_';
    (!prefix.is_empty() && !kind.is_empty() && kind.chars().all(word)).then_some((prefix, kind))
}

/// Discovers the card models of one node from its labels and allocatable resources.
pub fn discover(
    node: &str,
    labels: &BTreeMap<String, String>,
    allocatable: &BTreeMap<String, String>,
) -> NodeCards {
    let mut products: Vec<Product> = labels
        .iter()
        .filter_map(|(k, v)| {
            product_label(k).map(|(prefix, kind)| Product {
                prefix: prefix.to_string(),
                kind: kind.to_string(),
                product: v.clone(),
                label: k.clone(),
            })
        })
        .collect();
    products.sort_by(|a, b| {
        (a.prefix.as_str(), a.kind.as_str()).cmp(&(b.prefix.as_str(), b.kind.as_str()))
    });
    let mut out = NodeCards {
        prefixes: products.iter().map(|p| p.prefix.clone()).collect(),
        kinds: products
            .iter()
            .map(|p| format!("{}/{}", p.prefix, p.kind))
            .collect(),
        products: products.iter().map(|p| p.product.clone()).collect(),
        ..Default::default()
    };
    out.prefixes.dedup();
    if !out.products.is_empty() {
        out.labels = labels.clone();
    }
    for (resource, qty) in allocatable {
        let Some((prefix, suffix)) = resource.split_once('/') else {
            continue;
        };
        let candidates: Vec<&Product> = products.iter().filter(|p| p.prefix == prefix).collect();
        let mut modelless = || {
            if let Ok(n @ 1..) = parse_whole(qty) {
                out.modelless.insert(resource.clone(), n);
            }
        };
        if candidates.is_empty() {
            modelless();
            continue;
        }
        // Only the labelled type's resources are cards: `<type>`, `<type>.shared` and
        // MIG profiles. Other resources under the prefix (`nvidia.com/hostdev` for
        // GPUDirect RDMA) are not.
        let is_mig = suffix.starts_with("mig-");
        let base = suffix.strip_suffix(".shared").unwrap_or(suffix);
        let p = match candidates.iter().find(|p| p.kind == base) {
            Some(p) => *p,
            None if is_mig => candidates[0],
            None => {
                modelless();
                continue;
            }
        };
        let count = match parse_whole(qty) {
            Ok(n) => n,
            Err(e) => {
                out.problems
                    .push(format!("node {node}: allocatable {resource}={qty}: {e}"));
                continue;
            }
        };
        let model = if let Some(profile) = suffix.strip_prefix("mig-") {
            mig_model(&p.product, profile)
        } else if suffix.ends_with(".shared") {
            let label = |what: &str| labels.get(&format!("{}/{}.{what}", p.prefix, p.kind));
            let mem = label("memory").and_then(|m| m.parse::<u64>().ok());
            let replicas = label("replicas").and_then(|r| r.parse::<u64>().ok());
            match (mem, replicas) {
                (Some(mib), Some(r)) if r > 0 => mps_model(&p.product, mib, r),
                _ => {
                    out.problems.push(format!(
                        "node {node}: {resource} needs numeric labels {0}/{1}.memory and {0}/{1}.replicas to name its MPS model",
                        p.prefix, p.kind
                    ));
                    continue;
                }
            }
        } else {
            p.product.clone()
        };
        match CardName::parse(&model) {
            Ok(m) => {
                out.resources.insert(resource.clone(), (m, count));
                out.pins
                    .insert(resource.clone(), (p.label.clone(), p.product.clone()));
            }
            Err(e) => out.problems.push(format!("node {node}: {resource}: {e}")),
        }
    }
    out
}

/// True when a node label (or a pod's constraint on one) names a card product: what
/// discovery reads a node's model from, and what a pin sets.
pub fn is_product_label(key: &str) -> bool {
    product_label(key).is_some()
}

/// The product part of a model name (`NVIDIA-H200` of `NVIDIA-H200/mig-1g.18gb-mixed`):
/// the value of the product label that places a pod on that model.
pub fn product_of(model: &CardName) -> &str {
    model.as_str().split('/').next().unwrap_or_default()
}

/// The resource shape a model name implies when no node shows the model:
/// MIG models need `*/mig-<profile>`, MPS models `*.shared`, others a whole-card resource.
pub fn resource_fits_model_shape(resource: &str, model: &CardName) -> bool {
    // A claim's devices are whatever model they are: its selectors, not its name, say.
    if super::dra::is_claim_resource(resource) {
        return true;
    }
    let m = model.as_str();
    let suffix = resource.split_once('/').map(|(_, s)| s).unwrap_or(resource);
    if let Some(idx) = m.find("/mig-") {
        let profile = m[idx + 5..].strip_suffix("-mixed").unwrap_or(&m[idx + 5..]);
        suffix.strip_prefix("mig-") == Some(profile)
    } else if m.contains("/mps-") {
        suffix.ends_with(".shared")
    } else {
        !suffix.starts_with("mig-") && !suffix.ends_with(".shared")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn amd_node_labellers_product_name_names_the_model_and_the_pin() {
        let labels = map(&[
            ("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"),
            ("amd.com/gpu.family", "AI"),
            ("amd.com/gpu.vram", "192G"),
        ]);
        let alloc = map(&[("cpu", "64"), ("amd.com/gpu", "8")]);
        let n = discover("mi300", &labels, &alloc);
        assert_eq!(
            n.model_for("amd.com/gpu").map(CardName::as_str),
            Some("AMD_Instinct_MI300X_OAM")
        );
        assert_eq!(
            n.pins["amd.com/gpu"],
            (
                "amd.com/gpu.product-name".to_string(),
                "AMD_Instinct_MI300X_OAM".to_string()
            )
        );
        assert!(is_product_label("amd.com/gpu.product-name"));
        assert!(is_product_label("nvidia.com/gpu.product"));
        assert!(!is_product_label("amd.com/gpu.family"));
        assert!(!is_product_label("product-name"));
    }

    #[test]
    fn card_resources_no_label_names_are_kept_to_be_reported() {
        // AMD's device plugin before (or without) its node labeller; a hostdev beside.
        let alloc = map(&[("amd.com/gpu", "8"), ("nvidia.com/hostdev", "2")]);
        let mut n = discover("mi300", &map(&[]), &alloc);
        assert!(n.resources.is_empty());
        n.keep_managed(|r| r == "amd.com/gpu");
        assert_eq!(
            n.modelless,
            BTreeMap::from([("amd.com/gpu".to_string(), 8)])
        );
        // Labelled: a model, nothing to report.
        let labels = map(&[("amd.com/gpu.product-name", "MI300X")]);
        let mut n = discover("mi300", &labels, &alloc);
        n.keep_managed(|r| r == "amd.com/gpu");
        assert!(n.modelless.is_empty());
    }

    #[test]
    fn whole_mig_and_mps_cards_are_discovered_and_other_resources_ignored() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-H200"),
            ("nvidia.com/gpu.memory", "143771"),
            ("nvidia.com/gpu.replicas", "2"),
            ("nvidia.com/gpu.count", "8"),
        ]);
        let alloc = map(&[
            ("cpu", "64"),
            ("nvidia.com/gpu", "7"),
            ("nvidia.com/mig-1g.18gb", "7"),
            ("nvidia.com/gpu.shared", "2"),
            ("rdma/hca", "100"),
            ("hugepages-2Mi", "0"),
        ]);
        let n = discover("n1", &labels, &alloc);
        let got: Vec<(String, String, u64)> = n
            .resources
            .iter()
            .map(|(r, (m, c))| (r.clone(), m.to_string(), *c))
            .collect();
        assert_eq!(
            got,
            vec![
                ("nvidia.com/gpu".into(), "NVIDIA-H200".into(), 7),
                (
                    "nvidia.com/gpu.shared".into(),
                    "NVIDIA-H200/mps-140g*1/2".into(),
                    2
                ),
                (
                    "nvidia.com/mig-1g.18gb".into(),
                    "NVIDIA-H200/mig-1g.18gb-mixed".into(),
                    7
                ),
            ]
        );
        assert!(n.problems.is_empty());
    }

    #[test]
    fn other_resources_under_a_card_prefix_are_not_cards() {
        let labels = map(&[("nvidia.com/gpu.product", "NVIDIA-H200")]);
        let alloc = map(&[("nvidia.com/gpu", "8"), ("nvidia.com/hostdev", "4")]);
        let n = discover("n", &labels, &alloc);
        assert_eq!(n.resources.len(), 1, "{n:?}");
        assert!(n.model_for("nvidia.com/hostdev").is_none());
        assert!(n.problems.is_empty());
        assert_eq!(n.kinds, vec!["nvidia.com/gpu".to_string()]);
    }

    #[test]
    fn mps_memory_is_rounded_to_the_nearest_gib() {
        let labels = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-H800"),
            ("nvidia.com/gpu.memory", "81559"),
            ("nvidia.com/gpu.replicas", "2"),
        ]);
        let n = discover("n", &labels, &map(&[("nvidia.com/gpu.shared", "4")]));
        assert_eq!(
            n.model_for("nvidia.com/gpu.shared").unwrap().as_str(),
            "NVIDIA-H800/mps-80g*1/2"
        );
    }

    #[test]
    fn any_vendor_prefix_is_discovered() {
        let labels = map(&[("huawei.com/npu.product", "Ascend-910B")]);
        let n = discover("n", &labels, &map(&[("huawei.com/npu", "8")]));
        assert_eq!(
            n.model_for("huawei.com/npu").unwrap().as_str(),
            "Ascend-910B"
        );
    }

    #[test]
    fn a_node_without_product_labels_offers_no_models() {
        let n = discover("n", &BTreeMap::new(), &map(&[("nvidia.com/gpu", "8")]));
        assert!(n.resources.is_empty());
    }

    #[test]
    fn mps_without_memory_label_is_reported_not_guessed() {
        let labels = map(&[("nvidia.com/gpu.product", "NVIDIA-H800")]);
        let n = discover("n", &labels, &map(&[("nvidia.com/gpu.shared", "4")]));
        assert!(n.resources.is_empty());
        assert_eq!(n.problems.len(), 1);
    }
}
