//! Which of the breaker's refusals hold back every message the transport is handed (DESIGN
//! §19, "Not sent is not an attempt"): an outbox worker pauses as a whole only for those.

use std::time::Duration;

use crate::{Category, CircuitBreakerTransport, Envelope, Receipt, Scope, SendError, Transport};

/// A provider that always fails.
struct Down;

#[async_trait::async_trait]
impl Transport for Down {
    fn name(&self) -> &str {
        "down"
    }

    async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        Err(SendError::new(Category::Network, "test.down", "down"))
    }
}

fn breaker(scope: Scope) -> CircuitBreakerTransport<Down> {
    CircuitBreakerTransport::builder(Down)
        .scope(scope)
        .failure_threshold(1)
        .reset_timeout(Duration::from_secs(60))
        .build()
        .expect("valid settings")
}

fn message_to(to: &str) -> crate::Message {
    lettre::Message::builder()
        .from("app@example.com".parse().expect("address"))
        .to(to.parse().expect("address"))
        .body(String::from("hello"))
        .expect("message")
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_of_the_whole_transport_refuses_every_message() {
    let breaker = breaker(Scope::Transport);
    let _ = breaker.send(&message_to("user@a.example")).await;

    let refusal = breaker
        .send(&message_to("user@b.example"))
        .await
        .expect_err("open");

    assert_eq!(refusal.code(), "breaker.open");
    assert!(refusal.refuses_every_message(), "{refusal:?}");
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_of_one_recipient_domain_refuses_that_domains_mail_alone() {
    let breaker = breaker(Scope::RecipientDomain);
    let _ = breaker.send(&message_to("user@a.example")).await;

    let refusal = breaker
        .send(&message_to("other@a.example"))
        .await
        .expect_err("open for a.example");

    assert_eq!(refusal.code(), "breaker.open");
    assert!(refusal.is_not_attempted());
    assert!(!refusal.refuses_every_message(), "{refusal:?}");
}

#[tokio::test(start_paused = true)]
async fn an_isolated_breaker_of_recipient_domains_refuses_every_message() {
    let breaker = breaker(Scope::RecipientDomain);
    breaker.isolate().await;

    let refusal = breaker
        .send(&message_to("user@new.example"))
        .await
        .expect_err("isolated");

    assert_eq!(refusal.code(), "breaker.isolated");
    assert!(refusal.refuses_every_message(), "{refusal:?}");
}

#[test]
fn a_refusal_that_was_attempted_holds_back_nothing_else() {
    let refusal = SendError::new(Category::ServiceUnavailable, "breaker.open", "open")
        .not_attempted()
        .refusing_every_message()
        .attempted_before();

    assert!(!refusal.refuses_every_message());
}

#[test]
fn only_a_not_attempted_refusal_can_hold_back_every_message() {
    let attempted =
        SendError::new(Category::ServiceUnavailable, "test.busy", "busy").refusing_every_message();

    assert!(!attempted.refuses_every_message());
}
