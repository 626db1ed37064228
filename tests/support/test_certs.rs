//! Certificates for TLS tests: a test CA and a server certificate it signed for `localhost` and
//! `127.0.0.1`, made with the `openssl` command, which the client is told to trust. Used by the
//! aiosmtpd launcher and by the scripted raw server's STARTTLS.
//!
//! ```ignore
//! let Some(certificates) = TestCertificates::make(test) else {
//!     return; // no openssl: SKIPPED was printed (under CI=true it panicked instead)
//! };
//! let server = RawSmtp::start_with_tls(greeting, certificates.acceptor(), script).await;
//! let tls = Tls::Required(certificates.tls_parameters());
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lettre::transport::smtp::client::{Certificate, TlsParameters};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::servers::require_program;

/// A test CA and a server certificate in a scratch folder, removed on drop.
#[derive(Debug)]
pub struct TestCertificates {
    dir: PathBuf,
}

impl TestCertificates {
    /// Makes them, or returns `None` after printing `SKIPPED <test>` when openssl is missing
    /// (under `CI=true` that panics instead).
    pub fn make(test: &str) -> Option<TestCertificates> {
        let openssl = require_program("openssl", test)?;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mail-breaker-certs-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("creating a scratch folder for certificates");
        make_certificates(&openssl, &dir);
        Some(TestCertificates { dir })
    }

    /// One of the files: `ca.pem`, `server.pem` or `server.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Client TLS for `localhost` that trusts the test CA.
    pub fn tls_parameters(&self) -> TlsParameters {
        let pem = fs::read(self.dir.join("ca.pem")).expect("reading the test CA");
        TlsParameters::builder("localhost".to_owned())
            .add_root_certificate(Certificate::from_pem(&pem).expect("a PEM certificate"))
            .build()
            .expect("valid TLS parameters")
    }

    /// The server's side of the handshake, with the certificate the CA signed. The crypto
    /// provider is named: more than one is compiled in, so rustls has no default.
    pub fn acceptor(&self) -> TlsAcceptor {
        let certificate = CertificateDer::from_pem_file(self.dir.join("server.pem"))
            .expect("reading the server certificate");
        let key = PrivateKeyDer::from_pem_file(self.dir.join("server.key"))
            .expect("reading the server key");
        let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![certificate], key)
            .expect("a certificate that matches its key");
        TlsAcceptor::from(Arc::new(config))
    }
}

impl Drop for TestCertificates {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Makes a test CA (`ca.pem`) and a server certificate it signed (`server.pem`,
/// `server.key`) for `localhost` and `127.0.0.1`, valid for two days.
pub fn make_certificates(openssl: &Path, dir: &Path) {
    let run = |args: &[&str]| {
        let output = Command::new(openssl)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .expect("running openssl");
        assert!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=mail-breaker test CA",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    ]
    .concat());
    fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("writing the certificate's extensions");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
}
