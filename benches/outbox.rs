//! The outbox, side by side in one run: enqueueing one message at a time (each a commit synced
//! to disk) and in batches of 1,000 (`enqueue_many`), on SQLite and on PostgreSQL; and
//! draining 1,000 messages to a local smtp-sink through a breaker at 16 in flight, against
//! sending the same messages straight through the same stack. At the end, the drain's rate
//! over the direct send's again, from pairs of runs one right after the other, which a
//! machine whose speed drifts moves far less than criterion's separate measurements; and, on
//! Linux, what a message cost the machine's CPU in each, by process.
//!
//! `cargo bench --bench outbox`. PostgreSQL runs from a temporary folder (as `nobody` under
//! root), smtp-sink on a free port; each one missing is skipped with a message.

mod support;

use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use futures::{StreamExt, stream};
use mail_breaker::{CircuitBreakerTransport, Message, SmtpTransport, Transport};
use support::outbox::{Databases, Measured, empty};
use support::smtp_sink::SmtpSink;

const ONE_AT_A_TIME: usize = 100;
const BATCH: usize = 1_000;
const DRAINED: usize = 1_000;
const IN_FLIGHT: usize = 16;

fn messages(count: usize) -> Vec<Message> {
    (0..count)
        .map(|i| {
            Message::builder()
                .from("app@example.com".parse().expect("a sender"))
                .to("user@example.org".parse().expect("a recipient"))
                .subject(format!("outbox bench {i}"))
                .body(format!(
                    "a receipt, number {i}, of a few lines\r\nthank you\r\n"
                ))
                .expect("a message")
        })
        .collect()
}

fn enqueue(c: &mut Criterion) {
    let rt = runtime();
    let databases = Databases::start("outbox-bench");
    let outboxes = rt.block_on(databases.open());
    let batch = messages(BATCH);
    let mut group = c.benchmark_group("outbox_enqueue");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for measured in &outboxes {
        let (name, outbox) = (measured.name, &measured.outbox);
        group.throughput(Throughput::Elements(ONE_AT_A_TIME as u64));
        group.bench_function(BenchmarkId::new("one_at_a_time", name), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let batch = &batch;
                async move {
                    let mut took = Duration::ZERO;
                    for _ in 0..iters {
                        empty(measured).await;
                        let started = Instant::now();
                        for message in &batch[..ONE_AT_A_TIME] {
                            outbox.enqueue(message).await.expect("enqueued");
                        }
                        took += started.elapsed();
                    }
                    took
                }
            });
        });
        group.throughput(Throughput::Elements(BATCH as u64));
        group.bench_function(BenchmarkId::new("batched", name), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let batch = &batch;
                async move {
                    let mut took = Duration::ZERO;
                    for _ in 0..iters {
                        empty(measured).await;
                        let started = Instant::now();
                        outbox.enqueue_many(batch).await.expect("enqueued");
                        took += started.elapsed();
                    }
                    took
                }
            });
        });
    }
    group.finish();
}

fn drain(c: &mut Criterion) {
    if !support::installed("smtp-sink", "outbox drain") {
        return;
    }
    let Some(sink) = SmtpSink::start("outbox drain", &[]) else {
        return;
    };
    let rt = runtime();
    let databases = Databases::start("outbox-bench");
    let outboxes = rt.block_on(databases.open());
    let batch = messages(DRAINED);
    let stack = || {
        let smtp = SmtpTransport::unencrypted("127.0.0.1", sink.port())
            .with_concurrency(IN_FLIGHT)
            .with_timeout(Duration::from_secs(5));
        CircuitBreakerTransport::new(smtp)
    };
    let mut group = c.benchmark_group("outbox_drain");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(DRAINED as u64));
    let direct = stack();
    group.bench_function(BenchmarkId::new("direct", IN_FLIGHT), |b| {
        b.to_async(&rt).iter(|| send_straight(&direct, &batch));
    });
    let workers: Vec<_> = outboxes
        .iter()
        .map(|measured| {
            let worker = measured.outbox.worker(stack()).concurrency(IN_FLIGHT);
            (measured, worker)
        })
        .collect();
    for (measured, worker) in &workers {
        let id = BenchmarkId::new(format!("outbox_{}", measured.name), IN_FLIGHT);
        group.bench_function(id, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let batch = &batch;
                async move {
                    let mut took = Duration::ZERO;
                    for _ in 0..iters {
                        took += queue_and_drain(measured, worker, batch).await;
                    }
                    took
                }
            });
        });
    }
    group.finish();
    if measured_by_name("outbox_drain_interleaved") {
        rt.block_on(interleaved(&workers, &direct, &batch));
    }
}

/// Sends `batch` straight through `stack`, `IN_FLIGHT` at a time, and checks that each went.
async fn send_straight<T: Transport>(stack: &T, batch: &[Message]) {
    let sent = stream::iter(batch)
        .map(|message| stack.send(message))
        .buffer_unordered(IN_FLIGHT)
        .filter(|answer| std::future::ready(answer.is_ok()))
        .count()
        .await;
    assert_eq!(sent, batch.len());
}

/// Queues `batch` in the emptied outbox and drains it with `worker`: how long the drain took.
async fn queue_and_drain<U: Transport + 'static>(
    measured: &Measured,
    worker: &mail_breaker::outbox::Worker<U>,
    batch: &[Message],
) -> Duration {
    queue(measured, batch).await;
    drain_queued(measured, worker).await
}

/// Empties the outbox and queues `batch` in it.
async fn queue(measured: &Measured, batch: &[Message]) {
    empty(measured).await;
    measured.outbox.enqueue_many(batch).await.expect("enqueued");
}

/// Drains what is queued with `worker`: how long it took. Checks that nothing was left.
async fn drain_queued<U: Transport + 'static>(
    measured: &Measured,
    worker: &mail_breaker::outbox::Worker<U>,
) -> Duration {
    let started = Instant::now();
    worker.drain().await.expect("drained");
    let took = started.elapsed();
    assert_drained(measured).await;
    took
}

/// Checks that the outbox holds nothing queued.
async fn assert_drained(measured: &Measured) {
    let stats = measured.outbox.stats().await.expect("stats");
    assert_eq!(stats.queued, 0);
}

/// Pairs of a direct send and a drain, taken one right after the other.
const PAIRS: usize = 12;

/// Prints each drain's rate against the direct send's, from runs that alternate them.
/// Criterion measures each alone, every direct sample before every drain, and these VMs'
/// speed drifts by a third within minutes; the two runs of a pair share the machine's state.
/// Then, on Linux, what a message cost the machine's CPU in each run, by process: the bench
/// (the worker and the stack), smtp-sink and PostgreSQL, which share the machine's cores.
async fn interleaved<T: Transport, U: Transport + 'static>(
    workers: &[(&Measured, mail_breaker::outbox::Worker<U>)],
    direct: &T,
    batch: &[Message],
) {
    println!(
        "| outbox | its drain's rate over the direct send's just before it, median of {PAIRS} \
         pairs | lowest | highest |"
    );
    println!("|---|---|---|---|");
    let mut costs = Vec::new();
    for (measured, worker) in workers {
        let mut ratios = Vec::with_capacity(PAIRS);
        let mut direct_cost = Cost::default();
        let mut drain_cost = Cost::default();
        for _ in 0..PAIRS {
            let sending = direct_cost
                .measure(send_straight(direct, batch), batch.len())
                .await;
            queue(measured, batch).await;
            let drained = async { worker.drain().await.expect("drained") };
            let draining = drain_cost.measure(drained, batch.len()).await;
            assert_drained(measured).await;
            ratios.push(sending.as_secs_f64() / draining.as_secs_f64());
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "| {} | {:.2}x | {:.2}x | {:.2}x |",
            measured.name,
            ratios[PAIRS / 2],
            ratios[0],
            ratios[PAIRS - 1]
        );
        costs.push((measured.name, direct_cost, drain_cost));
    }
    if costs.iter().any(|(_, direct, _)| direct.cpu.is_none()) {
        return;
    }
    println!();
    println!(
        "| pairs | run | time per message | CPU per message, all | the bench's process | \
         smtp-sink | PostgreSQL |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, direct, drain) in &costs {
        println!("{}", direct.row(name, "direct"));
        println!("{}", drain.row(name, "drain"));
    }
}

/// What a kind of run cost in all, over the pairs: time, messages, and CPU by process (`None`
/// where `/proc` cannot be read).
#[derive(Default)]
struct Cost {
    took: Duration,
    messages: u32,
    cpu: Option<std::collections::BTreeMap<&'static str, Duration>>,
}

impl Cost {
    /// Runs `run`, which handles `messages`, and adds what it cost: how long it took.
    async fn measure(
        &mut self,
        run: impl std::future::Future<Output = ()>,
        messages: usize,
    ) -> Duration {
        let before = support::cpu::CpuTimes::now();
        let started = Instant::now();
        run.await;
        let took = started.elapsed();
        let spent = before.zip(support::cpu::CpuTimes::now());
        self.took += took;
        self.messages += u32::try_from(messages).expect("a bench-sized batch");
        self.cpu = spent.map(|(before, after)| {
            let mut sum = self.cpu.take().unwrap_or_default();
            for (process, spent) in after.since(&before) {
                *sum.entry(process).or_default() += spent;
            }
            sum
        });
        took
    }

    /// A table row: the mean time and CPU per message, in microseconds.
    fn row(&self, outbox: &str, run: &str) -> String {
        let per_message = |spent: Duration| spent.as_secs_f64() * 1e6 / f64::from(self.messages);
        let cpu = self.cpu.clone().unwrap_or_default();
        let of = |process| per_message(cpu.get(process).copied().unwrap_or_default());
        let all: Duration = cpu.values().sum();
        format!(
            "| {outbox} | {run} | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs |",
            per_message(self.took),
            per_message(all),
            of("bench"),
            of("smtp-sink"),
            of("postgres"),
        )
    }
}

/// Whether `name` is measured in this run: criterion's filter, the first argument that is not
/// a flag, names a part of it, or there is none.
fn measured_by_name(name: &str) -> bool {
    std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .is_none_or(|filter| name.contains(&filter))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

criterion_group!(benches, enqueue, drain);
criterion_main!(benches);
