//! The rules of the retry transport and its budget (DESIGN §6), one test each, time driven by
//! `tokio::time::pause()`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Backoff, Category, CircuitBreakerTransport, Message, PoolTransport, Receipt, RetryBudget,
    RetryTransport, SendError, Transport,
};
use support::scripted::{Reply, Scripted};
use support::{message, numbered_messages};
use tokio::time::Instant;

fn retry(inner: &Scripted, attempts: u32) -> RetryTransport<Scripted> {
    RetryTransport::builder(inner.clone())
        .max_attempts(attempts)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .build()
        .expect("valid settings")
}

fn unavailable_for(after: Duration) -> Reply {
    Reply::Err(
        SendError::new(Category::ServiceUnavailable, "smtp.421", "try later")
            .with_retry_after(after),
    )
}

async fn send_all<T: Transport>(
    transport: &T,
    messages: Vec<Message>,
) -> Vec<Result<Receipt, SendError>> {
    transport
        .send_many(futures::stream::iter(messages).boxed())
        .collect()
        .await
}

fn attempts(answers: &[Result<Receipt, SendError>]) -> Vec<String> {
    answers
        .iter()
        .map(|answer| match answer {
            Ok(receipt) => receipt.attempts().to_string(),
            Err(error) => error.code().to_owned(),
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_retryable_error_is_tried_again_until_it_succeeds() {
    let inner = Scripted::new("p");
    inner.then([
        Reply::fail(Category::Network),
        Reply::fail(Category::Timeout),
    ]);
    let receipt = retry(&inner, 3).send(&message()).await.unwrap();
    assert_eq!(receipt.attempts(), 3);
    assert_eq!(inner.sends(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_first_try_that_succeeds_counts_one_attempt() {
    let inner = Scripted::new("p");
    let receipt = retry(&inner, 3).send(&message()).await.unwrap();
    assert_eq!(receipt.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_non_retryable_error_is_returned_at_once() {
    for category in [
        Category::Rejected,
        Category::InvalidMessage,
        Category::Authentication,
        Category::Configuration,
        Category::Unsupported,
    ] {
        let inner = Scripted::answering("p", Reply::fail(category));
        let started = Instant::now();
        let err = retry(&inner, 5).send(&message()).await.unwrap_err();
        assert_eq!(err.category(), category);
        assert_eq!(inner.sends(), 1, "{category}");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}

#[tokio::test(start_paused = true)]
async fn it_gives_up_after_max_attempts_with_the_last_error() {
    let inner = Scripted::new("p");
    inner.then([
        Reply::fail(Category::Network),
        Reply::fail(Category::Network),
        Reply::fail(Category::Timeout),
    ]);
    let err = retry(&inner, 3).send(&message()).await.unwrap_err();
    assert_eq!(err.code(), "test.timeout");
    assert_eq!(inner.sends(), 3);
}

#[tokio::test(start_paused = true)]
async fn it_waits_the_backoff_between_tries() {
    let inner = Scripted::answering("p", Reply::fail(Category::ServerError));
    let started = Instant::now();
    retry(&inner, 4).send(&message()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn exponential_backoff_waits_no_longer_than_its_ceilings() {
    let inner = Scripted::answering("p", Reply::fail(Category::ServerError));
    let transport = RetryTransport::builder(inner.clone())
        .max_attempts(5)
        .backoff(Backoff::exponential(
            Duration::from_secs(1),
            Duration::from_secs(4),
        ))
        .build()
        .unwrap();
    let started = Instant::now();
    transport.send(&message()).await.unwrap_err();
    assert!(started.elapsed() <= Duration::from_secs(1 + 2 + 4 + 4));
    assert_eq!(inner.sends(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_retry_waits_the_errors_retry_after_when_it_is_longer_than_the_backoff() {
    let inner = Scripted::new("p");
    inner.then([unavailable_for(Duration::from_secs(20))]);
    let started = Instant::now();
    let receipt = retry(&inner, 3).send(&message()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(20));
    assert_eq!(receipt.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_waits_at_least_the_breakers_retry_after() {
    let inner = Scripted::answering("p", Reply::fail(Category::Network));
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let transport = RetryTransport::builder(breaker)
        .max_attempts(3)
        .backoff(Backoff::constant(Duration::from_millis(10)))
        .build()
        .unwrap();
    let started = Instant::now();
    let sender = tokio::spawn(async move { transport.send(&message()).await });
    // The first try opens the breaker; the second, 10 ms later, is refused with
    // breaker.open; the third must wait for the reset timeout.
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(
        inner.sends(),
        1,
        "nothing reaches the provider while the breaker is open"
    );
    inner.set_default(Reply::Ok);
    let receipt = sender.await.unwrap().unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(receipt.attempts(), 3);
    assert_eq!(inner.sends(), 2, "the probe");
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_wait_would_pass_max_elapsed_returns_at_once() {
    let inner = Scripted::answering("p", unavailable_for(Duration::from_secs(60)));
    let transport = RetryTransport::builder(inner.clone())
        .max_attempts(5)
        .max_elapsed(Duration::from_secs(30))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = transport.send(&message()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(err.code(), "smtp.421");
    assert_eq!(inner.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_counts_from_the_first_try() {
    let inner = Scripted::answering("p", unavailable_for(Duration::from_secs(10)));
    let transport = RetryTransport::builder(inner.clone())
        .max_attempts(10)
        .backoff(Backoff::constant(Duration::ZERO))
        .max_elapsed(Duration::from_secs(25))
        .build()
        .unwrap();
    let started = Instant::now();
    transport.send(&message()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(20));
    assert_eq!(
        inner.sends(),
        3,
        "at 0 s, 10 s and 20 s; 30 s would pass 25 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_stops_retries_but_never_the_first_attempt() {
    let budget = Arc::new(RetryBudget::new(20, 10, 10).unwrap());
    let inner = Scripted::answering("p", Reply::fail(Category::ServerError));
    let transport = RetryTransport::builder(inner.clone())
        .max_attempts(5)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .budget(Arc::clone(&budget))
        .build()
        .unwrap();
    transport.send(&message()).await.unwrap_err();
    assert_eq!(inner.sends(), 1, "the failure spent the budget: no retry");
    assert!(budget.throttle_retry_attempt());
    transport.send(&message()).await.unwrap_err();
    assert_eq!(inner.sends(), 2, "the first attempt is still made");
    inner.set_default(Reply::Ok);
    let receipt = transport.send(&message()).await.unwrap();
    assert_eq!(receipt.attempts(), 1);
}

#[test]
fn a_retry_gives_back_the_budget_it_shares_and_none_without_one() {
    let budget = Arc::new(RetryBudget::new(20, 10, 10).unwrap());
    let shared = RetryTransport::builder(Scripted::new("p"))
        .budget(Arc::clone(&budget))
        .build()
        .unwrap();
    assert!(Arc::ptr_eq(shared.budget().expect("its budget"), &budget));
    assert!(RetryTransport::new(Scripted::new("p")).budget().is_none());
}

#[test]
fn exponential_backoff_ceilings_double_from_the_first_wait_up_to_the_longest() {
    let backoff = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(10));
    let ceilings: Vec<_> = [1, 2, 3, 4, 5, 64, u32::MAX]
        .map(|retry| backoff.ceiling(retry).as_secs())
        .into();
    assert_eq!(ceilings, [1, 2, 4, 8, 10, 10, 10]);
}

#[test]
fn a_retry_is_named_and_shown_as_the_transport_it_retries_through() {
    let transport = RetryTransport::new(Scripted::new("p"));
    assert_eq!(transport.name(), "p");
    let shown = format!("{transport:?}");
    assert!(shown.starts_with("RetryTransport"), "{shown}");
    assert!(shown.contains("\"p\""), "{shown}");
}

#[tokio::test]
async fn verify_goes_through_the_retry_to_the_transport() {
    let inner = Scripted::new("p");
    inner.fail_verify_with(Reply::fail(Category::Authentication));
    let error = RetryTransport::new(inner.clone())
        .verify()
        .await
        .unwrap_err();
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(inner.verifies(), 1);
}

/// Reads the first message of each batch and ends the batch without answering it.
struct EndsUnanswered;

#[async_trait::async_trait]
impl Transport for EndsUnanswered {
    fn name(&self) -> &str {
        "silent"
    }

    async fn send_raw(&self, _: &mail_breaker::Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        Ok(Receipt::new("silent"))
    }

    fn send_many<'a>(
        &'a self,
        messages: mail_breaker::MessageStream<'a>,
    ) -> mail_breaker::ReceiptStream<'a> {
        futures::stream::unfold(messages, |mut messages| async move {
            messages.next().await;
            None::<(Result<Receipt, SendError>, mail_breaker::MessageStream<'a>)>
        })
        .boxed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_message_a_batch_left_unanswered_is_answered_with_an_error_naming_that_transport() {
    let transport = RetryTransport::builder(EndsUnanswered)
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .build()
        .unwrap();
    let answers: Vec<_> = transport
        .send_many(futures::stream::iter([message()]).boxed())
        .collect()
        .await;
    let [Err(error)] = &answers[..] else {
        panic!("one error for the one message, not {answers:?}");
    };
    assert_eq!(error.code(), "transport.unanswered");
    assert_eq!(error.transport(), Some("silent"));
}

#[tokio::test(start_paused = true)]
async fn successes_refill_the_budget_so_retries_resume() {
    let budget = Arc::new(RetryBudget::new(20, 10, 5).unwrap());
    budget.on_retry_failure();
    budget.on_retry_failure();
    assert!(budget.throttle_retry_attempt());
    let inner = Scripted::new("p");
    let transport = RetryTransport::builder(inner.clone())
        .budget(Arc::clone(&budget))
        .build()
        .unwrap();
    for _ in 0..6 {
        transport.send(&message()).await.unwrap();
    }
    assert_eq!(budget.tokens(), 16);
    // The failure costs 5 first, leaving 11: still above min_tokens.
    inner.then([Reply::fail(Category::Network)]);
    let receipt = transport.send(&message()).await.unwrap();
    assert_eq!(receipt.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn one_budget_is_shared_by_every_transport_that_holds_it() {
    let budget = Arc::new(RetryBudget::new(30, 10, 10).unwrap());
    let (a, b) = (
        Scripted::answering("a", Reply::fail(Category::Timeout)),
        Scripted::answering("b", Reply::fail(Category::Timeout)),
    );
    let with_budget = |inner: &Scripted| {
        RetryTransport::builder(inner.clone())
            .max_attempts(10)
            .backoff(Backoff::constant(Duration::from_millis(1)))
            .budget(Arc::clone(&budget))
            .build()
            .unwrap()
    };
    with_budget(&a).send(&message()).await.unwrap_err();
    with_budget(&b).send(&message()).await.unwrap_err();
    assert_eq!((a.sends(), b.sends()), (2, 1));
}

#[test]
fn budget_new_refuses_min_tokens_over_tokens() {
    let err = RetryBudget::new(10, 11, 1).unwrap_err();
    assert_eq!(err.setting(), "min_tokens");
}

#[test]
fn budget_new_refuses_zero_tokens_and_zero_cost() {
    assert_eq!(RetryBudget::new(0, 0, 1).unwrap_err().setting(), "tokens");
    assert_eq!(
        RetryBudget::new(10, 5, 0).unwrap_err().setting(),
        "error_cost"
    );
}

#[test]
fn budget_clamp_lowers_min_tokens_to_tokens_and_raises_zeros() {
    let budget = RetryBudget::clamp(0, 7, 0);
    assert_eq!(
        (
            budget.max_tokens(),
            budget.min_tokens(),
            budget.error_cost()
        ),
        (1, 1, 1)
    );
}

#[test]
fn budget_successes_never_fill_it_past_its_tokens() {
    let budget = RetryBudget::default();
    for _ in 0..10 {
        budget.on_success();
    }
    assert_eq!(budget.tokens(), budget.max_tokens());
}

#[test]
fn budget_failures_never_take_it_below_zero() {
    let budget = RetryBudget::new(15, 0, 10).unwrap();
    budget.on_retry_failure();
    budget.on_retry_failure();
    assert_eq!(budget.tokens(), 0);
    assert!(budget.throttle_retry_attempt());
}

#[test]
fn zero_max_attempts_is_a_config_error() {
    let err = RetryTransport::builder(Scripted::new("p"))
        .max_attempts(0)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "max_attempts");
}

#[test]
fn zero_max_elapsed_is_a_config_error() {
    let err = RetryTransport::builder(Scripted::new("p"))
        .max_elapsed(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "max_elapsed");
}

#[test]
fn exponential_backoff_whose_max_is_below_its_initial_is_a_config_error() {
    let err = RetryTransport::builder(Scripted::new("p"))
        .backoff(Backoff::exponential(
            Duration::from_secs(2),
            Duration::from_secs(1),
        ))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "backoff");
}

#[test]
fn exponential_backoff_whose_max_equals_its_initial_waits_the_same_each_time() {
    let second = Duration::from_secs(1);
    let built = RetryTransport::builder(Scripted::new("p"))
        .backoff(Backoff::exponential(second, second))
        .build();
    assert!(built.is_ok());
}

#[test]
fn exponential_backoff_with_a_zero_initial_wait_is_a_config_error() {
    let err = RetryTransport::builder(Scripted::new("p"))
        .backoff(Backoff::exponential(Duration::ZERO, Duration::from_secs(1)))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "backoff");
}

#[tokio::test(start_paused = true)]
async fn send_many_sends_the_batch_through_the_inner_send_many() {
    let inner = Scripted::new("p").batched();
    let answers = send_all(&retry(&inner, 3), numbered_messages(10)).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(inner.batches(), [10]);
}

#[tokio::test(start_paused = true)]
async fn send_many_retries_only_the_messages_that_failed_in_message_order() {
    let inner = Scripted::new("p").batched();
    inner.then([
        Reply::Ok,
        Reply::fail(Category::Network),
        Reply::Ok,
        Reply::fail(Category::ServerError),
        Reply::Ok,
    ]);
    let answers = send_all(&retry(&inner, 3), numbered_messages(5)).await;
    assert_eq!(attempts(&answers), ["1", "2", "1", "2", "1"]);
    assert_eq!(inner.batches(), [5, 2]);
    let subjects = inner.subjects();
    assert_eq!(subjects[5..], ["message 1", "message 3"]);
}

#[tokio::test(start_paused = true)]
async fn send_many_returns_non_retryable_errors_without_retrying_them() {
    let inner = Scripted::new("p").batched();
    inner.then([Reply::fail(Category::Rejected), Reply::Ok]);
    let answers = send_all(&retry(&inner, 3), numbered_messages(2)).await;
    assert_eq!(attempts(&answers), ["test.rejected", "1"]);
    assert_eq!(inner.sends(), 2);
}

#[tokio::test(start_paused = true)]
async fn send_many_gives_up_on_a_message_after_max_attempts() {
    let inner = Scripted::new("p").batched();
    inner.then([
        Reply::fail(Category::Timeout),
        Reply::Ok,
        Reply::fail(Category::Timeout),
        Reply::fail(Category::Network),
    ]);
    let answers = send_all(&retry(&inner, 3), numbered_messages(2)).await;
    assert_eq!(attempts(&answers), ["test.network", "1"]);
    assert_eq!(inner.batches(), [2, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn send_many_waits_the_retry_after_before_the_second_try() {
    let inner = Scripted::new("p");
    inner.then([unavailable_for(Duration::from_secs(15))]);
    let started = Instant::now();
    let answers = send_all(&retry(&inner, 3), numbered_messages(3)).await;
    assert_eq!(attempts(&answers), ["2", "1", "1"]);
    assert_eq!(started.elapsed(), Duration::from_secs(15));
}

#[tokio::test(start_paused = true)]
async fn send_many_waits_the_backoff_of_a_message_that_fails_while_its_next_try_is_sending() {
    let inner = Scripted::new("p");
    // The first message fails at once and is sent again after 1 s; the second fails at 2 s,
    // while that second try is under way, and must wait its own second before it joins it.
    inner.then([
        Reply::fail(Category::Network),
        Reply::after(Duration::from_secs(2), Reply::fail(Category::Network)),
    ]);
    let started = Instant::now();
    let answers = send_all(&retry(&inner, 3), numbered_messages(3)).await;
    assert_eq!(attempts(&answers), ["2", "2", "1"]);
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn send_many_retries_the_rest_of_a_batch_that_failed_as_a_whole() {
    let inner = Scripted::new("p").batched();
    inner.then([
        Reply::Ok,
        Reply::Err(
            SendError::new(Category::Network, "test.reset", "connection reset").batch_failure(),
        ),
    ]);
    let answers = send_all(&retry(&inner, 3), numbered_messages(4)).await;
    assert_eq!(attempts(&answers), ["1", "2", "2", "2"]);
    assert_eq!(inner.batches(), [4, 3]);
}

#[tokio::test(start_paused = true)]
async fn send_many_charges_the_budget_once_for_a_batch_failure() {
    let budget = Arc::new(RetryBudget::new(100, 0, 10).unwrap());
    let inner = Scripted::new("p").batched();
    inner.then([Reply::Err(
        SendError::new(Category::Network, "test.reset", "connection reset").batch_failure(),
    )]);
    let transport = RetryTransport::builder(inner.clone())
        .budget(Arc::clone(&budget))
        .build()
        .unwrap();
    let answers = send_all(&transport, numbered_messages(5)).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(
        budget.tokens(),
        95,
        "-10 for the batch failure, +1 for each success"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_around_a_pool_waits_for_the_soonest_breaker_and_delivers() {
    let (a, b) = (
        Scripted::answering("a", Reply::fail(Category::Network)),
        Scripted::answering("b", Reply::fail(Category::Network)),
    );
    let breaker = |inner: &Scripted, reset: u64| {
        CircuitBreakerTransport::builder(inner.clone())
            .failure_threshold(1)
            .reset_timeout(Duration::from_secs(reset))
            .build()
            .unwrap()
    };
    let pool = PoolTransport::builder()
        .add(breaker(&a, 40), 1)
        .add(breaker(&b, 25), 2)
        .build()
        .unwrap();
    let transport = RetryTransport::builder(pool)
        .max_attempts(4)
        .backoff(Backoff::constant(Duration::from_millis(100)))
        .build()
        .unwrap();
    b.set_default(Reply::Ok);
    b.then([Reply::fail(Category::Network)]);
    let started = Instant::now();
    let receipt = transport.send(&message()).await.unwrap();
    assert_eq!(receipt.transport(), "b");
    assert_eq!(receipt.attempts(), 3);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(25) && waited < Duration::from_secs(26),
        "{waited:?}"
    );
    assert_eq!((a.sends(), b.sends()), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn the_retry_transport_is_a_lettre_async_transport() {
    use lettre::AsyncTransport;
    let inner = Scripted::new("p");
    inner.then([Reply::fail(Category::Network)]);
    let receipt = AsyncTransport::send(&retry(&inner, 2), message())
        .await
        .unwrap();
    assert_eq!(receipt.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn unbounded_attempts_retry_until_max_elapsed_in_a_batch_too() {
    let inner = Scripted::answering("p", Reply::fail(Category::Network));
    let transport = RetryTransport::builder(inner.clone())
        .max_attempts(u32::MAX)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .max_elapsed(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = Instant::now();
    let answers = send_all(&transport, numbered_messages(2)).await;
    assert_eq!(attempts(&answers), ["test.network", "test.network"]);
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert_eq!(
        inner.sends(),
        22,
        "tries at 0, 1, ..., 10 s for each message"
    );
}

// ---- at most once (issue 10) ----

/// A timeout after SMTP's final dot: the provider may hold the message.
fn maybe_delivered_timeout() -> Reply {
    Reply::Err(
        SendError::new(
            Category::Timeout,
            "smtp.timeout",
            "no reply after the final dot",
        )
        .maybe_delivered(),
    )
}

fn at_most_once(inner: &Scripted, attempts: u32) -> RetryTransport<Scripted> {
    RetryTransport::builder(inner.clone())
        .max_attempts(attempts)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .at_most_once()
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn at_most_once_returns_a_maybe_delivered_error_at_once_without_a_retry() {
    let inner = Scripted::new("p");
    inner.then([maybe_delivered_timeout()]);
    let started = Instant::now();

    let error = at_most_once(&inner, 5).send(&message()).await.unwrap_err();

    assert_eq!(error.code(), "smtp.timeout");
    assert!(error.is_maybe_delivered());
    assert_eq!(inner.sends(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn at_most_once_still_retries_an_error_that_was_surely_not_delivered() {
    let inner = Scripted::new("p");
    inner.then([
        Reply::fail(Category::Timeout),
        Reply::fail(Category::Network),
    ]);

    let receipt = at_most_once(&inner, 5).send(&message()).await.unwrap();

    assert_eq!(receipt.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn by_default_a_maybe_delivered_error_is_retried_at_least_once() {
    let inner = Scripted::new("p");
    inner.then([maybe_delivered_timeout()]);

    let receipt = retry(&inner, 3).send(&message()).await.unwrap();

    assert_eq!(receipt.attempts(), 2);
    assert_eq!(inner.sends(), 2);
}

#[tokio::test(start_paused = true)]
async fn at_most_once_returns_a_maybe_delivered_error_in_a_batch_and_retries_the_others() {
    let inner = Scripted::new("p").naming_subjects_in_receipts();
    inner.then([
        Reply::fail(Category::Network),
        maybe_delivered_timeout(),
        Reply::Ok,
    ]);

    let answers = send_all(&at_most_once(&inner, 3), numbered_messages(3)).await;

    assert_eq!(attempts(&answers), ["2", "smtp.timeout", "1"]);
    assert_eq!(inner.sends(), 4);
}

// ---- a panic is an answer (issue 45, point 3; DESIGN §15) ----

/// A transport whose first `panics` sends panic, then delivers: a bug in a provider's code.
struct Panicking {
    panics: usize,
    sends: std::sync::atomic::AtomicUsize,
}

impl Panicking {
    fn new(panics: usize) -> Self {
        Panicking {
            panics,
            sends: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Transport for Panicking {
    fn name(&self) -> &str {
        "panicking"
    }

    async fn send_raw(
        &self,
        _envelope: &mail_breaker::Envelope,
        _raw: &[u8],
    ) -> Result<Receipt, SendError> {
        let send = self.sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if send < self.panics {
            panic!("a bug in the provider's code");
        }
        Ok(Receipt::new("panicking"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_send_that_panics_is_answered_transport_panicked_without_a_retry_and_sending_goes_on() {
    let transport = RetryTransport::builder(Panicking::new(1))
        .max_attempts(3)
        .build()
        .unwrap();

    let error = transport.send(&message()).await.unwrap_err();
    assert_eq!(error.code(), "transport.panicked");
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.transport(), Some("panicking"));
    assert_eq!(
        transport
            .inner()
            .sends
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    let receipt = transport.send(&message()).await.unwrap();
    assert_eq!(receipt.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_panics_answers_each_of_its_messages_transport_panicked() {
    let transport = RetryTransport::builder(Panicking::new(1))
        .max_attempts(3)
        .build()
        .unwrap();

    let answers = send_all(&transport, numbered_messages(3)).await;

    assert_eq!(answers.len(), 3);
    for answer in &answers {
        let error = answer.as_ref().unwrap_err();
        assert_eq!(error.code(), "transport.panicked");
        assert!(!error.is_batch_failure(), "each message's own answer");
    }
}

/// Issue 62 review: a retry whose first try reached the provider and whose last try was
/// refused without a send (a breaker the first failure opened) answers an attempted error,
/// so that an outbox counts the attempt and its backoff.
#[tokio::test(start_paused = true)]
async fn a_retry_whose_first_try_reached_the_provider_answers_attempted_though_its_last_was_refused()
 {
    let provider = Scripted::answering("provider", Reply::Ok);
    let refused = SendError::new(
        Category::ServiceUnavailable,
        "breaker.open",
        "the circuit breaker is open",
    )
    .with_retry_after(Duration::from_millis(1))
    .not_attempted();
    provider.then([Reply::fail(Category::ServerError), Reply::Err(refused)]);
    let retry = RetryTransport::builder(provider.clone())
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(1)))
        .build()
        .unwrap();

    let error = retry.send(&message()).await.unwrap_err();

    assert_eq!(error.code(), "breaker.open");
    assert!(
        !error.is_not_attempted(),
        "the first try reached the provider"
    );
    assert_eq!(provider.sends(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_every_try_was_refused_answers_not_attempted() {
    let provider = Scripted::answering("provider", Reply::Ok);
    let refused = || {
        SendError::new(Category::ServiceUnavailable, "breaker.open", "open")
            .with_retry_after(Duration::from_millis(1))
            .not_attempted()
    };
    provider.then([Reply::Err(refused()), Reply::Err(refused())]);
    let retry = RetryTransport::builder(provider.clone())
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(1)))
        .build()
        .unwrap();

    let error = retry.send(&message()).await.unwrap_err();

    assert!(error.is_not_attempted(), "nothing was sent: {error:?}");
}
