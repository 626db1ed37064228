//! A rate limiter in real time in front of a Postmark-like API that takes R messages a second
//! and throttles the rest with HTTP 429: pacing to it, and adapting when its capacity drops
//! and comes back.
#![cfg(feature = "postmark")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mail_breaker::{Category, Message, PostmarkTransport, RateLimitTransport, Transport};
use support::throttling::{TOKEN, ThrottlingApi};

/// When the capacity drops, how long it stays low, and how long the run goes on after.
const DROP_AT: Duration = Duration::from_secs(3);
const LOW_FOR: Duration = Duration::from_secs(8);
const BACK_FOR: Duration = Duration::from_secs(16);

fn message(index: usize) -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("user@example.org".parse().expect("a recipient"))
        .subject(format!("message {index}"))
        .body(String::from("hello"))
        .expect("a message")
}

/// Sends message after message until `stop`, each again until the API takes it; how many it
/// started.
async fn send_until(
    limiter: Arc<RateLimitTransport<PostmarkTransport>>,
    next: Arc<AtomicUsize>,
    stop: Instant,
) {
    while Instant::now() < stop {
        let message = message(next.fetch_add(1, Ordering::SeqCst));
        loop {
            match limiter.send(&message).await {
                Ok(_) => break,
                Err(error) if error.category() == Category::RateLimited => continue,
                Err(error) => panic!("only throttles are expected: {error}"),
            }
        }
    }
}

/// A limiter at `per_second` in front of `api`, whose sends wait up to 30 s for their slot.
fn limiter(
    api: &ThrottlingApi,
    per_second: f64,
    adaptive: bool,
) -> Arc<RateLimitTransport<PostmarkTransport>> {
    let postmark = PostmarkTransport::new(TOKEN)
        .with_endpoint(api.endpoint())
        .with_timeout(Duration::from_secs(2));
    Arc::new(
        RateLimitTransport::builder(postmark)
            .per_second(per_second)
            .adaptive(adaptive)
            .max_wait(Duration::from_secs(30))
            .build()
            .expect("valid settings"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_limiter_follows_the_providers_capacity_down_and_back_losing_nothing() {
    let api = ThrottlingApi::start(100.0).await;
    let limiter = limiter(&api, 100.0, true);
    let started = Instant::now();
    let (dropped, back) = (started + DROP_AT, started + DROP_AT + LOW_FOR);
    let stop = back + BACK_FOR;
    let next = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..16)
        .map(|_| tokio::spawn(send_until(Arc::clone(&limiter), Arc::clone(&next), stop)))
        .collect();
    tokio::time::sleep_until(dropped.into()).await;
    api.set_rate(40.0);
    tokio::time::sleep_until(back.into()).await;
    api.set_rate(100.0);
    for sender in senders {
        sender.await.expect("a sender ran");
    }

    let settled = dropped + Duration::from_secs(5);
    let (taken, throttled) = api.answers(settled, back - settled);
    let share = throttled as f64 / (taken + throttled) as f64;
    eprintln!("low: {taken} taken, {throttled} throttled");
    assert!(
        taken as f64 >= 0.5 * 40.0 * (back - settled).as_secs_f64(),
        "at 40/s, it still uses at least half of it: {taken} in {:?}",
        back - settled
    );
    assert!(
        share < 0.05,
        "5 s after the drop, throttles are {:.1} % of sends ({throttled} of {})",
        share * 100.0,
        taken + throttled
    );
    let last = Duration::from_secs(3);
    let (taken, throttled) = api.answers(stop - last, last);
    eprintln!("back: {taken} taken, {throttled} throttled");
    assert!(
        taken as f64 >= 0.9 * 100.0 * last.as_secs_f64(),
        "back at 100/s, it takes {taken} in the last {last:?}"
    );
    let mut subjects = api.subjects();
    let sent = next.load(Ordering::SeqCst);
    assert_eq!(subjects.len(), sent, "every message taken, once");
    subjects.sort();
    subjects.dedup();
    assert_eq!(subjects.len(), sent, "none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limiter_at_50_a_second_sends_500_messages_in_10_seconds_unthrottled() {
    let api = ThrottlingApi::start(60.0).await;
    let limiter = limiter(&api, 50.0, false);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, next) = (Arc::clone(&limiter), Arc::clone(&next));
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < 500 {
                    limiter.send(&message(0)).await.expect("sent");
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.expect("a sender ran");
    }
    let took = started.elapsed();
    let (taken, throttled) = api.answers(started, took + Duration::from_secs(1));
    assert_eq!((taken, throttled), (500, 0));
    // The first at once, then one every 20 ms: 9.98 s.
    assert!(
        took >= Duration::from_millis(9_500) && took <= Duration::from_millis(10_500),
        "500 sends at 50/s took {took:?}"
    );
}
