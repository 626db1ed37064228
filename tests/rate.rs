//! The rate limiter's rules, under paused time: pacing, bursts, the longest wait, sends in
//! flight, and an adaptive rate.

mod support;

use std::time::Duration;

use futures::future::join_all;
use mail_breaker::{
    Category, CircuitBreakerTransport, RateLimitTransport, SendError, State, Transport,
};
use support::scripted::{Reply, Scripted};
use tokio::time::Instant;

fn limiter(provider: &Scripted, per_second: f64) -> mail_breaker::RateLimitBuilder<Scripted> {
    RateLimitTransport::builder(provider.clone())
        .per_second(per_second)
        .max_wait(Duration::from_secs(60))
}

fn throttle() -> Reply {
    Reply::Err(SendError::new(
        Category::RateLimited,
        "ses.throttling",
        "Maximum sending rate exceeded",
    ))
}

#[tokio::test(start_paused = true)]
async fn five_hundred_sends_at_fifty_a_second_take_ten_seconds() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 50.0).build().unwrap();
    let message = support::message();
    let started = Instant::now();
    let answers = join_all((0..500).map(|_| limited.send(&message))).await;
    let took = started.elapsed();
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(provider.sends(), 500);
    // The first goes at once, then one every 20 ms.
    assert_eq!(took, Duration::from_millis(499 * 20), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_burst_goes_at_once_and_the_rest_are_spaced() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 10.0).burst(5).build().unwrap();
    let message = support::message();
    let started = Instant::now();
    join_all((0..5).map(|_| limited.send(&message))).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    limited.send(&message).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_send_with_no_slot_within_max_wait_is_refused_at_once_with_its_retry_after() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 1.0)
        .max_wait(Duration::from_millis(100))
        .build()
        .unwrap();
    let message = support::message();
    limited.send(&message).await.unwrap();
    let started = Instant::now();
    let error = limited.send(&message).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "answered at once");
    assert_eq!(error.category(), Category::RateLimited);
    assert_eq!(error.code(), "rate.limited");
    assert_eq!(error.retry_after(), Some(Duration::from_millis(900)));
    assert_eq!(error.transport(), Some("ses"));
    assert_eq!(provider.sends(), 1, "nothing was sent");
}

#[tokio::test(start_paused = true)]
async fn a_refused_send_reserves_no_slot() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 1.0)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let message = support::message();
    limited.send(&message).await.unwrap();
    for _ in 0..10 {
        limited.send(&message).await.unwrap_err();
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    limited.send(&message).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_refusal_never_trips_a_breaker() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 1.0)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let breaker = CircuitBreakerTransport::builder(limited)
        .failure_threshold(1)
        .build()
        .unwrap();
    let message = support::message();
    for _ in 0..20 {
        let _ = breaker.send(&message).await;
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn max_in_flight_bounds_the_sends_under_way() {
    let provider = Scripted::answering("ses", Reply::after(Duration::from_secs(1), Reply::Ok));
    let limited = limiter(&provider, 1_000.0)
        .burst(1_000)
        .max_in_flight(2)
        .build()
        .unwrap();
    let message = support::message();
    let started = Instant::now();
    let answers = join_all((0..6).map(|_| limited.send(&message))).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(3),
        "two at a time, a second each"
    );
}

#[tokio::test(start_paused = true)]
async fn a_send_that_waits_for_a_place_past_max_wait_is_refused() {
    let provider = Scripted::answering("ses", Reply::after(Duration::from_secs(10), Reply::Ok));
    let limited = limiter(&provider, 1_000.0)
        .burst(1_000)
        .max_in_flight(1)
        .max_wait(Duration::from_millis(500))
        .build()
        .unwrap();
    let message = support::message();
    let (first, second) = tokio::join!(limited.send(&message), async {
        tokio::task::yield_now().await;
        let started = Instant::now();
        let answer = limited.send(&message).await;
        (answer, started.elapsed())
    });
    first.unwrap();
    let (answer, waited) = second;
    assert_eq!(answer.unwrap_err().code(), "rate.limited");
    assert_eq!(waited, Duration::from_millis(500));
    assert_eq!(provider.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_provider_throttle_halves_an_adaptive_rate_and_each_quiet_second_gives_five_percent_back()
{
    let provider = Scripted::new("ses");
    provider.then([throttle()]);
    let limited = limiter(&provider, 100.0).adaptive(true).build().unwrap();
    let error = limited.send(&support::message()).await.unwrap_err();
    assert_eq!(
        error.code(),
        "ses.throttling",
        "the provider's answer is passed on"
    );
    assert_eq!(limited.per_second(), 50.0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(limited.per_second(), 55.0);
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(limited.per_second(), 100.0);
}

#[tokio::test(start_paused = true)]
async fn a_halved_rate_spaces_sends_twice_as_far() {
    let provider = Scripted::new("ses");
    provider.then([throttle()]);
    let limited = limiter(&provider, 10.0).adaptive(true).build().unwrap();
    let message = support::message();
    let _ = limited.send(&message).await; // at 0, throttled: 5 a second from now on
    let started = Instant::now();
    limited.send(&message).await.unwrap();
    limited.send(&message).await.unwrap();
    // The send owed at 0 is owed at the new rate too (issue 45, point 12): each of the two
    // waits one interval of 200 ms.
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(200 + 200),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_rate_never_falls_below_min_per_second() {
    let provider = Scripted::answering("ses", throttle());
    let limited = limiter(&provider, 100.0)
        .adaptive(true)
        .min_per_second(30.0)
        .build()
        .unwrap();
    for throttle in 0..5 {
        if throttle > 0 {
            tokio::time::advance(Duration::from_secs(1)).await; // each throttle a new signal
        }
        let _ = limited.send(&support::message()).await;
    }
    assert_eq!(limited.per_second(), 30.0);
}

#[tokio::test(start_paused = true)]
async fn a_limiter_that_is_not_adaptive_keeps_its_rate_after_a_throttle() {
    let provider = Scripted::answering("ses", throttle());
    let limited = limiter(&provider, 100.0).build().unwrap();
    let _ = limited.send(&support::message()).await;
    assert_eq!(limited.per_second(), 100.0);
}

#[tokio::test(start_paused = true)]
async fn an_inner_limiters_refusal_does_not_lower_an_outer_adaptive_rate() {
    let provider = Scripted::new("ses");
    let inner = limiter(&provider, 1.0)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let outer = RateLimitTransport::builder(inner)
        .per_second(100.0)
        .burst(100)
        .adaptive(true)
        .build()
        .unwrap();
    for _ in 0..3 {
        let _ = outer.send(&support::message()).await;
    }
    assert_eq!(outer.per_second(), 100.0);
}

#[test]
fn every_setting_out_of_range_is_a_config_error_naming_it() {
    let build = |f: fn(
        mail_breaker::RateLimitBuilder<Scripted>,
    ) -> mail_breaker::RateLimitBuilder<Scripted>| {
        f(RateLimitTransport::builder(Scripted::new("p")))
            .build()
            .unwrap_err()
            .setting()
            .to_owned()
    };
    assert_eq!(build(|b| b), "per_second");
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            RateLimitTransport::builder(Scripted::new("p"))
                .per_second(bad)
                .build()
                .unwrap_err()
                .setting(),
            "per_second"
        );
    }
    assert_eq!(build(|b| b.per_second(5.0).burst(0)), "burst");
    assert_eq!(
        build(|b| b.per_second(5.0).max_in_flight(0)),
        "max_in_flight"
    );
    assert_eq!(
        build(|b| b.per_second(5.0).min_per_second(6.0)),
        "min_per_second"
    );
    assert_eq!(
        build(|b| b.per_second(5.0).min_per_second(0.0)),
        "min_per_second"
    );
}

#[tokio::test(start_paused = true)]
async fn the_longest_settings_neither_panic_nor_overflow() {
    let provider = Scripted::new("ses");
    let limited = RateLimitTransport::builder(provider.clone())
        .per_second(f64::MIN_POSITIVE)
        .min_per_second(f64::MIN_POSITIVE)
        .burst(u32::MAX)
        .max_in_flight(usize::MAX)
        .max_wait(Duration::MAX)
        .adaptive(true)
        .build()
        .unwrap();
    limited.send(&support::message()).await.unwrap();
    let fast = RateLimitTransport::builder(provider)
        .per_second(f64::MAX)
        .build()
        .unwrap();
    fast.send(&support::message()).await.unwrap();
}

#[test]
fn a_limiter_is_named_after_its_transport_unless_named() {
    let provider = Scripted::new("ses");
    let unnamed = limiter(&provider, 10.0).build().unwrap();
    assert_eq!(unnamed.limiter_name(), "ses");
    let named = limiter(&provider, 10.0).name("ses-eu").build().unwrap();
    assert_eq!(named.limiter_name(), "ses-eu");
}

#[test]
fn a_limiter_keeps_its_transports_name_as_a_transport() {
    let provider = Scripted::new("ses");
    let named = limiter(&provider, 10.0).name("ses-eu").build().unwrap();
    assert_eq!(Transport::name(&named), "ses");
}

#[tokio::test(start_paused = true)]
async fn verify_asks_the_paced_transport_and_answers_what_it_said() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 10.0).build().unwrap();
    provider.fail_verify_with(Reply::fail(Category::Authentication));
    let error = limited.verify().await.unwrap_err();
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(provider.verifies(), 1);
}

// ---- a refusal is not a result (issue 45, point 10; DESIGN §15) ----

#[tokio::test(start_paused = true)]
async fn a_send_refused_for_want_of_a_slot_is_marked_not_attempted() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 1.0)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let message = support::message();
    let sent = limited.send(&message).await;
    let refused = limited.send(&message).await.unwrap_err();
    assert!(sent.is_ok());
    assert!(refused.is_not_attempted());
}

#[tokio::test(start_paused = true)]
async fn a_send_refused_for_want_of_a_place_in_flight_is_marked_not_attempted() {
    let provider = Scripted::answering("ses", Reply::Hang);
    let limited = limiter(&provider, 1_000.0)
        .burst(10)
        .max_in_flight(1)
        .max_wait(Duration::from_millis(10))
        .build()
        .unwrap();
    let message = support::message();
    let refused = tokio::select! {
        _ = limited.send(&message) => unreachable!("the provider never answers"),
        refused = async {
            tokio::task::yield_now().await;
            limited.send(&message).await
        } => refused.unwrap_err(),
    };
    assert_eq!(refused.code(), "rate.limited");
    assert!(refused.is_not_attempted());
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_throttles_is_not_marked_not_attempted() {
    let provider = Scripted::answering("ses", throttle());
    let limited = limiter(&provider, 10.0).build().unwrap();
    let throttled = limited.send(&support::message()).await.unwrap_err();
    assert!(!throttled.is_not_attempted());
}

// ---- a fractional rate builds by itself (issue 45, point 11) ----

#[tokio::test(start_paused = true)]
async fn a_fractional_rate_builds_by_itself_and_spaces_sends_by_its_interval() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 0.5).build().unwrap();
    let message = support::message();
    let started = Instant::now();
    limited.send(&message).await.unwrap();
    limited.send(&message).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_fractional_rate_builds_by_itself_and_keeps_its_rate_as_its_floor() {
    let provider = Scripted::answering("ses", throttle());
    let limited = limiter(&provider, 0.5).adaptive(true).build().unwrap();
    let _ = limited.send(&support::message()).await;
    assert_eq!(
        limited.per_second(),
        0.5,
        "the default floor, 1 a second, is above the rate: the rate is its own floor"
    );
}

#[test]
fn a_floor_set_above_the_rate_is_still_a_config_error() {
    let error = RateLimitTransport::builder(Scripted::new("p"))
        .per_second(0.5)
        .adaptive(true)
        .min_per_second(1.0)
        .build()
        .unwrap_err();
    assert_eq!(error.setting(), "min_per_second");
}

// ---- a rate change creates no credit (issue 45, point 12) ----

#[tokio::test(start_paused = true)]
async fn halving_a_saturated_limiter_gives_it_no_new_burst() {
    let provider = Scripted::new("ses");
    provider.then(std::iter::repeat_n(Reply::Ok, 9).chain([throttle()]));
    let limited = limiter(&provider, 10.0)
        .burst(10)
        .adaptive(true)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let message = support::message();
    for _ in 0..10 {
        let _ = limited.send(&message).await; // the burst, spent; the last is throttled
    }
    assert_eq!(limited.per_second(), 5.0);

    let refused = limited.send(&message).await.unwrap_err();

    assert_eq!(refused.code(), "rate.limited");
    assert_eq!(provider.sends(), 10);
}

#[tokio::test(start_paused = true)]
async fn after_a_halving_a_saturated_limiter_sends_at_the_new_rate() {
    let provider = Scripted::new("ses");
    provider.then(std::iter::repeat_n(Reply::Ok, 9).chain([throttle()]));
    let limited = limiter(&provider, 10.0)
        .burst(10)
        .adaptive(true)
        .build()
        .unwrap();
    let message = support::message();
    for _ in 0..10 {
        let _ = limited.send(&message).await;
    }
    let started = Instant::now();

    limited.send(&message).await.unwrap();

    // Ten sends spent at 100 ms each are owed at 200 ms each: the next slot is one new
    // interval past the burst, 2 s - 1.8 s of tolerance.
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

// ---- a limiter may count recipients (issue 45, point 13) ----

/// A message to `count` recipients.
fn message_to_many(count: usize) -> mail_breaker::Message {
    let mut builder = lettre::Message::builder().from("app@example.com".parse().unwrap());
    for n in 0..count {
        builder = builder.to(format!("user{n}@example.org").parse().unwrap());
    }
    builder.subject("hello").body(String::from("hi")).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_limiter_that_counts_recipients_charges_one_slot_per_recipient() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 10.0)
        .cost_per_recipient()
        .build()
        .unwrap();
    limited.send(&message_to_many(3)).await.unwrap();
    let started = Instant::now();
    limited.send(&message_to_many(1)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn by_default_a_message_costs_one_slot_whatever_its_recipients() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 10.0).build().unwrap();
    limited.send(&message_to_many(3)).await.unwrap();
    let started = Instant::now();
    limited.send(&message_to_many(1)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_message_to_more_recipients_than_the_burst_goes_once_the_burst_is_whole_and_the_rest_is_owed()
 {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 10.0)
        .burst(2)
        .max_wait(Duration::ZERO)
        .cost_per_recipient()
        .build()
        .unwrap();
    limited.send(&message_to_many(5)).await.unwrap();
    let refused = limited.send(&message_to_many(1)).await.unwrap_err();
    // Five slots owed (500 ms), less one interval of burst: the next send's slot is 400 ms away.
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(400)));
}

#[tokio::test(start_paused = true)]
async fn send_raw_counts_the_envelopes_recipients_too() {
    let provider = Scripted::new("ses");
    let limited = limiter(&provider, 10.0)
        .cost_per_recipient()
        .build()
        .unwrap();
    let message = message_to_many(4);
    limited
        .send_raw(message.envelope(), &message.formatted())
        .await
        .unwrap();
    let started = Instant::now();
    limited.send(&message_to_many(1)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(400));
}
