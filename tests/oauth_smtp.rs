//! SMTP with OAuth 2.0 (DESIGN §16) against a real aiosmtpd whose authenticator checks the
//! mailbox and the token (`support::aiosmtpd_oauth`): XOAUTH2 and OAUTHBEARER with a good
//! token deliver; a refused (expired) token is fetched again once and the login goes on; a
//! token refused twice is `Authentication`; a token is kept for the next connection; the
//! token is never in an error.
//!
//! Without python3, aiosmtpd or openssl each test prints `SKIPPED` and passes; under
//! `CI=true` it fails. `cargo test --test oauth_smtp`.
#![cfg(feature = "smtp")]

mod support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lettre::transport::smtp::client::Tls;
use mail_breaker::oauth::{AccessToken, OAuthMechanism, TokenSource};
use mail_breaker::{Category, SendError, SmtpTransport, Transport};
use support::aiosmtpd_oauth::{GOOD_TOKEN, OAuthSmtpd, Offered, USER};
use support::message;
use support::raw_smtp::{Answer, RawSmtp};

/// TLS handshakes on loopback take milliseconds; this only stops a hang.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Gives its tokens in order, the last one for ever after; counts how often it was asked.
struct Scripted {
    tokens: Mutex<Vec<&'static str>>,
    asked: AtomicUsize,
}

impl Scripted {
    fn new(tokens: &[&'static str]) -> std::sync::Arc<Scripted> {
        let mut tokens = tokens.to_vec();
        tokens.reverse();
        std::sync::Arc::new(Scripted {
            tokens: Mutex::new(tokens),
            asked: AtomicUsize::new(0),
        })
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TokenSource for Scripted {
    async fn token(&self) -> Result<AccessToken, SendError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let mut tokens = self.tokens.lock().unwrap();
        let token = if tokens.len() > 1 {
            tokens.pop().unwrap()
        } else {
            tokens[0]
        };
        Ok(AccessToken::new(token).expires_in(Duration::from_secs(3600)))
    }
}

fn transport(
    server: &OAuthSmtpd,
    source: std::sync::Arc<Scripted>,
    mechanism: Option<OAuthMechanism>,
) -> SmtpTransport {
    let mut builder = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .tls(Tls::Required(server.tls_parameters()))
        .timeout(TIMEOUT)
        .oauth2(USER, source);
    if let Some(mechanism) = mechanism {
        builder = builder.oauth2_mechanism(mechanism);
    }
    builder.build().expect("valid settings")
}

async fn good_token_delivers(test: &str, offered: Offered, expected: &str) {
    let Some(server) = OAuthSmtpd::start(test, offered) else {
        return;
    };
    let source = Scripted::new(&[GOOD_TOKEN]);
    let smtp = transport(&server, source.clone(), None);

    let receipt = smtp
        .send(&message())
        .await
        .unwrap_or_else(|error| panic!("{error:?}; server log: {}", server.log()));

    assert_eq!(receipt.message_id(), Some("OAUTH1"));
    assert_eq!(
        server.tokens_seen(),
        vec![format!("{expected} {GOOD_TOKEN}")],
        "{}",
        server.log()
    );
    assert_eq!(source.asked(), 1);
}

#[tokio::test]
async fn an_xoauth2_login_with_a_good_token_delivers() {
    let test = "an_xoauth2_login_with_a_good_token_delivers";
    good_token_delivers(test, Offered::XOAuth2, "XOAUTH2").await;
}

#[tokio::test]
async fn an_oauthbearer_login_with_a_good_token_delivers() {
    let test = "an_oauthbearer_login_with_a_good_token_delivers";
    good_token_delivers(test, Offered::OAuthBearer, "OAUTHBEARER").await;
}

#[tokio::test]
async fn the_mechanism_chosen_by_the_builder_is_the_one_spoken() {
    let test = "the_mechanism_chosen_by_the_builder_is_the_one_spoken";
    for (mechanism, name) in [
        (OAuthMechanism::OAuthBearer, "OAUTHBEARER"),
        (OAuthMechanism::XOAuth2, "XOAUTH2"),
    ] {
        let Some(server) = OAuthSmtpd::start(test, Offered::Both) else {
            return;
        };
        let source = Scripted::new(&[GOOD_TOKEN]);
        let smtp = transport(&server, source, Some(mechanism));
        smtp.send(&message())
            .await
            .unwrap_or_else(|error| panic!("{name}: {error:?}; server log: {}", server.log()));
        assert_eq!(server.tokens_seen(), vec![format!("{name} {GOOD_TOKEN}")]);
    }
}

/// XOAUTH2 is refused with `535` at once, OAUTHBEARER with a `334` error challenge first.
async fn an_expired_token_is_fetched_again_once(test: &str, offered: Offered, name: &str) {
    let Some(server) = OAuthSmtpd::start(test, offered) else {
        return;
    };
    let source = Scripted::new(&["ya29.expired", GOOD_TOKEN]);
    let smtp = transport(&server, source.clone(), None);

    let receipt = smtp
        .send(&message())
        .await
        .unwrap_or_else(|error| panic!("{error:?}; server log: {}", server.log()));

    assert_eq!(receipt.message_id(), Some("OAUTH1"));
    assert_eq!(source.asked(), 2);
    assert_eq!(
        server.tokens_seen(),
        vec![
            format!("{name} ya29.expired"),
            format!("{name} {GOOD_TOKEN}")
        ],
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn an_expired_xoauth2_token_refused_with_535_is_fetched_again_once_and_then_delivers() {
    let test = "an_expired_xoauth2_token_refused_with_535_is_fetched_again_once_and_then_delivers";
    an_expired_token_is_fetched_again_once(test, Offered::XOAuth2, "XOAUTH2").await;
}

#[tokio::test]
async fn an_expired_oauthbearer_token_refused_with_334_is_fetched_again_once_and_then_delivers() {
    let test =
        "an_expired_oauthbearer_token_refused_with_334_is_fetched_again_once_and_then_delivers";
    an_expired_token_is_fetched_again_once(test, Offered::OAuthBearer, "OAUTHBEARER").await;
}

async fn a_refused_token_is_authentication(test: &str, offered: Offered) {
    let Some(server) = OAuthSmtpd::start(test, offered) else {
        return;
    };
    let source = Scripted::new(&["ya29.revoked"]);
    let smtp = transport(&server, source.clone(), None);

    let error = smtp.send(&message()).await.expect_err("a refused token");

    assert_eq!(error.category(), Category::Authentication, "{error}");
    assert_eq!(
        source.asked(),
        2,
        "fetched once more after the refusal, no more"
    );
    assert_eq!(server.tokens_seen().len(), 2, "{}", server.log());
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains("revoked"), "{shown}");
}

#[tokio::test]
async fn a_refused_xoauth2_token_is_an_authentication_error_after_one_fetch_more() {
    let test = "a_refused_xoauth2_token_is_an_authentication_error_after_one_fetch_more";
    a_refused_token_is_authentication(test, Offered::XOAuth2).await;
}

#[tokio::test]
async fn a_refused_oauthbearer_token_is_an_authentication_error_after_one_fetch_more() {
    let test = "a_refused_oauthbearer_token_is_an_authentication_error_after_one_fetch_more";
    a_refused_token_is_authentication(test, Offered::OAuthBearer).await;
}

#[tokio::test]
async fn a_token_is_kept_for_the_next_connection() {
    let test = "a_token_is_kept_for_the_next_connection";
    let Some(server) = OAuthSmtpd::start(test, Offered::XOAuth2) else {
        return;
    };
    let source = Scripted::new(&[GOOD_TOKEN]);
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .tls(Tls::Required(server.tls_parameters()))
        .timeout(TIMEOUT)
        .max_messages_per_connection(1)
        .oauth2(USER, source.clone())
        .build()
        .expect("valid settings");

    for _ in 0..3 {
        smtp.send(&message())
            .await
            .unwrap_or_else(|error| panic!("{error:?}; server log: {}", server.log()));
    }

    assert_eq!(server.tokens_seen().len(), 3, "three connections logged in");
    assert_eq!(source.asked(), 1, "with one token");
}

/// A scripted server without TLS whose EHLO offers `auth` (e.g. `AUTH PLAIN LOGIN`).
async fn offering(auth: &'static str) -> RawSmtp {
    RawSmtp::start(
        b"220 raw.test ESMTP\r\n".to_vec(),
        move |command| match command {
            "EHLO" => Answer::Say(format!("250-raw.test\r\n250 {auth}\r\n").into_bytes()),
            "AUTH" => Answer::Say(b"235 2.7.0 ok\r\n".to_vec()),
            other => Answer::healthy(other),
        },
    )
    .await
}

fn in_clear(
    server: &RawSmtp,
    source: std::sync::Arc<Scripted>,
    mechanism: Option<OAuthMechanism>,
) -> mail_breaker::SmtpBuilder {
    let builder = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
        .oauth2(USER, source);
    match mechanism {
        Some(mechanism) => builder.oauth2_mechanism(mechanism),
        None => builder,
    }
}

#[tokio::test]
async fn an_oauth2_login_over_a_connection_without_tls_is_refused_before_a_token_is_fetched() {
    let server = offering("AUTH XOAUTH2 OAUTHBEARER").await;
    let source = Scripted::new(&[GOOD_TOKEN]);
    let smtp = in_clear(&server, source.clone(), None)
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("no TLS");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.auth_in_clear");
    assert_eq!(source.asked(), 0);
    assert_eq!(server.count("AUTH"), 0, "{:?}", server.commands());
}

#[tokio::test]
async fn a_mechanism_chosen_by_the_builder_that_the_server_does_not_offer_is_a_configuration_error()
{
    for (offered, chosen) in [
        ("AUTH OAUTHBEARER", OAuthMechanism::XOAuth2),
        ("AUTH XOAUTH2", OAuthMechanism::OAuthBearer),
    ] {
        let server = offering(offered).await;
        let source = Scripted::new(&[GOOD_TOKEN]);
        let smtp = in_clear(&server, source.clone(), Some(chosen))
            .auth_without_tls()
            .build()
            .expect("valid settings");

        let error = smtp.send(&message()).await.expect_err(offered);

        assert_eq!(
            error.category(),
            Category::Configuration,
            "{offered}: {error}"
        );
        assert_eq!(error.code(), "smtp.auth_unsupported", "{offered}");
        assert_eq!(
            server.count("AUTH"),
            0,
            "{offered}: {:?}",
            server.commands()
        );
    }
}

#[tokio::test]
async fn a_server_that_offers_no_oauth2_mechanism_is_a_configuration_error() {
    let server = offering("AUTH PLAIN LOGIN").await;
    let source = Scripted::new(&[GOOD_TOKEN]);
    let smtp = in_clear(&server, source.clone(), None)
        .auth_without_tls()
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("no OAuth mechanism");

    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "smtp.auth_unsupported");
    assert_eq!(server.count("AUTH"), 0, "{:?}", server.commands());
}
