//! Finding the real servers the tests run, and skipping (or, under CI, failing) without them.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Whether the tests run under CI, where a missing server is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The path of `program` on PATH or in the usual system folders, or `None` after printing
/// that `test` skipped. Under CI a missing program panics instead.
pub fn require_program(program: &str, test: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"].map(PathBuf::from));
    if let Some(found) = dirs
        .iter()
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
    {
        return Some(found);
    }
    assert!(
        !under_ci(),
        "{test}: `{program}` is not installed, and CI=true requires it (bash .ci/run installs it)"
    );
    report_skip(&format!(
        "SKIPPED {test}: `{program}` is not installed (bash .ci/run installs it)"
    ));
    None
}

/// A TCP port on 127.0.0.1 that nothing listens on now, and that this process has never
/// handed out before: a test that kills and restarts its server on "its" port can never meet
/// another test's server there, and a test that needs a closed port has one.
///
/// The port is found by binding port 0, and handed out only once a connect to it is refused.
/// Closing the listener is not enough: a process that another test thread forks at that moment
/// holds a copy of the listener until it execs, and the port accepts connections meanwhile
/// (how `smtp_auth` once took a port for its server's and connected before the server
/// listened). A server that can bind port 0 itself is better still (see `ready`); this is
/// for those that cannot (Redis, PostgreSQL, Postfix) and for a port that must stay closed.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        drop(listener);
        if handed_out.insert(port) && refuses_connections(port) {
            return port;
        }
    }
}

/// Whether a connect to `port` is refused, waiting up to a second for a forked child's copy of
/// a listener to go (it goes when the child execs).
fn refuses_connections(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..100 {
        match TcpStream::connect_timeout(&address, Duration::from_millis(100)) {
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    false
}

/// Prints why a test skipped straight to the terminal: the test harness captures `println!`
/// of passing tests, and a skip must be seen.
pub fn report_skip(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
