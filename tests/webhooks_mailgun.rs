//! `POST /mailgun`: HMAC-SHA256 of timestamp and token with the signing key; each token once
//! with one body, within Mailgun's 8-hour retry span.

mod webhooks_support;

use axum::http::StatusCode;
use hmac::{Hmac, Mac};
use mail_breaker::events::{BounceKind, EventKind, Provider};
use mail_breaker::webhooks::{SigningKey, Webhooks};
use serde_json::json;
use sha2::Sha256;
use webhooks_support::{Recorder, post, unix_now};

const KEY: &str = "key-7d1a3b2c9e0f4a5b6c7d8e9f0a1b2c3d";

fn router(sink: &std::sync::Arc<Recorder>) -> axum::Router {
    Webhooks::new(sink.clone())
        .mailgun(SigningKey::new(KEY))
        .member(Provider::Mailgun, "mailgun")
        .router()
}

/// Mailgun's signature block for `token` at `timestamp`, with `key`.
fn signature(key: &str, timestamp: u64, token: &str) -> serde_json::Value {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(format!("{timestamp}{token}").as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    json!({"timestamp": timestamp.to_string(), "token": token, "signature": hex})
}

fn failed(id: &str, recipient: &str) -> serde_json::Value {
    json!({
        "event": "failed", "id": id, "timestamp": 1765000000.25, "severity": "permanent",
        "reason": "bounce", "recipient": recipient,
        "delivery-status": {"code": 550, "message": "5.1.1 The email account that you tried to reach does not exist.", "description": ""},
        "message": {"headers": {"message-id": "20251206.1@mg.example.com"}}
    })
}

fn payload(signature: serde_json::Value, event: serde_json::Value) -> String {
    json!({"signature": signature, "event-data": event}).to_string()
}

const TOKEN: &str = "e0b5477167110d68991efc6b9f89f0a11066af27834600e123";

#[tokio::test]
async fn a_valid_mailgun_event_is_accepted_and_kept() {
    let sink = Recorder::new();
    let router = router(&sink);
    let body = payload(
        signature(KEY, unix_now(), TOKEN),
        failed("ev-1", "b@example.com"),
    );
    let (status, answer) = post(&router, "/mailgun", &[], body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let events = sink.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].recipient, "b@example.com");
    assert_eq!(events[0].event_id, "ev-1");
    assert_eq!(events[0].member.as_deref(), Some("mailgun"));
    assert_eq!(
        events[0].provider_message_id.as_deref(),
        Some("20251206.1@mg.example.com")
    );
    assert_eq!(
        events[0].mta_response.as_deref(),
        Some("550 5.1.1 The email account that you tried to reach does not exist.")
    );
    assert!(events[0].kind.suppresses());
}

#[tokio::test]
async fn a_forged_mailgun_event_is_refused_and_keeps_nothing() {
    let sink = Recorder::new();
    let router = router(&sink);
    let now = unix_now();
    let event = failed("ev-forged", "b@example.com");
    // Another key.
    let body = payload(signature("key-not-ours", now, TOKEN), event.clone());
    assert_eq!(
        post(&router, "/mailgun", &[], body).await.0,
        StatusCode::BAD_REQUEST
    );
    // The signature of another token, or of another time.
    let mut moved = signature(KEY, now, TOKEN);
    moved["token"] = "f0b5477167110d68991efc6b9f89f0a11066af27834600e123".into();
    assert_eq!(
        post(&router, "/mailgun", &[], payload(moved, event.clone()))
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    let mut moved = signature(KEY, now, TOKEN);
    moved["timestamp"] = (now - 1).to_string().into();
    assert_eq!(
        post(&router, "/mailgun", &[], payload(moved, event.clone()))
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    // No signature, a signature that is not hexadecimal, a body that is not JSON.
    let body = json!({"event-data": event}).to_string();
    assert_eq!(
        post(&router, "/mailgun", &[], body).await.0,
        StatusCode::BAD_REQUEST
    );
    let mut garbage = signature(KEY, now, TOKEN);
    garbage["signature"] = "zz".into();
    assert_eq!(
        post(&router, "/mailgun", &[], payload(garbage, event))
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        post(&router, "/mailgun", &[], "token=x&signature=y")
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_mailgun_event_signed_past_the_retry_span_is_refused_and_one_within_it_accepted() {
    let sink = Recorder::new();
    let router = router(&sink);
    let now = unix_now();
    let stale = payload(
        signature(KEY, now - 8 * 3600 - 6 * 60, TOKEN),
        failed("ev-stale", "b@example.com"),
    );
    let (status, answer) = post(&router, "/mailgun", &[], stale).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let ahead = payload(
        signature(KEY, now + 400, "token-ahead"),
        failed("ev-ahead", "b@example.com"),
    );
    assert_eq!(
        post(&router, "/mailgun", &[], ahead).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(sink.events(), vec![]);
    // Mailgun's last retry, 7.5 hours on, may carry the first attempt's signature.
    let retried = payload(
        signature(KEY, now - 7 * 3600 - 30 * 60, "token-retried"),
        failed("ev-retried", "b@example.com"),
    );
    let (status, answer) = post(&router, "/mailgun", &[], retried).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn a_mailgun_token_used_again_with_another_body_is_refused() {
    let sink = Recorder::new();
    let router = router(&sink);
    let captured = signature(KEY, unix_now(), TOKEN);
    let first = payload(captured.clone(), failed("ev-first", "a@example.com"));
    assert_eq!(
        post(&router, "/mailgun", &[], first).await.0,
        StatusCode::OK
    );
    let replayed = payload(captured, failed("ev-replayed", "victim@example.com"));
    let (status, answer) = post(&router, "/mailgun", &[], replayed).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer.contains("token"), "{answer}");
    let recipients: Vec<String> = sink.events().into_iter().map(|e| e.recipient).collect();
    assert_eq!(recipients, ["a@example.com"]);
}

#[tokio::test]
async fn a_resent_mailgun_event_is_answered_2xx_and_counted_once() {
    let sink = Recorder::new();
    let router = router(&sink);
    let body = payload(
        signature(KEY, unix_now(), TOKEN),
        failed("ev-resent", "b@example.com"),
    );
    // The first attempt finds the sink down: 5xx, and Mailgun resends the same body.
    sink.fail(true);
    assert!(
        post(&router, "/mailgun", &[], body.clone())
            .await
            .0
            .is_server_error()
    );
    sink.fail(false);
    for _ in 0..2 {
        let (status, answer) = post(&router, "/mailgun", &[], body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    // Resent with a fresh signature (a new token), the same event id.
    let fresh = payload(
        signature(
            KEY,
            unix_now(),
            "another-token-0000000000000000000000000000000000",
        ),
        failed("ev-resent", "b@example.com"),
    );
    assert_eq!(
        post(&router, "/mailgun", &[], fresh).await.0,
        StatusCode::OK
    );
    assert_eq!(sink.events().len(), 1);
}

#[tokio::test]
async fn the_mailgun_documented_samples_parse_to_their_kinds() {
    // Facts of the samples of Mailgun's events documentation (github.com/mailgun/documentation,
    // source/api-events.rst: "Per Event Result", and the failures query's temporary "No MX");
    // those samples carry no `id`, which a webhook's event-data always does, so each is given
    // one here. The suppress-bounce and rejected ones follow the same page's reasons
    // (`suppress-bounce`, and `reject.reason` of a message Mailgun refused outright).
    let samples = [
        (
            json!({"event":"delivered","id":"doc-delivered","timestamp":1377208314.173742,"recipient":"recipient@example.com","delivery-status":{"message":"","code":0,"description":null},"message":{"headers":{"to":"recipient@example.com","message-id":"20130822215151.29325.59996@samples.mailgun.org","from":"sender@example.com","subject":"Sample Message"}}}),
            "recipient@example.com",
            EventKind::Delivered,
        ),
        (
            json!({"event":"failed","id":"doc-failed","severity":"permanent","reason":"bounce","timestamp":1377198389.769129,"recipient":"recipient@example.com","delivery-status":{"message":"Relay Not Permitted","code":550,"description":null},"message":{"headers":{"message-id":"20130822185902.31528.73196@samples.mailgun.org"}}}),
            "recipient@example.com",
            EventKind::Bounced {
                bounce: BounceKind::Permanent,
                subtype: Some("bounce".into()),
            },
        ),
        (
            json!({"event":"failed","id":"doc-no-mx","severity":"temporary","reason":"generic","timestamp":1376435471.10744,"recipient":"bar@example.com","delivery-status":{"code":498,"message":"No MX for [example.com]","retry-seconds":900,"description":"No MX for [example.com]"}}),
            "bar@example.com",
            EventKind::Deferred,
        ),
        (
            json!({"event":"failed","id":"doc-suppress-bounce","severity":"permanent","reason":"suppress-bounce","timestamp":1521233195.375624,"recipient":"recipient@example.com","delivery-status":{"code":605,"message":"","description":"Not delivering to previously bounced address"}}),
            "recipient@example.com",
            EventKind::Rejected,
        ),
        (
            json!({"event":"rejected","id":"doc-rejected","timestamp":1521233195.375624,"reject":{"reason":"Sandbox subdomains are for test purposes only.","description":""}}),
            "",
            EventKind::Rejected,
        ),
        (
            json!({"event":"opened","id":"doc-opened","timestamp":1377047343.042277,"recipient":"recipient@example.com","ip":"111.111.111.111"}),
            "recipient@example.com",
            EventKind::Opened,
        ),
        (
            json!({"event":"clicked","id":"doc-clicked","timestamp":1377075564.094891,"recipient":"recipient@example.com","url":"http://google.com"}),
            "recipient@example.com",
            EventKind::Clicked,
        ),
        (
            json!({"event":"unsubscribed","id":"doc-unsubscribed","timestamp":1377213791.421473,"recipient":"recipient@example.com","tags":["*"]}),
            "recipient@example.com",
            EventKind::Unsubscribed,
        ),
        (
            json!({"event":"complained","id":"doc-complained","timestamp":1377214260.049634,"recipient":"foo@example.com","message":{"headers":{"to":"foo@example.com","message-id":"20130718032413.263EE2E0926@example.com"}}}),
            "foo@example.com",
            EventKind::Complained { feedback: None },
        ),
        (
            json!({"event":"accepted","id":"doc-accepted","timestamp":1377211256.096436,"recipient":"recipient@example.com","method":"smtp"}),
            "recipient@example.com",
            EventKind::Unknown {
                provider_kind: "accepted".into(),
            },
        ),
    ];
    let sink = Recorder::new();
    let router = router(&sink);
    for (index, (event, recipient, kind)) in samples.iter().enumerate() {
        let token = format!("sample-token-{index:040}");
        let body = payload(signature(KEY, unix_now(), &token), event.clone());
        let (status, answer) = post(&router, "/mailgun", &[], body).await;
        assert_eq!(status, StatusCode::OK, "#{index}: {answer}");
        let id = event["id"].as_str().unwrap();
        let kept: Vec<_> = sink
            .events()
            .into_iter()
            .filter(|e| e.event_id == id)
            .collect();
        assert_eq!(kept.len(), 1, "#{index}");
        assert_eq!(&kept[0].kind, kind, "#{index}");
        assert_eq!(&kept[0].recipient, recipient, "#{index}");
        if *kind == EventKind::Rejected {
            assert!(
                kept[0].description.is_some(),
                "#{index}: why it was refused"
            );
        }
    }
    // https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/webhook-payloads,
    // "Accepted Event" (checked against the page, as far as the stored copy reached: it
    // shows no timestamp before it ends)
    let accepted = json!({"account":{"id":"1234567890303a4bd1f33898"},"api-key-id":"12345678-87654321","domain":{"name":"sample.mailgun.com"},"envelope":{"sender":"sender@sample.mailgun.com","targets":"recipient@sample.mailgun.com","transport":"smtp"},"event":"accepted","flags":{"is-authenticated":true,"is-test-mode":false},"id":"CCXMjJ7nQi2N3BPigGOdgQ","log-level":"info","message":{"headers":{"from":"Sample Sender <sender@sample.mailgun.com>","message-id":"20260203192638.000be97f99f8cea1@sample.mailgun.com","subject":"Sample webhook payload","to":"recipient@sample.mailgun.com"},"size":341},"method":"HTTP","recipient":"recipient@sample.mailgun.com","recipient-domain":"sample.mailgun.com"});
    let token = format!("sample-token-accepted-{:030}", 0);
    let body = payload(signature(KEY, unix_now(), &token), accepted);
    let (status, answer) = post(&router, "/mailgun", &[], body).await;
    assert_eq!(status, StatusCode::OK, "accepted: {answer}");
    let kept: Vec<_> = sink
        .events()
        .into_iter()
        .filter(|e| e.event_id == "CCXMjJ7nQi2N3BPigGOdgQ")
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        kept[0].kind,
        EventKind::Unknown {
            provider_kind: "accepted".into()
        }
    );
    assert_eq!(kept[0].recipient, "recipient@sample.mailgun.com");
    assert_eq!(
        kept[0].provider_message_id.as_deref(),
        Some("20260203192638.000be97f99f8cea1@sample.mailgun.com")
    );
}
