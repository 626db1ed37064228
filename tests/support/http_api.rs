//! A small HTTP/1.1 server on a loopback port that stands in for an e-mail API (Postmark,
//! Resend, SendGrid, Mailgun): it records every request it reads (method, path, headers,
//! body) so a test can check what the transport sent, and answers each with what the test's
//! `answer` function says: a status with a body, a dropped connection, or no answer at all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// The path and query, e.g. `/v3/example.com/messages.mime`.
    pub path: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    /// The first value of the header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The fields of a `multipart/form-data` body: (name, file name, content), in order.
    pub fn form_fields(&self) -> Vec<(String, Option<String>, Vec<u8>)> {
        let Some(boundary) = self
            .header("content-type")
            .and_then(|ct| ct.split("boundary=").nth(1))
            .map(|b| b.trim_matches('"').to_owned())
        else {
            return Vec::new();
        };
        let delimiter = format!("--{boundary}");
        let mut fields = Vec::new();
        for section in split_bytes(&self.body, delimiter.as_bytes())
            .into_iter()
            .skip(1)
        {
            if section.starts_with(b"--") {
                break;
            }
            let section = section.strip_prefix(b"\r\n").unwrap_or(section);
            let Some(head_end) = find(section, b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&section[..head_end]).into_owned();
            let mut content = section[head_end + 4..].to_vec();
            if content.ends_with(b"\r\n") {
                content.truncate(content.len() - 2);
            }
            let disposition = head
                .lines()
                .find(|line| line.to_ascii_lowercase().starts_with("content-disposition"))
                .unwrap_or("");
            let name = quoted_param(disposition, "name").unwrap_or_default();
            let filename = quoted_param(disposition, "filename");
            fields.push((name, filename, content));
        }
        fields
    }
}

fn quoted_param(header: &str, param: &str) -> Option<String> {
    header.split(';').find_map(|piece| {
        let (key, value) = piece.trim().split_once('=')?;
        (key == param).then(|| value.trim_matches('"').to_owned())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn split_bytes<'a>(mut bytes: &'a [u8], delimiter: &[u8]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    while let Some(at) = find(bytes, delimiter) {
        pieces.push(&bytes[..at]);
        bytes = &bytes[at + delimiter.len()..];
    }
    pieces.push(bytes);
    pieces
}

/// What the server does with a request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answers with this status, headers and body, then closes the connection.
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Closes the connection without a word, after reading the request.
    Drop,
    /// Never answers (the connection stays open).
    Hang,
    /// Writes these bytes as they are (a head, maybe part of a body), then closes: an answer
    /// cut off, or one no well-behaved server sends.
    Raw(Vec<u8>),
    /// Writes these bytes as they are, then keeps the connection open without a word more: a
    /// body that stalls after its first bytes.
    RawThenHang(Vec<u8>),
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, body: &str) -> Reply {
        Reply::Answer {
            status,
            headers: vec![("Content-Type".to_owned(), "application/json".to_owned())],
            body: body.to_owned(),
        }
    }

    /// A plain-text answer.
    pub fn text(status: u16, body: &str) -> Reply {
        Reply::Answer {
            status,
            headers: vec![("Content-Type".to_owned(), "text/plain".to_owned())],
            body: body.to_owned(),
        }
    }

    /// A head saying `status` and a body of `declared` bytes, of which only `sent` is
    /// written before the connection closes.
    pub fn cut_off(status: u16, declared: usize, sent: &str) -> Reply {
        let mut bytes = format!(
            "HTTP/1.1 {status} Status\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        )
        .into_bytes();
        bytes.extend_from_slice(sent.as_bytes());
        Reply::Raw(bytes)
    }

    /// Adds a header to an answer.
    pub fn with_header(self, name: &str, value: &str) -> Reply {
        match self {
            Reply::Answer {
                status,
                mut headers,
                body,
            } => {
                headers.push((name.to_owned(), value.to_owned()));
                Reply::Answer {
                    status,
                    headers,
                    body,
                }
            }
            other => other,
        }
    }
}

type Answerer = dyn Fn(&Recorded) -> Reply + Send + Sync;

/// The running server; stops (and drops every open connection) when dropped.
pub struct ApiServer {
    port: u16,
    requests: Arc<Mutex<Vec<Recorded>>>,
    count: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl ApiServer {
    /// Starts answering every request with what `answer` says, on a free loopback port.
    pub async fn start(answer: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let count = Arc::new(AtomicUsize::new(0));
        let answer: Arc<Answerer> = Arc::new(answer);
        let (log, counter) = (Arc::clone(&requests), Arc::clone(&count));
        let task = tokio::spawn(async move {
            // Connections live in the set, so aborting this task closes them all.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(
                    stream,
                    Arc::clone(&answer),
                    Arc::clone(&log),
                    Arc::clone(&counter),
                ));
            }
        });
        ApiServer {
            port,
            requests,
            count,
            task,
        }
    }

    /// The base URL to give a transport's `with_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request read so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many requests it has read.
    pub fn request_count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// The last request read; panics when there was none.
    pub fn last(&self) -> Recorded {
        self.requests().pop().expect("the server read a request")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut stream: TcpStream,
    answer: Arc<Answerer>,
    log: Arc<Mutex<Vec<Recorded>>>,
    count: Arc<AtomicUsize>,
) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let reply = answer(&request);
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(request);
    count.fetch_add(1, Ordering::SeqCst);
    match reply {
        Reply::Answer {
            status,
            headers,
            body,
        } => {
            let mut head = format!("HTTP/1.1 {status} Status\r\n");
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str(&format!(
                "Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            ));
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Reply::Drop => {
            let _ = stream.shutdown().await;
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Reply::Raw(bytes) => {
            let _ = stream.write_all(&bytes).await;
            let _ = stream.shutdown().await;
        }
        Reply::RawThenHang(bytes) => {
            let _ = stream.write_all(&bytes).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

/// Reads one request: its head and its body (by `Content-Length`, or chunked); `None` if
/// the client went away first.
async fn read_request(stream: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect();
    let value_of = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let chunked = value_of("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let mut body = buffer[head_end..].to_vec();
    if chunked {
        loop {
            if let Some(decoded) = decode_chunked(&body) {
                body = decoded;
                break;
            }
            let read = stream.read(&mut chunk).await.ok()?;
            if read == 0 {
                return None;
            }
            body.extend_from_slice(&chunk[..read]);
        }
    } else {
        let length: usize = value_of("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while body.len() < length {
            let read = stream.read(&mut chunk).await.ok()?;
            if read == 0 {
                return None;
            }
            body.extend_from_slice(&chunk[..read]);
        }
        body.truncate(length);
    }
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

/// A whole chunked body decoded, or `None` while its last chunk has not arrived.
fn decode_chunked(mut bytes: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(bytes, b"\r\n")?;
        let size_text = String::from_utf8_lossy(&bytes[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        bytes = &bytes[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        if bytes.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}
