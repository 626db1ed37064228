//! The rules of the breaker (DESIGN §3) as one table of scenarios, run against every store:
//! `MemoryStore` on tokio's clock and, with the `redis` feature, `RedisStore` on a real
//! redis-server's clock and on a real three-master Redis Cluster (one cluster for the whole
//! table, each scenario in a namespace of its own). Both run in real time with short durations (a 400 ms reset timeout)
//! and waits that leave 100 ms of slack on either side of each deadline.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::breaker::{Counting, Decision, Outcome, Permit, Rules};
use mail_breaker::store::Reporter;
use mail_breaker::{BreakerStore, ErrorRate, MemoryStore, State};

use State::{Closed, HalfOpen, Open};

const RESET: Duration = Duration::from_millis(400);
const KEY: &str = "provider.example";
/// The name of the breaker the key belongs to.
const BREAKER: &str = "smtp://provider.example";

/// One step of a scenario; permits are numbered in the order they were given.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A send that goes through while closed.
    Send,
    /// A send that goes through as the probe.
    Probe,
    /// A send that is refused, with a retry_after above zero and at most the reset timeout.
    Refused,
    /// The result of the send made with permit `n`.
    Result(usize, Outcome),
    /// The send made with permit `n` is abandoned.
    Release(usize),
    /// Time passes.
    Wait(u64),
    /// The store's state for the key is now this.
    Is(State),
    /// A send that is refused with a retry_after longer than this many ms (an open time
    /// that grew).
    RefusedOver(u64),
    /// An operator isolates the breaker.
    Isolate,
    /// A send refused because the breaker is isolated.
    Isolated,
    /// An operator resets the breaker.
    Reset,
    /// An operator isolates the whole breaker the key belongs to (DESIGN §19).
    IsolateWhole,
    /// An operator lifts the isolation of the whole breaker.
    LiftWhole,
    /// A send to a key of the same breaker never seen before, refused as isolated.
    IsolatedElsewhere,
}

use Step::*;
const FAIL: Outcome = Outcome::Failure;
const OK: Outcome = Outcome::Success;

struct Scenario {
    rules: Rules,
    steps: &'static [Step],
    /// Every change of state the store reports, in order.
    transitions: &'static [(State, State)],
}

fn consecutive(threshold: u32, half_open_successes: u32) -> Rules {
    Rules {
        counting: Counting::Consecutive { threshold },
        reset_timeout: RESET,
        probe_timeout: RESET,
        half_open_successes,
        max_reset_timeout: None,
    }
}

/// Opens on one failure; each reopening doubles the open time, up to four reset timeouts.
fn escalating() -> Rules {
    Rules {
        max_reset_timeout: Some(RESET * 4),
        ..consecutive(1, 1)
    }
}

fn error_rate(percent: u8, minimum: u32, window_ms: u64, buckets: u32) -> Rules {
    Rules {
        counting: Counting::ErrorRate(ErrorRate {
            threshold_percent: percent,
            minimum_requests: minimum,
            window: Duration::from_millis(window_ms),
            buckets,
        }),
        ..consecutive(1, 1)
    }
}

async fn run(store: &dyn BreakerStore, scenario: Scenario) {
    let rules = &scenario.rules;
    let mut permits: Vec<Permit> = Vec::new();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&heard);
    let late = Reporter::new(move |_key, changes| {
        sink.lock()
            .unwrap()
            .extend(changes.iter().map(|t| (t.from, t.to)));
    });
    let transitions = Changes(&heard);
    for (at, step) in scenario.steps.iter().enumerate() {
        let context = format!("step {at} ({step:?})");
        match *step {
            Send | Probe | Refused | RefusedOver(_) | Isolated => {
                let (decision, changes) = store.acquire_in(BREAKER, KEY, rules, &late).await;
                transitions.extend(changes.iter().map(|t| (t.from, t.to)));
                match (step, decision) {
                    (Send, Decision::Send(permit)) if !permit.is_probe() => permits.push(permit),
                    (Probe, Decision::Send(permit)) if permit.is_probe() => permits.push(permit),
                    (Refused, Decision::Refuse { retry_after }) => assert!(
                        !retry_after.is_zero() && retry_after <= RESET,
                        "{context}: retry_after {retry_after:?} is not within the reset timeout"
                    ),
                    (RefusedOver(ms), Decision::Refuse { retry_after }) => assert!(
                        retry_after > Duration::from_millis(*ms),
                        "{context}: retry_after {retry_after:?} is not over {ms} ms"
                    ),
                    (Isolated, Decision::Isolated) => {}
                    (_, decision) => panic!("{context}: the store decided {decision:?}"),
                }
            }
            Result(n, outcome) => {
                let changes = store.record(KEY, rules, permits[n], outcome, &late).await;
                transitions.extend(changes.iter().map(|t| (t.from, t.to)));
            }
            Release(n) => {
                store.release(KEY, rules, permits[n], &late);
                // A remote store releases in the background.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Isolate => {
                let changes = store.isolate(KEY, rules, &late).await;
                transitions.extend(changes.iter().map(|t| (t.from, t.to)));
            }
            Reset => {
                let changes = store.reset(KEY, rules, &late).await;
                transitions.extend(changes.iter().map(|t| (t.from, t.to)));
            }
            IsolateWhole => {
                let reached = store.isolate_breaker(BREAKER).await;
                assert!(reached.is_ok(), "{context}: {reached:?}");
            }
            LiftWhole => {
                let reached = store.lift_isolation(BREAKER).await;
                assert!(reached.is_ok(), "{context}: {reached:?}");
            }
            IsolatedElsewhere => {
                let (decision, changes) = store
                    .acquire_in(BREAKER, "first-seen-now.example", rules, &late)
                    .await;
                transitions.extend(changes.iter().map(|t| (t.from, t.to)));
                assert_eq!(decision, Decision::Isolated, "{context}");
            }
            Is(expected) => {
                let (state, changes) = store.state(KEY, rules);
                transitions.extend(changes.iter().map(|t| (t.from, t.to)));
                assert_eq!(state, expected, "{context}");
            }
        }
    }
    assert_eq!(
        *heard.lock().unwrap(),
        scenario.transitions,
        "the changes of state"
    );
}

/// The changes of state heard so far, returned or reported late, in the order heard.
struct Changes<'a>(&'a Mutex<Vec<(State, State)>>);

impl Changes<'_> {
    fn extend(&self, changes: impl Iterator<Item = (State, State)>) {
        self.0.lock().unwrap().extend(changes);
    }
}

async fn run_on_memory(scenario: Scenario) {
    run(&MemoryStore::new(), scenario).await;
}

#[cfg(feature = "redis")]
async fn run_on_redis(test: &str, scenario: Scenario) {
    let Some(server) = support::redis::RedisServer::start(test) else {
        return;
    };
    let store = mail_breaker::RedisStore::connect(&server.url())
        .await
        .expect("a valid URL")
        .with_namespace(test)
        // Patient, so that no decision falls back to local state on a busy machine.
        .with_timeout(Duration::from_secs(2));
    assert!(
        store.is_shared(),
        "the store reaches the test's redis-server"
    );
    run(&store, scenario).await;
    assert_eq!(store.local_decisions(), 0, "every decision came from Redis");
}

#[cfg(feature = "redis")]
async fn run_on_redis_cluster(
    cluster: &support::redis_cluster::RedisCluster,
    name: &str,
    scenario: Scenario,
) {
    let store = mail_breaker::RedisStore::connect_cluster(&cluster.urls())
        .await
        .expect("valid URLs")
        .with_namespace(name)
        .with_timeout(Duration::from_secs(2));
    assert!(
        store.is_shared(),
        "{name}: the store reaches the test's cluster"
    );
    run(&store, scenario).await;
    assert!(
        store.is_shared(),
        "{name}: every decision came from the cluster"
    );
}

/// Each scenario becomes a module with one test per store, and a row of `ALL` for the
/// cluster, whose one test runs them in turn on one cluster.
macro_rules! scenarios {
    ($($name:ident: $scenario:expr;)*) => {
        #[cfg(feature = "redis")]
        const ALL: &[(&str, fn() -> Scenario)] = &[$((stringify!($name), $name::scenario)),*];
        $(
        mod $name {
            use super::*;

            #[cfg_attr(not(feature = "redis"), allow(dead_code))]
            pub(super) fn scenario() -> Scenario {
                $scenario
            }

            // Time is Tokio's here, paused, so the table's waits are exact.
            #[tokio::test(start_paused = true)]
            async fn on_the_memory_store() {
                run_on_memory($scenario).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test]
            async fn on_the_redis_store() {
                run_on_redis(stringify!($name), $scenario).await;
            }
        }
    )*};
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn every_scenario_on_the_redis_cluster_store() {
    let Some(cluster) = support::redis_cluster::RedisCluster::start("scenarios_on_a_cluster")
    else {
        return;
    };
    for (name, scenario) in ALL {
        run_on_redis_cluster(&cluster, name, scenario()).await;
    }
}

scenarios! {
    consecutive_failures_open_the_breaker: Scenario {
        rules: consecutive(3, 1),
        steps: &[Send, Result(0, FAIL), Send, Result(1, FAIL), Is(Closed),
                 Send, Result(2, FAIL), Is(Open), Refused],
        transitions: &[(Closed, Open)],
    };
    a_success_starts_the_count_of_failures_again: Scenario {
        rules: consecutive(3, 1),
        steps: &[Send, Result(0, FAIL), Send, Result(1, FAIL), Send, Result(2, OK),
                 Send, Result(3, FAIL), Send, Result(4, FAIL), Is(Closed), Send],
        transitions: &[],
    };
    an_open_breaker_refuses_until_the_reset_timeout_has_passed: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Refused, Wait(200), Refused, Is(Open)],
        transitions: &[(Closed, Open)],
    };
    after_the_reset_timeout_one_send_goes_through_as_the_probe: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Refused, Refused, Is(HalfOpen)],
        transitions: &[(Closed, Open), (Open, HalfOpen)],
    };
    a_successful_probe_closes_the_breaker: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Result(1, OK), Is(Closed), Send],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)],
    };
    a_failed_probe_opens_the_breaker_for_another_reset_timeout: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Result(1, FAIL), Is(Open),
                 Refused, Wait(500), Probe],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Open), (Open, HalfOpen)],
    };
    half_open_successes_probes_in_a_row_close_the_breaker: Scenario {
        rules: consecutive(1, 2),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Result(1, OK), Is(HalfOpen),
                 Probe, Refused, Result(2, OK), Is(Closed)],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)],
    };
    a_probe_that_times_out_reopens_the_breaker_and_its_late_result_is_ignored: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Wait(500), Refused,
                 Result(1, OK), Is(Open), Wait(500), Probe],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Open), (Open, HalfOpen)],
    };
    an_abandoned_probe_frees_the_slot_for_the_next_send: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Release(1), Probe, Refused],
        transitions: &[(Closed, Open), (Open, HalfOpen)],
    };
    a_late_result_from_an_earlier_period_changes_nothing: Scenario {
        rules: consecutive(2, 1),
        steps: &[Send, Send, Result(1, FAIL), Send, Result(2, FAIL), Is(Open),
                 // permit 0 was given before the breaker opened: its success does not close it
                 Result(0, OK), Is(Open), Wait(500), Probe, Result(3, OK), Is(Closed),
                 // nor does its failure count in the new closed period
                 Send, Result(0, FAIL), Result(4, FAIL), Is(Closed)],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)],
    };
    // A send the breaker let go and that was never attempted (a limiter below refused it) is
    // given back like an abandoned one: between failures it breaks no run of them.
    a_send_given_back_between_failures_breaks_no_run_of_them: Scenario {
        rules: consecutive(3, 1),
        steps: &[Send, Result(0, FAIL), Send, Result(1, FAIL), Send, Release(2), Is(Closed),
                 Send, Result(3, FAIL), Is(Open)],
        transitions: &[(Closed, Open)],
    };
    a_probe_given_back_leaves_the_breaker_half_open_for_the_next_send: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Release(1), Is(HalfOpen),
                 Probe, Result(2, OK), Is(Closed)],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)],
    };
    an_abandoned_send_that_is_not_a_probe_changes_nothing: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Release(0), Is(Closed), Send, Result(1, FAIL), Is(Open)],
        transitions: &[(Closed, Open)],
    };
    the_error_rate_opens_the_breaker_at_its_threshold_once_enough_results_are_in: Scenario {
        rules: error_rate(50, 4, 2_000, 4),
        steps: &[Send, Result(0, FAIL), Send, Result(1, FAIL), Send, Result(2, FAIL),
                 Is(Closed), Send, Result(3, OK), Is(Open)],
        transitions: &[(Closed, Open)],
    };
    the_error_rate_stays_closed_below_its_threshold: Scenario {
        rules: error_rate(50, 4, 2_000, 4),
        steps: &[Send, Result(0, OK), Send, Result(1, OK), Send, Result(2, OK),
                 Send, Result(3, FAIL), Send, Result(4, FAIL), Is(Closed)],
        transitions: &[],
    };
    the_error_rate_forgets_results_that_left_its_window: Scenario {
        rules: error_rate(50, 2, 400, 4),
        steps: &[Send, Result(0, FAIL), Wait(600), Send, Result(1, FAIL), Is(Closed),
                 Send, Result(2, FAIL), Is(Open)],
        transitions: &[(Closed, Open)],
    };
    an_isolated_breaker_refuses_as_isolated_and_lets_no_probe_go: Scenario {
        rules: consecutive(1, 1),
        steps: &[Isolate, Is(Open), Isolated, Wait(500), Isolated, Is(Open), Isolate],
        transitions: &[(Closed, Open)],
    };
    isolating_an_open_breaker_holds_it_past_its_reset_timeout: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Isolate, Wait(500), Isolated],
        transitions: &[(Closed, Open)],
    };
    isolating_a_half_open_breaker_makes_its_probe_count_for_nothing: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Isolate, Result(1, OK), Isolated],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Open)],
    };
    isolating_the_whole_breaker_refuses_every_key_also_one_first_seen_until_it_is_lifted: Scenario {
        rules: consecutive(1, 1),
        steps: &[Send, Result(0, OK), IsolateWhole, Isolated, IsolatedElsewhere, Wait(500),
                 Isolated, Is(Closed), LiftWhole, Send, Result(1, FAIL), Is(Open)],
        transitions: &[(Closed, Open)],
    };
    reset_closes_an_isolated_breaker: Scenario {
        rules: consecutive(1, 1),
        steps: &[Isolate, Reset, Is(Closed), Send, Result(0, FAIL), Is(Open)],
        transitions: &[(Closed, Open), (Open, Closed), (Closed, Open)],
    };
    reset_closes_an_open_breaker_and_forgets_the_results_sent_before_it: Scenario {
        rules: consecutive(2, 1),
        steps: &[Send, Send, Result(0, FAIL), Reset, Result(1, FAIL), Is(Closed),
                 Send, Result(2, FAIL), Is(Closed), Send, Result(3, FAIL), Is(Open),
                 Reset, Is(Closed), Send],
        transitions: &[(Closed, Open), (Open, Closed)],
    };
    each_reopening_without_a_close_doubles_the_open_time: Scenario {
        rules: escalating(),
        steps: &[Send, Result(0, FAIL), Refused, Wait(500), Probe, Result(1, FAIL),
                 RefusedOver(600), Wait(900), Probe, Result(2, FAIL), RefusedOver(1_400)],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Open),
                       (Open, HalfOpen), (HalfOpen, Open)],
    };
    a_close_or_a_reset_starts_the_open_time_again_from_the_reset_timeout: Scenario {
        rules: escalating(),
        steps: &[Send, Result(0, FAIL), Wait(500), Probe, Result(1, FAIL), RefusedOver(600),
                 Reset, Send, Result(2, FAIL), Refused],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Open), (Open, Closed),
                       (Closed, Open)],
    };
    the_error_rate_forgets_failures_after_the_breaker_closes: Scenario {
        rules: error_rate(50, 2, 5_000, 5),
        steps: &[Send, Result(0, FAIL), Send, Result(1, FAIL), Is(Open), Wait(500), Probe,
                 Result(2, OK), Send, Result(3, FAIL), Is(Closed)],
        transitions: &[(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)],
    };
}
