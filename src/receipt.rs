//! What a send returns: a [`Receipt`] on delivery, a [`SendError`] with a [`Category`] otherwise.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::inline::InlineStr;

impl PartialEq for Receipt {
    /// Receipts are equal when every part is; a rejected recipient's error compares by its
    /// category and code.
    fn eq(&self, other: &Self) -> bool {
        let same_rejections = same_refusals(&self.rejected, &other.rejected);
        self.transport == other.transport
            && self.message_id == other.message_id
            && self.response == other.response
            && self.attempts == other.attempts
            && same_rejections
            && same_refusals(&self.deferred, &other.deferred)
            && same_refusals(&self.maybe_delivered, &other.maybe_delivered)
            && self.transactions == other.transactions
    }
}

impl Eq for Receipt {}

/// Whether two lists of refused recipients are the same, each error by its category and code.
fn same_refusals(a: &[(lettre::Address, SendError)], b: &[(lettre::Address, SendError)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            a.0 == b.0 && a.1.category() == b.1.category() && a.1.code() == b.1.code()
        })
}

/// Proof that a transport accepted a message.
///
/// # Example
/// ```
/// use mail_breaker::Receipt;
///
/// let receipt = Receipt::new("smtp://relay.example.com:587")
///     .with_message_id("4F2A1")
///     .with_response("250 2.0.0 Ok: queued as 4F2A1");
/// assert_eq!(receipt.transport(), "smtp://relay.example.com:587");
/// assert_eq!(receipt.message_id(), Some("4F2A1"));
/// assert_eq!(receipt.attempts(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct Receipt {
    transport: String,
    message_id: Option<String>,
    response: Option<String>,
    attempts: u32,
    /// Recipients the provider refused while it accepted the others; empty almost always.
    rejected: Vec<(lettre::Address, SendError)>,
    /// Recipients the provider refused for now (a 4xx) while it accepted the others.
    deferred: Vec<(lettre::Address, SendError)>,
    /// Recipients whose transaction's data went out and whose answer never came.
    maybe_delivered: Vec<(lettre::Address, SendError)>,
    /// Each transaction the provider accepted, where it says (SMTP); empty otherwise.
    transactions: Vec<AcceptedTransaction>,
    /// Kept in an outbox to be sent later, not delivered yet.
    queued: bool,
    /// The recipients it lists as owed (deferred, maybe delivered) are kept in an outbox.
    owed_kept: bool,
}

impl Receipt {
    /// A receipt from the transport named `transport` (the leaf that delivered, not a wrapper).
    pub fn new(transport: impl Into<String>) -> Self {
        Receipt {
            transport: transport.into(),
            message_id: None,
            response: None,
            attempts: 1,
            rejected: Vec::new(),
            deferred: Vec::new(),
            maybe_delivered: Vec::new(),
            transactions: Vec::new(),
            queued: false,
            owed_kept: false,
        }
    }

    /// Marks the message as kept in an outbox to be sent later rather than delivered:
    /// [`OutboxTransport`](crate::outbox::OutboxTransport) answers so when it queued.
    ///
    /// ```
    /// # use mail_breaker::Receipt;
    /// let receipt = Receipt::new("outbox").with_message_id("42").queued();
    /// assert!(receipt.is_queued());
    /// assert!(!Receipt::new("smtp://relay:25").is_queued());
    /// ```
    pub fn queued(mut self) -> Self {
        self.queued = true;
        self
    }

    /// Whether the message was queued in an outbox (its [`message_id`](Self::message_id) is
    /// then the outbox's id) rather than delivered.
    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// Marks the recipients this receipt lists as owed (deferred, maybe delivered) as kept
    /// in an outbox, which sends to them again:
    /// [`OutboxTransport::send_or_queue`](crate::outbox::OutboxTransport::send_or_queue)
    /// answers so when it kept them.
    ///
    /// ```
    /// use mail_breaker::{Category, Receipt, SendError};
    ///
    /// let later = SendError::new(Category::ServerError, "smtp.450", "greylisted");
    /// let receipt = Receipt::new("smtp://relay:25")
    ///     .with_deferred_recipient("bob@example.org".parse()?, later)
    ///     .owed_kept();
    /// assert!(receipt.is_kept_for_later());
    /// # Ok::<(), lettre::address::AddressError>(())
    /// ```
    pub fn owed_kept(mut self) -> Self {
        self.owed_kept = true;
        self
    }

    /// Whether an outbox keeps the recipients this receipt lists as owed (deferred, maybe
    /// delivered) to send to them again, or queued the whole message
    /// ([`is_queued`](Self::is_queued)). A layer outside, such as a
    /// [`RetryTransport`](crate::RetryTransport) around
    /// [`send_or_queue`](crate::outbox::OutboxTransport::send_or_queue), must then not send to
    /// them itself: that would be a second copy.
    ///
    /// ```
    /// # use mail_breaker::Receipt;
    /// assert!(Receipt::new("outbox").queued().is_kept_for_later());
    /// assert!(!Receipt::new("smtp://relay:25").is_kept_for_later());
    /// ```
    pub fn is_kept_for_later(&self) -> bool {
        self.queued || self.owed_kept
    }

    /// Adds the provider's id for the message (an SES MessageId, an SMTP queue id).
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// Adds the provider's reply, e.g. `"250 2.0.0 Ok: queued as 4F2A1"`.
    pub fn with_response(mut self, text: impl Into<String>) -> Self {
        self.response = Some(text.into());
        self
    }

    /// Sets how many tries it took; [`RetryTransport`](crate::RetryTransport) sets this.
    ///
    /// ```
    /// # use mail_breaker::Receipt;
    /// assert_eq!(Receipt::new("stub").with_attempts(3).attempts(), 3);
    /// ```
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// Notes a recipient the provider refused while it accepted the message for the others
    /// (SMTP answers each `RCPT TO` on its own), with why.
    ///
    /// ```
    /// use mail_breaker::{Category, Receipt, SendError};
    ///
    /// let why = SendError::new(Category::Rejected, "smtp.550", "550 5.1.1 no such user");
    /// let receipt = Receipt::new("smtp://relay:25")
    ///     .with_rejected_recipient("bob@example.org".parse().unwrap(), why);
    /// assert_eq!(receipt.rejected_recipients().len(), 1);
    /// assert_eq!(receipt.rejected_recipients()[0].1.category(), Category::Rejected);
    /// ```
    pub fn with_rejected_recipient(mut self, to: lettre::Address, why: SendError) -> Self {
        self.rejected.push((to, why));
        self
    }

    /// The recipients the provider refused while it accepted the others, each with why; empty
    /// when every recipient was accepted.
    pub fn rejected_recipients(&self) -> &[(lettre::Address, SendError)] {
        &self.rejected
    }

    /// Notes a recipient the provider refused for now (SMTP `450` greylisting, `451`) while
    /// it accepted the message for the others, with why. [`RetryTransport`](crate::RetryTransport)
    /// sends the message again to these recipients only.
    ///
    /// ```
    /// use mail_breaker::{Category, Receipt, SendError};
    ///
    /// let why = SendError::new(Category::ServerError, "smtp.450", "450 4.2.0 greylisted");
    /// let receipt = Receipt::new("smtp://relay:25")
    ///     .with_deferred_recipient("bob@example.org".parse().unwrap(), why);
    /// assert_eq!(receipt.deferred_recipients().len(), 1);
    /// assert!(receipt.rejected_recipients().is_empty());
    /// ```
    pub fn with_deferred_recipient(mut self, to: lettre::Address, why: SendError) -> Self {
        self.deferred.push((to, why));
        self
    }

    /// The recipients the provider refused for now while it accepted the others, each with
    /// why: the message has not reached them yet, and a later try may deliver it. Empty when
    /// every recipient was accepted.
    ///
    /// ```
    /// # use mail_breaker::Receipt;
    /// assert!(Receipt::new("stub").deferred_recipients().is_empty());
    /// ```
    pub fn deferred_recipients(&self) -> &[(lettre::Address, SendError)] {
        &self.deferred
    }

    /// Takes the deferred recipients out, leaving none: for a retry that sends to them.
    pub(crate) fn take_deferred_recipients(&mut self) -> Vec<(lettre::Address, SendError)> {
        std::mem::take(&mut self.deferred)
    }

    /// Notes a recipient that may have the message: the data of the transaction that carried
    /// it went out and no answer came (the connection dropped, or the send's time ran out),
    /// while the message was delivered to others. Its error is marked
    /// [`maybe_delivered`](SendError::maybe_delivered).
    ///
    /// ```
    /// use mail_breaker::{Category, Receipt, SendError};
    ///
    /// let why = SendError::new(Category::Timeout, "smtp.timeout", "no answer to the final dot");
    /// let receipt = Receipt::new("smtp://relay:25")
    ///     .with_maybe_delivered_recipient("bob@example.org".parse().unwrap(), why);
    /// assert_eq!(receipt.maybe_delivered_recipients().len(), 1);
    /// assert!(receipt.maybe_delivered_recipients()[0].1.is_maybe_delivered());
    /// assert!(receipt.deferred_recipients().is_empty());
    /// ```
    pub fn with_maybe_delivered_recipient(mut self, to: lettre::Address, why: SendError) -> Self {
        self.maybe_delivered.push((to, why.maybe_delivered()));
        self
    }

    /// The recipients that may have the message although no answer said so, each with why
    /// (its error [`is_maybe_delivered`](SendError::is_maybe_delivered)): sending to them
    /// again may deliver twice. [`RetryTransport`](crate::RetryTransport) sends to them again
    /// only when it was not built with
    /// [`at_most_once`](crate::RetryBuilder::at_most_once). Every recipient of the envelope
    /// that is in none of the rejected, deferred and maybe-delivered lists was delivered.
    ///
    /// ```
    /// # use mail_breaker::Receipt;
    /// assert!(Receipt::new("stub").maybe_delivered_recipients().is_empty());
    /// ```
    pub fn maybe_delivered_recipients(&self) -> &[(lettre::Address, SendError)] {
        &self.maybe_delivered
    }

    /// Takes the maybe-delivered recipients out, leaving none: for a retry that sends to them.
    pub(crate) fn take_maybe_delivered_recipients(&mut self) -> Vec<(lettre::Address, SendError)> {
        std::mem::take(&mut self.maybe_delivered)
    }

    /// Notes one transaction the provider accepted. The first one noted also gives the
    /// receipt its [`response`](Self::response) and [`message_id`](Self::message_id) where
    /// those are not set yet.
    ///
    /// ```
    /// use mail_breaker::{AcceptedTransaction, Receipt};
    ///
    /// let first = AcceptedTransaction::new(
    ///     "250 2.0.0 Ok: queued as 4F2A1",
    ///     vec!["ann@example.org".parse().unwrap()],
    /// )
    /// .with_message_id("4F2A1");
    /// let second = AcceptedTransaction::new(
    ///     "250 2.0.0 Ok: queued as 4F2B7",
    ///     vec!["bob@example.org".parse().unwrap()],
    /// )
    /// .with_message_id("4F2B7");
    /// let receipt = Receipt::new("smtp://relay:25")
    ///     .with_transaction(first)
    ///     .with_transaction(second);
    /// assert_eq!(receipt.message_id(), Some("4F2A1"));
    /// assert_eq!(receipt.transactions()[1].message_id(), Some("4F2B7"));
    /// ```
    pub fn with_transaction(mut self, transaction: AcceptedTransaction) -> Self {
        if self.transactions.is_empty() {
            if self.response.is_none() {
                self.response = Some(transaction.response.clone());
            }
            if self.message_id.is_none() {
                self.message_id = transaction.message_id.clone();
            }
        }
        self.transactions.push(transaction);
        self
    }

    /// Each transaction the provider accepted, in order, with its reply, queue id and
    /// recipients: one for an SMTP message, more where the server took the recipients in
    /// several transactions (`452 4.5.3`, too many recipients for one), or where a retry sent
    /// the message again to recipients deferred. Empty for a provider that does not speak of
    /// transactions (the HTTP APIs). [`response`](Self::response) and
    /// [`message_id`](Self::message_id) are the first transaction's.
    ///
    /// ```
    /// # use mail_breaker::Receipt;
    /// assert!(Receipt::new("stub").transactions().is_empty());
    /// ```
    pub fn transactions(&self) -> &[AcceptedTransaction] {
        &self.transactions
    }

    /// The name of the transport that delivered the message.
    pub fn transport(&self) -> &str {
        &self.transport
    }

    /// The provider's id for the message, where it gave one.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// The provider's reply, where it gave one.
    pub fn response(&self) -> Option<&str> {
        self.response.as_deref()
    }

    /// How many tries the delivery took: 1 unless a retry transport tried again.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// One transaction a provider accepted: its reply, the queue id the reply names, and the
/// recipients it carried, so that an operator can trace each recipient to the server's log
/// (Postfix gives each transaction a queue id of its own). See [`Receipt::transactions`].
///
/// ```
/// use mail_breaker::AcceptedTransaction;
///
/// let transaction = AcceptedTransaction::new(
///     "250 2.0.0 Ok: queued as 4F2A1",
///     vec!["ann@example.org".parse().unwrap()],
/// )
/// .with_message_id("4F2A1");
/// assert_eq!(transaction.response(), "250 2.0.0 Ok: queued as 4F2A1");
/// assert_eq!(transaction.message_id(), Some("4F2A1"));
/// assert_eq!(transaction.recipients()[0].to_string(), "ann@example.org");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedTransaction {
    response: String,
    message_id: Option<String>,
    recipients: Vec<lettre::Address>,
}

impl AcceptedTransaction {
    /// A transaction the provider accepted with the reply `response`, for `recipients`.
    pub fn new(response: impl Into<String>, recipients: Vec<lettre::Address>) -> Self {
        AcceptedTransaction {
            response: response.into(),
            message_id: None,
            recipients,
        }
    }

    /// Adds the provider's id for this transaction (an SMTP queue id).
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// The provider's reply to the transaction's data, e.g. `"250 2.0.0 Ok: queued as 4F2A1"`.
    pub fn response(&self) -> &str {
        &self.response
    }

    /// The provider's id for the transaction, where its reply names one.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// The recipients this transaction delivered to.
    pub fn recipients(&self) -> &[lettre::Address] {
        &self.recipients
    }
}

/// What kind of failure a [`SendError`] is; decides retrying, failover and breaker counting.
///
/// ```
/// use mail_breaker::Category;
///
/// assert!(Category::Timeout.is_breaker_failure());
/// assert!(Category::RateLimited.is_retryable());
/// assert!(!Category::RateLimited.is_breaker_failure());
/// assert!(!Category::Rejected.is_retryable());
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// Connection refused or reset, DNS, TLS handshake, dropped mid-transaction.
    Network,
    /// No answer in time.
    Timeout,
    /// The provider failed: SMTP 451/452, HTTP 500.
    ServerError,
    /// The provider says it is down: SMTP 421, HTTP 503; also `breaker.open`, `pool.exhausted`.
    ServiceUnavailable,
    /// The provider is up and asks us to slow down: HTTP 429, SMTP 4.7.x rate codes.
    RateLimited,
    /// The provider refused this message or recipient: SMTP 5xx, SES MessageRejected.
    Rejected,
    /// Credentials refused: SMTP 535, SES 403.
    Authentication,
    /// The message itself cannot be sent: no recipients, too large.
    InvalidMessage,
    /// The transport is set up wrong, or was shut down.
    Configuration,
    /// This transport cannot carry this message, which another could: a signed message or a
    /// calendar invitation through a JSON API, a second body. A pool fails over, a breaker
    /// counts the provider as working, and a retry does not try the same transport again.
    ///
    /// ```
    /// use mail_breaker::Category;
    ///
    /// assert!(!Category::Unsupported.is_retryable());
    /// assert!(!Category::Unsupported.is_breaker_failure());
    /// assert_eq!(Category::Unsupported.as_str(), "unsupported");
    /// ```
    Unsupported,
}

impl Category {
    /// Whether trying the same message again later may succeed:
    /// Network, Timeout, ServerError, ServiceUnavailable and RateLimited.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Category::Network
                | Category::Timeout
                | Category::ServerError
                | Category::ServiceUnavailable
                | Category::RateLimited
        )
    }

    /// Whether the error says the provider is failing, which a breaker counts:
    /// Network, Timeout, ServerError and ServiceUnavailable.
    pub fn is_breaker_failure(self) -> bool {
        matches!(
            self,
            Category::Network
                | Category::Timeout
                | Category::ServerError
                | Category::ServiceUnavailable
        )
    }

    /// The category's name in snake case, as used in logs.
    ///
    /// ```
    /// assert_eq!(mail_breaker::Category::RateLimited.as_str(), "rate_limited");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Network => "network",
            Category::Timeout => "timeout",
            Category::ServerError => "server_error",
            Category::ServiceUnavailable => "service_unavailable",
            Category::RateLimited => "rate_limited",
            Category::Rejected => "rejected",
            Category::Authentication => "authentication",
            Category::InvalidMessage => "invalid_message",
            Category::Configuration => "configuration",
            Category::Unsupported => "unsupported",
        }
    }

    /// Every category, in the order declared.
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))] // read back from the outbox's table
    pub(crate) const ALL: [Category; 10] = [
        Category::Network,
        Category::Timeout,
        Category::ServerError,
        Category::ServiceUnavailable,
        Category::RateLimited,
        Category::Rejected,
        Category::Authentication,
        Category::InvalidMessage,
        Category::Configuration,
        Category::Unsupported,
    ];

    /// The category named `name` (as [`as_str`](Self::as_str) writes it).
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))] // read back from the outbox's table
    pub(crate) fn from_name(name: &str) -> Option<Category> {
        Category::ALL
            .into_iter()
            .find(|category| category.as_str() == name)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a message was not sent.
///
/// It clones cheaply (its source is kept in an `Arc`) so that one failure can answer every
/// message of a batch. Its `Display` shows the transport, code and a message in which every
/// e-mail address has its local part masked; it never holds a message body or credentials.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use mail_breaker::{Category, SendError};
///
/// let err = SendError::new(Category::ServiceUnavailable, "smtp.421", "550 <bob@example.org> try later")
///     .with_retry_after(Duration::from_secs(30))
///     .with_transport("smtp://relay.example.com:587");
/// assert!(err.is_retryable());
/// assert_eq!(err.code(), "smtp.421");
/// assert!(!err.to_string().contains("bob@"));
/// ```
#[derive(Debug, Clone)]
pub struct SendError {
    category: Category,
    code: Cow<'static, str>,
    message: Cow<'static, str>,
    retry_after: Option<Duration>,
    /// In place when short, so that a breaker's refusals and a batch failure's clones copy
    /// no string and count no reference; shared when long.
    transport: Option<TransportName>,
    batch_failure: bool,
    maybe_delivered: bool,
    not_attempted: bool,
    about_the_message: bool,
    /// A refusal that holds every message back, not only this one's recipients: see
    /// [`SendError::refusing_every_message`].
    every_message: bool,
    /// A member held back by its reputation breaker (`reputation.open`).
    reputation_hold: bool,
    /// Set on a reputation hold whose member allows failover (`reputation.failover=true`).
    hold_fails_over: bool,
    /// What few errors carry, boxed so that every `Result<_, SendError>` stays small.
    details: Option<Box<Details>>,
}

/// A transport's name in an error: the names of nearly all transports fit in place.
type TransportName = InlineStr<30>;

/// The rarely set parts of a [`SendError`].
#[derive(Debug, Clone, Default)]
struct Details {
    source: Option<Source>,
    causes: Vec<SendError>,
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = self.details.as_ref()?.source.as_ref()?;
        Some(&**source as &(dyn std::error::Error + 'static))
    }
}

impl SendError {
    /// A new error. `code` is a short machine-readable code such as `"smtp.421"`; e-mail
    /// addresses in `message` are masked (`***@example.org`).
    pub fn new(category: Category, code: impl Into<String>, message: impl Into<String>) -> Self {
        SendError::from_parts(
            category,
            Cow::Owned(code.into()),
            Cow::Owned(mask_addresses(message.into())),
        )
    }

    /// An error whose code and message are known at compile time; allocates nothing.
    pub(crate) fn fixed(category: Category, code: &'static str, message: &'static str) -> Self {
        SendError::from_parts(category, Cow::Borrowed(code), Cow::Borrowed(message))
    }

    fn from_parts(category: Category, code: Cow<'static, str>, message: Cow<'static, str>) -> Self {
        SendError {
            category,
            code,
            message,
            retry_after: None,
            transport: None,
            batch_failure: false,
            maybe_delivered: false,
            not_attempted: false,
            about_the_message: false,
            every_message: false,
            reputation_hold: false,
            hold_fails_over: false,
            details: None,
        }
    }

    /// Says how long to wait before trying again.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Keeps the lower-level error that caused this one (see [`std::error::Error::source`]).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.details.get_or_insert_default().source = Some(Arc::new(source));
        self
    }

    /// Names the transport the error came from.
    pub fn with_transport(mut self, name: impl Into<String>) -> Self {
        self.transport = Some(TransportName::new(&name.into()));
        self
    }

    /// Names the transport the error came from with a name already shared; allocates nothing.
    pub(crate) fn with_shared_transport(mut self, name: &Arc<str>) -> Self {
        self.transport = Some(TransportName::shared(name));
        self
    }

    /// Marks the error as the failure of a whole batch (see [`Transport::send_many`](crate::Transport::send_many)).
    pub fn batch_failure(mut self) -> Self {
        self.batch_failure = true;
        self
    }

    /// The same error as one message's answer: no longer the end of a batch. A wrapper that
    /// passes a batch failure on for one message, while its own stream goes on, clears the
    /// flag, so that the caller does not take it for the end of the wrapper's batch.
    pub(crate) fn for_one_message(mut self) -> Self {
        self.batch_failure = false;
        self
    }

    /// Marks that the provider may have taken the message although the send failed: the
    /// connection dropped or timed out after SMTP's final dot, or an HTTP request went out
    /// and no answer came. Sending it again may deliver it twice.
    ///
    /// ```
    /// use mail_breaker::{Category, SendError};
    ///
    /// let lost = SendError::new(Category::Timeout, "smtp.timeout", "no reply after the final dot")
    ///     .maybe_delivered();
    /// assert!(lost.is_maybe_delivered());
    /// assert!(!SendError::new(Category::Timeout, "smtp.timeout", "no greeting").is_maybe_delivered());
    /// ```
    pub fn maybe_delivered(mut self) -> Self {
        self.maybe_delivered = true;
        self
    }

    /// Whether the provider may have taken the message (see [`maybe_delivered`](Self::maybe_delivered)).
    /// [`RetryTransport`](crate::RetryTransport) and [`PoolTransport`](crate::PoolTransport)
    /// built with `at_most_once` return such an error as it is rather than send again.
    pub fn is_maybe_delivered(&self) -> bool {
        self.maybe_delivered
    }

    /// Marks that the message never reached the provider: a wrapper refused it before any
    /// send (`rate.limited` from a [`RateLimitTransport`](crate::RateLimitTransport),
    /// `breaker.open` from a breaker, `pool.exhausted` when no member sent). Such an error is
    /// no news of the provider's health: a [`CircuitBreakerTransport`](crate::CircuitBreakerTransport)
    /// around the wrapper counts it neither as a success nor as a failure, and a half-open
    /// breaker whose probe was not attempted stays half-open for the next send.
    ///
    /// ```
    /// use mail_breaker::{Category, SendError};
    ///
    /// let refused = SendError::new(Category::RateLimited, "myapp.quota", "the day's quota is spent")
    ///     .not_attempted();
    /// assert!(refused.is_not_attempted());
    /// assert!(!SendError::new(Category::RateLimited, "smtp.421", "slow down").is_not_attempted());
    /// ```
    pub fn not_attempted(mut self) -> Self {
        self.not_attempted = true;
        self
    }

    /// Whether the message never reached the provider (see [`not_attempted`](Self::not_attempted)).
    pub fn is_not_attempted(&self) -> bool {
        self.not_attempted
    }

    /// Marks that the failure is about this one message, not about the transport that
    /// answered it: a sender identity the provider has not verified (SES's "Email address is
    /// not verified", Postmark's sender signature errors), a body the server cannot carry, a
    /// send that panicked. The next message may well go, so a
    /// [`PoolTransport`](crate::PoolTransport) does not pass the member over for it, as it
    /// does for a failure of the member itself (credentials, account, endpoint).
    ///
    /// ```
    /// use mail_breaker::{Category, SendError};
    ///
    /// let unverified = SendError::new(Category::Configuration, "ses.MessageRejected", "sender not verified")
    ///     .about_the_message();
    /// assert!(unverified.is_about_the_message());
    /// assert!(!SendError::new(Category::Authentication, "smtp.535", "bad password").is_about_the_message());
    /// ```
    pub fn about_the_message(mut self) -> Self {
        self.about_the_message = true;
        self
    }

    /// Whether the failure is about this one message rather than the member (see
    /// [`about_the_message`](Self::about_the_message)).
    pub fn is_about_the_message(&self) -> bool {
        self.about_the_message
    }

    /// Marks a [not-attempted](Self::not_attempted) refusal that holds back every message the
    /// transport is handed, whatever its recipients: a breaker scoped by transport, or
    /// isolated; a rate limit; a pool member passed over. A breaker scoped by recipient
    /// domain refuses one domain's mail and leaves this unmarked. An outbox worker pauses as a
    /// whole only for such a refusal (DESIGN §19); for any other it moves that message alone.
    pub(crate) fn refusing_every_message(mut self) -> Self {
        self.every_message = true;
        self
    }

    /// The same error, answering a call whose earlier try may have reached the provider (a
    /// retry whose last try was refused): no longer [not attempted](Self::is_not_attempted),
    /// so that an outbox counts the attempt.
    pub(crate) fn attempted_before(mut self) -> Self {
        self.not_attempted = false;
        self.every_message = false;
        self
    }

    /// Whether this refusal holds back every message (see
    /// [`refusing_every_message`](Self::refusing_every_message)).
    pub(crate) fn refuses_every_message(&self) -> bool {
        self.every_message && self.not_attempted
    }

    /// Marks a refusal of a [`ReputationTransport`](crate::reputation::ReputationTransport)
    /// whose breaker opened on the member's bounces or complaints; `fails_over` when the
    /// member allows a pool to hand its mail to the next member.
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    pub(crate) fn held_for_reputation(mut self, fails_over: bool) -> Self {
        self.reputation_hold = true;
        self.hold_fails_over = fails_over;
        self
    }

    /// Whether the member was held back by its reputation breaker (`reputation.open`): its
    /// provider is not down, its account's bounces or complaints came near the provider's
    /// own limits, and only a person lets its mail go again. A
    /// [`PoolTransport`](crate::PoolTransport) returns such an error as it is, without
    /// failing over (that would burn the next account too), unless the member allows it;
    /// an outbox keeps the message until the breaker is reset.
    ///
    /// ```
    /// use mail_breaker::{Category, SendError};
    ///
    /// let down = SendError::new(Category::ServiceUnavailable, "smtp.421", "try later");
    /// assert!(!down.is_reputation_hold());
    /// ```
    pub fn is_reputation_hold(&self) -> bool {
        self.reputation_hold
    }

    /// Whether a pool may hand a [reputation hold](Self::is_reputation_hold)'s message to
    /// its next member: the member set `reputation.failover=true`.
    pub(crate) fn hold_fails_over(&self) -> bool {
        self.hold_fails_over
    }

    /// The same refusal, no longer holding back every message: a pool answers it for one
    /// member whose mail waits while the other members' mail goes.
    pub(crate) fn for_one_member(mut self) -> Self {
        self.every_message = false;
        self
    }

    /// Keeps the errors this one sums up, e.g. each pool member's error in `pool.exhausted`.
    ///
    /// ```
    /// # use mail_breaker::{Category, SendError};
    /// let a = SendError::new(Category::Timeout, "smtp.timeout", "no answer");
    /// let all = SendError::new(Category::ServiceUnavailable, "pool.exhausted", "every member failed")
    ///     .with_causes(vec![a]);
    /// assert_eq!(all.causes()[0].code(), "smtp.timeout");
    /// ```
    pub fn with_causes(mut self, causes: Vec<SendError>) -> Self {
        self.details.get_or_insert_default().causes = causes;
        self
    }

    /// What kind of failure this is.
    pub fn category(&self) -> Category {
        self.category
    }

    /// A short machine-readable code: `"smtp.421"`, `"ses.TooManyRequestsException"`,
    /// `"breaker.open"`, `"pool.exhausted"`.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The human-readable description, addresses masked.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// How long to wait before trying again, where known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether trying again later may succeed (see [`Category::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        self.category.is_retryable()
    }

    /// Whether this error answers a whole batch rather than one message.
    pub fn is_batch_failure(&self) -> bool {
        self.batch_failure
    }

    /// The transport the error came from, where known.
    pub fn transport(&self) -> Option<&str> {
        self.transport.as_ref().map(TransportName::as_str)
    }

    /// The errors this one sums up (each pool member's, for `pool.exhausted`).
    pub fn causes(&self) -> &[SendError] {
        self.details
            .as_ref()
            .map_or(&[], |details| details.causes.as_slice())
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(transport) = &self.transport {
            write!(f, "{}: ", transport.as_str())?;
        }
        write!(f, "{} ({}): {}", self.code, self.category, self.message)?;
        if let Some(after) = self.retry_after {
            write!(f, "; retry after {} ms", after.as_millis())?;
        }
        Ok(())
    }
}

/// Replaces the local part of every e-mail address in `text` with `***`, so that logs and
/// error messages never carry a full recipient address.
pub(crate) fn mask_addresses(text: String) -> String {
    if !text.contains('@') {
        return text;
    }
    let is_local = |c: char| c.is_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.\"".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find('@') {
        let before = &rest[..at];
        let local_start = before
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_local(c))
            .last()
            .map_or(at, |(i, _)| i);
        out.push_str(&before[..local_start]);
        if local_start < at {
            out.push_str("***");
        }
        out.push('@');
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

/// The text of an error's cause, addresses masked: kept as a [`SendError`]'s source where the
/// cause itself cannot be shared between clones.
#[derive(Debug)]
#[cfg_attr(not(any(feature = "smtp", feature = "ses")), allow(dead_code))]
pub(crate) struct SourceText(String);

#[cfg_attr(not(any(feature = "smtp", feature = "ses")), allow(dead_code))]
impl SourceText {
    pub(crate) fn masked(text: String) -> Self {
        SourceText(mask_addresses(text))
    }
}

impl fmt::Display for SourceText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SourceText {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_are_equal_only_when_every_part_is_including_the_maybe_delivered_and_transactions() {
        let bob: lettre::Address = "bob@example.org".parse().expect("an address");
        let lost = SendError::new(Category::Timeout, "smtp.timeout", "no answer to the dot");
        let transaction = AcceptedTransaction::new("250 2.0.0 Ok: queued as 4F2A1", vec![]);
        let full = Receipt::new("smtp://relay:25")
            .with_transaction(transaction.clone())
            .with_maybe_delivered_recipient(bob.clone(), lost.clone());
        assert_eq!(full, full.clone());
        let other_transport = Receipt::new("smtp://other:25")
            .with_transaction(transaction.clone())
            .with_maybe_delivered_recipient(bob.clone(), lost.clone());
        assert_ne!(full, other_transport);
        let no_maybe_delivered = Receipt::new("smtp://relay:25").with_transaction(transaction);
        assert_ne!(full, no_maybe_delivered);
        let other_transaction = Receipt::new("smtp://relay:25")
            .with_response("250 2.0.0 Ok: queued as 4F2A1")
            .with_transaction(AcceptedTransaction::new(
                "250 2.0.0 Ok: queued as 4F2B7",
                vec![],
            ))
            .with_maybe_delivered_recipient(bob, lost);
        assert_ne!(full, other_transaction);
    }

    #[test]
    fn addresses_in_messages_are_masked() {
        let masked =
            mask_addresses("550 5.1.1 <bob.smith+x@example.org>: unknown, cc a@b.c".into());
        assert_eq!(masked, "550 5.1.1 <***@example.org>: unknown, cc ***@b.c");
    }

    #[test]
    fn text_without_addresses_is_kept() {
        assert_eq!(mask_addresses("421 try later".into()), "421 try later");
        assert_eq!(mask_addresses("@ alone".into()), "@ alone");
    }

    #[test]
    fn a_result_with_a_send_error_stays_small() {
        // clippy's result_large_err starts at 128 bytes; the hot path moves results around.
        assert!(std::mem::size_of::<SendError>() < 128);
    }

    #[test]
    fn source_and_causes_are_kept() {
        let cause = SendError::new(Category::Timeout, "smtp.timeout", "no answer");
        let err = SendError::new(Category::Network, "smtp.network", "reset")
            .with_source(std::io::Error::other("connection reset"))
            .with_causes(vec![cause]);
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("connection reset"));
        assert_eq!(err.causes()[0].code(), "smtp.timeout");
        assert!(std::error::Error::source(&err.causes()[0]).is_none());
    }

    #[test]
    fn display_names_transport_code_and_category() {
        let err = SendError::new(Category::Timeout, "smtp.timeout", "no answer in 1 s")
            .with_transport("smtp://x:25");
        assert_eq!(
            err.to_string(),
            "smtp://x:25: smtp.timeout (timeout): no answer in 1 s"
        );
    }
}
