//! ResendTransport against a local server speaking Resend's `/emails` and `/domains` API:
//! what it sends (the bearer key, the JSON fields, Bcc kept, the idempotency key), and how
//! each documented answer is sorted (DESIGN §9, issue 14).
#![cfg(feature = "resend")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mail_breaker::{Category, ResendTransport, SendError, Transport};
use support::http_api::{ApiServer, Recorded, Reply};
use support::http_checks::{self, TIMEOUT, assert_discreet, message, send_error};

const KEY: &str = "re_test_key_never_shown";
const SENT: &str = r#"{"id":"49a3999c-0ce1-4ea6-ab68-afcd6dc2e794"}"#;

fn resend_error(status: u16, name: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &format!(r#"{{"statusCode":{status},"name":"{name}","message":"{message}"}}"#),
    )
}

/// A Resend stand-in: 403 unless the bearer key is right, `send` for `POST /emails`, a
/// domain list for `GET /domains`.
async fn resend(send: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> ApiServer {
    ApiServer::start(move |request| {
        if request.header("authorization") != Some(&format!("Bearer {KEY}")) {
            return resend_error(403, "invalid_api_key", "API key is invalid");
        }
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/emails") => send(request),
            ("GET", "/domains") => Reply::json(200, r#"{"data":[]}"#),
            _ => resend_error(404, "not_found", "The requested endpoint does not exist."),
        }
    })
    .await
}

fn transport(endpoint: String) -> ResendTransport {
    ResendTransport::new(KEY)
        .with_endpoint(endpoint)
        .with_timeout(TIMEOUT)
}

async fn error_for(reply: Reply) -> SendError {
    let server = resend(move |_| reply.clone()).await;
    let error = send_error(&transport(server.endpoint())).await;
    assert_discreet(&error, KEY);
    assert_eq!(error.transport(), Some("resend"));
    error
}

#[tokio::test]
async fn resend_gets_the_message_as_json_with_the_key_and_an_idempotency_key_from_the_message_id() {
    let server = resend(|_| Reply::json(200, SENT)).await;
    let receipt = transport(server.endpoint())
        .send(&message())
        .await
        .expect("Resend takes it");
    assert_eq!(receipt.transport(), "resend");
    assert_eq!(
        receipt.message_id(),
        Some("49a3999c-0ce1-4ea6-ab68-afcd6dc2e794")
    );

    let request = server.last();
    assert_eq!(request.path, "/emails");
    // The Message-ID, then a hash of the recipients this request is for (DESIGN §21).
    let key = mail_breaker::idempotency::try_key(
        message().envelope(),
        Some("<m-1@example.com>"),
        &message().formatted(),
    );
    assert!(key.starts_with("m-1@example.com."), "{key}");
    assert_eq!(request.header("idempotency-key"), Some(key.as_str()));
    let json = request.json();
    assert_eq!(json["from"], "\"App\" <app@example.com>");
    assert_eq!(json["to"], serde_json::json!(["\"Bob\" <bob@example.org>"]));
    assert_eq!(json["cc"], serde_json::json!(["carol@example.org"]));
    assert_eq!(
        json["bcc"],
        serde_json::json!(["dave@example.net"]),
        "Bcc kept"
    );
    assert_eq!(json["reply_to"], serde_json::json!(["help@example.com"]));
    assert_eq!(json["subject"], "http test");
    assert_eq!(json["text"], http_checks::BODY);
    assert_eq!(json["headers"]["Message-ID"], "<m-1@example.com>");
}

#[tokio::test]
async fn resend_a_retried_message_carries_the_same_idempotency_key_and_is_delivered_once() {
    // The stand-in keeps Resend's promise: a key it has seen gets the first answer again.
    let delivered: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let seen = Arc::clone(&delivered);
    let server = resend(move |request| {
        let key = request.header("idempotency-key").unwrap_or("").to_owned();
        let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        let next = seen.len();
        let id = *seen.entry(key).or_insert(next);
        Reply::json(200, &format!(r#"{{"id":"email-{id}"}}"#))
    })
    .await;
    let resend = transport(server.endpoint());
    let message = message();
    let first = resend.send(&message).await.expect("sent");
    let again = resend.send(&message).await.expect("answered again");
    assert_eq!(first.message_id(), again.message_id());
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].header("idempotency-key"),
        requests[1].header("idempotency-key")
    );
    assert_eq!(
        delivered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len(),
        1
    );
}

#[tokio::test]
async fn resend_bad_key_is_authentication_on_send_and_verify() {
    let server = resend(|_| Reply::json(200, SENT)).await;
    let wrong = ResendTransport::new("re_wrong_never_shown")
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = send_error(&wrong).await;
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "resend.invalid_api_key");
    assert_discreet(&error, "re_wrong_never_shown");
    let error = wrong.verify().await.expect_err("verify checks the key");
    assert_eq!(error.category(), Category::Authentication);
    transport(server.endpoint())
        .verify()
        .await
        .expect("the right key verifies");
}

#[tokio::test]
async fn resend_a_sending_only_key_passes_verify() {
    let server = ApiServer::start(|_| {
        resend_error(
            401,
            "restricted_api_key",
            "This API key is restricted to only send emails.",
        )
    })
    .await;
    transport(server.endpoint())
        .verify()
        .await
        .expect("a restricted key is a valid key");
    assert_eq!(server.last().path, "/domains");
}

#[tokio::test]
async fn resend_unverified_domain_403_is_configuration() {
    let error = error_for(resend_error(
        403,
        "validation_error",
        "The example.com domain is not verified. Please, add and verify your domain.",
    ))
    .await;
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "resend.validation_error");
}

#[tokio::test]
async fn resend_invalid_parameter_422_is_invalid_message() {
    let error = error_for(resend_error(
        422,
        "invalid_parameter",
        "Invalid `to` field.",
    ))
    .await;
    assert_eq!(error.category(), Category::InvalidMessage);
}

#[tokio::test]
async fn resend_security_error_451_is_rejected() {
    let error = error_for(resend_error(
        451,
        "security_error",
        "We may have found a security issue with the request.",
    ))
    .await;
    assert_eq!(error.category(), Category::Rejected);
}

#[tokio::test]
async fn resend_429_is_rate_limited_with_retry_after() {
    let error = error_for(
        resend_error(429, "rate_limit_exceeded", "Too many requests.")
            .with_header("Retry-After", "1"),
    )
    .await;
    assert_eq!(error.category(), Category::RateLimited);
    assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn resend_500_is_server_error_and_503_is_service_unavailable() {
    let error = error_for(resend_error(
        500,
        "internal_server_error",
        "Unexpected error",
    ))
    .await;
    assert_eq!(error.category(), Category::ServerError);
    let error = error_for(Reply::text(503, "down")).await;
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(error.code(), "resend.503");
}

#[tokio::test]
async fn resend_connection_refused_is_network_and_not_maybe_delivered() {
    http_checks::connection_refused_is_network_and_not_maybe_delivered(transport, "resend").await;
}

#[tokio::test]
async fn resend_no_answer_is_timeout_and_maybe_delivered() {
    http_checks::no_answer_is_timeout_and_maybe_delivered(transport, "resend").await;
}

#[tokio::test]
async fn resend_dropped_connection_is_network_and_maybe_delivered() {
    http_checks::dropped_connection_is_network_and_maybe_delivered(transport, "resend").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_pool_fails_over_to_smtp_while_resend_is_down_and_a_probe_brings_it_back() {
    let test = "resend_pool_fails_over_to_smtp_while_resend_is_down_and_a_probe_brings_it_back";
    http_checks::pool_fails_over_to_smtp_and_a_probe_brings_the_provider_back(
        test,
        transport,
        Reply::json(200, SENT),
        "49a3999c-0ce1-4ea6-ab68-afcd6dc2e794",
    )
    .await;
}

// Issue 23 (DESIGN §11): each test keeps one rule, and failed on the code before it.

#[tokio::test]
async fn resend_sends_over_http_only_to_a_loopback_host_unless_insecure_http_is_allowed() {
    http_checks::an_http_endpoint_off_loopback_is_refused_unless_insecure_http_is_allowed(
        transport,
        |endpoint| transport(endpoint).allow_insecure_http(),
        "resend",
    )
    .await;
}

#[tokio::test]
async fn resend_does_not_follow_a_redirect() {
    http_checks::a_redirect_is_not_followed(transport, Reply::json(200, SENT)).await;
}

#[tokio::test]
async fn resend_reads_an_answer_body_up_to_64_kib() {
    http_checks::an_answer_body_is_read_up_to_64_kib(|endpoint| {
        transport(endpoint).with_timeout(Duration::from_secs(5))
    })
    .await;
}

#[tokio::test]
async fn resend_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered() {
    http_checks::a_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered(transport).await;
}

#[tokio::test]
async fn resend_2xx_cut_off_mid_body_is_a_delivery() {
    http_checks::a_2xx_cut_off_mid_body_is_a_delivery(transport, 200).await;
}

#[tokio::test]
async fn resend_408_is_a_timeout() {
    http_checks::a_408_is_a_timeout(transport).await;
}

#[tokio::test]
async fn resend_a_message_it_cannot_carry_is_unsupported() {
    http_checks::a_message_a_json_api_cannot_carry_is_unsupported(transport).await;
}

#[tokio::test]
async fn resend_an_attachment_keeps_its_bytes_and_a_bare_type() {
    http_checks::an_attachment_keeps_its_bytes_and_a_bare_type(
        transport,
        Reply::json(200, SENT),
        "attachments",
        "content",
        "content_type",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_pool_delivers_a_message_resend_cannot_carry_through_smtp() {
    http_checks::a_message_the_provider_cannot_carry_is_delivered_by_an_smtp_member(
        "resend_pool_delivers_a_message_resend_cannot_carry_through_smtp",
        transport,
    )
    .await;
}
