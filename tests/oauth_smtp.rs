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

// ---- where OAuth meets SMTP (issue 62, point 8; DESIGN §19) ----

/// A source that waits `delay`, then gives `token`, or fails when `token` is `None`;
/// counts how often it was asked.
struct Slow {
    delay: Duration,
    token: Option<&'static str>,
    asked: AtomicUsize,
}

impl Slow {
    fn new(delay: Duration, token: Option<&'static str>) -> std::sync::Arc<Slow> {
        std::sync::Arc::new(Slow {
            delay,
            token,
            asked: AtomicUsize::new(0),
        })
    }
}

#[async_trait::async_trait]
impl TokenSource for Slow {
    async fn token(&self) -> Result<AccessToken, SendError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        match self.token {
            Some(token) => Ok(AccessToken::new(token).expires_in(Duration::from_secs(3600))),
            None => Err(SendError::new(
                Category::ServiceUnavailable,
                "oauth2.503",
                "the token endpoint is down",
            )),
        }
    }
}

#[tokio::test]
async fn a_token_fetch_has_its_own_bound_outside_the_connect_timeout() {
    let server = offering("AUTH XOAUTH2").await;
    let source = Slow::new(Duration::from_millis(400), Some(GOOD_TOKEN));
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
        .connect_timeout(Duration::from_millis(150))
        .auth_without_tls()
        .oauth2(USER, source.clone())
        .build()
        .expect("valid settings");

    let receipt = smtp.send(&message()).await;

    assert!(
        receipt.is_ok(),
        "a slow token is not the server's timeout: {receipt:?}"
    );
    assert_eq!(server.count("AUTH"), 1);
}

#[tokio::test]
async fn a_token_source_that_outlasts_the_send_timeout_is_blamed_not_the_mail_server() {
    let server = offering("AUTH XOAUTH2").await;
    let source = Slow::new(Duration::from_secs(3_600), Some(GOOD_TOKEN));
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(Duration::from_millis(300))
        .auth_without_tls()
        .oauth2(USER, source.clone())
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("no token came");

    assert_eq!(error.code(), "oauth2.timeout", "{error:?}");
    assert!(
        error.is_not_attempted(),
        "nothing of the message went: {error:?}"
    );
    assert_eq!(server.count("AUTH"), 0);
}

#[tokio::test]
async fn a_send_that_waits_behind_another_sends_token_fetch_blames_the_token_source_not_the_mail_server()
 {
    let server = offering("AUTH XOAUTH2").await;
    let source = Slow::new(Duration::from_secs(3_600), Some(GOOD_TOKEN));
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(Duration::from_millis(300))
        .auth_without_tls()
        .oauth2(USER, source.clone())
        .build()
        .expect("valid settings");
    // The first send gives up; its fetch goes on in its own task, holding the login.
    let first = smtp.send(&message()).await.expect_err("no token came");
    assert_eq!(first.code(), "oauth2.timeout", "{first:?}");

    // The next send waits for that same fetch: its cut is the token source's too.
    let second = smtp.send(&message()).await.expect_err("no token came");

    assert_eq!(second.code(), "oauth2.timeout", "{second:?}");
    assert!(
        second.is_not_attempted(),
        "nothing of the message went: {second:?}"
    );
    assert_eq!(source.asked.load(Ordering::SeqCst), 1, "one fetch for both");
    assert_eq!(server.count("AUTH"), 0);
}

#[tokio::test]
async fn a_failed_token_fetch_is_remembered_so_a_thousand_sends_ask_the_endpoint_once() {
    let server = offering("AUTH XOAUTH2").await;
    let source = Slow::new(Duration::from_millis(20), None);
    let smtp = SmtpTransport::builder_dangerous("localhost")
        .port(server.port())
        .timeout(TIMEOUT)
        .auth_without_tls()
        .oauth2(USER, source.clone())
        .build()
        .expect("valid settings");

    let sends = (0..1_000).map(|_| {
        let smtp = &smtp;
        async move { smtp.send(&message()).await }
    });
    let answers = futures::future::join_all(sends).await;

    assert_eq!(
        source.asked.load(Ordering::SeqCst),
        1,
        "one request in the backoff"
    );
    let errors: Vec<&SendError> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!(errors.len(), 1_000);
    let (remembered, fetched): (Vec<&SendError>, Vec<&SendError>) =
        errors.iter().partition(|error| error.is_not_attempted());
    assert_eq!(
        fetched.len(),
        1,
        "the send that asked answers the fetch's own failure"
    );
    assert!(
        remembered.iter().all(|error| error.retry_after().is_some()),
        "a remembered failure says when it ends"
    );
    assert_eq!(server.count("AUTH"), 0);
    let opened = server.connections();
    let after = smtp.send(&message()).await.expect_err("still remembered");
    assert!(after.is_not_attempted());
    assert_eq!(
        server.connections(),
        opened,
        "a remembered failure opens no connection to the mail server"
    );
}

#[tokio::test]
async fn a_530_to_mail_from_on_a_reused_oauth_session_logs_in_afresh_on_a_new_connection() {
    // The second transaction, on the kept session: its token expired meanwhile.
    let server = second_mail_answered(b"530 5.7.57 Client not authenticated\r\n").await;
    let source = Scripted::new(&["first-token", "second-token"]);
    let smtp = in_clear(&server, source.clone(), None)
        .auth_without_tls()
        .build()
        .expect("valid settings");

    smtp.send(&message())
        .await
        .expect("first, on a new session");
    let second = smtp.send(&message()).await;

    assert!(second.is_ok(), "sent again on a new session: {second:?}");
    assert_eq!(server.connections(), 2, "{:?}", server.commands());
    assert_eq!(source.asked(), 2, "the expired token was forgotten");
    assert_eq!(server.data().len(), 2, "both messages delivered");
}

/// The server of a kept session whose second `MAIL FROM` is answered `reply`: logged in with
/// XOAUTH2 when the client asks, counting its `MAIL`s.
async fn second_mail_answered(reply: &'static [u8]) -> RawSmtp {
    let mails = std::sync::Arc::new(AtomicUsize::new(0));
    RawSmtp::start(
        b"220 raw.test ESMTP\r\n".to_vec(),
        move |command| match command {
            "EHLO" => Answer::Say(b"250-raw.test\r\n250 AUTH XOAUTH2\r\n".to_vec()),
            "AUTH" => Answer::Say(b"235 2.7.0 ok\r\n".to_vec()),
            "MAIL" if mails.fetch_add(1, Ordering::SeqCst) == 1 => Answer::Say(reply.to_vec()),
            other => Answer::healthy(other),
        },
    )
    .await
}

#[tokio::test]
async fn a_refusal_of_the_sender_on_a_reused_oauth_session_is_the_answer_not_an_expired_token() {
    let server = second_mail_answered(b"550 5.7.1 sender refused\r\n").await;
    let source = Scripted::new(&["first-token", "second-token"]);
    let smtp = in_clear(&server, source.clone(), None)
        .auth_without_tls()
        .build()
        .expect("valid settings");
    smtp.send(&message())
        .await
        .expect("first, on a new session");

    let refused = smtp
        .send(&message())
        .await
        .expect_err("the sender is refused");

    assert_eq!(refused.category(), Category::Rejected, "{refused:?}");
    assert_eq!(server.connections(), 1, "{:?}", server.commands());
    assert_eq!(source.asked(), 1, "the token was not taken for expired");
}

#[tokio::test]
async fn a_530_on_a_reused_session_without_oauth_is_the_servers_answer_not_a_new_login() {
    let server = second_mail_answered(b"530 5.7.0 Authentication required\r\n").await;
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
        .build()
        .expect("valid settings");
    smtp.send(&message())
        .await
        .expect("first, on a new session");

    let refused = smtp.send(&message()).await.expect_err("refused");

    assert!(!refused.is_not_attempted(), "{refused:?}");
    assert_eq!(server.connections(), 1, "{:?}", server.commands());
}

/// A token source with a bug.
struct Panicking;

#[async_trait::async_trait]
impl TokenSource for Panicking {
    async fn token(&self) -> Result<AccessToken, SendError> {
        panic!("a bug in the token source")
    }
}

#[tokio::test]
async fn a_token_source_that_panics_is_answered_as_the_sources_bug_not_a_cancelled_fetch() {
    let server = offering("AUTH XOAUTH2").await;
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(server.port())
        .timeout(TIMEOUT)
        .oauth2(USER, std::sync::Arc::new(Panicking))
        .auth_without_tls()
        .build()
        .expect("valid settings");

    let error = smtp.send(&message()).await.expect_err("no token");

    assert_eq!(error.code(), "oauth2.panicked", "{error:?}");
    assert_eq!(error.category(), Category::Configuration);
}
