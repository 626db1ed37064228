//! End to end (issue 3, acceptance 2): 500 messages through retry(pool(breaker(smtp),
//! breaker(smtp))) against two real `smtp-sink` servers; the primary is stopped a third of
//! the way through and started again later.
//!
//! A counting TCP proxy in front of the primary records the time of every connection made to
//! it, so the test can check them against the times its breaker was open. The primary sends
//! one message at a time (`with_concurrency(1)`): with more, a send let through just before
//! the breaker opened could still be connecting just after, which is allowed but would blur
//! the check.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mail_breaker::{
    Backoff, CircuitBreakerTransport, PoolTransport, RetryTransport, SmtpTransport, State,
    StateChange, Transport,
};
use support::numbered_messages;
use support::smtp_sink::SmtpSink;
use tokio::net::{TcpListener, TcpStream};

const MESSAGES: usize = 500;
const STOP_PRIMARY_AT: usize = 150;
const RESTART_PRIMARY_AT: usize = 300;

type Log<T> = Arc<Mutex<Vec<T>>>;

fn lock<T>(log: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Forwards every connection on a loopback port to `upstream`, noting when each arrived.
async fn counting_proxy(upstream: SocketAddr) -> (u16, Log<Instant>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a proxy port");
    let port = listener.local_addr().expect("the proxy's address").port();
    let connections: Log<Instant> = Arc::default();
    let log = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            lock(&log).push(Instant::now());
            tokio::spawn(async move {
                // With the server down, the client's connection is closed at once.
                if let Ok(mut server) = TcpStream::connect(upstream).await {
                    // Without it, Nagle and delayed ACKs add ~40 ms to each SMTP round trip.
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (port, connections)
}

/// The spans during which the breaker was open: from entering Open to leaving it.
fn open_spans(changes: &[(Instant, StateChange)], end: Instant) -> Vec<(Instant, Instant)> {
    let mut spans = Vec::new();
    let mut opened = None;
    for (at, change) in changes {
        if change.to == State::Open {
            opened = Some(*at);
        } else if let Some(start) = opened.take() {
            spans.push((start, *at));
        }
    }
    spans.extend(opened.map(|start| (start, end)));
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_messages_fail_over_and_back_with_none_lost_duplicated_or_reordered() {
    let test = "five_hundred_messages_fail_over_and_back_with_none_lost_duplicated_or_reordered";
    let Some(primary_sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let Some(backup_sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let (proxy_port, connections) = counting_proxy(primary_sink.address()).await;
    let primary_sink = Arc::new(Mutex::new(primary_sink));

    let changes: Log<(Instant, StateChange)> = Arc::default();
    let heard = Arc::clone(&changes);
    let primary = CircuitBreakerTransport::builder(
        SmtpTransport::unencrypted("127.0.0.1", proxy_port)
            .with_name("primary")
            .with_timeout(Duration::from_secs(5))
            .with_concurrency(1),
    )
    .failure_threshold(3)
    .reset_timeout(Duration::from_millis(300))
    .on_state_change(move |change| lock(&heard).push((Instant::now(), change.clone())))
    .build()
    .expect("valid breaker settings");
    let backup = CircuitBreakerTransport::new(
        SmtpTransport::unencrypted("127.0.0.1", backup_sink.port())
            .with_name("backup")
            .with_timeout(Duration::from_secs(5)),
    );
    let pool = PoolTransport::builder()
        .add(primary, 1)
        .add(backup, 2)
        .build()
        .expect("a pool with members");
    let transport = RetryTransport::builder(pool)
        .max_attempts(4)
        .backoff(Backoff::exponential(
            Duration::from_millis(50),
            Duration::from_millis(500),
        ))
        .max_elapsed(Duration::from_secs(30))
        .build()
        .expect("valid retry settings");

    // The messages trickle in (4 ms apart); the primary goes down and comes back midway.
    let sink = Arc::clone(&primary_sink);
    let source = futures::stream::iter(numbered_messages(MESSAGES).into_iter().enumerate())
        .then(move |(index, message)| {
            let sink = Arc::clone(&sink);
            async move {
                tokio::time::sleep(Duration::from_millis(4)).await;
                if index == STOP_PRIMARY_AT || index == RESTART_PRIMARY_AT {
                    tokio::task::spawn_blocking(move || {
                        let mut sink = lock(&sink);
                        if index == STOP_PRIMARY_AT {
                            sink.stop();
                        } else {
                            sink.restart();
                        }
                    })
                    .await
                    .expect("stopping or restarting smtp-sink");
                }
                message
            }
        })
        .boxed();
    let started = Instant::now();
    let answers: Vec<_> = transport.send_many(source).collect().await;
    let finished = Instant::now();

    // Every message has exactly one answer, a receipt.
    assert_eq!(answers.len(), MESSAGES);
    let failures: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(failures.is_empty(), "failed: {failures:?}");

    // The servers got each message once: none lost, none twice.
    let primary_got = lock(&primary_sink).received_subjects();
    let backup_got = backup_sink.received_subjects();
    let mut all: Vec<_> = primary_got.iter().chain(&backup_got).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(
        primary_got.len() + backup_got.len(),
        MESSAGES,
        "a duplicate"
    );
    assert_eq!(all.len(), MESSAGES);

    // In order: the i-th receipt names the server that got message i.
    let by_receipt = |server: &str| -> BTreeSet<String> {
        answers
            .iter()
            .enumerate()
            .filter(|(_, a)| a.as_ref().is_ok_and(|r| r.transport() == server))
            .map(|(i, _)| format!("message {i}"))
            .collect()
    };
    assert_eq!(by_receipt("primary"), primary_got.into_iter().collect());
    assert_eq!(by_receipt("backup"), backup_got.into_iter().collect());

    // The primary failed over, and its probe brought it back.
    let changes = lock(&changes).clone();
    let states: Vec<_> = changes.iter().map(|(_, c)| c.to).collect();
    assert!(states.contains(&State::Open), "{states:?}");
    assert_eq!(states.last(), Some(&State::Closed), "{states:?}");
    assert!(
        answers[..STOP_PRIMARY_AT]
            .iter()
            .any(|a| a.as_ref().is_ok_and(|r| r.transport() == "primary"))
    );
    assert!(
        answers[RESTART_PRIMARY_AT..]
            .iter()
            .any(|a| a.as_ref().is_ok_and(|r| r.transport() == "primary"))
    );
    assert!(
        answers
            .iter()
            .any(|a| a.as_ref().is_ok_and(|r| r.transport() == "backup"))
    );

    // No connection reached the primary while its breaker was open.
    let connections = lock(&connections).clone();
    let spans = open_spans(&changes, finished);
    for at in &connections {
        for (opened, left) in &spans {
            assert!(
                !(opened < at && at < left),
                "a connection {:?} into an open span {:?}..{:?}",
                *at - started,
                *opened - started,
                *left - started
            );
        }
    }
    let open_time: Duration = spans.iter().map(|(a, b)| *b - *a).sum();
    println!(
        "{MESSAGES} messages in {:?}: primary {} / backup {}, {} retried; \
         {} connections to the primary; its breaker open {} times for {:?} in all; states {:?}",
        finished - started,
        by_receipt("primary").len(),
        by_receipt("backup").len(),
        answers
            .iter()
            .filter(|a| a.as_ref().is_ok_and(|r| r.attempts() > 1))
            .count(),
        connections.len(),
        spans.len(),
        open_time,
        states
    );
}
