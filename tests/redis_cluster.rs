//! The shared breaker on a real Redis Cluster (issue 15): keys spread over every master,
//! one probe among racing stores, the quorum, and a master killed mid-run. Each test starts
//! its own cluster of `redis-server --cluster-enabled yes` nodes on free loopback ports.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use mail_breaker::breaker::{Counting, Decision, Outcome, Rules};
use mail_breaker::store::Reporter;
use mail_breaker::{BreakerStore, Category, CircuitBreakerTransport, RedisStore, State, Transport};
use support::message;
use support::redis_cluster::RedisCluster;
use support::scripted::{Reply, Scripted};

const RESET: Duration = Duration::from_millis(300);
/// The timeout of the stores in the tests of sharing: long enough that no call falls back
/// on a machine busy with other tests.
const PATIENT: Duration = Duration::from_secs(2);

fn rules(threshold: u32) -> Rules {
    Rules {
        counting: Counting::Consecutive { threshold },
        reset_timeout: RESET,
        probe_timeout: RESET,
        half_open_successes: 1,
        max_reset_timeout: None,
    }
}

async fn cluster_store(cluster: &RedisCluster, namespace: &str, timeout: Duration) -> RedisStore {
    let store = RedisStore::connect_cluster(&cluster.urls())
        .await
        .expect("valid URLs")
        .with_namespace(namespace)
        .with_timeout(timeout)
        .with_retry_interval(Duration::from_millis(200));
    assert!(store.is_shared(), "the store reaches the test's cluster");
    store
}

/// Opens the breaker of `key` in `store` with one failure (threshold 1).
async fn open(store: &RedisStore, key: &str, rules: &Rules) {
    let late = Reporter::none();
    let (Decision::Send(permit), _) = store.acquire(key, rules, &late).await else {
        panic!("{key}: a closed breaker lets the send go");
    };
    store
        .record(key, rules, permit, Outcome::Failure, &late)
        .await;
}

fn transports() -> Vec<String> {
    (0..20)
        .map(|i| format!("smtp://relay-{i}.example"))
        .collect()
}

#[tokio::test]
async fn twenty_transports_spread_over_every_master_share_state_between_two_stores() {
    let Some(cluster) = RedisCluster::start("twenty_transports_on_a_cluster") else {
        return;
    };
    let (a, b) = (
        cluster_store(&cluster, "spread", PATIENT).await,
        cluster_store(&cluster, "spread", PATIENT).await,
    );
    let rules = rules(1);
    let late = Reporter::none();
    for key in transports() {
        open(&a, &key, &rules).await;
        let (decision, _) = b.acquire(&key, &rules, &late).await;
        assert!(
            matches!(decision, Decision::Refuse { .. }),
            "{key}: the other store sees the breaker open, it decided {decision:?}"
        );
        assert_eq!(b.state(&key, &rules).0, State::Open, "{key}");
    }
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "three masters");
    for port in &masters {
        assert!(
            cluster.keys_on(*port) > 0,
            "the master on port {port} holds some of the breakers"
        );
    }
    // snapshots() scans every master.
    let mut found: Vec<String> = b
        .snapshots(&rules, &late)
        .await
        .iter()
        .map(|snapshot| snapshot.key().to_owned())
        .collect();
    found.sort();
    let mut expected = transports();
    expected.sort();
    assert_eq!(found, expected, "every breaker, whichever master holds it");
    assert!(
        a.is_shared() && b.is_shared(),
        "every decision came from the cluster"
    );
}

#[tokio::test]
async fn two_hundred_sends_racing_across_two_cluster_stores_yield_exactly_one_probe() {
    let Some(cluster) = RedisCluster::start("two_hundred_sends_on_a_cluster") else {
        return;
    };
    let stores = [
        cluster_store(&cluster, "race", PATIENT).await,
        cluster_store(&cluster, "race", PATIENT).await,
    ];
    let rules = rules(1);
    for key in transports() {
        open(&stores[0], &key, &rules).await;
    }
    tokio::time::sleep(RESET + Duration::from_millis(100)).await;
    let late = Reporter::none();
    for key in transports() {
        let decisions =
            join_all((0..200).map(|i| stores[i % 2].acquire(&key, &rules, &late))).await;
        let probes = decisions
            .iter()
            .filter(|(decision, _)| matches!(decision, Decision::Send(permit) if permit.is_probe()))
            .count();
        let refused = decisions
            .iter()
            .filter(|(decision, _)| matches!(decision, Decision::Refuse { .. }))
            .count();
        assert_eq!((probes, refused), (1, 199), "{key}: exactly one probe");
    }
    assert!(stores.iter().all(RedisStore::is_shared));
}

/// A breaker named "provider" on `store`, failing or delivering every send.
fn member(store: &Arc<RedisStore>, working: bool) -> CircuitBreakerTransport<Scripted> {
    let reply = if working {
        Reply::Ok
    } else {
        Reply::fail(Category::Network)
    };
    CircuitBreakerTransport::builder(Scripted::answering("provider", reply))
        .failure_threshold(3)
        .reset_timeout(Duration::from_secs(30))
        .store(Arc::clone(store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings")
}

fn refused(result: &Result<mail_breaker::Receipt, mail_breaker::SendError>) -> bool {
    matches!(result, Err(error) if error.code() == "breaker.open")
}

#[tokio::test]
async fn with_a_quorum_of_two_one_members_failures_open_only_its_own_breaker() {
    let Some(cluster) = RedisCluster::start("quorum_on_a_cluster") else {
        return;
    };
    let mut stores = Vec::new();
    for name in ["web-1", "web-2", "web-3"] {
        let store = cluster_store(&cluster, "quorum", PATIENT)
            .await
            .with_quorum(2)
            .with_member(name);
        stores.push(Arc::new(store));
    }
    let sick = member(&stores[0], false);
    let healthy = member(&stores[1], true);
    let bystander = member(&stores[2], true);

    for _ in 0..3 {
        assert!(!refused(&sick.send(&message()).await));
    }
    // Three failures in a row: the rule is met, but by one member only.
    assert!(
        refused(&sick.send(&message()).await),
        "the sick member holds its sends"
    );
    assert_eq!(sick.state(), State::Open);
    assert_eq!(sick.inner().sends(), 3);
    assert!(
        healthy.send(&message()).await.is_ok(),
        "the others go on sending"
    );
    assert_eq!(healthy.state(), State::Closed);
    assert!(bystander.send(&message()).await.is_ok());

    // The successes cleared the count: a second member failing alone opens nothing either.
    let second = member(&stores[1], false);
    for _ in 0..3 {
        assert!(!refused(&second.send(&message()).await));
    }
    assert!(refused(&second.send(&message()).await));
    assert!(
        bystander.send(&message()).await.is_ok(),
        "one sick member at a time"
    );

    // Failures from two members in one count open everyone's breaker: web-3 fails twice
    // (its own breaker stays closed), then web-4 once, the third failure in a row.
    let first_again = member(&stores[0], false);
    let third = member(&stores[2], false);
    assert!(!refused(&third.send(&message()).await));
    assert!(!refused(&third.send(&message()).await));
    let fresh = Arc::new(
        cluster_store(&cluster, "quorum", PATIENT)
            .await
            .with_quorum(2)
            .with_member("web-4"),
    );
    let fourth = member(&fresh, false);
    assert!(!refused(&fourth.send(&message()).await));
    assert!(
        refused(&bystander.send(&message()).await),
        "the fleet's breaker is open"
    );
    assert!(refused(&first_again.send(&message()).await));
    let newcomer = Arc::new(
        cluster_store(&cluster, "quorum", PATIENT)
            .await
            .with_quorum(2)
            .with_member("web-5"),
    );
    let fifth = member(&newcomer, true);
    assert!(
        refused(&fifth.send(&message()).await),
        "even for a member that never failed"
    );
    assert_eq!(fifth.state(), State::Open);
    assert_eq!(fifth.inner().sends(), 0);
    assert!(stores.iter().all(|store| store.is_shared()));
}

#[tokio::test]
async fn a_master_killed_mid_run_never_holds_a_send_past_the_timeout_and_sharing_resumes() {
    let Some(mut cluster) =
        RedisCluster::start_with("master_killed_mid_run", 3, 1, Duration::from_millis(1000))
    else {
        return;
    };
    const TIMEOUT: Duration = Duration::from_millis(100);
    // What a loaded two-core machine adds to a call that gives up at the timeout.
    const MARGIN: Duration = Duration::from_millis(250);
    let a = cluster_store(&cluster, "failover", TIMEOUT).await;
    let b = cluster_store(&cluster, "failover", TIMEOUT).await;
    let rules = rules(1_000);
    let late = Reporter::none();
    let keys = transports();
    let victim_key = &keys[0];
    let victim = cluster.master_of(&format!("mail-breaker:failover:{{{victim_key}}}"));

    let started = Instant::now();
    let mut killed = false;
    let mut longest = Duration::ZERO;
    let mut fell_back = false;
    let mut calls = 0;
    while started.elapsed() < Duration::from_secs(6) {
        if !killed && started.elapsed() > Duration::from_millis(500) {
            cluster.kill(victim);
            killed = true;
        }
        for key in &keys {
            let store = if calls % 2 == 0 { &a } else { &b };
            calls += 1;
            let asked = Instant::now();
            let (decision, _) = store.acquire(key, &rules, &late).await;
            longest = longest.max(asked.elapsed());
            if let Decision::Send(permit) = decision {
                let asked = Instant::now();
                store
                    .record(key, &rules, permit, Outcome::Success, &late)
                    .await;
                longest = longest.max(asked.elapsed());
            }
            fell_back |= !store.is_shared();
        }
    }
    println!("{calls} sends; the longest call took {longest:?}");
    assert!(fell_back, "the stores noticed the dead master");
    assert!(
        longest <= TIMEOUT + MARGIN,
        "a call waited {longest:?}, longer than the timeout {TIMEOUT:?}"
    );

    // Once the replica took over, the stores share state again, on the moved keys too.
    cluster.wait_until_healthy(Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(30);
    let opening = rules_of_one();
    loop {
        if let (Decision::Send(permit), _) = a.acquire(victim_key, &opening, &late).await {
            a.record(victim_key, &opening, permit, Outcome::Failure, &late)
                .await;
        }
        let (decision, _) = b.acquire(victim_key, &opening, &late).await;
        if matches!(decision, Decision::Refuse { .. }) && a.is_shared() && b.is_shared() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stores did not share state again after the failover"
        );
        if let Decision::Send(permit) = decision {
            b.release(victim_key, &opening, permit, &late);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cluster.master_ports().len() == 3,
        "the replica took over: three masters again"
    );
}

/// A breaker that one failure opens, for a long time.
fn rules_of_one() -> Rules {
    Rules {
        reset_timeout: Duration::from_secs(60),
        probe_timeout: Duration::from_secs(60),
        ..rules(1)
    }
}

#[tokio::test]
async fn a_cluster_store_needs_at_least_one_node_and_valid_urls() {
    let none: [&str; 0] = [];
    let error = RedisStore::connect_cluster(&none).await.unwrap_err();
    assert!(error.to_string().contains("urls"), "{error}");
    assert!(RedisStore::connect_cluster(&["not a url"]).await.is_err());
}
