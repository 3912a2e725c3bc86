//! Subcommands: thin shells over the core.

pub mod demo;
pub mod manifests;
pub mod replay;
pub mod status;
