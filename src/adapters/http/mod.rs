//! Transports for HTTP e-mail APIs: [`PostmarkTransport`](crate::PostmarkTransport),
//! [`ResendTransport`](crate::ResendTransport), [`SendGridTransport`](crate::SendGridTransport)
//! and [`MailgunTransport`](crate::MailgunTransport), one feature each, sharing the one small
//! HTTP helper in this file.
//!
//! # What a failed request means
//! Every provider's transport sorts a request that got no HTTP answer the same way:
//!
//! | what happened | category | maybe delivered |
//! |---|---|---|
//! | the connection could not be made (refused, DNS, TLS handshake) | Network (`<provider>.network`) | no: nothing was sent |
//! | no connection within half the timeout | Timeout (`<provider>.timeout`) | no: nothing was sent |
//! | no answer within the timeout once the request went out | Timeout (`<provider>.timeout`) | **yes** |
//! | the connection dropped after the request went out | Network (`<provider>.network`) | **yes** |
//! | the request could not be built (a malformed endpoint URL) | Configuration (`<provider>.client`) | no |
//!
//! "Maybe delivered" ([`SendError::is_maybe_delivered`]) says the provider may have taken the
//! message: sending it again may deliver it twice. Resend alone takes an idempotency key
//! (derived from the Message-ID), so that sending the same message again within 24 hours is
//! answered without a second delivery; Postmark, SendGrid and Mailgun have no such key.
//!
//! A 2xx answer whose body cannot be read is a delivery: the receipt then has no message id,
//! and a WARN is logged.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use reqwest::header::HeaderMap;

use crate::{Category, SendError};

#[cfg(any(feature = "postmark", feature = "resend", feature = "sendgrid"))]
pub(crate) mod mime;

#[cfg(feature = "mailgun")]
pub mod mailgun;
#[cfg(feature = "postmark")]
pub mod postmark;
#[cfg(feature = "resend")]
pub mod resend;
#[cfg(feature = "sendgrid")]
pub mod sendgrid;

/// How long a request may take unless the transport is given another timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest provider message kept in a [`SendError`]; error messages are a sentence or two.
const MAX_MESSAGE_CHARS: usize = 300;

/// A reqwest client whose requests are bounded by one timeout, or why none could be built.
///
/// Building a client only fails when the TLS backend cannot start; the transports' `new`
/// cannot return an error, so the reason is kept and every request answers with it.
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: Result<reqwest::Client, Arc<str>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client whose requests each take at most `timeout`, connecting within half of it.
    pub(crate) fn new(timeout: Duration) -> Self {
        // Half, so that a connect that hangs ends as a connect failure (nothing sent) before
        // the whole request's timeout, which would mean "maybe delivered".
        let connect_timeout = timeout / 2;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            .user_agent(concat!("mail-breaker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| Arc::from(error.to_string()));
        HttpClient { client, timeout }
    }

    /// The bound on each request.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A request to `url`, or a Configuration error when no client could be built.
    pub(crate) fn request(
        &self,
        provider: &str,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, SendError> {
        match &self.client {
            Ok(client) => Ok(client.request(method, url)),
            Err(why) => Err(SendError::new(
                Category::Configuration,
                format!("{provider}.client"),
                format!("no HTTP client could be built: {why}"),
            )),
        }
    }

    /// Sends `request` and reads the answer, whatever its status; an error only when no
    /// answer came (see the module's table).
    pub(crate) async fn send(
        &self,
        provider: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Answer, SendError> {
        let response = request
            .send()
            .await
            .map_err(|error| request_failure(provider, &error, self.timeout))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = match response.bytes().await {
            Ok(body) => body.to_vec(),
            Err(error) => {
                tracing::warn!(
                    provider,
                    status,
                    error = %error,
                    "the body of the provider's answer could not be read"
                );
                Vec::new()
            }
        };
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

/// A provider's HTTP answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    /// Whether the provider took the request (a 2xx status).
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body read as JSON into `T`, or `None` when it is not that.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.body).ok()
    }

    /// A header's value, where it is there and is text.
    #[cfg(feature = "sendgrid")]
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// The body with every occurrence of `secret` (the API key) replaced: what a classifier
    /// may read, so that no error can carry the key.
    pub(crate) fn body_without(&self, secret: &str) -> Vec<u8> {
        redact(&String::from_utf8_lossy(&self.body), secret).into_bytes()
    }
}

/// Sorts a request that got no HTTP answer (see the module's table).
pub(crate) fn request_failure(
    provider: &str,
    error: &reqwest::Error,
    timeout: Duration,
) -> SendError {
    let source = crate::receipt::SourceText::masked(error_chain(error));
    let sorted = if error.is_builder() {
        SendError::new(
            Category::Configuration,
            format!("{provider}.client"),
            "the request could not be built (is the endpoint a valid URL?)",
        )
    } else if error.is_connect() && error.is_timeout() {
        SendError::new(
            Category::Timeout,
            format!("{provider}.timeout"),
            format!(
                "no connection to {provider} within {} ms",
                (timeout / 2).as_millis()
            ),
        )
    } else if error.is_connect() {
        SendError::new(
            Category::Network,
            format!("{provider}.network"),
            format!("the connection to {provider} could not be made"),
        )
    } else if error.is_timeout() {
        SendError::new(
            Category::Timeout,
            format!("{provider}.timeout"),
            format!(
                "{provider} did not answer within {} ms; it may have taken the message",
                timeout.as_millis()
            ),
        )
        .maybe_delivered()
    } else {
        SendError::new(
            Category::Network,
            format!("{provider}.network"),
            format!(
                "the connection to {provider} dropped before it answered; it may have taken the message"
            ),
        )
        .maybe_delivered()
    };
    sorted.with_source(source)
}

/// An error and its causes as one line: reqwest's own text says only "error sending request".
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// The answer's `Retry-After` (seconds or an HTTP-date), capped at a day.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    crate::time::parse_retry_after(value, SystemTime::now())
}

/// The category an HTTP status says by itself, for the statuses every provider shares:
/// 401/403 Authentication, 400/413/422 InvalidMessage, 429 RateLimited, 503
/// ServiceUnavailable, other 5xx ServerError, anything else Configuration (a wrong endpoint
/// or method).
pub(crate) fn category_of_status(status: u16) -> Category {
    match status {
        401 | 403 => Category::Authentication,
        400 | 413 | 422 => Category::InvalidMessage,
        429 => Category::RateLimited,
        503 => Category::ServiceUnavailable,
        500..=599 => Category::ServerError,
        _ => Category::Configuration,
    }
}

/// A classified answer as a [`SendError`]: the message cut short (and at its first sentence
/// for Authentication), the `Retry-After` kept, and a 504 marked maybe delivered (a gateway
/// gave up waiting on a provider that may have taken the message).
pub(crate) fn answer_error(
    category: Category,
    code: String,
    status: u16,
    message: &str,
    headers: &HeaderMap,
) -> SendError {
    let text = if message.trim().is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {}", safe_message(message, category))
    };
    let mut sorted = SendError::new(category, code, text);
    if let Some(after) = retry_after(headers) {
        sorted = sorted.with_retry_after(after);
    }
    if status == 504 {
        sorted = sorted.maybe_delivered();
    }
    sorted
}

/// A provider's message fit for logs: addresses are masked by [`SendError::new`]; this cuts
/// it short, and an authentication message at its first sentence.
fn safe_message(message: &str, category: Category) -> String {
    let message = message.trim();
    let message = if category == Category::Authentication {
        match message.find(". ") {
            Some(end) => &message[..=end],
            None => message,
        }
    } else {
        message
    };
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &message[..cut]),
        None => message.to_owned(),
    }
}

/// `text` with every occurrence of `secret` replaced, so that a provider that echoes the API
/// key back cannot put it into an error.
pub(crate) fn redact(text: &str, secret: &str) -> String {
    if secret.len() < 4 {
        return text.to_owned();
    }
    text.replace(secret, "[redacted]")
}

/// `endpoint` without a trailing slash, so that paths can be appended to it.
pub(crate) fn base_url(endpoint: impl Into<String>) -> String {
    let mut endpoint = endpoint.into();
    while endpoint.ends_with('/') {
        endpoint.pop();
    }
    endpoint
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_and_authentication_at_the_first_sentence() {
        let long = "x".repeat(1000);
        assert!(safe_message(&long, Category::ServerError).len() < 400);
        assert_eq!(
            safe_message("Bad token. It was abc", Category::Authentication),
            "Bad token."
        );
    }

    #[test]
    fn a_secret_is_redacted() {
        assert_eq!(
            redact("key sk-123456 is wrong", "sk-123456"),
            "key [redacted] is wrong"
        );
    }

    #[test]
    fn a_504_is_maybe_delivered_and_retry_after_is_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "3".parse().expect("a header value"));
        let error = answer_error(Category::ServerError, "x.504".into(), 504, "", &headers);
        assert!(error.is_maybe_delivered());
        assert_eq!(error.retry_after(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn trailing_slashes_are_dropped_from_endpoints() {
        assert_eq!(base_url("http://127.0.0.1:9/"), "http://127.0.0.1:9");
    }
}
