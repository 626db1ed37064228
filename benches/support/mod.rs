//! Shared by the benches: the test suite's launchers for smtp-sink, Postfix and redis-server,
//! its latency-adding relay, a transport that answers at once, a check that skips a bench
//! whose server is missing, the CPU time the machine's processes spent (`cpu`), and the
//! outboxes' databases (`outbox`).
#![allow(dead_code)]

use std::path::PathBuf;

use mail_breaker::{Envelope, Message, Receipt, SendError, Transport};

pub mod cpu;

#[cfg(feature = "postgres")]
pub mod outbox;

#[path = "../../tests/support/ready.rs"]
pub mod ready;

#[path = "../../tests/support/servers.rs"]
pub mod servers;

#[path = "../../tests/support/smtp_sink.rs"]
pub mod smtp_sink;

#[path = "../../tests/support/redis.rs"]
pub mod redis;

#[path = "../../tests/support/postgres.rs"]
pub mod postgres;

#[path = "../../tests/support/postfix.rs"]
pub mod postfix;

#[path = "../../tests/support/test_certs.rs"]
pub mod test_certs;

#[path = "../../tests/support/wire.rs"]
pub mod wire;

/// Whether `program` is installed; if not, prints why `bench` skipped. Unlike the tests, a
/// bench never fails for a missing server, not even under CI.
pub fn installed(program: &str, bench: &str) -> bool {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"].map(PathBuf::from));
    let found = dirs.iter().any(|dir| dir.join(program).is_file());
    if !found {
        println!("SKIPPED {bench}: `{program}` is not installed (bash .ci/run installs it)");
    }
    found
}

/// A transport that delivers every message at once and keeps nothing.
#[derive(Debug)]
pub struct Immediate;

#[async_trait::async_trait]
impl Transport for Immediate {
    fn name(&self) -> &str {
        "immediate"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        Ok(Receipt::new("immediate"))
    }

    async fn send(&self, _message: &Message) -> Result<Receipt, SendError> {
        Ok(Receipt::new("immediate"))
    }
}

/// A small message to `to`.
pub fn message_to(to: &str) -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to(to.parse().expect("a valid recipient"))
        .subject("bench")
        .body(String::from("hello from the bench"))
        .expect("a valid message")
}

/// A count a bench reads from the environment variable `name`, else `default`: a bench run
/// made quicker, or larger, without a rebuild. Anything but a whole number of at least 1
/// stops the bench with the variable's name.
pub fn setting(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .ok()
            .filter(|count| *count > 0)
            .unwrap_or_else(|| panic!("{name}={value}: a count of at least 1")),
        Err(_) => default,
    }
}
