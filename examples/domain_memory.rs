//! Peak memory of a breaker per recipient domain over 1,000,000 distinct domains, with
//! `max_keys` 10,000: the store forgets the least recently used closed breakers, so memory
//! stays flat however many domains pass through. Every send here fails once (the provider
//! is down for each domain), which is what makes the store keep a domain: a domain whose
//! sends only succeed takes no place at all.
//!
//! ```text
//! cargo run --release --example domain_memory
//! ```
//!
//! Prints the process's peak resident memory (`VmHWM` from `/proc/self/status`, Linux only)
//! before and after, and the number of keys the breaker tracks.

use std::time::Instant;

use mail_breaker::{
    Category, CircuitBreakerTransport, Envelope, Message, Receipt, Scope, SendError, Transport,
};

const DOMAINS: u32 = 1_000_000;
const MAX_KEYS: usize = 10_000;

/// Fails every message at once, as a provider that refuses each domain: each domain's
/// breaker counts one failure, too few to open it, and is kept.
struct Fails;

#[async_trait::async_trait]
impl Transport for Fails {
    fn name(&self) -> &str {
        "fails"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        Err(SendError::new(Category::Network, "example.down", "down"))
    }

    async fn send(&self, _message: &Message) -> Result<Receipt, SendError> {
        Err(SendError::new(Category::Network, "example.down", "down"))
    }
}

/// A field of `/proc/self/status` in KiB (`VmHWM`, `VmRSS`), where there is one.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || String::from("unknown"),
        |kib| format!("{:.1} MiB", kib as f64 / 1024.0),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let breaker = CircuitBreakerTransport::builder(Fails)
        .scope(Scope::RecipientDomain)
        .max_keys(MAX_KEYS)
        .build()?;
    let sender: lettre::Address = "app@example.com".parse()?;
    let before = status_kib("VmHWM");
    let start = Instant::now();
    runtime.block_on(async {
        for i in 0..DOMAINS {
            let recipient = lettre::Address::new("user", format!("d{i}.example"))?;
            let envelope = Envelope::new(Some(sender.clone()), vec![recipient])?;
            let failed = breaker
                .send_raw(&envelope, b"Subject: hi\r\n\r\nhello")
                .await;
            assert!(failed.is_err_and(|error| error.code() == "example.down"));
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let elapsed = start.elapsed();
    println!("domains sent to: {DOMAINS}");
    println!("max_keys: {MAX_KEYS}");
    println!("tracked_keys: {}", breaker.tracked_keys());
    println!("peak resident memory before: {}", mib(before));
    println!("peak resident memory (VmHWM): {}", mib(status_kib("VmHWM")));
    println!(
        "time: {:.2} s, {:.0} ns per send",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / f64::from(DOMAINS)
    );
    Ok(())
}
