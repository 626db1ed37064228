//! The socket under lettre's SMTP connection: a TCP stream the crate opens with TCP_NODELAY
//! set, watched so that a send knows whether its final dot went out.
//!
//! # Why a watch on the socket
//! A send that fails after the final `.` was written may have been delivered: the server may
//! hold the message although its reply never came. Before that point it cannot hold it. lettre
//! writes the body and the final dot and only then reads the reply, and its TLS layer reads
//! nothing while it writes; so once the body has begun, the first read that reaches the
//! socket shows that the whole body and the dot were written and flushed. That read is what
//! [`DotWatch`] notes. It works under TLS too, where the bytes on the socket are ciphertext.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use lettre::transport::smtp::client::AsyncTokioStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Where a connection's current transaction stands with its final dot.
#[derive(Debug, Default)]
pub(super) struct DotWatch(AtomicU8);

/// No body is being written.
const NO_BODY: u8 = 0;
/// The body is being written; its dot may not have gone out yet.
const WRITING_BODY: u8 = 1;
/// The body and its final dot were written, and the reply is awaited.
const DOT_WRITTEN: u8 = 2;

impl DotWatch {
    /// A transaction begins: whatever the last one did is forgotten.
    pub(super) fn transaction_begins(&self) {
        self.0.store(NO_BODY, Ordering::Relaxed);
    }

    /// The body is about to be written.
    pub(super) fn body_begins(&self) {
        self.0.store(WRITING_BODY, Ordering::Relaxed);
    }

    /// Whether the final dot of the current transaction was written.
    pub(super) fn final_dot_written(&self) -> bool {
        self.0.load(Ordering::Relaxed) == DOT_WRITTEN
    }

    /// The connection reads from its socket.
    fn reading(&self) {
        // Fails harmlessly outside a body: a read then says nothing about a dot.
        let _ = self.0.compare_exchange(
            WRITING_BODY,
            DOT_WRITTEN,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

/// A TCP stream whose reads are reported to a [`DotWatch`].
pub(super) struct WatchedSocket {
    tcp: TcpStream,
    watch: Arc<DotWatch>,
}

impl WatchedSocket {
    /// Connects to `host:port` with TCP_NODELAY set: lettre writes each command, the body and
    /// the final dot as separate small writes, and Nagle's algorithm with the server's
    /// delayed ACK would hold each of them back some 40 ms.
    pub(super) async fn connect(
        host: &str,
        port: u16,
        watch: Arc<DotWatch>,
    ) -> io::Result<WatchedSocket> {
        let tcp = TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        Ok(WatchedSocket { tcp, watch })
    }
}

impl fmt::Debug for WatchedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedSocket")
            .field("peer", &self.tcp.peer_addr().ok())
            .finish_non_exhaustive()
    }
}

impl AsyncRead for WatchedSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.watch.reading();
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for WatchedSocket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl AsyncTokioStream for WatchedSocket {
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }
}
