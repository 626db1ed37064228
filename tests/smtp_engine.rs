//! The SMTP transaction engine's rules (DESIGN §10) where a real server does not show them on
//! demand: what a pipelined transaction does when MAIL or every recipient is refused, RSET
//! after a refusal, and a pooled connection the server closed while idle. Each server is
//! `support::raw_smtp` on loopback, scripted per test.
#![cfg(feature = "smtp")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lettre::Address;
use mail_breaker::{Category, Envelope, SendError, SmtpTransport, Transport};
use support::message;
use support::raw_smtp::{Answer, RawSmtp};

const TIMEOUT: Duration = Duration::from_millis(800);

fn greeting() -> Vec<u8> {
    b"220 raw.test ESMTP\r\n".to_vec()
}

/// What a server that offers PIPELINING answers to `command`, healthy otherwise.
fn pipelining(command: &str) -> Answer {
    match command {
        "EHLO" => Answer::Say(b"250-raw.test\r\n250 PIPELINING\r\n".to_vec()),
        other => Answer::healthy(other),
    }
}

/// A script that answers the first `name` command with `answer`, and every command
/// otherwise (`name` again included) as `rest` does.
fn first(
    name: &'static str,
    answer: Answer,
    rest: fn(&str) -> Answer,
) -> impl Fn(&str) -> Answer + Send + Sync + 'static {
    let seen = AtomicUsize::new(0);
    move |command| {
        if command == name && seen.fetch_add(1, Ordering::SeqCst) == 0 {
            answer.clone()
        } else {
            rest(command)
        }
    }
}

fn transport(server: &RawSmtp, pipelining: bool) -> SmtpTransport {
    SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
        .pipelining(pipelining)
        .build()
        .expect("valid settings")
}

/// The commands the server read (the message's data and its dot are not commands), `EHLO`
/// and `QUIT` left out, upper-cased to their names.
fn names(server: &RawSmtp) -> Vec<String> {
    server
        .commands()
        .iter()
        .map(|line| {
            line.split([' ', ':'])
                .next()
                .unwrap_or_default()
                .to_ascii_uppercase()
        })
        .filter(|name| name != "EHLO" && name != "QUIT")
        .collect()
}

#[tokio::test]
async fn a_354_after_every_recipient_was_refused_ends_an_empty_message_and_sends_no_body() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "RCPT" => Answer::Say(b"550 5.1.1 no such user\r\n".to_vec()),
        "DATA" => Answer::Say(b"354 go ahead anyway\r\n".to_vec()),
        "." => Answer::Say(b"554 5.5.1 no valid recipients\r\n".to_vec()),
        other => pipelining(other),
    })
    .await;
    let error = transport(&server, true)
        .send(&message())
        .await
        .expect_err("every recipient refused");
    assert_eq!(error.category(), Category::Rejected, "{error}");
    assert_eq!(error.code(), "smtp.550");
    assert!(
        server.data().iter().all(|data| data.is_empty()),
        "{:?}",
        server.data()
    );
}

#[tokio::test]
async fn a_pipelined_transaction_whose_mail_is_refused_is_read_to_its_end_and_the_connection_carries_the_next()
 {
    let mails = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&mails);
    let server = RawSmtp::start(greeting(), move |command| match command {
        "MAIL" if seen.fetch_add(1, Ordering::SeqCst) == 0 => {
            Answer::Say(b"550 5.7.1 sender refused\r\n".to_vec())
        }
        "RCPT" | "DATA" if seen.load(Ordering::SeqCst) == 1 => {
            Answer::Say(b"503 5.5.1 no MAIL\r\n".to_vec())
        }
        other => pipelining(other),
    })
    .await;
    let smtp = transport(&server, true);
    let error = smtp.send(&message()).await.expect_err("sender refused");
    assert_eq!(error.code(), "smtp.550");
    smtp.send(&message())
        .await
        .expect("the next message delivers");
    assert_eq!(server.connections(), 1);
    assert_eq!(
        names(&server),
        ["MAIL", "RCPT", "DATA", "RSET", "MAIL", "RCPT", "DATA"]
    );
}

#[tokio::test]
async fn without_pipelining_a_refused_mail_sends_no_recipient() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "MAIL" => Answer::Say(b"550 5.7.1 sender refused\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let error = transport(&server, false)
        .send(&message())
        .await
        .expect_err("sender refused");
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(names(&server), ["MAIL"]);
}

#[tokio::test]
async fn after_every_recipient_was_refused_the_next_transaction_begins_with_rset() {
    let server = RawSmtp::start(
        greeting(),
        first(
            "RCPT",
            Answer::Say(b"550 5.1.1 no such user\r\n".to_vec()),
            Answer::healthy,
        ),
    )
    .await;
    let smtp = transport(&server, false);
    smtp.send(&message())
        .await
        .expect_err("the recipient refused");
    smtp.send(&message())
        .await
        .expect("the next message delivers");
    assert_eq!(
        names(&server),
        ["MAIL", "RCPT", "RSET", "MAIL", "RCPT", "DATA"]
    );
}

#[tokio::test]
async fn after_a_delivery_the_next_transaction_needs_no_rset() {
    let server = RawSmtp::start(greeting(), pipelining).await;
    let smtp = transport(&server, true);
    smtp.send(&message()).await.expect("delivered");
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(
        names(&server),
        ["MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA"]
    );
}

#[tokio::test]
async fn a_pipelined_pooled_connection_the_server_closed_while_idle_is_replaced_without_an_error() {
    let mails = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&mails);
    let server = RawSmtp::start(greeting(), move |command| match command {
        // The second MAIL comes on the idle connection: the server had timed it out.
        "MAIL" if seen.fetch_add(1, Ordering::SeqCst) == 1 => {
            Answer::SayAndHangUp(b"421 4.4.2 raw.test Error: timeout exceeded\r\n".to_vec())
        }
        other => pipelining(other),
    })
    .await;
    let smtp = transport(&server, true);
    smtp.send(&message()).await.expect("delivered");
    let receipt = smtp
        .send(&message())
        .await
        .expect("delivered on a fresh connection");
    assert_eq!(receipt.attempts(), 1);
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn a_421_to_mail_on_a_fresh_connection_is_the_answer_not_a_second_connection() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "MAIL" => Answer::SayAndHangUp(b"421 4.3.2 shutting down\r\n".to_vec()),
        other => pipelining(other),
    })
    .await;
    let error = transport(&server, true)
        .send(&message())
        .await
        .expect_err("the server is closing");
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn a_421_to_a_recipient_closes_the_connection_and_the_next_send_opens_another() {
    let server = RawSmtp::start(
        greeting(),
        first(
            "RCPT",
            Answer::SayAndHangUp(b"421 4.3.2 going down\r\n".to_vec()),
            pipelining,
        ),
    )
    .await;
    let smtp = transport(&server, true);
    let error = smtp.send(&message()).await.expect_err("closing");
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert!(!error.is_maybe_delivered());
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn a_421_to_the_first_of_two_recipients_ends_the_session_though_the_server_keeps_the_socket_open()
 {
    let server = RawSmtp::start(
        greeting(),
        first(
            "RCPT",
            Answer::Say(b"421 4.3.2 going down\r\n".to_vec()),
            pipelining,
        ),
    )
    .await;
    let smtp = transport(&server, true);
    let error = smtp
        .send(&message_to_two())
        .await
        .expect_err("the session ended: not delivered to the second recipient either");
    assert_eq!(error.category(), Category::ServiceUnavailable);
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(
        server.connections(),
        2,
        "the closed session carried nothing more"
    );
}

#[tokio::test]
async fn a_4xx_to_data_is_a_refusal_and_the_connection_is_kept() {
    let server = RawSmtp::start(
        greeting(),
        first(
            "DATA",
            Answer::Say(b"451 4.3.0 try later\r\n".to_vec()),
            Answer::healthy,
        ),
    )
    .await;
    let error = refused_then_delivered(&server, false, "smtp.451", 1).await;
    assert_eq!(error.category(), Category::ServerError);
    assert!(!error.is_maybe_delivered());
}

#[tokio::test]
async fn a_4xx_to_mail_on_a_fresh_connection_is_a_refusal_and_the_connection_is_kept() {
    let server = RawSmtp::start(
        greeting(),
        first(
            "MAIL",
            Answer::Say(b"451 4.3.0 try later\r\n".to_vec()),
            Answer::healthy,
        ),
    )
    .await;
    refused_then_delivered(&server, false, "smtp.451", 1).await;
}

#[tokio::test]
async fn a_421_to_the_reset_of_a_pooled_connection_replaces_it_though_the_server_keeps_the_socket_open()
 {
    let mails = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&mails);
    let server = RawSmtp::start(greeting(), move |command| match command {
        // The first transaction is refused, so the next one on this connection starts with
        // RSET, which the server, having timed the connection out while idle, answers 421.
        "MAIL" if seen.fetch_add(1, Ordering::SeqCst) == 0 => {
            Answer::Say(b"550 5.7.1 sender refused\r\n".to_vec())
        }
        "RCPT" | "DATA" if seen.load(Ordering::SeqCst) == 1 => {
            Answer::Say(b"503 5.5.1 no MAIL\r\n".to_vec())
        }
        "RSET" => Answer::Say(b"421 4.4.2 idle too long\r\n".to_vec()),
        other => pipelining(other),
    })
    .await;
    let smtp = transport(&server, true);
    let error = smtp.send(&message()).await.expect_err("refused");
    assert_eq!(error.code(), "smtp.550", "{error}");
    let receipt = smtp
        .send(&message())
        .await
        .expect("delivered on a fresh connection");
    assert_eq!(receipt.attempts(), 1);
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn verify_replaces_an_idle_connection_that_fails_its_noop() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "NOOP" => Answer::SayAndHangUp(b"421 4.4.2 idle too long\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let smtp = transport(&server, false);
    smtp.send(&message()).await.expect("delivered");
    smtp.verify().await.expect("a fresh connection answers");
    assert_eq!(server.connections(), 2);
    assert_eq!(server.count("NOOP"), 1);
}

#[tokio::test]
async fn verify_keeps_an_idle_connection_that_answers_its_noop() {
    let server = RawSmtp::start(greeting(), Answer::healthy).await;
    let smtp = transport(&server, false);
    smtp.send(&message()).await.expect("delivered");
    smtp.verify().await.expect("the idle connection answers");
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn a_connection_retired_after_its_share_of_messages_says_quit() {
    let server = RawSmtp::start(greeting(), Answer::healthy).await;
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
        .max_messages_per_connection(1)
        .build()
        .expect("valid settings");
    smtp.send(&message()).await.expect("delivered");
    // The QUIT goes in the background; give it a moment on loopback.
    for _ in 0..50 {
        if server.count("QUIT") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.count("QUIT"), 1, "{:?}", server.commands());
}

/// What a server that offers PIPELINING and CHUNKING answers to `command`, healthy otherwise.
fn chunking(command: &str) -> Answer {
    match command {
        "EHLO" => Answer::Say(b"250-raw.test\r\n250-PIPELINING\r\n250 CHUNKING\r\n".to_vec()),
        "BDAT" => Answer::Say(b"250 2.0.0 Ok: queued as RAW2\r\n".to_vec()),
        other => Answer::healthy(other),
    }
}

#[tokio::test]
async fn with_chunking_the_message_goes_as_one_bdat_last_with_its_exact_length() {
    let server = RawSmtp::start(greeting(), chunking).await;
    let receipt = transport(&server, true)
        .send(&message())
        .await
        .expect("delivered");
    assert_eq!(receipt.message_id(), Some("RAW2"));
    assert_eq!(names(&server), ["MAIL", "RCPT", "BDAT"]);
    let bdat = server.commands()[3].clone();
    let data = server.data();
    assert_eq!(bdat, format!("BDAT {} LAST", data[0].len()));
    assert!(data[0].ends_with(b"hello\r\n"), "{:?}", data[0]);
}

#[tokio::test]
async fn a_stale_chunked_attempt_does_not_make_the_fresh_connections_timeout_maybe_delivered() {
    let mails = Arc::new(AtomicUsize::new(0));
    let hellos = Arc::new(AtomicUsize::new(0));
    let (seen_mails, seen_hellos) = (Arc::clone(&mails), Arc::clone(&hellos));
    let server = RawSmtp::start(greeting(), move |command| match command {
        // The first connection's second MAIL: the server had timed it out while idle.
        "MAIL" if seen_mails.fetch_add(1, Ordering::SeqCst) == 1 => {
            Answer::SayAndHangUp(b"421 4.4.2 raw.test Error: timeout exceeded\r\n".to_vec())
        }
        // The fresh connection never gets past EHLO, so its message is never written.
        "EHLO" if seen_hellos.fetch_add(1, Ordering::SeqCst) == 1 => Answer::Silence,
        other => chunking(other),
    })
    .await;
    let smtp = transport(&server, true);
    smtp.send(&message()).await.expect("delivered");
    let error = smtp
        .send(&message())
        .await
        .expect_err("the fresh connection times out");
    assert_eq!(error.category(), Category::Timeout, "{error}");
    assert!(
        !error.is_maybe_delivered(),
        "the stale connection took nothing and the fresh one sent nothing: {error}"
    );
    assert_eq!(server.connections(), 2);
}

/// A server that takes one recipient a transaction (`452 4.5.3` to the second) and answers the
/// second transaction's DATA with `second_data`.
async fn one_recipient_a_transaction(second_data: Answer) -> RawSmtp {
    let rcpts = Arc::new(AtomicUsize::new(0));
    let datas = Arc::new(AtomicUsize::new(0));
    RawSmtp::start(greeting(), move |command| match command {
        "RCPT" if rcpts.fetch_add(1, Ordering::SeqCst) == 1 => {
            Answer::Say(b"452 4.5.3 Too many recipients\r\n".to_vec())
        }
        "DATA" if datas.fetch_add(1, Ordering::SeqCst) == 1 => second_data.clone(),
        other => Answer::healthy(other),
    })
    .await
}

fn message_to_two() -> mail_breaker::Message {
    mail_breaker::Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("a@example.org".parse().expect("a recipient"))
        .to("b@example.org".parse().expect("a recipient"))
        .subject("two")
        .body(String::from("hello"))
        .expect("a message")
}

#[tokio::test]
async fn a_further_transaction_that_is_refused_leaves_its_recipients_deferred_on_the_delivery() {
    let server =
        one_recipient_a_transaction(Answer::Say(b"451 4.3.0 try later\r\n".to_vec())).await;
    let receipt = transport(&server, false)
        .send(&message_to_two())
        .await
        .expect("delivered to the first recipient");
    let deferred = receipt.deferred_recipients();
    assert_eq!(deferred.len(), 1, "{receipt:?}");
    assert_eq!(deferred[0].0.to_string(), "b@example.org");
    assert_eq!(deferred[0].1.code(), "smtp.451");
    assert!(receipt.rejected_recipients().is_empty());
}

#[tokio::test]
async fn a_further_transaction_whose_connection_breaks_leaves_its_recipients_deferred_on_the_delivery()
 {
    let server =
        one_recipient_a_transaction(Answer::SayAndHangUp(b"421 4.3.2 going down\r\n".to_vec()))
            .await;
    let smtp = transport(&server, false);
    let receipt = smtp
        .send(&message_to_two())
        .await
        .expect("delivered to the first recipient");
    let deferred = receipt.deferred_recipients();
    assert_eq!(deferred.len(), 1, "{receipt:?}");
    assert_eq!(deferred[0].0.to_string(), "b@example.org");
    assert_eq!(deferred[0].1.category(), Category::ServiceUnavailable);
    // The broken connection is not used again.
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn a_reply_out_of_turn_to_a_recipient_closes_the_connection() {
    let server = RawSmtp::start(
        greeting(),
        first(
            "RCPT",
            Answer::Say(b"354 out of turn\r\n".to_vec()),
            Answer::healthy,
        ),
    )
    .await;
    refused_then_delivered(&server, false, "smtp.unexpected_reply", 2).await;
}

/// A server that refuses the first message's only recipient, then answers its BDAT with
/// `answer`; every later command is a chunking server's.
async fn refused_recipient_then_bdat(answer: Answer) -> RawSmtp {
    let bdats = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&bdats);
    RawSmtp::start(greeting(), move |command| match command {
        "RCPT" if seen.load(Ordering::SeqCst) == 0 => {
            Answer::Say(b"550 5.1.1 no such user\r\n".to_vec())
        }
        "BDAT" if seen.fetch_add(1, Ordering::SeqCst) == 0 => answer.clone(),
        other => chunking(other),
    })
    .await
}

/// A server that refuses the first MAIL, then answers the RCPT pipelined after it with
/// `answer`; every later command is a pipelining server's.
async fn refused_mail_then_rcpt(answer: Answer) -> RawSmtp {
    let mails = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&mails);
    RawSmtp::start(greeting(), move |command| match command {
        "MAIL" if seen.fetch_add(1, Ordering::SeqCst) == 0 => {
            Answer::Say(b"550 5.7.1 sender refused\r\n".to_vec())
        }
        "RCPT" if seen.load(Ordering::SeqCst) == 1 => answer.clone(),
        other => pipelining(other),
    })
    .await
}

/// Sends twice through a transport with or without PIPELINING: the first answer must be the
/// refusal `code` (returned, for more checks), the second message delivered, and
/// `connections` opened for the two: 1 where the refusal left the session usable, 2 where it
/// ended it.
async fn refused_then_delivered(
    server: &RawSmtp,
    pipelining: bool,
    code: &str,
    connections: usize,
) -> SendError {
    let smtp = transport(server, pipelining);
    let error = smtp.send(&message()).await.expect_err("refused");
    assert_eq!(error.code(), code, "{error}");
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(
        server.connections(),
        connections,
        "connections opened for the refused message and the next"
    );
    error
}

#[tokio::test]
async fn a_421_after_every_recipient_was_refused_keeps_their_refusal_as_the_answer_and_closes() {
    let server =
        refused_recipient_then_bdat(Answer::SayAndHangUp(b"421 4.3.2 going down\r\n".to_vec()))
            .await;
    refused_then_delivered(&server, true, "smtp.550", 2).await;
}

#[tokio::test]
async fn a_421_from_a_server_that_keeps_the_socket_open_still_ends_the_session() {
    // Says it is closing, and does not: the client must not send on this session.
    let server =
        refused_recipient_then_bdat(Answer::Say(b"421 4.3.2 going down\r\n".to_vec())).await;
    refused_then_delivered(&server, true, "smtp.550", 2).await;
}

#[tokio::test]
async fn a_421_in_the_pipeline_of_a_refused_mail_keeps_the_refusal_as_the_answer_and_closes() {
    let server =
        refused_mail_then_rcpt(Answer::SayAndHangUp(b"421 4.3.2 going down\r\n".to_vec())).await;
    refused_then_delivered(&server, true, "smtp.550", 2).await;
}

#[tokio::test]
async fn a_421_in_the_pipeline_of_a_refused_mail_ends_the_session_though_the_server_keeps_the_socket_open()
 {
    let server = refused_mail_then_rcpt(Answer::Say(b"421 4.3.2 going down\r\n".to_vec())).await;
    refused_then_delivered(&server, true, "smtp.550", 2).await;
}

#[tokio::test]
async fn a_recipient_accepted_in_a_transaction_the_server_refused_is_out_of_turn_and_ends_the_session()
 {
    // A 250 to RCPT after MAIL was refused: the server and the client no longer agree on
    // where the session stands.
    let server = refused_mail_then_rcpt(pipelining("RCPT")).await;
    refused_then_delivered(&server, true, "smtp.550", 2).await;
}

#[tokio::test]
async fn an_empty_message_the_server_took_after_every_recipient_was_refused_keeps_the_connection() {
    let datas = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&datas);
    let server = RawSmtp::start(greeting(), move |command| match command {
        "RCPT" if seen.load(Ordering::SeqCst) == 0 => {
            Answer::Say(b"550 5.1.1 no such user\r\n".to_vec())
        }
        "DATA" => {
            seen.fetch_add(1, Ordering::SeqCst);
            Answer::Say(b"354 go ahead anyway\r\n".to_vec())
        }
        other => pipelining(other),
    })
    .await;
    let smtp = transport(&server, true);
    let error = smtp.send(&message()).await.expect_err("refused");
    assert_eq!(error.code(), "smtp.550", "{error}");
    smtp.send(&message()).await.expect("delivered");
    assert_eq!(server.connections(), 1);
}

/// Addresses whose text holds a line break: lettre's parser refuses them, but
/// `Address::new_dangerous` (or a caller's own unchecked source) does not.
fn addresses_with_line_breaks() -> Vec<(&'static str, Envelope)> {
    let plain = |text: &str| -> Address { text.parse().expect("a valid address") };
    let evil_to = Address::new_dangerous("bob>\r\nRCPT TO:<eve", "example.org");
    let evil_from = Address::new_dangerous("app\n", "example.com");
    let evil_domain = Address::new_dangerous("bob", "example.org\rDATA");
    vec![
        (
            "a recipient with CRLF",
            Envelope::new(Some(plain("app@example.com")), vec![evil_to]).expect("an envelope"),
        ),
        (
            "a sender with LF",
            Envelope::new(Some(evil_from), vec![plain("bob@example.org")]).expect("an envelope"),
        ),
        (
            "a recipient domain with CR",
            Envelope::new(Some(plain("app@example.com")), vec![evil_domain]).expect("an envelope"),
        ),
    ]
}

#[tokio::test]
async fn an_address_with_cr_or_lf_is_refused_as_an_invalid_message_before_any_command_is_written() {
    let server = RawSmtp::start(greeting(), pipelining).await;
    let smtp = transport(&server, true);
    for (case, envelope) in addresses_with_line_breaks() {
        let error = smtp
            .send_raw(&envelope, b"Subject: x\r\n\r\nhello\r\n")
            .await
            .expect_err(case);
        assert_eq!(
            error.category(),
            Category::InvalidMessage,
            "{case}: {error}"
        );
        assert!(!error.is_retryable(), "{case}");
    }
    let written = names(&server);
    assert!(
        !written.iter().any(|name| name == "MAIL" || name == "RCPT"),
        "commands were written: {:?}",
        server.commands()
    );
}

/// A server that takes at most `limit` recipients a transaction (the others get
/// `too_many`, e.g. `452 4.5.3 ...`) and names each transaction's queue id after its number
/// (`Q1`, `Q2`, ...: the count of MAIL commands so far). `script(n, command)` may answer a
/// command of transaction `n` otherwise; `None` leaves it to the rules above.
async fn recipients_limited(
    limit: usize,
    too_many: &'static [u8],
    script: impl Fn(usize, &str) -> Option<Answer> + Send + Sync + 'static,
) -> RawSmtp {
    let mails = AtomicUsize::new(0);
    let rcpts = AtomicUsize::new(0);
    RawSmtp::start(greeting(), move |command| {
        if command == "MAIL" {
            mails.fetch_add(1, Ordering::SeqCst);
            rcpts.store(0, Ordering::SeqCst);
        }
        let transaction = mails.load(Ordering::SeqCst);
        if let Some(answer) = script(transaction, command) {
            return answer;
        }
        match command {
            "RCPT" if rcpts.fetch_add(1, Ordering::SeqCst) >= limit => {
                Answer::Say(too_many.to_vec())
            }
            "." => Answer::Say(format!("250 2.0.0 Ok: queued as Q{transaction}\r\n").into_bytes()),
            other => Answer::healthy(other),
        }
    })
    .await
}

const TOO_MANY: &[u8] = b"452 4.5.3 Error: too many recipients\r\n";

/// A message to `count` recipients, `r1@example.org` to `r<count>@example.org`.
fn message_to_many(count: usize) -> mail_breaker::Message {
    let mut builder = mail_breaker::Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .subject("many");
    for n in 1..=count {
        builder = builder.to(format!("r{n}@example.org").parse().expect("a recipient"));
    }
    builder.body(String::from("hello")).expect("a message")
}

fn addresses(list: &[(Address, SendError)]) -> Vec<String> {
    list.iter().map(|(to, _)| to.to_string()).collect()
}

#[tokio::test]
async fn a_split_send_lists_each_transaction_with_its_reply_queue_id_and_recipients() {
    let server = recipients_limited(2, TOO_MANY, |_, _| None).await;
    let receipt = transport(&server, false)
        .send(&message_to_many(5))
        .await
        .expect("delivered");
    let transactions: Vec<(Option<&str>, Vec<String>)> = receipt
        .transactions()
        .iter()
        .map(|t| {
            (
                t.message_id(),
                t.recipients().iter().map(ToString::to_string).collect(),
            )
        })
        .collect();
    assert_eq!(
        transactions,
        [
            (
                Some("Q1"),
                vec!["r1@example.org".to_owned(), "r2@example.org".to_owned()]
            ),
            (
                Some("Q2"),
                vec!["r3@example.org".to_owned(), "r4@example.org".to_owned()]
            ),
            (Some("Q3"), vec!["r5@example.org".to_owned()]),
        ]
    );
    assert_eq!(
        receipt.transactions()[1].response(),
        "250 2.0.0 Ok: queued as Q2"
    );
    // The receipt's own reply and queue id stay the first transaction's.
    assert_eq!(receipt.message_id(), Some("Q1"));
    assert_eq!(receipt.response(), Some("250 2.0.0 Ok: queued as Q1"));
    assert!(receipt.deferred_recipients().is_empty());
    assert!(receipt.maybe_delivered_recipients().is_empty());
}

#[tokio::test]
async fn a_single_transaction_is_listed_with_its_recipients_too() {
    let server = recipients_limited(10, TOO_MANY, |_, _| None).await;
    let receipt = transport(&server, true)
        .send(&message_to_many(2))
        .await
        .expect("delivered");
    assert_eq!(receipt.transactions().len(), 1, "{receipt:?}");
    assert_eq!(receipt.transactions()[0].recipients().len(), 2);
    assert_eq!(receipt.transactions()[0].message_id(), Some("Q1"));
}

#[tokio::test]
async fn a_later_transaction_that_breaks_after_its_data_was_written_files_its_recipients_as_maybe_delivered()
 {
    let server = recipients_limited(1, TOO_MANY, |transaction, command| {
        (transaction == 2 && command == ".").then_some(Answer::HangUp)
    })
    .await;
    let receipt = transport(&server, false)
        .send(&message_to_many(2))
        .await
        .expect("delivered to the first recipient");
    assert_eq!(
        addresses(receipt.maybe_delivered_recipients()),
        ["r2@example.org"]
    );
    assert!(
        receipt.maybe_delivered_recipients()[0]
            .1
            .is_maybe_delivered()
    );
    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
    assert_eq!(receipt.transactions().len(), 1);
}

#[tokio::test]
async fn a_timeout_in_a_later_transaction_keeps_what_the_earlier_one_delivered() {
    // The second transaction's final dot is never answered; the third recipient, too many
    // for it, never had its turn.
    let server = recipients_limited(1, TOO_MANY, |transaction, command| {
        (transaction == 2 && command == ".").then_some(Answer::Silence)
    })
    .await;
    let receipt = transport(&server, false)
        .send(&message_to_many(3))
        .await
        .expect("the first transaction delivered");
    assert_eq!(receipt.message_id(), Some("Q1"));
    assert_eq!(
        receipt.transactions()[0].recipients()[0].to_string(),
        "r1@example.org"
    );
    let maybe = receipt.maybe_delivered_recipients();
    assert_eq!(addresses(maybe), ["r2@example.org"], "{receipt:?}");
    assert_eq!(maybe[0].1.category(), Category::Timeout);
    assert!(maybe[0].1.is_maybe_delivered());
    assert_eq!(addresses(receipt.deferred_recipients()), ["r3@example.org"]);
    assert!(!receipt.deferred_recipients()[0].1.is_maybe_delivered());
}

#[tokio::test]
async fn a_timeout_before_a_later_transactions_data_leaves_its_recipients_deferred() {
    let server = recipients_limited(1, TOO_MANY, |transaction, command| {
        (transaction == 2 && command == "DATA").then_some(Answer::Silence)
    })
    .await;
    let receipt = transport(&server, false)
        .send(&message_to_many(2))
        .await
        .expect("the first transaction delivered");
    let deferred = receipt.deferred_recipients();
    assert_eq!(addresses(deferred), ["r2@example.org"], "{receipt:?}");
    assert_eq!(deferred[0].1.category(), Category::Timeout);
    assert!(!deferred[0].1.is_maybe_delivered());
    assert!(receipt.maybe_delivered_recipients().is_empty());
}

#[tokio::test]
async fn a_552_too_many_recipients_keeps_the_servers_own_words() {
    // RFC 5321 §4.5.3.1.10: some servers say 552 where 452 is meant; a client treats it as
    // temporary. This one takes no recipient at all.
    let server = recipients_limited(
        0,
        b"552 5.5.3 Recipient limit of raw.test reached\r\n",
        |_, _| None,
    )
    .await;
    let error = transport(&server, true)
        .send(&message())
        .await
        .expect_err("no recipient taken");
    assert_eq!(error.code(), "smtp.552", "{error}");
    assert!(
        error
            .message()
            .contains("Recipient limit of raw.test reached"),
        "{error}"
    );
    assert!(error.is_retryable(), "{error}");
}

#[tokio::test]
async fn when_every_recipient_is_refused_a_rate_limit_answers_over_a_recipients_deferral() {
    let server = RawSmtp::start_reading_lines(greeting(), |command, line| match command {
        "RCPT" if line.contains("r1@") => {
            Answer::Say(b"450 4.2.1 mailbox busy, try later\r\n".to_vec())
        }
        "RCPT" => Answer::Say(b"451 4.7.28 rate limited, slow down\r\n".to_vec()),
        other => pipelining(other),
    })
    .await;
    let error = transport(&server, true)
        .send(&message_to_many(2))
        .await
        .expect_err("every recipient refused");
    assert_eq!(error.category(), Category::RateLimited, "{error}");
    assert_eq!(error.code(), "smtp.451");
    assert!(
        error
            .causes()
            .iter()
            .any(|cause| cause.code() == "smtp.450"),
        "the recipient's deferral is kept beside it: {:?}",
        error.causes()
    );
}

/// A pipelining server offering 8BITMIME, and SMTPUTF8 where `smtputf8`.
async fn eight_bit_server(smtputf8: bool) -> RawSmtp {
    RawSmtp::start(greeting(), move |command| match command {
        "EHLO" if smtputf8 => Answer::Say(
            b"250-raw.test\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SMTPUTF8\r\n".to_vec(),
        ),
        "EHLO" => Answer::Say(b"250-raw.test\r\n250-PIPELINING\r\n250 8BITMIME\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await
}

fn ascii_envelope() -> Envelope {
    Envelope::new(
        Some("app@example.com".parse().expect("a sender")),
        vec!["bob@example.org".parse().expect("a recipient")],
    )
    .expect("an envelope")
}

/// The MAIL command the server read, if any.
fn mail_command(server: &RawSmtp) -> Option<String> {
    server
        .commands()
        .into_iter()
        .find(|line| line.starts_with("MAIL "))
}

const UTF8_SUBJECT: &str =
    "From: Jöran <app@example.com>\r\nSubject: Grüße aus Köln\r\n\r\nhello\r\n";

#[tokio::test]
async fn raw_utf8_in_the_headers_of_an_ascii_envelope_declares_smtputf8_where_offered() {
    let server = eight_bit_server(true).await;
    transport(&server, true)
        .send_raw(&ascii_envelope(), UTF8_SUBJECT.as_bytes())
        .await
        .expect("delivered");
    let mail = mail_command(&server).expect("MAIL was sent");
    assert!(mail.ends_with(" SMTPUTF8"), "{mail}");
    assert!(mail.contains(" BODY=8BITMIME"), "{mail}");
}

#[tokio::test]
async fn a_body_alone_that_is_not_ascii_declares_8bitmime_but_not_smtputf8() {
    let server = eight_bit_server(true).await;
    transport(&server, true)
        .send_raw(
            &ascii_envelope(),
            "Subject: plain\r\n\r\nGrüße\r\n".as_bytes(),
        )
        .await
        .expect("delivered");
    let mail = mail_command(&server).expect("MAIL was sent");
    assert!(mail.contains(" BODY=8BITMIME"), "{mail}");
    assert!(!mail.contains("SMTPUTF8"), "{mail}");
}

#[tokio::test]
async fn a_message_that_needs_smtputf8_is_an_invalid_message_where_the_server_does_not_offer_it() {
    let server = eight_bit_server(false).await;
    let smtp = transport(&server, true);
    let in_headers = smtp
        .send_raw(&ascii_envelope(), UTF8_SUBJECT.as_bytes())
        .await
        .expect_err("no SMTPUTF8");
    let utf8_recipient = Envelope::new(
        Some("app@example.com".parse().expect("a sender")),
        vec!["jöran@example.org".parse().expect("a recipient")],
    )
    .expect("an envelope");
    let in_envelope = smtp
        .send_raw(&utf8_recipient, b"Subject: x\r\n\r\nhello\r\n")
        .await
        .expect_err("no SMTPUTF8");
    for error in [in_headers, in_envelope] {
        assert_eq!(error.category(), Category::InvalidMessage, "{error}");
        assert!(error.message().contains("SMTPUTF8"), "says why: {error}");
    }
    assert_eq!(mail_command(&server), None, "nothing of it was sent");
}

#[tokio::test]
async fn a_line_over_998_octets_that_cannot_be_folded_is_an_invalid_message_and_nothing_of_it_is_sent()
 {
    let server = eight_bit_server(true).await;
    let smtp = transport(&server, true);
    for (where_, message) in [
        ("body", format!("Subject: x\r\n\r\n{}\r\n", "x".repeat(999))),
        (
            // A header line is folded before a space where it is too long; this one has none.
            "header",
            format!("X-Long:{}\r\n\r\nhello\r\n", "x".repeat(992)),
        ),
        (
            "last line",
            format!("Subject: x\r\n\r\nhi\r\n{}", "y".repeat(1500)),
        ),
    ] {
        let error = smtp
            .send_raw(&ascii_envelope(), message.as_bytes())
            .await
            .expect_err(where_);
        assert_eq!(
            error.category(),
            Category::InvalidMessage,
            "{where_}: {error}"
        );
        assert_eq!(error.code(), "smtp.line_too_long", "{where_}");
        assert!(error.message().contains("998"), "says why: {error}");
    }
    assert_eq!(mail_command(&server), None, "nothing of them was sent");
    // 998 octets and its CRLF are exactly the limit.
    let longest = format!("Subject: x\r\n\r\n{}\r\n", "x".repeat(998));
    smtp.send_raw(&ascii_envelope(), longest.as_bytes())
        .await
        .expect("a line of 998 octets is delivered");
}
