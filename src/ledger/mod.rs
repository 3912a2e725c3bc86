//! Usage per queue and model, and the exact feasibility check.

pub mod adjusted;
pub mod clock;
pub mod feasibility;
pub mod flow;
pub mod tally;
pub mod usage;

pub use adjusted::Adjusted;
pub use feasibility::{check, Demand, Verdict, DEFAULT_BUDGET};
pub use tally::Tally;
pub use usage::{bound_charges, queue_usage, QueueUsage, Row, Share, UsageKey};
pub mod entries;
pub mod record;
pub mod seal;

pub use entries::{Effect, Entry, EntryKey, Hold, Ledger, LedgerError};
pub use record::{ledger_record, LedgerRecord};
