//! How [`Admin::serve`](super::Admin::serve) holds its connections: each served by hyper with
//! a timer, so that none holds the server longer than a bounded time, and at most
//! [`OPEN_AT_ONCE`] open at once.
//!
//! - A request's headers must arrive within [`HEADER_READ`]. Hyper's header timer runs from
//!   the moment a connection waits for a request, so the same bound cuts a client that sends
//!   its headers slowly (slowloris), one that sends nothing, and an idle keep-alive
//!   connection.
//! - A request is answered within [`REQUEST`] (its body read included), else 408.
//! - A connection lives at most [`LIFETIME`]: then it is asked to close after the request
//!   under way, and cut [`HEADER_READ`] later if it has not (a client that reads its answer
//!   slowly holds no slot for ever).
//! - A connection beyond [`OPEN_AT_ONCE`] is closed unanswered: the newest are refused, so
//!   that those being served are not cut, and the timeouts above bound how long the others
//!   keep their slots.
//! - One peer (an IPv4 address, or an IPv6 /64, as the credential's throttle counts them)
//!   holds at most [`OPEN_PER_PEER`] of them: one more from it is closed unanswered, so
//!   that a single client keeping its requests under way cannot take every slot and keep
//!   the operator out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

/// How long a client may take to send a request's headers, counted from when the connection
/// waits for one: also how long a keep-alive connection may stay idle. The page refreshes
/// every 5 s, so a browser's connection outlives its refreshes.
pub(crate) const HEADER_READ: Duration = Duration::from_secs(10);

/// How long a request may take, its body read and its answer made.
pub(crate) const REQUEST: Duration = Duration::from_secs(30);

/// How long a connection may stay open, however busy.
pub(crate) const LIFETIME: Duration = Duration::from_secs(300);

/// The connections open at once; one more is closed unanswered.
pub(crate) const OPEN_AT_ONCE: usize = 1024;

/// The connections one peer may hold at once: a sixteenth of [`OPEN_AT_ONCE`], far more
/// than a browser opens (six), so that it takes many addresses to fill the page.
pub(crate) const OPEN_PER_PEER: usize = OPEN_AT_ONCE / 16;

/// The connections the [trusted proxies](super::Admin::trusted_proxies) may hold at once,
/// all together: every client behind them comes from their addresses, but half of
/// [`OPEN_AT_ONCE`] is left to the others (the webhook receivers' providers, the page's
/// direct visitors), however many addresses one proxy reaches the page from.
pub(crate) const OPEN_PER_PROXY: usize = OPEN_AT_ONCE / 2;

/// The key the trusted proxies' connections are counted under, together: the IPv4 broadcast
/// address, which no peer connects from (an IPv6 key would be some peer's /64: `::` is
/// `::1`'s).
const PROXIES: IpAddr = IpAddr::V4(std::net::Ipv4Addr::BROADCAST);

/// How many connections each peer holds; a peer with none is not kept, so the table holds
/// no more peers than there are connections open (and the one being accepted).
#[derive(Default)]
struct PerPeer {
    open: Mutex<HashMap<IpAddr, PeerCount>>,
    /// The trusted proxies ([`Admin::trusted_proxies`](super::Admin::trusted_proxies)),
    /// held together to [`OPEN_PER_PROXY`] rather than each to [`OPEN_PER_PEER`].
    exempt: Arc<[IpAddr]>,
}

#[derive(Default)]
struct PeerCount {
    open: usize,
    /// Whether a refusal of it was said: once while it holds any connection, so that a
    /// peer cycling its connections at the cap does not fill the log.
    said: bool,
}

/// One connection of `peer`, counted until dropped.
struct PeerSlot {
    table: Arc<PerPeer>,
    peer: IpAddr,
}

impl PerPeer {
    /// A table that holds the `exempt` addresses (trusted proxies) to [`OPEN_PER_PROXY`].
    fn exempting(exempt: Arc<[IpAddr]>) -> PerPeer {
        PerPeer {
            open: Mutex::default(),
            exempt,
        }
    }

    /// A slot for one more connection of `peer`, unless it holds [`OPEN_PER_PEER`] (a
    /// trusted proxy [`OPEN_PER_PROXY`]); its first refusal is logged.
    fn take(table: &Arc<PerPeer>, peer: SocketAddr) -> Option<PeerSlot> {
        let (peer, cap) = if super::throttle::is_trusted(peer.ip(), &table.exempt) {
            (PROXIES, OPEN_PER_PROXY)
        } else {
            (super::throttle::peer_of(peer.ip()), OPEN_PER_PEER)
        };
        let mut open = table.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(peer).or_default();
        if count.open >= cap {
            if !count.said {
                count.said = true;
                tracing::warn!(
                    %peer,
                    open = cap,
                    "admin.connections_refused: one address holds as many connections as it may"
                );
            }
            return None;
        }
        count.open += 1;
        Some(PeerSlot {
            table: Arc::clone(table),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self
            .table
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.peer) {
            count.open = count.open.saturating_sub(1);
            if count.open == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// Serves `router` on `listener` until accepting fails for good (it does not: an axum
/// listener retries its own errors).
pub(crate) async fn serve<L>(
    mut listener: L,
    router: Router,
    trusted_proxies: Arc<[IpAddr]>,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let open = Arc::new(Semaphore::new(OPEN_AT_ONCE));
    let per_peer = Arc::new(PerPeer::exempting(trusted_proxies));
    // Said once each time the cap is reached, not once a connection.
    let mut refusing = false;
    loop {
        let (io, peer) = listener.accept().await;
        // The peer's share first: a peer at its cap takes no slot of the others.
        let Some(peer_slot) = PerPeer::take(&per_peer, peer) else {
            drop(io);
            continue;
        };
        let Ok(slot) = Arc::clone(&open).try_acquire_owned() else {
            if !refusing {
                tracing::warn!(
                    open = OPEN_AT_ONCE,
                    "admin.connections_refused: as many connections are open as the page takes"
                );
                refusing = true;
            }
            drop(io);
            continue;
        };
        refusing = false;
        let router = router.clone();
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            connection(TokioIo::new(io), peer, router).await;
        });
    }
}

/// Serves one connection from `peer` within the bounds of the module docs.
async fn connection<I>(io: TokioIo<I>, peer: SocketAddr, router: Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        // What `axum::serve` gives a handler: whom the request came from.
        request.extensions_mut().insert(ConnectInfo(peer));
        let mut router = router.clone();
        async move {
            let answered = tokio::time::timeout(
                REQUEST,
                tower_service::Service::call(&mut router, request.map(Body::new)),
            )
            .await;
            Ok::<Response<Body>, Infallible>(match answered {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => {
                    (StatusCode::REQUEST_TIMEOUT, "the request took too long\n").into_response()
                }
            })
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ);
    let connection = http.serve_connection(io, service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        () = tokio::time::sleep(LIFETIME) => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(HEADER_READ, connection.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(error) = ended {
        // A client gone, or cut by a timeout: worth a look only when debugging.
        tracing::debug!(%peer, %error, "admin.connection_ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(address: &str) -> SocketAddr {
        SocketAddr::new(address.parse().unwrap(), 4000)
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_a_closed_connection_gives_its_slot_back() {
        let table = Arc::new(PerPeer::default());
        let mut held: Vec<PeerSlot> = (0..OPEN_PER_PEER)
            .map(|_| PerPeer::take(&table, at("192.0.2.1")).expect("within its share"))
            .collect();
        assert!(PerPeer::take(&table, at("192.0.2.1")).is_none());
        assert!(
            PerPeer::take(&table, at("192.0.2.2")).is_some(),
            "another peer has its own share"
        );
        held.pop();
        assert!(PerPeer::take(&table, at("192.0.2.1")).is_some());
    }

    #[test]
    fn a_trusted_proxy_may_hold_half_the_pages_connections_and_others_keep_their_share() {
        let table = Arc::new(PerPeer::exempting(Arc::from(["192.0.2.9"
            .parse()
            .unwrap()])));
        let held: Vec<PeerSlot> = (0..OPEN_PER_PROXY)
            .map(|_| PerPeer::take(&table, at("::ffff:192.0.2.9")).expect("within its share"))
            .collect();
        assert!(
            PerPeer::take(&table, at("192.0.2.9")).is_none(),
            "half at most"
        );
        let others: Vec<PeerSlot> = (0..OPEN_PER_PEER)
            .map(|_| PerPeer::take(&table, at("192.0.2.1")).expect("within its share"))
            .collect();
        assert!(
            PerPeer::take(&table, at("192.0.2.1")).is_none(),
            "others are capped"
        );
        drop((held, others));
        assert!(table.open.lock().unwrap().is_empty());
    }

    #[test]
    fn a_peers_first_refusal_is_logged_once_while_it_holds_connections() {
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let table = Arc::new(PerPeer::default());
            let held: Vec<PeerSlot> = (0..OPEN_PER_PEER)
                .map(|_| PerPeer::take(&table, at("192.0.2.1")).expect("within its share"))
                .collect();
            assert!(PerPeer::take(&table, at("192.0.2.1")).is_none());
            assert!(PerPeer::take(&table, at("192.0.2.1")).is_none());
            drop(held);
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text.matches("admin.connections_refused").count(),
            1,
            "{text}"
        );
    }

    /// Review 7: the proxies' shared count was kept under `::`, which is `::1`'s /64.
    #[test]
    fn a_peer_at_loopback_ipv6_that_is_not_trusted_is_counted_apart_from_the_trusted_proxies() {
        let proxies: Arc<[IpAddr]> = Arc::from(["127.0.0.1".parse().unwrap()]);
        let table = Arc::new(PerPeer::exempting(proxies));
        let held: Vec<PeerSlot> = (0..OPEN_PER_PEER)
            .map(|_| PerPeer::take(&table, at("127.0.0.1")).expect("within their share"))
            .collect();
        assert!(
            PerPeer::take(&table, at("::1")).is_some(),
            "::1 has its own share"
        );
        drop(held);
    }

    /// Review 6: the same nginx often reaches the page as `127.0.0.1` and `::1`; two
    /// trusted proxies held half each, and left nothing to the others.
    #[test]
    fn the_trusted_proxies_together_hold_at_most_half_the_pages_connections() {
        // The documented figures: 512 of 1024, where one address holds 64.
        assert_eq!(
            (OPEN_PER_PROXY, OPEN_AT_ONCE, OPEN_PER_PEER),
            (512, 1024, 64)
        );
        let proxies: Arc<[IpAddr]> =
            Arc::from(["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()]);
        let table = Arc::new(PerPeer::exempting(proxies));
        let held: Vec<PeerSlot> = (0..OPEN_PER_PROXY)
            .map(|n| {
                let proxy = if n % 2 == 0 { "127.0.0.1" } else { "::1" };
                PerPeer::take(&table, at(proxy)).expect("within their share")
            })
            .collect();
        assert!(PerPeer::take(&table, at("::1")).is_none(), "half at most");
        assert!(
            PerPeer::take(&table, at("127.0.0.1")).is_none(),
            "half at most"
        );
        drop(held);
        assert!(table.open.lock().unwrap().is_empty());
    }

    #[test]
    fn a_peer_whose_connections_all_closed_is_forgotten() {
        let table = Arc::new(PerPeer::default());
        let slot = PerPeer::take(&table, at("192.0.2.1")).expect("a slot");
        let other = PerPeer::take(&table, at("192.0.2.2")).expect("a slot");
        assert_eq!(table.open.lock().unwrap().len(), 2);
        drop(slot);
        assert_eq!(table.open.lock().unwrap().len(), 1);
        drop(other);
        assert!(table.open.lock().unwrap().is_empty());
    }

    #[test]
    fn the_addresses_of_one_ipv6_64_share_one_peers_connections() {
        let table = Arc::new(PerPeer::default());
        let held: Vec<PeerSlot> = (0..OPEN_PER_PEER as u16)
            .map(|n| {
                let address = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, n);
                PerPeer::take(&table, SocketAddr::from((address, 4000))).expect("a slot")
            })
            .collect();
        assert!(PerPeer::take(&table, at("2001:db8:0:1::ffff")).is_none());
        assert!(PerPeer::take(&table, at("2001:db8:0:2::1")).is_some());
        drop(held);
    }
}
