//! The providers' webhooks, received: an axum router whose routes each authenticate a
//! request before reading a single event from it, read the events into the crate's one
//! vocabulary ([`DeliveryEvent`](crate::events::DeliveryEvent)) and hand them to an [`EventSink`].
//!
//! | route | provider | how a request is authenticated |
//! |---|---|---|
//! | `POST /ses` | Amazon SES through SNS | RSA signature (SNS versions 1 and 2) over AWS's canonical string, with the certificate fetched from an `sns.<region>.amazonaws.com` URL; the topic in an allow-list; the publish time within an hour and 5 minutes |
//! | `POST /sendgrid` | SendGrid | ECDSA P-256 over the timestamp and the raw body; 5 minutes either way |
//! | `POST /mailgun` | Mailgun | HMAC-SHA256 of timestamp and token; each token once, with one body |
//! | `POST /resend` | Resend (Svix) | HMAC-SHA256 of `id.timestamp.body`; 5 minutes either way |
//! | `POST /postmark` | Postmark | HTTP basic credentials (Postmark signs nothing) |
//!
//! The answers are what each provider needs to resend what was not kept:
//!
//! - `400 Bad Request` for a request that is not authentic (a bad signature, a stale time, a
//!   topic not allowed, a Mailgun token reused with another body) or cannot be read as the
//!   provider's envelope; nothing is kept. Postmark's missing or wrong credentials are
//!   `401 Unauthorized`, as HTTP answers credentials.
//! - `200 OK` once the sink kept the events. A report the provider resends with the same id
//!   is answered `200` again, and the sink counts it once (see [`EventSink`]'s contract).
//! - `503 Service Unavailable` when the sink failed, or when AWS could not be reached for an
//!   SNS signing certificate (SNS takes any answer below `500` as delivered), so that the
//!   provider sends it again.
//! - `413 Payload Too Large` for a body past [`Webhooks::body_limit`].
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use async_trait::async_trait;
//! use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept, Provider};
//! use mail_breaker::webhooks::{BasicAuth, SigningKey, SnsPolicy, Webhooks};
//!
//! struct Log;
//!
//! #[async_trait]
//! impl EventSink for Log {
//!     async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
//!         for event in events {
//!             println!("{} {} {}", event.provider, event.kind.name(), event.recipient);
//!         }
//!         Ok(Kept { new: events.len() })
//!     }
//! }
//!
//! let router: axum::Router = Webhooks::new(Arc::new(Log))
//!     .ses(SnsPolicy::new().allow_topic("arn:aws:sns:us-east-1:123456789012:ses-events"))
//!     .member(Provider::Ses, "ses-primary")
//!     .postmark(BasicAuth::new("postmark", "a long random password"))
//!     .mailgun(SigningKey::new("key-from-the-mailgun-dashboard"))
//!     .router();
//! // Mount it where the providers are told to post: `/webhooks/ses`, `/webhooks/postmark`…
//! let app: axum::Router = axum::Router::new().nest("/webhooks", router);
//! # let _ = app;
//! ```

mod answer;
mod hex;
mod json;
mod mailgun;
mod postmark;
mod resend;
mod sendgrid;
mod ses;
mod sns;
mod timestamp;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::routing::post;

use crate::events::{EventSink, Provider};

pub use mailgun::{DEFAULT_TOKEN_CAPACITY, SigningKey};
pub use postmark::BasicAuth;
pub use resend::SvixSecret;
pub use sendgrid::PublicKey;
pub use sns::SnsPolicy;

/// The largest body a route reads unless [`Webhooks::body_limit`] says otherwise: 1 MiB.
/// SNS messages are at most 256 KiB; SendGrid posts its events in batches, which stay far
/// below this.
///
/// ```
/// use mail_breaker::webhooks::DEFAULT_BODY_LIMIT;
///
/// assert_eq!(DEFAULT_BODY_LIMIT, 1024 * 1024);
/// ```
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The webhook receivers, one route per provider configured, built into an axum
/// [`Router`] by [`router`](Self::router).
///
/// A route is served only for a provider given its secret ([`ses`](Self::ses),
/// [`postmark`](Self::postmark), [`sendgrid`](Self::sendgrid), [`mailgun`](Self::mailgun),
/// [`resend`](Self::resend)); any other path is `404`.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// # use async_trait::async_trait;
/// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
/// use mail_breaker::events::Provider;
/// use mail_breaker::webhooks::{SvixSecret, Webhooks};
/// # struct Sink;
/// # #[async_trait]
/// # impl EventSink for Sink {
/// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
/// # }
///
/// let secret = SvixSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let router = Webhooks::new(Arc::new(Sink))
///     .resend(secret)
///     .member(Provider::Resend, "resend")
///     .body_limit(256 * 1024)
///     .router();
/// # let _ = router;
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
pub struct Webhooks {
    sink: Arc<dyn EventSink>,
    members: HashMap<Provider, String>,
    body_limit: usize,
    ses: Option<SnsPolicy>,
    postmark: Option<BasicAuth>,
    sendgrid: Option<PublicKey>,
    mailgun: Option<SigningKey>,
    resend: Option<SvixSecret>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secrets stay out of logs: only which routes are configured.
        f.debug_struct("Webhooks")
            .field("members", &self.members)
            .field("body_limit", &self.body_limit)
            .field("ses", &self.ses.is_some())
            .field("postmark", &self.postmark.is_some())
            .field("sendgrid", &self.sendgrid.is_some())
            .field("mailgun", &self.mailgun.is_some())
            .field("resend", &self.resend.is_some())
            .finish()
    }
}

impl Webhooks {
    /// Receivers that keep what they verify in `sink`, with no route yet.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::Webhooks;
    ///
    /// let webhooks = Webhooks::new(Arc::new(Sink));
    /// # let _ = webhooks;
    /// ```
    pub fn new(sink: Arc<dyn EventSink>) -> Webhooks {
        Webhooks {
            sink,
            members: HashMap::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            ses: None,
            postmark: None,
            sendgrid: None,
            mailgun: None,
            resend: None,
        }
    }

    /// Serves `POST /ses`: SES's notifications and event publishing through SNS, verified by
    /// `policy`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::{SnsPolicy, Webhooks};
    ///
    /// let policy = SnsPolicy::new().allow_topic("arn:aws:sns:eu-west-1:123456789012:bounces");
    /// let router = Webhooks::new(Arc::new(Sink)).ses(policy).router();
    /// # let _ = router;
    /// ```
    pub fn ses(mut self, policy: SnsPolicy) -> Webhooks {
        self.ses = Some(policy);
        self
    }

    /// Serves `POST /postmark`, for requests carrying these basic credentials.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::{BasicAuth, Webhooks};
    ///
    /// let router = Webhooks::new(Arc::new(Sink))
    ///     .postmark(BasicAuth::new("postmark", "a long random password"))
    ///     .router();
    /// # let _ = router;
    /// ```
    pub fn postmark(mut self, credentials: BasicAuth) -> Webhooks {
        self.postmark = Some(credentials);
        self
    }

    /// Serves `POST /sendgrid`, verified with SendGrid's signed event webhook key.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::{PublicKey, Webhooks};
    ///
    /// // The verification key SendGrid shows under Mail Settings, base64 DER.
    /// let key = PublicKey::from_base64(
    ///     "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEoXZGLUkUBNjO4SgueBMruW5ymXPOYI2xr1RxNB+2dQUbxfWne2h02vz0c2/O05uW4gaM1AWTtAkDq2yP4cJFMA==",
    /// )?;
    /// let router = Webhooks::new(Arc::new(Sink)).sendgrid(key).router();
    /// # let _ = router;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn sendgrid(mut self, key: PublicKey) -> Webhooks {
        self.sendgrid = Some(key);
        self
    }

    /// Serves `POST /mailgun`, verified with Mailgun's webhook signing key.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::{SigningKey, Webhooks};
    ///
    /// let router = Webhooks::new(Arc::new(Sink))
    ///     .mailgun(SigningKey::new("key-from-the-mailgun-dashboard"))
    ///     .router();
    /// # let _ = router;
    /// ```
    pub fn mailgun(mut self, key: SigningKey) -> Webhooks {
        self.mailgun = Some(key);
        self
    }

    /// Serves `POST /resend`, verified with the endpoint's Svix signing secret.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::{SvixSecret, Webhooks};
    ///
    /// let secret = SvixSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
    /// let router = Webhooks::new(Arc::new(Sink)).resend(secret).router();
    /// # let _ = router;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn resend(mut self, secret: SvixSecret) -> Webhooks {
        self.resend = Some(secret);
        self
    }

    /// Names the pool member that `provider`'s events are about: each event the route keeps
    /// carries it in [`DeliveryEvent::member`](crate::events::DeliveryEvent::member). Without
    /// it, the events carry `None`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::events::Provider;
    /// use mail_breaker::webhooks::{SigningKey, Webhooks};
    ///
    /// let router = Webhooks::new(Arc::new(Sink))
    ///     .mailgun(SigningKey::new("key"))
    ///     .member(Provider::Mailgun, "mailgun-eu")
    ///     .router();
    /// # let _ = router;
    /// ```
    pub fn member(mut self, provider: Provider, name: impl Into<String>) -> Webhooks {
        self.members.insert(provider, name.into());
        self
    }

    /// The largest body a route reads, in bytes (default [`DEFAULT_BODY_LIMIT`]); a larger
    /// one is answered `413` unread.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::Webhooks;
    ///
    /// let webhooks = Webhooks::new(Arc::new(Sink)).body_limit(512 * 1024);
    /// # let _ = webhooks;
    /// ```
    pub fn body_limit(mut self, bytes: usize) -> Webhooks {
        self.body_limit = bytes;
        self
    }

    /// The router: `POST /ses`, `/postmark`, `/sendgrid`, `/mailgun`, `/resend` for the
    /// providers configured, each with the body limit. Mount it with [`Router::nest`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use async_trait::async_trait;
    /// # use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
    /// # struct Sink;
    /// # #[async_trait]
    /// # impl EventSink for Sink {
    /// #     async fn keep(&self, e: &[DeliveryEvent]) -> Result<Kept, KeepError> { Ok(Kept { new: e.len() }) }
    /// # }
    /// use mail_breaker::webhooks::{BasicAuth, Webhooks};
    ///
    /// let app: axum::Router = axum::Router::new().nest(
    ///     "/webhooks",
    ///     Webhooks::new(Arc::new(Sink)).postmark(BasicAuth::new("u", "p")).router(),
    /// );
    /// # let _ = app;
    /// ```
    pub fn router(self) -> Router {
        let mut router = Router::new();
        let member = |provider: Provider| self.members.get(&provider).cloned();
        if let Some(policy) = self.ses {
            let route = Arc::new(ses::SesRoute::new(
                policy,
                self.sink.clone(),
                member(Provider::Ses),
            ));
            router = router.route(
                "/ses",
                post(move |headers: HeaderMap, body: Bytes| {
                    let route = route.clone();
                    async move { route.receive(&headers, &body).await }
                }),
            );
        }
        if let Some(credentials) = self.postmark {
            let route = Arc::new(postmark::PostmarkRoute::new(
                credentials,
                self.sink.clone(),
                member(Provider::Postmark),
            ));
            router = router.route(
                "/postmark",
                post(move |headers: HeaderMap, body: Bytes| {
                    let route = route.clone();
                    async move { route.receive(&headers, &body).await }
                }),
            );
        }
        if let Some(key) = self.sendgrid {
            let route = Arc::new(sendgrid::SendGridRoute::new(
                key,
                self.sink.clone(),
                member(Provider::SendGrid),
            ));
            router = router.route(
                "/sendgrid",
                post(move |headers: HeaderMap, body: Bytes| {
                    let route = route.clone();
                    async move { route.receive(&headers, &body).await }
                }),
            );
        }
        if let Some(key) = self.mailgun {
            let route = Arc::new(mailgun::MailgunRoute::new(
                key,
                self.sink.clone(),
                member(Provider::Mailgun),
            ));
            router = router.route(
                "/mailgun",
                post(move |headers: HeaderMap, body: Bytes| {
                    let route = route.clone();
                    async move { route.receive(&headers, &body).await }
                }),
            );
        }
        if let Some(secret) = self.resend {
            let route = Arc::new(resend::ResendRoute::new(
                secret,
                self.sink.clone(),
                member(Provider::Resend),
            ));
            router = router.route(
                "/resend",
                post(move |headers: HeaderMap, body: Bytes| {
                    let route = route.clone();
                    async move { route.receive(&headers, &body).await }
                }),
            );
        }
        router.layer(DefaultBodyLimit::max(self.body_limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{DeliveryEvent, KeepError, Kept};

    struct Nowhere;

    #[async_trait::async_trait]
    impl EventSink for Nowhere {
        async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
            Ok(Kept { new: events.len() })
        }
    }

    #[test]
    fn its_debug_names_the_routes_it_serves_and_no_secret() {
        let webhooks = Webhooks::new(Arc::new(Nowhere))
            .mailgun(SigningKey::new("key-mailgun-hidden"))
            .postmark(BasicAuth::new("hooks", "postmark-hidden"))
            .body_limit(4096);
        let shown = format!("{webhooks:?}");
        for part in [
            "Webhooks",
            "body_limit: 4096",
            "mailgun: true",
            "postmark: true",
            "ses: false",
            "sendgrid: false",
            "resend: false",
        ] {
            assert!(shown.contains(part), "{part} in {shown}");
        }
        assert!(!shown.contains("hidden"), "{shown}");
    }
}
