//! [`MailgunTransport`]: Mailgun's `messages.mime` API, the formatted message uploaded as it
//! is, its errors sorted into [`Category`]s by [`classify_mailgun_error`].

use std::fmt;
use std::time::Duration;

use reqwest::multipart::{Form, Part};
use serde::Deserialize;

use super::{HttpClient, base_url};
use crate::{Category, Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};

mod classify;

pub use classify::classify_mailgun_error;

/// The name of the provider in codes (`mailgun.429`) and logs.
const PROVIDER: &str = "mailgun";

/// Mailgun's API in the US region.
const DEFAULT_ENDPOINT: &str = "https://api.mailgun.net";

/// Mailgun's API in the EU region.
const EU_ENDPOINT: &str = "https://api.eu.mailgun.net";

/// Sends through Mailgun's `messages.mime` API for one sending domain.
///
/// - **The message** goes as it was formatted, a MIME upload (`multipart/form-data`, the
///   message in the `message` field): every structure MIME can hold is sent, signed and
///   calendar messages included.
/// - **Recipients**: the `to` field lists every recipient of the envelope, which is who
///   Mailgun delivers to, so Bcc recipients (in the envelope, not in the headers) are kept.
///   Mailgun sets the bounce address (the envelope's sender) for the domain itself.
/// - **Receipts** carry Mailgun's message `id`, without its angle brackets.
/// - **Errors** are sorted by [`classify_mailgun_error`]; a request that got no answer as
///   the [module table](crate::adapters::http) says. Mailgun takes no idempotency key: a
///   maybe-delivered error, sent again, may deliver twice.
/// - **verify** reads the domain (`GET /v4/domains/<domain>`): a bad key is Authentication;
///   a domain that is not on the account, not verified or disabled is Configuration
///   (`mailgun.404`, `mailgun.domain_unverified`, `mailgun.domain_disabled`).
///
/// # Example
/// ```no_run
/// use mail_breaker::{CircuitBreakerTransport, MailgunTransport, Transport};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mailgun = MailgunTransport::new("key-123", "mg.example.com").eu();
/// assert_eq!(mailgun.name(), "mailgun:mg.example.com");
/// mailgun.verify().await?;
///
/// let mailer = CircuitBreakerTransport::new(mailgun);
/// let message = lettre::Message::builder()
///     .from("app@mg.example.com".parse()?)
///     .to("user@example.org".parse()?)
///     .subject("Welcome")
///     .body(String::from("hello"))?;
/// let receipt = mailer.send(&message).await?;
/// println!("Mailgun id {:?}", receipt.message_id());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MailgunTransport {
    api_key: String,
    domain: String,
    endpoint: String,
    client: HttpClient,
    name: String,
    concurrency: usize,
}

impl MailgunTransport {
    /// A transport sending with `api_key` for the sending domain `domain` to Mailgun's US
    /// API, with a 30-second timeout, named `mailgun:<domain>`.
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com");
    /// # let _ = mailgun;
    /// ```
    pub fn new(api_key: impl Into<String>, domain: impl Into<String>) -> Self {
        let domain = domain.into();
        MailgunTransport {
            api_key: api_key.into(),
            name: format!("{PROVIDER}:{domain}"),
            domain,
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            client: HttpClient::new(super::DEFAULT_TIMEOUT),
            concurrency: 10,
        }
    }

    /// Sends to Mailgun's EU region, `https://api.eu.mailgun.net`, where a domain created
    /// in the EU lives.
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com").eu();
    /// # let _ = mailgun;
    /// ```
    pub fn eu(self) -> Self {
        self.with_endpoint(EU_ENDPOINT)
    }

    /// Sends to another base URL than `https://api.mailgun.net` (a test server, a proxy).
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com")
    ///     .with_endpoint("http://127.0.0.1:8080");
    /// # let _ = mailgun;
    /// ```
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = base_url(url);
        self
    }

    /// Bounds each request (default 30 s); connecting gets half of it (see the
    /// [module table](crate::adapters::http)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com")
    ///     .with_timeout(Duration::from_secs(5));
    /// # let _ = mailgun;
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.client = HttpClient::new(timeout);
        self
    }

    /// Sets the name used in logs, receipts and breaker keys (default `mailgun:<domain>`).
    ///
    /// ```
    /// use mail_breaker::Transport;
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com").with_name("mailgun");
    /// assert_eq!(mailgun.name(), "mailgun");
    /// ```
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many messages `send_many` sends at once (default 10; at least 1).
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com").with_concurrency(4);
    /// # let _ = mailgun;
    /// ```
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The sending domain.
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com");
    /// assert_eq!(mailgun.domain(), "mg.example.com");
    /// ```
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The bound on each request.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com");
    /// assert_eq!(mailgun.timeout(), Duration::from_secs(30));
    /// ```
    pub fn timeout(&self) -> Duration {
        self.client.timeout()
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, SendError> {
        Ok(self
            .client
            .request(PROVIDER, method, &format!("{}{path}", self.endpoint))?
            .basic_auth("api", Some(&self.api_key)))
    }

    fn failure(&self, answer: &super::Answer) -> SendError {
        classify_mailgun_error(
            answer.status,
            &answer.headers,
            &answer.body_without(&self.api_key),
        )
    }

    /// The domain's state as `GET /v4/domains/<domain>` gives it, as an error where it keeps
    /// the domain from sending.
    fn domain_problem(&self, state: &str) -> Option<SendError> {
        let (code, why) = match state.to_ascii_lowercase().as_str() {
            "unverified" => (
                "mailgun.domain_unverified",
                "the sending domain is not verified (its DNS records are missing or wrong)",
            ),
            "disabled" => (
                "mailgun.domain_disabled",
                "the sending domain is disabled on the account",
            ),
            _ => return None,
        };
        Some(SendError::new(Category::Configuration, code, why))
    }
}

/// What `messages.mime` answers on success.
#[derive(Debug, Deserialize)]
struct Queued {
    id: Option<String>,
}

/// What `GET /v4/domains/<domain>` answers.
#[derive(Debug, Deserialize)]
struct DomainAnswer {
    domain: Option<DomainState>,
}

#[derive(Debug, Deserialize)]
struct DomainState {
    state: Option<String>,
}

#[async_trait::async_trait]
impl Transport for MailgunTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        if envelope.to().is_empty() {
            return Err(tag(SendError::new(
                Category::InvalidMessage,
                "mailgun.message",
                "the envelope has no recipient",
            )));
        }
        let recipients: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
        let message = Part::bytes(raw.to_vec())
            .file_name("message.mime")
            .mime_str("message/rfc822")
            .map_err(|_| {
                tag(SendError::new(
                    Category::Configuration,
                    "mailgun.client",
                    "the message part could not be built",
                ))
            })?;
        let form = Form::new()
            .text("to", recipients.join(","))
            .part("message", message);
        let path = format!("/v3/{}/messages.mime", self.domain);
        let request = self
            .request(reqwest::Method::POST, &path)
            .map_err(tag)?
            .multipart(form);
        let answer = self.client.send(PROVIDER, request).await.map_err(tag)?;
        if !answer.is_success() {
            return Err(tag(self.failure(&answer)));
        }
        let receipt = Receipt::new(&self.name);
        match answer.json::<Queued>().and_then(|queued| queued.id) {
            Some(id) => Ok(receipt.with_message_id(id.trim_matches(['<', '>']))),
            None => {
                tracing::warn!(transport = %self.name, "Mailgun queued the message but its answer had no id");
                Ok(receipt)
            }
        }
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    async fn verify(&self) -> Result<(), SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let path = format!("/v4/domains/{}", self.domain);
        let request = self.request(reqwest::Method::GET, &path).map_err(tag)?;
        let answer = self.client.send(PROVIDER, request).await.map_err(tag)?;
        if !answer.is_success() {
            return Err(tag(self.failure(&answer)));
        }
        let state = answer
            .json::<DomainAnswer>()
            .and_then(|answer| answer.domain?.state)
            .unwrap_or_default();
        match self.domain_problem(&state) {
            Some(problem) => Err(tag(problem)),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for MailgunTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailgunTransport")
            .field("name", &self.name)
            .field("domain", &self.domain)
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.client.timeout())
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}
