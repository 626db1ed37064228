//! `Admin::serve`: what a connection may hold of the server. Connections are in-memory pipes
//! handed to the server by a listener of the test's own, and the clock is Tokio's paused one,
//! so that the server's timeouts pass in no real time.
#![cfg(all(feature = "admin", feature = "smtp"))]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mail_breaker::Mailer;
use mail_breaker::admin::Admin;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

/// A listener whose connections are the pipes the test sends it, each from its peer.
struct Pipes {
    incoming: mpsc::UnboundedReceiver<(DuplexStream, SocketAddr)>,
}

impl axum::serve::Listener for Pipes {
    type Io = DuplexStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (DuplexStream, SocketAddr) {
        match self.incoming.recv().await {
            Some(pipe) => pipe,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(SocketAddr::from(([127, 0, 0, 1], 8025)))
    }
}

/// The page over a mailer of one member that is never sent to, served on [`Pipes`]; what
/// connects to it.
async fn served() -> impl Fn() -> DuplexStream {
    let connect = served_to_peers().await;
    move || connect(SocketAddr::from(([127, 0, 0, 1], 40000)))
}

/// [`served`], connected to from the peer the closure is given.
async fn served_to_peers() -> impl Fn(SocketAddr) -> DuplexStream {
    let mailer = Mailer::from_dsn("smtp://127.0.0.1:9?name=relay")
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let admin = Admin::new(Arc::new(mailer));
    let (connect, incoming) = mpsc::unbounded_channel();
    tokio::spawn(async move { admin.serve(Pipes { incoming }).await });
    move |peer| {
        let (client, server) = tokio::io::duplex(64 * 1024);
        connect.send((server, peer)).unwrap();
        client
    }
}

const GET: &[u8] = b"GET /api/breakers HTTP/1.1\r\nHost: 127.0.0.1:8025\r\n\r\n";

/// Reads until the server closes the connection, for at most an hour of the paused clock:
/// what was read, or `None` if the hour passed with the connection still open.
async fn until_closed(client: &mut DuplexStream) -> Option<String> {
    let mut read = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(3600), async {
        let mut buffer = [0u8; 4096];
        loop {
            match client.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    closed
        .ok()
        .map(|()| String::from_utf8_lossy(&read).into_owned())
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_its_headers_slowly_is_cut_after_a_bounded_time() {
    let connect = served().await;
    let mut client = connect();
    client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    // A header line every few seconds, never the blank line that ends them.
    let trickle = async {
        for at in 0..1000 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if client
                .write_all(format!("X-Slow-{at}: x\r\n").as_bytes())
                .await
                .is_err()
            {
                return true;
            }
        }
        false
    };
    assert!(
        trickle.await,
        "a client sending a header line every 5 s was still connected after 5000 s"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_is_cut_after_a_bounded_time() {
    let connect = served().await;
    let mut client = connect();
    client.write_all(GET).await.unwrap();
    let mut first = [0u8; 12];
    client.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(
        until_closed(&mut client).await.is_some(),
        "an idle keep-alive connection was still open after an hour"
    );
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_nothing_is_cut_after_a_bounded_time() {
    let connect = served().await;
    let mut client = connect();
    assert_eq!(
        until_closed(&mut client).await.as_deref(),
        Some(""),
        "a silent connection was still open after an hour"
    );
}

#[tokio::test(start_paused = true)]
async fn connections_beyond_the_cap_are_closed_unanswered_until_others_close() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let refusals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(Refusals(Arc::clone(&refusals))),
    );
    let connect = served_to_peers().await;
    // Open from many addresses (one address alone has a smaller share), and each one's
    // request under way (its headers not all sent yet).
    let mut held = Vec::new();
    for at in 0..2000u32 {
        let peer = SocketAddr::from(([10, 0, (at >> 8) as u8, at as u8], 40000));
        let mut client = connect(peer);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(client);
    }
    tokio::task::yield_now().await;
    let mut beyond = connect(SocketAddr::from(([10, 1, 0, 1], 40000)));
    beyond.write_all(GET).await.unwrap();
    let answer = until_closed(&mut beyond).await;
    assert_eq!(
        answer.as_deref(),
        Some(""),
        "a connection beyond 2000 open ones was served"
    );
    let warned = refusals.lock().unwrap().len();
    assert_eq!(
        warned, 1,
        "reaching the cap is said once, not once a connection"
    );
    // Once those are closed, a new one is served again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut later = connect(SocketAddr::from(([10, 1, 0, 1], 40000)));
    later.write_all(GET).await.unwrap();
    let mut first = [0u8; 12];
    later.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
}

#[tokio::test(start_paused = true)]
async fn one_peer_holding_every_connection_it_may_keeps_no_other_peer_out() {
    let connect = served_to_peers().await;
    // One address (and its IPv6 /64 neighbours) opens far more than the cap, each request
    // under way and kept so within the header timeout.
    let mut held = Vec::new();
    for at in 0..2000u16 {
        let peer = if at % 2 == 0 {
            SocketAddr::from(([192, 0, 2, 7], 1000 + at))
        } else {
            let v6 = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, at);
            SocketAddr::from((v6, 1000 + at))
        };
        let mut client = connect(peer);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(client);
    }
    tokio::task::yield_now().await;

    let mut other = connect(SocketAddr::from(([198, 51, 100, 9], 5000)));
    other.write_all(GET).await.unwrap();
    let mut first = [0u8; 12];
    let answered = tokio::time::timeout(Duration::from_secs(1), other.read_exact(&mut first)).await;

    assert!(
        matches!(answered, Ok(Ok(_))) && &first == b"HTTP/1.1 200",
        "another peer was refused while two peers held the connections: {answered:?} {:?}",
        String::from_utf8_lossy(&first)
    );
    drop(held);
}

/// Keeps the message of each `admin.connections_refused` event.
struct Refusals(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Refusals {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(Option<String>);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        let mut message = Message(None);
        event.record(&mut message);
        if let Some(message) = message
            .0
            .filter(|m| m.contains("admin.connections_refused"))
        {
            self.0.lock().unwrap().push(message);
        }
    }
}
