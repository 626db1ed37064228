//! The breaker's logs (DESIGN §3, tracing). Alone in its own test binary: tracing caches
//! whether a call site is wanted per process, so a test in another thread with no subscriber
//! could hide these events from the scoped subscriber below.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::{Category, CircuitBreakerTransport, Transport};
use support::message;
use support::scripted::{Reply, Scripted};
use tokio::time::advance;

const RESET: Duration = Duration::from_secs(30);

/// A writer that keeps what the tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn changes_and_refusals_are_logged_at_their_levels_with_transport_and_key() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .build()
        .unwrap();
    inner.then([Reply::fail(Category::ServerError)]);
    let _ = breaker.send(&message()).await;
    let _ = breaker.send(&message()).await;
    advance(RESET).await;
    breaker.send(&message()).await.unwrap();
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = |event: &str| {
        log.lines()
            .find(|l| l.contains(event))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("breaker.open").contains("WARN"), "{log}");
    assert!(line("breaker.refused").contains("DEBUG"), "{log}");
    assert!(line("breaker.half_open").contains("INFO"), "{log}");
    assert!(line("breaker.closed").contains("INFO"), "{log}");
    assert!(
        line("breaker.open").contains("transport=\"p\"")
            && line("breaker.open").contains("key=\"p\""),
        "{log}"
    );
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_logs_what_it_would_refuse_once_per_change_of_state_not_once_per_send() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let inner = Scripted::answering("p", Reply::fail(Category::ServerError));
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .shadow(true)
        .build()
        .unwrap();
    for _ in 0..10 {
        let _ = breaker.send(&message()).await;
    }
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let shadow_lines: Vec<_> = log
        .lines()
        .filter(|l| l.contains("breaker.shadow"))
        .collect();
    assert_eq!(shadow_lines.len(), 1, "{log}");
    assert!(shadow_lines[0].contains("INFO"), "{log}");
    assert!(shadow_lines[0].contains("refuse every send"), "{log}");
    assert!(!log.contains("breaker.refused"), "no line per send: {log}");
    assert_eq!(inner.sends(), 10);
}
