//! A TCP relay in the test, between a client and a server, that can stop forwarding without
//! closing anything: a link that drops packets, as a dead network path does. Bytes that
//! arrive meanwhile are held, and delivered once it forwards again (as TCP's retransmissions
//! would).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// Forwards each connection made to [`port`](Self::port) to `127.0.0.1:<upstream>`, until
/// dropped.
pub struct Relay {
    port: u16,
    forwarding: Arc<AtomicBool>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        let forwarding = Arc::new(AtomicBool::new(true));
        let shared = Arc::clone(&forwarding);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let forwarding = Arc::clone(&shared);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    let up = pipe(from_client, to_server, Arc::clone(&forwarding));
                    let down = pipe(from_server, to_client, forwarding);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Relay {
            port,
            forwarding,
            accepting,
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding: nothing is closed, nothing answered; bytes are held.
    pub fn blackhole(&self) {
        self.forwarding.store(false, Ordering::SeqCst);
    }

    /// Forwards again, the held bytes first.
    pub fn forward(&self) {
        self.forwarding.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies `from` to `to`, holding each read while the relay does not forward; at the end of
/// `from`, shuts `to` down.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, forwarding: Arc<AtomicBool>) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        while !forwarding.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
