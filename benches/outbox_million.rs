//! The outbox when a long outage has left a million messages queued, against the same with a
//! thousand: on SQLite and on PostgreSQL, after the queue is filled (batches of 1,000 messages
//! of about 2 KB), how long a `stats` call takes, how long one more `enqueue` takes, how long
//! a worker takes from its start to its first send (its first claim, which must find the due
//! messages without reading the queue), how fast it drains the first 10,000 (all of the
//! thousand), and how many
//! bytes on disk each queued message takes.
//!
//! `cargo bench --bench outbox_million --features postgres`. `OUTBOX_MILLION_QUEUED` (default
//! 1,000,000) sets the large queue, `OUTBOX_MILLION_RUNS` (default 9) how many calls each
//! latency is the median of. PostgreSQL runs from a temporary folder (as `nobody` under
//! root); without it only SQLite is measured. Each database of a million takes about 3 GB
//! for the run.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mail_breaker::outbox::Outbox;
use mail_breaker::{Envelope, Message, Receipt, SendError, Transport};
use sqlx::Connection as _;
use support::outbox::{Databases, receipts};
use support::setting;
use tokio::sync::Notify;

/// Messages per `enqueue_many` while the queue is filled.
const BATCH: usize = 1_000;

/// Messages the worker sends before it is stopped.
const DRAINED: usize = 10_000;

/// Sends at once in the worker, as in the drain figures of `outbox_peers`.
const IN_FLIGHT: usize = 16;

/// The two queue lengths compared.
fn queued() -> [usize; 2] {
    [1_000, setting("OUTBOX_MILLION_QUEUED", 1_000_000)]
}

/// Calls per latency, whose median is printed.
fn runs() -> usize {
    setting("OUTBOX_MILLION_RUNS", 9)
}

/// A sink that answers every message at once, notes when its first send began, and wakes
/// `done` at the `stop_at`th.
struct Counting {
    sent: AtomicUsize,
    stop_at: usize,
    first: OnceLock<Instant>,
    done: Arc<Notify>,
}

#[async_trait::async_trait]
impl Transport for Counting {
    fn name(&self) -> &str {
        "counting"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        self.first.get_or_init(Instant::now);
        if self.sent.fetch_add(1, Ordering::SeqCst) + 1 == self.stop_at {
            self.done.notify_one();
        }
        Ok(Receipt::new("counting"))
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        self.send_raw(message.envelope(), &[]).await
    }
}

/// One queue length's figures on one database.
struct Figures {
    database: &'static str,
    queued: usize,
    fill_rate: f64,
    stats: Duration,
    enqueue: Duration,
    first_send: Duration,
    drain_rate: f64,
    bytes_per_message: f64,
}

/// The median of `runs()` timings of `call`.
async fn median_of<F: Future<Output = ()>>(mut call: impl FnMut() -> F) -> Duration {
    let mut times = Vec::new();
    for _ in 0..runs() {
        let started = Instant::now();
        call().await;
        times.push(started.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

/// Runs a worker at `IN_FLIGHT` until its sink has sent `stop_at` messages: how long it took
/// to its first send, how long it ran, and how many it sent (those it had started when it
/// stopped included).
async fn run_until(outbox: &Outbox, stop_at: usize) -> (Duration, Duration, usize) {
    let done = Arc::new(Notify::new());
    let sink = Counting {
        sent: AtomicUsize::new(0),
        stop_at,
        first: OnceLock::new(),
        done: done.clone(),
    };
    let worker = outbox.worker(sink).concurrency(IN_FLIGHT);
    let started = Instant::now();
    worker
        .run(async move { done.notified().await })
        .await
        .expect("the worker ran");
    let took = started.elapsed();
    let sink = worker.get_ref();
    let first = sink.first.get().copied().expect("a first send");
    (first - started, took, sink.sent.load(Ordering::SeqCst))
}

/// How long a worker takes from its start to its first send (its first claim must find the
/// due messages in the schedule's index): the median of `runs()` workers, each stopped at its
/// first send (handing back what it claimed and had not started).
async fn first_send(outbox: &Outbox) -> Duration {
    let mut times = Vec::new();
    for _ in 0..runs() {
        times.push(run_until(outbox, 1).await.0);
    }
    times.sort();
    times[times.len() / 2]
}

/// Fills `outbox` with `count` messages in batches; the messages per second it took.
async fn fill(outbox: &Outbox, batch: &[Message], count: usize) -> f64 {
    let started = Instant::now();
    let mut left = count;
    while left > 0 {
        let now = left.min(batch.len());
        outbox.enqueue_many(&batch[..now]).await.expect("enqueued");
        left -= now;
    }
    count as f64 / started.elapsed().as_secs_f64()
}

/// Measures `outbox` holding `count` messages; `disk` gives its bytes on disk.
async fn measure<D: Future<Output = u64>>(
    database: &'static str,
    outbox: &Outbox,
    batch: &[Message],
    count: usize,
    disk: impl FnOnce() -> D,
) -> Figures {
    let fill_rate = fill(outbox, batch, count).await;
    let bytes_per_message = disk().await as f64 / count as f64;
    let stats = median_of(|| async {
        outbox.stats().await.expect("stats");
    })
    .await;
    let enqueue = median_of(|| async {
        outbox.enqueue(&batch[0]).await.expect("enqueued");
    })
    .await;
    let first_send = first_send(outbox).await;
    // The workers above each sent what they started before they stopped.
    let left = outbox.stats().await.expect("stats").queued;
    let stop_at = DRAINED.min(usize::try_from(left).unwrap_or(usize::MAX));
    let (to_first, took, sent) = run_until(outbox, stop_at).await;
    // From the first send on: the worker's start is the figure before it.
    let sending = took.saturating_sub(to_first);
    Figures {
        database,
        queued: count,
        fill_rate,
        stats,
        enqueue,
        first_send,
        drain_rate: sent as f64 / sending.as_secs_f64(),
        bytes_per_message,
    }
}

/// The bytes of an SQLite outbox's files: the database and its write-ahead log.
fn sqlite_bytes(path: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|suffix| std::fs::metadata(format!("{}{suffix}", path.display())).ok())
        .map(|metadata| metadata.len())
        .sum()
}

/// The bytes of the PostgreSQL outbox's table, with its indexes and its TOAST.
async fn postgres_bytes(url: &str) -> u64 {
    let mut connection = sqlx::PgConnection::connect(url).await.expect("connected");
    let (bytes,): (i64,) = sqlx::query_as("SELECT pg_total_relation_size('mail_breaker_outbox')")
        .fetch_one(&mut connection)
        .await
        .expect("the table's size");
    bytes.unsigned_abs()
}

/// Empties the PostgreSQL outbox's table and gives its space back.
async fn truncate(url: &str) {
    let mut connection = sqlx::PgConnection::connect(url).await.expect("connected");
    sqlx::raw_sql("TRUNCATE mail_breaker_outbox")
        .execute(&mut connection)
        .await
        .expect("emptied");
}

fn print(rows: &[Figures]) {
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    println!(
        "| database | queued | fill, batched | `stats` | one `enqueue` | worker's first send | \
         first {DRAINED} drained, from the first send | bytes on disk per message |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {:.0}/s | {} | {} | {} | {:.0}/s | {:.0} |",
            row.database,
            row.queued,
            row.fill_rate,
            ms(row.stats),
            ms(row.enqueue),
            ms(row.first_send),
            row.drain_rate,
            row.bytes_per_message,
        );
    }
    println!();
    println!(
        "| database | `stats` | one `enqueue` | worker's first send | drain | (large over small) |"
    );
    println!("|---|---|---|---|---|---|");
    for pair in rows.chunks(2) {
        let [small, large] = pair else { continue };
        let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64();
        println!(
            "| {} | {:.1}x | {:.1}x | {:.1}x | {:.1}x | |",
            small.database,
            ratio(small.stats, large.stats),
            ratio(small.enqueue, large.enqueue),
            ratio(small.first_send, large.first_send),
            large.drain_rate / small.drain_rate,
        );
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let databases = Databases::start("outbox-million");
    rt.block_on(async {
        let batch = receipts(BATCH);
        println!(
            "messages of {} bytes, enqueued {BATCH} at a time; latencies the median of {} calls; \
             the worker at {IN_FLIGHT} in flight",
            batch[0].formatted().len(),
            runs(),
        );
        // Each database is first measured once with the small queue, not counted: its caches
        // and the process's are then warm for both figures.
        let [small, large] = queued();
        let counted = [(small, false), (small, true), (large, true)];
        let mut rows = Vec::new();
        for (count, kept) in counted {
            let path = databases.folder.join(format!("outbox-{count}-{kept}.db"));
            let outbox = Outbox::sqlite(&path).await.expect("an SQLite outbox");
            let disk = || async { sqlite_bytes(&path) };
            let figures = measure("sqlite", &outbox, &batch, count, disk).await;
            rows.extend(kept.then_some(figures));
            drop(outbox);
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
        if let Some(server) = &databases.postgres {
            let url = server.url();
            let outbox = Outbox::postgres(&url).await.expect("a PostgreSQL outbox");
            for (count, kept) in counted {
                truncate(&url).await;
                let figures =
                    measure("postgres", &outbox, &batch, count, || postgres_bytes(&url)).await;
                rows.extend(kept.then_some(figures));
            }
            truncate(&url).await;
        }
        println!();
        print(&rows);
    });
}
