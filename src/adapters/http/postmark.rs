//! [`PostmarkTransport`]: Postmark's `/email` API, the formatted message read back into its
//! JSON fields, its errors sorted into [`Category`](crate::Category)s by
//! [`classify_postmark_error`].

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use super::mime::ReadMessage;
use super::{HttpClient, base_url};
use crate::{Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};

mod classify;

pub use classify::classify_postmark_error;

/// The name of the provider in codes (`postmark.422.406`) and logs.
const PROVIDER: &str = "postmark";

/// Postmark's API.
const DEFAULT_ENDPOINT: &str = "https://api.postmarkapp.com";

/// Sends through Postmark's `/email` API with a server token.
///
/// - **The message** is read back from its MIME form into Postmark's fields: From, To, Cc,
///   Bcc, ReplyTo, Subject, TextBody, HtmlBody, Attachments (inline ones with their
///   `ContentID`) and Headers (every other header, Message-ID included). A structure
///   Postmark cannot express (a signed message, a calendar alternative) is InvalidMessage,
///   naming it; see [`adapters::http`](crate::adapters::http) for the rules.
/// - **Recipients**: the envelope decides. Envelope recipients in neither To nor Cc go as
///   Bcc, so Bcc is kept. The envelope's sender is not sent: Postmark sets the bounce
///   address (Return-Path) of its own for the sender's domain.
/// - **Receipts** carry Postmark's `MessageID`.
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
#[derive(Clone)]
pub struct PostmarkTransport {
    server_token: String,
    endpoint: String,
    client: HttpClient,
    name: String,
    message_stream: Option<String>,
    concurrency: usize,
}

impl PostmarkTransport {
    /// A transport sending with the server token `server_token` to Postmark's API, with a
    /// 30-second timeout, named `postmark`.
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("server-token");
    /// # let _ = postmark;
    /// ```
    pub fn new(server_token: impl Into<String>) -> Self {
        PostmarkTransport {
            server_token: server_token.into(),
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            client: HttpClient::new(super::DEFAULT_TIMEOUT),
            name: PROVIDER.to_owned(),
            message_stream: None,
            concurrency: 10,
        }
    }

    /// Sends to another base URL than `https://api.postmarkapp.com` (a test server, a proxy).
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("token").with_endpoint("http://127.0.0.1:8080");
    /// # let _ = postmark;
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
    /// let postmark = mail_breaker::PostmarkTransport::new("token").with_timeout(Duration::from_secs(5));
    /// # let _ = postmark;
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.client = HttpClient::new(timeout);
        self
    }

    /// Sets the name used in logs, receipts and breaker keys (default `postmark`).
    ///
    /// ```
    /// use mail_breaker::Transport;
    /// let postmark = mail_breaker::PostmarkTransport::new("token").with_name("postmark-eu");
    /// assert_eq!(postmark.name(), "postmark-eu");
    /// ```
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sends every message through this message stream (default: the server's
    /// transactional stream, `outbound`).
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("token").with_message_stream("broadcast");
    /// # let _ = postmark;
    /// ```
    pub fn with_message_stream(mut self, stream: impl Into<String>) -> Self {
        self.message_stream = Some(stream.into());
        self
    }

    /// How many messages `send_many` sends at once (default 10; at least 1).
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("token").with_concurrency(4);
    /// # let _ = postmark;
    /// ```
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The bound on each request.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let postmark = mail_breaker::PostmarkTransport::new("token");
    /// assert_eq!(postmark.timeout(), Duration::from_secs(30));
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
            .header("X-Postmark-Server-Token", &self.server_token)
            .header(reqwest::header::ACCEPT, "application/json"))
    }

    /// The answer as a [`SendError`], classified without the token in sight.
    fn failure(&self, answer: &super::Answer) -> SendError {
        classify_postmark_error(
            answer.status,
            &answer.headers,
            &answer.body_without(&self.server_token),
        )
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

/// What `/email` answers on success.
#[derive(Debug, Deserialize)]
struct Sent {
    #[serde(rename = "MessageID")]
    message_id: Option<String>,
    #[serde(rename = "ErrorCode", default)]
    error_code: i64,
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

#[async_trait::async_trait]
impl Transport for PostmarkTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let message = ReadMessage::read(PROVIDER, envelope, raw).map_err(tag)?;
        message.require_to(PROVIDER).map_err(tag)?;
        let body = email(&message, self.message_stream.as_deref());
        let request = self
            .request(reqwest::Method::POST, "/email")
            .map_err(tag)?
            .json(&body);
        let answer = self.client.send(PROVIDER, request).await.map_err(tag)?;
        let sent: Option<Sent> = answer.json();
        if !answer.is_success() || sent.as_ref().is_some_and(|sent| sent.error_code != 0) {
            return Err(tag(self.failure(&answer)));
        }
        let receipt = Receipt::new(&self.name);
        match sent.and_then(|sent| sent.message_id) {
            Some(id) => Ok(receipt.with_message_id(id)),
            None => {
                tracing::warn!(transport = %self.name, "Postmark took the message but its answer had no MessageID");
                Ok(receipt)
            }
        }
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    async fn verify(&self) -> Result<(), SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let request = self.request(reqwest::Method::GET, "/server").map_err(tag)?;
        let answer = self.client.send(PROVIDER, request).await.map_err(tag)?;
        if answer.is_success() {
            Ok(())
        } else {
            Err(tag(self.failure(&answer)))
        }
    }
}

impl fmt::Debug for PostmarkTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostmarkTransport")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.client.timeout())
            .field("message_stream", &self.message_stream)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}
