//! The outbox against apalis 1.x, the job queue a Rust team names first, side by side in one
//! run: the same messages (10,000 of about 2 KB) and the same in-process sink (a no-op send,
//! and one that takes 1 ms), drained by our outbox's worker and by an apalis worker whose job
//! sends the message through the same sink, on SQLite and on PostgreSQL, at 1, 16 and 64 in
//! flight; and each queue's enqueue, one message at a time and batched. Every figure is the
//! median of several runs, ours and apalis's taken in turn so that a machine whose speed
//! drifts moves both alike; with the CPU a message cost the bench's process and, on Linux,
//! the PostgreSQL server (its postmaster and backends, from `/proc`).
//!
//! apalis runs at its documented settings: `SqliteStorage::new` and `PostgresStorage::new`
//! with their default `Config` (batches of 10), `setup` as documented, and a worker limited
//! to the in-flight count with `.concurrency(k)`, as its README's workers are built.
//! `OUTBOX_PEERS_APALIS_BATCH` tunes it: the jobs one fetch takes (its `Config::batch_size`).
//!
//! The 1 ms sink waits on a thread of Tokio's blocking pool, which wakes within tens of
//! microseconds; Tokio's own `sleep` wakes on a timer of whole milliseconds, so a "1 ms"
//! `sleep` takes up to 2 ms, and would cap the drain below the 16,000/s that 16 sends of 1 ms
//! allow whatever the queue did.
//!
//! `cargo bench --bench outbox_peers --features postgres`. `OUTBOX_PEERS_MESSAGES` (default
//! 10,000) and `OUTBOX_PEERS_RUNS` (default 3) make a quicker run, `OUTBOX_PEERS_IN_FLIGHT`
//! (say 16) drains at one in-flight count only, and `OUTBOX_PEERS_SENDS_TAKE_MS` (0 or 1)
//! with one sink only; `OUTBOX_PEERS_ONLY_OURS=1` leaves apalis out, for a quick A/B of two
//! builds of ours. `OUTBOX_PEERS_PERF_CTL` and `OUTBOX_PEERS_PERF_ACK` name the fifos of a
//! `perf record -a --delay=-1 --control fifo:CTL,ACK` run beside the bench, which then samples
//! during our drains only, or our enqueues (`OUTBOX_PEERS_PERF_ON=batched` or
//! `one-at-a-time`); `benches/README.md` shows how. PostgreSQL runs from a temporary folder
//! (as `nobody` under root); without it only SQLite is measured.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::{
    BoxDynError, Data, TaskSink, WorkerBuilder, WorkerBuilderExt as _, WorkerContext,
};
use apalis_postgres::{PgPool, PostgresStorage};
use apalis_sqlite::{SqlitePool, SqliteStorage};
use futures::FutureExt as _;
use mail_breaker::{Envelope, Message, Receipt, SendError, Transport};
use serde::{Deserialize, Serialize};
use sqlx::Connection as _;
use support::cpu::CpuTimes;
use support::outbox::{Databases, Measured, empty, receipts as messages};
use support::setting;

const IN_FLIGHT: [usize; 3] = [1, 16, 64];

/// Whether `OUTBOX_PEERS_ONLY_OURS=1` leaves apalis out: for a quick A/B of two builds of ours
/// (apalis on SQLite takes a minute a run).
fn only_ours() -> bool {
    std::env::var("OUTBOX_PEERS_ONLY_OURS").is_ok_and(|value| value == "1")
}

/// The in-flight counts drained at: all three, or the one `OUTBOX_PEERS_IN_FLIGHT` names.
fn in_flight_counts() -> Vec<usize> {
    match std::env::var("OUTBOX_PEERS_IN_FLIGHT") {
        Ok(_) => vec![setting("OUTBOX_PEERS_IN_FLIGHT", 16)],
        Err(_) => IN_FLIGHT.to_vec(),
    }
}

/// The sinks drained through: the no-op and the 1 ms, or the one `OUTBOX_PEERS_SENDS_TAKE_MS`
/// names (0 or 1).
fn sinks() -> Vec<Sink> {
    let sink = |ms| Sink {
        takes: Duration::from_millis(ms),
    };
    match std::env::var("OUTBOX_PEERS_SENDS_TAKE_MS").as_deref() {
        Ok("0") => vec![sink(0)],
        Ok("1") => vec![sink(1)],
        Ok(other) => panic!("OUTBOX_PEERS_SENDS_TAKE_MS={other}: 0 or 1"),
        Err(_) => vec![sink(0), sink(1)],
    }
}

/// The jobs an apalis worker fetches at once: its documented 10, or `OUTBOX_PEERS_APALIS_BATCH`.
fn apalis_batch() -> usize {
    setting("OUTBOX_PEERS_APALIS_BATCH", 10)
}

/// Messages drained per run, and batched per enqueue run.
fn messages_per_run() -> usize {
    setting("OUTBOX_PEERS_MESSAGES", 10_000)
}

/// Runs per figure, whose median is printed.
fn runs() -> usize {
    setting("OUTBOX_PEERS_RUNS", 3)
}

/// Messages enqueued one at a time per run: each is a commit of its own, so fewer.
fn one_at_a_time() -> usize {
    messages_per_run().min(1_000)
}

/// The sink both queues send through: it answers every message, at once or after `takes`.
#[derive(Debug, Clone, Copy)]
struct Sink {
    takes: Duration,
}

impl Sink {
    fn name(self) -> &'static str {
        if self.takes.is_zero() {
            "no-op"
        } else {
            "1 ms"
        }
    }
}

#[async_trait::async_trait]
impl Transport for Sink {
    fn name(&self) -> &str {
        "sink"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        if !self.takes.is_zero() {
            let takes = self.takes;
            tokio::task::spawn_blocking(move || std::thread::sleep(takes))
                .await
                .expect("the sink's wait");
        }
        Ok(Receipt::new("sink"))
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        self.send_raw(message.envelope(), &[]).await
    }
}

/// An apalis job's arguments: the message as the outbox keeps it, its envelope and its
/// formatted bytes (JSON-encoded by apalis's codec).
#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    from: Option<String>,
    to: Vec<String>,
    raw: String,
}

impl From<&Message> for Mail {
    fn from(message: &Message) -> Mail {
        let envelope = message.envelope();
        Mail {
            from: envelope.from().map(ToString::to_string),
            to: envelope.to().iter().map(ToString::to_string).collect(),
            raw: String::from_utf8(message.formatted()).expect("an ASCII message"),
        }
    }
}

/// How many of a drain's messages the apalis jobs have sent: the job that sends the last one
/// stops the worker, which then writes the answers it holds and returns.
struct Progress {
    sent: AtomicUsize,
    expected: usize,
}

/// The apalis job: sends the message through the sink, as our worker does.
async fn send_mail(
    mail: Mail,
    sink: Data<Sink>,
    progress: Data<Arc<Progress>>,
    worker: WorkerContext,
) -> Result<(), BoxDynError> {
    let from = mail.from.map(|from| from.parse()).transpose()?;
    let to = mail
        .to
        .iter()
        .map(|to| to.parse())
        .collect::<Result<_, _>>()?;
    let envelope = Envelope::new(from, to)?;
    sink.send_raw(&envelope, mail.raw.as_bytes()).await?;
    if progress.sent.fetch_add(1, Ordering::SeqCst) + 1 == progress.expected {
        // An error only says the worker is already stopping.
        let _ = worker.stop();
    }
    Ok(())
}

/// apalis's queue on SQLite: `new`, as documented, with `apalis_batch()` jobs to a fetch.
fn apalis_sqlite(pool: &SqlitePool) -> SqliteStorage<Mail> {
    let config = apalis_sqlite::Config::default()
        .queue(std::any::type_name::<Mail>())
        .batch_size(apalis_batch());
    SqliteStorage::new(pool).with_config(config)
}

/// apalis's queue on PostgreSQL: `new`, as documented, with `apalis_batch()` jobs to a fetch.
fn apalis_postgres(pool: &PgPool) -> PostgresStorage<Mail> {
    let config = apalis_postgres::Config::default()
        .queue(std::any::type_name::<Mail>())
        .batch_size(apalis_batch());
    PostgresStorage::new(pool).with_config(config)
}

/// A queue measured: ours on one database, or apalis on the same kind of database.
enum Queue<'a> {
    Ours(&'a Measured),
    ApalisSqlite { pool: SqlitePool, url: String },
    ApalisPostgres { pool: PgPool, url: String },
}

impl Queue<'_> {
    /// Empties the queue, so that each run starts from an empty table.
    async fn reset(&self) {
        match self {
            Queue::Ours(measured) => empty(measured).await,
            Queue::ApalisSqlite { url, .. } => {
                let mut connection = sqlx::SqliteConnection::connect(url).await.expect("open");
                sqlx::raw_sql("DELETE FROM Jobs; DELETE FROM Workers;")
                    .execute(&mut connection)
                    .await
                    .expect("emptied");
            }
            Queue::ApalisPostgres { url, .. } => {
                let mut connection = sqlx::PgConnection::connect(url).await.expect("connected");
                sqlx::raw_sql("TRUNCATE apalis.jobs; DELETE FROM apalis.workers;")
                    .execute(&mut connection)
                    .await
                    .expect("emptied");
            }
        }
    }

    async fn enqueue_one_at_a_time(&self, batch: &[Message]) {
        match self {
            Queue::Ours(measured) => {
                for message in batch {
                    measured.outbox.enqueue(message).await.expect("enqueued");
                }
            }
            Queue::ApalisSqlite { pool, .. } => {
                let mut storage = apalis_sqlite(pool);
                for message in batch {
                    storage.push(Mail::from(message)).await.expect("pushed");
                }
            }
            Queue::ApalisPostgres { pool, .. } => {
                let mut storage = apalis_postgres(pool);
                for message in batch {
                    storage.push(Mail::from(message)).await.expect("pushed");
                }
            }
        }
    }

    async fn enqueue_batched(&self, batch: &[Message]) {
        let mails = || batch.iter().map(Mail::from).collect::<Vec<_>>();
        match self {
            Queue::Ours(measured) => {
                measured.outbox.enqueue_many(batch).await.expect("enqueued");
            }
            Queue::ApalisSqlite { pool, .. } => {
                let mut storage = apalis_sqlite(pool);
                storage.push_bulk(mails()).await.expect("pushed");
            }
            Queue::ApalisPostgres { pool, .. } => {
                let mut storage = apalis_postgres(pool);
                storage.push_bulk(mails()).await.expect("pushed");
            }
        }
    }

    /// Drains the `expected` queued messages through `sink`, `in_flight` at a time; `false`
    /// if apalis's worker stalled (it is then dropped, and the run not counted).
    async fn drain(&self, sink: Sink, in_flight: usize, expected: usize, run: usize) -> bool {
        let progress = Arc::new(Progress {
            sent: AtomicUsize::new(0),
            expected,
        });
        let name = format!("outbox-peers-{in_flight}-{run}");
        let worker = match self {
            Queue::Ours(measured) => {
                let worker = measured.outbox.worker(sink).concurrency(in_flight);
                worker.drain().await.expect("drained");
                return true;
            }
            Queue::ApalisSqlite { pool, .. } => WorkerBuilder::new(name)
                .backend(apalis_sqlite(pool))
                .data(sink)
                .data(progress.clone())
                .concurrency(in_flight)
                .build(send_mail)
                .run()
                .boxed(),
            Queue::ApalisPostgres { pool, .. } => WorkerBuilder::new(name)
                .backend(apalis_postgres(pool))
                .data(sink)
                .data(progress.clone())
                .concurrency(in_flight)
                .build(send_mail)
                .run()
                .boxed(),
        };
        // A generous bound: a worker that parks with messages left would hang the bench.
        let bound = Duration::from_secs(60) + Duration::from_millis(20) * expected as u32;
        match tokio::time::timeout(bound, worker).await {
            Ok(ran) => {
                ran.expect("apalis's worker ran");
                true
            }
            Err(_) => {
                let sent = progress.sent.load(Ordering::SeqCst);
                println!("apalis's worker stalled: {sent} of {expected} sent in {bound:?}");
                false
            }
        }
    }

    /// The PostgreSQL server's write-ahead log, in bytes from its start, as far as it is
    /// written into (commits that do not wait for the flush included); `None` on SQLite.
    async fn wal_position(&self) -> Option<u64> {
        let url = match self {
            Queue::Ours(measured) => measured.postgres.as_deref()?,
            Queue::ApalisPostgres { url, .. } => url.as_str(),
            Queue::ApalisSqlite { .. } => return None,
        };
        let mut connection = sqlx::PgConnection::connect(url).await.expect("connected");
        let (bytes,): (i64,) =
            sqlx::query_as("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
                .fetch_one(&mut connection)
                .await
                .expect("the WAL's position");
        Some(bytes.unsigned_abs())
    }

    /// Runs `run`, which handles `messages`, and measures it: its rate, the CPU each process
    /// spent, and the bytes of WAL it wrote on PostgreSQL (read outside the timed part). Ours
    /// is profiled when `OUTBOX_PEERS_PERF_ON` names its `kind` (see `perf_control`).
    async fn measure(
        &self,
        kind: &str,
        run: impl Future<Output = bool>,
        messages: usize,
    ) -> Option<Figures> {
        let wal_before = self.wal_position().await;
        let profiled = matches!(self, Queue::Ours(_));
        if profiled {
            perf_control(kind, "enable");
        }
        let before = CpuTimes::now();
        let started = Instant::now();
        let finished = run.await;
        let took = started.elapsed();
        if profiled {
            perf_control(kind, "disable");
        }
        let spent = before
            .zip(CpuTimes::now())
            .map(|(before, after)| after.since(&before))
            .unwrap_or_default();
        if !finished {
            return None;
        }
        let per_message = |process| {
            let cpu = spent.get(process).copied().unwrap_or_default();
            cpu.as_secs_f64() * 1e6 / messages as f64
        };
        let wal_bytes = match (wal_before, self.wal_position().await) {
            (Some(before), Some(after)) => after.saturating_sub(before) as f64 / messages as f64,
            _ => 0.0,
        };
        Some(Figures {
            rate: messages as f64 / took.as_secs_f64(),
            bench_cpu: per_message("bench"),
            server_cpu: per_message("postgres"),
            wal_bytes,
        })
    }

    /// How many messages are still queued (ours) or not done (apalis's).
    async fn left(&self) -> u64 {
        match self {
            Queue::Ours(measured) => measured.outbox.stats().await.expect("stats").queued,
            Queue::ApalisSqlite { url, .. } => {
                let sql = "SELECT COUNT(*) FROM Jobs WHERE status <> 'Done'";
                let mut connection = sqlx::SqliteConnection::connect(url).await.expect("open");
                let (left,): (i64,) = sqlx::query_as(sql)
                    .fetch_one(&mut connection)
                    .await
                    .expect("counted");
                left.unsigned_abs()
            }
            Queue::ApalisPostgres { url, .. } => {
                let sql = "SELECT COUNT(*) FROM apalis.jobs WHERE status <> 'Done'";
                let mut connection = sqlx::PgConnection::connect(url).await.expect("connected");
                let (left,): (i64,) = sqlx::query_as(sql)
                    .fetch_one(&mut connection)
                    .await
                    .expect("counted");
                left.unsigned_abs()
            }
        }
    }
}

/// One run's figures: messages per second, CPU per message in microseconds of the bench's
/// process and of the PostgreSQL server, and the bytes of PostgreSQL's WAL per message.
#[derive(Debug, Clone, Copy)]
struct Figures {
    rate: f64,
    bench_cpu: f64,
    server_cpu: f64,
    wal_bytes: f64,
}

/// The median of each figure over the runs that finished; `None` if none did.
fn median(runs: &[Figures]) -> Option<Figures> {
    let of = |figure: fn(&Figures) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(figure).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    (!runs.is_empty()).then(|| Figures {
        rate: of(|figures| figures.rate),
        bench_cpu: of(|figures| figures.bench_cpu),
        server_cpu: of(|figures| figures.server_cpu),
        wal_bytes: of(|figures| figures.wal_bytes),
    })
}

/// A pair of queues on one database: ours and apalis's.
struct Pair<'a> {
    database: &'static str,
    ours: Queue<'a>,
    apalis: Queue<'a>,
}

/// One row of a table: what was measured, and both medians.
struct Row {
    what: String,
    database: &'static str,
    ours: Option<Figures>,
    apalis: Option<Figures>,
}

impl Row {
    fn print(&self) {
        let rate = |figures: Option<Figures>| {
            let missing = if only_ours() { "not run" } else { "stalled" };
            figures.map_or(missing.to_owned(), |figures| {
                format!("{:.0}/s", figures.rate)
            })
        };
        let cpu = |figures: Option<Figures>, server: bool| match figures {
            Some(figures) if server => format!("{:.1} µs", figures.server_cpu),
            Some(figures) => format!("{:.1} µs", figures.bench_cpu),
            None => "-".to_owned(),
        };
        let ratio = match (self.ours, self.apalis) {
            (Some(ours), Some(apalis)) => format!("{:.1}x", ours.rate / apalis.rate),
            _ => "-".to_owned(),
        };
        let server = self.database == "postgres";
        let server_cpu = |figures| {
            if server {
                cpu(figures, true)
            } else {
                "n/a".to_owned()
            }
        };
        let wal = |figures: Option<Figures>| match figures {
            Some(figures) if server => format!("{:.0} B", figures.wal_bytes),
            Some(_) => "n/a".to_owned(),
            None => "-".to_owned(),
        };
        println!(
            "| {} | {} | {} | {} | {ratio} | {} | {} | {} | {} | {} | {} |",
            self.what,
            self.database,
            rate(self.ours),
            rate(self.apalis),
            cpu(self.ours, false),
            cpu(self.apalis, false),
            server_cpu(self.ours),
            server_cpu(self.apalis),
            wal(self.ours),
            wal(self.apalis),
        );
    }
}

fn header(what: &str) {
    println!(
        "| {what} | database | ours | apalis | ours over apalis | bench CPU/msg, ours | \
         bench CPU/msg, apalis | PostgreSQL CPU/msg, ours | PostgreSQL CPU/msg, apalis | \
         WAL/msg, ours | WAL/msg, apalis |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
}

/// Each queue's enqueue, one message at a time and batched, ours and apalis's in turn.
async fn enqueue(pairs: &[Pair<'_>], batch: &[Message]) -> Vec<Row> {
    let one_at_a_time = &batch[..one_at_a_time()];
    let mut rows = Vec::new();
    for (how, messages) in [("one at a time", one_at_a_time), ("batched", batch)] {
        for pair in pairs {
            let (mut ours, mut apalis) = (Vec::new(), Vec::new());
            for _ in 0..runs() {
                for (queue, figures) in [(&pair.ours, &mut ours), (&pair.apalis, &mut apalis)] {
                    if only_ours() && !matches!(queue, Queue::Ours(_)) {
                        continue;
                    }
                    queue.reset().await;
                    let run = async {
                        if how == "batched" {
                            queue.enqueue_batched(messages).await;
                        } else {
                            queue.enqueue_one_at_a_time(messages).await;
                        }
                        true
                    };
                    let kind = how.replace(' ', "-");
                    figures.extend(queue.measure(&kind, run, messages.len()).await);
                }
            }
            rows.push(Row {
                what: how.to_owned(),
                database: pair.database,
                ours: median(&ours),
                apalis: median(&apalis),
            });
        }
    }
    rows
}

/// Tells a `perf record --control fifo:CTL,ACK` started beside the bench to `command`
/// (`enable` or `disable`) and waits for its ack, when `OUTBOX_PEERS_PERF_CTL` and
/// `OUTBOX_PEERS_PERF_ACK` name those two fifos and our run about to start or just ended is of
/// the `kind` that `OUTBOX_PEERS_PERF_ON` names (`drain`, the default, `batched` or
/// `one-at-a-time`): so that a profile holds those runs alone, not the others nor apalis's.
fn perf_control(kind: &str, command: &str) {
    use std::io::{Read as _, Write as _};
    let (Ok(ctl), Ok(ack)) = (
        std::env::var("OUTBOX_PEERS_PERF_CTL"),
        std::env::var("OUTBOX_PEERS_PERF_ACK"),
    ) else {
        return;
    };
    let profiled = std::env::var("OUTBOX_PEERS_PERF_ON").unwrap_or_else(|_| "drain".to_owned());
    if profiled != kind {
        return;
    }
    let mut ctl = std::fs::OpenOptions::new()
        .write(true)
        .open(&ctl)
        .expect("perf's control fifo");
    writeln!(ctl, "{command}").expect("writing to perf's control fifo");
    let mut answer = [0; 4]; // "ack\n"
    let mut ack = std::fs::File::open(&ack).expect("perf's ack fifo");
    ack.read_exact(&mut answer).expect("perf's ack");
}

/// Each queue's drain of `batch` through `sink` at each in-flight count, ours and apalis's in
/// turn; each run's messages enqueued (batched, not timed) before it.
async fn drain(pairs: &[Pair<'_>], batch: &[Message], sink: Sink) -> Vec<Row> {
    let mut rows = Vec::new();
    for in_flight in in_flight_counts() {
        for pair in pairs {
            let (mut ours, mut apalis) = (Vec::new(), Vec::new());
            for run in 0..runs() {
                for (queue, figures) in [(&pair.ours, &mut ours), (&pair.apalis, &mut apalis)] {
                    if only_ours() && !matches!(queue, Queue::Ours(_)) {
                        continue;
                    }
                    queue.reset().await;
                    queue.enqueue_batched(batch).await;
                    let drained = queue.drain(sink, in_flight, batch.len(), run);
                    let measured = queue.measure("drain", drained, batch.len()).await;
                    if measured.is_some() {
                        let left = queue.left().await;
                        assert_eq!(left, 0, "messages left queued after a drain");
                    }
                    figures.extend(measured);
                }
            }
            rows.push(Row {
                what: format!("drain, {} sink, {in_flight} in flight", sink.name()),
                database: pair.database,
                ours: median(&ours),
                apalis: median(&apalis),
            });
        }
    }
    rows
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let databases = Databases::start("outbox-peers");
    rt.block_on(async {
        let outboxes = databases.open().await;
        let mut pairs = Vec::new();
        for measured in &outboxes {
            let apalis = match &measured.postgres {
                None => {
                    let path = databases.folder.join("apalis.db");
                    let url = format!("sqlite://{}?mode=rwc", path.display());
                    let pool = SqlitePool::connect(&url).await.expect("apalis's SQLite");
                    SqliteStorage::setup(&pool).await.expect("apalis's tables");
                    Queue::ApalisSqlite { pool, url }
                }
                Some(url) => {
                    let pool = PgPool::connect(url).await.expect("apalis's PostgreSQL");
                    PostgresStorage::setup(&pool)
                        .await
                        .expect("apalis's tables");
                    let url = url.clone();
                    Queue::ApalisPostgres { pool, url }
                }
            };
            pairs.push(Pair {
                database: measured.name,
                ours: Queue::Ours(measured),
                apalis,
            });
        }
        let batch = messages(messages_per_run());
        println!(
            "{} messages of {} bytes, median of {} runs, {} one at a time, apalis's batch_size {}",
            batch.len(),
            batch[0].formatted().len(),
            runs(),
            one_at_a_time(),
            apalis_batch(),
        );
        println!();
        header("enqueue");
        for row in enqueue(&pairs, &batch).await {
            row.print();
        }
        println!();
        header("drain");
        for sink in sinks() {
            for row in drain(&pairs, &batch, sink).await {
                row.print();
            }
        }
    });
}
