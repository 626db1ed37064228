//! Finding the real servers the tests run, and skipping (or, under CI, failing) without them.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

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

/// A TCP port on 127.0.0.1 that was free a moment ago, and that this process has never
/// handed out before: a test that kills and restarts its server on "its" port can never meet
/// another test's server there.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// Prints why a test skipped straight to the terminal: the test harness captures `println!`
/// of passing tests, and a skip must be seen.
pub fn report_skip(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
