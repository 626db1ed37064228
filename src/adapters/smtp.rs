//! [`SmtpTransport`]: lettre's async SMTP transport, each send bounded in time, its errors
//! sorted into [`Category`]s by [`classify_smtp_error`].

use std::fmt;
use std::time::Duration;

use lettre::transport::smtp::Error as SmtpError;
use lettre::transport::smtp::response::Response;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use crate::receipt::SourceText;
use crate::{Category, Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};

/// Sends over SMTP with lettre's pooled async transport.
///
/// lettre's own timeout bounds only the TCP connect: a server that stalls after its greeting
/// would hold a send for as long as it stalls. [`with_timeout`](Self::with_timeout) (default
/// 60 s) bounds each whole send, connect to final reply, and answers `smtp.timeout`.
///
/// `send_many` sends up to [`with_concurrency`](Self::with_concurrency) messages at once over
/// lettre's connection pool (default 10, the pool's default size) and answers in message order.
///
/// lettre's connection pool starts a Tokio task when the lettre transport is built, so build it
/// (and call [`unencrypted`](Self::unencrypted)) inside a Tokio runtime: outside one, lettre
/// panics.
///
/// ```
/// use std::time::Duration;
/// use lettre::{AsyncSmtpTransport, Tokio1Executor};
/// use mail_breaker::SmtpTransport;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let relay = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1").port(2525).build();
/// let smtp = SmtpTransport::new(relay)
///     .with_name("smtp://127.0.0.1:2525")
///     .with_timeout(Duration::from_secs(10));
/// # let _ = smtp;
/// # });
/// ```
#[derive(Clone)]
pub struct SmtpTransport {
    inner: AsyncSmtpTransport<Tokio1Executor>,
    name: String,
    timeout: Duration,
    concurrency: usize,
}

impl SmtpTransport {
    /// Wraps a lettre SMTP transport, named `"smtp"` until [`with_name`](Self::with_name).
    pub fn new(inner: AsyncSmtpTransport<Tokio1Executor>) -> Self {
        SmtpTransport {
            inner,
            name: "smtp".to_owned(),
            timeout: Duration::from_secs(60),
            concurrency: 10,
        }
    }

    /// A transport to a server on `host:port` without TLS or authentication (a local relay,
    /// a test server), named `smtp://host:port`. Call it inside a Tokio runtime (see above).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let smtp = mail_breaker::SmtpTransport::unencrypted("127.0.0.1", 2525);
    /// # use mail_breaker::Transport;
    /// assert_eq!(smtp.name(), "smtp://127.0.0.1:2525");
    /// # });
    /// ```
    pub fn unencrypted(host: &str, port: u16) -> Self {
        let relay = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
            .port(port)
            .build();
        SmtpTransport::new(relay).with_name(format!("smtp://{host}:{port}"))
    }

    /// Sets the name used in logs, receipts and breaker keys.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Bounds each whole send, connect to final reply (default 60 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many messages `send_many` sends at once (default 10; at least 1).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The lettre transport it sends with.
    pub fn inner(&self) -> &AsyncSmtpTransport<Tokio1Executor> {
        &self.inner
    }

    fn receipt(&self, response: &Response) -> Receipt {
        let text = reply_text(response);
        let receipt = Receipt::new(&self.name);
        match queue_id(&text) {
            Some(id) => receipt.with_message_id(id).with_response(text),
            None => receipt.with_response(text),
        }
    }

    fn timed_out(&self) -> SendError {
        SendError::fixed(
            Category::Timeout,
            "smtp.timeout",
            "the server did not finish the send in time",
        )
        .with_transport(&self.name)
    }
}

#[async_trait::async_trait]
impl Transport for SmtpTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        match tokio::time::timeout(self.timeout, self.inner.send_raw(envelope, raw)).await {
            Ok(Ok(response)) => Ok(self.receipt(&response)),
            Ok(Err(error)) => Err(classify_smtp_error(&error).with_transport(&self.name)),
            Err(_elapsed) => Err(self.timed_out()),
        }
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    async fn verify(&self) -> Result<(), SendError> {
        match tokio::time::timeout(self.timeout, self.inner.test_connection()).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(SendError::fixed(
                Category::ServiceUnavailable,
                "smtp.unreachable",
                "the server did not accept a connection",
            )
            .with_transport(&self.name)),
            Ok(Err(error)) => Err(classify_smtp_error(&error).with_transport(&self.name)),
            Err(_elapsed) => Err(self.timed_out()),
        }
    }
}

impl fmt::Debug for SmtpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpTransport")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// Sorts a lettre SMTP error into a [`Category`], with the code `smtp.<reply code>` for a
/// server's reply, else `smtp.timeout`, `smtp.network`, `smtp.tls`, `smtp.client` or
/// `smtp.shutdown`.
///
/// | what happened | category |
/// |---|---|
/// | timeout | Timeout |
/// | 421 | ServiceUnavailable |
/// | 4xx with an RFC 3463 `4.7.x` code that speaks of a rate (`450 4.7.28 rate limited`) | RateLimited |
/// | other 4xx | ServerError |
/// | 530, 534, 535 | Authentication |
/// | other 5xx | Rejected |
/// | TLS, connection, I/O, a reply cut off or unreadable | Network |
/// | lettre's own misuse, a transport shut down | Configuration |
///
/// ```
/// use mail_breaker::{classify_smtp_error, Category};
/// # use lettre::AsyncTransport;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// // Nothing listens on port 1.
/// let relay = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::builder_dangerous("127.0.0.1").port(1).build();
/// let envelope = lettre::address::Envelope::new(None, vec!["a@example.org".parse().unwrap()]).unwrap();
/// let error = relay.send_raw(&envelope, b"Subject: x\r\n\r\nhi").await.unwrap_err();
/// assert_eq!(classify_smtp_error(&error).category(), Category::Network);
/// # });
/// ```
pub fn classify_smtp_error(error: &SmtpError) -> SendError {
    let message = error.to_string();
    let sorted = if error.is_timeout() {
        SendError::new(Category::Timeout, "smtp.timeout", message)
    } else if let Some(code) = error.status() {
        classify_smtp_reply(u16::from(code), &message)
    } else if error.is_client() {
        SendError::new(Category::Configuration, "smtp.client", message)
    } else if error.is_transport_shutdown() {
        SendError::new(Category::Configuration, "smtp.shutdown", message)
    } else if error.is_tls() {
        SendError::new(Category::Network, "smtp.tls", message)
    } else {
        // Connection and I/O errors, and a reply lettre could not read: a connection dropped
        // mid-reply shows up as "incomplete response".
        SendError::new(Category::Network, "smtp.network", message)
    };
    match error_source(error) {
        Some(source) => sorted.with_source(source),
        None => sorted,
    }
}

/// Sorts a server's SMTP reply into a [`Category`], with the code `smtp.<code>`: the rules of
/// [`classify_smtp_error`] for an error that carries a reply, as a pure function of the reply
/// code and its text (which is kept as the error's message, addresses masked).
///
/// Any code and any text land in a category: a code that is not a failure reply at all (a
/// `250` where an error was expected, or a `999`) is `Network`, the server having answered
/// something that is not SMTP.
///
/// ```
/// use mail_breaker::{Category, classify_smtp_reply};
///
/// let error = classify_smtp_reply(450, "450 4.7.28 <bob@example.org> rate limited");
/// assert_eq!(error.category(), Category::RateLimited);
/// assert_eq!(error.code(), "smtp.450");
/// assert!(!error.to_string().contains("bob@"));
/// assert_eq!(classify_smtp_reply(421, "try later").category(), Category::ServiceUnavailable);
/// assert_eq!(classify_smtp_reply(999, "what?").category(), Category::Network);
/// ```
pub fn classify_smtp_reply(code: u16, text: &str) -> SendError {
    SendError::new(reply_category(code, text), format!("smtp.{code}"), text)
}

/// The category of an SMTP reply code, reading the enhanced status code in `text` if any.
fn reply_category(reply: u16, text: &str) -> Category {
    match reply {
        421 => Category::ServiceUnavailable,
        400..=499 if is_rate_limit(text) => Category::RateLimited,
        400..=499 => Category::ServerError,
        530 | 534 | 535 => Category::Authentication,
        500..=599 => Category::Rejected,
        // Not a failure code at all: the server answered something lettre did not expect.
        _ => Category::Network,
    }
}

/// Whether a 4xx reply asks the client to slow down: an RFC 3463 `4.7.x` status with words of
/// rate in the text, or Gmail's `4.7.28` (unusual rate of mail).
fn is_rate_limit(text: &str) -> bool {
    let Some(detail) = enhanced_status(text)
        .and_then(|(class, subject, detail)| (class == 4 && subject == 7).then_some(detail))
    else {
        return false;
    };
    let lower = text.to_ascii_lowercase();
    detail == 28
        || ["rate", "limit", "too many", "throttl", "slow down"]
            .iter()
            .any(|word| lower.contains(word))
}

/// The first RFC 3463 enhanced status code (`class.subject.detail`) in `text`.
fn enhanced_status(text: &str) -> Option<(u16, u16, u16)> {
    text.split(|c: char| c.is_whitespace() || c == ':' || c == ',' || c == '(' || c == ')')
        .find_map(|word| {
            let mut parts = word.split('.');
            let class = parts.next()?;
            let subject = parts.next()?;
            let detail = parts.next()?;
            if parts.next().is_some()
                || class.len() != 1
                || !(1..=3).contains(&subject.len())
                || !(1..=3).contains(&detail.len())
            {
                return None;
            }
            let class: u16 = class.parse().ok()?;
            if !(2..=5).contains(&class) {
                return None;
            }
            Some((class, subject.parse().ok()?, detail.parse().ok()?))
        })
}

fn error_source(error: &SmtpError) -> Option<SourceText> {
    std::error::Error::source(error).map(|source| SourceText::masked(source.to_string()))
}

fn reply_text(response: &Response) -> String {
    let mut text = u16::from(response.code()).to_string();
    for line in response.message() {
        text.push(' ');
        text.push_str(line);
    }
    text
}

/// The queue id in a reply such as `250 2.0.0 Ok: queued as 4F2A1`.
fn queue_id(text: &str) -> Option<String> {
    let rest = &text[text.find("queued as ")? + "queued as ".len()..];
    let id: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_421_is_service_unavailable() {
        assert_eq!(
            reply_category(421, "421 4.3.0 closing"),
            Category::ServiceUnavailable
        );
    }

    #[test]
    fn rate_limit_reply_with_4_7_code_is_rate_limited() {
        assert_eq!(
            reply_category(450, "450 4.7.28 rate limited"),
            Category::RateLimited
        );
        assert_eq!(
            reply_category(451, "451 4.7.1 too many messages, slow down"),
            Category::RateLimited
        );
    }

    #[test]
    fn policy_4_7_reply_without_rate_words_is_server_error() {
        assert_eq!(
            reply_category(450, "450 4.7.1 greylisted"),
            Category::ServerError
        );
    }

    #[test]
    fn rate_words_without_a_4_7_code_are_server_error() {
        assert_eq!(
            reply_category(451, "451 rate of errors too high"),
            Category::ServerError
        );
    }

    #[test]
    fn authentication_replies_are_authentication() {
        for code in [530, 534, 535] {
            assert_eq!(reply_category(code, ""), Category::Authentication);
        }
    }

    #[test]
    fn other_permanent_replies_are_rejected() {
        assert_eq!(
            reply_category(550, "550 5.1.1 unknown user"),
            Category::Rejected
        );
        assert_eq!(reply_category(554, ""), Category::Rejected);
    }

    #[test]
    fn enhanced_status_is_found_after_the_reply_code() {
        assert_eq!(enhanced_status("450 4.7.28 rate limited"), Some((4, 7, 28)));
        assert_eq!(
            enhanced_status("transient error (450): 4.2.2 mailbox full"),
            Some((4, 2, 2))
        );
        assert_eq!(enhanced_status("450 version 1.2.3.4"), None);
        assert_eq!(enhanced_status("no code here"), None);
    }

    #[test]
    fn queue_id_is_read_from_the_reply() {
        assert_eq!(
            queue_id("250 2.0.0 Ok: queued as 4F2A1").as_deref(),
            Some("4F2A1")
        );
        assert_eq!(queue_id("250 Ok"), None);
    }
}
