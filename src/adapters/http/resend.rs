//! [`ResendTransport`]: Resend's `/emails` API with an idempotency key that belongs to one
//! send, its errors sorted into [`Category`](crate::Category)s by
//! [`classify_resend_error`].

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use super::client::Answer;
use super::frame::{Call, Provider, Sent};
use super::mime::{Mailbox, ReadMessage};
use super::{ApiKey, HeaderMap, HttpTransport};
use crate::{Envelope, SendError};

mod classify;

pub use classify::classify_resend_error;

/// Sends through Resend's `/emails` API with an API key.
///
/// - **The message** is read back from its MIME form into Resend's fields: from, to, cc,
///   bcc, reply_to, subject, text, html, attachments (inline ones with their `content_id`)
///   and headers (every other header, Message-ID included). A structure Resend cannot
///   express (a signed message, a calendar alternative, a header given twice, which its
///   `headers` object cannot hold, Bcc recipients only) is
///   [`Unsupported`](crate::Category::Unsupported), naming it, so a pool fails over to a
///   transport that takes MIME. Attachments keep their bytes, with a bare `type/subtype` as
///   `content_type` (the key of Resend's API reference; `contentType` is its Node SDK's).
/// - **Recipients**: the envelope decides. Envelope recipients in neither To nor Cc go as
///   bcc, so Bcc is kept. The envelope's sender is not sent: Resend sets its own bounce
///   address for the sender's domain.
/// - **Receipts** carry Resend's email `id`; a 2xx without one is not Resend's answer (see
///   [`HttpTransport`]).
/// - **Errors** are sorted by [`classify_resend_error`]; a request that got no answer as
///   the [module table](crate::adapters::http) says.
/// - **verify** lists the account's domains (`GET /domains`). A bad key is Authentication;
///   a key restricted to sending (which may not list domains) is `Ok`: it is valid.
///
/// # Idempotency: a retry cannot deliver twice
/// Every request carries an `Idempotency-Key`, the [try's key](crate::idempotency::try_key):
/// the application's own ([`with_key`](crate::idempotency::with_key)), the message's
/// Message-ID, or one made when the application handed the message over (kept with it in
/// the outbox, the same for the retry's every try, the pool's every member and the outbox
/// worker's every attempt), followed by a hash of the recipients the try addresses.
/// Resend answers a request whose key it has seen in the last 24 hours with the first answer
/// and sends nothing again, so a maybe-delivered error (a timeout, a dropped connection) may
/// be retried safely within those 24 hours, by the retry or the outbox, through this
/// transport or any other `ResendTransport` on the same account. Two messages of the same
/// content are two keys, unless they carry the same Message-ID: then they are one message,
/// and the second is answered with the first's result. Resend refuses a key it has seen with
/// another request body (`resend.invalid_idempotent_request`, InvalidMessage): a Message-ID
/// given to two different messages.
///
/// # Example
/// ```no_run
/// use mail_breaker::{CircuitBreakerTransport, ResendTransport, Transport};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let resend = ResendTransport::new("re_123");
/// assert_eq!(resend.name(), "resend");
/// resend.verify().await?;
///
/// let mailer = CircuitBreakerTransport::new(resend);
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse()?)
///     .to("user@example.org".parse()?)
///     .subject("Welcome")
///     .message_id(None)
///     .body(String::from("hello"))?;
/// let receipt = mailer.send(&message).await?;
/// println!("Resend id {:?}", receipt.message_id());
/// # Ok(())
/// # }
/// ```
pub type ResendTransport = HttpTransport<Resend>;

/// Resend's part of a [`ResendTransport`]: nothing to set beyond the shared settings.
///
/// ```
/// let resend = mail_breaker::ResendTransport::new("re_123");
/// assert!(format!("{resend:?}").contains("Resend"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Resend;

impl HttpTransport<Resend> {
    /// A transport sending with `api_key` to Resend's API, with a 30-second timeout, named
    /// `resend`.
    ///
    /// ```
    /// let resend = mail_breaker::ResendTransport::new("re_123");
    /// # let _ = resend;
    /// ```
    pub fn new(api_key: impl Into<String>) -> Self {
        HttpTransport::with_provider(Resend, ApiKey::new(api_key), Resend::NAME.to_owned())
    }
}

impl Provider for Resend {
    const NAME: &'static str = "resend";
    const TYPE_NAME: &'static str = "ResendTransport";
    const DEFAULT_ENDPOINT: &'static str = "https://api.resend.com";

    fn authorize(&self, request: reqwest::RequestBuilder, key: &ApiKey) -> reqwest::RequestBuilder {
        request.bearer_auth(key.expose())
    }

    fn send_call(&self, envelope: &Envelope, raw: &[u8]) -> Result<Call, SendError> {
        let message = ReadMessage::read(Self::NAME, envelope, raw)?;
        message.require_to(Self::NAME)?;
        let key = crate::idempotency::try_key(envelope, message.message_id.as_deref(), raw);
        Ok(Call::post_json("/emails", &email(&message)?)?.header("Idempotency-Key", key))
    }

    fn sent(&self, answer: &Answer) -> Sent {
        match answer.json::<Reply>() {
            Some(reply) => Sent::Delivered(Some(reply.id)),
            None => Sent::Foreign,
        }
    }

    fn classify(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
        classify_resend_error(status, headers, body)
    }

    /// Lists the account's domains (`GET /domains`).
    fn verify_call(&self) -> Call {
        Call::new(reqwest::Method::GET, "/domains")
    }

    /// A key restricted to sending may not list domains, and says so: it is a valid key.
    fn verified(
        &self,
        answer: &Answer,
        failure: impl FnOnce() -> SendError,
    ) -> Result<(), SendError> {
        if answer.is_success() {
            return Ok(());
        }
        let error = failure();
        if error.code() == "resend.restricted_api_key" {
            return Ok(());
        }
        Err(error)
    }
}

/// The `/emails` request body.
#[derive(Debug, Serialize)]
struct Email<'a> {
    from: String,
    to: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cc: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    bcc: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reply_to: Vec<String>,
    subject: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<&'a str, &'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<Attachment<'a>>,
}

#[derive(Debug, Serialize)]
struct Attachment<'a> {
    filename: &'a str,
    content: String,
    content_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_id: Option<&'a str>,
}

/// What `/emails` answers on success.
#[derive(Debug, Deserialize)]
struct Reply {
    id: String,
}

fn header_forms(mailboxes: &[Mailbox]) -> Vec<String> {
    mailboxes.iter().map(Mailbox::to_header_form).collect()
}

fn email(message: &ReadMessage) -> Result<Email<'_>, SendError> {
    let headers = message.headers_by_name(Resend::NAME)?;
    Ok(Email {
        from: message.from.to_header_form(),
        to: header_forms(&message.to),
        cc: header_forms(&message.cc),
        bcc: header_forms(&message.bcc),
        reply_to: header_forms(&message.reply_to),
        subject: message.subject.as_deref().unwrap_or(""),
        text: message.text.as_deref(),
        html: message.html.as_deref(),
        headers,
        attachments: message
            .attachments
            .iter()
            .map(|attachment| Attachment {
                filename: &attachment.filename,
                content: BASE64.encode(&attachment.content),
                content_type: &attachment.content_type,
                content_id: attachment.content_id.as_deref(),
            })
            .collect(),
    })
}
