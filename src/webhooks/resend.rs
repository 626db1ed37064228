//! `POST /resend`: Resend's webhooks, delivered by Svix. Svix signs HMAC-SHA256 of
//! `svix-id`, `.`, `svix-timestamp`, `.`, and the raw body, with the key that is the base64
//! after `whsec_`; the `svix-signature` header holds one or more space-separated
//! `v1,<base64>` signatures (several while a secret rotates), any one of which may match.
//! The timestamp must be within 5 minutes of now either way: Svix signs each attempt afresh.

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::answer::{self, Refused};
use super::json::{text, texts};
use super::timestamp;
use crate::error::ConfigError;
use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};

/// A Svix endpoint's signing secret, as Resend shows it: `whsec_` and base64.
///
/// # Example
///
/// ```
/// use mail_breaker::webhooks::SvixSecret;
///
/// assert!(SvixSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
/// assert_eq!(SvixSecret::new("whsec_not base64!").unwrap_err().setting(), "resend");
/// ```
#[derive(Clone)]
pub struct SvixSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for SvixSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SvixSecret(..)")
    }
}

impl SvixSecret {
    /// Reads the secret: the base64 after `whsec_` (the prefix may be left out, as Svix's
    /// own libraries allow).
    ///
    /// ```
    /// use mail_breaker::webhooks::SvixSecret;
    ///
    /// let secret = SvixSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
    /// # let _ = secret;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn new(secret: &str) -> Result<SvixSecret, ConfigError> {
        let encoded = secret.trim();
        let encoded = encoded.strip_prefix("whsec_").unwrap_or(encoded);
        let key = STANDARD.decode(encoded).map_err(|_| {
            ConfigError::new("resend", "the signing secret is not whsec_ and base64")
        })?;
        if key.is_empty() {
            return Err(ConfigError::new("resend", "the signing secret is empty"));
        }
        Ok(SvixSecret { key })
    }

    /// Whether one of `signatures` signs `id.timestamp.body`, compared in constant time,
    /// and `timestamp` is within 5 minutes of `now`.
    pub(crate) fn verify(
        &self,
        id: &str,
        timestamp_text: &str,
        body: &[u8],
        signatures: &str,
        now: SystemTime,
    ) -> Result<(), Refused> {
        let signed_at =
            timestamp::unix_seconds(timestamp_text).ok_or(Refused::Missing("svix-timestamp"))?;
        if !timestamp::within(signed_at, now, timestamp::SKEW) {
            return Err(Refused::Stale);
        }
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).map_err(|_| Refused::BadSignature)?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp_text.as_bytes());
        mac.update(b".");
        mac.update(body);
        let expected = mac.finalize().into_bytes();
        let matched = signatures
            .split(' ')
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|signature| STANDARD.decode(signature).ok())
            .fold(subtle::Choice::from(0), |matched, signature| {
                matched | expected.as_slice().ct_eq(&signature)
            });
        if bool::from(matched) {
            Ok(())
        } else {
            Err(Refused::BadSignature)
        }
    }
}

pub(crate) struct ResendRoute {
    secret: SvixSecret,
    sink: Arc<dyn EventSink>,
    member: Option<String>,
}

impl ResendRoute {
    pub(crate) fn new(
        secret: SvixSecret,
        sink: Arc<dyn EventSink>,
        member: Option<String>,
    ) -> ResendRoute {
        ResendRoute {
            secret,
            sink,
            member,
        }
    }

    pub(crate) async fn receive(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        let header = |name: &'static str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .ok_or(Refused::Missing(name))
        };
        let verified = (|| {
            let id = header("svix-id")?;
            let timestamp = header("svix-timestamp")?;
            let signatures = header("svix-signature")?;
            self.secret
                .verify(id, timestamp, body, signatures, SystemTime::now())?;
            Ok::<_, Refused>(id)
        })();
        let id = match verified {
            Ok(id) => id,
            Err(refused) => return refused.into_response(),
        };
        match read(id, body) {
            Ok(events) => answer::keep(&self.sink, &self.member, events).await,
            Err(refused) => refused.into_response(),
        }
    }
}

/// The events of a verified body, one per recipient in `data.to`, each with `svix_id`.
pub(crate) fn read(svix_id: &str, body: &[u8]) -> Result<Vec<DeliveryEvent>, Refused> {
    let payload: Value =
        serde_json::from_slice(body).map_err(|_| Refused::Malformed("Resend's event JSON"))?;
    let data = &payload["data"];
    let name = text(&payload, &["type"]).unwrap_or("");
    let kind = match name {
        "email.delivered" => EventKind::Delivered,
        // Resend's event-types page shows its sample as `email.delivered_delayed`.
        "email.delivery_delayed" | "email.delivered_delayed" => EventKind::Deferred,
        "email.complained" => EventKind::Complained { feedback: None },
        "email.opened" => EventKind::Opened,
        "email.clicked" => EventKind::Clicked,
        "email.failed" | "email.suppressed" => EventKind::Rejected,
        "email.bounced" => EventKind::Bounced {
            bounce: match text(data, &["bounce", "type"]) {
                Some("Permanent") => BounceKind::Permanent,
                Some("Transient" | "Temporary") => BounceKind::Transient,
                _ => BounceKind::Undetermined,
            },
            subtype: text(data, &["bounce", "subType"]).map(str::to_owned),
        },
        other => EventKind::Unknown {
            provider_kind: other.to_owned(),
        },
    };
    let at = text(&payload, &["created_at"])
        .and_then(timestamp::rfc3339)
        .unwrap_or_else(SystemTime::now);
    let description = text(data, &["bounce", "message"])
        .or_else(|| text(data, &["failed", "reason"]))
        .or_else(|| text(data, &["suppressed", "message"]))
        .map(str::to_owned);
    let mut recipients = texts(data, &["to"]);
    if recipients.is_empty() {
        // Resend's `to` is an array; a single address is read too, and none is one event.
        recipients.push(text(data, &["to"]).unwrap_or("").to_owned());
    }
    Ok(recipients
        .into_iter()
        .map(|recipient| {
            let mut event =
                DeliveryEvent::new(Provider::Resend, svix_id, kind.clone(), recipient, at);
            event.provider_message_id = text(data, &["email_id"]).map(str::to_owned);
            event.description.clone_from(&description);
            event
        })
        .collect())
}
