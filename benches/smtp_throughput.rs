//! Messages to one local smtp-sink, in the same process, at 1, 8 and 50 in flight: bare lettre
//! 0.11.23 (its pooled `AsyncSmtpTransport`) against `SmtpTransport::unencrypted` (the crate's
//! own connections) against a breaker around it; and, as the limit, lettre's raw
//! `AsyncSmtpConnection` on one socket with TCP_NODELAY, one message at a time.
//!
//! Each iteration sends 20 messages per message in flight, so that bare lettre, which waits
//! some 40 ms per message for Nagle and the server's delayed ACK, takes about a second.
//! Skipped, with a message, where smtp-sink is not installed.
//!
//! `smtp_wan`: one connection, one message at a time, one recipient, messages per second
//! through a relay that delays each direction by 10 ms (a 20 ms round trip, as to a provider
//! in the next region; `tests/support/wire.rs`), and on plain loopback: bare lettre 0.11.23
//! (its pool of one) and `SmtpTransport` (PIPELINING against smtp-sink; PIPELINING and
//! CHUNKING against a real Postfix, which runs only as root). Each server missing is skipped
//! with a message. After each figure the relay's count of round trips per message is
//! printed. `cargo bench --bench smtp_throughput -- smtp_wan`. (The client before the crate
//! spoke SMTP itself was a third contender until its figures were settled: they are in
//! `benches/README.md`.)

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use futures::{StreamExt, stream};
use lettre::transport::smtp::PoolConfig;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::extension::ClientId;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use mail_breaker::{CircuitBreakerTransport, Message, SmtpTransport, Transport};
use support::postfix::{Postfix, PostfixOptions};
use support::smtp_sink::SmtpSink;
use support::wire::Relay;

/// Messages in flight at once.
const IN_FLIGHT: [usize; 3] = [1, 8, 50];
/// Messages per iteration, per message in flight.
const MESSAGES_PER_SLOT: usize = 20;

fn smtp_throughput(c: &mut Criterion) {
    if !support::installed("smtp-sink", "smtp_throughput") {
        return;
    }
    let Some(sink) = SmtpSink::start("smtp_throughput", &[]) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let _entered = rt.enter(); // lettre's pool starts a task when it is built
    let port = sink.port();

    for in_flight in IN_FLIGHT {
        let count = in_flight * MESSAGES_PER_SLOT;
        let messages: Vec<Message> = (0..count)
            .map(|i| support::message_to(&format!("user{i}@example.org")))
            .collect();
        let lettre = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
            .port(port)
            .pool_config(PoolConfig::new().max_size(in_flight as u32))
            .build();
        let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
            .port(port)
            .max_connections(in_flight)
            .max_messages_per_connection(u32::MAX)
            .timeout(Duration::from_secs(30))
            .build()
            .expect("valid settings");
        let breaker = CircuitBreakerTransport::new(smtp.clone());

        let mut group = c.benchmark_group("smtp_throughput");
        group
            .throughput(Throughput::Elements(count as u64))
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
        if in_flight == 1 {
            bench_raw_connection(&mut group, &rt, port, &messages);
        }
        group.bench_function(BenchmarkId::new("bare_lettre", in_flight), |b| {
            b.to_async(&rt).iter(|| async {
                let sent = stream::iter(messages.iter().cloned())
                    .map(|message| {
                        let lettre = &lettre;
                        async move { lettre.send(message).await }
                    })
                    .buffered(in_flight)
                    .filter(|result| futures::future::ready(result.is_ok()))
                    .count()
                    .await;
                assert_eq!(sent, count, "bare lettre lost messages");
            })
        });
        group.bench_function(BenchmarkId::new("smtp_transport", in_flight), |b| {
            b.to_async(&rt).iter(|| async {
                let input = stream::iter(messages.iter().cloned()).boxed();
                let sent = smtp
                    .send_many(input)
                    .filter(|r| futures::future::ready(r.is_ok()));
                assert_eq!(sent.count().await, count, "SmtpTransport lost messages");
            })
        });
        group.bench_function(BenchmarkId::new("breaker", in_flight), |b| {
            b.to_async(&rt).iter(|| async {
                let input = stream::iter(messages.iter().cloned()).boxed();
                let sent = breaker
                    .send_many(input)
                    .filter(|r| futures::future::ready(r.is_ok()));
                assert_eq!(sent.count().await, count, "the breaker lost messages");
            })
        });
        group.finish();
    }
}

/// The limit: lettre's own connection on one socket with TCP_NODELAY, one message after
/// another, no pool, no timeout, no breaker.
fn bench_raw_connection(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    port: u16,
    messages: &[Message],
) {
    let connection = rt.block_on(async {
        let socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connecting to smtp-sink");
        socket.set_nodelay(true).expect("setting TCP_NODELAY");
        AsyncSmtpConnection::connect_with_transport(Box::new(socket), &ClientId::default())
            .await
            .expect("greeted by smtp-sink")
    });
    let connection = tokio::sync::Mutex::new(connection);
    group.bench_function(BenchmarkId::new("raw_connection_nodelay", 1), |b| {
        b.to_async(rt).iter(|| async {
            let mut connection = connection.lock().await;
            // Each message formatted as it goes, as the transports do.
            for message in messages {
                connection
                    .send(message.envelope(), &message.formatted())
                    .await
                    .expect("smtp-sink accepts");
            }
        })
    });
}

/// One way through the WAN relay: a 20 ms round trip.
const WAN_ONE_WAY: Duration = Duration::from_millis(10);

/// What sends in `smtp_wan`.
#[derive(Clone, Copy)]
enum Contender {
    BareLettre,
    NewTransport,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::BareLettre => "bare_lettre",
            Contender::NewTransport => "smtp_transport",
        }
    }
}

/// One connection, one message at a time, one recipient: messages per second through a 20 ms
/// round trip and on plain loopback, for each contender against each server there is.
fn smtp_wan(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let _entered = rt.enter(); // lettre's pool starts a task when it is built
    let sink = support::installed("smtp-sink", "smtp_wan (smtp-sink)")
        .then(|| SmtpSink::start("smtp_wan", &[]))
        .flatten();
    let postfix = if Postfix::can_run() {
        Postfix::start("smtp_wan", PostfixOptions::default())
    } else {
        println!("SKIPPED smtp_wan on Postfix: it is not installed, or this is not root");
        None
    };
    let mut servers: Vec<(&str, SocketAddr)> = Vec::new();
    if let Some(sink) = &sink {
        servers.push(("smtp-sink", sink.address()));
    }
    if let Some(postfix) = &postfix {
        servers.push(("postfix", postfix.address()));
    }
    let message = support::message_to("user@example.org");

    let mut group = c.benchmark_group("smtp_wan");
    group
        .throughput(Throughput::Elements(1))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (network, one_way) in [("rtt_20ms", WAN_ONE_WAY), ("loopback", Duration::ZERO)] {
        for &(server, address) in &servers {
            for contender in [Contender::BareLettre, Contender::NewTransport] {
                // A relay of its own per figure, so its round trips are this contender's.
                // On loopback the relay is not used: the client goes to the server's port.
                let relay =
                    (!one_way.is_zero()).then(|| rt.block_on(Relay::start(address, one_way)));
                let port = relay.as_ref().map_or(address.port(), Relay::port);
                let id = BenchmarkId::new(format!("{}/{server}", contender.name()), network);
                let sent = AtomicU64::new(0);
                let send = |outcome: Result<(), String>| {
                    if let Err(error) = outcome {
                        panic!("{}/{server}/{network}: {error}", contender.name());
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                };
                match contender {
                    Contender::BareLettre => {
                        let lettre =
                            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
                                .port(port)
                                .pool_config(PoolConfig::new().max_size(1))
                                .build();
                        group.bench_function(id, |b| {
                            b.to_async(&rt).iter(|| async {
                                let outcome = lettre.send(message.clone()).await;
                                send(outcome.map(drop).map_err(|e| e.to_string()));
                            })
                        });
                    }
                    Contender::NewTransport => {
                        let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
                            .port(port)
                            .max_connections(1)
                            .max_messages_per_connection(u32::MAX)
                            .timeout(Duration::from_secs(30))
                            .build()
                            .expect("valid settings");
                        group.bench_function(id, |b| {
                            b.to_async(&rt).iter(|| async {
                                let outcome = smtp.send(&message).await;
                                send(outcome.map(drop).map_err(|e| e.to_string()));
                            })
                        });
                    }
                }
                let sent = sent.load(Ordering::Relaxed);
                if let Some(relay) = relay.filter(|_| sent > 0) {
                    let stats = relay.stats();
                    println!(
                        "smtp_wan/{}/{server}/{network}: {:.2} round trips a message \
                         ({} over {sent} messages, {} connections)",
                        contender.name(),
                        stats.turns as f64 / sent as f64,
                        stats.turns,
                        stats.connections,
                    );
                }
            }
        }
    }
    group.finish();
    drop(postfix);
    drop(sink);
}

criterion_group!(benches, smtp_throughput, smtp_wan);
criterion_main!(benches);
