//! The SMTP adapter and the breaker against an SMTP server inside the test process
//! (`mailin-embedded`), so that they run with nothing installed.
#![cfg(feature = "smtp")]

mod support;

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Category, CircuitBreakerTransport, SmtpTransport, State, StateChange, Transport,
};
use support::servers::free_port;
use support::{message, numbered_messages};

use embedded::{EmbeddedSmtp, Mode};

/// Each send, and each test, finishes quickly against a loopback server.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

fn smtp_to(server: &EmbeddedSmtp) -> SmtpTransport {
    SmtpTransport::unencrypted("127.0.0.1", server.port()).with_timeout(SEND_TIMEOUT)
}

fn breaker_around(
    smtp: SmtpTransport,
    reset_timeout: Duration,
) -> CircuitBreakerTransport<SmtpTransport> {
    CircuitBreakerTransport::builder(smtp)
        .failure_threshold(3)
        .reset_timeout(reset_timeout)
        .build()
        .expect("valid breaker settings")
}

#[tokio::test]
async fn a_healthy_server_delivers_and_the_receipt_carries_its_reply() {
    let server = EmbeddedSmtp::start();
    let smtp = smtp_to(&server);

    let receipt = smtp.send(&message()).await.expect("delivered");

    assert_eq!(receipt.response(), Some("250 2.0.0 Ok: queued as Q1"));
    assert_eq!(receipt.message_id(), Some("Q1"));
    assert_eq!(receipt.transport(), smtp.name());
    assert_eq!(server.accepted(), 1);
}

#[tokio::test]
async fn a_server_answering_421_is_service_unavailable_and_opens_the_breaker() {
    let server = EmbeddedSmtp::start();
    server.set_mode(Mode::Unavailable);
    let breaker = breaker_around(smtp_to(&server), Duration::from_secs(30));

    for _ in 0..3 {
        let error = breaker
            .send(&message())
            .await
            .expect_err("the server is down");
        assert_eq!(error.category(), Category::ServiceUnavailable);
        assert_eq!(error.code(), "smtp.421");
    }

    assert_eq!(breaker.state(), State::Open);
    let refused = breaker.send(&message()).await.expect_err("refused at once");
    assert_eq!(refused.code(), "breaker.open");
    assert_eq!(server.accepted(), 0);
}

#[tokio::test]
async fn a_server_answering_451_is_a_server_error() {
    let server = EmbeddedSmtp::start();
    server.set_mode(Mode::Failing);

    let error = smtp_to(&server)
        .send(&message())
        .await
        .expect_err("the server fails");

    assert_eq!(error.category(), Category::ServerError);
    assert_eq!(error.code(), "smtp.451");
}

#[tokio::test]
async fn a_server_answering_550_is_rejected_and_never_opens_the_breaker() {
    let server = EmbeddedSmtp::start();
    server.set_mode(Mode::Rejecting);
    let breaker = breaker_around(smtp_to(&server), Duration::from_secs(30));

    for _ in 0..10 {
        let error = breaker.send(&message()).await.expect_err("refused");
        assert_eq!(error.category(), Category::Rejected);
        assert_eq!(error.code(), "smtp.550");
    }

    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test]
async fn a_breaker_closes_after_its_probe_when_the_server_answers_again() {
    let server = EmbeddedSmtp::start();
    server.set_mode(Mode::Unavailable);
    let changes = Arc::new(AtomicUsize::new(0));
    let heard = Arc::clone(&changes);
    let breaker = CircuitBreakerTransport::builder(smtp_to(&server))
        .failure_threshold(2)
        .reset_timeout(Duration::from_millis(200))
        .on_state_change(move |_: &StateChange| {
            heard.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .expect("valid breaker settings");
    for _ in 0..2 {
        assert!(breaker.send(&message()).await.is_err());
    }
    assert_eq!(breaker.state(), State::Open);

    server.set_mode(Mode::Accept);
    tokio::time::sleep(Duration::from_millis(250)).await;
    breaker.send(&message()).await.expect("the probe delivers");

    assert_eq!(breaker.state(), State::Closed);
    // closed -> open -> half-open -> closed
    assert_eq!(changes.load(Ordering::SeqCst), 3);
    assert_eq!(server.accepted(), 1);
}

#[tokio::test]
async fn send_many_of_200_messages_answers_each_in_message_order() {
    let server = EmbeddedSmtp::start();
    let smtp = smtp_to(&server);
    let messages = numbered_messages(200);

    let receipts: Vec<_> = smtp
        .send_many(futures::stream::iter(messages).boxed())
        .collect()
        .await;

    assert_eq!(receipts.len(), 200);
    for (i, receipt) in receipts.into_iter().enumerate() {
        let receipt = receipt.expect("delivered");
        let queue_id = receipt.message_id().expect("a queue id in the reply");
        assert_eq!(
            server.subject_of(queue_id),
            Some(format!("message {i}")),
            "receipt {i} answers another message"
        );
    }
    assert_eq!(server.accepted(), 200);
}

#[tokio::test]
async fn verify_succeeds_against_a_running_server() {
    let server = EmbeddedSmtp::start();

    smtp_to(&server).verify().await.expect("reachable");
}

#[tokio::test]
async fn verify_fails_with_a_network_error_on_a_port_nothing_listens_on() {
    let smtp = SmtpTransport::unencrypted("127.0.0.1", free_port()).with_timeout(SEND_TIMEOUT);

    let error = smtp.verify().await.expect_err("nothing listens");

    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), "smtp.network");
}
