//! A member's own breaker beside the fleet's (`RedisStore::with_quorum` above 1), on one real
//! redis-server: what a member shows, and the own permit it gives back when the fleet refuses.
//!
//! The fleet's breaker runs on a clock the test moves (`with_clock_for_tests`), so it stays
//! open until the test says; each member's own breaker runs on real time.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mail_breaker::breaker::{Counting, Decision, Outcome, Rules};
use mail_breaker::store::Reporter;
use mail_breaker::{BreakerStore, RedisStore, State};
use support::redis::RedisServer;

const KEY: &str = "provider";
/// Any time will do for the fleet's clock, as long as the test is the one that moves it.
const EPOCH_MICROS: u64 = 1_700_000_000_000_000;
/// Long enough that no call falls back on a busy machine.
const PATIENT: Duration = Duration::from_secs(2);

/// One failure opens each breaker, for 200 ms; a probe may take 30 s.
fn rules() -> Rules {
    Rules {
        counting: Counting::Consecutive { threshold: 1 },
        reset_timeout: Duration::from_millis(200),
        probe_timeout: Duration::from_secs(30),
        half_open_successes: 1,
        max_reset_timeout: None,
    }
}

/// A member of a fleet with a quorum of 2, whose fleet breaker reads `clock`.
async fn member(server: &RedisServer, name: &str, clock: &Arc<AtomicU64>) -> RedisStore {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a valid URL")
        .with_namespace("quorum")
        .with_timeout(PATIENT)
        .with_quorum(2)
        .with_member(name)
        .with_clock_for_tests(Arc::clone(clock));
    assert!(store.is_shared(), "{name} reaches the test's redis-server");
    store
}

/// One send through `store` that ends with `outcome`.
async fn send(store: &RedisStore, outcome: Outcome) {
    let rules = rules();
    let (Decision::Send(permit), _) = store.acquire(KEY, &rules, &Reporter::none()).await else {
        panic!("expected leave to send");
    };
    store
        .record(KEY, &rules, permit, outcome, &Reporter::none())
        .await;
}

#[tokio::test]
async fn a_member_held_open_by_its_own_breaker_shows_its_own_breaker_in_its_snapshot() {
    let Some(server) = RedisServer::start("quorum_own_snapshot") else {
        return;
    };
    let clock = Arc::new(AtomicU64::new(EPOCH_MICROS));
    let web7 = member(&server, "web-7", &clock).await;
    send(&web7, Outcome::Failure).await;

    let snapshot = web7.snapshot(KEY, &rules(), &Reporter::none()).await;
    assert_eq!(snapshot.state(), State::Open, "{snapshot:?}");
    assert_eq!(snapshot.failures(), 1);
    let fleet = member(&server, "web-8", &clock).await;
    let seen = fleet.snapshot(KEY, &rules(), &Reporter::none()).await;
    assert_eq!(seen.state(), State::Closed, "one member of two failed");
}

#[tokio::test]
async fn a_members_own_probe_is_given_back_when_the_fleet_refuses_it() {
    let Some(server) = RedisServer::start("quorum_own_probe_back") else {
        return;
    };
    let clock = Arc::new(AtomicU64::new(EPOCH_MICROS));
    let (web7, web8) = (
        member(&server, "web-7", &clock).await,
        member(&server, "web-8", &clock).await,
    );
    send(&web7, Outcome::Failure).await;
    send(&web8, Outcome::Failure).await; // two members: the fleet's breaker opens

    // web-7's own breaker is half-open by now; the fleet's, on the stopped clock, is open.
    tokio::time::sleep(rules().reset_timeout + Duration::from_millis(50)).await;
    let (refused, _) = web7.acquire(KEY, &rules(), &Reporter::none()).await;
    assert!(
        matches!(refused, Decision::Refuse { .. }),
        "the fleet is open: {refused:?}"
    );

    clock.fetch_add(
        u64::try_from(rules().reset_timeout.as_micros()).expect("short"),
        Ordering::Relaxed,
    );
    let (decision, _) = web7.acquire(KEY, &rules(), &Reporter::none()).await;
    assert!(
        matches!(decision, Decision::Send(permit) if permit.is_probe()),
        "the fleet lets a probe go, and web-7's own probe was given back: {decision:?}"
    );
}
