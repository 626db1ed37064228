//! [`SendGridTransport`]: SendGrid's v3 `/mail/send` API, the formatted message read back
//! into its JSON fields, its errors sorted into [`Category`]s by
//! [`classify_sendgrid_error`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use super::mime::{Mailbox, ReadMessage};
use super::{HttpClient, base_url};
use crate::{Category, Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};

mod classify;

pub use classify::classify_sendgrid_error;

/// The name of the provider in codes (`sendgrid.429`) and logs.
const PROVIDER: &str = "sendgrid";

/// SendGrid's global API.
const DEFAULT_ENDPOINT: &str = "https://api.sendgrid.com";

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
///   twice) is InvalidMessage, naming it; see [`adapters::http`](crate::adapters::http).
/// - **Recipients**: the envelope decides, in one personalization. Envelope recipients in
///   neither To nor Cc go as bcc, so Bcc is kept. The envelope's sender is not sent:
///   SendGrid sets its own bounce address.
/// - **Receipts** carry SendGrid's `X-Message-Id`.
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
#[derive(Clone)]
pub struct SendGridTransport {
    api_key: String,
    endpoint: String,
    client: HttpClient,
    name: String,
    concurrency: usize,
}

impl SendGridTransport {
    /// A transport sending with `api_key` to SendGrid's global API, with a 30-second
    /// timeout, named `sendgrid`.
    ///
    /// ```
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key");
    /// # let _ = sendgrid;
    /// ```
    pub fn new(api_key: impl Into<String>) -> Self {
        SendGridTransport {
            api_key: api_key.into(),
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            client: HttpClient::new(super::DEFAULT_TIMEOUT),
            name: PROVIDER.to_owned(),
            concurrency: 10,
        }
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

    /// Sends to another base URL than `https://api.sendgrid.com` (a test server, a proxy).
    ///
    /// ```
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key").with_endpoint("http://127.0.0.1:8080");
    /// # let _ = sendgrid;
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
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key").with_timeout(Duration::from_secs(5));
    /// # let _ = sendgrid;
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.client = HttpClient::new(timeout);
        self
    }

    /// Sets the name used in logs, receipts and breaker keys (default `sendgrid`).
    ///
    /// ```
    /// use mail_breaker::Transport;
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key").with_name("sendgrid-eu");
    /// assert_eq!(sendgrid.name(), "sendgrid-eu");
    /// ```
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many messages `send_many` sends at once (default 10; at least 1).
    ///
    /// ```
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key").with_concurrency(4);
    /// # let _ = sendgrid;
    /// ```
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The bound on each request.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(mail_breaker::SendGridTransport::new("SG.key").timeout(), Duration::from_secs(30));
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
            .bearer_auth(&self.api_key))
    }

    fn failure(&self, answer: &super::Answer) -> SendError {
        classify_sendgrid_error(
            answer.status,
            &answer.headers,
            &answer.body_without(&self.api_key),
        )
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
    let headers = message.headers_by_name(PROVIDER)?;
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

#[async_trait::async_trait]
impl Transport for SendGridTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let message = ReadMessage::read(PROVIDER, envelope, raw).map_err(tag)?;
        message.require_to(PROVIDER).map_err(tag)?;
        let body = mail(&message).map_err(tag)?;
        let request = self
            .request(reqwest::Method::POST, "/v3/mail/send")
            .map_err(tag)?
            .json(&body);
        let answer = self.client.send(PROVIDER, request).await.map_err(tag)?;
        if !answer.is_success() {
            return Err(tag(self.failure(&answer)));
        }
        let receipt = Receipt::new(&self.name);
        match answer.header("x-message-id") {
            Some(id) => Ok(receipt.with_message_id(id)),
            None => {
                tracing::warn!(transport = %self.name, "SendGrid took the message but sent no X-Message-Id");
                Ok(receipt)
            }
        }
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    async fn verify(&self) -> Result<(), SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let request = self
            .request(reqwest::Method::GET, "/v3/scopes")
            .map_err(tag)?;
        let answer = self.client.send(PROVIDER, request).await.map_err(tag)?;
        if !answer.is_success() {
            return Err(tag(self.failure(&answer)));
        }
        let scopes = answer
            .json::<Scopes>()
            .map(|s| s.scopes)
            .unwrap_or_default();
        if scopes.iter().any(|scope| scope == MAIL_SEND_SCOPE) {
            Ok(())
        } else {
            Err(tag(SendError::new(
                Category::Authentication,
                "sendgrid.scope",
                "the API key lacks the mail.send scope",
            )))
        }
    }
}

impl fmt::Debug for SendGridTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendGridTransport")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.client.timeout())
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}
