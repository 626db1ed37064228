//! `POST /resend`: Svix's HMAC-SHA256 of `id.timestamp.body`, several `v1,` signatures in
//! one header, 5 minutes either way; cross-checked both ways with PyPI's `svix`.

mod webhooks_support;

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use mail_breaker::events::{BounceKind, EventKind, Provider};
use mail_breaker::webhooks::{SvixSecret, Webhooks};
use sha2::Sha256;
use webhooks_support::{Recorder, post, unix_now};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The test's own Svix signer: `v1,` and base64 of HMAC-SHA256 of `id.timestamp.body`.
fn sign(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

fn headers(id: &str, timestamp: u64, signature: String) -> Vec<(&'static str, String)> {
    vec![
        ("svix-id", id.to_owned()),
        ("svix-timestamp", timestamp.to_string()),
        ("svix-signature", signature),
    ]
}

fn router(sink: &std::sync::Arc<Recorder>) -> axum::Router {
    Webhooks::new(sink.clone())
        .resend(SvixSecret::new(SECRET).unwrap())
        .member(Provider::Resend, "resend")
        .router()
}

const BOUNCED: &str = r#"{"type":"email.bounced","created_at":"2024-11-22T23:41:12.126Z","data":{"created_at":"2024-11-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["delivered@resend.dev"],"subject":"Sending this example","bounce":{"message":"The recipient's email address is on the suppression list because it has a recent history of producing hard bounces.","subType":"Suppressed","type":"Permanent"}}}"#;

#[tokio::test]
async fn a_valid_resend_event_is_accepted_and_kept() {
    let sink = Recorder::new();
    let router = router(&sink);
    let now = unix_now();
    let signature = sign(SECRET, "msg_1", now, BOUNCED);
    let (status, body) = post(
        &router,
        "/resend",
        &headers("msg_1", now, signature),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = sink.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_id, "msg_1");
    assert_eq!(events[0].recipient, "delivered@resend.dev");
    assert_eq!(events[0].member.as_deref(), Some("resend"));
    assert_eq!(
        events[0].provider_message_id.as_deref(),
        Some("56761188-7520-42d8-8898-ff6fc54ce618")
    );
}

#[tokio::test]
async fn one_matching_signature_among_several_is_enough() {
    let sink = Recorder::new();
    let router = router(&sink);
    let now = unix_now();
    let old_secret = "whsec_c2VjcmV0LWJlZm9yZS10aGUtcm90YXRpb24=";
    let several = format!(
        "v1,bm90IHRoZSBzaWduYXR1cmU= {} v2,whatever {}",
        sign(old_secret, "msg_2", now, BOUNCED),
        sign(SECRET, "msg_2", now, BOUNCED)
    );
    let (status, body) = post(&router, "/resend", &headers("msg_2", now, several), BOUNCED).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Two signatures that both match (the same secret listed twice while rotating).
    let twice = format!(
        "{} {}",
        sign(SECRET, "msg_2b", now, BOUNCED),
        sign(SECRET, "msg_2b", now, BOUNCED)
    );
    let (status, body) = post(&router, "/resend", &headers("msg_2b", now, twice), BOUNCED).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_forged_resend_event_is_refused_and_keeps_nothing() {
    let sink = Recorder::new();
    let router = router(&sink);
    let now = unix_now();
    let signature = sign(SECRET, "msg_3", now, BOUNCED);
    let other = BOUNCED.replace("delivered@resend.dev", "victim@example.com");
    let cases = [
        (headers("msg_3", now, signature.clone()), other.as_str()),
        (headers("msg_4", now, signature.clone()), BOUNCED),
        (headers("msg_3", now - 1, signature.clone()), BOUNCED),
        (
            headers(
                "msg_3",
                now,
                sign("whsec_b3RoZXIta2V5", "msg_3", now, BOUNCED),
            ),
            BOUNCED,
        ),
        (
            headers("msg_3", now, signature.replace("v1,", "v2,")),
            BOUNCED,
        ),
        (headers("msg_3", now, String::new()), BOUNCED),
        (vec![("svix-id", "msg_3".to_owned())], BOUNCED),
    ];
    for (index, (headers, body)) in cases.into_iter().enumerate() {
        let (status, answer) = post(&router, "/resend", &headers, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "#{index}: {answer}");
    }
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_resend_event_signed_more_than_five_minutes_away_is_refused() {
    let sink = Recorder::new();
    let router = router(&sink);
    let now = unix_now();
    for at in [now - 301, now + 301] {
        let signature = sign(SECRET, "msg_5", at, BOUNCED);
        let (status, body) = post(
            &router,
            "/resend",
            &headers("msg_5", at, signature),
            BOUNCED,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_resent_resend_event_is_answered_2xx_and_counted_once() {
    let sink = Recorder::new();
    let router = router(&sink);
    // Svix signs each attempt afresh, with the same svix-id.
    for delay in [0, 5] {
        let at = unix_now() - delay;
        let signature = sign(SECRET, "msg_6", at, BOUNCED);
        let (status, _) = post(
            &router,
            "/resend",
            &headers("msg_6", at, signature),
            BOUNCED,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(sink.events().len(), 1);
    sink.fail(true);
    let now = unix_now();
    let signature = sign(SECRET, "msg_7", now, BOUNCED);
    let (status, _) = post(
        &router,
        "/resend",
        &headers("msg_7", now, signature),
        BOUNCED,
    )
    .await;
    assert!(
        status.is_server_error(),
        "a sink that fails is 5xx: {status}"
    );
}

#[tokio::test]
async fn the_resend_documented_samples_parse_to_their_kinds() {
    // Facts of the sample payloads of https://resend.com/docs/dashboard/webhooks/event-types
    // (its common data checked against the page; the bounce's and click's objects, and the
    // failed event, are not on the stored copies reached for this check)
    let data = r#""created_at":"2024-11-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["delivered@resend.dev"],"subject":"Sending this example""#;
    let samples = [
        ("email.sent", String::new(), EventKind::Unknown { provider_kind: "email.sent".into() }),
        ("email.delivered", String::new(), EventKind::Delivered),
        ("email.delivery_delayed", String::new(), EventKind::Deferred),
        ("email.complained", String::new(), EventKind::Complained { feedback: None }),
        (
            "email.bounced",
            r#","bounce":{"message":"The recipient's email address is on the suppression list because it has a recent history of producing hard bounces.","subType":"Suppressed","type":"Permanent"}"#.to_owned(),
            EventKind::Bounced { bounce: BounceKind::Permanent, subtype: Some("Suppressed".into()) },
        ),
        // https://resend.com/docs/webhooks/emails/bounced: the type is "e.g., `Permanent`,
        // `Temporary`"; a temporary bounce is a transient one.
        (
            "email.bounced",
            r#","bounce":{"message":"The recipient's mailbox is full.","subType":"MailboxFull","type":"Temporary"}"#.to_owned(),
            EventKind::Bounced { bounce: BounceKind::Transient, subtype: Some("MailboxFull".into()) },
        ),
        // https://resend.com/docs/webhooks/emails/suppressed: Resend refused to send.
        (
            "email.suppressed",
            r#","suppressed":{"message":"This email address is on your account's suppression list.","type":"OnAccountSuppressionList"}"#.to_owned(),
            EventKind::Rejected,
        ),
        ("email.scheduled", String::new(), EventKind::Unknown { provider_kind: "email.scheduled".into() }),
        ("email.opened", String::new(), EventKind::Opened),
        (
            "email.clicked",
            r#","click":{"ipAddress":"122.115.53.11","link":"https://resend.com","timestamp":"2024-11-24T05:00:57.163Z","userAgent":"Mozilla/5.0"}"#.to_owned(),
            EventKind::Clicked,
        ),
        ("email.failed", r#","failed":{"reason":"reached_daily_quota"}"#.to_owned(), EventKind::Rejected),
        ("contact.created", String::new(), EventKind::Unknown { provider_kind: "contact.created".into() }),
    ];
    let sink = Recorder::new();
    let router = router(&sink);
    // Whole bodies as the pages show them (checked against the pages).
    let bodies = [
        // https://resend.com/docs/dashboard/webhooks/event-types: its sample of the delayed
        // delivery names it "email.delivered_delayed", the heading above it
        // "email.delivery_delayed"; both read as deferred.
        (
            r#"{"type":"email.delivered_delayed","created_at":"2024-02-22T23:41:12.126Z","data":{"created_at":"2024-02-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["delivered@resend.dev"],"subject":"Sending this example"}}"#,
            EventKind::Deferred,
        ),
        // https://resend.com/docs/webhooks/emails/delivery-delayed
        (
            r#"{"type":"email.delivery_delayed","created_at":"2024-02-22T23:41:12.126Z","data":{"broadcast_id":"8b146471-e88e-4322-86af-016cd36fd216","created_at":"2024-02-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["delivered@resend.dev"],"subject":"Sending this example","template_id":"43f68331-0622-4e15-8202-246a0388854b","tags":{"category":"confirm_email"}}}"#,
            EventKind::Deferred,
        ),
        // https://resend.com/docs/webhooks/emails/sent
        (
            r#"{"type":"email.sent","created_at":"2024-02-22T23:41:12.126Z","data":{"broadcast_id":"8b146471-e88e-4322-86af-016cd36fd216","created_at":"2024-02-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["delivered@resend.dev"],"subject":"Sending this example","template_id":"43f68331-0622-4e15-8202-246a0388854b","tags":{"category":"confirm_email"}}}"#,
            EventKind::Unknown {
                provider_kind: "email.sent".into(),
            },
        ),
    ];
    for (index, (body, kind)) in bodies.iter().enumerate() {
        let id = format!("msg_page_{index}");
        let now = unix_now();
        let signature = sign(SECRET, &id, now, body);
        let (status, answer) = post(
            &router,
            "/resend",
            &headers(&id, now, signature),
            body.to_string(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "#{index}: {answer}");
        let kept: Vec<_> = sink
            .events()
            .into_iter()
            .filter(|e| e.event_id == id)
            .collect();
        assert_eq!(kept.len(), 1, "#{index}");
        assert_eq!(&kept[0].kind, kind, "#{index}");
        assert_eq!(kept[0].recipient, "delivered@resend.dev", "#{index}");
    }
    for (index, (kind_name, extra, kind)) in samples.iter().enumerate() {
        let body = format!(
            r#"{{"type":"{kind_name}","created_at":"2024-11-22T23:41:12.126Z","data":{{{data}{extra}}}}}"#
        );
        let id = format!("msg_sample_{index}");
        let now = unix_now();
        let signature = sign(SECRET, &id, now, &body);
        let (status, answer) = post(&router, "/resend", &headers(&id, now, signature), body).await;
        assert_eq!(status, StatusCode::OK, "{kind_name}: {answer}");
        let kept: Vec<_> = sink
            .events()
            .into_iter()
            .filter(|e| e.event_id == id)
            .collect();
        assert_eq!(kept.len(), 1, "{kind_name}");
        assert_eq!(&kept[0].kind, kind, "{kind_name}");
    }
}

/// Python: `svix` signs a payload for this receiver, and verifies what this test signed.
const PYTHON: &str = r#"
import json, sys
from datetime import datetime, timezone
from svix.webhooks import Webhook, WebhookVerificationError
given = json.load(sys.stdin)
hook = Webhook(given["secret"])
now = datetime.now(tz=timezone.utc)
signature = hook.sign("msg_from_svix", now, given["payload_to_sign"])
headers = {"svix-id": given["id"], "svix-timestamp": given["timestamp"], "svix-signature": given["signature"]}
def verdict(payload, headers):
    try:
        hook.verify(payload, headers)
        return True
    except WebhookVerificationError:
        return False
print(json.dumps({
    "signature": signature,
    "timestamp": str(int(now.timestamp())),
    "verified": verdict(given["payload"], headers),
    "forged": verdict(given["payload"] + " ", headers),
}))
"#;

#[tokio::test]
async fn svix_and_this_receiver_agree_both_ways() {
    let Some(python) =
        webhooks_support::python_with("svix", "svix_and_this_receiver_agree_both_ways")
    else {
        return;
    };
    let now = unix_now();
    let to_sign = BOUNCED.replace("delivered@resend.dev", "signed-by-svix@example.com");
    let given = serde_json::json!({
        "secret": SECRET,
        "id": "msg_from_test",
        "timestamp": now.to_string(),
        "signature": sign(SECRET, "msg_from_test", now, BOUNCED),
        "payload": BOUNCED,
        "payload_to_sign": to_sign,
    });
    let output = webhooks_support::run(&python, &["-c", PYTHON], &[], &given.to_string());
    let answer: serde_json::Value = serde_json::from_str(output.trim()).unwrap();
    assert_eq!(
        answer["verified"], true,
        "svix on the test's signature: {answer}"
    );
    assert_eq!(answer["forged"], false, "svix on a changed body: {answer}");
    let sink = Recorder::new();
    let router = router(&sink);
    let svix_headers = vec![
        ("svix-id", "msg_from_svix".to_owned()),
        (
            "svix-timestamp",
            answer["timestamp"].as_str().unwrap().to_owned(),
        ),
        (
            "svix-signature",
            answer["signature"].as_str().unwrap().to_owned(),
        ),
    ];
    let (status, body) = post(&router, "/resend", &svix_headers, to_sign.clone()).await;
    assert_eq!(status, StatusCode::OK, "svix's signature here: {body}");
    let (status, _) = post(&router, "/resend", &svix_headers, BOUNCED).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "svix's signature on another body"
    );
    let recipients: Vec<String> = sink.events().into_iter().map(|e| e.recipient).collect();
    assert_eq!(recipients, ["signed-by-svix@example.com"]);
}
