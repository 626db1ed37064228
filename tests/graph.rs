//! Microsoft Graph's `sendMail` (issue 65, DESIGN §21) against an in-test Graph endpoint and
//! token endpoint that speak the documented requests and error bodies.
#![cfg(feature = "graph")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use mail_breaker::oauth::ClientCredentials;
use mail_breaker::{Category, GraphTransport, Message, PoolTransport, SmtpTransport, Transport};
use support::http_api::{ApiServer, Recorded, Reply};
use support::smtp_sink::SmtpSink;

/// A token endpoint that hands out `token-1`, `token-2`, ... one a request.
async fn token_endpoint() -> ApiServer {
    let issued = Arc::new(AtomicUsize::new(0));
    ApiServer::start(move |_| {
        let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
        Reply::json(
            200,
            &format!(r#"{{"token_type":"Bearer","access_token":"token-{n}","expires_in":3599}}"#),
        )
    })
    .await
}

/// A Graph transport sending as `app@contoso.com` to `graph`, with tokens from `tokens`.
fn graph_on(graph: &ApiServer, tokens: &ApiServer) -> GraphTransport {
    let source = ClientCredentials {
        token_url: format!("{}/tenant/oauth2/v2.0/token", tokens.endpoint()),
        ..ClientCredentials::for_graph("contoso.onmicrosoft.com", "app-id", "s3cret")
    }
    .build()
    .expect("a token source");
    GraphTransport::new("app@contoso.com", source)
        .with_endpoint(graph.endpoint())
        .with_timeout(Duration::from_millis(800))
}

fn to_ann_and_bob() -> Message {
    Message::builder()
        .from("app@contoso.com".parse().unwrap())
        .to("ann@example.org".parse().unwrap())
        .bcc("bob@example.org".parse().unwrap())
        .subject("the report")
        .body(String::from("hello"))
        .unwrap()
}

/// The MIME a request to Graph carried.
fn mime_of(request: &Recorded) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(request.text().trim())
        .expect("a base64 body");
    String::from_utf8(bytes).expect("UTF-8 MIME")
}

fn graph_error(status: u16, code: &str) -> Reply {
    Reply::json(
        status,
        &format!(r#"{{"error":{{"code":"{code}","message":"Graph refused it."}}}}"#),
    )
}

#[tokio::test]
async fn a_message_is_delivered_as_its_mime_with_a_bcc_naming_the_blind_copy() {
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let message = to_ann_and_bob();
    let receipt = graph_on(&graph, &tokens).send(&message).await.unwrap();
    assert_eq!(receipt.message_id(), None);
    assert!(
        receipt
            .response()
            .unwrap_or_default()
            .contains("no message id"),
        "{receipt:?}"
    );
    let request = graph.last();
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1.0/users/app@contoso.com/sendMail");
    assert_eq!(request.header("content-type"), Some("text/plain"));
    assert_eq!(request.header("authorization"), Some("Bearer token-1"));
    let sent = String::from_utf8(message.formatted()).unwrap();
    assert_eq!(mime_of(&request), format!("Bcc: bob@example.org\r\n{sent}"));
    // The token endpoint was asked as Microsoft's documents it.
    let asked = tokens.last().text();
    assert!(asked.contains("grant_type=client_credentials"), "{asked}");
    assert!(
        asked.contains("scope=https%3A%2F%2Fgraph.microsoft.com%2F.default"),
        "{asked}"
    );
}

#[tokio::test]
async fn a_401_takes_a_fresh_token_and_succeeds_on_the_second_try() {
    let tokens = token_endpoint().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let graph = ApiServer::start(move |_| {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            graph_error(401, "InvalidAuthenticationToken")
        } else {
            Reply::text(202, "")
        }
    })
    .await;
    graph_on(&graph, &tokens)
        .send(&to_ann_and_bob())
        .await
        .expect("delivered with the second token");
    let bearers: Vec<_> = graph
        .requests()
        .iter()
        .map(|request| {
            request
                .header("authorization")
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(bearers, ["Bearer token-1", "Bearer token-2"]);
}

#[tokio::test]
async fn a_second_401_is_an_authentication_error_and_no_third_try_is_made() {
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| graph_error(401, "InvalidAuthenticationToken")).await;
    let error = graph_on(&graph, &tokens)
        .send(&to_ann_and_bob())
        .await
        .unwrap_err();
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "graph.InvalidAuthenticationToken");
    assert_eq!(graph.request_count(), 2);
    assert_eq!(tokens.request_count(), 2);
}

#[tokio::test]
async fn an_invalid_client_at_the_token_endpoint_is_an_authentication_error_and_nothing_is_sent() {
    let tokens = ApiServer::start(|_| {
        Reply::json(
            401,
            r#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided."}"#,
        )
    })
    .await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let error = graph_on(&graph, &tokens)
        .send(&to_ann_and_bob())
        .await
        .unwrap_err();
    assert_eq!(error.category(), Category::Authentication, "{error}");
    assert!(!error.is_maybe_delivered());
    assert_eq!(graph.request_count(), 0);
}

#[tokio::test]
async fn each_row_of_the_error_table_gives_its_category_its_wait_and_whether_it_is_about_the_message()
 {
    let tokens = token_endpoint().await;
    let rows = [
        (
            graph_error(429, "ApplicationThrottled").with_header("Retry-After", "7"),
            Category::RateLimited,
            Some(7),
            false,
        ),
        (
            Reply::text(503, "").with_header("Retry-After", "30"),
            Category::ServiceUnavailable,
            Some(30),
            false,
        ),
        (
            graph_error(403, "ErrorSendAsDenied"),
            Category::Configuration,
            None,
            true,
        ),
        (
            graph_error(403, "ErrorAccessDenied"),
            Category::Configuration,
            None,
            false,
        ),
        (
            graph_error(403, "NoPermissionsInAccessToken"),
            Category::Configuration,
            None,
            false,
        ),
        (
            graph_error(400, "MailboxNotEnabledForRESTAPI"),
            Category::Configuration,
            None,
            false,
        ),
        (
            graph_error(404, "ResourceNotFound"),
            Category::Configuration,
            None,
            false,
        ),
        (
            graph_error(403, "ErrorQuotaExceeded"),
            Category::Configuration,
            None,
            false,
        ),
    ];
    for (reply, category, wait, about_the_message) in rows {
        let graph = ApiServer::start(move |_| reply.clone()).await;
        let error = graph_on(&graph, &tokens)
            .send(&to_ann_and_bob())
            .await
            .unwrap_err();
        assert_eq!(error.category(), category, "{error}");
        assert_eq!(
            error.retry_after(),
            wait.map(Duration::from_secs),
            "{error}"
        );
        assert_eq!(error.is_about_the_message(), about_the_message, "{error}");
        assert!(!error.is_maybe_delivered(), "{error}");
    }
}

#[tokio::test]
async fn a_5xx_a_504_and_a_dropped_connection_after_the_request_went_are_maybe_delivered() {
    let tokens = token_endpoint().await;
    for reply in [
        graph_error(500, "InternalServerError"),
        Reply::text(504, ""),
        Reply::Drop,
    ] {
        let graph = ApiServer::start(move |_| reply.clone()).await;
        let error = graph_on(&graph, &tokens)
            .send(&to_ann_and_bob())
            .await
            .unwrap_err();
        assert!(error.is_maybe_delivered(), "{error}");
    }
}

#[tokio::test]
async fn a_message_over_four_megabytes_is_unsupported_and_never_reaches_graph() {
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let large = Message::builder()
        .from("app@contoso.com".parse().unwrap())
        .to("ann@example.org".parse().unwrap())
        .subject("large")
        .body("x".repeat(3_200_000))
        .unwrap();
    let error = graph_on(&graph, &tokens).send(&large).await.unwrap_err();
    assert_eq!(error.category(), Category::Unsupported);
    assert_eq!(error.code(), "graph.too_large");
    assert_eq!(graph.request_count(), 0);
}

#[tokio::test]
async fn verify_checks_that_the_tokens_roles_hold_mail_send_and_reads_nothing() {
    let claims = |roles: &str| {
        let part = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
        format!(
            "{}.{}.sig",
            part(r#"{"alg":"RS256","typ":"JWT"}"#),
            part(&format!(
                r#"{{"aud":"https://graph.microsoft.com","roles":{roles}}}"#
            ))
        )
    };
    let graph = ApiServer::start(|_| Reply::text(500, "")).await;
    for (roles, passes) in [(r#"["Mail.Send"]"#, true), (r#"["User.Read.All"]"#, false)] {
        let token = claims(roles);
        let tokens = ApiServer::start(move |_| {
            Reply::json(
                200,
                &format!(r#"{{"access_token":"{token}","expires_in":3599}}"#),
            )
        })
        .await;
        let verdict = graph_on(&graph, &tokens).verify().await;
        assert_eq!(verdict.is_ok(), passes, "{roles}: {verdict:?}");
        if let Err(error) = verdict {
            assert_eq!(error.category(), Category::Configuration);
            assert_eq!(error.code(), "graph.no_mail_send");
        }
    }
    assert_eq!(graph.request_count(), 0, "verify reads nothing from Graph");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_to_one_of_three_recipients_is_unsupported_and_reaches_smtp_sink_through_the_next_member()
 {
    let Some(sink) =
        SmtpSink::start_counting("a_resend_to_one_of_three_recipients_reaches_smtp_sink", &[])
    else {
        return;
    };
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let pool = PoolTransport::builder()
        .add(graph_on(&graph, &tokens), 1)
        .add(
            SmtpTransport::unencrypted("127.0.0.1", sink.port())
                .with_timeout(Duration::from_millis(800)),
            2,
        )
        .build()
        .unwrap();
    let message = Message::builder()
        .from("app@contoso.com".parse().unwrap())
        .to("ann@example.org".parse().unwrap())
        .to("bob@example.org".parse().unwrap())
        .to("cat@example.org".parse().unwrap())
        .subject("resent to bob")
        .body(String::from("hello"))
        .unwrap();
    // A resend to the one recipient an earlier try deferred: the headers name all three.
    let bob = mail_breaker::Envelope::new(
        Some("app@contoso.com".parse().unwrap()),
        vec!["bob@example.org".parse().unwrap()],
    )
    .unwrap();
    let receipt = pool.send_raw(&bob, &message.formatted()).await.unwrap();
    assert_ne!(receipt.transport(), "graph", "{receipt:?}");
    assert_eq!(graph.request_count(), 0);
    assert_eq!(sink.received(), 1, "{}", sink.log());
}

/// Review of Graph: a direct send waited out the token source's own 30 s (or 120 s), not
/// the transport's timeout, as SMTP's login does.
#[tokio::test]
async fn a_send_whose_token_source_never_answers_ends_at_the_transports_timeout_not_attempted() {
    let tokens = ApiServer::start(|_| Reply::Hang).await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let transport = graph_on(&graph, &tokens).with_timeout(Duration::from_millis(300));
    let answer = tokio::time::timeout(Duration::from_secs(10), transport.send(&to_ann_and_bob()))
        .await
        .expect("an answer within the transport's timeout, not the token source's 30 s");
    let error = answer.unwrap_err();
    assert_eq!(error.code(), "oauth2.timeout", "{error}");
    assert!(error.is_not_attempted(), "{error}");
    assert_eq!(graph.request_count(), 0);
}

/// Review of Graph: a message that kept its own `Bcc:` got a second one, and Exchange may
/// read only one of them.
#[tokio::test]
async fn a_message_with_its_own_bcc_is_sent_with_one_bcc_naming_its_own_and_the_envelopes() {
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let raw = b"From: app@contoso.com\r\nTo: ann@example.org\r\nBcc: dave@example.org\r\nSubject: hi\r\n\r\nhello\r\n";
    let envelope = mail_breaker::Envelope::new(
        Some("app@contoso.com".parse().unwrap()),
        ["ann@example.org", "dave@example.org", "erin@example.org"]
            .iter()
            .map(|to| to.parse().unwrap())
            .collect(),
    )
    .unwrap();
    graph_on(&graph, &tokens)
        .send_raw(&envelope, raw)
        .await
        .unwrap();
    let mime = mime_of(&graph.last());
    let bcc: Vec<&str> = mime
        .lines()
        .filter(|line| line.to_ascii_lowercase().starts_with("bcc:"))
        .collect();
    assert_eq!(bcc.len(), 1, "{mime}");
    let head = mime.split("\r\n\r\n").next().unwrap_or_default();
    for blind in ["dave@example.org", "erin@example.org"] {
        assert!(head.contains(blind), "{blind} in {mime}");
    }
}

/// Review of Graph: a `To:` entry the parser could not read was skipped, so a resend to
/// some recipients passed the envelope check and Graph delivered to everyone named.
#[tokio::test]
async fn a_header_recipient_that_cannot_be_read_makes_the_send_unsupported_and_nothing_is_sent() {
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let envelope = mail_breaker::Envelope::new(
        Some("app@contoso.com".parse().unwrap()),
        vec!["ann@example.org".parse().unwrap()],
    )
    .unwrap();
    for to in [
        "ann@example.org, Bob <bob at example.org>",
        "ann@example.org, just-a-name",
    ] {
        let raw = format!("From: app@contoso.com\r\nTo: {to}\r\nSubject: hi\r\n\r\nhello\r\n");
        let error = graph_on(&graph, &tokens)
            .send_raw(&envelope, raw.as_bytes())
            .await
            .unwrap_err();
        assert_eq!(error.category(), Category::Unsupported, "{to}: {error}");
    }
    assert_eq!(graph.request_count(), 0);
}

/// Review of Graph: a MIME that Graph cannot convert may go through a member that takes
/// MIME as it is.
#[tokio::test]
async fn a_mime_graph_cannot_convert_is_unsupported_so_a_pool_tries_the_next_member() {
    let tokens = token_endpoint().await;
    for code in [
        "ErrorMimeContentConversionFailed",
        "ErrorMimeContentInvalid",
    ] {
        let graph = ApiServer::start(move |_| graph_error(400, code)).await;
        let error = graph_on(&graph, &tokens)
            .send(&to_ann_and_bob())
            .await
            .unwrap_err();
        assert_eq!(error.category(), Category::Unsupported, "{code}");
    }
}

/// Review of Graph: an error left out for holding the token lost `is_about_the_message`,
/// and a pool passed the member over for a refusal of one message.
#[tokio::test]
async fn an_error_left_out_for_holding_the_token_keeps_whether_it_is_about_the_message() {
    let tokens = token_endpoint().await;
    // The token `token-1` with its first letter as a JSON escape: no redaction of the raw
    // body finds it, and the message read from it holds it.
    let graph = ApiServer::start(|_| {
        Reply::json(
            403,
            r#"{"error":{"code":"ErrorSendAsDenied","message":"\u0074oken-1 may not send as it"}}"#,
        )
    })
    .await;
    let error = graph_on(&graph, &tokens)
        .send(&to_ann_and_bob())
        .await
        .unwrap_err();
    assert!(!format!("{error:?}").contains("token-1"), "{error:?}");
    assert!(error.is_about_the_message(), "{error:?}");
}
