//! `RedisStore` at its edges: calls whose callers stopped waiting, calls that timed out here
//! but ran on the server, probes given back late, outages one after another, and settings
//! Redis itself would refuse. Each test runs its own redis-server, in real time.
#![cfg(feature = "redis")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::breaker::{Counting, Decision, Outcome, Permit, Rules};
use mail_breaker::store::Reporter;
use mail_breaker::{BreakerStore, RedisStore, State};
use support::redis::RedisServer;

const KEY: &str = "provider";
const RESET: Duration = Duration::from_millis(300);
/// Long enough that no call of a sharing test falls back on a busy machine.
const PATIENT: Duration = Duration::from_secs(2);
/// The timeout of the stores whose calls are meant to time out.
const IMPATIENT: Duration = Duration::from_millis(100);

async fn store(server: &RedisServer, timeout: Duration) -> RedisStore {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a valid URL")
        .with_namespace("fleet")
        .with_timeout(timeout)
        .with_retry_interval(Duration::from_millis(200));
    assert!(
        store.is_shared(),
        "the store reaches the test's redis-server"
    );
    store
}

/// One failure opens; `probe_timeout` as given.
fn rules(probe_timeout: Duration) -> Rules {
    Rules {
        counting: Counting::Consecutive { threshold: 1 },
        reset_timeout: RESET,
        probe_timeout,
        half_open_successes: 1,
        max_reset_timeout: None,
    }
}

type Heard = Arc<Mutex<Vec<(State, State)>>>;

/// A reporter that keeps what it is told.
fn listener() -> (Heard, Reporter) {
    let heard: Heard = Arc::default();
    let sink = Arc::clone(&heard);
    let late = Reporter::new(move |_key, changes| {
        sink.lock()
            .unwrap()
            .extend(changes.iter().map(|t| (t.from, t.to)));
    });
    (heard, late)
}

async fn granted(store: &RedisStore, rules: &Rules) -> Permit {
    match store.acquire(KEY, rules, &Reporter::none()).await.0 {
        Decision::Send(permit) => permit,
        refused => panic!("expected leave to send, got {refused:?}"),
    }
}

/// Opens the shared breaker with one failure, then waits out its reset timeout.
async fn open_then_wait(store: &RedisStore, rules: &Rules) {
    let permit = granted(store, rules).await;
    store
        .record(KEY, rules, permit, Outcome::Failure, &Reporter::none())
        .await;
    tokio::time::sleep(RESET + Duration::from_millis(20)).await;
}

async fn pttl(server: &RedisServer) -> i64 {
    let mut redis = redis::Client::open(server.url())
        .expect("a valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    redis::cmd("PTTL")
        .arg("mail-breaker:fleet:{provider}")
        .query_async(&mut redis)
        .await
        .expect("PTTL")
}

#[tokio::test]
async fn a_probe_given_back_after_its_deadline_reopens_the_shared_breaker_and_is_heard() {
    let Some(server) = RedisServer::start("redis_probe_given_back_late") else {
        return;
    };
    let store = store(&server, PATIENT).await;
    let rules = rules(Duration::from_millis(100));
    open_then_wait(&store, &rules).await;
    let probe = granted(&store, &rules).await;
    assert!(probe.is_probe());

    // Given back 50 ms past its deadline: the breaker reopens until 300 ms after the deadline.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (heard, late) = listener();
    store.release(KEY, &rules, probe, &late);
    tokio::time::sleep(Duration::from_millis(50)).await;

    assert_eq!(*heard.lock().unwrap(), [(State::HalfOpen, State::Open)]);
    let (decision, _) = store.acquire(KEY, &rules, &Reporter::none()).await;
    assert!(
        matches!(decision, Decision::Refuse { .. }),
        "reopened from the deadline, so no second probe goes: {decision:?}"
    );
}

#[tokio::test]
async fn an_acquire_whose_caller_stopped_waiting_reports_the_changes_it_made_and_gives_its_probe_back()
 {
    let Some(server) = RedisServer::start("redis_abandoned_acquire_heard") else {
        return;
    };
    let store = store(&server, PATIENT).await;
    let rules = rules(Duration::from_secs(60));
    open_then_wait(&store, &rules).await;

    let (heard, late) = listener();
    {
        let mut abandoned = store.acquire(KEY, &rules, &late);
        // One poll sends the acquire to Redis, which moves to half-open and grants the probe.
        assert!(futures::poll!(&mut abandoned).is_pending());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert_eq!(*heard.lock().unwrap(), [(State::Open, State::HalfOpen)]);
    let probe = granted(&store, &rules).await;
    assert!(probe.is_probe(), "the abandoned probe was given back");
}

#[tokio::test]
async fn a_record_whose_caller_stopped_waiting_reports_the_changes_it_made() {
    let Some(server) = RedisServer::start("redis_abandoned_record_heard") else {
        return;
    };
    let store = store(&server, PATIENT).await;
    let rules = rules(Duration::from_secs(60));
    open_then_wait(&store, &rules).await;
    let probe = granted(&store, &rules).await;

    let (heard, late) = listener();
    {
        let mut abandoned = store.record(KEY, &rules, probe, Outcome::Success, &late);
        assert!(futures::poll!(&mut abandoned).is_pending());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert_eq!(*heard.lock().unwrap(), [(State::HalfOpen, State::Closed)]);
}

#[tokio::test]
async fn a_probe_granted_by_a_call_that_timed_out_here_but_ran_on_redis_is_given_back() {
    let Some(server) = RedisServer::start("redis_late_reply_gives_probe_back") else {
        return;
    };
    let impatient = store(&server, IMPATIENT).await;
    let other = store(&server, PATIENT).await;
    let rules = rules(Duration::from_secs(60));
    open_then_wait(&other, &rules).await;

    server.freeze();
    let (heard, late) = listener();
    let (decision, _) = impatient.acquire(KEY, &rules, &late).await;
    // The acquire gave up here after IMPATIENT and decided locally; Redis runs it on thawing.
    assert!(!impatient.is_shared(), "decided locally: {decision:?}");
    server.thaw();
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert_eq!(
        *heard.lock().unwrap(),
        [(State::Open, State::HalfOpen)],
        "the late answer's change was heard"
    );
    let probe = granted(&other, &rules).await;
    assert!(
        probe.is_probe(),
        "the probe Redis granted to nobody was given back, not held for 60 s"
    );
}

#[tokio::test]
async fn a_store_connected_while_redis_is_down_decides_locally_from_its_first_call() {
    let Some(mut server) = RedisServer::start("redis_down_at_connect") else {
        return;
    };
    server.stop();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a Redis that does not answer yet is not an error");
    assert!(!store.is_shared(), "connecting found Redis silent");
    let (decision, _) = store.acquire(KEY, &rules(PATIENT), &Reporter::none()).await;
    assert!(matches!(decision, Decision::Send(_)), "{decision:?}");
    assert_eq!(store.local_decisions(), 1);
}

/// Leave for `key`, then its result.
async fn send(store: &RedisStore, key: &str, rules: &Rules, outcome: Outcome) {
    match store.acquire(key, rules, &Reporter::none()).await.0 {
        Decision::Send(permit) => {
            store
                .record(key, rules, permit, outcome, &Reporter::none())
                .await;
        }
        refused => panic!("expected leave to send for {key}, got {refused:?}"),
    }
}

#[tokio::test]
async fn a_breaker_last_seen_open_is_remembered_while_closed_ones_come_and_go() {
    let Some(server) = RedisServer::start("redis_seen_open_kept") else {
        return;
    };
    let store = store(&server, PATIENT).await.with_max_keys(2);
    let rules = rules(PATIENT);
    send(&store, "open.example", &rules, Outcome::Failure).await;
    for key in ["a.example", "b.example", "c.example"] {
        send(&store, key, &rules, Outcome::Success).await;
    }
    assert_eq!(store.state("open.example", &rules).0, State::Open);
    assert_eq!(store.tracked_keys(), 2, "within max_keys");
}

#[tokio::test]
async fn in_an_outage_a_breaker_started_open_stays_open_while_closed_ones_come_and_go() {
    let Some(mut server) = RedisServer::start("redis_outage_open_kept") else {
        return;
    };
    let store = store(&server, IMPATIENT).await.with_max_keys(2);
    let rules = Rules {
        reset_timeout: Duration::from_secs(30),
        ..rules(Duration::from_secs(30))
    };
    send(&store, "open.example", &rules, Outcome::Failure).await;
    server.stop();
    let refused = |decision: &Decision| matches!(decision, Decision::Refuse { .. });
    let (first, _) = store
        .acquire("open.example", &rules, &Reporter::none())
        .await;
    assert!(!store.is_shared());
    assert!(
        refused(&first),
        "last seen open, so it starts open: {first:?}"
    );
    for key in ["a.example", "b.example", "c.example"] {
        send(&store, key, &rules, Outcome::Success).await;
    }
    let (again, _) = store
        .acquire("open.example", &rules, &Reporter::none())
        .await;
    assert!(refused(&again), "still open: {again:?}");
}

#[tokio::test]
async fn each_outage_starts_from_the_state_last_seen_in_redis_not_from_an_earlier_outage() {
    let Some(mut server) = RedisServer::start("redis_second_outage_from_redis") else {
        return;
    };
    let store = store(&server, IMPATIENT).await;
    let rules = Rules {
        reset_timeout: Duration::from_secs(30),
        ..rules(Duration::from_secs(30))
    };

    // Outage 1: a failure opens this process's local breaker.
    server.stop();
    let permit = granted(&store, &rules).await;
    store
        .record(KEY, &rules, permit, Outcome::Failure, &Reporter::none())
        .await;
    let (refused, _) = store.acquire(KEY, &rules, &Reporter::none()).await;
    assert!(matches!(refused, Decision::Refuse { .. }), "{refused:?}");

    // Redis is back and says the breaker is closed.
    server.restart();
    tokio::time::sleep(Duration::from_millis(300)).await; // past the retry interval
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (decision, _) = store.acquire(KEY, &rules, &Reporter::none()).await;
        if store.is_shared() {
            assert!(matches!(decision, Decision::Send(_)), "{decision:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis never answered again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Outage 2 starts from "closed", not from outage 1's open breaker.
    server.stop();
    let (decision, _) = store.acquire(KEY, &rules, &Reporter::none()).await;
    assert!(!store.is_shared());
    assert!(
        matches!(decision, Decision::Send(permit) if !permit.is_probe()),
        "last seen closed in Redis, so sends go: {decision:?}"
    );
}

#[tokio::test]
async fn giving_a_probe_back_keeps_the_expiry_the_breakers_timeouts_need() {
    let Some(server) = RedisServer::start("redis_release_keeps_expiry") else {
        return;
    };
    let store = store(&server, PATIENT).await;
    // A two-hour probe timeout: the key must outlive it, well past the default idle hour.
    let rules = rules(Duration::from_secs(2 * 3600));
    open_then_wait(&store, &rules).await;
    let probe = granted(&store, &rules).await;
    store.release(KEY, &rules, probe, &Reporter::none());
    tokio::time::sleep(Duration::from_millis(200)).await;

    let ttl = pttl(&server).await;
    assert!(
        ttl > 3 * 3600 * 1000,
        "the release kept the key for the probe timeout's sake (PTTL {ttl} ms)"
    );
}

#[tokio::test]
async fn an_idle_expiry_of_duration_max_still_shares_state() {
    let Some(server) = RedisServer::start("redis_idle_expiry_max") else {
        return;
    };
    let forever = store(&server, PATIENT)
        .await
        .with_idle_expiry(Duration::MAX);
    let other = store(&server, PATIENT).await;
    let rules = rules(Duration::from_secs(60));
    let permit = granted(&forever, &rules).await;
    forever
        .record(KEY, &rules, permit, Outcome::Failure, &Reporter::none())
        .await;

    assert!(forever.is_shared(), "Redis took the write");
    let (decision, _) = other.acquire(KEY, &rules, &Reporter::none()).await;
    assert!(
        matches!(decision, Decision::Refuse { .. }),
        "the other store sees the breaker open: {decision:?}"
    );
    assert!(pttl(&server).await > 0, "the key still expires, far ahead");
}

/// A provider that freezes the Redis server (SIGSTOP) while it sends, so the breaker's
/// record meets a Redis that does not answer.
struct FreezesRedis(Arc<RedisServer>);

#[async_trait::async_trait]
impl mail_breaker::Transport for FreezesRedis {
    fn name(&self) -> &str {
        KEY
    }

    async fn send_raw(
        &self,
        _: &mail_breaker::Envelope,
        _: &[u8],
    ) -> Result<mail_breaker::Receipt, mail_breaker::SendError> {
        self.0.freeze();
        Ok(mail_breaker::Receipt::new(KEY))
    }
}

#[tokio::test]
async fn redis_frozen_between_acquire_and_record_holds_the_send_one_timeout_at_most() {
    let Some(server) = RedisServer::start("redis_frozen_before_record") else {
        return;
    };
    let server = Arc::new(server);
    let timeout = Duration::from_millis(250);
    // Redis is not tried again for 5 s after the frozen record: a send that waited for that
    // too would take 5 s, far past the bound below.
    let store = store(&server, timeout)
        .await
        .with_retry_interval(Duration::from_secs(5));
    let store = Arc::new(store);
    let breaker = mail_breaker::CircuitBreakerTransport::builder(FreezesRedis(Arc::clone(&server)))
        .store(Arc::clone(&store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings");
    let took = {
        use mail_breaker::Transport;
        let started = std::time::Instant::now();
        breaker
            .send(&support::message())
            .await
            .expect("delivered; the record is lost, not the send");
        started.elapsed()
    };
    server.thaw();
    assert!(!store.is_shared(), "the record met a frozen Redis");
    // One timeout and the send's own work, never a second timeout nor the retry interval: the
    // bound sits between one timeout and two, so that a loaded machine's slowness (a run under
    // `stress` took 304 ms) does not fail it and a record that waited twice (500 ms) does.
    assert!(
        took < timeout * 2,
        "the send waited {took:?}: one timeout ({timeout:?}), not two"
    );
}
