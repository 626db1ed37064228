//! Operating breakers (DESIGN §8), one rule each, time driven by `tokio::time::pause()`:
//! snapshots, isolate and reset, shadow mode, the escalating open time and slow calls.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::{
    Category, CircuitBreakerTransport, ErrorRate, PoolTransport, Scope, State, StateChange,
    Transport,
};
use support::scripted::{Reply, Scripted};
use support::{message, message_to};
use tokio::time::advance;

const RESET: Duration = Duration::from_secs(30);

type Heard = Arc<Mutex<Vec<(State, State)>>>;

fn listener() -> (Heard, impl Fn(&StateChange) + Send + Sync + 'static) {
    let heard: Heard = Arc::default();
    let sink = Arc::clone(&heard);
    (heard, move |change: &StateChange| {
        sink.lock().unwrap().push((change.from, change.to))
    })
}

fn failure() -> Reply {
    Reply::fail(Category::ServerError)
}

/// Opens after `threshold` failures in a row, for RESET.
fn breaker(inner: &Scripted, threshold: u32) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(threshold)
        .reset_timeout(RESET)
        .build()
        .expect("valid settings")
}

async fn fail_times(breaker: &CircuitBreakerTransport<Scripted>, count: usize) {
    breaker.inner().then(std::iter::repeat_n(failure(), count));
    for _ in 0..count {
        let _ = breaker.send(&message()).await;
    }
}

// ---- snapshots ----

#[tokio::test(start_paused = true)]
async fn a_snapshot_tells_the_state_the_failures_counted_and_the_time_until_a_probe() {
    let inner = Scripted::new("p");
    let breaker = breaker(&inner, 3);
    fail_times(&breaker, 2).await;
    let counting = breaker.snapshot().await;
    assert_eq!(counting.key(), "p");
    assert_eq!(counting.state(), State::Closed);
    assert_eq!((counting.failures(), counting.calls()), (2, 2));
    assert_eq!(counting.retry_after(), None);
    assert_eq!(counting.failure_rate(), None);

    fail_times(&breaker, 1).await;
    advance(Duration::from_secs(10)).await;
    let open = breaker.snapshot().await;
    assert_eq!(open.state(), State::Open);
    assert!(!open.is_isolated());
    assert_eq!(open.retry_after(), Some(RESET - Duration::from_secs(10)));
    assert_eq!(open.open_streak(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_under_error_rate_counting_tells_the_failure_rate_in_the_window() {
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .error_rate(ErrorRate {
            threshold_percent: 90,
            minimum_requests: 100,
            window: Duration::from_secs(10),
            buckets: 10,
        })
        .build()
        .expect("valid settings");
    inner.then([failure(), Reply::Ok, Reply::Ok, failure()]);
    for _ in 0..4 {
        let _ = breaker.send(&message()).await;
    }
    let snapshot = breaker.snapshot().await;
    assert_eq!((snapshot.failures(), snapshot.calls()), (2, 4));
    assert_eq!(snapshot.failure_rate(), Some(0.5));

    advance(Duration::from_secs(11)).await;
    let later = breaker.snapshot().await;
    assert_eq!(
        (later.calls(), later.failure_rate()),
        (0, None),
        "the window moved on"
    );
}

#[tokio::test(start_paused = true)]
async fn snapshots_list_every_tracked_key() {
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(2)
        .scope(Scope::RecipientDomain)
        .build()
        .expect("valid settings");
    inner.then([failure(), failure(), failure()]);
    for to in ["a@down.example", "b@down.example", "c@flaky.example"] {
        let _ = breaker.send(&message_to(to)).await;
    }
    // A domain whose sends only succeed is not tracked: its breaker is as a new one is.
    breaker
        .send(&message_to("d@up.example"))
        .await
        .expect("delivered");

    let mut snapshots = breaker.snapshots().await;
    snapshots.sort_by(|a, b| a.key().cmp(b.key()));
    let seen: Vec<_> = snapshots
        .iter()
        .map(|s| (s.key(), s.state(), s.failures()))
        .collect();
    assert_eq!(
        seen,
        [
            ("down.example", State::Open, 2),
            ("flaky.example", State::Closed, 1)
        ]
    );
    assert_eq!(
        breaker.snapshot_of("down.example").await.state(),
        State::Open
    );
    assert_eq!(
        breaker.snapshot_of("up.example").await.state(),
        State::Closed
    );
}

// ---- isolate and reset ----

#[tokio::test(start_paused = true)]
async fn an_isolated_breaker_refuses_every_send_as_isolated_however_long_it_waits() {
    let inner = Scripted::new("p");
    let breaker = breaker(&inner, 3);
    breaker.isolate().await;
    for _ in 0..3 {
        let refused = breaker.send(&message()).await.unwrap_err();
        assert_eq!(refused.code(), "breaker.isolated");
        assert_eq!(refused.category(), Category::ServiceUnavailable);
        assert_eq!(refused.retry_after(), None);
        advance(RESET * 10).await;
    }
    assert_eq!(inner.sends(), 0, "no probe went");
    assert_eq!(breaker.state(), State::Open);
    assert!(breaker.snapshot().await.is_isolated());
}

#[tokio::test(start_paused = true)]
async fn isolating_one_breaker_of_a_shared_memory_store_leaves_the_others_sending() {
    let store: Arc<dyn mail_breaker::BreakerStore> = Arc::new(mail_breaker::MemoryStore::new());
    let (first, second) = (Scripted::new("first"), Scripted::new("second"));
    let shared = |inner: &Scripted| {
        CircuitBreakerTransport::builder(inner.clone())
            .store(Arc::clone(&store))
            .build()
            .expect("valid settings")
    };
    let (isolated, other) = (shared(&first), shared(&second));

    isolated.isolate().await;

    let refused = isolated.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.isolated");
    other
        .send(&message())
        .await
        .expect("another breaker of the store is not isolated");
    assert_eq!((first.sends(), second.sends()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn isolating_an_open_breaker_keeps_it_open_past_its_reset_timeout() {
    let inner = Scripted::new("p");
    let breaker = breaker(&inner, 1);
    fail_times(&breaker, 1).await;
    breaker.isolate().await;
    advance(RESET * 2).await;
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.isolated");
    assert_eq!(inner.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn isolate_and_reset_are_changes_of_state_the_listener_hears() {
    let inner = Scripted::new("p");
    let (heard, listen) = listener();
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .on_state_change(listen)
        .build()
        .expect("valid settings");
    breaker.isolate().await;
    breaker.isolate().await; // already isolated: nothing new
    breaker.reset().await;
    assert_eq!(
        *heard.lock().unwrap(),
        [(State::Closed, State::Open), (State::Open, State::Closed)]
    );
    breaker.send(&message()).await.expect("reset lets sends go");
}

#[tokio::test(start_paused = true)]
async fn reset_closes_an_open_breaker_and_clears_its_counts() {
    let inner = Scripted::new("p");
    let breaker = breaker(&inner, 2);
    fail_times(&breaker, 2).await;
    assert_eq!(breaker.state(), State::Open);
    breaker.reset().await;
    let snapshot = breaker.snapshot().await;
    assert_eq!(snapshot.state(), State::Closed);
    assert_eq!((snapshot.failures(), snapshot.open_streak()), (0, 0));

    fail_times(&breaker, 1).await;
    assert_eq!(breaker.state(), State::Closed, "the count started again");
}

#[tokio::test(start_paused = true)]
async fn reset_of_a_closed_breaker_forgets_the_failures_counted_so_far() {
    let inner = Scripted::new("p");
    let breaker = breaker(&inner, 2);
    fail_times(&breaker, 1).await;
    breaker.reset().await;
    fail_times(&breaker, 1).await;
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn isolate_key_and_reset_key_act_on_one_recipient_domain() {
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .scope(Scope::RecipientDomain)
        .build()
        .expect("valid settings");
    breaker.isolate_key("blocked.example").await;
    let refused = breaker
        .send(&message_to("a@blocked.example"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "breaker.isolated");
    breaker
        .send(&message_to("a@other.example"))
        .await
        .expect("other domains go");
    breaker.reset_key("blocked.example").await;
    breaker
        .send(&message_to("a@blocked.example"))
        .await
        .expect("reset");
}

#[tokio::test(start_paused = true)]
async fn a_pool_fails_over_from_an_isolated_member() {
    let (primary, backup) = (Scripted::new("primary"), Scripted::new("backup"));
    let guarded = Arc::new(breaker(&primary, 3));
    let pool = PoolTransport::builder()
        .add(Arc::clone(&guarded), 1)
        .add(backup.clone(), 2)
        .build()
        .expect("a pool");
    guarded.isolate().await;
    let receipt = pool.send(&message()).await.expect("the backup delivers");
    assert_eq!(receipt.transport(), "backup");
    assert_eq!(primary.sends(), 0);
}

// ---- shadow mode ----

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_and_changes_state_but_never_refuses_a_send() {
    let inner = Scripted::answering("p", failure());
    let (heard, listen) = listener();
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(2)
        .reset_timeout(RESET)
        .shadow(true)
        .on_state_change(listen)
        .build()
        .expect("valid settings");
    for _ in 0..5 {
        let error = breaker.send(&message()).await.unwrap_err();
        assert_eq!(
            error.code(),
            "test.server_error",
            "the provider's own answer"
        );
    }
    assert_eq!(inner.sends(), 5, "every send went");
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(*heard.lock().unwrap(), [(State::Closed, State::Open)]);

    inner.set_default(Reply::Ok);
    advance(RESET).await;
    breaker.send(&message()).await.expect("the probe delivers");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_sends_a_batch_whole_while_open() {
    use futures::StreamExt;
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .shadow(true)
        .build()
        .expect("valid settings");
    breaker.isolate().await;
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(support::numbered_messages(5)).boxed())
        .collect()
        .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(inner.sends(), 5);
}

// ---- escalating open time ----

fn escalating(inner: &Scripted) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .max_reset_timeout(Duration::from_secs(100))
        .build()
        .expect("valid settings")
}

/// Waits out the open time, sends a failing probe, and returns the next refusal's wait.
async fn fail_the_probe(breaker: &CircuitBreakerTransport<Scripted>) -> Option<Duration> {
    let wait = breaker.snapshot().await.retry_after().expect("open");
    advance(wait).await;
    breaker.inner().then([failure()]);
    let _ = breaker.send(&message()).await;
    breaker.send(&message()).await.unwrap_err().retry_after()
}

#[tokio::test(start_paused = true)]
async fn each_reopening_without_a_close_doubles_the_open_time_up_to_the_maximum() {
    let inner = Scripted::new("p");
    let breaker = escalating(&inner);
    fail_times(&breaker, 1).await;
    assert_eq!(breaker.snapshot().await.retry_after(), Some(RESET));
    assert_eq!(
        fail_the_probe(&breaker).await,
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        fail_the_probe(&breaker).await,
        Some(Duration::from_secs(100))
    );
    assert_eq!(
        fail_the_probe(&breaker).await,
        Some(Duration::from_secs(100))
    );
    assert_eq!(breaker.snapshot().await.open_streak(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_close_starts_the_open_time_again_from_the_reset_timeout() {
    let inner = Scripted::new("p");
    let breaker = escalating(&inner);
    fail_times(&breaker, 1).await;
    fail_the_probe(&breaker).await;
    advance(Duration::from_secs(60)).await;
    breaker
        .send(&message())
        .await
        .expect("a probe that closes it");
    assert_eq!(breaker.state(), State::Closed);
    fail_times(&breaker, 1).await;
    assert_eq!(breaker.snapshot().await.retry_after(), Some(RESET));
}

#[tokio::test(start_paused = true)]
async fn a_probe_past_its_deadline_reopens_for_the_doubled_time() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(escalating(&inner));
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    inner.then([Reply::Hang]);
    let probing = Arc::clone(&breaker);
    let _probe = tokio::spawn(async move { probing.send(&message()).await });
    tokio::time::sleep(RESET).await; // the probe timeout (= reset timeout) passes
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
}

#[test]
fn a_longest_open_time_below_the_reset_timeout_is_a_config_error() {
    let error = CircuitBreakerTransport::builder(Scripted::new("p"))
        .reset_timeout(RESET)
        .max_reset_timeout(Duration::from_secs(10))
        .build()
        .unwrap_err();
    assert_eq!(error.setting(), "max_reset_timeout");
}

// ---- slow calls ----

/// A breaker over `inner` that opens at `threshold` failures and counts a success slower
/// than 10 s as one.
fn slow_call_breaker(inner: &Scripted, threshold: u32) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(threshold)
        .slow_call(Duration::from_secs(10))
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn a_slow_success_counts_as_a_failure_but_its_caller_gets_the_receipt() {
    let inner = Scripted::answering("p", Reply::after(Duration::from_secs(11), Reply::Ok));
    let breaker = slow_call_breaker(&inner, 2);
    for _ in 0..2 {
        breaker
            .send(&message())
            .await
            .expect("delivered, if slowly");
    }
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_success_within_the_slow_call_time_counts_as_a_success() {
    let inner = Scripted::new("p");
    inner.then([
        failure(),
        Reply::after(Duration::from_secs(9), Reply::Ok),
        failure(),
    ]);
    let breaker = slow_call_breaker(&inner, 2);
    for _ in 0..3 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_success_that_takes_exactly_the_slow_call_time_is_not_slow() {
    let inner = Scripted::answering("p", Reply::after(Duration::from_secs(10), Reply::Ok));
    let breaker = slow_call_breaker(&inner, 1);
    breaker.send(&message()).await.expect("delivered");
    assert_eq!(breaker.state(), State::Closed, "slow means over the time");
}

#[tokio::test(start_paused = true)]
async fn slow_sends_in_a_batch_count_as_failures() {
    use futures::StreamExt;
    let inner = Scripted::answering("p", Reply::after(Duration::from_secs(11), Reply::Ok));
    let breaker = slow_call_breaker(&inner, 2);
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(support::numbered_messages(2)).boxed())
        .collect()
        .await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(breaker.state(), State::Open);
}

#[test]
fn a_slow_call_time_of_zero_is_a_config_error() {
    let error = CircuitBreakerTransport::builder(Scripted::new("p"))
        .slow_call(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(error.setting(), "slow_call");
}
