//! Group caps: quota keys that end in `*` (docs/annotations.md, "Group caps").
//!
//! `P*` caps the cards of every model whose name starts with `P`. A pattern with no `/`
//! counts whole cards only (`*`, `NVIDIA-*`); one with a `/` counts the sub-card models
//! under it (`NVIDIA-H200/mig-*`). Two patterns of one kind match nested sets when one
//! prefix starts with the other, and disjoint sets otherwise; patterns of different kinds
//! match disjoint sets. So a quota's caps form a tree (a laminar family), which is what
//! keeps the feasibility check a flow.

use std::fmt;
use std::sync::Arc;

use super::names::{shown, CardName, MAX_NAME_LEN};

/// A quota key ending in `*`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CardPattern {
    /// The key without its final `*` (`""` for `*`).
    prefix: Arc<str>,
}

/// Why a key ending in `*` is not a pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error(
        "a group cap ends in one '*' after a prefix (such as \"NVIDIA-*\" or \"*\"), got {0:?}"
    )]
    DoubleStar(String),
    #[error("pattern {0:?} contains whitespace")]
    Whitespace(String),
    #[error("pattern {0:?} contains '|'; a group cap is one prefix")]
    Composite(String),
    #[error(
        "pattern {0:?} has an empty model before its '/' (expected e.g. \"NVIDIA-H200/mig-*\")"
    )]
    EmptyModel(String),
    #[error("pattern {name:?} is {len} characters long; at most {MAX_NAME_LEN} are allowed")]
    TooLong { name: String, len: usize },
}

impl CardPattern {
    /// True when `key` is meant as a pattern (it ends in `*`).
    pub fn is_pattern(key: &str) -> bool {
        key.ends_with('*')
    }

    /// Parses a key ending in `*`. A `*` elsewhere is part of a model name.
    pub fn parse(key: &str) -> Result<Self, PatternError> {
        let Some(prefix) = key.strip_suffix('*') else {
            return Err(PatternError::DoubleStar(shown(key)));
        };
        if key.len() > MAX_NAME_LEN {
            return Err(PatternError::TooLong {
                name: shown(key),
                len: key.len(),
            });
        }
        // A `*` inside is part of a model's name (MPS: `NVIDIA-H800/mps-80g*1/2`); two
        // at the end are a typo.
        if prefix.ends_with('*') {
            return Err(PatternError::DoubleStar(shown(key)));
        }
        if key.chars().any(char::is_whitespace) {
            return Err(PatternError::Whitespace(shown(key)));
        }
        if key.contains('|') {
            return Err(PatternError::Composite(shown(key)));
        }
        if prefix.starts_with('/') {
            return Err(PatternError::EmptyModel(shown(key)));
        }
        Ok(Self {
            prefix: Arc::from(prefix),
        })
    }

    /// True for a pattern over sub-card models (its prefix has a `/`).
    pub fn is_sub_card(&self) -> bool {
        self.prefix.contains('/')
    }

    /// True when the cap counts `m`'s cards.
    pub fn matches(&self, m: &CardName) -> bool {
        let name = m.as_str();
        name.starts_with(&*self.prefix) && name.contains('/') == self.is_sub_card()
    }

    /// True when every model `other` matches, this one matches too (`*` contains
    /// `NVIDIA-*`; a pattern contains itself).
    pub fn contains(&self, other: &CardPattern) -> bool {
        self.is_sub_card() == other.is_sub_card() && other.prefix.starts_with(&*self.prefix)
    }

    /// The prefix's length: of two nested patterns, the longer is the inner one.
    pub fn specificity(&self) -> usize {
        self.prefix.len()
    }
}

impl fmt::Display for CardPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CardPattern {
        CardPattern::parse(s).unwrap()
    }
    fn m(s: &str) -> CardName {
        CardName::parse(s).unwrap()
    }

    #[test]
    fn a_pattern_without_a_slash_counts_whole_cards_only() {
        assert!(p("*").matches(&m("NVIDIA-H200")));
        assert!(!p("*").matches(&m("NVIDIA-H200/mig-1g.18gb")));
        assert!(p("NVIDIA-*").matches(&m("NVIDIA-A100")));
        assert!(!p("NVIDIA-*").matches(&m("AMD-MI300X")));
    }

    #[test]
    fn a_pattern_with_a_slash_counts_the_sub_cards_under_it() {
        let mig = p("NVIDIA-H200/mig-*");
        assert!(mig.matches(&m("NVIDIA-H200/mig-1g.18gb-mixed")));
        assert!(!mig.matches(&m("NVIDIA-H200")));
        assert!(!mig.matches(&m("NVIDIA-H200/mps-4")));
        assert!(p("NVIDIA-H200/*").matches(&m("NVIDIA-H200/mps-4")));
    }

    #[test]
    fn patterns_nest_or_are_disjoint() {
        assert!(p("*").contains(&p("NVIDIA-*")));
        assert!(!p("NVIDIA-*").contains(&p("*")));
        assert!(!p("*").contains(&p("NVIDIA-H200/*")));
        assert!(p("NVIDIA-H200/*").contains(&p("NVIDIA-H200/mig-*")));
        assert!(!p("NVIDIA-A*").contains(&p("NVIDIA-H*")));
    }

    #[test]
    fn malformed_patterns_are_refused_with_the_reason() {
        assert!(matches!(
            CardPattern::parse("**"),
            Err(PatternError::DoubleStar(_))
        ));
        assert!(matches!(
            CardPattern::parse("NVIDIA-**"),
            Err(PatternError::DoubleStar(_))
        ));
        // MPS model names hold a '*': a pattern over them may too.
        assert!(CardPattern::parse("NVIDIA-H800/mps-80g*1/*")
            .unwrap()
            .matches(&m("NVIDIA-H800/mps-80g*1/2")));
        assert!(matches!(
            CardPattern::parse("/mig-*"),
            Err(PatternError::EmptyModel(_))
        ));
        assert!(matches!(
            CardPattern::parse("A *"),
            Err(PatternError::Whitespace(_))
        ));
        assert!(matches!(
            CardPattern::parse("A|B*"),
            Err(PatternError::Composite(_))
        ));
        assert_eq!(
            CardPattern::parse("**").unwrap_err().to_string(),
            "a group cap ends in one '*' after a prefix (such as \"NVIDIA-*\" or \"*\"), got \"**\""
        );
    }
}
