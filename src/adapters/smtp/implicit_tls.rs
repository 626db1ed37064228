//! TLS on the crate's own socket, for implicit TLS (SMTPS, port 465) before the greeting and
//! for STARTTLS after its `220`.
//!
//! The socket is wrapped in lettre's own TLS layer (with the caller's `TlsParameters`, whose
//! configuration lettre keeps private), and the encrypted stream is read and written like a
//! plain one. lettre calls its stream type
//! `AsyncNetworkStream` "not meant to be public"; it is the one way to use the caller's TLS
//! settings on a socket of our own, so its use stays in this file.
#![allow(deprecated)]

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::io::{AsyncRead as FuturesRead, AsyncWrite as FuturesWrite};
use lettre::transport::smtp::Error as SmtpError;
use lettre::transport::smtp::client::{AsyncNetworkStream, AsyncTokioStream, TlsParameters};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `socket` after a TLS handshake. Call it with nothing of the server's read ahead: what the
/// server sent before the handshake is not part of the encrypted session.
pub(super) async fn wrap(
    socket: Box<dyn AsyncTokioStream>,
    parameters: TlsParameters,
) -> Result<Box<dyn AsyncTokioStream>, SmtpError> {
    let mut stream = AsyncNetworkStream::use_existing_tokio1(socket);
    stream.upgrade_tls(parameters).await?;
    Ok(Box::new(Encrypted(stream)))
}

/// lettre's encrypted stream, seen through Tokio's I/O traits.
#[derive(Debug)]
struct Encrypted(AsyncNetworkStream);

impl AsyncRead for Encrypted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = match Pin::new(&mut self.0).poll_read(cx, buf.initialize_unfilled()) {
            Poll::Ready(Ok(read)) => read,
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            Poll::Pending => return Poll::Pending,
        };
        buf.advance(read);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Encrypted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}

impl AsyncTokioStream for Encrypted {
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.0.peer_addr()
    }
}
