//! The outbox across processes (issue 24): what an `enqueue` answered `Ok` survives the
//! process being SIGKILLed, and worker processes sharing one PostgreSQL queue send every
//! message exactly once, or, when some of them are SIGKILLed mid-send, lose none and send
//! again only what the killed ones held (or, `at_most_once`, dead-letter it).
//!
//! Each test re-executes this test binary as its child processes, selecting one of the two
//! `child_process_*` tests with `--exact`; those read what to do from environment variables
//! and return at once without them, so in a normal run they pass doing nothing.
//!
//! The tests that start processes run one at a time (they share the `HEAVY` lock): the CI
//! machine has two cores.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use mail_breaker::outbox::{Outbox, OutboxId};
use mail_breaker::{
    Backoff, Category, CircuitBreakerTransport, Envelope, Message, Receipt, SendError,
    SmtpTransport, Transport,
};
use support::postgres::PostgresServer;
use support::smtp_sink::SmtpSink;

/// The child that enqueues one message at a time and prints each index once it is `Ok`.
const ENQUEUE_CHILD: &str = "child_process_enqueues_one_at_a_time_and_reports_each_ok";
/// The child that runs a worker until nothing is queued.
const WORKER_CHILD: &str = "child_process_runs_a_worker_until_nothing_is_queued";

/// The enqueueing child's outbox: an SQLite path or a `postgres://` URL.
const ENQUEUE_DB: &str = "OUTBOX_ENQUEUE_CHILD_DB";
/// The worker child's outbox: an SQLite path or a `postgres://` URL.
const WORKER_DB: &str = "OUTBOX_WORKER_CHILD_DB";
/// The smtp-sink port the worker child sends to.
const WORKER_SMTP_PORT: &str = "OUTBOX_WORKER_CHILD_SMTP_PORT";
/// The worker child's lease in milliseconds (default: the worker's own, 5 minutes).
const WORKER_LEASE_MS: &str = "OUTBOX_WORKER_CHILD_LEASE_MS";
/// Set (to anything) for a worker child with `at_most_once`.
const WORKER_AT_MOST_ONCE: &str = "OUTBOX_WORKER_CHILD_AT_MOST_ONCE";
/// The worker child's `max_age` (ms).
const WORKER_MAX_AGE_MS: &str = "OUTBOX_WORKER_CHILD_MAX_AGE_MS";
/// When set, the worker child drains once and exits, whatever is left queued. A message that
/// fails waits a minute for its retry, so the one drain tries each message once (a retry
/// drawn from the usual backoff, 0 to 100 ms, could come due before the drain ends).
const WORKER_ONCE: &str = "OUTBOX_WORKER_CHILD_ONCE";
/// How long each of the worker child's sends takes before it goes to the server (ms).
const WORKER_SEND_DELAY_MS: &str = "OUTBOX_WORKER_CHILD_SEND_DELAY_MS";
/// When set, the worker child runs (`Worker::run`) with this poll (ms) until nothing is
/// queued, rather than draining: it rests between claims as a long-lived worker does.
const WORKER_RUN_POLL_MS: &str = "OUTBOX_WORKER_CHILD_RUN_POLL_MS";
/// When set, the worker child's first send is refused for now, as a provider's 451 is.
const WORKER_FAIL_FIRST: &str = "OUTBOX_WORKER_CHILD_FAIL_FIRST";

/// How many messages the enqueueing child tries to enqueue.
const ENQUEUES: usize = 5_000;
/// What the enqueueing child prints after each `Ok`, before the index.
const ENQUEUED: &str = "enqueued ";
/// What the enqueueing child prints once it enqueued all of them.
const ALL_ENQUEUED: &str = "all enqueued";

/// How many messages the worker tests send.
const MESSAGES: usize = 10_000;
/// Sends in flight in each worker child.
const CONCURRENCY: usize = 16;
/// How many worker children the killing tests SIGKILL (and replace).
const KILLS: usize = 5;
/// How many worker children the killing tests keep running.
const RUNNING: usize = 2;

/// A worker child that has not finished in this long is killed and its test fails.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// One test that starts processes at a time.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Message `index`: its index in the subject and in its Message-ID.
fn numbered(index: usize) -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to("user@example.org".parse().expect("a valid recipient"))
        .subject(format!("outbox {index}"))
        .message_id(Some(format!("<outbox-{index}@mail-breaker.test>")))
        .body(format!("message {index}\r\n"))
        .expect("a valid message")
}

/// The index in a message's (or an smtp-sink dump's) Message-ID, if it is one of ours.
fn message_index(text: &str) -> Option<usize> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.eq_ignore_ascii_case("message-id") {
            return None;
        }
        let value = value.trim().strip_prefix("<outbox-")?;
        value.strip_suffix("@mail-breaker.test>")?.parse().ok()
    })
}

async fn open(db: &str) -> Result<Outbox, SendError> {
    if db.starts_with("postgres://") {
        Outbox::postgres(db).await
    } else {
        Outbox::sqlite(db).await
    }
}

/// A scratch folder for an SQLite file, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch folder");
        Scratch(dir)
    }

    fn db(&self) -> String {
        self.0.join("outbox.db").to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This test binary, running only the child test `name`.
fn child_command(name: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null());
    command
}

// ---------------------------------------------------------------------------------------
// The child processes.

/// The enqueueing child: enqueues `ENQUEUES` messages one at a time, printing each index
/// (a line, flushed) once its `enqueue` returned `Ok`. Does nothing without `ENQUEUE_DB`.
#[test]
fn child_process_enqueues_one_at_a_time_and_reports_each_ok() {
    let Ok(db) = std::env::var(ENQUEUE_DB) else {
        return;
    };
    runtime().block_on(async {
        let outbox = open(&db).await.expect("opening the outbox");
        let mut stdout = std::io::stdout().lock();
        // The test harness has printed `test <name> ... ` without a line break.
        writeln!(stdout).expect("reporting");
        for index in 0..ENQUEUES {
            outbox
                .enqueue(&numbered(index))
                .await
                .expect("enqueueing a message");
            // A closed pipe (the parent is gone) ends the child here.
            writeln!(stdout, "{ENQUEUED}{index}").expect("reporting an enqueue");
            stdout.flush().expect("reporting an enqueue");
        }
        writeln!(stdout, "{ALL_ENQUEUED}").expect("reporting the end");
        stdout.flush().expect("reporting the end");
    });
}

/// The worker child: a worker (concurrency `CONCURRENCY`) sending through a breaker to
/// smtp-sink, drained again and again until nothing is queued. Does nothing without
/// `WORKER_DB`.
#[test]
fn child_process_runs_a_worker_until_nothing_is_queued() {
    let Ok(db) = std::env::var(WORKER_DB) else {
        return;
    };
    let port: u16 = std::env::var(WORKER_SMTP_PORT)
        .expect("the smtp-sink port")
        .parse()
        .expect("a port number");
    let lease = std::env::var(WORKER_LEASE_MS)
        .ok()
        .map(|ms| Duration::from_millis(ms.parse().expect("a lease in milliseconds")));
    let at_most_once = std::env::var_os(WORKER_AT_MOST_ONCE).is_some();
    let delay = std::env::var(WORKER_SEND_DELAY_MS)
        .ok()
        .map_or(Duration::ZERO, |ms| {
            Duration::from_millis(ms.parse().expect("a delay in milliseconds"))
        });
    let max_age = std::env::var(WORKER_MAX_AGE_MS)
        .ok()
        .map(|ms| Duration::from_millis(ms.parse().expect("a max age in milliseconds")));
    let once = std::env::var_os(WORKER_ONCE).is_some();
    let run_poll = std::env::var(WORKER_RUN_POLL_MS)
        .ok()
        .map(|ms| Duration::from_millis(ms.parse().expect("a poll in milliseconds")));
    let fail_first = AtomicBool::new(std::env::var_os(WORKER_FAIL_FIRST).is_some());
    let deadline = Instant::now() + CHILD_DEADLINE;
    runtime().block_on(async {
        let outbox = open(&db).await.expect("opening the outbox");
        let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
            .port(port)
            .max_connections(CONCURRENCY)
            .timeout(Duration::from_secs(10))
            .build()
            .expect("valid SMTP settings");
        let mut worker = outbox
            .worker(CircuitBreakerTransport::new(Slow {
                inner: smtp,
                delay,
                fail_first,
            }))
            .concurrency(CONCURRENCY)
            .poll(Duration::from_millis(100))
            .backoff(if once {
                Backoff::constant(Duration::from_secs(60))
            } else {
                Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1))
            });
        if let Some(lease) = lease {
            worker = worker.lease(lease);
        }
        if at_most_once {
            worker = worker.at_most_once();
        }
        if let Some(max_age) = max_age {
            worker = worker.max_age(max_age);
        }
        if let Some(poll) = run_poll {
            let watched = outbox.clone();
            let emptied = async move {
                loop {
                    assert!(Instant::now() < deadline, "the worker child ran too long");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if matches!(watched.stats().await, Ok(stats) if stats.queued == 0) {
                        return;
                    }
                }
            };
            if let Err(error) = worker.poll(poll).run(emptied).await {
                eprintln!("worker child {}: run: {error}", std::process::id());
            }
            return;
        }
        if once {
            if let Err(error) = worker.drain().await {
                eprintln!("worker child {}: drain: {error}", std::process::id());
            }
            return;
        }
        loop {
            assert!(Instant::now() < deadline, "the worker child ran too long");
            if let Err(error) = worker.drain().await {
                eprintln!("worker child {}: drain: {error}", std::process::id());
            }
            match outbox.stats().await {
                Ok(stats) if stats.queued == 0 => return,
                Ok(_) => {}
                Err(error) => eprintln!("worker child {}: stats: {error}", std::process::id()),
            }
            // Others hold what is left, or it is due later.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// A transport that waits `delay` before each send goes to `inner`: a slow provider; with
/// `fail_first`, its first send is refused for now.
struct Slow<T> {
    inner: T,
    delay: Duration,
    fail_first: AtomicBool,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for Slow<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.fail_first.swap(false, Ordering::SeqCst) {
            return Err(SendError::new(
                Category::ServerError,
                "test.later",
                "451 try again later",
            ));
        }
        self.inner.send_raw(envelope, raw).await
    }
}

// ---------------------------------------------------------------------------------------
// Every enqueue that returned Ok survives a SIGKILL.

/// A transport that keeps the raw bytes of every message sent through it.
#[derive(Clone, Default)]
struct Recorder {
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

#[async_trait::async_trait]
impl Transport for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn send_raw(&self, _envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent.push(raw.to_vec());
        Ok(Receipt::new("recorder"))
    }
}

/// Runs the enqueueing child on `db`, SIGKILLs it after a random number of reported
/// enqueues, and checks that the outbox holds every message it reported (and at most the one
/// it was enqueueing when it died besides).
fn enqueues_survive_a_sigkill(test: &str, db: &str) {
    let started = Instant::now();
    let kill_after = fastrand::usize(500..=4_000);
    let mut child = child_command(ENQUEUE_CHILD)
        .env(ENQUEUE_DB, db)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning the enqueueing child");
    let stdout = child.stdout.take().expect("the child's stdout");
    let (lines, read) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });

    let mut reported = Vec::new();
    let mut finished = false;
    let mut killed_at = None;
    loop {
        let line = match read.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{test}: the child reported nothing for 20 s");
            }
        };
        if let Some(index) = line.strip_prefix(ENQUEUED) {
            reported.push(index.parse::<usize>().expect("an index"));
        } else if line == ALL_ENQUEUED {
            finished = true;
        }
        if killed_at.is_none() && reported.len() == kill_after {
            child.kill().expect("SIGKILL the child");
            killed_at = Some(reported.len());
        }
    }
    reader.join().expect("the reader thread");
    let status = child.wait().expect("waiting for the child");
    let reported_before_kill = killed_at.expect("the child was killed");
    assert!(!finished, "{test}: the child finished before it was killed");
    assert!(reported.len() < ENQUEUES, "{test}: the child finished");
    assert_eq!(
        status.signal(),
        Some(9),
        "{test}: the child did not die of SIGKILL: {status}"
    );
    // Reported in order, each once: 0, 1, 2, ...
    let out_of_order = reported.iter().enumerate().find(|(i, index)| *i != **index);
    assert_eq!(out_of_order, None, "{test}: reports out of order");

    // Read the messages back by sending them all through a recorder.
    let recorder = Recorder::default();
    let stats = runtime().block_on(async {
        let outbox = open(db).await.expect("reopening the outbox");
        let before = outbox.stats().await.expect("stats");
        outbox
            .worker(recorder.clone())
            .concurrency(CONCURRENCY)
            .drain()
            .await
            .expect("draining the outbox");
        let after = outbox.stats().await.expect("stats");
        assert_eq!(after.queued, 0, "{test}: {after:?}");
        assert_eq!(after.dead, 0, "{test}: {after:?}");
        before
    });
    let sent = recorder.sent.lock().unwrap_or_else(PoisonError::into_inner);
    let stored: Vec<usize> = sent
        .iter()
        .map(|raw| message_index(&String::from_utf8_lossy(raw)).expect("one of ours"))
        .collect();
    let distinct: BTreeSet<usize> = stored.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        stored.len(),
        "{test}: a message stored twice"
    );
    assert_eq!(stats.queued, stored.len() as u64, "{test}: {stats:?}");
    let missing: Vec<usize> = reported
        .iter()
        .copied()
        .filter(|index| !distinct.contains(index))
        .collect();
    assert!(
        missing.is_empty(),
        "{test}: {} enqueues answered Ok are gone after the SIGKILL: {missing:?}",
        missing.len()
    );
    // Besides those: at most the one in flight when the child died, committed but not
    // reported yet.
    let extra: Vec<usize> = distinct
        .iter()
        .copied()
        .filter(|index| *index >= reported.len())
        .collect();
    assert!(
        extra.is_empty() || extra == [reported.len()],
        "{test}: stored but never enqueued: {extra:?}"
    );
    eprintln!(
        "{test}: killed after {reported_before_kill} reports; {} reported, {} stored, in {:?}",
        reported.len(),
        stored.len(),
        started.elapsed()
    );
}

#[test]
fn every_enqueue_that_returned_ok_survives_a_sigkill_on_sqlite() {
    let test = "every_enqueue_that_returned_ok_survives_a_sigkill_on_sqlite";
    let _heavy = heavy();
    let scratch = Scratch::new(test);
    enqueues_survive_a_sigkill(test, &scratch.db());
}

#[test]
fn every_enqueue_that_returned_ok_survives_a_sigkill_on_postgres() {
    let test = "every_enqueue_that_returned_ok_survives_a_sigkill_on_postgres";
    let _heavy = heavy();
    let Some(postgres) = PostgresServer::start(test) else {
        return;
    };
    enqueues_survive_a_sigkill(test, &postgres.url());
}

// ---------------------------------------------------------------------------------------
// Worker processes.

/// Worker children, SIGKILLed when dropped (a failing test leaves none behind).
struct Workers {
    db: String,
    smtp_port: u16,
    lease: Option<Duration>,
    at_most_once: bool,
    send_delay: Option<Duration>,
    max_age: Option<Duration>,
    once: bool,
    /// The poll of children that run (`Worker::run`) rather than drain.
    run_poll: Option<Duration>,
    /// Whether each child's first send is refused for now.
    fail_first: bool,
    /// How far ahead of the machine's the children's clock runs (`faketime -f`'s offset).
    clock_ahead: Option<&'static str>,
    /// Each running child and when it started.
    running: Vec<(Child, Instant)>,
}

impl Workers {
    fn new(db: &str, smtp_port: u16) -> Workers {
        Workers {
            db: db.to_owned(),
            smtp_port,
            lease: None,
            at_most_once: false,
            send_delay: None,
            max_age: None,
            once: false,
            run_poll: None,
            fail_first: false,
            clock_ahead: None,
            running: Vec::new(),
        }
    }

    fn spawn(&mut self) {
        let mut command = match self.clock_ahead {
            Some(offset) => {
                let mut faked = Command::new("faketime");
                faked
                    .args(["-f", offset])
                    .arg(std::env::current_exe().expect("the test binary's path"))
                    .args(["--exact", WORKER_CHILD, "--nocapture", "--test-threads=1"])
                    .stdin(Stdio::null());
                faked
            }
            None => child_command(WORKER_CHILD),
        };
        command
            .env(WORKER_DB, &self.db)
            .env(WORKER_SMTP_PORT, self.smtp_port.to_string())
            // The test harness's own lines are noise; the worker's errors go to stderr.
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(lease) = self.lease {
            command.env(WORKER_LEASE_MS, lease.as_millis().to_string());
        }
        if self.at_most_once {
            command.env(WORKER_AT_MOST_ONCE, "1");
        }
        if let Some(delay) = self.send_delay {
            command.env(WORKER_SEND_DELAY_MS, delay.as_millis().to_string());
        }
        if let Some(max_age) = self.max_age {
            command.env(WORKER_MAX_AGE_MS, max_age.as_millis().to_string());
        }
        if self.once {
            command.env(WORKER_ONCE, "1");
        }
        if let Some(poll) = self.run_poll {
            command.env(WORKER_RUN_POLL_MS, poll.as_millis().to_string());
        }
        if self.fail_first {
            command.env(WORKER_FAIL_FIRST, "1");
        }
        let child = command.spawn().expect("spawning a worker child");
        self.running.push((child, Instant::now()));
    }

    /// Reaps the children that exited; each must have exited successfully.
    fn reap(&mut self, test: &str) {
        let mut index = 0;
        while index < self.running.len() {
            match self.running[index]
                .0
                .try_wait()
                .expect("polling a worker child")
            {
                Some(status) => {
                    assert!(status.success(), "{test}: a worker child failed: {status}");
                    self.running.swap_remove(index);
                }
                None => index += 1,
            }
        }
    }

    /// SIGKILLs a random child that has run at least `min_age`; whether there was one.
    fn kill_one(&mut self, min_age: Duration) -> bool {
        let old: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].1.elapsed() >= min_age)
            .collect();
        if old.is_empty() {
            return false;
        }
        let (mut child, _) = self.running.swap_remove(old[fastrand::usize(..old.len())]);
        child.kill().expect("SIGKILL a worker child");
        let status = child.wait().expect("waiting for a killed worker child");
        // It may have exited on its own a moment before (nothing was queued any more).
        status.signal() == Some(9)
    }

    /// Waits until every child has exited successfully.
    fn wait_all(&mut self, test: &str) {
        let deadline = Instant::now() + CHILD_DEADLINE;
        loop {
            self.reap(test);
            if self.running.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{test}: {} worker children still running after {CHILD_DEADLINE:?}",
                self.running.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (child, _) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Enqueues `MESSAGES` numbered messages in batches of 1,000; their ids, by index.
fn enqueue_all(runtime: &tokio::runtime::Runtime, outbox: &Outbox) -> Vec<OutboxId> {
    enqueue_first(runtime, outbox, MESSAGES)
}

/// Enqueues the first `count` numbered messages in batches of 1,000; their ids, by index.
fn enqueue_first(
    runtime: &tokio::runtime::Runtime,
    outbox: &Outbox,
    count: usize,
) -> Vec<OutboxId> {
    runtime.block_on(async {
        let mut ids = Vec::with_capacity(count);
        for start in (0..count).step_by(1_000) {
            let batch: Vec<Message> = (start..(start + 1_000).min(count)).map(numbered).collect();
            ids.extend(
                outbox
                    .enqueue_many(&batch)
                    .await
                    .expect("enqueueing a batch"),
            );
        }
        ids
    })
}

/// What smtp-sink received: how many complete copies of each of our messages, and the dumps
/// that are not a complete message of ours.
#[derive(Debug, Default)]
struct Received {
    /// How many messages were enqueued: indices 0 to `count - 1`.
    count: usize,
    copies: BTreeMap<usize, usize>,
    incomplete: usize,
    foreign: usize,
}

impl Received {
    fn read(sink: &SmtpSink) -> Received {
        Received::read_first(sink, MESSAGES)
    }

    /// What the sink holds of the first `count` messages.
    fn read_first(sink: &SmtpSink, count: usize) -> Received {
        let mut received = Received {
            count,
            ..Received::default()
        };
        for dump in sink.received_dumps() {
            // smtp-sink ends a dump with an empty line once it has read the final `.`.
            if !dump.ends_with("\n\n") {
                received.incomplete += 1;
                continue;
            }
            match message_index(&dump) {
                Some(index) if index < count => *received.copies.entry(index).or_default() += 1,
                _ => received.foreign += 1,
            }
        }
        received
    }

    fn missing(&self) -> Vec<usize> {
        (0..self.count)
            .filter(|index| !self.copies.contains_key(index))
            .collect()
    }

    /// Fails `test` unless every message arrived whole exactly once, and nothing else did.
    fn assert_each_once(&self, test: &str) {
        let missing = self.missing();
        let duplicated = self.duplicated();
        assert!(
            missing.is_empty(),
            "{test}: {} never received, e.g. {}",
            missing.len(),
            first(&missing, 20)
        );
        assert!(
            duplicated.is_empty(),
            "{test}: {} received more than once, e.g. {}",
            duplicated.len(),
            first(&duplicated, 20)
        );
        assert_eq!(self.copies.len(), self.count, "{test}");
        assert_eq!((self.incomplete, self.foreign), (0, 0), "{test}");
    }

    /// Copies beyond the first of each message.
    fn duplicates(&self) -> usize {
        self.copies.values().map(|copies| copies - 1).sum()
    }

    fn duplicated(&self) -> Vec<usize> {
        let twice = self.copies.iter().filter(|(_, copies)| **copies > 1);
        twice.map(|(index, _)| *index).collect()
    }
}

/// The first `limit` items of `list`, for a failure message.
fn first<T: std::fmt::Debug>(list: &[T], limit: usize) -> String {
    format!("{:?}", &list[..list.len().min(limit)])
}

#[test]
fn three_worker_processes_on_postgres_send_every_message_exactly_once() {
    let test = "three_worker_processes_on_postgres_send_every_message_exactly_once";
    let _heavy = heavy();
    let Some(postgres) = PostgresServer::start(test) else {
        return;
    };
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let started = Instant::now();
    let runtime = runtime();
    let outbox = runtime
        .block_on(Outbox::postgres(&postgres.url()))
        .expect("opening the outbox");
    enqueue_all(&runtime, &outbox);
    let enqueued = started.elapsed();

    let mut workers = Workers::new(&postgres.url(), sink.port());
    for _ in 0..3 {
        workers.spawn();
    }
    workers.wait_all(test);
    let sent = started.elapsed() - enqueued;

    let stats = runtime.block_on(outbox.stats()).expect("stats");
    assert_eq!((stats.queued, stats.dead), (0, 0), "{test}: {stats:?}");
    Received::read(&sink).assert_each_once(test);
    eprintln!(
        "{test}: enqueued {MESSAGES} in {enqueued:?}, 3 workers sent them in {sent:?}, {:?} in all",
        started.elapsed()
    );
}

#[test]
fn three_worker_processes_on_postgres_whose_sends_take_six_tenths_of_the_lease_send_each_message_once()
 {
    // A message claimed ahead of its send waits while the sends before it take most of the
    // lease: its lease is renewed (or it is given back) before it runs out, so no other
    // worker takes it meanwhile.
    const COUNT: usize = 2_000;
    let test = "three_worker_processes_on_postgres_whose_sends_take_six_tenths_of_the_lease";
    let _heavy = heavy();
    let Some(postgres) = PostgresServer::start(test) else {
        return;
    };
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let runtime = runtime();
    let outbox = runtime
        .block_on(Outbox::postgres(&postgres.url()))
        .expect("opening the outbox");
    enqueue_first(&runtime, &outbox, COUNT);
    // Sends of 600 ms against a send timeout of 750 ms: room for the SMTP exchange itself.
    let lease = Duration::from_secs(1);
    let mut workers = Workers::new(&postgres.url(), sink.port());
    workers.lease = Some(lease);
    workers.send_delay = Some(lease * 6 / 10);
    for _ in 0..3 {
        workers.spawn();
    }
    workers.wait_all(test);

    let stats = runtime.block_on(outbox.stats()).expect("stats");
    assert_eq!((stats.queued, stats.dead), (0, 0), "{test}: {stats:?}");
    Received::read_first(&sink, COUNT).assert_each_once(test);
}

#[test]
fn a_worker_whose_clock_runs_an_hour_ahead_of_postgres_counts_max_age_from_when_mail_was_queued() {
    // Leases, due times and ages are the database's: a worker on a machine whose clock is
    // an hour fast must not take mail queued a moment ago for mail an hour old.
    let test = "a_worker_whose_clock_runs_an_hour_ahead_of_postgres";
    let _heavy = heavy();
    if support::servers::require_program("faketime", test).is_none() {
        return;
    }
    let Some(postgres) = PostgresServer::start(test) else {
        return;
    };
    // Every recipient refused for now (451): the message fails and is kept to try again.
    let Some(sink) = SmtpSink::start(test, &["-r", "RCPT"]) else {
        return;
    };
    let runtime = runtime();
    let outbox = runtime
        .block_on(Outbox::postgres(&postgres.url()))
        .expect("opening the outbox");
    let ids = enqueue_first(&runtime, &outbox, 1);
    let mut workers = Workers::new(&postgres.url(), sink.port());
    workers.max_age = Some(Duration::from_secs(30 * 60));
    workers.once = true;
    workers.clock_ahead = Some("+1h");
    workers.spawn();
    workers.wait_all(test);

    let stats = runtime.block_on(outbox.stats()).expect("stats");
    assert_eq!(
        (stats.queued, stats.dead),
        (1, 0),
        "{test}: tried once and kept, not dead as expired: {stats:?}"
    );
    let message = runtime
        .block_on(outbox.message(ids[0]))
        .expect("read")
        .expect("kept");
    assert_eq!(message.attempts, 1, "{test}: {message:?}");
}

#[test]
fn a_worker_whose_clock_runs_an_hour_behind_postgres_wakes_for_a_retry_when_it_is_due() {
    // Due times are the database's, and a resting worker's wait for the next one is counted
    // on the database's clock: a worker an hour slow must not take a retry due in a moment
    // for one due in an hour, and sleep its whole poll.
    let test = "a_worker_whose_clock_runs_an_hour_behind_postgres_wakes_for_a_retry";
    let _heavy = heavy();
    if support::servers::require_program("faketime", test).is_none() {
        return;
    }
    let Some(postgres) = PostgresServer::start(test) else {
        return;
    };
    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let runtime = runtime();
    let outbox = runtime
        .block_on(Outbox::postgres(&postgres.url()))
        .expect("opening the outbox");
    enqueue_first(&runtime, &outbox, 1);
    // The first send is refused for now; the retry is due a backoff (at most 1 s) later,
    // the poll a minute later.
    let poll = Duration::from_secs(60);
    let mut workers = Workers::new(&postgres.url(), sink.port());
    workers.run_poll = Some(poll);
    workers.fail_first = true;
    workers.clock_ahead = Some("-1h");
    let started = Instant::now();
    workers.spawn();
    workers.wait_all(test);

    let took = started.elapsed();
    assert!(
        took < poll / 2,
        "{test}: the retry went out after {took:?}, as if the worker slept its poll ({poll:?})"
    );
    Received::read_first(&sink, 1).assert_each_once(test);
}

/// What became of the messages when worker children were SIGKILLed and replaced.
struct AfterKills {
    received: Received,
    /// The indices of the dead letters, and their error codes.
    dead: Vec<(usize, String)>,
    kills: usize,
}

/// Enqueues `MESSAGES` on PostgreSQL and sends them to smtp-sink through worker children
/// (lease 2 s), `RUNNING` at a time, of which `KILLS` are SIGKILLed at random moments of the
/// sending (each replaced at once); returns once the rest have emptied the queue.
fn send_while_killing_workers(test: &str, at_most_once: bool) -> Option<AfterKills> {
    let postgres = PostgresServer::start(test)?;
    let sink = SmtpSink::start_counting(test, &[])?;
    let started = Instant::now();
    let runtime = runtime();
    let outbox = runtime
        .block_on(Outbox::postgres(&postgres.url()))
        .expect("opening the outbox");
    let ids = enqueue_all(&runtime, &outbox);
    let index_of: BTreeMap<OutboxId, usize> =
        ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();

    let mut workers = Workers::new(&postgres.url(), sink.port());
    // Well above a send to a local smtp-sink, even on a loaded CI machine: a live worker
    // whose send outlasted its lease would add duplicates or dead letters beyond the bound.
    workers.lease = Some(Duration::from_secs(2));
    workers.at_most_once = at_most_once;
    for _ in 0..RUNNING {
        workers.spawn();
    }
    // A kill each time smtp-sink has seen another random share of the messages.
    let mut kill_at: Vec<usize> = (0..KILLS)
        .map(|_| fastrand::usize(MESSAGES / 20..MESSAGES * 4 / 5))
        .collect();
    kill_at.sort_unstable();
    let mut kills = 0;
    let deadline = Instant::now() + CHILD_DEADLINE;
    while kills < KILLS {
        assert!(
            Instant::now() < deadline,
            "{test}: {kills} kills in {CHILD_DEADLINE:?}"
        );
        workers.reap(test);
        if workers.running.is_empty() {
            break; // everything was sent before all the kills
        }
        if sink.received() >= kill_at[kills] {
            // A child just started may not have claimed anything yet.
            if workers.kill_one(Duration::from_millis(300)) {
                kills += 1;
            }
            while workers.running.len() < RUNNING {
                workers.spawn();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    workers.wait_all(test);
    eprintln!(
        "{test}: {kills} kills at {kill_at:?} messages seen; sent in {:?}",
        started.elapsed()
    );

    let stats = runtime.block_on(outbox.stats()).expect("stats");
    assert_eq!(stats.queued, 0, "{test}: {stats:?}");
    let dead = runtime
        .block_on(outbox.dead_letters(MESSAGES as u32))
        .expect("reading the dead letters");
    assert_eq!(stats.dead, dead.len() as u64, "{test}: {stats:?}");
    // Shown with a failure: why they died (a killed worker's lease, or a live one's send that
    // timed out, read the same code).
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    for letter in &dead {
        *why.entry(letter.error.to_string()).or_default() += 1;
    }
    eprintln!("{test}: dead letters by their error: {why:#?}");
    let dead = dead
        .iter()
        .map(|letter| {
            let index = index_of.get(&letter.id).expect("a dead letter we enqueued");
            (*index, letter.error.code().to_owned())
        })
        .collect();
    Some(AfterKills {
        received: Received::read(&sink),
        dead,
        kills,
    })
}

#[test]
fn killed_workers_lose_no_message_and_duplicate_only_expired_leases() {
    let test = "killed_workers_lose_no_message_and_duplicate_only_expired_leases";
    let _heavy = heavy();
    let started = Instant::now();
    let Some(after) = send_while_killing_workers(test, false) else {
        return;
    };
    assert_eq!(after.kills, KILLS, "{test}: the workers finished first");
    assert!(
        after.dead.is_empty(),
        "{test}: dead letters: {:?}",
        after.dead
    );
    let received = &after.received;
    let missing = received.missing();
    assert!(
        missing.is_empty(),
        "{test}: {} never received, e.g. {}",
        missing.len(),
        first(&missing, 20)
    );
    assert_eq!(received.foreign, 0, "{test}");
    // Only what a killed worker held (at most CONCURRENCY each) can have been sent twice.
    let duplicates = received.duplicates();
    assert!(
        duplicates <= KILLS * CONCURRENCY,
        "{test}: {duplicates} duplicates after {KILLS} kills of workers sending {CONCURRENCY} at once: {}",
        first(&received.duplicated(), 100)
    );
    eprintln!(
        "{test}: {} received, {duplicates} duplicates, {} incomplete dumps, in {:?}",
        received.copies.len(),
        received.incomplete,
        started.elapsed()
    );
}

#[test]
fn with_at_most_once_killed_workers_duplicate_nothing_and_dead_letter_what_they_held() {
    let test = "with_at_most_once_killed_workers_duplicate_nothing_and_dead_letter_what_they_held";
    let _heavy = heavy();
    let started = Instant::now();
    let Some(after) = send_while_killing_workers(test, true) else {
        return;
    };
    assert_eq!(after.kills, KILLS, "{test}: the workers finished first");
    let received = &after.received;
    assert_eq!(received.foreign, 0, "{test}");
    let duplicated = received.duplicated();
    assert!(
        duplicated.is_empty(),
        "{test}: {} sent twice under at_most_once: {}",
        duplicated.len(),
        first(&duplicated, 20)
    );
    let wrong: Vec<_> = after
        .dead
        .iter()
        .filter(|(_, code)| code != "outbox.maybe_delivered")
        .collect();
    assert!(
        wrong.is_empty(),
        "{test}: dead for another reason: {wrong:?}"
    );
    // Every message was received or is a dead letter ...
    let dead: BTreeSet<usize> = after.dead.iter().map(|(index, _)| *index).collect();
    assert_eq!(dead.len(), after.dead.len(), "{test}: a message dead twice");
    let lost: Vec<usize> = (0..MESSAGES)
        .filter(|index| !received.copies.contains_key(index) && !dead.contains(index))
        .collect();
    assert!(
        lost.is_empty(),
        "{test}: {} neither received nor dead: {}",
        lost.len(),
        first(&lost, 20)
    );
    // ... and only what the killed workers held is dead: some of it they had sent before
    // they died (received and dead: "maybe delivered" indeed), the rest never reached
    // smtp-sink. Under at_most_once a worker holds at most CONCURRENCY leases, counting the
    // answers it has not written yet: it claims nothing it cannot start at once.
    let both = dead
        .iter()
        .filter(|index| received.copies.contains_key(index))
        .count();
    assert!(
        dead.len() <= KILLS * CONCURRENCY,
        "{test}: {} dead letters after {KILLS} kills of workers sending {CONCURRENCY} at once \
         ({both} of them received too): {}",
        dead.len(),
        first(&dead.iter().copied().collect::<Vec<_>>(), 100)
    );
    assert_eq!(received.copies.len() + dead.len() - both, MESSAGES);
    eprintln!(
        "{test}: {} received, {} dead ({both} of them received too: sent before the kill), \
         {} incomplete dumps, in {:?}",
        received.copies.len(),
        dead.len(),
        received.incomplete,
        started.elapsed()
    );
}
