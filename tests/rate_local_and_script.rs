//! Property test (issue 45, point 15): the limiter of one process and the fleet's script in
//! Redis (`src/rate/rate.lua`, on a real redis-server) give the same answers to the same
//! sequence. Random sequences of waits, sends, throttled sends and a factor of ½ turned on and
//! off (a reputation breaker's throttle, `slowed_by`) drive a local
//! `RateLimitTransport` under tokio's paused clock, and the script, timed by its test-only
//! clock argument, along the same timeline: each send must go at once in both, or be refused
//! in both with the same `retry_after`, at the same rate (in thousandths of a send a second).
//!
//! The limiters never wait (`max_wait` zero): tokio's timers keep whole milliseconds, so a
//! local send that waited would be seen to wait up to a millisecond longer than it was told,
//! while a refusal's `retry_after` is the limiter's own number, to the microsecond. The
//! script's waits are checked against the rules in `rate_script_model.rs`.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use mail_breaker::{Category, RateLimitTransport, SendError, Transport};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::redis::RedisServer;
use support::scripted::{Reply, Scripted};

const SCRIPT: &str = include_str!("../src/rate/rate.lua");
/// The script's clock at the local limiter's first instant, in µs.
const EPOCH: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// Time passes, in µs.
    Wait(u64),
    /// A send to this many recipients, each a slot.
    Send(u32),
    /// A send to this many recipients that the provider answers with a throttle.
    Throttled(u32),
    /// From now on the limiter is slowed by half (a reputation breaker's throttle), or not.
    Slowed(bool),
}

/// A factor the test turns: ½ while set, else 1.
#[derive(Debug, Clone, Default)]
struct Half(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl mail_breaker::rate::RateFactor for Half {
    fn rate_factor(&self) -> f64 {
        if self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0.5
        } else {
            1.0
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => prop_oneof![Just(1_000_000u64), Just(999_999), Just(1_000_001)].prop_map(Op::Wait),
        3 => (0u64..1_500_000).prop_map(Op::Wait),
        5 => prop_oneof![3 => Just(1u32), 1 => 2u32..9].prop_map(Op::Send),
        1 => (1u32..4).prop_map(Op::Throttled),
        1 => any::<bool>().prop_map(Op::Slowed),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    per_second: f64,
    burst: u32,
    floor: f64,
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        prop_oneof![
            Just(1.0),
            Just(3.0),
            Just(7.0),
            Just(14.5),
            Just(0.3),
            0.2f64..500.0
        ],
        1u32..8,
        prop_oneof![Just(0.1f64), Just(1.0), Just(30.0)],
    )
        .prop_map(|(per_second, burst, floor)| Settings {
            per_second,
            burst,
            floor: floor.min(per_second),
        })
}

/// What one send was answered: sent after a wait, or refused with a retry_after (µs); and
/// the rate when it was asked, in thousandths.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Sent { wait: u64, rate: i64 },
    Refused { retry_after: u64, rate: i64 },
}

fn throttle() -> Reply {
    Reply::Err(SendError::new(
        Category::RateLimited,
        "ses.throttling",
        "Maximum sending rate exceeded",
    ))
}

/// A message to `count` recipients.
fn message_to(count: u32) -> mail_breaker::Message {
    let mut builder = lettre::Message::builder().from("app@example.com".parse().unwrap());
    for n in 0..count {
        builder = builder.to(format!("user{n}@example.org").parse().unwrap());
    }
    builder.subject("hello").body(String::from("hi")).unwrap()
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).expect("a short duration")
}

#[test]
fn the_local_limiter_and_the_fleets_script_answer_a_sequence_alike() {
    let Some(server) = RedisServer::start("rate_local_and_script") else {
        return;
    };
    let redis_runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let client = redis::Client::open(server.url()).expect("a URL");
    let connection = redis_runtime
        .block_on(client.get_multiplexed_async_connection())
        .expect("a connection");
    let script = redis::Script::new(SCRIPT);
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let sequences = (settings(), proptest::collection::vec(op(), 1..50));
    runner
        .run(&sequences, |(settings, ops)| {
            let key = format!(
                "rate-local-and-script:{}",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            // The local limiter's clock: paused, advanced only by the sequence and the waits.
            let local_runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a runtime");
            let provider = Scripted::new("ses");
            let half = Half::default();
            let limited = local_runtime.block_on(async {
                RateLimitTransport::builder(provider.clone())
                    .per_second(settings.per_second)
                    .burst(settings.burst)
                    .min_per_second(settings.floor)
                    .max_wait(Duration::ZERO)
                    .adaptive(true)
                    .cost_per_recipient()
                    .slowed_by(half.clone())
                    .build()
                    .expect("valid settings")
            });
            let script_call =
                |op: &str, cost: u32, now: u64, factor: f64| -> Result<Vec<i64>, TestCaseError> {
                    let mut call = script.key(&key);
                    call.arg(op)
                        .arg(settings.per_second)
                        .arg(settings.burst)
                        .arg(0)
                        .arg(settings.floor)
                        .arg(60_000)
                        .arg("model")
                        .arg(cost)
                        .arg(now)
                        .arg(factor);
                    redis_runtime
                        .block_on(call.invoke_async(&mut connection.clone()))
                        .map_err(|error| TestCaseError::fail(error.to_string()))
                };
            let mut clock = 0u64;
            for (step, op) in ops.iter().enumerate() {
                let (throttled, recipients) = match op {
                    Op::Wait(by) => {
                        local_runtime.block_on(tokio::time::advance(Duration::from_micros(*by)));
                        clock += by;
                        continue;
                    }
                    Op::Send(recipients) => (false, *recipients),
                    Op::Throttled(recipients) => (true, *recipients),
                    Op::Slowed(slowed) => {
                        half.0.store(*slowed, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                };
                let factor = mail_breaker::rate::RateFactor::rate_factor(&half);
                let message = message_to(recipients);
                let (local, rate_after) = local_runtime.block_on(async {
                    // The script says its rate before the factor; x * ½ / ½ is x exactly.
                    let rate = (limited.per_second() / factor * 1000.0).floor() as i64;
                    if throttled {
                        provider.then([throttle()]);
                    }
                    let started = tokio::time::Instant::now();
                    let answer = limited.send(&message).await;
                    let waited = micros(started.elapsed());
                    provider.clear_queue();
                    let local = match answer {
                        Err(error) if error.code() == "rate.limited" => Answer::Refused {
                            retry_after: micros(error.retry_after().unwrap_or_default()),
                            rate,
                        },
                        _ => Answer::Sent { wait: waited, rate },
                    };
                    (
                        local,
                        (limited.per_second() / factor * 1000.0).floor() as i64,
                    )
                });
                let said = script_call("take", recipients, EPOCH + clock, factor)?;
                let script = match said[..] {
                    [1, wait, rate, _] => Answer::Sent {
                        wait: wait as u64,
                        rate,
                    },
                    [0, retry_after, rate, _] => Answer::Refused {
                        retry_after: retry_after as u64,
                        rate,
                    },
                    _ => return Err(TestCaseError::fail(format!("the script said {said:?}"))),
                };
                prop_assert_eq!(
                    &local,
                    &script,
                    "step {} ({:?}) of {:?} under {:?}",
                    step,
                    op,
                    ops,
                    settings
                );
                if let Answer::Sent { wait, .. } = local {
                    clock += wait;
                    if throttled {
                        let said = script_call("throttle", 1, EPOCH + clock, factor)?;
                        prop_assert_eq!(
                            said.get(2).copied(),
                            Some(rate_after),
                            "the rate after the throttle of step {} of {:?} under {:?}",
                            step,
                            ops,
                            settings
                        );
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}
