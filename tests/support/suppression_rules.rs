//! The suppression list's rules as checks every store must pass: `tests/suppression_sqlite.rs`
//! runs them on an SQLite outbox, `tests/suppression_postgres.rs` on PostgreSQL and
//! `tests/suppression_redis.rs` on Redis, through [`all_suppression_rules!`].
//!
//! Time is a clock the test moves (`Clock`), never a sleep.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
use mail_breaker::suppression::{Reason, SuppressionError, SuppressionList};

const HOUR: Duration = Duration::from_secs(3_600);

/// A clock the test sets: seconds since the epoch, from a day in 2026.
#[derive(Clone)]
pub struct Clock(Arc<AtomicU64>);

impl Clock {
    pub fn new() -> Clock {
        Clock(Arc::new(AtomicU64::new(1_780_000_000)))
    }

    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.0.load(Ordering::SeqCst))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_secs(), Ordering::SeqCst);
    }

    /// `list` reading this clock.
    pub fn drive(&self, list: SuppressionList) -> SuppressionList {
        let clock = self.clone();
        list.with_clock(move || clock.now())
    }
}

pub fn bounce(id: &str, kind: BounceKind, to: &str, at: SystemTime) -> DeliveryEvent {
    DeliveryEvent::new(
        Provider::Ses,
        id,
        EventKind::Bounced {
            bounce: kind,
            subtype: None,
        },
        to,
        at,
    )
}

pub fn complaint(id: &str, to: &str, at: SystemTime) -> DeliveryEvent {
    DeliveryEvent::new(
        Provider::SendGrid,
        id,
        EventKind::Complained {
            feedback: Some("abuse".into()),
        },
        to,
        at,
    )
}

pub async fn a_permanent_bounce_suppresses_the_address_with_its_reason_provider_event_and_time(
    list: SuppressionList,
) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let at = clock.now() - HOUR;
    let kept = list
        .keep(&[bounce(
            "evt-1",
            BounceKind::Permanent,
            "gone@example.org",
            at,
        )])
        .await
        .unwrap();
    assert_eq!(kept.new, 1);
    let entry = list
        .get("gone@example.org")
        .await
        .unwrap()
        .expect("suppressed");
    assert_eq!(entry.reason, Reason::Bounced);
    assert_eq!(entry.provider.as_deref(), Some("ses"));
    assert_eq!(entry.event_id.as_deref(), Some("evt-1"));
    assert_eq!(entry.at, at);
    assert_eq!(entry.until, None, "for good");
}

pub async fn a_complaint_suppresses_the_address_as_complained(list: SuppressionList) {
    let clock = Clock::new();
    let list = clock.drive(list);
    list.keep(&[complaint("sg-1", "angry@example.org", clock.now())])
        .await
        .unwrap();
    let entry = list
        .get("angry@example.org")
        .await
        .unwrap()
        .expect("suppressed");
    assert_eq!(entry.reason, Reason::Complained);
    assert_eq!(entry.provider.as_deref(), Some("sendgrid"));
}

pub async fn a_resent_event_changes_nothing_and_is_not_counted_again(list: SuppressionList) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let transient = bounce(
        "t-1",
        BounceKind::Transient,
        "full@example.org",
        clock.now(),
    );
    assert_eq!(
        list.keep(std::slice::from_ref(&transient))
            .await
            .unwrap()
            .new,
        1
    );
    // The same report twice more: were it counted, three would suppress.
    assert_eq!(
        list.keep(std::slice::from_ref(&transient))
            .await
            .unwrap()
            .new,
        0
    );
    assert_eq!(
        list.keep(&[transient.clone(), transient])
            .await
            .unwrap()
            .new,
        0
    );
    assert!(!list.contains("full@example.org").await.unwrap());
    let permanent = bounce(
        "p-1",
        BounceKind::Permanent,
        "gone@example.org",
        clock.now(),
    );
    list.keep(std::slice::from_ref(&permanent)).await.unwrap();
    list.remove("gone@example.org").await.unwrap();
    // A provider resending the bounce after an operator removed the address does not put it back.
    assert_eq!(list.keep(&[permanent]).await.unwrap().new, 0);
    assert!(!list.contains("gone@example.org").await.unwrap());
}

pub async fn an_events_id_is_remembered_for_30_days_and_then_forgotten(list: SuppressionList) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let delivered = DeliveryEvent::new(
        Provider::Mailgun,
        "mg-1",
        EventKind::Delivered,
        "user@example.org",
        clock.now(),
    );
    assert_eq!(
        list.keep(std::slice::from_ref(&delivered))
            .await
            .unwrap()
            .new,
        1
    );
    clock.advance(30 * 24 * HOUR - Duration::from_secs(1));
    assert_eq!(
        list.keep(std::slice::from_ref(&delivered))
            .await
            .unwrap()
            .new,
        0,
        "a resend within 30 days changes nothing"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        list.keep(std::slice::from_ref(&delivered))
            .await
            .unwrap()
            .new,
        1,
        "the ids of 30 days ago are forgotten: no provider resends that late"
    );
}

pub async fn one_report_naming_several_recipients_keeps_each_recipient_under_the_one_id(
    list: SuppressionList,
) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let events = [
        bounce("sns-1", BounceKind::Permanent, "a@example.org", clock.now()),
        bounce("sns-1", BounceKind::Permanent, "b@example.org", clock.now()),
    ];
    assert_eq!(list.keep(&events).await.unwrap().new, 2);
    assert!(list.contains("a@example.org").await.unwrap());
    assert!(list.contains("b@example.org").await.unwrap());
}

pub async fn three_transient_bounces_within_72_hours_suppress_for_24_hours_from_the_last(
    list: SuppressionList,
) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let to = "full@example.org";
    for (n, id) in ["t-1", "t-2", "t-3"].iter().enumerate() {
        if n > 0 {
            clock.advance(30 * HOUR);
        }
        list.keep(&[bounce(id, BounceKind::Transient, to, clock.now())])
            .await
            .unwrap();
    }
    let entry = list.get(to).await.unwrap().expect("held after the third");
    assert_eq!(entry.reason, Reason::Bounced);
    assert_eq!(entry.until, Some(clock.now() + 24 * HOUR));
}

pub async fn two_transient_bounces_do_not_suppress(list: SuppressionList) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let to = "full@example.org";
    list.keep(&[bounce("t-1", BounceKind::Transient, to, clock.now())])
        .await
        .unwrap();
    clock.advance(HOUR);
    list.keep(&[bounce("t-2", BounceKind::Transient, to, clock.now())])
        .await
        .unwrap();
    assert!(!list.contains(to).await.unwrap());
}

pub async fn three_transient_bounces_spread_over_more_than_72_hours_do_not_suppress(
    list: SuppressionList,
) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let to = "full@example.org";
    for id in ["t-1", "t-2", "t-3"] {
        list.keep(&[bounce(id, BounceKind::Transient, to, clock.now())])
            .await
            .unwrap();
        clock.advance(37 * HOUR);
    }
    assert!(!list.contains(to).await.unwrap());
}

pub async fn a_hold_for_transient_bounces_expires_after_24_hours(list: SuppressionList) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let to = "full@example.org";
    for id in ["t-1", "t-2", "t-3"] {
        list.keep(&[bounce(id, BounceKind::Transient, to, clock.now())])
            .await
            .unwrap();
    }
    clock.advance(24 * HOUR - Duration::from_secs(1));
    assert!(
        list.contains(to).await.unwrap(),
        "held until the 24 hours are out"
    );
    clock.advance(Duration::from_secs(1));
    assert!(!list.contains(to).await.unwrap(), "free once they are");
    assert!(list.list(None, 10).await.unwrap().is_empty());
    // The three are still within 72 hours: a fourth makes three in a row again, and holds.
    list.keep(&[bounce("t-4", BounceKind::Transient, to, clock.now())])
        .await
        .unwrap();
    let entry = list.get(to).await.unwrap().expect("held again");
    assert_eq!(entry.until, Some(clock.now() + 24 * HOUR));
}

pub async fn a_permanent_bounce_turns_a_hold_into_a_suppression_for_good(list: SuppressionList) {
    let clock = Clock::new();
    let list = clock.drive(list);
    let to = "full@example.org";
    for id in ["t-1", "t-2", "t-3"] {
        list.keep(&[bounce(id, BounceKind::Transient, to, clock.now())])
            .await
            .unwrap();
    }
    list.keep(&[bounce("p-1", BounceKind::Permanent, to, clock.now())])
        .await
        .unwrap();
    clock.advance(48 * HOUR);
    let entry = list.get(to).await.unwrap().expect("for good");
    assert_eq!(
        (entry.until, entry.event_id.as_deref()),
        (None, Some("p-1"))
    );
}

pub async fn the_domain_is_compared_without_case_and_the_local_part_as_written(
    list: SuppressionList,
) {
    let clock = Clock::new();
    let list = clock.drive(list);
    list.keep(&[bounce(
        "p-1",
        BounceKind::Permanent,
        "Bob@Example.ORG",
        clock.now(),
    )])
    .await
    .unwrap();
    assert!(list.contains("Bob@example.org").await.unwrap());
    assert!(list.contains("Bob@EXAMPLE.org").await.unwrap());
    assert!(!list.contains("bob@example.org").await.unwrap());
    let entry = list.get("Bob@example.org").await.unwrap().unwrap();
    assert_eq!(entry.address, "Bob@example.org");
    assert!(list.remove("Bob@EXAMPLE.ORG").await.unwrap());
}

pub async fn add_get_remove_and_list_by_pages_work_by_hand(list: SuppressionList) {
    for n in 0..7 {
        list.add(&format!("user{n}@example.org"), Reason::Manual)
            .await
            .unwrap();
    }
    list.add("user3@example.org", Reason::Complained)
        .await
        .unwrap();
    assert_eq!(
        list.get("user3@example.org").await.unwrap().unwrap().reason,
        Reason::Complained,
        "an add replaces what was there"
    );
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = list.list(after.as_deref(), 3).await.unwrap();
        let Some(last) = page.last() else { break };
        assert!(page.len() <= 3);
        after = Some(last.address.clone());
        seen.extend(page.into_iter().map(|entry| entry.address));
    }
    let expected: Vec<String> = (0..7).map(|n| format!("user{n}@example.org")).collect();
    assert_eq!(seen, expected);
    assert!(list.remove("user0@example.org").await.unwrap());
    assert!(!list.remove("user0@example.org").await.unwrap());
    assert_eq!(list.list(None, 100).await.unwrap().len(), 6);
    let error = list.add("nobody", Reason::Manual).await.unwrap_err();
    assert!(
        matches!(error, SuppressionError::InvalidAddress { .. }),
        "{error}"
    );
}

pub async fn an_import_adds_every_line_or_none(list: SuppressionList) {
    list.add("known@example.org", Reason::Complained)
        .await
        .unwrap();
    let bad = "email,reason\nnew1@example.org,bounce\nnot an address\n";
    let error = list.import(bad, Reason::Manual).await.unwrap_err();
    assert!(
        matches!(error, SuppressionError::Import { line: 3, .. }),
        "{error}"
    );
    assert!(
        !list.contains("new1@example.org").await.unwrap(),
        "nothing imported"
    );
    let good = "EmailAddress,SuppressionReason,Origin\n\
                new1@example.org,HardBounce,Recipient\n\
                known@example.org,ManualSuppression,Customer\n\
                new2@Example.org,,Customer\n";
    let imported = list.import(good, Reason::Manual).await.unwrap();
    assert_eq!((imported.read, imported.added), (3, 2));
    assert_eq!(
        list.get("known@example.org").await.unwrap().unwrap().reason,
        Reason::Complained,
        "an address already suppressed for good keeps its cause"
    );
    assert_eq!(
        list.get("new2@example.org").await.unwrap().unwrap().reason,
        Reason::Manual
    );
}

pub async fn a_search_finds_the_addresses_holding_a_text_by_address_at_most_as_many_as_asked(
    list: SuppressionList,
) {
    for address in [
        "ann@shop.example",
        "bob@example.org",
        "carol@SHOP.example",
        "dave@shopping.example",
        "x%_\\*?[y]@odd.example",
    ] {
        list.add(address, Reason::Manual).await.unwrap();
    }
    let found = |page: Vec<mail_breaker::suppression::Suppression>| -> Vec<String> {
        page.into_iter().map(|entry| entry.address).collect()
    };
    assert_eq!(
        found(list.search("shop", 10).await.unwrap()),
        [
            "ann@shop.example",
            "carol@shop.example",
            "dave@shopping.example"
        ],
        "by address, the domain as the list keeps it"
    );
    assert_eq!(
        found(list.search("SHOP.EX", 10).await.unwrap()),
        ["ann@shop.example", "carol@shop.example"],
        "letters A to Z are found without case"
    );
    assert_eq!(found(list.search("shop", 2).await.unwrap()).len(), 2);
    for literal in ["%", "_", "\\", "*", "?", "[y]"] {
        assert_eq!(
            found(list.search(literal, 10).await.unwrap()),
            ["x%_\\*?[y]@odd.example"],
            "{literal:?} is searched as written, not as a pattern"
        );
    }
    assert!(list.search("nobody", 10).await.unwrap().is_empty());
    assert!(list.search("shop", 0).await.unwrap().is_empty());

    // A list larger than one read of the store's index (Redis scans about 500 at a time).
    let bulk: String = (0..1_500)
        .map(|n| format!("bulk{n:04}@example.net\n"))
        .collect();
    list.import(&bulk, Reason::Manual).await.unwrap();
    let expected: Vec<String> = (1_490..1_500)
        .map(|n| format!("bulk{n:04}@example.net"))
        .collect();
    assert_eq!(
        found(list.search("bulk149", 100).await.unwrap()),
        expected,
        "every match, wherever the index holds it"
    );
    assert_eq!(found(list.search("bulk", 20).await.unwrap()).len(), 20);
}

/// One test per rule, each on a store of its own from `$open(test_name)`.
#[macro_export]
macro_rules! suppression_rules {
    ($open:expr; $($rule:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $rule() {
            let Some((list, _guard)) = $open(stringify!($rule)).await else { return };
            support::suppression_rules::$rule(list).await;
        }
    )+};
}

/// Every rule, for [`suppression_rules!`].
#[macro_export]
macro_rules! all_suppression_rules {
    ($open:expr) => {
        $crate::suppression_rules!($open;
            a_permanent_bounce_suppresses_the_address_with_its_reason_provider_event_and_time,
            a_complaint_suppresses_the_address_as_complained,
            a_resent_event_changes_nothing_and_is_not_counted_again,
            an_events_id_is_remembered_for_30_days_and_then_forgotten,
            one_report_naming_several_recipients_keeps_each_recipient_under_the_one_id,
            three_transient_bounces_within_72_hours_suppress_for_24_hours_from_the_last,
            two_transient_bounces_do_not_suppress,
            three_transient_bounces_spread_over_more_than_72_hours_do_not_suppress,
            a_hold_for_transient_bounces_expires_after_24_hours,
            a_permanent_bounce_turns_a_hold_into_a_suppression_for_good,
            the_domain_is_compared_without_case_and_the_local_part_as_written,
            add_get_remove_and_list_by_pages_work_by_hand,
            an_import_adds_every_line_or_none,
            a_search_finds_the_addresses_holding_a_text_by_address_at_most_as_many_as_asked,
        );
    };
}
