//! moto's server (`moto[server]` from PyPI), an SES-compatible endpoint on a free loopback
//! port, started by a test and killed when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::servers::{free_port, require_program, under_ci};

/// How long moto may take to answer its first request (it imports a lot of Python).
const STARTUP: Duration = Duration::from_secs(30);

/// A running moto server; killed on drop.
pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts moto on a free loopback port and waits until it answers, or returns `None`
    /// after printing why `test` skipped (moto not installed). Under CI a missing moto panics.
    pub async fn start(test: &str) -> Option<Moto> {
        let python = python_with_moto(test)?;
        // A port found free may be taken before moto binds it: try a few.
        for _ in 0..3 {
            let port = free_port();
            // The interpreter itself, not a pyenv shim around it, so that kill() stops moto.
            let child = Command::new(&python)
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting moto's server");
            let mut moto = Moto { child, port };
            if moto.wait_until_it_answers().await {
                return Some(moto);
            }
        }
        panic!("{test}: moto's server did not start on a free port in three tries");
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

    async fn wait_until_it_answers(&mut self) -> bool {
        let deadline = Instant::now() + STARTUP;
        while Instant::now() < deadline {
            if let Ok(Some(_exited)) = self.child.try_wait() {
                return false;
            }
            if http_get(self.port, "/moto-api/").await.is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
