//! A loopback relay in front of a server's port that puts a wide-area network between a
//! client and the server, and counts what crosses it:
//!
//! - each direction is delayed by a set one-way time, so a round trip costs twice that
//!   (bandwidth is not limited: only latency is added, and the order of the bytes is kept).
//!   Tokio's timers tick in milliseconds and round up, so each hop takes up to about a
//!   millisecond more than asked: 10 ms each way measures as a 21-22 ms round trip;
//! - **turns**: how many times data went client→server after server→client data was last
//!   delivered to the client, summed over the relay's connections. A client that waits for a
//!   reply before each command pays a turn per command; a message on a warm connection with
//!   PIPELINING and CHUNKING costs one (`MAIL`, `RCPT`, `BDAT <n> LAST` and the body in one
//!   go), with PIPELINING alone two (the body goes after the `354`). The EHLO of a fresh
//!   connection is a turn too (after the greeting);
//! - bytes each way, and connections made to the server.
//!
//! A fresh connection is as slow as over a network: the server is connected to 1.5 round
//! trips after the client, so its greeting reaches the client two round trips after the
//! client connected (the client's own connect returns at once, on the loopback).
//!
//! ```ignore
//! let relay = Relay::start(server_address, Duration::from_millis(10)).await; // 20 ms RTT
//! let smtp = SmtpTransport::builder_dangerous("127.0.0.1").port(relay.port()).build()?;
//! smtp.send(&message).await?;  // warms a connection
//! relay.reset();
//! smtp.send(&message).await?;
//! assert_eq!(relay.turns(), 1);
//! ```
//!
//! Only Tokio (and std): the benches include this file with
//! `#[path = "../tests/support/wire.rs"] mod wire;`. Every task it starts is aborted when the
//! `Relay` is dropped, which closes its connections.

#![allow(dead_code)]

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// At most this much of the client's bytes is kept by a capturing relay (since its last
/// [`Relay::reset`]); a test looks at commands, not at whole bodies.
const CAPTURE_LIMIT: usize = 256 * 1024;

/// What crossed a relay since it started or was last [`reset`](Relay::reset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Client→server data after server→client data (see the module's doc).
    pub turns: u64,
    /// Bytes the client sent.
    pub bytes_to_server: u64,
    /// Bytes the server sent.
    pub bytes_to_client: u64,
    /// Connections the relay made to the server.
    pub connections: u64,
}

#[derive(Default)]
struct Counters {
    turns: AtomicU64,
    bytes_to_server: AtomicU64,
    bytes_to_client: AtomicU64,
    connections: AtomicU64,
    /// The client's bytes, when capturing.
    captured: Option<Mutex<Vec<u8>>>,
}

/// A running relay on `127.0.0.1:<port>`, forwarding each connection to its target.
pub struct Relay {
    port: u16,
    target: SocketAddr,
    one_way: Duration,
    counters: Arc<Counters>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Relay {
    /// Starts a relay to `target` that delays each direction by `one_way` (zero: no delay,
    /// only counting). Call it inside a Tokio runtime: the relay runs as tasks on it.
    pub async fn start(target: SocketAddr, one_way: Duration) -> Relay {
        Relay::launch(target, one_way, false).await
    }

    /// Like [`start`](Self::start), and also keeps the bytes the client sent (up to 256 KiB
    /// since the last reset), for [`client_bytes`](Self::client_bytes).
    pub async fn start_capturing(target: SocketAddr, one_way: Duration) -> Relay {
        Relay::launch(target, one_way, true).await
    }

    async fn launch(target: SocketAddr, one_way: Duration, capture: bool) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("binding the relay's loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let counters = Arc::new(Counters {
            captured: capture.then(|| Mutex::new(Vec::new())),
            ..Counters::default()
        });
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn(accept_loop(
            listener,
            target,
            one_way,
            Arc::clone(&counters),
            Arc::clone(&tasks),
        ));
        lock(&tasks).push(accept.abort_handle());
        Relay {
            port,
            target,
            one_way,
            counters,
            tasks,
        }
    }

    /// The relay's port on 127.0.0.1: point the client here.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The delay each direction gets; a round trip is twice this.
    pub fn one_way(&self) -> Duration {
        self.one_way
    }

    /// Client→server turns since the start or the last reset.
    pub fn turns(&self) -> u64 {
        self.counters.turns.load(Ordering::SeqCst)
    }

    /// Bytes the client sent since the start or the last reset.
    pub fn bytes_to_server(&self) -> u64 {
        self.counters.bytes_to_server.load(Ordering::SeqCst)
    }

    /// Bytes the server sent since the start or the last reset.
    pub fn bytes_to_client(&self) -> u64 {
        self.counters.bytes_to_client.load(Ordering::SeqCst)
    }

    /// Connections made to the server since the start or the last reset.
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(Ordering::SeqCst)
    }

    /// All the counts at once.
    pub fn stats(&self) -> WireStats {
        WireStats {
            turns: self.turns(),
            bytes_to_server: self.bytes_to_server(),
            bytes_to_client: self.bytes_to_client(),
            connections: self.connections(),
        }
    }

    /// What the client sent since the last reset (up to 256 KiB), for a relay made with
    /// [`start_capturing`](Self::start_capturing); lossy UTF-8.
    pub fn client_bytes(&self) -> String {
        let captured = self
            .counters
            .captured
            .as_ref()
            .expect("client_bytes() needs a relay made with Relay::start_capturing");
        String::from_utf8_lossy(&lock(captured)).into_owned()
    }

    /// Sets every count to zero (and forgets the captured bytes). Open connections stay open
    /// and remember who spoke last: after a reset, a warm connection's next message counts
    /// the turns it costs, no more.
    pub fn reset(&self) {
        let counters = &self.counters;
        counters.turns.store(0, Ordering::SeqCst);
        counters.bytes_to_server.store(0, Ordering::SeqCst);
        counters.bytes_to_client.store(0, Ordering::SeqCst);
        counters.connections.store(0, Ordering::SeqCst);
        if let Some(captured) = &counters.captured {
            lock(captured).clear();
        }
    }
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("port", &self.port)
            .field("target", &self.target)
            .field("one_way", &self.one_way)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    one_way: Duration,
    counters: Arc<Counters>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let connection = tokio::spawn(connect(
            client,
            target,
            one_way,
            Arc::clone(&counters),
            Arc::clone(&tasks),
        ));
        let mut handles = lock(&tasks);
        // Keep the list from growing without end over a long bench: finished tasks go.
        handles.retain(|handle| !handle.is_finished());
        handles.push(connection.abort_handle());
    }
}

/// Connects an accepted client to the target, as late as a real network would: over a
/// network the server accepts after the SYN, SYN-ACK and ACK (one and a half round trips)
/// and its greeting reaches the client half a round trip later, while on the loopback both
/// sockets are connected at once. So the target is connected to three one-way times after
/// the client was accepted, and the greeting arrives two round trips after the client began.
async fn connect(
    client: TcpStream,
    target: SocketAddr,
    one_way: Duration,
    counters: Arc<Counters>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
) {
    tokio::time::sleep(one_way * 3).await;
    let Ok(server) = TcpStream::connect(target).await else {
        // Nothing listens there: the client sees its connection closed.
        return;
    };
    counters.connections.fetch_add(1, Ordering::SeqCst);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Whether server→client data was delivered to the client since the client last sent.
    let server_spoke = Arc::new(AtomicBool::new(false));
    let directions = [
        spawn_direction(
            client_read,
            server_write,
            one_way,
            Direction::ToServer,
            Arc::clone(&counters),
            Arc::clone(&server_spoke),
        ),
        spawn_direction(
            server_read,
            client_write,
            one_way,
            Direction::ToClient,
            counters,
            server_spoke,
        ),
    ];
    lock(&tasks).extend(directions.into_iter().flatten());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Waits until `when`, to well under a millisecond. Tokio's timers fire on the first whole
/// millisecond after their deadline, which made each 10 ms direction 10-11 ms and a 20 ms
/// round trip 21-22 ms; the last millisecond is waited out by yielding instead.
async fn deliver_at(when: Instant) {
    let early = when.checked_sub(Duration::from_millis(1)).unwrap_or(when);
    tokio::time::sleep_until(early).await;
    // Bounded, for a clock paused by a test, which yielding never moves on.
    for _ in 0..1_000_000 {
        if Instant::now() >= when {
            return;
        }
        tokio::task::yield_now().await;
    }
    tokio::time::sleep_until(when).await;
}

/// One direction of one connection: a reader that stamps each chunk with when it may be
/// delivered, and a writer that delivers it then. Returns both tasks' abort handles.
fn spawn_direction(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    one_way: Duration,
    direction: Direction,
    counters: Arc<Counters>,
    server_spoke: Arc<AtomicBool>,
) -> [AbortHandle; 2] {
    // None: the reader saw the end of the stream (or an error); shut the write side down.
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let reading_counters = Arc::clone(&counters);
    let reading_spoke = Arc::clone(&server_spoke);
    let reader = tokio::spawn(async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => {
                    let _ = chunks.send((Instant::now() + one_way, None));
                    return;
                }
                Ok(read) => read,
            };
            let data = buffer[..read].to_vec();
            match direction {
                Direction::ToServer => {
                    if reading_spoke.swap(false, Ordering::SeqCst) {
                        reading_counters.turns.fetch_add(1, Ordering::SeqCst);
                    }
                    reading_counters
                        .bytes_to_server
                        .fetch_add(read as u64, Ordering::SeqCst);
                    if let Some(captured) = &reading_counters.captured {
                        let mut captured = lock(captured);
                        let room = CAPTURE_LIMIT.saturating_sub(captured.len());
                        captured.extend_from_slice(&data[..read.min(room)]);
                    }
                }
                Direction::ToClient => {
                    reading_counters
                        .bytes_to_client
                        .fetch_add(read as u64, Ordering::SeqCst);
                }
            }
            if chunks.send((Instant::now() + one_way, Some(data))).is_err() {
                return;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some((when, chunk)) = due.recv().await {
            deliver_at(when).await;
            let Some(chunk) = chunk else {
                let _ = to.shutdown().await;
                return;
            };
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            if direction == Direction::ToClient {
                // Marked once delivered: the client can answer it only from now on.
                server_spoke.store(true, Ordering::SeqCst);
            }
        }
    });
    [reader.abort_handle(), writer.abort_handle()]
}
