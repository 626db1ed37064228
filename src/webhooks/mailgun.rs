//! `POST /mailgun`: Mailgun's webhooks (the JSON of its current webhooks API). Mailgun signs
//! HMAC-SHA256 of `timestamp` followed by `token` with the webhook signing key, and signs
//! neither the body nor the event: a captured token and signature could carry any body. So
//! each token is remembered with a hash of its body, and the same token with another body
//! is refused; with the same body it is a resend, answered as one.
//!
//! How long a token is remembered: Mailgun's documentation (Securing Webhooks,
//! <https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/securing-webhooks>)
//! does not say that a retry is signed afresh, and its retry schedule
//! (<https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/webhook-retries>)
//! runs for 8 hours (5 min, 10 min, 15 min, 1 h, 2 h, 4 h). So a retry may carry the first
//! attempt's timestamp: a signed time is accepted for 8 hours and 5 minutes, and each token
//! is remembered as long, in memory (one process; a fleet behind a load balancer remembers
//! per process, so a token replayed to another process with another body is not caught there).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::answer::{self, Refused};
use super::hex;
use super::json::{at, text, text_or_number};
use super::timestamp;
use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};

/// How old a signed time may be: Mailgun's retries span 8 hours, and may keep the first
/// attempt's signature; 5 minutes more for clocks and queues.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(8 * 3600 + 5 * 60);

/// How many tokens are remembered at most unless [`SigningKey::remember_tokens`] says
/// otherwise.
///
/// ```
/// use mail_breaker::webhooks::{DEFAULT_TOKEN_CAPACITY, SigningKey};
///
/// let key = SigningKey::new("key").remember_tokens(DEFAULT_TOKEN_CAPACITY * 2);
/// # let _ = key;
/// ```
pub const DEFAULT_TOKEN_CAPACITY: usize = 200_000;

/// Mailgun's webhook signing key (the dashboard's "HTTP webhook signing key", not the API
/// key), and how many tokens the route remembers.
///
/// # Example
///
/// ```
/// use mail_breaker::webhooks::SigningKey;
///
/// let key = SigningKey::new("key-from-the-mailgun-dashboard").remember_tokens(50_000);
/// # let _ = key;
/// ```
#[derive(Clone)]
pub struct SigningKey {
    key: Vec<u8>,
    capacity: usize,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The key as Mailgun shows it.
    ///
    /// ```
    /// use mail_breaker::webhooks::SigningKey;
    ///
    /// let key = SigningKey::new("key-from-the-mailgun-dashboard");
    /// # let _ = key;
    /// ```
    pub fn new(key: impl Into<String>) -> SigningKey {
        SigningKey {
            key: key.into().into_bytes(),
            capacity: DEFAULT_TOKEN_CAPACITY,
        }
    }

    /// How many tokens the route remembers at most (default [`DEFAULT_TOKEN_CAPACITY`],
    /// about 150 bytes each). Tokens older than 8 hours and 5 minutes are forgotten first;
    /// when that frees no room, a new token is answered `503` (Mailgun sends it again
    /// later) rather than forgetting one still inside its window.
    ///
    /// ```
    /// use mail_breaker::webhooks::SigningKey;
    ///
    /// let key = SigningKey::new("key").remember_tokens(1_000_000);
    /// # let _ = key;
    /// ```
    pub fn remember_tokens(mut self, capacity: usize) -> SigningKey {
        self.capacity = capacity.max(1);
        self
    }

    /// Whether `signature` (hex) is HMAC-SHA256 of `timestamp` and `token`, compared in
    /// constant time, and `timestamp` is within the window.
    fn verify(
        &self,
        timestamp_text: &str,
        token: &str,
        signature: &str,
        now: SystemTime,
    ) -> Result<SystemTime, Refused> {
        let signed_at = timestamp::unix_seconds(timestamp_text)
            .ok_or(Refused::Missing("signature.timestamp"))?;
        let signature = hex::decode(signature).ok_or(Refused::BadSignature)?;
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).map_err(|_| Refused::BadSignature)?;
        mac.update(timestamp_text.as_bytes());
        mac.update(token.as_bytes());
        mac.verify_slice(&signature)
            .map_err(|_| Refused::BadSignature)?;
        if !timestamp::within(signed_at, now, MAX_AGE) {
            return Err(Refused::Stale);
        }
        Ok(signed_at)
    }
}

/// The tokens seen, each with its body's hash and when it may be forgotten.
#[derive(Debug, Default)]
struct Tokens {
    seen: HashMap<String, ([u8; 32], SystemTime)>,
}

/// What the token store says of a verified token.
#[derive(Debug, PartialEq, Eq)]
enum TokenUse {
    /// First seen, or seen with this same body (a resend).
    Fresh,
    /// Seen with another body.
    Reused,
    /// The store is full of tokens still in their window.
    Full,
}

impl Tokens {
    fn check(
        &mut self,
        token: &str,
        body: [u8; 32],
        signed_at: SystemTime,
        now: SystemTime,
        capacity: usize,
    ) -> TokenUse {
        if let Some((hash, _)) = self.seen.get(token) {
            return if *hash == body {
                TokenUse::Fresh
            } else {
                TokenUse::Reused
            };
        }
        if self.seen.len() >= capacity {
            self.seen.retain(|_, (_, forget_at)| *forget_at > now);
            if self.seen.len() >= capacity {
                return TokenUse::Full;
            }
        }
        let forget_at = signed_at.checked_add(MAX_AGE).unwrap_or(now);
        self.seen.insert(token.to_owned(), (body, forget_at));
        TokenUse::Fresh
    }
}

pub(crate) struct MailgunRoute {
    key: SigningKey,
    tokens: Mutex<Tokens>,
    sink: Arc<dyn EventSink>,
    member: Option<String>,
}

impl MailgunRoute {
    pub(crate) fn new(
        key: SigningKey,
        sink: Arc<dyn EventSink>,
        member: Option<String>,
    ) -> MailgunRoute {
        MailgunRoute {
            key,
            tokens: Mutex::new(Tokens::default()),
            sink,
            member,
        }
    }

    pub(crate) async fn receive(&self, _headers: &HeaderMap, body: &[u8]) -> Response {
        let now = SystemTime::now();
        let Ok(payload) = serde_json::from_slice::<Value>(body) else {
            return Refused::Malformed("Mailgun's webhook JSON").into_response();
        };
        let field = |name: &'static str, path: &[&str]| {
            text_or_number(&payload, path).ok_or(Refused::Missing(name))
        };
        let verified = (|| {
            let timestamp_text = field("signature.timestamp", &["signature", "timestamp"])?;
            let token = field("signature.token", &["signature", "token"])?;
            let signature = field("signature.signature", &["signature", "signature"])?;
            let signed_at = self.key.verify(&timestamp_text, &token, &signature, now)?;
            Ok::<_, Refused>((token, signed_at))
        })();
        let (token, signed_at) = match verified {
            Ok(verified) => verified,
            Err(refused) => return refused.into_response(),
        };
        let hash: [u8; 32] = Sha256::digest(body).into();
        let used = self
            .tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(&token, hash, signed_at, now, self.key.capacity);
        match used {
            TokenUse::Fresh => {}
            TokenUse::Reused => return Refused::TokenReused.into_response(),
            TokenUse::Full => {
                tracing::warn!(
                    "the Mailgun token store is full; the event is answered 503 and Mailgun will resend it"
                );
                return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
            }
        }
        let events = read(&payload, body);
        answer::keep(&self.sink, &self.member, events).await
    }
}

/// The event of a verified payload (its `event-data`).
pub(crate) fn read(payload: &Value, body: &[u8]) -> Vec<DeliveryEvent> {
    let data = &payload["event-data"];
    let name = text(data, &["event"]).unwrap_or("");
    let reason = text(data, &["reason"]);
    let kind = match name {
        "delivered" => EventKind::Delivered,
        "opened" => EventKind::Opened,
        "clicked" => EventKind::Clicked,
        "unsubscribed" => EventKind::Unsubscribed,
        "complained" => EventKind::Complained { feedback: None },
        "rejected" => EventKind::Rejected,
        "failed" => match text(data, &["severity"]) {
            // Mailgun keeps trying after a temporary failure.
            Some("temporary") => EventKind::Deferred,
            // Mailgun's own suppression lists refused it; no server was asked.
            _ if reason.is_some_and(|reason| reason.starts_with("suppress-")) => {
                EventKind::Rejected
            }
            Some("permanent") => EventKind::Bounced {
                bounce: BounceKind::Permanent,
                subtype: reason.map(str::to_owned),
            },
            _ => EventKind::Bounced {
                bounce: BounceKind::Undetermined,
                subtype: reason.map(str::to_owned),
            },
        },
        other => EventKind::Unknown {
            provider_kind: other.to_owned(),
        },
    };
    let at_time = data
        .get("timestamp")
        .and_then(Value::as_f64)
        .and_then(timestamp::unix_float)
        .unwrap_or_else(SystemTime::now);
    let event_id = text(data, &["id"])
        .map(str::to_owned)
        .unwrap_or_else(|| hex::encode(&Sha256::digest(body)));
    let recipient = text(data, &["recipient"]).unwrap_or("");
    let mut event = DeliveryEvent::new(Provider::Mailgun, event_id, kind, recipient, at_time);
    event.provider_message_id =
        text(data, &["message", "headers", "message-id"]).map(str::to_owned);
    let status = at(data, &["delivery-status"]);
    event.description = status
        .and_then(|status| text(status, &["description"]))
        .filter(|text| !text.is_empty())
        .or(reason)
        // A message Mailgun refused outright says why in `reject`.
        .or_else(|| text(data, &["reject", "reason"]).filter(|text| !text.is_empty()))
        .map(str::to_owned);
    event.mta_response = status.and_then(|status| {
        let message = text(status, &["message"]).filter(|text| !text.is_empty())?;
        Some(match text_or_number(status, &["code"]) {
            Some(code) if !message.starts_with(&code) => format!("{code} {message}"),
            _ => message.to_owned(),
        })
    });
    vec![event]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_token_is_fresh_once_per_body_and_reused_with_another() {
        let mut tokens = Tokens::default();
        let now = at(100_000);
        assert_eq!(tokens.check("t", [1; 32], now, now, 10), TokenUse::Fresh);
        assert_eq!(tokens.check("t", [1; 32], now, now, 10), TokenUse::Fresh);
        assert_eq!(tokens.check("t", [2; 32], now, now, 10), TokenUse::Reused);
    }

    #[test]
    fn a_token_is_forgotten_once_its_window_has_ended_and_not_before() {
        let signed = at(100_000);
        let ends = signed + MAX_AGE;
        let mut tokens = Tokens::default();
        assert_eq!(
            tokens.check("old", [1; 32], signed, signed, 1),
            TokenUse::Fresh
        );
        let just_before = ends - Duration::from_nanos(1);
        assert_eq!(
            tokens.check("new", [1; 32], just_before, just_before, 1),
            TokenUse::Full
        );
        assert_eq!(tokens.check("new", [1; 32], ends, ends, 1), TokenUse::Fresh);
    }

    #[test]
    fn a_full_store_forgets_expired_tokens_and_never_one_inside_its_window() {
        let mut tokens = Tokens::default();
        let old = at(100_000);
        assert_eq!(tokens.check("old", [1; 32], old, old, 1), TokenUse::Fresh);
        let later = old + MAX_AGE + Duration::from_secs(1);
        assert_eq!(
            tokens.check("new", [1; 32], later, later, 1),
            TokenUse::Fresh
        );
        assert_eq!(
            tokens.check("newer", [1; 32], later, later, 1),
            TokenUse::Full
        );
        assert_eq!(
            tokens.check("new", [2; 32], later, later, 1),
            TokenUse::Reused
        );
    }
}
