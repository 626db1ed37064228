//! What providers report after a send, in one vocabulary for every provider: bounces,
//! complaints, deliveries and the rest, as the webhook receivers ([`crate::webhooks`]) read
//! them, and the [`EventSink`] that keeps them (the suppression list, the reputation breaker).
//!
//! The vocabulary is django-anymail's: a provider's own names (SES's `Bounce` with
//! `bounceType: Permanent`, SendGrid's `bounce` with `type: blocked`, Mailgun's `failed` with
//! `severity: permanent`) all read as one [`EventKind`]. A kind this crate does not know, or a
//! field it cannot read, is kept as [`EventKind::Unknown`] with the provider's name for it,
//! never an error: providers add event types without notice.

use std::fmt;
use std::time::SystemTime;

use async_trait::async_trait;

/// One thing a provider reports about one recipient of one message.
///
/// A provider's notification naming several recipients (SES sends one bounce notification for
/// every recipient that bounced) reads as one `DeliveryEvent` per recipient, each with the
/// notification's [`event_id`](Self::event_id) and its own [`recipient`](Self::recipient).
///
/// # Example
///
/// ```
/// use std::time::SystemTime;
/// use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, Provider};
///
/// let event = DeliveryEvent::new(
///     Provider::Ses,
///     "0000014a-f4d4-4f36-b1e6-07a9a4e1b9ee",
///     EventKind::Bounced { bounce: BounceKind::Permanent, subtype: Some("General".into()) },
///     "bounce@example.com",
///     SystemTime::UNIX_EPOCH,
/// );
/// assert!(event.kind.suppresses());
/// assert_eq!(event.provider.as_str(), "ses");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryEvent {
    /// What happened.
    pub kind: EventKind,
    /// The recipient it happened to, as the provider wrote it.
    pub recipient: String,
    /// The provider's id of the message (SES's `mail.messageId`, SendGrid's `sg_message_id`,
    /// Postmark's `MessageID`), when it gives one.
    pub provider_message_id: Option<String>,
    /// The pool member the event is about: the name the receiver was configured with, `None`
    /// when the receiver serves an account no member names.
    pub member: Option<String>,
    /// Which provider reported it.
    pub provider: Provider,
    /// When the provider says it happened (its timestamp, not the time it reached us).
    pub at: SystemTime,
    /// The provider's id of this report, the same each time the provider sends it again (SNS's
    /// `MessageId`, `svix-id`, SendGrid's `sg_event_id`, Mailgun's `event-data.id`, Postmark's
    /// record id). A receiver keeps each id once: a resent report changes nothing.
    pub event_id: String,
    /// The provider's description, for people (Postmark's `Description`, SES's
    /// `diagnosticCode` when no better text is given).
    pub description: Option<String>,
    /// The remote mail server's answer, as the provider relays it (`550 5.1.1 user unknown`).
    pub mta_response: Option<String>,
}

impl DeliveryEvent {
    /// An event with its required parts; the optional ones start `None`.
    pub fn new(
        provider: Provider,
        event_id: impl Into<String>,
        kind: EventKind,
        recipient: impl Into<String>,
        at: SystemTime,
    ) -> DeliveryEvent {
        DeliveryEvent {
            kind,
            recipient: recipient.into(),
            provider_message_id: None,
            member: None,
            provider,
            at,
            event_id: event_id.into(),
            description: None,
            mta_response: None,
        }
    }
}

/// What a provider reports, in django-anymail's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// The recipient's server refused the message, or the provider gave up on it.
    Bounced {
        /// Whether sending again can ever succeed.
        bounce: BounceKind,
        /// The provider's finer name for it (SES's `bounceSubType` such as `NoEmail`,
        /// `MailboxFull`; SendGrid's `type` such as `blocked`), as given.
        subtype: Option<String>,
    },
    /// The recipient marked the message as spam (a feedback loop report).
    Complained {
        /// The report's feedback type (`abuse`, `fraud`, `virus`, `not-spam`…), when given.
        feedback: Option<String>,
    },
    /// The recipient's server accepted the message.
    Delivered,
    /// Delivery was delayed; the provider keeps trying.
    Deferred,
    /// The provider refused to send the message at all (its own suppression list, a virus,
    /// a policy), before any remote server was asked.
    Rejected,
    /// The recipient opened the message (tracking pixel).
    Opened,
    /// The recipient followed a tracked link.
    Clicked,
    /// The recipient asked to receive no more (a list-unsubscribe or the provider's link).
    Unsubscribed,
    /// A kind this crate does not read, kept with the provider's own name for it.
    Unknown {
        /// The provider's name for the event (`"Subscription"`, `"group_resubscribe"`…).
        provider_kind: String,
    },
}

impl EventKind {
    /// Whether the event puts its recipient on the suppression list: a permanent bounce or
    /// a complaint. A transient bounce suppresses only when several come in a row, which the
    /// list decides; a `Rejected` is the provider's own decision and suppresses nothing here.
    ///
    /// ```
    /// use mail_breaker::events::{BounceKind, EventKind};
    ///
    /// assert!(EventKind::Complained { feedback: None }.suppresses());
    /// let transient = EventKind::Bounced { bounce: BounceKind::Transient, subtype: None };
    /// assert!(!transient.suppresses());
    /// ```
    pub fn suppresses(&self) -> bool {
        matches!(
            self,
            EventKind::Bounced {
                bounce: BounceKind::Permanent,
                ..
            } | EventKind::Complained { .. }
        )
    }

    /// A short name for logs, metrics and the page: `bounced`, `complained`, `delivered`,
    /// `deferred`, `rejected`, `opened`, `clicked`, `unsubscribed`, `unknown`.
    ///
    /// ```
    /// use mail_breaker::events::EventKind;
    ///
    /// assert_eq!(EventKind::Delivered.name(), "delivered");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Bounced { .. } => "bounced",
            EventKind::Complained { .. } => "complained",
            EventKind::Delivered => "delivered",
            EventKind::Deferred => "deferred",
            EventKind::Rejected => "rejected",
            EventKind::Opened => "opened",
            EventKind::Clicked => "clicked",
            EventKind::Unsubscribed => "unsubscribed",
            EventKind::Unknown { .. } => "unknown",
        }
    }
}

/// Whether a bounce can ever be delivered by sending again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BounceKind {
    /// The address does not exist or refuses for good (SES `Permanent`, a 5xx).
    Permanent,
    /// For now (a full mailbox, a message too large, an auto-reply).
    Transient,
    /// The provider could not tell (SES `Undetermined`).
    Undetermined,
}

/// The provider that reported an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Provider {
    /// Amazon SES, through SNS.
    Ses,
    /// Postmark.
    Postmark,
    /// SendGrid (Twilio).
    SendGrid,
    /// Mailgun.
    Mailgun,
    /// Resend (through Svix).
    Resend,
}

impl Provider {
    /// The provider's name as the receivers' routes and the stores spell it: `ses`,
    /// `postmark`, `sendgrid`, `mailgun`, `resend`.
    ///
    /// ```
    /// use mail_breaker::events::Provider;
    ///
    /// assert_eq!(Provider::SendGrid.as_str(), "sendgrid");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Ses => "ses",
            Provider::Postmark => "postmark",
            Provider::SendGrid => "sendgrid",
            Provider::Mailgun => "mailgun",
            Provider::Resend => "resend",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where verified events are kept: the suppression list, the reputation breaker, or an
/// application's own store. A receiver answers the provider 2xx only once `keep` returned
/// `Ok`, so that a provider whose report could not be kept sends it again.
///
/// # Contract
///
/// - `keep` is all or nothing for the events it is given: the ids of the events are kept in
///   the same transaction as what the events change.
/// - An event whose `(provider, event_id, recipient)` was kept before changes nothing and is
///   not counted in [`Kept::new`]: providers resend a report with the same id.
///
/// # Example
///
/// ```
/// use std::sync::Mutex;
/// use async_trait::async_trait;
/// use mail_breaker::events::{DeliveryEvent, EventSink, KeepError, Kept};
///
/// #[derive(Default)]
/// struct InMemory(Mutex<Vec<DeliveryEvent>>);
///
/// #[async_trait]
/// impl EventSink for InMemory {
///     async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
///         let mut kept = self.0.lock().map_err(|_| KeepError::new("poisoned"))?;
///         let mut new = 0;
///         for event in events {
///             let seen = kept.iter().any(|k| {
///                 k.provider == event.provider
///                     && k.event_id == event.event_id
///                     && k.recipient == event.recipient
///             });
///             if !seen {
///                 kept.push(event.clone());
///                 new += 1;
///             }
///         }
///         Ok(Kept { new })
///     }
/// }
/// ```
#[async_trait]
pub trait EventSink: Send + Sync + 'static {
    /// Keeps the events, each id once; see the trait's contract.
    async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError>;
}

/// What [`EventSink::keep`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Kept {
    /// How many of the events were new (not kept before under their id).
    pub new: usize,
}

/// A sink could not keep events (its database is down): the receiver answers 5xx and the
/// provider sends them again.
#[derive(Debug, thiserror::Error)]
#[error("the delivery events could not be kept: {reason}")]
pub struct KeepError {
    reason: String,
}

impl KeepError {
    /// An error with its reason, for logs (never shown to the provider).
    ///
    /// ```
    /// use mail_breaker::events::KeepError;
    ///
    /// let error = KeepError::new("database is locked");
    /// assert!(error.to_string().contains("database is locked"));
    /// ```
    pub fn new(reason: impl Into<String>) -> KeepError {
        KeepError {
            reason: reason.into(),
        }
    }
}
