//! Which extended resources are cards (docs/models.md, "Card resources"): one list of
//! names and `prefix*` patterns, read by node discovery, by a pod's demand and by the
//! webhook configurations' `matchConditions` alike. A condition sees only the pod, so a
//! vendor prefix cannot tell a card (`nvidia.com/gpu`) from a NIC
//! (`nvidia.com/sriov_rdma_vf`): the list names the cards themselves.

use std::fmt;
use std::sync::Arc;

use super::dra::DraSettings;

/// The card resources of an install that names none: NVIDIA's whole cards, MPS shares
/// and MIG profiles, AMD's cards, Huawei's Ascend NPUs.
pub const DEFAULT_CARD_RESOURCES: &[&str] = &[
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-*",
    "amd.com/gpu",
    "huawei.com/Ascend*",
    "huawei.com/npu",
];

/// One entry: an exact resource name, or every name that starts with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn matches(&self, resource: &str) -> bool {
        match self {
            Self::Exact(n) => n == resource,
            Self::Prefix(p) => resource.starts_with(p.as_str()),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(n) => f.write_str(n),
            Self::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// The card resources of an install, and the DRA drivers and DeviceClasses whose
/// devices are cards (`--dra-driver`, `--dra-class`): one setting, handed together to
/// discovery, demand and the install's hook conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardResources(Arc<Vec<Pattern>>, Arc<DraSettings>);

/// A `--card-resource` entry that is not an extended resource name or pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid card resource {given:?}: {why}")]
pub struct CardResourceError {
    given: String,
    why: &'static str,
}

impl Default for CardResources {
    fn default() -> Self {
        Self::parse(DEFAULT_CARD_RESOURCES)
            .unwrap_or_else(|_| Self(Arc::new(Vec::new()), Arc::default()))
    }
}

impl CardResources {
    /// Parses names (`nvidia.com/gpu`) and patterns ending in one `*`
    /// (`nvidia.com/mig-*`). An empty list is an error: an install gating no card
    /// resource would gate nothing at all without a word.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, CardResourceError> {
        if items.is_empty() {
            return Err(CardResourceError {
                given: String::new(),
                why: "the list is empty; name at least one card resource",
            });
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let given = item.as_ref();
            let err = |why| CardResourceError {
                given: given.to_string(),
                why,
            };
            let (body, prefix) = match given.strip_suffix('*') {
                Some(b) => (b, true),
                None => (given, false),
            };
            let Some((domain, name)) = body.split_once('/') else {
                return Err(err("expected <domain>/<name>, e.g. nvidia.com/gpu"));
            };
            if !domain.contains('.')
                || !domain
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
            {
                return Err(err(
                    "the domain must be a DNS subdomain (lowercase, with a dot), e.g. nvidia.com",
                ));
            }
            if domain.ends_with("kubernetes.io") || domain.ends_with("k8s.io") {
                return Err(err(
                    "resources under kubernetes.io and k8s.io are not extended resources",
                ));
            }
            let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
            if (!prefix && name.is_empty()) || !name.chars().all(name_ok) {
                return Err(err("the name after the domain allows letters, digits, '.', '-' and '_', and '*' only at the end"));
            }
            let p = if prefix {
                Pattern::Prefix(body.to_string())
            } else {
                Pattern::Exact(body.to_string())
            };
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(Self(Arc::new(out), Arc::default()))
    }

    /// The default list, shared (records are read with it before a snapshot applies
    /// the install's own).
    pub fn defaults() -> &'static CardResources {
        static DEFAULTS: std::sync::LazyLock<CardResources> =
            std::sync::LazyLock::new(CardResources::default);
        &DEFAULTS
    }

    /// These card resources with the DRA settings `dra`.
    pub fn with_dra(self, dra: DraSettings) -> Self {
        Self(self.0, Arc::new(dra))
    }

    /// The DRA drivers and DeviceClasses whose devices are cards.
    pub fn dra(&self) -> &DraSettings {
        &self.1
    }

    /// True when `resource` is a card resource of this install.
    pub fn matches(&self, resource: &str) -> bool {
        self.0.iter().any(|p| p.matches(resource))
    }

    /// The entries, in the order given.
    pub fn patterns(&self) -> &[Pattern] {
        &self.0
    }

    /// The exact names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Pattern::Exact(n) => Some(n.as_str()),
            Pattern::Prefix(_) => None,
        })
    }

    /// The prefixes of the `prefix*` patterns.
    pub fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Pattern::Prefix(x) => Some(x.as_str()),
            Pattern::Exact(_) => None,
        })
    }

    /// True for the list an install gets when it names none.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl fmt::Display for CardResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&shown.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_name_cards_and_leave_nics_alone() {
        let c = CardResources::default();
        for card in [
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "nvidia.com/mig-1g.18gb",
            "amd.com/gpu",
            "huawei.com/Ascend910",
        ] {
            assert!(c.matches(card), "{card}");
        }
        for other in [
            "nvidia.com/sriov_rdma_vf",
            "nvidia.com/hostdev",
            "nvidia.com/gpumem",
            "nvidia.com/gpucores",
            "rdma/hca_shared_devices_a",
            "amd.com/gpu.x",
            "cambricon.com/mlu",
        ] {
            assert!(!c.matches(other), "{other}");
        }
    }

    #[test]
    fn entries_are_checked_and_named_in_errors() {
        let bad = |s: &str| CardResources::parse(&[s]).unwrap_err().to_string();
        assert_eq!(
            bad("gpu"),
            "invalid card resource \"gpu\": expected <domain>/<name>, e.g. nvidia.com/gpu"
        );
        assert!(bad("nvidia.com/g*pu").contains("'*' only at the end"));
        assert!(bad("NVIDIA.com/gpu").contains("DNS subdomain"));
        assert!(bad("example.kubernetes.io/x").contains("not extended resources"));
        assert!(CardResources::parse::<&str>(&[])
            .unwrap_err()
            .to_string()
            .contains("the list is empty"));
        let ok = CardResources::parse(&["cambricon.com/mlu", "nvidia.com/mig-*"]).unwrap();
        assert!(ok.matches("cambricon.com/mlu") && ok.matches("nvidia.com/mig-2g.20gb"));
        assert!(!ok.matches("nvidia.com/gpu"));
        assert_eq!(ok.to_string(), "cambricon.com/mlu, nvidia.com/mig-*");
    }
}
