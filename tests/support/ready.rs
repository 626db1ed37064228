//! When a server a test started is ready: when it has answered as itself, never when a bare
//! TCP connect succeeds.
//!
//! A connect proves nothing about the server. On Linux a connect to a loopback port in the
//! ephemeral range where nothing listens yet can pick that very port as its own source port
//! and connect to itself (TCP's simultaneous open), and another process may hold a port that
//! was free a moment ago. So a launcher waits for the server's own answer (the SMTP greeting
//! `220`, `+PONG`, an HTTP status line, a query that returns, or a ready line the server
//! prints) and, where it can, checks that the socket listening on the port belongs to the
//! process it started ([`listening_ports`]). Where the server can, it binds port 0 itself and
//! the launcher reads the port it got, so no port is chosen ahead and handed over.
//!
//! Every process is owned by a [`ServerProcess`] before the test waits for it, so a failed
//! wait or a panicking test still stops it.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

/// How long one readiness probe waits for a connect or an answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A server's process, killed (and reaped) when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
}

impl ServerProcess {
    /// Owns `child` from now on.
    pub fn new(child: Child) -> Self {
        ServerProcess { child }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// How the process ended, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the process (SIGKILL) and reaps it; nothing if it has ended already.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The child, for launchers that read its pipes.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `probe` says the server answered as itself, at most `limit`.
///
/// Fails at once when the process exits, and after `limit` with the probe's last answer; both
/// errors carry the server's `log`.
pub fn wait_until_ready(
    what: &str,
    process: &mut ServerProcess,
    limit: Duration,
    log: impl Fn() -> String,
    mut probe: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = process.exited() {
            return Err(format!(
                "{what} exited at start with {status}; log: {}",
                log()
            ));
        }
        let last = match probe() {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{what} did not answer within {limit:?} (last try: {last}); log: {}",
                log()
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Whether an SMTP server answers on `address` with its greeting: a reply `220` as the
/// first line it writes. Returns the greeting.
pub fn smtp_greeting(address: SocketAddr) -> Result<String, String> {
    let stream = connect(address)?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|error| format!("no greeting from {address}: {error}"))?;
    if line.starts_with("220") {
        Ok(line)
    } else {
        Err(format!("{address} greeted with {line:?}, not 220"))
    }
}

/// Whether a Redis answers `PING` on `address` as Redis does: `+PONG`, or `-NOAUTH` where the
/// default user needs a password.
pub fn redis_pong(address: SocketAddr) -> Result<(), String> {
    let mut stream = connect(address)?;
    stream
        .write_all(b"PING\r\n")
        .map_err(|error| format!("writing PING to {address}: {error}"))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|error| format!("no answer to PING from {address}: {error}"))?;
    if line.starts_with("+PONG") || line.starts_with("-NOAUTH") {
        Ok(())
    } else {
        Err(format!("{address} answered PING with {line:?}"))
    }
}

/// Whether an HTTP server answers a `GET /` on `address` with a status line.
pub fn http_answer(address: SocketAddr) -> Result<(), String> {
    let mut stream = connect(address)?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|error| format!("writing a request to {address}: {error}"))?;
    let mut start = [0u8; 7];
    stream
        .read_exact(&mut start)
        .map_err(|error| format!("no HTTP answer from {address}: {error}"))?;
    if &start == b"HTTP/1." {
        Ok(())
    } else {
        Err(format!(
            "{address} answered {:?}, not HTTP",
            String::from_utf8_lossy(&start)
        ))
    }
}

fn connect(address: SocketAddr) -> Result<TcpStream, String> {
    let stream = TcpStream::connect_timeout(&address, PROBE_TIMEOUT)
        .map_err(|error| format!("connecting to {address}: {error}"))?;
    let _ = stream.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    Ok(stream)
}

/// The TCP ports on which process `pid` or one of its descendants listens, read from `/proc`
/// (empty where `/proc` cannot be read).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = process_tree(pid)
        .into_iter()
        .flat_map(socket_inodes)
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is field 1 (`HEXIP:HEXPORT`), st field 3 (`0A` is LISTEN), inode field 9.
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if *state != "0A" || !inodes.iter().any(|owned| owned == inode) {
                continue;
            }
            if let Some(port) = local
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Whether the socket listening on `port` belongs to process `pid` or a descendant of it: the
/// server answering there is the one the test started. Where `/proc` cannot be read (not
/// Linux), it cannot tell and says yes.
pub fn listens_on(pid: u32, port: u16) -> bool {
    if fs::metadata("/proc/net/tcp").is_err() {
        return true;
    }
    listening_ports(pid).contains(&port)
}

/// Waits until process `pid` (or a descendant) listens on exactly one TCP port and returns it:
/// how a launcher learns the port of a server that bound port 0 itself.
pub fn wait_for_bound_port(
    what: &str,
    process: &mut ServerProcess,
    limit: Duration,
    log: impl Fn() -> String,
) -> Result<u16, String> {
    let pid = process.id();
    let mut port = None;
    wait_until_ready(
        what,
        process,
        limit,
        log,
        || match listening_ports(pid)[..] {
            [one] => {
                port = Some(one);
                Ok(())
            }
            [] => Err(format!("{what} listens on no port yet")),
            ref many => Err(format!("{what} listens on several ports: {many:?}")),
        },
    )?;
    port.ok_or_else(|| format!("{what} gave no port"))
}

/// `pid` and every process descended from it.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // The parent is the second field after the command's closing parenthesis.
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|field| field.parse::<u32>().ok());
            if let Some(parent) = parent {
                parents.push((child, parent));
            }
        }
    }
    let mut tree = vec![pid];
    let mut next = 0;
    while next < tree.len() {
        let parent = tree[next];
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(child, _)| *child),
        );
        next += 1;
    }
    tree
}

/// The inodes of the sockets process `pid` holds open.
fn socket_inodes(pid: u32) -> Vec<String> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| fs::read_link(entry.path()).ok())
        .filter_map(|target| {
            target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect()
}
