//! `POST /ses`: SES's notifications through SNS. The SNS envelope is verified first
//! ([`super::sns`]); only then is its `Message` read as SES's notification, in both of SES's
//! shapes: the notifications of an identity (`notificationType`) and event publishing
//! through a configuration set (`eventType`). One notification naming several recipients
//! reads as one event per recipient, each with the SNS `MessageId` as its id.

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::answer;
use super::json::{text, texts};
use super::sns::{MessageType, SnsPolicy, SnsVerifier};
use super::timestamp;
use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};

pub(crate) struct SesRoute {
    verifier: SnsVerifier,
    sink: Arc<dyn EventSink>,
    member: Option<String>,
}

impl SesRoute {
    pub(crate) fn new(
        policy: SnsPolicy,
        sink: Arc<dyn EventSink>,
        member: Option<String>,
    ) -> SesRoute {
        SesRoute {
            verifier: SnsVerifier::new(policy),
            sink,
            member,
        }
    }

    pub(crate) async fn receive(&self, _headers: &HeaderMap, body: &[u8]) -> Response {
        let verified = match self.verifier.verify(body, SystemTime::now()).await {
            Ok(verified) => verified,
            Err(refused) => return refused.into_response(),
        };
        match verified.kind {
            MessageType::Notification => {
                let events = read(&verified.message, &verified.message_id, verified.timestamp);
                answer::keep(&self.sink, &self.member, events).await
            }
            MessageType::SubscriptionConfirmation => match self.verifier.confirm(&verified).await {
                Ok(()) => (StatusCode::OK, "subscription confirmed").into_response(),
                // SNS sends the confirmation again when it is not answered 2xx.
                Err(refused) => (StatusCode::BAD_GATEWAY, refused.to_string()).into_response(),
            },
            // Never followed: unsubscribing is the topic owner's decision, made in AWS.
            MessageType::UnsubscribeConfirmation => (StatusCode::OK, "noted").into_response(),
        }
    }
}

/// The events of one SES notification (`message`, the SNS `Message`), each with `event_id`.
/// A message that is not SES's JSON, or a type this crate does not read, is one
/// [`EventKind::Unknown`] event with an empty recipient, so that it is still kept once.
pub(crate) fn read(message: &str, event_id: &str, published: SystemTime) -> Vec<DeliveryEvent> {
    let unknown = |provider_kind: &str| {
        vec![DeliveryEvent::new(
            Provider::Ses,
            event_id,
            EventKind::Unknown {
                provider_kind: provider_kind.to_owned(),
            },
            "",
            published,
        )]
    };
    let Ok(notification) = serde_json::from_str::<Value>(message) else {
        return unknown("sns.message");
    };
    let Some(kind) =
        text(&notification, &["notificationType"]).or_else(|| text(&notification, &["eventType"]))
    else {
        return unknown("sns.message");
    };
    let mail = &notification["mail"];
    let destination = texts(mail, &["destination"]);
    let message_id = text(mail, &["messageId"]);
    let at = |section: &str| {
        text(&notification, &[section, "timestamp"])
            .or_else(|| text(mail, &["timestamp"]))
            .and_then(timestamp::rfc3339)
            .unwrap_or(published)
    };
    // Each recipient with its own details: (address, description, remote MTA's answer).
    type Recipient = (String, Option<String>, Option<String>);
    let every = |addresses: Vec<String>| -> Vec<Recipient> {
        addresses.into_iter().map(|a| (a, None, None)).collect()
    };
    let (kind, section, recipients): (EventKind, &str, Vec<Recipient>) = match kind {
        "Bounce" => {
            let bounce = match text(&notification, &["bounce", "bounceType"]) {
                Some("Permanent") => BounceKind::Permanent,
                Some("Transient") => BounceKind::Transient,
                _ => BounceKind::Undetermined,
            };
            let subtype = text(&notification, &["bounce", "bounceSubType"]).map(str::to_owned);
            let recipients = diagnosed(&notification["bounce"]["bouncedRecipients"]);
            (EventKind::Bounced { bounce, subtype }, "bounce", recipients)
        }
        "Complaint" => {
            let feedback =
                text(&notification, &["complaint", "complaintFeedbackType"]).map(str::to_owned);
            let recipients = notification["complaint"]["complainedRecipients"]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter_map(|r| Some((text(r, &["emailAddress"])?.to_owned(), None, None)))
                        .collect()
                })
                .unwrap_or_default();
            (EventKind::Complained { feedback }, "complaint", recipients)
        }
        "Delivery" => {
            let answer = text(&notification, &["delivery", "smtpResponse"]).map(str::to_owned);
            let recipients = texts(&notification, &["delivery", "recipients"])
                .into_iter()
                .map(|a| (a, None, answer.clone()))
                .collect();
            (EventKind::Delivered, "delivery", recipients)
        }
        "DeliveryDelay" => {
            let recipients = diagnosed(&notification["deliveryDelay"]["delayedRecipients"]);
            (EventKind::Deferred, "deliveryDelay", recipients)
        }
        "Reject" => {
            let reason = text(&notification, &["reject", "reason"]).map(str::to_owned);
            let recipients = destination
                .into_iter()
                .map(|a| (a, reason.clone(), None))
                .collect();
            (EventKind::Rejected, "reject", recipients)
        }
        "Rendering Failure" => {
            let reason = text(&notification, &["failure", "errorMessage"]).map(str::to_owned);
            let recipients = destination
                .into_iter()
                .map(|a| (a, reason.clone(), None))
                .collect();
            (EventKind::Rejected, "failure", recipients)
        }
        // A recipient's change of its subscriptions (SES's list management): an unsubscribe
        // from every topic, or from one, reads as unsubscribed; a subscribe as unknown.
        "Subscription" => {
            let new = &notification["subscription"]["newTopicPreferences"];
            let old = &notification["subscription"]["oldTopicPreferences"];
            // What changed counts, not what stays: a topic opted out before is no news.
            let all = new["unsubscribeAll"].as_bool() == Some(true)
                && old["unsubscribeAll"].as_bool() != Some(true);
            let opted_out = |preferences: &Value| -> Vec<String> {
                preferences["topicSubscriptionStatus"]
                    .as_array()
                    .map(|topics| {
                        topics
                            .iter()
                            .filter(|topic| text(topic, &["subscriptionStatus"]) == Some("OptOut"))
                            .filter_map(|topic| text(topic, &["topicName"]).map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let before = opted_out(old);
            let from_a_topic = opted_out(new).iter().any(|topic| !before.contains(topic));
            let kind = if all || from_a_topic {
                EventKind::Unsubscribed
            } else {
                EventKind::Unknown {
                    provider_kind: "Subscription".to_owned(),
                }
            };
            (kind, "subscription", every(destination))
        }
        "Open" => (EventKind::Opened, "open", every(destination)),
        "Click" => (EventKind::Clicked, "click", every(destination)),
        other => (
            EventKind::Unknown {
                provider_kind: other.to_owned(),
            },
            "",
            every(destination),
        ),
    };
    let at = at(section);
    let recipients = if recipients.is_empty() {
        vec![(String::new(), None, None)]
    } else {
        recipients
    };
    recipients
        .into_iter()
        .map(|(recipient, description, mta_response)| {
            let mut event =
                DeliveryEvent::new(Provider::Ses, event_id, kind.clone(), recipient, at);
            event.provider_message_id = message_id.map(str::to_owned);
            event.description = description;
            event.mta_response = mta_response;
            event
        })
        .collect()
}

/// The recipients of a list of SES's that names each with `emailAddress` and
/// `diagnosticCode` (bounced, delayed), as (address, description, remote server's answer):
/// SES's diagnosticCode is both the remote server's answer and the best description it gives.
fn diagnosed(list: &Value) -> Vec<(String, Option<String>, Option<String>)> {
    list.as_array()
        .map(|list| {
            list.iter()
                .filter_map(|r| {
                    let address = text(r, &["emailAddress"])?.to_owned();
                    let diagnostic = text(r, &["diagnosticCode"]).map(str::to_owned);
                    Some((address, diagnostic.clone(), diagnostic))
                })
                .collect()
        })
        .unwrap_or_default()
}
