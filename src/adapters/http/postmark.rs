//! [`PostmarkTransport`]: Postmark's `/email` API, the formatted message read back into its
//! JSON fields, its errors sorted into [`Category`](crate::Category)s by
//! [`classify_postmark_error`].

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use super::frame::{Call, Provider, Sent};
use super::mime::ReadMessage;
use super::{ApiKey, HeaderMap, HttpTransport};
use crate::{Envelope, SendError};

mod classify;

pub use classify::classify_postmark_error;

/// Sends through Postmark's `/email` API with a server token.
///
/// - **The message** is read back from its MIME form into Postmark's fields: From, To, Cc,
///   Bcc, ReplyTo, Subject, TextBody, HtmlBody, Attachments (inline ones with their
///   `ContentID`) and Headers (every other header, Message-ID included). A structure
///   Postmark cannot express (a signed message, a calendar alternative, Bcc recipients only)
///   is [`Unsupported`](crate::Category::Unsupported), naming it, so a pool fails over to a
///   transport that takes MIME. Attachments keep their bytes and a bare `type/subtype`.
/// - **Recipients**: the envelope decides. Envelope recipients in neither To nor Cc go as
///   Bcc, so Bcc is kept. The envelope's sender is not sent: Postmark sets the bounce
///   address (Return-Path) of its own for the sender's domain.
/// - **Receipts** carry Postmark's `MessageID`; a 2xx without `MessageID` and `ErrorCode` 0
///   is not Postmark's answer (see [`HttpTransport`]).
/// - **Errors** are sorted by [`classify_postmark_error`]; a request that got no answer as
///   the [module table](crate::adapters::http) says. Postmark takes no idempotency key: a
///   maybe-delivered error, sent again, may deliver twice.
/// - **verify** reads the server's settings (`GET /server`), which needs a valid server
///   token: a bad token is Authentication.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use mail_breaker::{CircuitBreakerTransport, PostmarkTransport, Transport};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let postmark = PostmarkTransport::new("server-token")
///     .with_message_stream("outbound")
///     .with_timeout(Duration::from_secs(10));
/// assert_eq!(postmark.name(), "postmark");
/// postmark.verify().await?;
///
/// let mailer = CircuitBreakerTransport::new(postmark);
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse()?)
///     .to("user@example.org".parse()?)
///     .subject("Welcome")
///     .body(String::from("hello"))?;
/// let receipt = mailer.send(&message).await?;
/// println!("Postmark MessageID {:?}", receipt.message_id());
/// # Ok(())
/// # }
/// ```
pub type PostmarkTransport = HttpTransport<Postmark>;

/// Postmark's part of a [`PostmarkTransport`]: the message stream it sends through.
///
/// ```
/// let postmark = mail_breaker::PostmarkTransport::new("token").with_message_stream("broadcast");
/// assert!(format!("{postmark:?}").contains("broadcast"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Postmark {
    message_stream: Option<String>,
}

impl HttpTransport<Postmark> {
    /// A transport sending with the server token `server_token` to Postmark's API, with a
    /// 30-second timeout, named `postmark`.
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("server-token");
    /// # let _ = postmark;
    /// ```
    pub fn new(server_token: impl Into<String>) -> Self {
        HttpTransport::with_provider(
            Postmark::default(),
            ApiKey::new(server_token),
            Postmark::NAME.to_owned(),
        )
    }

    /// Sends every message through this message stream (default: the server's
    /// transactional stream, `outbound`).
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("token").with_message_stream("broadcast");
    /// # let _ = postmark;
    /// ```
    pub fn with_message_stream(mut self, stream: impl Into<String>) -> Self {
        self.provider_mut().message_stream = Some(stream.into());
        self
    }
}

impl Provider for Postmark {
    const NAME: &'static str = "postmark";
    const TYPE_NAME: &'static str = "PostmarkTransport";
    const DEFAULT_ENDPOINT: &'static str = "https://api.postmarkapp.com";

    fn authorize(&self, request: reqwest::RequestBuilder, key: &ApiKey) -> reqwest::RequestBuilder {
        request
            .header("X-Postmark-Server-Token", key.expose())
            .header(reqwest::header::ACCEPT, "application/json")
    }

    fn send_call(&self, envelope: &Envelope, raw: &[u8]) -> Result<Call, SendError> {
        let message = ReadMessage::read(Self::NAME, envelope, raw)?;
        message.require_to(Self::NAME)?;
        Call::post_json("/email", &email(&message, self.message_stream.as_deref()))
    }

    fn sent(&self, answer: &super::client::Answer) -> Sent {
        match answer.json::<Reply>() {
            Some(Reply {
                error_code: Some(0),
                message_id: Some(id),
            }) => Sent::Delivered(Some(id)),
            Some(Reply {
                error_code: Some(code),
                ..
            }) if code != 0 => Sent::Refused,
            _ => Sent::Foreign,
        }
    }

    fn classify(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
        classify_postmark_error(status, headers, body)
    }

    /// Reads the server's settings (`GET /server`), which any valid server token may.
    fn verify_call(&self) -> Call {
        Call::new(reqwest::Method::GET, "/server")
    }
}

/// The `/email` request body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Email<'a> {
    from: String,
    to: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cc: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bcc: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text_body: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html_body: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<Header<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<Attachment<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_stream: Option<&'a str>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Header<'a> {
    name: &'a str,
    value: &'a str,
}

#[derive(Debug, Serialize)]
struct Attachment<'a> {
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "Content")]
    content: String,
    #[serde(rename = "ContentType")]
    content_type: &'a str,
    #[serde(rename = "ContentID", skip_serializing_if = "Option::is_none")]
    content_id: Option<String>,
}

/// What `/email` answers: on success `ErrorCode` 0 and the `MessageID`.
#[derive(Debug, Deserialize)]
struct Reply {
    #[serde(rename = "MessageID")]
    message_id: Option<String>,
    #[serde(rename = "ErrorCode")]
    error_code: Option<i64>,
}

/// Comma-separated addresses in header form, or `None` for none.
fn address_list(mailboxes: &[super::mime::Mailbox]) -> Option<String> {
    if mailboxes.is_empty() {
        return None;
    }
    let list: Vec<String> = mailboxes.iter().map(|m| m.to_header_form()).collect();
    Some(list.join(", "))
}

fn email<'a>(message: &'a ReadMessage, message_stream: Option<&'a str>) -> Email<'a> {
    Email {
        from: message.from.to_header_form(),
        to: address_list(&message.to).unwrap_or_default(),
        cc: address_list(&message.cc),
        bcc: address_list(&message.bcc),
        reply_to: address_list(&message.reply_to),
        subject: message.subject.as_deref(),
        text_body: message.text.as_deref(),
        html_body: message.html.as_deref(),
        headers: message
            .headers
            .iter()
            .map(|(name, value)| Header { name, value })
            .collect(),
        attachments: message
            .attachments
            .iter()
            .map(|attachment| Attachment {
                name: &attachment.filename,
                content: BASE64.encode(&attachment.content),
                content_type: &attachment.content_type,
                content_id: attachment.content_id.as_ref().map(|id| format!("cid:{id}")),
            })
            .collect(),
        message_stream,
    }
}
