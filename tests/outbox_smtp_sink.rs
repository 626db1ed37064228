//! The outbox against a real SMTP server, `smtp-sink`, through a breaker: every provider down
//! for 10 s mid-run.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mail_breaker::outbox::Outbox;
use mail_breaker::{
    CircuitBreakerTransport, Envelope, Receipt, SendError, SmtpTransport, Transport,
};
use support::smtp_sink::SmtpSink;

/// Counts the sends that reach the provider: those the breaker let through.
struct Attempts<T> {
    inner: T,
    count: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for Attempts<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.inner.send_raw(envelope, raw).await
    }
}

const CONCURRENCY: usize = 16;
const FAILURE_THRESHOLD: u32 = 3;
const RESET_TIMEOUT: Duration = Duration::from_secs(2);
const DOWN_FOR: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_provider_down_for_10_s_the_queue_grows_few_attempts_are_made_and_all_drains() {
    let test = "outbox_everything_down";
    let Some(mut sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let folder = std::env::temp_dir().join(format!("mail-breaker-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let outbox = Outbox::sqlite(folder.join("outbox.db")).await.unwrap();

    let attempts = Arc::new(AtomicUsize::new(0));
    let smtp = SmtpTransport::unencrypted("127.0.0.1", sink.port())
        .with_timeout(Duration::from_millis(500));
    let stack = CircuitBreakerTransport::builder(Attempts {
        inner: smtp,
        count: Arc::clone(&attempts),
    })
    .failure_threshold(FAILURE_THRESHOLD)
    .reset_timeout(RESET_TIMEOUT)
    .build()
    .unwrap();
    let worker = outbox
        .worker(stack)
        .concurrency(CONCURRENCY)
        .backoff(mail_breaker::Backoff::constant(Duration::from_millis(100)))
        .poll(Duration::from_millis(50));
    let running = support::outbox_rules::Running::start(worker);

    // Mail arrives all along: up to 100 a second for 13 s (fewer on a loaded machine, where
    // each enqueue's sync to disk takes longer).
    let enqueued = Arc::new(AtomicUsize::new(0));
    let producer = {
        let outbox = outbox.clone();
        let enqueued = Arc::clone(&enqueued);
        tokio::spawn(async move {
            let mut subjects = Vec::new();
            for (i, message) in support::numbered_messages(1_300).into_iter().enumerate() {
                outbox.enqueue(&message).await.unwrap();
                enqueued.fetch_add(1, Ordering::SeqCst);
                subjects.push(format!("message {i}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            subjects
        })
    };

    tokio::time::sleep(Duration::from_secs(1)).await;
    sink.stop();
    let down_at = Instant::now();
    let attempts_at_stop = attempts.load(Ordering::SeqCst);
    let enqueued_at_stop = enqueued.load(Ordering::SeqCst);
    tokio::time::sleep(DOWN_FOR).await;
    let queued_while_down = outbox.stats().await.unwrap().queued;
    let enqueued_while_down = enqueued.load(Ordering::SeqCst) - enqueued_at_stop;
    let attempts_while_down = attempts.load(Ordering::SeqCst) - attempts_at_stop;
    sink.restart();
    let down_for = down_at.elapsed();

    let subjects = producer.await.unwrap();
    let started = Instant::now();
    while outbox.stats().await.unwrap().queued > 0 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;

    // Those in flight when it went down, the failures that open the breaker, then one probe
    // per open period.
    let probes = (down_for.as_secs_f64() / RESET_TIMEOUT.as_secs_f64()).ceil() as usize + 1;
    let allowed = CONCURRENCY + FAILURE_THRESHOLD as usize + probes;
    println!(
        "down {down_for:?}: {attempts_while_down} attempts reached the server (at most {allowed}), \
         {queued_while_down} queued at the end of it"
    );
    assert!(
        attempts_while_down <= allowed,
        "{attempts_while_down} attempts while down"
    );
    // Nothing leaves the queue while the provider is down: all that came meanwhile waits.
    assert!(
        enqueued_while_down >= 100,
        "mail kept coming while down: {enqueued_while_down}"
    );
    assert!(
        queued_while_down >= enqueued_while_down as u64,
        "the queue grew by all that came while down: {queued_while_down} queued, \
         {enqueued_while_down} came"
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.dead),
        (0, 0),
        "all of it drained: {stats:?}"
    );
    let received: HashSet<String> = sink.received_subjects().into_iter().collect();
    let lost: Vec<&String> = subjects.iter().filter(|s| !received.contains(*s)).collect();
    assert!(
        lost.is_empty(),
        "{} lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let _ = std::fs::remove_dir_all(&folder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_recipient_is_dead_at_once_with_its_error_and_requeue_sends_it_again() {
    let test = "outbox_rejected_recipient";
    // smtp-sink answers every RCPT TO with a hard reject (5xx).
    let Some(mut sink) = SmtpSink::start_counting(test, &["-f", "RCPT"]) else {
        return;
    };
    let folder = std::env::temp_dir().join(format!("mail-breaker-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let outbox = Outbox::sqlite(folder.join("outbox.db")).await.unwrap();
    let id = outbox.enqueue(&support::message()).await.unwrap();
    let stack = |port: u16| {
        CircuitBreakerTransport::new(
            SmtpTransport::unencrypted("127.0.0.1", port).with_timeout(Duration::from_millis(500)),
        )
    };
    outbox.worker(stack(sink.port())).drain().await.unwrap();
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "dead at once, not retried");
    assert_eq!(dead[0].id, id);
    assert_eq!(dead[0].error.category(), mail_breaker::Category::Rejected);
    assert!(
        dead[0].error.code().starts_with("smtp.5"),
        "{}",
        dead[0].error.code()
    );
    assert_eq!(dead[0].attempts, 1);

    // The recipient is fixed (here: a server that takes it); the operator requeues.
    sink = SmtpSink::start_counting(test, &[]).expect("smtp-sink started before");
    assert!(outbox.requeue(id).await.unwrap());
    outbox.worker(stack(sink.port())).drain().await.unwrap();
    assert_eq!(sink.received(), 1);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
    assert_eq!(outbox.dead_letters(10).await.unwrap().len(), 0);
    let _ = std::fs::remove_dir_all(&folder);
}
