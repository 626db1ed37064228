//! The whole story: a retry around a pool of two circuit breakers around two SMTP servers.
//!
//! Runs with nothing installed: it starts two SMTP servers of its own on free loopback ports,
//! a primary and a backup, and sends a message every 100 ms. Midway the primary goes down
//! (it answers 421): its failures move mail to the backup, then its breaker opens and the
//! pool skips it without waiting. For a moment the backup fails too, so the pool is
//! exhausted and the retry waits and tries again. Then the primary comes back, and once its
//! reset timeout has passed the probe goes through and mail flows to it again.
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! Each line is a message (the members it went through, and where it was delivered) or a
//! breaker's change of state.
//!
//! Then the outbox: both servers go down for a while, so each message is kept in an SQLite
//! outbox (a temporary file) instead of lost; a worker sleeps while the breakers are open,
//! and when the primary is back its probe succeeds and everything queued goes out.

mod support;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mail_breaker::outbox::{Outbox, OutboxTransport};
use mail_breaker::{
    Backoff, CircuitBreakerTransport, Envelope, Message, PoolTransport, Receipt, RetryTransport,
    SendError, SmtpTransport, StateChange, Transport,
};
use support::{EmbeddedSmtp, Mode};

/// Short so that the whole demo takes a few seconds.
const RESET_TIMEOUT: Duration = Duration::from_secs(1);
const PACE: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = Clock(Instant::now());
    let primary_server = EmbeddedSmtp::start();
    let backup_server = EmbeddedSmtp::start();
    println!(
        "primary SMTP server on 127.0.0.1:{}, backup on 127.0.0.1:{}",
        primary_server.port(),
        backup_server.port()
    );

    let trail = Trail::default();
    let member = |name: &'static str, server: &EmbeddedSmtp| {
        let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port())
            .with_name(name)
            .with_timeout(Duration::from_secs(5));
        let breaker = CircuitBreakerTransport::builder(smtp)
            .failure_threshold(3)
            .reset_timeout(RESET_TIMEOUT)
            .on_state_change(move |change: &StateChange| {
                clock.say(format!(
                    "   breaker {}: {} -> {}",
                    change.key, change.from, change.to
                ));
            })
            .build()?;
        Ok::<_, mail_breaker::ConfigError>(Traced {
            inner: breaker,
            trail: trail.clone(),
            role: Role::Member,
        })
    };
    let pool = Traced {
        inner: PoolTransport::builder()
            .add(member("primary", &primary_server)?, 1)
            .add(member("backup", &backup_server)?, 2)
            .build()?,
        trail: trail.clone(),
        role: Role::Pool,
    };
    let transport = RetryTransport::builder(pool)
        .max_attempts(4)
        .backoff(Backoff::constant(Duration::from_millis(300)))
        .max_elapsed(Duration::from_secs(10))
        .build()?;

    let mut number = 0;
    clock.say("-- both servers accept mail");
    for _ in 0..4 {
        send(&transport, &trail, &mut number, clock).await?;
    }

    clock.say("-- the primary goes down: it answers 421 to every message");
    primary_server.set_mode(Mode::Unavailable);
    for _ in 0..6 {
        send(&transport, &trail, &mut number, clock).await?;
    }

    clock.say("-- the backup fails too (451) for 500 ms");
    backup_server.set_mode(Mode::Failing);
    let backup = backup_server.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        backup.set_mode(Mode::Accept);
        clock.say("-- the backup works again");
    });
    send(&transport, &trail, &mut number, clock).await?;

    clock.say("-- the primary is back; its breaker stays open until its reset timeout");
    primary_server.set_mode(Mode::Accept);
    for _ in 0..12 {
        send(&transport, &trail, &mut number, clock).await?;
    }

    let (primary, backup) = (primary_server.accepted(), backup_server.accepted());
    clock.say(format!(
        "-- done: {number} messages, {primary} delivered by the primary and {backup} by the backup"
    ));
    if primary + backup != number {
        return Err(format!("{number} messages sent but {} delivered", primary + backup).into());
    }
    outbox_act(&primary_server, &backup_server, clock).await
}

/// Every provider down: mail waits in the outbox and goes out when the primary is back.
async fn outbox_act(
    primary_server: &EmbeddedSmtp,
    backup_server: &EmbeddedSmtp,
    clock: Clock,
) -> Result<(), Box<dyn std::error::Error>> {
    let delivered_before = primary_server.accepted() + backup_server.accepted();
    let folder = std::env::temp_dir().join(format!("mail-breaker-demo-{}", std::process::id()));
    std::fs::create_dir_all(&folder)?;
    let outbox = Outbox::sqlite(folder.join("outbox.db")).await?;
    clock.say(format!(
        "-- the outbox: {}; both servers go down (421)",
        folder.join("outbox.db").display()
    ));
    primary_server.set_mode(Mode::Unavailable);
    backup_server.set_mode(Mode::Unavailable);

    let member = |name: &'static str, server: &EmbeddedSmtp| {
        let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port())
            .with_name(name)
            .with_timeout(Duration::from_secs(5));
        CircuitBreakerTransport::builder(smtp)
            .failure_threshold(2)
            .reset_timeout(RESET_TIMEOUT)
            .on_state_change(move |change: &StateChange| {
                clock.say(format!(
                    "   breaker {}: {} -> {}",
                    change.key, change.from, change.to
                ));
            })
            .build()
    };
    let stack = Arc::new(
        PoolTransport::builder()
            .add(member("primary", primary_server)?, 1)
            .add(member("backup", backup_server)?, 2)
            .build()?,
    );
    let transport = OutboxTransport::send_or_queue(outbox.clone(), Arc::clone(&stack));
    const QUEUED: usize = 10;
    for number in 1..=QUEUED {
        let message = Message::builder()
            .from("app@example.com".parse()?)
            .to("user@example.org".parse()?)
            .subject(format!("queued message {number}"))
            .body(format!("queued message {number}"))?;
        let receipt = transport.send(&message).await?;
        clock.say(format!(
            "#q{number:02} {} as {}",
            if receipt.is_queued() {
                "queued in the outbox"
            } else {
                "delivered"
            },
            receipt.message_id().unwrap_or("?")
        ));
    }
    clock.say(format!("   outbox: {:?}", outbox.stats().await?));

    let worker = outbox
        .worker(Arc::clone(&stack))
        .concurrency(4)
        .backoff(Backoff::constant(Duration::from_millis(200)))
        .poll(Duration::from_millis(100));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running =
        tokio::spawn(async move { worker.run(async { stopped.await.unwrap_or(()) }).await });
    clock.say("-- a worker runs: it sleeps while both breakers are open");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    clock.say(format!(
        "   outbox after 2.5 s down: {:?}",
        outbox.stats().await?
    ));
    clock.say("-- the primary is back: its breaker's probe succeeds and the outbox drains");
    primary_server.set_mode(Mode::Accept);
    let started = Instant::now();
    while outbox.stats().await?.queued > 0 && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    running.await??;
    backup_server.set_mode(Mode::Accept);

    let stats = outbox.stats().await?;
    let delivered = primary_server.accepted() + backup_server.accepted() - delivered_before;
    let lost = QUEUED - delivered;
    clock.say(format!(
        "-- done: {QUEUED} queued, {delivered} delivered from the outbox, {lost} lost; outbox {stats:?}"
    ));
    std::fs::remove_dir_all(&folder)?;
    if lost != 0 || stats.queued != 0 {
        return Err(format!("{lost} of {QUEUED} queued messages were not delivered").into());
    }
    Ok(())
}

/// Sends one message and prints the members it went through and where it ended up.
async fn send(
    transport: &impl Transport,
    trail: &Trail,
    number: &mut usize,
    clock: Clock,
) -> Result<(), Box<dyn std::error::Error>> {
    *number += 1;
    let message = Message::builder()
        .from("app@example.com".parse()?)
        .to("user@example.org".parse()?)
        .subject(format!("demo message {number}"))
        .body(format!("demo message {number}"))?;
    tokio::time::sleep(PACE).await;
    let result = transport.send(&message).await;
    let route = trail.take().join(" -> ");
    let outcome = match &result {
        Ok(receipt) => format!(
            "delivered by {} as {} after {} attempt{}",
            receipt.transport(),
            receipt.message_id().unwrap_or("?"),
            receipt.attempts(),
            if receipt.attempts() == 1 { "" } else { "s" }
        ),
        Err(error) => format!("FAILED: {error}"),
    };
    clock.say(format!("#{number:02} {route}  =>  {outcome}"));
    Ok(())
}

/// Seconds since the demo started, in front of each line.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn say(self, line: impl AsRef<str>) {
        println!(
            "{:>6.3}s  {}",
            self.0.elapsed().as_secs_f64(),
            line.as_ref()
        );
    }
}

/// What each member answered for the message being sent, in order.
#[derive(Clone, Default)]
struct Trail(Arc<Mutex<Vec<String>>>);

impl Trail {
    fn note(&self, role: Role, name: &str, result: &Result<Receipt, SendError>) {
        let what = match (role, result) {
            (Role::Pool, Ok(_)) => return,
            (Role::Pool, Err(error)) => format!("[{}: the retry waits]", error.code()),
            (Role::Member, Ok(_)) => format!("{name} ok"),
            (Role::Member, Err(error)) if error.code() == "breaker.open" => {
                format!("{name} skipped (open)")
            }
            (Role::Member, Err(error)) => format!("{name} {}", error.code()),
        };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[derive(Clone, Copy)]
enum Role {
    /// A pool member: every answer is noted.
    Member,
    /// The pool: only its failures, which the retry waits after.
    Pool,
}

/// A transport that notes each answer it gives in the trail.
struct Traced<T> {
    inner: T,
    trail: Trail,
    role: Role,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for Traced<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let result = self.inner.send_raw(envelope, raw).await;
        self.trail.note(self.role, self.inner.name(), &result);
        result
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        let result = self.inner.send(message).await;
        self.trail.note(self.role, self.inner.name(), &result);
        result
    }
}
