//! What a breaker costs on one send, against the bare transport and against wrapping the same
//! send in failsafe's `StateMachine` or recloser's `AsyncRecloser`.
//!
//! The transport answers at once, so every figure above the bare one is the guard's own cost.
//! Groups: `closed` (one task), `open` (a refusal), `closed_2_tasks` (two tasks on a 2-worker
//! runtime sending through one shared guard; the figure is the time per send of each task).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use failsafe::StateMachine;
use failsafe::backoff::{self, Constant};
use failsafe::failure_policy::{self, ConsecutiveFailures};
use mail_breaker::{
    Category, CircuitBreakerTransport, Envelope, Message, Receipt, SendError, Transport,
};
use recloser::{AsyncRecloser, Recloser};
use tokio::runtime::{Builder, Runtime};

/// A transport that answers every send at once, as success or as a Network failure.
struct Immediate {
    fail: bool,
}

#[async_trait::async_trait]
impl Transport for Immediate {
    fn name(&self) -> &str {
        "immediate"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        self.answer()
    }

    async fn send(&self, _message: &Message) -> Result<Receipt, SendError> {
        self.answer()
    }
}

impl Immediate {
    fn answer(&self) -> Result<Receipt, SendError> {
        if self.fail {
            Err(SendError::new(Category::Network, "test.down", "down"))
        } else {
            Ok(Receipt::new("immediate"))
        }
    }
}

fn message() -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to("user@example.org".parse().expect("a valid recipient"))
        .subject("bench")
        .body(String::from("hello"))
        .expect("a valid message")
}

/// failsafe's state machine: 5 failures in a row open it for 30 s, like the breaker's default.
type Failsafe = StateMachine<ConsecutiveFailures<Constant>, ()>;

fn failsafe() -> Failsafe {
    let backoff = backoff::constant(Duration::from_secs(30));
    StateMachine::new(failure_policy::consecutive_failures(5, backoff), ())
}

fn recloser() -> AsyncRecloser {
    AsyncRecloser::from(
        Recloser::custom()
            .error_rate(0.5)
            .closed_len(5)
            .open_wait(Duration::from_secs(30))
            .build(),
    )
}

/// Sends `message` through failsafe's state machine the way its futures API does: ask, send,
/// record (here only Network-like errors fail, as in the breaker's default).
async fn through_failsafe(
    machine: &Failsafe,
    transport: &Immediate,
    message: &Message,
) -> Result<Receipt, SendError> {
    if !machine.is_call_permitted() {
        return Err(SendError::new(
            Category::ServiceUnavailable,
            "failsafe.rejected",
            "rejected",
        ));
    }
    let result = transport.send(message).await;
    match &result {
        Err(error) if error.category().is_breaker_failure() => machine.on_error(),
        _ => machine.on_success(),
    }
    result
}

async fn through_recloser(
    recloser: &AsyncRecloser,
    transport: &Immediate,
    message: &Message,
) -> Result<Receipt, SendError> {
    recloser
        .call_with(
            |error: &SendError| error.category().is_breaker_failure(),
            transport.send(message),
        )
        .await
        .map_err(|error| match error {
            recloser::Error::Inner(error) => error,
            recloser::Error::Rejected => SendError::new(
                Category::ServiceUnavailable,
                "recloser.rejected",
                "rejected",
            ),
        })
}

fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

fn closed(c: &mut Criterion) {
    let rt = current_thread();
    let message = message();
    let bare = Immediate { fail: false };
    let breaker = CircuitBreakerTransport::new(Immediate { fail: false });
    let failsafe = failsafe();
    let recloser = recloser();

    let mut group = c.benchmark_group("closed");
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(bare.send(&message).await) })
    });
    group.bench_function("breaker", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(breaker.send(&message).await) })
    });
    group.bench_function("failsafe", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(through_failsafe(&failsafe, &bare, &message).await) })
    });
    group.bench_function("recloser", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(through_recloser(&recloser, &bare, &message).await) })
    });
    group.finish();
}

fn open(c: &mut Criterion) {
    let rt = current_thread();
    let message = message();
    let failing = Immediate { fail: true };
    let breaker = CircuitBreakerTransport::new(Immediate { fail: true });
    let failsafe = failsafe();
    let recloser = recloser();
    rt.block_on(async {
        for _ in 0..10 {
            let _ = breaker.send(&message).await;
            let _ = through_failsafe(&failsafe, &failing, &message).await;
            let _ = through_recloser(&recloser, &failing, &message).await;
        }
    });
    assert_eq!(breaker.state(), mail_breaker::State::Open);
    assert!(!failsafe.is_call_permitted());

    let mut group = c.benchmark_group("open");
    group.bench_function("breaker", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(breaker.send(&message).await) })
    });
    group.bench_function("failsafe", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(through_failsafe(&failsafe, &failing, &message).await) })
    });
    group.bench_function("recloser", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(through_recloser(&recloser, &failing, &message).await) })
    });
    group.finish();
}

/// Runs `send` `iters` times in each of two tasks at once; returns the wall time.
fn two_tasks<F, Fut>(rt: &Runtime, iters: u64, send: F) -> Duration
where
    F: Fn() -> Fut + Copy + Send + 'static,
    Fut: Future<Output = Result<Receipt, SendError>> + Send,
{
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                tokio::spawn(async move {
                    for _ in 0..iters {
                        let _ = black_box(send().await);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a bench task");
        }
        start.elapsed()
    })
}

/// Leaked so that both tasks borrow it without touching a shared reference count per send.
fn shared<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

fn closed_2_tasks(c: &mut Criterion) {
    let rt = Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let message = shared(message());
    let bare = shared(Immediate { fail: false });
    let breaker = shared(CircuitBreakerTransport::new(Immediate { fail: false }));
    let failsafe = shared(failsafe());
    let recloser = shared(recloser());

    let mut group = c.benchmark_group("closed_2_tasks");
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| two_tasks(&rt, iters, move || bare.send(message)))
    });
    group.bench_function("breaker", |b| {
        b.iter_custom(|iters| two_tasks(&rt, iters, move || breaker.send(message)))
    });
    group.bench_function("failsafe", |b| {
        b.iter_custom(|iters| {
            two_tasks(&rt, iters, move || {
                through_failsafe(failsafe, bare, message)
            })
        })
    });
    group.bench_function("recloser", |b| {
        b.iter_custom(|iters| {
            two_tasks(&rt, iters, move || {
                through_recloser(recloser, bare, message)
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = closed, open, closed_2_tasks
}
criterion_main!(benches);
