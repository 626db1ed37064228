//! The rules of the failover pool (DESIGN §5), one test each, time driven by `tokio::time::pause()`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Category, CircuitBreakerTransport, Envelope, Message, MessageStream, PoolTransport, Receipt,
    ReceiptStream, RetryTransport, SendError, Strategy, Transport,
};
use support::scripted::{Reply, Scripted};
use support::{message, numbered_messages};

fn pool_of(primary: &Scripted, backup: &Scripted) -> PoolTransport {
    PoolTransport::builder()
        .add(primary.clone(), 1)
        .add(backup.clone(), 2)
        .build()
        .expect("a pool with members")
}

fn breaker(inner: &Scripted, reset: Duration) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(2)
        .reset_timeout(reset)
        .build()
        .expect("valid settings")
}

fn failure() -> Reply {
    Reply::fail(Category::ServerError)
}

fn batch_failure(category: Category) -> Reply {
    Reply::Err(SendError::new(category, "test.batch", "the whole batch failed").batch_failure())
}

async fn send_all(pool: &PoolTransport, messages: Vec<Message>) -> Vec<Result<Receipt, SendError>> {
    pool.send_many(futures::stream::iter(messages).boxed())
        .collect()
        .await
}

/// Sends `count` numbered messages through `pool`, each arriving a second after the last.
async fn send_slowly(pool: &PoolTransport, count: usize) -> Vec<Result<Receipt, SendError>> {
    let slowly = futures::stream::iter(numbered_messages(count)).then(|message| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        message
    });
    pool.send_many(slowly.boxed()).collect().await
}

fn transports(answers: &[Result<Receipt, SendError>]) -> Vec<String> {
    answers
        .iter()
        .map(|answer| match answer {
            Ok(receipt) => receipt.transport().to_owned(),
            Err(error) => format!("error:{}", error.code()),
        })
        .collect()
}

fn subjects(range: impl IntoIterator<Item = usize>) -> Vec<String> {
    range.into_iter().map(|i| format!("message {i}")).collect()
}

#[test]
fn a_pool_without_members_is_a_config_error_naming_add() {
    let err = PoolTransport::builder().build().unwrap_err();
    assert_eq!(err.setting(), "add");
    assert!(err.to_string().contains("at least one member"), "{err}");
}

#[test]
fn a_pool_lists_its_members_lowest_priority_number_first_and_tells_its_strategy() {
    let (a, b) = (Scripted::new("a"), Scripted::new("b"));
    let pool = PoolTransport::builder()
        .add(b, 2)
        .add(a, 1)
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let members: Vec<_> = pool
        .members()
        .map(|(member, priority)| (member.name().to_owned(), priority))
        .collect();
    assert_eq!(members, [("a".to_owned(), 1), ("b".to_owned(), 2)]);
    assert_eq!(pool.strategy(), Strategy::RoundRobin);
    assert_eq!(
        pool_of(&Scripted::new("p"), &Scripted::new("q")).strategy(),
        Strategy::Priority
    );
}

#[test]
fn a_pool_is_shown_with_its_name_members_and_strategy() {
    let pool = PoolTransport::builder()
        .name("mail")
        .add(Scripted::new("a"), 1)
        .build()
        .unwrap();
    let shown = format!("{pool:?}");
    assert!(shown.starts_with("PoolTransport"), "{shown}");
    for part in ["\"mail\"", "\"a\"", "Priority"] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
}

#[test]
fn a_pool_builder_is_shown_with_what_it_was_given() {
    let builder = PoolTransport::builder()
        .name("mail")
        .add(Scripted::new("a"), 7)
        .at_most_once();
    let shown = format!("{builder:?}");
    assert!(shown.starts_with("PoolBuilder"), "{shown}");
    for part in ["\"mail\"", "(\"a\", 7)", "Priority", "at_most_once: true"] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
}

#[tokio::test(start_paused = true)]
async fn priority_sends_through_the_lowest_number_first() {
    let (primary, backup) = (Scripted::new("primary"), Scripted::new("backup"));
    let pool = PoolTransport::builder()
        .add(backup.clone(), 5)
        .add(primary.clone(), 1)
        .build()
        .unwrap();
    for _ in 0..3 {
        assert_eq!(pool.send(&message()).await.unwrap().transport(), "primary");
    }
    assert_eq!((primary.sends(), backup.sends()), (3, 0));
}

#[tokio::test(start_paused = true)]
async fn equal_priorities_share_the_load_in_turn() {
    let (a, b, c) = (Scripted::new("a"), Scripted::new("b"), Scripted::new("c"));
    let pool = PoolTransport::builder()
        .add(a.clone(), 1)
        .add(b.clone(), 1)
        .add(c.clone(), 2)
        .build()
        .unwrap();
    for _ in 0..4 {
        pool.send(&message()).await.unwrap();
    }
    assert_eq!((a.sends(), b.sends(), c.sends()), (2, 2, 0));
}

#[tokio::test(start_paused = true)]
async fn round_robin_rotates_the_first_member() {
    let (a, b, c) = (Scripted::new("a"), Scripted::new("b"), Scripted::new("c"));
    let pool = PoolTransport::builder()
        .add(a.clone(), 1)
        .add(b.clone(), 2)
        .add(c.clone(), 3)
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let mut firsts = Vec::new();
    for _ in 0..6 {
        firsts.push(pool.send(&message()).await.unwrap().transport().to_owned());
    }
    assert_eq!(firsts, ["a", "b", "c", "a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_server_error_fails_over_to_the_backup() {
    let primary = Scripted::answering("primary", Reply::fail(Category::ServerError));
    let backup = Scripted::new("backup");
    let receipt = pool_of(&primary, &backup).send(&message()).await.unwrap();
    assert_eq!(receipt.transport(), "backup");
    assert_eq!((primary.sends(), backup.sends()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn every_category_but_rejected_and_invalid_message_fails_over() {
    for category in [
        Category::Network,
        Category::Timeout,
        Category::ServerError,
        Category::ServiceUnavailable,
        Category::RateLimited,
        Category::Authentication,
        Category::Configuration,
        Category::Unsupported,
    ] {
        let primary = Scripted::answering("primary", Reply::fail(category));
        let backup = Scripted::new("backup");
        let receipt = pool_of(&primary, &backup).send(&message()).await;
        assert_eq!(receipt.unwrap().transport(), "backup", "{category}");
    }
}

#[tokio::test(start_paused = true)]
async fn when_no_member_can_carry_a_message_the_pool_says_unsupported_and_a_retry_does_not_try_again()
 {
    let primary = Scripted::answering("primary", Reply::fail(Category::Unsupported));
    let backup = Scripted::answering("backup", Reply::fail(Category::Unsupported));
    let retry = RetryTransport::builder(pool_of(&primary, &backup))
        .max_attempts(3)
        .build()
        .expect("valid settings");
    let err = retry.send(&message()).await.unwrap_err();
    assert_eq!(err.category(), Category::Unsupported);
    assert_eq!(err.code(), "pool.unsupported");
    assert_eq!(err.causes().len(), 2);
    assert_eq!((primary.sends(), backup.sends()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn when_one_member_cannot_carry_a_message_and_another_is_down_the_pool_is_exhausted() {
    let primary = Scripted::answering("primary", Reply::fail(Category::Unsupported));
    let backup = Scripted::answering("backup", Reply::fail(Category::ServiceUnavailable));
    let err = pool_of(&primary, &backup)
        .send(&message())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "pool.exhausted");
    assert!(err.is_retryable());
}

#[tokio::test(start_paused = true)]
async fn a_rejected_error_from_the_primary_is_returned_and_the_backup_is_never_called() {
    let primary = Scripted::answering("primary", Reply::fail(Category::Rejected));
    let backup = Scripted::new("backup");
    let err = pool_of(&primary, &backup)
        .send(&message())
        .await
        .unwrap_err();
    assert_eq!(err.category(), Category::Rejected);
    assert_eq!(err.code(), "test.rejected");
    assert_eq!(backup.sends(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_message_error_is_returned_and_the_backup_is_never_called() {
    let primary = Scripted::answering("primary", Reply::fail(Category::InvalidMessage));
    let backup = Scripted::new("backup");
    let err = pool_of(&primary, &backup)
        .send(&message())
        .await
        .unwrap_err();
    assert_eq!(err.category(), Category::InvalidMessage);
    assert_eq!(backup.sends(), 0);
}

#[tokio::test(start_paused = true)]
async fn after_the_primarys_breaker_opens_its_inner_transport_is_not_called_until_its_reset_timeout()
 {
    let primary = Scripted::answering("primary", Reply::fail(Category::Network));
    let backup = Scripted::new("backup");
    let guarded = breaker(&primary, Duration::from_secs(30));
    let pool = PoolTransport::builder()
        .add(guarded, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    for _ in 0..2 {
        assert_eq!(pool.send(&message()).await.unwrap().transport(), "backup");
    }
    assert_eq!(primary.sends(), 2); // the breaker is open now
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(pool.send(&message()).await.unwrap().transport(), "backup");
    }
    assert_eq!(primary.sends(), 2, "20 s into a 30 s reset timeout");
    tokio::time::advance(Duration::from_secs(10)).await;
    primary.set_default(Reply::Ok);
    assert_eq!(pool.send(&message()).await.unwrap().transport(), "primary");
    assert_eq!(primary.sends(), 3, "the probe after the reset timeout");
    assert_eq!(backup.sends(), 12);
}

#[tokio::test(start_paused = true)]
async fn all_members_down_gives_pool_exhausted_whose_retry_after_is_the_smallest_of_theirs() {
    let (a, b) = (
        Scripted::answering("a", Reply::fail(Category::Timeout)),
        Scripted::answering("b", Reply::fail(Category::Timeout)),
    );
    let pool = PoolTransport::builder()
        .add(breaker(&a, Duration::from_secs(60)), 1)
        .add(breaker(&b, Duration::from_secs(20)), 2)
        .build()
        .unwrap();
    for _ in 0..2 {
        pool.send(&message()).await.unwrap_err();
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    let err = pool.send(&message()).await.unwrap_err();
    assert_eq!(err.code(), "pool.exhausted");
    assert_eq!(err.category(), Category::ServiceUnavailable);
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(15)));
    let codes: Vec<_> = err.causes().iter().map(SendError::code).collect();
    assert_eq!(codes, ["breaker.open", "breaker.open"]);
}

#[tokio::test(start_paused = true)]
async fn pool_exhausted_keeps_each_members_error_in_the_order_tried() {
    let a = Scripted::answering("a", Reply::fail(Category::Network));
    let b = Scripted::answering("b", Reply::fail(Category::RateLimited));
    let err = pool_of(&a, &b).send(&message()).await.unwrap_err();
    assert_eq!(err.code(), "pool.exhausted");
    let causes: Vec<_> = err
        .causes()
        .iter()
        .map(|cause| (cause.transport().unwrap_or_default(), cause.category()))
        .collect();
    assert_eq!(
        causes,
        [("a", Category::Network), ("b", Category::RateLimited)]
    );
    assert_eq!(err.transport(), Some("pool"));
}

#[tokio::test(start_paused = true)]
async fn pool_exhausted_gives_no_retry_after_when_a_member_gave_none() {
    let a = Scripted::answering(
        "a",
        Reply::Err(
            SendError::new(Category::ServiceUnavailable, "smtp.421", "busy")
                .with_retry_after(Duration::from_secs(9)),
        ),
    );
    let b = Scripted::answering("b", Reply::fail(Category::Network));
    let err = pool_of(&a, &b).send(&message()).await.unwrap_err();
    assert_eq!(err.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn send_many_keeps_the_batch_on_one_member() {
    let primary = Scripted::new("primary").batched();
    let backup = Scripted::new("backup").batched();
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(20)).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(primary.batches(), [20]);
    assert!(backup.batches().is_empty());
}

#[tokio::test(start_paused = true)]
async fn send_many_of_messages_that_come_slowly_is_one_batch_read_as_they_come() {
    let primary = Scripted::new("primary").batched();
    let backup = Scripted::new("backup").batched();
    let answers = send_slowly(&pool_of(&primary, &backup), 5).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(primary.batches(), [5], "one batch, not one per message");
}

/// Sends five messages through `pool` and checks that it had read at most two of them from
/// the caller when the first answer came: the one sent and the next.
async fn assert_reads_at_most_two_of_five_before_the_first_answer(pool: &PoolTransport) {
    let pulled = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&pulled);
    let messages = futures::stream::iter(numbered_messages(5)).inspect(move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    let mut answers = pool.send_many(messages.boxed());
    answers.next().await.expect("an answer").expect("delivered");
    let pulled = pulled.load(Ordering::Relaxed);
    assert!(
        pulled <= 2,
        "{pulled} of 5 messages read before the first was sent"
    );
}

#[tokio::test(start_paused = true)]
async fn send_many_reads_the_callers_messages_only_as_the_member_takes_them() {
    let member = Scripted::answering("p", Reply::after(Duration::from_secs(1), Reply::Ok));
    let pool = PoolTransport::builder().add(member, 1).build().unwrap();
    assert_reads_at_most_two_of_five_before_the_first_answer(&pool).await;
}

#[tokio::test(start_paused = true)]
async fn after_failing_over_send_many_reads_the_callers_messages_only_as_the_backup_takes_them() {
    let primary = Scripted::answering("primary", batch_failure(Category::Network));
    let backup = Scripted::answering("backup", Reply::after(Duration::from_secs(1), Reply::Ok));
    let pool = pool_of(&primary, &backup);
    assert_reads_at_most_two_of_five_before_the_first_answer(&pool).await;
}

#[tokio::test(start_paused = true)]
async fn the_last_members_batch_stays_open_while_a_member_before_it_may_still_fail_over() {
    let primary = Scripted::answering("primary", failure());
    let slow_failure = Reply::after(Duration::from_secs(1), failure());
    let secondary = Scripted::answering("secondary", slow_failure);
    let last = Scripted::new("last").batched();
    let pool = PoolTransport::builder()
        .add(primary.clone(), 1)
        .add(secondary.clone(), 2)
        .add(last.clone(), 3)
        .build()
        .unwrap();
    let answers = send_all(&pool, numbered_messages(3)).await;
    assert!(answers.iter().all(Result::is_ok));
    // The secondary fails one message a second; the last member's batch waits for them all,
    // also while the secondary works on the last one and has nothing more queued.
    assert_eq!(last.batches(), [3], "one batch, not one per failure");
}

#[tokio::test(start_paused = true)]
async fn send_many_resends_only_the_failed_messages_to_the_backup_in_one_batch() {
    let primary = Scripted::new("primary").batched();
    primary.then([
        Reply::Ok,
        Reply::fail(Category::ServerError),
        Reply::Ok,
        Reply::fail(Category::Timeout),
        Reply::Ok,
    ]);
    let backup = Scripted::new("backup").batched();
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(5)).await;
    assert_eq!(
        transports(&answers),
        ["primary", "backup", "primary", "backup", "primary"]
    );
    assert_eq!(backup.batches(), [2]);
    assert_eq!(backup.subjects(), subjects([1, 3]));
}

#[tokio::test(start_paused = true)]
async fn send_many_answers_in_message_order_when_the_backup_is_slower() {
    let primary = Scripted::new("primary");
    primary.then([Reply::fail(Category::Network), Reply::Ok, Reply::Ok]);
    let backup = Scripted::answering("backup", Reply::after(Duration::from_secs(5), Reply::Ok));
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(3)).await;
    assert_eq!(transports(&answers), ["backup", "primary", "primary"]);
}

#[tokio::test(start_paused = true)]
async fn send_many_returns_a_rejected_message_without_failover() {
    let primary = Scripted::new("primary").batched();
    primary.then([Reply::Ok, Reply::fail(Category::Rejected), Reply::Ok]);
    let backup = Scripted::new("backup").batched();
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(3)).await;
    assert_eq!(
        transports(&answers),
        ["primary", "error:test.rejected", "primary"]
    );
    assert_eq!(backup.sends(), 0);
}

#[tokio::test(start_paused = true)]
async fn send_many_hands_the_rest_of_a_failed_batch_to_the_backup() {
    let primary = Scripted::new("primary").batched();
    primary.then([Reply::Ok, Reply::Ok, batch_failure(Category::Network)]);
    let backup = Scripted::new("backup").batched();
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(6)).await;
    assert_eq!(
        transports(&answers),
        ["primary", "primary", "backup", "backup", "backup", "backup"]
    );
    assert_eq!(primary.sends(), 3, "the batch ended at its failure");
    assert_eq!(backup.batches(), [4]);
    assert_eq!(backup.subjects(), subjects(2..6));
}

#[tokio::test(start_paused = true)]
async fn send_many_answers_every_message_when_the_last_members_batch_fails() {
    let primary = Scripted::answering("primary", Reply::fail(Category::Network)).batched();
    let backup = Scripted::new("backup").batched();
    backup.then([Reply::Ok, batch_failure(Category::Network)]);
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(5)).await;
    assert_eq!(
        transports(&answers),
        [
            "backup",
            "error:pool.exhausted",
            "error:pool.exhausted",
            "error:pool.exhausted",
            "error:pool.exhausted"
        ]
    );
    for answer in &answers[1..] {
        let err = answer.as_ref().unwrap_err();
        assert!(!err.is_batch_failure(), "each message has its own answer");
        let codes: Vec<_> = err.causes().iter().map(SendError::code).collect();
        assert_eq!(codes, ["test.network", "test.batch"]);
    }
}

#[tokio::test(start_paused = true)]
async fn after_the_last_members_batch_failed_messages_that_come_slowly_are_still_answered() {
    // Each member's batch fails on its first message, before the next one comes.
    let primary = Scripted::answering("primary", batch_failure(Category::Network));
    let backup = Scripted::answering("backup", batch_failure(Category::Network));
    let answers = send_slowly(&pool_of(&primary, &backup), 3).await;
    assert_eq!(transports(&answers), ["error:pool.exhausted"; 3]);
}

#[tokio::test(start_paused = true)]
async fn send_many_answers_the_rest_of_a_batch_rejected_as_a_whole_with_that_error() {
    let primary = Scripted::new("primary").batched();
    primary.then([Reply::Ok, batch_failure(Category::Rejected)]);
    let backup = Scripted::new("backup").batched();
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(4)).await;
    assert_eq!(
        transports(&answers),
        [
            "primary",
            "error:test.batch",
            "error:test.batch",
            "error:test.batch"
        ]
    );
    assert_eq!(backup.sends(), 0);
}

#[tokio::test(start_paused = true)]
async fn send_many_gives_one_answer_per_message_when_every_member_fails() {
    let primary = Scripted::answering("primary", Reply::fail(Category::ServerError)).batched();
    let backup = Scripted::answering("backup", Reply::fail(Category::Timeout)).batched();
    let answers = send_all(&pool_of(&primary, &backup), numbered_messages(7)).await;
    assert_eq!(answers.len(), 7);
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_err_and(|e| e.code() == "pool.exhausted"))
    );
    assert_eq!((primary.batches(), backup.batches()), (vec![7], vec![7]));
}

#[tokio::test(start_paused = true)]
async fn send_many_of_nothing_answers_nothing() {
    let (primary, backup) = (Scripted::new("primary"), Scripted::new("backup"));
    let answers = send_all(&pool_of(&primary, &backup), Vec::new()).await;
    assert!(answers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn send_many_skips_the_primary_while_its_breaker_is_open() {
    let primary = Scripted::answering("primary", Reply::fail(Category::Network));
    let backup = Scripted::new("backup").batched();
    let pool = PoolTransport::builder()
        .add(breaker(&primary, Duration::from_secs(30)), 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let answers = send_all(&pool, numbered_messages(10)).await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|r| r.transport() == "backup"))
    );
    assert_eq!(primary.sends(), 2, "the breaker opened after two failures");
    assert_eq!(backup.batches(), [10]);
}

#[tokio::test(start_paused = true)]
async fn the_probe_brings_the_primary_back_after_its_reset_timeout() {
    let primary = Scripted::answering("primary", Reply::fail(Category::Network));
    let backup = Scripted::new("backup");
    let guarded = breaker(&primary, Duration::from_secs(30));
    let pool = PoolTransport::builder()
        .add(guarded, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    send_all(&pool, numbered_messages(3)).await;
    primary.set_default(Reply::Ok);
    tokio::time::advance(Duration::from_secs(30)).await;
    let answers = send_all(&pool, numbered_messages(3)).await;
    assert_eq!(transports(&answers), ["primary", "primary", "primary"]);
}

/// A member whose `verify` fails.
struct Unreachable(Scripted);

#[async_trait::async_trait]
impl Transport for Unreachable {
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.0.send_raw(envelope, raw).await
    }
    async fn verify(&self) -> Result<(), SendError> {
        Err(SendError::new(
            Category::Network,
            "test.refused",
            "connection refused",
        ))
    }
}

#[tokio::test(start_paused = true)]
async fn verify_is_ok_when_one_member_can_be_reached() {
    let pool = PoolTransport::builder()
        .add(Unreachable(Scripted::new("a")), 1)
        .add(Scripted::new("b"), 2)
        .build()
        .unwrap();
    pool.verify().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn verify_names_the_unreachable_members_when_none_can_be_reached() {
    let pool = PoolTransport::builder()
        .add(Unreachable(Scripted::new("relay-a")), 1)
        .add(Unreachable(Scripted::new("relay-b")), 2)
        .build()
        .unwrap();
    let err = pool.verify().await.unwrap_err();
    assert_eq!(err.code(), "pool.unreachable");
    assert!(err.message().contains("relay-a, relay-b"), "{err}");
    assert_eq!(err.causes().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn verify_each_lists_every_members_result() {
    let pool = PoolTransport::builder()
        .add(Unreachable(Scripted::new("a")), 1)
        .add(Scripted::new("b"), 2)
        .build()
        .unwrap();
    let results: Vec<_> = pool
        .verify_each()
        .await
        .into_iter()
        .map(|(name, result)| (name.to_owned(), result.is_ok()))
        .collect();
    assert_eq!(results, [("a".to_owned(), false), ("b".to_owned(), true)]);
}

#[tokio::test(start_paused = true)]
async fn the_pool_is_a_lettre_async_transport() {
    use lettre::AsyncTransport;
    let primary = Scripted::answering("primary", Reply::fail(Category::Timeout));
    let pool = pool_of(&primary, &Scripted::new("backup"));
    let receipt = AsyncTransport::send(&pool, message()).await.unwrap();
    assert_eq!(receipt.transport(), "backup");
    assert_eq!(pool.name(), "pool");
}

/// A member whose `send_many` reads `reads` messages (all when `None`) and ends its batch
/// without answering any.
struct Mute {
    reads: Option<usize>,
}

#[async_trait::async_trait]
impl Transport for Mute {
    fn name(&self) -> &str {
        "mute"
    }
    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        Ok(Receipt::new("mute"))
    }
    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        let reads = self.reads;
        futures::stream::once(async move {
            match reads {
                Some(count) => drop(messages.take(count).collect::<Vec<_>>().await),
                None => drop(messages.collect::<Vec<_>>().await),
            }
            futures::stream::empty()
        })
        .flatten()
        .boxed()
    }
}

#[tokio::test(start_paused = true)]
async fn messages_a_member_read_but_never_answered_fail_over() {
    let backup = Scripted::new("backup").batched();
    let pool = PoolTransport::builder()
        .add(Mute { reads: None }, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let answers = send_all(&pool, numbered_messages(4)).await;
    assert_eq!(transports(&answers), ["backup"; 4]);
    assert_eq!(backup.batches(), [4]);
}

#[tokio::test(start_paused = true)]
async fn a_member_that_ends_its_batch_without_reading_is_passed_over() {
    let backup = Scripted::new("backup");
    let pool = PoolTransport::builder()
        .add(Mute { reads: Some(0) }, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let answers = send_all(&pool, numbered_messages(3)).await;
    assert_eq!(transports(&answers), ["backup"; 3]);
}

// ---- at most once (issue 10) ----

/// A network error after SMTP's final dot: the member may hold the message.
fn maybe_delivered_network_error() -> Reply {
    Reply::Err(
        SendError::new(
            Category::Network,
            "smtp.network",
            "hung up after the final dot",
        )
        .maybe_delivered(),
    )
}

fn at_most_once_pool_of(primary: &Scripted, backup: &Scripted) -> PoolTransport {
    PoolTransport::builder()
        .add(primary.clone(), 1)
        .add(backup.clone(), 2)
        .at_most_once()
        .build()
        .expect("a pool with members")
}

#[tokio::test(start_paused = true)]
async fn at_most_once_returns_a_maybe_delivered_error_without_failing_over() {
    let primary = Scripted::answering("primary", maybe_delivered_network_error());
    let backup = Scripted::new("backup");

    let error = at_most_once_pool_of(&primary, &backup)
        .send(&message())
        .await
        .unwrap_err();

    assert_eq!(error.code(), "smtp.network");
    assert!(error.is_maybe_delivered());
    assert_eq!(error.transport(), Some("primary"));
    assert_eq!(backup.sends(), 0);
}

#[tokio::test(start_paused = true)]
async fn at_most_once_still_fails_over_an_error_that_was_surely_not_delivered() {
    let primary = Scripted::answering("primary", Reply::fail(Category::Network));
    let backup = Scripted::new("backup");

    let receipt = at_most_once_pool_of(&primary, &backup)
        .send(&message())
        .await
        .unwrap();

    assert_eq!(receipt.transport(), "backup");
}

#[tokio::test(start_paused = true)]
async fn by_default_a_maybe_delivered_error_fails_over_at_least_once() {
    let primary = Scripted::answering("primary", maybe_delivered_network_error());
    let backup = Scripted::new("backup");

    let receipt = pool_of(&primary, &backup).send(&message()).await.unwrap();

    assert_eq!(receipt.transport(), "backup");
}

#[tokio::test(start_paused = true)]
async fn at_most_once_keeps_a_maybe_delivered_message_of_a_batch_on_its_member() {
    let primary = Scripted::new("primary");
    primary.then([
        Reply::fail(Category::ServerError),
        maybe_delivered_network_error(),
        Reply::Ok,
    ]);
    let backup = Scripted::new("backup");

    let answers = send_all(
        &at_most_once_pool_of(&primary, &backup),
        numbered_messages(3),
    )
    .await;

    assert_eq!(
        transports(&answers),
        ["backup", "error:smtp.network", "primary"]
    );
    assert_eq!(backup.sends(), 1);
}

/// A member that hands its inner transport each batch as `reading` reads it.
struct Reading {
    inner: Scripted,
    reading: for<'a> fn(MessageStream<'a>) -> MessageStream<'a>,
}

#[async_trait::async_trait]
impl Transport for Reading {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.inner.send_raw(envelope, raw).await
    }
    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        self.inner.send_many((self.reading)(messages))
    }
}

/// Reads a batch as a pipelining transport may: each read is a future in a
/// `FuturesUnordered`, which polls it again only once its waker is woken.
fn only_when_woken(mut messages: MessageStream<'_>) -> MessageStream<'_> {
    futures::stream::once(async move {
        let mut batch = Vec::new();
        loop {
            let mut read = futures::stream::FuturesUnordered::new();
            read.push(messages.next());
            match read.next().await.flatten() {
                Some(message) => batch.push(message),
                None => break,
            }
        }
        futures::stream::iter(batch)
    })
    .flatten()
    .boxed()
}

/// Ends the batch after two messages.
fn two_at_a_time(messages: MessageStream<'_>) -> MessageStream<'_> {
    messages.take(2).boxed()
}

#[tokio::test(start_paused = true)]
async fn a_member_reading_only_when_woken_is_woken_for_each_message_and_the_end_of_its_batch() {
    let primary = Scripted::new("primary");
    let slow_ok = || Reply::after(Duration::from_secs(1), Reply::Ok);
    // The backup waits for a message while the primary sends one, and for the end of its
    // batch while the primary sends the last.
    primary.then([failure(), slow_ok(), failure(), slow_ok()]);
    let backup = Scripted::new("backup").batched();
    let pool = PoolTransport::builder()
        .add(primary.clone(), 1)
        .add(
            Reading {
                inner: backup.clone(),
                reading: only_when_woken,
            },
            2,
        )
        .build()
        .unwrap();
    let answers = tokio::time::timeout(
        Duration::from_secs(60),
        send_all(&pool, numbered_messages(4)),
    )
    .await
    .expect("every message answered, none left waiting for a wake");
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(backup.batches(), [2]);
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_batch_ends_after_reading_part_of_it_is_given_the_rest_in_new_batches() {
    let primary = Scripted::new("primary").batched();
    let backup = Scripted::new("backup").batched();
    let pool = PoolTransport::builder()
        .add(
            Reading {
                inner: primary.clone(),
                reading: two_at_a_time,
            },
            1,
        )
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let answers = send_all(&pool, numbered_messages(5)).await;
    assert_eq!(transports(&answers), ["primary"; 5]);
    assert_eq!(primary.batches(), [2, 2, 1]);
}

// ---- a panic is an answer (issue 45, point 3; DESIGN §15) ----

/// A member whose first `panics` sends panic, then delivers: a bug in a provider's code.
#[derive(Clone)]
struct Panicking {
    name: &'static str,
    panics: usize,
    sends: Arc<AtomicUsize>,
}

impl Panicking {
    fn new(name: &'static str, panics: usize) -> Self {
        Panicking {
            name,
            panics,
            sends: Arc::new(AtomicUsize::new(0)),
        }
    }
}

#[async_trait::async_trait]
impl Transport for Panicking {
    fn name(&self) -> &str {
        self.name
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        if self.sends.fetch_add(1, Ordering::SeqCst) < self.panics {
            panic!("a bug in the provider's code");
        }
        Ok(Receipt::new(self.name))
    }
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_send_panics_is_answered_transport_panicked_and_the_pool_fails_over() {
    let backup = Scripted::new("backup");
    let pool = PoolTransport::builder()
        .add(Panicking::new("primary", usize::MAX), 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();

    let receipt = pool.send(&message()).await.unwrap();

    assert_eq!(receipt.transport(), "backup");
    assert_eq!(backup.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_only_member_panicked_answers_with_transport_panicked_and_sends_on() {
    let pool = PoolTransport::builder()
        .add(Panicking::new("only", 1), 1)
        .build()
        .unwrap();

    let error = pool.send(&message()).await.unwrap_err();
    let causes: Vec<_> = error.causes().iter().map(SendError::code).collect();
    assert_eq!(causes, ["transport.panicked"]);
    assert_eq!(error.causes()[0].category(), Category::Configuration);
    assert_eq!(error.causes()[0].transport(), Some("only"));

    // A panic is about that one send (DESIGN §19): the member is asked at once for the next.
    let receipt = pool.send(&message()).await.unwrap();
    assert_eq!(receipt.transport(), "only");
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_batch_panics_hands_its_messages_to_the_next_member() {
    let backup = Scripted::new("backup");
    let pool = PoolTransport::builder()
        .add(Panicking::new("primary", 2), 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();

    let answers = send_all(&pool, numbered_messages(3)).await;

    assert_eq!(transports(&answers), ["backup"; 3]);
}

// ---- not attempted is not an answer (issue 45, point 10; DESIGN §15) ----

#[tokio::test(start_paused = true)]
async fn a_pool_whose_members_all_held_the_message_back_is_exhausted_without_an_attempt() {
    let primary = Scripted::answering("primary", failure());
    let backup = Scripted::answering("backup", failure());
    let pool = PoolTransport::builder()
        .add(breaker(&primary, Duration::from_secs(30)), 1)
        .add(breaker(&backup, Duration::from_secs(30)), 2)
        .build()
        .unwrap();
    for _ in 0..2 {
        let tried = pool.send(&message()).await.unwrap_err();
        assert_eq!(tried.code(), "pool.exhausted");
        assert!(!tried.is_not_attempted(), "both members failed for real");
    }

    let held = pool.send(&message()).await.unwrap_err();

    assert_eq!(held.code(), "pool.exhausted");
    assert!(held.is_not_attempted());
    assert_eq!((primary.sends(), backup.sends()), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn a_pool_in_which_one_member_sent_is_exhausted_with_an_attempt() {
    let primary = Scripted::answering("primary", failure());
    let backup = Scripted::answering("backup", failure());
    let pool = PoolTransport::builder()
        .add(breaker(&primary, Duration::from_secs(30)), 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let _ = pool.send(&message()).await;
    let _ = pool.send(&message()).await; // the primary's breaker opens

    let error = pool.send(&message()).await.unwrap_err();

    assert_eq!(error.causes()[0].code(), "breaker.open");
    assert!(!error.is_not_attempted());
}

#[tokio::test(start_paused = true)]
async fn a_batch_whose_members_all_held_it_back_is_exhausted_without_an_attempt() {
    let primary = Scripted::answering("primary", failure());
    let backup = Scripted::answering("backup", failure());
    let pool = PoolTransport::builder()
        .add(breaker(&primary, Duration::from_secs(30)), 1)
        .add(breaker(&backup, Duration::from_secs(30)), 2)
        .build()
        .unwrap();
    let _ = send_all(&pool, numbered_messages(2)).await; // both breakers open

    let answers = send_all(&pool, numbered_messages(2)).await;

    for answer in answers {
        let error = answer.unwrap_err();
        assert_eq!(error.code(), "pool.exhausted");
        assert!(error.is_not_attempted());
    }
}

// ---- a member that cannot work is skipped (issue 46, point 8; DESIGN §15) ----

fn refusing(category: Category) -> Reply {
    Reply::Err(SendError::new(
        category,
        "test.cannot_work",
        "credentials refused",
    ))
}

#[tokio::test(start_paused = true)]
async fn a_member_that_answered_authentication_is_skipped_for_sixty_seconds() {
    let primary = Scripted::answering("primary", refusing(Category::Authentication));
    let backup = Scripted::new("backup");
    let pool = pool_of(&primary, &backup);

    for _ in 0..3 {
        let receipt = pool.send(&message()).await.unwrap();
        assert_eq!(receipt.transport(), "backup");
    }
    assert_eq!(primary.sends(), 1, "asked once, then passed over");

    tokio::time::advance(Duration::from_secs(59)).await;
    pool.send(&message()).await.unwrap();
    assert_eq!(primary.sends(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    pool.send(&message()).await.unwrap();
    assert_eq!(primary.sends(), 2, "asked again once the 60 s have passed");
}

#[tokio::test(start_paused = true)]
async fn a_member_that_answered_configuration_is_skipped_too() {
    let primary = Scripted::answering("primary", refusing(Category::Configuration));
    let backup = Scripted::new("backup");
    let pool = pool_of(&primary, &backup);

    pool.send(&message()).await.unwrap();
    pool.send(&message()).await.unwrap();

    assert_eq!(primary.sends(), 1);
    assert_eq!(backup.sends(), 2);
}

// ---- a failure about the message keeps the member (issue 62, point 5; DESIGN §19) ----

#[tokio::test(start_paused = true)]
async fn a_member_whose_failure_was_about_the_message_fails_it_over_and_is_asked_for_the_next() {
    for category in [Category::Configuration, Category::Authentication] {
        let unverified = SendError::new(category, "test.unverified_sender", "sender not verified")
            .about_the_message();
        let primary = Scripted::answering("primary", Reply::Err(unverified));
        let backup = Scripted::new("backup");
        let pool = pool_of(&primary, &backup);

        let first = pool.send(&message()).await.unwrap();
        pool.send(&message()).await.unwrap();

        assert_eq!(first.transport(), "backup", "{category:?}: failed over");
        assert_eq!(primary.sends(), 2, "{category:?}: asked again for the next");
    }
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_send_panicked_is_asked_again_for_the_next_message() {
    let panicking = Panicking::new("primary", 1);
    let backup = Scripted::new("backup");
    let pool = PoolTransport::builder()
        .add(panicking, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();

    assert_eq!(pool.send(&message()).await.unwrap().transport(), "backup");
    assert_eq!(pool.send(&message()).await.unwrap().transport(), "primary");
    assert_eq!(backup.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_member_that_failed_otherwise_is_asked_again_at_once() {
    let primary = Scripted::answering("primary", failure());
    let backup = Scripted::new("backup");
    let pool = pool_of(&primary, &backup);

    pool.send(&message()).await.unwrap();
    pool.send(&message()).await.unwrap();

    assert_eq!(primary.sends(), 2);
}

#[tokio::test(start_paused = true)]
async fn skipping_a_member_does_not_open_its_breaker() {
    let primary = Scripted::answering("primary", refusing(Category::Authentication));
    let changes = Arc::new(AtomicUsize::new(0));
    let heard = Arc::clone(&changes);
    let guarded = CircuitBreakerTransport::builder(primary.clone())
        .failure_threshold(1)
        .on_state_change(move |_| {
            heard.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let pool = PoolTransport::builder()
        .add(guarded, 1)
        .add(Scripted::new("backup"), 2)
        .build()
        .unwrap();

    for _ in 0..5 {
        pool.send(&message()).await.unwrap();
    }

    assert_eq!(primary.sends(), 1, "the pool passes it over");
    assert_eq!(
        changes.load(Ordering::SeqCst),
        0,
        "its breaker never changed state"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_every_member_is_skipped_is_exhausted_without_an_attempt_until_the_first_comes_back()
 {
    let primary = Scripted::answering("primary", refusing(Category::Authentication));
    let backup = Scripted::answering("backup", refusing(Category::Configuration));
    let pool = pool_of(&primary, &backup);
    let _ = pool.send(&message()).await;
    tokio::time::advance(Duration::from_secs(10)).await;

    let error = pool.send(&message()).await.unwrap_err();

    assert_eq!(error.code(), "pool.exhausted");
    assert!(error.is_not_attempted());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(50)));
    let causes: Vec<_> = error.causes().iter().map(SendError::code).collect();
    assert_eq!(causes, ["pool.skipped", "pool.skipped"]);
    assert_eq!(error.causes()[0].category(), Category::Authentication);
    assert_eq!(error.causes()[0].transport(), Some("primary"));
    assert_eq!((primary.sends(), backup.sends()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn send_many_passes_over_a_skipped_member() {
    let primary = Scripted::answering("primary", refusing(Category::Authentication)).batched();
    let backup = Scripted::new("backup").batched();
    let pool = pool_of(&primary, &backup);
    let _ = pool.send(&message()).await;

    let answers = send_all(&pool, numbered_messages(3)).await;

    assert_eq!(transports(&answers), ["backup"; 3]);
    assert_eq!(primary.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_batch_answered_authentication_is_skipped_by_the_next_send() {
    let primary = Scripted::answering("primary", refusing(Category::Authentication)).batched();
    let backup = Scripted::new("backup");
    let pool = pool_of(&primary, &backup);
    let _ = send_all(&pool, numbered_messages(2)).await;
    let sent_before = primary.sends();

    pool.send(&message()).await.unwrap();

    assert_eq!(primary.sends(), sent_before);
}
