//! A real SMTP server that logs in with OAuth 2.0: Python's `aiosmtpd` with `XOAUTH2` and
//! `OAUTHBEARER` (RFC 7628) mechanisms whose authenticator checks the mailbox and the bearer
//! token, after STARTTLS (a certificate made with `openssl` for `localhost`, signed by a
//! test CA the client is told to trust). A separate launcher from `support::aiosmtpd`, so
//! that one stays as it is.
//!
//! ```ignore
//! let Some(server) = OAuthSmtpd::start(test, Offered::Both) else { return };
//! let tls = Tls::Required(server.tls_parameters());
//! ```
//!
//! It accepts the user [`USER`] with the token [`GOOD_TOKEN`] and refuses any other: a
//! refused XOAUTH2 login gets `535` at once (as Microsoft 365 answers), a refused
//! OAUTHBEARER one the RFC's `334` error challenge first and `535` after the client's
//! `%x01` (as Gmail answers). It answers each message `250 2.0.0 Ok: queued as OAUTH1` and
//! is killed on drop.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use lettre::transport::smtp::client::{Certificate, TlsParameters};

use super::servers::{free_port, report_skip, require_program, under_ci};
use super::test_certs::make_certificates;

/// The mailbox the server accepts.
pub const USER: &str = "mailer@example.com";
/// The one token it accepts.
pub const GOOD_TOKEN: &str = "ya29.good-token";

/// How long a freshly started server has to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Which OAuth mechanisms the server offers (and nothing else: no PLAIN, no LOGIN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    XOAuth2,
    OAuthBearer,
    Both,
}

const SCRIPT: &str = r#"
import argparse, base64, json, ssl, sys, threading
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--offered", choices=["xoauth2", "oauthbearer", "both"], required=True)
parser.add_argument("--cert", required=True)
parser.add_argument("--key", required=True)
parser.add_argument("--user", required=True)
parser.add_argument("--token", required=True)
parser.add_argument("--clear", action="store_true")
args = parser.parse_args()

def log(line):
    print(line, file=sys.stderr, flush=True)

def fields(text, separator):
    out = {}
    for part in text.split(separator):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key] = value
    return out

def decode(args_):
    if len(args_) < 2:
        return None
    try:
        return base64.b64decode(args_[1], validate=True).decode()
    except Exception:
        return None

class Handler:
    async def handle_DATA(self, server, session, envelope):
        return "250 2.0.0 Ok: queued as OAUTH1"

    async def auth_XOAUTH2(self, server, args_):
        text = decode(args_)
        if text is None:
            return AuthResult(success=False, handled=False)
        parts = fields(text, "\x01")
        token = parts.get("auth", "").removeprefix("Bearer ")
        log("TOKEN XOAUTH2 " + token)
        ok = parts.get("user") == args.user and token == args.token and text.endswith("\x01\x01")
        return AuthResult(success=ok, handled=False)

    async def auth_OAUTHBEARER(self, server, args_):
        text = decode(args_)
        if text is None or not text.startswith("n,"):
            return AuthResult(success=False, handled=False)
        header, _, rest = text.partition("\x01")
        user = header.split(",")[1].removeprefix("a=").replace("=2C", ",").replace("=3D", "=")
        parts = fields(rest, "\x01")
        token = parts.get("auth", "").removeprefix("Bearer ")
        log("TOKEN OAUTHBEARER " + token)
        if user == args.user and token == args.token and "host" in parts and "port" in parts:
            return AuthResult(success=True)
        # RFC 7628 3.2.2: the error as a JSON challenge; the client answers %x01.
        error = json.dumps({"status": "invalid_token", "scope": "https://mail.google.com/"})
        answer = await server.challenge_auth(error)
        log("END " + repr(answer))
        return AuthResult(success=False, handled=False)

class LoggingSMTP(SMTP):
    async def smtp_AUTH(self, arg):
        log("AUTH " + (arg.split()[0] if arg else ""))
        return await super().smtp_AUTH(arg)

class LoggingController(Controller):
    def factory(self):
        return LoggingSMTP(self.handler, **self.SMTP_kwargs)

excluded = ["PLAIN", "LOGIN"]
if args.offered == "xoauth2":
    excluded.append("OAUTHBEARER")
if args.offered == "oauthbearer":
    excluded.append("XOAUTH2")
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(args.cert, args.key)
if args.clear:
    controller = LoggingController(
        Handler(), hostname="127.0.0.1", port=args.port, require_starttls=False,
        auth_require_tls=False, auth_required=True, auth_exclude_mechanism=excluded)
else:
    controller = LoggingController(
        Handler(), hostname="127.0.0.1", port=args.port, tls_context=context,
        require_starttls=True, auth_require_tls=True, auth_required=True,
        auth_exclude_mechanism=excluded)
controller.start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// A running OAuth aiosmtpd on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct OAuthSmtpd {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl OAuthSmtpd {
    /// Starts the server on a free loopback port and waits until it accepts connections.
    ///
    /// Returns `None` after printing `SKIPPED <test>` when python3, aiosmtpd or openssl is
    /// missing; under `CI=true` that panics instead.
    pub fn start(test: &str, offered: Offered) -> Option<OAuthSmtpd> {
        OAuthSmtpd::launch(test, offered, false)
    }

    /// [`start`](Self::start), but without TLS and taking AUTH in clear text: for a client
    /// that cannot be told to trust the test CA (a DSN), with `auth_without_tls`.
    pub fn start_clear(test: &str, offered: Offered) -> Option<OAuthSmtpd> {
        OAuthSmtpd::launch(test, offered, true)
    }

    fn launch(test: &str, offered: Offered, clear: bool) -> Option<OAuthSmtpd> {
        let python = require_program("python3", test)?;
        let openssl = require_program("openssl", test)?;
        if !has_aiosmtpd(&python) {
            assert!(
                !under_ci(),
                "{test}: the Python module aiosmtpd is not installed, and CI=true requires it \
                 (bash .ci/run installs it)"
            );
            report_skip(&format!(
                "SKIPPED {test}: the Python module aiosmtpd is not installed (bash .ci/run installs it)"
            ));
            return None;
        }
        let dir = scratch_dir();
        make_certificates(&openssl, &dir);
        fs::write(dir.join("server.py"), SCRIPT).expect("writing the aiosmtpd script");
        let port = free_port();
        let log = fs::File::create(dir.join("server.log")).expect("creating the server log");
        let offered = match offered {
            Offered::XOAuth2 => "xoauth2",
            Offered::OAuthBearer => "oauthbearer",
            Offered::Both => "both",
        };
        let clear: &[&str] = if clear { &["--clear"] } else { &[] };
        let child = Command::new(&python)
            .arg(dir.join("server.py"))
            .args(clear)
            .args(["--port", &port.to_string(), "--offered", offered])
            .arg("--cert")
            .arg(dir.join("server.pem"))
            .arg("--key")
            .arg(dir.join("server.key"))
            .args(["--user", USER, "--token", GOOD_TOKEN])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning python3");
        let mut server = OAuthSmtpd { port, dir, child };
        server.wait_until_listening(test);
        Some(server)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// TLS for `localhost` that trusts the test CA which signed the server's certificate.
    pub fn tls_parameters(&self) -> TlsParameters {
        let pem = fs::read(self.dir.join("ca.pem")).expect("reading the test CA");
        TlsParameters::builder("localhost".to_owned())
            .add_root_certificate(Certificate::from_pem(&pem).expect("a PEM certificate"))
            .build()
            .expect("valid TLS parameters")
    }

    /// What the server wrote to stderr, for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The tokens the server was shown, each as `<MECHANISM> <token>`, in order.
    pub fn tokens_seen(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|line| line.strip_prefix("TOKEN "))
            .map(str::to_owned)
            .collect()
    }

    fn wait_until_listening(&mut self, test: &str) {
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{test}: aiosmtpd exited at start with {status}: {}",
                    self.log()
                );
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{test}: aiosmtpd did not listen within {STARTUP_TIMEOUT:?}: {}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OAuthSmtpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn has_aiosmtpd(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import aiosmtpd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A fresh folder for one server's certificates, script and log.
fn scratch_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mail-breaker-aiosmtpd-oauth-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating a scratch folder for aiosmtpd");
    dir
}
