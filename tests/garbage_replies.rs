//! A server that answers garbage: each case yields a categorised `SendError` through
//! `SmtpTransport` within its timeout, never a panic or a hang.
//!
//! No real server sends these, so a raw TCP listener in the test writes them
//! (`support::raw_smtp`). Each send is bounded by `with_timeout(TIMEOUT)`, and the test by
//! a wider `tokio::time::timeout`, so a hang fails the test instead of stalling it.

mod support;

use std::time::{Duration, Instant};

use mail_breaker::{Category, SendError, SmtpTransport, Transport};
use support::message;
use support::raw_smtp::{Answer, RawSmtp};

const TIMEOUT: Duration = Duration::from_millis(500);

/// Sends one message to `server` and returns its error, failing on a delivery or a hang.
async fn send_to(server: &RawSmtp) -> SendError {
    let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port()).with_timeout(TIMEOUT);
    let started = Instant::now();
    let result = tokio::time::timeout(TIMEOUT * 10, smtp.send(&message()))
        .await
        .expect("the send hung past its own timeout");
    let error = result.expect_err("garbage was taken for a delivery");
    println!("{:?} later: {error}", started.elapsed());
    error
}

fn healthy_greeting() -> Vec<u8> {
    b"220 raw.test ESMTP\r\n".to_vec()
}

#[tokio::test]
async fn a_non_smtp_banner_is_a_network_error() {
    let server = RawSmtp::start(
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".to_vec(),
        Answer::healthy,
    )
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_binary_banner_that_is_not_utf8_is_a_network_error() {
    let server = RawSmtp::start(vec![0xff, 0xfe, 0x00, 0x9c, b'\r', b'\n'], Answer::healthy).await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_999_reply_code_is_a_network_error() {
    let server = RawSmtp::start(healthy_greeting(), |command| match command {
        "MAIL" => Answer::Say(b"999 9.9.9 what is this\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_999_banner_is_a_network_error() {
    let server = RawSmtp::start(b"999 hello\r\n".to_vec(), Answer::healthy).await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_reply_line_of_one_mebibyte_is_a_network_error() {
    let mut line = b"250 ".to_vec();
    line.resize(1024 * 1024, b'x');
    line.extend_from_slice(b"\r\n");
    let server = RawSmtp::start(healthy_greeting(), move |command| match command {
        "EHLO" => Answer::Say(line.clone()),
        other => Answer::healthy(other),
    })
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_one_mebibyte_line_without_an_end_is_answered_within_the_timeout() {
    let mut line = b"220 ".to_vec();
    line.resize(1024 * 1024, b'x');
    let server = RawSmtp::start(line, Answer::healthy).await;
    let error = send_to(&server).await;
    assert!(
        matches!(error.category(), Category::Network | Category::Timeout),
        "{error}"
    );
}

#[tokio::test]
async fn a_server_that_sends_nothing_is_a_timeout() {
    let server = RawSmtp::start(Vec::new(), Answer::healthy).await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Timeout, "{error}");
    assert_eq!(error.code(), "smtp.timeout");
}

#[tokio::test]
async fn a_server_that_goes_silent_after_data_is_a_timeout() {
    let server = RawSmtp::start(healthy_greeting(), |command| match command {
        "." => Answer::Silence,
        other => Answer::healthy(other),
    })
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Timeout, "{error}");
}

#[tokio::test]
async fn a_server_that_hangs_up_after_the_final_dot_is_a_network_error() {
    let server = RawSmtp::start(healthy_greeting(), |command| match command {
        "." => Answer::HangUp,
        other => Answer::healthy(other),
    })
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn replies_whose_codes_disagree_across_lines_are_a_network_error() {
    let server = RawSmtp::start(healthy_greeting(), |command| match command {
        "RCPT" => Answer::Say(b"250-first\r\n550 second\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_421_banner_is_service_unavailable() {
    let server = RawSmtp::start(b"421 4.3.2 shutting down\r\n".to_vec(), Answer::healthy).await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::ServiceUnavailable, "{error}");
    assert_eq!(error.code(), "smtp.421");
}

#[tokio::test]
async fn postfixs_421_too_many_errors_is_service_unavailable_not_a_rate_limit() {
    // The session's own errors, not a rate: Postfix says this when a client passed
    // smtpd_hard_error_limit.
    let server = RawSmtp::start(
        b"421 4.7.0 pfx.test Error: too many errors\r\n".to_vec(),
        Answer::healthy,
    )
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::ServiceUnavailable, "{error}");
    assert_eq!(error.code(), "smtp.421");
}

#[tokio::test]
async fn a_421_that_speaks_of_a_connection_rate_is_rate_limited() {
    // What Postfix's anvil limits say at the greeting.
    let server = RawSmtp::start(
        b"421 4.7.0 pfx.test Error: too many connections from 127.0.0.1\r\n".to_vec(),
        Answer::healthy,
    )
    .await;
    let error = send_to(&server).await;
    assert_eq!(error.category(), Category::RateLimited, "{error}");
}

#[test]
fn a_421_is_a_rate_limit_only_when_the_reply_says_it_is_one() {
    let category = |text: &str| mail_breaker::classify_smtp_reply(421, text).category();
    for rate in [
        "421 4.7.28 Our system has detected an unusual rate of mail",
        "421 4.7.0 Error: too many connections from 192.0.2.1",
        "421 4.7.0 Too many messages, slow down",
        "421 4.7.0 Connection rate limit exceeded",
        "421 4.7.0 Try again later, throttled",
    ] {
        assert_eq!(category(rate), Category::RateLimited, "{rate}");
    }
    for not_rate in [
        "421 4.7.0 pfx.test Error: too many errors",
        "421 4.7.0 Error: too many bad commands",
        "421 4.7.1 Unable to generate a response, closing",
        "421 4.3.2 System not accepting network messages",
    ] {
        assert_eq!(
            category(not_rate),
            Category::ServiceUnavailable,
            "{not_rate}"
        );
    }
}
