//! Five OS processes sharing one breaker through Redis with a quorum of 2 (issue 15): one
//! member with its route to the provider broken opens only its own breaker while the other
//! four keep sending; a second broken member opens the fleet's breaker for all five; and
//! exactly one probe goes per half-open period, fleet-wide.
//!
//! As in `redis_fleet.rs`, the test runs its own binary as the fleet's members: the ignored
//! test `quorum_fleet_member` does a member's work when `MAIL_BREAKER_QUORUM_URL` is set.
//!
//! The timeline, from a start time the parent hands to every member:
//! - `0..BOTH_BROKEN`: member 0's route is broken; all five send.
//! - from `BOTH_BROKEN`: member 1's route is broken too. Members 2 to 4 hold their mail:
//!   a success starts the count again (DESIGN §4), so while three members deliver, two
//!   sick ones cannot open the fleet's breaker. The parent watches the fleet's breaker in
//!   Redis and, once it is open, tells the three (a file) to send once: they must be
//!   refused. They hold their mail a while longer, and the fleet must let one probe through
//!   per half-open period (the sick members' probes fail) until a healthy member's probe
//!   closes it.
#![cfg(feature = "redis")]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mail_breaker::{
    BreakerStore, Category, CircuitBreakerTransport, Envelope, Receipt, RedisStore, SendError,
    State, Transport,
};
use support::redis::RedisServer;

const MEMBERS: usize = 5;
const RESET: Duration = Duration::from_secs(1);
const THRESHOLD: u32 = 3;
const BOTH_BROKEN: Duration = Duration::from_secs(2);
/// Long enough after the healthy members resume for several half-open periods: each goes to
/// whichever member asks first, sick or healthy, so a healthy probe may take a few.
const RUN_FOR: Duration = Duration::from_millis(12_000);
/// How long the healthy members hold their mail again after their first refusal, so that
/// the sick members probe the fleet's breaker through a few half-open periods on their own.
const HOLD_AFTER_TOLD: Duration = Duration::from_millis(2_500);
const NAMESPACE: &str = "quorum-fleet";
/// How far the clocks of the processes and Redis's may seem apart in the gaps between probes.
const SLACK: Duration = Duration::from_millis(50);

fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64)
}

/// A member's route to the provider: delivers, or fails once `broken_from` (µs since the
/// epoch) has passed. Prints `sent <µs> ok|fail` for each send that took the route.
#[derive(Debug)]
struct Route {
    broken_from: Option<i64>,
}

#[async_trait::async_trait]
impl Transport for Route {
    fn name(&self) -> &str {
        "provider"
    }

    async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        let now = unix_micros();
        if self.broken_from.is_some_and(|from| now >= from) {
            println!("sent {now} fail");
            Err(SendError::new(
                Category::Network,
                "test.route",
                "no route to the provider",
            ))
        } else {
            println!("sent {now} ok");
            Ok(Receipt::new("provider"))
        }
    }
}

async fn fleet_store(url: &str, member: &str) -> RedisStore {
    let store = RedisStore::connect(url)
        .await
        .expect("a valid URL")
        .with_namespace(NAMESPACE)
        .with_timeout(Duration::from_secs(1))
        .with_quorum(2)
        .with_member(member);
    assert!(
        store.is_shared(),
        "{member} reaches the test's redis-server"
    );
    store
}

fn fleet_breaker<T: Transport>(store: RedisStore, transport: T) -> CircuitBreakerTransport<T> {
    CircuitBreakerTransport::builder(transport)
        .failure_threshold(THRESHOLD)
        .reset_timeout(RESET)
        .store(Arc::new(store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings")
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a member"))
}

/// One member: sends every 2 ms from the start time for RUN_FOR, as the timeline says, and
/// prints what happened (`sent`, and `refused <µs>` for each send its breaker held).
#[test]
#[ignore = "a fleet member, run as a child process by five_processes_with_a_quorum_of_two"]
fn quorum_fleet_member() {
    let Ok(url) = std::env::var("MAIL_BREAKER_QUORUM_URL") else {
        return;
    };
    let index: usize = env("MAIL_BREAKER_QUORUM_INDEX").parse().expect("an index");
    let start: i64 = env("MAIL_BREAKER_QUORUM_START").parse().expect("a time");
    let flag = PathBuf::from(env("MAIL_BREAKER_QUORUM_FLAG"));
    let both_broken = start + BOTH_BROKEN.as_micros() as i64;
    let end = start + RUN_FOR.as_micros() as i64;
    let broken_from = match index {
        0 => Some(start),
        1 => Some(both_broken),
        _ => None,
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let store = fleet_store(&url, &format!("member-{index}")).await;
        let breaker = fleet_breaker(store, Route { broken_from });
        let message = support::message();
        while unix_micros() < start {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut told = false;
        while unix_micros() < end {
            let now = unix_micros();
            if index >= 2 && now >= both_broken && !told {
                // Holding mail until the parent says the fleet's breaker is open.
                if !flag.exists() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                told = true;
                let result = breaker.send(&message).await;
                let held = matches!(&result, Err(error) if error.code() == "breaker.open");
                println!("told {} {held} {}", unix_micros(), breaker.state());
                tokio::time::sleep(HOLD_AFTER_TOLD).await;
                continue;
            }
            if let Err(error) = breaker.send(&message).await
                && error.code() == "breaker.open"
            {
                println!("refused {}", unix_micros());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
}

/// What one member printed.
#[derive(Debug, Default)]
struct Log {
    sent: Vec<(i64, bool)>,
    refused: Vec<i64>,
    told: Option<(i64, bool, String)>,
}

fn read_log(stdout: &str) -> Log {
    let mut log = Log::default();
    for line in stdout.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["sent", at, outcome] => log
                .sent
                .push((at.parse().expect("a time"), *outcome == "ok")),
            ["refused", at] => log.refused.push(at.parse().expect("a time")),
            ["told", at, held, state] => {
                log.told = Some((
                    at.parse().expect("a time"),
                    *held == "true",
                    (*state).to_owned(),
                ));
            }
            _ => {}
        }
    }
    log
}

/// Watches the fleet's breaker in Redis every 20 ms until `end`; creates `flag` once it is
/// open after `both_broken`. Returns when it was first seen open before and after that time.
async fn watch(url: &str, flag: &Path, both_broken: i64, end: i64) -> (Option<i64>, Option<i64>) {
    let observer = fleet_breaker(
        fleet_store(url, "observer").await,
        Route { broken_from: None },
    );
    let (mut early, mut opened) = (None, None);
    while unix_micros() < end {
        let state = observer.snapshot().await.state();
        let now = unix_micros();
        if state == State::Open {
            if now < both_broken {
                early.get_or_insert(now);
            } else if opened.is_none() {
                opened = Some(now);
                std::fs::write(flag, b"open").expect("writing the flag");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (early, opened)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_with_a_quorum_of_two_open_the_fleets_breaker_only_when_two_members_fail() {
    let Some(server) = RedisServer::start("five_processes_with_a_quorum") else {
        return;
    };
    let flag = std::env::temp_dir().join(format!("mail-breaker-quorum-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    // Time for five processes to start and connect on a loaded machine.
    let start = unix_micros() + 2_000_000;
    let both_broken = start + BOTH_BROKEN.as_micros() as i64;
    let end = start + RUN_FOR.as_micros() as i64;

    let members = support::members::start("quorum_fleet_member", MEMBERS, |index| {
        vec![
            ("MAIL_BREAKER_QUORUM_URL", server.url()),
            ("MAIL_BREAKER_QUORUM_INDEX", index.to_string()),
            ("MAIL_BREAKER_QUORUM_START", start.to_string()),
            (
                "MAIL_BREAKER_QUORUM_FLAG",
                flag.to_string_lossy().into_owned(),
            ),
        ]
    });
    let (early, opened) = watch(&server.url(), &flag, both_broken, end).await;
    let outputs = support::members::outputs(members).await;
    let _ = std::fs::remove_file(&flag);
    let logs: Vec<Log> = outputs.iter().map(|stdout| read_log(stdout)).collect();

    // One sick member: its own breaker opens, the fleet's does not.
    assert_eq!(
        early, None,
        "the fleet's breaker opened while one member was sick"
    );
    let first_phase = |at: &i64| *at < both_broken;
    let sick_sends = logs[0]
        .sent
        .iter()
        .filter(|(at, _)| first_phase(at))
        .count();
    let probes_allowed =
        THRESHOLD as usize + (BOTH_BROKEN.as_millis() / RESET.as_millis()) as usize + 1;
    assert!(
        (THRESHOLD as usize..=probes_allowed).contains(&sick_sends),
        "the sick member tried its route {sick_sends} times: its own breaker held the rest"
    );
    assert!(
        logs[0].refused.iter().any(first_phase),
        "the sick member's own breaker refused"
    );
    for (index, log) in logs.iter().enumerate().skip(1) {
        let delivered = log
            .sent
            .iter()
            .filter(|(at, ok)| first_phase(at) && *ok)
            .count();
        let held = log.refused.iter().filter(|at| first_phase(at)).count();
        println!("member {index}: {delivered} delivered, {held} refused while one member was sick");
        assert_eq!(
            held, 0,
            "member {index} was refused while one member was sick"
        );
        assert!(
            delivered >= 50,
            "member {index} kept sending: {delivered} delivered"
        );
    }

    // Two sick members: the fleet's breaker opens for everyone.
    let opened = opened.expect("the fleet's breaker opened once two members were sick");
    println!(
        "the fleet's breaker opened {} ms after the second member fell sick",
        (opened - both_broken) / 1000
    );
    for (index, log) in logs.iter().enumerate().skip(2) {
        let (_, held, state) = log.told.clone().expect("the member was told to send again");
        assert!(
            held,
            "member {index}'s first send after the opening was refused"
        );
        assert_eq!(state, "open", "member {index}'s breaker is open");
    }

    // One probe per half-open period, fleet-wide, until a healthy member's probe closes it.
    let mut sends: Vec<(i64, bool)> = logs
        .iter()
        .flat_map(|log| log.sent.iter().copied())
        .filter(|(at, _)| *at >= opened)
        .collect();
    sends.sort_unstable();
    let closed = sends
        .iter()
        .position(|(_, ok)| *ok)
        .expect("a healthy member's probe closed the fleet's breaker");
    let probes = &sends[..=closed];
    println!("{} probes while the fleet's breaker was open", probes.len());
    assert!(
        probes.len() >= 2,
        "the sick members probed the fleet's breaker while the others held their mail"
    );
    for pair in probes.windows(2) {
        let gap = Duration::from_micros((pair[1].0 - pair[0].0) as u64);
        assert!(gap >= RESET - SLACK, "two probes {gap:?} apart");
    }
    let delivered_after = sends[closed..].iter().filter(|(_, ok)| *ok).count();
    assert!(
        delivered_after > 10,
        "the healthy members deliver again once it closed"
    );
}
