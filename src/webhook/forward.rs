//! Sends a review to the replica that owns its queue (see [`crate::routing`]) and
//! brings back that replica's answer. Every replica serves the same certificate (one
//! Secret), so a peer is trusted when it presents exactly the certificate this replica
//! serves: no CA or name to configure, and nothing else can answer in a peer's place.
//! The same certificate is this replica's client certificate, which a peer under
//! `--client-ca` accepts from a replica.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::routing::{Peer, FORWARDED_HEADER};

use super::tls::{Reloading, TlsError};

/// The largest answer taken from a peer (an answer is a few KiB at most).
const MAX_ANSWER: usize = 1 << 20;

/// Why a review could not be forwarded (the replica then decides it itself).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no answer from {peer} within {within:?}")]
    Timeout { peer: String, within: Duration },
    #[error("{peer}: {source}")]
    Request {
        peer: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("{peer} answered HTTP {status}")]
    Status { peer: String, status: u16 },
    #[error("{peer}: reading the answer: {message}")]
    Body { peer: String, message: String },
    #[error("building the request to {peer}: {message}")]
    Build { peer: String, message: String },
    #[error("the owner's answer is not passed on: {0}")]
    Answer(String),
}

/// Accepts a server presenting the certificate this replica serves now.
#[derive(Debug)]
struct SameCertificate {
    ours: Arc<Reloading>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SameCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.ours.certificate() {
            Some(c) if c.as_ref() == end_entity.as_ref() => Ok(ServerCertVerified::assertion()),
            // A peer mid-rotation serves another certificate for a moment: the review
            // is then decided here, which is correct, only slower.
            _ => Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Presents the certificate this replica serves when a peer asks for a client
/// certificate (under `--client-ca`, peers accept it as a replica's).
#[derive(Debug)]
struct OwnCertificate(Arc<Reloading>);

impl ResolvesClientCert for OwnCertificate {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.certified())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// An HTTPS client to the other replicas (connections kept alive between reviews).
pub struct Forwarder {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    me: String,
}

impl Forwarder {
    /// A client that trusts peers serving the certificate `ours` serves, and names
    /// this replica `me` on what it forwards.
    pub fn new(ours: Arc<Reloading>, me: &str) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ours_key = ours.clone();
        let verifier = Arc::new(SameCertificate {
            ours,
            algorithms: provider.signature_verification_algorithms,
        });
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(Arc::new(OwnCertificate(ours_key)));
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(1)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            // Idle connections go before the peer's server closes them (5 s): a request
            // on a connection closed under it would count as the owner failing.
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(2))
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build(https),
            me: me.to_string(),
        })
    }

    /// POSTs `body` (an AdmissionReview) to `path` on `peer` and returns its answer,
    /// or why there is none within `within`.
    pub async fn send(
        &self,
        peer: &Peer,
        path: &str,
        body: Bytes,
        within: Duration,
    ) -> Result<Vec<u8>, ForwardError> {
        let name = || peer.name.clone();
        let req = hyper::Request::post(format!("https://{}{path}", peer.addr))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(FORWARDED_HEADER, self.me.as_str())
            .body(Full::new(body))
            .map_err(|e| ForwardError::Build {
                peer: name(),
                message: e.to_string(),
            })?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|source| ForwardError::Request {
                    peer: name(),
                    source,
                })?;
            if resp.status() != hyper::StatusCode::OK {
                return Err(ForwardError::Status {
                    peer: name(),
                    status: resp.status().as_u16(),
                });
            }
            let body = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| ForwardError::Body {
                    peer: name(),
                    message: e.to_string(),
                })?;
            Ok(body.to_bytes().to_vec())
        };
        tokio::time::timeout(within, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(ForwardError::Timeout {
                    peer: name(),
                    within,
                })
            })
    }
}
