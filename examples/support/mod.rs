//! An SMTP server inside the process (built on `mailin-embedded`), for the examples and for
//! tests that must run with nothing installed.
//!
//! It listens on a free loopback port and can be switched at run time to accept mail, or to
//! answer every `MAIL FROM` with 421 (the server is going down, and hangs up), 451 (a local
//! error) or 550 (this sender is refused). It counts the messages it accepted and remembers
//! each one's subject under the queue id it gave in its reply
//! (`250 2.0.0 Ok: queued as Q17`).
//!
//! ```ignore
//! let server = EmbeddedSmtp::start();
//! let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port());
//! server.set_mode(Mode::Unavailable);   // from now on: 421
//! ```
//!
//! The server runs on background threads until the process ends: `mailin-embedded` has no way
//! to stop it. A test that needs a dead port binds and drops a listener instead.
#![allow(dead_code)]

use std::io;
use std::net::{IpAddr, TcpListener};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use mailin_embedded::{Handler, Response, Server, SslConfig};

/// How many SMTP sessions the server serves at once. lettre keeps idle pooled connections open,
/// and each one holds a server thread, so this is well above lettre's default pool size (10).
const SESSIONS: u32 = 32;

/// How the server answers `MAIL FROM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// 250: takes the message.
    Accept = 0,
    /// `421 4.3.2 Service shutting down`, then hangs up.
    Unavailable = 1,
    /// `451 4.3.0 Local error in processing`.
    Failing = 2,
    /// `550 5.7.1 Sender refused`.
    Rejecting = 3,
}

impl Mode {
    fn from_u8(value: u8) -> Mode {
        match value {
            1 => Mode::Unavailable,
            2 => Mode::Failing,
            3 => Mode::Rejecting,
            _ => Mode::Accept,
        }
    }
}

/// One message the server accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The queue id it answered with (`Q1`, `Q2`, ... in the order the messages completed).
    pub queue_id: String,
    /// The message's `Subject:` header, if it had one.
    pub subject: Option<String>,
}

#[derive(Debug, Default)]
struct Shared {
    mode: AtomicU8,
    accepted: Mutex<Vec<Accepted>>,
}

/// A running embedded SMTP server on `127.0.0.1:<port>`.
#[derive(Debug, Clone)]
pub struct EmbeddedSmtp {
    port: u16,
    shared: Arc<Shared>,
}

impl EmbeddedSmtp {
    /// Starts a server that accepts mail, on a free loopback port; it accepts connections as
    /// soon as this returns (the socket is bound before the server thread starts).
    pub fn start() -> EmbeddedSmtp {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding a loopback port for the SMTP server");
        let port = listener
            .local_addr()
            .expect("the SMTP server's bound address")
            .port();
        let shared = Arc::new(Shared::default());
        let mut server = Server::new(SessionHandler {
            shared: Arc::clone(&shared),
            data: Vec::new(),
        });
        server
            .with_name("embedded.localhost")
            .with_num_threads(SESSIONS)
            .with_ssl(SslConfig::None)
            .expect("a server without TLS")
            .with_tcp_listener(listener);
        std::thread::Builder::new()
            .name(format!("embedded-smtp-{port}"))
            .spawn(move || {
                if let Err(error) = server.serve() {
                    eprintln!("embedded SMTP server on port {port} stopped: {error}");
                }
            })
            .expect("starting the SMTP server thread");
        EmbeddedSmtp { port, shared }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Changes how the server answers from the next `MAIL FROM` on.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// How the server answers now.
    pub fn mode(&self) -> Mode {
        Mode::from_u8(self.shared.mode.load(Ordering::SeqCst))
    }

    /// How many messages it has accepted.
    pub fn accepted(&self) -> usize {
        self.lock_accepted().len()
    }

    /// The messages it has accepted, in the order they completed.
    pub fn messages(&self) -> Vec<Accepted> {
        self.lock_accepted().clone()
    }

    /// The subject of the message it accepted under `queue_id`.
    pub fn subject_of(&self, queue_id: &str) -> Option<String> {
        self.lock_accepted()
            .iter()
            .find(|accepted| accepted.queue_id == queue_id)
            .and_then(|accepted| accepted.subject.clone())
    }

    fn lock_accepted(&self) -> std::sync::MutexGuard<'_, Vec<Accepted>> {
        // A panicking session thread cannot leave the list half-written: pushes are atomic.
        self.shared
            .accepted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One per SMTP session (mailin-embedded clones it for each connection).
#[derive(Debug, Clone)]
struct SessionHandler {
    shared: Arc<Shared>,
    data: Vec<u8>,
}

impl Handler for SessionHandler {
    fn mail(&mut self, _ip: IpAddr, _domain: &str, _from: &str) -> Response {
        match Mode::from_u8(self.shared.mode.load(Ordering::SeqCst)) {
            Mode::Accept => mailin_embedded::response::OK,
            Mode::Unavailable => Response::custom(421, "4.3.2 Service shutting down".to_owned()),
            Mode::Failing => Response::custom(451, "4.3.0 Local error in processing".to_owned()),
            Mode::Rejecting => Response::custom(550, "5.7.1 Sender refused".to_owned()),
        }
    }

    fn data_start(
        &mut self,
        _domain: &str,
        _from: &str,
        _is8bit: bool,
        _to: &[String],
    ) -> Response {
        self.data.clear();
        mailin_embedded::response::OK
    }

    fn data(&mut self, buf: &[u8]) -> io::Result<()> {
        self.data.extend_from_slice(buf);
        Ok(())
    }

    fn data_end(&mut self) -> Response {
        let subject = subject(&self.data);
        self.data.clear();
        let queue_id = {
            let mut accepted = self
                .shared
                .accepted
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let queue_id = format!("Q{}", accepted.len() + 1);
            accepted.push(Accepted {
                queue_id: queue_id.clone(),
                subject,
            });
            queue_id
        };
        Response::custom(250, format!("2.0.0 Ok: queued as {queue_id}"))
    }
}

/// The `Subject:` header of a raw message (unfolded headers only, which is what lettre writes
/// for short subjects).
fn subject(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    text.lines()
        .take_while(|line| !line.is_empty())
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("subject")
                .then(|| value.trim().to_owned())
        })
}
