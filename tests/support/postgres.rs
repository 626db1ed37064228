//! A real PostgreSQL server on a free loopback port, over a fresh cluster in a temporary
//! folder, started by a test and killed (and its folder removed) when dropped.

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::ready::{ServerProcess, listens_on, wait_until_ready};
use super::servers::{free_port, require_program};

/// The superuser `initdb` creates; trust authentication means the URL needs no password.
const USER: &str = "mail_breaker";

/// A `postgres` child process on 127.0.0.1 with fsync on: the outbox tests crash it and count
/// on what it committed surviving the restart.
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    /// The `setpriv` prefix that drops root to `nobody` (PostgreSQL refuses to run as root),
    /// or nothing. setpriv execs the program, so the child is the postmaster itself; runuser
    /// stays as its parent, and killing that child would leave the server running.
    as_user: Vec<String>,
    dir: PathBuf,
    port: u16,
    child: Option<ServerProcess>,
}

impl PostgresServer {
    /// Creates a cluster, starts a server on a free port and waits until it accepts
    /// connections; `None` (after printing SKIPPED) where PostgreSQL is not installed, a panic
    /// under CI.
    pub fn start(test: &str) -> Option<PostgresServer> {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let bin = find_bin(test)?;
        let as_user = unprivileged(test)?;
        let started = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("mail-breaker-pg-{}-{started}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir); // left by an earlier run that had the same pid
        std::fs::create_dir_all(&dir).expect("creating the PostgreSQL folder");
        if !as_user.is_empty() {
            let (uid, gid) = (id(&["-u", "nobody"]), id(&["-g", "nobody"]));
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown to nobody");
        }
        // Built before initdb runs, so that its Drop removes the folder if initdb fails.
        let mut server = PostgresServer {
            bin,
            as_user,
            dir,
            port: 0,
            child: None,
        };
        // The C locale exists everywhere; the caller's LANG may not be generated.
        let args = format!("-A trust -U {USER} --no-sync -E UTF8 --locale=C -D");
        let mut initdb = server.command("initdb");
        initdb.args(args.split(' ')).arg(server.dir.join("data"));
        let output = initdb.output().expect("running initdb");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{test}: initdb failed: {stderr}");
        for _ in 0..5 {
            // Another process may take the port between free_port and the bind: try another.
            server.port = free_port();
            if server.spawn().is_ok() {
                return Some(server);
            }
        }
        let log = server.log_tail();
        panic!("{test}: postgres did not start on 5 free ports:\n{log}");
    }

    /// The server's URL: the `postgres` database as the superuser, without a password.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's port, the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process id while it runs: its backends are its children, so a bench
    /// can count this server's CPU apart from any other PostgreSQL on the machine.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ServerProcess::id)
    }

    /// Kills the postmaster at once (SIGKILL), as a crash would: nothing is checkpointed, and
    /// the data folder (with its stale postmaster.pid) stays for `restart`, which recovers
    /// from the WAL. Its backends exit when they notice the postmaster gone.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.child.take() {
            process.kill();
        }
    }

    /// Starts the server again on the same port and data, and waits until it has recovered
    /// and accepts connections.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(30);
        // The crashed server's backends may still hold its shared memory for a moment.
        while let Err(error) = self.spawn() {
            assert!(
                Instant::now() < deadline,
                "postgres did not restart on port {}: {error}\n{}",
                self.port,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the server was started, not stopped, and accepts connections.
    pub fn is_running(&self) -> bool {
        self.child
            .as_ref()
            .is_some_and(|process| self.answers(process.id()).is_ok())
    }

    /// `program` from the server's bin folder as the unprivileged user, run in the server's
    /// folder (root's working folder may be closed to `nobody`).
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let words = self.as_user.iter().map(OsStr::new);
        let mut words = words.chain([program.as_os_str()]);
        let mut command = Command::new(words.next().expect("a program"));
        command.args(words).current_dir(&self.dir);
        command
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("postgres.log"));
        let log = log.map_err(|error| format!("opening the postgres log: {error}"))?;
        let settings =
            "listen_addresses=127.0.0.1 fsync=on max_connections=200 shared_buffers=32MB";
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args(settings.split(' ').flat_map(|setting| ["-c", setting]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| format!("spawning postgres: {error}"))?;
        // Owned before the wait: a failed wait still kills it. PostgreSQL cannot bind port 0,
        // so the port was chosen ahead: the server is ready when it answers on it.
        let mut process = ServerProcess::new(child);
        let pid = process.id();
        let log = || self.log_tail();
        wait_until_ready(
            "postgres",
            &mut process,
            Duration::from_secs(30),
            log,
            || self.answers(pid),
        )?;
        self.child = Some(process);
        Ok(())
    }

    /// Whether the postmaster `pid` listens on the port and answers there as PostgreSQL does
    /// (`pg_isready` sends a startup packet and reads the server's answer): during crash
    /// recovery the port is open but connections are refused.
    fn answers(&self, pid: u32) -> Result<(), String> {
        if !listens_on(pid, self.port) {
            return Err(format!(
                "postgres does not listen on port {} yet",
                self.port
            ));
        }
        let args = format!("-q -t 1 -h 127.0.0.1 -U {USER} -d postgres -p");
        let mut pg_isready = Command::new(self.bin.join("pg_isready"));
        pg_isready.args(args.split(' ')).arg(self.port.to_string());
        match pg_isready.status() {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("pg_isready: {status}")),
            Err(error) => Err(format!("running pg_isready: {error}")),
        }
    }

    /// The server's log so far: what it printed, and each statement once a test has set
    /// `log_statement`.
    #[allow(dead_code)] // not every test binary reads it
    pub fn log(&self) -> String {
        let log = std::fs::read(self.dir.join("postgres.log")).unwrap_or_default();
        String::from_utf8_lossy(&log).into_owned()
    }

    /// The last lines of the server's log, for a panic message.
    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The folder holding `initdb` and `postgres`: Debian keeps them off PATH in
/// /usr/lib/postgresql/<version>/bin (the newest version wins), elsewhere they are on PATH.
fn find_bin(test: &str) -> Option<PathBuf> {
    let mut newest: Option<(Vec<u32>, PathBuf)> = None;
    let installed = std::fs::read_dir("/usr/lib/postgresql");
    for entry in installed.into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let version: Vec<u32> = name.split('.').flat_map(str::parse).collect();
        let bin = entry.path().join("bin");
        let complete = bin.join("initdb").is_file() && bin.join("postgres").is_file();
        if complete && newest.as_ref().is_none_or(|(newest, _)| *newest < version) {
            newest = Some((version, bin));
        }
    }
    if let Some((_, bin)) = newest {
        return Some(bin);
    }
    require_program("postgres", test)?;
    // PATH may hold symlinks into the real folder, where pg_isready lives too.
    let initdb = std::fs::canonicalize(require_program("initdb", test)?).ok()?;
    initdb.parent().map(Path::to_path_buf)
}

/// The prefix that runs a program as `nobody` when this process is root, else nothing.
fn unprivileged(test: &str) -> Option<Vec<String>> {
    if id(&["-u"]) != 0 {
        return Some(Vec::new());
    }
    let setpriv = require_program("setpriv", test)?;
    let (uid, gid) = (id(&["-u", "nobody"]), id(&["-g", "nobody"]));
    let args = format!("--reuid={uid} --regid={gid} --clear-groups --");
    let mut prefix = vec![setpriv.to_string_lossy().into_owned()];
    prefix.extend(args.split(' ').map(String::from));
    Some(prefix)
}

/// The number `id` prints for `args`.
fn id(args: &[&str]) -> u32 {
    let output = Command::new("id").args(args).output().expect("running id");
    let text = String::from_utf8_lossy(&output.stdout);
    let id = text.trim().parse();
    id.unwrap_or_else(|_| panic!("id {args:?} printed {text:?}"))
}
