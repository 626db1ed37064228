//! How many wrong credentials a peer may send: after [`WRONG_AT_MOST`] within [`WINDOW`],
//! every request from it is refused (429) for [`HELD_FOR`], whatever it carries, so that a
//! credential cannot be guessed at the speed of the network. A peer is an IPv4 address or an
//! IPv6 /64 (what one host is usually given); its network ([`network_of`]: an IPv4 /24, an
//! IPv6 /48) is counted too, against [`WRONG_FROM_A_NETWORK_AT_MOST`], so that one network's
//! many addresses do not guess ten times each. Behind a trusted proxy the peer is the client
//! the proxy names ([`client`]), and the proxy itself is counted too, against
//! [`WRONG_THROUGH_A_PROXY_AT_MOST`]. A network or a proxy held back still lets through a
//! client that gave the right credential within [`ADMITTED_FOR`]. Without the peer's address
//! (a router that an application serves without axum's `ConnectInfo`) all requests are one
//! peer.
//!
//! The table keeps at most [`PEERS_AT_MOST`] peers: when full, the entries that no longer
//! count are dropped first, then the one whose wrong credentials are oldest, a held peer
//! last.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::time::Instant;

/// The wrong credentials a peer may send within [`WINDOW`] before it is held back.
pub(crate) const WRONG_AT_MOST: u32 = 10;

/// The wrong credentials that may come from one network ([`network_of`]) within [`WINDOW`],
/// whichever of its addresses send them, before the whole network is held back.
pub(crate) const WRONG_FROM_A_NETWORK_AT_MOST: u32 = 10 * WRONG_AT_MOST;

/// The wrong credentials that may come through one trusted proxy within [`WINDOW`], whatever
/// clients it names, before everything it forwards is held back: a proxy that passes on its
/// clients' own `X-Forwarded-For` would otherwise let a guesser name a new client for each
/// guess. Ten times a network's, so that guessers from a few networks, each held back on its
/// own, do not keep out the operator on call.
pub(crate) const WRONG_THROUGH_A_PROXY_AT_MOST: u32 = 10 * WRONG_FROM_A_NETWORK_AT_MOST;

/// How long a client that gave the right credential is let through while its network or
/// its proxy is held back for others' wrong ones.
pub(crate) const ADMITTED_FOR: Duration = Duration::from_secs(3600);

/// How long a wrong credential counts.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// How long a peer that sent too many is refused.
pub(crate) const HELD_FOR: Duration = Duration::from_secs(300);

/// The peers the table keeps at most.
pub(crate) const PEERS_AT_MOST: usize = 4096;

/// Whom wrong credentials are counted against: an IPv4 address, an IPv6 /64, or `None`
/// when the request does not say.
type Peer = Option<IpAddr>;

/// One peer's wrong credentials.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When the first wrong credential that still counts came.
    since: Instant,
    wrong: u32,
    /// Until when the peer is refused, once it sent too many.
    held_until: Option<Instant>,
}

impl Entry {
    /// Whether the entry still says anything at `now`.
    fn counts(&self, now: Instant) -> bool {
        match self.held_until {
            Some(until) => now < until,
            None => now.saturating_duration_since(self.since) < WINDOW,
        }
    }
}

/// The wrong credentials of each peer; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Throttle {
    peers: Mutex<HashMap<Peer, Entry>>,
    /// The wrong credentials a peer may send within [`WINDOW`].
    wrong_at_most: u32,
}

impl Default for Throttle {
    /// The throttle of clients: [`WRONG_AT_MOST`].
    fn default() -> Throttle {
        Throttle::allowing(WRONG_AT_MOST)
    }
}

impl Throttle {
    /// A throttle that holds a peer back at its `wrong_at_most`th wrong credential within
    /// [`WINDOW`].
    pub(crate) fn allowing(wrong_at_most: u32) -> Throttle {
        Throttle {
            peers: Mutex::default(),
            wrong_at_most,
        }
    }

    /// How long `peer` is still refused at `now`, if it is.
    pub(crate) fn held(&self, peer: Option<IpAddr>, now: Instant) -> Option<Duration> {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let until = peers.get(&key(peer))?.held_until?;
        (now < until).then(|| until.saturating_duration_since(now))
    }

    /// Counts a wrong credential from `peer` at `now`; the one that makes too many holds the
    /// peer back.
    pub(crate) fn wrong(&self, peer: Option<IpAddr>, now: Instant) {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let peer = key(peer);
        if !peers.contains_key(&peer) && peers.len() >= PEERS_AT_MOST {
            make_room(&mut peers, now);
        }
        let entry = peers.entry(peer).or_insert(Entry {
            since: now,
            wrong: 0,
            held_until: None,
        });
        if !entry.counts(now) {
            *entry = Entry {
                since: now,
                wrong: 0,
                held_until: None,
            };
        }
        entry.wrong = entry.wrong.saturating_add(1);
        if entry.wrong >= self.wrong_at_most {
            entry.held_until = Some(now + HELD_FOR);
        }
    }

    /// Forgets `peer`'s wrong credentials: it has just given the right one.
    pub(crate) fn admitted(&self, peer: Option<IpAddr>) {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers.remove(&key(peer));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The clients (as [`peer_of`] counts them) that gave the right credential lately, at most
/// [`PEERS_AT_MOST`]: when full, those admitted longest ago are forgotten first.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    clients: Mutex<HashMap<IpAddr, Instant>>,
}

impl Admitted {
    /// `client` gave the right credential at `now`.
    pub(crate) fn note(&self, client: IpAddr, now: Instant) {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let client = peer_of(client);
        if !clients.contains_key(&client) && clients.len() >= PEERS_AT_MOST {
            clients.retain(|_, at| now.saturating_duration_since(*at) < ADMITTED_FOR);
            if clients.len() >= PEERS_AT_MOST
                && let Some(oldest) = clients.iter().min_by_key(|(_, at)| **at).map(|(c, _)| *c)
            {
                clients.remove(&oldest);
            }
        }
        clients.insert(client, now);
    }

    /// Whether `client` gave the right credential within [`ADMITTED_FOR`] of `now`.
    pub(crate) fn lately(&self, client: IpAddr, now: Instant) -> bool {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients
            .get(&peer_of(client))
            .is_some_and(|at| now.saturating_duration_since(*at) < ADMITTED_FOR)
    }
}

/// The peer `address` is counted as: an IPv6 address by its /64, an IPv4 one (mapped into
/// IPv6 or not) by itself.
fn key(address: Option<IpAddr>) -> Peer {
    address.map(peer_of)
}

/// The peer `address` is counted as, for the throttle and the connections' cap: an IPv6
/// address by its /64, an IPv4 one (mapped into IPv6 or not) by itself.
pub(crate) fn peer_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// The network `address` belongs to, counted as a whole: an IPv4 /24 (an IPv4 address
/// mapped into IPv6 included), an IPv6 /48 (what one site is usually given).
pub(crate) fn network_of(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & !0xff).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 80) - 1)).into()),
    }
}

/// The client a request from `peer` is counted as: `peer` itself, unless it is one of the
/// trusted `proxies` ([`Admin::trusted_proxies`](super::Admin::trusted_proxies)); then the
/// rightmost address of `X-Forwarded-For` that is not itself a trusted proxy (the address the
/// outermost trusted proxy was reached from: the entries to its left are the client's own
/// claims), or `peer` when the header names none it can read.
pub(crate) fn client(peer: IpAddr, headers: &HeaderMap, proxies: &[IpAddr]) -> IpAddr {
    let trusted = |address: IpAddr| is_trusted(address, proxies);
    if !trusted(peer) {
        return peer;
    }
    let values: Vec<_> = headers.get_all("x-forwarded-for").iter().collect();
    for value in values.into_iter().rev() {
        // Entry by entry, from the right: bytes a client wrote further left (nginx appends
        // to them in the same value) are never read.
        for hop in value.as_bytes().rsplit(|&byte| byte == b',') {
            let hop = std::str::from_utf8(hop).ok();
            match hop.and_then(|hop| hop_address(hop.trim())) {
                Some(address) if trusted(address) => {}
                Some(address) => return address,
                // Unreadable: whom it names cannot be told, so the proxy answers for it.
                None => return peer,
            }
        }
    }
    peer
}

/// Whether `address` is one of the trusted `proxies` (kept canonical by
/// [`Admin::trusted_proxies`](super::Admin::trusted_proxies)), an IPv4 address mapped into
/// IPv6 included.
pub(crate) fn is_trusted(address: IpAddr, proxies: &[IpAddr]) -> bool {
    proxies.contains(&address.to_canonical())
}

/// The address of one `X-Forwarded-For` entry: `192.0.2.1`, `2001:db8::1`, or either with
/// a port (`192.0.2.1:4000`, `[2001:db8::1]:4000`).
fn hop_address(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .or_else(|_| {
            hop.parse::<std::net::SocketAddr>()
                .map(|address| address.ip())
        })
        .ok()
        .map(|address| address.to_canonical())
}

/// Drops every entry that no longer counts, and if none did, the one whose first wrong
/// credential is oldest (a held peer only when every peer is held).
fn make_room(peers: &mut HashMap<Peer, Entry>, now: Instant) {
    peers.retain(|_, entry| entry.counts(now));
    if peers.len() < PEERS_AT_MOST {
        return;
    }
    let oldest = peers
        .iter()
        .min_by_key(|(_, entry)| (entry.held_until.is_some(), entry.since))
        .map(|(peer, _)| *peer);
    if let Some(oldest) = oldest {
        peers.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([192, 0, 2, last]))
    }

    #[test]
    fn a_peer_is_held_back_at_its_tenth_wrong_credential_within_the_window_and_not_before() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for at in 0..WRONG_AT_MOST - 1 {
            throttle.wrong(v4(1), start + Duration::from_secs(u64::from(at)));
            assert_eq!(throttle.held(v4(1), start + Duration::from_secs(10)), None);
        }
        let tenth = start + Duration::from_secs(20);
        throttle.wrong(v4(1), tenth);
        assert_eq!(throttle.held(v4(1), tenth), Some(HELD_FOR));
        assert_eq!(
            throttle.held(v4(1), tenth + HELD_FOR - Duration::from_secs(1)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(throttle.held(v4(1), tenth + HELD_FOR), None);
        assert_eq!(
            throttle.held(v4(2), tenth),
            None,
            "another peer is not held"
        );
        // Once let go, its count starts again.
        throttle.wrong(v4(1), tenth + HELD_FOR);
        assert_eq!(throttle.held(v4(1), tenth + HELD_FOR), None);
    }

    #[test]
    fn a_network_is_an_ipv4_slash_24_or_an_ipv6_slash_48() {
        let network = |text: &str| network_of(text.parse().unwrap()).to_string();
        assert_eq!(network("203.0.113.77"), "203.0.113.0");
        assert_eq!(network("::ffff:203.0.113.77"), "203.0.113.0");
        assert_eq!(network("2001:db8:aa:bb:cc::1"), "2001:db8:aa::");
        assert_eq!(network("2001:db8:aa:ffff::"), "2001:db8:aa::");
    }

    #[test]
    fn a_full_table_of_admitted_clients_forgets_the_oldest_for_a_new_one_and_no_one_for_one_it_knows()
     {
        let admitted = Admitted::default();
        let start = Instant::now();
        let client = |n: u32| IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
        let full = PEERS_AT_MOST as u32;
        for n in 0..full {
            admitted.note(client(n), start + Duration::from_millis(n.into()));
        }
        let now = start + Duration::from_secs(10);
        // One it knows, again: no one is forgotten.
        admitted.note(client(1), now);
        assert!(admitted.lately(client(0), now));
        // A new one: the one admitted longest ago is forgotten, and the others kept.
        admitted.note(client(full), now);
        assert!(!admitted.lately(client(0), now));
        assert!(admitted.lately(client(2), now));
        assert!(admitted.lately(client(full), now));
    }

    #[test]
    fn a_full_table_of_admitted_clients_drops_those_admitted_over_an_hour_ago_first() {
        let admitted = Admitted::default();
        let start = Instant::now();
        let client = |n: u32| IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
        let full = PEERS_AT_MOST as u32;
        for n in 0..full {
            admitted.note(client(n), start + Duration::from_millis(n.into()));
        }
        // The first six are an hour old or more: they go, and no one admitted lately.
        let now = start + ADMITTED_FOR + Duration::from_millis(5);
        admitted.note(client(full), now);
        assert!(admitted.lately(client(6), now));
        assert!(admitted.lately(client(full), now));
    }

    #[test]
    fn a_client_counts_as_admitted_until_an_hour_after_its_right_credential() {
        let admitted = Admitted::default();
        let at = Instant::now();
        admitted.note(v4(1).unwrap(), at);
        let almost = at + ADMITTED_FOR - Duration::from_millis(1);
        assert!(admitted.lately(v4(1).unwrap(), almost));
        assert!(!admitted.lately(v4(1).unwrap(), at + ADMITTED_FOR));
    }

    #[test]
    fn a_peer_already_counted_keeps_its_count_when_the_table_is_full() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for _ in 0..WRONG_AT_MOST - 1 {
            throttle.wrong(v4(1), now);
        }
        for n in 1..PEERS_AT_MOST as u32 {
            let address = IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
            throttle.wrong(Some(address), now + Duration::from_millis(1));
        }
        assert_eq!(throttle.len(), PEERS_AT_MOST);
        // The oldest entry, but not to be dropped for itself.
        throttle.wrong(v4(1), now + Duration::from_millis(2));
        assert!(
            throttle
                .held(v4(1), now + Duration::from_millis(2))
                .is_some()
        );
        assert_eq!(throttle.len(), PEERS_AT_MOST);
    }

    #[test]
    fn wrong_credentials_older_than_the_window_no_longer_count() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for _ in 0..WRONG_AT_MOST - 1 {
            throttle.wrong(v4(1), start);
        }
        let later = start + WINDOW;
        throttle.wrong(v4(1), later);
        assert_eq!(throttle.held(v4(1), later), None);
    }

    #[test]
    fn the_right_credential_forgets_the_wrong_ones_before_it() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for _ in 0..WRONG_AT_MOST - 1 {
            throttle.wrong(v4(1), now);
        }
        throttle.admitted(v4(1));
        throttle.wrong(v4(1), now);
        assert_eq!(throttle.held(v4(1), now), None);
    }

    #[test]
    fn the_addresses_of_one_ipv6_64_are_one_peer_and_a_mapped_ipv4_is_the_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(key(Some(a)), key(Some(b)));
        assert_ne!(key(Some(a)), key(Some(c)));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(key(Some(mapped)), v4(1));
        assert_eq!(key(v4(1)), v4(1));
    }

    #[test]
    fn the_table_never_holds_more_peers_than_its_cap_and_keeps_a_held_peer_over_a_newer_one() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for _ in 0..WRONG_AT_MOST {
            throttle.wrong(v4(1), now);
        }
        for n in 0..PEERS_AT_MOST as u32 + 100 {
            let address = IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
            let at = now + Duration::from_millis(u64::from(n));
            throttle.wrong(Some(address), at);
            assert!(throttle.len() <= PEERS_AT_MOST);
        }
        assert!(
            throttle.held(v4(1), now).is_some(),
            "the held peer was dropped"
        );
    }

    #[test]
    fn entries_that_no_longer_count_are_dropped_first_when_the_table_is_full() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for n in 0..PEERS_AT_MOST as u32 {
            let address = IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
            throttle.wrong(Some(address), now);
        }
        assert_eq!(throttle.len(), PEERS_AT_MOST);
        throttle.wrong(v4(1), now + WINDOW);
        assert_eq!(throttle.len(), 1);
        // Half of them stale: only those go, the ones that count stay.
        let throttle = Throttle::default();
        for n in 0..PEERS_AT_MOST as u32 {
            let address = IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
            let at = if n % 2 == 0 { now } else { now + WINDOW };
            throttle.wrong(Some(address), at);
        }
        throttle.wrong(v4(1), now + WINDOW);
        assert_eq!(throttle.len(), PEERS_AT_MOST / 2 + 1);
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", value.parse().unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_peer_that_is_no_trusted_proxy_is_its_own_client_whatever_it_forwards() {
        let proxies = [ip("10.0.0.5")];
        let headers = forwarded(&["198.51.100.1"]);
        assert_eq!(
            client(ip("203.0.113.7"), &headers, &proxies),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn through_a_trusted_proxy_the_client_is_the_rightmost_address_that_is_no_proxy() {
        let proxies = [ip("10.0.0.5"), ip("10.0.0.6")];
        let headers = forwarded(&["192.0.2.99, 203.0.113.7", "10.0.0.6"]);
        assert_eq!(
            client(ip("10.0.0.5"), &headers, &proxies),
            ip("203.0.113.7")
        );
        let with_ports = forwarded(&["[2001:db8::1]:4000, 198.51.100.1:4000"]);
        assert_eq!(
            client(ip("10.0.0.5"), &with_ports, &proxies),
            ip("198.51.100.1")
        );
        let mapped = forwarded(&["203.0.113.8"]);
        assert_eq!(
            client(ip("::ffff:10.0.0.5"), &mapped, &proxies),
            ip("203.0.113.8"),
            "a proxy's IPv4 address mapped into IPv6 is the proxy"
        );
    }

    #[test]
    fn a_trusted_proxys_request_without_a_readable_client_counts_against_the_proxy() {
        let proxies = [ip("10.0.0.5")];
        for values in [
            &[][..],
            &["unknown"],
            &["203.0.113.7, garbage"],
            &["10.0.0.5"],
        ] {
            let headers = forwarded(values);
            assert_eq!(
                client(ip("10.0.0.5"), &headers, &proxies),
                ip("10.0.0.5"),
                "{values:?}"
            );
        }
        let mut opaque = HeaderMap::new();
        opaque.insert(
            "x-forwarded-for",
            axum::http::HeaderValue::from_bytes(b"203.0.113.7\xff").unwrap(),
        );
        assert_eq!(client(ip("10.0.0.5"), &opaque, &proxies), ip("10.0.0.5"));
    }

    #[test]
    fn bytes_a_client_wrote_left_of_the_proxys_entry_do_not_hide_the_client() {
        // nginx appends the address it saw to whatever the client sent, in one value.
        let proxies = [ip("10.0.0.5")];
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            axum::http::HeaderValue::from_bytes(b"\xc3\xa9, 203.0.113.7").unwrap(),
        );
        assert_eq!(
            client(ip("10.0.0.5"), &headers, &proxies),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn a_client_admitted_is_known_for_an_hour_and_the_memory_keeps_at_most_its_bound() {
        let admitted = Admitted::default();
        let now = Instant::now();
        admitted.note(ip("198.51.100.1"), now);
        assert!(admitted.lately(
            ip("198.51.100.1"),
            now + ADMITTED_FOR - Duration::from_secs(1)
        ));
        assert!(!admitted.lately(ip("198.51.100.1"), now + ADMITTED_FOR));
        assert!(!admitted.lately(ip("198.51.100.2"), now));
        for n in 0..PEERS_AT_MOST as u32 + 10 {
            admitted.note(IpAddr::from((0x0a00_0000 + n).to_be_bytes()), now);
        }
        let kept = admitted.clients.lock().unwrap().len();
        assert_eq!(kept, PEERS_AT_MOST);
    }
}
