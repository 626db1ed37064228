//! SendGridTransport against a local server speaking SendGrid's v3 `/mail/send` and
//! `/scopes` API: what it sends (the bearer key, the personalization with Bcc kept, the
//! content in order), and how each documented answer is sorted (DESIGN §9, issue 14).
#![cfg(feature = "sendgrid")]

mod support;

use std::time::Duration;

use mail_breaker::{Category, SendError, SendGridTransport, Transport};
use support::http_api::{ApiServer, Recorded, Reply};
use support::http_checks::{self, TIMEOUT, assert_discreet, message, send_error};

const KEY: &str = "SG.test-key-never-shown";
const MESSAGE_ID: &str = "14c5d75ce93.dfd.64b469.filter-147.22.MSG";

fn accepted() -> Reply {
    Reply::text(202, "").with_header("X-Message-Id", MESSAGE_ID)
}

fn sendgrid_error(status: u16, field: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &format!(r#"{{"errors":[{{"message":"{message}","field":"{field}","help":null}}]}}"#),
    )
}

/// A SendGrid stand-in: 401 unless the bearer key is right, `send` for
/// `POST /v3/mail/send`, `scopes` for `GET /v3/scopes`.
async fn sendgrid_with_scopes(
    scopes: &'static str,
    send: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
) -> ApiServer {
    ApiServer::start(move |request| {
        if request.header("authorization") != Some(&format!("Bearer {KEY}")) {
            return sendgrid_error(
                401,
                "",
                "The provided authorization grant is invalid, expired, or revoked",
            );
        }
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/v3/mail/send") => send(request),
            ("GET", "/v3/scopes") => Reply::json(200, scopes),
            _ => Reply::json(404, "{}"),
        }
    })
    .await
}

async fn sendgrid(send: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> ApiServer {
    sendgrid_with_scopes(r#"{"scopes":["alerts.read","mail.send"]}"#, send).await
}

fn transport(endpoint: String) -> SendGridTransport {
    SendGridTransport::new(KEY)
        .with_endpoint(endpoint)
        .with_timeout(TIMEOUT)
}

async fn error_for(reply: Reply) -> SendError {
    let server = sendgrid(move |_| reply.clone()).await;
    let error = send_error(&transport(server.endpoint())).await;
    assert_discreet(&error, KEY);
    assert_eq!(error.transport(), Some("sendgrid"));
    error
}

#[tokio::test]
async fn sendgrid_gets_one_personalization_with_bcc_kept_and_the_receipt_has_the_x_message_id() {
    let server = sendgrid(|_| accepted()).await;
    let receipt = transport(server.endpoint())
        .send(&message())
        .await
        .expect("SendGrid takes it");
    assert_eq!(receipt.transport(), "sendgrid");
    assert_eq!(receipt.message_id(), Some(MESSAGE_ID));

    let json = server.last().json();
    let personalization = &json["personalizations"][0];
    assert_eq!(
        personalization["to"],
        serde_json::json!([{"email": "bob@example.org", "name": "Bob"}])
    );
    assert_eq!(
        personalization["cc"],
        serde_json::json!([{"email": "carol@example.org"}])
    );
    assert_eq!(
        personalization["bcc"],
        serde_json::json!([{"email": "dave@example.net"}]),
        "Bcc kept"
    );
    assert_eq!(
        json["from"],
        serde_json::json!({"email": "app@example.com", "name": "App"})
    );
    assert_eq!(
        json["reply_to"],
        serde_json::json!({"email": "help@example.com"})
    );
    assert_eq!(json["subject"], "http test");
    assert_eq!(
        json["content"],
        serde_json::json!([{"type": "text/plain", "value": http_checks::BODY}])
    );
    assert_eq!(json["headers"]["Message-ID"], "<m-1@example.com>");
}

#[tokio::test]
async fn sendgrid_bad_key_is_authentication_on_send_and_verify() {
    let server = sendgrid(|_| accepted()).await;
    let wrong = SendGridTransport::new("SG.wrong-never-shown")
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = send_error(&wrong).await;
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "sendgrid.401");
    assert_discreet(&error, "SG.wrong-never-shown");
    let error = wrong.verify().await.expect_err("verify checks the key");
    assert_eq!(error.category(), Category::Authentication);
    transport(server.endpoint())
        .verify()
        .await
        .expect("the right key with mail.send verifies");
    assert_eq!(server.last().path, "/v3/scopes");
}

#[tokio::test]
async fn sendgrid_a_key_without_the_mail_send_scope_fails_verify() {
    let server = sendgrid_with_scopes(r#"{"scopes":["alerts.read"]}"#, |_| accepted()).await;
    let error = transport(server.endpoint())
        .verify()
        .await
        .expect_err("no mail.send scope");
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "sendgrid.scope");
}

#[tokio::test]
async fn sendgrid_unverified_sender_identity_403_is_configuration() {
    let error = error_for(sendgrid_error(
        403,
        "from",
        "The from address does not match a verified Sender Identity.",
    ))
    .await;
    assert_eq!(error.category(), Category::Configuration);
}

#[tokio::test]
async fn sendgrid_invalid_address_400_is_invalid_message() {
    let error = error_for(sendgrid_error(
        400,
        "personalizations.0.to.0.email",
        "Does not contain a valid address.",
    ))
    .await;
    assert_eq!(error.category(), Category::InvalidMessage);
    assert!(error.message().contains("personalizations.0.to.0.email"));
}

#[tokio::test]
async fn sendgrid_429_is_rate_limited_with_retry_after() {
    let error =
        error_for(sendgrid_error(429, "", "too many requests").with_header("Retry-After", "4"))
            .await;
    assert_eq!(error.category(), Category::RateLimited);
    assert_eq!(error.retry_after(), Some(Duration::from_secs(4)));
}

#[tokio::test]
async fn sendgrid_500_is_server_error_and_503_is_service_unavailable() {
    let error = error_for(sendgrid_error(500, "", "internal error")).await;
    assert_eq!(error.category(), Category::ServerError);
    let error = error_for(Reply::text(503, "down")).await;
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(error.code(), "sendgrid.503");
}

#[tokio::test]
async fn sendgrid_connection_refused_is_network_and_not_maybe_delivered() {
    http_checks::connection_refused_is_network_and_not_maybe_delivered(transport, "sendgrid").await;
}

#[tokio::test]
async fn sendgrid_no_answer_is_timeout_and_maybe_delivered() {
    http_checks::no_answer_is_timeout_and_maybe_delivered(transport, "sendgrid").await;
}

#[tokio::test]
async fn sendgrid_dropped_connection_is_network_and_maybe_delivered() {
    http_checks::dropped_connection_is_network_and_maybe_delivered(transport, "sendgrid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendgrid_pool_fails_over_to_smtp_while_sendgrid_is_down_and_a_probe_brings_it_back() {
    let test = "sendgrid_pool_fails_over_to_smtp_while_sendgrid_is_down_and_a_probe_brings_it_back";
    http_checks::pool_fails_over_to_smtp_and_a_probe_brings_the_provider_back(
        test,
        transport,
        accepted(),
        MESSAGE_ID,
    )
    .await;
}

// Issue 23 (DESIGN §11): each test keeps one rule, and failed on the code before it.

#[tokio::test]
async fn sendgrid_sends_over_http_only_to_a_loopback_host_unless_insecure_http_is_allowed() {
    http_checks::an_http_endpoint_off_loopback_is_refused_unless_insecure_http_is_allowed(
        transport,
        |endpoint| transport(endpoint).allow_insecure_http(),
        "sendgrid",
    )
    .await;
}

#[tokio::test]
async fn sendgrid_does_not_follow_a_redirect() {
    http_checks::a_redirect_is_not_followed(transport, accepted()).await;
}

#[tokio::test]
async fn sendgrid_reads_an_answer_body_up_to_64_kib() {
    http_checks::an_answer_body_is_read_up_to_64_kib(|endpoint| {
        transport(endpoint).with_timeout(Duration::from_secs(5))
    })
    .await;
}

#[tokio::test]
async fn sendgrid_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered() {
    http_checks::a_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered(transport).await;
}

#[tokio::test]
async fn sendgrid_2xx_cut_off_mid_body_is_a_delivery() {
    http_checks::a_2xx_cut_off_mid_body_is_a_delivery(transport, 202).await;
}

#[tokio::test]
async fn sendgrid_408_is_a_timeout() {
    http_checks::a_408_is_a_timeout(transport).await;
}

#[tokio::test]
async fn sendgrid_a_message_it_cannot_carry_is_unsupported() {
    http_checks::a_message_a_json_api_cannot_carry_is_unsupported(transport).await;
}

#[tokio::test]
async fn sendgrid_an_attachment_keeps_its_bytes_and_a_bare_type() {
    http_checks::an_attachment_keeps_its_bytes_and_a_bare_type(
        transport,
        accepted(),
        "attachments",
        "content",
        "type",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendgrid_pool_delivers_a_message_sendgrid_cannot_carry_through_smtp() {
    http_checks::a_message_the_provider_cannot_carry_is_delivered_by_an_smtp_member(
        "sendgrid_pool_delivers_a_message_sendgrid_cannot_carry_through_smtp",
        transport,
    )
    .await;
}

/// SendGrid says when its rate limit resets in `X-RateLimit-Reset` (epoch seconds), not in
/// `Retry-After`.
#[tokio::test]
async fn sendgrid_x_ratelimit_reset_gives_retry_after() {
    let reset = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        + 30;
    let reply = sendgrid_error(429, "", "too many requests")
        .with_header("X-RateLimit-Limit", "600")
        .with_header("X-RateLimit-Remaining", "0")
        .with_header("X-RateLimit-Reset", &reset.to_string());
    let server = sendgrid(move |_| reply.clone()).await;
    let error = send_error(&transport(server.endpoint())).await;
    assert_eq!(error.category(), Category::RateLimited);
    let after = error.retry_after().expect("the reset time is kept");
    assert!(
        (Duration::from_secs(28)..=Duration::from_secs(31)).contains(&after),
        "{after:?}"
    );
}
