//! TLS and AUTH on the SMTP transport's own connections (issue 10), against a real server:
//! Python's aiosmtpd with STARTTLS or implicit TLS and AUTH PLAIN/LOGIN, on a free loopback
//! port, with a certificate each test makes and the transport trusts. Without python3,
//! aiosmtpd or openssl each test prints `SKIPPED` and passes; under `CI=true` it fails.
#![cfg(feature = "smtp")]

mod support;

use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use mail_breaker::{Category, SmtpBuilder, SmtpTransport, Transport};
use support::aiosmtpd::{Aiosmtpd, Mechanisms, Mode, PASSWORD, USER};
use support::message;
use support::smtp_sink::SmtpSink;

/// TLS handshakes on loopback take milliseconds; this only stops a hang.
const TIMEOUT: Duration = Duration::from_millis(900);

fn to(server: &Aiosmtpd, tls: Tls) -> SmtpBuilder {
    SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .tls(tls)
        .timeout(TIMEOUT)
}

fn right_credentials() -> Credentials {
    Credentials::new(USER.to_owned(), PASSWORD.to_owned())
}

#[tokio::test]
async fn starttls_and_auth_plain_deliver_over_a_certificate_the_transport_trusts() {
    let test = "starttls_and_auth_plain_deliver_over_a_certificate_the_transport_trusts";
    let Some(server) = Aiosmtpd::start(test, Mode::StartTls, Mechanisms::PlainAndLogin) else {
        return;
    };
    let smtp = to(&server, Tls::Required(server.tls_parameters()))
        .credentials(right_credentials())
        .build()
        .expect("valid settings");

    for _ in 0..3 {
        let receipt = smtp.send(&message()).await.unwrap_or_else(|error| {
            panic!("{error}; server log: {}", server.log());
        });
        assert_eq!(receipt.message_id(), Some("AIO1"));
    }
    smtp.verify().await.expect("reachable");
}

#[tokio::test]
async fn starttls_and_auth_login_deliver_when_the_server_offers_only_login() {
    let test = "starttls_and_auth_login_deliver_when_the_server_offers_only_login";
    let Some(server) = Aiosmtpd::start(test, Mode::StartTls, Mechanisms::LoginOnly) else {
        return;
    };
    let smtp = to(&server, Tls::Required(server.tls_parameters()))
        .credentials(right_credentials())
        .build()
        .expect("valid settings");

    let receipt = smtp.send(&message()).await.unwrap_or_else(|error| {
        panic!("{error}; server log: {}", server.log());
    });

    assert_eq!(receipt.message_id(), Some("AIO1"));
}

#[tokio::test]
async fn implicit_tls_and_auth_deliver() {
    let test = "implicit_tls_and_auth_deliver";
    let Some(server) = Aiosmtpd::start(test, Mode::Implicit, Mechanisms::PlainAndLogin) else {
        return;
    };
    let smtp = to(&server, Tls::Wrapper(server.tls_parameters()))
        .credentials(right_credentials())
        .build()
        .expect("valid settings");

    for _ in 0..3 {
        let receipt = smtp.send(&message()).await.unwrap_or_else(|error| {
            panic!("{error}; server log: {}", server.log());
        });
        assert_eq!(receipt.message_id(), Some("AIO1"));
    }
}

#[tokio::test]
async fn wrong_credentials_are_an_authentication_error() {
    let test = "wrong_credentials_are_an_authentication_error";
    let Some(server) = Aiosmtpd::start(test, Mode::StartTls, Mechanisms::PlainAndLogin) else {
        return;
    };
    let smtp = to(&server, Tls::Required(server.tls_parameters()))
        .credentials(Credentials::new(USER.to_owned(), "wrong".to_owned()))
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("refused");

    assert_eq!(error.category(), Category::Authentication, "{error}");
    assert_eq!(error.code(), "smtp.535");
    assert!(!error.to_string().contains("wrong"), "{error}");
}

#[tokio::test]
async fn a_certificate_the_transport_does_not_trust_is_a_network_error() {
    let test = "a_certificate_the_transport_does_not_trust_is_a_network_error";
    let Some(server) = Aiosmtpd::start(test, Mode::StartTls, Mechanisms::PlainAndLogin) else {
        return;
    };
    let system_roots = TlsParameters::new("localhost".to_owned()).expect("valid TLS parameters");
    let smtp = to(&server, Tls::Required(system_roots))
        .credentials(right_credentials())
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("untrusted");

    assert_eq!(error.category(), Category::Network, "{error}");
}

#[tokio::test]
async fn a_server_without_starttls_when_tls_is_required_is_a_configuration_error() {
    let test = "a_server_without_starttls_when_tls_is_required_is_a_configuration_error";
    let Some(sink) = SmtpSink::start(test, &[]) else {
        return;
    };
    let tls = TlsParameters::new("localhost".to_owned()).expect("valid TLS parameters");
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(sink.port())
        .tls(Tls::Required(tls))
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("no STARTTLS");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.starttls_unavailable");
}
