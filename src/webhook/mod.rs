//! The webhook server: HTTPS admission, TLS material, health and metrics.

pub mod metrics;
pub mod server;
pub mod tls;
