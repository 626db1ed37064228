//! The SMTP client against hostile and odd servers (DESIGN §10): whatever a server sends, the
//! client neither runs a reply behind, nor smuggles a second message, nor sends credentials in
//! clear text, nor buffers without end, nor panics; it checks each reply code against its
//! command, and sorts the answers real servers give when they blocklist, throttle or defer.
//!
//! Each server is `support::raw_smtp` on loopback, scripted per test. The STARTTLS ones take a
//! real TLS handshake with a certificate made by `openssl` (skipped without it, failing under
//! CI). A test whose server has to stall waits with short real-time timeouts: the sockets are
//! real, so the clock cannot be paused.
#![cfg(feature = "smtp")]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lettre::Address;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::Tls;
use mail_breaker::{
    Backoff, Category, Envelope, Message, PoolTransport, Receipt, RetryTransport, SendError,
    SmtpBuilder, SmtpTransport, Transport,
};
use support::message;
use support::raw_smtp::{Answer, RawSmtp};
use support::servers::report_skip;
use support::test_certs::TestCertificates;

/// Short: every server here is on loopback.
const TIMEOUT: Duration = Duration::from_millis(500);
/// TLS handshakes on loopback take milliseconds even in a debug build; this only stops a hang.
const TLS_TIMEOUT: Duration = Duration::from_millis(900);
/// A send timeout long enough that a test can tell an error that came early from one that
/// waited for the time to run out.
const GENEROUS: Duration = Duration::from_secs(20);
/// The bound that stands for "long before the timeout": a bound, not a speed claim.
const WELL_BEFORE: Duration = Duration::from_secs(5);
/// Past every send timeout in this file: a send still running then hangs.
const HANG: Duration = Duration::from_secs(40);

fn greeting() -> Vec<u8> {
    b"220 raw.test ESMTP\r\n".to_vec()
}

fn address(text: &str) -> Address {
    text.parse().expect("a valid address")
}

fn to_server(server: &RawSmtp) -> SmtpBuilder {
    SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
}

fn transport_to(server: &RawSmtp) -> SmtpTransport {
    to_server(server).build().expect("valid settings")
}

/// Sends `message`, failing the test if the send outlives its own timeout (a hang).
async fn send(transport: &impl Transport, message: &Message) -> Result<Receipt, SendError> {
    tokio::time::timeout(HANG, transport.send(message))
        .await
        .expect("the send hung past its own timeout")
}

/// The error of a send to a server that answers `name` with `answer`, healthily otherwise.
async fn error_when_answering(name: &'static str, answer: Answer) -> SendError {
    let server = RawSmtp::start(greeting(), move |command| {
        if command == name {
            answer.clone()
        } else {
            Answer::healthy(command)
        }
    })
    .await;
    send(&transport_to(&server), &message())
        .await
        .expect_err("a refusal is no delivery")
}

/// A message from `app@example.com` to each of `recipients`.
fn message_to_each(recipients: &[&str]) -> Message {
    recipients
        .iter()
        .fold(
            Message::builder().from("app@example.com".parse().expect("a valid sender")),
            |builder, to| builder.to(to.parse().expect("a valid recipient")),
        )
        .subject("test")
        .body(String::from("hello"))
        .expect("a valid message")
}

/// The commands the server read after the first `DATA`, but `QUIT` and `RSET`.
fn commands_after_data(server: &RawSmtp) -> Vec<String> {
    server
        .commands()
        .into_iter()
        .skip_while(|line| !line.eq_ignore_ascii_case("DATA"))
        .skip(1)
        .filter(|line| !["QUIT", "RSET"].contains(&line.to_ascii_uppercase().as_str()))
        .collect()
}

/// The recipients of each transaction the server read, in order: the `RCPT TO:` lines after
/// each `MAIL`.
fn recipients_per_transaction(server: &RawSmtp) -> Vec<Vec<String>> {
    let mut transactions: Vec<Vec<String>> = Vec::new();
    for line in server.commands() {
        let upper = line.to_ascii_uppercase();
        if upper.starts_with("MAIL") {
            transactions.push(Vec::new());
        } else if upper.starts_with("RCPT")
            && let Some(transaction) = transactions.last_mut()
        {
            transaction.push(line);
        }
    }
    transactions
}

/// The value of the header `name` in a message's data, if it has one.
fn header(data: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(data).lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).escape_debug().to_string()
}

// 1. STARTTLS response injection (CVE-2011-0411 and its kin): a reply the client reads after
// the handshake must come from inside TLS.

/// A server that offers STARTTLS in its first EHLO, answers STARTTLS with `starttls_reply` in
/// one write and then a real TLS handshake, and is healthy otherwise.
async fn starttls_server(
    certificates: &TestCertificates,
    starttls_reply: &'static [u8],
) -> RawSmtp {
    let ehlos = AtomicUsize::new(0);
    RawSmtp::start_with_tls(
        greeting(),
        certificates.acceptor(),
        move |command, _line| match command {
            "EHLO" if ehlos.fetch_add(1, Ordering::SeqCst) == 0 => {
                Answer::Say(b"250-raw.test\r\n250-STARTTLS\r\n250 8BITMIME\r\n".to_vec())
            }
            "STARTTLS" => Answer::SayAndStartTls(starttls_reply.to_vec()),
            other => Answer::healthy(other),
        },
    )
    .await
}

#[tokio::test]
async fn a_starttls_reply_without_injected_bytes_delivers_over_tls() {
    let test = "a_starttls_reply_without_injected_bytes_delivers_over_tls";
    let Some(certificates) = TestCertificates::make(test) else {
        return;
    };
    let server = starttls_server(&certificates, b"220 go ahead\r\n").await;
    let smtp = to_server(&server)
        .tls(Tls::Required(certificates.tls_parameters()))
        .timeout(TLS_TIMEOUT)
        .build()
        .expect("valid settings");

    let receipt = send(&smtp, &message()).await.expect("delivered over TLS");

    assert_eq!(receipt.message_id(), Some("RAW1"), "{receipt:?}");
    assert_eq!(server.count("EHLO"), 2, "{:?}", server.commands());
}

#[tokio::test]
async fn bytes_injected_after_the_starttls_reply_close_the_connection_with_a_network_error() {
    let test = "bytes_injected_after_the_starttls_reply_close_the_connection_with_a_network_error";
    let Some(certificates) = TestCertificates::make(test) else {
        return;
    };
    let server = starttls_server(&certificates, b"220 go ahead\r\n250 injected\r\n").await;
    let smtp = to_server(&server)
        .tls(Tls::Required(certificates.tls_parameters()))
        .timeout(TLS_TIMEOUT)
        .build()
        .expect("valid settings");

    let error = send(&smtp, &message())
        .await
        .expect_err("the injected line was read as the server's answer inside TLS");

    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), "smtp.starttls_injection", "{error}");
    assert_eq!(server.count("MAIL"), 0, "{:?}", server.commands());
}

// 2. SMTP smuggling: a body whose bare LF before a dot ends the data for a lenient server, and
// smuggles a second message after it.

/// Bare CR and bare LF made CRLF; a CRLF left as it is.
fn with_crlf_line_endings(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + 16);
    let mut bytes = raw.iter().copied().peekable();
    while let Some(byte) = bytes.next() {
        match byte {
            b'\r' => {
                out.extend_from_slice(b"\r\n");
                bytes.next_if_eq(&b'\n');
            }
            b'\n' => out.extend_from_slice(b"\r\n"),
            other => out.push(other),
        }
    }
    out
}

#[tokio::test]
async fn a_body_with_bare_line_endings_and_dots_reaches_the_wire_as_crlf_lines_dot_stuffed_and_ended_once()
 {
    let server = RawSmtp::start(greeting(), Answer::healthy).await;
    let smtp = transport_to(&server);
    let envelope = Envelope::new(
        Some(address("app@example.com")),
        vec![address("user@example.org")],
    )
    .expect("a valid envelope");
    let raw: &[u8] = b"From: app@example.com\r\nTo: user@example.org\r\nSubject: smuggling\r\n\r\n\
        a\n.\r\nMAIL FROM:<x@evil>\r\nRCPT TO:<victim@example.org>\r\nDATA\r\n\
        smuggled\r\n.\r\n.leading dot\r\nbare\rCR\r\nlast line ends bare\n";

    tokio::time::timeout(HANG, smtp.send_raw(&envelope, raw))
        .await
        .expect("the send hung past its own timeout")
        .expect("delivered");

    let transcript = server.transcript(0);
    let data_starts = transcript
        .windows(6)
        .position(|window| window == b"DATA\r\n")
        .expect("the client sent DATA")
        + 6;
    let after_data = &transcript[data_starts..];
    // Read strictly, the data ends at its first CRLF . CRLF.
    let data_ends = after_data
        .windows(5)
        .position(|window| window == b"\r\n.\r\n")
        .expect("the data ends with CRLF . CRLF")
        + 2;
    let data = &after_data[..data_ends];
    for (at, pair) in data.windows(2).enumerate() {
        assert!(
            !(pair[1] == b'\n' && pair[0] != b'\r'),
            "a bare LF at {at} of the data: {}",
            shown(data)
        );
        assert!(
            !(pair[0] == b'\r' && pair[1] != b'\n'),
            "a bare CR at {at} of the data: {}",
            shown(data)
        );
    }
    assert!(
        data.first() != Some(&b'\n') && data.last() != Some(&b'\r'),
        "a bare line ending at an end of the data: {}",
        shown(data)
    );
    // Ended once: what follows the end is commands of the client's own, not the message.
    let after_end = &after_data[data_ends + 3..];
    for line in String::from_utf8_lossy(after_end).lines() {
        assert!(
            ["QUIT", "RSET", "NOOP"].contains(&line.to_ascii_uppercase().as_str()),
            "after the end of the data came {line:?}: {}",
            shown(after_end)
        );
    }
    let mut unstuffed = Vec::new();
    for line in data.split_inclusive(|&byte| byte == b'\n') {
        if line.first() == Some(&b'.') {
            assert!(
                line.starts_with(b".."),
                "a line beginning with a dot went out unstuffed: {}",
                shown(line)
            );
            unstuffed.extend_from_slice(&line[1..]);
        } else {
            unstuffed.extend_from_slice(line);
        }
    }
    // The client may end the data with a line end of its own after the message's last one.
    let trim = |bytes: &[u8]| -> Vec<u8> {
        let mut bytes = bytes.to_vec();
        while bytes.ends_with(b"\r\n") {
            bytes.truncate(bytes.len() - 2);
        }
        bytes
    };
    assert_eq!(
        shown(&trim(&unstuffed)),
        shown(&trim(&with_crlf_line_endings(raw))),
        "the message changed on the wire beyond its line endings"
    );
    assert_eq!(
        server.count("MAIL"),
        1,
        "a second message was smuggled: {:?}",
        server.commands()
    );
    assert_eq!(server.data().len(), 1, "{:?}", server.commands());
}

// 3. AUTH only over TLS, unless the builder allows it for a local relay.

/// A server that offers AUTH PLAIN (and no STARTTLS) and accepts any credentials.
async fn server_offering_auth_in_clear() -> RawSmtp {
    RawSmtp::start(greeting(), |command| match command {
        "EHLO" => Answer::Say(b"250-raw.test\r\n250-AUTH PLAIN\r\n250 8BITMIME\r\n".to_vec()),
        // Clients send PLAIN with its initial response, so one answer does.
        "AUTH" => Answer::Say(b"235 2.7.0 Authentication successful\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await
}

#[tokio::test]
async fn credentials_in_an_smtp_url_without_tls_are_a_configuration_error_and_no_auth_is_sent() {
    let server = server_offering_auth_in_clear().await;
    let url = format!("smtp://u:p@127.0.0.1:{}", server.port());
    let smtp = SmtpTransport::from_url(&url)
        .expect("a valid URL")
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    let error = send(&smtp, &message())
        .await
        .expect_err("the credentials went out in clear text");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.auth_in_clear", "{error}");
    assert_eq!(server.count("AUTH"), 0, "{:?}", server.commands());
}

#[tokio::test]
async fn opportunistic_tls_with_a_server_that_offers_no_starttls_sends_no_credentials_in_clear() {
    let server = server_offering_auth_in_clear().await;
    let url = format!("smtp://u:p@127.0.0.1:{}?tls=opportunistic", server.port());
    let smtp = SmtpTransport::from_url(&url)
        .expect("a valid URL")
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    let error = send(&smtp, &message())
        .await
        .expect_err("the credentials went out in clear text");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.auth_in_clear", "{error}");
    assert_eq!(server.count("AUTH"), 0, "{:?}", server.commands());
}

// New API: SmtpBuilder::auth_without_tls.
#[tokio::test]
async fn auth_without_tls_lets_credentials_go_to_a_local_relay_in_clear() {
    let server = server_offering_auth_in_clear().await;
    let smtp = to_server(&server)
        .credentials(Credentials::new("u".to_owned(), "p".to_owned()))
        .auth_without_tls()
        .build()
        .expect("valid settings");

    let receipt = send(&smtp, &message()).await.expect("delivered after AUTH");

    assert_eq!(receipt.message_id(), Some("RAW1"), "{receipt:?}");
    assert_eq!(server.count("AUTH"), 1, "{:?}", server.commands());
}

// 4. Bounded reads: no reply makes the client hold more than a few KiB, or wait for its timeout.

/// A server whose EHLO reply is `reply`.
async fn server_answering_ehlo(reply: Vec<u8>) -> RawSmtp {
    RawSmtp::start(greeting(), move |command| match command {
        "EHLO" => Answer::Say(reply.clone()),
        other => Answer::healthy(other),
    })
    .await
}

/// An EHLO reply of `lines` lines, each of `width` octets before its CRLF.
fn ehlo_reply_of(lines: usize, width: usize) -> Vec<u8> {
    let mut reply = Vec::new();
    for index in 0..lines {
        let separator = if index + 1 == lines { ' ' } else { '-' };
        let mut line = format!("250{separator}X-FILLER-{index:03} ").into_bytes();
        line.resize(width.max(line.len()), b'x');
        reply.extend_from_slice(&line);
        reply.extend_from_slice(b"\r\n");
    }
    reply
}

async fn reply_too_long(server: &RawSmtp) {
    let error = send(&transport_to(server), &message())
        .await
        .expect_err("the overlong reply was taken");
    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), "smtp.reply_too_long", "{error}");
}

#[tokio::test]
async fn an_ehlo_reply_line_that_never_ends_is_a_reply_too_long_error_long_before_the_timeout() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "EHLO" => Answer::SayEndlessly(b"250-raw.test ".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let smtp = to_server(&server)
        .timeout(GENEROUS)
        .build()
        .expect("valid settings");

    let started = Instant::now();
    let error = send(&smtp, &message())
        .await
        .expect_err("a line that never ends was taken");
    let elapsed = started.elapsed();

    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), "smtp.reply_too_long", "{error}");
    assert!(elapsed < WELL_BEFORE, "{elapsed:?} to give up on the line");
}

#[tokio::test]
async fn an_ehlo_reply_of_101_lines_is_a_reply_too_long_error() {
    let server = server_answering_ehlo(ehlo_reply_of(101, 20)).await;
    reply_too_long(&server).await;
}

#[tokio::test]
async fn an_ehlo_reply_of_100_lines_is_read_whole() {
    let server = server_answering_ehlo(ehlo_reply_of(100, 20)).await;
    send(&transport_to(&server), &message())
        .await
        .expect("a reply of 100 lines is within the bounds");
}

#[tokio::test]
async fn an_ehlo_reply_line_of_2049_octets_is_a_reply_too_long_error() {
    let mut reply = b"250-raw.test\r\n".to_vec();
    // 2,049 octets before the CRLF: over the bound whether it counts the CRLF or not.
    reply.extend(ehlo_reply_of(1, 2049));
    let server = server_answering_ehlo(reply).await;
    reply_too_long(&server).await;
}

#[tokio::test]
async fn an_ehlo_reply_of_more_than_64_kib_in_lines_of_700_octets_is_a_reply_too_long_error() {
    // 99 lines of 700 octets: 69,498 octets, each line and the line count within bounds.
    let server = server_answering_ehlo(ehlo_reply_of(99, 700)).await;
    reply_too_long(&server).await;
}

// 5. No panic from a server's input.

#[tokio::test]
async fn ehlo_reply_lines_that_are_blank_or_one_space_end_the_send_without_a_panic() {
    let replies: [&'static [u8]; 5] = [
        b"250-srv\r\n250- \r\n250 OK\r\n",
        b"250-srv\r\n250  \r\n",
        b"250-srv\r\n250-\r\n250 OK\r\n",
        b"250 \r\n",
        b"250  \r\n",
    ];
    let mut panicked = Vec::new();
    for reply in replies {
        let server = server_answering_ehlo(reply.to_vec()).await;
        let smtp = transport_to(&server);
        // On a task of its own, so that a panic is counted here rather than ending the test.
        let outcome = tokio::spawn(async move { send(&smtp, &message()).await }).await;
        match outcome {
            Ok(result) => println!("{}: {:?}", shown(reply), result.map(|_| "delivered")),
            Err(join) if join.is_panic() => panicked.push(shown(reply)),
            Err(join) => panic!("the send's task ended without an answer: {join}"),
        }
    }
    assert!(
        panicked.is_empty(),
        "the client panicked on the EHLO replies {panicked:?}"
    );
}

// 6, 7. Each reply checked against its command.

#[tokio::test]
async fn a_421_answer_to_the_final_dot_is_service_unavailable_and_not_maybe_delivered() {
    let error = error_when_answering(
        ".",
        Answer::SayAndHangUp(b"421 4.3.2 shutting down\r\n".to_vec()),
    )
    .await;

    assert_eq!(error.category(), Category::ServiceUnavailable, "{error}");
    assert_eq!(error.code(), "smtp.421", "{error}");
    assert!(!error.is_maybe_delivered(), "{error}");
}

#[tokio::test]
async fn a_354_answer_to_the_final_dot_is_an_unexpected_reply_that_may_have_delivered() {
    let error = error_when_answering(".", Answer::Say(b"354 go ahead, again\r\n".to_vec())).await;

    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), "smtp.unexpected_reply", "{error}");
    assert!(error.is_maybe_delivered(), "{error}");
}

#[tokio::test]
async fn a_250_answer_to_data_is_an_unexpected_reply_and_no_body_line_reaches_the_server() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "DATA" => Answer::Say(b"250 ok\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;

    let error = send(&transport_to(&server), &message())
        .await
        .expect_err("a 250 to DATA was taken for a 354");

    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), "smtp.unexpected_reply", "{error}");
    assert!(!error.is_maybe_delivered(), "{error}");
    assert_eq!(
        commands_after_data(&server),
        Vec::<String>::new(),
        "the body was read as commands"
    );
}

// 8. A reply code without text is a whole reply (RFC 5321 §4.2).

#[tokio::test]
async fn a_greeting_of_a_bare_220_is_valid_and_the_message_is_delivered() {
    let server = RawSmtp::start(b"220\r\n".to_vec(), Answer::healthy).await;
    send(&transport_to(&server), &message())
        .await
        .expect("delivered");
}

#[tokio::test]
async fn bare_250_answers_to_mail_rcpt_and_the_final_dot_are_valid_and_the_message_is_delivered() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "MAIL" | "RCPT" | "." => Answer::Say(b"250\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let receipt = send(&transport_to(&server), &message())
        .await
        .expect("delivered");
    assert_eq!(receipt.message_id(), None, "{receipt:?}");
}

#[tokio::test]
async fn a_bare_354_answer_to_data_is_valid_and_the_message_is_delivered() {
    let server = RawSmtp::start(greeting(), |command| match command {
        "DATA" => Answer::Say(b"354\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let receipt = send(&transport_to(&server), &message())
        .await
        .expect("delivered");
    assert_eq!(receipt.message_id(), Some("RAW1"), "{receipt:?}");
}

// 9-11. Categories of what real servers answer.

fn blocklisting_greeting() -> Vec<u8> {
    b"554 5.7.1 Service unavailable; client host blocklisted\r\n".to_vec()
}

#[tokio::test]
async fn a_554_greeting_is_service_unavailable() {
    let server = RawSmtp::start(blocklisting_greeting(), Answer::healthy).await;

    let error = send(&transport_to(&server), &message())
        .await
        .expect_err("a 554 greeting is no delivery");

    assert_eq!(error.category(), Category::ServiceUnavailable, "{error}");
    assert_eq!(error.code(), "smtp.554", "{error}");
}

#[tokio::test]
async fn a_pool_delivers_through_the_next_server_when_the_first_greets_with_554() {
    let blocklisting = RawSmtp::start(blocklisting_greeting(), Answer::healthy).await;
    let healthy = RawSmtp::start(greeting(), Answer::healthy).await;
    let pool = PoolTransport::builder()
        .add(transport_to(&blocklisting), 1)
        .add(transport_to(&healthy), 2)
        .build()
        .expect("a pool with members");

    let receipt = send(&pool, &message())
        .await
        .expect("delivered by the second server");

    assert_eq!(
        receipt.transport(),
        format!("smtp://127.0.0.1:{}", healthy.port())
    );
    assert_eq!(healthy.count("MAIL"), 1);
}

#[tokio::test]
async fn gmails_421_4_7_28_answer_to_mail_is_rate_limited() {
    let error = error_when_answering(
        "MAIL",
        Answer::SayAndHangUp(b"421 4.7.28 Try again later.\r\n".to_vec()),
    )
    .await;

    assert_eq!(error.category(), Category::RateLimited, "{error}");
    assert_eq!(error.code(), "smtp.421", "{error}");
}

#[tokio::test]
async fn a_421_4_7_0_rate_limited_answer_to_rcpt_is_rate_limited() {
    let error = error_when_answering(
        "RCPT",
        Answer::SayAndHangUp(b"421 4.7.0 Try again later, rate limited\r\n".to_vec()),
    )
    .await;

    assert_eq!(error.category(), Category::RateLimited, "{error}");
    assert_eq!(error.code(), "smtp.421", "{error}");
}

#[tokio::test]
async fn a_552_5_3_4_message_too_big_answer_to_the_final_dot_is_an_invalid_message() {
    let error =
        error_when_answering(".", Answer::Say(b"552 5.3.4 Message too big\r\n".to_vec())).await;

    assert_eq!(error.category(), Category::InvalidMessage, "{error}");
    assert_eq!(error.code(), "smtp.552", "{error}");
    assert!(!error.is_maybe_delivered(), "{error}");
}

// 12. Temporary refusals of some recipients.

/// The recipients a server accepted, as their `RCPT TO:` lines.
type Accepted = Arc<Mutex<Vec<String>>>;

fn accepted_set(accepted: &Accepted) -> BTreeSet<String> {
    accepted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .cloned()
        .collect()
}

// New API: Receipt::deferred_recipients.
#[tokio::test]
async fn a_452_too_many_recipients_sends_the_rest_in_a_further_transaction_on_the_same_connection()
{
    // Two recipients a transaction, as a server with a low limit takes them.
    let accepted = Accepted::default();
    let (taken, in_transaction) = (Arc::clone(&accepted), AtomicUsize::new(0));
    let server = RawSmtp::start_reading_lines(greeting(), move |command, line| match command {
        "MAIL" => {
            in_transaction.store(0, Ordering::SeqCst);
            Answer::healthy(command)
        }
        "RCPT" if in_transaction.fetch_add(1, Ordering::SeqCst) >= 2 => {
            Answer::Say(b"452 4.5.3 Too many recipients\r\n".to_vec())
        }
        "RCPT" => {
            taken
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line.to_owned());
            Answer::healthy(command)
        }
        other => Answer::healthy(other),
    })
    .await;
    let everyone = [
        "a@example.org",
        "b@example.org",
        "c@example.org",
        "d@example.org",
    ];

    let receipt = send(&transport_to(&server), &message_to_each(&everyone))
        .await
        .expect("delivered");

    assert_eq!(
        accepted_set(&accepted),
        everyone.map(|to| format!("RCPT TO:<{to}>")).into(),
        "{:?}",
        server.commands()
    );
    assert_eq!(server.count("MAIL"), 2, "{:?}", server.commands());
    assert_eq!(server.data().len(), 2, "{:?}", server.commands());
    assert_eq!(server.connections(), 1);
    assert!(receipt.rejected_recipients().is_empty(), "{receipt:?}");
    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
}

/// A server that answers `450 4.2.0 greylisted` to `grey@example.org`, every time or only the
/// first time, and records the recipients it accepted.
async fn greylisting_server(every_time: bool) -> (RawSmtp, Accepted) {
    let accepted = Accepted::default();
    let (taken, refused_once) = (Arc::clone(&accepted), AtomicBool::new(false));
    let server = RawSmtp::start_reading_lines(greeting(), move |command, line| match command {
        "RCPT"
            if line.contains("<grey@example.org>")
                && (every_time || !refused_once.swap(true, Ordering::SeqCst)) =>
        {
            Answer::Say(b"450 4.2.0 <grey@example.org>: greylisted, come back later\r\n".to_vec())
        }
        "RCPT" => {
            taken
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line.to_owned());
            Answer::healthy(command)
        }
        other => Answer::healthy(other),
    })
    .await;
    (server, accepted)
}

// New API: Receipt::deferred_recipients.
#[tokio::test]
async fn a_450_to_one_of_two_recipients_is_a_deferred_recipient_on_the_receipt_not_a_rejected_one()
{
    let (server, accepted) = greylisting_server(true).await;

    let receipt = send(
        &transport_to(&server),
        &message_to_each(&["user@example.org", "grey@example.org"]),
    )
    .await
    .expect("delivered to the other recipient");

    assert!(receipt.rejected_recipients().is_empty(), "{receipt:?}");
    let deferred = receipt.deferred_recipients();
    assert_eq!(deferred.len(), 1, "{receipt:?}");
    assert_eq!(deferred[0].0, address("grey@example.org"));
    assert_eq!(
        deferred[0].1.category(),
        Category::ServerError,
        "{receipt:?}"
    );
    assert_eq!(deferred[0].1.code(), "smtp.450", "{receipt:?}");
    assert_eq!(
        accepted_set(&accepted),
        BTreeSet::from(["RCPT TO:<user@example.org>".to_owned()])
    );
}

#[tokio::test]
async fn a_retry_transport_sends_again_to_the_deferred_recipient_only_with_the_same_message() {
    let (server, accepted) = greylisting_server(false).await;
    let retry = RetryTransport::builder(transport_to(&server))
        .max_attempts(3)
        .backoff(Backoff::constant(Duration::from_millis(10)))
        .build()
        .expect("valid settings");

    let message = Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to("user@example.org".parse().expect("a valid recipient"))
        .to("grey@example.org".parse().expect("a valid recipient"))
        .message_id(Some("<greylisted.1@example.com>".to_owned()))
        .subject("test")
        .body(String::from("hello"))
        .expect("a valid message");
    send(&retry, &message).await.expect("delivered");

    assert_eq!(
        recipients_per_transaction(&server),
        [
            vec![
                "RCPT TO:<user@example.org>".to_owned(),
                "RCPT TO:<grey@example.org>".to_owned()
            ],
            vec!["RCPT TO:<grey@example.org>".to_owned()],
        ],
        "{:?}",
        server.commands()
    );
    assert_eq!(accepted_set(&accepted).len(), 2);
    let data = server.data();
    assert_eq!(data.len(), 2, "{:?}", server.commands());
    let first_id = header(&data[0], "Message-ID").expect("the message has a Message-ID");
    assert_eq!(header(&data[1], "Message-ID"), Some(first_id));
    assert_eq!(shown(&data[0]), shown(&data[1]), "the bytes differ");
}

// 13. verify within the pool.

#[tokio::test]
async fn verify_uses_a_pooled_connection_and_stays_within_max_connections() {
    let server = RawSmtp::start(greeting(), Answer::healthy).await;
    let smtp = to_server(&server)
        .max_connections(1)
        .build()
        .expect("valid settings");

    for _ in 0..3 {
        tokio::time::timeout(HANG, smtp.verify())
            .await
            .expect("verify hung past its own timeout")
            .expect("reachable");
    }
    send(&smtp, &message()).await.expect("delivered");

    assert_eq!(server.connections(), 1, "connections opened");
}

// 14. A fresh connection is bounded by the connect timeout, address by address.

// New API: SmtpBuilder::connect_timeout.
#[tokio::test]
async fn a_server_that_never_greets_fails_the_send_within_the_connect_timeout_not_the_send_timeout()
{
    let server = RawSmtp::start(Vec::new(), Answer::healthy).await;
    let smtp = to_server(&server)
        .connect_timeout(Duration::from_millis(200))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("valid settings");

    let started = Instant::now();
    let error = send(&smtp, &message())
        .await
        .expect_err("a server that never greets delivered");
    let elapsed = started.elapsed();

    assert!(
        matches!(error.category(), Category::Timeout | Category::Network),
        "{error}"
    );
    assert!(
        elapsed < WELL_BEFORE,
        "{elapsed:?} to give up on the greeting"
    );
}

// New API: SmtpBuilder::connect_timeout.
#[tokio::test]
async fn each_resolved_address_is_tried_in_turn_so_one_that_never_greets_does_not_end_the_send() {
    let test =
        "each_resolved_address_is_tried_in_turn_so_one_that_never_greets_does_not_end_the_send";
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(("localhost", 25))
        .await
        .map(Iterator::collect)
        .unwrap_or_default();
    let ipv6_first = resolved.first().is_some_and(SocketAddr::is_ipv6);
    let ipv4_later = resolved.iter().skip(1).any(SocketAddr::is_ipv4);
    if !(ipv6_first && ipv4_later) {
        report_skip(&format!(
            "SKIPPED {test}: `localhost` resolves to {resolved:?} here; the test needs ::1 \
             first and 127.0.0.1 after it (/etc/hosts)"
        ));
        return;
    }
    // A healthy server on 127.0.0.1:P, and on [::1]:P one that accepts and never greets.
    let mut attempts = 0;
    let (healthy, silent) = loop {
        let healthy = RawSmtp::start(greeting(), Answer::healthy).await;
        match tokio::net::TcpListener::bind(("::1", healthy.port())).await {
            Ok(silent) => break (healthy, silent),
            Err(error) => {
                attempts += 1;
                assert!(
                    attempts < 20,
                    "no port free on both ::1 and 127.0.0.1: {error}"
                );
            }
        }
    };
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let smtp = SmtpTransport::builder_dangerous("localhost")
        .port(healthy.port())
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(5))
        .build()
        .expect("valid settings");

    let receipt = send(&smtp, &message())
        .await
        .expect("delivered through the second address");

    held.abort();
    assert_eq!(receipt.message_id(), Some("RAW1"), "{receipt:?}");
}
