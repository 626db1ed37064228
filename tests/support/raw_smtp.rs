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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
type Script = Arc<dyn Fn(&str, &str) -> Answer + Send + Sync>;

/// A scripted server, stopped when dropped.
#[derive(Debug)]
pub struct RawSmtp {
    port: u16,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
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
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let script: Script = Arc::new(answer);
        let greeting: Arc<[u8]> = greeting.into();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let (script, greeting) = (Arc::clone(&script), Arc::clone(&greeting));
                tokio::spawn(async move {
                    // A client that goes away mid-conversation is not the test's concern.
                    let _ = converse(stream, &greeting, &*script).await;
                });
            }
        });
        RawSmtp {
            port,
            connections,
            task,
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many connections it has accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RawSmtp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn converse(
    stream: TcpStream,
    greeting: &[u8],
    answer: &(dyn Fn(&str, &str) -> Answer + Send + Sync),
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    writer.write_all(greeting).await?;
    let mut line = Vec::new();
    let mut in_data = false;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let command = if in_data {
            if line != b".\r\n" {
                continue;
            }
            in_data = false;
            ".".to_owned()
        } else {
            let text = String::from_utf8_lossy(&line);
            text.split_whitespace()
                .next()
                .unwrap_or_default()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_ascii_uppercase()
        };
        let mut reply = answer(&command, String::from_utf8_lossy(&line).trim_end());
        while let Answer::After(delay, then) = reply {
            tokio::time::sleep(delay).await;
            reply = *then;
        }
        if command == "DATA" && matches!(&reply, Answer::Say(bytes) if bytes.starts_with(b"354")) {
            in_data = true;
        }
        match reply {
            Answer::Say(bytes) => writer.write_all(&bytes).await?,
            Answer::SayAndHangUp(bytes) => {
                writer.write_all(&bytes).await?;
                return writer.shutdown().await;
            }
            Answer::Silence => {}
            Answer::HangUp => return Ok(()),
            Answer::After(..) => unreachable!("waited for above"),
        }
    }
}
