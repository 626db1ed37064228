//! A caller may drop its future at any await point. Each test polls a fresh send (or batch)
//! `n` times, letting paused time move on between polls, then drops it, for n = 0, 1, 2, …
//! until it finishes, and checks after each drop that the breaker is where DESIGN §3 says:
//! a dropped closed send counts nothing, a dropped probe frees its slot at once, a batch
//! counts only the answers it gave out. Through a pool and a retry, no message gets two
//! answers and nothing panics.
//!
//! Every breaker test runs twice: over the default `MemoryStore`, whose decisions are ready
//! at once, and over a `SlowStore`, whose decisions take a while as a remote store's do, so
//! that there are await points inside the breaker itself.

mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Backoff, BreakerStore, Category, CircuitBreakerTransport, MemoryStore, PoolTransport, Receipt,
    RetryTransport, SendError, State, Transport,
};
use support::scripted::{Reply, Scripted};
use support::slow_store::SlowStore;
use support::{message, numbered_messages};

/// How far paused time moves between two polls.
const STEP: Duration = Duration::from_millis(4);
/// The scripted replies and the slow store each take this long, a few steps.
const DELAY: Duration = Duration::from_millis(10);
const RESET: Duration = Duration::from_secs(30);
/// Longer than any test runs: a probe slot that was not freed stays held, and shows.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3_600);
/// More polls than any of these sends needs to finish.
const MAX_POLLS: usize = 500;

/// A reply that takes two timers to come.
fn slowly(reply: Reply) -> Reply {
    Reply::after(DELAY, Reply::after(DELAY, reply))
}

fn failure() -> Reply {
    Reply::fail(Category::ServerError)
}

type Stores = [(&'static str, fn() -> Arc<dyn BreakerStore>); 2];

const STORES: Stores = [
    ("memory", || Arc::new(MemoryStore::new())),
    ("slow", || Arc::new(SlowStore::new(DELAY))),
];

fn breaker(
    inner: Scripted,
    threshold: u32,
    store: Arc<dyn BreakerStore>,
) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner)
        .failure_threshold(threshold)
        .reset_timeout(RESET)
        .probe_timeout(PROBE_TIMEOUT)
        .store(store)
        .build()
        .expect("valid settings")
}

/// Polls `future` up to `polls` times, moving paused time on by [`STEP`] after each poll that
/// did not finish; its output if it finished, else `None` (it is dropped).
async fn poll_then_drop<F: Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = pin!(future);
    for _ in 0..polls {
        if let Poll::Ready(output) = futures::poll!(future.as_mut()) {
            return Some(output);
        }
        tokio::time::advance(STEP).await;
    }
    None
}

/// What a batch gave out before it was dropped after `polls` polls, and whether it ended.
async fn read_then_drop<'a>(
    mut answers: mail_breaker::ReceiptStream<'a>,
    polls: usize,
) -> (Vec<Result<Receipt, SendError>>, bool) {
    let mut got = Vec::new();
    for _ in 0..polls {
        match futures::poll!(answers.next()) {
            Poll::Ready(Some(answer)) => got.push(answer),
            Poll::Ready(None) => return (got, true),
            Poll::Pending => tokio::time::advance(STEP).await,
        }
    }
    (got, false)
}

/// Opens `breaker` with one failing send (a threshold of 1), then lets the reset timeout pass.
async fn open_then_wait(breaker: &CircuitBreakerTransport<Scripted>) {
    breaker.inner().then([failure()]);
    let _ = breaker.send(&message()).await;
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(RESET).await;
}

/// Whether the breaker lets a send through now; from here on its transport delivers at once.
async fn lets_a_send_through(breaker: &CircuitBreakerTransport<Scripted>) -> bool {
    breaker.inner().clear_queue();
    breaker.inner().set_default(Reply::Ok);
    match breaker.send(&message()).await {
        Ok(_) => true,
        Err(error) if error.code() == "breaker.open" => false,
        Err(error) => panic!("unexpected: {error}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_closed_send_dropped_at_any_await_point_counts_nothing() {
    for (store_name, store) in STORES {
        let mut dropped_at = 0;
        for polls in 0..MAX_POLLS {
            let breaker = breaker(Scripted::answering("p", slowly(failure())), 1, store());
            let result = poll_then_drop(breaker.send(&message()), polls).await;
            match result {
                Some(result) => {
                    assert!(result.is_err());
                    assert_eq!(breaker.state(), State::Open, "{store_name}: counted");
                    break;
                }
                None => {
                    assert_eq!(
                        breaker.state(),
                        State::Closed,
                        "{store_name}: a send dropped after {polls} polls counted"
                    );
                    dropped_at += 1;
                }
            }
        }
        assert!(dropped_at >= 3, "{store_name}: only {dropped_at} drops");
        println!("{store_name}: dropped at {dropped_at} await points");
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_dropped_at_any_await_point_frees_its_slot_at_once() {
    for (store_name, store) in STORES {
        let mut dropped_at = 0;
        for polls in 0..MAX_POLLS {
            let breaker = breaker(Scripted::new("p"), 1, store());
            open_then_wait(&breaker).await;
            breaker.inner().then([slowly(Reply::Ok)]);
            match poll_then_drop(breaker.send(&message()), polls).await {
                Some(result) => {
                    assert!(result.is_ok());
                    assert_eq!(breaker.state(), State::Closed, "{store_name}");
                    break;
                }
                None => {
                    assert!(
                        lets_a_send_through(&breaker).await,
                        "{store_name}: the probe dropped after {polls} polls still holds its slot"
                    );
                    assert_eq!(breaker.state(), State::Closed, "{store_name}");
                    dropped_at += 1;
                }
            }
        }
        assert!(dropped_at >= 3, "{store_name}: only {dropped_at} drops");
        println!("{store_name}: dropped at {dropped_at} await points");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_dropped_at_any_await_point_neither_closes_nor_holds_the_breaker() {
    for (store_name, store) in STORES {
        for polls in 0..MAX_POLLS {
            let breaker = breaker(Scripted::new("p"), 1, store());
            open_then_wait(&breaker).await;
            breaker.inner().then([slowly(failure())]);
            if poll_then_drop(breaker.send(&message()), polls)
                .await
                .is_some()
            {
                // Answered: it failed, so the breaker opened for another reset timeout.
                assert_eq!(breaker.state(), State::Open, "{store_name}");
                assert!(!lets_a_send_through(&breaker).await);
                break;
            }
            assert_ne!(breaker.state(), State::Closed, "{store_name}");
            assert!(
                lets_a_send_through(&breaker).await,
                "{store_name}: dropped after {polls} polls, the slot is held"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_dropped_at_any_await_point_counts_only_the_answers_it_gave_out() {
    const THRESHOLD: u32 = 3;
    const MESSAGES: usize = 5;
    for (store_name, store) in STORES {
        for polls in 0..MAX_POLLS {
            let breaker = breaker(
                Scripted::answering("p", slowly(failure())),
                THRESHOLD,
                store(),
            );
            let messages = futures::stream::iter(numbered_messages(MESSAGES)).boxed();
            let (got, ended) = read_then_drop(breaker.send_many(messages), polls).await;
            assert!(
                got.len() <= MESSAGES,
                "{store_name}: more answers than messages"
            );
            let counted = got
                .iter()
                .filter(|answer| answer.as_ref().is_err_and(|e| e.code() != "breaker.open"))
                .count();
            let expected = if counted >= THRESHOLD as usize {
                State::Open
            } else {
                State::Closed
            };
            assert_eq!(
                breaker.state(),
                expected,
                "{store_name}: dropped after {polls} polls with {counted} failures given out"
            );
            if ended {
                assert_eq!(got.len(), MESSAGES, "{store_name}");
                assert_eq!(counted, THRESHOLD as usize, "{store_name}");
                break;
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_in_a_batch_dropped_at_any_await_point_frees_its_slot_at_once() {
    for (store_name, store) in STORES {
        for polls in 0..MAX_POLLS {
            let breaker = breaker(Scripted::new("p"), 1, store());
            open_then_wait(&breaker).await;
            breaker.inner().then([slowly(Reply::Ok)]);
            let messages = futures::stream::iter(numbered_messages(3)).boxed();
            let (got, ended) = read_then_drop(breaker.send_many(messages), polls).await;
            if got.first().is_some_and(Result::is_ok) {
                // The probe answered and closed the breaker.
                assert_eq!(breaker.state(), State::Closed, "{store_name}");
            } else {
                assert!(
                    lets_a_send_through(&breaker).await,
                    "{store_name}: a batch dropped after {polls} polls still holds the probe"
                );
            }
            if ended {
                assert_eq!(got.len(), 3);
                break;
            }
        }
    }
}

// ---- through a pool and a retry ----

/// retry(pool(breaker(primary), breaker(backup))): the primary fails slowly, the backup
/// delivers slowly; each receipt names its message.
struct Stack {
    primary: Arc<CircuitBreakerTransport<Scripted>>,
    backup: Arc<CircuitBreakerTransport<Scripted>>,
    pool: Arc<PoolTransport>,
    retry: RetryTransport<Arc<PoolTransport>>,
}

fn stack(store: fn() -> Arc<dyn BreakerStore>) -> Stack {
    let primary = Arc::new(breaker(
        Scripted::answering("primary", slowly(failure())).naming_subjects_in_receipts(),
        2,
        store(),
    ));
    let backup = Scripted::new("backup").naming_subjects_in_receipts();
    // The backup fails its first try, so the retry has something to retry.
    backup.then([slowly(Reply::fail(Category::Network))]);
    backup.set_default(slowly(Reply::Ok));
    let backup = Arc::new(breaker(backup, 3, store()));
    let pool = Arc::new(
        PoolTransport::builder()
            .add(Arc::clone(&primary), 1)
            .add(Arc::clone(&backup), 2)
            .build()
            .expect("a pool"),
    );
    let retry = RetryTransport::builder(Arc::clone(&pool))
        .max_attempts(3)
        .backoff(Backoff::constant(DELAY))
        .build()
        .expect("valid retry settings");
    Stack {
        primary,
        backup,
        pool,
        retry,
    }
}

impl Stack {
    /// Neither breaker holds a probe: once their reset timeouts pass, each lets a send through.
    async fn holds_no_probe(&self) -> bool {
        tokio::time::advance(RESET).await;
        lets_a_send_through(&self.primary).await && lets_a_send_through(&self.backup).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_pool_send_dropped_at_any_await_point_delivers_at_most_once_and_holds_no_probe() {
    for (store_name, store) in STORES {
        for polls in 0..MAX_POLLS {
            let stack = stack(store);
            let result = poll_then_drop(stack.pool.send(&message()), polls).await;
            let tries = stack.primary.inner().sends() + stack.backup.inner().sends();
            assert!(tries <= 2, "{store_name}: {tries} tries of one pool send");
            assert!(stack.holds_no_probe().await, "{store_name}: after {polls}");
            if result.is_some() {
                break;
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_send_dropped_at_any_await_point_answers_at_most_once_and_holds_no_probe() {
    for (store_name, store) in STORES {
        for polls in 0..MAX_POLLS {
            let stack = stack(store);
            let result = poll_then_drop(stack.retry.send(&message()), polls).await;
            if let Some(result) = &result {
                let receipt = result
                    .as_ref()
                    .expect("delivered by the backup's second try");
                assert_eq!(receipt.transport(), "backup");
                assert_eq!(receipt.attempts(), 2);
            }
            assert!(stack.holds_no_probe().await, "{store_name}: after {polls}");
            if result.is_some() {
                break;
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_batch_dropped_at_any_await_point_gives_each_message_at_most_one_answer_in_order() {
    const MESSAGES: usize = 6;
    for (store_name, store) in STORES {
        let mut finished = false;
        for polls in 0..MAX_POLLS {
            let stack = stack(store);
            let messages = futures::stream::iter(numbered_messages(MESSAGES)).boxed();
            let (got, ended) = read_then_drop(stack.retry.send_many(messages), polls).await;
            assert!(got.len() <= MESSAGES, "{store_name}: {} answers", got.len());
            for (index, answer) in got.iter().enumerate() {
                if let Ok(receipt) = answer {
                    assert_eq!(
                        receipt.message_id(),
                        Some(format!("message {index}").as_str()),
                        "{store_name}: answer {index} is another message's"
                    );
                }
            }
            assert!(stack.holds_no_probe().await, "{store_name}: after {polls}");
            if ended {
                assert_eq!(got.len(), MESSAGES, "{store_name}");
                assert!(got.iter().all(Result::is_ok), "{store_name}: {got:?}");
                finished = true;
                break;
            }
        }
        assert!(
            finished,
            "{store_name}: never finished in {MAX_POLLS} polls"
        );
    }
}
