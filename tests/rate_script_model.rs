//! Property test: the fleet's rate script (`src/rate/rate.lua`) keeps the rate limiter's
//! rules, on a real redis-server. Random sequences of waits, takes and throttles go to the
//! script (timed by its test-only clock argument) and to a model written here from the rules
//! below, and every reply must be the same.
//!
//! The rules, in whole microseconds (issue 45, points 12 and 15):
//! - The rate: the configured rate until the first halving; then the rate just after the last
//!   halving plus 5 % of the configured rate for each whole second since, never above the
//!   configured rate.
//! - A throttle halves the rate (not below the floor, itself at most the configured rate),
//!   unless the last halving was less than a second ago: then it changes nothing. The halved
//!   rate is kept exactly.
//! - A take (GCRA): a slot every `ceil(1e6 / rate)` µs (at least 1, at most 2⁵⁰); a send may
//!   go up to `burst - 1` intervals ahead of the theoretical arrival time (at most 2⁵⁰ µs); its
//!   wait is how far its slot is from now. A wait beyond the longest wait (itself at most 2⁵⁰)
//!   is refused, nothing reserved, with how far past it the slot would be; else the
//!   theoretical arrival time moves on by one interval, and is kept with that interval.
//! - A take may cost several slots (`cost`, below 1 taken as 1): it goes once
//!   `min(cost, burst)` slots are free (its slot is `tat + (min(cost, burst) - 1) × interval -
//!   tolerance`, that part at most 2⁵⁰), and moves the theoretical arrival time on by `cost`
//!   intervals (at most 2⁵⁰ µs).
//! - A rate change creates no credit: when the interval now differs from the one the
//!   theoretical arrival time was counted in, what is owed (`tat - now`, when positive) is
//!   owed as as many sends at the new interval, `ceil(owed × new / old)` (at most 3 × 2⁵⁰).
//! - Replies: `{1, wait, rate, members}`, `{0, past the longest wait, rate, members}` or
//!   `{2, 0, rate, members}` for a throttle, times in µs, rates in thousandths rounded down,
//!   `members` the processes that called in the last ten minutes (here one).
#![cfg(feature = "redis")]

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::redis::RedisServer;

const SCRIPT: &str = include_str!("../src/rate/rate.lua");
const EPOCH: f64 = 1_700_000_000_000_000.0;
const SECOND: f64 = 1_000_000.0;

#[derive(Debug, Clone)]
enum Op {
    Wait(u32),
    Take { max_wait: u32, cost: u32 },
    Throttle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Whole seconds and a µs either side, where the rules change their minds.
        1 => prop_oneof![Just(1_000_000u32), Just(999_999), Just(1_000_001), Just(2_000_000)]
            .prop_map(Op::Wait),
        3 => (0u32..1_500_000).prop_map(Op::Wait),
        5 => (
            prop_oneof![Just(0u32), Just(10_000), Just(100_000), Just(1_000_000), 0u32..3_000_000],
            prop_oneof![3 => Just(1u32), 1 => 0u32..9],
        )
            .prop_map(|(max_wait, cost)| Op::Take { max_wait, cost }),
        1 => Just(Op::Throttle),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    configured: f64,
    burst: u32,
    floor: f64,
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        prop_oneof![
            Just(1.0),
            Just(3.0),
            Just(14.5),
            Just(50.0),
            Just(100.0),
            0.5f64..500.0
        ],
        1u32..6,
        prop_oneof![Just(0.5), Just(1.0), Just(30.0), Just(1_000.0)],
    )
        .prop_map(|(configured, burst, floor)| Settings {
            configured,
            burst,
            floor,
        })
}

/// The longest interval, tolerance and wait, in µs.
const CAP: f64 = 1_125_899_906_842_624.0;

/// The model: the rules above, on what the script keeps.
#[derive(Debug, Default)]
struct Model {
    /// The theoretical arrival time, and the interval it was counted in.
    tat: Option<(f64, f64)>,
    base: Option<f64>,
    since: Option<f64>,
}

impl Model {
    fn rate(&self, settings: Settings, now: f64) -> f64 {
        match (self.base, self.since) {
            (Some(base), Some(since)) => {
                let quiet = ((now - since).max(0.0) / SECOND).floor();
                settings
                    .configured
                    .min(base + 0.05 * settings.configured * quiet)
            }
            _ => settings.configured,
        }
    }

    fn throttle(&mut self, settings: Settings, now: f64) -> [i64; 3] {
        let rate = self.rate(settings, now);
        if self.since.is_some_and(|since| now - since < SECOND) {
            return [2, 0, (rate * 1000.0).floor() as i64];
        }
        let halved = (rate * 0.5).max(settings.floor.min(settings.configured));
        self.base = Some(halved);
        self.since = Some(now);
        [2, 0, (halved * 1000.0).floor() as i64]
    }

    fn take(&mut self, settings: Settings, now: f64, max_wait: f64, cost: u32) -> [i64; 3] {
        let rate = self.rate(settings, now);
        let interval = (SECOND / rate).ceil().clamp(1.0, CAP);
        let tolerance = (interval * f64::from(settings.burst.saturating_sub(1))).min(CAP);
        let tat = match self.tat {
            Some((tat, counted_in)) if tat > now && counted_in != interval => {
                now + ((tat - now) * interval / counted_in).ceil().min(3.0 * CAP)
            }
            Some((tat, _)) => tat.max(now),
            None => now,
        };
        let cost = f64::from(cost.max(1));
        let ahead = (interval * (cost.min(f64::from(settings.burst.max(1))) - 1.0)).min(CAP);
        let slot = (tat + ahead - tolerance).max(now);
        let wait = slot - now;
        let rate_millis = (rate * 1000.0).floor() as i64;
        let max_wait = max_wait.min(CAP);
        if wait > max_wait {
            return [0, (wait - max_wait) as i64, rate_millis];
        }
        self.tat = Some((tat + (interval * cost).min(CAP), interval));
        [1, wait as i64, rate_millis]
    }
}

#[test]
fn the_rate_script_keeps_the_rate_limiters_rules() {
    let Some(server) = RedisServer::start("rate_script_model") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let client = redis::Client::open(server.url()).expect("a URL");
    let connection = runtime
        .block_on(client.get_multiplexed_async_connection())
        .expect("a connection");
    let script = redis::Script::new(SCRIPT);
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(300);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let sequences = (settings(), proptest::collection::vec(op(), 1..60));
    runner
        .run(&sequences, |(settings, ops)| {
            let key = format!(
                "rate-model:{}",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            let mut model = Model::default();
            let mut now = EPOCH;
            for (step, op) in ops.iter().enumerate() {
                let (name, max_wait, cost) = match op {
                    Op::Wait(micros) => {
                        now += f64::from(*micros);
                        continue;
                    }
                    Op::Take { max_wait, cost } => ("take", f64::from(*max_wait), *cost),
                    Op::Throttle => ("throttle", 0.0, 1),
                };
                let mut call = script.key(&key);
                call.arg(name)
                    .arg(settings.configured)
                    .arg(settings.burst)
                    .arg(max_wait)
                    .arg(settings.floor)
                    .arg(60_000)
                    .arg("model")
                    .arg(cost)
                    .arg(now);
                let said: Vec<i64> = runtime
                    .block_on(call.invoke_async(&mut connection.clone()))
                    .map_err(|error| TestCaseError::fail(error.to_string()))?;
                let expected = match op {
                    Op::Throttle => model.throttle(settings, now),
                    _ => model.take(settings, now, max_wait, cost),
                };
                prop_assert_eq!(said.get(3).copied(), Some(1), "one process shares it");
                prop_assert_eq!(
                    &said[..3],
                    expected.as_slice(),
                    "step {} ({:?}) of {:?} under {:?}",
                    step,
                    op,
                    ops,
                    settings
                );
            }
            Ok(())
        })
        .unwrap();
}
