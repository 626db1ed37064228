//! Transports for HTTP e-mail APIs: [`PostmarkTransport`](crate::PostmarkTransport),
//! [`ResendTransport`](crate::ResendTransport), [`SendGridTransport`](crate::SendGridTransport),
//! [`MailgunTransport`](crate::MailgunTransport) and Microsoft Graph's `GraphTransport`
//! (feature `graph`), one feature each, sharing one frame,
//! [`HttpTransport`]: the settings and setters, the request and the reading of the answer are
//! written once; each provider's file holds only its request, its success answer, its error
//! table and its `verify`.
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
//! (one per send, made when the application hands the message over:
//! [`idempotency`](crate::idempotency)), so that sending the same message again within 24
//! hours is answered without a second delivery; Postmark, SendGrid, Mailgun and Microsoft
//! Graph have no such key.
//!
//! # What an answer means
//! - A 3xx is not followed: Configuration (`<provider>.<status>`), nothing delivered.
//! - A 2xx with the provider's success answer is a delivery, its message id on the receipt.
//! - A 2xx with any other body (HTML from a proxy, a wrong endpoint) is ServerError
//!   (`<provider>.unexpected_answer`), **maybe delivered**.
//! - A 2xx whose body is unreadable, that is cut off by a dropped connection or by the
//!   timeout in the middle of it, is a delivery without a message id, and a WARN is logged:
//!   the status said the provider took the message.
//! - Any other status is sorted by the provider's table; every table sorts 408 as Timeout.
//! - Only the first 64 KiB of a body are read; the rest is dropped unread.

use std::time::Duration;

pub use reqwest::header::HeaderMap;

use crate::adapters::answer::safe_message;
use crate::{Category, SendError};

mod client;
mod frame;
mod key;

pub use frame::HttpTransport;
pub use key::ApiKey;

#[cfg(any(feature = "postmark", feature = "resend", feature = "sendgrid"))]
pub(crate) mod mime;

#[cfg(feature = "graph")]
pub mod graph;
#[cfg(feature = "mailgun")]
pub mod mailgun;
#[cfg(feature = "postmark")]
pub mod postmark;
#[cfg(feature = "resend")]
pub mod resend;
#[cfg(feature = "sendgrid")]
pub mod sendgrid;

/// The answer's `Retry-After` (seconds or an HTTP-date), capped at a day.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    crate::adapters::answer::retry_after(value)
}

/// The category an HTTP status says by itself, for the statuses every provider shares:
/// 401/403 Authentication, 400/413/422 InvalidMessage, 408 Timeout (the provider gave up
/// waiting for the request), 429 RateLimited, 503 ServiceUnavailable, other 5xx
/// ServerError, anything else Configuration (a redirect, a wrong endpoint or method).
pub(crate) fn category_of_status(status: u16) -> Category {
    match status {
        401 | 403 => Category::Authentication,
        400 | 413 | 422 => Category::InvalidMessage,
        408 => Category::Timeout,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_504_is_maybe_delivered_and_retry_after_is_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "3".parse().expect("a header value"));
        let error = answer_error(Category::ServerError, "x.504".into(), 504, "", &headers);
        assert!(error.is_maybe_delivered());
        assert_eq!(error.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(error.message(), "HTTP 504");
        let other = answer_error(
            Category::ServerError,
            "x.502".into(),
            502,
            " oops ",
            &HeaderMap::new(),
        );
        assert!(!other.is_maybe_delivered());
        assert_eq!(other.retry_after(), None);
        assert_eq!(other.message(), "HTTP 502: oops");
    }

    #[test]
    fn shared_statuses_have_their_categories() {
        let table = [
            (401, Category::Authentication),
            (403, Category::Authentication),
            (400, Category::InvalidMessage),
            (413, Category::InvalidMessage),
            (422, Category::InvalidMessage),
            (408, Category::Timeout),
            (429, Category::RateLimited),
            (503, Category::ServiceUnavailable),
            (500, Category::ServerError),
            (599, Category::ServerError),
            (307, Category::Configuration),
            (404, Category::Configuration),
            (600, Category::Configuration),
        ];
        for (status, category) in table {
            assert_eq!(category_of_status(status), category, "{status}");
        }
    }
}
