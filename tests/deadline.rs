//! Issue 62, point 2 (DESIGN §19, "A deadline, not a guess"): the outbox worker's
//! `send_timeout` is a deadline the whole stack sees. A layer that would only wait past it
//! answers at once; a wait of unknown length is cut as not attempted; only a try that may
//! have reached the provider makes the cut maybe-delivered.
//!
//! Real time on an SQLite outbox (`tokio::time::pause` does not mix with SQLite's clock):
//! every wait the stack would take is an hour, the send timeout a fraction of a second, so
//! no test depends on how fast the machine is.
#![cfg(all(feature = "outbox", feature = "smtp"))]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mail_breaker::outbox::{Outbox, Worker};
use mail_breaker::{
    Backoff, Category, Envelope, RateLimitTransport, Receipt, RetryTransport, SendError,
    SmtpTransport, Transport,
};

use support::raw_smtp::{Answer, RawSmtp};
use support::scripted::{Reply, Scripted};

const HOUR: Duration = Duration::from_secs(3_600);

/// An outbox in a fresh SQLite file; the folder goes when the guard is dropped.
async fn open(test: &str) -> (Outbox, tempfile::TempDir) {
    let folder = tempfile::Builder::new()
        .prefix(&format!("mail-breaker-deadline-{test}-"))
        .tempdir()
        .expect("a temporary folder");
    let outbox = Outbox::sqlite(folder.path().join("outbox.db"))
        .await
        .expect("an SQLite outbox");
    (outbox, folder)
}

/// A worker whose sends are cut at 300 ms of a 1 s lease, and whose own waits after a
/// failure are an hour: what a drain leaves queued was answered once.
fn worker<T: Transport + 'static>(outbox: &Outbox, stack: T) -> Worker<T> {
    outbox
        .worker(stack)
        .lease(Duration::from_secs(1))
        .send_timeout(Duration::from_millis(300))
        .backoff(Backoff::constant(HOUR))
        .poll(Duration::from_millis(50))
}

fn busy_for_an_hour() -> SendError {
    SendError::new(
        Category::ServiceUnavailable,
        "test.busy",
        "busy, come back in an hour",
    )
    .with_retry_after(HOUR)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_would_sleep_past_the_deadline_answers_its_last_error_not_maybe_delivered() {
    let (outbox, _folder) = open("retry-sleep").await;
    let id = outbox.enqueue(&support::message()).await.expect("queued");
    let provider = Scripted::answering("provider", Reply::Err(busy_for_an_hour()));
    let retry = RetryTransport::builder(provider.clone())
        .max_attempts(3)
        .build()
        .expect("a retry");
    worker(&outbox, retry)
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    assert_eq!(provider.sends(), 1, "tried once, then the retry gave up");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.queued, stats.dead),
        (1, 0),
        "kept for a later try, not dead as maybe delivered: {:?}",
        outbox.dead_letters(1).await.expect("dead letters")
    );
    let stored = outbox.message(id).await.expect("read").expect("kept");
    let error = stored.error.expect("its last error");
    assert_eq!(error.code(), "test.busy", "{error}");
    assert!(!error.is_maybe_delivered(), "{error}");
}

/// Delivers to the first recipient and defers the others for an hour, then delivers.
#[derive(Debug, Default)]
struct DeliversToTheFirst {
    sends: AtomicUsize,
}

#[async_trait::async_trait]
impl Transport for DeliversToTheFirst {
    fn name(&self) -> &str {
        "first-only"
    }

    async fn send_raw(&self, envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        if self.sends.fetch_add(1, Ordering::SeqCst) > 0 {
            return Ok(Receipt::new("first-only"));
        }
        Ok(envelope
            .to()
            .iter()
            .skip(1)
            .fold(Receipt::new("first-only"), |receipt, to| {
                receipt.with_deferred_recipient(to.clone(), busy_for_an_hour())
            }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_holding_a_receipt_with_deferred_recipients_answers_that_receipt_at_the_deadline() {
    let (outbox, _folder) = open("retry-receipt").await;
    let message = lettre::Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("first@example.org".parse().expect("a recipient"))
        .to("later@example.org".parse().expect("a recipient"))
        .subject("two")
        .body(String::from("hello"))
        .expect("a message");
    let id = outbox.enqueue(&message).await.expect("queued");
    let provider = Arc::new(DeliversToTheFirst::default());
    let retry = RetryTransport::builder(Arc::clone(&provider))
        .max_attempts(3)
        .build()
        .expect("a retry");
    worker(&outbox, retry).drain().await.expect("drained");
    assert_eq!(provider.sends.load(Ordering::SeqCst), 1);
    let stored = outbox.message(id).await.expect("read").expect("kept");
    let owed: Vec<String> = stored
        .envelope
        .to()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        owed,
        ["later@example.org"],
        "kept for the deferred recipient alone: the first has it"
    );
    assert_eq!(stored.error.expect("why").code(), "test.busy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiter_whose_wait_would_pass_the_deadline_refuses_at_once_as_not_attempted() {
    let (outbox, _folder) = open("rate-wait").await;
    let ids = outbox
        .enqueue_many(&support::numbered_messages(2))
        .await
        .expect("queued");
    let provider = Scripted::new("provider");
    // One send a minute: the second waits a minute, within max_wait, past the deadline.
    let limited = RateLimitTransport::builder(provider.clone())
        .per_second(1.0 / 60.0)
        .burst(1)
        .max_wait(HOUR)
        .build()
        .expect("a limiter");
    worker(&outbox, limited)
        .concurrency(1)
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    assert_eq!(
        provider.sends(),
        1,
        "the first went, the second waits its turn"
    );
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.queued, stats.dead),
        (1, 0),
        "the second kept, not dead as maybe delivered: {:?}",
        outbox.dead_letters(1).await.expect("dead letters")
    );
    for id in ids {
        if let Some(stored) = outbox.message(id).await.expect("read") {
            // A refusal without an attempt is given back, due again, with no attempt
            // counted and no error of its own (DESIGN §19, "Not sent is not an attempt").
            assert_eq!(stored.attempts, 0, "not attempted: no attempt counted");
            assert!(stored.error.is_none(), "{:?}", stored.error);
        }
    }
}

/// A server on a loopback port that takes everything, except that it never answers the
/// first message's final dot.
async fn server_silent_after_the_first_data() -> RawSmtp {
    let dots = AtomicUsize::new(0);
    RawSmtp::start(b"220 raw.test ESMTP\r\n".to_vec(), move |command| {
        if command == "." && dots.fetch_add(1, Ordering::SeqCst) == 0 {
            Answer::Silence
        } else {
            Answer::healthy(command)
        }
    })
    .await
}

fn smtp_to(server: &RawSmtp, connections: usize) -> SmtpTransport {
    SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .max_connections(connections)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an SMTP transport")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_send_waiting_for_a_pooled_connection_slot_cut_by_the_deadline_is_not_attempted() {
    let (outbox, _folder) = open("smtp-slot").await;
    let id = outbox.enqueue(&support::message()).await.expect("queued");
    let server = server_silent_after_the_first_data().await;
    // One connection, held by a send of the application's own that hangs after its data
    // until the transport's own timeout: the worker's send waits for the slot all along.
    let smtp = Arc::new(smtp_to(&server, 1));
    let holder = {
        let smtp = Arc::clone(&smtp);
        tokio::spawn(async move { smtp.send(&support::message()).await })
    };
    while server.count("DATA") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    worker(&outbox, Arc::clone(&smtp))
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    let dead = outbox.dead_letters(10).await.expect("dead letters");
    assert!(dead.is_empty(), "nothing of it was sent: {dead:?}");
    let stored = outbox.message(id).await.expect("read").expect("kept");
    // Given back, due again, with no attempt counted and no error of its own (DESIGN §19,
    // "Not sent is not an attempt").
    assert_eq!(stored.attempts, 0, "not attempted: no attempt counted");
    assert!(stored.error.is_none(), "{:?}", stored.error);
    assert_eq!(server.count("DATA"), 1, "only the holder's data went");
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_send_cut_after_its_data_is_maybe_delivered() {
    let (outbox, _folder) = open("smtp-data").await;
    outbox.enqueue(&support::message()).await.expect("queued");
    let server = server_silent_after_the_first_data().await;
    worker(&outbox, smtp_to(&server, 1))
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    let dead = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(dead.len(), 1, "never sent again");
    assert_eq!(dead[0].error.code(), "outbox.maybe_delivered");
    assert_eq!(server.data().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_own_transport_cut_at_the_deadline_is_maybe_delivered() {
    let (outbox, _folder) = open("own-transport").await;
    outbox.enqueue(&support::message()).await.expect("queued");
    let hung = Scripted::answering("own", Reply::Hang);
    worker(&outbox, hung.clone())
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    let dead = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(
        dead.len(),
        1,
        "it marks nothing: it may have reached the provider"
    );
    assert_eq!(dead[0].error.code(), "outbox.maybe_delivered");
    assert_eq!(hung.sends(), 1);
}
