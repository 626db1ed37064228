//! What a breaker costs, against the bare transport and against failsafe's `StateMachine` and
//! recloser's `AsyncRecloser`, each both wrapped around the send's future inline and wrapped
//! as a [`Transport`] the way a user composing it into a pool would write it.
//!
//! The transport answers at once, so every figure above the bare one is the guard's own cost.
//! Groups:
//! - `closed`: one send on one task; `open`: a refusal. Built with the `metrics` feature,
//!   these two groups also hold `breaker_prometheus`: a breaker whose handles were taken
//!   from the Prometheus exporter's recorder (built as the `prometheus` example builds it,
//!   its upkeep run every 5 s as the exporter's own task would, never rendered), so that it
//!   records every send there; `breaker` is then the feature without a recorder.
//! - `scaling_<n>`: n tasks on an n-worker runtime sending through one shared guard, for n =
//!   1, 2, 4, … up to the machine's cores; the figure is the time per send of each task.
//! - `domains`: one send under `Scope::RecipientDomain` with 100,000 domains cycling through
//!   `max_keys` 10,000 (every send a new key), against the per-transport breaker: sends that
//!   succeed (a domain is not kept until it fails), and sends that fail (each new domain is
//!   kept, in the place of the least recently used one), each against its own bare send.
//! - `send_many`: a batch of 10,000 through `retry(pool(breaker, breaker))` against the bare
//!   transport's `send_many`; the figure is the whole batch.
//! - `rate`: one send through a local `RateLimitTransport` whose rate is never reached (so
//!   no send waits: the figure is the limiter's own cost) against the bare transport.

#[path = "support/guards.rs"]
mod guards;

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use guards::{
    FAILING, Failsafe, FailsafeTransport, Immediate, OK, RecloserTransport, domain_envelopes,
    failsafe, message, message_to, per_domain, recloser, through_failsafe, through_recloser,
};
use mail_breaker::{
    CircuitBreakerTransport, Envelope, Message, PoolTransport, Receipt, RetryTransport, SendError,
    Transport,
};
use recloser::AsyncRecloser;
use tokio::runtime::{Builder, Runtime};

/// The guards under test, each over its own copy of `inner`.
struct Guards {
    breaker: CircuitBreakerTransport<Immediate>,
    failsafe: Failsafe,
    recloser: AsyncRecloser,
    failsafe_transport: FailsafeTransport<Immediate>,
    recloser_transport: RecloserTransport<Immediate>,
}

impl Guards {
    fn over(inner: fn() -> Immediate) -> Self {
        Guards {
            breaker: CircuitBreakerTransport::new(inner()),
            failsafe: failsafe(),
            recloser: recloser(),
            failsafe_transport: FailsafeTransport {
                inner: inner(),
                machine: failsafe(),
            },
            recloser_transport: RecloserTransport {
                inner: inner(),
                recloser: recloser(),
            },
        }
    }
}

fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// The Prometheus exporter's recorder, as the `prometheus` example builds it (the send time
/// in buckets), with its upkeep run every 5 s on a thread of its own, as `install` would run
/// it: the histograms' values are drained there, not kept for ever.
#[cfg(feature = "metrics")]
fn prometheus() -> &'static metrics_exporter_prometheus::PrometheusRecorder {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    static RECORDER: std::sync::OnceLock<&'static metrics_exporter_prometheus::PrometheusRecorder> =
        std::sync::OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(mail_breaker::metrics::SEND_SECONDS.to_owned()),
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
            )
            .expect("valid buckets")
            .build_recorder();
        let handle = recorder.handle();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(5));
                handle.run_upkeep();
            }
        });
        Box::leak(Box::new(recorder))
    })
}

/// The one-task groups: `closed` over a transport that delivers, `open` over one that fails.
fn one_task(c: &mut Criterion, group: &str, inner: fn() -> Immediate) {
    let rt = current_thread();
    let message = message();
    let bare = inner();
    let guards = Guards::over(inner);
    // Its first sends under the recorder, set for this thread only: the breaker takes its
    // handles there and keeps them, as one built before `install` and first used after it.
    #[cfg(feature = "metrics")]
    let recorded = CircuitBreakerTransport::new(inner());
    #[cfg(feature = "metrics")]
    metrics::with_local_recorder(prometheus(), || {
        rt.block_on(async {
            for _ in 0..10 {
                let _ = recorded.send(&message).await;
            }
        })
    });
    if inner().fail {
        #[cfg(feature = "metrics")]
        assert_eq!(recorded.state(), mail_breaker::State::Open);
        rt.block_on(async {
            for _ in 0..10 {
                let _ = guards.breaker.send(&message).await;
                let _ = through_failsafe(&guards.failsafe, || bare.send(&message)).await;
                let _ = through_recloser(&guards.recloser, bare.send(&message)).await;
                let _ = guards.failsafe_transport.send(&message).await;
                let _ = guards.recloser_transport.send(&message).await;
            }
        });
        assert_eq!(guards.breaker.state(), mail_breaker::State::Open);
        assert!(!guards.failsafe.is_call_permitted());
        assert!(!guards.failsafe_transport.machine.is_call_permitted());
    }

    let mut group = c.benchmark_group(group);
    if !inner().fail {
        group.bench_function("bare", |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(bare.send(&message).await) })
        });
    }
    group.bench_function("breaker", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(guards.breaker.send(&message).await) })
    });
    #[cfg(feature = "metrics")]
    group.bench_function("breaker_prometheus", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(recorded.send(&message).await) })
    });
    group.bench_function("failsafe_inline", |b| {
        b.to_async(&rt).iter(|| async {
            black_box(through_failsafe(&guards.failsafe, || bare.send(&message)).await)
        })
    });
    group.bench_function("recloser_inline", |b| {
        b.to_async(&rt).iter(|| async {
            black_box(through_recloser(&guards.recloser, bare.send(&message)).await)
        })
    });
    group.bench_function("failsafe_transport", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(guards.failsafe_transport.send(&message).await) })
    });
    group.bench_function("recloser_transport", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(guards.recloser_transport.send(&message).await) })
    });
    group.finish();
}

fn closed(c: &mut Criterion) {
    one_task(c, "closed", || OK);
}

fn open(c: &mut Criterion) {
    one_task(c, "open", || FAILING);
}

/// Runs `send` `iters` times in each of `tasks` tasks at once; returns the wall time, which
/// is the time per send of each task times `iters`.
fn in_tasks<F, Fut>(rt: &Runtime, tasks: usize, iters: u64, send: F) -> Duration
where
    F: Fn() -> Fut + Copy + Send + 'static,
    Fut: Future<Output = Result<Receipt, SendError>> + Send,
{
    rt.block_on(async {
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                tokio::spawn(async move {
                    for _ in 0..iters {
                        let _ = black_box(send().await);
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("a bench task");
        }
        start.elapsed()
    })
}

/// Leaked so that the tasks borrow it without touching a shared reference count per send.
fn shared<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

/// 1, 2, 4, … up to the machine's cores, and the number of cores itself.
fn task_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut counts: Vec<usize> = (0..)
        .map(|power| 1 << power)
        .take_while(|&n| n <= cores)
        .collect();
    if counts.last() != Some(&cores) {
        counts.push(cores);
    }
    counts
}

fn scaling(c: &mut Criterion) {
    let message = shared(message());
    let bare = shared(OK);
    let guards = shared(Guards::over(|| OK));
    for tasks in task_counts() {
        let rt = Builder::new_multi_thread()
            .worker_threads(tasks)
            .enable_all()
            .build()
            .expect("a Tokio runtime");
        let mut group = c.benchmark_group(format!("scaling_{tasks}"));
        group.bench_function("bare", |b| {
            b.iter_custom(|iters| in_tasks(&rt, tasks, iters, move || bare.send(message)))
        });
        group.bench_function("breaker", |b| {
            b.iter_custom(|iters| in_tasks(&rt, tasks, iters, move || guards.breaker.send(message)))
        });
        group.bench_function("failsafe_transport", |b| {
            b.iter_custom(|iters| {
                in_tasks(&rt, tasks, iters, move || {
                    guards.failsafe_transport.send(message)
                })
            })
        });
        group.bench_function("recloser_transport", |b| {
            b.iter_custom(|iters| {
                in_tasks(&rt, tasks, iters, move || {
                    guards.recloser_transport.send(message)
                })
            })
        });
        group.finish();
    }
}

/// How many recipient domains the churn cycles through, and how many the breaker keeps.
const DOMAINS: usize = 100_000;
const MAX_KEYS: usize = 10_000;

fn domains(c: &mut Criterion) {
    let rt = current_thread();
    // Envelopes and `send_raw`: 100,000 whole messages would measure the memory more than
    // the breaker. Every candidate reads the same envelopes in the same order.
    let envelopes = domain_envelopes(DOMAINS);
    let raw = b"Subject: bench\r\n\r\nhello\r\n";
    let bare = OK;
    let per_transport = CircuitBreakerTransport::new(OK);
    let churn = per_domain(OK, MAX_KEYS);
    // Sends that fail, to a breaker that never opens: each keeps its domain. The first
    // domain a store sees is kept apart and never forgotten; here it is one outside the
    // churn, so that every domain of the churn goes through the bounded map.
    let bare_failing = FAILING;
    let per_transport_failing = CircuitBreakerTransport::builder(FAILING)
        .failure_threshold(u32::MAX)
        .build()
        .expect("a valid breaker");
    let churn_failing = per_domain(FAILING, MAX_KEYS);
    let outside = Envelope::new(
        None,
        vec!["user@outside.example".parse().expect("a valid recipient")],
    )
    .expect("a valid envelope");
    let _ = rt.block_on(churn_failing.send_raw(&outside, raw));
    let next = AtomicUsize::new(0);
    // A caller has just built the envelope it sends, so its recipient is in the cache; here
    // 100,000 of them were built long before. Every candidate reads the recipient's domain
    // first, so that the cache misses of the bench's own data count for all alike.
    let envelope = || {
        let envelope = &envelopes[next.fetch_add(1, Ordering::Relaxed) % DOMAINS];
        black_box(envelope.to().first().map(|to| to.domain().len()));
        envelope
    };

    let mut group = c.benchmark_group("domains");
    // Written out for each, not through `dyn Transport`: as in the other groups, each
    // candidate is called directly.
    macro_rules! candidate {
        ($name:literal, $transport:expr) => {
            group.bench_function($name, |b| {
                b.to_async(&rt)
                    .iter(|| async { black_box($transport.send_raw(envelope(), raw).await) })
            });
        };
    }
    candidate!("bare", bare);
    candidate!("per_transport", per_transport);
    candidate!("per_domain_churn", churn);
    candidate!("bare_failing", bare_failing);
    candidate!("per_transport_failing", per_transport_failing);
    candidate!("per_domain_churn_failing", churn_failing);
    group.finish();
    // Domains that only succeed are not kept: only the first, kept apart.
    let tracked = churn.tracked_keys();
    assert!(tracked <= 1, "the churn tracked {tracked} keys");
    // The failing churn (millions of sends over 100,000 domains) filled the map to its
    // bound, if it ran at all: a filter such as `-- closed` skips it.
    let tracked = churn_failing.tracked_keys();
    assert!(
        tracked == 1 || tracked == MAX_KEYS,
        "the failing churn tracked {tracked} keys"
    );
}

/// How many messages one `send_many` batch holds.
const BATCH: usize = 10_000;

fn send_many(c: &mut Criterion) {
    let rt = current_thread();
    let messages: Vec<Message> = (0..BATCH)
        .map(|i| message_to(&format!("user{i}@example.org")))
        .collect();
    let bare = OK;
    let member = |name| CircuitBreakerTransport::new(Immediate { name, fail: false });
    let stack = RetryTransport::new(
        PoolTransport::builder()
            .add(member("primary"), 1)
            .add(member("backup"), 2)
            .build()
            .expect("a valid pool"),
    );
    let batch = || futures::stream::iter(messages.clone()).boxed();
    let count = |receipts: Vec<Result<Receipt, SendError>>| {
        assert_eq!(receipts.len(), BATCH);
        black_box(receipts)
    };

    let mut group = c.benchmark_group("send_many");
    group.sample_size(10);
    group.bench_function("bare", |b| {
        b.to_async(&rt).iter_batched(
            batch,
            |input| async { count(bare.send_many(input).collect().await) },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("stack", |b| {
        b.to_async(&rt).iter_batched(
            batch,
            |input| async { count(stack.send_many(input).collect().await) },
            BatchSize::PerIteration,
        )
    });
    group.finish();

    // `send` through the same stack, one message at a time, for comparison.
    let message = message();
    let mut group = c.benchmark_group("stack_send");
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(bare.send(&message).await) })
    });
    group.bench_function("stack", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(stack.send(&message).await) })
    });
    group.finish();
}

/// A local rate limiter's cost per send, at a rate no send waits for.
fn rate(c: &mut Criterion) {
    let rt = current_thread();
    let message = message();
    let bare = OK;
    let limited = mail_breaker::RateLimitTransport::builder(OK)
        .per_second(1e12)
        .build()
        .expect("valid settings");
    let mut group = c.benchmark_group("rate");
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(bare.send(&message).await) })
    });
    group.bench_function("local_limiter", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(limited.send(&message).await) })
    });
    group.finish();
}

/// The pieces a recorded send is made of, each alone: the clock reads of the send's
/// duration, and the handles' operations, without a recorder and with Prometheus's.
#[cfg(feature = "metrics")]
fn pieces(c: &mut Criterion) {
    let mut group = c.benchmark_group("pieces");
    group.bench_function("std_now", |b| b.iter(|| black_box(Instant::now())));
    group.bench_function("std_now_elapsed", |b| {
        b.iter(|| black_box(black_box(Instant::now()).elapsed()))
    });
    group.bench_function("tokio_now", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()))
    });
    group.bench_function("tokio_now_elapsed", |b| {
        b.iter(|| black_box(black_box(tokio::time::Instant::now()).elapsed()))
    });
    #[cfg(target_arch = "x86_64")]
    group.bench_function("rdtsc", |b| {
        // SAFETY: reading the time-stamp counter has no precondition on x86_64.
        b.iter(|| black_box(unsafe { std::arch::x86_64::_rdtsc() }))
    });
    let noop_counter = metrics::Counter::noop();
    let noop_histogram = metrics::Histogram::noop();
    group.bench_function("noop_counter", |b| {
        b.iter(|| black_box(&noop_counter).increment(1))
    });
    group.bench_function("noop_histogram", |b| {
        b.iter(|| black_box(&noop_histogram).record(black_box(0.25)))
    });
    let (counter, histogram) = metrics::with_local_recorder(prometheus(), || {
        (
            metrics::counter!("pieces_total", "transport" => "immediate", "outcome" => "success"),
            metrics::histogram!(mail_breaker::metrics::SEND_SECONDS, "transport" => "pieces"),
        )
    });
    group.bench_function("prometheus_counter", |b| {
        b.iter(|| black_box(&counter).increment(1))
    });
    group.bench_function("prometheus_histogram", |b| {
        b.iter(|| black_box(&histogram).record(black_box(0.25)))
    });
    group.finish();
}

#[cfg(not(feature = "metrics"))]
fn pieces(_: &mut Criterion) {}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = closed, open, pieces, scaling, domains, send_many, rate
}
criterion_main!(benches);
