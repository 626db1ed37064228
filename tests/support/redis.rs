//! A real `redis-server` on a free loopback port, started by a test and killed when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::servers::{free_port, require_program};

/// A `redis-server` child process on 127.0.0.1, without persistence.
#[derive(Debug)]
pub struct RedisServer {
    program: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers; `None` (after printing
    /// SKIPPED) where redis-server is not installed, a panic under CI.
    pub fn start(test: &str) -> Option<RedisServer> {
        let program = require_program("redis-server", test)?;
        for _ in 0..5 {
            let mut server = RedisServer {
                program: program.clone(),
                port: free_port(),
                child: None,
            };
            // Another process may take the port between free_port and the bind: try another.
            if server.spawn().is_ok() {
                return Some(server);
            }
        }
        panic!("{test}: redis-server did not start on any of 5 free ports");
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        // The port can take a moment to be free again after the kill.
        while let Err(error) = self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}: {error}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server's process (SIGSTOP): connections stay open and nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("a running redis-server");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill {signal} failed");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut child = Command::new(&self.program)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("spawning redis-server: {error}"))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("redis-server exited: {status}"));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(String::from("redis-server did not answer PING within 5 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Whether a Redis on `port` answers PING.
fn ping(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop(); // SIGKILL ends a frozen server too
    }
}
