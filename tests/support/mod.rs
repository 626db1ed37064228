//! Helpers shared by the integration tests: scripted transports, messages, and launchers for
//! the real servers (smtp-sink, redis-server, moto) that skip where a server is missing and
//! fail under CI (`CI=true`).
#![allow(dead_code)]

pub mod aiosmtpd;
pub mod aiosmtpd_oauth;
#[cfg(all(feature = "config", feature = "metrics"))]
pub mod equivalence;
pub mod flaky;
pub mod http_api;
pub mod http_checks;
pub mod members;
pub mod moto;
#[cfg(feature = "outbox")]
pub mod outbox_rules;
pub mod postfix;
pub mod postgres;
pub mod raw_smtp;
pub mod ready;
pub mod redis;
pub mod redis_cluster;
pub mod relay;
pub mod scripted;
pub mod servers;
pub mod ses_faults;
pub mod slow_store;
pub mod smtp_sink;
pub mod smtp_watch;
#[cfg(feature = "webhooks")]
pub mod suppression_rules;
pub mod test_certs;
pub mod throttling;
pub mod wire;

use mail_breaker::Message;

/// A small message from `app@example.com` to `to`.
pub fn message_to(to: &str) -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to(to.parse().expect("a valid recipient"))
        .subject("test")
        .body(String::from("hello"))
        .expect("a valid message")
}

/// A message to `user@example.org`.
pub fn message() -> Message {
    message_to("user@example.org")
}

/// `count` messages, each with its index in the subject so order can be checked.
pub fn numbered_messages(count: usize) -> Vec<Message> {
    (0..count)
        .map(|i| {
            Message::builder()
                .from("app@example.com".parse().expect("a valid sender"))
                .to("user@example.org".parse().expect("a valid recipient"))
                .subject(format!("message {i}"))
                .body(format!("message {i}"))
                .expect("a valid message")
        })
        .collect()
}

/// `count` permanent bounces reported now by SES for `user{n}@example.org`, heard for the
/// member `member`: what a reputation breaker's tests record.
#[cfg(feature = "webhooks")]
pub fn hard_bounces(member: &str, count: usize) -> Vec<mail_breaker::events::DeliveryEvent> {
    use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, Provider};
    (0..count)
        .map(|n| {
            let mut event = DeliveryEvent::new(
                Provider::Ses,
                format!("bounce-{n}"),
                EventKind::Bounced {
                    bounce: BounceKind::Permanent,
                    subtype: None,
                },
                format!("user{n}@example.org"),
                std::time::SystemTime::now(),
            );
            event.member = Some(member.to_owned());
            event
        })
        .collect()
}
