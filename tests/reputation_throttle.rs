//! The reputation breaker's `throttle` tier acts (issue 64: "the member's rate halved until
//! the rates fall below warn"): a member with a rate limit sends at half its rate while its
//! breaker throttles, composed by hand or built from a configuration; one without a rate
//! limit has nothing to halve and says so.
#![cfg(feature = "webhooks")]

mod support;

use std::time::{Duration, SystemTime};

use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
use mail_breaker::reputation::{ReputationBreaker, Tier};
use mail_breaker::{Mailer, RateLimitTransport, Transport};
use support::scripted::Scripted;
use tokio::time::Instant;

fn hard_bounces(member: &str, from: usize, count: usize) -> Vec<DeliveryEvent> {
    (from..from + count)
        .map(|n| {
            let mut event = DeliveryEvent::new(
                Provider::Ses,
                format!("bounce-{n}"),
                EventKind::Bounced {
                    bounce: BounceKind::Permanent,
                    subtype: Some("General".into()),
                },
                format!("gone{n}@example.org"),
                SystemTime::UNIX_EPOCH,
            );
            event.member = Some(member.to_owned());
            event
        })
        .collect()
}

/// Counts `count` sends in `breaker` through a transport of its own, unpaced.
async fn count_sends(breaker: &ReputationBreaker, count: usize) {
    let unpaced = breaker.wrap(Scripted::new(breaker.member()));
    for _ in 0..count {
        unpaced.send(&support::message()).await.unwrap();
    }
}

/// Brings `breaker` to `throttle`: 1,000 sends more, then hard bounces to 3 % of the window.
async fn throttle(breaker: &ReputationBreaker) {
    count_sends(breaker, 1_000).await;
    let window = breaker.standing().await.unwrap().window;
    let bounces = (window.sends * 3).div_ceil(100) as usize;
    breaker
        .keep(&hard_bounces(breaker.member(), 0, bounces))
        .await
        .unwrap();
    assert_eq!(breaker.tier(), Tier::Throttle);
}

/// Dilutes `breaker`'s hard bounces with clean sends to just under warn's 2 %.
async fn below_warn(breaker: &ReputationBreaker) {
    let window = breaker.standing().await.unwrap().window;
    count_sends(
        breaker,
        (window.hard_bounces * 50 + 1 - window.sends) as usize,
    )
    .await;
    assert_eq!(breaker.tier(), Tier::Healthy);
}

/// How long `count` sends through `transport` take, one after the other, on tokio's clock.
async fn time_of(transport: &impl Transport, count: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..count {
        transport.send(&support::message()).await.unwrap();
    }
    start.elapsed()
}

/// A member paced at 10 a second, burst 1, slowed by its reputation breaker, composed by hand.
fn paced_member(
    breaker: &ReputationBreaker,
) -> RateLimitTransport<mail_breaker::reputation::ReputationTransport<Scripted>> {
    RateLimitTransport::builder(breaker.wrap(Scripted::new("ses")))
        .per_second(10.0)
        .burst(1)
        .max_wait(Duration::from_secs(60))
        .slowed_by(breaker.clone())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_throttled_member_sends_at_half_its_rate_and_at_its_whole_rate_once_below_warn() {
    let breaker = ReputationBreaker::builder("ses").build().unwrap();
    let member = paced_member(&breaker);
    let closed = time_of(&member, 20).await;
    tokio::time::sleep(Duration::from_secs(10)).await; // the burst back

    throttle(&breaker).await;
    assert_eq!(member.per_second(), 5.0);
    let throttled = time_of(&member, 20).await;
    assert_eq!(throttled, 2 * closed, "twenty sends take twice as long");
    tokio::time::sleep(Duration::from_secs(10)).await;

    below_warn(&breaker).await;
    assert_eq!(member.per_second(), 10.0);
    assert_eq!(time_of(&member, 20).await, closed);
}

#[tokio::test(start_paused = true)]
async fn a_member_under_the_throttle_threshold_but_still_at_warn_stays_at_half_its_rate() {
    let breaker = ReputationBreaker::builder("ses").build().unwrap();
    let member = paced_member(&breaker);
    throttle(&breaker).await;
    count_sends(&breaker, 400).await; // 30 in 1,420: 2.1 %
    assert_eq!(breaker.tier(), Tier::Throttle);
    assert_eq!(member.per_second(), 5.0);
}

#[tokio::test(start_paused = true)]
async fn an_open_member_is_held_back_not_paced() {
    let breaker = ReputationBreaker::builder("ses").build().unwrap();
    let member = paced_member(&breaker);
    throttle(&breaker).await;
    breaker.keep(&hard_bounces("ses", 30, 11)).await.unwrap();
    assert_eq!(breaker.tier(), Tier::Open);
    let start = Instant::now();
    let error = member.send(&support::message()).await.unwrap_err();
    assert_eq!(error.code(), "reputation.open");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "refused without waiting for a slot"
    );
}

#[tokio::test]
async fn a_mailer_built_from_a_configuration_halves_a_throttled_members_rate() {
    let mailer = Mailer::from_dsn(
        "smtp://relay.example.com:587?name=relay&rate=10/s&reputation.failover=false",
    )
    .unwrap()
    .build()
    .await
    .unwrap();
    let breaker = mailer
        .reputation("relay")
        .expect("a reputation breaker")
        .clone();
    let limiter = || {
        mailer
            .limiters()
            .find(|limiter| limiter.name() == "relay")
            .unwrap()
    };
    assert_eq!(limiter().per_second(), 10.0);
    throttle(&breaker).await;
    assert_eq!(limiter().per_second(), 5.0);
    assert_eq!(limiter().configured_per_second(), 10.0);
    below_warn(&breaker).await;
    assert_eq!(limiter().per_second(), 10.0);
}

#[tokio::test]
async fn a_breaker_knows_whether_a_rate_limit_reads_it() {
    let mailer = Mailer::from_toml(
        r#"
        [[member]]
        url = "smtp://relay.example.com:587"
        name = "relay"
        rate = { per_second = 10 }
        reputation = {}

        [[member]]
        url = "smtp://backup.example.com:587"
        name = "backup"
        reputation = {}
        "#,
    )
    .unwrap()
    .build()
    .await
    .unwrap();
    assert!(mailer.reputation("relay").unwrap().is_paced());
    assert!(!mailer.reputation("backup").unwrap().is_paced());
}

#[tokio::test(start_paused = true)]
async fn a_throttled_member_without_a_rate_limit_sends_as_before() {
    let breaker = ReputationBreaker::builder("ses").build().unwrap();
    let provider = Scripted::new("ses");
    let member = breaker.wrap(provider.clone());
    throttle(&breaker).await;
    assert!(!breaker.is_paced());
    assert_eq!(time_of(&member, 20).await, Duration::ZERO);
    assert_eq!(provider.sends(), 20);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_members_shared_limiter_draws_from_the_fleets_budget_at_half_the_rate() {
    let Some(server) = support::redis::RedisServer::start("reputation_throttle_shared") else {
        return;
    };
    let store = mail_breaker::RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_namespace("reputation-throttle-shared")
        .with_timeout(Duration::from_secs(2));
    let store = std::sync::Arc::new(store);
    let breaker = ReputationBreaker::builder("ses")
        .store(store.clone())
        .build()
        .unwrap();
    let member = RateLimitTransport::builder(breaker.wrap(Scripted::new("ses")))
        .per_second(1.0)
        .burst(1)
        .max_wait(Duration::ZERO)
        .shared(store)
        .slowed_by(breaker.clone())
        .build()
        .unwrap();
    throttle(&breaker).await;
    member.send(&support::message()).await.unwrap();
    let error = member.send(&support::message()).await.unwrap_err();
    assert_eq!(error.code(), "rate.limited");
    let retry_after = error.retry_after().unwrap();
    assert!(
        retry_after > Duration::from_millis(1_500),
        "the next slot is two seconds off at half a send a second, not one: {retry_after:?}"
    );
    assert_eq!(member.per_second(), 0.5);
}
