//! A launcher for a real Postfix `smtpd` (the whole Postfix, from a private configuration in
//! a temporary folder, not `/etc/postfix`) on a free loopback port. It offers PIPELINING,
//! CHUNKING (BDAT), SIZE (a limit the test chooses), 8BITMIME, SMTPUTF8 and STARTTLS with a
//! certificate for `localhost` that the launcher makes with `openssl`, signed by a test CA a
//! client can trust ([`Postfix::tls_parameters`], [`Postfix::ca_pem`]).
//!
//! ```ignore
//! let options = PostfixOptions::default().message_size_limit(20_000).refuse("no@example.org");
//! let Some(postfix) = Postfix::start(test, options) else {
//!     return; // not installed, or not root: SKIPPED was printed (under CI=true it panicked)
//! };
//! let smtp = SmtpTransport::builder_dangerous("127.0.0.1").port(postfix.port()).build()?;
//! // ... send ...
//! let delivered = postfix.wait_for_deliveries(2, Duration::from_secs(10));
//! ```
//!
//! Every message is discarded (`default_transport = discard:`), one `discard` line per
//! recipient in `DIR/maillog`, which [`Postfix::delivered`] reads; recipients refused at RCPT
//! are in [`Postfix::rejected`]. It takes mail only for `example.org`: a recipient anywhere
//! else gets `554 5.7.1 <x@elsewhere.test>: Relay access denied`; and
//! [`PostfixOptions::refuse`] makes it refuse chosen `example.org` recipients with
//! `554 5.7.1` too, through a `check_recipient_access` table.
//!
//! Postfix runs only as root (it drops to its `postfix` user itself): as another user the
//! launcher skips like a missing server. Each launcher has its own folder (configuration,
//! queue, data, maillog) and port, so tests in one binary can each run their own. It is
//! stopped on drop (`postfix -c DIR stop`, then the master is killed if it lingers).
//!
//! The notes this follows: `/work/shared/notes/postfix-smtpd.md`.

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use lettre::transport::smtp::client::{Certificate, TlsParameters};

use super::servers::{free_port, report_skip, require_program, under_ci};

/// How long a freshly started Postfix has to greet on its port. It starts in well under a
/// second on an idle machine; the margin is for a machine busy with builds.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How many ports are tried before giving up (another process may take a "free" port).
const START_ATTEMPTS: usize = 3;

/// Where Debian keeps Postfix's daemons; `smtpd` among them.
const DAEMON_DIRECTORY: &str = "/usr/lib/postfix/sbin";

/// The reply code and enhanced status of a recipient refused by [`PostfixOptions::refuse`].
pub const REFUSAL: &str = "554 5.7.1";

/// What the test wants of its Postfix.
#[derive(Debug, Clone)]
pub struct PostfixOptions {
    message_size_limit: u64,
    refused: Vec<String>,
    extra: Vec<(String, String)>,
}

impl Default for PostfixOptions {
    fn default() -> Self {
        PostfixOptions {
            message_size_limit: 10_240_000,
            refused: Vec::new(),
            extra: Vec::new(),
        }
    }
}

impl PostfixOptions {
    /// The largest message Postfix takes, in bytes: what it announces as `SIZE <n>` in EHLO
    /// (default 10,240,000, Postfix's own default).
    pub fn message_size_limit(mut self, bytes: u64) -> Self {
        self.message_size_limit = bytes;
        self
    }

    /// Postfix refuses `recipient` at RCPT with `554 5.7.1 <recipient>: Recipient address
    /// rejected: refused by the test`; every other recipient is accepted.
    pub fn refuse(mut self, recipient: &str) -> Self {
        self.refused.push(recipient.to_owned());
        self
    }

    /// Any other `main.cf` setting, written after the launcher's own (so it wins).
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.extra.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// A running Postfix whose `smtpd` listens on `127.0.0.1:<port>`; stopped on drop.
#[derive(Debug)]
pub struct Postfix {
    postfix: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Postfix {
    /// Starts Postfix with `options` on a free loopback port and waits for its `220`.
    ///
    /// Returns `None` after printing `SKIPPED <test>` when Postfix (its `postfix` command,
    /// `smtpd`) or `openssl` is missing, or when not running as root; under `CI=true` each of
    /// those panics instead. A Postfix that is there but does not start panics with its
    /// `postfix check` output and its maillog.
    pub fn start(test: &str, options: PostfixOptions) -> Option<Postfix> {
        let postfix = require_program("postfix", test)?;
        let openssl = require_program("openssl", test)?;
        if !Path::new(DAEMON_DIRECTORY).join("smtpd").is_file() {
            return skip(
                test,
                &format!("Postfix's smtpd is not in {DAEMON_DIRECTORY} (bash .ci/run installs it)"),
            );
        }
        if !running_as_root() {
            return skip(test, "Postfix runs only as root");
        }
        let dir = scratch_dir();
        make_certificates(&openssl, &dir);
        let mut server = Postfix {
            postfix,
            dir,
            port: 0,
            child: None,
        };
        let mut failures = String::new();
        for attempt in 1..=START_ATTEMPTS {
            server.port = free_port();
            server.configure(&options);
            match server.spawn() {
                Ok(()) => return Some(server),
                Err(why) => {
                    let _ = writeln!(failures, "attempt {attempt}, port {}: {why}", server.port);
                    server.stop();
                }
            }
        }
        panic!(
            "{test}: Postfix did not start.\n{failures}\n`postfix check`: {}\nstart-fg output: \
             {}\nmaillog:\n{}",
            server.check(),
            fs::read_to_string(server.dir.join("start.log")).unwrap_or_default(),
            server.maillog()
        );
    }

    /// Whether Postfix can run here (its `postfix` command and `smtpd` installed, and this
    /// process root), without printing anything: for a bench, which skips rather than fails.
    pub fn can_run() -> bool {
        let installed = ["/usr/sbin/postfix", "/usr/bin/postfix"]
            .iter()
            .any(|path| Path::new(path).is_file());
        installed && Path::new(DAEMON_DIRECTORY).join("smtpd").is_file() && running_as_root()
    }

    /// The loopback port its `smtpd` listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The folder it runs from: `conf/`, `queue/`, `data/`, `maillog`, `ca.pem`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The test CA that signed the server's certificate, as PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        fs::read(self.ca_path()).expect("reading the test CA")
    }

    /// Where [`ca_pem`](Self::ca_pem) is on disk.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// TLS for `localhost` trusting the test CA (and nothing else).
    pub fn tls_parameters(&self) -> TlsParameters {
        TlsParameters::builder("localhost".to_owned())
            .add_root_certificate(Certificate::from_pem(&self.ca_pem()).expect("a PEM certificate"))
            .build()
            .expect("valid TLS parameters")
    }

    /// Everything Postfix logged so far.
    pub fn maillog(&self) -> String {
        fs::read_to_string(self.dir.join("maillog")).unwrap_or_default()
    }

    /// Each recipient Postfix delivered (to `discard:`) so far, one entry per delivery, in the
    /// maillog's order.
    pub fn delivered(&self) -> Vec<String> {
        self.maillog()
            .lines()
            .filter(|line| line.contains("postfix/discard[") && line.contains("status=sent"))
            .filter_map(recipient_of)
            .collect()
    }

    /// Each recipient `smtpd` refused at RCPT so far, in order. Postfix logs through
    /// `postlogd`, after it answered the client: see [`Self::wait_for_rejections`].
    pub fn rejected(&self) -> Vec<String> {
        self.maillog()
            .lines()
            .filter(|line| line.contains("postfix/smtpd[") && line.contains("reject: RCPT"))
            .filter_map(recipient_of)
            .collect()
    }

    /// Each `disconnect from ...` summary so far, e.g. `localhost[127.0.0.1] ehlo=1 mail=1
    /// rcpt=2/3 bdat=1 commands=5/6`: what each finished session said, counted by Postfix.
    /// The launcher's own check that the port greets shows as `quit=1 commands=1`.
    pub fn sessions(&self) -> Vec<String> {
        self.maillog()
            .lines()
            .filter_map(|line| {
                let at = line.find("disconnect from ")?;
                Some(line[at + "disconnect from ".len()..].to_owned())
            })
            .collect()
    }

    /// Waits (polling the maillog, up to `timeout`) until at least `count` deliveries were
    /// logged, and returns them all; panics with the maillog if they do not come. Postfix
    /// delivers after it answered the client, so a receipt comes before its maillog line.
    pub fn wait_for_deliveries(&self, count: usize, timeout: Duration) -> Vec<String> {
        self.wait_for("deliveries", Self::delivered, count, timeout)
    }

    /// Waits (polling the maillog, up to `timeout`) until at least `count` refusals at RCPT
    /// were logged, and returns them all; panics with the maillog if they do not come.
    /// `smtpd` hands its log line to `postlogd` after it answered the client, so a refusal
    /// the client has seen may not be in the maillog yet (seen once under `stress`).
    pub fn wait_for_rejections(&self, count: usize, timeout: Duration) -> Vec<String> {
        self.wait_for("refusals", Self::rejected, count, timeout)
    }

    /// Polls `read` (a reading of the maillog) every 25 ms until it returns at least `count`
    /// entries, and returns them; panics with the maillog after `timeout`.
    fn wait_for(
        &self,
        what: &str,
        read: fn(&Self) -> Vec<String>,
        count: usize,
        timeout: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let logged = read(self);
            if logged.len() >= count {
                return logged;
            }
            assert!(
                Instant::now() < deadline,
                "Postfix logged {} of {count} {what} within {timeout:?}: {logged:?}\nmaillog:\n{}",
                logged.len(),
                self.maillog()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// The output of `postfix -c DIR/conf check`: empty when the configuration is sound.
    pub fn check(&self) -> String {
        Command::new(&self.postfix)
            .arg("-c")
            .arg(self.conf())
            .arg("check")
            .stdin(Stdio::null())
            .output()
            .map(|output| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                )
            })
            .unwrap_or_else(|error| format!("could not run postfix check: {error}"))
    }

    /// Stops Postfix: `postfix stop`, then the master and the `start-fg` child are killed if
    /// they are still there after a few seconds.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new(&self.postfix)
            .arg("-c")
            .arg(self.conf())
            .arg("stop")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // It did not stop: kill the master (its pid file names it) and the child.
        if let Some(pid) = self.master_pid() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("conf")
    }

    fn master_pid(&self) -> Option<u32> {
        fs::read_to_string(self.dir.join("queue/pid/master.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Writes `conf/main.cf`, `conf/master.cf` (the system's, with `smtpd` on our port only)
    /// and the recipient table, and makes the queue and data folders.
    fn configure(&self, options: &PostfixOptions) {
        let dir = &self.dir;
        let conf = self.conf();
        for sub in ["conf", "queue", "data"] {
            fs::create_dir_all(dir.join(sub)).expect("creating Postfix's folders");
        }
        let mut refused = String::new();
        for recipient in &options.refused {
            let _ = writeln!(refused, "{recipient} REJECT 5.7.1 refused by the test");
        }
        fs::write(conf.join("refused"), refused).expect("writing the recipient table");

        let d = dir.display();
        let mut main = format!(
            "compatibility_level = 3.6\n\
             queue_directory = {d}/queue\n\
             data_directory = {d}/data\n\
             daemon_directory = {DAEMON_DIRECTORY}\n\
             maillog_file = {d}/maillog\n\
             maillog_file_prefixes = {d}\n\
             inet_interfaces = 127.0.0.1\n\
             inet_protocols = ipv4\n\
             myhostname = pfx{port}.test\n\
             mydestination =\n\
             mynetworks = 127.0.0.0/8\n\
             relay_domains = example.org\n\
             alias_maps =\n\
             alias_database =\n\
             default_transport = discard:\n\
             relay_transport = discard:\n\
             local_transport = discard:\n\
             smtpd_relay_restrictions = reject_unauth_destination\n\
             smtpd_recipient_restrictions = check_recipient_access texthash:{d}/conf/refused\n\
             access_map_reject_code = 554\n\
             message_size_limit = {size}\n\
             mailbox_size_limit = 0\n\
             smtpd_tls_cert_file = {d}/server.pem\n\
             smtpd_tls_key_file = {d}/server.key\n\
             smtpd_tls_security_level = may\n\
             smtpd_tls_loglevel = 1\n\
             smtpd_error_sleep_time = 0\n\
             smtpd_soft_error_limit = 1000\n\
             smtpd_hard_error_limit = 1000\n\
             smtpd_junk_command_limit = 100000\n\
             in_flow_delay = 0\n\
             smtpd_client_connection_count_limit = 0\n\
             smtpd_client_connection_rate_limit = 0\n",
            port = self.port,
            size = options.message_size_limit,
        );
        for (name, value) in &options.extra {
            let _ = writeln!(main, "{name} = {value}");
        }
        fs::write(conf.join("main.cf"), main).expect("writing main.cf");

        let system = fs::read_to_string("/etc/postfix/master.cf")
            .or_else(|_| fs::read_to_string("/usr/share/postfix/master.cf.dist"))
            .expect("reading Postfix's master.cf (/etc/postfix/master.cf)");
        let mut master = String::new();
        let mut in_listener = false;
        for line in system.lines() {
            // The system's own listeners (port 25, submission...) are not ours to open: they
            // are commented out, with their `  -o` continuation lines.
            let continues =
                line.starts_with(|c: char| c.is_whitespace()) && !line.trim().is_empty();
            if !continues {
                in_listener =
                    !line.starts_with('#') && line.split_whitespace().nth(1) == Some("inet");
            }
            if in_listener {
                let _ = writeln!(master, "#{line}");
            } else {
                let _ = writeln!(master, "{line}");
            }
        }
        // `n` for chroot: the temporary folder has no chroot tree.
        let _ = writeln!(master, "127.0.0.1:{} inet n - n - - smtpd", self.port);
        fs::write(conf.join("master.cf"), master).expect("writing master.cf");

        // The master's lock file lives in the data folder, which Postfix's user must own.
        let status = Command::new("chown")
            .args(["-R", "postfix:postfix"])
            .arg(dir.join("data"))
            .status()
            .expect("running chown");
        assert!(
            status.success(),
            "chown postfix:postfix of the data folder failed"
        );
    }

    /// Runs `postfix start-fg` as a child and waits until the port greets with `220`.
    fn spawn(&mut self) -> Result<(), String> {
        let log = fs::File::create(self.dir.join("start.log"))
            .map_err(|error| format!("creating start.log: {error}"))?;
        let err_log = log
            .try_clone()
            .map_err(|error| format!("cloning start.log: {error}"))?;
        let child = Command::new(&self.postfix)
            .arg("-c")
            .arg(self.conf())
            .arg("start-fg")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .spawn()
            .map_err(|error| format!("spawning {}: {error}", self.postfix.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("postfix start-fg exited with {status}"));
            }
            // Its own name in the greeting: not another server that took the "free" port.
            let ours = format!("220 pfx{}.test ", self.port);
            match greeting(self.address()) {
                Ok(line) if line.starts_with(&ours) => return Ok(()),
                Ok(line) => return Err(format!("the port answered {line:?}, not {ours:?}...")),
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                Err(error) => {
                    return Err(format!(
                        "no greeting within {STARTUP_TIMEOUT:?}; last try: {error}"
                    ));
                }
            }
        }
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            // Keep the folder of a failed test for a look, and say where it is.
            report_skip(&format!("Postfix's folder kept: {}", self.dir.display()));
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The first line a server at `address` sends, after which the session is ended with QUIT.
fn greeting(address: SocketAddr) -> std::io::Result<String> {
    let stream = TcpStream::connect_timeout(&address, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let _ = (&stream).write_all(b"QUIT\r\n");
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed before a greeting",
        ));
    }
    Ok(line.trim_end().to_owned())
}

/// The address in `to=<...>` on a maillog line.
fn recipient_of(line: &str) -> Option<String> {
    let start = line.find("to=<")? + "to=<".len();
    let end = start + line[start..].find('>')?;
    Some(line[start..end].to_owned())
}

fn skip(test: &str, why: &str) -> Option<Postfix> {
    assert!(
        !under_ci(),
        "{test}: {why}, and CI=true requires Postfix (bash .ci/run installs it; CI runs as root)"
    );
    report_skip(&format!("SKIPPED {test}: {why}"));
    None
}

fn running_as_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// A fresh folder for one Postfix, reachable by Postfix's own user (its daemons read the
/// configuration and write the queue and data folders there).
fn scratch_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mail-breaker-postfix-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating a scratch folder for Postfix");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .expect("opening the scratch folder to Postfix's user");
    dir
}

/// Makes a test CA (`ca.pem`) and a server certificate it signed (`server.pem`,
/// `server.key`) for `localhost` and `127.0.0.1`, as every TLS test does, with a key only
/// root reads.
fn make_certificates(openssl: &Path, dir: &Path) {
    super::test_certs::make_certificates(openssl, dir);
    // smtpd reads its key as root, before it drops to Postfix's user.
    let _ = fs::set_permissions(dir.join("server.key"), fs::Permissions::from_mode(0o600));
}
