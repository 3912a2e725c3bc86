//! The webhook server: HTTPS admission, TLS material, health and the metrics endpoint.

pub mod certs;
pub mod forward;
pub mod metrics;
pub mod server;
pub mod tls;
