//! Card names, annotations, node discovery and pod demand: the vocabulary of card-quota.

pub mod annotations;
pub mod demand;
pub mod dra;
pub mod hashing;
pub mod names;
pub mod nodes;
pub mod pattern;
pub mod quantity;
pub mod resources;
pub mod subject;

pub use annotations::{AnnotationError, CardRequest, Quota};
pub use names::{Alternatives, CardName, NameError, ObjectKey, QueueName};
pub use nodes::NodeCards;
pub use pattern::CardPattern;
pub use quantity::Cards;
pub use resources::CardResources;
pub use subject::{Subject, WorkloadKind};
