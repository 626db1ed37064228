//! Property test (issue 16): the Redis store's script (`src/store/redis/breaker.lua`) decides
//! as the pure `Machine` does. The same random sequences of time steps, sends, results,
//! drops, looks, isolates and resets go through a `RedisStore` on a real redis-server and
//! through a `Machine`, and after each step every decision (with its permit's period and
//! probe, or its retry_after), snapshot, state and change of state is compared.
//!
//! Both see one time, in whole milliseconds since the case started: the `Machine` as an
//! `Instant` after a start, the script as microseconds through the store's test-only clock,
//! so no rounding can set them apart. Each case uses a key of its own on one connection.
#![cfg(feature = "redis")]

mod support;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::breaker::{Counting, Decision, Machine, Outcome, Permit, Rules, Transitions};
use mail_breaker::store::Reporter;
use mail_breaker::{BreakerStore, ErrorRate, RedisStore, State};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use support::redis::RedisServer;
use tokio::time::Instant;

/// Random sequences per run, at least.
const CASES: u32 = 500;
/// The store's timeout: long enough that no call falls back to local state on a busy machine.
const PATIENT: Duration = Duration::from_secs(5);
/// The script's time at the start of each case, in microseconds (an ordinary Unix time).
const EPOCH_MICROS: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone)]
enum Event {
    Wait(u64),
    Send,
    Answer { pick: Pick, failed: bool },
    Drop { pick: Pick },
    Look,
    Isolate,
    Reset,
}

/// Which of the sends out an answer or a drop is for.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// The last one given: often the probe, whose answer decides the most.
    Latest,
    /// Any, by index modulo how many are out.
    Any(usize),
}

impl Pick {
    fn index(self, out: usize) -> usize {
        match self {
            Pick::Latest => out - 1,
            Pick::Any(n) => n % out,
        }
    }
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![Just(Pick::Latest), any::<usize>().prop_map(Pick::Any)]
}

/// One event; a result is a failure with probability `failing`, which each sequence draws
/// once, so that some providers are mostly down and some mostly up (closing a half-open
/// breaker takes successful probes in a row).
fn event(failing: f64) -> impl Strategy<Value = Event> {
    // Whole seconds as well as odd milliseconds, so that waits land on deadlines set in
    // whole seconds.
    let wait = prop_oneof![0u64..6_000, (0u64..40).prop_map(|secs| secs * 1_000)];
    prop_oneof![
        3 => wait.prop_map(Event::Wait),
        4 => Just(Event::Send),
        4 => (pick(), prop::bool::weighted(failing))
            .prop_map(|(pick, failed)| Event::Answer { pick, failed }),
        2 => pick().prop_map(|pick| Event::Drop { pick }),
        1 => Just(Event::Look),
        // Rarer: each undoes what the sequence built up.
        1 => prop_oneof![19 => Just(Event::Look), 1 => Just(Event::Isolate)],
        1 => prop_oneof![9 => Just(Event::Look), 1 => Just(Event::Reset)],
    ]
}

fn rules() -> impl Strategy<Value = Rules> {
    let counting = prop_oneof![
        (1u32..6).prop_map(|threshold| Counting::Consecutive { threshold }),
        (1u8..=100, 1u32..12, 1u64..20, 0u64..1_000, 1u32..=10).prop_map(
            |(threshold_percent, minimum_requests, secs, extra_ms, buckets)| {
                Counting::ErrorRate(ErrorRate {
                    threshold_percent,
                    minimum_requests,
                    // Any whole number of milliseconds: buckets need not divide it evenly.
                    window: Duration::from_millis(secs * 1_000 + extra_ms),
                    buckets,
                })
            }
        ),
    ];
    let longest = prop::option::of(0u64..200);
    (counting, 1u64..30, 1u64..30, 1u32..4, longest).prop_map(
        |(counting, reset, probe, successes, longest)| Rules {
            counting,
            reset_timeout: Duration::from_secs(reset),
            probe_timeout: Duration::from_secs(probe),
            half_open_successes: successes,
            // Never below the reset timeout: the builder refuses that.
            max_reset_timeout: longest.map(|extra| Duration::from_secs(reset + extra)),
        },
    )
}

/// Sequences where the two once disagreed, and one the random search is unlikely to meet,
/// run before it.
fn known_cases() -> Vec<(Rules, Vec<Event>)> {
    use Event::*;
    let ok = Answer {
        pick: Pick::Latest,
        failed: false,
    };
    let failed = Answer {
        pick: Pick::Latest,
        failed: true,
    };
    // A reset of a key never written moves the period: the failure of the send made
    // before it counts for nothing.
    let reset_fresh_key = (
        Rules {
            counting: Counting::Consecutive { threshold: 1 },
            ..Rules::default()
        },
        vec![Send, Reset, failed, Send],
    );
    // A window's slices start at its first result, not when the key was made.
    let slices_from_first_result = (
        Rules {
            counting: Counting::ErrorRate(ErrorRate {
                threshold_percent: 1,
                minimum_requests: 1,
                window: Duration::from_millis(5_656),
                buckets: 1,
            }),
            ..Rules::default()
        },
        vec![Wait(1), Send, ok.clone(), Wait(5_655), Look],
    );
    // A window of 1001 ms in 3 buckets: slices of 333.666... ms. Counted in nanoseconds
    // and in microseconds, slice 501 starts 333 us apart, at 166 833 ms on the script's
    // side of the result at 165 900 ms (slice 498).
    let uneven_slices = Rules {
        counting: Counting::ErrorRate(ErrorRate {
            threshold_percent: 100,
            minimum_requests: 5,
            window: Duration::from_millis(1_001),
            buckets: 3,
        }),
        ..Rules::default()
    };
    vec![
        reset_fresh_key,
        slices_from_first_result,
        (
            uneven_slices,
            vec![Send, ok.clone(), Wait(165_900), Send, ok, Wait(933), Look],
        ),
    ]
}

fn changes(transitions: Transitions) -> Vec<(State, State)> {
    transitions.iter().map(|t| (t.from, t.to)).collect()
}

/// One case's two breakers, stepped together.
struct Pair<'a> {
    store: &'a RedisStore,
    clock: &'a AtomicU64,
    key: String,
    rules: Rules,
    machine: Machine,
    start: Instant,
    elapsed_ms: u64,
    /// Changes the store reported through the reporter rather than returned.
    late: Reporter,
    heard_late: Arc<Mutex<Vec<(State, State)>>>,
    /// Sends out, each with the store's permit and the machine's.
    outstanding: Vec<(Permit, Permit)>,
}

impl Pair<'_> {
    fn now(&self) -> Instant {
        self.start + Duration::from_millis(self.elapsed_ms)
    }

    fn late_changes(&self) -> Vec<(State, State)> {
        std::mem::take(&mut *self.heard_late.lock().unwrap())
    }

    /// Runs `event` through both, checking that they agree; `step` names it in a failure.
    async fn step(&mut self, step: usize, event: &Event) -> Result<(), TestCaseError> {
        let now = self.now();
        let (key, rules, late) = (self.key.as_str(), &self.rules, &self.late);
        let (script, machine, asked) = match *event {
            Event::Wait(ms) => {
                self.elapsed_ms += ms;
                self.clock
                    .store(EPOCH_MICROS + self.elapsed_ms * 1_000, Ordering::Relaxed);
                return Ok(());
            }
            Event::Send => {
                let (script, script_changes) = self.store.acquire(key, rules, late).await;
                let (machine, machine_changes) = self.machine.acquire(rules, now);
                prop_assert_eq!(script, machine, "step {}: the decision", step);
                if let (Decision::Send(script), Decision::Send(machine)) = (script, machine) {
                    self.outstanding.push((script, machine));
                }
                (script_changes, machine_changes, true)
            }
            Event::Answer { pick, failed } => {
                if self.outstanding.is_empty() {
                    return Ok(());
                }
                let (script, machine) = self.outstanding.remove(pick.index(self.outstanding.len()));
                let outcome = if failed {
                    Outcome::Failure
                } else {
                    Outcome::Success
                };
                (
                    self.store.record(key, rules, script, outcome, late).await,
                    self.machine.record(rules, now, machine, outcome),
                    true,
                )
            }
            Event::Drop { pick } => {
                if self.outstanding.is_empty() {
                    return Ok(());
                }
                let (script, machine) = self.outstanding.remove(pick.index(self.outstanding.len()));
                release_and_wait(self.store, key, rules, script, late).await;
                (
                    Transitions::NONE,
                    self.machine.release(rules, now, machine),
                    false,
                )
            }
            Event::Look => {
                let script = self.store.snapshot(key, rules, late).await;
                let (machine, machine_changes) = self.machine.snapshot(key, rules, now);
                prop_assert_eq!(script, machine, "step {}: the snapshot", step);
                (Transitions::NONE, machine_changes, true)
            }
            Event::Isolate => (
                self.store.isolate(key, rules, late).await,
                self.machine.isolate(),
                true,
            ),
            Event::Reset => (
                self.store.reset(key, rules, late).await,
                self.machine.reset(),
                true,
            ),
        };
        let mut script_changes = changes(script);
        script_changes.extend(self.late_changes());
        prop_assert_eq!(
            script_changes,
            changes(machine),
            "step {}: the changes of state",
            step
        );
        // The store's state is what it last saw in Redis; a release answers in the
        // background, so its state is checked at the next call that asks.
        if asked {
            prop_assert_eq!(
                self.store.state(key, rules).0,
                self.machine.state(),
                "step {}: the state",
                step
            );
        }
        prop_assert!(self.store.is_shared(), "step {}: Redis answered", step);
        Ok(())
    }
}

/// Gives `permit` back and waits until the store's background call, if it made one, has
/// ended and reported what it changed.
async fn release_and_wait(
    store: &RedisStore,
    key: &str,
    rules: &Rules,
    permit: Permit,
    late: &Reporter,
) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    store.release(key, rules, permit, late);
    let deadline = std::time::Instant::now() + PATIENT;
    while metrics.num_alive_tasks() > before {
        assert!(
            std::time::Instant::now() < deadline,
            "the release did not end within {PATIENT:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn run_case(
    store: &RedisStore,
    clock: &AtomicU64,
    key: String,
    rules: Rules,
    events: &[Event],
) -> Result<(), TestCaseError> {
    clock.store(EPOCH_MICROS, Ordering::Relaxed);
    let start = Instant::now();
    let heard_late: Arc<Mutex<Vec<(State, State)>>> = Arc::default();
    let sink = Arc::clone(&heard_late);
    let mut pair = Pair {
        store,
        clock,
        key,
        rules,
        machine: Machine::new(&rules, start),
        start,
        elapsed_ms: 0,
        late: Reporter::new(move |_, transitions| {
            sink.lock()
                .unwrap()
                .extend(transitions.iter().map(|t| (t.from, t.to)));
        }),
        heard_late,
        outstanding: Vec::new(),
    };
    for (step, event) in events.iter().enumerate() {
        pair.step(step, event).await?;
    }
    prop_assert_eq!(store.local_decisions(), 0, "every decision came from Redis");
    Ok(())
}

#[test]
fn the_redis_script_decides_as_the_machine_does() {
    let Some(server) = RedisServer::start("the_redis_script_decides_as_the_machine_does") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let clock = Arc::new(AtomicU64::new(EPOCH_MICROS));
    let store = runtime.block_on(async {
        RedisStore::connect(&server.url())
            .await
            .expect("a valid URL")
            .with_namespace("script-model")
            .with_timeout(PATIENT)
            .with_clock_for_tests(Arc::clone(&clock))
    });
    assert!(
        store.is_shared(),
        "the store reaches the test's redis-server"
    );

    let defaults = ProptestConfig::default();
    let mut runner = TestRunner::new(ProptestConfig {
        // PROPTEST_CASES may ask for more, for a longer hunt.
        cases: defaults.cases.max(CASES),
        source_file: Some(file!()),
        ..defaults
    });
    let case = Cell::new(0u64);
    for (rules, events) in known_cases() {
        case.set(case.get() + 1);
        let key = format!("case-{}", case.get());
        if let Err(failure) = runtime.block_on(run_case(&store, &clock, key, rules, &events)) {
            panic!("{failure}\nrules: {rules:#?}\nevents: {events:#?}");
        }
    }
    let events =
        (0.1f64..0.9).prop_flat_map(|failing| prop::collection::vec(event(failing), 1..120));
    let strategy = (rules(), events);
    let result = runner.run(&strategy, |(rules, events)| {
        case.set(case.get() + 1);
        // A key of its own for every case, shrunk ones included.
        let key = format!("case-{}", case.get());
        runtime.block_on(run_case(&store, &clock, key, rules, &events))
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}
