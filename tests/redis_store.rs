//! Breakers sharing a `RedisStore` (issue 4, acceptance 1 and 3), each test against its own
//! real redis-server on a free loopback port, in real time.
#![cfg(feature = "redis")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use mail_breaker::breaker::{Decision, Rules};
use mail_breaker::store::Reporter;
use mail_breaker::{
    BreakerStore, Category, CircuitBreakerTransport, RedisStore, State, StateChange, Transport,
};
use support::message;
use support::redis::RedisServer;
use support::scripted::{Reply, Scripted};
use tracing_subscriber::layer::SubscriberExt;

const RESET: Duration = Duration::from_millis(300);
/// The timeout of the stores in the tests of the fallback.
const TIMEOUT: Duration = Duration::from_millis(100);
/// The timeout of the stores in the tests of sharing: long enough that no call falls back
/// on a machine busy with other tests.
const PATIENT: Duration = Duration::from_secs(2);

/// The changes of state one breaker's listener heard.
type Heard = Arc<Mutex<Vec<(State, State)>>>;

/// A store on its own connection to `server`, in the namespace every test breaker shares.
async fn store(server: &RedisServer) -> Arc<RedisStore> {
    store_with_timeout(server, TIMEOUT).await
}

async fn store_with_timeout(server: &RedisServer, timeout: Duration) -> Arc<RedisStore> {
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
    Arc::new(store)
}

/// A breaker on `store` guarding `inner` (named "provider", the key every breaker shares).
fn breaker(
    inner: &Scripted,
    store: &Arc<RedisStore>,
    threshold: u32,
) -> (CircuitBreakerTransport<Scripted>, Heard) {
    let heard: Heard = Arc::default();
    let listener = Arc::clone(&heard);
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(threshold)
        .reset_timeout(RESET)
        .on_state_change(move |change: &StateChange| {
            listener.lock().unwrap().push((change.from, change.to));
        })
        .store(Arc::clone(store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings");
    (breaker, heard)
}

fn failing() -> Scripted {
    Scripted::answering("provider", Reply::fail(Category::ServerError))
}

fn is_refused(result: &Result<mail_breaker::Receipt, mail_breaker::SendError>) -> bool {
    matches!(result, Err(error) if error.code() == "breaker.open")
}

type Member = (CircuitBreakerTransport<Scripted>, Heard);

/// Two breakers, each on its own patient connection, opened together by failures split
/// between them; with a check that neither store ever decided locally.
async fn open_pair(server: &RedisServer) -> (Member, Member, impl Fn()) {
    let stores = [
        store_with_timeout(server, PATIENT).await,
        store_with_timeout(server, PATIENT).await,
    ];
    let (a, b) = (
        breaker(&failing(), &stores[0], 4),
        breaker(&failing(), &stores[1], 4),
    );
    for _ in 0..2 {
        assert!(!is_refused(&a.0.send(&message()).await));
        assert!(!is_refused(&b.0.send(&message()).await));
    }
    let both_shared = move || {
        assert!(
            stores.iter().all(|store| store.local_decisions() == 0),
            "every decision came from Redis"
        );
    };
    (a, b, both_shared)
}

#[tokio::test]
async fn by_default_a_store_has_a_quorum_of_1_its_host_and_process_as_member_namespace_default() {
    let Some(server) = RedisServer::start("a_store_defaults") else {
        return;
    };
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a valid URL");
    assert_eq!(store.quorum(), 1);
    assert_eq!(store.namespace(), "default");
    let pid = format!(":{}", std::process::id());
    assert!(store.member().ends_with(&pid), "{}", store.member());
    assert!(
        store.member().len() > pid.len(),
        "a host before the process id"
    );
}

#[tokio::test]
async fn a_store_keeps_the_quorum_member_name_and_namespace_it_is_given_and_a_quorum_of_0_is_1() {
    let Some(server) = RedisServer::start("a_store_keeps_its_quorum") else {
        return;
    };
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a valid URL");
    let store = store
        .with_quorum(3)
        .with_member("web-7")
        .with_namespace("billing");
    assert_eq!(
        (store.quorum(), store.member(), store.namespace()),
        (3, "web-7", "billing")
    );
    assert_eq!(store.with_quorum(0).quorum(), 1);
}

#[tokio::test]
async fn a_store_shows_its_settings_when_debug_printed() {
    let Some(server) = RedisServer::start("a_store_shows_its_settings") else {
        return;
    };
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a valid URL")
        .with_namespace("billing")
        .with_member("web-7")
        .with_quorum(3)
        .with_timeout(Duration::from_millis(250));
    let shown = format!("{store:?}");
    for setting in [
        "namespace: \"billing\"",
        "member: \"web-7\"",
        "quorum: 3",
        "timeout: 250ms",
        "shared: true",
    ] {
        assert!(shown.contains(setting), "{setting} in {shown}");
    }
}

#[tokio::test]
async fn two_breakers_in_one_namespace_count_failures_together_and_open_together() {
    let Some(server) = RedisServer::start("two_breakers_count_together") else {
        return;
    };
    let ((a, _), (b, _), both_shared) = open_pair(&server).await;
    assert!(is_refused(&a.send(&message()).await));
    assert!(is_refused(&b.send(&message()).await));
    assert_eq!((a.state(), b.state()), (State::Open, State::Open));
    assert_eq!(a.inner().sends() + b.inner().sends(), 4);
    both_shared();
}

#[tokio::test]
async fn two_hundred_sends_racing_across_two_breakers_in_half_open_yield_exactly_one_probe() {
    let Some(server) = RedisServer::start("two_hundred_sends_one_probe") else {
        return;
    };
    let ((a, _), (b, _), both_shared) = open_pair(&server).await;
    // The probe answers only after every other send was decided.
    a.inner()
        .set_default(Reply::after(Duration::from_millis(500), Reply::Ok));
    b.inner()
        .set_default(Reply::after(Duration::from_millis(500), Reply::Ok));
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;

    let message = message();
    let sends = (0..200).map(|i| {
        let breaker = if i % 2 == 0 { &a } else { &b };
        breaker.send(&message)
    });
    let results = join_all(sends).await;
    let refused = results.iter().filter(|r| is_refused(r)).count();
    assert_eq!((200 - refused, refused), (1, 199));
    assert_eq!(a.inner().sends() + b.inner().sends(), 4 + 1);
    both_shared();
}

#[tokio::test]
async fn a_probe_that_succeeds_closes_the_breaker_for_both() {
    let Some(server) = RedisServer::start("a_probe_closes_both") else {
        return;
    };
    let ((a, _), (b, _), both_shared) = open_pair(&server).await;
    a.inner().set_default(Reply::Ok);
    b.inner().set_default(Reply::Ok);
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;
    assert!(a.send(&message()).await.is_ok(), "the probe");
    assert_eq!(a.state(), State::Closed);
    for _ in 0..3 {
        assert!(b.send(&message()).await.is_ok());
    }
    assert_eq!(b.state(), State::Closed);
    both_shared();
}

#[tokio::test]
async fn each_change_of_state_is_heard_by_the_one_breaker_whose_call_made_it() {
    let Some(server) = RedisServer::start("each_change_heard_once") else {
        return;
    };
    let ((a, heard_a), (_b, heard_b), both_shared) = open_pair(&server).await;
    a.inner().set_default(Reply::Ok);
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;
    assert!(a.send(&message()).await.is_ok(), "the probe");

    // The fourth failure, b's, opened it; a's send found it half-open and a's probe closed it.
    assert_eq!(*heard_b.lock().unwrap(), [(State::Closed, State::Open)]);
    assert_eq!(
        *heard_a.lock().unwrap(),
        [
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Closed)
        ]
    );
    both_shared();
}

#[tokio::test]
async fn a_late_result_from_an_earlier_period_changes_nothing_in_either_breaker() {
    let Some(server) = RedisServer::start("a_late_result_changes_nothing") else {
        return;
    };
    let slow = Scripted::answering(
        "provider",
        Reply::after(
            Duration::from_millis(900),
            Reply::fail(Category::ServerError),
        ),
    );
    let quick = failing();
    let (a, _) = breaker(&slow, &store_with_timeout(&server, PATIENT).await, 1);
    let (b, _) = breaker(&quick, &store_with_timeout(&server, PATIENT).await, 1);

    let message = message();
    let late = a.send(&message); // sent while closed; fails after 900 ms
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!is_refused(&b.send(&message).await)); // opens it
        tokio::time::sleep(RESET + Duration::from_millis(50)).await;
        b.inner().set_default(Reply::Ok);
        assert!(b.send(&message).await.is_ok()); // the probe closes it
    };
    let (late, ()) = tokio::join!(late, meanwhile);
    assert!(late.is_err(), "the late send failed");

    assert_eq!(b.state(), State::Closed, "the late failure did not open it");
    b.inner().set_default(Reply::fail(Category::ServerError));
    assert!(!is_refused(&b.send(&message).await), "nor did it count");
}

/// Counts the log events whose message starts with a given name, e.g. `store.redis_unreachable`.
#[derive(Clone, Default)]
struct LogCounter(Arc<Mutex<Vec<String>>>);

impl LogCounter {
    fn count(&self, name: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.starts_with(name))
            .count()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }
}

/// Sends `count` messages one after another, `pause` apart, and returns how long each took.
async fn timed_sends(
    breaker: &CircuitBreakerTransport<Scripted>,
    count: usize,
    pause: Duration,
) -> Vec<Duration> {
    let message = message();
    let mut took = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        let _ = breaker.send(&message).await;
        took.push(start.elapsed());
        tokio::time::sleep(pause).await;
    }
    took
}

fn percentile(durations: &[Duration], percent: usize) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    sorted[(sorted.len() - 1) * percent / 100]
}

#[tokio::test]
async fn when_redis_is_killed_sends_go_on_and_the_breaker_counts_from_local_state() {
    let Some(mut server) = RedisServer::start("redis_killed_local_state") else {
        return;
    };
    let store = store(&server).await;
    let (breaker, heard) = breaker(&failing(), &store, 3);
    server.stop();

    let took = timed_sends(&breaker, 4, Duration::ZERO).await;
    assert_eq!(
        breaker.inner().sends(),
        3,
        "three failures reached the provider"
    );
    assert_eq!(
        breaker.state(),
        State::Open,
        "then the local breaker opened"
    );
    assert_eq!(*heard.lock().unwrap(), [(State::Closed, State::Open)]);
    assert!(!store.is_shared());
    assert_eq!(
        store.local_decisions(),
        4,
        "each of the four sends was decided here, Redis being down"
    );
    for took in took {
        assert!(
            took <= TIMEOUT + Duration::from_millis(100),
            "a send took {took:?}"
        );
    }
}

#[tokio::test]
async fn when_redis_is_killed_a_breaker_last_seen_open_stays_open_from_local_state() {
    let Some(mut server) = RedisServer::start("redis_killed_stays_open") else {
        return;
    };
    let (breaker, heard) = breaker(&failing(), &store(&server).await, 1);
    let _ = breaker.send(&message()).await;
    assert_eq!(breaker.state(), State::Open);
    server.stop();

    assert!(is_refused(&breaker.send(&message()).await));
    assert_eq!(
        breaker.inner().sends(),
        1,
        "nothing more reached the provider"
    );
    assert_eq!(
        *heard.lock().unwrap(),
        [(State::Closed, State::Open)],
        "heard once"
    );
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;
    breaker.inner().set_default(Reply::Ok);
    assert!(breaker.send(&message()).await.is_ok(), "the local probe");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test]
async fn a_redis_that_stops_answering_costs_a_decision_at_most_the_timeout() {
    let Some(server) = RedisServer::start("redis_frozen_timeout") else {
        return;
    };
    let store = store(&server).await;
    let (breaker, _) = breaker(&Scripted::new("provider"), &store, 3);
    server.freeze();

    // 40 sends 20 ms apart: Redis is tried again every 200 ms, each try costing the timeout.
    let took = timed_sends(&breaker, 40, Duration::from_millis(20)).await;
    server.thaw();
    let slowest = took.iter().max().copied().unwrap_or_default();
    println!(
        "frozen redis, timeout {TIMEOUT:?}: first send {:?}, median {:?}, slowest {slowest:?}",
        took[0],
        percentile(&took, 50),
    );
    assert_eq!(breaker.inner().sends(), 40, "every send went through");
    assert!(took[0] >= TIMEOUT, "the first send waited for Redis");
    assert!(
        slowest <= TIMEOUT + Duration::from_millis(100),
        "a send took {slowest:?}"
    );
    assert!(
        percentile(&took, 50) < TIMEOUT / 2,
        "most sends did not wait for Redis"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_that_loses_redis_logs_one_warning_not_one_per_send() {
    let Some(mut server) = RedisServer::start("redis_lost_one_warning") else {
        return;
    };
    let logs = LogCounter::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    let store = store(&server).await;
    let (breaker, _) = breaker(&Scripted::new("provider"), &store, 3);
    server.stop();

    // Long enough for Redis to be tried again several times.
    timed_sends(&breaker, 50, Duration::from_millis(20)).await;
    assert_eq!(breaker.inner().sends(), 50);
    assert_eq!(logs.count("store.redis_unreachable"), 1);
}

#[tokio::test]
async fn when_redis_restarts_the_breakers_share_state_again() {
    let Some(mut server) = RedisServer::start("redis_restarted_shared_again") else {
        return;
    };
    let (a_store, b_store) = (store(&server).await, store(&server).await);
    let (a, _) = breaker(&Scripted::new("provider"), &a_store, 4);
    let (b, _) = breaker(&Scripted::new("provider"), &b_store, 4);
    server.stop();
    timed_sends(&a, 3, Duration::ZERO).await;
    timed_sends(&b, 3, Duration::ZERO).await;
    assert!(!a_store.is_shared() && !b_store.is_shared());

    server.restart();
    // Redis may need a try or two to reconnect: healthy sends until both stores use it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(a_store.is_shared() && b_store.is_shared()) {
        assert!(
            Instant::now() < deadline,
            "the stores never used Redis again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.send(&message()).await.expect("healthy");
        b.send(&message()).await.expect("healthy");
    }
    // Two failures each: only a count shared through Redis reaches the threshold of 4.
    let local = (a_store.local_decisions(), b_store.local_decisions());
    a.inner().set_default(Reply::fail(Category::ServerError));
    b.inner().set_default(Reply::fail(Category::ServerError));
    for _ in 0..2 {
        assert!(!is_refused(&a.send(&message()).await));
        assert!(!is_refused(&b.send(&message()).await));
    }
    assert!(
        is_refused(&a.send(&message()).await),
        "A opened on B's failures too"
    );
    assert!(
        is_refused(&b.send(&message()).await),
        "B opened on A's failures too"
    );
    assert_eq!(
        (a_store.local_decisions(), b_store.local_decisions()),
        local,
        "every decision since came from Redis"
    );
}

#[tokio::test]
async fn a_decision_on_redis_takes_well_under_the_timeout() {
    let Some(server) = RedisServer::start("redis_decision_latency") else {
        return;
    };
    let store = store(&server).await;
    let rules = Rules::default();
    let mut took = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let start = Instant::now();
        let (decision, _) = store.acquire("provider", &rules, &Reporter::none()).await;
        took.push(start.elapsed());
        assert!(matches!(decision, Decision::Send(_)));
    }
    let (median, p99) = (percentile(&took, 50), percentile(&took, 99));
    println!("decision on redis: median {median:?}, p99 {p99:?}");
    assert!(store.is_shared());
    assert!(p99 < TIMEOUT / 2, "p99 {p99:?}");
}

/// A plain connection to `server`, to look at what the store wrote.
async fn inspect(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("a valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to the test's redis-server")
}

#[tokio::test]
async fn a_breakers_key_is_escaped_hash_tagged_and_expires_when_idle() {
    let Some(server) = RedisServer::start("redis_key_layout") else {
        return;
    };
    let store = store(&server).await;
    let rules = Rules::default();
    let (Decision::Send(permit), _) = store
        .acquire("Evil}{:%.example", &rules, &Reporter::none())
        .await
    else {
        panic!("a closed breaker lets the send go");
    };
    store
        .record(
            "Evil}{:%.example",
            &rules,
            permit,
            mail_breaker::breaker::Outcome::Failure,
            &Reporter::none(),
        )
        .await;

    let mut redis = inspect(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(keys, ["mail-breaker:fleet:{Evil%7D%7B%3A%25.example}"]);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(ttl > 0, "the key expires when idle (PTTL {ttl})");
}

#[tokio::test]
async fn a_closed_breaker_that_counted_no_failure_writes_nothing_to_redis() {
    let Some(server) = RedisServer::start("redis_writes_nothing") else {
        return;
    };
    let (breaker, _) = breaker(&Scripted::new("provider"), &store(&server).await, 3);
    for _ in 0..10 {
        assert!(breaker.send(&message()).await.is_ok());
    }
    let mut redis = inspect(&server).await;
    let size: i64 = redis::cmd("DBSIZE").query_async(&mut redis).await.unwrap();
    assert_eq!(size, 0);
}

#[tokio::test]
async fn giving_back_a_permit_that_is_not_a_probe_costs_no_call_to_redis() {
    let Some(server) = RedisServer::start("redis_release_not_a_probe") else {
        return;
    };
    let store = store_with_timeout(&server, PATIENT).await;
    let rules = Rules::default();
    let (Decision::Send(permit), _) = store.acquire("provider", &rules, &Reporter::none()).await
    else {
        panic!("a closed breaker lets a send go");
    };
    assert!(!permit.is_probe());
    let before = server.scripts_run().await;
    store.release("provider", &rules, permit, &Reporter::none());
    // Time for a call in the background, had one been started, to reach the server.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.scripts_run().await, before);
}

#[tokio::test]
async fn a_probe_granted_to_a_caller_who_stopped_waiting_for_redis_is_given_back() {
    let Some(server) = RedisServer::start(
        "a_probe_granted_to_a_caller_who_stopped_waiting_for_redis_is_given_back",
    ) else {
        return;
    };
    let store = store_with_timeout(&server, PATIENT).await;
    let rules = Rules {
        counting: mail_breaker::breaker::Counting::Consecutive { threshold: 1 },
        reset_timeout: RESET,
        // Far longer than the test: only a give-back can free the probe's slot in time.
        probe_timeout: Duration::from_secs(60),
        half_open_successes: 1,
        max_reset_timeout: None,
    };
    let (Decision::Send(permit), _) = store.acquire("provider", &rules, &Reporter::none()).await
    else {
        panic!("a closed breaker lets the first send through");
    };
    store
        .record(
            "provider",
            &rules,
            permit,
            mail_breaker::breaker::Outcome::Failure,
            &Reporter::none(),
        )
        .await;
    tokio::time::sleep(RESET).await;
    {
        let late = Reporter::none();
        let mut abandoned = store.acquire("provider", &rules, &late);
        // One poll sends the acquire to Redis, which grants the probe; then the caller leaves.
        assert!(futures::poll!(&mut abandoned).is_pending());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (decision, _) = store.acquire("provider", &rules, &Reporter::none()).await;
    assert!(
        matches!(decision, Decision::Send(permit) if permit.is_probe()),
        "the abandoned probe was given back, so this send probes: {decision:?}"
    );
}

#[tokio::test]
async fn a_change_a_send_made_on_redis_after_its_caller_stopped_waiting_is_heard_and_kept() {
    // A send dropped after its first poll: its acquire already runs on Redis, which moves the
    // breaker to half-open. The change comes back after nobody waits for it; the breaker's
    // listener still hears it and its recent changes still show it.
    let Some(server) = RedisServer::start("redis_breaker_late_change") else {
        return;
    };
    let store = store_with_timeout(&server, PATIENT).await;
    let (breaker, heard) = breaker(&failing(), &store, 1);
    assert!(!is_refused(&breaker.send(&message()).await));
    assert_eq!(*heard.lock().unwrap(), [(State::Closed, State::Open)]);
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;
    {
        let message = message();
        let mut abandoned = std::pin::pin!(breaker.send(&message));
        assert!(futures::poll!(&mut abandoned).is_pending());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert_eq!(
        *heard.lock().unwrap(),
        [(State::Closed, State::Open), (State::Open, State::HalfOpen)]
    );
    let changes = breaker.recent_changes();
    assert_eq!(changes[0].to, State::HalfOpen, "{changes:?}");
}
