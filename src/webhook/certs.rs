//! `card-quota certs`: a CA kept beside the serving certificate, so that the serving
//! certificate is renewed under the CA the API server already trusts, and the CA itself
//! is rotated with an overlap (old and new CA both in the caBundle) instead of an outage.
//!
//! Files in the certificate directory: `ca.crt`, `ca.key` (0600), `tls.crt`, `tls.key`
//! (0600), and during a CA rotation `ca-previous.crt`.

use std::net::IpAddr;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// What `certs` is asked to do with the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new CA and serving certificate; refused when a CA is already there.
    New,
    /// A new serving certificate under the kept CA (no caBundle change).
    Renew,
    /// A new CA; the old one stays trusted as `ca-previous.crt` until `DropPreviousCa`.
    RotateCa,
    /// Ends a rotation: the previous CA leaves the caBundle.
    DropPreviousCa,
    /// Replaces everything (the old CA is no longer trusted once the caBundle changes).
    Force,
}

/// The names the serving certificate is for.
#[derive(Debug, Clone)]
pub struct Names {
    pub service: String,
    pub namespace: String,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Names {
    /// The Service's in-cluster name the API server calls.
    pub fn service_host(&self) -> String {
        service_host(&self.service, &self.namespace)
    }
}

fn service_host(service: &str, namespace: &str) -> String {
    format!("{service}.{namespace}.svc")
}

/// Errors of `certs` and of reading its directory.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} exists: the API server may trust this CA today. --renew issues a new serving certificate under it (no caBundle change); --rotate-ca makes a new CA and keeps this one trusted until the rotation ends; --force replaces both (card pods are refused until the new caBundle and certificate are both in place)")]
    Exists { path: String },
    #[error("{path} is missing: certificates made before card-quota kept its CA key cannot be renewed; use --rotate-ca")]
    NoCaKey { path: String },
    #[error("{path} is missing: no CA to renew under; run certs without --renew first")]
    NoCa { path: String },
    #[error("{path}: no CA rotation in progress (nothing to drop)")]
    NoPrevious { path: String },
    #[error("{path}: not a PEM certificate")]
    NotPem { path: String },
    #[error("{path} is for {have}, not {want}: make certificates for this namespace with `card-quota certs --namespace {namespace}`")]
    WrongNames {
        path: String,
        have: String,
        want: String,
        namespace: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertsError {
    let p = path.display().to_string();
    move |source| CertsError::Io { path: p, source }
}

fn read(path: &Path) -> Result<String, CertsError> {
    std::fs::read_to_string(path).map_err(io(path))
}

/// Writes `text` to `dir/name` with `mode`, created with that mode (a key is never
/// readable by others, not even briefly).
fn write(dir: &Path, name: &str, text: &str, mode: u32) -> Result<(), CertsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io(&tmp))?;
    // Renamed into place: a reader (a replica reloading) sees the old file or the new.
    std::fs::rename(&tmp, &p).map_err(io(&p))
}

/// The validity period, from today (00:00 UTC, which also covers a little clock skew).
fn period(params: &mut CertificateParams, years: i16) {
    let today = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date();
    let day = |years: i16| {
        rcgen::date_time_ymd(
            i32::from(today.year() + years),
            u8::try_from(today.month()).unwrap_or(1),
            // Feb 29 does not exist in most target years.
            u8::try_from(today.day().min(28)).unwrap_or(1),
        )
    };
    params.not_before = day(0);
    params.not_after = day(years);
}

fn new_ca(namespace: &str) -> Result<(String, KeyPair, CertificateParams), CertsError> {
    let key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("card-quota CA ({namespace})"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    period(&mut ca, 10);
    let pem = ca.self_signed(&key)?.pem();
    Ok((pem, key, ca))
}

/// The serving certificate and its key, signed by `issuer`.
fn leaf(names: &Names, issuer: &Issuer<'_, KeyPair>) -> Result<(String, String), CertsError> {
    let (service, namespace) = (&names.service, &names.namespace);
    let mut dns = vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        service_host(service, namespace),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    dns.extend(names.dns.iter().cloned());
    let mut leaf = CertificateParams::new(dns)?;
    leaf.distinguished_name
        .push(DnType::CommonName, service_host(service, namespace));
    for ip in &names.ips {
        leaf.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    period(&mut leaf, 2);
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Does what `mode` says in `out`; returns the caBundle to install (PEM).
pub fn issue(names: &Names, out: &Path, mode: Mode) -> Result<String, CertsError> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let (ca_crt, ca_key, previous) = (
        out.join("ca.crt"),
        out.join("ca.key"),
        out.join("ca-previous.crt"),
    );
    let issuer = match mode {
        Mode::New if ca_crt.exists() => {
            return Err(CertsError::Exists {
                path: ca_crt.display().to_string(),
            })
        }
        Mode::DropPreviousCa => {
            if !previous.exists() {
                return Err(CertsError::NoPrevious {
                    path: previous.display().to_string(),
                });
            }
            std::fs::remove_file(&previous).map_err(io(&previous))?;
            return ca_bundle(out);
        }
        Mode::Renew => {
            if !ca_crt.exists() {
                return Err(CertsError::NoCa {
                    path: ca_crt.display().to_string(),
                });
            }
            if !ca_key.exists() {
                return Err(CertsError::NoCaKey {
                    path: ca_key.display().to_string(),
                });
            }
            let key = KeyPair::from_pem(&read(&ca_key)?)?;
            Issuer::from_ca_cert_pem(&read(&ca_crt)?, key)?
        }
        Mode::RotateCa | Mode::New | Mode::Force => {
            if mode == Mode::RotateCa && ca_crt.exists() {
                write(out, "ca-previous.crt", &read(&ca_crt)?, 0o644)?;
            }
            if mode == Mode::Force {
                let _ = std::fs::remove_file(&previous);
            }
            let (pem, key, params) = new_ca(&names.namespace)?;
            write(out, "ca.key", &key.serialize_pem(), 0o600)?;
            write(out, "ca.crt", &pem, 0o644)?;
            Issuer::new(params, key)
        }
    };
    let (crt, key) = leaf(names, &issuer)?;
    write(out, "tls.key", &key, 0o600)?;
    write(out, "tls.crt", &crt, 0o644)?;
    ca_bundle(out)
}

/// Every CA the API server should trust: `ca.crt`, then `ca-previous.crt` during a
/// rotation.
pub fn ca_bundle(dir: &Path) -> Result<String, CertsError> {
    let mut bundle = read(&dir.join("ca.crt"))?;
    let previous = dir.join("ca-previous.crt");
    if previous.exists() {
        if !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&read(&previous)?);
    }
    Ok(bundle)
}

/// The DNS names and the expiry (Unix seconds) of the PEM certificate at `path`.
pub fn names_and_expiry(path: &Path) -> Result<(Vec<String>, i64), CertsError> {
    use rustls::pki_types::pem::PemObject;
    let not_pem = || CertsError::NotPem {
        path: path.display().to_string(),
    };
    let der = rustls::pki_types::CertificateDer::from_pem_slice(read(path)?.as_bytes())
        .map_err(|_| not_pem())?;
    let (_, c) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(|_| not_pem())?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push((*d).to_string());
            }
        }
    }
    Ok((names, c.validity().not_after.timestamp()))
}

/// Checks that `dir/tls.crt` is for `service` in `namespace` (the name the API server
/// calls), so that an install into another namespace fails at `manifests`, not at the
/// first admission.
pub fn check_service(dir: &Path, service: &str, namespace: &str) -> Result<(), CertsError> {
    let path = dir.join("tls.crt");
    let (names, _) = names_and_expiry(&path)?;
    let want = service_host(service, namespace);
    if names.contains(&want) {
        return Ok(());
    }
    Err(CertsError::WrongNames {
        path: path.display().to_string(),
        have: names
            .iter()
            .find(|n| n.ends_with(".svc"))
            .or(names.first())
            .cloned()
            .unwrap_or_else(|| "no DNS name".into()),
        want,
        namespace: namespace.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(namespace: &str) -> Names {
        Names {
            service: "card-quota".into(),
            namespace: namespace.into(),
            dns: vec![],
            ips: vec![],
        }
    }

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cq-certs-{}-{}",
            std::process::id(),
            jiff::Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_ca_key_is_kept_private_and_a_second_run_refuses_to_overwrite() {
        let d = dir();
        issue(&names("card-quota"), &d, Mode::New).unwrap();
        assert_eq!(mode_of(&d.join("ca.key")), 0o600);
        assert_eq!(mode_of(&d.join("tls.key")), 0o600);
        let e = issue(&names("card-quota"), &d, Mode::New).unwrap_err();
        assert!(e.to_string().contains("ca.crt exists"), "{e}");
    }

    #[test]
    fn renewing_keeps_the_ca_and_the_new_certificate_chains_to_it() {
        let d = dir();
        let bundle = issue(&names("card-quota"), &d, Mode::New).unwrap();
        let old_leaf = read(&d.join("tls.crt")).unwrap();
        let renewed = issue(&names("card-quota"), &d, Mode::Renew).unwrap();
        assert_eq!(bundle, renewed, "the caBundle does not change");
        let new_leaf = read(&d.join("tls.crt")).unwrap();
        assert_ne!(old_leaf, new_leaf);
        assert!(chains_to(&new_leaf, &bundle));
    }

    #[test]
    fn a_ca_rotation_trusts_both_cas_until_it_ends() {
        let d = dir();
        issue(&names("card-quota"), &d, Mode::New).unwrap();
        let old_leaf = read(&d.join("tls.crt")).unwrap();
        let during = issue(&names("card-quota"), &d, Mode::RotateCa).unwrap();
        let new_leaf = read(&d.join("tls.crt")).unwrap();
        // Replicas still serving the old certificate and those serving the new one are
        // both trusted while the rotation lasts.
        assert!(chains_to(&old_leaf, &during) && chains_to(&new_leaf, &during));
        let after = issue(&names("card-quota"), &d, Mode::DropPreviousCa).unwrap();
        assert!(chains_to(&new_leaf, &after) && !chains_to(&old_leaf, &after));
        let e = issue(&names("card-quota"), &d, Mode::DropPreviousCa).unwrap_err();
        assert!(e.to_string().contains("no CA rotation in progress"), "{e}");
    }

    #[test]
    fn renewing_without_a_kept_ca_key_says_what_to_do() {
        let d = dir();
        issue(&names("card-quota"), &d, Mode::New).unwrap();
        std::fs::remove_file(d.join("ca.key")).unwrap();
        let e = issue(&names("card-quota"), &d, Mode::Renew).unwrap_err();
        assert!(e.to_string().contains("use --rotate-ca"), "{e}");
    }

    #[test]
    fn certificates_for_another_namespace_are_named() {
        let d = dir();
        issue(&names("card-quota"), &d, Mode::New).unwrap();
        check_service(&d, "card-quota", "card-quota").unwrap();
        let e = check_service(&d, "card-quota", "gpu").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} is for card-quota.card-quota.svc, not card-quota.gpu.svc: make certificates for this namespace with `card-quota certs --namespace gpu`",
                d.join("tls.crt").display()
            )
        );
    }

    /// True when `leaf` (PEM) verifies against one of the CAs of `bundle` (PEM).
    fn chains_to(leaf: &str, bundle: &str) -> bool {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let der = CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap();
        let name = rustls::pki_types::ServerName::try_from("card-quota.card-quota.svc").unwrap();
        verifier
            .verify_server_cert(&der, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .is_ok()
    }
}
