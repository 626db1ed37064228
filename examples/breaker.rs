//! A circuit breaker around an SMTP server that goes down and comes back.
//!
//! Runs with nothing installed: it starts its own SMTP server on a free loopback port, then
//! switches that server to answer 421 (going down), so the breaker opens and refuses sends at
//! once; after its reset timeout it lets one probe through, which fails while the server is
//! still down and succeeds once it is back, closing the breaker.
//!
//! ```text
//! cargo run --example breaker
//! ```

mod support;

use std::time::{Duration, Instant};

use mail_breaker::{CircuitBreakerTransport, Message, SmtpTransport, StateChange, Transport};
use support::{EmbeddedSmtp, Mode};

/// Short so the whole demo takes about a second and a half.
const RESET_TIMEOUT: Duration = Duration::from_millis(500);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let server = EmbeddedSmtp::start();
    let smtp =
        SmtpTransport::unencrypted("127.0.0.1", server.port()).with_timeout(Duration::from_secs(5));
    println!("SMTP server listening on 127.0.0.1:{}", server.port());

    let breaker = CircuitBreakerTransport::builder(smtp)
        .failure_threshold(3)
        .reset_timeout(RESET_TIMEOUT)
        .on_state_change(move |change: &StateChange| {
            println!(
                "{:>6.3}s  breaker {}: {} -> {}",
                started.elapsed().as_secs_f64(),
                change.key,
                change.from,
                change.to
            );
        })
        .build()?;
    let mut sent = 0;

    step(started, "the server accepts mail");
    for _ in 0..2 {
        send(&breaker, &mut sent, started).await?;
    }

    step(started, "the server goes down: it now answers 421");
    server.set_mode(Mode::Unavailable);
    for _ in 0..5 {
        send(&breaker, &mut sent, started).await?;
    }

    step(
        started,
        "waiting out the reset timeout; the server is still down",
    );
    tokio::time::sleep(RESET_TIMEOUT).await;
    send(&breaker, &mut sent, started).await?;

    step(
        started,
        "the server is back; waiting out the reset timeout again",
    );
    server.set_mode(Mode::Accept);
    tokio::time::sleep(RESET_TIMEOUT).await;
    for _ in 0..2 {
        send(&breaker, &mut sent, started).await?;
    }

    println!(
        "{:>6.3}s  done: {sent} sends, the server accepted {}, the breaker is {}",
        started.elapsed().as_secs_f64(),
        server.accepted(),
        breaker.state()
    );
    Ok(())
}

fn step(started: Instant, what: &str) {
    println!("{:>6.3}s  -- {what}", started.elapsed().as_secs_f64());
}

/// Sends one message through the breaker and prints what became of it and how long it took.
async fn send<T: Transport>(
    breaker: &CircuitBreakerTransport<T>,
    sent: &mut usize,
    started: Instant,
) -> Result<(), Box<dyn std::error::Error>> {
    *sent += 1;
    let message = Message::builder()
        .from("app@example.com".parse()?)
        .to("user@example.org".parse()?)
        .subject(format!("demo message {sent}"))
        .body(format!("demo message {sent}"))?;
    let sending = Instant::now();
    let outcome = match breaker.send(&message).await {
        Ok(receipt) => format!("delivered: {}", receipt.response().unwrap_or("(no reply)")),
        Err(error) if error.code() == "breaker.open" => format!(
            "refused by the breaker, nothing sent (retry in {} ms)",
            error.retry_after().unwrap_or_default().as_millis()
        ),
        Err(error) => format!("failed: {} {}", error.code(), error.category()),
    };
    println!(
        "{:>6.3}s  send {sent}: {outcome} [{} µs]",
        started.elapsed().as_secs_f64(),
        sending.elapsed().as_micros()
    );
    Ok(())
}
