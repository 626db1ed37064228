//! `serve --tls-cert FILE --tls-key FILE`: the page over TLS (rustls), each connection's
//! handshake made before the page's server sees it, in a task of its own and for a bounded
//! time; when too many are under way, the oldest of the address that has the most is let go.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
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

/// Handshakes under way at once. A connection beyond them lets one go: the accept loop
/// never waits for a slot, so silent connections cannot keep a client out. The one let go
/// is the oldest of the address with the most under way, so that an address opening
/// connections faster than a distant client's handshake takes (two round trips) lets go
/// of its own, never of that client's.
const HANDSHAKES_AT_ONCE: usize = 64;

/// Handshakes one address (an IPv6 /64) may have under way: one more from it lets its own
/// oldest go. A browser opens six connections at most.
const HANDSHAKES_PER_PEER: usize = 8;

/// Handshakes the trusted proxies (`--trusted-proxy`) may have under way, together: every
/// client behind a proxy that speaks TLS to the page comes from its addresses.
const HANDSHAKES_THROUGH_PROXIES: usize = HANDSHAKES_AT_ONCE / 2;

/// The key the trusted proxies' handshakes are counted under, together: the IPv4 broadcast
/// address, which no peer connects from (an IPv6 key would be some peer's /64: `::` is
/// `::1`'s).
const PROXIES: IpAddr = IpAddr::V4(std::net::Ipv4Addr::BROADCAST);

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

/// The handshakes under way, oldest first: each one's number, its peer and what stops it.
#[derive(Default)]
struct UnderWay {
    next: u64,
    handshakes: VecDeque<(u64, IpAddr, AbortHandle)>,
    /// The trusted proxies, canonical: counted together, against
    /// [`HANDSHAKES_THROUGH_PROXIES`].
    proxies: Vec<IpAddr>,
}

impl UnderWay {
    /// No handshake under way yet, with `proxies` trusted.
    fn trusting(proxies: Vec<IpAddr>) -> UnderWay {
        UnderWay {
            proxies: proxies
                .into_iter()
                .map(|proxy| proxy.to_canonical())
                .collect(),
            ..UnderWay::default()
        }
    }

    /// Whom a handshake from `address` is counted against: the trusted proxies together,
    /// or its peer ([`peer_of`]).
    fn peer(&self, address: IpAddr) -> IpAddr {
        if self.proxies.contains(&address.to_canonical()) {
            PROXIES
        } else {
            peer_of(address)
        }
    }

    /// Makes room for one more handshake from `address`: its peer's own oldest is stopped
    /// (its connection closed) when it has [`HANDSHAKES_PER_PEER`] under way (the trusted
    /// proxies together [`HANDSHAKES_THROUGH_PROXIES`]), and while all have
    /// [`HANDSHAKES_AT_ONCE`], the oldest of the peer with the most.
    fn make_room(&mut self, address: IpAddr) {
        let peer = self.peer(address);
        let share = if peer == PROXIES {
            HANDSHAKES_THROUGH_PROXIES
        } else {
            HANDSHAKES_PER_PEER
        };
        if self.of(peer) >= share {
            self.stop_oldest_of(peer);
        }
        while self.handshakes.len() >= HANDSHAKES_AT_ONCE {
            let mut counts: HashMap<IpAddr, usize> = HashMap::new();
            for (_, each, _) in &self.handshakes {
                *counts.entry(*each).or_default() += 1;
            }
            // The first peer (oldest) among those with the most: ties go as before.
            let most = counts.values().copied().max().unwrap_or(0);
            let Some(busiest) = self
                .handshakes
                .iter()
                .map(|(_, each, _)| *each)
                .find(|each| counts.get(each) == Some(&most))
            else {
                return;
            };
            self.stop_oldest_of(busiest);
        }
    }

    /// The handshakes `peer` has under way.
    fn of(&self, peer: IpAddr) -> usize {
        self.handshakes
            .iter()
            .filter(|(_, each, _)| *each == peer)
            .count()
    }

    /// Stops `peer`'s oldest handshake under way.
    fn stop_oldest_of(&mut self, peer: IpAddr) {
        if let Some(at) = self
            .handshakes
            .iter()
            .position(|(_, each, _)| *each == peer)
            && let Some((_, _, oldest)) = self.handshakes.remove(at)
        {
            oldest.abort();
        }
    }

    /// The number of the next handshake.
    fn number(&mut self) -> u64 {
        let number = self.next;
        self.next = self.next.wrapping_add(1);
        number
    }

    /// Keeps `handshake` from `address`, under `number`.
    fn add(&mut self, number: u64, address: IpAddr, handshake: AbortHandle) {
        let peer = self.peer(address);
        self.handshakes.push_back((number, peer, handshake));
    }

    /// Forgets handshake `number`: it ended.
    fn remove(&mut self, number: u64) {
        self.handshakes.retain(|(each, _, _)| *each != number);
    }
}

impl TlsListener {
    /// Accepts on `listener` and makes each connection's handshake with `acceptor`, until the
    /// listener is dropped.
    /// The `proxies` (`--trusted-proxy`) may have [`HANDSHAKES_THROUGH_PROXIES`] under way
    /// together, rather than one address's [`HANDSHAKES_PER_PEER`].
    pub fn new(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        proxies: Vec<IpAddr>,
    ) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (ready, handshaken) = mpsc::channel(WAITING_AT_MOST);
        let under_way = Arc::new(Mutex::new(UnderWay::trusting(proxies)));
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
                    let from = peer.ip();
                    handshakes.make_room(from);
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
                    handshakes.add(number, from, task.abort_handle());
                }
            }
        });
        Ok(TlsListener { handshaken, local })
    }
}

/// The peer `address` is counted as: an IPv6 address by its /64 (what one host is usually
/// given), an IPv4 one (mapped into IPv6 or not) by itself, as the page's server counts it.
fn peer_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A handshake from `address` that never ends, kept in `under_way` as the accept loop
    /// keeps it.
    fn pending(under_way: &mut UnderWay, address: IpAddr) -> tokio::task::JoinHandle<()> {
        under_way.make_room(address);
        let number = under_way.number();
        let task = tokio::spawn(std::future::pending::<()>());
        under_way.add(number, address, task.abort_handle());
        task
    }

    /// Review 7: the proxies' shared count was kept under `::`, which is `::1`'s /64, so
    /// with no proxy `::1` had the proxies' 32.
    #[tokio::test]
    async fn a_peer_at_loopback_ipv6_has_one_addresss_share_of_handshakes() {
        let mut under_way = UnderWay::trusting(Vec::new());
        let local: IpAddr = "::1".parse().unwrap();
        let own: Vec<_> = (0..=HANDSHAKES_PER_PEER)
            .map(|_| pending(&mut under_way, local))
            .collect();
        assert!(stopped(&own[0]).await, "its ninth lets its first go");
    }

    /// Review 6: behind a proxy that speaks TLS to the page, every client's handshake comes
    /// from the proxy's address, and a burst of eight let the others' go.
    #[tokio::test]
    async fn the_trusted_proxies_together_may_have_half_the_handshakes_under_way() {
        let proxies: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        let mut under_way = UnderWay::trusting(proxies.clone());
        let through: Vec<_> = (0..HANDSHAKES_AT_ONCE / 2)
            .map(|n| pending(&mut under_way, proxies[n % 2]))
            .collect();
        for task in &through {
            assert!(!stopped(task).await, "within their share");
        }
        let next = pending(&mut under_way, proxies[1]);
        assert!(
            stopped(&through[0]).await,
            "beyond it, their own oldest goes"
        );
        assert!(!stopped(&next).await);
        assert_eq!(under_way.handshakes.len(), HANDSHAKES_AT_ONCE / 2);
    }

    async fn stopped(task: &tokio::task::JoinHandle<()>) -> bool {
        tokio::task::yield_now().await;
        task.is_finished()
    }

    fn v4(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[tokio::test]
    async fn a_peer_at_its_share_lets_its_own_oldest_handshake_go_and_no_one_elses() {
        let mut under_way = UnderWay::default();
        let other = pending(&mut under_way, v4(9));
        let own: Vec<_> = (0..HANDSHAKES_PER_PEER)
            .map(|_| pending(&mut under_way, v4(1)))
            .collect();
        let newest = pending(&mut under_way, v4(1));
        assert!(stopped(&own[0]).await, "its own oldest goes");
        for task in &own[1..] {
            assert!(!stopped(task).await);
        }
        assert!(!stopped(&other).await, "another peer's is kept");
        assert!(!stopped(&newest).await);
        assert_eq!(under_way.of(v4(1)), HANDSHAKES_PER_PEER);
        assert_eq!(under_way.of(v4(9)), 1);
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_handshake_of_the_peer_with_the_most_goes() {
        let mut under_way = UnderWay::default();
        let lone = pending(&mut under_way, v4(200));
        let mut tasks = Vec::new();
        // The rest of the cap: peers 1, 2, ... with 7 each, the last with fewer.
        let mut peer = 1;
        while under_way.handshakes.len() < HANDSHAKES_AT_ONCE {
            if under_way.of(v4(peer)) == HANDSHAKES_PER_PEER - 1 {
                peer += 1;
            }
            tasks.push((peer, pending(&mut under_way, v4(peer))));
        }
        let newcomer = pending(&mut under_way, v4(250));
        assert!(!stopped(&lone).await, "the oldest, but of a peer with one");
        assert!(
            stopped(&tasks[0].1).await,
            "the oldest of the busiest peer goes"
        );
        assert_eq!(tasks[0].0, 1);
        for (_, task) in &tasks[1..] {
            assert!(!stopped(task).await);
        }
        assert!(!stopped(&newcomer).await);
        assert_eq!(under_way.handshakes.len(), HANDSHAKES_AT_ONCE);
    }

    #[tokio::test]
    async fn a_handshake_that_ended_is_forgotten_and_the_others_are_kept() {
        let mut under_way = UnderWay::default();
        let first = pending(&mut under_way, v4(1));
        let second = pending(&mut under_way, v4(1));
        let number = under_way.handshakes[0].0;
        under_way.remove(number);
        assert_eq!(under_way.of(v4(1)), 1, "the other still under way");
        drop((first, second));
    }

    #[tokio::test]
    async fn a_handshake_that_ended_is_forgotten() {
        let mut under_way = UnderWay::default();
        let task = pending(&mut under_way, v4(1));
        let number = under_way.handshakes[0].0;
        under_way.remove(number);
        assert_eq!(under_way.of(v4(1)), 0);
        assert!(under_way.handshakes.is_empty());
        task.abort();
    }

    #[test]
    fn the_addresses_of_one_ipv6_64_are_one_peer_and_a_mapped_ipv4_is_the_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(peer_of(a), peer_of(b));
        assert_ne!(peer_of(a), peer_of(c));
        assert_eq!(peer_of(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        assert_eq!(peer_of("::ffff:192.0.2.1".parse().unwrap()), v4(1));
        assert_eq!(peer_of(v4(1)), v4(1));
    }
}
