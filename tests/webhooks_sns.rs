//! `POST /ses`: SNS messages signed by the test's own RSA key (versions 1 and 2), its
//! certificate served over HTTPS at `sns.us-east-1.amazonaws.com` resolved to loopback. Each
//! refusal keeps nothing; a resent id is answered 2xx and counted once; npm's
//! `sns-validator` checks that the messages this test signs are what AWS's format says.

mod webhooks_support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use mail_breaker::events::{BounceKind, EventKind, Provider};
use mail_breaker::webhooks::Webhooks;
use webhooks_support::{CERT_PATH, Recorder, SignatureVersion, Sns, TOPIC, post};

const BOUNCE: &str = r#"{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","bounceSubType":"General","bouncedRecipients":[{"emailAddress":"b@example.com","action":"failed","status":"5.1.1","diagnosticCode":"smtp; 550 5.1.1 user unknown"}],"timestamp":"2026-12-07T08:00:00.000Z","feedbackId":"0100-feedback"},"mail":{"timestamp":"2026-12-07T07:59:59.000Z","source":"app@example.org","messageId":"0100-ses-message","destination":["b@example.com"]}}"#;

fn router(sns: &Sns, sink: &Arc<Recorder>, more_topics: &[&str]) -> axum::Router {
    Webhooks::new(sink.clone())
        .ses(sns.policy(more_topics))
        .member(Provider::Ses, "ses-primary")
        .router()
}

async fn accepted_and_kept(version: SignatureVersion, test: &str) {
    let Some(sns) = Sns::start(test).await else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let envelope = sns.notification(version, "msg-accepted", BOUNCE, SystemTime::now());
    let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = sink.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event.recipient, "b@example.com");
    assert_eq!(event.event_id, "msg-accepted");
    assert_eq!(event.member.as_deref(), Some("ses-primary"));
    assert_eq!(
        event.provider_message_id.as_deref(),
        Some("0100-ses-message")
    );
    assert_eq!(
        event.kind,
        EventKind::Bounced {
            bounce: BounceKind::Permanent,
            subtype: Some("General".into())
        }
    );
    assert_eq!(
        event.mta_response.as_deref(),
        Some("smtp; 550 5.1.1 user unknown")
    );
}

#[tokio::test]
async fn a_notification_signed_with_version_1_is_accepted_and_kept() {
    accepted_and_kept(
        SignatureVersion::V1,
        "a_notification_signed_with_version_1_is_accepted_and_kept",
    )
    .await;
}

#[tokio::test]
async fn a_notification_signed_with_version_2_is_accepted_and_kept() {
    accepted_and_kept(
        SignatureVersion::V2,
        "a_notification_signed_with_version_2_is_accepted_and_kept",
    )
    .await;
}

/// Changes one byte of `text` (the one at `at`, to another printable one).
fn one_byte_changed(text: &str, at: usize) -> String {
    let mut bytes = text.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    String::from_utf8(bytes).unwrap()
}

#[tokio::test]
async fn one_changed_byte_in_any_signed_field_is_refused_and_keeps_nothing() {
    let Some(sns) =
        Sns::start("one_changed_byte_in_any_signed_field_is_refused_and_keeps_nothing").await
    else {
        return;
    };
    let sink = Recorder::new();
    // The changed topic is allowed too, so that it is the signature that refuses it.
    let changed_topic = one_byte_changed(TOPIC, TOPIC.len() - 1);
    let router = router(&sns, &sink, &[&changed_topic]);
    for version in [SignatureVersion::V1, SignatureVersion::V2] {
        let signed = sns.notification(version, "msg-changed", BOUNCE, SystemTime::now());
        for field in [
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
            "Signature",
        ] {
            let original = signed[field].as_str().unwrap();
            // A byte the field's reader still accepts: the Timestamp's milliseconds, the
            // topic's last letter, the middle of the others.
            let at = match field {
                "Timestamp" => original.len() - 2,
                "TopicArn" => original.len() - 1,
                "Signature" => 10,
                _ => original.len() / 2,
            };
            let mut forged = signed.clone();
            forged[field] = one_byte_changed(original, at).into();
            let (status, body) = post(&router, "/ses", &[], forged.to_string()).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{version:?} {field}: {body}"
            );
        }
        let mut other_version = signed.clone();
        other_version["SignatureVersion"] = match version {
            SignatureVersion::V1 => "2".into(),
            SignatureVersion::V2 => "1".into(),
        };
        let (status, body) = post(&router, "/ses", &[], other_version.to_string()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{version:?} SignatureVersion: {body}"
        );
        let mut without_subject = signed.clone();
        without_subject.as_object_mut().unwrap().remove("Subject");
        let (status, _) = post(&router, "/ses", &[], without_subject.to_string()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{version:?} Subject removed"
        );
    }
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_certificate_url_on_another_host_is_refused_without_fetching_it() {
    let Some(sns) =
        Sns::start("a_certificate_url_on_another_host_is_refused_without_fetching_it").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    for url in [
        format!("https://sns.us-east-1.amazonaws.com.evil.test{CERT_PATH}"),
        format!("https://s3.amazonaws.com/a-bucket{CERT_PATH}"),
        format!("https://a-bucket.s3.us-east-1.amazonaws.com{CERT_PATH}"),
        format!("http://sns.us-east-1.amazonaws.com{CERT_PATH}"),
        format!(
            "https://sns.us-east-1.amazonaws.com:{}{CERT_PATH}",
            sns.addr.port()
        ),
        format!("https://sns.us-east-1.amazonaws.com{CERT_PATH}?x=1"),
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService.crt".to_owned(),
    ] {
        for version in [SignatureVersion::V1, SignatureVersion::V2] {
            let mut envelope = sns.notification(version, "msg-host", BOUNCE, SystemTime::now());
            envelope["SigningCertURL"] = url.clone().into();
            let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
            assert!(body.contains("certificate URL"), "{url}: {body}");
        }
    }
    assert_eq!(sns.requests(), Vec::<String>::new());
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_redirect_from_the_certificate_url_is_refused_and_not_followed() {
    let Some(sns) =
        Sns::start("a_redirect_from_the_certificate_url_is_refused_and_not_followed").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let mut envelope = sns.notification(
        SignatureVersion::V2,
        "msg-redirect",
        BOUNCE,
        SystemTime::now(),
    );
    envelope["SigningCertURL"] = "https://sns.us-east-1.amazonaws.com/redirect.pem".into();
    let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(sns.requests(), vec!["/redirect.pem".to_owned()]);
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_topic_not_allowed_is_refused_without_fetching_the_certificate() {
    let Some(sns) =
        Sns::start("a_topic_not_allowed_is_refused_without_fetching_the_certificate").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = Webhooks::new(sink.clone())
        .ses(
            mail_breaker::webhooks::SnsPolicy::new()
                .allow_topic("arn:aws:sns:us-east-1:123456789012:another-topic")
                .resolve(webhooks_support::SNS_HOST, sns.addr)
                .trust_root_pem(&sns.ca_pem)
                .unwrap(),
        )
        .router();
    let envelope = sns.notification(SignatureVersion::V2, "msg-topic", BOUNCE, SystemTime::now());
    let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("topic"), "{body}");
    assert_eq!(sns.requests(), Vec::<String>::new());
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_message_two_hours_old_is_refused_and_one_an_hour_old_accepted() {
    let Some(sns) =
        Sns::start("a_message_two_hours_old_is_refused_and_one_an_hour_old_accepted").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let two_hours_ago = SystemTime::now() - Duration::from_secs(2 * 3600);
    let old = sns.notification(SignatureVersion::V2, "msg-old", BOUNCE, two_hours_ago);
    let (status, body) = post(&router, "/ses", &[], old.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("time"), "{body}");
    assert_eq!(sink.events(), vec![]);
    // SNS's last retry of a message keeps its publish time: an hour old is still accepted.
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let retried = sns.notification(SignatureVersion::V2, "msg-retried", BOUNCE, hour_ago);
    let (status, body) = post(&router, "/ses", &[], retried.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_resent_message_id_is_answered_2xx_and_counted_once() {
    let Some(sns) = Sns::start("a_resent_message_id_is_answered_2xx_and_counted_once").await else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let envelope = sns.notification(
        SignatureVersion::V1,
        "msg-resent",
        BOUNCE,
        SystemTime::now(),
    );
    for _ in 0..3 {
        let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(sink.events().len(), 1);
    // The certificate was fetched once: it is cached by its URL.
    assert_eq!(sns.requests(), vec![CERT_PATH.to_owned()]);
}

#[tokio::test]
async fn a_sink_that_fails_is_answered_5xx_so_that_sns_sends_it_again() {
    let Some(sns) =
        Sns::start("a_sink_that_fails_is_answered_5xx_so_that_sns_sends_it_again").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let envelope = sns.notification(SignatureVersion::V2, "msg-sink", BOUNCE, SystemTime::now());
    sink.fail(true);
    let (status, _) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert!(status.is_server_error(), "{status}");
    sink.fail(false);
    let (status, _) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sink.events().len(), 1);
}

#[tokio::test]
async fn a_subscription_for_an_allowed_topic_is_confirmed_at_its_subscribe_url() {
    let Some(sns) =
        Sns::start("a_subscription_for_an_allowed_topic_is_confirmed_at_its_subscribe_url").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    for version in [SignatureVersion::V1, SignatureVersion::V2] {
        let confirmation = sns.confirmation(version, TOPIC);
        let (status, body) = post(&router, "/ses", &[], confirmation.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{version:?}: {body}");
    }
    let confirmations = sns
        .requests()
        .into_iter()
        .filter(|path| path.starts_with("/?Action=ConfirmSubscription"))
        .count();
    assert_eq!(confirmations, 2);
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_subscription_for_a_topic_not_allowed_is_refused_and_never_confirmed() {
    let Some(sns) =
        Sns::start("a_subscription_for_a_topic_not_allowed_is_refused_and_never_confirmed").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let confirmation = sns.confirmation(
        SignatureVersion::V2,
        "arn:aws:sns:us-east-1:999999999999:theirs",
    );
    let (status, body) = post(&router, "/ses", &[], confirmation.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A confirmation whose SubscribeURL leaves SNS is signed but never followed.
    let mut elsewhere = sns.confirmation(SignatureVersion::V2, TOPIC);
    elsewhere["SubscribeURL"] =
        format!("https://evil.test/?Action=ConfirmSubscription&TopicArn={TOPIC}").into();
    sns.sign(&mut elsewhere, SignatureVersion::V2);
    let (status, body) = post(&router, "/ses", &[], elsewhere.to_string()).await;
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status} {body}"
    );
    assert!(
        !sns.requests()
            .iter()
            .any(|path| path.contains("ConfirmSubscription")),
        "{:?}",
        sns.requests()
    );
}

#[tokio::test]
async fn an_unsubscribe_confirmation_is_answered_2xx_and_never_followed() {
    let Some(sns) =
        Sns::start("an_unsubscribe_confirmation_is_answered_2xx_and_never_followed").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let mut unsubscribed = sns.confirmation(SignatureVersion::V2, TOPIC);
    unsubscribed["Type"] = "UnsubscribeConfirmation".into();
    sns.sign(&mut unsubscribed, SignatureVersion::V2);
    let (status, body) = post(&router, "/ses", &[], unsubscribed.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(sns.requests(), vec![CERT_PATH.to_owned()]);
    assert_eq!(sink.events(), vec![]);
    // An SNS type this receiver does not know is refused.
    let mut unknown = sns.confirmation(SignatureVersion::V2, TOPIC);
    unknown["Type"] = "SomethingElse".into();
    sns.sign(&mut unknown, SignatureVersion::V2);
    let (status, _) = post(&router, "/ses", &[], unknown.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn one_ses_notification_for_two_recipients_is_two_events_with_the_sns_message_id() {
    let Some(sns) =
        Sns::start("one_ses_notification_for_two_recipients_is_two_events_with_the_sns_message_id")
            .await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    // Facts of "Bounce notification with a DSN", https://docs.aws.amazon.com/ses/latest/dg/notification-examples.html
    let message = r#"{"notificationType":"Bounce","bounce":{"feedbackId":"000001378603177f-7a5433e7-8edb-42ae-af10-f0181f34d6ee-000000","bounceType":"Permanent","bounceSubType":"General","bouncedRecipients":[{"emailAddress":"jane@example.com","status":"5.0.0","action":"failed","diagnosticCode":"smtp; 550 user unknown"},{"emailAddress":"richard@example.com","status":"5.0.0","action":"failed","diagnosticCode":"smtp; 550 user unknown"}],"timestamp":"2016-01-27T14:59:38.237Z","remoteMtaIp":"127.0.2.0","reportingMTA":"dsn; example.com"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"00000137860315fd-34208509-5b74-41f3-95c5-22c1edc3c924-000000","source":"john@example.com","destination":["jane@example.com","mary@example.com","richard@example.com"]}}"#;
    let envelope = sns.notification(SignatureVersion::V2, "sns-two", message, SystemTime::now());
    let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = sink.events();
    let recipients: Vec<&str> = events.iter().map(|e| e.recipient.as_str()).collect();
    assert_eq!(recipients, ["jane@example.com", "richard@example.com"]);
    for event in &events {
        assert_eq!(event.event_id, "sns-two");
        assert!(event.kind.suppresses(), "{:?}", event.kind);
        assert_eq!(
            event.at,
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_453_906_778_237)
        );
    }
}

#[tokio::test]
async fn the_ses_documented_samples_parse_to_their_kinds_in_both_shapes() {
    let Some(sns) =
        Sns::start("the_ses_documented_samples_parse_to_their_kinds_in_both_shapes").await
    else {
        return;
    };
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    let bounced = |bounce| EventKind::Bounced {
        bounce,
        subtype: Some("General".into()),
    };
    let notifications = "https://docs.aws.amazon.com/ses/latest/dg/notification-examples.html";
    let publishing =
        "https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-examples.html";
    // (source, the sample's facts, the recipient, the kind it reads as)
    let samples: Vec<(&str, &str, &str, EventKind)> = vec![
        // notification-examples.html, "Bounce notification with a DSN" (checked against the
        // page: three destinations, one bounced; the headers left out)
        (
            notifications,
            r#"{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","reportingMTA":"dns; email.example.com","bouncedRecipients":[{"emailAddress":"jane@example.com","status":"5.1.1","action":"failed","diagnosticCode":"smtp; 550 5.1.1 <jane@example.com>... User"}],"bounceSubType":"General","timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa068a-000000","remoteMtaIp":"127.0.2.0"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","source":"john@example.com","sourceArn":"arn:aws:ses:us-east-1:888888888888:identity/example.com","sourceIp":"127.0.3.0","sendingAccountId":"123456789012","callerIdentity":"IAM_user_or_role_name","messageId":"00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000","destination":["jane@example.com","mary@example.com","richard@example.com"],"headersTruncated":false}}"#,
            "jane@example.com",
            bounced(BounceKind::Permanent),
        ),
        (
            notifications,
            r#"{"notificationType":"Complaint","complaint":{"userAgent":"AnyCompany Feedback Loop (V0.01)","complainedRecipients":[{"emailAddress":"richard@example.com"}],"complaintFeedbackType":"abuse","arrivalDate":"2016-01-27T14:59:38.237Z","timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"000001378603177f-18c07c78-fa81-4a58-9dd1-fedc3cb8f49a-000000"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"000001378603177f-7a5433e7-8edb-42ae-af10-f0181f34d6ee-000000","source":"john@example.com","destination":["jane@example.com","mary@example.com","richard@example.com"]}}"#,
            "richard@example.com",
            EventKind::Complained {
                feedback: Some("abuse".into()),
            },
        ),
        (
            notifications,
            r#"{"notificationType":"Delivery","mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"0000014644fe5ef6-9a483358-9170-4cb4-a269-f5dcdf415321-000000","source":"john@example.com","destination":["jane@example.com"]},"delivery":{"timestamp":"2016-01-27T14:59:38.237Z","recipients":["jane@example.com"],"processingTimeMillis":546,"reportingMTA":"a8-70.smtp-out.amazonses.com","smtpResponse":"250 ok:  Message 64111812 accepted","remoteMtaIp":"127.0.2.0"}}"#,
            "jane@example.com",
            EventKind::Delivered,
        ),
        // event-publishing-retrieving-sns-examples.html, "Bounce record" (checked against the
        // page; the headers and tags left out)
        (
            publishing,
            r#"{"eventType":"Bounce","bounce":{"bounceType":"Permanent","bounceSubType":"General","bouncedRecipients":[{"emailAddress":"recipient@example.com","action":"failed","status":"5.1.1","diagnosticCode":"smtp; 550 5.1.1 user unknown"}],"timestamp":"2017-08-05T00:41:02.669Z","feedbackId":"01000157c44f053b-61b59c11-9236-11e6-8f96-7be8aexample-000000","reportingMTA":"dsn; mta.example.com"},"mail":{"timestamp":"2017-08-05T00:40:02.012Z","source":"Sender Name <sender@example.com>","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]}}"#,
            "recipient@example.com",
            bounced(BounceKind::Permanent),
        ),
        (
            publishing,
            r#"{"eventType":"Complaint","complaint":{"complainedRecipients":[{"emailAddress":"recipient@example.com"}],"timestamp":"2017-08-05T00:41:02.669Z","feedbackId":"01000157c44f053b-61b59c11-9236-11e6-8f96-7be8aexample-000000","userAgent":"Mozilla/5.0","complaintFeedbackType":"abuse","arrivalDate":"2017-08-05T00:41:02.669Z"},"mail":{"timestamp":"2017-08-05T00:40:01.123Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]}}"#,
            "recipient@example.com",
            EventKind::Complained {
                feedback: Some("abuse".into()),
            },
        ),
        (
            publishing,
            r#"{"eventType":"Delivery","mail":{"timestamp":"2016-10-19T23:20:52.240Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]},"delivery":{"timestamp":"2016-10-19T23:21:04.133Z","processingTimeMillis":11893,"recipients":["recipient@example.com"],"smtpResponse":"250 2.6.0 Message received","reportingMTA":"mta.example.com"}}"#,
            "recipient@example.com",
            EventKind::Delivered,
        ),
        (
            publishing,
            r#"{"eventType":"Send","mail":{"timestamp":"2016-10-14T05:02:16.645Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]},"send":{}}"#,
            "recipient@example.com",
            EventKind::Unknown {
                provider_kind: "Send".into(),
            },
        ),
        (
            publishing,
            r#"{"eventType":"Reject","mail":{"timestamp":"2016-10-14T17:38:15.211Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["sender@example.com"]},"reject":{"reason":"Bad content"}}"#,
            "sender@example.com",
            EventKind::Rejected,
        ),
        (
            publishing,
            r#"{"eventType":"Open","mail":{"timestamp":"2017-08-09T21:59:49.927Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]},"open":{"ipAddress":"192.0.2.1","timestamp":"2017-08-09T22:00:19.652Z","userAgent":"Mozilla/5.0"}}"#,
            "recipient@example.com",
            EventKind::Opened,
        ),
        (
            publishing,
            r#"{"eventType":"Click","click":{"ipAddress":"192.0.2.1","link":"http://docs.aws.amazon.com/ses/latest/DeveloperGuide/send-email-smtp.html","linkTags":{"samplekey0":["samplevalue0"]},"timestamp":"2017-08-09T23:51:25.570Z","userAgent":"Mozilla/5.0"},"mail":{"timestamp":"2017-08-09T23:50:05.795Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]}}"#,
            "recipient@example.com",
            EventKind::Clicked,
        ),
        (
            publishing,
            r#"{"eventType":"Rendering Failure","mail":{"timestamp":"2018-01-22T18:43:06.197Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]},"failure":{"errorMessage":"Attribute 'attributeName' is not present in the rendering data.","templateName":"MyTemplate"}}"#,
            "recipient@example.com",
            EventKind::Rejected,
        ),
        (
            publishing,
            r#"{"eventType":"DeliveryDelay","mail":{"timestamp":"2020-06-16T00:15:40.641Z","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]},"deliveryDelay":{"timestamp":"2020-06-16T00:25:40.095Z","delayType":"TransientCommunicationFailure","expirationTime":"2020-06-16T00:25:40.914Z","delayedRecipients":[{"emailAddress":"recipient@example.com","status":"4.4.1","diagnosticCode":"smtp; 421 4.4.1 Unable to connect to remote host"}]}}"#,
            "recipient@example.com",
            EventKind::Deferred,
        ),
        (
            publishing,
            r#"{"eventType":"Subscription","mail":{"timestamp":"2022-01-12T01:00:14.340Z","messageId":"EXAMPLEe4bccb684-777bc8de-afa7-4970-92b0-f515137b1497-000000","destination":["recipient@example.com"]},"subscription":{"contactList":"ContactListName","timestamp":"2022-01-12T01:00:17.910Z","source":"UnsubscribeHeader","newTopicPreferences":{"unsubscribeAll":true},"oldTopicPreferences":{"unsubscribeAll":false}}}"#,
            "recipient@example.com",
            EventKind::Unsubscribed,
        ),
        // notification-examples.html, "Complaint notification without a feedback report"
        (
            notifications,
            r#"{"notificationType":"Complaint","complaint":{"userAgent":"AnyCompany Feedback Loop (V0.01)","complainedRecipients":[{"emailAddress":"richard@example.com"}],"timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"0000013786031775-fea503bc-7497-49e1-881b-a0379bb037d3-000000"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"0000013786031775-163e3910-53eb-4c8e-a04a-f29debf88a84-000000","source":"john@example.com","destination":["jane@example.com","mary@example.com","richard@example.com"]}}"#,
            "richard@example.com",
            EventKind::Complained { feedback: None },
        ),
        // Opting into topic B while topic A stays opted out is no unsubscribe: only what
        // changed from the old preferences counts.
        (
            publishing,
            r#"{"eventType":"Subscription","mail":{"timestamp":"2022-01-12T01:00:14.340Z","messageId":"EXAMPLEe4bccb684-777bc8de-afa7-4970-92b0-f515137b1497-000000","destination":["recipient@example.com"]},"subscription":{"contactList":"ContactListName","timestamp":"2022-01-12T01:00:17.910Z","source":"UnsubscribeHeader","newTopicPreferences":{"unsubscribeAll":false,"topicSubscriptionStatus":[{"topicName":"A","subscriptionStatus":"OptOut"},{"topicName":"B","subscriptionStatus":"OptIn"}]},"oldTopicPreferences":{"unsubscribeAll":false,"topicSubscriptionStatus":[{"topicName":"A","subscriptionStatus":"OptOut"},{"topicName":"B","subscriptionStatus":"OptOut"}]}}}"#,
            "recipient@example.com",
            EventKind::Unknown {
                provider_kind: "Subscription".into(),
            },
        ),
        // A recipient's subscribe again (the same record with the preference turned back on)
        // is no unsubscribe.
        (
            publishing,
            r#"{"eventType":"Subscription","mail":{"timestamp":"2022-01-12T01:00:14.340Z","messageId":"EXAMPLEe4bccb684-777bc8de-afa7-4970-92b0-f515137b1497-000000","destination":["recipient@example.com"]},"subscription":{"contactList":"ContactListName","timestamp":"2022-01-12T01:00:17.910Z","source":"UnsubscribeHeader","newTopicPreferences":{"unsubscribeAll":false,"topicSubscriptionStatus":[{"topicName":"ExampleTopicName","subscriptionStatus":"OptIn"}]},"oldTopicPreferences":{"unsubscribeAll":true}}}"#,
            "recipient@example.com",
            EventKind::Unknown {
                provider_kind: "Subscription".into(),
            },
        ),
    ];
    for (index, (source, message, recipient, kind)) in samples.iter().enumerate() {
        let id = format!("sample-{index}");
        let envelope = sns.notification(SignatureVersion::V2, &id, message, SystemTime::now());
        let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{source} #{index}: {body}");
        let events: Vec<_> = sink
            .events()
            .into_iter()
            .filter(|e| e.event_id == id)
            .collect();
        assert_eq!(events.len(), 1, "{source} #{index}: {events:?}");
        assert_eq!(&events[0].recipient, recipient, "{source} #{index}");
        assert_eq!(&events[0].kind, kind, "{source} #{index}");
    }
    // notification-examples.html, "Bounce notification without a DSN": one notification
    // for two recipients is an event for each.
    let without_dsn = r#"{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","bounceSubType":"General","bouncedRecipients":[{"emailAddress":"jane@example.com"},{"emailAddress":"richard@example.com"}],"timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"00000137860315fd-869464a4-8680-4114-98d3-716fe35851f9-000000","remoteMtaIp":"127.0.2.0"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"00000137860315fd-34208509-5b74-41f3-95c5-22c1edc3c924-000000","source":"john@example.com","destination":["jane@example.com","mary@example.com","richard@example.com"]}}"#;
    let envelope = sns.notification(SignatureVersion::V1, "two", without_dsn, SystemTime::now());
    let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let bounced_two: Vec<(String, EventKind)> = sink
        .events()
        .into_iter()
        .filter(|e| e.event_id == "two")
        .map(|e| (e.recipient, e.kind))
        .collect();
    assert_eq!(
        bounced_two,
        [
            (
                "jane@example.com".to_owned(),
                bounced(BounceKind::Permanent)
            ),
            (
                "richard@example.com".to_owned(),
                bounced(BounceKind::Permanent)
            ),
        ]
    );
    // What SES sends when a topic is first set up, and a message from a topic's console,
    // are kept as unknown, never an error.
    for (index, message) in [
        r#"{"notificationType":"AmazonSnsSubscriptionSucceeded","message":"You have successfully subscribed your Amazon SNS topic to receive 'Bounce' notifications from Amazon SES for identity 'example.com'."}"#,
        "hello from the SNS console",
    ]
    .iter()
    .enumerate()
    {
        let id = format!("unknown-{index}");
        let envelope = sns.notification(SignatureVersion::V1, &id, message, SystemTime::now());
        let (status, body) = post(&router, "/ses", &[], envelope.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let events: Vec<_> = sink.events().into_iter().filter(|e| e.event_id == id).collect();
        assert!(matches!(events[0].kind, EventKind::Unknown { .. }), "{events:?}");
    }
}

/// npm's `sns-validator`, run by node, with its HTTPS fetch pointed at the test's server
/// (its host check still reads the URL's host; the TLS check the server's name).
const SNS_VALIDATOR: &str = r#"
const https = require('https');
const fs = require('fs');
const ca = fs.readFileSync(process.env.SNS_CA);
const get = https.get;
https.get = function (target, callback) {
  const url = new URL(target);
  return get({ host: '127.0.0.1', port: Number(process.env.SNS_PORT), servername: url.hostname,
               path: url.pathname, ca, headers: { host: url.hostname } }, callback);
};
const MessageValidator = require('sns-validator');
const validator = new MessageValidator();
const messages = JSON.parse(fs.readFileSync(0, 'utf8'));
const results = [];
let pending = messages.length;
messages.forEach((message, i) => validator.validate(message, (error) => {
  results[i] = error ? 'refused: ' + error.message : 'valid';
  if (--pending === 0) console.log(JSON.stringify(results));
}));
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sns_validator_and_this_receiver_agree_on_messages_signed_with_versions_1_and_2() {
    let test = "sns_validator_and_this_receiver_agree_on_messages_signed_with_versions_1_and_2";
    let Some(node_modules) = webhooks_support::node_with("sns-validator", test) else {
        return;
    };
    let Some(sns) = Sns::start(test).await else {
        return;
    };
    let v1 = sns.notification(SignatureVersion::V1, "cross-v1", BOUNCE, SystemTime::now());
    let v2 = sns.notification(SignatureVersion::V2, "cross-v2", BOUNCE, SystemTime::now());
    let mut forged = v2.clone();
    forged["Message"] = BOUNCE.replace("b@example.com", "c@example.com").into();
    let messages = serde_json::json!([v1, v2, forged]).to_string();
    let port = sns.addr.port().to_string();
    let ca = sns.ca_path();
    let node_path = node_modules.display().to_string();
    let verdicts = tokio::task::spawn_blocking(move || {
        webhooks_support::run(
            std::path::Path::new("node"),
            &["-e", SNS_VALIDATOR],
            &[
                ("NODE_PATH", node_path.as_str()),
                ("SNS_PORT", port.as_str()),
                ("SNS_CA", ca.to_str().unwrap()),
            ],
            &messages,
        )
    })
    .await
    .unwrap();
    let verdicts: Vec<String> = serde_json::from_str(verdicts.trim()).unwrap();
    assert_eq!(
        verdicts[0], "valid",
        "sns-validator on version 1: {verdicts:?}"
    );
    assert_eq!(
        verdicts[1], "valid",
        "sns-validator on version 2: {verdicts:?}"
    );
    assert!(
        verdicts[2].starts_with("refused"),
        "sns-validator on a forged one: {verdicts:?}"
    );
    let sink = Recorder::new();
    let router = router(&sns, &sink, &[]);
    for (message, expected) in [
        (&v1, StatusCode::OK),
        (&v2, StatusCode::OK),
        (&forged, StatusCode::BAD_REQUEST),
    ] {
        let (status, body) = post(&router, "/ses", &[], message.to_string()).await;
        assert_eq!(status, expected, "{body}");
    }
    assert_eq!(sink.events().len(), 2);
}

#[tokio::test]
async fn a_certificate_that_cannot_be_fetched_for_now_is_answered_5xx_so_that_sns_sends_it_again() {
    // SNS takes any answer below 500 as delivered and never resends it: a bounce refused
    // because this process could not reach AWS for a moment would be lost for good.
    let Some(sns) = Sns::start(
        "a_certificate_that_cannot_be_fetched_for_now_is_answered_5xx_so_that_sns_sends_it_again",
    )
    .await
    else {
        return;
    };
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let sink = Recorder::new();
    let unreachable = Webhooks::new(sink.clone())
        .ses(
            mail_breaker::webhooks::SnsPolicy::new()
                .allow_topic(TOPIC)
                .resolve(webhooks_support::SNS_HOST, closed)
                .trust_root_pem(&sns.ca_pem)
                .unwrap()
                .fetch_timeout(Duration::from_secs(2)),
        )
        .router();
    let envelope = sns.notification(
        SignatureVersion::V2,
        "msg-unreachable",
        BOUNCE,
        SystemTime::now(),
    );
    let (status, body) = post(&unreachable, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(sink.events(), vec![]);
    // Once AWS answers, the resend is kept.
    let reachable = router(&sns, &sink, &[]);
    let (status, body) = post(&reachable, "/ses", &[], envelope.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(sink.events().len(), 1);
}
