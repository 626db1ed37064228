//! [`MailgunTransport`]: Mailgun's `messages.mime` API, the formatted message uploaded as it
//! is, its errors sorted into [`Category`]s by [`classify_mailgun_error`].

use reqwest::multipart::{Form, Part};
use serde::Deserialize;

use super::client::Answer;
use super::frame::{Call, CallBody, Provider, Sent};
use super::{ApiKey, HeaderMap, HttpTransport};
use crate::{Category, Envelope, SendError};

mod classify;

pub use classify::classify_mailgun_error;

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
/// - **Receipts** carry Mailgun's message `id`, without its angle brackets; a 2xx without
///   one is not Mailgun's answer (see [`HttpTransport`]).
/// - **Errors** are sorted by [`classify_mailgun_error`]; a request that got no answer as
///   the [module table](crate::adapters::http) says. Mailgun takes no idempotency key: a
///   maybe-delivered error, sent again, may deliver twice.
/// - **verify** posts an empty form to `messages.mime` (no recipient, no message: nothing can
///   be sent), the one call a least-privilege domain sending key may make; reading the
///   domain (`GET /v4/domains/<domain>`) needs a key with more rights. Mailgun checks the key
///   and the domain first: a bad key is Authentication (401), a domain the key cannot send
///   for is Configuration (404, or a 400/403 saying the domain is disabled, unverified or
///   sandboxed). The plain 400 for the missing fields means the key may send: `Ok`.
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
pub type MailgunTransport = HttpTransport<Mailgun>;

/// Mailgun's part of a [`MailgunTransport`]: the sending domain.
///
/// ```
/// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com");
/// assert!(format!("{mailgun:?}").contains("mg.example.com"));
/// ```
#[derive(Debug, Clone)]
pub struct Mailgun {
    domain: String,
}

impl HttpTransport<Mailgun> {
    /// A transport sending with `api_key` for the sending domain `domain` to Mailgun's US
    /// API, with a 30-second timeout, named `mailgun:<domain>`.
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com");
    /// # let _ = mailgun;
    /// ```
    pub fn new(api_key: impl Into<String>, domain: impl Into<String>) -> Self {
        let domain = domain.into();
        let name = format!("{}:{domain}", Mailgun::NAME);
        HttpTransport::with_provider(Mailgun { domain }, ApiKey::new(api_key), name)
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

    /// The sending domain.
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com");
    /// assert_eq!(mailgun.domain(), "mg.example.com");
    /// ```
    pub fn domain(&self) -> &str {
        &self.provider().domain
    }
}

impl Mailgun {
    /// The upload path of the domain.
    fn messages_path(&self) -> String {
        format!("/v3/{}/messages.mime", self.domain)
    }
}

/// What `messages.mime` answers on success.
#[derive(Debug, Deserialize)]
struct Queued {
    id: String,
}

impl Provider for Mailgun {
    const NAME: &'static str = "mailgun";
    const TYPE_NAME: &'static str = "MailgunTransport";
    const DEFAULT_ENDPOINT: &'static str = "https://api.mailgun.net";

    fn authorize(&self, request: reqwest::RequestBuilder, key: &ApiKey) -> reqwest::RequestBuilder {
        request.basic_auth("api", Some(key.expose()))
    }

    fn send_call(&self, envelope: &Envelope, raw: &[u8]) -> Result<Call, SendError> {
        if envelope.to().is_empty() {
            return Err(SendError::fixed(
                Category::InvalidMessage,
                "mailgun.message",
                "the envelope has no recipient",
            ));
        }
        let recipients: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
        let message = Part::bytes(raw.to_vec())
            .file_name("message.mime")
            .mime_str("message/rfc822")
            .map_err(|_| {
                SendError::fixed(
                    Category::Configuration,
                    "mailgun.client",
                    "the message part could not be built",
                )
            })?;
        let form = Form::new()
            .text("to", recipients.join(","))
            .part("message", message);
        Ok(Call {
            body: CallBody::Form(form),
            template: Some("/v3/{domain}/messages.mime"),
            ..Call::new(reqwest::Method::POST, self.messages_path())
        })
    }

    fn sent(&self, answer: &Answer) -> Sent {
        match answer.json::<Queued>() {
            Some(queued) => Sent::Delivered(Some(queued.id.trim_matches(['<', '>']).to_owned())),
            None => Sent::Foreign,
        }
    }

    fn classify(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
        classify_mailgun_error(status, headers, body)
    }

    /// An empty form to `messages.mime`: see the type's docs.
    fn verify_call(&self) -> Call {
        Call {
            body: CallBody::Form(Form::new()),
            template: Some("/v3/{domain}/messages.mime"),
            ..Call::new(reqwest::Method::POST, self.messages_path())
        }
    }

    fn verified(
        &self,
        answer: &Answer,
        failure: impl FnOnce() -> SendError,
    ) -> Result<(), SendError> {
        if answer.is_success() {
            return Ok(());
        }
        let error = failure();
        // The plain 400 for the fields left out: the key and the domain passed.
        if error.category() == Category::InvalidMessage {
            return Ok(());
        }
        Err(error)
    }
}
