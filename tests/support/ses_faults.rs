//! A small HTTP/1.1 server on a loopback port that answers every request the way a failing
//! SES endpoint would: a canned error, a dropped connection, or no answer at all. The real
//! AWS SDK talks to it, so its error handling is what the tests exercise.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// What the server does with each request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answers with this status, headers and body, then closes the connection.
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Reads the request and closes the connection without a word.
    Drop,
    /// Reads the request and never answers (the connection stays open).
    Hang,
    /// Waits, then does what the inner fault says.
    After(Duration, Box<Fault>),
    /// Writes a head saying `status` and a body of `declared` bytes, writes only `sent`, then
    /// closes: an answer cut off.
    CutOff {
        status: u16,
        declared: usize,
        sent: String,
    },
}

impl Fault {
    /// An SES (restJson1) error: the code in `x-amzn-ErrorType`, as SES sends it (with a
    /// trailing documentation URL), and `{"message": ...}` in the body.
    pub fn ses_error(status: u16, code: &str, message: &str) -> Fault {
        Fault::Answer {
            status,
            headers: vec![
                (
                    "x-amzn-ErrorType".to_owned(),
                    format!("{code}:http://internal.amazon.com/coral/com.amazon.ses/"),
                ),
                ("Content-Type".to_owned(), "application/json".to_owned()),
            ],
            body: format!(r#"{{"message":"{message}"}}"#),
        }
    }

    /// An error whose code is only in the body's `__type` field.
    pub fn typed_body(status: u16, code: &str, message: &str) -> Fault {
        Fault::json(
            status,
            &format!(r#"{{"__type":"{code}","message":"{message}"}}"#),
        )
    }

    /// A JSON answer.
    pub fn json(status: u16, body: &str) -> Fault {
        Fault::Answer {
            status,
            headers: vec![("Content-Type".to_owned(), "application/json".to_owned())],
            body: body.to_owned(),
        }
    }

    /// Waits `delay` before doing what `self` says.
    pub fn after(self, delay: Duration) -> Fault {
        Fault::After(delay, Box::new(self))
    }

    /// Adds a header to an answer.
    pub fn with_header(self, name: &str, value: &str) -> Fault {
        match self {
            Fault::Answer {
                status,
                mut headers,
                body,
            } => {
                headers.push((name.to_owned(), value.to_owned()));
                Fault::Answer {
                    status,
                    headers,
                    body,
                }
            }
            other => other,
        }
    }
}

/// The running server; stops (and drops every open connection) when dropped.
pub struct FaultServer {
    port: u16,
    counts: Arc<Counts>,
    task: JoinHandle<()>,
}

/// What the server has seen.
#[derive(Default)]
struct Counts {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

impl FaultServer {
    /// Starts answering every request on a free loopback port with `fault`.
    pub async fn start(fault: Fault) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let counts = Arc::new(Counts::default());
        let counter = counts.clone();
        let task = tokio::spawn(async move {
            // Connections live in the set, so aborting this task closes them all.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, fault.clone(), counter.clone()));
            }
        });
        FaultServer { port, counts, task }
    }

    /// The endpoint URL for an SDK client.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many requests it has read.
    pub fn requests(&self) -> usize {
        self.counts.requests.load(Ordering::SeqCst)
    }

    /// The most requests it was answering at the same time.
    pub fn most_in_flight(&self) -> usize {
        self.counts.most_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, fault: Fault, counts: Arc<Counts>) {
    if read_request(&mut stream).await.is_none() {
        return;
    }
    counts.requests.fetch_add(1, Ordering::SeqCst);
    let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counts.most_in_flight.fetch_max(now, Ordering::SeqCst);
    answer(&mut stream, fault).await;
    counts.in_flight.fetch_sub(1, Ordering::SeqCst);
}

async fn answer(stream: &mut TcpStream, fault: Fault) {
    let mut fault = fault;
    while let Fault::After(delay, inner) = fault {
        tokio::time::sleep(delay).await;
        fault = *inner;
    }
    match fault {
        Fault::Answer {
            status,
            headers,
            body,
        } => {
            let mut answer = format!("HTTP/1.1 {status} {}\r\n", reason(status));
            for (name, value) in headers {
                answer.push_str(&format!("{name}: {value}\r\n"));
            }
            answer.push_str(&format!(
                "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ));
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Fault::Drop => {
            let _ = stream.shutdown().await;
        }
        Fault::Hang => std::future::pending::<()>().await,
        Fault::CutOff {
            status,
            declared,
            sent,
        } => {
            let answer = format!(
                "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n{sent}",
                reason(status)
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Fault::After(..) => unreachable!("unwrapped above"),
    }
}

/// Reads one request (head and a `Content-Length` body); `None` if the client went away.
async fn read_request(stream: &mut TcpStream) -> Option<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    Some(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
