//! An `smtp://` member's URL read into the transport it describes, against a real aiosmtpd
//! that offers no STARTTLS and takes AUTH in clear text (`support::aiosmtpd`, `Mode::Clear`):
//! credentials without a `tls` option mean STARTTLS required, so nothing of them is sent;
//! `tls=none&auth_without_tls=true` says clear text in words and authenticates; a URL with
//! neither credentials nor `tls` is clear text (against Postfix's smtp-sink).
//!
//! Without python3, aiosmtpd or openssl each test prints `SKIPPED` and passes; under
//! `CI=true` it fails. `cargo test --test config_smtp_url`.
#![cfg(all(feature = "config", feature = "smtp"))]

mod support;

use std::time::Duration;

use mail_breaker::config::Mailer;
use mail_breaker::{Category, Transport};
use support::aiosmtpd::{Aiosmtpd, Mechanisms, Mode, PASSWORD, USER};
use support::message;
use support::smtp_sink::SmtpSink;

/// `smtp://USER:PASSWORD@127.0.0.1:<port>` (the password percent-encoded: it has a space),
/// with `query` after it, and a short timeout.
fn dsn(server: &Aiosmtpd, query: &str) -> String {
    let password = PASSWORD.replace(' ', "%20");
    let port = server.port();
    let separator = if query.is_empty() { "" } else { "&" };
    format!("smtp://{USER}:{password}@127.0.0.1:{port}?{query}{separator}timeout=5s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_without_a_tls_option_mean_starttls_required_and_nothing_is_sent_in_clear() {
    let test =
        "credentials_without_a_tls_option_mean_starttls_required_and_nothing_is_sent_in_clear";
    let Some(server) = Aiosmtpd::start(test, Mode::Clear, Mechanisms::PlainAndLogin) else {
        return;
    };
    let mailer = Mailer::from_dsn(&dsn(&server, ""))
        .unwrap()
        .build()
        .await
        .unwrap();

    let error = mailer
        .send(&message())
        .await
        .expect_err("no STARTTLS offered");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.starttls_unavailable", "{error}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.auth_commands(),
        Vec::<String>::new(),
        "{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_none_with_auth_without_tls_authenticates_in_clear_text_and_delivers() {
    let test = "tls_none_with_auth_without_tls_authenticates_in_clear_text_and_delivers";
    let Some(server) = Aiosmtpd::start(test, Mode::Clear, Mechanisms::PlainAndLogin) else {
        return;
    };
    let config = Mailer::from_dsn(&dsn(&server, "tls=none&auth_without_tls=true")).unwrap();
    let mailer = config.build().await.unwrap();

    let receipt = mailer
        .send(&message())
        .await
        .unwrap_or_else(|error| panic!("{error:?}; server log: {}", server.log()));

    assert_eq!(receipt.message_id(), Some("AIO1"));
    assert_eq!(server.auth_commands().len(), 1, "{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_credentials_or_a_tls_option_sends_in_clear_text() {
    // Postfix's smtp-sink offers no STARTTLS: a member that required it would send nothing.
    let test = "a_url_without_credentials_or_a_tls_option_sends_in_clear_text";
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let dsn = format!("smtp://127.0.0.1:{}?timeout=5s", sink.port());
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();

    mailer
        .send(&message())
        .await
        .unwrap_or_else(|error| panic!("{error:?}"));

    assert_eq!(sink.received(), 1);
}
