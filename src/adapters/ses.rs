//! [`SesTransport`]: Amazon SES (API v2) sending raw MIME through `SendEmail`, its errors
//! sorted into [`Category`]s by [`classify_ses_error`].

use std::fmt;
use std::time::Duration;

use aws_sdk_sesv2::Client;
use aws_sdk_sesv2::config::retry::RetryConfig;
use aws_sdk_sesv2::config::timeout::TimeoutConfig;
use aws_sdk_sesv2::operation::get_account::GetAccountOutput;
use aws_sdk_sesv2::primitives::Blob;
use aws_sdk_sesv2::types::{Destination, EmailContent, RawMessage};

use crate::{Category, Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};

mod account;
mod classify;

pub use account::{ACCOUNT_TIMEOUT, SesAccount, SesEnforcement};
pub use classify::classify_ses_error;

/// The operation timeout [`SesTransport::new`] gives a client that has none.
const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends through Amazon SES (API v2): each message goes as raw MIME in one `SendEmail` call.
///
/// - **Recipients**: every recipient of the envelope is passed as a destination address, so
///   Bcc recipients (which are in the envelope, not in the formatted headers) are kept. The
///   envelope's sender, where there is one, is the `FromEmailAddress` (the identity SES checks
///   and the address bounces go to).
/// - **Receipts** carry SES's `MessageId`.
/// - **Errors** are sorted by [`classify_ses_error`]; codes read `ses.<ErrorCode>`.
/// - **Batches**: [`send_many`](Transport::send_many) sends up to
///   [`with_concurrency`](Self::with_concurrency) messages at once (default 10) and answers in
///   message order.
/// - **verify** calls `GetAccount`. An account whose sending is disabled or that SES has shut
///   down is a Configuration error (`ses.SendingPaused`, `ses.AccountSuspended`). A sandboxed
///   account (no production access: it sends only to verified addresses, at a low rate) is
///   `Ok` with a WARN log (`ses.sandbox`), because staging and test setups run in the sandbox
///   on purpose; [`deny_sandbox`](Self::deny_sandbox) makes it an error instead. An account on
///   probation is `Ok` with a WARN log.
///
/// # The SDK's own retries are off
/// The AWS SDK retries throttling, 5xx and transient network errors by itself (3 attempts in
/// the standard mode). Inside this crate a [`CircuitBreakerTransport`](crate::CircuitBreakerTransport)
/// must see every failure and a `RetryTransport` decides when to try
/// again, so [`new`](Self::new) rebuilds the client from its own configuration with
/// [`RetryConfig::disabled()`]: one `SendEmail` call, one HTTP request. Everything else of the
/// client's configuration (region, credentials, endpoint, timeouts, HTTP client) is kept. To
/// let the SDK retry again, pass a retry configuration to
/// [`with_sdk_retries`](Self::with_sdk_retries).
///
/// # Every call is bounded
/// The SDK's default bounds only the connect (3.1 s): a hung answer would keep a send waiting
/// for ever. [`new`](Self::new) gives a client without an operation timeout one of 30 s;
/// [`with_timeout`](Self::with_timeout) sets another. An operation or attempt timeout is
/// `ses.timeout` (Timeout).
///
/// # Maybe delivered
/// A `SendEmail` request that went out and got no answer may have been taken:
/// [`SendError::is_maybe_delivered`](crate::SendError::is_maybe_delivered) is set on an
/// operation, attempt or read timeout, a connection dropped after connecting, and a 2xx whose
/// body was cut off. A failure to connect (refused, DNS, TLS, connect timeout) sent nothing
/// and is not marked. See [`classify_ses_error`].
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
/// use aws_sdk_sesv2::config::timeout::TimeoutConfig;
/// use mail_breaker::{CircuitBreakerTransport, SesTransport, Transport};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = aws_sdk_sesv2::Config::builder()
///     .behavior_version(BehaviorVersion::latest())
///     .region(Region::new("eu-west-1"))
///     .credentials_provider(Credentials::new("AKID", "SECRET", None, None, "static"))
///     .timeout_config(TimeoutConfig::builder().operation_timeout(Duration::from_secs(10)).build())
///     .build();
/// let ses = SesTransport::new(aws_sdk_sesv2::Client::from_conf(config)).with_concurrency(5);
/// assert_eq!(ses.name(), "ses:eu-west-1");
/// ses.verify().await?;
///
/// let mailer = CircuitBreakerTransport::new(ses);
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse()?)
///     .to("user@example.org".parse()?)
///     .body(String::from("hello"))?;
/// let receipt = mailer.send(&message).await?;
/// println!("SES MessageId {:?}", receipt.message_id());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SesTransport {
    client: Client,
    name: String,
    concurrency: usize,
    configuration_set: Option<String>,
    allow_sandbox: bool,
}

impl SesTransport {
    /// Wraps an SES v2 client with the SDK's own retries turned off and, where the client has
    /// no operation timeout, one of 30 s; named `ses:<region>` (`ses` where the client has no
    /// region).
    ///
    /// ```no_run
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client);
    /// let timeouts = ses.client().config().timeout_config().cloned();
    /// assert!(timeouts.and_then(|t| t.operation_timeout()).is_some());
    /// # }
    /// ```
    pub fn new(client: Client) -> Self {
        let name = match client.config().region() {
            Some(region) => format!("ses:{region}"),
            None => "ses".to_owned(),
        };
        let mut timeouts = client
            .config()
            .timeout_config()
            .cloned()
            .unwrap_or_else(|| TimeoutConfig::builder().build());
        if timeouts.operation_timeout().is_none() {
            timeouts = timeouts
                .to_builder()
                .operation_timeout(DEFAULT_OPERATION_TIMEOUT)
                .build();
        }
        let config = client
            .config()
            .to_builder()
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts)
            .build();
        SesTransport {
            client: Client::from_conf(config),
            name,
            concurrency: 10,
            configuration_set: None,
            allow_sandbox: true,
        }
    }

    /// Lets the SDK retry each call with `retry` (see the type's docs on why
    /// [`new`](Self::new) turns its retries off). `RetryConfig::standard()` is the SDK's
    /// default: 3 attempts with exponential backoff.
    ///
    /// ```no_run
    /// use aws_sdk_sesv2::config::retry::RetryConfig;
    /// use mail_breaker::SesTransport;
    ///
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = SesTransport::new(client).with_sdk_retries(RetryConfig::standard().with_max_attempts(3));
    /// # let _ = ses;
    /// # }
    /// ```
    pub fn with_sdk_retries(mut self, retry: RetryConfig) -> Self {
        self.client = with_retry_config(&self.client, retry);
        self
    }

    /// Bounds each call, the answer included, with this operation timeout (default: the
    /// client's, else 30 s); the client's other timeouts stay.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client).with_timeout(Duration::from_secs(10));
    /// # let _ = ses;
    /// # }
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        let timeouts = self
            .client
            .config()
            .timeout_config()
            .map(TimeoutConfig::to_builder)
            .unwrap_or_default()
            .operation_timeout(timeout)
            .build();
        let config = self
            .client
            .config()
            .to_builder()
            .timeout_config(timeouts)
            .build();
        self.client = Client::from_conf(config);
        self
    }

    /// Sets the name used in logs, receipts and breaker keys.
    ///
    /// ```no_run
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client).with_name("ses-marketing");
    /// # let _ = ses;
    /// # }
    /// ```
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many messages `send_many` sends at once (default 10; at least 1). Keep it near the
    /// account's maximum send rate per second, or SES answers `TooManyRequestsException`.
    ///
    /// ```no_run
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client).with_concurrency(14);
    /// # let _ = ses;
    /// # }
    /// ```
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Sends every message with this SES configuration set (event publishing, IP pools).
    ///
    /// ```no_run
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client).with_configuration_set("transactional");
    /// # let _ = ses;
    /// # }
    /// ```
    pub fn with_configuration_set(mut self, name: impl Into<String>) -> Self {
        self.configuration_set = Some(name.into());
        self
    }

    /// Makes [`verify`](Transport::verify) fail (Configuration, `ses.sandbox`) on an account
    /// still in the SES sandbox, for production deployments that must not run there.
    ///
    /// ```no_run
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client).deny_sandbox();
    /// # let _ = ses;
    /// # }
    /// ```
    pub fn deny_sandbox(mut self) -> Self {
        self.allow_sandbox = false;
        self
    }

    /// The SES client it sends with (with the retry configuration it was given).
    ///
    /// ```no_run
    /// # fn run(client: aws_sdk_sesv2::Client) {
    /// let ses = mail_breaker::SesTransport::new(client);
    /// assert_eq!(ses.client().config().retry_config().map(|r| r.max_attempts()), Some(1));
    /// # }
    /// ```
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn configuration_error(&self, code: &'static str, message: &'static str) -> SendError {
        SendError::fixed(Category::Configuration, code, message).with_transport(&self.name)
    }

    /// What keeps the account `GetAccount` describes from sending, if anything; logs what
    /// only deserves a warning (see the type's docs).
    fn account_problem(&self, account: &GetAccountOutput) -> Option<SendError> {
        let enforcement = account.enforcement_status.as_deref().unwrap_or("");
        if enforcement.eq_ignore_ascii_case("SHUTDOWN") {
            return Some(self.configuration_error(
                "ses.AccountSuspended",
                "SES has shut the account down for sending (enforcement status SHUTDOWN)",
            ));
        }
        if !account.sending_enabled {
            return Some(
                self.configuration_error(
                    "ses.SendingPaused",
                    "sending is disabled for the account",
                ),
            );
        }
        if enforcement.eq_ignore_ascii_case("PROBATION") {
            tracing::warn!(
                transport = %self.name,
                code = "ses.probation",
                "the SES account is on probation; it may be shut down for sending"
            );
        }
        if !account.production_access_enabled {
            if !self.allow_sandbox {
                return Some(self.configuration_error(
                    "ses.sandbox",
                    "the account is in the SES sandbox and deny_sandbox() is set",
                ));
            }
            tracing::warn!(
                transport = %self.name,
                code = "ses.sandbox",
                "the SES account is in the sandbox: it sends only to verified addresses"
            );
        }
        None
    }

    /// One `SendEmail` call and its answer.
    async fn send_once(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let recipients = envelope.to().iter().map(ToString::to_string).collect();
        let destination = Destination::builder()
            .set_to_addresses(Some(recipients))
            .build();
        let raw_message = RawMessage::builder()
            .data(Blob::new(raw))
            .build()
            .map_err(|_| {
                self.configuration_error("ses.build", "the raw message could not be built")
            })?;
        // Handed to the client: a deadline's cut from now on may leave the message with SES
        // (DESIGN §19).
        crate::deadline::may_have_reached();
        let output = self
            .client
            .send_email()
            .set_from_email_address(envelope.from().map(ToString::to_string))
            .destination(destination)
            .content(EmailContent::builder().raw(raw_message).build())
            .set_configuration_set_name(self.configuration_set.clone())
            .send()
            .await
            .map_err(|error| classify_ses_error(&error).with_transport(&self.name))?;
        let receipt = Receipt::new(&self.name);
        Ok(match output.message_id {
            Some(id) => receipt.with_message_id(id),
            None => receipt,
        })
    }
}

#[async_trait::async_trait]
impl Transport for SesTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let result = self.send_once(envelope, raw).await;
        // Answered: a deadline's cut from now on (in a layer above, still at work) does not
        // take this try for one in flight (DESIGN §19).
        crate::deadline::try_answered(&result);
        result
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    async fn verify(&self) -> Result<(), SendError> {
        let account = self
            .client
            .get_account()
            .send()
            .await
            .map_err(|error| classify_ses_error(&error).with_transport(&self.name))?;
        match self.account_problem(&account) {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }
}

/// The same client with another retry configuration; everything else of its configuration
/// (region, credentials, endpoint, timeouts, HTTP client) is kept.
fn with_retry_config(client: &Client, retry: RetryConfig) -> Client {
    Client::from_conf(client.config().to_builder().retry_config(retry).build())
}

impl fmt::Debug for SesTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SesTransport")
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .field("configuration_set", &self.configuration_set)
            .field("allow_sandbox", &self.allow_sandbox)
            .finish_non_exhaustive()
    }
}
