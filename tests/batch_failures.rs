//! The batch-failure mark across wrappers (DESIGN §1): it means "my stream ends here", so a
//! wrapper that answers one message with such an error while its own stream goes on must not
//! pass the mark on, and a batch that fails before reading anything still answers with its
//! own error. Time is driven by `tokio::time::pause()`.

mod support;

use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Backoff, Category, CircuitBreakerTransport, Envelope, MessageStream, PoolTransport, Receipt,
    ReceiptStream, RetryTransport, SendError, Transport,
};
use support::numbered_messages;
use support::scripted::{Reply, Scripted};

/// A retry (two tries) over a provider that delivers messages 0, 2 and 3 at once, and whose
/// batch for the second try of message 1 fails as a whole: message 1's answer is that batch
/// failure, and the others were delivered before it.
fn retry_whose_second_batch_fails() -> RetryTransport<Scripted> {
    let provider = Scripted::new("primary").naming_subjects_in_receipts();
    provider.then([
        Reply::Ok,
        Reply::fail(Category::ServerError),
        Reply::Ok,
        Reply::Ok,
        Reply::Err(
            SendError::new(Category::Network, "test.dropped", "connection dropped").batch_failure(),
        ),
    ]);
    RetryTransport::builder(provider)
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(10)))
        .build()
        .expect("valid settings")
}

fn answered_by(answers: &[Result<Receipt, SendError>]) -> Vec<String> {
    answers
        .iter()
        .map(|answer| match answer {
            Ok(receipt) => format!(
                "{}:{}",
                receipt.transport(),
                receipt.message_id().unwrap_or("")
            ),
            Err(error) => format!("error:{}", error.code()),
        })
        .collect()
}

async fn send_all(transport: &impl Transport, count: usize) -> Vec<Result<Receipt, SendError>> {
    transport
        .send_many(futures::stream::iter(numbered_messages(count)).boxed())
        .collect()
        .await
}

#[tokio::test(start_paused = true)]
async fn a_pool_over_a_retry_fails_over_only_the_message_the_retry_could_not_send() {
    let backup = Scripted::new("backup").naming_subjects_in_receipts();
    let pool = PoolTransport::builder()
        .add(retry_whose_second_batch_fails(), 1)
        .add(backup.clone(), 2)
        .build()
        .expect("a pool with members");

    let answers = send_all(&pool, 4).await;

    assert_eq!(
        answered_by(&answers),
        [
            "primary:message 0",
            "backup:message 1",
            "primary:message 2",
            "primary:message 3",
        ]
    );
    assert_eq!(
        backup.subjects(),
        ["message 1"],
        "nothing was delivered twice"
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_over_a_retry_answers_the_messages_the_retry_delivered_as_delivered() {
    let breaker = CircuitBreakerTransport::new(retry_whose_second_batch_fails());

    let answers = send_all(&breaker, 4).await;

    assert_eq!(
        answered_by(&answers),
        [
            "primary:message 0",
            "error:test.dropped",
            "primary:message 2",
            "primary:message 3",
        ]
    );
    assert!(
        answers
            .iter()
            .all(|a| !matches!(a, Err(e) if e.is_batch_failure())),
        "each answer is one message's"
    );
}

/// A provider whose every batch fails as a whole before it reads a message.
#[derive(Debug)]
struct DownBeforeReading;

#[async_trait::async_trait]
impl Transport for DownBeforeReading {
    fn name(&self) -> &str {
        "down"
    }

    async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        Err(down())
    }

    fn send_many<'a>(&'a self, _messages: MessageStream<'a>) -> ReceiptStream<'a> {
        futures::stream::once(async { Err(down().batch_failure()) }).boxed()
    }
}

fn down() -> SendError {
    SendError::new(
        Category::ServiceUnavailable,
        "test.down",
        "down for maintenance",
    )
    .with_retry_after(Duration::from_secs(30))
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_fails_before_reading_answers_with_its_own_error_and_the_retry_waits_for_it() {
    let retry = RetryTransport::builder(DownBeforeReading)
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(1)))
        .build()
        .expect("valid settings");
    let started = tokio::time::Instant::now();

    let answers = send_all(&retry, 3).await;

    assert_eq!(answers.len(), 3);
    for answer in &answers {
        let error = answer.as_ref().unwrap_err();
        assert_eq!(error.code(), "test.down", "{error}");
        assert_eq!(error.category(), Category::ServiceUnavailable);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(30)));
        assert!(!error.is_batch_failure());
    }
    assert!(
        started.elapsed() >= Duration::from_secs(30),
        "the second try waited for the retry_after: {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_member_fails_before_reading_fails_over_with_that_members_error_kept() {
    let backup = Scripted::new("backup");
    let pool = PoolTransport::builder()
        .add(DownBeforeReading, 1)
        .add(backup.clone(), 2)
        .build()
        .expect("a pool with members");

    let answers = send_all(&pool, 3).await;

    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(backup.sends(), 3);
}
