//! What the store needs for Redis over TLS and with ACL users: the crypto provider, a private
//! authority's certificate, and telling a refusal (credentials, certificate) that waiting
//! would not mend from a server that does not answer yet.

use ::redis::{ErrorKind, RedisError, TlsCertificates};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::ConfigError;

/// Makes ring the process's rustls crypto provider if the application chose none: redis-rs
/// builds its TLS settings with the process default, and with more than one provider compiled
/// in (ring here, aws-lc-rs in other crates) rustls cannot pick one by itself.
pub(super) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one in between: either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A `ConfigError` for `setting` unless `url` asks for TLS (`rediss://`).
pub(super) fn require_tls_url(setting: &'static str, url: &str) -> Result<(), ConfigError> {
    if url.starts_with("rediss://") {
        Ok(())
    } else {
        Err(ConfigError::new(
            setting,
            "a certificate authority is for TLS: expected a rediss:// URL",
        ))
    }
}

/// The certificates that trust only the authority in `ca_pem`; a `ConfigError` for `ca_pem`
/// when it holds no PEM certificate.
pub(super) fn certificates(ca_pem: &[u8]) -> Result<TlsCertificates, ConfigError> {
    let found = CertificateDer::pem_slice_iter(ca_pem).next();
    if !matches!(found, Some(Ok(_))) {
        return Err(ConfigError::new(
            "ca_pem",
            "no PEM certificate (-----BEGIN CERTIFICATE-----) found",
        ));
    }
    Ok(TlsCertificates {
        client_tls: None,
        root_cert: Some(ca_pem.to_vec()),
    })
}

/// Why the server refused the store for good, if it did: its user or password, a permission
/// the user lacks, or a certificate this side does not trust.
pub(super) fn refusal(error: &RedisError) -> Option<String> {
    if error.kind() == ErrorKind::AuthenticationFailed || error.code() == Some("WRONGPASS") {
        return Some(format!(
            "Redis refused the user or password in the URL: {error}"
        ));
    }
    if error.code() == Some("NOPERM") {
        return Some(format!(
            "the Redis user may not run what the store needs (EVALSHA, SCRIPT LOAD, SCAN and its keys): {error}"
        ));
    }
    // redis-rs keeps the io::Error that carries rustls's error behind an `Arc<dyn Error>`,
    // which no downcast reaches; rustls's own words for it ("invalid peer certificate: …")
    // come through in the text.
    let text = error.to_string();
    if text.contains("invalid peer certificate") {
        return Some(format!(
            "the Redis server's TLS certificate is not trusted ({text}): give its authority with connect_with_ca"
        ));
    }
    None
}
