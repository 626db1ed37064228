//! A transport that fails in bursts drawn from a seeded random generator, and keeps the
//! books a soak test checks: every delivery per message, every fault it injected.
//!
//! Each message is known by its `Subject:`, which the receipt carries as its message id, so a
//! test can tell which message an answer belongs to. A delivery is booked only when its
//! answer is given out: a send dropped mid-flight delivered nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Category, Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport,
};
use tokio::time::Instant;

/// How a [`Flaky`] transport misbehaves.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// The chance that a burst of failures starts at a given send, while healthy.
    pub burst_chance: f64,
    /// How long a burst lasts, at most (it is drawn between a tenth of this and this).
    pub burst_length: Duration,
    /// The chance that a send fails outside a burst.
    pub stray_failure_chance: f64,
    /// The chance that a send is refused as `Rejected` (the provider working, a bad recipient).
    pub rejection_chance: f64,
    /// The chance that a send is slow: it answers only after `slow_reply`.
    pub slow_chance: f64,
    /// How long a slow send takes (past a breaker's probe timeout, to exercise it).
    pub slow_reply: Duration,
    /// How long a normal send takes, at most.
    pub latency: Duration,
    /// The chance that a failure inside `send_many` fails the whole batch.
    pub batch_failure_chance: f64,
}

/// What a [`Flaky`] transport did.
#[derive(Debug, Default, Clone)]
pub struct Books {
    /// Deliveries per message id (the subject).
    pub delivered: HashMap<String, u32>,
    /// Sends that reached it, answered or not.
    pub sends: u64,
    /// Failures it answered, by category code (`test.network`, …), batch failures apart.
    pub failures: HashMap<String, u64>,
    /// Whole batches it failed.
    pub batch_failures: u64,
    /// Rejections it answered.
    pub rejections: u64,
    /// Slow sends it started.
    pub slow: u64,
    /// Bursts of failure it went through.
    pub bursts: u64,
}

impl Books {
    /// Every failure answered, batch failures included.
    pub fn faults(&self) -> u64 {
        self.failures.values().sum::<u64>() + self.batch_failures
    }
}

#[derive(Debug)]
struct Inner {
    rng: fastrand::Rng,
    down_until: Option<Instant>,
    healthy: bool,
    books: Books,
}

/// A transport that fails in random bursts; see the module docs.
#[derive(Debug, Clone)]
pub struct Flaky {
    name: String,
    faults: Faults,
    inner: Arc<Mutex<Inner>>,
}

enum Plan {
    Deliver(Duration),
    Fail(Duration, Category),
    Reject(Duration),
}

impl Flaky {
    /// A transport named `name` misbehaving as `faults`, its randomness drawn from `seed`.
    pub fn new(name: &str, faults: Faults, seed: u64) -> Self {
        Flaky {
            name: name.to_owned(),
            faults,
            inner: Arc::new(Mutex::new(Inner {
                rng: fastrand::Rng::with_seed(seed),
                down_until: None,
                healthy: false,
                books: Books::default(),
            })),
        }
    }

    /// Stops every fault from now on (slow sends still in flight finish as they were).
    pub fn heal(&self) {
        let mut inner = self.lock();
        inner.healthy = true;
        inner.down_until = None;
    }

    /// A copy of its books.
    pub fn books(&self) -> Books {
        self.lock().books.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn plan(&self) -> Plan {
        let faults = self.faults;
        let mut inner = self.lock();
        inner.books.sends += 1;
        let now = Instant::now();
        let latency = faults.latency.mul_f64(inner.rng.f64());
        if inner.healthy {
            return Plan::Deliver(latency);
        }
        if inner.down_until.is_some_and(|until| now >= until) {
            inner.down_until = None;
        }
        if inner.down_until.is_none() && inner.rng.f64() < faults.burst_chance {
            let length = faults.burst_length.mul_f64(0.1 + 0.9 * inner.rng.f64());
            inner.down_until = Some(now + length);
            inner.books.bursts += 1;
        }
        let delay = if inner.rng.f64() < faults.slow_chance {
            inner.books.slow += 1;
            faults.slow_reply
        } else {
            latency
        };
        if inner.down_until.is_some() || inner.rng.f64() < faults.stray_failure_chance {
            let category = [
                Category::Network,
                Category::Timeout,
                Category::ServerError,
                Category::ServiceUnavailable,
            ][inner.rng.usize(..4)];
            return Plan::Fail(delay, category);
        }
        if inner.rng.f64() < faults.rejection_chance {
            return Plan::Reject(delay);
        }
        Plan::Deliver(delay)
    }

    /// Sends one message; `in_batch` lets a failure fail the whole batch. Books nothing:
    /// [`book`](Self::book) does, once the answer is given out.
    async fn send_one(&self, raw: &[u8], in_batch: bool) -> Result<Receipt, SendError> {
        let id = message_id(raw);
        match self.plan() {
            Plan::Deliver(delay) => {
                tokio::time::sleep(delay).await;
                Ok(Receipt::new(&self.name).with_message_id(id))
            }
            Plan::Reject(delay) => {
                tokio::time::sleep(delay).await;
                Err(
                    SendError::new(Category::Rejected, "test.rejected", "recipient refused")
                        .with_transport(&self.name),
                )
            }
            Plan::Fail(delay, category) => {
                tokio::time::sleep(delay).await;
                let error = SendError::new(category, format!("test.{category}"), "injected")
                    .with_transport(&self.name);
                let whole_batch =
                    in_batch && self.lock().rng.f64() < self.faults.batch_failure_chance;
                Err(if whole_batch {
                    error.batch_failure()
                } else {
                    error
                })
            }
        }
    }

    /// Books an answer as it is given out.
    fn book(&self, answer: &Result<Receipt, SendError>) {
        let books = &mut self.lock().books;
        match answer {
            Ok(receipt) => {
                let id = receipt.message_id().unwrap_or_default().to_owned();
                *books.delivered.entry(id).or_default() += 1;
            }
            Err(error) if error.category() == Category::Rejected => books.rejections += 1,
            Err(error) if error.is_batch_failure() => books.batch_failures += 1,
            Err(error) => *books.failures.entry(error.code().to_owned()).or_default() += 1,
        }
    }
}

/// The message id a [`Flaky`] transport books a message under: its `Subject:`.
pub fn message_id(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .lines()
        .find_map(|line| line.strip_prefix("Subject: ").map(str::to_owned))
        .unwrap_or_default()
}

#[async_trait::async_trait]
impl Transport for Flaky {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, _envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let answer = self.send_one(raw, false).await;
        self.book(&answer);
        answer
    }

    /// Up to four messages at once, answered in order; a batch failure ends the batch.
    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        let answers = messages
            .map(move |message| async move { self.send_one(&message.formatted(), true).await })
            .buffered(4);
        futures::stream::unfold(Some(answers), move |answers| async move {
            let mut answers = answers?;
            let answer = answers.next().await?;
            self.book(&answer);
            let ends = matches!(&answer, Err(error) if error.is_batch_failure());
            Some((answer, (!ends).then_some(answers)))
        })
        .boxed()
    }
}
