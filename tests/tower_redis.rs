//! The tower layer's breaker shared by two OS processes through Redis (issue 66): exactly
//! one call reaches the service in each half-open period, whichever process makes it.
//!
//! The test runs its own binary twice as the fleet's members: the ignored test
//! `tower_fleet_member` does a member's work when `MAIL_BREAKER_TOWER_FLEET_URL` is set.
#![cfg(all(feature = "tower", feature = "redis"))]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mail_breaker::tower::{BreakerError, CircuitBreakerLayer};
use mail_breaker::{BreakerStore, RedisStore, State};
use support::redis::RedisServer;
use tower::{ServiceBuilder, ServiceExt};

const RESET: Duration = Duration::from_millis(300);
const MEMBERS: usize = 2;
const RUN_FOR: Duration = Duration::from_secs(2);

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros())
}

async fn fleet_layer(url: &str, heard: Arc<Mutex<Vec<String>>>) -> CircuitBreakerLayer {
    let store = RedisStore::connect(url)
        .await
        .expect("a valid URL")
        .with_namespace("tower-fleet");
    assert!(
        store.is_shared(),
        "the member reaches the test's redis-server"
    );
    CircuitBreakerLayer::builder("backend")
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

/// A backend that is down: every call fails, and each notes when it reached the backend.
fn down(
    reached: Arc<Mutex<Vec<u128>>>,
) -> impl tower::Service<
    (),
    Response = (),
    Error = std::io::Error,
    Future = impl Future<Output = Result<(), std::io::Error>> + Send + 'static,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |()| {
        reached.lock().unwrap().push(unix_micros());
        async { Err(std::io::Error::other("down")) }
    })
}

/// One member: calls as fast as the breaker lets it for RUN_FOR, then prints `probe <µs>`
/// for each call that reached the backend and each change of state its listener heard.
#[test]
#[ignore = "a fleet member, run as a child process by two_processes_sharing_one_redis_breaker_through_the_layer_let_one_call_through_per_half_open_period"]
fn tower_fleet_member() {
    let Ok(url) = std::env::var("MAIL_BREAKER_TOWER_FLEET_URL") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let reached = Arc::new(Mutex::new(Vec::new()));
        let layer = fleet_layer(&url, Arc::clone(&heard)).await;
        let service = ServiceBuilder::new()
            .layer(layer)
            .service(down(Arc::clone(&reached)));
        let end = tokio::time::Instant::now() + RUN_FOR;
        while tokio::time::Instant::now() < end {
            let _ = service.clone().oneshot(()).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for at in reached.lock().unwrap().iter() {
            println!("probe {at}");
        }
        for line in heard.lock().unwrap().iter() {
            println!("{line}");
        }
    });
}

#[tokio::test]
async fn two_processes_sharing_one_redis_breaker_through_the_layer_let_one_call_through_per_half_open_period()
 {
    let Some(server) = RedisServer::start("tower_two_processes_one_probe") else {
        return;
    };
    let opener = fleet_layer(&server.url(), Arc::default()).await;
    let service = ServiceBuilder::new()
        .layer(opener.clone())
        .service(down(Arc::default()));
    assert!(matches!(
        service.oneshot(()).await,
        Err(BreakerError::Inner(_))
    ));
    assert_eq!(opener.handle().state(), State::Open);

    let members = support::members::start("tower_fleet_member", MEMBERS, |_| {
        vec![("MAIL_BREAKER_TOWER_FLEET_URL", server.url())]
    });
    let outputs = support::members::outputs(members).await;

    let mut probes: Vec<u128> = Vec::new();
    let mut half_open_periods = 0;
    for stdout in &outputs {
        for line in stdout.lines() {
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["probe", at] => probes.push(at.parse().expect("a time")),
                ["change", "open", "half_open", _] => half_open_periods += 1,
                _ => {}
            }
        }
    }
    probes.sort_unstable();
    assert!(
        half_open_periods >= 3,
        "half open {half_open_periods} times"
    );
    assert_eq!(
        probes.len(),
        half_open_periods,
        "one call per half-open period"
    );
    for pair in probes.windows(2) {
        let gap = Duration::from_micros((pair[1] - pair[0]) as u64);
        assert!(
            gap >= RESET - Duration::from_millis(20),
            "two calls {gap:?} apart"
        );
    }
}
