//! Five OS processes share one rate through Redis: each sends as fast as its limiter lets it
//! for 10 s to one Postmark-like API, which must see the shared rate and throttle nothing.
//! Once on one redis-server, once on a 3-master Redis Cluster.
//!
//! The test runs its own binary as the fleet's members: the ignored test `rate_fleet_member`
//! does a member's work when `MAIL_BREAKER_RATE_FLEET_REDIS` is set.
#![cfg(all(feature = "redis", feature = "postmark"))]

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mail_breaker::{PostmarkTransport, RateLimitTransport, RedisStore, Transport};
use support::redis::RedisServer;
use support::redis_cluster::RedisCluster;
use support::throttling::{TOKEN, ThrottlingApi};

const MEMBERS: usize = 5;
const PER_SECOND: f64 = 50.0;
const RUN_FOR: Duration = Duration::from_secs(10);
/// Sends each member keeps under way at once: as fast as the limiter lets it.
const SENDERS: usize = 4;

const REDIS: &str = "MAIL_BREAKER_RATE_FLEET_REDIS";
const CLUSTER: &str = "MAIL_BREAKER_RATE_FLEET_CLUSTER";
const API: &str = "MAIL_BREAKER_RATE_FLEET_API";
const START: &str = "MAIL_BREAKER_RATE_FLEET_START_MS";

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// One member: from the common start, sends through a limiter sharing `per_second(50)` with
/// the fleet for RUN_FOR; a send whose slot comes after the end is not made.
#[test]
#[ignore = "a fleet member, run as a child process by the tests below"]
fn rate_fleet_member() {
    let Ok(redis) = std::env::var(REDIS) else {
        return;
    };
    let api = std::env::var(API).expect("the API's endpoint");
    let start: u64 = std::env::var(START)
        .expect("the start")
        .parse()
        .expect("a time");
    let cluster = std::env::var_os(CLUSTER).is_some();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let store = if cluster {
            let urls: Vec<&str> = redis.split(',').collect();
            RedisStore::connect_cluster(&urls).await
        } else {
            RedisStore::connect(&redis).await
        };
        let store = Arc::new(store.expect("a store").with_namespace("rate-fleet"));
        let postmark = PostmarkTransport::new(TOKEN)
            .with_endpoint(api)
            .with_timeout(Duration::from_secs(2));
        let limiter = Arc::new(
            RateLimitTransport::builder(postmark)
                .name("postmark")
                .per_second(PER_SECOND)
                .max_wait(Duration::from_secs(5))
                .members(MEMBERS as u32)
                .shared(Arc::clone(&store))
                .build()
                .expect("valid settings"),
        );
        let wait = Duration::from_millis(start.saturating_sub(unix_millis()));
        tokio::time::sleep(wait).await;
        let end = tokio::time::Instant::now() + RUN_FOR;
        let senders: Vec<_> = (0..SENDERS)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    let message = support::message();
                    while tokio::time::Instant::now() < end {
                        match tokio::time::timeout_at(end, limiter.send(&message)).await {
                            Ok(Ok(_)) | Err(_) => {}
                            Ok(Err(error)) => panic!("a send failed: {error}"),
                        }
                    }
                })
            })
            .collect();
        for sender in senders {
            sender.await.expect("a sender ran");
        }
    });
}

/// Runs the five members against `redis` (a URL, or the cluster's URLs joined by commas) and
/// an API that takes up to 60 a second; what the API took and throttled.
async fn run_fleet(redis: &str, cluster: bool) -> (usize, usize) {
    let api = ThrottlingApi::start(PER_SECOND * 1.2).await;
    let start = unix_millis() + 2_000; // time for every member to start and connect
    let program = std::env::current_exe().expect("the test binary's path");
    let members: Vec<_> = (0..MEMBERS)
        .map(|_| {
            let mut command = Command::new(&program);
            command
                .args(["rate_fleet_member", "--exact", "--ignored", "--nocapture"])
                .env(REDIS, redis)
                .env(API, api.endpoint())
                .env(START, start.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            if cluster {
                command.env(CLUSTER, "1");
            }
            command.spawn().expect("starting a fleet member")
        })
        .collect();
    let statuses = tokio::task::spawn_blocking(move || {
        members
            .into_iter()
            .map(|mut member| member.wait().expect("a member's end"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("waiting for the members");
    assert!(
        statuses.iter().all(|status| status.success()),
        "{statuses:?}"
    );
    api.answers(
        Instant::now() - Duration::from_secs(60),
        Duration::from_secs(120),
    )
}

fn assert_paced(taken: usize, throttled: usize) {
    eprintln!("the API took {taken}, throttled {throttled}");
    let expected = PER_SECOND * RUN_FOR.as_secs_f64();
    assert!(
        (taken as f64 - expected).abs() <= 0.05 * expected,
        "{MEMBERS} processes at {PER_SECOND}/s for {RUN_FOR:?}: the API took {taken}"
    );
    assert_eq!(throttled, 0, "the API throttled {throttled} sends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_sharing_one_rate_through_redis_send_at_that_rate_together() {
    let Some(server) = RedisServer::start("rate_fleet_redis") else {
        return;
    };
    let (taken, throttled) = run_fleet(&server.url(), false).await;
    assert_paced(taken, throttled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_sharing_one_rate_through_a_redis_cluster_send_at_that_rate_together() {
    let Some(cluster) = RedisCluster::start("rate_fleet_cluster") else {
        return;
    };
    let (taken, throttled) = run_fleet(&cluster.urls().join(","), true).await;
    assert_paced(taken, throttled);
}
