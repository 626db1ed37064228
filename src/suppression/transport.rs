//! [`SuppressionTransport`]: the list asked before every send, and suppressed recipients
//! answered without the provider.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{Suppression, SuppressionList, rules};
use crate::{Category, Envelope, Receipt, SendError, Transport};

/// How long a message waits when the list cannot be read, before it is tried again.
const UNREADABLE_WAIT: Duration = Duration::from_secs(5);

/// The code of a recipient held for a while (not suppressed for good).
const HELD: &str = "suppressed.held";

/// A transport that asks a [`SuppressionList`] about every recipient before `inner` sends.
///
/// - A suppressed recipient is answered as `Rejected` with the code of its reason
///   (`suppressed.bounced`, `suppressed.complained`, `suppressed.manual`) in the receipt's
///   [`rejected_recipients`](Receipt::rejected_recipients), and `inner` never hears of it:
///   the message goes to the others alone.
/// - A recipient only held for a while (after repeated transient bounces) is deferred, not
///   refused: `suppressed.held`, `ServiceUnavailable`, not attempted, with the hold's end as
///   its `retry_after`, in the receipt's
///   [`deferred_recipients`](Receipt::deferred_recipients); an outbox sends it once the hold
///   ends. When no recipient may be sent to now and one of them is held, the whole message
///   waits: `Err` `suppressed.held`, not attempted, until the earliest hold ends.
/// - When every recipient is suppressed for good, `inner` is not called at all: the answer is `Err`,
///   `Rejected` and [about the message](SendError::is_about_the_message) (a pool passes no
///   member over for it, an outbox makes it a dead letter at once), coded as the
///   recipients' reason when they share one (`suppressed.mixed` when not), with one cause
///   per recipient in the envelope's order.
/// - When the list cannot be read (its database is down), nothing is sent: the answer is
///   `ServiceUnavailable` `suppression.unavailable`, [not attempted](SendError::is_not_attempted)
///   with a `retry_after` of 5 seconds, so that an outbox keeps the message and tries it
///   again later, and `send_or_queue` queues it. Failing open (sending) would mail an address
///   that bounced or complained whenever the database blinks, the very harm the list is
///   there to prevent; a message held a few seconds costs nothing.
///
/// # Example
/// ```
/// use mail_breaker::outbox::Outbox;
/// use mail_breaker::suppression::{Reason, SuppressionList, SuppressionTransport};
/// use mail_breaker::{LettreTransport, Message, Transport};
/// use lettre::transport::stub::AsyncStubTransport;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
/// list.add("gone@example.org", Reason::Bounced).await?;
/// let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let transport = SuppressionTransport::new(provider, list);
///
/// let message = Message::builder()
///     .from("app@example.com".parse()?)
///     .to("here@example.org".parse()?)
///     .to("gone@example.org".parse()?)
///     .body(String::from("hello"))?;
/// let receipt = transport.send(&message).await?;
/// let (who, why) = &receipt.rejected_recipients()[0];
/// assert_eq!(who.to_string(), "gone@example.org");
/// assert_eq!(why.code(), "suppressed.bounced");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct SuppressionTransport<T> {
    inner: T,
    list: SuppressionList,
}

impl<T> SuppressionTransport<T> {
    /// `inner`, sending only to recipients `list` does not hold.
    ///
    /// ```no_run
    /// # fn run(list: mail_breaker::suppression::SuppressionList, smtp: mail_breaker::SmtpTransport) {
    /// let transport = mail_breaker::suppression::SuppressionTransport::new(smtp, list);
    /// # }
    /// ```
    pub fn new(inner: T, list: SuppressionList) -> Self {
        SuppressionTransport { inner, list }
    }

    /// The transport it sends through.
    ///
    /// ```no_run
    /// # fn run(transport: mail_breaker::suppression::SuppressionTransport<mail_breaker::SmtpTransport>) {
    /// let smtp: &mail_breaker::SmtpTransport = transport.get_ref();
    /// # }
    /// ```
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The transport it sends through, to change.
    ///
    /// ```no_run
    /// # fn run(mut transport: mail_breaker::suppression::SuppressionTransport<mail_breaker::SmtpTransport>) {
    /// let smtp: &mut mail_breaker::SmtpTransport = transport.get_mut();
    /// # }
    /// ```
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The transport it sends through, given back.
    ///
    /// ```no_run
    /// # fn run(transport: mail_breaker::suppression::SuppressionTransport<mail_breaker::SmtpTransport>) {
    /// let smtp: mail_breaker::SmtpTransport = transport.into_inner();
    /// # }
    /// ```
    pub fn into_inner(self) -> T {
        self.inner
    }

    /// The list it asks.
    ///
    /// ```no_run
    /// # fn run(transport: mail_breaker::suppression::SuppressionTransport<mail_breaker::SmtpTransport>) {
    /// let list = transport.list().clone();
    /// # }
    /// ```
    pub fn list(&self) -> &SuppressionList {
        &self.list
    }
}

/// What one suppressed recipient is answered at `now`: a refusal for an address suppressed
/// for good; for one held after repeated transient bounces, a deferral until the hold ends,
/// so that the message waits (in an outbox) instead of dying of a mailbox full for a day.
fn suppressed(entry: &Suppression, now: SystemTime) -> SendError {
    let by = entry
        .provider
        .as_deref()
        .map(|provider| format!(" (reported by {provider})"))
        .unwrap_or_default();
    match entry.until {
        Some(until) => SendError::new(
            Category::ServiceUnavailable,
            HELD,
            format!(
                "the recipient is held after repeated transient bounces: {}{by}; not sent to \
                 the provider before the hold ends",
                entry.reason
            ),
        )
        .with_retry_after(until.duration_since(now).unwrap_or_default())
        .not_attempted(),
        None => SendError::new(
            Category::Rejected,
            entry.reason.code(),
            format!(
                "the recipient is on the suppression list: {}{by}; not sent to the provider",
                entry.reason
            ),
        )
        .about_the_message(),
    }
}

/// The answer when the list cannot be read: nothing is sent, and the message waits.
fn unreadable(error: &super::SuppressionError) -> SendError {
    SendError::new(
        Category::ServiceUnavailable,
        "suppression.unavailable",
        format!(
            "the suppression list could not be read, so nothing was sent (an address on it \
             must never be mailed): {error}"
        ),
    )
    .with_retry_after(UNREADABLE_WAIT)
    .not_attempted()
    .refusing_every_message()
}

#[async_trait]
impl<T: Transport> Transport for SuppressionTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let recipients = envelope.to();
        // A lettre address is always one the list reads; none would be kept under another key.
        let keys: Vec<Option<String>> = recipients
            .iter()
            .map(|to| rules::address_key(to.as_ref()).ok())
            .collect();
        let wanted: Vec<String> = keys.iter().flatten().cloned().collect();
        let found = self
            .list
            .find_keys(&wanted)
            .await
            .map_err(|error| unreadable(&error))?;
        if found.is_empty() {
            return self.inner.send_raw(envelope, raw).await;
        }
        let now = (self.list.clock)();
        let mut refused = Vec::new();
        let mut others = Vec::new();
        for (to, key) in recipients.iter().zip(&keys) {
            let entry = key
                .as_ref()
                .and_then(|key| found.iter().find(|entry| entry.address == *key));
            match entry {
                Some(entry) => refused.push((to.clone(), suppressed(entry, now))),
                None => others.push(to.clone()),
            }
        }
        #[cfg(feature = "metrics")]
        for (_, why) in &refused {
            let reason = why.code().trim_start_matches("suppressed.").to_owned();
            ::metrics::counter!(crate::metrics::SUPPRESSED_TOTAL, "reason" => reason).increment(1);
        }
        if others.is_empty() {
            // A held recipient makes the whole message wait for the earliest hold's end; those
            // suppressed for good are answered when it is tried again.
            if let Some(wait) = refused
                .iter()
                .filter(|(_, why)| why.code() == HELD)
                .filter_map(|(_, why)| why.retry_after())
                .min()
            {
                return Err(every_recipient_held(&refused, wait));
            }
            return Err(every_recipient_suppressed(refused));
        }
        let narrowed = Envelope::new(envelope.from().cloned(), others).map_err(|error| {
            SendError::new(
                Category::InvalidMessage,
                "suppression.envelope",
                format!("the envelope without its suppressed recipients is refused: {error}"),
            )
        })?;
        let receipt = self.inner.send_raw(&narrowed, raw).await?;
        Ok(refused.into_iter().fold(receipt, |receipt, (to, why)| {
            if why.code() == HELD {
                receipt.with_deferred_recipient(to, why)
            } else {
                receipt.with_rejected_recipient(to, why)
            }
        }))
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.inner.verify().await
    }
}

/// The answer when no recipient may be sent to now and some are only held: the message waits
/// `wait`, the earliest hold's end, untried.
fn every_recipient_held(refused: &[(lettre::Address, SendError)], wait: Duration) -> SendError {
    let held = refused.iter().filter(|(_, why)| why.code() == HELD).count();
    SendError::new(
        Category::ServiceUnavailable,
        HELD,
        format!(
            "no recipient may be sent to now: {held} held after repeated transient bounces, \
             the others suppressed; nothing was sent to the provider"
        ),
    )
    .with_retry_after(wait)
    .not_attempted()
    .with_causes(refused.iter().map(|(_, why)| why.clone()).collect())
}

/// The answer when every recipient is suppressed: their shared reason's code (or
/// `suppressed.mixed`), each recipient's refusal a cause.
fn every_recipient_suppressed(refused: Vec<(lettre::Address, SendError)>) -> SendError {
    let first = refused.first().map(|(_, why)| why.code().to_owned());
    let shared = first
        .filter(|code| refused.iter().all(|(_, why)| why.code() == code))
        .unwrap_or_else(|| "suppressed.mixed".to_owned());
    let count = refused.len();
    SendError::new(
        Category::Rejected,
        shared,
        format!(
            "every recipient ({count}) is on the suppression list: nothing was sent to the \
             provider"
        ),
    )
    .about_the_message()
    .with_causes(refused.into_iter().map(|(_, why)| why).collect())
}
