//! The suppression list's rules in an SQLite outbox's file, a file of its own per test; and
//! that `keep` is all or nothing.

mod support;

use mail_breaker::events::{BounceKind, EventSink};
use mail_breaker::outbox::Outbox;
use mail_breaker::suppression::SuppressionList;
use support::suppression_rules::{Clock, bounce};

async fn open(_test: &str) -> Option<(SuppressionList, tempfile::TempDir)> {
    let folder = tempfile::tempdir().expect("a temporary folder");
    let outbox = Outbox::sqlite(folder.path().join("outbox.db"))
        .await
        .expect("an SQLite outbox");
    let list = SuppressionList::in_outbox(&outbox).expect("the list in the outbox's file");
    Some((list, folder))
}

all_suppression_rules!(open);

#[tokio::test]
async fn keep_is_all_or_nothing_an_event_that_cannot_be_kept_keeps_none_of_its_batch() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("outbox.db");
    let outbox = Outbox::sqlite(&path).await.unwrap();
    // The database refuses the second event's id, as a full disk would refuse a write.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_boom BEFORE INSERT ON mail_breaker_suppression_event \
         WHEN NEW.recipient = 'boom@example.org' BEGIN SELECT RAISE(ABORT, 'disk full'); END",
    )
    .execute(&pool)
    .await
    .unwrap();
    let clock = Clock::new();
    let list = clock.drive(SuppressionList::in_outbox(&outbox).unwrap());
    let events = [
        bounce(
            "e-1",
            BounceKind::Permanent,
            "first@example.org",
            clock.now(),
        ),
        bounce(
            "e-2",
            BounceKind::Permanent,
            "boom@example.org",
            clock.now(),
        ),
    ];
    let error = list.keep(&events).await.unwrap_err();
    assert!(error.to_string().contains("disk full"), "{error}");
    assert!(
        !list.contains("first@example.org").await.unwrap(),
        "the first event's change was rolled back with the second's failure"
    );
    sqlx::query("DROP TRIGGER refuse_boom")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        list.keep(&events).await.unwrap().new,
        2,
        "the first event's id was rolled back too: sent again, both are new"
    );
}

/// A list in a file of its own, and a provider that takes everything, counting its sends.
async fn guarded() -> (
    mail_breaker::suppression::SuppressionTransport<support::scripted::Scripted>,
    support::scripted::Scripted,
    SuppressionList,
    tempfile::TempDir,
) {
    let (list, folder) = open("guarded").await.expect("a list");
    let provider = support::scripted::Scripted::new("provider");
    let transport =
        mail_breaker::suppression::SuppressionTransport::new(provider.clone(), list.clone());
    (transport, provider, list, folder)
}

fn to_all(recipients: &[&str]) -> mail_breaker::Message {
    let mut builder =
        mail_breaker::Message::builder().from("app@example.com".parse().expect("a sender"));
    for to in recipients {
        builder = builder.to(to.parse().expect("a recipient"));
    }
    builder
        .subject("hello")
        .body(String::from("hello"))
        .expect("a message")
}

#[tokio::test]
async fn recipients_suppressed_for_different_reasons_are_answered_suppressed_mixed_each_with_its_reason()
 {
    use mail_breaker::Transport;
    use mail_breaker::suppression::Reason;
    let (transport, provider, list, _folder) = guarded().await;
    list.add("b@example.org", Reason::Bounced).await.unwrap();
    list.add("c@example.org", Reason::Complained).await.unwrap();
    let error = transport
        .send(&to_all(&["b@example.org", "c@example.org"]))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "suppressed.mixed");
    let causes: Vec<&str> = error.causes().iter().map(|why| why.code()).collect();
    assert_eq!(causes, ["suppressed.bounced", "suppressed.complained"]);
    assert_eq!(provider.sends(), 0, "the provider was not called");
}

#[tokio::test]
async fn a_message_to_no_suppressed_recipient_goes_to_the_provider_as_it_is_under_its_name() {
    use mail_breaker::Transport;
    let (transport, provider, _list, _folder) = guarded().await;
    let receipt = transport
        .send(&to_all(&["a@example.org", "b@example.org"]))
        .await
        .unwrap();
    assert!(receipt.rejected_recipients().is_empty());
    assert_eq!(provider.sends(), 1);
    assert_eq!(transport.name(), "provider");
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn each_suppressed_recipient_is_counted_by_its_reason() {
    use mail_breaker::Transport;
    use mail_breaker::suppression::Reason;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(recorder);
    let (transport, _provider, list, _folder) = guarded().await;
    list.add("b@example.org", Reason::Bounced).await.unwrap();
    list.add("c@example.org", Reason::Complained).await.unwrap();
    list.add("d@example.org", Reason::Bounced).await.unwrap();
    transport
        .send(&to_all(&[
            "a@example.org",
            "b@example.org",
            "c@example.org",
            "d@example.org",
        ]))
        .await
        .unwrap();
    let mut counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == mail_breaker::metrics::SUPPRESSED_TOTAL)
        .filter_map(|(key, _, _, value)| {
            let reason = key
                .key()
                .labels()
                .find(|label| label.key() == "reason")
                .map(|label| label.value().to_owned())?;
            match value {
                DebugValue::Counter(count) => Some((reason, count)),
                _ => None,
            }
        })
        .collect();
    counted.sort();
    assert_eq!(
        counted,
        [("bounced".to_owned(), 2), ("complained".to_owned(), 1)]
    );
}

#[tokio::test]
async fn an_import_of_more_addresses_than_one_write_takes_adds_and_counts_every_one() {
    let (list, _folder) = open("import_in_parts").await.expect("SQLite");
    let csv: String = (0..450).map(|n| format!("many{n}@example.net\n")).collect();
    list.add(
        "many7@example.net",
        mail_breaker::suppression::Reason::Complained,
    )
    .await
    .unwrap();

    let imported = list
        .import(&csv, mail_breaker::suppression::Reason::Manual)
        .await
        .unwrap();

    assert_eq!((imported.read, imported.added), (450, 449));
    assert!(list.contains("many449@example.net").await.unwrap());
    assert_eq!(
        list.get("many7@example.net").await.unwrap().unwrap().reason,
        mail_breaker::suppression::Reason::Complained,
        "an address already there is left as it is"
    );
}

/// A list driven by `clock` on which `held@example.org` is held for 24 hours after three
/// transient bounces, and `gone@example.org` is suppressed for good.
async fn with_a_hold(
    clock: &Clock,
) -> (
    mail_breaker::suppression::SuppressionTransport<support::scripted::Scripted>,
    support::scripted::Scripted,
    tempfile::TempDir,
) {
    let (list, folder) = open("held").await.expect("a list");
    let list = clock.drive(list);
    for n in 0..3 {
        let at = clock.now();
        list.keep(&[bounce(
            &format!("t{n}"),
            BounceKind::Transient,
            "held@example.org",
            at,
        )])
        .await
        .unwrap();
    }
    list.add(
        "gone@example.org",
        mail_breaker::suppression::Reason::Bounced,
    )
    .await
    .unwrap();
    let provider = support::scripted::Scripted::new("provider");
    let transport = mail_breaker::suppression::SuppressionTransport::new(provider.clone(), list);
    (transport, provider, folder)
}

#[tokio::test]
async fn a_recipient_held_after_transient_bounces_is_deferred_until_the_hold_ends_not_refused() {
    use mail_breaker::Transport;
    let clock = Clock::new();
    let (transport, provider, _folder) = with_a_hold(&clock).await;
    clock.advance(std::time::Duration::from_secs(3_600));

    let receipt = transport
        .send(&to_all(&["held@example.org", "a@example.org"]))
        .await
        .expect("a@ is sent");

    assert!(receipt.rejected_recipients().is_empty(), "{receipt:?}");
    let deferred = receipt.deferred_recipients();
    assert_eq!(deferred.len(), 1, "{receipt:?}");
    assert_eq!(deferred[0].0.to_string(), "held@example.org");
    assert_eq!(deferred[0].1.code(), "suppressed.held");
    assert!(deferred[0].1.is_retryable());
    assert_eq!(
        deferred[0].1.retry_after(),
        Some(std::time::Duration::from_secs(23 * 3_600)),
        "until the hold ends"
    );
    assert_eq!(provider.sends(), 1);
}

#[tokio::test]
async fn a_message_whose_recipients_are_all_held_or_suppressed_waits_for_the_hold_untried() {
    use mail_breaker::Transport;
    let clock = Clock::new();
    let (transport, provider, _folder) = with_a_hold(&clock).await;

    let error = transport
        .send(&to_all(&["held@example.org", "gone@example.org"]))
        .await
        .expect_err("no one to send to now");

    assert_eq!(error.code(), "suppressed.held");
    assert!(
        error.is_retryable() && error.is_not_attempted(),
        "{error:?}"
    );
    assert_eq!(
        error.retry_after(),
        Some(std::time::Duration::from_secs(24 * 3_600))
    );
    assert_eq!(provider.sends(), 0);
}
