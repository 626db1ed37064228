//! The crate's own SMTP client against Postfix's `smtp-sink`, which offers PIPELINING but not
//! CHUNKING, through a loopback relay that counts round trips (`support::wire`): a message on
//! a warm connection costs two (MAIL, RCPT and DATA in one write; the body and its dot after
//! the `354`), and four where the server does not offer PIPELINING (`smtp-sink -p`), since a
//! client may pipeline only where the server says it can (RFC 2920).
//!
//! Without smtp-sink each test prints `SKIPPED` and passes; under `CI=true` it fails.
//! `cargo test --test smtp_sink_pipelining`.
#![cfg(feature = "smtp")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use mail_breaker::{SmtpTransport, Transport};
use support::smtp_sink::SmtpSink;
use support::wire::Relay;

/// Each direction through the relay: enough that a client which waits for a reply is seen
/// to wait.
const ONE_WAY: Duration = Duration::from_millis(5);

const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one message to warm a connection through `relay`, then `messages` more, and returns
/// the turns each of those cost, with what the client sent for the last.
async fn turns_of_warm_messages(relay: &Relay, messages: usize) -> (Vec<u64>, String) {
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(relay.port())
        .max_connections(1)
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");
    smtp.send(&support::message()).await.expect("delivered");
    let mut turns = Vec::new();
    for _ in 0..messages {
        relay.reset();
        smtp.send(&support::message()).await.expect("delivered");
        assert_eq!(relay.connections(), 0, "the connection was not reused");
        turns.push(relay.turns());
    }
    (turns, relay.client_bytes())
}

async fn relay_to(address: SocketAddr) -> Relay {
    Relay::start_capturing(address, ONE_WAY).await
}

#[tokio::test]
async fn with_pipelining_and_no_chunking_a_warm_message_costs_two_round_trips() {
    let test = "with_pipelining_and_no_chunking_a_warm_message_costs_two_round_trips";
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let relay = relay_to(sink.address()).await;

    let (turns, wire) = turns_of_warm_messages(&relay, 3).await;

    assert_eq!(
        turns,
        [2, 2, 2],
        "MAIL, RCPT and DATA in one write, then the body: the client sent {wire:?}"
    );
    assert!(
        wire.contains("DATA\r\n"),
        "smtp-sink offers no CHUNKING: {wire:?}"
    );
    assert!(!wire.contains("BDAT"), "BDAT to a server without CHUNKING");
    assert_eq!(sink.received(), 4);
}

#[tokio::test]
async fn without_pipelining_offered_a_warm_message_costs_four_round_trips() {
    let test = "without_pipelining_offered_a_warm_message_costs_four_round_trips";
    let Some(sink) = SmtpSink::start_counting(test, &["-p"]) else {
        return;
    };
    let relay = relay_to(sink.address()).await;

    let (turns, wire) = turns_of_warm_messages(&relay, 2).await;

    assert_eq!(
        turns,
        [4, 4],
        "MAIL, RCPT, DATA and the body, each after the last reply: the client sent {wire:?}"
    );
    assert_eq!(sink.received(), 3);
}
