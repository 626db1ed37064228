//! The reputation breaker (issue 64, DESIGN §20) through its transport, a pool and an
//! outbox: its thresholds on both sides, the hold that is not an outage, and the reset.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
use mail_breaker::outbox::{Outbox, OutboxTransport};
use mail_breaker::reputation::{ReputationBreaker, ReputationTransport, Tier, TierChange};
use mail_breaker::{Category, PoolTransport, Strategy, Transport};
use support::scripted::Scripted;

fn event(member: &str, id: &str, kind: EventKind) -> DeliveryEvent {
    let mut event = DeliveryEvent::new(
        Provider::Ses,
        id,
        kind,
        format!("{id}@example.org"),
        SystemTime::UNIX_EPOCH,
    );
    event.member = Some(member.to_owned());
    event
}

fn hard_bounces(member: &str, count: usize) -> Vec<DeliveryEvent> {
    let kind = || EventKind::Bounced {
        bounce: BounceKind::Permanent,
        subtype: Some("General".into()),
    };
    (0..count)
        .map(|n| event(member, &format!("bounce-{n}"), kind()))
        .collect()
}

fn complaints(member: &str, count: usize) -> Vec<DeliveryEvent> {
    (0..count)
        .map(|n| {
            let kind = EventKind::Complained {
                feedback: Some("abuse".into()),
            };
            event(member, &format!("complaint-{n}"), kind)
        })
        .collect()
}

/// A member `name` behind its reputation breaker, and the breaker.
fn member(name: &str) -> (ReputationTransport<Scripted>, ReputationBreaker, Scripted) {
    let provider = Scripted::new(name);
    let breaker = ReputationBreaker::builder(name).build().unwrap();
    (breaker.wrap(provider.clone()), breaker, provider)
}

async fn send_many(transport: &impl Transport, count: usize) {
    for _ in 0..count {
        transport.send(&support::message()).await.unwrap();
    }
}

/// Opens `breaker` as the acceptance does: 41 hard bounces in 1,000 sends.
async fn open(transport: &ReputationTransport<Scripted>, breaker: &ReputationBreaker) {
    send_many(transport, 1_000).await;
    breaker
        .keep(&hard_bounces(breaker.member(), 41))
        .await
        .unwrap();
    assert_eq!(breaker.tier(), Tier::Open);
}

#[tokio::test]
async fn thirty_nine_hard_bounces_in_a_thousand_sends_warn_and_mail_still_goes() {
    let provider = Scripted::new("ses");
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&heard);
    let breaker = ReputationBreaker::builder("ses")
        .on_tier_change(move |member, change| {
            sink.lock().unwrap().push((member.to_owned(), change));
        })
        .build()
        .unwrap();
    let transport = breaker.wrap(provider.clone());
    send_many(&transport, 1_000).await;
    breaker.keep(&hard_bounces("ses", 39)).await.unwrap();
    let heard = heard.lock().unwrap().clone();
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert!(
        heard[0].1.to >= Tier::Warn && heard[0].1.to < Tier::Open,
        "{heard:?}"
    );
    transport.send(&support::message()).await.unwrap();
    assert_eq!(provider.sends(), 1_001);
}

#[tokio::test]
async fn forty_one_hard_bounces_in_a_thousand_sends_open_and_hold_every_send_back_unsent() {
    let (transport, breaker, provider) = member("ses");
    open(&transport, &breaker).await;
    let error = transport.send(&support::message()).await.unwrap_err();
    assert_eq!(error.code(), "reputation.open");
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert!(error.is_not_attempted());
    assert!(error.is_reputation_hold());
    assert_eq!(provider.sends(), 1_000, "the provider never saw it");
}

#[tokio::test]
async fn one_complaint_in_two_thousand_sends_does_nothing() {
    let (transport, breaker, _) = member("ses");
    send_many(&transport, 2_000).await;
    breaker.keep(&complaints("ses", 1)).await.unwrap();
    assert_eq!(breaker.tier(), Tier::Healthy);
    transport.send(&support::message()).await.unwrap();
}

#[tokio::test]
async fn three_complaints_in_two_thousand_five_hundred_sends_open() {
    let (transport, breaker, _) = member("ses");
    send_many(&transport, 2_500).await;
    breaker.keep(&complaints("ses", 3)).await.unwrap();
    assert_eq!(breaker.tier(), Tier::Open);
    let error = transport.send(&support::message()).await.unwrap_err();
    assert!(error.is_reputation_hold());
}

#[tokio::test]
async fn a_resent_event_is_counted_once_and_other_members_events_change_nothing() {
    let (transport, breaker, _) = member("ses");
    send_many(&transport, 1_000).await;
    let first = breaker.keep(&hard_bounces("ses", 20)).await.unwrap();
    assert_eq!(first.new, 20);
    let resent = breaker.keep(&hard_bounces("ses", 20)).await.unwrap();
    assert_eq!(resent.new, 0);
    let others = breaker.keep(&hard_bounces("postmark", 100)).await.unwrap();
    assert_eq!(others.new, 0);
    let delivered = vec![event("ses", "delivered-1", EventKind::Delivered)];
    assert_eq!(breaker.keep(&delivered).await.unwrap().new, 0);
    let standing = breaker.standing().await.unwrap();
    assert_eq!(standing.window.hard_bounces, 20);
    assert_eq!(standing.tier, Tier::Warn);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_never_closes_by_time_only_a_reset_closes_it() {
    let (transport, breaker, provider) = member("ses");
    open(&transport, &breaker).await;
    tokio::time::advance(Duration::from_secs(365 * 24 * 3_600)).await;
    assert!(
        transport
            .send(&support::message())
            .await
            .unwrap_err()
            .is_reputation_hold()
    );
    breaker.reset().await.unwrap();
    assert_eq!(breaker.tier(), Tier::Healthy);
    transport.send(&support::message()).await.unwrap();
    assert_eq!(provider.sends(), 1_001);
}

#[tokio::test]
async fn a_reset_is_heard_by_the_listener_as_a_change_to_healthy() {
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&heard);
    let provider = Scripted::new("ses");
    let breaker = ReputationBreaker::builder("ses")
        .on_tier_change(move |_, change| sink.lock().unwrap().push(change))
        .build()
        .unwrap();
    open(&breaker.wrap(provider), &breaker).await;
    breaker.reset().await.unwrap();
    let heard = heard.lock().unwrap().clone();
    assert_eq!(
        heard,
        [
            TierChange {
                from: Tier::Healthy,
                to: Tier::Open
            },
            TierChange {
                from: Tier::Open,
                to: Tier::Healthy
            },
        ]
    );
}

#[tokio::test]
async fn a_pool_returns_an_open_members_hold_without_failing_over() {
    let (ses, breaker, _) = member("ses");
    open(&ses, &breaker).await;
    let backup = Scripted::new("postmark");
    let pool = PoolTransport::builder()
        .add(ses, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let error = pool.send(&support::message()).await.unwrap_err();
    assert_eq!(error.code(), "reputation.open");
    assert!(error.is_reputation_hold());
    assert_eq!(
        backup.sends(),
        0,
        "failing over would burn the next account too"
    );
}

#[tokio::test]
async fn a_pool_fails_over_an_open_member_that_allows_it() {
    let provider = Scripted::new("ses");
    let breaker = ReputationBreaker::builder("ses")
        .failover(true)
        .build()
        .unwrap();
    let ses = breaker.wrap(provider);
    open(&ses, &breaker).await;
    let backup = Scripted::new("postmark");
    let pool = PoolTransport::builder()
        .add(ses, 1)
        .add(backup.clone(), 2)
        .build()
        .unwrap();
    let receipt = pool.send(&support::message()).await.unwrap();
    assert_eq!(receipt.transport(), "postmark");
    assert_eq!(backup.sends(), 1);
}

/// A folder of its own for a test's outbox, removed when dropped.
struct Folder(tempfile::TempDir);

impl Folder {
    fn new() -> Folder {
        Folder(tempfile::tempdir().unwrap())
    }
    fn database(&self) -> std::path::PathBuf {
        self.0.path().join("outbox.db")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_mail_waits_in_the_outbox_while_another_members_mail_goes_and_a_reset_lets_it_go() {
    let folder = Folder::new();
    let outbox = Outbox::sqlite(folder.database()).await.unwrap();
    let (ses, breaker, ses_provider) = member("ses");
    open(&ses, &breaker).await;
    let (postmark, _, postmark_provider) = member("postmark");
    // Each message's first try starts at the next member in turn.
    let pool = PoolTransport::builder()
        .add(ses, 1)
        .add(postmark, 1)
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let front = OutboxTransport::send_or_queue(outbox.clone(), pool);
    let first = front.send(&support::message()).await.unwrap();
    let second = front.send(&support::message()).await.unwrap();
    assert!(
        first.is_queued(),
        "the held member's message waits in the outbox"
    );
    assert!(!second.is_queued(), "the other member's mail still goes");
    assert_eq!(second.transport(), "postmark");
    assert_eq!(postmark_provider.sends(), 1);
    assert_eq!(outbox.stats().await.unwrap().queued, 1);

    // The worker sends through the held member alone: the message stays queued.
    let worker = outbox
        .worker(breaker.wrap(ses_provider.clone()))
        .poll(Duration::from_millis(10));
    worker.drain().await.unwrap();
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
    assert_eq!(
        ses_provider.sends(),
        1_000,
        "nothing reached the held provider"
    );

    breaker.reset().await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await; // past the refusal's poll
    worker.drain().await.unwrap();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 0));
    assert_eq!(ses_provider.sends(), 1_001);
}

#[tokio::test(start_paused = true)]
async fn a_retry_answers_a_reputation_hold_at_once_without_waiting_to_try_again() {
    let (ses, breaker, _) = member("ses");
    open(&ses, &breaker).await;
    let retry = mail_breaker::RetryTransport::builder(ses)
        .max_attempts(5)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let error = retry.send(&support::message()).await.unwrap_err();
    assert!(error.is_reputation_hold());
    assert_eq!(
        tokio::time::Instant::now(),
        started,
        "no backoff was waited: the paused clock did not move"
    );
}
