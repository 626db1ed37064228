//! 2,000 messages to a local smtp-sink: bare lettre against `SmtpTransport::send_many` against
//! a breaker around it, all over one lettre connection pool at the same concurrency.
//!
//! lettre leaves Nagle's algorithm on, so one message at a time waits ~40 ms for a delayed
//! ACK from the server; the messages therefore go `CONCURRENCY` at a time, as a bulk sender
//! would send them. Skipped, with a message, where smtp-sink is not installed.

mod support;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::{StreamExt, stream};
use lettre::transport::smtp::PoolConfig;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use mail_breaker::{CircuitBreakerTransport, Message, SmtpTransport, Transport};
use support::smtp_sink::SmtpSink;

const MESSAGES: usize = 2_000;
const CONCURRENCY: usize = 50;

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
    let lettre = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(sink.port())
        .pool_config(PoolConfig::new().max_size(CONCURRENCY as u32))
        .build();
    // One pool for all three: SmtpTransport keeps a clone of the same lettre transport.
    let smtp = SmtpTransport::new(lettre.clone())
        .with_name(format!("smtp://127.0.0.1:{}", sink.port()))
        .with_concurrency(CONCURRENCY)
        .with_timeout(Duration::from_secs(30));
    let breaker = CircuitBreakerTransport::new(smtp.clone());
    let messages: Vec<Message> = (0..MESSAGES)
        .map(|i| support::message_to(&format!("user{i}@example.org")))
        .collect();

    let mut group = c.benchmark_group("smtp_throughput");
    group
        .throughput(Throughput::Elements(MESSAGES as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(20));
    group.bench_function("bare_lettre", |b| {
        b.to_async(&rt).iter(|| async {
            let sent = stream::iter(messages.iter().cloned())
                .map(|message| {
                    let lettre = &lettre;
                    async move { lettre.send(message).await }
                })
                .buffered(CONCURRENCY)
                .filter(|result| futures::future::ready(result.is_ok()))
                .count()
                .await;
            assert_eq!(sent, MESSAGES, "bare lettre lost messages");
        })
    });
    group.bench_function("smtp_transport", |b| {
        b.to_async(&rt).iter(|| async {
            let input = stream::iter(messages.iter().cloned()).boxed();
            let sent = smtp
                .send_many(input)
                .filter(|r| futures::future::ready(r.is_ok()));
            assert_eq!(sent.count().await, MESSAGES, "SmtpTransport lost messages");
        })
    });
    group.bench_function("breaker", |b| {
        b.to_async(&rt).iter(|| async {
            let input = stream::iter(messages.iter().cloned()).boxed();
            let sent = breaker
                .send_many(input)
                .filter(|r| futures::future::ready(r.is_ok()));
            assert_eq!(sent.count().await, MESSAGES, "the breaker lost messages");
        })
    });
    group.finish();
}

criterion_group!(benches, smtp_throughput);
criterion_main!(benches);
