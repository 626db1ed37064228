//! The webhook receivers from a DSN or a TOML document (`webhooks.*`), every key checked as
//! all others are, and the mailer's event sink that feeds both the suppression list and the
//! members' reputation breakers (issue 64).
#![cfg(all(feature = "webhooks", feature = "config", feature = "resend"))]

mod webhooks_support;

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use mail_breaker::Mailer;
use mail_breaker::events::EventSink;
use mail_breaker::suppression::Reason;
use sha2::Sha256;
use webhooks_support::{post, unix_now};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SENDGRID_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEoXZGLUkUBNjO4SgueBMruW5ymXPOYI2xr1RxNB+2dQUbxfWne2h02vz0c2/O05uW4gaM1AWTtAkDq2yP4cJFMA==";

/// A permanent bounce for `gone@example.org`, as Resend posts it.
const BOUNCED: &str = r#"{"type":"email.bounced","created_at":"2024-11-22T23:41:12.126Z","data":{"created_at":"2024-11-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["gone@example.org"],"subject":"Hello","bounce":{"message":"Hard bounce","subType":"General","type":"Permanent"}}}"#;

/// Svix's headers for `body` under `id`, signed now with `secret`.
fn signed(secret: &str, id: &str, body: &str) -> Vec<(&'static str, String)> {
    let now = unix_now();
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{now}.{body}").as_bytes());
    let signature = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    vec![
        ("svix-id", id.to_owned()),
        ("svix-timestamp", now.to_string()),
        ("svix-signature", signature),
    ]
}

/// A folder for the test's outbox, removed with it.
fn folder() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mail-breaker-config-webhooks-")
        .tempdir()
        .unwrap()
}

/// A Resend member named `resend` with a reputation breaker, the suppression list in an
/// outbox in `dir`, and `more` options.
fn dsn(dir: &tempfile::TempDir, more: &str) -> String {
    format!(
        "resend://re_key@default?name=resend&reputation.failover=false\
         &outbox=sqlite://{}/outbox.db&suppression=true{more}",
        dir.path().display()
    )
}

#[tokio::test]
async fn webhook_keys_in_a_dsn_serve_the_routes_they_name_and_no_other() {
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(&dir, &format!("&webhooks.resend.secret={SECRET}")))
        .unwrap()
        .build()
        .await
        .unwrap();
    let router = mailer.webhooks().expect("webhooks configured").router();
    let (status, body) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_1", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = post(&router, "/sendgrid", &[], "[]").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no SendGrid key, no route");
}

#[tokio::test]
async fn a_mailer_without_a_webhooks_table_has_no_receivers() {
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(&dir, ""))
        .unwrap()
        .build()
        .await
        .unwrap();
    assert!(mailer.webhooks().is_none());
}

#[tokio::test]
async fn webhook_keys_in_toml_read_as_the_dsn_reads_them() {
    let dir = folder();
    let toml = format!(
        r#"
        [[member]]
        url = "resend://re_key@default"
        name = "resend"
        reputation = {{ failover = false }}

        [outbox]
        url = "sqlite://{}/outbox.db"

        [suppression]
        store = "outbox"

        [webhooks]
        body_limit = 65536
        resend = {{ secret = "{SECRET}" }}
        sendgrid = {{ public_key = "{SENDGRID_KEY}", member = "resend" }}
        postmark = {{ user = "postmark", password = "a long random password" }}
        mailgun = {{ signing_key = "key-from-the-dashboard" }}
        ses = {{ topics = ["arn:aws:sns:us-east-1:123456789012:ses-events"] }}
        "#,
        dir.path().display()
    );
    let mailer = Mailer::from_toml(&toml).unwrap().build().await.unwrap();
    let router = mailer.webhooks().expect("webhooks configured").router();
    let (status, body) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_2", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for route in ["/sendgrid", "/postmark", "/mailgun", "/ses"] {
        let (status, _) = post(&router, route, &[], "{}").await;
        assert_ne!(status, StatusCode::NOT_FOUND, "{route} is served");
    }
    let big = "x".repeat(65_537);
    let (status, _) = post(&router, "/resend", &signed(SECRET, "msg_3", &big), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_signed_event_feeds_both_the_suppression_list_and_the_members_reputation_breaker() {
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(&dir, &format!("&webhooks.resend.secret={SECRET}")))
        .unwrap()
        .build()
        .await
        .unwrap();
    let router = mailer.webhooks().unwrap().router();
    let (status, _) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_4", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let list = mailer.suppression().expect("a list");
    let entry = list
        .get("gone@example.org")
        .await
        .unwrap()
        .expect("suppressed");
    assert_eq!(entry.reason, Reason::Bounced);
    let breaker = mailer.reputation("resend").expect("a breaker");
    let standing = breaker.standing().await.unwrap();
    assert_eq!(
        standing.window.hard_bounces, 1,
        "the one resend member is the events' member by default"
    );
}

#[tokio::test]
async fn a_resent_event_id_changes_neither_the_list_nor_the_breaker() {
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(&dir, &format!("&webhooks.resend.secret={SECRET}")))
        .unwrap()
        .build()
        .await
        .unwrap();
    let router = mailer.webhooks().unwrap().router();
    for _ in 0..3 {
        let (status, _) = post(
            &router,
            "/resend",
            &signed(SECRET, "msg_5", BOUNCED),
            BOUNCED,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "a resent event is answered 2xx");
    }
    let list = mailer.suppression().unwrap();
    list.remove("gone@example.org").await.unwrap();
    let (status, _) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_5", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !list.contains("gone@example.org").await.unwrap(),
        "the id was kept: the resent event does not suppress again"
    );
    let standing = mailer
        .reputation("resend")
        .unwrap()
        .standing()
        .await
        .unwrap();
    assert_eq!(standing.window.hard_bounces, 1, "counted once");
}

#[tokio::test]
async fn the_mailers_event_sink_counts_an_event_new_once() {
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(&dir, ""))
        .unwrap()
        .build()
        .await
        .unwrap();
    let sink = mailer.event_sink().expect("a list and a breaker to feed");
    let mut event = mail_breaker::events::DeliveryEvent::new(
        mail_breaker::events::Provider::Resend,
        "msg_6",
        mail_breaker::events::EventKind::Complained { feedback: None },
        "angry@example.org",
        std::time::SystemTime::now(),
    );
    event.member = Some("resend".into());
    assert_eq!(
        sink.keep(std::slice::from_ref(&event)).await.unwrap().new,
        1
    );
    assert_eq!(sink.keep(&[event]).await.unwrap().new, 0);
    let standing = mailer
        .reputation("resend")
        .unwrap()
        .standing()
        .await
        .unwrap();
    assert_eq!(standing.window.complaints, 1);
}

#[tokio::test]
async fn a_webhook_secret_is_read_from_the_environment() {
    // SAFETY: no other test of this binary reads or writes this variable.
    unsafe { std::env::set_var("MAIL_BREAKER_CONFIG_WEBHOOKS_SECRET", SECRET) };
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(
        &dir,
        "&webhooks.resend.secret=${MAIL_BREAKER_CONFIG_WEBHOOKS_SECRET}",
    ))
    .unwrap()
    .build()
    .await
    .unwrap();
    let router = mailer.webhooks().unwrap().router();
    let (status, body) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_7", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn the_member_named_for_a_providers_events_is_the_one_whose_breaker_counts_them() {
    let dir = folder();
    let dsn = format!(
        "failover(resend://re_key@default?name=resend&reputation.failover=false \
                  smtp://127.0.0.1:25?name=relay&reputation.failover=false)\
         ?outbox=sqlite://{}/outbox.db&suppression=true\
         &webhooks.resend.secret={SECRET}&webhooks.resend.member=relay",
        dir.path().display()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let router = mailer.webhooks().unwrap().router();
    let (status, _) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_8", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let relay = mailer
        .reputation("relay")
        .unwrap()
        .standing()
        .await
        .unwrap();
    let resend = mailer
        .reputation("resend")
        .unwrap()
        .standing()
        .await
        .unwrap();
    assert_eq!(
        (relay.window.hard_bounces, resend.window.hard_bounces),
        (1, 0)
    );
}

#[tokio::test]
async fn a_member_named_that_the_stack_does_not_have_is_an_error_naming_the_key() {
    let dir = folder();
    let error = Mailer::from_dsn(&dsn(
        &dir,
        &format!("&webhooks.resend.secret={SECRET}&webhooks.resend.member=nope"),
    ))
    .unwrap()
    .build()
    .await
    .unwrap_err();
    assert_eq!(error.setting(), "webhooks.resend.member");
    assert!(error.reason().contains("nope"), "{error}");
}

#[test]
fn two_members_of_a_providers_kind_need_the_member_named() {
    let error = Mailer::from_dsn(&format!(
        "failover(resend://a@default?name=a resend://b@default?name=b)\
         ?outbox=sqlite:///tmp/o.db&suppression=true&webhooks.resend.secret={SECRET}"
    ))
    .unwrap_err();
    assert_eq!(error.setting(), "webhooks.resend.member");
}

#[test]
fn an_unknown_webhooks_key_is_an_error_naming_it() {
    let base = "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true";
    let error = Mailer::from_dsn(&format!("{base}&webhooks.resend.secrett=x")).unwrap_err();
    assert_eq!(error.setting(), "webhooks.resend.secrett");
    let error = Mailer::from_dsn(&format!("{base}&webhooks.sns.topics=x")).unwrap_err();
    assert_eq!(error.setting(), "webhooks.sns");
}

#[test]
fn each_bad_webhook_value_is_an_error_naming_its_key_and_never_showing_it() {
    let base = "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true";
    let cases = [
        (
            "webhooks.sendgrid.public_key=c2VjcmV0LW5vdC1hLWtleQ==",
            "webhooks.sendgrid.public_key",
            "c2VjcmV0LW5vdC1hLWtleQ",
        ),
        (
            "webhooks.resend.secret=whsec_not!base64secret",
            "webhooks.resend.secret",
            "not!base64secret",
        ),
        (
            "webhooks.postmark.user=pm&webhooks.postmark.password=short-pw",
            "webhooks.postmark.password",
            "short-pw",
        ),
        (
            "webhooks.postmark.user=pm",
            "webhooks.postmark.password",
            "~",
        ),
        (
            "webhooks.postmark.user=p:m&webhooks.postmark.password=a%20long%20random%20password",
            "webhooks.postmark.user",
            "random",
        ),
        (
            "webhooks.mailgun.signing_key=",
            "webhooks.mailgun.signing_key",
            "~",
        ),
        ("webhooks.ses.topics=not-an-arn", "webhooks.ses.topics", "~"),
        ("webhooks.ses.topics=", "webhooks.ses.topics", "~"),
        ("webhooks.body_limit=0", "webhooks.body_limit", "~"),
        ("webhooks.body_limit=lots", "webhooks.body_limit", "~"),
        ("webhooks.body_limit=1073741824", "webhooks.body_limit", "~"),
        (
            "webhooks.resend.secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw&webhooks.resend.member=",
            "webhooks.resend.member",
            "MfKQ9r8",
        ),
    ];
    for (option, setting, secret) in cases {
        let error = Mailer::from_dsn(&format!("{base}&{option}")).unwrap_err();
        assert_eq!(error.setting(), setting, "{option}");
        assert!(!error.to_string().contains(secret), "{option}: {error}");
    }
}

/// Hostile review of issue 64: a provider's secret written where its table belongs
/// (`resend = "whsec_..."`) is refused without being shown, as every webhooks value is.
#[test]
fn a_secret_written_in_place_of_a_providers_table_is_refused_without_being_shown() {
    for provider in ["resend", "mailgun", "sendgrid", "postmark", "ses"] {
        let toml = format!(
            "[[member]]\nurl = \"smtp://relay.example.com\"\n\n[outbox]\nurl = \"sqlite:///tmp/o.db\"\n\n\
             [suppression]\n\n[webhooks]\n{provider} = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
        );
        let error = Mailer::from_toml(&toml).unwrap_err();
        assert_eq!(error.setting(), format!("webhooks.{provider}"));
        assert!(
            !error.to_string().contains("MfKQ9r8"),
            "{provider}: {error}"
        );
    }
}

#[test]
fn a_webhooks_table_naming_no_provider_is_refused() {
    let error = Mailer::from_dsn(
        "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true&webhooks.body_limit=4096",
    )
    .unwrap_err();
    assert_eq!(error.setting(), "webhooks");
}

#[test]
fn receivers_with_nowhere_to_keep_events_are_refused() {
    let error = Mailer::from_dsn(&format!(
        "smtp://relay.example.com?webhooks.resend.secret={SECRET}"
    ))
    .unwrap_err();
    assert_eq!(error.setting(), "webhooks");
    assert!(error.reason().contains("suppression"), "{error}");
}

#[tokio::test]
async fn no_webhook_secret_shows_in_debug() {
    let dir = folder();
    let dsn = dsn(
        &dir,
        &format!(
            "&webhooks.resend.secret={SECRET}&webhooks.mailgun.signing_key=key-mailgun-secret\
             &webhooks.postmark.user=pm&webhooks.postmark.password=postmark-password-secret"
        ),
    );
    let config = Mailer::from_dsn(&dsn).unwrap();
    let shown = format!("{config:?}");
    let mailer = config.build().await.unwrap();
    let shown = format!("{shown} {mailer:?} {:?}", mailer.webhooks().unwrap());
    for secret in [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "key-mailgun-secret",
        "postmark-password-secret",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(
        shown.contains("webhooks"),
        "the table is shown, its secrets starred: {shown}"
    );
}

#[test]
fn a_postmark_password_has_at_least_12_characters() {
    let base = "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true\
                &webhooks.postmark.user=postmark";
    let error =
        Mailer::from_dsn(&format!("{base}&webhooks.postmark.password=elevenchars")).unwrap_err();
    assert_eq!(error.setting(), "webhooks.postmark.password");
    assert!(Mailer::from_dsn(&format!("{base}&webhooks.postmark.password=twelve-chars")).is_ok());
    let error = Mailer::from_dsn(&format!(
        "{base}&webhooks.postmark.user=&webhooks.postmark.password=twelve-chars"
    ))
    .unwrap_err();
    assert_eq!(error.setting(), "webhooks.postmark.user", "an empty user");
}

#[test]
fn an_ses_topic_is_an_sns_topics_whole_arn() {
    let base = "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true";
    let read = |topics: &str| Mailer::from_dsn(&format!("{base}&webhooks.ses.topics={topics}"));
    assert!(read("arn:aws:sns:us-east-1:123456789012:ses-events").is_ok());
    assert!(
        read("arn:aws:sns:us-east-1:123456789012:a,arn:aws-cn:sns:cn-north-1:123456789012:b")
            .is_ok(),
        "several, separated by commas"
    );
    for refused in [
        "arn:aws:sqs:us-east-1:123456789012:queue",
        "xrn:aws:sns:us-east-1:123456789012:ses",
        "arn:aws:sns:us-east-1:123456789012:",
        "arn:aws:sns:us-east-1:123456789012",
        "arn:aws:sns:us-east-1:123456789012:ses:extra",
        "arn::sns:us-east-1:123456789012:ses",
        "arn:aws:sns:us-east-1:123456789012:ok,not-an-arn",
    ] {
        let error = read(refused).unwrap_err();
        assert_eq!(error.setting(), "webhooks.ses.topics", "{refused}");
    }
}

#[test]
fn receivers_keep_events_in_a_suppression_list_alone_or_in_reputation_breakers_alone() {
    let list_only = format!(
        "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true\
         &webhooks.resend.secret={SECRET}"
    );
    assert!(Mailer::from_dsn(&list_only).is_ok());
    let breakers_only = format!(
        "smtp://relay.example.com?name=relay&reputation.failover=false\
         &webhooks.resend.secret={SECRET}&webhooks.resend.member=relay"
    );
    assert!(Mailer::from_dsn(&breakers_only).is_ok());
}

#[tokio::test]
async fn without_a_member_of_the_providers_kind_its_events_feed_the_list_and_no_breaker() {
    let dir = folder();
    let dsn = format!(
        "smtp://127.0.0.1:25?name=relay&reputation.failover=false\
         &outbox=sqlite://{}/outbox.db&suppression=true&webhooks.resend.secret={SECRET}",
        dir.path().display()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let router = mailer.webhooks().unwrap().router();
    let (status, _) = post(
        &router,
        "/resend",
        &signed(SECRET, "msg_9", BOUNCED),
        BOUNCED,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        mailer
            .suppression()
            .unwrap()
            .contains("gone@example.org")
            .await
            .unwrap()
    );
    let relay = mailer
        .reputation("relay")
        .unwrap()
        .standing()
        .await
        .unwrap();
    assert_eq!(relay.window.hard_bounces, 0, "the events name no member");
}

#[tokio::test]
async fn the_mailers_event_sink_shows_what_it_feeds_in_debug() {
    let dir = folder();
    let mailer = Mailer::from_dsn(&dsn(&dir, ""))
        .unwrap()
        .build()
        .await
        .unwrap();
    let shown = format!("{:?}", mailer.event_sink().unwrap());
    assert!(
        shown.contains("MailerEvents") && shown.contains("\"resend\""),
        "{shown}"
    );
    assert!(shown.contains("SuppressionList"), "{shown}");
}

#[test]
fn the_body_limit_is_from_1_kib_to_64_mib() {
    let base = format!(
        "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true\
         &webhooks.resend.secret={SECRET}"
    );
    let read = |bytes: u64| Mailer::from_dsn(&format!("{base}&webhooks.body_limit={bytes}"));
    assert!(read(1024).is_ok());
    assert!(read(64 * 1024 * 1024).is_ok());
    for refused in [1023, 64 * 1024 * 1024 + 1] {
        let error = read(refused).unwrap_err();
        assert_eq!(error.setting(), "webhooks.body_limit", "{refused}");
    }
}

/// The suppression list's store must exist in the stack: in the outbox's database, an
/// outbox; in Redis, the stack's `[redis]`. Each is an error naming the key, and a stack
/// that has it reads.
#[test]
fn a_suppression_list_needs_the_store_it_names_and_reads_when_the_stack_has_it() {
    let error = Mailer::from_dsn("smtp://relay.example.com?suppression=true").unwrap_err();
    assert_eq!(error.setting(), "suppression", "{error}");
    let error = Mailer::from_dsn(
        "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true&suppression.store=redis",
    )
    .unwrap_err();
    assert_eq!(error.setting(), "suppression.store", "{error}");
    Mailer::from_dsn(
        "smtp://relay.example.com?redis=redis://127.0.0.1/&suppression=true&suppression.store=redis",
    )
    .expect("a list in the stack's Redis");
    Mailer::from_dsn("smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true")
        .expect("a list in the outbox's database");
}
