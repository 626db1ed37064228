//! `POST /sendgrid`: SendGrid's signed event webhook. The signature is ECDSA P-256 with
//! SHA-256 over the `X-Twilio-Email-Event-Webhook-Timestamp` header's text followed by the
//! raw body, in the `X-Twilio-Email-Event-Webhook-Signature` header (base64 DER); the
//! timestamp must be within 5 minutes of now either way. The body is an array of events.

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::answer::{self, Refused};
use super::hex;
use super::json::{text, text_or_number};
use super::timestamp;
use crate::error::ConfigError;
use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};

const SIGNATURE: &str = "x-twilio-email-event-webhook-signature";
const TIMESTAMP: &str = "x-twilio-email-event-webhook-timestamp";

/// SendGrid's verification key for its signed event webhook: the ECDSA P-256 public key
/// SendGrid shows under Mail Settings, base64 of its DER (`SubjectPublicKeyInfo`).
///
/// # Example
///
/// ```
/// use mail_breaker::webhooks::PublicKey;
///
/// let key = PublicKey::from_base64(
///     "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEoXZGLUkUBNjO4SgueBMruW5ymXPOYI2xr1RxNB+2dQUbxfWne2h02vz0c2/O05uW4gaM1AWTtAkDq2yP4cJFMA==",
/// );
/// assert!(key.is_ok());
/// assert_eq!(PublicKey::from_base64("not a key").unwrap_err().setting(), "sendgrid");
/// ```
#[derive(Clone, Debug)]
pub struct PublicKey {
    key: VerifyingKey,
}

impl PublicKey {
    /// Reads the key as SendGrid shows it (base64 DER; whitespace around it is ignored).
    ///
    /// ```
    /// use mail_breaker::webhooks::PublicKey;
    ///
    /// let shown = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEoXZGLUkUBNjO4SgueBMruW5ymXPOYI2xr1RxNB+2dQUbxfWne2h02vz0c2/O05uW4gaM1AWTtAkDq2yP4cJFMA==";
    /// let key = PublicKey::from_base64(shown)?;
    /// # let _ = key;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn from_base64(text: &str) -> Result<PublicKey, ConfigError> {
        let der = STANDARD
            .decode(text.trim())
            .map_err(|_| ConfigError::new("sendgrid", "the verification key is not base64"))?;
        let key = VerifyingKey::from_public_key_der(&der).map_err(|_| {
            ConfigError::new(
                "sendgrid",
                "the verification key is not an ECDSA P-256 public key",
            )
        })?;
        Ok(PublicKey { key })
    }

    /// Whether `signature` (base64 DER) signs `timestamp` followed by `body` and
    /// `timestamp` is within 5 minutes of `now`.
    pub(crate) fn verify(
        &self,
        timestamp_text: &str,
        body: &[u8],
        signature: &str,
        now: SystemTime,
    ) -> Result<(), Refused> {
        let signed_at =
            timestamp::unix_seconds(timestamp_text).ok_or(Refused::Missing(TIMESTAMP))?;
        if !timestamp::within(signed_at, now, timestamp::SKEW) {
            return Err(Refused::Stale);
        }
        let der = STANDARD
            .decode(signature.trim())
            .map_err(|_| Refused::BadSignature)?;
        let signature = Signature::from_der(&der).map_err(|_| Refused::BadSignature)?;
        let mut signed = Vec::with_capacity(timestamp_text.len() + body.len());
        signed.extend_from_slice(timestamp_text.as_bytes());
        signed.extend_from_slice(body);
        // Signatures from other libraries may carry the high S of the pair; both verify.
        let signature = signature.normalize_s().unwrap_or(signature);
        self.key
            .verify(&signed, &signature)
            .map_err(|_| Refused::BadSignature)
    }
}

pub(crate) struct SendGridRoute {
    key: PublicKey,
    sink: Arc<dyn EventSink>,
    member: Option<String>,
}

impl SendGridRoute {
    pub(crate) fn new(
        key: PublicKey,
        sink: Arc<dyn EventSink>,
        member: Option<String>,
    ) -> SendGridRoute {
        SendGridRoute { key, sink, member }
    }

    pub(crate) async fn receive(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        let header = |name: &'static str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .ok_or(Refused::Missing(name))
        };
        let verified = header(TIMESTAMP).and_then(|timestamp| {
            let signature = header(SIGNATURE)?;
            self.key
                .verify(timestamp, body, signature, SystemTime::now())
        });
        if let Err(refused) = verified {
            return refused.into_response();
        }
        match read(body) {
            Ok(events) => answer::keep(&self.sink, &self.member, events).await,
            Err(refused) => refused.into_response(),
        }
    }
}

/// The events of a verified body: SendGrid's array of events.
pub(crate) fn read(body: &[u8]) -> Result<Vec<DeliveryEvent>, Refused> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(body) else {
        return Err(Refused::Malformed("an array of SendGrid events"));
    };
    Ok(items.iter().map(event).collect())
}

fn event(item: &Value) -> DeliveryEvent {
    let name = text(item, &["event"]).unwrap_or("");
    let kind = match name {
        "delivered" => EventKind::Delivered,
        "deferred" => EventKind::Deferred,
        "dropped" => EventKind::Rejected,
        "open" => EventKind::Opened,
        "click" => EventKind::Clicked,
        "spamreport" => EventKind::Complained { feedback: None },
        "unsubscribe" | "group_unsubscribe" => EventKind::Unsubscribed,
        // `type` says which: `bounce` (the address refused for good) or `blocked` (the
        // receiving server refused this message, for now).
        "bounce" => {
            let subtype = text(item, &["type"]).map(str::to_owned);
            let bounce = match subtype.as_deref() {
                Some("blocked") => BounceKind::Transient,
                Some("bounce") | None => BounceKind::Permanent,
                Some(_) => BounceKind::Undetermined,
            };
            EventKind::Bounced { bounce, subtype }
        }
        other => EventKind::Unknown {
            provider_kind: other.to_owned(),
        },
    };
    let at = item
        .get("timestamp")
        .and_then(Value::as_f64)
        .and_then(timestamp::unix_float)
        .unwrap_or_else(SystemTime::now);
    // An event without SendGrid's id is known by its own content, which a resend repeats.
    let event_id = text_or_number(item, &["sg_event_id"])
        .unwrap_or_else(|| hex::encode(&Sha256::digest(item.to_string().as_bytes())));
    let recipient = text(item, &["email"]).unwrap_or("");
    let mut event = DeliveryEvent::new(Provider::SendGrid, event_id, kind, recipient, at);
    event.provider_message_id = text(item, &["sg_message_id"]).map(str::to_owned);
    event.description = text(item, &["reason"]).map(str::to_owned);
    event.mta_response = text(item, &["response"])
        .or_else(|| text(item, &["reason"]))
        .map(str::to_owned);
    event
}
