//! The reputation breaker shared by a fleet through a real redis-server: events heard by one
//! process open it for all, a reset by one closes it for all, and the script decides as the
//! memory store does.
#![cfg(all(feature = "redis", feature = "webhooks"))]

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mail_breaker::RedisStore;
use mail_breaker::Transport;
use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
use mail_breaker::reputation::{
    Heard, Limits, MemoryReputation, ReputationBreaker, ReputationRules, ReputationStore, Signal,
    Tier,
};
use support::redis::RedisServer;
use support::scripted::Scripted;

/// One process's store: a connection of its own to the test's server.
async fn store(server: &RedisServer, namespace: &str) -> Arc<RedisStore> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_namespace(namespace)
        .with_timeout(Duration::from_secs(2));
    assert!(
        store.is_shared(),
        "the store reaches the test's redis-server"
    );
    Arc::new(store)
}

fn hard_bounces(member: &str, count: usize) -> Vec<DeliveryEvent> {
    (0..count)
        .map(|n| {
            let mut event = DeliveryEvent::new(
                Provider::Ses,
                format!("bounce-{n}"),
                EventKind::Bounced {
                    bounce: BounceKind::Permanent,
                    subtype: None,
                },
                format!("gone{n}@example.org"),
                SystemTime::UNIX_EPOCH,
            );
            event.member = Some(member.to_owned());
            event
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_recorded_through_one_of_three_breakers_on_one_redis_open_it_for_all_three() {
    let Some(server) = RedisServer::start("reputation_fleet_opens") else {
        return;
    };
    let mut fleet = Vec::new();
    for _ in 0..3 {
        let breaker = ReputationBreaker::builder("ses")
            .store(store(&server, "reputation-fleet").await)
            .build()
            .unwrap();
        let provider = Scripted::new("ses");
        fleet.push((breaker.wrap(provider.clone()), breaker, provider));
    }
    for (transport, _, _) in &fleet {
        for _ in 0..400 {
            transport.send(&support::message()).await.unwrap();
        }
    }
    let standing = fleet[2].1.standing().await.unwrap();
    assert_eq!(
        standing.window.sends, 1_200,
        "the fleet counts into one window"
    );

    // 49 in 1,200 is 4.08 %: heard by the first process alone.
    let kept = fleet[0].1.keep(&hard_bounces("ses", 49)).await.unwrap();
    assert_eq!(kept.new, 49);
    for (transport, _, provider) in &fleet {
        let error = transport.send(&support::message()).await.unwrap_err();
        assert_eq!(error.code(), "reputation.open");
        assert!(error.is_reputation_hold());
        assert_eq!(provider.sends(), 400, "nothing more reached the provider");
    }
    assert_eq!(
        fleet[1].1.keep(&hard_bounces("ses", 49)).await.unwrap().new,
        0,
        "the same events heard by another process count once"
    );

    fleet[2].1.reset().await.unwrap();
    for (transport, breaker, provider) in &fleet {
        transport.send(&support::message()).await.unwrap();
        assert_eq!(provider.sends(), 401);
        assert_eq!(breaker.tier(), Tier::Healthy);
    }
}

/// Each member's reputation is its own in Redis as in memory: one member's bounces open its
/// breaker and leave another member's, on the same store and namespace, as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_members_bounces_in_redis_leave_another_members_breaker_closed() {
    let Some(server) = RedisServer::start("reputation_per_member") else {
        return;
    };
    let shared = store(&server, "reputation-members").await;
    let mut members = Vec::new();
    for name in ["ses", "postmark"] {
        let breaker = ReputationBreaker::builder(name)
            .store(Arc::clone(&shared) as Arc<dyn ReputationStore>)
            .build()
            .unwrap();
        let transport = breaker.wrap(Scripted::new(name));
        for _ in 0..1_000 {
            transport.send(&support::message()).await.unwrap();
        }
        members.push((transport, breaker));
    }
    members[0].1.keep(&hard_bounces("ses", 50)).await.unwrap();
    let refused = members[0].0.send(&support::message()).await.unwrap_err();
    assert_eq!(refused.code(), "reputation.open");
    members[1]
        .0
        .send(&support::message())
        .await
        .expect("another member's breaker is its own");
    assert_eq!(members[1].1.tier(), Tier::Healthy);
    assert_eq!(members[1].1.standing().await.unwrap().window.sends, 1_001);
}

/// The issue's thresholds as (sends, hard bounces, complaints, tier), run against a store.
async fn thresholds_hold(store: &dyn ReputationStore, member_prefix: &str) {
    let rules = ReputationRules::default();
    let cases = [
        (1_000, 39, 0, Tier::Throttle),
        (1_000, 41, 0, Tier::Open),
        (1_000, 40, 0, Tier::Open),
        (1_000, 20, 0, Tier::Warn),
        (1_000, 19, 0, Tier::Healthy),
        (499, 499, 0, Tier::Healthy),
        (2_000, 0, 1, Tier::Healthy),
        (2_500, 0, 3, Tier::Open),
        (2_500, 0, 1, Tier::Warn),
    ];
    for (n, (sends, bounces, complaints, tier)) in cases.into_iter().enumerate() {
        let member = format!("{member_prefix}-{n}");
        store.record(&member, &rules, sends, &[]).await.unwrap();
        let heard: Vec<Heard> = (0..bounces)
            .map(|i| Heard {
                id: format!("b{i}"),
                signal: Signal::HardBounce,
            })
            .chain((0..complaints).map(|i| Heard {
                id: format!("c{i}"),
                signal: Signal::Complaint,
            }))
            .collect();
        let recorded = store.record(&member, &rules, 0, &heard).await.unwrap();
        assert_eq!(
            recorded.standing.tier, tier,
            "{bounces} hard bounces and {complaints} complaints in {sends} sends"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issues_thresholds_hold_in_redis_as_in_memory() {
    thresholds_hold(&MemoryReputation::new(), "memory").await;
    let Some(server) = RedisServer::start("reputation_thresholds") else {
        return;
    };
    thresholds_hold(&*store(&server, "reputation-thresholds").await, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_decides_as_the_memory_store_does_after_any_sequence() {
    let Some(server) = RedisServer::start("reputation_script_model") else {
        return;
    };
    let redis = store(&server, "reputation-model").await;
    let rules = ReputationRules {
        hard_bounces: Limits {
            warn: 100_000,
            throttle: 200_000,
            open: 300_000,
            minimum_sends: 5,
        },
        complaints: Limits {
            warn: 50_000,
            throttle: 50_000,
            open: 150_000,
            minimum_sends: 10,
        },
        window_sends: 20,
        buckets: 4,
    };
    for seed in 0..20u64 {
        let mut random = fastrand::Rng::with_seed(seed);
        let memory = MemoryReputation::new();
        let member = format!("member-{seed}");
        for step in 0..150 {
            let (from_memory, from_redis) = match random.u8(0..20) {
                0 => (
                    memory
                        .reset(&member, &rules)
                        .await
                        .map(|change| (change.to, 0)),
                    redis
                        .reset(&member, &rules)
                        .await
                        .map(|change| (change.to, 0)),
                ),
                _ => {
                    let sends = random.u64(0..6);
                    let heard: Vec<Heard> = (0..random.usize(0..3))
                        .map(|_| Heard {
                            // Few ids, so that some are heard again.
                            id: format!("e{}", random.u8(0..40)),
                            signal: if random.bool() {
                                Signal::HardBounce
                            } else {
                                Signal::Complaint
                            },
                        })
                        .collect();
                    let memory = memory.record(&member, &rules, sends, &heard).await.unwrap();
                    let redis = redis.record(&member, &rules, sends, &heard).await.unwrap();
                    assert_eq!(memory, redis, "seed {seed}, step {step}");
                    (
                        Ok((memory.standing.tier, memory.new)),
                        Ok((redis.standing.tier, redis.new)),
                    )
                }
            };
            assert_eq!(
                from_memory.unwrap(),
                from_redis.unwrap(),
                "seed {seed}, step {step}"
            );
            assert_eq!(
                memory.standing(&member, &rules).await.unwrap(),
                redis.standing(&member, &rules).await.unwrap(),
                "seed {seed}, step {step}"
            );
        }
    }
}

/// A member throttled at 3 % hard bounces, then diluted by clean sends, as (sends added,
/// tier after).
async fn throttle_lasts_until_below_warn(store: &dyn ReputationStore, member: &str) {
    let rules = ReputationRules::default();
    store.record(member, &rules, 1_000, &[]).await.unwrap();
    let heard: Vec<Heard> = (0..30)
        .map(|i| Heard {
            id: format!("b{i}"),
            signal: Signal::HardBounce,
        })
        .collect();
    let recorded = store.record(member, &rules, 0, &heard).await.unwrap();
    assert_eq!(recorded.standing.tier, Tier::Throttle, "30 in 1,000: 3 %");
    for (sends, tier) in [
        (499, Tier::Throttle),
        (1, Tier::Throttle),
        (1, Tier::Healthy),
    ] {
        let recorded = store.record(member, &rules, sends, &[]).await.unwrap();
        let window = recorded.standing.window;
        assert_eq!(
            recorded.standing.tier, tier,
            "{} hard bounces in {} sends",
            window.hard_bounces, window.sends
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_lasts_until_the_rates_fall_below_warn_in_redis_as_in_memory() {
    throttle_lasts_until_below_warn(&MemoryReputation::new(), "memory").await;
    let Some(server) = RedisServer::start("reputation_throttle_lasts") else {
        return;
    };
    throttle_lasts_until_below_warn(&*store(&server, "reputation-throttle").await, "redis").await;
}
