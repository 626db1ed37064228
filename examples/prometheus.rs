//! The failover story of the demo, with the crate's metrics served to Prometheus.
//!
//! Runs with nothing installed: it starts two SMTP servers of its own (a primary and a
//! backup) and a Prometheus endpoint on a free loopback port, then sends through a retry
//! around a pool of two circuit breakers. The primary goes down, its breaker opens and mail
//! fails over to the backup; the primary comes back and a probe closes its breaker. At the
//! end it scrapes `/metrics` once, as Prometheus would, and prints what it got: the series
//! to graph and alert on.
//!
//! ```text
//! cargo run --example prometheus --features metrics
//! ```

mod support;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use mail_breaker::{
    Backoff, CircuitBreakerTransport, Message, PoolTransport, RetryTransport, SmtpTransport,
    Transport, metrics,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use support::{EmbeddedSmtp, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Short so that the whole example takes a few seconds.
const RESET_TIMEOUT: Duration = Duration::from_secs(1);
const PACE: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = serve_metrics()?;
    println!("metrics on http://{address}/metrics");

    let primary_server = EmbeddedSmtp::start();
    let backup_server = EmbeddedSmtp::start();
    let member = |name: &str, server: &EmbeddedSmtp| {
        let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port())
            .with_name(name)
            .with_timeout(Duration::from_secs(5));
        CircuitBreakerTransport::builder(smtp)
            .failure_threshold(3)
            .reset_timeout(RESET_TIMEOUT)
            .build()
    };
    let pool = PoolTransport::builder()
        .name("outbound")
        .add(member("primary", &primary_server)?, 1)
        .add(member("backup", &backup_server)?, 2)
        .build()?;
    let transport = RetryTransport::builder(pool)
        .max_attempts(4)
        .backoff(Backoff::constant(Duration::from_millis(300)))
        .build()?;

    let mut sent = 0;
    println!("-- both servers accept mail");
    send_some(&transport, 3, &mut sent).await?;

    println!("-- the primary goes down (421): failures, then its breaker opens");
    primary_server.set_mode(Mode::Unavailable);
    send_some(&transport, 6, &mut sent).await?;

    println!("-- the backup fails too (451) for 400 ms: the pool is exhausted, the retry waits");
    backup_server.set_mode(Mode::Failing);
    let backup = backup_server.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        backup.set_mode(Mode::Accept);
    });
    send_some(&transport, 1, &mut sent).await?;

    println!("-- the primary is back; after the reset timeout a probe closes its breaker");
    primary_server.set_mode(Mode::Accept);
    send_some(&transport, 10, &mut sent).await?;

    let delivered = primary_server.accepted() + backup_server.accepted();
    println!("-- {sent} messages sent, {delivered} delivered");

    let scrape = scrape(address).await?;
    println!("\n-- GET /metrics\n{scrape}");
    if !scrape.contains(metrics::SENDS_TOTAL) {
        return Err("the scrape holds no mail_breaker_sends_total".into());
    }
    Ok(())
}

/// Installs the Prometheus recorder with its HTTP listener on a free loopback port.
fn serve_metrics() -> Result<SocketAddr, Box<dyn std::error::Error>> {
    // Ask the system for a free port, then let the exporter listen on it.
    let address = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?;
    PrometheusBuilder::new()
        .with_http_listener(address)
        // Buckets make the send time a Prometheus histogram (else a summary), so that
        // `histogram_quantile` can aggregate it across processes.
        .set_buckets_for_metric(
            Matcher::Full(metrics::SEND_SECONDS.to_owned()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )?
        .install()?;
    metrics::describe();
    Ok(address)
}

/// Sends `count` messages, one every [`PACE`], and prints where each went.
async fn send_some(
    transport: &impl Transport,
    count: usize,
    sent: &mut usize,
) -> Result<(), Box<dyn std::error::Error>> {
    for _ in 0..count {
        *sent += 1;
        let message = Message::builder()
            .from("app@example.com".parse()?)
            .to("user@example.org".parse()?)
            .subject(format!("message {sent}"))
            .body(format!("message {sent}"))?;
        tokio::time::sleep(PACE).await;
        match transport.send(&message).await {
            Ok(receipt) => println!(
                "#{sent:02} delivered by {} (attempt {})",
                receipt.transport(),
                receipt.attempts()
            ),
            Err(error) => println!("#{sent:02} FAILED: {error}"),
        }
    }
    Ok(())
}

/// One plain HTTP/1.0 GET of `/metrics` (so the body comes whole, not chunked): its body.
async fn scrape(address: SocketAddr) -> Result<String, Box<dyn std::error::Error>> {
    let mut stream = TcpStream::connect(address).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    match response.split_once("\r\n\r\n") {
        Some((head, body))
            if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") =>
        {
            Ok(body.to_owned())
        }
        _ => Err(format!("unexpected answer from the exporter: {response}").into()),
    }
}
