//! `serve --tls-cert FILE --tls-key FILE`: the page over TLS (rustls), each connection's
//! handshake made before axum sees it.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

use crate::exit::Failure;

/// How long a client may take over its handshake: one that says nothing holds no slot longer.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Handshakes made at once; a connection beyond them waits for its TCP accept.
const HANDSHAKES_AT_ONCE: usize = 64;

/// The server's side of TLS from a PEM certificate chain and its PEM private key; a file that
/// cannot be read or holds no certificate or key is bad arguments, naming the file.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, Failure> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| {
            Failure::usage(format!(
                "--tls-cert {}: no PEM certificate read: {error}",
                cert.display()
            ))
        })?;
    if chain.is_empty() {
        return Err(Failure::usage(format!(
            "--tls-cert {}: holds no PEM certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|error| {
        Failure::usage(format!(
            "--tls-key {}: no PEM private key read: {error}",
            key.display()
        ))
    })?;
    // Other dependencies may compile in another crypto provider, and rustls then has no
    // default: name one.
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|error| Failure::usage(format!("TLS: {error}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| {
            Failure::usage(format!(
                "--tls-cert and --tls-key do not make a certificate and its key: {error}"
            ))
        })?;
    // The page speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener whose connections have made their TLS handshake: for
/// [`Admin::serve`](mail_breaker::admin::Admin::serve). Handshakes run in tasks of their own,
/// so that a slow client delays no other.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` and makes each connection's handshake with `acceptor`, until the
    /// listener is dropped.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (ready, handshaken) = mpsc::channel(HANDSHAKES_AT_ONCE);
        let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_AT_ONCE));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = ready.closed() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, or a connection reset before it was taken:
                        // wait a little rather than spin.
                        tracing::warn!(%error, "serve.accept_failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, ready) = (acceptor.clone(), ready.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = ready.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "serve.tls_refused"),
                        Err(_) => tracing::debug!(%peer, "serve.tls_handshake_timed_out"),
                    }
                });
            }
        });
        Ok(TlsListener { handshaken, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The accepting task ended (the runtime is shutting down): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
