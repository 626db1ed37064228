//! `POST /postmark`: Postmark's webhooks. Postmark signs nothing and sends no time: the only
//! proof is the HTTP basic credentials set in the webhook's URL, compared in constant time
//! (a hash of each side, so that neither the length nor the content shows in the timing).

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::answer::{self, Refused};
use super::hex;
use super::json::{text, text_or_number};
use super::timestamp;
use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};

/// The basic credentials Postmark sends (set them in the webhook's URL,
/// `https://user:password@example.com/webhooks/postmark`).
///
/// # Example
///
/// ```
/// use mail_breaker::webhooks::BasicAuth;
///
/// let credentials = BasicAuth::new("postmark", "a long random password");
/// # let _ = credentials;
/// ```
#[derive(Clone)]
pub struct BasicAuth {
    /// SHA-256 of `user:password`, the form the header carries once decoded.
    expected: [u8; 32],
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BasicAuth(..)")
    }
}

impl BasicAuth {
    /// The user and password Postmark must send.
    ///
    /// ```
    /// use mail_breaker::webhooks::BasicAuth;
    ///
    /// let credentials = BasicAuth::new("postmark", "a long random password");
    /// # let _ = credentials;
    /// ```
    pub fn new(user: &str, password: &str) -> BasicAuth {
        BasicAuth {
            expected: Sha256::digest(format!("{user}:{password}").as_bytes()).into(),
        }
    }

    /// Whether the `Authorization` header carries these credentials.
    pub(crate) fn verify(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .ok_or(Refused::Credentials)?;
        let (scheme, encoded) = value.trim().split_once(' ').ok_or(Refused::Credentials)?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(Refused::Credentials);
        }
        let presented = STANDARD
            .decode(encoded.trim())
            .map_err(|_| Refused::Credentials)?;
        let presented: [u8; 32] = Sha256::digest(&presented).into();
        if bool::from(presented.ct_eq(&self.expected)) {
            Ok(())
        } else {
            Err(Refused::Credentials)
        }
    }
}

pub(crate) struct PostmarkRoute {
    credentials: BasicAuth,
    sink: Arc<dyn EventSink>,
    member: Option<String>,
}

impl PostmarkRoute {
    pub(crate) fn new(
        credentials: BasicAuth,
        sink: Arc<dyn EventSink>,
        member: Option<String>,
    ) -> PostmarkRoute {
        PostmarkRoute {
            credentials,
            sink,
            member,
        }
    }

    pub(crate) async fn receive(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        if let Err(refused) = self.credentials.verify(headers) {
            return refused.into_response();
        }
        match read(body) {
            Ok(events) => answer::keep(&self.sink, &self.member, events).await,
            Err(refused) => refused.into_response(),
        }
    }
}

/// The event of a verified body. Its id is Postmark's record `ID` where the record has one
/// (bounces, spam complaints); the others (deliveries, opens, clicks, subscription changes)
/// carry none, and are known by a hash of their body, which a resend repeats.
pub(crate) fn read(body: &[u8]) -> Result<Vec<DeliveryEvent>, Refused> {
    let record: Value =
        serde_json::from_slice(body).map_err(|_| Refused::Malformed("Postmark's webhook JSON"))?;
    if !record.is_object() {
        return Err(Refused::Malformed("Postmark's webhook JSON"));
    }
    let record_type = text(&record, &["RecordType"]).unwrap_or_else(|| untyped(&record));
    let (kind, recipient, time) = match record_type {
        "Bounce" | "SpamComplaint" => {
            let bounce_type = text(&record, &["Type"]).unwrap_or("");
            (bounce_kind(record_type, bounce_type), "Email", "BouncedAt")
        }
        "Delivery" => (EventKind::Delivered, "Recipient", "DeliveredAt"),
        "Open" => (EventKind::Opened, "Recipient", "ReceivedAt"),
        "Click" => (EventKind::Clicked, "Recipient", "ReceivedAt"),
        "SubscriptionChange" => {
            let suppressed = record.get("SuppressSending").and_then(Value::as_bool);
            let reason = text(&record, &["SuppressionReason"]);
            // Only a recipient's own request reads as unsubscribed: Postmark's suppressions
            // after a hard bounce or a complaint come with their Bounce or SpamComplaint
            // record, which is the event; counting both would count it twice.
            // Postmark: "If a recipient unsubscribes, they will be suppressed with the
            // SuppressionReason of ManualSuppression"; the sender's own suppressions (Origin
            // Customer or Admin) are no unsubscribe.
            let origin = text(&record, &["Origin"]);
            let kind = match (suppressed, reason, origin) {
                (Some(true), Some("ManualSuppression"), Some("Recipient")) => {
                    EventKind::Unsubscribed
                }
                _ => EventKind::Unknown {
                    provider_kind: "SubscriptionChange".to_owned(),
                },
            };
            (kind, "Recipient", "ChangedAt")
        }
        other => (
            EventKind::Unknown {
                provider_kind: other.to_owned(),
            },
            "Recipient",
            "ReceivedAt",
        ),
    };
    let at = text(&record, &[time])
        .and_then(timestamp::rfc3339)
        .unwrap_or_else(SystemTime::now);
    let event_id =
        text_or_number(&record, &["ID"]).unwrap_or_else(|| hex::encode(&Sha256::digest(body)));
    let recipient = text(&record, &[recipient])
        .or_else(|| text(&record, &["Recipient"]))
        .or_else(|| text(&record, &["Email"]))
        .unwrap_or("");
    let mut event = DeliveryEvent::new(Provider::Postmark, event_id, kind, recipient, at);
    event.provider_message_id = text(&record, &["MessageID"]).map(str::to_owned);
    event.description = text(&record, &["Description"]).map(str::to_owned);
    event.mta_response = text(&record, &["Details"])
        .filter(|d| !d.is_empty())
        .map(str::to_owned);
    Ok(vec![event])
}

/// The record type of a record without `RecordType`, as Postmark's older hooks post them
/// and its documentation's curl examples still show: a bounce (or spam complaint) by its
/// `Type` and `BouncedAt`, a delivery by its `DeliveredAt`; else none.
fn untyped(record: &Value) -> &'static str {
    if text(record, &["Type"]) == Some("SpamComplaint") {
        "SpamComplaint"
    } else if text(record, &["BouncedAt"]).is_some() && text(record, &["Type"]).is_some() {
        "Bounce"
    } else if text(record, &["DeliveredAt"]).is_some() {
        "Delivery"
    } else {
        ""
    }
}

/// Postmark's bounce `Type`s in the vocabulary.
fn bounce_kind(record_type: &str, bounce_type: &str) -> EventKind {
    let bounced = |bounce| EventKind::Bounced {
        bounce,
        subtype: Some(bounce_type.to_owned()),
    };
    if record_type == "SpamComplaint" {
        return EventKind::Complained { feedback: None };
    }
    match bounce_type {
        "HardBounce" | "BadEmailAddress" => bounced(BounceKind::Permanent),
        "SoftBounce" | "DnsError" | "SpamNotification" | "VirusNotification" | "Blocked"
        | "DMARCPolicy" => bounced(BounceKind::Transient),
        "Transient" => EventKind::Deferred,
        "SpamComplaint" => EventKind::Complained { feedback: None },
        "Unsubscribe" => EventKind::Unsubscribed,
        "ManuallyDeactivated" | "SMTPApiError" | "TemplateRenderingFailed" | "Unconfirmed" => {
            EventKind::Rejected
        }
        "Subscribe"
        | "AutoResponder"
        | "AddressChange"
        | "OpenRelayTest"
        | "ChallengeVerification"
        | "InboundError" => EventKind::Unknown {
            provider_kind: bounce_type.to_owned(),
        },
        _ => bounced(BounceKind::Undetermined),
    }
}
