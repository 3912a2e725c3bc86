//! Subcommands: thin shells over the core.

pub mod check;
pub mod demo;
pub mod manifests;
pub mod preflight;
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

/// `--card-full`: what a queue without `volcano.sh/card.full` does with a pod that
/// does not fit its room now but could fit its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FullArg {
    /// Refuse it (its controller retries with its own backoff).
    #[default]
    Refuse,
    /// Admit it behind card-quota's scheduling gate and release it when room appears.
    Wait,
}

impl From<FullArg> for crate::cards::annotations::Full {
    fn from(a: FullArg) -> Self {
        match a {
            FullArg::Refuse => Self::Refuse,
            FullArg::Wait => Self::Wait,
        }
    }
}

/// `--enforcement`: what a queue without `volcano.sh/card.enforcement` does with a
/// request that does not fit its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum EnforcementArg {
    /// Refuse it.
    #[default]
    Deny,
    /// Admit it with a warning, an Event and a metric (a safe rollout).
    Warn,
}

impl From<EnforcementArg> for crate::decide::Enforcement {
    fn from(a: EnforcementArg) -> Self {
        match a {
            EnforcementArg::Deny => Self::Deny,
            EnforcementArg::Warn => Self::Warn,
        }
    }
}

impl From<ScalePolicyArg> for ScalePolicy {
    fn from(a: ScalePolicyArg) -> Self {
        match a {
            ScalePolicyArg::Clamp => Self::Clamp,
            ScalePolicyArg::Deny => Self::Deny,
        }
    }
}
