//! Rate limiters that share one budget through a real redis-server: the fleet's pacing, a
//! throttle lowering everyone's rate, and each process on its own share while Redis is down.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mail_breaker::{Category, RateLimitTransport, RedisStore, SendError, Transport};
use support::redis::RedisServer;
use support::scripted::{Reply, Scripted};

async fn store(server: &RedisServer) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(&server.url())
            .await
            .unwrap()
            .with_namespace("rate-tests")
            .with_timeout(Duration::from_millis(100))
            .with_retry_interval(Duration::from_millis(100)),
    )
}

fn limiter(
    provider: &Scripted,
    store: &Arc<RedisStore>,
    per_second: f64,
) -> mail_breaker::RateLimitBuilder<Scripted> {
    RateLimitTransport::builder(provider.clone())
        .name("ses")
        .per_second(per_second)
        .max_wait(Duration::from_secs(30))
        .shared(Arc::clone(store))
}

/// Sends `count` messages one after another through `transport`; how long it took.
async fn send_all(transport: &RateLimitTransport<Scripted>, count: usize) -> Duration {
    let started = Instant::now();
    for _ in 0..count {
        transport.send(&support::message()).await.unwrap();
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_sharing_one_budget_send_at_its_rate_together() {
    let Some(server) = RedisServer::start("rate_shared_budget") else {
        return;
    };
    let store = store(&server).await;
    let (a, b) = (Scripted::new("ses"), Scripted::new("ses"));
    let (first, second) = (
        limiter(&a, &store, 50.0).build().unwrap(),
        limiter(&b, &store, 50.0).build().unwrap(),
    );
    let started = Instant::now();
    tokio::join!(send_all(&first, 50), send_all(&second, 50));
    let took = started.elapsed();
    // 100 sends at 50 a second between them: the first at once, then one every 20 ms.
    assert!(
        took >= Duration::from_millis(1_900) && took <= Duration::from_millis(2_400),
        "{took:?}: alone each would have taken 1 s"
    );
    assert_eq!(a.sends() + b.sends(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_seen_by_one_limiter_halves_the_rate_of_every_limiter_sharing_it() {
    let Some(server) = RedisServer::start("rate_shared_throttle") else {
        return;
    };
    let store = store(&server).await;
    let throttled = Scripted::new("ses");
    throttled.then([Reply::Err(SendError::new(
        Category::RateLimited,
        "ses.throttling",
        "slow down",
    ))]);
    let other = Scripted::new("ses");
    let first = limiter(&throttled, &store, 100.0)
        .adaptive(true)
        .build()
        .unwrap();
    let second = limiter(&other, &store, 100.0)
        .adaptive(true)
        .build()
        .unwrap();
    assert_eq!(
        first.send(&support::message()).await.unwrap_err().code(),
        "ses.throttling"
    );
    second.send(&support::message()).await.unwrap();
    assert_eq!(
        second.per_second(),
        50.0,
        "the fleet's rate, as Redis told the other limiter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_heard_across_the_fleet_within_a_second_of_a_halving_halve_it_once() {
    let Some(server) = RedisServer::start("rate_shared_settling") else {
        return;
    };
    let store = store(&server).await;
    let throttle = || {
        let provider = Scripted::new("ses");
        provider.then([Reply::Err(SendError::new(
            Category::RateLimited,
            "ses.throttling",
            "slow down",
        ))]);
        provider
    };
    let (a, b) = (throttle(), throttle());
    let first = limiter(&a, &store, 100.0).adaptive(true).build().unwrap();
    let second = limiter(&b, &store, 100.0).adaptive(true).build().unwrap();
    let _ = first.send(&support::message()).await;
    let _ = second.send(&support::message()).await;
    second.send(&support::message()).await.unwrap();
    assert_eq!(second.per_second(), 50.0, "one halving, not two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_send_through_a_shared_limiter_is_one_redis_round_trip() {
    let Some(server) = RedisServer::start("rate_shared_round_trips") else {
        return;
    };
    let store = store(&server).await;
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 10_000.0).build().unwrap();
    limited.send(&support::message()).await.unwrap(); // the script loaded
    let before = server.scripts_run().await;
    send_all(&limited, 50).await;
    let after = server.scripts_run().await;
    assert_eq!(after - before, 50, "one script call per send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_each_limiter_paces_itself_at_its_share_and_shares_again_once_it_is_back() {
    let Some(mut server) = RedisServer::start("rate_shared_fallback") else {
        return;
    };
    let store = store(&server).await;
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 20.0).members(2).build().unwrap();
    limited.send(&support::message()).await.unwrap();
    server.stop();
    // 11 sends at this process's share, 10 a second: at least 1 s (the first may go at once).
    let took = send_all(&limited, 11).await;
    assert!(took >= Duration::from_millis(950), "{took:?}");
    assert!(
        took <= Duration::from_millis(2_500),
        "no send waited on the dead Redis: {took:?}"
    );
    assert_eq!(limited.per_second(), 10.0);
    server.restart();
    tokio::time::sleep(Duration::from_millis(150)).await; // past the retry interval
    send_all(&limited, 2).await;
    assert_eq!(limited.per_second(), 20.0, "shared again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_limiter_refuses_a_send_with_no_slot_within_max_wait_with_the_fleets_retry_after()
{
    let Some(server) = RedisServer::start("rate_shared_refusal") else {
        return;
    };
    let store = store(&server).await;
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 1.0)
        .max_wait(Duration::from_millis(100))
        .build()
        .unwrap();
    limited.send(&support::message()).await.unwrap();
    let refused = limited.send(&support::message()).await.unwrap_err();
    assert_eq!(refused.code(), "rate.limited");
    // The next slot is a second after the first send, less the moment since.
    let retry_after = refused.retry_after().expect("a retry_after");
    assert!(
        retry_after > Duration::from_millis(500) && retry_after <= Duration::from_secs(1),
        "{retry_after:?}"
    );
    assert_eq!(provider.sends(), 1, "a refused send is not sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_hangs_holds_one_send_per_retry_interval_for_its_timeout_not_every_send() {
    let Some(server) = RedisServer::start("rate_shared_hang") else {
        return;
    };
    let store = Arc::new(
        RedisStore::connect(&server.url())
            .await
            .unwrap()
            .with_namespace("rate-tests")
            .with_timeout(Duration::from_millis(100))
            .with_retry_interval(Duration::from_secs(30)),
    );
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 1_000.0).build().unwrap();
    limited.send(&support::message()).await.unwrap();
    server.freeze();
    // The first waits out the timeout, and the limiter paces alone until the retry
    // interval has passed: 10 sends at 1,000 a second take 100 ms and a few more.
    let took = send_all(&limited, 10).await;
    server.thaw();
    assert!(took >= Duration::from_millis(100), "{took:?}");
    assert!(
        took < Duration::from_millis(400),
        "only the first send waited for the silent Redis: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_limiters_debug_shows_its_key_and_rate() {
    let Some(server) = RedisServer::start("rate_shared_debug") else {
        return;
    };
    let store = store(&server).await;
    let limited = limiter(&Scripted::new("ses"), &store, 14.0)
        .build()
        .unwrap();
    let debug = format!("{limited:?}");
    assert!(debug.contains("SharedLimiter"), "{debug}");
    assert!(debug.contains("rate-tests"), "{debug}");
    assert!(debug.contains("14.0"), "{debug}");
}

/// A probe the limiter refused is given back to the breaker's Redis store: the breaker
/// stays half-open, and the next send is let through as the probe (issue 45, point 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_the_limiter_refused_is_given_back_to_a_breaker_on_redis() {
    let Some(server) = RedisServer::start("rate_refused_probe") else {
        return;
    };
    let store = Arc::new(
        RedisStore::connect(&server.url())
            .await
            .unwrap()
            .with_namespace("rate-refused-probe")
            .with_timeout(Duration::from_secs(2)),
    );
    let provider = Scripted::new("ses");
    provider.then([Reply::fail(Category::ServerError)]);
    let limiter = RateLimitTransport::builder(provider.clone())
        .per_second(1.0)
        .burst(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let breaker = mail_breaker::CircuitBreakerTransport::builder(limiter)
        .failure_threshold(1)
        .reset_timeout(Duration::from_millis(200))
        .store(store)
        .build()
        .unwrap();
    let started = Instant::now();
    let _ = breaker.send(&support::message()).await; // spends the slot, opens the breaker
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = breaker.send(&support::message()).await.unwrap_err();
    assert_eq!(refused.code(), "rate.limited");
    assert_eq!(breaker.state(), mail_breaker::State::HalfOpen);
    tokio::time::sleep(Duration::from_millis(100)).await; // the release goes in the background
    let next = breaker.send(&support::message()).await.unwrap_err();
    assert_eq!(
        next.code(),
        "rate.limited",
        "the probe's slot was free again"
    );

    // The limiter's next slot is a second after the first send.
    tokio::time::sleep(Duration::from_millis(1_100).saturating_sub(started.elapsed())).await;
    breaker.send(&support::message()).await.unwrap();
    assert_eq!(breaker.state(), mail_breaker::State::Closed);
    assert_eq!(provider.sends(), 2);
}

/// Issue 45, point 12, in the fleet's script: a halving gives no new burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halving_a_saturated_shared_limiter_gives_it_no_new_burst() {
    let Some(server) = RedisServer::start("rate_shared_halving") else {
        return;
    };
    let store = store(&server).await;
    let provider = Scripted::new("ses");
    provider.then(
        std::iter::repeat_n(Reply::Ok, 9).chain([Reply::Err(SendError::new(
            Category::RateLimited,
            "ses.throttling",
            "slow down",
        ))]),
    );
    let limited = limiter(&provider, &store, 10.0)
        .burst(10)
        .adaptive(true)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    for _ in 0..10 {
        let _ = limited.send(&support::message()).await;
    }
    assert_eq!(limited.per_second(), 5.0);

    let refused = limited.send(&support::message()).await.unwrap_err();

    assert_eq!(refused.code(), "rate.limited");
    assert_eq!(provider.sends(), 10);
}

/// Sends `count` messages one after another through `transport`, which never waits: how
/// many went.
async fn sent_at_once(transport: &RateLimitTransport<Scripted>, count: usize) -> usize {
    let mut sent = 0;
    for _ in 0..count {
        if transport.send(&support::message()).await.is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Issue 45, point 14: with Redis down, `.members(n)` divides the burst as well as the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_a_limiter_of_known_members_takes_its_share_of_the_burst() {
    let Some(mut server) = RedisServer::start("rate_fallback_burst") else {
        return;
    };
    let store = store(&server).await;
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 4.0)
        .burst(8)
        .members(4)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    limited.send(&support::message()).await.unwrap();
    server.stop();

    assert_eq!(
        sent_at_once(&limited, 5).await,
        2,
        "a quarter of the burst of 8"
    );
    assert_eq!(limited.per_second(), 1.0);
}

/// Issue 45, point 14: without `.members(n)`, the share is that of the processes last seen
/// sharing the limiter in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_a_limiter_takes_the_share_of_the_processes_last_seen_sharing_it() {
    let Some(mut server) = RedisServer::start("rate_fallback_seen") else {
        return;
    };
    let member = |name: &'static str| {
        let url = server.url();
        async move {
            Arc::new(
                RedisStore::connect(&url)
                    .await
                    .unwrap()
                    .with_namespace("rate-tests")
                    .with_member(name)
                    .with_timeout(Duration::from_millis(100))
                    .with_retry_interval(Duration::from_millis(100)),
            )
        }
    };
    let (store_a, store_b) = (member("web-1").await, member("web-2").await);
    let provider = Scripted::new("ses");
    let build = |store: &Arc<RedisStore>| {
        limiter(&provider, store, 4.0)
            .burst(8)
            .max_wait(Duration::ZERO)
            .build()
            .unwrap()
    };
    let (a, b) = (build(&store_a), build(&store_b));
    a.send(&support::message()).await.unwrap();
    b.send(&support::message()).await.unwrap();
    a.send(&support::message()).await.unwrap(); // a has now seen both
    server.stop();

    assert_eq!(sent_at_once(&a, 6).await, 4, "half the burst of 8");
    assert_eq!(a.per_second(), 2.0, "half the rate");
}

/// DESIGN §13: knowing neither `.members(n)` nor who shares it, the fallback takes the full
/// rate and burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_from_the_start_a_limiter_takes_the_full_rate_and_burst() {
    let Some(mut server) = RedisServer::start("rate_fallback_unknown") else {
        return;
    };
    let store = store(&server).await;
    server.stop();
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 4.0)
        .burst(8)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();

    assert_eq!(sent_at_once(&limited, 9).await, 8);
    assert_eq!(limited.per_second(), 4.0);
}

/// Issue 45, point 13, in the fleet's script: a shared limiter that counts recipients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_limiter_that_counts_recipients_charges_one_slot_per_recipient() {
    let Some(server) = RedisServer::start("rate_shared_recipients") else {
        return;
    };
    let store = store(&server).await;
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, &store, 1.0)
        .burst(3)
        .max_wait(Duration::ZERO)
        .cost_per_recipient()
        .build()
        .unwrap();
    let to_three = lettre::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("a@example.org".parse().unwrap())
        .to("b@example.org".parse().unwrap())
        .to("c@example.org".parse().unwrap())
        .body(String::from("hi"))
        .unwrap();

    limited.send(&to_three).await.unwrap();
    let refused = limited.send(&support::message()).await.unwrap_err();

    assert_eq!(
        refused.code(),
        "rate.limited",
        "the burst of 3 went to one message"
    );
}
