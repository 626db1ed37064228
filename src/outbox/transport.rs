//! [`OutboxTransport`]: the outbox as a [`Transport`], queueing every message or only those
//! the stack cannot send now.

use crate::{Envelope, Receipt, SendError, Transport};

use super::Outbox;

/// A [`Transport`] in front of an [`Outbox`]:
/// - [`queue_only`](Self::queue_only): every send is an enqueue; a worker sends it later.
/// - [`send_or_queue`](Self::send_or_queue): sends through the stack now; a message that
///   failed for a reason a [`Worker`](super::Worker) would send it again for is queued
///   instead: every provider down, `breaker.open`, `pool.exhausted`, `RateLimited`, and a
///   failure of the setup (`Authentication`, `Configuration`, `Unsupported`: an expired
///   password, a token endpoint that answers a page), however many members the stack has.
///   Such a message is due at once; the worker's first failed try then waits its
///   `setup_wait` or backoff, as for any queued message.
///
/// A queued message is answered `Ok` with [`Receipt::is_queued`] true, its
/// [`message_id`](Receipt::message_id) the outbox's id. A message refused for good
/// (`Rejected`, `InvalidMessage`) is answered with its error: queueing would not help.
/// `Err` means the message was neither sent nor kept. A delivery that did not reach every
/// recipient is answered with its receipt; the message is queued for the recipients owed
/// (deferred, and maybe delivered unless `at_most_once`), and the refused ones (and the
/// maybe-delivered under `at_most_once`) are dead letters of their own.
///
/// # Example
/// ```
/// use mail_breaker::outbox::{Outbox, OutboxTransport};
/// use mail_breaker::{LettreTransport, Message, Transport};
/// use lettre::transport::stub::AsyncStubTransport;
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = std::env::temp_dir().join(format!("outbox-transport-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
/// let down = LettreTransport::new(AsyncStubTransport::new_error(), |_| {
///     mail_breaker::SendError::new(mail_breaker::Category::Network, "stub.down", "down")
/// });
/// let transport = OutboxTransport::send_or_queue(outbox.clone(), down);
/// let message = Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("your receipt"))
///     .unwrap();
/// let receipt = transport.send(&message).await?;
/// assert!(receipt.is_queued()); // the provider is down: kept, sent later by a worker
/// assert_eq!(outbox.stats().await?.queued, 1);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), mail_breaker::SendError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct OutboxTransport<T = NoStack> {
    outbox: Outbox,
    stack: Option<T>,
    at_most_once: bool,
}

/// The stack of an [`OutboxTransport::queue_only`]: there is none.
#[derive(Debug, Clone, Copy)]
pub struct NoStack;

impl OutboxTransport<NoStack> {
    /// Every message sent through it is enqueued; a [`Worker`](super::Worker) sends it.
    pub fn queue_only(outbox: Outbox) -> Self {
        OutboxTransport {
            outbox,
            stack: None,
            at_most_once: false,
        }
    }
}

impl<T: Transport> OutboxTransport<T> {
    /// Sends through `stack` now, and queues a message that failed for a reason that may pass.
    /// A message queued after a failure [maybe delivered](SendError::is_maybe_delivered) (at
    /// least once: it is sent again) is answered with a [queued](Receipt::is_queued) receipt
    /// that lists its recipients as [maybe delivered](Receipt::maybe_delivered_recipients):
    /// the resend may make a second copy.
    pub fn send_or_queue(outbox: Outbox, stack: T) -> Self {
        OutboxTransport {
            outbox,
            stack: Some(stack),
            at_most_once: false,
        }
    }

    /// A failure marked [maybe-delivered](SendError::is_maybe_delivered) is answered with
    /// its error rather than queued: the provider may have the message already.
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// The outbox it queues into.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// A delivery that did not reach every recipient (DESIGN §19): the message is queued for
    /// the recipients owed (deferred, as SMTP `450` to their `RCPT TO` answers, and the
    /// maybe-delivered unless `at_most_once`), and the recipients refused beside the others,
    /// or maybe delivered under `at_most_once`, each leave a dead letter of their own, all
    /// in one transaction, as the worker does; the receipt is answered as it is (its lists
    /// say who waits). If the outbox cannot keep them, that is logged: the receipt still
    /// tells the truth.
    async fn keep_owed(&self, envelope: &Envelope, raw: &[u8], receipt: Receipt) -> Receipt {
        let owed = super::schedule::owed_after(&receipt, self.at_most_once);
        if owed.again.is_none() && owed.dead.is_empty() {
            return receipt;
        }
        let sender = envelope.from().map(ToString::to_string);
        // The first try's key: a resend to the owed recipients is a try of the same send.
        let key = super::record::key_to_keep(raw);
        let row = |recipients: &str| super::record::NewRow {
            sender: sender.clone(),
            recipients: recipients.to_owned(),
            raw: raw.to_vec(),
            key: key.clone(),
        };
        let queued: Vec<_> = owed.again.iter().map(|(_, to)| row(to)).collect();
        let dead: Vec<_> = owed
            .dead
            .iter()
            .map(|(error, to)| (row(to), super::record::StoredError::of(error)))
            .collect();
        match self.outbox.keep_split(&queued, &dead).await {
            Ok(()) => {
                tracing::debug!(
                    queued = queued.len(),
                    dead = dead.len(),
                    "outbox.queued_owed"
                );
                // The outbox sends to them again: a retry outside must not (a second copy).
                // Dead letters alone are kept for no one to send again.
                if queued.is_empty() {
                    receipt
                } else {
                    receipt.owed_kept()
                }
            }
            Err(error) => {
                tracing::error!(
                    error = %error,
                    deferred = receipt.deferred_recipients().len(),
                    maybe_delivered = receipt.maybe_delivered_recipients().len(),
                    rejected = receipt.rejected_recipients().len(),
                    "outbox.owed_not_kept"
                );
                receipt
            }
        }
    }

    async fn queue(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let id = self.outbox.enqueue_raw(envelope, raw).await?;
        Ok(Receipt::new("outbox")
            .with_message_id(id.to_string())
            .queued())
    }
}

#[async_trait::async_trait]
impl<T: Transport> Transport for OutboxTransport<T> {
    fn name(&self) -> &str {
        match &self.stack {
            Some(stack) => stack.name(),
            None => "outbox",
        }
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        // The first try's idempotency key is the one the outbox keeps (DESIGN §21).
        crate::idempotency::handover(self.send_or_keep(envelope, raw)).await
    }
}

impl<T: Transport> OutboxTransport<T> {
    async fn send_or_keep(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let Some(stack) = &self.stack else {
            return self.queue(envelope, raw).await;
        };
        let error = match stack.send_raw(envelope, raw).await {
            Ok(receipt) => return Ok(self.keep_owed(envelope, raw, receipt).await),
            Err(error) => error,
        };
        if !super::schedule::sends_again(&error, self.at_most_once) {
            return Err(error);
        }
        match self.queue(envelope, raw).await {
            Ok(receipt) => {
                tracing::debug!(code = error.code(), "outbox.queued_after_failure");
                // Queued to be sent again, and maybe delivered already: the answer says both,
                // since the resend may make a second copy (at least once).
                let receipt = if error.is_maybe_delivered() {
                    envelope.to().iter().fold(receipt, |receipt, to| {
                        receipt.with_maybe_delivered_recipient(to.clone(), error.clone())
                    })
                } else {
                    receipt
                };
                Ok(receipt)
            }
            // Neither sent nor kept: the caller gets the send's error, the database's inside.
            Err(database) => Err(error.with_causes(vec![database])),
        }
    }
}

#[async_trait::async_trait]
impl Transport for NoStack {
    fn name(&self) -> &str {
        "outbox"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        Err(SendError::new(
            crate::Category::Configuration,
            "outbox.no_stack",
            "a queue-only outbox transport has no stack to send through",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_stack_is_named_outbox_and_refuses_every_send_as_a_setup_error() {
        assert_eq!(NoStack.name(), "outbox");
        let message = lettre::Message::builder()
            .from("app@example.com".parse().expect("a sender"))
            .to("user@example.org".parse().expect("a recipient"))
            .body(String::from("hello"))
            .expect("a message");
        let error = NoStack.send(&message).await.expect_err("no stack");
        assert_eq!(error.category(), crate::Category::Configuration);
        assert_eq!(error.code(), "outbox.no_stack");
    }
}
