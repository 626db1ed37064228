//! [`SendGridTransport`]: SendGrid's v3 `/mail/send` API, the formatted message read back
//! into its JSON fields, its errors sorted into [`Category`]s by
//! [`classify_sendgrid_error`].

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use super::client::Answer;
use super::frame::{Call, Provider, Sent};
use super::mime::{Mailbox, ReadMessage};
use super::{ApiKey, HeaderMap, HttpTransport};
use crate::{Category, Envelope, SendError};

mod classify;

pub use classify::classify_sendgrid_error;

/// SendGrid's API for EU regional subusers.
const EU_ENDPOINT: &str = "https://api.eu.sendgrid.com";

/// The API key scope that sending needs.
const MAIL_SEND_SCOPE: &str = "mail.send";

/// Sends through SendGrid's v3 `/mail/send` API with an API key.
///
/// - **The message** is read back from its MIME form into SendGrid's fields: from,
///   personalizations (to, cc, bcc), reply_to (or reply_to_list), subject, content (text
///   first, then HTML, as SendGrid requires), attachments (inline ones with their
///   `content_id`) and headers (every other header, Message-ID included). A structure
///   SendGrid cannot express (a signed message, a calendar alternative, a header given
///   twice, Bcc recipients only) is [`Unsupported`](crate::Category::Unsupported), naming it,
///   so a pool fails over to a transport that takes MIME. Attachments keep their bytes, with
///   a bare `type/subtype` (SendGrid refuses a type with `;`).
/// - **Recipients**: the envelope decides, in one personalization. Envelope recipients in
///   neither To nor Cc go as bcc, so Bcc is kept. The envelope's sender is not sent:
///   SendGrid sets its own bounce address.
/// - **Receipts** carry SendGrid's `X-Message-Id`. SendGrid answers a send with an empty
///   202; a 2xx with a body is not its answer (see [`HttpTransport`]).
/// - **Errors** are sorted by [`classify_sendgrid_error`]; a request that got no answer as
///   the [module table](crate::adapters::http) says. SendGrid takes no idempotency key: a
///   maybe-delivered error, sent again, may deliver twice.
/// - **verify** lists the key's scopes (`GET /v3/scopes`): a bad key is Authentication, and
///   so is a key without the `mail.send` scope (`sendgrid.scope`).
///
/// # Example
/// ```no_run
/// use mail_breaker::{CircuitBreakerTransport, SendGridTransport, Transport};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sendgrid = SendGridTransport::new("SG.key");
/// assert_eq!(sendgrid.name(), "sendgrid");
/// sendgrid.verify().await?;
///
/// let mailer = CircuitBreakerTransport::new(sendgrid);
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse()?)
///     .to("user@example.org".parse()?)
///     .subject("Welcome")
///     .body(String::from("hello"))?;
/// let receipt = mailer.send(&message).await?;
/// println!("SendGrid X-Message-Id {:?}", receipt.message_id());
/// # Ok(())
/// # }
/// ```
pub type SendGridTransport = HttpTransport<SendGrid>;

/// SendGrid's part of a [`SendGridTransport`]: nothing to set beyond the shared settings
/// ([`eu`](HttpTransport::eu) sets the endpoint).
///
/// ```
/// let sendgrid = mail_breaker::SendGridTransport::new("SG.key");
/// assert!(format!("{sendgrid:?}").contains("SendGrid"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct SendGrid;

impl HttpTransport<SendGrid> {
    /// A transport sending with `api_key` to SendGrid's global API, with a 30-second
    /// timeout, named `sendgrid`.
    ///
    /// ```
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key");
    /// # let _ = sendgrid;
    /// ```
    pub fn new(api_key: impl Into<String>) -> Self {
        HttpTransport::with_provider(SendGrid, ApiKey::new(api_key), SendGrid::NAME.to_owned())
    }

    /// Sends to SendGrid's API for EU regional subusers, `https://api.eu.sendgrid.com`.
    ///
    /// ```
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key").eu();
    /// # let _ = sendgrid;
    /// ```
    pub fn eu(self) -> Self {
        self.with_endpoint(EU_ENDPOINT)
    }
}

impl Provider for SendGrid {
    const NAME: &'static str = "sendgrid";
    const TYPE_NAME: &'static str = "SendGridTransport";
    const DEFAULT_ENDPOINT: &'static str = "https://api.sendgrid.com";

    fn authorize(&self, request: reqwest::RequestBuilder, key: &ApiKey) -> reqwest::RequestBuilder {
        request.bearer_auth(key.expose())
    }

    fn send_call(&self, envelope: &Envelope, raw: &[u8]) -> Result<Call, SendError> {
        let message = ReadMessage::read(Self::NAME, envelope, raw)?;
        message.require_to(Self::NAME)?;
        Call::post_json("/v3/mail/send", &mail(&message)?)
    }

    /// SendGrid's answer to a send is an empty body, the id in `X-Message-Id`.
    fn sent(&self, answer: &Answer) -> Sent {
        if !answer.body.trim_ascii().is_empty() {
            return Sent::Foreign;
        }
        Sent::Delivered(answer.header("x-message-id").map(str::to_owned))
    }

    fn classify(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
        classify_sendgrid_error(status, headers, body)
    }

    /// Lists the key's scopes (`GET /v3/scopes`), which any key may.
    fn verify_call(&self) -> Call {
        Call::new(reqwest::Method::GET, "/v3/scopes")
    }

    /// A key without the `mail.send` scope is Authentication (`sendgrid.scope`).
    fn verified(
        &self,
        answer: &Answer,
        failure: impl FnOnce() -> SendError,
    ) -> Result<(), SendError> {
        if !answer.is_success() {
            return Err(failure());
        }
        let scopes = answer
            .json::<Scopes>()
            .map(|s| s.scopes)
            .unwrap_or_default();
        if scopes.iter().any(|scope| scope == MAIL_SEND_SCOPE) {
            Ok(())
        } else {
            Err(SendError::fixed(
                Category::Authentication,
                "sendgrid.scope",
                "the API key lacks the mail.send scope",
            ))
        }
    }
}

/// The `/v3/mail/send` request body.
#[derive(Debug, Serialize)]
struct Mail<'a> {
    personalizations: [Personalization<'a>; 1],
    from: Address<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_to: Option<Address<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reply_to_list: Vec<Address<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    content: Vec<Content<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<Attachment<'a>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<&'a str, &'a str>,
}

#[derive(Debug, Serialize)]
struct Personalization<'a> {
    to: Vec<Address<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cc: Vec<Address<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    bcc: Vec<Address<'a>>,
}

#[derive(Debug, Serialize)]
struct Address<'a> {
    email: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct Content<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    value: &'a str,
}

#[derive(Debug, Serialize)]
struct Attachment<'a> {
    content: String,
    #[serde(rename = "type")]
    content_type: &'a str,
    filename: &'a str,
    disposition: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_id: Option<&'a str>,
}

/// What `/v3/scopes` answers.
#[derive(Debug, Deserialize)]
struct Scopes {
    #[serde(default)]
    scopes: Vec<String>,
}

fn address(mailbox: &Mailbox) -> Address<'_> {
    Address {
        email: &mailbox.address,
        name: mailbox.name.as_deref().filter(|name| !name.is_empty()),
    }
}

fn addresses(mailboxes: &[Mailbox]) -> Vec<Address<'_>> {
    mailboxes.iter().map(address).collect()
}

fn mail(message: &ReadMessage) -> Result<Mail<'_>, SendError> {
    let headers = message.headers_by_name(SendGrid::NAME)?;
    // SendGrid wants text/plain before text/html.
    let content = [
        ("text/plain", message.text.as_deref()),
        ("text/html", message.html.as_deref()),
    ]
    .into_iter()
    .filter_map(|(kind, value)| {
        Some(Content {
            kind,
            value: value?,
        })
    })
    .collect();
    let (reply_to, reply_to_list) = match message.reply_to.as_slice() {
        [] => (None, Vec::new()),
        [one] => (Some(address(one)), Vec::new()),
        many => (None, addresses(many)),
    };
    Ok(Mail {
        personalizations: [Personalization {
            to: addresses(&message.to),
            cc: addresses(&message.cc),
            bcc: addresses(&message.bcc),
        }],
        from: address(&message.from),
        reply_to,
        reply_to_list,
        subject: message.subject.as_deref(),
        content,
        attachments: message
            .attachments
            .iter()
            .map(|attachment| Attachment {
                content: BASE64.encode(&attachment.content),
                content_type: &attachment.content_type,
                filename: &attachment.filename,
                disposition: if attachment.content_id.is_some() {
                    "inline"
                } else {
                    "attachment"
                },
                content_id: attachment.content_id.as_deref(),
            })
            .collect(),
        headers,
    })
}
