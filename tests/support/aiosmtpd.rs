//! A launcher for a real SMTP server with TLS and AUTH: Python's `aiosmtpd`, run by a small
//! script on a loopback port it binds itself, with a certificate the test makes with the `openssl`
//! command for `localhost` and `127.0.0.1`, signed by a test CA that the client is told to
//! trust.
//!
//! ```ignore
//! let Some(server) = Aiosmtpd::start(test, Mode::StartTls, Mechanisms::PlainAndLogin) else {
//!     return; // not installed: SKIPPED was printed (under CI=true it panicked instead)
//! };
//! let tls = Tls::Required(server.tls_parameters());
//! ```
//!
//! The server accepts the user [`USER`] with the password [`PASSWORD`], requires AUTH before
//! MAIL, and answers each message `250 2.0.0 Ok: queued as AIO1`. It is killed on drop.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use lettre::transport::smtp::client::{Certificate, TlsParameters};

use super::ready::{ServerProcess, listens_on, smtp_greeting, wait_until_ready};
use super::servers::{report_skip, require_program, under_ci};
use super::test_certs::make_certificates;

/// The user the server accepts.
pub const USER: &str = "mailer";
/// That user's password.
pub const PASSWORD: &str = "s3cret pass";

/// How long a freshly started server has to say it is ready and greet.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// How the server speaks TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Clear text first; STARTTLS offered and required before AUTH and MAIL.
    StartTls,
    /// TLS from the first byte (SMTPS).
    Implicit,
    /// No TLS at all, and AUTH accepted in clear text (`auth_require_tls=False`): a local
    /// relay that lets a client authenticate without TLS, so that only the client can refuse.
    Clear,
}

/// Which AUTH mechanisms the server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanisms {
    PlainAndLogin,
    /// Only LOGIN, so that a client must use it.
    LoginOnly,
}

const SCRIPT: &str = r#"
import argparse, asyncio, ssl, sys
from aiosmtpd.smtp import SMTP, AuthResult

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["starttls", "implicit", "clear"], required=True)
parser.add_argument("--mechanisms", choices=["plain-and-login", "login-only"], required=True)
parser.add_argument("--cert", required=True)
parser.add_argument("--key", required=True)
parser.add_argument("--user", required=True)
parser.add_argument("--password", required=True)
args = parser.parse_args()

class Handler:
    async def handle_DATA(self, server, session, envelope):
        return "250 2.0.0 Ok: queued as AIO1"

def authenticator(server, session, envelope, mechanism, auth_data):
    ok = auth_data.login == args.user.encode() and auth_data.password == args.password.encode()
    # handled=False: aiosmtpd then answers a failure with its own 535.
    return AuthResult(success=ok, handled=False)

class LoggingSMTP(SMTP):
    # Each AUTH the server receives, on stderr (mechanism only), for Aiosmtpd::auth_commands.
    async def smtp_AUTH(self, arg):
        print("AUTH " + (arg.split()[0] if arg else ""), file=sys.stderr, flush=True)
        return await super().smtp_AUTH(arg)

context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(args.cert, args.key)
options = dict(
    authenticator=authenticator,
    auth_required=True,
    auth_exclude_mechanism=["PLAIN"] if args.mechanisms == "login-only" else [],
)
implicit_tls = None
if args.mode == "starttls":
    options.update(tls_context=context, require_starttls=True, auth_require_tls=True)
elif args.mode == "clear":
    options.update(require_starttls=False, auth_require_tls=False)
else:
    options.update(auth_require_tls=False)
    implicit_tls = context

async def main():
    # The server binds port 0 itself and says which port it got once it listens, so that no
    # port is chosen ahead and handed over (another process could take it meanwhile).
    handler = Handler()
    server = await asyncio.get_running_loop().create_server(
        lambda: LoggingSMTP(handler, **options), host="127.0.0.1", port=0, ssl=implicit_tls)
    print("ready %d" % server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"#;

/// A running aiosmtpd on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct Aiosmtpd {
    server: ScriptServer,
}

impl Aiosmtpd {
    /// Starts the server on a loopback port it binds itself and waits until it greets there.
    ///
    /// Returns `None` after printing `SKIPPED <test>` when python3, aiosmtpd or openssl is
    /// missing; under `CI=true` that panics instead.
    pub fn start(test: &str, mode: Mode, mechanisms: Mechanisms) -> Option<Aiosmtpd> {
        let mode_arg = match mode {
            Mode::StartTls => "starttls",
            Mode::Implicit => "implicit",
            Mode::Clear => "clear",
        };
        let mechanisms = match mechanisms {
            Mechanisms::PlainAndLogin => "plain-and-login",
            Mechanisms::LoginOnly => "login-only",
        };
        let args = ["--mode", mode_arg, "--mechanisms", mechanisms];
        let args = args.iter().chain(&["--user", USER, "--password", PASSWORD]);
        let server = ScriptServer::launch(test, "aiosmtpd", SCRIPT, args, mode != Mode::Implicit)?;
        Some(Aiosmtpd { server })
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// TLS for `localhost` that trusts the test CA which signed the server's certificate.
    pub fn tls_parameters(&self) -> TlsParameters {
        self.server.tls_parameters()
    }

    /// What the server wrote to stderr, for failure messages.
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// The AUTH commands the server received so far, each as `AUTH <mechanism>`, in order.
    pub fn auth_commands(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|line| line.starts_with("AUTH"))
            .map(str::to_owned)
            .collect()
    }
}

/// An aiosmtpd script run from a scratch folder that holds it, its log and a certificate for
/// `localhost` signed by a test CA; killed, and its folder removed, on drop.
///
/// The script binds port 0 itself and prints `ready PORT` once it listens, so that no port is
/// chosen ahead and handed over (another process could take it meanwhile); it is given
/// `--cert FILE --key FILE` beside the arguments of the launcher.
#[derive(Debug)]
pub(super) struct ScriptServer {
    pub(super) port: u16,
    pub(super) dir: PathBuf,
    process: ServerProcess,
}

impl ScriptServer {
    /// Runs `script` with `args` and waits for its ready line, then (where `greets_in_clear`)
    /// for its greeting, and checks that the port's listener is this process's. `None` after
    /// printing SKIPPED where python3, aiosmtpd or openssl is missing; a panic under CI.
    pub(super) fn launch<'a>(
        test: &str,
        what: &str,
        script: &str,
        args: impl IntoIterator<Item = &'a &'a str>,
        greets_in_clear: bool,
    ) -> Option<ScriptServer> {
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
        fs::write(dir.join("server.py"), script).expect("writing the aiosmtpd script");
        let log = fs::File::create(dir.join("server.log")).expect("creating the server log");
        let child = Command::new(&python)
            .arg(dir.join("server.py"))
            .args(args)
            .arg("--cert")
            .arg(dir.join("server.pem"))
            .arg("--key")
            .arg(dir.join("server.key"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawning python3");
        // Owned before the wait: a failed wait still kills it.
        let mut server = ScriptServer {
            port: 0,
            dir,
            process: ServerProcess::new(child),
        };
        if let Err(error) = server.wait_until_ready(what, greets_in_clear) {
            panic!("{test}: {error}");
        }
        Some(server)
    }

    /// TLS for `localhost` that trusts the test CA which signed the server's certificate.
    pub(super) fn tls_parameters(&self) -> TlsParameters {
        let pem = fs::read(self.dir.join("ca.pem")).expect("reading the test CA");
        TlsParameters::builder("localhost".to_owned())
            .add_root_certificate(Certificate::from_pem(&pem).expect("a PEM certificate"))
            .build()
            .expect("valid TLS parameters")
    }

    /// What the server wrote to stderr.
    pub(super) fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Waits for the script's `ready PORT` line, then for the SMTP greeting there where the
    /// greeting is in clear text, and checks that the port's listener is this process's.
    fn wait_until_ready(&mut self, what: &str, greets_in_clear: bool) -> Result<(), String> {
        let stdout = self
            .process
            .child_mut()
            .stdout
            .take()
            .ok_or("the script's stdout is not piped")?;
        let (ready_line, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if ready_line.send(line).is_err() {
                    break;
                }
            }
        });
        let log_dir = self.dir.clone();
        let log = move || fs::read_to_string(log_dir.join("server.log")).unwrap_or_default();
        let mut port = None;
        wait_until_ready(what, &mut self.process, STARTUP_TIMEOUT, &log, || {
            let line = lines
                .try_recv()
                .map_err(|_| String::from("no ready line yet"))?;
            port = line
                .strip_prefix("ready ")
                .and_then(|port| port.trim().parse::<u16>().ok());
            port.map(|_| ())
                .ok_or(format!("an unexpected line: {line:?}"))
        })?;
        self.port = port.ok_or("no port")?;
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        if greets_in_clear {
            wait_until_ready(what, &mut self.process, STARTUP_TIMEOUT, &log, || {
                smtp_greeting(address).map(drop)
            })?;
        }
        if !listens_on(self.process.id(), self.port) {
            return Err(format!(
                "port {} is not {what}'s; log: {}",
                self.port,
                log()
            ));
        }
        Ok(())
    }
}

impl Drop for ScriptServer {
    fn drop(&mut self) {
        self.process.kill();
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
        "mail-breaker-aiosmtpd-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating a scratch folder for aiosmtpd");
    dir
}
