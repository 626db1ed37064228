//! PostmarkTransport against a local server speaking Postmark's `/email` and `/server` API:
//! what it sends (the token header, the JSON fields, Bcc kept, inline images), and how each
//! documented answer is sorted (DESIGN §9, issue 14).
#![cfg(feature = "postmark")]

mod support;

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Attachment, MultiPart, SinglePart};
use mail_breaker::{Category, Message, PostmarkTransport, Transport};
use support::http_api::{ApiServer, Recorded, Reply};
use support::http_checks::{self, TIMEOUT, assert_discreet, message, send_error};

const TOKEN: &str = "pm-server-token-never-shown";
const SENT: &str = r#"{"To":"bob@example.org","SubmittedAt":"2024-01-01T00:00:00Z","MessageID":"pm-0a1b2c","ErrorCode":0,"Message":"OK"}"#;

/// A Postmark stand-in: 401 unless the server token is right, `send` for `POST /email`,
/// the server's settings for `GET /server`.
async fn postmark(send: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> ApiServer {
    ApiServer::start(move |request| {
        if request.header("x-postmark-server-token") != Some(TOKEN) {
            return Reply::json(
                401,
                r#"{"ErrorCode":10,"Message":"Request does not contain a valid Server token."}"#,
            );
        }
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/email") => send(request),
            ("GET", "/server") => Reply::json(200, r#"{"ID":1,"Name":"Staging"}"#),
            _ => Reply::json(404, "{}"),
        }
    })
    .await
}

fn transport(endpoint: String) -> PostmarkTransport {
    PostmarkTransport::new(TOKEN)
        .with_endpoint(endpoint)
        .with_timeout(TIMEOUT)
}

async fn error_for(reply: Reply) -> mail_breaker::SendError {
    let server = postmark(move |_| reply.clone()).await;
    let error = send_error(&transport(server.endpoint())).await;
    assert_discreet(&error, TOKEN);
    assert_eq!(error.transport(), Some("postmark"));
    error
}

#[tokio::test]
async fn postmark_gets_the_message_as_json_with_the_token_and_the_receipt_has_its_message_id() {
    let server = postmark(|_| Reply::json(200, SENT)).await;
    let receipt = transport(server.endpoint())
        .send(&message())
        .await
        .expect("Postmark takes it");
    assert_eq!(receipt.transport(), "postmark");
    assert_eq!(receipt.message_id(), Some("pm-0a1b2c"));

    let request = server.last();
    assert_eq!(request.header("accept"), Some("application/json"));
    assert!(
        request
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("application/json"))
    );
    let json = request.json();
    assert_eq!(json["From"], "\"App\" <app@example.com>");
    assert_eq!(json["To"], "\"Bob\" <bob@example.org>");
    assert_eq!(json["Cc"], "carol@example.org");
    assert_eq!(
        json["Bcc"], "dave@example.net",
        "the envelope's Bcc recipient is kept"
    );
    assert_eq!(json["ReplyTo"], "help@example.com");
    assert_eq!(json["Subject"], "http test");
    assert_eq!(json["TextBody"], http_checks::BODY);
    assert!(json.get("HtmlBody").is_none());
    let headers = json["Headers"].as_array().expect("custom headers");
    assert!(
        headers
            .iter()
            .any(|h| h["Name"] == "Message-ID" && h["Value"] == "<m-1@example.com>")
    );
}

#[tokio::test]
async fn postmark_gets_html_and_inline_images_with_their_content_ids() {
    let server = postmark(|_| Reply::json(200, SENT)).await;
    let body = MultiPart::mixed()
        .multipart(
            MultiPart::alternative()
                .singlepart(SinglePart::plain("plain".to_owned()))
                .multipart(
                    MultiPart::related()
                        .singlepart(SinglePart::html("<img src=\"cid:logo\">".to_owned()))
                        .singlepart(Attachment::new_inline("logo".to_owned()).body(
                            vec![0x89u8, b'P', b'N', b'G'],
                            ContentType::parse("image/png").expect("a type"),
                        )),
                ),
        )
        .singlepart(Attachment::new("invoice.pdf".to_owned()).body(
            b"%PDF-1.4".to_vec(),
            ContentType::parse("application/pdf").expect("a type"),
        ));
    let message = Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("bob@example.org".parse().expect("a recipient"))
        .subject("with pictures")
        .multipart(body)
        .expect("a message");
    transport(server.endpoint())
        .send(&message)
        .await
        .expect("Postmark takes it");

    let json = server.last().json();
    assert_eq!(json["TextBody"], "plain");
    assert_eq!(json["HtmlBody"], "<img src=\"cid:logo\">");
    let attachments = json["Attachments"].as_array().expect("attachments");
    assert_eq!(attachments.len(), 2);
    assert_eq!(attachments[0]["ContentID"], "cid:logo");
    assert_eq!(attachments[0]["ContentType"], "image/png");
    assert_eq!(attachments[0]["Content"], "iVBORw==");
    assert_eq!(attachments[1]["Name"], "invoice.pdf");
    assert_eq!(attachments[1]["Content"], "JVBERi0xLjQ=");
    assert!(attachments[1].get("ContentID").is_none());
}

#[tokio::test]
async fn postmark_bad_token_is_authentication_on_send_and_verify() {
    let server = postmark(|_| Reply::json(200, SENT)).await;
    let wrong = PostmarkTransport::new("wrong-token-never-shown")
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = send_error(&wrong).await;
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "postmark.401.10");
    assert_discreet(&error, "wrong-token-never-shown");
    let error = wrong.verify().await.expect_err("verify checks the token");
    assert_eq!(error.category(), Category::Authentication);
    transport(server.endpoint())
        .verify()
        .await
        .expect("the right token verifies");
    assert_eq!(server.last().path, "/server");
}

#[tokio::test]
async fn postmark_inactive_recipient_406_is_rejected() {
    let error = error_for(Reply::json(
        422,
        r#"{"ErrorCode":406,"Message":"You tried to send to recipient(s) that have been marked as inactive. Found inactive addresses: bob@example.org."}"#,
    ))
    .await;
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(error.code(), "postmark.422.406");
}

#[tokio::test]
async fn postmark_invalid_email_request_300_is_invalid_message() {
    let error = error_for(Reply::json(
        422,
        r#"{"ErrorCode":300,"Message":"Error parsing 'To': Illegal email address 'bob@'."}"#,
    ))
    .await;
    assert_eq!(error.category(), Category::InvalidMessage);
}

#[tokio::test]
async fn postmark_unconfirmed_sender_signature_and_suspended_account_are_configuration() {
    for code in [400, 401, 413] {
        let body = format!(r#"{{"ErrorCode":{code},"Message":"The sender cannot send."}}"#);
        let error = error_for(Reply::json(422, &body)).await;
        assert_eq!(
            error.category(),
            Category::Configuration,
            "ErrorCode {code}"
        );
    }
}

#[tokio::test]
async fn postmark_429_is_rate_limited_with_retry_after() {
    let error = error_for(
        Reply::json(429, r#"{"ErrorCode":429,"Message":"Rate limit exceeded."}"#)
            .with_header("Retry-After", "7"),
    )
    .await;
    assert_eq!(error.category(), Category::RateLimited);
    assert_eq!(error.retry_after(), Some(std::time::Duration::from_secs(7)));
}

#[tokio::test]
async fn postmark_500_is_server_error_and_503_is_service_unavailable() {
    let error = error_for(Reply::json(
        500,
        r#"{"ErrorCode":0,"Message":"Internal error"}"#,
    ))
    .await;
    assert_eq!(error.category(), Category::ServerError);
    assert!(error.category().is_breaker_failure());
    let error = error_for(Reply::text(503, "down")).await;
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(error.code(), "postmark.503");
}

#[tokio::test]
async fn postmark_errors_never_show_the_token_even_when_echoed() {
    let error = error_for(Reply::json(
        422,
        &format!(r#"{{"ErrorCode":300,"Message":"Token {TOKEN} cannot send to bob@example.org"}}"#),
    ))
    .await;
    assert!(error.message().contains("[redacted]"), "{error}");
}

#[tokio::test]
async fn postmark_unexpressible_message_is_unsupported_and_nothing_is_sent() {
    let server = postmark(|_| Reply::json(200, SENT)).await;
    let calendar = MultiPart::alternative()
        .singlepart(SinglePart::plain("invite".to_owned()))
        .singlepart(
            SinglePart::builder()
                .header(ContentType::parse("text/calendar; method=REQUEST").expect("a type"))
                .body("BEGIN:VCALENDAR".to_owned()),
        );
    let message = Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("bob@example.org".parse().expect("a recipient"))
        .multipart(calendar)
        .expect("a message");
    let error = transport(server.endpoint())
        .send(&message)
        .await
        .expect_err("a calendar alternative cannot be expressed");
    assert_eq!(error.category().as_str(), "unsupported");
    assert!(error.message().contains("text/calendar"), "{error}");
    assert_eq!(server.request_count(), 0);
}

#[tokio::test]
async fn postmark_connection_refused_is_network_and_not_maybe_delivered() {
    http_checks::connection_refused_is_network_and_not_maybe_delivered(transport, "postmark").await;
}

#[tokio::test]
async fn postmark_no_answer_is_timeout_and_maybe_delivered() {
    http_checks::no_answer_is_timeout_and_maybe_delivered(transport, "postmark").await;
}

#[tokio::test]
async fn postmark_dropped_connection_is_network_and_maybe_delivered() {
    http_checks::dropped_connection_is_network_and_maybe_delivered(transport, "postmark").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postmark_pool_fails_over_to_smtp_while_postmark_is_down_and_a_probe_brings_it_back() {
    let test = "postmark_pool_fails_over_to_smtp_while_postmark_is_down_and_a_probe_brings_it_back";
    http_checks::pool_fails_over_to_smtp_and_a_probe_brings_the_provider_back(
        test,
        transport,
        Reply::json(200, SENT),
        "pm-0a1b2c",
    )
    .await;
}

// Issue 23 (DESIGN §11): each test keeps one rule, and failed on the code before it.

#[tokio::test]
async fn postmark_sends_over_http_only_to_a_loopback_host_unless_insecure_http_is_allowed() {
    http_checks::an_http_endpoint_off_loopback_is_refused_unless_insecure_http_is_allowed(
        transport,
        |endpoint| transport(endpoint).allow_insecure_http(),
        "postmark",
    )
    .await;
}

#[tokio::test]
async fn postmark_does_not_follow_a_redirect() {
    http_checks::a_redirect_is_not_followed(transport, Reply::json(200, SENT)).await;
}

#[tokio::test]
async fn postmark_reads_an_answer_body_up_to_64_kib() {
    http_checks::an_answer_body_is_read_up_to_64_kib(|endpoint| {
        transport(endpoint).with_timeout(Duration::from_secs(5))
    })
    .await;
}

#[tokio::test]
async fn postmark_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered() {
    http_checks::a_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered(transport).await;
}

#[tokio::test]
async fn postmark_2xx_cut_off_mid_body_is_a_delivery() {
    http_checks::a_2xx_cut_off_mid_body_is_a_delivery(transport, 200).await;
}

#[tokio::test]
async fn postmark_408_is_a_timeout() {
    http_checks::a_408_is_a_timeout(transport).await;
}

#[tokio::test]
async fn postmark_a_message_it_cannot_carry_is_unsupported() {
    http_checks::a_message_a_json_api_cannot_carry_is_unsupported(transport).await;
}

#[tokio::test]
async fn postmark_an_attachment_keeps_its_bytes_and_a_bare_type() {
    http_checks::an_attachment_keeps_its_bytes_and_a_bare_type(
        transport,
        Reply::json(200, SENT),
        "Attachments",
        "Content",
        "ContentType",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postmark_pool_delivers_a_message_postmark_cannot_carry_through_smtp() {
    http_checks::a_message_the_provider_cannot_carry_is_delivered_by_an_smtp_member(
        "postmark_pool_delivers_a_message_postmark_cannot_carry_through_smtp",
        transport,
    )
    .await;
}
