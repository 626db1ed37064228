//! The suppression list in a `Mailer` whose provider is a real smtp-sink: a suppressed
//! recipient never reaches the server, the others do, and mail queued before an address was
//! suppressed is checked when it is sent.

mod support;

use std::time::SystemTime;

use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
use mail_breaker::{Category, Mailer, Message, Transport};
use support::smtp_sink::SmtpSink;

fn to_a_and_b() -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("a@example.org".parse().expect("a recipient"))
        .to("b@example.org".parse().expect("a recipient"))
        .subject("to a and b")
        .body(String::from("hello"))
        .expect("a message")
}

fn permanent_bounce(to: &str) -> DeliveryEvent {
    DeliveryEvent::new(
        Provider::Ses,
        "sns-0001",
        EventKind::Bounced {
            bounce: BounceKind::Permanent,
            subtype: Some("General".into()),
        },
        to,
        SystemTime::now(),
    )
}

/// The envelope recipients smtp-sink was given in each transaction it took (its dump's
/// `X-Rcpt-Args` lines), and the dumps themselves for failure messages.
fn envelope_recipients(sink: &SmtpSink) -> (Vec<String>, String) {
    let dumps = sink.received_dumps();
    let recipients = dumps
        .iter()
        .flat_map(|dump| {
            dump.lines()
                .filter_map(|line| line.strip_prefix("X-Rcpt-Args: "))
                .map(|args| args.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    (recipients, dumps.join("\n----\n"))
}

async fn mailer(sink: &SmtpSink, folder: &tempfile::TempDir, options: &str) -> Mailer {
    let dsn = format!(
        "smtp://127.0.0.1:{}?tls=none&outbox=sqlite://{}&suppression=true{options}",
        sink.port(),
        folder.path().join("outbox.db").display()
    );
    Mailer::from_dsn(&dsn)
        .expect("the DSN reads")
        .build_without_worker()
        .await
        .expect("the mailer builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_permanent_bounce_for_b_a_message_to_a_and_b_reaches_smtp_sink_for_a_alone_and_b_is_answered_suppressed_bounced()
 {
    let test = "suppressed_recipient_never_reaches_smtp_sink";
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let mailer = mailer(&sink, &folder, "").await;
    let list = mailer.suppression().expect("suppression=true gives a list");
    assert_eq!(
        list.keep(&[permanent_bounce("b@example.org")])
            .await
            .unwrap()
            .new,
        1
    );

    let receipt = mailer.send(&to_a_and_b()).await.expect("sent to a");
    assert!(!receipt.is_queued(), "sent, not queued");
    let rejected: Vec<(String, &str, Category)> = receipt
        .rejected_recipients()
        .iter()
        .map(|(to, why)| (to.to_string(), why.code(), why.category()))
        .collect();
    assert_eq!(
        rejected,
        vec![(
            "b@example.org".to_owned(),
            "suppressed.bounced",
            Category::Rejected
        )]
    );
    let (recipients, dumps) = envelope_recipients(&sink);
    assert_eq!(sink.received(), 1, "{dumps}");
    assert!(
        recipients.iter().any(|to| to.contains("a@example.org")),
        "a@ reached smtp-sink: {dumps}"
    );
    assert!(
        !recipients.iter().any(|to| to.contains("b@example.org")),
        "smtp-sink never saw b@ in an envelope: {dumps}"
    );
    let outbox = mailer.outbox().expect("an outbox");
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "b@ is a dead letter of its own");
    assert!(dead[0].is_suppressed());
    assert_eq!(dead[0].error.code(), "suppressed.bounced");
    assert_eq!(dead[0].envelope.to()[0].to_string(), "b@example.org");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_every_recipient_is_suppressed_reaches_no_provider_and_is_answered_rejected_about_the_message()
 {
    let test = "every_recipient_suppressed_reaches_no_provider";
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let mailer = mailer(&sink, &folder, "").await;
    let list = mailer.suppression().unwrap();
    list.keep(&[
        permanent_bounce("a@example.org"),
        permanent_bounce("b@Example.ORG"),
    ])
    .await
    .unwrap();
    let error = mailer.send(&to_a_and_b()).await.unwrap_err();
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(error.code(), "suppressed.bounced");
    assert!(error.is_about_the_message());
    let causes: Vec<&str> = error.causes().iter().map(|why| why.code()).collect();
    assert_eq!(
        causes,
        ["suppressed.bounced", "suppressed.bounced"],
        "one per recipient"
    );
    assert_eq!(sink.received(), 0, "no transaction reached smtp-sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_before_the_bounce_is_checked_when_the_worker_sends_it() {
    let test = "queued_message_checked_at_send_time";
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let mailer = mailer(&sink, &folder, "&outbox.queue_only=true").await;
    let receipt = mailer.send(&to_a_and_b()).await.unwrap();
    assert!(receipt.is_queued());
    mailer
        .suppression()
        .unwrap()
        .keep(&[permanent_bounce("b@example.org")])
        .await
        .unwrap();

    mailer.worker().expect("a worker").drain().await.unwrap();

    let (recipients, dumps) = envelope_recipients(&sink);
    assert_eq!(sink.received(), 1, "{dumps}");
    assert!(
        !recipients.iter().any(|to| to.contains("b@example.org")),
        "{dumps}"
    );
    let outbox = mailer.outbox().unwrap();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 1));
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead[0].error.code(), "suppressed.bounced");
    assert_eq!(dead[0].envelope.to()[0].to_string(), "b@example.org");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_cannot_be_read_sends_nothing_and_the_outbox_keeps_the_message() {
    let test = "unreadable_list_sends_nothing";
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let mailer = mailer(&sink, &folder, "").await;
    // The list's table gone, as a database that fails reading it.
    let path = folder.path().join("outbox.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("DROP TABLE mail_breaker_suppression")
        .execute(&pool)
        .await
        .unwrap();

    let receipt = mailer.send(&to_a_and_b()).await.expect("kept");
    assert!(receipt.is_queued(), "send_or_queue kept it for later");
    assert_eq!(
        sink.received(),
        0,
        "nothing was sent while the list could not be read"
    );
    assert_eq!(mailer.outbox().unwrap().stats().await.unwrap().queued, 1);
}
