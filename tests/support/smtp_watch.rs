//! A TCP proxy in front of an SMTP server that watches each mail transaction go by: which
//! message (by `Subject:`) the client finished with the final `.`, and whether the server's
//! reply to that `.` reached the client before the connection was lost.
//!
//! A transaction whose `.` went through but whose reply never came back is the one place SMTP
//! itself can duplicate a message: the server may have accepted it, and the client, seeing a
//! lost connection, sends it again. A chaos test counts these to explain each duplicate.
//!
//! The proxy reads line by line, so it suits SMTP without pipelining (lettre does not
//! pipeline); it forwards each line as soon as it is read.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy saw, over all its connections.
#[derive(Debug, Default, Clone)]
pub struct Watched {
    /// Connections accepted from the client.
    pub connections: u64,
    /// Connections the server refused (it was down).
    pub refused: u64,
    /// Transactions whose `.` the server answered, per subject.
    pub answered: HashMap<String, u32>,
    /// Transactions whose `.` reached the server but whose reply never reached the client,
    /// per subject: each may have been accepted, and may be sent again.
    pub unanswered_after_dot: HashMap<String, u32>,
    /// Transactions cut off before their `.`: never accepted.
    pub cut_before_dot: u64,
}

/// A watching proxy on a loopback port; stops accepting when dropped.
#[derive(Debug)]
pub struct SmtpWatch {
    port: u16,
    watched: Arc<Mutex<Watched>>,
    task: JoinHandle<()>,
}

impl SmtpWatch {
    /// Forwards every connection on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> SmtpWatch {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let watched = Arc::new(Mutex::new(Watched::default()));
        let books = Arc::clone(&watched);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                lock(&books).connections += 1;
                let books = Arc::clone(&books);
                tokio::spawn(async move {
                    match TcpStream::connect(upstream).await {
                        Ok(server) => relay(client, server, &books).await,
                        // Dropping the client's connection tells it the server is down.
                        Err(_) => lock(&books).refused += 1,
                    }
                });
            }
        });
        SmtpWatch {
            port,
            watched,
            task,
        }
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A copy of what it saw so far.
    pub fn watched(&self) -> Watched {
        lock(&self.watched).clone()
    }
}

impl Drop for SmtpWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One connection's transactions in flight: subjects whose `.` went to the server and await
/// its reply.
#[derive(Debug, Default)]
struct Conversation {
    awaiting_reply: VecDeque<String>,
    in_data: bool,
    subject: Option<String>,
}

async fn relay(client: TcpStream, server: TcpStream, books: &Mutex<Watched>) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, mut client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    let conversation = Mutex::new(Conversation::default());

    let upstream = async {
        let mut reader = BufReader::new(client_read);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            {
                let mut talk = lock(&conversation);
                if talk.in_data {
                    if line == b".\r\n" {
                        // Noted before it is sent, so that its reply cannot come first.
                        talk.in_data = false;
                        let subject = talk.subject.take().unwrap_or_default();
                        talk.awaiting_reply.push_back(subject);
                    } else if talk.subject.is_none()
                        && let Some(subject) = line.strip_prefix(b"Subject: ")
                    {
                        talk.subject = Some(String::from_utf8_lossy(subject).trim().to_owned());
                    }
                } else if line.eq_ignore_ascii_case(b"DATA\r\n") {
                    talk.in_data = true;
                    talk.subject = None;
                }
            }
            if server_write.write_all(&line).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };

    let downstream = async {
        let mut reader = BufReader::new(server_read);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if client_write.write_all(&line).await.is_err() {
                break;
            }
            // A final reply line ("250 …", not "250-…") after a `.` answers it.
            if line.get(3) == Some(&b' ') {
                let answered = lock(&conversation).awaiting_reply.pop_front();
                if let Some(subject) = answered {
                    *lock(books).answered.entry(subject).or_default() += 1;
                }
            }
        }
        let _ = client_write.shutdown().await;
    };

    // Either side closing ends the conversation: the other is closed with it.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
    let talk = lock(&conversation);
    let mut books = lock(books);
    for subject in &talk.awaiting_reply {
        *books
            .unanswered_after_dot
            .entry(subject.clone())
            .or_default() += 1;
    }
    if talk.in_data {
        books.cut_before_dot += 1;
    }
}
