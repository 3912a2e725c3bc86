//! Card model names, alternatives and queue names: the vocabulary of docs/decisions.md.

use std::fmt;
use std::sync::Arc;

/// A canonical card model name, e.g. `NVIDIA-H200` or `NVIDIA-H200/mig-1g.18gb-mixed`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CardName(Arc<str>);

/// Why a model name or an alternatives list is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty model name")]
    Empty,
    #[error("model name {0:?} contains whitespace")]
    Whitespace(String),
    #[error("empty alternative in {0:?} (expected A or A|B|C)")]
    EmptyAlternative(String),
    #[error("model {model:?} is listed twice in {list:?}")]
    DuplicateAlternative { model: String, list: String },
    #[error("model name {0:?} contains '|' where a single model is expected")]
    Composite(String),
    #[error("{count} alternatives; at most {MAX_ALTERNATIVES} are allowed")]
    TooManyAlternatives { count: usize },
    #[error("model name {name:?} is {len} characters long; at most {MAX_NAME_LEN} are allowed")]
    TooLong { name: String, len: usize },
}

/// How many models one `A|B|C` may list: bounds the work of every decision that reads
/// it (a pod's pin search, the feasibility check) whatever a user writes.
pub const MAX_ALTERNATIVES: usize = 32;
/// The longest model name: a product label value (63) with a MIG or MPS suffix fits.
pub const MAX_NAME_LEN: usize = 253;

/// A user-supplied string as messages quote it: at most 64 characters, the rest
/// summarised, so a hostile value cannot blow up a refusal, a log line or an Event.
pub fn shown(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}... ({} bytes)", &s[..cut], s.len()),
    }
}

impl CardName {
    /// Parses one model name: non-empty, no whitespace, no `|`.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if s.chars().any(char::is_whitespace) {
            return Err(NameError::Whitespace(shown(s)));
        }
        if s.contains('|') {
            return Err(NameError::Composite(shown(s)));
        }
        if s.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong {
                name: shown(s),
                len: s.len(),
            });
        }
        Ok(Self(Arc::from(s)))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for CardName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for CardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One or more acceptable models, most preferred first (`A|B|C`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Alternatives(Arc<[CardName]>);

impl Alternatives {
    /// Parses `A` or `A|B|C`; rejects empty alternatives, whitespace and duplicates.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        let count = s.split('|').count();
        if count > MAX_ALTERNATIVES {
            return Err(NameError::TooManyAlternatives { count });
        }
        let mut out: Vec<CardName> = Vec::with_capacity(count);
        for part in s.split('|') {
            if part.is_empty() {
                return Err(NameError::EmptyAlternative(shown(s)));
            }
            let name = CardName::parse(part)?;
            if out.contains(&name) {
                return Err(NameError::DuplicateAlternative {
                    model: shown(part),
                    list: shown(s),
                });
            }
            out.push(name);
        }
        Ok(Self(out.into()))
    }

    /// A single model as a one-element list.
    pub fn single(name: CardName) -> Self {
        Self(Arc::from(vec![name]))
    }

    /// Builds from an ordered, duplicate-free list; `None` when empty.
    pub fn from_models(models: Vec<CardName>) -> Option<Self> {
        let mut out: Vec<CardName> = Vec::new();
        for m in models {
            if !out.contains(&m) {
                out.push(m);
            }
        }
        (!out.is_empty()).then(|| Self(out.into()))
    }

    pub fn models(&self) -> &[CardName] {
        &self.0
    }

    pub fn first(&self) -> &CardName {
        &self.0[0]
    }

    pub fn contains(&self, m: &CardName) -> bool {
        self.0.contains(m)
    }

    /// The single model when there is exactly one.
    pub fn as_single(&self) -> Option<&CardName> {
        match &self.0[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// True when every model here is also in `other`.
    pub fn is_subset_of(&self, other: &Alternatives) -> bool {
        self.0.iter().all(|m| other.contains(m))
    }
}

impl fmt::Display for Alternatives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            f.write_str(m.as_str())?;
        }
        Ok(())
    }
}

/// A Volcano queue name. Shared, not copied: every pod of a queue refers to it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueName(Arc<str>);

/// No walk over the tree of queues goes further than this many queues (DESIGN's depth
/// limit is far below it).
pub const WALK_LIMIT: usize = 64;

impl QueueName {
    /// Volcano's top queue: every queue without `spec.parent` is under it.
    pub const ROOT: &'static str = "root";
    pub fn new(s: impl Into<String>) -> Self {
        Self(Arc::from(s.into()))
    }
    /// Volcano's default queue, used when a pod names none.
    pub fn default_queue() -> Self {
        Self(Arc::from("default"))
    }
    /// True for Volcano's default queue.
    pub fn is_default(&self) -> bool {
        &*self.0 == "default"
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_model_name_parses() {
        assert_eq!(
            CardName::parse("NVIDIA-H200").unwrap().as_str(),
            "NVIDIA-H200"
        );
    }

    #[test]
    fn alternatives_keep_their_order() {
        let a = Alternatives::parse("B|A|C").unwrap();
        assert_eq!(a.to_string(), "B|A|C");
        assert_eq!(a.first().as_str(), "B");
    }

    #[test]
    fn long_values_are_shortened_in_messages() {
        let long = format!("A {}", "x".repeat(10_000));
        let e = Alternatives::parse(&long).unwrap_err().to_string();
        assert!(e.len() < 120, "{e}");
        assert!(e.contains("(10002 bytes)"), "{e}");
        assert_eq!(shown("short"), "short");
        assert_eq!(
            shown(&"é".repeat(65)),
            format!("{}... (130 bytes)", "é".repeat(64))
        );
    }

    #[test]
    fn malformed_alternatives_are_refused() {
        assert!(matches!(
            Alternatives::parse("A||B"),
            Err(NameError::EmptyAlternative(_))
        ));
        assert!(matches!(
            Alternatives::parse("|A"),
            Err(NameError::EmptyAlternative(_))
        ));
        assert!(matches!(
            Alternatives::parse("A|"),
            Err(NameError::EmptyAlternative(_))
        ));
        assert!(matches!(
            Alternatives::parse("A|A"),
            Err(NameError::DuplicateAlternative { .. })
        ));
        assert!(matches!(
            Alternatives::parse("A B"),
            Err(NameError::Whitespace(_))
        ));
        assert!(matches!(Alternatives::parse(""), Err(NameError::Empty)));
    }
}
