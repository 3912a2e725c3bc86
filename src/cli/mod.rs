//! Subcommands: thin shells over the core.

pub mod demo;
pub mod manifests;
pub mod replay;
pub mod status;

use crate::decide::ScalePolicy;

/// `--scale-policy`: what to do about a scale-up that does not fully fit. (The decision
/// core's own enum knows nothing of command lines.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ScalePolicyArg {
    /// Lower `spec.replicas` to what fits (the HPA then sits at the quota).
    #[default]
    Clamp,
    /// Refuse the scale-up.
    Deny,
}

impl From<ScalePolicyArg> for ScalePolicy {
    fn from(a: ScalePolicyArg) -> Self {
        match a {
            ScalePolicyArg::Clamp => Self::Clamp,
            ScalePolicyArg::Deny => Self::Deny,
        }
    }
}
