//! A real `redis-server` on a free loopback port, started by a test and killed when dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::ready::{ServerProcess, listens_on, redis_pong, wait_until_ready};
use super::servers::{free_port, require_program};

/// A `redis-server` child process on 127.0.0.1, without persistence.
#[derive(Debug)]
pub struct RedisServer {
    program: PathBuf,
    port: u16,
    child: Option<ServerProcess>,
    /// Options beyond the defaults: a TLS port and its certificate, ACL users.
    extra: Vec<String>,
    tls_port: Option<u16>,
}

/// The ACL user that [`RedisServer::start_with_tls_and_user`] adds, and its password.
pub const ACL_USER: (&str, &str) = ("mailer", "s3cret-pass");

impl RedisServer {
    /// Starts a server on a free port and waits until it answers; `None` (after printing
    /// SKIPPED) where redis-server is not installed, a panic under CI.
    pub fn start(test: &str) -> Option<RedisServer> {
        RedisServer::start_with(test, None)
    }

    /// A server that also listens for TLS on [`tls_port`](Self::tls_port) with the test CA's
    /// server certificate (for `localhost` and 127.0.0.1), and has the ACL user
    /// [`ACL_USER`] on both ports beside the default one.
    pub fn start_with_tls_and_user(
        test: &str,
        certificates: &super::test_certs::TestCertificates,
    ) -> Option<RedisServer> {
        RedisServer::start_with(test, Some(certificates))
    }

    fn start_with(
        test: &str,
        certificates: Option<&super::test_certs::TestCertificates>,
    ) -> Option<RedisServer> {
        let program = require_program("redis-server", test)?;
        for _ in 0..5 {
            let tls_port = certificates.map(|_| free_port());
            let mut extra = Vec::new();
            if let (Some(certificates), Some(tls_port)) = (certificates, tls_port) {
                let file = |name| certificates.path(name).display().to_string();
                extra.extend([
                    "--tls-port".to_owned(),
                    tls_port.to_string(),
                    "--tls-cert-file".to_owned(),
                    file("server.pem"),
                    "--tls-key-file".to_owned(),
                    file("server.key"),
                    "--tls-ca-cert-file".to_owned(),
                    file("ca.pem"),
                    "--tls-auth-clients".to_owned(),
                    "no".to_owned(),
                    "--user".to_owned(),
                    ACL_USER.0.to_owned(),
                    "on".to_owned(),
                    format!(">{}", ACL_USER.1),
                    "~*".to_owned(),
                    "&*".to_owned(),
                    "+@all".to_owned(),
                ]);
            }
            let mut server = RedisServer {
                program: program.clone(),
                port: free_port(),
                child: None,
                extra,
                tls_port,
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

    /// How many scripts clients asked this server to run so far (EVALSHA and EVAL, by INFO
    /// commandstats; the commands a script runs inside are counted apart).
    #[cfg(feature = "redis")]
    pub async fn scripts_run(&self) -> u64 {
        let client = redis::Client::open(self.url()).expect("a valid URL");
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the test's redis-server");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .expect("INFO commandstats");
        info.lines()
            .filter(|line| {
                line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:")
            })
            .filter_map(|line| {
                line.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// The TLS port, for a server started with TLS.
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("a server started with TLS")
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.child.take() {
            process.kill();
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
        let child = Command::new(&self.program)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("spawning redis-server: {error}"))?;
        // Owned before the wait: a failed wait still kills it. redis-server cannot bind port 0
        // (0 turns TCP off), so the port was chosen ahead: the server is ready when it answers
        // PING on it and the listener there is this process's.
        let mut process = ServerProcess::new(child);
        let (pid, address) = (process.id(), SocketAddr::from(([127, 0, 0, 1], self.port)));
        wait_until_ready(
            "redis-server",
            &mut process,
            Duration::from_secs(5),
            String::new,
            || {
                redis_pong(address)?;
                if listens_on(pid, address.port()) {
                    Ok(())
                } else {
                    Err(format!(
                        "port {} is not this redis-server's",
                        address.port()
                    ))
                }
            },
        )?;
        self.child = Some(process);
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop(); // SIGKILL ends a frozen server too
    }
}
