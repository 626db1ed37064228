//! `POST /postmark`: Postmark signs nothing and sends no time; the route's proof is the basic
//! credentials in the webhook's URL, compared in constant time. Also: what every route shares
//! (the body limit, the routes served only when configured).

mod webhooks_support;

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use mail_breaker::events::{BounceKind, EventKind, Provider};
use mail_breaker::webhooks::{BasicAuth, Webhooks};
use webhooks_support::{Recorder, post};

fn router(sink: &std::sync::Arc<Recorder>) -> axum::Router {
    Webhooks::new(sink.clone())
        .postmark(BasicAuth::new("postmark", "s3cret-password"))
        .member(Provider::Postmark, "postmark")
        .router()
}

fn basic(user: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![(
        "authorization",
        format!("Basic {}", STANDARD.encode(format!("{user}:{password}"))),
    )]
}

// Facts of the sample of https://postmarkapp.com/developer/webhooks/bounce-webhook (the
// stored copies of that page reached for this check end before its sample: its fields are
// those of the spam complaint's sample, which was checked, with the bounce's values)
const BOUNCE: &str = r#"{"RecordType":"Bounce","MessageStream":"outbound","ID":4323372036854775807,"Type":"HardBounce","TypeCode":1,"Name":"Hard bounce","Tag":"Test","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483","Metadata":{"a_key":"a_value","b_key":"b_value"},"ServerID":23,"Description":"The server was unable to deliver your message (ex: unknown user, mailbox not found).","Details":"Test bounce details","Email":"john@example.com","From":"sender@example.com","BouncedAt":"2019-11-05T16:33:54.9070259Z","DumpAvailable":true,"Inactive":true,"CanActivate":true,"Subject":"Test subject","Content":"<Full dump of bounce>"}"#;

#[tokio::test]
async fn a_postmark_event_with_the_credentials_is_accepted_and_kept() {
    let sink = Recorder::new();
    let router = router(&sink);
    let (status, body) = post(
        &router,
        "/postmark",
        &basic("postmark", "s3cret-password"),
        BOUNCE,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = sink.events();
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(event.event_id, "4323372036854775807");
    assert_eq!(event.recipient, "john@example.com");
    assert_eq!(event.member.as_deref(), Some("postmark"));
    assert_eq!(
        event.provider_message_id.as_deref(),
        Some("883953f4-6105-42a2-a16a-77a8eac79483")
    );
    assert_eq!(
        event.kind,
        EventKind::Bounced {
            bounce: BounceKind::Permanent,
            subtype: Some("HardBounce".into())
        }
    );
    assert_eq!(
        event.description.as_deref(),
        Some(
            "The server was unable to deliver your message (ex: unknown user, mailbox not found)."
        )
    );
}

#[tokio::test]
async fn a_postmark_event_without_the_credentials_is_refused_and_keeps_nothing() {
    let sink = Recorder::new();
    let router = router(&sink);
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![],
        basic("postmark", "s3cret-passwore"),
        basic("postmark", "s3cret-password "),
        basic("postmarK", "s3cret-password"),
        basic("postmark", ""),
        vec![("authorization", "Bearer s3cret-password".to_owned())],
        vec![("authorization", "Basic not base64!".to_owned())],
        vec![("authorization", "Basic".to_owned())],
    ];
    for (index, headers) in cases.iter().enumerate() {
        let (status, body) = post(&router, "/postmark", headers, BOUNCE).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "#{index}: {body}");
    }
    assert_eq!(sink.events(), vec![]);
    // The scheme's name is case-insensitive, as HTTP says.
    let lower = vec![(
        "authorization",
        format!("basic {}", STANDARD.encode("postmark:s3cret-password")),
    )];
    assert_eq!(
        post(&router, "/postmark", &lower, BOUNCE).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_resent_postmark_event_is_answered_2xx_and_counted_once() {
    let sink = Recorder::new();
    let router = router(&sink);
    let credentials = basic("postmark", "s3cret-password");
    // A delivery carries no record id: it is known by its body, which a resend repeats.
    let delivery = r#"{"RecordType":"Delivery","ServerID":23,"MessageStream":"outbound","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483","Recipient":"john@example.com","Tag":"welcome-email","DeliveredAt":"2019-11-05T16:33:54.9070259Z","Details":"Test delivery webhook details","Metadata":{"a_key":"a_value"}}"#;
    for body in [BOUNCE, BOUNCE, delivery, delivery] {
        let (status, answer) = post(&router, "/postmark", &credentials, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    assert_eq!(sink.events().len(), 2);
    sink.fail(true);
    let other = BOUNCE.replace("4323372036854775807", "42");
    let (status, _) = post(&router, "/postmark", &credentials, other).await;
    assert!(
        status.is_server_error(),
        "a sink that fails is 5xx: {status}"
    );
}

#[tokio::test]
async fn the_postmark_documented_samples_parse_to_their_kinds() {
    let sink = Recorder::new();
    let router = router(&sink);
    let credentials = basic("postmark", "s3cret-password");
    let samples = [
        // https://postmarkapp.com/developer/webhooks/bounce-webhook
        (BOUNCE.to_owned(), "john@example.com", EventKind::Bounced { bounce: BounceKind::Permanent, subtype: Some("HardBounce".into()) }),
        // Not samples of Postmark's: the documented bounce with its Type changed to other
        // types of the bounce API's table (its TypeCode, Name and Description left as they
        // are), for the reading of each type.
        (BOUNCE.replace("\"HardBounce\"", "\"SoftBounce\"").replace("4323372036854775807", "2"), "john@example.com", EventKind::Bounced { bounce: BounceKind::Transient, subtype: Some("SoftBounce".into()) }),
        (BOUNCE.replace("\"HardBounce\"", "\"Transient\"").replace("4323372036854775807", "3"), "john@example.com", EventKind::Deferred),
        // Postmark's own refusals, before any server was asked (its bounce types,
        // https://postmarkapp.com/developer/api/bounce-api#bounce-types).
        (BOUNCE.replace("\"HardBounce\"", "\"ManuallyDeactivated\"").replace("4323372036854775807", "4"), "john@example.com", EventKind::Rejected),
        (BOUNCE.replace("\"HardBounce\"", "\"SMTPApiError\"").replace("4323372036854775807", "5"), "john@example.com", EventKind::Rejected),
        (BOUNCE.replace("\"HardBounce\"", "\"BadEmailAddress\"").replace("4323372036854775807", "6"), "john@example.com", EventKind::Bounced { bounce: BounceKind::Permanent, subtype: Some("BadEmailAddress".into()) }),
        (BOUNCE.replace("\"HardBounce\"", "\"AutoResponder\"").replace("4323372036854775807", "7"), "john@example.com", EventKind::Unknown { provider_kind: "AutoResponder".into() }),
        (BOUNCE.replace("\"HardBounce\"", "\"SomeNewType\"").replace("4323372036854775807", "8"), "john@example.com", EventKind::Bounced { bounce: BounceKind::Undetermined, subtype: Some("SomeNewType".into()) }),
        // https://postmarkapp.com/developer/webhooks/spam-complaint-webhook ("Example JSON
        // webhook data"; its TypeCode is 512 there, though the bounce types say 100001)
        (r#"{"RecordType":"SpamComplaint","MessageStream":"outbound","ID":42,"Type":"SpamComplaint","TypeCode":512,"Name":"Spam complaint","Tag":"Test","MessageID":"00000000-0000-0000-0000-000000000000","Metadata":{"a_key":"a_value","b_key":"b_value"},"ServerID":1234,"Description":"","Details":"Test spam complaint details","Email":"john@example.com","From":"sender@example.com","BouncedAt":"2019-11-05T16:33:54.9070259Z","DumpAvailable":true,"Inactive":true,"CanActivate":false,"Subject":"Test subject","Content":"<Abuse report dump>"}"#.to_owned(), "john@example.com", EventKind::Complained { feedback: None }),
        // https://postmarkapp.com/developer/webhooks/delivery-webhook
        (r#"{"RecordType":"Delivery","ServerID":23,"MessageStream":"outbound","MessageID":"00000000-0000-0000-0000-000000000000","Recipient":"john@example.com","Tag":"welcome-email","DeliveredAt":"2019-11-05T16:33:54.9070259Z","Details":"Test delivery webhook details","Metadata":{"a_key":"a_value","b_key":"b_value"}}"#.to_owned(), "john@example.com", EventKind::Delivered),
        // https://postmarkapp.com/developer/webhooks/spam-complaint-webhook: the page's curl
        // request, "the same JSON format that the Postmark servers will use", has no RecordType.
        (r#"{"ID":43,"Type":"SpamComplaint","TypeCode":512,"Name":"Spam complaint","Tag":"Test","MessageID":"00000000-0000-0000-0000-000000000000","ServerID":1234,"Description":"","Details":"Test spam complaint details","Email":"john@example.com","From":"sender@example.com","BouncedAt":"2018-02-20T12:54:23.3396434-05:00","DumpAvailable":true,"Inactive":true,"CanActivate":false,"Subject":"Test subject"}"#.to_owned(), "john@example.com", EventKind::Complained { feedback: None }),
        // https://postmarkapp.com/support/article/1067-how-do-i-enable-delivery-webhooks
        // ("Example delivery webhook event": no RecordType; the recipient as the page spells it)
        (r#"{"MessageID":"a94dfe84-8ab9-43cf-8a1c-ac234c296e25","Recipient":"recipeint@example.com","Tag":"Your Tag","DeliveredAt":"2016-12-01T15:41:45-05:00","Details":"smtp;250 2.0.0 OK 1480624905 l186si10190883ite.73- gsmtp"}"#.to_owned(), "recipeint@example.com", EventKind::Delivered),
        // https://postmarkapp.com/developer/webhooks/open-tracking-webhook
        (r#"{"RecordType":"Open","MessageStream":"outbound","FirstOpen":true,"Client":{"Name":"Chrome 35.0.1916.153","Company":"Google","Family":"Chrome"},"OS":{"Name":"OS X 10.7 Lion","Company":"Apple Computer, Inc.","Family":"OS X 10"},"Platform":"WebMail","UserAgent":"Mozilla/5.0","ReadSeconds":5,"Geo":{"CountryISOCode":"RS","Country":"Serbia"},"MessageID":"00000000-0000-0000-0000-000000000000","Metadata":{"a_key":"a_value"},"ReceivedAt":"2019-11-05T16:33:54.9070259Z","Tag":"welcome-email","Recipient":"john@example.com"}"#.to_owned(), "john@example.com", EventKind::Opened),
        // https://postmarkapp.com/developer/webhooks/click-webhook
        (r#"{"RecordType":"Click","MessageStream":"outbound","ClickLocation":"HTML","Client":{"Name":"Chrome 35.0.1916.153","Company":"Google","Family":"Chrome"},"OS":{"Name":"OS X 10.7 Lion","Company":"Apple Computer, Inc.","Family":"OS X 10"},"Platform":"Desktop","UserAgent":"Mozilla/5.0","OriginalLink":"https://example.com","Geo":{"CountryISOCode":"RS","Country":"Serbia"},"MessageID":"00000000-0000-0000-0000-000000000000","Metadata":{"a_key":"a_value"},"ReceivedAt":"2019-11-05T16:33:54.9070259Z","Tag":"welcome-email","Recipient":"john@example.com"}"#.to_owned(), "john@example.com", EventKind::Clicked),
        // https://postmarkapp.com/developer/webhooks/subscription-change-webhook ("Example
        // JSON webhook data")
        (r#"{"RecordType":"SubscriptionChange","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483","ServerID":123456,"MessageStream":"outbound","ChangedAt":"2020-02-01T10:53:34.416071Z","Recipient":"bounced-address@wildbit.com","Origin":"Recipient","SuppressSending":true,"SuppressionReason":"HardBounce","Tag":"my-tag","Metadata":{"example":"value","example_2":"value"}}"#.to_owned(), "bounced-address@wildbit.com", EventKind::Unknown { provider_kind: "SubscriptionChange".into() }),
        // The same page's rules, not a sample: "If a recipient unsubscribes, they will be
        // suppressed with the SuppressionReason of ManualSuppression" (Origin Recipient);
        // a suppression by the sender (Origin Customer or Admin, MessageID null) is none;
        // a reactivation has SuppressSending false and SuppressionReason null.
        (r#"{"RecordType":"SubscriptionChange","MessageID":"883953f4-6105-42a2-a16a-77a8eac79484","ServerID":123456,"MessageStream":"outbound","ChangedAt":"2020-02-01T10:53:34.416071Z","Recipient":"unsubscribed@example.com","Origin":"Recipient","SuppressSending":true,"SuppressionReason":"ManualSuppression","Tag":"my-tag","Metadata":{}}"#.to_owned(), "unsubscribed@example.com", EventKind::Unsubscribed),
        (r#"{"RecordType":"SubscriptionChange","MessageID":null,"ServerID":123456,"MessageStream":"outbound","ChangedAt":"2020-02-01T10:53:34.416071Z","Recipient":"suppressed-by-us@example.com","Origin":"Customer","SuppressSending":true,"SuppressionReason":"ManualSuppression","Tag":null,"Metadata":{}}"#.to_owned(), "suppressed-by-us@example.com", EventKind::Unknown { provider_kind: "SubscriptionChange".into() }),
        (r#"{"RecordType":"SubscriptionChange","MessageID":null,"ServerID":123456,"MessageStream":"outbound","ChangedAt":"2020-02-01T10:53:34.416071Z","Recipient":"reactivated@example.com","Origin":"Admin","SuppressSending":false,"SuppressionReason":null,"Tag":null,"Metadata":{}}"#.to_owned(), "reactivated@example.com", EventKind::Unknown { provider_kind: "SubscriptionChange".into() }),
        (r#"{"RecordType":"SomethingNew","Recipient":"john@example.com"}"#.to_owned(), "john@example.com", EventKind::Unknown { provider_kind: "SomethingNew".into() }),
    ];
    for (index, (body, recipient, kind)) in samples.iter().enumerate() {
        let before = sink.events().len();
        let (status, answer) = post(&router, "/postmark", &credentials, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "#{index}: {answer}");
        let events = sink.events();
        assert_eq!(events.len(), before + 1, "#{index}");
        let event = events.last().unwrap();
        assert_eq!(&event.kind, kind, "#{index}");
        assert_eq!(event.recipient, *recipient, "#{index}");
    }
}

#[tokio::test]
async fn a_body_past_the_limit_is_refused_unread() {
    let sink = Recorder::new();
    let router = Webhooks::new(sink.clone())
        .postmark(BasicAuth::new("postmark", "s3cret-password"))
        .body_limit(1024)
        .router();
    let credentials = basic("postmark", "s3cret-password");
    let large = BOUNCE.replace("<Full dump of bounce>", &"x".repeat(2048));
    let (status, _) = post(&router, "/postmark", &credentials, large).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn only_the_configured_providers_have_a_route() {
    let sink = Recorder::new();
    let router = router(&sink);
    for path in ["/ses", "/sendgrid", "/mailgun", "/resend"] {
        let (status, _) = post(&router, path, &[], "{}").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn a_body_that_is_not_the_providers_json_is_refused_after_the_credentials() {
    let sink = Recorder::new();
    let router = router(&sink);
    let credentials = basic("postmark", "s3cret-password");
    for body in ["", "not json", "[1,2]", "\u{0}"] {
        let (status, _) = post(&router, "/postmark", &credentials, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}");
    }
    assert_eq!(sink.events(), vec![]);
}

#[tokio::test]
async fn a_record_without_record_type_reads_as_a_bounce_only_with_both_its_type_and_bounced_at() {
    let sink = Recorder::new();
    let router = router(&sink);
    let credentials = basic("postmark", "s3cret-password");
    let unknown = EventKind::Unknown {
        provider_kind: String::new(),
    };
    for (body, kind) in [
        (
            r#"{"ID":7,"Type":"HardBounce","Email":"a@example.com"}"#,
            &unknown,
        ),
        (
            r#"{"ID":8,"BouncedAt":"2019-11-05T16:33:54Z","Email":"a@example.com"}"#,
            &unknown,
        ),
        (
            r#"{"ID":9,"Type":"HardBounce","BouncedAt":"2019-11-05T16:33:54Z","Email":"a@example.com"}"#,
            &EventKind::Bounced {
                bounce: BounceKind::Permanent,
                subtype: Some("HardBounce".into()),
            },
        ),
    ] {
        let (status, answer) = post(&router, "/postmark", &credentials, body).await;
        assert_eq!(status, StatusCode::OK, "{body}: {answer}");
        assert_eq!(&sink.events().last().unwrap().kind, kind, "{body}");
    }
}
