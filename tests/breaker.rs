//! The rules of the circuit breaker (DESIGN §3), one test each, time driven by `tokio::time::pause()`.

mod support;

use std::time::Duration;

use mail_breaker::{Category, CircuitBreakerTransport, State, Transport};
use support::message;
use support::scripted::{Reply, Scripted};

fn breaker(inner: Scripted) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner)
        .failure_threshold(3)
        .reset_timeout(Duration::from_secs(30))
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_open_the_breaker() {
    let inner = Scripted::answering("p", Reply::fail(Category::ServerError));
    let breaker = breaker(inner.clone());
    for _ in 0..3 {
        assert!(breaker.send(&message()).await.is_err());
    }
    assert_eq!(breaker.state(), State::Open);
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.open");
    assert_eq!(inner.sends(), 3);
}
