//! Helpers for the webhook receivers' tests (`tests/webhooks_*.rs`): a sink that keeps in
//! memory what it is given (each id once, as the `EventSink` contract says), a request
//! through the router in process, SNS's side played by the test (its own RSA key and
//! certificate, served over HTTPS at `sns.us-east-1.amazonaws.com` resolved to loopback), and
//! the independent implementations the cross-checks run (PyPI's `svix` and `sendgrid`, npm's
//! `sns-validator`), which skip without them, or fail under `CI=true`.
#![allow(dead_code)]

#[path = "../support/servers.rs"]
mod servers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::{SignatureEncoding, Signer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

pub use servers::under_ci;

/// A sink that keeps each `(provider, event_id, recipient)` once, and can be made to fail.
#[derive(Default)]
pub struct Recorder {
    kept: Mutex<Vec<DeliveryEvent>>,
    failing: AtomicBool,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    /// What was kept, in order.
    pub fn events(&self) -> Vec<DeliveryEvent> {
        self.kept.lock().unwrap().clone()
    }

    /// From now on every `keep` fails (a database down).
    pub fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

#[async_trait]
impl EventSink for Recorder {
    async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(KeepError::new("the test's sink is failing"));
        }
        let mut kept = self.kept.lock().unwrap();
        let mut new = 0;
        for event in events {
            let seen = kept.iter().any(|k| {
                k.provider == event.provider
                    && k.event_id == event.event_id
                    && k.recipient == event.recipient
            });
            if !seen {
                kept.push(event.clone());
                new += 1;
            }
        }
        Ok(Kept { new })
    }
}

/// POSTs `body` with `headers` to `path` through `router`, in process.
pub async fn post(
    router: &Router,
    path: &str,
    headers: &[(&str, String)],
    body: impl Into<Vec<u8>>,
) -> (StatusCode, String) {
    let mut request = Request::post(path);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request.body(Body::from(body.into())).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Now, as Unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `at` as SNS writes times: `2026-12-07T08:00:00.000Z`.
pub fn iso(at: SystemTime) -> String {
    let seconds = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.000Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

// ---------------------------------------------------------------------------------------
// SNS, played by the test.

/// The host SNS signs from in these tests, resolved to the test's loopback server.
pub const SNS_HOST: &str = "sns.us-east-1.amazonaws.com";
/// The topic the tests' policies allow.
pub const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:ses-events";
/// Where the test's server serves the signing certificate.
pub const CERT_PATH: &str = "/SimpleNotificationService-0000000000000000000000000000000.pem";

/// The test's SNS: an RSA key and its certificate (the signing certificate), a test CA and
/// a TLS certificate it signed for `sns.us-east-1.amazonaws.com`, and an HTTPS server on
/// loopback that serves the signing certificate at [`CERT_PATH`], a redirect to it at
/// `/redirect.pem`, and answers `200` to `/?Action=ConfirmSubscription...`; it records
/// every path asked for.
pub struct Sns {
    dir: tempfile::TempDir,
    key: rsa::RsaPrivateKey,
    pub addr: SocketAddr,
    pub ca_pem: Vec<u8>,
    pub signing_cert_pem: String,
    requests: Arc<Mutex<Vec<String>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Sns {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Which hash signs: SNS's `SignatureVersion` 1 (SHA-1) or 2 (SHA-256).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureVersion {
    V1,
    V2,
}

impl Sns {
    /// Makes the keys and starts the server, or `None` after printing SKIPPED without the
    /// `openssl` command (a failure under CI).
    pub async fn start(test: &str) -> Option<Sns> {
        let openssl = servers::require_program("openssl", test)?;
        let dir = tempfile::tempdir().unwrap();
        make_certificates(&openssl, dir.path());
        let key_pem = std::fs::read_to_string(dir.path().join("sign.key")).unwrap();
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(&key_pem).unwrap();
        let signing_cert_pem = std::fs::read_to_string(dir.path().join("sign.pem")).unwrap();
        let ca_pem = std::fs::read(dir.path().join("ca.pem")).unwrap();
        let acceptor = acceptor(dir.path());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let server = tokio::spawn(serve(
            listener,
            acceptor,
            signing_cert_pem.clone(),
            requests.clone(),
        ));
        Some(Sns {
            dir,
            key,
            addr,
            ca_pem,
            signing_cert_pem,
            requests,
            server,
        })
    }

    /// A policy that allows [`TOPIC`] (and `more`), fetching from this server.
    pub fn policy(&self, more: &[&str]) -> mail_breaker::webhooks::SnsPolicy {
        let mut policy = mail_breaker::webhooks::SnsPolicy::new()
            .allow_topic(TOPIC)
            .resolve(SNS_HOST, self.addr)
            .trust_root_pem(&self.ca_pem)
            .unwrap()
            .fetch_timeout(Duration::from_secs(5));
        for topic in more {
            policy = policy.allow_topic(*topic);
        }
        policy
    }

    /// Every path the server was asked for.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// The certificate URL the tests sign with.
    pub fn cert_url(&self) -> String {
        format!("https://{SNS_HOST}{CERT_PATH}")
    }

    /// The CA's PEM file, for a client outside this process (node).
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A notification carrying `message`, published at `at`, signed.
    pub fn notification(
        &self,
        version: SignatureVersion,
        message_id: &str,
        message: &str,
        at: SystemTime,
    ) -> serde_json::Value {
        let mut envelope = serde_json::json!({
            "Type": "Notification",
            "MessageId": message_id,
            "TopicArn": TOPIC,
            "Subject": "Amazon SES Email Event Notification",
            "Message": message,
            "Timestamp": iso(at),
            "SigningCertURL": self.cert_url(),
            "UnsubscribeURL": format!("https://{SNS_HOST}/?Action=Unsubscribe&SubscriptionArn={TOPIC}:0000"),
        });
        self.sign(&mut envelope, version);
        envelope
    }

    /// A subscription confirmation for `topic`, signed.
    pub fn confirmation(&self, version: SignatureVersion, topic: &str) -> serde_json::Value {
        let mut envelope = serde_json::json!({
            "Type": "SubscriptionConfirmation",
            "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
            "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a747ba6f3beb71854e285d6ad02428b09ceece29417f1f02d609c582afbacc99c583a916b9981dd2728f4ae6fdb82efd087cc3b7849e05798d2d2785c03b0879594eeac82c01f235d0e717736",
            "TopicArn": topic,
            "Message": format!("You have chosen to subscribe to the topic {topic}.\nTo confirm the subscription, visit the SubscribeURL included in this message."),
            "SubscribeURL": format!("https://{SNS_HOST}/?Action=ConfirmSubscription&TopicArn={topic}&Token=2336412f37"),
            "Timestamp": iso(SystemTime::now()),
            "SigningCertURL": self.cert_url(),
        });
        self.sign(&mut envelope, version);
        envelope
    }

    /// Sets `SignatureVersion` and `Signature` over AWS's canonical string of the fields
    /// present, as AWS's documentation writes it (the test's own signer, independent of the
    /// crate's verifier).
    pub fn sign(&self, envelope: &mut serde_json::Value, version: SignatureVersion) {
        let fields: &[&str] = if envelope["Type"] == "Notification" {
            &[
                "Message",
                "MessageId",
                "Subject",
                "Timestamp",
                "TopicArn",
                "Type",
            ]
        } else {
            &[
                "Message",
                "MessageId",
                "SubscribeURL",
                "Timestamp",
                "Token",
                "TopicArn",
                "Type",
            ]
        };
        let mut canonical = String::new();
        for field in fields {
            if let Some(value) = envelope[*field].as_str() {
                canonical.push_str(&format!("{field}\n{value}\n"));
            }
        }
        let signature = match version {
            SignatureVersion::V1 => SigningKey::<sha1::Sha1>::new(self.key.clone())
                .sign(canonical.as_bytes())
                .to_vec(),
            SignatureVersion::V2 => SigningKey::<sha2::Sha256>::new(self.key.clone())
                .sign(canonical.as_bytes())
                .to_vec(),
        };
        envelope["SignatureVersion"] = match version {
            SignatureVersion::V1 => "1".into(),
            SignatureVersion::V2 => "2".into(),
        };
        envelope["Signature"] = STANDARD.encode(signature).into();
    }
}

/// The signing key and certificate (RSA 2048, self-signed: SNS's certificate is checked by
/// its URL's host, not its chain), and a CA with a TLS certificate for the SNS host.
fn make_certificates(openssl: &Path, dir: &Path) {
    let run = |args: &[&str]| {
        let output = Command::new(openssl)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "sign.key",
        "-out",
        "sign.pem",
        "-days",
        "2",
        "-subj",
        "/CN=sns.amazonaws.com",
    ]);
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
            "/CN=mail-breaker SNS test CA",
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
            "/CN=sns.us-east-1.amazonaws.com",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:sns.us-east-1.amazonaws.com\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
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

fn acceptor(dir: &Path) -> TlsAcceptor {
    let certificate = CertificateDer::from_pem_file(dir.join("server.pem")).unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certificate], key)
        .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    certificate: String,
    requests: Arc<Mutex<Vec<String>>>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let acceptor = acceptor.clone();
        let certificate = certificate.clone();
        let requests = requests.clone();
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(stream).await else {
                return;
            };
            let mut head = Vec::new();
            let mut buffer = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
                match tls.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buffer[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head);
            let path = head.split(' ').nth(1).unwrap_or("").to_owned();
            requests.lock().unwrap().push(path.clone());
            let (status, extra, body) = if path == CERT_PATH {
                ("200 OK", String::new(), certificate)
            } else if path == "/redirect.pem" {
                (
                    "302 Found",
                    format!("Location: https://{SNS_HOST}{CERT_PATH}\r\n"),
                    String::new(),
                )
            } else if path.starts_with("/?Action=ConfirmSubscription") {
                (
                    "200 OK",
                    String::new(),
                    "<ConfirmSubscriptionResponse/>".to_owned(),
                )
            } else {
                ("404 Not Found", String::new(), String::new())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.write_all(response.as_bytes()).await;
            let _ = tls.shutdown().await;
        });
    }
}

// ---------------------------------------------------------------------------------------
// The independent implementations.

/// A Python that imports `module` (from PATH, or the venv `.ci/run` makes), or `None` after
/// printing SKIPPED (a failure under CI).
pub fn python_with(module: &str, test: &str) -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("python3")];
    if let Some(venv) = std::env::var_os("MAIL_BREAKER_VENV") {
        candidates.insert(0, PathBuf::from(venv).join("bin/python3"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/mail-breaker/moto-venv/bin/python3"));
    }
    for python in candidates {
        let imports = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if imports {
            return Some(python);
        }
    }
    missing(test, &format!("the Python module `{module}`"))
}

/// The `node_modules` folder holding `package` (under `$HOME/.cache/mail-breaker/node`, or
/// `MAIL_BREAKER_NODE`), with `node` on PATH; or `None` after printing SKIPPED (a failure
/// under CI).
pub fn node_with(package: &str, test: &str) -> Option<PathBuf> {
    let root = std::env::var_os("MAIL_BREAKER_NODE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".cache/mail-breaker/node"))
        })?;
    let modules = root.join("node_modules");
    let node = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if node && modules.join(package).is_dir() {
        return Some(modules);
    }
    missing(
        test,
        &format!(
            "node and the npm package `{package}` in {}",
            modules.display()
        ),
    )
}

fn missing(test: &str, what: &str) -> Option<PathBuf> {
    assert!(
        !under_ci(),
        "{test}: {what} is not installed, and CI=true requires it (bash .ci/run installs it)"
    );
    servers::report_skip(&format!(
        "SKIPPED {test}: {what} is not installed (bash .ci/run installs it)"
    ));
    None
}

/// Runs `program` with `args`, `stdin` as its input, and gives its standard output; panics
/// with its error output when it fails.
pub fn run(program: &Path, args: &[&str], envs: &[(&str, &str)], stdin: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{} {args:?} failed: {}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
