//! [`SendRequest`]: a message as a tower request.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Envelope, Message};

/// One message to send: its envelope and its formatted bytes, the request of
/// [`TransportService`](super::TransportService) and of a service standing in a
/// [`ServiceTransport`](super::ServiceTransport).
///
/// It is the bytes rather than lettre's [`Message`], because the pool and the outbox send
/// bytes (`send_raw`) and bytes cannot be parsed back into a `Message`. It serializes (the
/// envelope as lettre does, checked again when read back), so that a job queue's job
/// (apalis) can carry it.
///
/// ```
/// use mail_breaker::tower::SendRequest;
///
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .subject("hello")
///     .body(String::from("hi"))
///     .unwrap();
/// let request = SendRequest::from(&message);
/// assert_eq!(request.envelope.to().len(), 1);
/// let json = serde_json::to_string(&request).unwrap();
/// let back: SendRequest = serde_json::from_str(&json).unwrap();
/// assert_eq!(back, request);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SendRequest {
    /// Who it is from and for.
    pub envelope: Envelope,
    /// The formatted message, headers and body.
    pub raw: Bytes,
}

impl SendRequest {
    /// A request to send `raw` to `envelope`.
    ///
    /// ```
    /// # use mail_breaker::tower::SendRequest;
    /// let envelope = lettre::address::Envelope::new(
    ///     Some("app@example.com".parse().unwrap()),
    ///     vec!["user@example.org".parse().unwrap()],
    /// ).unwrap();
    /// let request = SendRequest::new(envelope, "Subject: hi\r\n\r\nhello\r\n");
    /// assert!(request.raw.starts_with(b"Subject"));
    /// ```
    pub fn new(envelope: Envelope, raw: impl Into<Bytes>) -> SendRequest {
        SendRequest {
            envelope,
            raw: raw.into(),
        }
    }
}

impl From<&Message> for SendRequest {
    fn from(message: &Message) -> SendRequest {
        SendRequest::new(message.envelope().clone(), message.formatted())
    }
}
