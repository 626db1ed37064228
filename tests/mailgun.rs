//! MailgunTransport against a local server speaking Mailgun's `messages.mime` and domains
//! API: what it sends (basic auth, the MIME message as it is, every envelope recipient),
//! and how each documented answer is sorted (DESIGN §9, issue 14).
#![cfg(feature = "mailgun")]

mod support;

use std::time::Duration;

use base64::Engine;
use mail_breaker::{Category, Envelope, MailgunTransport, SendError, Transport};
use support::http_api::{ApiServer, Recorded, Reply};
use support::http_checks::{self, TIMEOUT, assert_discreet, message, send_error};

const KEY: &str = "key-test-never-shown";
const DOMAIN: &str = "mg.example.com";
const QUEUED: &str =
    r#"{"id":"<20240101000000.1.ABCDEF@mg.example.com>","message":"Queued. Thank you."}"#;

fn basic_auth(key: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("api:{key}"));
    format!("Basic {token}")
}

fn mailgun_error(status: u16, message: &str) -> Reply {
    Reply::json(status, &format!(r#"{{"message":"{message}"}}"#))
}

/// A Mailgun stand-in: 401 `Forbidden` unless the key is right; for
/// `POST /v3/<domain>/messages.mime`, `send` where the domain is active and the form has a
/// message, a 400 for a form without one (what `verify` sends), a 403 for a domain not
/// active; a 404 for any other domain or path.
async fn mailgun_with_state(
    state: &'static str,
    send: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
) -> ApiServer {
    ApiServer::start(move |request| {
        if request.header("authorization") != Some(&basic_auth(KEY)) {
            return Reply::text(401, "Forbidden");
        }
        let messages = format!("/v3/{DOMAIN}/messages.mime");
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", path) if path == messages => {
                if state != "active" {
                    return mailgun_error(
                        403,
                        &format!("Domain {DOMAIN} is not allowed to send: domain is {state}"),
                    );
                }
                let has_message = request
                    .form_fields()
                    .iter()
                    .any(|(name, _, _)| name == "message");
                if has_message {
                    send(request)
                } else {
                    mailgun_error(400, "message parameter is missing")
                }
            }
            _ => mailgun_error(404, "Domain not found"),
        }
    })
    .await
}

async fn mailgun(send: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> ApiServer {
    mailgun_with_state("active", send).await
}

fn transport(endpoint: String) -> MailgunTransport {
    MailgunTransport::new(KEY, DOMAIN)
        .with_endpoint(endpoint)
        .with_timeout(TIMEOUT)
}

async fn error_for(reply: Reply) -> SendError {
    let server = mailgun(move |_| reply.clone()).await;
    let error = send_error(&transport(server.endpoint())).await;
    assert_discreet(&error, KEY);
    assert_eq!(error.transport(), Some("mailgun:mg.example.com"));
    error
}

#[tokio::test]
async fn mailgun_gets_the_mime_message_as_it_is_with_every_envelope_recipient() {
    let server = mailgun(|_| Reply::json(200, QUEUED)).await;
    let message = message();
    let receipt = transport(server.endpoint())
        .send(&message)
        .await
        .expect("Mailgun takes it");
    assert_eq!(receipt.transport(), "mailgun:mg.example.com");
    assert_eq!(
        receipt.message_id(),
        Some("20240101000000.1.ABCDEF@mg.example.com")
    );

    let request = server.last();
    assert!(
        request
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("multipart/form-data"))
    );
    let fields = request.form_fields();
    let to = fields
        .iter()
        .find(|(name, _, _)| name == "to")
        .expect("a to field");
    assert_eq!(
        String::from_utf8_lossy(&to.2),
        "bob@example.org,carol@example.org,dave@example.net",
        "every envelope recipient, Bcc included"
    );
    let upload = fields
        .iter()
        .find(|(name, _, _)| name == "message")
        .expect("a message field");
    assert!(upload.1.is_some(), "the message goes as a file");
    assert_eq!(upload.2, message.formatted(), "the MIME message as it is");
}

#[tokio::test]
async fn mailgun_sends_a_signed_message_that_json_apis_cannot_express() {
    let server = mailgun(|_| Reply::json(200, QUEUED)).await;
    let raw = b"From: app@example.com\r\nTo: bob@example.org\r\nSubject: signed\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/signed; boundary=\"XX\"; protocol=\"application/pgp-signature\"\r\n\r\n\
--XX\r\nContent-Type: text/plain\r\n\r\nhello\r\n--XX\r\nContent-Type: application/pgp-signature\r\n\r\nsig\r\n--XX--\r\n";
    let envelope = Envelope::new(
        Some("app@example.com".parse().expect("an address")),
        vec!["bob@example.org".parse().expect("an address")],
    )
    .expect("an envelope");
    transport(server.endpoint())
        .send_raw(&envelope, raw)
        .await
        .expect("Mailgun takes any MIME");
    let fields = server.last().form_fields();
    assert!(
        fields
            .iter()
            .any(|(name, _, content)| name == "message" && content == raw)
    );
}

#[tokio::test]
async fn mailgun_bad_key_is_authentication_on_send_and_verify() {
    let server = mailgun(|_| Reply::json(200, QUEUED)).await;
    let wrong = MailgunTransport::new("key-wrong-never-shown", DOMAIN)
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = send_error(&wrong).await;
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "mailgun.401");
    assert_discreet(&error, "key-wrong-never-shown");
    let error = wrong.verify().await.expect_err("verify checks the key");
    assert_eq!(error.category(), Category::Authentication);
    transport(server.endpoint())
        .verify()
        .await
        .expect("the right key and an active domain verify");
    assert_eq!(server.last().path, "/v3/mg.example.com/messages.mime");
}

#[tokio::test]
async fn mailgun_an_unverified_domain_fails_verify_as_configuration() {
    let server = mailgun_with_state("unverified", |_| Reply::json(200, QUEUED)).await;
    let error = transport(server.endpoint())
        .verify()
        .await
        .expect_err("an unverified domain cannot send");
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "mailgun.403");
    let unknown = MailgunTransport::new(KEY, "other.example.com")
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = unknown
        .verify()
        .await
        .expect_err("a domain not on the account");
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "mailgun.404");
}

#[tokio::test]
async fn mailgun_sandbox_domain_not_allowed_to_send_403_is_configuration() {
    let error = error_for(mailgun_error(
        403,
        "Domain sandbox1.mailgun.org is not allowed to send: Free accounts are for test purposes only. Please upgrade or add the address to authorized recipients in Account Settings.",
    ))
    .await;
    assert_eq!(error.category(), Category::Configuration);
}

#[tokio::test]
async fn mailgun_bad_address_400_is_invalid_message() {
    let error = error_for(mailgun_error(
        400,
        "to parameter is not a valid address. please check documentation",
    ))
    .await;
    assert_eq!(error.category(), Category::InvalidMessage);
}

#[tokio::test]
async fn mailgun_429_is_rate_limited_with_retry_after() {
    let error =
        error_for(mailgun_error(429, "Too many requests").with_header("Retry-After", "3")).await;
    assert_eq!(error.category(), Category::RateLimited);
    assert_eq!(error.retry_after(), Some(Duration::from_secs(3)));
}

#[tokio::test]
async fn mailgun_500_is_server_error_and_503_is_service_unavailable() {
    let error = error_for(mailgun_error(500, "Internal error")).await;
    assert_eq!(error.category(), Category::ServerError);
    let error = error_for(Reply::text(503, "down")).await;
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(error.code(), "mailgun.503");
}

#[tokio::test]
async fn mailgun_connection_refused_is_network_and_not_maybe_delivered() {
    http_checks::connection_refused_is_network_and_not_maybe_delivered(transport, "mailgun").await;
}

#[tokio::test]
async fn mailgun_no_answer_is_timeout_and_maybe_delivered() {
    http_checks::no_answer_is_timeout_and_maybe_delivered(transport, "mailgun").await;
}

#[tokio::test]
async fn mailgun_dropped_connection_is_network_and_maybe_delivered() {
    http_checks::dropped_connection_is_network_and_maybe_delivered(transport, "mailgun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mailgun_pool_fails_over_to_smtp_while_mailgun_is_down_and_a_probe_brings_it_back() {
    let test = "mailgun_pool_fails_over_to_smtp_while_mailgun_is_down_and_a_probe_brings_it_back";
    http_checks::pool_fails_over_to_smtp_and_a_probe_brings_the_provider_back(
        test,
        transport,
        Reply::json(200, QUEUED),
        "20240101000000.1.ABCDEF@mg.example.com",
    )
    .await;
}

// Issue 23 (DESIGN §11): each test keeps one rule, and failed on the code before it.

#[tokio::test]
async fn mailgun_sends_over_http_only_to_a_loopback_host_unless_insecure_http_is_allowed() {
    http_checks::an_http_endpoint_off_loopback_is_refused_unless_insecure_http_is_allowed(
        transport,
        |endpoint| transport(endpoint).allow_insecure_http(),
        "mailgun",
    )
    .await;
}

#[tokio::test]
async fn mailgun_does_not_follow_a_redirect() {
    http_checks::a_redirect_is_not_followed(transport, Reply::json(200, QUEUED)).await;
}

#[tokio::test]
async fn mailgun_reads_an_answer_body_up_to_64_kib() {
    http_checks::an_answer_body_is_read_up_to_64_kib(|endpoint| {
        transport(endpoint).with_timeout(Duration::from_secs(5))
    })
    .await;
}

#[tokio::test]
async fn mailgun_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered() {
    http_checks::a_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered(transport).await;
}

#[tokio::test]
async fn mailgun_2xx_cut_off_mid_body_is_a_delivery() {
    http_checks::a_2xx_cut_off_mid_body_is_a_delivery(transport, 200).await;
}

#[tokio::test]
async fn mailgun_408_is_a_timeout() {
    http_checks::a_408_is_a_timeout(transport).await;
}

/// A domain sending key may only POST messages: verify must pass with one.
#[tokio::test]
async fn mailgun_verify_passes_with_a_domain_sending_key() {
    let server = ApiServer::start(|request| {
        if request.header("authorization") != Some(&basic_auth(KEY)) {
            return Reply::text(401, "Forbidden");
        }
        let messages = format!("/v3/{DOMAIN}/messages.mime");
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", path) if path == messages => {
                let has_message = request
                    .form_fields()
                    .iter()
                    .any(|(name, _, _)| name == "message");
                if has_message {
                    Reply::json(200, QUEUED)
                } else {
                    mailgun_error(400, "message parameter is missing")
                }
            }
            ("POST", _) => mailgun_error(404, "Domain not found"),
            // A sending key may read nothing else.
            _ => Reply::text(401, "Forbidden"),
        }
    })
    .await;
    transport(server.endpoint())
        .verify()
        .await
        .expect("a sending key is a valid key");
    assert!(
        server
            .requests()
            .iter()
            .all(|request| request.method == "POST"
                && request
                    .form_fields()
                    .iter()
                    .all(|(name, _, _)| name != "message")),
        "verify sent no message"
    );
    let wrong = MailgunTransport::new("key-wrong-never-shown", DOMAIN)
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = wrong.verify().await.expect_err("a wrong key");
    assert_eq!(error.category(), Category::Authentication);
    let unknown = MailgunTransport::new(KEY, "other.example.com")
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = unknown
        .verify()
        .await
        .expect_err("a domain the key cannot send for");
    assert_ne!(error.category(), Category::Authentication, "{error}");
}
