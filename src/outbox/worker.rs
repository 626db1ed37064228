//! The [`Worker`]: claims due messages, sends them through a transport, and writes back what
//! each answer does to its message.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::Outbox;
use super::backend::{Bytes, DeadPart, Finish};
use super::record::{self, Claim, Claimed, StoredError};
use super::schedule::{self, Attempted, Millis, Next, Policy};
use crate::time::later;
use crate::{Backoff, Category, ConfigError, Receipt, SendError, Transport};

/// Sends an [`Outbox`]'s due messages through a transport (from [`Outbox::worker`]).
///
/// - Up to [`concurrency`](Self::concurrency) sends at once. It claims due messages in
///   batches, each with a [`lease`](Self::lease): no other worker, in this process or
///   another, sends a message while it is held. It holds up to four times `concurrency`
///   ahead of its sends (none under [`at_most_once`](Self::at_most_once)), and gives back
///   those it has not started when it shuts down or the stack refuses. If it dies, those
///   wait for their leases to run out, and are sent once: only the sends in flight may go
///   twice.
/// - It does not look for work faster than the next due time, except to notice mail that
///   other processes enqueue ([`poll`](Self::poll), 1 s by default). Mail enqueued through
///   this process's [`Outbox`] wakes it at once.
/// - When the stack refuses without sending (`breaker.open`, or `pool.exhausted` when every
///   member's breaker is open) or the provider throttles (`RateLimited`) with a
///   `retry_after`, it claims nothing until then, and then sends one message, the probe,
///   before it fills its sends again: while everything is open, no message is tried
///   against a breaker known to be open.
/// - Database errors are waited out in [`run`](Self::run) (logged, tried again with a
///   growing wait up to 5 s); [`drain`](Self::drain) returns them.
///
/// # Example
/// ```
/// # use mail_breaker::outbox::Outbox;
/// # use mail_breaker::{CircuitBreakerTransport, LettreTransport};
/// # use lettre::transport::stub::AsyncStubTransport;
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = std::env::temp_dir().join(format!("outbox-worker-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
/// let stack = CircuitBreakerTransport::new(LettreTransport::new(
///     AsyncStubTransport::new_ok(),
///     |_| unreachable!(),
/// ));
/// let worker = outbox
///     .worker(stack)
///     .concurrency(16)
///     .lease(Duration::from_secs(300))
///     .max_age(Duration::from_secs(3 * 86_400));
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let running = tokio::spawn(async move {
///     worker.run(async { stopped.await.unwrap_or(()) }).await
/// });
/// stop.send(()).unwrap(); // e.g. on SIGTERM: sends in flight finish, nothing new starts
/// running.await.unwrap()?;
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), mail_breaker::SendError>(())
/// # }).unwrap();
/// ```
pub struct Worker<T> {
    outbox: Outbox,
    transport: Arc<T>,
    concurrency: usize,
    lease: Duration,
    /// `None`: three quarters of the lease.
    send_timeout: Option<Duration>,
    max_held_bytes: u64,
    poll: Duration,
    shutdown_timeout: Duration,
    policy: Policy,
}

impl<T> fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("outbox", &self.outbox)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("send_timeout", &self.send_timeout)
            .field("max_held_bytes", &self.max_held_bytes)
            .field("poll", &self.poll)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// How a worker's loop ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// The shutdown future completed (`run`).
    Shutdown,
    /// Nothing is due (`drain`).
    NothingDue,
}

/// The longest wait between two tries of an unreachable database.
const DATABASE_WAIT: Duration = Duration::from_secs(5);

/// How often a working worker reads the outbox's counts for its gauges, at most.
const STATS_EVERY: Duration = Duration::from_secs(1);

/// The counts read the whole table, and the worker waits for them: after a read that took
/// `t`, the next waits `STATS_SHARE * t` if that is longer than `STATS_EVERY`, so that under
/// a large backlog they take at most a twentieth of the worker's and the database's time.
const STATS_SHARE: u32 = 20;

impl<T: Transport + 'static> Worker<T> {
    pub(super) fn new(outbox: Outbox, transport: T) -> Worker<T> {
        Worker {
            outbox,
            transport: Arc::new(transport),
            concurrency: 8,
            lease: Duration::from_secs(300),
            send_timeout: None,
            max_held_bytes: 64 * 1024 * 1024,
            poll: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(30),
            policy: Policy {
                backoff: Backoff::exponential(Duration::from_secs(1), Duration::from_secs(600)),
                setup_wait: Duration::from_secs(3_600),
                max_age: Duration::from_secs(3 * 86_400),
                at_most_once: false,
            },
        }
    }

    /// Sends in flight at once (default 8; at least 1).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How long a claimed message is held (default 5 minutes): longer than any send takes.
    /// If this worker dies, others send its messages after this.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest a send may take (default three quarters of the [`lease`](Self::lease);
    /// it must be shorter than the lease). It is a deadline the whole stack sees: a retry or
    /// a rate limiter that would wait past it answers at once with what it holds, a wait for
    /// a connection is cut there as not attempted. A send still running then is dropped and
    /// answered as a timeout (`outbox.send_timeout`), maybe delivered only if a try in
    /// flight may have reached the provider (the crate's SMTP client wrote `DATA` or `BDAT`,
    /// an HTTP or SES adapter handed over its request, or a transport that says nothing of
    /// its progress, such as lettre's or an application's own, was under way): then it is
    /// sent again, or dead as maybe delivered under [`at_most_once`](Self::at_most_once). See
    /// the guide's outbox chapter, "The send timeout is a deadline". No send
    /// starts with less than this left of its message's lease; messages held ahead of their
    /// sends have their leases renewed (or given back) first. So a message's lease never
    /// runs out while this worker holds it, and the time between the two is left to write
    /// its answer.
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = Some(timeout);
        self
    }

    /// The send timeout in effect: the one set, or three quarters of the lease.
    pub fn get_send_timeout(&self) -> Duration {
        self.send_timeout
            .unwrap_or_else(|| self.lease.saturating_mul(3) / 4)
    }

    /// The most bytes of message bodies this worker holds at once, claimed and not yet
    /// answered (default 64 MiB): it claims no more while they are held, and a claim stops
    /// before the body that would pass it. A single message larger than this is still
    /// sent, alone.
    pub fn max_held_bytes(mut self, bytes: u64) -> Self {
        self.max_held_bytes = bytes;
        self
    }

    /// How long a message is tried before it is dead as `outbox.expired` (default 3 days).
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.policy.max_age = max_age;
        self
    }

    /// The wait after a failure that may pass, when the error asks for no longer (default
    /// exponential from 1 s, doubling to 10 minutes, with jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy.backoff = backoff;
        self
    }

    /// The wait after an `Authentication`, `Configuration` or `Unsupported` error, which
    /// someone must fix (default 1 hour).
    pub fn setup_wait(mut self, wait: Duration) -> Self {
        self.policy.setup_wait = wait;
        self
    }

    /// A message that may have reached the provider (an error marked
    /// [maybe-delivered](SendError::is_maybe_delivered), or a lease that ran out mid-send)
    /// goes to the dead letters as `outbox.maybe_delivered` instead of being sent again.
    ///
    /// Such a worker claims no message it cannot start at once: it holds at most
    /// [`concurrency`](Self::concurrency) messages, counting the sent ones whose answers it
    /// has not written yet. If it dies, those are what goes dead when their leases run out.
    pub fn at_most_once(mut self) -> Self {
        self.policy.at_most_once = true;
        self
    }

    /// How often an idle worker looks for mail enqueued by other processes (default 1 s).
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// How long [`run`](Self::run) lets sends in flight finish after shutdown (default
    /// 30 s); the leases of those still unanswered then run out, as if the worker died.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The transport it sends through.
    pub fn get_ref(&self) -> &T {
        &self.transport
    }

    /// Sends due messages until `shutdown` completes; then claims nothing more, lets the
    /// sends in flight finish (within [`shutdown_timeout`](Self::shutdown_timeout)), records
    /// their answers and returns. `Err` only for a setting out of range (`Configuration`).
    pub async fn run(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), SendError> {
        self.work(Box::pin(shutdown), Until::Shutdown).await
    }

    /// Sends until nothing is due now (a failed message due later stays queued), then
    /// returns: for tests and cron jobs. A database error ends it with that error.
    pub async fn drain(&self) -> Result<(), SendError> {
        self.work(Box::pin(std::future::pending()), Until::NothingDue)
            .await
    }

    /// Checks the settings, as [`run`](Self::run) and [`drain`](Self::drain) do before they
    /// start: a `ConfigError` naming the first one out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.concurrency == 0 {
            return Err(ConfigError::new(
                "concurrency",
                "an outbox worker needs at least one send in flight",
            ));
        }
        if self.lease.is_zero() {
            return Err(ConfigError::new(
                "lease",
                "a lease must be longer than zero, or every claim runs out at once",
            ));
        }
        let send_timeout = self.get_send_timeout();
        if send_timeout.is_zero() || send_timeout >= self.lease {
            return Err(ConfigError::new(
                "send_timeout",
                format!(
                    "the send timeout ({send_timeout:?}) must be longer than zero and shorter \
                     than the lease ({:?}), which must outlast every send and its answer",
                    self.lease
                ),
            ));
        }
        if self.poll.is_zero() {
            return Err(ConfigError::new(
                "poll",
                "the poll interval must be longer than zero",
            ));
        }
        self.policy.backoff.validate()
    }

    async fn work(
        &self,
        mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
        until: Until,
    ) -> Result<(), SendError> {
        self.validate()
            .map_err(|e| SendError::new(Category::Configuration, "outbox.config", e.to_string()))?;
        let backend = self.outbox.backend();
        let mut flight = Flight {
            poll: self.poll,
            ..Flight::default()
        };
        let mut stopping: Option<Instant> = None;
        let mut database = DatabaseWait::default();
        let mut stats_read: Option<(Instant, Duration)> = None;
        // The database's work runs beside the sends, so that a send's answer starts the next
        // send at once rather than after a commit: one claim and one write of answers at a
        // time, each owning what it needs. Answers that come during a write go together in
        // the next: fewer, larger statements leave the machine's time to the sends.
        let mut writing: Option<Writing<'_>> = None;
        let mut claiming: Option<Claiming<'_>> = None;
        // A renewal of the leases of the messages held ahead of their sends, once the next
        // to start has less than `send_timeout` of its lease left.
        let mut renewing: Option<Renewing<'_>> = None;
        // The shutdown timeout has passed: only a write under way is awaited, then `run`
        // returns; nothing is started and no timer is waited on again.
        let mut gave_up = false;
        let send_timeout = self.get_send_timeout();
        // False once a claim found fewer due than it asked for: nothing more is due until a
        // wake (an enqueue here, the next due time, the poll).
        let mut may_claim = true;
        let mut asked = 0;
        // The bytes the claim under way may take; and whether the last claim may have found
        // less than it asked for only because of them, so that an answer (which frees bytes)
        // lets the worker claim again.
        let mut asked_bytes = Bytes {
            max: u64::MAX,
            first_whatever_size: true,
        };
        let mut short_of_bytes = false;
        // Whether the last claim was made with nothing held: a drain ends when such a claim
        // finds less than it asked for.
        let mut last_claim_idle = false;
        loop {
            let notified = self.outbox.enqueued().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            if gave_up && writing.is_none() {
                return Ok(());
            }
            let now = Instant::now();
            if stopping.is_some() || flight.paused(now) {
                flight.give_back();
            }
            // A read: it never waits on the background work's write lock.
            if stats_due(stats_read, now) {
                let reading = Instant::now();
                let stats = backend.stats(record::now()).await;
                stats_read = Some((now, reading.elapsed()));
                if let Ok(stats) = stats {
                    super::gauges::stats(&stats);
                }
            }
            self.start_ready(&mut flight, send_timeout);
            if renewing.is_none()
                && stopping.is_none()
                && database.may_try(now)
                && flight.needs_renewal(now, self.concurrency, send_timeout)
            {
                let held: Vec<Held> = flight.ready.drain(..).collect();
                flight.renewing = held.len();
                let claims: Vec<Claim> = held.iter().map(|held| held.message.claim).collect();
                let (lease, durable) = (self.lease, self.policy.at_most_once);
                renewing = Some(
                    async move {
                        let sent = Instant::now();
                        let renewed = backend.renew(&claims, record::now(), lease, durable).await;
                        (held, sent, renewed)
                    }
                    .boxed(),
                );
            }
            if writing.is_none() && !gave_up && !flight.answers.is_empty() && database.may_try(now)
            {
                let batch = std::mem::take(&mut flight.answers);
                flight.writing += batch.len();
                writing = Some(
                    async move {
                        let span = crate::telemetry::outbox_span(true);
                        let written =
                            tracing::Instrument::instrument(backend.finish(&batch), span.clone())
                                .await;
                        crate::telemetry::ended(&span, &written);
                        (batch, written)
                    }
                    .boxed(),
                );
            }
            let busy = renewing.is_some();
            if until == Until::NothingDue && !busy && at_rest(&flight, &writing, &claiming) {
                if flight.paused(now) || (!may_claim && last_claim_idle) {
                    // Nothing due now (or everything due was refused for now: due later).
                    return Ok(());
                }
                may_claim = true; // one more claim, made idle, to be sure
            }
            if claiming.is_none()
                && may_claim
                && stopping.is_none()
                && !flight.paused(now)
                && database.may_try(now)
                && let Some(wanted) = flight.wanted(self.concurrency, self.prefetch())
                && let Some(bytes) = flight.bytes_free(self.max_held_bytes)
            {
                let lease = self.lease;
                let idle = !busy && at_rest(&flight, &writing, &claiming);
                let durable = self.policy.at_most_once;
                let wanted = wanted.get();
                asked = wanted as usize;
                asked_bytes = bytes;
                claiming = Some(
                    async move {
                        // The lease's end by this clock counts from before the claim was
                        // sent: never later than the database's.
                        let sent = Instant::now();
                        let span = crate::telemetry::outbox_span(false);
                        let claimed = tracing::Instrument::instrument(
                            backend.claim(record::now(), lease, wanted, bytes, durable),
                            span.clone(),
                        )
                        .await;
                        crate::telemetry::ended(&span, &claimed);
                        (idle, sent, claimed)
                    }
                    .boxed(),
                );
            }
            let rest = !busy && at_rest(&flight, &writing, &claiming);
            if stopping.is_some() && rest {
                return Ok(());
            }
            // Only a worker at rest needs a wake: else an answer, a claim or a write wakes it.
            let wake = if stopping.is_none() && rest && database.may_try(now) {
                Some(self.next_wake(flight.pause(now), now).await)
            } else {
                None
            };
            tokio::select! {
                biased;
                () = &mut shutdown, if stopping.is_none() => {
                    stopping = Some(later(Instant::now(), self.shutdown_timeout));
                }
                Some(answer) = flight.sends.next(), if !flight.sends.is_empty() => {
                    flight.answered(answer, &self.policy);
                    flight.collect_ready(&self.policy);
                    // A failure may be due again at once: a drain claims once more, idle.
                    last_claim_idle = false;
                    if std::mem::take(&mut short_of_bytes) {
                        may_claim = true;
                    }
                }
                (batch, written) = async { writing.as_mut().expect("guarded").await }, if writing.is_some() => {
                    writing = None;
                    flight.writing -= batch.len();
                    match written {
                        Ok(()) => {
                            record_written(&self.outbox, &batch);
                            database.reached();
                        }
                        Err(error) if until == Until::NothingDue => return Err(error),
                        Err(error) => {
                            database.failed(&error);
                            // Written again at the database's next try, before later ones.
                            flight.answers.splice(0..0, batch);
                            if stopping.is_some_and(|deadline| deadline <= Instant::now()) {
                                // Shut down with the database away: the leases run out, and
                                // the messages are sent again (or dead, under at_most_once).
                                tracing::warn!(
                                    unwritten = flight.answers.len(),
                                    "outbox.shutdown_unwritten"
                                );
                                return Ok(());
                            }
                        }
                    }
                }
                (started_idle, sent, claimed) = async { claiming.as_mut().expect("guarded").await }, if claiming.is_some() => {
                    claiming = None;
                    match claimed {
                        Ok(messages) => {
                            database.reached();
                            may_claim = messages.len() >= asked;
                            let taken: u64 = messages.iter().map(body_size).sum();
                            short_of_bytes = !may_claim
                                && (!asked_bytes.first_whatever_size
                                    || taken.saturating_mul(2) > asked_bytes.max);
                            last_claim_idle = started_idle;
                            let lease_end = later(sent, self.lease);
                            for message in messages {
                                self.take(&mut flight, message, lease_end);
                            }
                        }
                        Err(error) if until == Until::NothingDue => return Err(error),
                        Err(error) => database.failed(&error),
                    }
                }
                (held, sent, renewed) = async { renewing.as_mut().expect("guarded").await }, if renewing.is_some() => {
                    renewing = None;
                    match renewed {
                        Ok(renewed) => {
                            database.reached();
                            flight.renewed(held, &renewed, later(sent, self.lease));
                        }
                        Err(error) if until == Until::NothingDue => return Err(error),
                        Err(error) => {
                            database.failed(&error);
                            // Held as they were: renewed at the database's next try, or given
                            // back, or their leases run out.
                            flight.renewed_none(held);
                        }
                    }
                }
                () = tokio::time::sleep_until(stopping.unwrap_or(now)), if stopping.is_some() && !gave_up => {
                    // Sends still unanswered keep their leases, which run out; so do the
                    // answers not written yet. A write under way is awaited, nothing else.
                    tracing::warn!(
                        unanswered = flight.sends.len(),
                        unwritten = flight.answers.len(),
                        "outbox.shutdown_timeout"
                    );
                    flight.sends.clear();
                    gave_up = true;
                }
                () = notified, if stopping.is_none() => may_claim = true,
                () = sleep_until_some(wake) => may_claim = true,
                () = tokio::time::sleep_until(database.next_try(now)), if !database.may_try(now) => {}
            }
        }
    }

    /// When a worker at rest looks again: the end of its pause; else the next due time or
    /// the poll, whichever is first.
    async fn next_wake(&self, pause: Option<Instant>, now: Instant) -> Instant {
        if let Some(end) = pause {
            return end;
        }
        let poll = later(now, self.poll);
        let now_ms = record::now();
        match self.outbox.backend().next_due(now_ms).await {
            Ok(Some(due_at)) => {
                let wait = u64::try_from(due_at.saturating_sub(now_ms)).unwrap_or(0);
                later(now, Duration::from_millis(wait)).min(poll)
            }
            Ok(None) | Err(_) => poll,
        }
    }

    /// Messages claimed beyond those that start at once, so that a claim serves several
    /// sends: four times `concurrency` (none under `at_most_once`, where a message claimed
    /// by a worker that died counts as maybe sent, and must not have waited unsent). Each
    /// claim is a commit; fewer, larger ones leave the database's time to the sends.
    fn prefetch(&self) -> usize {
        if self.policy.at_most_once {
            0
        } else {
            self.concurrency.saturating_mul(4)
        }
    }

    /// Starts claimed messages while there is room among the sends, unless the stack said
    /// it refuses for now; never one with less than `send_timeout` of its lease left (its
    /// lease is renewed first).
    fn start_ready(&self, flight: &mut Flight, send_timeout: Duration) {
        let now = Instant::now();
        if flight.paused(now) {
            return;
        }
        while flight.room(self.concurrency) > 0 {
            match flight.ready.front() {
                Some(next) if next.lease_left(now) >= send_timeout => {}
                _ => break,
            }
            if let Some(held) = flight.ready.pop_front() {
                self.start(flight, held.message, send_timeout);
            }
        }
    }

    /// Takes a claimed message in: ready to send, or dead at once when its last holder's lease
    /// ran out and `at_most_once` forbids sending it again (before it could be given back).
    fn take(&self, flight: &mut Flight, message: Claimed, lease_end: Instant) {
        if message.lease_lost
            && let Some(error) = schedule::after_lost_lease(&self.policy)
        {
            let dead = Finish::Dead {
                error: StoredError::of(&error),
                at: record::now(),
                recipients: None,
            };
            flight.answers.push((message.claim, dead));
            return;
        }
        flight.held_bytes = flight.held_bytes.saturating_add(body_size(&message));
        flight.ready.push_back(Held { message, lease_end });
    }

    /// Starts the send of a claimed message: answered within `send_timeout`, and a panic
    /// inside it is its answer (`transport.panicked`).
    fn start(&self, flight: &mut Flight, message: Claimed, send_timeout: Duration) {
        let transport = Arc::clone(&self.transport);
        let send = async move {
            let result = match record::envelope(message.sender.as_deref(), &message.recipients) {
                Ok(envelope) => {
                    let name = transport.name();
                    // Every attempt, in every worker, under the key kept with the message
                    // (DESIGN §21).
                    let send = crate::idempotency::kept(
                        message.key.clone(),
                        crate::panicked::catch_panic(name, async {
                            transport.send_raw(&envelope, &message.raw).await
                        }),
                    );
                    // The deadline every layer of the stack sees (DESIGN §19).
                    let deadline = later(Instant::now(), send_timeout);
                    let span = crate::telemetry::send_span();
                    if !span.is_disabled() {
                        span.record("mail_breaker.outbox.attempt", message.claim.attempts);
                    }
                    let answer = tracing::Instrument::instrument(
                        crate::deadline::scope(deadline, send),
                        span.clone(),
                    )
                    .await;
                    let answer = match answer {
                        Ok(answer) => answer,
                        Err(cut) => Err(send_timed_out(send_timeout, name, cut)),
                    };
                    crate::telemetry::ended(&span, &answer);
                    answer
                }
                Err(corrupt) => Err(corrupt),
            };
            Answer {
                size: body_size(&message),
                claim: message.claim,
                enqueued_at: message.enqueued_at,
                panics: message.panics,
                result,
            }
        };
        flight.sends.push(send.boxed());
    }
}

/// The answer to a send dropped at `send_timeout`: maybe delivered only when a try in flight
/// at the cut may have reached the provider (or the cut threw away a delivery), as the
/// layers below said through the deadline's scope; else a timeout that sent nothing (the
/// stack was only waiting: a connection, a turn), counted as an attempt.
fn send_timed_out(send_timeout: Duration, transport: &str, cut: crate::deadline::Cut) -> SendError {
    if !cut.may_have_reached {
        return SendError::new(
            Category::Timeout,
            "outbox.send_timeout",
            format!(
                "the send took longer than the worker's send_timeout of {send_timeout:?} and \
                 was dropped before any of it reached the provider"
            ),
        )
        .with_transport(transport);
    }
    SendError::new(
        Category::Timeout,
        "outbox.send_timeout",
        format!(
            "the send took longer than the worker's send_timeout of {send_timeout:?} and was \
             dropped; the provider may have the message"
        ),
    )
    .with_transport(transport)
    .maybe_delivered()
}

/// The size of a claimed message's body, as `max_held_bytes` counts it.
fn body_size(message: &Claimed) -> u64 {
    u64::try_from(message.raw.len()).unwrap_or(u64::MAX)
}

/// A claimed message this worker holds, and when its lease ends by this process's clock.
struct Held {
    message: Claimed,
    lease_end: Instant,
}

impl Held {
    fn lease_left(&self, now: Instant) -> Duration {
        self.lease_end.saturating_duration_since(now)
    }
}

/// Nothing held and nothing under way: no send in flight, none claimed and waiting, no
/// answer unwritten, no claim or write running.
fn at_rest(
    flight: &Flight,
    writing: &Option<Writing<'_>>,
    claiming: &Option<Claiming<'_>>,
) -> bool {
    flight.is_idle() && writing.is_none() && claiming.is_none()
}

/// A write of answers in the background: gives the batch back with how it went.
type Writing<'a> = BoxFuture<'a, (Vec<(Claim, Finish)>, Result<(), SendError>)>;

/// A claim in the background: whether nothing was held when it was made, when it was sent,
/// and what it took.
type Claiming<'a> = BoxFuture<'a, (bool, Instant, Result<Vec<Claimed>, SendError>)>;

/// A renewal of held leases in the background: the messages, when it was sent, and the
/// claims renewed.
type Renewing<'a> = BoxFuture<'a, (Vec<Held>, Instant, Result<Vec<Claim>, SendError>)>;

/// A send's answer, with what the worker needs to record it.
struct Answer {
    claim: Claim,
    /// Its body's size, held until this answer.
    size: u64,
    enqueued_at: Millis,
    /// Its sends that panicked before this one.
    panics: u32,
    result: Result<Receipt, SendError>,
}

/// The sends in flight and the answers not yet written.
#[derive(Default)]
struct Flight {
    /// Claimed, not started yet, soonest due first.
    ready: std::collections::VecDeque<Held>,
    /// How many held messages a renewal under way holds.
    renewing: usize,
    /// The bodies' bytes of the messages claimed and not yet answered.
    held_bytes: u64,
    sends: FuturesUnordered<futures::future::BoxFuture<'static, Answer>>,
    answers: Vec<(Claim, Finish)>,
    /// How many answers the writes under way hold.
    writing: usize,
    /// No claims until then: the stack refused, or the provider throttled.
    paused_until: Option<Instant>,
    /// After a pause, one send at a time until an answer other than a refusal comes.
    probing: bool,
    /// The worker's poll: how long a message refused without a time (an isolated breaker)
    /// waits before it is due again.
    poll: Duration,
}

impl Flight {
    /// Sends that may start: `concurrency` (one while probing) less the sends in flight and
    /// the answers not yet written. A worker that dies can send again only what it sent and
    /// had not written the answer of, so this keeps that to `concurrency`.
    fn room(&self, concurrency: usize) -> u32 {
        let limit = if self.probing { 1 } else { concurrency };
        let held = self.sends.len() + self.answers.len() + self.writing;
        u32::try_from(limit.saturating_sub(held)).unwrap_or(u32::MAX)
    }

    /// How many messages to claim now, if any: what fills `concurrency` sends and the
    /// `prefetch` above them; but none while more than half of that is held and the sends
    /// are not starving (nothing ready while fewer than `concurrency` are in flight), so
    /// that each claim serves several sends. While probing, one.
    ///
    /// Held is every message whose lease is the worker's: claimed, renewing, in flight, or
    /// answered and not yet written (which fills a send's place, as in `room`). So with no
    /// prefetch (`at_most_once`) a worker never holds a message it cannot start at once,
    /// and one killed holds at most `concurrency`.
    fn wanted(&self, concurrency: usize, prefetch: usize) -> Option<NonZeroU32> {
        let (capacity, prefetch) = if self.probing {
            (1, 0)
        } else {
            (concurrency.saturating_add(prefetch), prefetch)
        };
        let held =
            self.sends.len() + self.answers.len() + self.writing + self.ready.len() + self.renewing;
        let free = capacity.saturating_sub(held);
        let starving = self.ready.is_empty() && self.sends.len() < capacity - prefetch;
        if !starving && free < capacity.div_ceil(2) {
            return None;
        }
        NonZeroU32::new(u32::try_from(free).unwrap_or(u32::MAX))
    }

    /// Hands back the messages claimed and not started (shutdown, or the stack refusing),
    /// with the next write of answers, so that they are due at once for any worker. If the
    /// database cannot take them, their leases run out instead.
    fn give_back(&mut self) {
        let now = record::now();
        let mut bytes = 0_u64;
        let handed = self.ready.drain(..).map(|held| {
            bytes = bytes.saturating_add(body_size(&held.message));
            (held.message.claim, Finish::GiveBack { now, wait: 0 })
        });
        self.answers.extend(handed);
        self.held_bytes = self.held_bytes.saturating_sub(bytes);
    }

    /// Nothing held: no send in flight, none claimed and waiting, no answer unwritten.
    fn is_idle(&self) -> bool {
        self.sends.is_empty()
            && self.ready.is_empty()
            && self.answers.is_empty()
            && self.renewing == 0
    }

    /// The bytes of bodies a claim may take under `max_held_bytes`: `None` while that many
    /// are held. With nothing held, a claim takes at least one message however large.
    fn bytes_free(&self, max_held_bytes: u64) -> Option<Bytes> {
        let free = max_held_bytes.saturating_sub(self.held_bytes);
        let idle = self.held_bytes == 0;
        (idle || free > 0).then_some(Bytes {
            max: free,
            first_whatever_size: idle,
        })
    }

    /// Whether the held messages' leases need renewing now: a send may start, and the next
    /// message to start has less than `send_timeout` of its lease left.
    fn needs_renewal(&self, now: Instant, concurrency: usize, send_timeout: Duration) -> bool {
        self.renewing == 0
            && !self.paused(now)
            && self.room(concurrency) > 0
            && self
                .ready
                .front()
                .is_some_and(|next| next.lease_left(now) < send_timeout)
    }

    /// Takes back the messages of a renewal: those `renewed` with their new lease's end,
    /// ahead of any claimed since; the others are no longer this worker's (another took the
    /// message after its lease ran out, or it is gone) and are dropped unsent.
    fn renewed(&mut self, held: Vec<Held>, renewed: &[Claim], lease_end: Instant) {
        self.renewing = 0;
        let lost = held.len().saturating_sub(renewed.len());
        if lost > 0 {
            tracing::debug!(lost, "outbox.leases_lost");
        }
        let renewed: std::collections::HashSet<&Claim> = renewed.iter().collect();
        for mut held in held.into_iter().rev() {
            if renewed.contains(&held.message.claim) {
                held.lease_end = lease_end;
                self.ready.push_front(held);
            } else {
                self.held_bytes = self.held_bytes.saturating_sub(body_size(&held.message));
            }
        }
    }

    /// Takes back the messages of a renewal that failed, as they were.
    fn renewed_none(&mut self, held: Vec<Held>) {
        self.renewing = 0;
        for held in held.into_iter().rev() {
            self.ready.push_front(held);
        }
    }

    /// The end of the pause the stack asked for, if it has not come by `now`.
    fn pause(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|until| *until > now)
    }

    fn paused(&self, now: Instant) -> bool {
        self.pause(now).is_some()
    }

    /// Records every answer already there without waiting.
    fn collect_ready(&mut self, policy: &Policy) {
        while let Some(Some(answer)) = self.sends.next().now_or_never() {
            self.answered(answer, policy);
        }
    }

    fn answered(&mut self, answer: Answer, policy: &Policy) {
        self.held_bytes = self.held_bytes.saturating_sub(answer.size);
        let now = record::now();
        let mut dead_parts = Vec::new();
        let (error, recipients) = match answer.result {
            Ok(receipt) => {
                self.probing = false;
                let owed = schedule::owed_after(&receipt, policy.at_most_once);
                dead_parts = owed
                    .dead
                    .iter()
                    .map(|(error, recipients)| DeadPart {
                        error: StoredError::of(error),
                        at: now,
                        recipients: recipients.clone(),
                    })
                    .collect();
                match owed.again {
                    // Delivered to the others: the message stays for those owed only.
                    Some((error, recipients)) => (error, Some(recipients)),
                    None if dead_parts.is_empty() => {
                        self.answers.push((answer.claim, Finish::Sent));
                        return;
                    }
                    None => {
                        // Nothing to send again: the row itself is the first dead letter.
                        let first = dead_parts.remove(0);
                        let finish = Finish::Dead {
                            error: first.error,
                            at: now,
                            recipients: Some(first.recipients),
                        };
                        self.answers.push((answer.claim, split(finish, dead_parts)));
                        return;
                    }
                }
            }
            Err(error) if error.is_not_attempted() => {
                self.refused(answer.claim, &error, now);
                return;
            }
            Err(error) => (error, None),
        };
        match stack_closed_for(&error) {
            Some(wait) => {
                let until = later(Instant::now(), wait);
                self.paused_until =
                    Some(self.paused_until.map_or(until, |paused| paused.max(until)));
                self.probing = true;
            }
            None => self.probing = false,
        }
        let panicked = error.code() == crate::panicked::PANICKED;
        let attempted = Attempted {
            enqueued_at: answer.enqueued_at,
            attempts: answer.claim.attempts,
            panics: answer.panics.saturating_add(u32::from(panicked)),
            now,
        };
        let finish = match schedule::after_failure(policy, attempted, error, |retry| {
            policy.backoff.delay(retry)
        }) {
            Next::Dead(error) => Finish::Dead {
                error: StoredError::of(&error),
                at: now,
                recipients,
            },
            Next::Retry { due_at, error } => Finish::Retry {
                error: StoredError::of(&error),
                due_at,
                wait: due_at.saturating_sub(now),
                recipients,
            },
        };
        self.answers.push((answer.claim, split(finish, dead_parts)));
    }
}

/// `main`, with a dead letter of its own for each of `dead` beside it when there are any.
fn split(main: Finish, dead: Vec<DeadPart>) -> Finish {
    if dead.is_empty() {
        main
    } else {
        Finish::Split {
            main: Box::new(main),
            dead,
        }
    }
}

impl Flight {
    /// A send the stack refused without an attempt (DESIGN §19, "Not sent is not an
    /// attempt"): the message is given back, due again after the refusal's `retry_after` (or
    /// the next poll, for an isolation, which promises no time), with no attempt counted and
    /// no backoff. The worker pauses as a whole only when the refusal holds back every
    /// message (a breaker of the whole transport, a rate limit, a pool whose members all
    /// refused so); a breaker of one recipient domain moves that message alone.
    fn refused(&mut self, claim: Claim, error: &SendError, now: Millis) {
        let wait = error.retry_after().unwrap_or(self.poll);
        if error.refuses_every_message() {
            let until = later(Instant::now(), wait);
            self.paused_until = Some(self.paused_until.map_or(until, |paused| paused.max(until)));
            self.probing = true;
        }
        self.answers.push((
            claim,
            Finish::GiveBack {
                now,
                wait: schedule::millis(wait),
            },
        ));
    }
}

/// Whether a worker that last read the outbox's counts at `read`, in `took`, reads them again
/// at `now` for its gauges: at once, then once a second, or after `STATS_SHARE` times as long
/// as the last read took; never without the metrics feature.
fn stats_due(last: Option<(Instant, Duration)>, now: Instant) -> bool {
    crate::metrics::ENABLED
        && last.is_none_or(|(read, took)| {
            now.duration_since(read) >= STATS_EVERY.max(took.saturating_mul(STATS_SHARE))
        })
}

/// Counts answers once they are in the database, by outcome.
fn record_written(outbox: &Outbox, batch: &[(Claim, Finish)]) {
    let count = |outcome: fn(&Finish) -> bool| {
        batch.iter().filter(|(_, finish)| outcome(finish)).count() as u64
    };
    let sent = count(|finish| matches!(finish, Finish::Sent));
    outbox.count_sent(sent);
    super::gauges::answers("sent", sent);
    super::gauges::answers(
        "retry",
        count(|finish| matches!(finish.own(), Finish::Retry { .. })),
    );
    // Each dead letter a split delivery writes beside its row is one more dead.
    let dead_parts: usize = batch
        .iter()
        .map(|(_, finish)| finish.dead_parts().len())
        .sum();
    super::gauges::answers(
        "dead",
        count(|finish| matches!(finish.own(), Finish::Dead { .. })) + dead_parts as u64,
    );
}

/// How long the providers asked the whole stack to wait after an attempt: a throttle
/// (`RateLimited` with a `retry_after`), or a pool whose every member throttled or refused
/// every message (`pool.exhausted` with the soonest `retry_after`). `None` for any other
/// error: one provider's own failure moves that message alone.
fn stack_closed_for(error: &SendError) -> Option<Duration> {
    error.retry_after().filter(|_| holds_every_message(error))
}

/// Whether `error` holds back every message the stack is handed: a provider's throttle, a
/// refusal of every message, or a pool whose members each answered one of these.
fn holds_every_message(error: &SendError) -> bool {
    error.category() == Category::RateLimited
        || error.refuses_every_message()
        || (error.code() == "pool.exhausted"
            && !error.causes().is_empty()
            && error.causes().iter().all(holds_every_message))
}

/// Waits for a database that failed: 100 ms after the first failure, doubling to 5 s.
#[derive(Default)]
struct DatabaseWait {
    failures: u32,
    next_try: Option<Instant>,
}

impl DatabaseWait {
    fn failed(&mut self, error: &SendError) {
        self.failures = self.failures.saturating_add(1);
        let wait = Duration::from_millis(100)
            .saturating_mul(1 << self.failures.min(16).saturating_sub(1))
            .min(DATABASE_WAIT);
        tracing::warn!(error = %error, wait_ms = wait.as_millis() as u64, "outbox.database_unreachable");
        self.next_try = Some(later(Instant::now(), wait));
    }

    fn reached(&mut self) {
        // A wait is set by a failure and cleared here: one there means the database was away.
        if self.next_try.take().is_some() {
            tracing::info!(failures = self.failures, "outbox.database_back");
        }
        self.failures = 0;
    }

    fn may_try(&self, now: Instant) -> bool {
        self.next_try.is_none_or(|at| at <= now)
    }

    fn next_try(&self, now: Instant) -> Instant {
        self.next_try.unwrap_or(now)
    }
}

/// Sleeps until `at`, or for ever when `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
