//! Subcommands: thin shells over the core.

pub mod demo;
pub mod replay;
pub mod status;
