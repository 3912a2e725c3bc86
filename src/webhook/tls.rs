//! TLS material: generating a CA and serving certificate (`card-quota certs`), and a
//! server certificate resolver that reloads rotated files without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::UnixTime;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

/// Errors of certificate generation and loading.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCert { path: String },
    #[error("{path}: not a usable PEM private key: {message}")]
    BadKey { path: String, message: String },
    #[error("{path}: not a usable client CA bundle (PEM certificates expected): {message}")]
    BadCa { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Rustls(rustls::Error),
}

/// Writes a new CA and serving certificate into `out` for the Service DNS names plus
/// extra SANs, replacing what is there; returns the caBundle (PEM). See
/// [`super::certs`] for renewal and rotation.
pub fn generate(
    service: &str,
    namespace: &str,
    extra_dns: &[String],
    ips: &[std::net::IpAddr],
    out: &Path,
) -> Result<String, super::certs::CertsError> {
    let names = super::certs::Names {
        service: service.to_string(),
        namespace: namespace.to_string(),
        dns: extra_dns.to_vec(),
        ips: ips.to_vec(),
    };
    super::certs::issue(&names, out, super::certs::Mode::Force)
}

/// Loads `tls.crt` and `tls.key` from a directory into a rustls certified key.
pub fn load(dir: &Path) -> Result<(Arc<CertifiedKey>, Vec<u8>), TlsError> {
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|source| TlsError::Io {
            path: p.display().to_string(),
            source,
        })
    };
    let (crt_pem, key_pem) = (read(&crt)?, read(&key)?);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&crt_pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCert {
            path: crt.display().to_string(),
        });
    }
    let bad = |message: String| TlsError::BadKey {
        path: key.display().to_string(),
        message,
    };
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| bad(e.to_string()))?;
    let signer =
        rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(|e| bad(e.to_string()))?;
    let ck = CertifiedKey::new(certs, signer);
    ck.keys_match()
        .map_err(|e| bad(format!("does not match tls.crt: {e}")))?;
    let mut fingerprint = crt_pem;
    fingerprint.extend_from_slice(&key_pem);
    Ok((Arc::new(ck), fingerprint))
}

/// Serves the current certificate; `reload` swaps it when the files change and stay valid.
#[derive(Debug)]
pub struct Reloading {
    dir: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Vec<u8>)>,
}

impl Reloading {
    pub fn new(dir: PathBuf) -> Result<Self, TlsError> {
        let cur = load(&dir)?;
        Ok(Self {
            dir,
            current: RwLock::new(cur),
        })
    }

    /// Re-reads the files (by content: Secret volumes swap symlinks, which file watches
    /// miss). Returns true when a new certificate was installed; keeps the old one if the
    /// new files are invalid.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (ck, fp) = load(&self.dir)?;
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        if cur.1 == fp {
            return Ok(false);
        }
        *cur = (ck, fp);
        Ok(true)
    }

    /// The certificate and key served now.
    pub fn certified(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// When the certificate served now expires (Unix seconds).
    pub fn not_after(&self) -> Option<i64> {
        let cert = self.certificate()?;
        let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        Some(c.validity().not_after.timestamp())
    }

    /// The certificate served now (its end-entity certificate).
    pub fn certificate(&self) -> Option<CertificateDer<'static>> {
        self.certified().cert.first().cloned()
    }

    /// True when `cert` is the certificate served now: a peer replica (every replica
    /// mounts the same Secret).
    pub fn serves(&self, cert: &CertificateDer<'_>) -> bool {
        self.certified()
            .cert
            .first()
            .is_some_and(|c| c.as_ref() == cert.as_ref())
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.certified())
    }
}

/// Who may call: clients presenting a certificate signed by `ca` (the API server's
/// webhook client certificate), optionally only under one of `names`.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// PEM bundle of the CA(s) that sign the API server's client certificate.
    pub ca: PathBuf,
    /// Accepted common names or DNS names; empty: any certificate `ca` signed.
    pub names: Vec<String>,
}

/// Verifies the client's chain against the CA, then its name. A peer replica
/// forwarding a charge (see `webhook::forward`) presents the certificate this replica
/// serves, and is accepted as such.
#[derive(Debug)]
struct NamedClients {
    chain: Arc<dyn ClientCertVerifier>,
    names: Vec<String>,
    peers: Arc<Reloading>,
}

/// The common name and DNS names of a certificate.
fn cert_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, c)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let mut out: Vec<String> = c
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                out.push((*d).to_string());
            }
        }
    }
    out
}

impl ClientCertVerifier for NamedClients {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self.peers.serves(end_entity) {
            return Ok(ClientCertVerified::assertion());
        }
        let ok = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        let names = cert_names(end_entity);
        if self.names.is_empty() || names.iter().any(|n| self.names.contains(n)) {
            Ok(ok)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

fn client_verifier(
    auth: &ClientAuth,
    provider: Arc<rustls::crypto::CryptoProvider>,
    peers: Arc<Reloading>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let path = auth.ca.display().to_string();
    let pem = std::fs::read(&auth.ca).map_err(|source| TlsError::Io {
        path: path.clone(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| TlsError::BadCa {
            path: path.clone(),
            message: e.to_string(),
        })?;
        roots.add(c).map_err(|e| TlsError::BadCa {
            path: path.clone(),
            message: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCert { path });
    }
    let chain = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::BadCa {
            path,
            message: e.to_string(),
        })?;
    Ok(Arc::new(NamedClients {
        chain,
        names: auth.names.clone(),
        peers,
    }))
}

/// A rustls server config (ring provider) over a reloading resolver, offering h2 and
/// http/1.1. With `client`, callers without a certificate it accepts (or the one this
/// replica serves, which peers present) are refused at the handshake.
pub fn server_config(
    resolver: Arc<Reloading>,
    client: Option<&ClientAuth>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?;
    let mut cfg = match client {
        Some(auth) => builder
            .with_client_cert_verifier(client_verifier(auth, provider, resolver.clone())?)
            .with_cert_resolver(resolver),
        None => builder.with_no_client_auth().with_cert_resolver(resolver),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // Resumed sessions skip a full handshake for the API server's reconnects.
    cfg.session_storage = rustls::server::ServerSessionMemoryCache::new(1024);
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod key_tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_private_key_is_readable_by_its_owner_only_and_the_files_load() {
        let dir = std::env::temp_dir().join(format!("cq-certs-{}", std::process::id()));
        for _ in 0..2 {
            // Twice: regenerating over existing files keeps the modes.
            super::generate("card-quota", "card-quota", &[], &[], &dir).unwrap();
            let mode =
                |f: &str| std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode("tls.key"), 0o600);
            assert_eq!(mode("tls.crt"), 0o644);
            assert!(super::load(&dir).is_ok());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
