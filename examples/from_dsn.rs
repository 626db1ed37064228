//! The whole stack from one DSN: reads `MAILER_DSN`, or by default pools two SMTP servers
//! this example starts in its own process, and sends a few messages, printing each answer.
//!
//! ```text
//! cargo run --example from_dsn
//! MAILER_DSN='failover(smtp://user:pass@relay.example.com:587?tls=required ses://eu-west-1)?retry.attempts=4' \
//!     cargo run --example from_dsn --features ses
//! ```
//!
//! With the default, the primary answers 451 from the third message on: its breaker opens
//! after two failures and the pool sends to the backup.

mod support;

use mail_breaker::config::Mailer;
use mail_breaker::{Message, Transport};
use support::{EmbeddedSmtp, Mode};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Started even when MAILER_DSN is set, and then unused: kept simple.
    let (primary, backup) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
    let dsn = std::env::var("MAILER_DSN").unwrap_or_else(|_| {
        format!(
            "retry(failover(smtp://127.0.0.1:{}?name=primary&breaker.threshold=2 \
             smtp://127.0.0.1:{}?name=backup))?attempts=3&delay=100ms",
            primary.port(),
            backup.port()
        )
    });
    let mailer = Mailer::from_dsn(&dsn)?.build().await?;
    println!("{mailer:?}\n");
    for number in 1..=6 {
        if number == 3 {
            println!("-- the primary starts answering 451");
            primary.set_mode(Mode::Failing);
        }
        let message = Message::builder()
            .from("app@example.com".parse()?)
            .to("user@example.org".parse()?)
            .subject(format!("message {number}"))
            .body(String::from("hello"))?;
        match mailer.send(&message).await {
            Ok(receipt) => println!("#{number} sent: {:?}", receipt.response()),
            Err(error) => println!("#{number} not sent ({}): {error}", error.category()),
        }
    }
    for (name, breaker) in mailer.breakers() {
        println!("breaker {name}: {}", breaker.snapshot().await.state());
    }
    Ok(())
}
