//! `serve --tls-cert FILE --tls-key FILE`: the page over TLS (rustls), each connection's
//! handshake made before the page's server sees it, in a task of its own and for a bounded
//! time, the oldest let go when too many are under way.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

use crate::exit::Failure;

/// How long a client may take over its handshake; one that says nothing is cut then.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Handshakes under way at once. A connection beyond them lets the oldest go: the accept
/// loop never waits for a slot, so silent connections cannot keep a client out, and an
/// attacker must open connections faster than a real client's handshake takes (a few
/// milliseconds) to keep one out, rather than 64 every 10 seconds.
const HANDSHAKES_AT_ONCE: usize = 64;

/// Handshaken connections waiting for the server to take them; beyond, one is dropped.
const WAITING_AT_MOST: usize = 64;

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
/// each for [`HANDSHAKE`] at most, and at most [`HANDSHAKES_AT_ONCE`] at once, the oldest let
/// go for a new one: a connection that does not finish its handshake keeps no other out.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

/// The handshakes under way, oldest first: each one's number and what stops it.
#[derive(Default)]
struct UnderWay {
    next: u64,
    handshakes: VecDeque<(u64, AbortHandle)>,
}

impl UnderWay {
    /// Makes room for one more handshake: the oldest ones beyond the cap are stopped (their
    /// connections closed).
    fn make_room(&mut self) {
        while self.handshakes.len() >= HANDSHAKES_AT_ONCE {
            if let Some((_, oldest)) = self.handshakes.pop_front() {
                oldest.abort();
            }
        }
    }

    /// The number of the next handshake.
    fn number(&mut self) -> u64 {
        let number = self.next;
        self.next = self.next.wrapping_add(1);
        number
    }

    /// Keeps `handshake`, under `number`.
    fn add(&mut self, number: u64, handshake: AbortHandle) {
        self.handshakes.push_back((number, handshake));
    }

    /// Forgets handshake `number`: it ended.
    fn remove(&mut self, number: u64) {
        self.handshakes.retain(|(each, _)| *each != number);
    }
}

impl TlsListener {
    /// Accepts on `listener` and makes each connection's handshake with `acceptor`, until the
    /// listener is dropped.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (ready, handshaken) = mpsc::channel(WAITING_AT_MOST);
        let under_way = Arc::new(Mutex::new(UnderWay::default()));
        tokio::spawn(async move {
            loop {
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
                {
                    let mut handshakes = under_way.lock().unwrap_or_else(PoisonError::into_inner);
                    handshakes.make_room();
                    let number = handshakes.number();
                    let (acceptor, ready, under_way) =
                        (acceptor.clone(), ready.clone(), Arc::clone(&under_way));
                    // Kept below before the lock is let go, so that its end (which takes the
                    // lock) always finds it.
                    let task = tokio::spawn(async move {
                        let made = tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await;
                        under_way
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(number);
                        match made {
                            Ok(Ok(tls)) => {
                                if ready.try_send((tls, peer)).is_err() {
                                    tracing::debug!(%peer, "serve.tls_dropped: the server is busy");
                                }
                            }
                            Ok(Err(error)) => tracing::debug!(%peer, %error, "serve.tls_refused"),
                            Err(_) => tracing::debug!(%peer, "serve.tls_handshake_timed_out"),
                        }
                    });
                    handshakes.add(number, task.abort_handle());
                }
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
