//! AUTH on the crate's own SMTP client (DESIGN §10: "AUTH only over TLS"), against a real
//! aiosmtpd (`support::aiosmtpd`): AUTH after STARTTLS delivers; credentials on a connection
//! without TLS are a `Configuration` error (`smtp.auth_in_clear`) and the server sees no AUTH
//! at all, even one that would take it; `.auth_without_tls()` authenticates in clear where
//! the caller says so (a local relay).
//!
//! Without python3, aiosmtpd or openssl each test prints `SKIPPED` and passes; under
//! `CI=true` it fails. `cargo test --test smtp_auth`.
#![cfg(feature = "smtp")]

mod support;

use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::Tls;
use mail_breaker::{Category, SmtpTransport, Transport};
use support::aiosmtpd::{Aiosmtpd, Mechanisms, Mode, PASSWORD, USER};
use support::message;

/// TLS handshakes on loopback take milliseconds; this only stops a hang.
const TIMEOUT: Duration = Duration::from_secs(5);

/// `smtp://USER:PASSWORD@127.0.0.1:<port>`, the password percent-encoded (it has a space),
/// with `query` (`?tls=required`, or nothing) after it.
fn url_with_credentials(port: u16, query: &str) -> String {
    format!(
        "smtp://{USER}:{}@127.0.0.1:{port}{query}",
        PASSWORD.replace(' ', "%20")
    )
}

#[tokio::test]
async fn auth_after_starttls_delivers() {
    let test = "auth_after_starttls_delivers";
    let Some(server) = Aiosmtpd::start(test, Mode::StartTls, Mechanisms::PlainAndLogin) else {
        return;
    };
    let smtp = SmtpTransport::from_url(&url_with_credentials(server.port(), "?tls=required"))
        .expect("a valid URL")
        .tls(Tls::Required(server.tls_parameters()))
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    for _ in 0..2 {
        let receipt = smtp.send(&message()).await.unwrap_or_else(|error| {
            panic!("{error:?}; server log: {}", server.log());
        });
        assert_eq!(receipt.message_id(), Some("AIO1"));
    }
    // One connection, authenticated once, after STARTTLS (the server refuses AUTH before it).
    assert_eq!(server.auth_commands().len(), 1, "{}", server.log());
}

#[tokio::test]
async fn credentials_without_tls_are_a_configuration_error_and_no_auth_is_sent() {
    let test = "credentials_without_tls_are_a_configuration_error_and_no_auth_is_sent";
    // A server that would take AUTH in clear: only the client stands between the password
    // and the wire.
    let Some(server) = Aiosmtpd::start(test, Mode::Clear, Mechanisms::PlainAndLogin) else {
        return;
    };
    let smtp = SmtpTransport::from_url(&url_with_credentials(server.port(), ""))
        .expect("a valid URL")
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("AUTH in clear");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.auth_in_clear", "{error}");
    assert!(!error.is_retryable());
    assert!(!error.to_string().contains(PASSWORD), "{error}");
    // Let any AUTH the client might have sent reach the server's log before looking.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.auth_commands(),
        Vec::<String>::new(),
        "the server saw AUTH: {}",
        server.log()
    );
    let verified = smtp.verify().await.expect_err("verify says the same");
    assert_eq!(verified.code(), "smtp.auth_in_clear", "{verified}");
    assert!(server.auth_commands().is_empty(), "{}", server.log());
}

#[tokio::test]
async fn auth_without_tls_authenticates_in_clear_where_the_caller_says_so() {
    let test = "auth_without_tls_authenticates_in_clear_where_the_caller_says_so";
    let Some(server) = Aiosmtpd::start(test, Mode::Clear, Mechanisms::PlainAndLogin) else {
        return;
    };
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .credentials(Credentials::new(USER.to_owned(), PASSWORD.to_owned()))
        .auth_without_tls()
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    let receipt = smtp.send(&message()).await.unwrap_or_else(|error| {
        panic!("{error:?}; server log: {}", server.log());
    });

    assert_eq!(receipt.message_id(), Some("AIO1"));
    assert_eq!(server.auth_commands().len(), 1, "{}", server.log());
}

#[tokio::test]
async fn auth_without_tls_with_wrong_credentials_is_an_authentication_error() {
    let test = "auth_without_tls_with_wrong_credentials_is_an_authentication_error";
    let Some(server) = Aiosmtpd::start(test, Mode::Clear, Mechanisms::LoginOnly) else {
        return;
    };
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .credentials(Credentials::new(USER.to_owned(), "wrong".to_owned()))
        .auth_without_tls()
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("refused");

    assert_eq!(error.category(), Category::Authentication, "{error}");
    assert_eq!(error.code(), "smtp.535", "{error}");
    assert_eq!(server.auth_commands(), ["AUTH LOGIN"], "{}", server.log());
}
