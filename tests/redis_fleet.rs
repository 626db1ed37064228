//! Three OS processes sharing one breaker through Redis (issue 4, acceptance 2): exactly one
//! probe among them in each half-open period.
//!
//! The test runs its own binary three times as the fleet's members: the ignored test
//! `fleet_member` does a member's work when `MAIL_BREAKER_FLEET_URL` is set, so no other
//! build target is needed and the members are always built from the code under test.
#![cfg(feature = "redis")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mail_breaker::{
    BreakerStore, Category, CircuitBreakerTransport, Envelope, Receipt, RedisStore, SendError,
    State, Transport,
};
use support::redis::RedisServer;

const RESET: Duration = Duration::from_millis(300);
const MEMBERS: usize = 3;
const RUN_FOR: Duration = Duration::from_secs(2);
const NAMESPACE: &str = "fleet";

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros())
}

/// A provider that is down: it fails every send, and notes when each one reached it.
#[derive(Debug, Default, Clone)]
struct DownProvider {
    reached_at: Arc<Mutex<Vec<u128>>>,
}

#[async_trait::async_trait]
impl Transport for DownProvider {
    fn name(&self) -> &str {
        "provider"
    }

    async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        self.reached_at.lock().unwrap().push(unix_micros());
        Err(SendError::new(
            Category::ServerError,
            "test.down",
            "the provider is down",
        ))
    }
}

async fn fleet_breaker(
    url: &str,
    heard: Arc<Mutex<Vec<String>>>,
) -> CircuitBreakerTransport<DownProvider> {
    let store = RedisStore::connect(url)
        .await
        .expect("a valid URL")
        .with_namespace(NAMESPACE);
    assert!(
        store.is_shared(),
        "the member reaches the test's redis-server"
    );
    CircuitBreakerTransport::builder(DownProvider::default())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .on_state_change(move |change| {
            heard.lock().unwrap().push(format!(
                "change {} {} {}",
                change.from,
                change.to,
                unix_micros()
            ));
        })
        .store(Arc::new(store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings")
}

/// One member of the fleet: sends as fast as the breaker lets it for RUN_FOR, then prints
/// `probe <unix µs>` for each send that reached the provider and `change <from> <to> <unix µs>`
/// for each change of state its listener heard.
#[test]
#[ignore = "a fleet member, run as a child process by three_processes_sharing_one_redis_breaker_let_one_probe_through_per_half_open_period"]
fn fleet_member() {
    let Ok(url) = std::env::var("MAIL_BREAKER_FLEET_URL") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let breaker = fleet_breaker(&url, Arc::clone(&heard)).await;
        let message = support::message();
        let end = tokio::time::Instant::now() + RUN_FOR;
        while tokio::time::Instant::now() < end {
            let _ = breaker.send(&message).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for at in breaker.inner().reached_at.lock().unwrap().iter() {
            println!("probe {at}");
        }
        for line in heard.lock().unwrap().iter() {
            println!("{line}");
        }
    });
}

#[tokio::test]
async fn three_processes_sharing_one_redis_breaker_let_one_probe_through_per_half_open_period() {
    let Some(server) = RedisServer::start("three_processes_one_probe") else {
        return;
    };
    // Open the shared breaker first, so that every send of a member that reaches the
    // provider is a probe.
    let opener = fleet_breaker(&server.url(), Arc::default()).await;
    let _ = opener.send(&support::message()).await;
    assert_eq!(opener.state(), State::Open);

    let members = support::members::start("fleet_member", MEMBERS, |_| {
        vec![("MAIL_BREAKER_FLEET_URL", server.url())]
    });
    let outputs = support::members::outputs(members).await;

    let mut probes: Vec<(u128, usize)> = Vec::new();
    let mut half_open_periods = 0;
    let mut probes_per_member = [0usize; MEMBERS];
    for (member, stdout) in outputs.iter().enumerate() {
        for line in stdout.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["probe", at] => {
                    probes.push((at.parse().expect("a time"), member));
                    probes_per_member[member] += 1;
                }
                ["change", "open", "half_open", _] => half_open_periods += 1,
                _ => {}
            }
        }
    }
    probes.sort();
    println!(
        "{} probes in {RUN_FOR:?} over {half_open_periods} half-open periods; per member {probes_per_member:?}",
        probes.len()
    );

    assert!(
        half_open_periods >= 3,
        "the breaker went half-open only {half_open_periods} times"
    );
    assert_eq!(
        probes.len(),
        half_open_periods,
        "exactly one probe per half-open period"
    );
    for pair in probes.windows(2) {
        let gap = Duration::from_micros((pair[1].0 - pair[0].0) as u64);
        // Each probe fails at once and reopens the breaker for RESET: the next probe can come
        // no sooner (a few ms of slack for the clocks of the processes against Redis's).
        assert!(
            gap >= RESET - Duration::from_millis(20),
            "two probes {gap:?} apart"
        );
    }
}
