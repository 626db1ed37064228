//! A launcher for Postfix's `smtp-sink`, a real SMTP server that can be told to fail in
//! particular ways (`-Q MAIL`: 421 and hang up; `-r RCPT`: 4xx; `-q DATA`: hang up without a
//! reply; `-W DATA:5`: stall), on a loopback port it binds itself.
//!
//! ```ignore
//! let Some(sink) = SmtpSink::start("healthy_server_delivers", &["-Q", "MAIL"]) else {
//!     return; // not installed: SKIPPED was printed (under CI=true it panicked instead)
//! };
//! let smtp = SmtpTransport::unencrypted("127.0.0.1", sink.port());
//! ```
//!
//! The server is killed when the `SmtpSink` is dropped; [`SmtpSink::stop`] and
//! [`SmtpSink::restart`] take it down and bring it back on the same port.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use super::ready::{
    ServerProcess, listens_on, smtp_greeting, wait_for_bound_port, wait_until_ready,
};
use super::servers::require_program;

/// How long a freshly started smtp-sink has to greet.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a restart tries its port (it can take a moment to be free after the kill).
const START_ATTEMPTS: usize = 5;

/// A running `smtp-sink` on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct SmtpSink {
    program: PathBuf,
    flags: Vec<String>,
    port: u16,
    /// Holds the server's stderr log and, when counting, the dumped messages.
    dir: PathBuf,
    dump_dir: Option<PathBuf>,
    /// How many times it was started: each start dumps under its own file-name prefix.
    starts: usize,
    child: Option<ServerProcess>,
}

impl SmtpSink {
    /// Starts `smtp-sink` with `flags` (e.g. `&["-r", "RCPT"]`) on a loopback port it binds
    /// itself and waits until it greets there.
    ///
    /// Returns `None` after printing `SKIPPED <test>` when smtp-sink is not installed; under
    /// `CI=true` that panics instead.
    pub fn start(test: &str, flags: &[&str]) -> Option<SmtpSink> {
        SmtpSink::launch(test, flags, false)
    }

    /// Like [`start`](Self::start), and also writes each message the server accepts to a file
    /// (`-d`) so that [`received`](Self::received) can count them.
    pub fn start_counting(test: &str, flags: &[&str]) -> Option<SmtpSink> {
        SmtpSink::launch(test, flags, true)
    }

    fn launch(test: &str, flags: &[&str], counting: bool) -> Option<SmtpSink> {
        let program = require_program("smtp-sink", test)?;
        let dir = scratch_dir();
        let dump_dir = counting.then(|| {
            let dump_dir = dir.join("messages");
            fs::create_dir_all(&dump_dir).expect("creating the smtp-sink dump folder");
            // As root smtp-sink drops to `nobody`, which must be able to write here.
            fs::set_permissions(&dump_dir, fs::Permissions::from_mode(0o777))
                .expect("opening the dump folder to the smtp-sink user");
            dump_dir
        });
        let mut sink = SmtpSink {
            program,
            flags: flags.iter().map(|flag| (*flag).to_owned()).collect(),
            port: 0,
            dir,
            dump_dir,
            starts: 0,
            child: None,
        };
        // Port 0: smtp-sink binds a port itself, and the launcher reads which from /proc.
        if let Err(error) = sink.spawn() {
            panic!("{test}: {error}");
        }
        Some(sink)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Whether the server process is alive.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(process) => process.exited().is_none(),
            None => false,
        }
    }

    /// Kills the server; its port then refuses connections until [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut process) = self.child.take() {
            process.kill();
        }
    }

    /// Starts the server again on the same port with the same flags (stopping it first if it
    /// runs), and waits until it greets there.
    pub fn restart(&mut self) {
        self.stop();
        // The port may be briefly unavailable just after the old process exits.
        for _ in 0..START_ATTEMPTS {
            if self.spawn().is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "smtp-sink did not restart on port {}: {}",
            self.port,
            self.log()
        );
    }

    /// How many messages the server has accepted (finished with `.` and dumped) so far, over
    /// all its restarts. Only for a sink made with [`start_counting`](Self::start_counting).
    ///
    /// smtp-sink opens a message's file at `MAIL FROM` and removes it if the transaction is
    /// abandoned, so count once the sends have been answered: a transaction still in
    /// progress is counted too.
    pub fn received(&self) -> usize {
        let dump_dir = self
            .dump_dir
            .as_ref()
            .expect("received() needs a sink made with SmtpSink::start_counting");
        fs::read_dir(dump_dir)
            .expect("reading the smtp-sink dump folder")
            .filter(|entry| entry.as_ref().is_ok_and(|e| e.path().is_file()))
            .count()
    }

    /// The `Subject:` of each message the server has accepted so far, over all its restarts,
    /// in no particular order (the dump files have random names). Only for a sink made with
    /// [`start_counting`](Self::start_counting).
    pub fn received_subjects(&self) -> Vec<String> {
        let dump_dir = self
            .dump_dir
            .as_ref()
            .expect("received_subjects() needs a sink made with SmtpSink::start_counting");
        fs::read_dir(dump_dir)
            .expect("reading the smtp-sink dump folder")
            .filter_map(|entry| fs::read(entry.ok()?.path()).ok())
            .filter_map(|dump| {
                String::from_utf8_lossy(&dump)
                    .lines()
                    .find_map(|line| line.strip_prefix("Subject: ").map(str::to_owned))
            })
            .collect()
    }

    /// The text of every message file the server has written so far, over all its restarts,
    /// in no particular order. Only for a sink made with [`start_counting`](Self::start_counting).
    ///
    /// A file ends with an empty line after the message once the server has read the final
    /// `.`; a server killed mid-transaction can leave a file cut short (or empty) behind.
    pub fn received_dumps(&self) -> Vec<String> {
        let dump_dir = self
            .dump_dir
            .as_ref()
            .expect("received_dumps() needs a sink made with SmtpSink::start_counting");
        fs::read_dir(dump_dir)
            .expect("reading the smtp-sink dump folder")
            .filter_map(|entry| fs::read(entry.ok()?.path()).ok())
            .map(|dump| String::from_utf8_lossy(&dump).into_owned())
            .collect()
    }

    /// What smtp-sink wrote to stderr, for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("smtp-sink.log")).unwrap_or_default()
    }

    /// Spawns the process on `self.port` (0 the first time: any port, which it then learns)
    /// and waits until the server greets there.
    fn spawn(&mut self) -> Result<(), String> {
        let mut command = Command::new(&self.program);
        if running_as_root() {
            // smtp-sink refuses to run as root without dropping privileges.
            command.args(["-u", "nobody"]);
        }
        if let Some(dump_dir) = &self.dump_dir {
            // smtp-sink appends a pseudo-random hex suffix to the template, and a restarted
            // sink can draw the names its first run used: it then finds each taken and stops
            // ("mail_file_open: something is looping"). Each start has its own prefix.
            command
                .arg("-d")
                .arg(dump_dir.join(format!("message.{}.", self.starts)));
        }
        self.starts += 1;
        let log = File::create(self.dir.join("smtp-sink.log"))
            .map_err(|error| format!("creating the smtp-sink log: {error}"))?;
        let child = command
            .args(&self.flags)
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("128")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| format!("spawning {}: {error}", self.program.display()))?;
        // Owned before the wait: a failed wait still kills it.
        let mut process = ServerProcess::new(child);
        let log_file = self.dir.join("smtp-sink.log");
        let log = || fs::read_to_string(&log_file).unwrap_or_default();
        if self.port == 0 {
            self.port = wait_for_bound_port("smtp-sink", &mut process, STARTUP_TIMEOUT, log)?;
        }
        let address = self.address();
        let pid = process.id();
        wait_until_ready("smtp-sink", &mut process, STARTUP_TIMEOUT, log, || {
            smtp_greeting(address)?;
            // The greeting must come from this process, not one that held the port.
            if listens_on(pid, address.port()) {
                Ok(())
            } else {
                Err(format!("port {} is not this smtp-sink's", address.port()))
            }
        })?;
        self.child = Some(process);
        Ok(())
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether this process runs as root (smtp-sink then needs `-u nobody`).
fn running_as_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// A fresh folder for one sink's log and dumps, readable by the `nobody` user.
fn scratch_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mail-breaker-smtp-sink-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating a scratch folder for smtp-sink");
    // The dump folder inside must be reachable by the `nobody` user.
    let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o755));
    dir
}
