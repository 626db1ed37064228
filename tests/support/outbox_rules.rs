//! The outbox's rules as checks any backend must pass: `tests/outbox_sqlite.rs` runs them on
//! an SQLite file, `tests/outbox_postgres.rs` on a PostgreSQL server, through
//! [`outbox_rules!`](crate::outbox_rules).

use std::time::Duration;

use mail_breaker::outbox::{Outbox, OutboxTransport};
use mail_breaker::{Category, CircuitBreakerTransport, SendError, Transport};

use super::numbered_messages;
use super::scripted::{Reply, Scripted};

/// A worker's backoff short enough for tests that wait for a retry.
fn quick(outbox: &Outbox, transport: Scripted) -> mail_breaker::outbox::Worker<Scripted> {
    outbox
        .worker(transport)
        .backoff(mail_breaker::Backoff::constant(Duration::from_millis(50)))
        .poll(Duration::from_millis(50))
}

/// A worker running in the background until it is stopped, as an application runs one.
pub struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), SendError>>,
}

impl Running {
    /// Spawns `worker.run`, its shutdown the `stop` below.
    pub fn start<T: Transport + 'static>(worker: mail_breaker::outbox::Worker<T>) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task =
            tokio::spawn(async move { worker.run(async { stopped.await.unwrap_or(()) }).await });
        Running { stop, task }
    }

    /// Shuts the worker down and checks that `run` ended with `Ok`.
    pub async fn stop(self) {
        self.stop.send(()).expect("the worker still running");
        self.task
            .await
            .expect("the worker's task")
            .expect("run ended with Ok");
    }
}

pub async fn drain_sends_every_queued_message_once_and_empties_the_outbox(outbox: Outbox) {
    outbox.enqueue_many(&numbered_messages(40)).await.unwrap();
    let provider = Scripted::new("provider");
    quick(&outbox, provider.clone())
        .concurrency(4)
        .drain()
        .await
        .unwrap();
    let mut subjects = provider.subjects();
    subjects.sort();
    subjects.dedup();
    assert_eq!(subjects.len(), 40);
    assert_eq!(provider.sends(), 40);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead, stats.oldest), (0, 0, None));
}

pub async fn a_worker_idle_for_its_poll_wakes_at_once_for_mail_enqueued_through_its_outbox(
    outbox: Outbox,
) {
    let provider = Scripted::new("provider");
    let worker = outbox
        .worker(provider.clone())
        .poll(Duration::from_secs(3_600));
    let running = Running::start(worker);
    tokio::time::sleep(Duration::from_millis(100)).await; // idle, waiting an hour
    outbox.enqueue(&super::message()).await.unwrap();
    for _ in 0..100 {
        if provider.sends() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        provider.sends(),
        1,
        "woken by the enqueue, not the hourly poll"
    );
    running.stop().await;
}

pub async fn a_worker_idle_for_its_poll_wakes_at_once_for_the_recipients_send_or_queue_kept(
    outbox: Outbox,
) {
    let provider = PartlyDelivering::default();
    let worker = outbox
        .worker(provider.clone())
        .poll(Duration::from_secs(3_600));
    let running = Running::start(worker);
    tokio::time::sleep(Duration::from_millis(100)).await; // idle, waiting an hour
    let receipt = OutboxTransport::send_or_queue(outbox.clone(), provider.clone())
        .send(&partly(&["later"]))
        .await
        .unwrap();
    assert_eq!(receipt.deferred_recipients().len(), 1);
    let sent_again = || provider.envelopes.lock().unwrap().len() == 2;
    for _ in 0..100 {
        if sent_again() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        sent_again(),
        "woken by what send_or_queue kept, not the hourly poll"
    );
    running.stop().await;
}

pub async fn a_rejected_message_is_dead_at_once_with_its_error(outbox: Outbox) {
    let id = outbox.enqueue(&super::message()).await.unwrap();
    let provider = Scripted::answering("provider", Reply::fail(Category::Rejected));
    quick(&outbox, provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 1, "a rejection is never tried again");
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    assert_eq!(dead[0].error.category(), Category::Rejected);
    assert_eq!(dead[0].error.code(), "test.rejected");
    assert_eq!(dead[0].error.transport(), Some("provider"));
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(dead[0].envelope.to()[0].to_string(), "user@example.org");
    let since = std::time::SystemTime::now()
        .duration_since(dead[0].at)
        .unwrap();
    assert!(since < Duration::from_secs(60), "dead {since:?} ago");
    assert_eq!(i64::from(dead[0].id), i64::from(id));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 1));
}

pub async fn sent_here_counts_the_deliveries_of_this_outbox_s_workers_and_its_clones_share_it(
    outbox: Outbox,
) {
    let clone = outbox.clone();
    outbox.enqueue_many(&numbered_messages(4)).await.unwrap();
    let provider = Scripted::new("provider");
    provider.then([Reply::fail(Category::Rejected)]);
    quick(&clone, provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 4);
    assert_eq!(
        (outbox.sent_here(), clone.sent_here()),
        (3, 3),
        "the rejected one was not delivered"
    );
}

pub async fn message_reads_a_queued_message_and_a_dead_letter_as_the_outbox_holds_them(
    outbox: Outbox,
) {
    let id = outbox.enqueue(&super::message()).await.unwrap();
    let queued = outbox.message(id).await.unwrap().expect("queued");
    assert_eq!(queued.id, id);
    assert_eq!(queued.envelope.to()[0].to_string(), "user@example.org");
    assert_eq!(queued.subject().as_deref(), Some("test"));
    assert_eq!((queued.attempts, queued.leased), (0, false));
    assert!(!queued.is_dead() && queued.error.is_none());
    let provider = Scripted::answering("provider", Reply::fail(Category::Rejected));
    quick(&outbox, provider).drain().await.unwrap();
    let dead = outbox.message(id).await.unwrap().expect("dead, kept");
    assert!(dead.is_dead());
    assert_eq!(dead.attempts, 1);
    assert_eq!(
        dead.error.map(|error| error.code().to_owned()).as_deref(),
        Some("test.rejected")
    );
    assert_eq!(dead.raw, queued.raw);
    assert!(outbox.purge(id).await.unwrap());
    assert!(outbox.message(id).await.unwrap().is_none(), "purged");
}

/// Issue 45, point 6: a requeued dead letter starts afresh, its attempts counted anew.
pub async fn requeue_sends_a_dead_letter_again_with_a_fresh_attempt_count(outbox: Outbox) {
    let id = outbox.enqueue(&super::message()).await.unwrap();
    let provider = Scripted::answering("provider", Reply::fail(Category::Rejected));
    quick(&outbox, provider.clone()).drain().await.unwrap();
    assert!(outbox.requeue(id).await.unwrap());
    assert!(
        !outbox.requeue(id).await.unwrap(),
        "only a dead letter is requeued"
    );
    quick(&outbox, provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 2);
    assert_eq!(outbox.dead_letters(10).await.unwrap()[0].attempts, 1);
    provider.set_default(Reply::Ok);
    assert!(outbox.requeue(id).await.unwrap());
    quick(&outbox, provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 3);
    assert_eq!(outbox.stats().await.unwrap().dead, 0);
}

/// Issue 45, point 6: `max_age` counts from the requeue, not from the first enqueue.
pub async fn a_requeued_dead_letter_is_tried_until_max_age_from_its_requeue(outbox: Outbox) {
    let id = outbox.enqueue(&super::message()).await.unwrap();
    let max_age = Duration::from_millis(300);
    let refusing = Scripted::answering("provider", Reply::fail(Category::Rejected));
    quick(&outbox, refusing)
        .max_age(max_age)
        .drain()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // older than max_age now
    assert!(outbox.requeue(id).await.unwrap());
    let down = Scripted::answering("provider", Reply::fail(Category::Timeout));
    quick(&outbox, down.clone())
        .max_age(max_age)
        .backoff(mail_breaker::Backoff::constant(Duration::from_secs(3_600)))
        .drain()
        .await
        .unwrap();
    assert_eq!(down.sends(), 1);
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.dead),
        (1, 0),
        "retried, not expired: {stats:?}"
    );
}

pub async fn a_failure_that_may_pass_is_not_due_before_its_retry_after(outbox: Outbox) {
    outbox.enqueue(&super::message()).await.unwrap();
    let open = SendError::new(Category::ServiceUnavailable, "test.down", "down")
        .with_retry_after(Duration::from_secs(3_600));
    let provider = Scripted::answering("provider", Reply::Err(open));
    quick(&outbox, provider.clone()).drain().await.unwrap();
    quick(&outbox, provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 1, "not due again for an hour");
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.due, stats.leased, stats.dead),
        (1, 0, 0, 0)
    );
}

/// The backoff of the two tests below, which wait it out. Their checks hold however slow the
/// machine: what they see before the backoff has passed is checked only while it has not.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Drains through `transport` with a backoff of `RETRY_BACKOFF`, then checks `before_retry`
/// with the stats read after it, if the backoff cannot have run out by then (5 ms to spare
/// for due times kept in whole milliseconds); then waits the backoff out and drains again.
async fn drain_across_the_backoff<T: Transport + 'static>(
    outbox: &Outbox,
    transport: T,
    before_retry: impl FnOnce(mail_breaker::outbox::OutboxStats),
) {
    let worker = outbox
        .worker(transport)
        .backoff(mail_breaker::Backoff::constant(RETRY_BACKOFF));
    let started = std::time::Instant::now();
    worker.drain().await.unwrap();
    let answered = std::time::Instant::now();
    let stats = outbox.stats().await.unwrap();
    if started.elapsed() + Duration::from_millis(5) < RETRY_BACKOFF {
        before_retry(stats);
    }
    tokio::time::sleep_until((answered + RETRY_BACKOFF).into()).await;
    worker.drain().await.unwrap();
}

pub async fn a_failure_that_may_pass_is_sent_again_after_the_backoff(outbox: Outbox) {
    outbox.enqueue(&super::message()).await.unwrap();
    let provider = Scripted::new("provider");
    provider.then([Reply::fail(Category::Timeout)]);
    drain_across_the_backoff(&outbox, provider.clone(), |stats| {
        assert_eq!((provider.sends(), stats.queued), (1, 1), "kept for a retry");
    })
    .await;
    assert_eq!(provider.sends(), 2);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// Delivers to every recipient but `later@example.org`, which it defers once; records each
/// envelope's recipients.
#[derive(Clone, Default)]
struct Greylisting {
    envelopes: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
}

#[async_trait::async_trait]
impl Transport for Greylisting {
    fn name(&self) -> &str {
        "greylisting"
    }

    async fn send_raw(
        &self,
        envelope: &mail_breaker::Envelope,
        _raw: &[u8],
    ) -> Result<mail_breaker::Receipt, SendError> {
        let to: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
        let first_time = {
            let mut envelopes = self.envelopes.lock().unwrap();
            envelopes.push(to.clone());
            envelopes.len() == 1
        };
        let mut receipt = mail_breaker::Receipt::new("greylisting");
        if first_time {
            let later = SendError::new(Category::ServerError, "smtp.450", "450 greylisted");
            receipt = receipt.with_deferred_recipient("later@example.org".parse().unwrap(), later);
        }
        Ok(receipt)
    }
}

/// On its first send, delivers to `now@` and answers each other recipient by its local part:
/// `later@` deferred (450), `maybe@` maybe delivered (no reply after the data), `refused@`
/// rejected (550); every later send delivers to all. Keeps each envelope it was handed.
#[derive(Clone, Default)]
struct PartlyDelivering {
    envelopes: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
}

#[async_trait::async_trait]
impl Transport for PartlyDelivering {
    fn name(&self) -> &str {
        "partly"
    }

    async fn send_raw(
        &self,
        envelope: &mail_breaker::Envelope,
        _raw: &[u8],
    ) -> Result<mail_breaker::Receipt, SendError> {
        let to: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
        let first_time = {
            let mut envelopes = self.envelopes.lock().unwrap();
            envelopes.push(to.clone());
            envelopes.len() == 1
        };
        let mut receipt = mail_breaker::Receipt::new("partly");
        if !first_time {
            return Ok(receipt);
        }
        for address in envelope.to() {
            let address = address.clone();
            receipt = match address.user() {
                "later" => receipt.with_deferred_recipient(
                    address,
                    SendError::new(Category::ServerError, "smtp.450", "450 greylisted"),
                ),
                "maybe" => receipt.with_maybe_delivered_recipient(
                    address,
                    SendError::new(Category::Timeout, "smtp.timeout", "no reply after the dot"),
                ),
                "refused" => receipt.with_rejected_recipient(
                    address,
                    SendError::new(Category::Rejected, "smtp.550", "550 no such user"),
                ),
                _ => receipt,
            };
        }
        Ok(receipt)
    }
}

/// A worker that sends a failed message again at once, so that one drain sees it twice.
fn at_once(
    outbox: &Outbox,
    provider: PartlyDelivering,
) -> mail_breaker::outbox::Worker<PartlyDelivering> {
    outbox
        .worker(provider)
        .backoff(mail_breaker::Backoff::constant(Duration::ZERO))
}

/// A message to `now@`, and to each of `others` at example.org.
fn partly(others: &[&str]) -> mail_breaker::Message {
    let mut builder = mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("now@example.org".parse().unwrap());
    for other in others {
        builder = builder.to(format!("{other}@example.org").parse().unwrap());
    }
    builder.body(String::from("hello")).unwrap()
}

/// The dead letters, each as its recipients and its error's code, in id order.
async fn dead_by_recipients(outbox: &Outbox) -> Vec<(Vec<String>, String)> {
    let mut dead = outbox.dead_letters(100).await.unwrap();
    dead.sort_by_key(|letter| letter.id.to_string().parse::<i64>().unwrap_or_default());
    dead.into_iter()
        .map(|letter| {
            let to = letter
                .envelope
                .to()
                .iter()
                .map(ToString::to_string)
                .collect();
            (to, letter.error.code().to_owned())
        })
        .collect()
}

/// Issue 62, point 3: a recipient with no answer after the data is sent again, alone, by an
/// at-least-once worker; a recipient refused beside delivered ones leaves a dead letter of
/// its own, never written off as sent.
pub async fn a_partial_delivery_sends_again_the_maybe_delivered_and_deferred_and_buries_the_refused(
    outbox: Outbox,
) {
    outbox
        .enqueue(&partly(&["later", "maybe", "refused"]))
        .await
        .unwrap();
    let provider = PartlyDelivering::default();
    at_once(&outbox, provider.clone()).drain().await.unwrap();
    let envelopes = provider.envelopes.lock().unwrap().clone();
    assert_eq!(envelopes.len(), 2, "{envelopes:?}");
    assert_eq!(
        envelopes[1],
        ["later@example.org", "maybe@example.org"],
        "sent again to the owed alone"
    );
    assert_eq!(
        dead_by_recipients(&outbox).await,
        [(
            vec!["refused@example.org".to_owned()],
            "smtp.550".to_owned()
        )]
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// Issue 62, point 3, at most once: the maybe-delivered recipient is a dead letter of its own
/// (`outbox.maybe_delivered`), never sent again; the deferred one is; the refused one is dead.
pub async fn under_at_most_once_a_maybe_delivered_recipient_is_a_dead_letter_of_its_own(
    outbox: Outbox,
) {
    outbox
        .enqueue(&partly(&["later", "maybe", "refused"]))
        .await
        .unwrap();
    let provider = PartlyDelivering::default();
    at_once(&outbox, provider.clone())
        .at_most_once()
        .drain()
        .await
        .unwrap();
    let envelopes = provider.envelopes.lock().unwrap().clone();
    assert_eq!(envelopes.len(), 2, "{envelopes:?}");
    assert_eq!(envelopes[1], ["later@example.org"]);
    assert_eq!(
        dead_by_recipients(&outbox).await,
        [
            (
                vec!["refused@example.org".to_owned()],
                "smtp.550".to_owned()
            ),
            (
                vec!["maybe@example.org".to_owned()],
                "outbox.maybe_delivered".to_owned()
            ),
        ]
    );
}

/// Issue 62, point 3: nothing owed but recipients of their own fates: the message's row is
/// the first dead letter, and the second is a copy beside it.
pub async fn a_delivery_that_refused_one_and_may_have_reached_another_leaves_two_dead_letters_under_at_most_once(
    outbox: Outbox,
) {
    outbox
        .enqueue(&partly(&["maybe", "refused"]))
        .await
        .unwrap();
    let provider = PartlyDelivering::default();
    outbox
        .worker(provider.clone())
        .at_most_once()
        .drain()
        .await
        .unwrap();
    assert_eq!(provider.envelopes.lock().unwrap().len(), 1);
    let dead = dead_by_recipients(&outbox).await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 2), "{stats:?}");
}

/// Issue 62, point 3, for `send_or_queue`: the same truths as the worker keeps.
pub async fn send_or_queue_keeps_every_recipients_truth_of_a_partial_delivery(outbox: Outbox) {
    for at_most_once in [false, true] {
        let provider = PartlyDelivering::default();
        let mut transport = OutboxTransport::send_or_queue(outbox.clone(), provider.clone());
        if at_most_once {
            transport = transport.at_most_once();
        }
        let receipt = transport
            .send(&partly(&["later", "maybe", "refused"]))
            .await
            .unwrap();
        assert!(!receipt.is_queued(), "delivered to now@");
        outbox.worker(provider.clone()).drain().await.unwrap();
        let envelopes = provider.envelopes.lock().unwrap().clone();
        let again: &[&str] = if at_most_once {
            &["later@example.org"]
        } else {
            &["later@example.org", "maybe@example.org"]
        };
        assert_eq!(envelopes[1..], [again], "at_most_once={at_most_once}");
    }
    let dead = dead_by_recipients(&outbox).await;
    let codes: Vec<(&str, &str)> = dead
        .iter()
        .map(|(to, code)| (to[0].as_str(), code.as_str()))
        .collect();
    assert_eq!(
        codes,
        [
            ("refused@example.org", "smtp.550"),
            ("refused@example.org", "smtp.550"),
            ("maybe@example.org", "outbox.maybe_delivered"),
        ]
    );
}

pub async fn a_delivery_deferred_for_some_recipients_stays_queued_for_them_only(outbox: Outbox) {
    let message = mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("now@example.org".parse().unwrap())
        .to("later@example.org".parse().unwrap())
        .body(String::from("hello"))
        .unwrap();
    outbox.enqueue(&message).await.unwrap();
    let provider = Greylisting::default();
    drain_across_the_backoff(&outbox, provider.clone(), |stats| {
        assert_eq!(
            (stats.queued, stats.due),
            (1, 0),
            "kept for the deferred recipient, not due before the backoff"
        );
    })
    .await;
    let envelopes = provider.envelopes.lock().unwrap().clone();
    assert_eq!(
        envelopes,
        [
            vec!["now@example.org".to_owned(), "later@example.org".to_owned()],
            vec!["later@example.org".to_owned()],
        ]
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn drain_sends_again_a_failed_message_that_is_due_again_at_once(outbox: Outbox) {
    outbox.enqueue(&super::message()).await.unwrap();
    let provider = Scripted::new("provider");
    provider.then([Reply::fail(Category::Timeout)]);
    let worker = outbox
        .worker(provider.clone())
        .backoff(mail_breaker::Backoff::constant(Duration::ZERO));
    worker.drain().await.unwrap();
    assert_eq!(
        provider.sends(),
        2,
        "due again at once, so still due for the drain"
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn a_maybe_delivered_failure_is_dead_under_at_most_once(outbox: Outbox) {
    outbox.enqueue(&super::message()).await.unwrap();
    let lost = SendError::new(
        Category::Timeout,
        "test.after_dot",
        "no reply after the dot",
    )
    .maybe_delivered();
    let provider = Scripted::answering("provider", Reply::Err(lost));
    quick(&outbox, provider.clone())
        .at_most_once()
        .drain()
        .await
        .unwrap();
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error.code(), "outbox.maybe_delivered");
    assert_eq!(dead[0].error.category(), Category::Timeout);
    assert_eq!(provider.sends(), 1);
}

/// A worker that holds one message and never answers, until its lease of 200 ms runs out.
async fn lose_a_lease(outbox: &Outbox) {
    lose_leases(outbox, 1).await;
}

/// A worker that sends `count` messages at once and never answers, until their leases of
/// 200 ms run out.
async fn lose_leases(outbox: &Outbox, count: usize) {
    outbox
        .enqueue_many(&numbered_messages(count))
        .await
        .unwrap();
    let hung = Scripted::answering("hung", Reply::Hang);
    let worker = quick(outbox, hung.clone())
        .concurrency(count)
        .lease(Duration::from_millis(200));
    let held = tokio::spawn(async move { worker.drain().await });
    while hung.sends() < count {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(outbox.stats().await.unwrap().leased, count as u64);
    held.abort(); // the worker dies mid-send
    tokio::time::sleep(Duration::from_millis(250)).await;
}

pub async fn a_message_whose_lease_ran_out_is_sent_again(outbox: Outbox) {
    lose_a_lease(&outbox).await;
    let provider = Scripted::new("provider");
    quick(&outbox, provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 1);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// A worker at rest sleeps until the soonest time anything may be claimed, however long its
/// poll: here the end of a dead worker's lease, before a message due again in an hour.
pub async fn a_worker_at_rest_wakes_when_a_lease_it_waits_for_runs_out(outbox: Outbox) {
    let down = SendError::new(Category::ServiceUnavailable, "test.down", "down")
        .with_retry_after(Duration::from_secs(3_600));
    outbox.enqueue(&super::message()).await.unwrap();
    quick(&outbox, Scripted::answering("down", Reply::Err(down)))
        .drain()
        .await
        .unwrap();
    outbox.enqueue(&super::message()).await.unwrap();
    let hung = Scripted::answering("hung", Reply::Hang);
    let dying = quick(&outbox, hung.clone()).lease(Duration::from_millis(600));
    let held = tokio::spawn(async move { dying.drain().await });
    while hung.sends() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.abort(); // the worker dies mid-send
    let provider = Scripted::new("provider");
    let worker = outbox
        .worker(provider.clone())
        .poll(Duration::from_secs(3_600));
    let running = Running::start(worker);
    for _ in 0..150 {
        if provider.sends() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.stop().await;
    assert_eq!(
        provider.sends(),
        1,
        "woken when the lease ran out, not at the hourly poll"
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.leased),
        (1, 0),
        "the one due in an hour"
    );
}

pub async fn a_message_whose_lease_ran_out_is_dead_under_at_most_once(outbox: Outbox) {
    lose_a_lease(&outbox).await;
    let provider = Scripted::new("provider");
    quick(&outbox, provider.clone())
        .at_most_once()
        .drain()
        .await
        .unwrap();
    assert_eq!(provider.sends(), 0, "never sent again");
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead[0].error.code(), "outbox.maybe_delivered");
}

pub async fn drain_ends_only_once_every_message_whose_lease_ran_out_is_dead_under_at_most_once(
    outbox: Outbox,
) {
    lose_leases(&outbox, 3).await;
    let provider = Scripted::new("provider");
    quick(&outbox, provider.clone())
        .at_most_once()
        .concurrency(1)
        .drain()
        .await
        .unwrap();
    assert_eq!(provider.sends(), 0, "none sent again");
    assert_eq!(outbox.dead_letters(10).await.unwrap().len(), 3);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// How many messages a worker with `concurrency` 2 holds while its sends hang.
async fn held_while_sending(outbox: &Outbox, at_most_once: bool) -> u64 {
    outbox.enqueue_many(&numbered_messages(30)).await.unwrap();
    let hung = Scripted::answering("hung", Reply::Hang);
    let mut worker = quick(outbox, hung.clone()).concurrency(2);
    if at_most_once {
        worker = worker.at_most_once();
    }
    let held = tokio::spawn(async move { worker.drain().await });
    while hung.sends() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let leased = outbox.stats().await.unwrap().leased;
    held.abort();
    assert_eq!(hung.sends(), 2, "two sends in flight");
    leased
}

pub async fn a_worker_claims_ahead_four_times_what_it_sends_so_that_one_claim_serves_several(
    outbox: Outbox,
) {
    assert_eq!(held_while_sending(&outbox, false).await, 2 + 8);
}

pub async fn under_at_most_once_a_worker_holds_only_what_it_sends(outbox: Outbox) {
    assert_eq!(held_while_sending(&outbox, true).await, 2);
}

pub async fn a_held_message_is_not_claimed_by_another_worker(outbox: Outbox) {
    outbox.enqueue(&super::message()).await.unwrap();
    let slow = Scripted::answering("slow", Reply::after(Duration::from_millis(300), Reply::Ok));
    let first = quick(&outbox, slow.clone());
    let held = tokio::spawn(async move { first.drain().await });
    while slow.sends() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let other = Scripted::new("other");
    quick(&outbox, other.clone()).drain().await.unwrap();
    assert_eq!(other.sends(), 0);
    held.await.unwrap().unwrap();
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn two_workers_never_send_one_message_twice(outbox: Outbox) {
    outbox.enqueue_many(&numbered_messages(200)).await.unwrap();
    let provider = Scripted::answering(
        "provider",
        Reply::after(Duration::from_millis(1), Reply::Ok),
    );
    let a = quick(&outbox, provider.clone()).concurrency(4);
    let b = quick(&outbox, provider.clone()).concurrency(4);
    let (a, b) = tokio::join!(a.drain(), b.drain());
    a.unwrap();
    b.unwrap();
    let mut subjects = provider.subjects();
    assert_eq!(subjects.len(), 200);
    subjects.sort();
    subjects.dedup();
    assert_eq!(subjects.len(), 200);
}

pub async fn the_worker_tries_nothing_while_the_breaker_is_open_and_drains_after_the_probe(
    outbox: Outbox,
) {
    outbox.enqueue_many(&numbered_messages(30)).await.unwrap();
    let provider = Scripted::answering("provider", Reply::fail(Category::Network));
    let breaker = CircuitBreakerTransport::builder(provider.clone())
        .failure_threshold(2)
        .reset_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let worker = outbox
        .worker(breaker)
        .concurrency(4)
        .backoff(mail_breaker::Backoff::constant(Duration::from_millis(1)))
        .poll(Duration::from_millis(20));
    let running = Running::start(worker);
    // The first sends fail (4 at once) and the breaker opens after 2 failures; the worker
    // then hands back what it claimed. On a loaded machine that may take a while: wait for
    // it (issue 51: a fixed second here failed about once in 15 runs of the binary beside
    // two mutation-testing runs, the first claim of 20 not yet answered).
    let mut waited = Duration::ZERO;
    while provider.sends() < 2 || outbox.stats().await.unwrap().leased > 1 {
        assert!(
            waited < Duration::from_secs(10),
            "the breaker never opened, or the worker kept what it held: {:?}",
            outbox.stats().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    let opened = provider.sends();
    // 1 s of a provider down, the breaker letting a probe through every 300 ms at most.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let while_down = provider.sends();
    assert!(
        while_down - opened <= 4,
        "one probe per open period of 300 ms: {} tries in 1 s",
        while_down - opened
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.queued, 30);
    assert!(
        stats.leased <= 1,
        "nothing held but a probe while the breaker is open: {stats:?}"
    );
    provider.set_default(Reply::Ok);
    for _ in 0..200 {
        if outbox.stats().await.unwrap().queued == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.stop().await;
    assert_eq!(
        outbox.stats().await.unwrap().queued,
        0,
        "all sent after the probe"
    );
    assert_eq!(provider.sends(), while_down + 30);
}

/// Issue 62, point 6: a refusal without an attempt (here an isolated breaker, which promises
/// no time) moves only the message's due time, to the next poll: no attempt counted, no
/// backoff, so that mail goes within a poll of the reset, however long it was refused.
pub async fn an_isolated_member_keeps_every_attempt_count_at_zero_and_drains_within_a_poll_of_the_reset(
    outbox: Outbox,
) {
    let ids = outbox
        .enqueue_many(&numbered_messages(1_000))
        .await
        .unwrap();
    let provider = Scripted::new("provider");
    let breaker = std::sync::Arc::new(
        CircuitBreakerTransport::builder(provider.clone())
            .build()
            .unwrap(),
    );
    breaker.isolate().await;
    let poll = Duration::from_millis(200);
    // The default backoff (1 s doubling to 10 min): a refusal counted as an attempt would
    // push the messages' due times out of reach of the wait below.
    let worker = outbox.worker(std::sync::Arc::clone(&breaker)).poll(poll);
    let running = Running::start(worker);
    tokio::time::sleep(poll * 6).await;
    // A claim counts its attempt until the refusal gives it back: read the counts with no
    // worker holding a claim.
    running.stop().await;
    assert_eq!(provider.sends(), 0, "isolated: nothing sent");
    for id in &ids {
        let stored = outbox.message(*id).await.unwrap().expect("still queued");
        assert_eq!(stored.attempts, 0, "message {id}: a refusal is no attempt");
        assert!(stored.dead_at.is_none());
    }
    breaker.reset().await;
    let worker = outbox.worker(std::sync::Arc::clone(&breaker)).poll(poll);
    let running = Running::start(worker);
    let mut waited = Duration::ZERO;
    while outbox.stats().await.unwrap().queued > 0 {
        assert!(
            waited < Duration::from_secs(20),
            "not drained after the reset: {:?}",
            outbox.stats().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    running.stop().await;
    assert_eq!(provider.sends(), 1_000);
}

/// Fails every send to a recipient at `a.example` (the provider's route there is down) and
/// delivers the others.
#[derive(Clone, Default)]
struct DownForDomainA {
    sent: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl Transport for DownForDomainA {
    fn name(&self) -> &str {
        "provider"
    }

    async fn send_raw(
        &self,
        envelope: &mail_breaker::Envelope,
        _raw: &[u8],
    ) -> Result<mail_breaker::Receipt, SendError> {
        let to: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
        self.sent.lock().unwrap().extend(to.iter().cloned());
        if to.iter().any(|to| to.ends_with("@a.example")) {
            return Err(SendError::new(Category::Network, "test.down", "route down"));
        }
        Ok(mail_breaker::Receipt::new("provider"))
    }
}

fn to(address: &str) -> mail_breaker::Message {
    mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to(address.parse().unwrap())
        .body(String::from("hello"))
        .unwrap()
}

/// Issue 62, point 6: with a breaker per recipient domain, one domain's open breaker holds
/// back that domain's mail alone; the worker does not pause for it.
pub async fn a_breaker_open_for_one_recipient_domain_holds_back_that_domains_mail_alone(
    outbox: Outbox,
) {
    let provider = DownForDomainA::default();
    let breaker = CircuitBreakerTransport::builder(provider.clone())
        .scope(mail_breaker::Scope::RecipientDomain)
        .failure_threshold(1)
        .reset_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    breaker.send(&to("first@a.example")).await.unwrap_err();
    let mut messages: Vec<_> = (0..5).map(|i| to(&format!("a{i}@a.example"))).collect();
    messages.extend((0..5).map(|i| to(&format!("b{i}@b.example"))));
    let ids = outbox.enqueue_many(&messages).await.unwrap();
    outbox.worker(breaker).concurrency(1).drain().await.unwrap();
    let sent = provider.sent.lock().unwrap().clone();
    assert_eq!(
        sent.len(),
        6,
        "a.example once before, then b.example's five: {sent:?}"
    );
    assert!(
        sent[1..].iter().all(|to| to.ends_with("@b.example")),
        "{sent:?}"
    );
    for id in &ids[..5] {
        let stored = outbox
            .message(*id)
            .await
            .unwrap()
            .expect("a.example's wait");
        assert_eq!(
            stored.attempts, 0,
            "refused by its domain's breaker: no attempt"
        );
    }
    for id in &ids[5..] {
        assert!(
            outbox.message(*id).await.unwrap().is_none(),
            "b.example's sent"
        );
    }
}

pub async fn shutdown_lets_sends_in_flight_finish_and_starts_no_more(outbox: Outbox) {
    outbox.enqueue_many(&numbered_messages(6)).await.unwrap();
    let provider = Scripted::answering(
        "provider",
        Reply::after(Duration::from_millis(200), Reply::Ok),
    );
    let worker = quick(&outbox, provider.clone()).concurrency(2);
    let running = Running::start(worker);
    while provider.sends() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.stop().await;
    assert_eq!(provider.sends(), 2);
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.due, stats.leased),
        (4, 4, 0),
        "{stats:?}"
    );
}

/// A retry wrapped around `send_or_queue`, with a short backoff.
fn retry_around<T: Transport>(transport: T) -> mail_breaker::RetryTransport<T> {
    mail_breaker::RetryTransport::builder(transport)
        .max_attempts(3)
        .backoff(mail_breaker::Backoff::constant(Duration::from_millis(10)))
        .build()
        .unwrap()
}

/// Review 6: a retry around `send_or_queue` that sent the queued recipients again made one
/// more copy, and one more row if that send failed the same way.
pub async fn a_retry_around_send_or_queue_sends_nothing_again_that_it_queued(outbox: Outbox) {
    let provider = Scripted::new("provider");
    provider.then([Reply::Err(maybe_delivered())]);
    let transport = retry_around(OutboxTransport::send_or_queue(
        outbox.clone(),
        provider.clone(),
    ));
    let receipt = transport.send(&super::message()).await.unwrap();
    assert!(receipt.is_queued());
    assert_eq!(
        provider.sends(),
        1,
        "the outbox sends it again, not the retry"
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
}

/// Review 6: the same for the recipients a partial delivery left owed, which
/// `send_or_queue` keeps in the outbox.
pub async fn a_retry_around_send_or_queue_sends_nothing_again_to_the_recipients_it_kept(
    outbox: Outbox,
) {
    let provider = PartlyDelivering::default();
    let transport = retry_around(OutboxTransport::send_or_queue(
        outbox.clone(),
        provider.clone(),
    ));
    let receipt = transport.send(&partly(&["later", "maybe"])).await.unwrap();
    assert!(!receipt.is_queued(), "delivered to now@");
    assert_eq!(
        provider.envelopes.lock().unwrap().len(),
        1,
        "only the outbox sends again"
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
}

/// Review 7: a receipt whose undelivered recipients only became dead letters said they were
/// kept to be sent again.
pub async fn a_receipt_whose_undelivered_recipients_only_became_dead_letters_is_not_kept_for_later(
    outbox: Outbox,
) {
    let provider = PartlyDelivering::default();
    let transport = OutboxTransport::send_or_queue(outbox.clone(), provider.clone());
    let receipt = transport.send(&partly(&["refused"])).await.unwrap();
    assert_eq!(receipt.rejected_recipients().len(), 1);
    assert!(!receipt.is_kept_for_later(), "{receipt:?}");
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 1), "{stats:?}");
    let fresh = OutboxTransport::send_or_queue(outbox.clone(), PartlyDelivering::default());
    let kept = fresh.send(&partly(&["later"])).await.unwrap();
    assert!(kept.is_kept_for_later(), "{kept:?}");
}

pub async fn send_or_queue_queues_a_failure_that_may_pass(outbox: Outbox) {
    let down = Scripted::answering("provider", Reply::fail(Category::ServiceUnavailable));
    let transport = OutboxTransport::send_or_queue(outbox.clone(), down);
    let receipt = transport.send(&super::message()).await.unwrap();
    assert!(receipt.is_queued());
    let id: i64 = receipt.message_id().unwrap().parse().unwrap();
    assert!(id > 0);
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
}

/// An error from after SMTP's final dot: the provider may have the message.
fn maybe_delivered() -> SendError {
    SendError::new(
        Category::Timeout,
        "test.after_dot",
        "no reply after the dot",
    )
    .maybe_delivered()
}

pub async fn send_or_queue_queues_a_maybe_delivered_failure_to_send_again(outbox: Outbox) {
    let lost = Scripted::answering("provider", Reply::Err(maybe_delivered()));
    let transport = OutboxTransport::send_or_queue(outbox.clone(), lost);
    let receipt = transport.send(&super::message()).await.unwrap();
    assert!(receipt.is_queued(), "at least once: sent again later");
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
    // The answer tells the truth: the resend may make a second copy.
    let maybe: Vec<(String, &str)> = receipt
        .maybe_delivered_recipients()
        .iter()
        .map(|(to, why)| (to.to_string(), why.code()))
        .collect();
    assert_eq!(
        maybe,
        [("user@example.org".to_owned(), "test.after_dot")],
        "queued, and maybe delivered already"
    );
}

pub async fn send_or_queue_under_at_most_once_answers_a_maybe_delivered_failure_and_keeps_nothing(
    outbox: Outbox,
) {
    let lost = Scripted::answering("provider", Reply::Err(maybe_delivered()));
    let transport = OutboxTransport::send_or_queue(outbox.clone(), lost).at_most_once();
    let error = transport.send(&super::message()).await.unwrap_err();
    assert_eq!(error.code(), "test.after_dot");
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn send_or_queue_under_at_most_once_still_queues_a_failure_that_sent_nothing(
    outbox: Outbox,
) {
    let down = Scripted::answering("provider", Reply::fail(Category::ServiceUnavailable));
    let transport = OutboxTransport::send_or_queue(outbox.clone(), down).at_most_once();
    assert!(transport.send(&super::message()).await.unwrap().is_queued());
}

pub async fn an_outbox_transport_bears_its_stacks_name_or_outbox_when_it_only_queues(
    outbox: Outbox,
) {
    let stack = Scripted::new("provider");
    assert_eq!(
        OutboxTransport::send_or_queue(outbox.clone(), stack).name(),
        "provider"
    );
    assert_eq!(OutboxTransport::queue_only(outbox).name(), "outbox");
}

/// Issue 62, point 4: a failure of the setup (an expired password, a token endpoint's HTML
/// page, a transport that cannot carry the message) is one the worker sends again after its
/// `setup_wait`, so `send_or_queue` keeps it, whether the stack has one member or many.
pub async fn send_or_queue_keeps_every_failure_the_worker_would_send_again(outbox: Outbox) {
    for category in [
        Category::Authentication,
        Category::Configuration,
        Category::Unsupported,
    ] {
        let failing = Scripted::answering("provider", Reply::fail(category));
        let transport = OutboxTransport::send_or_queue(outbox.clone(), failing);
        let receipt = transport.send(&super::message()).await;
        assert!(
            receipt.as_ref().is_ok_and(mail_breaker::Receipt::is_queued),
            "{category:?}: {receipt:?}"
        );
    }
    assert_eq!(outbox.stats().await.unwrap().queued, 3);
}

pub async fn send_or_queue_answers_a_rejection_with_its_error_and_keeps_nothing(outbox: Outbox) {
    let refusing = Scripted::answering("provider", Reply::fail(Category::Rejected));
    let transport = OutboxTransport::send_or_queue(outbox.clone(), refusing);
    let error = transport.send(&super::message()).await.unwrap_err();
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn send_or_queue_answers_a_delivery_as_delivered(outbox: Outbox) {
    let provider = Scripted::new("provider");
    let transport = OutboxTransport::send_or_queue(outbox.clone(), provider.clone());
    let receipt = transport.send(&super::message()).await.unwrap();
    assert!(!receipt.is_queued());
    assert_eq!(receipt.transport(), "provider");
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn queue_only_queues_every_message(outbox: Outbox) {
    let transport = OutboxTransport::queue_only(outbox.clone());
    for message in numbered_messages(3) {
        assert!(transport.send(&message).await.unwrap().is_queued());
    }
    assert_eq!(outbox.stats().await.unwrap().queued, 3);
}

pub async fn purge_deletes_a_message_queued_or_dead(outbox: Outbox) {
    let queued = outbox.enqueue(&super::message()).await.unwrap();
    assert!(outbox.purge(queued).await.unwrap());
    assert!(!outbox.purge(queued).await.unwrap());
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn purge_dead_deletes_a_dead_letter_and_never_a_message_still_queued(outbox: Outbox) {
    let id = outbox.enqueue(&super::message()).await.unwrap();
    assert!(!outbox.purge_dead(id).await.unwrap(), "queued, not dead");
    assert!(outbox.message(id).await.unwrap().is_some(), "still queued");
    let refusing = Scripted::answering("refusing", Reply::fail(Category::Rejected));
    quick(&outbox, refusing).drain().await.unwrap();
    assert!(outbox.purge_dead(id).await.unwrap(), "dead, so deleted");
    assert!(outbox.message(id).await.unwrap().is_none());
    assert!(!outbox.purge_dead(id).await.unwrap(), "already gone");
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 0));
}

/// An operator's purge read the message dead; another requeued it before the purge ran.
pub async fn a_dead_letter_requeued_before_its_purge_stays_queued(outbox: Outbox) {
    let id = outbox.enqueue(&super::message()).await.unwrap();
    let refusing = Scripted::answering("refusing", Reply::fail(Category::Rejected));
    quick(&outbox, refusing).drain().await.unwrap();
    let seen_dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(seen_dead.len(), 1);
    assert!(outbox.requeue(id).await.unwrap());
    assert!(!outbox.purge_dead(seen_dead[0].id).await.unwrap());
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (1, 0), "the requeued mail kept");
}

/// 250 dead letters among queued mail, read 100 at a time: each page holds the next ids
/// below its cursor, newest first, and no queued message; every dead letter is read once.
pub async fn dead_letters_page_reads_every_dead_letter_newest_first_below_its_cursor(
    outbox: Outbox,
) {
    let first = outbox.enqueue_many(&numbered_messages(250)).await.unwrap();
    let refusing = Scripted::answering("refusing", Reply::fail(Category::Rejected));
    quick(&outbox, refusing)
        .concurrency(8)
        .drain()
        .await
        .unwrap();
    // Queued mail on either side of the dead letters' ids, and a requeued hole among them.
    let later = outbox.enqueue_many(&numbered_messages(20)).await.unwrap();
    assert!(outbox.requeue(first[100]).await.unwrap());
    let mut dead: Vec<_> = first
        .iter()
        .copied()
        .filter(|id| *id != first[100])
        .collect();
    dead.reverse();

    let mut read = Vec::new();
    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let page = outbox.dead_letters_page(before, 100).await.unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        pages.push(page.len());
        read.extend(page.iter().map(|letter| letter.id));
    }
    assert_eq!(pages, [100, 100, 49]);
    assert_eq!(read, dead, "every dead letter once, newest first");
    assert!(
        read.iter()
            .all(|id| !later.contains(id) && *id != first[100])
    );
    let below = outbox.dead_letters_page(Some(dead[0]), 2).await.unwrap();
    assert_eq!(
        below.iter().map(|letter| letter.id).collect::<Vec<_>>(),
        dead[1..3],
        "the cursor's own id is not read again"
    );
    let letter = &below[0];
    assert_eq!(letter.error.category(), Category::Rejected);
    assert_eq!(letter.attempts, 1);
    assert!(outbox.dead_letters_page(None, 0).await.unwrap().is_empty());
    assert!(
        outbox
            .dead_letters_page(Some(dead[248]), 100)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn enqueue_many_answers_each_messages_id_in_order(outbox: Outbox) {
    let ids = outbox
        .enqueue_many(&numbered_messages(1_200))
        .await
        .unwrap();
    assert_eq!(ids.len(), 1_200);
    for gone in [0, 1, 499, 500, 1_199] {
        assert!(outbox.purge(ids[gone]).await.unwrap());
    }
    let provider = Scripted::new("provider");
    quick(&outbox, provider.clone())
        .concurrency(8)
        .drain()
        .await
        .unwrap();
    let sent: std::collections::HashSet<String> = provider.subjects().into_iter().collect();
    assert_eq!(sent.len(), 1_195);
    for gone in [0, 1, 499, 500, 1_199] {
        assert!(
            !sent.contains(&format!("message {gone}")),
            "message {gone} was purged"
        );
    }
}

pub async fn stats_say_how_long_the_oldest_message_has_waited(outbox: Outbox) {
    outbox.enqueue(&super::message()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    outbox.enqueue(&super::message()).await.unwrap();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.due), (2, 2));
    let oldest = stats.oldest.unwrap();
    assert!(
        oldest >= Duration::from_millis(50) && oldest < Duration::from_secs(30),
        "{oldest:?}"
    );
}

pub async fn a_worker_with_no_room_for_a_send_is_a_configuration_error(outbox: Outbox) {
    let error = outbox
        .worker(Scripted::new("p"))
        .concurrency(0)
        .drain()
        .await
        .unwrap_err();
    assert_eq!(error.category(), Category::Configuration);
    assert!(error.message().contains("concurrency"), "{error}");
}

/// Issue 45, point 1: a worker that holds messages ahead of its sends never lets their leases
/// run out under it, so its own next claim never takes one of them again.
pub async fn a_worker_whose_sends_take_most_of_the_lease_delivers_each_held_message_once(
    outbox: Outbox,
) {
    outbox.enqueue_many(&numbered_messages(8)).await.unwrap();
    let slow = Scripted::answering("slow", Reply::after(Duration::from_millis(240), Reply::Ok));
    quick(&outbox, slow.clone())
        .concurrency(1)
        .lease(Duration::from_millis(400))
        .drain()
        .await
        .unwrap();
    let mut subjects = slow.subjects();
    subjects.sort();
    let sent = subjects.len();
    subjects.dedup();
    assert_eq!(
        (sent, subjects.len()),
        (8, 8),
        "each of the 8 once: {subjects:?}"
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// Issue 45, point 1: a send still running at `send_timeout` is dropped and answered as a
/// timeout, before the lease runs out; the message is kept to be sent again.
pub async fn a_send_still_running_at_send_timeout_is_answered_as_a_timeout_within_the_lease(
    outbox: Outbox,
) {
    outbox.enqueue(&super::message()).await.unwrap();
    let hung = Scripted::answering("hung", Reply::Hang);
    let started = std::time::Instant::now();
    quick(&outbox, hung.clone())
        .lease(Duration::from_millis(400))
        .send_timeout(Duration::from_millis(200))
        .backoff(mail_breaker::Backoff::constant(Duration::from_secs(3_600)))
        .drain()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(400), "answered in {took:?}");
    assert_eq!(hung.sends(), 1);
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.leased, stats.dead),
        (1, 0, 0),
        "kept for a later try: {stats:?}"
    );
}

/// Issue 45, point 1: under `at_most_once`, a send dropped at `send_timeout` may have reached
/// the provider (the worker cannot know whether its data went), so it is never sent again.
pub async fn under_at_most_once_a_send_dropped_at_send_timeout_is_dead_as_maybe_delivered(
    outbox: Outbox,
) {
    outbox.enqueue(&super::message()).await.unwrap();
    let hung = Scripted::answering("hung", Reply::Hang);
    quick(&outbox, hung.clone())
        .lease(Duration::from_millis(400))
        .send_timeout(Duration::from_millis(100))
        .at_most_once()
        .drain()
        .await
        .unwrap();
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error.code(), "outbox.maybe_delivered");
    assert_eq!(dead[0].error.category(), Category::Timeout);
}

/// Issue 45, point 1: `send_timeout` must leave the lease room to write the answer.
pub async fn a_send_timeout_not_below_the_lease_is_a_configuration_error(outbox: Outbox) {
    for send_timeout in [
        Duration::from_secs(1),
        Duration::from_secs(2),
        Duration::ZERO,
    ] {
        let worker = outbox
            .worker(Scripted::new("p"))
            .lease(Duration::from_secs(1))
            .send_timeout(send_timeout);
        let refused = worker.validate().unwrap_err();
        assert_eq!(refused.setting(), "send_timeout", "{refused}");
        let error = worker.drain().await.unwrap_err();
        assert_eq!(error.category(), Category::Configuration);
        assert!(error.message().contains("send_timeout"), "{error}");
    }
    let fine = outbox
        .worker(Scripted::new("p"))
        .lease(Duration::from_secs(1));
    assert_eq!(
        fine.get_send_timeout(),
        Duration::from_millis(750),
        "3/4 of the lease"
    );
    assert!(fine.validate().is_ok());
}

/// Issue 45, point 2: an `Ok` whose receipt defers some recipients keeps the message for
/// them alone; the caller gets the receipt as it is.
pub async fn send_or_queue_queues_the_message_for_the_recipients_its_delivery_deferred_alone(
    outbox: Outbox,
) {
    let message = mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("now@example.org".parse().unwrap())
        .to("later@example.org".parse().unwrap())
        .body(String::from("hello"))
        .unwrap();
    let provider = Greylisting::default();
    let transport = OutboxTransport::send_or_queue(outbox.clone(), provider.clone());
    let receipt = transport.send(&message).await.unwrap();
    assert!(!receipt.is_queued(), "delivered to the others");
    assert_eq!(receipt.deferred_recipients().len(), 1);
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
    outbox.worker(provider.clone()).drain().await.unwrap();
    let envelopes = provider.envelopes.lock().unwrap().clone();
    assert_eq!(
        envelopes,
        [
            vec!["now@example.org".to_owned(), "later@example.org".to_owned()],
            vec!["later@example.org".to_owned()],
        ]
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// Panics on every send of a message whose subject is `boom`; delivers the others.
#[derive(Clone, Default)]
struct PanicsOnBoom {
    sends: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl Transport for PanicsOnBoom {
    fn name(&self) -> &str {
        "panicking"
    }

    async fn send_raw(
        &self,
        _envelope: &mail_breaker::Envelope,
        raw: &[u8],
    ) -> Result<mail_breaker::Receipt, SendError> {
        let boom = String::from_utf8_lossy(raw).contains("Subject: boom");
        self.sends
            .lock()
            .unwrap()
            .push(if boom { "boom" } else { "fine" }.to_owned());
        assert!(!boom, "the transport has a bug");
        Ok(mail_breaker::Receipt::new("panicking"))
    }
}

/// Issue 45, point 3: a send that panics is an answer (`transport.panicked`); the worker goes
/// on, and the third panic of one message makes it a dead letter.
pub async fn a_message_whose_send_panicked_three_times_is_dead_and_the_worker_goes_on(
    outbox: Outbox,
) {
    let boom = mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("user@example.org".parse().unwrap())
        .subject("boom")
        .body(String::from("hello"))
        .unwrap();
    outbox.enqueue(&boom).await.unwrap();
    outbox.enqueue(&super::message()).await.unwrap();
    let provider = PanicsOnBoom::default();
    outbox
        .worker(provider.clone())
        .concurrency(1)
        .setup_wait(Duration::ZERO)
        .drain()
        .await
        .unwrap();
    let sends = provider.sends.lock().unwrap().clone();
    assert_eq!(
        sends.iter().filter(|s| *s == "boom").count(),
        3,
        "{sends:?}"
    );
    assert_eq!(
        sends.iter().filter(|s| *s == "fine").count(),
        1,
        "{sends:?}"
    );
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error.code(), "transport.panicked");
    assert_eq!(dead[0].error.category(), Category::Configuration);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// Issue 45, point 8: a worker holds at most `max_held_bytes` of bodies claimed and not yet
/// answered (and one message alone, whatever its size), and still sends them all.
/// A message of 10 kB, numbered `i` in its subject.
fn big(i: usize) -> mail_breaker::Message {
    mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("user@example.org".parse().unwrap())
        .subject(format!("message {i}"))
        .body("x".repeat(10_000))
        .unwrap()
}

pub async fn a_worker_under_its_byte_bound_claims_again_as_soon_as_an_answer_makes_room(
    outbox: Outbox,
) {
    let messages: Vec<_> = (0..3).map(big).collect();
    outbox.enqueue_many(&messages).await.unwrap();
    // Two of 10 kB fit in 25 kB: one answers at once, the other after a second.
    let provider = Scripted::new("provider");
    provider.then([Reply::Ok, Reply::after(Duration::from_secs(1), Reply::Ok)]);
    let worker = quick(&outbox, provider.clone())
        .concurrency(8)
        .max_held_bytes(25_000);
    let drained = tokio::spawn(async move { worker.drain().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        provider.sends(),
        3,
        "the third went out while the slow one was still held"
    );
    drained.await.unwrap().unwrap();
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

pub async fn a_worker_holds_no_more_message_bodies_than_max_held_bytes(outbox: Outbox) {
    let messages: Vec<_> = (0..12).map(big).collect();
    outbox.enqueue_many(&messages).await.unwrap();
    let hung = Scripted::answering("hung", Reply::Hang);
    let worker = quick(&outbox, hung.clone())
        .concurrency(8)
        .max_held_bytes(25_000);
    let held = tokio::spawn(async move { worker.drain().await });
    while hung.sends() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Mail enqueued now wakes the worker, which claims again: no body fits beside the two.
    outbox.enqueue(&big(50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leased = outbox.stats().await.unwrap().leased;
    held.abort();
    assert_eq!(
        (hung.sends(), leased),
        (2, 2),
        "two bodies of 10 kB fit in 25 kB, a third does not"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;

    let other = outbox.enqueue(&big(99)).await.unwrap();
    assert!(outbox.purge(other).await.unwrap());
    let provider = Scripted::answering(
        "provider",
        Reply::after(Duration::from_millis(5), Reply::Ok),
    );
    quick(&outbox, provider.clone())
        .concurrency(8)
        .lease(Duration::from_secs(1))
        .max_held_bytes(1)
        .drain()
        .await
        .unwrap();
    assert_eq!(
        outbox.stats().await.unwrap().leased,
        2,
        "the hung worker's two"
    );
    assert_eq!(provider.sends(), 11, "each sent, alone past the bound");
}

/// One `#[tokio::test]` per rule above, each on a fresh outbox from `$open` (an async
/// expression giving `Option<(Outbox, guard)>`, `None` when its server is missing).
#[macro_export]
macro_rules! outbox_rules {
    ($open:expr; $($rule:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $rule() {
            let Some((outbox, _guard)) = $open(stringify!($rule)).await else { return };
            support::outbox_rules::$rule(outbox).await;
        }
    )+};
}

/// Every rule, for [`outbox_rules!`].
#[macro_export]
macro_rules! all_outbox_rules {
    ($open:expr) => {
        $crate::outbox_rules!($open;
            drain_sends_every_queued_message_once_and_empties_the_outbox,
            a_rejected_message_is_dead_at_once_with_its_error,
            sent_here_counts_the_deliveries_of_this_outbox_s_workers_and_its_clones_share_it,
            message_reads_a_queued_message_and_a_dead_letter_as_the_outbox_holds_them,
            a_worker_idle_for_its_poll_wakes_at_once_for_mail_enqueued_through_its_outbox,
            a_worker_idle_for_its_poll_wakes_at_once_for_the_recipients_send_or_queue_kept,
            requeue_sends_a_dead_letter_again_with_a_fresh_attempt_count,
            a_requeued_dead_letter_is_tried_until_max_age_from_its_requeue,
            a_failure_that_may_pass_is_not_due_before_its_retry_after,
            a_failure_that_may_pass_is_sent_again_after_the_backoff,
            a_maybe_delivered_failure_is_dead_under_at_most_once,
            drain_sends_again_a_failed_message_that_is_due_again_at_once,
            a_delivery_deferred_for_some_recipients_stays_queued_for_them_only,
            a_partial_delivery_sends_again_the_maybe_delivered_and_deferred_and_buries_the_refused,
            under_at_most_once_a_maybe_delivered_recipient_is_a_dead_letter_of_its_own,
            a_delivery_that_refused_one_and_may_have_reached_another_leaves_two_dead_letters_under_at_most_once,
            send_or_queue_keeps_every_recipients_truth_of_a_partial_delivery,
            a_message_whose_lease_ran_out_is_sent_again,
            a_message_whose_lease_ran_out_is_dead_under_at_most_once,
            a_worker_at_rest_wakes_when_a_lease_it_waits_for_runs_out,
            drain_ends_only_once_every_message_whose_lease_ran_out_is_dead_under_at_most_once,
            a_held_message_is_not_claimed_by_another_worker,
            a_worker_claims_ahead_four_times_what_it_sends_so_that_one_claim_serves_several,
            under_at_most_once_a_worker_holds_only_what_it_sends,
            two_workers_never_send_one_message_twice,
            the_worker_tries_nothing_while_the_breaker_is_open_and_drains_after_the_probe,
            an_isolated_member_keeps_every_attempt_count_at_zero_and_drains_within_a_poll_of_the_reset,
            a_breaker_open_for_one_recipient_domain_holds_back_that_domains_mail_alone,
            shutdown_lets_sends_in_flight_finish_and_starts_no_more,
            send_or_queue_queues_a_failure_that_may_pass,
            a_retry_around_send_or_queue_sends_nothing_again_that_it_queued,
            a_retry_around_send_or_queue_sends_nothing_again_to_the_recipients_it_kept,
            a_receipt_whose_undelivered_recipients_only_became_dead_letters_is_not_kept_for_later,
            send_or_queue_answers_a_rejection_with_its_error_and_keeps_nothing,
            send_or_queue_keeps_every_failure_the_worker_would_send_again,
            send_or_queue_queues_a_maybe_delivered_failure_to_send_again,
            send_or_queue_under_at_most_once_answers_a_maybe_delivered_failure_and_keeps_nothing,
            send_or_queue_under_at_most_once_still_queues_a_failure_that_sent_nothing,
            an_outbox_transport_bears_its_stacks_name_or_outbox_when_it_only_queues,
            send_or_queue_answers_a_delivery_as_delivered,
            queue_only_queues_every_message,
            purge_deletes_a_message_queued_or_dead,
            dead_letters_page_reads_every_dead_letter_newest_first_below_its_cursor,
            purge_dead_deletes_a_dead_letter_and_never_a_message_still_queued,
            a_dead_letter_requeued_before_its_purge_stays_queued,
            stats_say_how_long_the_oldest_message_has_waited,
            enqueue_many_answers_each_messages_id_in_order,
            a_worker_with_no_room_for_a_send_is_a_configuration_error,
            a_worker_whose_sends_take_most_of_the_lease_delivers_each_held_message_once,
            a_send_still_running_at_send_timeout_is_answered_as_a_timeout_within_the_lease,
            under_at_most_once_a_send_dropped_at_send_timeout_is_dead_as_maybe_delivered,
            a_send_timeout_not_below_the_lease_is_a_configuration_error,
            send_or_queue_queues_the_message_for_the_recipients_its_delivery_deferred_alone,
            a_message_whose_send_panicked_three_times_is_dead_and_the_worker_goes_on,
            a_worker_holds_no_more_message_bodies_than_max_held_bytes,
            a_worker_under_its_byte_bound_claims_again_as_soon_as_an_answer_makes_room,
        );
    };
}
