//! A raw TCP server on a loopback port that answers SMTP commands with whatever a test
//! scripts, garbage included: no real server sends a non-SMTP banner or a 999 code, so tests
//! of how the client copes with one need a server that does.
//!
//! ```ignore
//! let server = RawSmtp::start(b"220 ready\r\n".to_vec(), |command| match command {
//!     "MAIL" => Answer::SayAndHangUp(b"999 what\r\n".to_vec()),
//!     other => Answer::healthy(other),
//! })
//! .await;
//! let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port());
//! ```
//!
//! It keeps what it received for the test to read ([`RawSmtp::commands`], the raw bytes of
//! each connection in [`RawSmtp::transcript`], each message's data in [`RawSmtp::data`]);
//! it can answer STARTTLS with a real handshake ([`RawSmtp::start_with_tls`] and
//! [`Answer::SayAndStartTls`]), and send a reply line that never ends
//! ([`Answer::SayEndlessly`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// What the server does after reading one command.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Writes these bytes and reads the next command.
    Say(Vec<u8>),
    /// Writes these bytes and closes the connection.
    SayAndHangUp(Vec<u8>),
    /// Writes nothing and reads on (the client waits for a reply that never comes).
    Silence,
    /// Closes the connection without a word.
    HangUp,
    /// Waits, then answers (a server slow to reply).
    After(Duration, Box<Answer>),
    /// Writes the first bytes, waits, writes the second (a reply nobody asked for, arriving
    /// while the client's connection is idle), then reads the next command.
    SayThenLater(Vec<u8>, Duration, Vec<u8>),
    /// Writes these bytes in one write, then takes the server's side of a TLS handshake and
    /// goes on over TLS: the answer to STARTTLS. Needs a server made by
    /// [`RawSmtp::start_with_tls`].
    SayAndStartTls(Vec<u8>),
    /// Writes these bytes, then `x` after `x` without ever ending the line, until the client
    /// goes away: a reply that never ends. Paced (4 KiB every 5 ms), so that a client that
    /// keeps it all grows slowly instead of filling the machine's memory.
    SayEndlessly(Vec<u8>),
}

impl Answer {
    /// What a working server answers to `command` (`EHLO`, `MAIL`, `RCPT`, `DATA`, `.` for the
    /// end of the message, `QUIT`, …).
    pub fn healthy(command: &str) -> Answer {
        match command {
            "EHLO" => Answer::Say(b"250-raw.test\r\n250 8BITMIME\r\n".to_vec()),
            "DATA" => Answer::Say(b"354 go ahead\r\n".to_vec()),
            "." => Answer::Say(b"250 2.0.0 Ok: queued as RAW1\r\n".to_vec()),
            "QUIT" => Answer::SayAndHangUp(b"221 bye\r\n".to_vec()),
            _ => Answer::Say(b"250 ok\r\n".to_vec()),
        }
    }
}

/// The script: the command's name (`MAIL`, `.`, …) and its whole line.
type Script = dyn Fn(&str, &str) -> Answer + Send + Sync;

/// What the server received, kept for the test to read.
#[derive(Debug, Default)]
struct Received {
    /// Every byte each connection received (after STARTTLS, the decrypted bytes), in order.
    transcripts: Vec<Vec<u8>>,
    /// Each line read as a command, without its line ending, across connections in order.
    commands: Vec<String>,
    /// Each message's data as read between a 354 and the line `.`: the lines as received,
    /// still dot-stuffed, without that final line.
    data: Vec<Vec<u8>>,
}

/// What every connection of one server shares.
struct Shared {
    greeting: Vec<u8>,
    script: Box<Script>,
    tls: Option<TlsAcceptor>,
    received: Mutex<Received>,
    /// How many late replies ([`Answer::SayThenLater`]'s second bytes) it has written.
    late_written: AtomicUsize,
}

impl Shared {
    fn received(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A scripted server, stopped when dropped.
pub struct RawSmtp {
    port: u16,
    connections: Arc<AtomicUsize>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for RawSmtp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSmtp")
            .field("port", &self.port)
            .field("connections", &self.connections())
            .finish_non_exhaustive()
    }
}

impl RawSmtp {
    /// Listens on a free loopback port; each connection gets `greeting` (may be empty: a server
    /// that says nothing), then `answer(command)` for each command it sends.
    pub async fn start(
        greeting: Vec<u8>,
        answer: impl Fn(&str) -> Answer + Send + Sync + 'static,
    ) -> RawSmtp {
        RawSmtp::start_reading_lines(greeting, move |command, _line| answer(command)).await
    }

    /// Like [`start`](Self::start), the script also reading each command's whole line
    /// (`RCPT TO:<bob@example.org>`), e.g. to refuse one recipient.
    pub async fn start_reading_lines(
        greeting: Vec<u8>,
        answer: impl Fn(&str, &str) -> Answer + Send + Sync + 'static,
    ) -> RawSmtp {
        RawSmtp::listen(greeting, None, Box::new(answer)).await
    }

    /// Like [`start_reading_lines`](Self::start_reading_lines), with `tls` for the handshake
    /// that [`Answer::SayAndStartTls`] begins.
    pub async fn start_with_tls(
        greeting: Vec<u8>,
        tls: TlsAcceptor,
        answer: impl Fn(&str, &str) -> Answer + Send + Sync + 'static,
    ) -> RawSmtp {
        RawSmtp::listen(greeting, Some(tls), Box::new(answer)).await
    }

    async fn listen(greeting: Vec<u8>, tls: Option<TlsAcceptor>, script: Box<Script>) -> RawSmtp {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let shared = Arc::new(Shared {
            greeting,
            script,
            tls,
            received: Mutex::new(Received::default()),
            late_written: AtomicUsize::new(0),
        });
        let connections = Arc::new(AtomicUsize::new(0));
        let (accepted, serving) = (Arc::clone(&connections), Arc::clone(&shared));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let shared = Arc::clone(&serving);
                tokio::spawn(async move {
                    // A client that goes away mid-conversation is not the test's concern.
                    let _ = converse(stream, &shared).await;
                });
            }
        });
        RawSmtp {
            port,
            connections,
            shared,
            task,
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits until it has written `count` late replies ([`Answer::SayThenLater`]), so that a
    /// test acts after the reply is on its way, however slow a loaded machine is to wake the
    /// server; panics after 10 s.
    #[allow(dead_code)] // not every test binary sends late replies
    pub async fn wait_for_late_replies(&self, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.shared.late_written.load(Ordering::SeqCst) < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server wrote {} of {count} late replies in 10 s",
                self.shared.late_written.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How many connections it has accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Every line it read as a command (`MAIL FROM:<a@example.com>`), without the line ending,
    /// in order, across connections. Lines of a message's data are not commands.
    pub fn commands(&self) -> Vec<String> {
        self.shared.received().commands.clone()
    }

    /// How many commands named `name` (`MAIL`, `RCPT`, `AUTH`, …) it read.
    pub fn count(&self, name: &str) -> usize {
        self.commands()
            .iter()
            .filter(|line| command_name(line.as_bytes()) == name)
            .count()
    }

    /// Every byte connection `index` (0 for the first) received, as it came.
    pub fn transcript(&self, index: usize) -> Vec<u8> {
        self.shared
            .received()
            .transcripts
            .get(index)
            .cloned()
            .unwrap_or_default()
    }

    /// Each message's data as it read it (after a 354, up to the line `.`, which is left out).
    pub fn data(&self) -> Vec<Vec<u8>> {
        self.shared.received().data.clone()
    }
}

impl Drop for RawSmtp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The command's name in `line`: its first word, up to a colon, upper-cased.
fn command_name(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    text.split_whitespace()
        .next()
        .unwrap_or_default()
        .split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase()
}

/// What a conversation asks for when it stops.
enum Next {
    Close,
    StartTls,
}

async fn converse(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let connection = {
        let mut received = shared.received();
        received.transcripts.push(Vec::new());
        received.transcripts.len() - 1
    };
    let mut plain = BufReader::new(stream);
    plain.get_mut().write_all(&shared.greeting).await?;
    if let Next::Close = talk(&mut plain, shared, connection).await? {
        return Ok(());
    }
    let Some(tls) = &shared.tls else {
        // A script that answers STARTTLS on a server without TLS: the test is wrong.
        panic!("Answer::SayAndStartTls needs a server made by RawSmtp::start_with_tls");
    };
    // A client sends nothing between STARTTLS and its handshake, so the reader holds no
    // buffered bytes that would be lost here.
    let secure = tls.accept(plain.into_inner()).await?;
    let mut secure = BufReader::new(secure);
    // A second STARTTLS inside TLS is not something these tests script: it ends the talk.
    let _ = talk(&mut secure, shared, connection).await?;
    Ok(())
}

/// Reads commands and answers them until the client goes away, the script hangs up, or it
/// answers STARTTLS. Lines end at `\n` alone, as lenient servers read them (so a bare LF
/// before a `.` ends a message's data here, which is what SMTP smuggling needs).
async fn talk<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut BufReader<S>,
    shared: &Shared,
    connection: usize,
) -> std::io::Result<Next> {
    let mut line = Vec::new();
    let mut data: Option<Vec<u8>> = None;
    loop {
        line.clear();
        if stream.read_until(b'\n', &mut line).await? == 0 {
            return Ok(Next::Close);
        }
        let command = {
            let mut received = shared.received();
            received.transcripts[connection].extend_from_slice(&line);
            match data.as_mut() {
                Some(data) if line != b".\r\n" => {
                    data.extend_from_slice(&line);
                    continue;
                }
                Some(_) => {
                    received.data.extend(data.take());
                    ".".to_owned()
                }
                None => {
                    let text = String::from_utf8_lossy(&line);
                    received.commands.push(text.trim_end().to_owned());
                    command_name(&line)
                }
            }
        };
        if command == "BDAT" {
            // RFC 3030: the chunk's length follows the command, and its octets follow the line.
            let length = String::from_utf8_lossy(&line)
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            let mut chunk = vec![0; length];
            stream.read_exact(&mut chunk).await?;
            let mut received = shared.received();
            received.transcripts[connection].extend_from_slice(&chunk);
            received.data.push(chunk);
        }
        let mut reply = (shared.script)(&command, String::from_utf8_lossy(&line).trim_end());
        while let Answer::After(delay, then) = reply {
            tokio::time::sleep(delay).await;
            reply = *then;
        }
        if command == "DATA" && matches!(&reply, Answer::Say(bytes) if bytes.starts_with(b"354")) {
            data = Some(Vec::new());
        }
        let writer = stream.get_mut();
        match reply {
            Answer::Say(bytes) => writer.write_all(&bytes).await?,
            Answer::SayAndHangUp(bytes) => {
                writer.write_all(&bytes).await?;
                writer.shutdown().await?;
                return Ok(Next::Close);
            }
            Answer::SayThenLater(first, delay, second) => {
                writer.write_all(&first).await?;
                writer.flush().await?;
                tokio::time::sleep(delay).await;
                writer.write_all(&second).await?;
                writer.flush().await?;
                shared.late_written.fetch_add(1, Ordering::SeqCst);
            }
            Answer::Silence => {}
            Answer::HangUp => return Ok(Next::Close),
            Answer::After(..) => unreachable!("waited for above"),
            Answer::SayAndStartTls(bytes) => {
                writer.write_all(&bytes).await?;
                writer.flush().await?;
                return Ok(Next::StartTls);
            }
            Answer::SayEndlessly(bytes) => {
                writer.write_all(&bytes).await?;
                let chunk = [b'x'; 4096];
                loop {
                    // Ends when the client closes the connection and the write fails.
                    writer.write_all(&chunk).await?;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
}
