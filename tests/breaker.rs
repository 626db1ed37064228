//! The rules of the circuit breaker (DESIGN §3), one test each, time driven by `tokio::time::pause()`.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Category, CircuitBreakerTransport, ErrorRate, Receipt, SendError, State, StateChange, Transport,
};
use support::scripted::{Reply, Scripted};
use support::{message, numbered_messages};
use tokio::time::{Instant, advance, sleep};

const RESET: Duration = Duration::from_secs(30);

fn breaker(inner: Scripted) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner)
        .failure_threshold(3)
        .reset_timeout(RESET)
        .build()
        .expect("valid settings")
}

/// A breaker that opens on one failure, with the given probe timeout.
fn opens_after_one_failure(
    inner: &Scripted,
    probe_timeout: Duration,
) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .probe_timeout(probe_timeout)
        .build()
        .expect("valid settings")
}

/// A breaker that opens on one failure and closes after three successful probes in a row.
fn closes_after_three_probes(inner: &Scripted) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .half_open_successes(3)
        .build()
        .expect("valid settings")
}

fn failure() -> Reply {
    Reply::fail(Category::ServerError)
}

/// Sends until the breaker has seen `count` results, all failures.
async fn fail_times(breaker: &CircuitBreakerTransport<Scripted>, count: usize) {
    breaker.inner().then(std::iter::repeat_n(failure(), count));
    for _ in 0..count {
        let _ = breaker.send(&message()).await;
    }
}

async fn opened(inner: Scripted) -> CircuitBreakerTransport<Scripted> {
    let breaker = breaker(inner);
    fail_times(&breaker, 3).await;
    assert_eq!(breaker.state(), State::Open);
    breaker
}

type Changes = Arc<Mutex<Vec<(State, State)>>>;

fn recorder() -> (Changes, impl Fn(&StateChange) + Send + Sync + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    (seen, move |change: &StateChange| {
        sink.lock().unwrap().push((change.from, change.to))
    })
}

// ---- closed ----

#[tokio::test(start_paused = true)]
async fn successes_keep_the_breaker_closed() {
    let breaker = breaker(Scripted::new("p"));
    for _ in 0..20 {
        breaker.send(&message()).await.unwrap();
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_open_the_breaker() {
    let inner = Scripted::answering("p", failure());
    let breaker = breaker(inner.clone());
    for _ in 0..3 {
        assert!(breaker.send(&message()).await.is_err());
    }
    assert_eq!(breaker.state(), State::Open);
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.open");
    assert_eq!(inner.sends(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_success_between_failures_starts_the_count_again() {
    let inner = Scripted::new("p");
    inner.then([failure(), failure(), Reply::Ok, failure(), failure()]);
    let breaker = breaker(inner);
    for _ in 0..5 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_success_let_go_before_failures_in_its_period_still_starts_the_count_again() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(breaker(inner.clone()));
    inner.then([Reply::after(Duration::from_secs(5), Reply::Ok)]);
    let slow = Arc::clone(&breaker);
    let early = tokio::spawn(async move { slow.send(&message()).await });
    sleep(Duration::from_millis(1)).await;
    fail_times(&breaker, 2).await;
    early.await.unwrap().expect("the early send's success");
    fail_times(&breaker, 2).await;
    assert_eq!(
        breaker.state(),
        State::Closed,
        "the success cleared the two failures before it"
    );
    fail_times(&breaker, 1).await;
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_recipient_never_opens_the_breaker() {
    let breaker = breaker(Scripted::answering("p", Reply::fail(Category::Rejected)));
    for _ in 0..10 {
        let error = breaker.send(&message()).await.unwrap_err();
        assert_eq!(error.category(), Category::Rejected);
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_recipient_never_opens_even_a_breaker_that_opens_on_one_failure() {
    // The first answer of a breaker with no failure counted takes its quickest path: a
    // refusal of the recipient must not count there either.
    let inner = Scripted::answering("p", Reply::fail(Category::Rejected));
    let breaker = opens_after_one_failure(&inner, Duration::from_secs(60));
    let error = breaker.send(&message()).await.unwrap_err();
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_message_the_provider_cannot_carry_never_opens_the_breaker() {
    let breaker = breaker(Scripted::answering("p", Reply::fail(Category::Unsupported)));
    for _ in 0..10 {
        let error = breaker.send(&message()).await.unwrap_err();
        assert_eq!(error.category(), Category::Unsupported);
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn unsupported_messages_count_as_the_provider_working() {
    let inner = Scripted::new("p");
    inner.then([
        failure(),
        failure(),
        Reply::fail(Category::Unsupported),
        failure(),
        failure(),
        Reply::fail(Category::Unsupported),
        failure(),
        failure(),
    ]);
    let breaker = breaker(inner);
    for _ in 0..8 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn rate_limits_and_rejections_count_as_the_provider_working() {
    let inner = Scripted::new("p");
    inner.then([
        failure(),
        failure(),
        Reply::fail(Category::RateLimited),
        failure(),
        failure(),
        Reply::fail(Category::Rejected),
        failure(),
        failure(),
    ]);
    let breaker = breaker(inner);
    for _ in 0..8 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn is_failure_decides_which_errors_count() {
    let breaker = CircuitBreakerTransport::builder(Scripted::answering(
        "p",
        Reply::fail(Category::RateLimited),
    ))
    .failure_threshold(2)
    .is_failure(|error: &SendError| error.category() == Category::RateLimited)
    .build()
    .unwrap();
    for _ in 0..2 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_send_decides_nothing_while_closed() {
    let inner = Scripted::new("p");
    inner.then([failure(), failure(), Reply::Hang]);
    let breaker = breaker(inner);
    let _ = breaker.send(&message()).await;
    let _ = breaker.send(&message()).await;
    let hung = tokio::time::timeout(Duration::from_secs(1), breaker.send(&message())).await;
    assert!(hung.is_err(), "the third send hangs and is dropped");
    assert_eq!(breaker.state(), State::Closed);
}

/// A transport whose send panics.
struct Panicking;

#[async_trait::async_trait]
impl Transport for Panicking {
    fn name(&self) -> &str {
        "panicking"
    }
    async fn send_raw(&self, _: &mail_breaker::Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        panic!("a bug in the transport")
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_send_decides_nothing() {
    let breaker = Arc::new(
        CircuitBreakerTransport::builder(Panicking)
            .failure_threshold(1)
            .build()
            .unwrap(),
    );
    for _ in 0..3 {
        let breaker = Arc::clone(&breaker);
        let joined = tokio::spawn(async move { breaker.send(&message()).await }).await;
        assert!(joined.unwrap_err().is_panic());
    }
    assert_eq!(breaker.state(), State::Closed);
}

// ---- error rate ----

fn rate_breaker(inner: Scripted) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner)
        .error_rate(ErrorRate {
            threshold_percent: 50,
            minimum_requests: 10,
            window: Duration::from_secs(10),
            buckets: 10,
        })
        .reset_timeout(RESET)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn error_rate_opens_at_the_threshold_once_minimum_requests_are_seen() {
    let inner = Scripted::new("p");
    // Alternate: after 10 results, 5 failures = 50 %.
    inner.then((0..10).map(|i| if i % 2 == 0 { failure() } else { Reply::Ok }));
    let breaker = rate_breaker(inner);
    for i in 0..10 {
        assert_eq!(breaker.state(), State::Closed, "closed before result {i}");
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn error_rate_never_opens_below_minimum_requests() {
    let breaker = rate_breaker(Scripted::answering("p", failure()));
    for _ in 0..9 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn error_rate_stays_closed_below_the_threshold() {
    let inner = Scripted::new("p");
    inner.then((0..30).map(|i| if i % 3 == 0 { failure() } else { Reply::Ok }));
    let breaker = rate_breaker(inner);
    for _ in 0..30 {
        let _ = breaker.send(&message()).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn old_results_slide_out_of_the_error_rate_window() {
    let breaker = rate_breaker(Scripted::answering("p", failure()));
    for _ in 0..9 {
        let _ = breaker.send(&message()).await;
    }
    advance(Duration::from_secs(11)).await;
    breaker.inner().set_default(failure());
    let _ = breaker.send(&message()).await;
    assert_eq!(
        breaker.state(),
        State::Closed,
        "the 9 old failures left the window"
    );
}

// ---- open ----

#[tokio::test(start_paused = true)]
async fn an_open_breaker_answers_at_once_with_the_time_left() {
    let inner = Scripted::new("p");
    let breaker = opened(inner.clone()).await;
    advance(Duration::from_secs(10)).await;
    let started = Instant::now();
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(refused.category(), Category::ServiceUnavailable);
    assert_eq!(refused.code(), "breaker.open");
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(20)));
    assert_eq!(refused.transport(), Some("p"));
    assert_eq!(inner.sends(), 3, "nothing was sent");
}

#[tokio::test(start_paused = true)]
async fn a_refusal_names_the_transport_by_the_name_it_has_now_after_a_rename() {
    let mut breaker = breaker(Scripted::new("p"));
    breaker.inner_mut().rename("renamed");
    fail_times(&breaker, 3).await;
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.open");
    assert_eq!(refused.transport(), Some("renamed"));
}

#[tokio::test(start_paused = true)]
async fn the_breaker_stays_open_until_the_reset_timeout() {
    let inner = Scripted::new("p");
    let breaker = opened(inner.clone()).await;
    advance(RESET - Duration::from_millis(1)).await;
    assert!(breaker.send(&message()).await.is_err());
    assert_eq!(inner.sends(), 3);
}

#[tokio::test(start_paused = true)]
async fn verify_goes_through_while_open() {
    let breaker = opened(Scripted::new("p")).await;
    breaker
        .inner()
        .fail_verify_with(Reply::fail(Category::Authentication));
    let answer = breaker.verify().await.unwrap_err();
    assert_eq!(
        answer.category(),
        Category::Authentication,
        "the provider's own answer"
    );
    assert_eq!(breaker.inner().verifies(), 1, "it reached the provider");
    assert_eq!(breaker.state(), State::Open, "and counted for nothing");
}

// ---- half-open ----

#[tokio::test(start_paused = true)]
async fn after_the_reset_timeout_the_next_send_is_a_probe_that_closes_on_success() {
    let inner = Scripted::new("p");
    let breaker = opened(inner.clone()).await;
    advance(RESET).await;
    assert_eq!(
        breaker.state(),
        State::Open,
        "half-open is entered on the next send"
    );
    breaker.send(&message()).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(inner.sends(), 4);
}

#[tokio::test(start_paused = true)]
async fn exactly_one_probe_is_in_flight_when_100_sends_race_in_half_open() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(opened(inner.clone()).await);
    advance(RESET).await;
    inner.set_default(Reply::after(Duration::from_secs(1), Reply::Ok));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let breaker = Arc::clone(&breaker);
            tokio::spawn(async move { breaker.send(&message()).await })
        })
        .collect();
    let mut delivered = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => delivered += 1,
            Err(error) => assert_eq!(error.code(), "breaker.open"),
        }
    }
    assert_eq!(delivered, 1);
    assert_eq!(inner.sends(), 4, "three failures and one probe");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn sends_during_a_probe_are_refused_with_the_time_until_its_deadline() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(opens_after_one_failure(&inner, Duration::from_secs(10)));
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    inner.set_default(Reply::Hang);
    let probing = Arc::clone(&breaker);
    let _probe = tokio::spawn(async move { probing.send(&message()).await });
    sleep(Duration::from_secs(4)).await;
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.open");
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(6)));
    assert_eq!(breaker.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_opens_the_breaker_for_another_reset_timeout() {
    let inner = Scripted::new("p");
    let breaker = opened(inner.clone()).await;
    advance(RESET).await;
    inner.then([failure()]);
    assert!(breaker.send(&message()).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.retry_after(), Some(RESET));
}

#[tokio::test(start_paused = true)]
async fn half_open_successes_probes_in_a_row_close_the_breaker() {
    let inner = Scripted::new("p");
    let breaker = closes_after_three_probes(&inner);
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    for probe in 0..3 {
        assert_ne!(
            breaker.state(),
            State::Closed,
            "still half-open before probe {probe}"
        );
        breaker.send(&message()).await.unwrap();
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_failure_among_the_probes_reopens_the_breaker() {
    let inner = Scripted::new("p");
    let breaker = closes_after_three_probes(&inner);
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    inner.then([Reply::Ok, failure()]);
    breaker.send(&message()).await.unwrap();
    assert!(breaker.send(&message()).await.is_err());
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_the_slot_at_once() {
    let inner = Scripted::new("p");
    let breaker = opened(inner.clone()).await;
    advance(RESET).await;
    inner.then([Reply::Hang]);
    {
        let message = message();
        let mut probe = Box::pin(breaker.send(&message));
        assert!(futures::poll!(&mut probe).is_pending());
        assert_eq!(breaker.state(), State::HalfOpen);
    }
    breaker
        .send(&message())
        .await
        .expect("the next send is the probe");
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(inner.sends(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_probe_past_its_deadline_reopens_the_breaker_and_its_late_success_does_not_close_it() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(opens_after_one_failure(&inner, Duration::from_secs(5)));
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    inner.then([Reply::after(Duration::from_secs(8), Reply::Ok)]);
    let probing = Arc::clone(&breaker);
    let probe = tokio::spawn(async move { probing.send(&message()).await });
    sleep(Duration::from_secs(5)).await;
    assert_eq!(breaker.state(), State::Open, "the probe's deadline passed");
    probe
        .await
        .unwrap()
        .expect("the probe's send itself was not cancelled");
    assert_eq!(
        breaker.state(),
        State::Open,
        "its late success changed nothing"
    );
    let refused = breaker.send(&message()).await.unwrap_err();
    // Reopened from the deadline (5 s after the probe left) for another reset timeout.
    assert_eq!(refused.retry_after(), Some(RESET - Duration::from_secs(3)));
}

#[tokio::test(start_paused = true)]
async fn a_probe_dropped_after_its_deadline_reopens_the_breaker_from_that_deadline_and_the_listener_hears_it()
 {
    let inner = Scripted::new("p");
    let (heard, listener) = recorder();
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .probe_timeout(Duration::from_secs(5))
        .on_state_change(listener)
        .build()
        .expect("valid settings");
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    inner.then([Reply::Hang]);
    {
        let message = message();
        let mut probe = Box::pin(breaker.send(&message));
        assert!(futures::poll!(&mut probe).is_pending());
        // The caller gives up 7 s later, 2 s after the probe's deadline.
        advance(Duration::from_secs(7)).await;
    }
    assert_eq!(
        *heard.lock().unwrap(),
        [
            (State::Closed, State::Open),
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Open),
        ],
        "the reopening was heard when the probe was given back"
    );
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.open", "no second probe goes");
    assert_eq!(refused.retry_after(), Some(RESET - Duration::from_secs(2)));
    assert_eq!(inner.sends(), 2);
}

// ---- periods ----

#[tokio::test(start_paused = true)]
async fn a_late_success_from_before_the_breaker_opened_does_not_close_it() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(breaker(inner.clone()));
    inner.then([Reply::after(Duration::from_secs(5), Reply::Ok)]);
    let slow = Arc::clone(&breaker);
    let late = tokio::spawn(async move { slow.send(&message()).await });
    sleep(Duration::from_millis(1)).await;
    fail_times(&breaker, 3).await;
    assert_eq!(breaker.state(), State::Open);
    late.await.unwrap().unwrap();
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_late_success_from_before_the_breaker_opened_does_not_clear_the_count_after_it_closed_again()
 {
    let inner = Scripted::new("p");
    let breaker = Arc::new(breaker(inner.clone()));
    inner.then([Reply::after(Duration::from_secs(100), Reply::Ok)]);
    let slow = Arc::clone(&breaker);
    let late = tokio::spawn(async move { slow.send(&message()).await });
    sleep(Duration::from_millis(1)).await;
    fail_times(&breaker, 3).await;
    advance(RESET).await;
    breaker.send(&message()).await.expect("the probe closes it");
    fail_times(&breaker, 2).await;
    late.await.unwrap().expect("the slow send's late success");
    assert_eq!(breaker.state(), State::Closed);
    fail_times(&breaker, 1).await;
    assert_eq!(
        breaker.state(),
        State::Open,
        "the late success, from an earlier period, did not clear the two failures"
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_failure_from_before_the_breaker_closed_again_does_not_count() {
    let inner = Scripted::new("p");
    let breaker = Arc::new(
        CircuitBreakerTransport::builder(inner.clone())
            .failure_threshold(1)
            .reset_timeout(RESET)
            .build()
            .unwrap(),
    );
    inner.then([Reply::after(RESET * 2, failure()), failure()]);
    let slow = Arc::clone(&breaker);
    let late = tokio::spawn(async move { slow.send(&message()).await });
    sleep(Duration::from_millis(1)).await;
    let _ = breaker.send(&message()).await; // opens
    advance(RESET).await;
    breaker.send(&message()).await.unwrap(); // the probe closes it
    assert_eq!(breaker.state(), State::Closed);
    assert!(late.await.unwrap().is_err());
    assert_eq!(
        breaker.state(),
        State::Closed,
        "a failure from an earlier period counts for nothing"
    );
}

// ---- batches ----

#[tokio::test(start_paused = true)]
async fn send_many_of_1000_messages_while_closed_reaches_the_inner_send_many_as_one_batch_in_order()
{
    let inner = Scripted::new("p").batched();
    let breaker = breaker(inner.clone());
    let messages = numbered_messages(1000);
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(messages).boxed())
        .collect()
        .await;
    assert_eq!(answers.len(), 1000);
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(inner.batches(), vec![1000]);
    let expected: Vec<_> = (0..1000).map(|i| format!("message {i}")).collect();
    assert_eq!(inner.subjects(), expected);
}

#[tokio::test(start_paused = true)]
async fn send_many_answers_each_message_in_place_while_open() {
    let inner = Scripted::new("p").batched();
    let breaker = opened(inner.clone()).await;
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(numbered_messages(10)).boxed())
        .collect()
        .await;
    assert_eq!(answers.len(), 10);
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().unwrap_err().code() == "breaker.open")
    );
    assert!(
        inner.batches().is_empty(),
        "nothing reached the inner transport"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_failure_counts_once_and_answers_every_message() {
    let inner = Scripted::new("p").batched();
    let batch_failure =
        SendError::new(Category::Network, "test.dropped", "connection dropped").batch_failure();
    inner.then([Reply::Ok, Reply::Ok, Reply::Err(batch_failure)]);
    let breaker = breaker(inner.clone());
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(numbered_messages(50)).boxed())
        .collect()
        .await;
    assert_eq!(answers.len(), 50);
    assert!(answers[..2].iter().all(Result::is_ok));
    assert!(
        answers[2..]
            .iter()
            .all(|a| a.as_ref().unwrap_err().code() == "test.dropped")
    );
    assert_eq!(
        breaker.state(),
        State::Closed,
        "one failure of three allowed"
    );
    fail_times(&breaker, 2).await;
    assert_eq!(
        breaker.state(),
        State::Open,
        "the batch failure was the first of three"
    );
}

#[tokio::test(start_paused = true)]
async fn send_many_answers_the_rest_in_place_once_the_breaker_opens_midway() {
    let inner = Scripted::new("p");
    inner.then([Reply::Ok, failure(), failure(), failure()]);
    let breaker = breaker(inner.clone());
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(numbered_messages(10)).boxed())
        .collect()
        .await;
    assert_eq!(answers.len(), 10);
    assert!(answers[0].is_ok());
    assert!(
        answers[1..4]
            .iter()
            .all(|a| a.as_ref().unwrap_err().code() == "test.server_error")
    );
    assert!(
        answers[4..]
            .iter()
            .all(|a| a.as_ref().unwrap_err().code() == "breaker.open")
    );
    assert_eq!(inner.sends(), 4);
}

#[tokio::test(start_paused = true)]
async fn send_many_in_half_open_sends_the_probe_alone_then_the_rest_once_it_closes() {
    let inner = Scripted::new("p").batched();
    let breaker = opened(inner.clone()).await;
    advance(RESET).await;
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(numbered_messages(5)).boxed())
        .collect()
        .await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(inner.batches(), vec![1, 4], "the probe went alone");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_left_in_a_batch_whose_caller_stops_reading_frees_the_slot() {
    let inner = Scripted::new("p");
    let breaker = opened(inner.clone()).await;
    advance(RESET).await;
    inner.then([Reply::Hang]);
    {
        let mut answers = breaker.send_many(futures::stream::iter(numbered_messages(3)).boxed());
        assert!(futures::poll!(answers.next()).is_pending());
        assert_eq!(breaker.state(), State::HalfOpen);
    }
    breaker
        .send(&message())
        .await
        .expect("the next send is the probe");
    assert_eq!(breaker.state(), State::Closed);
}

// ---- listeners and logs ----

#[tokio::test(start_paused = true)]
async fn the_listener_hears_every_change_exactly_once() {
    let (seen, listener) = recorder();
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .on_state_change(listener)
        .build()
        .unwrap();
    fail_times(&breaker, 1).await;
    advance(RESET).await;
    inner.then([failure()]);
    let _ = breaker.send(&message()).await;
    advance(RESET).await;
    breaker.send(&message()).await.unwrap();
    let _ = breaker.state();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (State::Closed, State::Open),
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Open),
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Closed),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_listener_is_told_the_key_and_transport() {
    let changes = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&changes);
    let breaker =
        CircuitBreakerTransport::builder(Scripted::answering("smtp://relay:25", failure()))
            .failure_threshold(1)
            .on_state_change(move |change| sink.lock().unwrap().push(change.clone()))
            .build()
            .unwrap();
    let _ = breaker.send(&message()).await;
    let change = changes.lock().unwrap()[0].clone();
    assert_eq!(
        (change.key.as_str(), change.transport.as_str()),
        ("smtp://relay:25", "smtp://relay:25")
    );
}

#[tokio::test(start_paused = true)]
async fn a_listener_that_panics_does_not_stop_sending() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .on_state_change(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            panic!("a listener bug");
        })
        .build()
        .unwrap();
    fail_times(&breaker, 1).await;
    assert_eq!(breaker.state(), State::Open);
    advance(RESET).await;
    breaker
        .send(&message())
        .await
        .expect("the probe goes through");
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

// ---- settings, accessors, lettre ----

#[test]
fn settings_that_cannot_work_are_config_errors_naming_the_setting() {
    let build = |f: fn(
        mail_breaker::breaker::CircuitBreakerBuilder<Scripted>,
    ) -> mail_breaker::breaker::CircuitBreakerBuilder<Scripted>| {
        f(CircuitBreakerTransport::builder(Scripted::new("p")))
            .build()
            .unwrap_err()
            .setting()
            .to_owned()
    };
    assert_eq!(build(|b| b.failure_threshold(0)), "failure_threshold");
    assert_eq!(build(|b| b.reset_timeout(Duration::ZERO)), "reset_timeout");
    assert_eq!(build(|b| b.probe_timeout(Duration::ZERO)), "probe_timeout");
    assert_eq!(build(|b| b.half_open_successes(0)), "half_open_successes");
    assert_eq!(build(|b| b.max_keys(0)), "max_keys");
    assert_eq!(
        build(|b| b.error_rate(ErrorRate {
            threshold_percent: 0,
            ..ErrorRate::default()
        })),
        "error_rate.threshold_percent"
    );
    assert_eq!(
        build(|b| b.error_rate(ErrorRate {
            threshold_percent: 101,
            ..ErrorRate::default()
        })),
        "error_rate.threshold_percent"
    );
    assert_eq!(
        build(|b| b.error_rate(ErrorRate {
            buckets: 0,
            ..ErrorRate::default()
        })),
        "error_rate.buckets"
    );
    assert_eq!(
        build(|b| b.error_rate(ErrorRate {
            window: Duration::from_micros(5),
            ..ErrorRate::default()
        })),
        "error_rate.window"
    );
    assert_eq!(
        build(|b| b.error_rate(ErrorRate {
            minimum_requests: 0,
            ..ErrorRate::default()
        })),
        "error_rate.minimum_requests"
    );
}

#[test]
fn an_error_rate_threshold_of_one_or_a_hundred_percent_is_valid() {
    for threshold_percent in [1, 100] {
        let built = CircuitBreakerTransport::builder(Scripted::new("p"))
            .error_rate(ErrorRate {
                threshold_percent,
                ..ErrorRate::default()
            })
            .build();
        assert!(built.is_ok(), "{threshold_percent} %");
    }
}

#[test]
fn an_error_rate_takes_up_to_max_buckets_each_at_least_a_millisecond_wide() {
    use mail_breaker::machine::MAX_BUCKETS;
    let build = |buckets: u32, window: Duration| {
        CircuitBreakerTransport::builder(Scripted::new("p"))
            .error_rate(ErrorRate {
                buckets,
                window,
                ..ErrorRate::default()
            })
            .build()
            .err()
            .map(|error| error.setting().to_owned())
    };
    let at_most = Duration::from_secs(60);
    assert_eq!(build(MAX_BUCKETS, at_most), None);
    assert_eq!(
        build(MAX_BUCKETS + 1, at_most).as_deref(),
        Some("error_rate.buckets")
    );
    assert_eq!(build(10, Duration::from_millis(10)), None);
    assert_eq!(
        build(10, Duration::from_micros(9_999)).as_deref(),
        Some("error_rate.window")
    );
}

#[test]
fn a_config_error_says_which_setting_and_why() {
    let error = CircuitBreakerTransport::builder(Scripted::new("p"))
        .reset_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid reset_timeout: must be longer than zero"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_the_breaker_never_saw_is_closed() {
    let breaker = breaker(Scripted::new("p"));
    assert_eq!(breaker.state_of("never.example"), State::Closed);
    assert_eq!(breaker.tracked_keys(), 0);
}

#[tokio::test(start_paused = true)]
async fn send_raw_is_guarded_like_send() {
    let inner = Scripted::answering("p", failure());
    let breaker = breaker(inner.clone());
    let message = message();
    for _ in 0..4 {
        let _ = breaker
            .send_raw(message.envelope(), &message.formatted())
            .await;
    }
    assert_eq!(inner.sends(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_drops_into_code_written_against_lettre() {
    use lettre::AsyncTransport;
    let breaker = breaker(Scripted::new("p"));
    let receipt: Receipt = AsyncTransport::send(&breaker, message()).await.unwrap();
    assert_eq!(receipt.transport(), "p");
}

#[tokio::test(start_paused = true)]
async fn boxed_and_shared_transports_are_transports_too() {
    let boxed: Box<dyn Transport> = Box::new(breaker(Scripted::new("p")));
    let shared: Arc<dyn Transport> = Arc::new(Scripted::new("q"));
    let wrapped = CircuitBreakerTransport::new(shared);
    let borrowed: &dyn Transport = &wrapped;
    assert_eq!(boxed.send(&message()).await.unwrap().transport(), "p");
    assert_eq!(borrowed.send(&message()).await.unwrap().transport(), "q");
}

// ---- several threads ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_racing_on_several_threads_all_go_through_while_closed_and_failures_open_it_once() {
    const TASKS: usize = 8;
    let inner = Scripted::new("p");
    let (heard, listener) = recorder();
    let breaker = Arc::new(
        CircuitBreakerTransport::builder(inner.clone())
            .failure_threshold(5)
            .reset_timeout(Duration::from_secs(3600))
            .on_state_change(listener)
            .build()
            .expect("valid settings"),
    );
    let race = |sends: usize| {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let breaker = Arc::clone(&breaker);
                tokio::spawn(async move {
                    let mut refused = 0;
                    for _ in 0..sends {
                        if let Err(error) = breaker.send(&message()).await
                            && error.code() == "breaker.open"
                        {
                            refused += 1;
                        }
                    }
                    refused
                })
            })
            .collect();
        futures::future::join_all(tasks)
    };

    let refused: usize = race(1_000).await.into_iter().map(Result::unwrap).sum();
    assert_eq!((refused, inner.sends()), (0, TASKS * 1_000));
    assert_eq!(breaker.state(), State::Closed);
    assert!(heard.lock().unwrap().is_empty());

    inner.set_default(failure());
    let refused: usize = race(100).await.into_iter().map(Result::unwrap).sum();
    let failures_sent = inner.sends() - TASKS * 1_000;
    assert_eq!(*heard.lock().unwrap(), [(State::Closed, State::Open)]);
    assert!(
        (5..5 + TASKS).contains(&failures_sent),
        "only the failures in flight when it opened passed the threshold: {failures_sent}"
    );
    assert_eq!(refused + failures_sent, TASKS * 100);
}

// ---- a send that was never attempted is not an answer (issue 45, point 10; DESIGN §15) ----

/// A breaker of `threshold` failures in a row over a limiter of one send a second, burst 1,
/// that never waits: a second send within the same second is refused `rate.limited`.
fn over_a_strict_limiter(
    inner: &Scripted,
    threshold: u32,
) -> CircuitBreakerTransport<mail_breaker::RateLimitTransport<Scripted>> {
    let limiter = mail_breaker::RateLimitTransport::builder(inner.clone())
        .per_second(1.0)
        .burst(1)
        .max_wait(Duration::ZERO)
        .build()
        .expect("valid limiter settings");
    CircuitBreakerTransport::builder(limiter)
        .failure_threshold(threshold)
        .reset_timeout(Duration::from_millis(100))
        .build()
        .expect("valid breaker settings")
}

#[tokio::test(start_paused = true)]
async fn a_probe_the_limiter_refused_leaves_the_breaker_half_open() {
    let inner = Scripted::new("provider");
    inner.then([failure()]);
    let breaker = over_a_strict_limiter(&inner, 1);
    let _ = breaker.send(&message()).await; // spends the limiter's slot, opens the breaker
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_millis(150)).await;

    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "rate.limited");
    assert!(refused.is_not_attempted());
    assert_eq!(
        breaker.state(),
        State::HalfOpen,
        "the refusal decided nothing"
    );
    assert_eq!(inner.sends(), 1);

    advance(Duration::from_secs(1)).await;
    breaker.send(&message()).await.unwrap(); // the next send is the probe
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn fail_fail_refusal_fail_opens_a_breaker_of_three_failures() {
    let inner = Scripted::answering("provider", failure());
    let breaker = over_a_strict_limiter(&inner, 3);

    let _ = breaker.send(&message()).await;
    advance(Duration::from_secs(1)).await;
    let _ = breaker.send(&message()).await;
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "rate.limited");
    assert_eq!(breaker.state(), State::Closed);
    advance(Duration::from_secs(1)).await;
    let _ = breaker.send(&message()).await;

    assert_eq!(inner.sends(), 3);
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_send_an_inner_breaker_held_back_counts_for_nothing_in_the_breaker_around_it() {
    let inner = Scripted::answering("provider", failure());
    let inner_breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .build()
        .unwrap();
    let outer = CircuitBreakerTransport::builder(inner_breaker)
        .failure_threshold(2)
        .reset_timeout(RESET)
        .build()
        .unwrap();

    let _ = outer.send(&message()).await; // a failure: the inner breaker opens
    let held = outer.send(&message()).await.unwrap_err();

    assert_eq!(held.code(), "breaker.open");
    assert!(held.is_not_attempted());
    assert_eq!(inner.sends(), 1);
    assert_eq!(
        outer.state(),
        State::Closed,
        "one failure, one send not attempted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_of_a_breaker_is_marked_not_attempted_and_a_provider_error_is_not() {
    let inner = Scripted::answering("provider", failure());
    let breaker = opens_after_one_failure(&inner, RESET);

    let failed = breaker.send(&message()).await.unwrap_err();
    let held = breaker.send(&message()).await.unwrap_err();

    assert!(!failed.is_not_attempted());
    assert!(held.is_not_attempted());
}

#[tokio::test(start_paused = true)]
async fn a_batch_message_the_limiter_refused_counts_for_nothing() {
    let inner = Scripted::answering("provider", failure());
    let breaker = over_a_strict_limiter(&inner, 2);

    // One failure, then two refusals in the same second, then a failure: two in a row.
    let answers: Vec<_> = breaker
        .send_many(futures::stream::iter(numbered_messages(3)).boxed())
        .collect()
        .await;
    let codes: Vec<_> = answers
        .iter()
        .map(|answer| answer.as_ref().unwrap_err().code().to_owned())
        .collect();
    assert_eq!(codes, ["test.server_error", "rate.limited", "rate.limited"]);
    assert_eq!(breaker.state(), State::Closed);
    advance(Duration::from_secs(1)).await;
    let _ = breaker.send(&message()).await;
    assert_eq!(breaker.state(), State::Open);
}
