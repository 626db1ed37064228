//! Retrying sends that failed for a reason that may pass: waits for what the error says.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cascade::{self, Stages, Verdict};
use crate::panicked::catch_panic;
use crate::{Envelope, Message, MessageStream, Receipt, ReceiptStream, SendError, Transport};

mod backoff;
mod budget;
mod builder;

pub use backoff::Backoff;
pub use budget::RetryBudget;
pub use builder::RetryBuilder;

/// A [`Transport`] that tries a message again when its error is
/// [retryable](SendError::is_retryable).
///
/// - Only retryable errors are retried (Network, Timeout, ServerError, ServiceUnavailable,
///   RateLimited); any other error is returned at once, and so is a
///   [reputation hold](SendError::is_reputation_hold), which no wait lifts.
/// - Before retry `n` it waits the longer of [`Backoff::delay`]`(n)` and the error's
///   [`retry_after`](SendError::retry_after), so a `breaker.open` or `pool.exhausted` error
///   is never retried before the breaker would let it through.
/// - It gives up, returning the last error at once, after `max_attempts` tries, when that
///   wait would end past `max_elapsed` from the first try or past the deadline of the send
///   it is part of (an outbox worker's `send_timeout`), or when the [`RetryBudget`]
///   throttles retries. Deferred recipients it would wait for then stay listed as deferred
///   in the receipt it answers.
/// - Built with [`at_most_once`](RetryBuilder::at_most_once), it returns an error marked
///   [`is_maybe_delivered`](SendError::is_maybe_delivered) as it is: the provider may hold
///   the message, and a retry could deliver it twice. By default it retries such errors.
/// - A try that panics is answered `transport.panicked` (Configuration, so not retried);
///   the transport goes on with the next send.
/// - [`Receipt::attempts`] says how many tries the delivery took.
/// - **Deferred recipients.** A delivery whose receipt lists
///   [`deferred_recipients`](Receipt::deferred_recipients) (an SMTP server took the message
///   for some recipients and said "later" to others, as greylisting does) is sent again, the
///   same octets and so the same Message-ID, to those recipients only, after the same wait
///   as a retry and within the same limits. The receipt then lists the recipients still
///   deferred, and those refused for good among the rejected. (`send` and `send_raw`; a
///   `send_many` answers with the first receipt, its deferred recipients listed.)
/// - **Maybe-delivered recipients** ([`Receipt::maybe_delivered_recipients`]: a later SMTP
///   transaction's data went out and no answer came) are sent again with the deferred, unless
///   built with [`at_most_once`](RetryBuilder::at_most_once): then they stay listed as they
///   are, and so does a deferred recipient whose next try ended maybe delivered. The
///   transactions of each further delivery are added to [`Receipt::transactions`].
///
/// Time is read from `tokio::time`, so `tokio::time::pause()` drives it in tests.
///
/// # Batches
/// [`send_many`](Transport::send_many) sends the batch through the inner transport's
/// `send_many`; the messages that failed with a retryable error go, each after its own wait,
/// into one batch for the second try, those that fail again into one for the third, and so
/// on. The answers come in message order, one per message.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use mail_breaker::{Backoff, CircuitBreakerTransport, LettreTransport, RetryTransport, Transport};
/// use lettre::transport::stub::AsyncStubTransport;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let transport = RetryTransport::builder(CircuitBreakerTransport::new(provider))
///     .max_attempts(4)
///     .backoff(Backoff::exponential(Duration::from_millis(500), Duration::from_secs(30)))
///     .max_elapsed(Duration::from_secs(120))
///     .build()?;
///
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// let receipt = transport.send(&message).await.unwrap();
/// assert_eq!(receipt.attempts(), 1);
/// # Ok::<(), mail_breaker::ConfigError>(())
/// # }).unwrap();
/// ```
pub struct RetryTransport<T> {
    inner: T,
    policy: Policy,
}

impl<T: Transport> RetryTransport<T> {
    /// Retries with the defaults: 3 tries, `Backoff::exponential(500 ms, 30 s)`, no time
    /// limit, no budget.
    pub fn new(inner: T) -> Self {
        match RetryBuilder::new(inner).build() {
            Ok(transport) => transport,
            Err(never) => unreachable!("the default settings are valid: {never}"),
        }
    }

    /// A builder to set each setting.
    pub fn builder(inner: T) -> RetryBuilder<T> {
        RetryBuilder::new(inner)
    }

    /// The transport it retries through.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The transport it retries through, mutably.
    pub fn inner_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The transport it retries through, dropping the retries.
    pub fn into_inner(self) -> T {
        self.inner
    }

    /// The budget it shares, if any.
    pub fn budget(&self) -> Option<&Arc<RetryBudget>> {
        self.policy.budget.as_ref()
    }

    /// Tries `send` until it delivers or the policy gives up; `first_try` is now.
    async fn retrying<F, Fut>(&self, first_try: Instant, mut send: F) -> Result<Receipt, SendError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Receipt, SendError>>,
    {
        let mut attempt = 1;
        // Whether a try so far may have reached the provider: then the answer is no mere
        // refusal, whatever the last try met (a breaker the first try's failure opened).
        let mut reached = false;
        loop {
            crate::deadline::try_begins();
            let result = catch_panic(self.inner.name(), send()).await;
            reached |= result
                .as_ref()
                .is_err_and(|error| !error.is_not_attempted());
            crate::deadline::try_answered(&result);
            match self
                .policy
                .judge(self.inner.name(), attempt, first_try, result, false)
            {
                Verdict::Answer(Err(error)) if reached && error.is_not_attempted() => {
                    return Err(error.attempted_before());
                }
                Verdict::Answer(result) => return result,
                Verdict::Next { not_before, .. } => {
                    if let Some(at) = not_before {
                        tokio::time::sleep_until(at).await;
                    }
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    /// Whether `receipt` lists recipients to send to again: the deferred, and the
    /// maybe-delivered unless `at_most_once`, unless an outbox inside keeps them.
    fn leaves_recipients_to_retry(&self, receipt: &Receipt) -> bool {
        !receipt.is_kept_for_later()
            && (!receipt.deferred_recipients().is_empty()
                || !(self.policy.at_most_once || receipt.maybe_delivered_recipients().is_empty()))
    }

    /// Sends `raw` again to the recipients of `receipt` it may send to again (the deferred,
    /// and the maybe-delivered unless `at_most_once`), as the policy allows, and gives back
    /// the receipt with what became of them.
    async fn deliver_deferred(
        &self,
        mut receipt: Receipt,
        from: Option<&lettre::Address>,
        raw: &[u8],
        first_try: Instant,
    ) -> Receipt {
        let transport = self.inner.name();
        let at_most_once = self.policy.at_most_once;
        let mut attempt = receipt.attempts();
        // Each with why; a why marked maybe-delivered says the recipient may have it.
        let mut again = receipt.take_deferred_recipients();
        if !at_most_once {
            again.extend(receipt.take_maybe_delivered_recipients());
        }
        while let Some(why) = again
            .iter()
            .map(|(_, why)| why)
            .max_by_key(|why| why.retry_after())
        {
            let Some(wait) = self
                .policy
                .wait_before_retry(transport, why, attempt, first_try)
            else {
                break;
            };
            let recipients = again.iter().map(|(to, _)| to.clone()).collect();
            let Ok(envelope) = Envelope::new(from.cloned(), recipients) else {
                break;
            };
            self.policy.recorded.retry(transport);
            tokio::time::sleep_until(crate::time::later(Instant::now(), wait)).await;
            attempt = attempt.saturating_add(1);
            crate::deadline::try_begins();
            let answered = catch_panic(transport, self.inner.send_raw(&envelope, raw)).await;
            crate::deadline::try_answered(&answered);
            match answered {
                Ok(mut answer) if answer.is_kept_for_later() => {
                    // An outbox inside keeps whom this try left owed (a queued answer: every
                    // recipient of the try): they stay listed as owed, and this retry sends
                    // them nothing more, which would be a second copy.
                    if let Some(budget) = &self.policy.budget {
                        budget.on_success();
                    }
                    for (to, why) in answer.rejected_recipients() {
                        receipt = receipt.with_rejected_recipient(to.clone(), why.clone());
                    }
                    for transaction in answer.transactions() {
                        receipt = receipt.with_transaction(transaction.clone());
                    }
                    let mut owed = answer.take_deferred_recipients();
                    owed.extend(answer.take_maybe_delivered_recipients());
                    if answer.is_queued() {
                        for (to, why) in std::mem::take(&mut again) {
                            if !owed.iter().any(|(listed, _)| *listed == to) {
                                owed.push((to, why));
                            }
                        }
                    }
                    again = owed;
                    receipt = receipt.owed_kept();
                    break;
                }
                Ok(mut answer) => {
                    if let Some(budget) = &self.policy.budget {
                        budget.on_success();
                    }
                    for (to, why) in answer.rejected_recipients() {
                        receipt = receipt.with_rejected_recipient(to.clone(), why.clone());
                    }
                    for transaction in answer.transactions() {
                        receipt = receipt.with_transaction(transaction.clone());
                    }
                    again = answer.take_deferred_recipients();
                    let maybe = answer.take_maybe_delivered_recipients();
                    if at_most_once {
                        for (to, why) in maybe {
                            receipt = receipt.with_maybe_delivered_recipient(to, why);
                        }
                    } else {
                        again.extend(maybe);
                    }
                }
                Err(error)
                    if error.is_retryable() && !(at_most_once && error.is_maybe_delivered()) =>
                {
                    if let Some(budget) = &self.policy.budget {
                        budget.on_retry_failure();
                    }
                    for (_, why) in &mut again {
                        *why = error.clone();
                    }
                }
                Err(error) => {
                    for (to, _) in std::mem::take(&mut again) {
                        receipt = if error.is_maybe_delivered() {
                            receipt.with_maybe_delivered_recipient(to, error.clone())
                        } else if error.is_retryable() {
                            receipt.with_deferred_recipient(to, error.clone())
                        } else {
                            receipt.with_rejected_recipient(to, error.clone())
                        };
                    }
                    break;
                }
            }
        }
        again
            .into_iter()
            .fold(receipt, |receipt, (to, why)| {
                if why.is_maybe_delivered() {
                    receipt.with_maybe_delivered_recipient(to, why)
                } else {
                    receipt.with_deferred_recipient(to, why)
                }
            })
            .with_attempts(attempt)
    }
}

/// When to try again.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) max_elapsed: Option<Duration>,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    /// Maybe-delivered errors are answers, not retried.
    pub(crate) at_most_once: bool,
    /// The retries it scheduled and those the budget refused, under the `metrics` feature.
    pub(crate) recorded: Recorded,
}

impl Policy {
    /// What `result` of try number `attempt` means. `repeated` marks the clones of a batch
    /// failure, which the budget has already counted once.
    fn judge(
        &self,
        transport: &str,
        attempt: u32,
        first_try: Instant,
        result: Result<Receipt, SendError>,
        repeated: bool,
    ) -> Verdict {
        let error = match result {
            Ok(receipt) => {
                if let (Some(budget), false) = (&self.budget, repeated) {
                    budget.on_success();
                }
                return Verdict::Answer(Ok(receipt.with_attempts(attempt)));
            }
            Err(error) if !error.is_retryable() => return Verdict::Answer(Err(error)),
            // Held for the member's reputation: only a person lets it go, not a wait.
            Err(error) if error.is_reputation_hold() => return Verdict::Answer(Err(error)),
            Err(error) if self.at_most_once && error.is_maybe_delivered() => {
                return Verdict::Answer(Err(error));
            }
            Err(error) => error,
        };
        if let (Some(budget), false) = (&self.budget, repeated) {
            budget.on_retry_failure();
        }
        match self.wait_before_retry(transport, &error, attempt, first_try) {
            Some(wait) => {
                self.recorded.retry(transport);
                tracing::debug!(
                    transport = error.transport().unwrap_or_default(),
                    code = error.code(),
                    attempt,
                    wait_ms = wait.as_millis() as u64,
                    "retry.scheduled"
                );
                Verdict::Next {
                    error,
                    not_before: Some(crate::time::later(Instant::now(), wait)),
                }
            }
            None => Verdict::Answer(Err(error)),
        }
    }

    /// The wait before the try after `attempt`, or `None` to give up now.
    fn wait_before_retry(
        &self,
        transport: &str,
        error: &SendError,
        attempt: u32,
        first_try: Instant,
    ) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        if let Some(budget) = &self.budget
            && budget.throttle_retry_attempt()
        {
            tracing::debug!(code = error.code(), "retry.throttled");
            self.recorded.throttled(transport);
            return None;
        }
        let wait = self
            .backoff
            .delay(attempt)
            .max(error.retry_after().unwrap_or_default());
        if let Some(limit) = self.max_elapsed
            && first_try.elapsed().saturating_add(wait) > limit
        {
            tracing::debug!(
                code = error.code(),
                wait_ms = wait.as_millis() as u64,
                "retry.out_of_time"
            );
            return None;
        }
        // A wait that would end past the send's deadline is not started (DESIGN §19): the
        // caller answers the last error, or the receipt it holds, now.
        if crate::deadline::would_pass(wait) {
            tracing::debug!(
                code = error.code(),
                wait_ms = wait.as_millis() as u64,
                "retry.past_deadline"
            );
            return None;
        }
        Some(wait)
    }
}

#[async_trait::async_trait]
impl<T: Transport> Transport for RetryTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        // Every try of this call under one idempotency key (DESIGN §21).
        crate::idempotency::handover(async {
            let first_try = Instant::now();
            let receipt = self
                .retrying(first_try, || self.inner.send_raw(envelope, raw))
                .await?;
            if !self.leaves_recipients_to_retry(&receipt) {
                return Ok(receipt);
            }
            Ok(self
                .deliver_deferred(receipt, envelope.from(), raw, first_try)
                .await)
        })
        .await
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        crate::idempotency::handover(async {
            let first_try = Instant::now();
            let receipt = self
                .retrying(first_try, || self.inner.send(message))
                .await?;
            if !self.leaves_recipients_to_retry(&receipt) {
                return Ok(receipt);
            }
            let raw = message.formatted();
            Ok(self
                .deliver_deferred(receipt, message.envelope().from(), &raw, first_try)
                .await)
        })
        .await
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        // No handover follows one message from attempt to attempt: its bytes key it.
        let attempts = cascade::send_many(Attempts { retry: self }, messages);
        futures::StreamExt::boxed(crate::idempotency::keyed_by_bytes(attempts))
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.inner.verify().await
    }
}

crate::transport::lettre_async_transport!(RetryTransport<T>, T);

impl<T: fmt::Debug> fmt::Debug for RetryTransport<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryTransport")
            .field("inner", &self.inner)
            .field("max_attempts", &self.policy.max_attempts)
            .field("backoff", &self.policy.backoff)
            .field("max_elapsed", &self.policy.max_elapsed)
            .field("budget", &self.policy.budget)
            .field("at_most_once", &self.policy.at_most_once)
            .finish()
    }
}

/// One `send_many` of the retry transport: stage `k` is try number `k + 1`.
struct Attempts<'a, T> {
    retry: &'a RetryTransport<T>,
}

impl<'a, T: Transport> Stages<'a> for Attempts<'a, T> {
    /// When the message's first try began.
    type Note = Instant;

    fn count(&self) -> usize {
        self.retry.policy.max_attempts as usize
    }

    fn name(&self, _stage: usize) -> &str {
        self.retry.inner.name()
    }

    fn note(&self) -> Instant {
        Instant::now()
    }

    fn send_many(&self, _stage: usize, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        let retry: &'a RetryTransport<T> = self.retry;
        retry.inner.send_many(messages)
    }

    fn judge(
        &self,
        stage: usize,
        first_try: &mut Instant,
        result: Result<Receipt, SendError>,
        repeated: bool,
    ) -> Verdict {
        let attempt = u32::try_from(stage + 1).unwrap_or(u32::MAX);
        let retry = self.retry;
        (retry.policy).judge(retry.inner.name(), attempt, *first_try, result, repeated)
    }
}

/// The handles of a retry transport's counters, each taken at its first use and kept (see
/// [`crate::handles`]), labelled with the inner transport's name; nothing without the
/// `metrics` feature.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    #[cfg(feature = "metrics")]
    retries: crate::handles::Named<::metrics::Counter>,
    #[cfg(feature = "metrics")]
    throttled: crate::handles::Named<::metrics::Counter>,
}

impl Recorded {
    /// A retry through `transport` was scheduled: counted under the `metrics` feature
    /// ([`RETRIES_TOTAL`](crate::metrics::RETRIES_TOTAL)).
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn retry(&self, transport: &str) {
        #[cfg(feature = "metrics")]
        self.retries.record(
            transport,
            |transport| {
                ::metrics::counter!(
                    crate::metrics::RETRIES_TOTAL,
                    "transport" => transport.to_owned()
                )
            },
            |counter| counter.increment(1),
        );
    }

    /// The retry budget refused a retry through `transport`: counted under the `metrics`
    /// feature ([`RETRIES_THROTTLED_TOTAL`](crate::metrics::RETRIES_THROTTLED_TOTAL)).
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn throttled(&self, transport: &str) {
        #[cfg(feature = "metrics")]
        self.throttled.record(
            transport,
            |transport| {
                ::metrics::counter!(
                    crate::metrics::RETRIES_THROTTLED_TOTAL,
                    "transport" => transport.to_owned()
                )
            },
            |counter| counter.increment(1),
        );
    }
}
