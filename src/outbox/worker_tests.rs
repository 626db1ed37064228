//! The worker's rules that only its inside shows: how much it claims, when a pause ends, and
//! how often it touches the database (counted by a backend that wraps SQLite's).

use std::sync::atomic::{AtomicUsize, Ordering};

use lettre::Message;

use super::*;
use crate::outbox::backend::{Backend, Bytes};
use crate::outbox::record::{DeadRow, NewRow};
use crate::outbox::{Kind, OutboxId, OutboxStats};

#[test]
fn a_worker_reads_the_counts_for_its_gauges_at_once_then_once_a_second() {
    let now = Instant::now();
    let metrics = crate::metrics::ENABLED;
    let quick = Some((now, Duration::from_millis(2)));
    assert_eq!(stats_due(None, now), metrics);
    assert!(!stats_due(quick, now));
    assert!(!stats_due(
        quick,
        now + STATS_EVERY - Duration::from_millis(1)
    ));
    assert_eq!(stats_due(quick, now + STATS_EVERY), metrics);
}

#[test]
fn counts_that_took_long_to_read_are_read_again_only_after_twenty_times_as_long() {
    let now = Instant::now();
    let metrics = crate::metrics::ENABLED;
    // A backlog whose count took 200 ms: read every 4 s, not every second.
    let slow = Some((now, Duration::from_millis(200)));
    assert!(!stats_due(slow, now + Duration::from_millis(3_999)));
    assert_eq!(stats_due(slow, now + Duration::from_secs(4)), metrics);
    // However long the last one took, working out the wait does not overflow.
    let endless = Some((now, Duration::MAX));
    assert!(!stats_due(endless, now + Duration::from_secs(3_600)));
}

/// A flight with `sends` in flight (never answering) and `ready` claimed and not started.
fn flight(sends: usize, ready: usize) -> Flight {
    let mut flight = Flight::default();
    for _ in 0..sends {
        flight.sends.push(std::future::pending::<Answer>().boxed());
    }
    for id in 0..ready {
        flight.ready.push_back(Held {
            message: Claimed {
                claim: Claim {
                    id: OutboxId(id as i64),
                    attempts: 1,
                },
                enqueued_at: 0,
                lease_lost: false,
                panics: 0,
                key: None,
                sender: None,
                recipients: String::new(),
                raw: Vec::new(),
            },
            lease_end: Instant::now() + Duration::from_secs(60),
        });
    }
    flight
}

fn wanted(flight: &Flight, concurrency: usize, prefetch: usize) -> u32 {
    flight
        .wanted(concurrency, prefetch)
        .map_or(0, NonZeroU32::get)
}

#[test]
fn a_flight_holding_nothing_claims_what_fills_its_sends_and_its_prefetch() {
    assert_eq!(wanted(&flight(0, 0), 4, 16), 20);
}

#[test]
fn a_flight_more_than_half_full_claims_nothing_until_half_is_free() {
    assert_eq!(wanted(&flight(4, 7), 4, 16), 0, "9 of 20 free");
    assert_eq!(wanted(&flight(4, 6), 4, 16), 10, "10 of 20 free");
    assert_eq!(wanted(&flight(4, 16), 4, 16), 0, "full");
}

#[test]
fn a_starving_flight_claims_for_its_empty_sends_though_less_than_half_is_free() {
    assert_eq!(wanted(&flight(3, 0), 4, 0), 1);
}

#[test]
fn a_flight_with_a_message_ready_is_not_starving() {
    assert_eq!(wanted(&flight(2, 1), 4, 0), 0);
}

#[test]
fn a_flight_whose_sends_are_all_in_flight_is_not_starving() {
    assert_eq!(wanted(&flight(4, 0), 4, 2), 0, "2 of 6 free");
}

#[test]
fn a_probing_flight_claims_one_message_and_no_more_while_it_is_out() {
    let mut probing = flight(0, 0);
    probing.probing = true;
    assert_eq!(wanted(&probing, 4, 16), 1);
    probing.sends.push(std::future::pending::<Answer>().boxed());
    assert_eq!(wanted(&probing, 4, 16), 0);
}

#[test]
fn answers_not_yet_written_count_as_held_so_a_flight_whose_slots_they_fill_claims_nothing() {
    // Their leases are still the worker's: a claim beside them would wait unsent, which
    // `at_most_once` (no prefetch) forbids.
    let mut flight = flight(0, 0);
    flight.writing = 3;
    flight.answers.push((
        Claim {
            id: OutboxId(1),
            attempts: 1,
        },
        Finish::Sent,
    ));
    assert_eq!(
        wanted(&flight, 4, 0),
        0,
        "4 of 4 held: 3 being written, 1 to write"
    );
    assert_eq!(wanted(&flight, 4, 2), 2, "the prefetch above them");
    flight.writing = 1;
    assert_eq!(wanted(&flight, 4, 0), 2, "2 of 4 free");
}

#[test]
fn a_pause_lasts_until_its_instant_and_no_longer() {
    let end = Instant::now() + Duration::from_secs(1);
    let mut flight = flight(0, 0);
    assert_eq!(flight.pause(end), None, "no pause asked for");
    flight.paused_until = Some(end);
    assert_eq!(flight.pause(end - Duration::from_millis(1)), Some(end));
    assert!(flight.paused(end - Duration::from_millis(1)));
    assert_eq!(flight.pause(end), None);
    assert!(!flight.paused(end));
    assert_eq!(flight.pause(end + Duration::from_millis(1)), None);
}

/// SQLite's backend, counting the claims and the reads of the next due time.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Backend>,
    claims: AtomicUsize,
    next_dues: AtomicUsize,
    finishes: AtomicUsize,
    renewals: AtomicUsize,
    /// When the last claim was asked for.
    last_claim: std::sync::Mutex<Option<std::time::Instant>>,
    /// How long every claim after the first takes, in ms (0 unless a test slows them).
    later_claims_take_ms: std::sync::atomic::AtomicU64,
    /// How many renewals from now on the database refuses (0 unless a test says).
    renewals_to_refuse: AtomicUsize,
    /// How long every write of answers takes, in ms (0 unless a test slows them).
    finishes_take_ms: std::sync::atomic::AtomicU64,
    /// Messages claimed and not yet answered in the database (claims less the outcomes
    /// written), and the most there ever were.
    leased: std::sync::Mutex<(usize, usize)>,
    /// The folder of the database file, removed when the last handle is dropped (after
    /// `inner`, declared before it).
    _folder: tempfile::TempDir,
}

#[async_trait::async_trait]
impl Backend for Counting {
    async fn enqueue(&self, rows: &[NewRow], now: Millis) -> Result<Vec<OutboxId>, SendError> {
        self.inner.enqueue(rows, now).await
    }
    async fn keep_split(
        &self,
        queued: &[NewRow],
        dead: &[(NewRow, StoredError)],
        now: Millis,
    ) -> Result<(), SendError> {
        self.inner.keep_split(queued, dead, now).await
    }
    async fn claim(
        &self,
        now: Millis,
        lease: Duration,
        limit: u32,
        bytes: Bytes,
        durable: bool,
    ) -> Result<Vec<Claimed>, SendError> {
        let earlier = self.claims.fetch_add(1, Ordering::SeqCst);
        *self.last_claim.lock().expect("unpoisoned") = Some(std::time::Instant::now());
        if earlier > 0 {
            let takes = self.later_claims_take_ms.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(takes)).await;
        }
        let claimed = self.inner.claim(now, lease, limit, bytes, durable).await?;
        let mut leased = self.leased.lock().expect("unpoisoned");
        leased.0 += claimed.len();
        leased.1 = leased.1.max(leased.0);
        Ok(claimed)
    }
    async fn renew(
        &self,
        claims: &[Claim],
        now: Millis,
        lease: Duration,
        durable: bool,
    ) -> Result<Vec<Claim>, SendError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        let refused = self
            .renewals_to_refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if refused {
            return Err(crate::outbox::record::database_error(
                "renewing leases",
                sqlx::Error::PoolTimedOut,
            ));
        }
        self.inner.renew(claims, now, lease, durable).await
    }

    async fn finish(&self, outcomes: &[(Claim, Finish)]) -> Result<(), SendError> {
        self.finishes.fetch_add(1, Ordering::SeqCst);
        let takes = self.finishes_take_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(takes)).await;
        self.inner.finish(outcomes).await?;
        let mut leased = self.leased.lock().expect("unpoisoned");
        leased.0 = leased.0.saturating_sub(outcomes.len());
        Ok(())
    }
    async fn next_due(&self, now: Millis) -> Result<Option<Millis>, SendError> {
        self.next_dues.fetch_add(1, Ordering::SeqCst);
        self.inner.next_due(now).await
    }
    async fn stats(&self, now: Millis) -> Result<OutboxStats, SendError> {
        self.inner.stats(now).await
    }
    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadRow>, SendError> {
        self.inner.dead_letters(limit).await
    }
    async fn dead_letters_page(
        &self,
        before: Option<OutboxId>,
        limit: u32,
    ) -> Result<Vec<DeadRow>, SendError> {
        self.inner.dead_letters_page(before, limit).await
    }
    async fn requeue(&self, id: OutboxId, now: Millis) -> Result<bool, SendError> {
        self.inner.requeue(id, now).await
    }
    async fn purge(&self, id: OutboxId) -> Result<bool, SendError> {
        self.inner.purge(id).await
    }
    async fn purge_dead(&self, id: OutboxId) -> Result<bool, SendError> {
        self.inner.purge_dead(id).await
    }
    async fn message(
        &self,
        id: OutboxId,
    ) -> Result<Option<crate::outbox::inspect::MessageRow>, SendError> {
        self.inner.message(id).await
    }
}

/// An outbox in a fresh SQLite file, and the counts of what its workers ask of it.
async fn counted_outbox(name: &str) -> (Outbox, Arc<Counting>) {
    let folder = tempfile::Builder::new()
        .prefix(&format!("mail-breaker-worker-{name}-"))
        .tempdir()
        .expect("a temporary directory");
    let sqlite = crate::outbox::sqlite::SqliteBackend::open(
        &folder.path().join("outbox.db"),
        &crate::outbox::OutboxOptions::new(),
    )
    .await
    .expect("an SQLite outbox");
    let counting = Arc::new(Counting {
        inner: Arc::new(sqlite),
        claims: AtomicUsize::new(0),
        next_dues: AtomicUsize::new(0),
        finishes: AtomicUsize::new(0),
        renewals: AtomicUsize::new(0),
        last_claim: std::sync::Mutex::default(),
        later_claims_take_ms: std::sync::atomic::AtomicU64::new(0),
        renewals_to_refuse: AtomicUsize::new(0),
        finishes_take_ms: std::sync::atomic::AtomicU64::new(0),
        leased: std::sync::Mutex::default(),
        _folder: folder,
    });
    let backend: Arc<dyn Backend> = counting.clone();
    (Outbox::with(backend, Kind::Sqlite), counting)
}

fn messages(count: usize) -> Vec<Message> {
    (0..count)
        .map(|i| {
            Message::builder()
                .from("app@example.com".parse().expect("a sender"))
                .to("user@example.org".parse().expect("a recipient"))
                .subject(format!("message {i}"))
                .body(format!("message {i}"))
                .expect("a message")
        })
        .collect()
}

/// Answers every send with a clone of one answer, after a delay, counting the sends.
struct Answering {
    answer: Result<Receipt, SendError>,
    delay: Duration,
    sends: AtomicUsize,
    /// When the last answer was given.
    last_answer: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Answering {
    fn new(answer: Result<Receipt, SendError>, delay: Duration) -> Arc<Answering> {
        Arc::new(Answering {
            answer,
            delay,
            sends: AtomicUsize::new(0),
            last_answer: std::sync::Mutex::default(),
        })
    }
}

#[async_trait::async_trait]
impl Transport for Answering {
    fn name(&self) -> &str {
        "answering"
    }
    async fn send_raw(
        &self,
        _envelope: &lettre::address::Envelope,
        _raw: &[u8],
    ) -> Result<Receipt, SendError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        *self.last_answer.lock().expect("unpoisoned") = Some(std::time::Instant::now());
        self.answer.clone()
    }
}

/// Runs `worker` in a task of its own until the `Notify` it gives back is notified.
fn spawn_until_stopped<T: Transport + 'static>(
    worker: Worker<T>,
) -> (
    Arc<tokio::sync::Notify>,
    tokio::task::JoinHandle<Result<(), SendError>>,
) {
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = Arc::clone(&stop);
    let running =
        tokio::spawn(async move { worker.run(async move { stopped.notified().await }).await });
    (stop, running)
}

/// Runs `worker` for `period`, then stops it.
async fn run_for<T: Transport + 'static>(worker: Worker<T>, period: Duration) {
    let running = tokio::spawn(async move { worker.run(tokio::time::sleep(period)).await });
    running.await.expect("the worker ran").expect("no error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ends_only_after_a_claim_made_with_nothing_held_finds_nothing_due() {
    let (outbox, counts) = counted_outbox("drain-ends-idle").await;
    outbox.enqueue_many(&messages(5)).await.expect("enqueued");
    // One in flight and four ahead: the first claim takes all five. The next, made with
    // sends in flight, answers only after they are all answered: it may have missed what
    // their answers made due (a failure due again at once), so the drain claims once more.
    counts.later_claims_take_ms.store(200, Ordering::SeqCst);
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::ZERO);
    outbox
        .worker(Arc::clone(&provider))
        .concurrency(1)
        .drain()
        .await
        .expect("drained");
    assert_eq!(provider.sends.load(Ordering::SeqCst), 5);
    let last_claim = counts
        .last_claim
        .lock()
        .expect("unpoisoned")
        .expect("claims");
    let last_answer = provider
        .last_answer
        .lock()
        .expect("unpoisoned")
        .expect("answers");
    assert!(
        last_claim > last_answer,
        "the drain's last claim was made while sends were in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_database_refused_keeps_the_held_messages_and_the_worker_stops_when_asked() {
    let (outbox, counts) = counted_outbox("renewal-refused").await;
    outbox.enqueue_many(&messages(4)).await.expect("enqueued");
    counts.renewals_to_refuse.store(1, Ordering::SeqCst);
    // One send at a time, each 600 ms of a 1 s lease: the messages held ahead need their
    // leases renewed before they start, and the first renewal is refused.
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::from_millis(600));
    let worker = outbox
        .worker(Arc::clone(&provider))
        .concurrency(1)
        .lease(Duration::from_secs(1))
        .shutdown_timeout(Duration::from_secs(30));
    let (stop, running) = spawn_until_stopped(worker);
    until_sent(&outbox, "the held messages were never sent").await;
    stop.notify_one();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the worker stops when asked, holding nothing")
        .expect("the worker ran")
        .expect("no error");
    assert_eq!(
        counts.renewals_to_refuse.load(Ordering::SeqCst),
        0,
        "one was refused"
    );
    assert_eq!(provider.sends.load(Ordering::SeqCst), 4, "each sent once");
}

/// Waits until `outbox` holds nothing queued, failing with `why` after 20 s.
async fn until_sent(outbox: &Outbox, why: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while outbox.stats().await.expect("stats").queued > 0 {
        assert!(std::time::Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_late_claim_brought_with_their_leases_short_are_renewed_then_sent() {
    let (outbox, counts) = counted_outbox("late-claim").await;
    // Every claim after the worker's first (which finds nothing) answers 400 ms after it
    // was sent: its messages come with 600 ms of a 1 s lease left, under the 750 ms a send
    // needs, while every send slot is free.
    counts.later_claims_take_ms.store(400, Ordering::SeqCst);
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::ZERO);
    let worker = outbox
        .worker(Arc::clone(&provider))
        .concurrency(1)
        .lease(Duration::from_secs(1));
    let (stop, running) = spawn_until_stopped(worker);
    while counts.claims.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    outbox.enqueue_many(&messages(2)).await.expect("enqueued");
    until_sent(&outbox, "messages held with short leases were never sent").await;
    stop.notify_one();
    running.await.expect("the worker ran").expect("no error");
    assert!(counts.renewals.load(Ordering::SeqCst) >= 1, "renewed first");
    assert_eq!(provider.sends.load(Ordering::SeqCst), 2, "each sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_every_send_slot_is_busy_renews_no_lease_until_one_is_free() {
    let (outbox, counts) = counted_outbox("busy-renews-later").await;
    outbox.enqueue_many(&messages(2)).await.expect("enqueued");
    // One send at a time, each 600 ms, and a send needs 900 ms of a 1 s lease: the second
    // message's lease is short 100 ms after the claim, but it cannot start before the first
    // is answered. It is renewed then, once, not each time the worker wakes while it waits.
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::from_millis(600));
    let worker = outbox
        .worker(Arc::clone(&provider))
        .concurrency(1)
        .lease(Duration::from_secs(1))
        .send_timeout(Duration::from_millis(900));
    let (stop, running) = spawn_until_stopped(worker);
    while provider.sends.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Wakes, as an enqueue elsewhere would, while the first send is under way.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        outbox.enqueued().notify_waiters();
    }
    until_sent(&outbox, "the two messages were never sent").await;
    stop.notify_one();
    running.await.expect("the worker ran").expect("no error");
    assert_eq!(provider.sends.load(Ordering::SeqCst), 2, "each sent once");
    assert_eq!(counts.renewals.load(Ordering::SeqCst), 1, "one renewal");
}

#[test]
fn a_renewal_that_lost_leases_logs_how_many_and_one_that_lost_none_logs_nothing() {
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("unpoisoned").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let renew = |renewed: usize| {
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let mut held = flight(0, 3);
        let messages: Vec<Held> = held.ready.drain(..).collect();
        let claims: Vec<Claim> = messages.iter().map(|held| held.message.claim).collect();
        tracing::subscriber::with_default(subscriber, || {
            held.renewed(messages, &claims[..renewed], Instant::now());
        });
        assert_eq!(held.ready.len(), renewed, "the renewed are held again");
        let text = log.0.lock().expect("unpoisoned").clone();
        String::from_utf8(text).expect("text")
    };
    let lost_one = renew(2);
    assert!(
        lost_one.contains("outbox.leases_lost") && lost_one.contains("lost=1"),
        "{lost_one}"
    );
    let lost_none = renew(3);
    assert!(!lost_none.contains("outbox.leases_lost"), "{lost_none}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_at_rest_looks_for_work_once_per_poll() {
    let (outbox, counts) = counted_outbox("rest").await;
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::ZERO);
    let worker = outbox.worker(provider).poll(Duration::from_millis(100));
    run_for(worker, Duration::from_millis(550)).await;
    let claims = counts.claims.load(Ordering::SeqCst);
    assert!(
        (4..=7).contains(&claims),
        "one claim at the start, then one per 100 ms poll: {claims}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_sends_in_flight_never_reads_when_the_next_is_due() {
    let (outbox, counts) = counted_outbox("busy").await;
    outbox.enqueue_many(&messages(200)).await.expect("enqueued");
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::from_millis(1));
    let worker = outbox
        .worker(Arc::clone(&provider))
        .concurrency(4)
        .poll(Duration::from_secs(60));
    let (stop, running) = spawn_until_stopped(worker);
    while outbox.stats().await.expect("stats").queued > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.notify_one();
    running.await.expect("the worker ran").expect("no error");
    assert_eq!(provider.sends.load(Ordering::SeqCst), 200);
    let reads = counts.next_dues.load(Ordering::SeqCst);
    assert!(
        reads <= 1,
        "read once at rest after the queue ran out, never between sends: {reads}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_the_stack_refuses_tries_one_probe_per_pause_and_touches_the_database_only_then() {
    let (outbox, counts) = counted_outbox("paused").await;
    outbox.enqueue_many(&messages(10)).await.expect("enqueued");
    let open = SendError::new(
        Category::ServiceUnavailable,
        "breaker.open",
        "the circuit breaker is open",
    )
    .with_retry_after(Duration::from_millis(300))
    // As a breaker of the whole transport refuses: not sent, and every message held back.
    .not_attempted()
    .refusing_every_message();
    let stack = Answering::new(Err(open), Duration::ZERO);
    let worker = outbox
        .worker(Arc::clone(&stack))
        .concurrency(2)
        .poll(Duration::from_millis(20));
    // 1 s: the first 2 sends refused, then a probe at 300, 600 and 900 ms.
    run_for(worker, Duration::from_millis(1_000)).await;
    let tries = stack.sends.load(Ordering::SeqCst);
    assert!(
        (4..=6).contains(&tries),
        "2 at the start, then one probe per 300 ms pause: {tries}"
    );
    let claims = counts.claims.load(Ordering::SeqCst);
    assert!(
        claims <= 5,
        "the first claim, then one per probe, not one per 20 ms poll: {claims}"
    );
    let reads = counts.next_dues.load(Ordering::SeqCst);
    assert_eq!(
        reads, 0,
        "a pause's end is known without asking the database"
    );
}

/// Issue 62 review: a pool whose every member throttled (each answered 429 after a try) is
/// the whole stack asking to wait: the worker pauses for the soonest `retry_after`, one probe
/// per pause, instead of sending the whole queue through throttled providers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_every_member_throttled_pauses_the_worker_for_the_soonest_retry_after() {
    let (outbox, counts) = counted_outbox("throttled").await;
    outbox.enqueue_many(&messages(10)).await.expect("enqueued");
    let throttled = || {
        SendError::new(Category::RateLimited, "http.429", "slow down")
            .with_retry_after(Duration::from_millis(300))
    };
    let exhausted = SendError::new(
        Category::ServiceUnavailable,
        "pool.exhausted",
        "every member of the pool failed (2 tried)",
    )
    .with_retry_after(Duration::from_millis(300))
    .with_causes(vec![throttled(), throttled()]);
    let stack = Answering::new(Err(exhausted), Duration::ZERO);
    let worker = outbox
        .worker(Arc::clone(&stack))
        .concurrency(2)
        .backoff(crate::Backoff::constant(Duration::ZERO))
        .poll(Duration::from_millis(20));
    run_for(worker, Duration::from_millis(1_000)).await;
    let tries = stack.sends.load(Ordering::SeqCst);
    assert!(
        (4..=6).contains(&tries),
        "2 at the start, then one probe per 300 ms pause: {tries}"
    );
    let _ = counts;
}

/// Issue 62 review: a pool one of whose members failed otherwise (a 503 after its try) is
/// no pause of the whole stack: the failure moves that message alone.
#[test]
fn a_pool_exhausted_by_one_throttle_and_one_failure_does_not_pause_the_worker() {
    let exhausted = SendError::new(Category::ServiceUnavailable, "pool.exhausted", "both")
        .with_retry_after(Duration::from_millis(300))
        .with_causes(vec![
            SendError::new(Category::RateLimited, "http.429", "slow down")
                .with_retry_after(Duration::from_millis(300)),
            SendError::new(Category::ServiceUnavailable, "http.503", "down")
                .with_retry_after(Duration::from_millis(300)),
        ]);
    assert_eq!(stack_closed_for(&exhausted), None);
    let throttled = SendError::new(Category::RateLimited, "http.429", "slow down")
        .with_retry_after(Duration::from_millis(300));
    assert_eq!(
        stack_closed_for(&throttled),
        Some(Duration::from_millis(300))
    );
}

/// Holds every send until `together` are under way, then answers them all at once.
struct Together {
    barrier: tokio::sync::Barrier,
}

#[async_trait::async_trait]
impl Transport for Together {
    fn name(&self) -> &str {
        "together"
    }
    async fn send_raw(
        &self,
        _envelope: &lettre::address::Envelope,
        _raw: &[u8],
    ) -> Result<Receipt, SendError> {
        self.barrier.wait().await;
        Ok(Receipt::new("together"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_come_together_are_written_in_one_write() {
    let (outbox, counts) = counted_outbox("together").await;
    outbox.enqueue_many(&messages(8)).await.expect("enqueued");
    let together = Together {
        barrier: tokio::sync::Barrier::new(8),
    };
    outbox
        .worker(together)
        .concurrency(8)
        .drain()
        .await
        .expect("drained");
    assert_eq!(outbox.stats().await.expect("stats").queued, 0);
    assert_eq!(
        counts.finishes.load(Ordering::SeqCst),
        1,
        "8 answers, one write"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_at_most_once_a_worker_whose_writes_are_slow_never_holds_more_than_its_concurrency() {
    // A worker killed loses what it holds: under `at_most_once`, each message it held is a
    // dead letter. So it holds no message it cannot start at once: with its answers
    // waiting on a slow write, it claims nothing beside them.
    let (outbox, counts) = counted_outbox("at-most-once-holds").await;
    outbox.enqueue_many(&messages(24)).await.expect("enqueued");
    counts.finishes_take_ms.store(50, Ordering::SeqCst);
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::ZERO);
    outbox
        .worker(Arc::clone(&provider))
        .concurrency(4)
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    assert_eq!(provider.sends.load(Ordering::SeqCst), 24);
    let (leased, most) = *counts.leased.lock().expect("unpoisoned");
    assert_eq!(leased, 0, "every answer written");
    assert!(
        most <= 4,
        "{most} messages leased at once by a worker sending 4 at once"
    );
}

fn unreachable() -> SendError {
    SendError::new(
        Category::ServiceUnavailable,
        "outbox.database",
        "connection refused",
    )
}

#[tokio::test(start_paused = true)]
async fn a_database_that_failed_waits_100_ms_then_twice_as_long_each_time_up_to_5_s() {
    let mut database = DatabaseWait::default();
    let mut waits = Vec::new();
    for _ in 0..9 {
        let now = Instant::now();
        database.failed(&unreachable());
        assert!(!database.may_try(now));
        waits.push(database.next_try(now) - now);
    }
    let millis: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
    assert_eq!(
        millis,
        [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000, 5_000]
    );
    let end = Instant::now() + Duration::from_secs(5);
    assert!(database.may_try(end), "tried again once the wait is over");
}

#[tokio::test(start_paused = true)]
async fn a_database_that_answered_again_is_tried_at_once_and_waits_100_ms_after_its_next_failure() {
    let mut database = DatabaseWait::default();
    database.failed(&unreachable());
    database.failed(&unreachable());
    database.reached();
    let now = Instant::now();
    assert!(database.may_try(now));
    assert_eq!(database.next_try(now), now);
    database.failed(&unreachable());
    assert_eq!(database.next_try(now) - now, Duration::from_millis(100));
}

/// How many of 10 queued messages a worker (concurrency 2, poll 20 ms) tried in `period`
/// against a provider that answers every send with `error`.
async fn tries_against(name: &str, error: SendError, period: Duration) -> usize {
    let (outbox, _counts) = counted_outbox(name).await;
    outbox.enqueue_many(&messages(10)).await.expect("enqueued");
    let provider = Answering::new(Err(error), Duration::ZERO);
    let worker = outbox
        .worker(Arc::clone(&provider))
        .concurrency(2)
        .poll(Duration::from_millis(20));
    run_for(worker, period).await;
    provider.sends.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_the_provider_throttles_tries_one_probe_per_retry_after() {
    let throttle = SendError::new(Category::RateLimited, "ses.throttling", "slow down")
        .with_retry_after(Duration::from_millis(300));
    let tries = tries_against("throttled", throttle, Duration::from_millis(1_000)).await;
    assert!(
        (4..=6).contains(&tries),
        "2 at the start, then one probe per 300 ms throttle: {tries}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_with_a_retry_after_that_is_no_refusal_or_throttle_pauses_nothing() {
    let busy = SendError::new(Category::ServiceUnavailable, "smtp.421", "try later")
        .with_retry_after(Duration::from_secs(30));
    let tries = tries_against("busy-provider", busy, Duration::from_millis(300)).await;
    assert_eq!(
        tries, 10,
        "each message tried once (each then due in 30 s), none held back"
    );
}

/// A backend holding one message to claim, whose writes of answers never end until let go.
#[derive(Debug, Default)]
struct StuckWrites {
    claimed: std::sync::atomic::AtomicBool,
    writes: AtomicUsize,
    let_go: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl Backend for StuckWrites {
    async fn enqueue(&self, _rows: &[NewRow], _now: Millis) -> Result<Vec<OutboxId>, SendError> {
        Ok(Vec::new())
    }
    async fn keep_split(
        &self,
        _queued: &[NewRow],
        _dead: &[(NewRow, StoredError)],
        _now: Millis,
    ) -> Result<(), SendError> {
        Ok(())
    }
    async fn claim(
        &self,
        _now: Millis,
        _lease: Duration,
        _limit: u32,
        _bytes: Bytes,
        _durable: bool,
    ) -> Result<Vec<Claimed>, SendError> {
        if self.claimed.swap(true, Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        Ok(vec![Claimed {
            claim: Claim {
                id: OutboxId(1),
                attempts: 1,
            },
            enqueued_at: record::now(),
            lease_lost: false,
            panics: 0,
            key: None,
            sender: None,
            recipients: String::from("user@example.org"),
            raw: b"Subject: stuck\r\n\r\nhello\r\n".to_vec(),
        }])
    }
    async fn renew(
        &self,
        claims: &[Claim],
        _now: Millis,
        _lease: Duration,
        _durable: bool,
    ) -> Result<Vec<Claim>, SendError> {
        Ok(claims.to_vec())
    }
    async fn finish(&self, _outcomes: &[(Claim, Finish)]) -> Result<(), SendError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.let_go.notified().await;
        Ok(())
    }
    async fn next_due(&self, _now: Millis) -> Result<Option<Millis>, SendError> {
        Ok(None)
    }
    async fn stats(&self, _now: Millis) -> Result<OutboxStats, SendError> {
        Ok(OutboxStats::default())
    }
    async fn dead_letters(&self, _limit: u32) -> Result<Vec<DeadRow>, SendError> {
        Ok(Vec::new())
    }
    async fn dead_letters_page(
        &self,
        _before: Option<OutboxId>,
        _limit: u32,
    ) -> Result<Vec<DeadRow>, SendError> {
        Ok(Vec::new())
    }
    async fn requeue(&self, _id: OutboxId, _now: Millis) -> Result<bool, SendError> {
        Ok(false)
    }
    async fn purge(&self, _id: OutboxId) -> Result<bool, SendError> {
        Ok(false)
    }
    async fn purge_dead(&self, _id: OutboxId) -> Result<bool, SendError> {
        Ok(false)
    }
    async fn message(
        &self,
        _id: OutboxId,
    ) -> Result<Option<crate::outbox::inspect::MessageRow>, SendError> {
        Ok(None)
    }
}

/// Counts the wakes of the task it is the waker of.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl futures::task::ArcWake for Wakes {
    fn wake_by_ref(this: &Arc<Self>) {
        this.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Issue 45, point 5: once `shutdown_timeout` has passed with an answer's write still under
/// way, the worker awaits that write (it neither loops on its expired timer nor wakes
/// itself), and returns when the write ends.
#[tokio::test(start_paused = true)]
async fn past_its_shutdown_timeout_a_worker_awaits_the_write_under_way_without_spinning() {
    let backend = Arc::new(StuckWrites::default());
    let shared: Arc<dyn Backend> = backend.clone();
    let outbox = Outbox::with(shared, Kind::Sqlite);
    let provider = Answering::new(Ok(Receipt::new("answering")), Duration::ZERO);
    let worker = outbox
        .worker(provider)
        .shutdown_timeout(Duration::from_secs(1))
        .poll(Duration::from_secs(3_600));
    let wakes = Arc::new(Wakes::default());
    let waker = futures::task::waker(Arc::clone(&wakes));
    let mut cx = std::task::Context::from_waker(&waker);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut run = Box::pin(worker.run(async { stopped.await.unwrap_or(()) }));
    // Claimed, sent and answered; the answer's write never ends.
    for _ in 0..20 {
        assert!(run.as_mut().poll(&mut cx).is_pending());
        tokio::task::yield_now().await;
    }
    assert_eq!(
        backend.writes.load(Ordering::SeqCst),
        1,
        "the write under way"
    );
    stop.send(()).expect("the worker listens");
    assert!(run.as_mut().poll(&mut cx).is_pending());
    tokio::time::advance(Duration::from_secs(2)).await;
    // The shutdown timer fires once, and wakes the worker once.
    assert!(run.as_mut().poll(&mut cx).is_pending(), "awaits the write");
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    let before = wakes.0.load(Ordering::SeqCst);
    for _ in 0..3 {
        assert!(run.as_mut().poll(&mut cx).is_pending(), "awaits the write");
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        before,
        "a worker waiting on a write sets no timer that wakes it again"
    );
    backend.let_go.notify_one();
    let mut ended = None;
    for _ in 0..20 {
        if let std::task::Poll::Ready(result) = run.as_mut().poll(&mut cx) {
            ended = Some(result);
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        matches!(ended, Some(Ok(()))),
        "returned once the write ended"
    );
    assert_eq!(
        backend.writes.load(Ordering::SeqCst),
        1,
        "nothing more started"
    );
}

/// Says its try has not reached the provider, then waits for ever: a transport stuck before
/// it wrote anything (DESIGN §19).
struct StuckBeforeSending;

#[async_trait::async_trait]
impl Transport for StuckBeforeSending {
    fn name(&self) -> &str {
        "stuck"
    }
    async fn send_raw(
        &self,
        _envelope: &lettre::address::Envelope,
        _raw: &[u8],
    ) -> Result<Receipt, SendError> {
        crate::deadline::not_reached();
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_cut_before_any_of_it_reached_the_provider_is_a_timeout_not_maybe_delivered() {
    let (outbox, _counts) = counted_outbox("cut-unsent").await;
    let ids = outbox.enqueue_many(&messages(1)).await.expect("enqueued");
    outbox
        .worker(StuckBeforeSending)
        .lease(Duration::from_millis(400))
        .send_timeout(Duration::from_millis(200))
        .backoff(Backoff::constant(Duration::from_secs(3_600)))
        .at_most_once()
        .drain()
        .await
        .expect("drained");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.queued, stats.dead),
        (1, 0),
        "sent again later, not dead"
    );
    let stored = outbox.message(ids[0]).await.expect("read").expect("kept");
    let error = stored.error.expect("the cut's error");
    assert_eq!(error.code(), "outbox.send_timeout", "{error}");
    assert!(!error.is_maybe_delivered(), "{error}");
    assert_eq!(
        stored.attempts, 1,
        "a cut is an attempt, though nothing went"
    );
}
