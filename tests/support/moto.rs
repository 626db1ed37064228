//! moto's server (`moto[server]` from PyPI), an SES-compatible endpoint on a loopback port it
//! binds itself, started by a test and killed when dropped.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ready::{ServerProcess, listening_ports};
use super::servers::{require_program, under_ci};

/// How long moto may take to answer its first request (it imports a lot of Python).
const STARTUP: Duration = Duration::from_secs(30);

/// A running moto server; killed on drop.
pub struct Moto {
    process: ServerProcess,
    port: u16,
    /// moto's stderr, in a file (a pipe nobody reads would fill up and stall it).
    log: std::path::PathBuf,
}

impl Moto {
    /// Starts moto on a loopback port and waits until it answers there, or returns `None`
    /// after printing why `test` skipped (moto not installed). Under CI a missing moto panics.
    pub async fn start(test: &str) -> Option<Moto> {
        let python = python_with_moto(test)?;
        // Port 0: moto binds a port itself, and the launcher reads which from /proc, so that
        // no port is chosen ahead and handed over. The interpreter itself, not a pyenv shim
        // around it, so that kill() stops moto.
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let log = std::env::temp_dir().join(format!(
            "mail-breaker-moto-{}-{}.log",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let child = Command::new(&python)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("creating moto's log"))
            .spawn()
            .expect("starting moto's server");
        // Owned before the wait: a failed wait still kills it.
        let mut moto = Moto {
            process: ServerProcess::new(child),
            port: 0,
            log,
        };
        if let Err(error) = moto.wait_until_it_answers().await {
            panic!("{test}: {error}");
        }
        Some(moto)
    }

    /// The endpoint URL for an SDK client: `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The body of moto's state dump (`GET /moto-api/data.json`), which lists each raw message
    /// SES accepted with its destinations.
    pub async fn state_dump(&self) -> String {
        http_get(self.port, "/moto-api/data.json")
            .await
            .expect("moto answers /moto-api/data.json")
    }

    /// Waits until moto listens on the port it bound and answers an HTTP request there as
    /// moto (`/moto-api/`).
    async fn wait_until_it_answers(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        let pid = self.process.id();
        loop {
            if let Some(status) = self.process.exited() {
                return Err(format!(
                    "moto's server exited at start with {status}: {}",
                    self.log()
                ));
            }
            if self.port == 0
                && let [port] = listening_ports(pid)[..]
            {
                self.port = port;
            }
            if self.port != 0 && http_get(self.port, "/moto-api/").await.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.process.kill();
                return Err(format!(
                    "moto's server did not answer within {STARTUP:?}: {}",
                    self.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What moto printed so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The path of a Python interpreter that can import `moto.server`, or `None` after printing
/// that `test` skipped.
fn python_with_moto(test: &str) -> Option<String> {
    let python3 = require_program("python3", test)?;
    let probe = Command::new(python3)
        .args(["-c", "import sys, moto.server; print(sys.executable)"])
        .stderr(Stdio::null())
        .output();
    match probe {
        Ok(output) if output.status.success() => {
            Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        }
        _ => {
            assert!(
                !under_ci(),
                "{test}: python3 cannot import moto.server, and CI=true requires it (pip install 'moto[server]')"
            );
            super::servers::report_skip(&format!(
                "SKIPPED {test}: python3 cannot import moto.server (pip install 'moto[server]')"
            ));
            None
        }
    }
}

/// A plain HTTP/1.1 GET on 127.0.0.1, returning the body of a 200 answer.
async fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?;
    (head.starts_with("HTTP/1.") && status == "200").then(|| body.to_owned())
}
