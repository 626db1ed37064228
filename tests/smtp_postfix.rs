//! The crate's own SMTP client (DESIGN §10) against a real Postfix `smtpd`, which offers
//! PIPELINING, CHUNKING, SIZE and STARTTLS, started by each test in a folder of its own on a
//! free loopback port (`support::postfix`). The client reaches it through a loopback relay
//! (`support::wire`) that adds a little latency and counts round trips ("turns": data from
//! the client after data from the server), so that what the client promises on the wire is
//! checked against what a real server needs:
//!
//! - a message on a warm connection is one round trip (MAIL, RCPT, `BDAT <n> LAST` and the
//!   body in one write), two with `.chunking(false)` (DATA's `354` first), four with
//!   neither PIPELINING nor CHUNKING;
//! - a refused recipient leaves the others delivered, as Postfix's maillog shows;
//! - a message over the server's SIZE is refused before anything of it is sent;
//! - STARTTLS with the launcher's CA delivers, and nothing of the mail goes in clear.
//!
//! Postfix runs as root only; without it (or not as root) each test prints `SKIPPED` and
//! passes; under `CI=true` it fails. `cargo test --test smtp_postfix`.
#![cfg(feature = "smtp")]

mod support;

use std::time::Duration;

use lettre::transport::smtp::client::Tls;
use mail_breaker::{Category, Message, SmtpBuilder, SmtpTransport, Transport};
use support::postfix::{Postfix, PostfixOptions};
use support::wire::Relay;

/// Each direction through the relay: enough that a client which waits for a reply is seen
/// to wait, small enough to keep the tests quick.
const ONE_WAY: Duration = Duration::from_millis(5);

/// Postfix on a loopback answers in milliseconds; this only stops a hang on a busy machine.
const TIMEOUT: Duration = Duration::from_secs(15);

/// How long Postfix has to log a delivery after it answered the client.
const DELIVERY_WAIT: Duration = Duration::from_secs(15);

/// One connection to `port`, so that every send after the first finds it warm.
fn one_connection_to(port: u16) -> SmtpBuilder {
    SmtpTransport::builder_dangerous("127.0.0.1")
        .port(port)
        .max_connections(1)
        .max_messages_per_connection(1000)
        .timeout(TIMEOUT)
}

/// A small message from `app@example.com` to each of `recipients`.
fn message_to_all(recipients: &[&str], subject: &str) -> Message {
    let mut builder = Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .subject(subject);
    for recipient in recipients {
        builder = builder.to(recipient.parse().expect("a valid recipient"));
    }
    builder
        .body(String::from("hello from mail-breaker\r\n"))
        .expect("a valid message")
}

/// A message to `user@example.org` whose body alone is about `bytes` long, in lines of 78.
fn message_of_about(bytes: usize) -> Message {
    let line = format!("{}\r\n", "x".repeat(76));
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to("user@example.org".parse().expect("a valid recipient"))
        .subject("a large message")
        .body(line.repeat(bytes / line.len() + 1))
        .expect("a valid message")
}

/// Sends `message`, panicking with Postfix's maillog if it is not delivered.
async fn deliver(smtp: &SmtpTransport, message: &Message, postfix: &Postfix) {
    if let Err(error) = smtp.send(message).await {
        panic!("{error:?}\nmaillog:\n{}", postfix.maillog());
    }
}

#[tokio::test]
async fn a_message_on_a_warm_connection_is_one_round_trip() {
    let test = "a_message_on_a_warm_connection_is_one_round_trip";
    let Some(postfix) = Postfix::start(test, PostfixOptions::default()) else {
        return;
    };
    let relay = Relay::start_capturing(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .build()
        .expect("valid settings");
    deliver(&smtp, &support::message(), &postfix).await;

    for sent in 1..=5 {
        relay.reset();
        deliver(&smtp, &support::message(), &postfix).await;
        let stats = relay.stats();
        assert_eq!(stats.connections, 0, "message {sent} opened a connection");
        assert_eq!(
            stats.turns,
            1,
            "message {sent} on a warm connection: {stats:?}, the client sent {:?}",
            relay.client_bytes()
        );
    }

    let wire = relay.client_bytes();
    assert!(wire.contains("BDAT "), "no BDAT, the client sent {wire:?}");
    assert!(wire.contains(" LAST\r\n"), "no BDAT LAST: {wire:?}");
    assert!(!wire.contains("DATA\r\n"), "DATA beside CHUNKING: {wire:?}");
    assert_eq!(postfix.wait_for_deliveries(6, DELIVERY_WAIT).len(), 6);
}

#[tokio::test]
async fn a_message_to_three_recipients_one_refused_lands_for_the_other_two() {
    let test = "a_message_to_three_recipients_one_refused_lands_for_the_other_two";
    let options = PostfixOptions::default().refuse("refused@example.org");
    let Some(postfix) = Postfix::start(test, options) else {
        return;
    };
    let relay = Relay::start_capturing(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .build()
        .expect("valid settings");
    deliver(&smtp, &support::message_to("warm@example.org"), &postfix).await;
    relay.reset();

    let message = message_to_all(
        &["a@example.org", "refused@example.org", "b@example.org"],
        "three recipients",
    );
    let receipt = smtp.send(&message).await.unwrap_or_else(|error| {
        panic!("{error:?}\nmaillog:\n{}", postfix.maillog());
    });

    let refused = receipt.rejected_recipients();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let (address, why) = &refused[0];
    assert_eq!(address.to_string(), "refused@example.org");
    assert_eq!(why.category(), Category::Rejected, "{why}");
    assert_eq!(why.code(), "smtp.554", "{why}");
    assert_eq!(
        relay.turns(),
        1,
        "every RCPT goes in the one write, a refusal among them: the client sent {:?}",
        relay.client_bytes()
    );
    assert_eq!(
        postfix.wait_for_rejections(1, DELIVERY_WAIT),
        ["refused@example.org"]
    );
    let mut delivered = postfix.wait_for_deliveries(3, DELIVERY_WAIT);
    delivered.retain(|to| to != "warm@example.org");
    delivered.sort();
    assert_eq!(delivered, ["a@example.org", "b@example.org"]);

    // The connection carries on after the refusal, still at one round trip a message.
    relay.reset();
    deliver(&smtp, &support::message_to("c@example.org"), &postfix).await;
    assert_eq!(relay.stats().connections, 0);
    assert_eq!(
        relay.turns(),
        1,
        "after a refusal: {:?}",
        relay.client_bytes()
    );
    postfix.wait_for_deliveries(4, DELIVERY_WAIT);
}

#[tokio::test]
async fn a_message_over_the_servers_size_is_refused_before_anything_of_it_is_sent() {
    let test = "a_message_over_the_servers_size_is_refused_before_anything_of_it_is_sent";
    let limit: usize = 20_000;
    let options = PostfixOptions::default().message_size_limit(limit as u64);
    let Some(postfix) = Postfix::start(test, options) else {
        return;
    };
    let relay = Relay::start_capturing(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .build()
        .expect("valid settings");
    // Warm: the client has read `SIZE 20000` in Postfix's EHLO reply.
    deliver(&smtp, &support::message(), &postfix).await;
    relay.reset();

    let too_large = message_of_about(5 * limit);
    assert!(too_large.formatted().len() > 4 * limit);
    let error = smtp.send(&too_large).await.expect_err("over SIZE");

    assert_eq!(error.category(), Category::InvalidMessage, "{error}");
    assert_eq!(error.code(), "smtp.size", "{error}");
    assert!(!error.is_retryable());
    let sent = relay.bytes_to_server();
    assert!(
        sent < limit as u64,
        "{sent} bytes went to the server for a message it said it would refuse"
    );
    let wire = relay.client_bytes();
    assert!(
        !wire.contains("MAIL FROM"),
        "the client began a transaction it knew the server would refuse: {wire:?}"
    );
    assert!(
        !postfix.maillog().contains("552 5.3.4"),
        "Postfix had to refuse the size itself:\n{}",
        postfix.maillog()
    );

    // Refusing it cost the connection nothing: the next message goes on it, delivered.
    relay.reset();
    let fits = message_of_about(limit / 2);
    deliver(&smtp, &fits, &postfix).await;
    assert_eq!(relay.stats().connections, 0);
    assert_eq!(postfix.wait_for_deliveries(2, DELIVERY_WAIT).len(), 2);
}

#[tokio::test]
async fn starttls_with_the_servers_ca_delivers_and_nothing_of_the_mail_goes_in_clear() {
    let test = "starttls_with_the_servers_ca_delivers_and_nothing_of_the_mail_goes_in_clear";
    let Some(postfix) = Postfix::start(test, PostfixOptions::default()) else {
        return;
    };
    let relay = Relay::start_capturing(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .tls(Tls::Required(postfix.tls_parameters()))
        .build()
        .expect("valid settings");

    deliver(&smtp, &support::message(), &postfix).await;
    let wire = relay.client_bytes();
    relay.reset();
    deliver(&smtp, &support::message(), &postfix).await;

    assert!(wire.contains("STARTTLS\r\n"), "no STARTTLS: {wire:?}");
    assert!(!wire.contains("MAIL FROM"), "MAIL in clear: {wire:?}");
    assert!(
        !wire.contains("user@example.org"),
        "a recipient in clear: {wire:?}"
    );
    assert!(
        !relay.client_bytes().contains("example"),
        "the warm message in clear"
    );
    assert_eq!(
        relay.turns(),
        1,
        "a warm message under TLS is one round trip too"
    );
    assert_eq!(postfix.wait_for_deliveries(2, DELIVERY_WAIT).len(), 2);
    let maillog = postfix.maillog();
    assert!(
        maillog.contains("TLS connection established from localhost"),
        "Postfix logged no TLS session:\n{maillog}"
    );
}

#[tokio::test]
async fn without_chunking_a_warm_message_costs_two_round_trips_and_delivers() {
    let test = "without_chunking_a_warm_message_costs_two_round_trips_and_delivers";
    let Some(postfix) = Postfix::start(test, PostfixOptions::default()) else {
        return;
    };
    let relay = Relay::start_capturing(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .chunking(false)
        .build()
        .expect("valid settings");
    deliver(&smtp, &support::message(), &postfix).await;

    relay.reset();
    deliver(&smtp, &support::message(), &postfix).await;

    let wire = relay.client_bytes();
    assert_eq!(
        relay.turns(),
        2,
        "MAIL, RCPT and DATA in one write, the body and its dot after the 354: {wire:?}"
    );
    assert!(wire.contains("DATA\r\n"), "{wire:?}");
    assert!(wire.ends_with("\r\n.\r\n"), "{wire:?}");
    assert!(!wire.contains("BDAT"), "BDAT with chunking off: {wire:?}");
    assert_eq!(postfix.wait_for_deliveries(2, DELIVERY_WAIT).len(), 2);
}

#[tokio::test]
async fn without_pipelining_or_chunking_a_warm_message_costs_four_round_trips() {
    let test = "without_pipelining_or_chunking_a_warm_message_costs_four_round_trips";
    let Some(postfix) = Postfix::start(test, PostfixOptions::default()) else {
        return;
    };
    let relay = Relay::start(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .pipelining(false)
        .chunking(false)
        .build()
        .expect("valid settings");
    deliver(&smtp, &support::message(), &postfix).await;

    relay.reset();
    deliver(&smtp, &support::message(), &postfix).await;

    assert_eq!(relay.turns(), 4, "MAIL, RCPT, DATA, the body: each waits");
    assert_eq!(postfix.wait_for_deliveries(2, DELIVERY_WAIT).len(), 2);
}

#[tokio::test]
async fn after_a_message_whose_every_recipient_was_refused_the_next_on_the_same_connection_delivers()
 {
    let test = "after_a_message_whose_every_recipient_was_refused_the_next_on_the_same_connection_delivers";
    let options = PostfixOptions::default().refuse("refused@example.org");
    let Some(postfix) = Postfix::start(test, options) else {
        return;
    };
    let relay = Relay::start(postfix.address(), ONE_WAY).await;
    let smtp = one_connection_to(relay.port())
        .build()
        .expect("valid settings");

    let error = smtp
        .send(&support::message_to("refused@example.org"))
        .await
        .expect_err("the only recipient is refused");
    assert_eq!(error.code(), "smtp.554", "{error}");

    // Postfix holds the refused transaction open: without the RSET the next MAIL would be
    // "503 nested MAIL command". The RSET goes in the same write, so it is still one turn.
    relay.reset();
    deliver(&smtp, &support::message_to("a@example.org"), &postfix).await;
    assert_eq!(relay.stats().connections, 0);
    assert_eq!(relay.turns(), 1);
    assert_eq!(
        postfix.wait_for_deliveries(1, DELIVERY_WAIT),
        ["a@example.org"]
    );
}

#[tokio::test]
async fn a_message_to_1001_recipients_is_split_at_the_452_and_delivered_to_all_in_one_send() {
    let test = "a_message_to_1001_recipients_is_split_at_the_452_and_delivered_to_all_in_one_send";
    // Postfix's own smtpd_recipient_limit: 1,000 a transaction.
    let Some(postfix) = Postfix::start(test, PostfixOptions::default()) else {
        return;
    };
    let recipients: Vec<String> = (1..=1001).map(|n| format!("r{n}@example.org")).collect();
    let names: Vec<&str> = recipients.iter().map(String::as_str).collect();
    let smtp = one_connection_to(postfix.port())
        .build()
        .expect("valid settings");
    let receipt = match smtp.send(&message_to_all(&names, "1001")).await {
        Ok(receipt) => receipt,
        Err(error) => panic!("{error:?}\nmaillog:\n{}", postfix.maillog()),
    };

    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
    assert!(receipt.rejected_recipients().is_empty());
    assert!(receipt.maybe_delivered_recipients().is_empty());
    let transactions = receipt.transactions();
    assert_eq!(transactions.len(), 2, "split at the 452 once");
    assert_eq!(transactions[0].recipients().len(), 1000);
    assert_eq!(transactions[1].recipients().len(), 1);
    let listed: Vec<String> = transactions
        .iter()
        .flat_map(|t| t.recipients().iter().map(ToString::to_string))
        .collect();
    assert_eq!(listed, recipients, "every recipient listed once, in order");
    let (first, second) = (transactions[0].message_id(), transactions[1].message_id());
    assert!(first.is_some() && second.is_some(), "{transactions:?}");
    assert_ne!(first, second, "each transaction has its own queue id");
    assert_eq!(receipt.message_id(), first);

    let mut delivered = postfix.wait_for_deliveries(1001, DELIVERY_WAIT);
    delivered.sort();
    let mut expected = recipients.clone();
    expected.sort();
    assert_eq!(delivered, expected);
    let maillog = postfix.maillog();
    for id in [first, second].into_iter().flatten() {
        assert!(maillog.contains(id), "queue id {id} not in the maillog");
    }
}

#[tokio::test]
async fn with_a_connection_rate_limit_of_5_fifty_messages_sent_8_at_a_time_through_one_pool_are_all_delivered()
 {
    let test = "with_a_connection_rate_limit_of_5_fifty_messages_sent_8_at_a_time_through_one_pool_are_all_delivered";
    // Five connections a minute from one client, loopback included (by default the clients
    // of mynetworks are exempt); anvil counts them.
    let options = PostfixOptions::default()
        .setting("smtpd_client_connection_rate_limit", "5")
        .setting("smtpd_client_event_limit_exceptions", "");
    let Some(postfix) = Postfix::start(test, options) else {
        return;
    };
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(postfix.port())
        .max_connections(8)
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");
    let messages = support::numbered_messages(50);
    let answers: Vec<_> = {
        use futures::StreamExt;
        smtp.send_many(futures::stream::iter(messages).boxed())
            .collect()
            .await
    };

    let failed: Vec<String> = answers
        .iter()
        .filter_map(|answer| answer.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 50 failed: {failed:?}\nmaillog:\n{}",
        failed.len(),
        postfix.maillog()
    );
    assert_eq!(postfix.wait_for_deliveries(50, DELIVERY_WAIT).len(), 50);
    assert!(
        postfix.maillog().contains("Connection rate limit exceeded"),
        "the limit was never reached, so this test showed nothing:\n{}",
        postfix.maillog()
    );
}
