//! No setting and no number from a server panics: the public builders and errors driven with
//! extreme durations (0, 1 ns, `u64::MAX` seconds, `Duration::MAX` and anything between).
//! Each setting is either refused as a `ConfigError` or works, with every time sum saturating.

mod support;

use std::time::Duration;

use mail_breaker::{
    Backoff, Category, CircuitBreakerTransport, ErrorRate, RetryTransport, SendError, State,
    Transport,
};
use proptest::prelude::*;
use support::message;
use support::scripted::{Reply, Scripted};

fn extreme_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_millis(1)),
        Just(Duration::from_secs(u64::MAX)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX / 2)),
        (0u64..u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..10_000_000).prop_map(Duration::from_millis),
    ]
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

fn server_error_after(wait: Duration) -> Reply {
    Reply::Err(SendError::new(Category::ServerError, "test.busy", "busy").with_retry_after(wait))
}

/// A breaker with these timeouts (and window) opens, refuses, waits and probes without a panic.
fn drive_a_breaker(reset: Duration, probe: Duration, window: Duration, waited: Duration) {
    paused_runtime().block_on(async {
        let inner = Scripted::answering("p", Reply::fail(Category::Network));
        let consecutive = CircuitBreakerTransport::builder(inner.clone())
            .failure_threshold(1)
            .reset_timeout(reset)
            .probe_timeout(probe)
            .build();
        let by_rate = CircuitBreakerTransport::builder(inner.clone())
            .error_rate(ErrorRate {
                threshold_percent: 50,
                minimum_requests: 1,
                window,
                buckets: 10,
            })
            .reset_timeout(reset)
            .build();
        for breaker in [consecutive, by_rate].into_iter().flatten() {
            for _ in 0..3 {
                let _ = breaker.send(&message()).await;
            }
            if let Err(refused) = breaker.send(&message()).await {
                let _ = refused.to_string();
            }
            tokio::time::advance(waited).await;
            let _ = breaker.send(&message()).await;
            let _ = breaker.state();
            tokio::time::advance(waited).await;
            let _ = breaker.state();
        }
    });
}

/// A retry with this backoff, over a provider asking for `retry_after`, answers without a panic.
fn drive_a_retry(initial: Duration, max: Duration, retry_after: Duration, limit: Option<Duration>) {
    paused_runtime().block_on(async {
        let inner = Scripted::answering("p", server_error_after(retry_after));
        for backoff in [
            Backoff::exponential(initial, max),
            Backoff::constant(initial),
        ] {
            let mut builder = RetryTransport::builder(inner.clone())
                .max_attempts(3)
                .backoff(backoff);
            if let Some(limit) = limit {
                builder = builder.max_elapsed(limit);
            }
            let Ok(retry) = builder.build() else {
                continue; // refused as a ConfigError: that is an answer too
            };
            let error = retry.send(&message()).await.unwrap_err();
            assert_eq!(error.code(), "test.busy");
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn no_breaker_setting_panics(
        reset in extreme_duration(),
        probe in extreme_duration(),
        window in extreme_duration(),
        waited in (0u64..1_000_000).prop_map(Duration::from_secs),
    ) {
        drive_a_breaker(reset, probe, window, waited);
    }

    #[test]
    fn no_retry_setting_or_retry_after_from_a_server_panics(
        initial in extreme_duration(),
        max in extreme_duration(),
        retry_after in extreme_duration(),
        limit in prop::option::of(extreme_duration()),
    ) {
        drive_a_retry(initial, max, retry_after, limit);
    }
}

#[test]
fn a_breaker_whose_timeouts_are_duration_max_opens_and_refuses_for_ever() {
    paused_runtime().block_on(async {
        let inner = Scripted::answering("p", Reply::fail(Category::Network));
        let breaker = CircuitBreakerTransport::builder(inner)
            .failure_threshold(1)
            .reset_timeout(Duration::MAX)
            .probe_timeout(Duration::MAX)
            .build()
            .expect("Duration::MAX means for ever");
        let _ = breaker.send(&message()).await;
        tokio::time::advance(Duration::from_secs(10 * 365 * 24 * 3600)).await;
        let refused = breaker.send(&message()).await.unwrap_err();
        assert_eq!(refused.code(), "breaker.open");
        assert!(refused.retry_after().unwrap() > Duration::from_secs(365 * 24 * 3600));
        assert_eq!(breaker.state(), State::Open);
    });
}

#[test]
fn a_retry_without_max_elapsed_waits_out_a_huge_retry_after_instead_of_panicking() {
    paused_runtime().block_on(async {
        let inner = Scripted::new("p");
        inner.then([server_error_after(Duration::MAX)]);
        let retry = RetryTransport::builder(inner.clone())
            .max_attempts(2)
            .build()
            .expect("valid settings");
        retry
            .send(&message())
            .await
            .expect("the second try delivers");
        assert_eq!(inner.sends(), 2);
    });
}

#[cfg(feature = "redis")]
mod redis_store {
    use std::sync::Arc;
    use std::time::Duration;

    use mail_breaker::{BreakerStore, CircuitBreakerTransport, RedisStore, Transport};

    use super::support::message;
    use super::support::scripted::Scripted;
    use super::support::servers::free_port;

    #[tokio::test]
    async fn a_redis_store_with_extreme_settings_decides_locally_without_panicking_when_redis_is_down()
     {
        // Nothing listens on this port: Redis is down from the start.
        let url = format!("redis://127.0.0.1:{}/", free_port());
        for extreme in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            let store = RedisStore::connect(&url)
                .await
                .expect("a valid URL")
                .with_retry_interval(extreme)
                .with_idle_expiry(extreme)
                .with_timeout(Duration::from_millis(50));
            let breaker = CircuitBreakerTransport::builder(Scripted::new("provider"))
                .store(Arc::new(store) as Arc<dyn BreakerStore>)
                .build()
                .expect("valid settings");
            for _ in 0..3 {
                breaker.send(&message()).await.expect("sent on local state");
            }
        }
    }
}
