//! The outbox: mail that no provider takes now is kept in a database (SQLite, or PostgreSQL
//! for a fleet) and sent by a [`Worker`] when a provider is back.
//!
//! # Delivery
//! - **At least once** by default. A message leaves the outbox when a provider accepted it. A
//!   worker that dies mid-send leaves its lease to run out, and the message is then sent
//!   again: a provider may get it twice, never zero times.
//! - **At most once** with [`Worker::at_most_once`]. A message whose last attempt may have
//!   reached the provider (an error marked [maybe-delivered](SendError::is_maybe_delivered),
//!   or a lease that ran out mid-send) goes to the dead letters as `outbox.maybe_delivered`
//!   instead of being sent again.
//! - **One idempotency key per message**, made when it is enqueued (or `send_or_queue`'s
//!   first try's) and kept with it: every attempt, in any worker, is sent under it, so a
//!   provider that honours keys (Resend, for 24 hours) answers a resend after a
//!   maybe-delivered attempt with the first result ([`idempotency`](crate::idempotency)).
//! - **Deferred recipients.** A delivery the provider deferred for some recipients (SMTP
//!   `450`/`451` to their `RCPT TO`, as greylisting answers) leaves the message in the outbox
//!   for those recipients only, scheduled like a failure with the deferral's error.
//!
//! # Scheduling
//! A queued message is due at once. After a failure it is due again at the error's
//! [`retry_after`](SendError::retry_after) (a breaker's open time, the pool's soonest
//! member) or at the worker's backoff, whichever is later. `Rejected` and `InvalidMessage`
//! are dead at once with their error; `Authentication`, `Configuration` and `Unsupported`
//! wait the worker's `setup_wait` (someone must fix the setup); everything else is retried
//! until `max_age`, then dead as `outbox.expired`.
//!
//! # Example
//! ```
//! use mail_breaker::outbox::Outbox;
//! use mail_breaker::{LettreTransport, Message};
//! use lettre::transport::stub::AsyncStubTransport;
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let dir = std::env::temp_dir().join(format!("outbox-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
//!
//! let message = Message::builder()
//!     .from("app@example.com".parse().unwrap())
//!     .to("user@example.org".parse().unwrap())
//!     .body(String::from("welcome"))
//!     .unwrap();
//! outbox.enqueue(&message).await?; // Ok: committed to disk
//! assert_eq!(outbox.stats().await?.queued, 1);
//!
//! let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
//! outbox.worker(provider).drain().await?; // sends everything due, then returns
//! assert_eq!(outbox.stats().await?.queued, 0);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), mail_breaker::SendError>(())
//! # }).unwrap();
//! ```

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use crate::{Envelope, Message, SendError, Transport};

#[cfg(feature = "admin")]
mod admin_reads;
mod backend;
mod gauges;
mod inspect;
mod lanes;
mod options;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
pub(crate) mod schedule;
mod sqlite;
#[cfg_attr(not(feature = "config"), allow(dead_code))]
pub(crate) mod supervise;
mod transport;
mod worker;

use backend::Backend;
pub use inspect::StoredMessage;
pub use options::OutboxOptions;
use record::NewRow;
pub use transport::OutboxTransport;
pub use worker::Worker;

/// A durable queue of messages waiting for a provider: SQLite in one file, or PostgreSQL.
///
/// Cheap to clone: clones share the database's connection pool. See the
/// [module docs](self) for how messages are scheduled and what "delivered" means here.
#[derive(Clone)]
pub struct Outbox {
    backend: Arc<dyn Backend>,
    /// Wakes this process's idle workers when something is enqueued here.
    enqueued: Arc<Notify>,
    /// The messages this process's workers delivered from here, their answers written.
    sent: Arc<std::sync::atomic::AtomicU64>,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    #[cfg(feature = "postgres")]
    Postgres,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox").field("kind", &self.kind).finish()
    }
}

/// A message's id in its outbox.
///
/// ```
/// # use mail_breaker::outbox::OutboxId;
/// let id = OutboxId::from(42);
/// assert_eq!(id.to_string(), "42");
/// assert_eq!(i64::from(id), 42);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OutboxId(pub(crate) i64);

impl fmt::Display for OutboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<i64> for OutboxId {
    fn from(id: i64) -> Self {
        OutboxId(id)
    }
}

impl From<OutboxId> for i64 {
    fn from(id: OutboxId) -> Self {
        id.0
    }
}

/// What an outbox holds, from [`Outbox::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting to be sent (due or not, held by a worker or not); dead ones excluded.
    pub queued: u64,
    /// Queued messages due now that no worker holds.
    pub due: u64,
    /// Queued messages a worker holds right now (a send in flight).
    pub leased: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long the oldest queued message has waited; `None` when nothing is queued.
    pub oldest: Option<Duration>,
}

/// A message the outbox gave up on, from [`Outbox::dead_letters`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id: [`Outbox::requeue`] or [`Outbox::purge_dead`] it.
    pub id: OutboxId,
    /// Who it was for.
    pub envelope: Envelope,
    /// Why it died: the provider's error (`Rejected`, `InvalidMessage`), or one coded
    /// `outbox.expired` or `outbox.maybe_delivered` with the category of the last error.
    /// Read back from the database: category, code, message and transport.
    pub error: SendError,
    /// How many times a worker took it to send.
    pub attempts: u32,
    /// When it died.
    pub at: SystemTime,
}

impl DeadLetter {
    /// Whether it died because its recipients are on the suppression list (its error's code
    /// is `suppressed.bounced`, `suppressed.complained`, `suppressed.manual` or
    /// `suppressed.mixed`, from [`SuppressionTransport`](crate::suppression::SuppressionTransport)):
    /// a dead letter of its own kind, which `mail-breaker outbox requeue --all` and the
    /// operator page do not requeue, since sending it again would be refused again (or, once
    /// the address is removed from the list, should be a person's decision, one at a time).
    /// Not `suppressed.held`: an address held for a while after transient bounces is no
    /// refusal, and mail that died waiting for it may be requeued as any other.
    ///
    /// ```
    /// use mail_breaker::outbox::Outbox;
    /// use mail_breaker::{Category, LettreTransport, Message, SendError};
    /// use lettre::transport::stub::AsyncStubTransport;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = std::env::temp_dir().join(format!("outbox-suppressed-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
    /// # let message = Message::builder()
    /// #     .from("app@example.com".parse().unwrap())
    /// #     .to("user@example.org".parse().unwrap())
    /// #     .body(String::from("hello"))
    /// #     .unwrap();
    /// outbox.enqueue(&message).await?;
    /// let refusing = LettreTransport::new(AsyncStubTransport::new_error(), |_| {
    ///     SendError::new(Category::Rejected, "smtp.550", "no such user")
    /// });
    /// outbox.worker(refusing).drain().await?;
    /// assert!(!outbox.dead_letters(10).await?[0].is_suppressed());
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), mail_breaker::SendError>(())
    /// # }).unwrap();
    /// ```
    pub fn is_suppressed(&self) -> bool {
        is_suppressed_code(self.error.code())
    }
}

/// Whether an error's code says its recipients are suppressed (for good, not held a while).
pub(crate) fn is_suppressed_code(code: &str) -> bool {
    code.starts_with("suppressed.") && code != "suppressed.held"
}

#[cfg(test)]
#[test]
fn only_a_recipient_suppressed_for_good_makes_a_dead_letter_of_the_suppressed_kind() {
    for code in [
        "suppressed.bounced",
        "suppressed.complained",
        "suppressed.manual",
        "suppressed.mixed",
    ] {
        assert!(is_suppressed_code(code), "{code}");
    }
    for code in ["suppressed.held", "smtp.550", "suppression.unavailable"] {
        assert!(!is_suppressed_code(code), "{code}");
    }
}

impl Outbox {
    /// Opens the outbox in the SQLite file at `path`, creating the file and its table if
    /// missing. The file is in WAL mode and every commit waits for its sync to disk.
    ///
    /// Several processes may open one file; their workers never send one message at once.
    /// An error is `Configuration` when the file cannot be opened or created.
    pub async fn sqlite(path: impl AsRef<Path>) -> Result<Outbox, SendError> {
        Outbox::sqlite_with(path, &OutboxOptions::new()).await
    }

    /// [`sqlite`](Self::sqlite) with its pool's size set by `options`; `Configuration` for
    /// options out of range.
    pub async fn sqlite_with(
        path: impl AsRef<Path>,
        options: &OutboxOptions,
    ) -> Result<Outbox, SendError> {
        options.validate().map_err(config_error)?;
        let backend = sqlite::SqliteBackend::open(path.as_ref(), options).await?;
        Ok(Outbox::with(Arc::new(backend), Kind::Sqlite))
    }

    /// Opens the outbox in the PostgreSQL database at `url`
    /// (`postgres://user:password@host/database`), creating its table if missing. Workers in
    /// many processes share its queue: each claims due messages with `FOR UPDATE SKIP LOCKED`.
    ///
    /// A table an earlier version of this crate made is upgraded here (a `lease_until`
    /// column, and half of each page kept free so that claims update rows in place). Stop
    /// that version's workers first: they do not read the leases this version writes.
    ///
    /// Bodies are compressed with lz4 where the server has it (PostgreSQL 14 and later, built
    /// with it), unless a compression was chosen for the column already. Opening sets it once,
    /// as the table's owner: the role that opens the outbox owns its table already, since it
    /// creates the table and its indexes when they are missing.
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str) -> Result<Outbox, SendError> {
        Outbox::postgres_with(url, &OutboxOptions::new()).await
    }

    /// [`postgres`](Self::postgres) with its pools' sizes and its statements' bound set by
    /// `options`; `Configuration` for options out of range.
    #[cfg(feature = "postgres")]
    pub async fn postgres_with(url: &str, options: &OutboxOptions) -> Result<Outbox, SendError> {
        options.validate().map_err(config_error)?;
        let backend = postgres::PostgresBackend::open(url, options).await?;
        Ok(Outbox::with(Arc::new(backend), Kind::Postgres))
    }

    fn with(backend: Arc<dyn Backend>, kind: Kind) -> Outbox {
        Outbox {
            backend,
            enqueued: Arc::new(Notify::new()),
            sent: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            kind,
        }
    }

    /// How many messages the workers of this process delivered from this outbox (and
    /// removed from it) since it was opened: the workers that other processes run on the
    /// same database are not counted. Clones of an outbox share the count.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::SendError> {
    /// let outbox = mail_breaker::outbox::Outbox::sqlite("outbox.db").await?;
    /// assert_eq!(outbox.sent_here(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sent_here(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts `count` more messages delivered by a worker of this process.
    fn count_sent(&self, count: u64) {
        self.sent
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps `message` to be sent; `Ok` once it is committed to the database. Its
    /// idempotency key is made now (or is the one [`idempotency::with_key`] gave) and kept
    /// with it.
    ///
    /// [`idempotency::with_key`]: crate::idempotency::with_key
    pub async fn enqueue(&self, message: &Message) -> Result<OutboxId, SendError> {
        self.enqueue_raw(message.envelope(), &message.formatted())
            .await
    }

    /// Keeps a formatted message to be sent to `envelope`; `Ok` once it is committed.
    pub async fn enqueue_raw(
        &self,
        envelope: &Envelope,
        raw: &[u8],
    ) -> Result<OutboxId, SendError> {
        let ids = self.store(&[NewRow::new(envelope, raw)]).await?;
        ids.into_iter().next().ok_or_else(|| {
            SendError::new(
                crate::Category::ServiceUnavailable,
                "outbox.database",
                "the database stored no row for the message",
            )
        })
    }

    /// Keeps every message of `messages` in one transaction: all or none, and much faster
    /// than one at a time. Their ids, in order.
    pub async fn enqueue_many(&self, messages: &[Message]) -> Result<Vec<OutboxId>, SendError> {
        let rows: Vec<NewRow> = messages
            .iter()
            .map(|message| NewRow::new(message.envelope(), &message.formatted()))
            .collect();
        self.store(&rows).await
    }

    /// Keeps, in one transaction, `queued` to be sent and `dead` as dead letters: what
    /// `send_or_queue` keeps of a delivery that did not reach every recipient.
    pub(crate) async fn keep_split(
        &self,
        queued: &[NewRow],
        dead: &[(NewRow, record::StoredError)],
    ) -> Result<(), SendError> {
        self.backend.keep_split(queued, dead, record::now()).await?;
        if !queued.is_empty() {
            self.enqueued.notify_waiters();
        }
        Ok(())
    }

    async fn store(&self, rows: &[NewRow]) -> Result<Vec<OutboxId>, SendError> {
        let ids = self.backend.enqueue(rows, record::now()).await?;
        self.enqueued.notify_waiters();
        Ok(ids)
    }

    /// Keeps `message` in the caller's own transaction (or connection), so that it commits,
    /// or rolls back, with the caller's own writes: the transactional-outbox pattern. The
    /// connection must be to the outbox's database (`&mut *tx` of an `sqlx::Transaction` on
    /// SQLite or PostgreSQL). A worker sees the message once the caller commits.
    ///
    /// ```no_run
    /// # async fn signup(pool: sqlx::SqlitePool, outbox: mail_breaker::outbox::Outbox, welcome: mail_breaker::Message) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO users (email) VALUES (?)").bind("user@example.org").execute(&mut *tx).await?;
    /// outbox.enqueue_in(&mut *tx, &welcome).await?;
    /// tx.commit().await?; // the user and the welcome mail, together or not at all
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_in<C: OutboxConnection>(
        &self,
        connection: C,
        message: &Message,
    ) -> Result<OutboxId, SendError> {
        let row = NewRow::new(message.envelope(), &message.formatted());
        let id = connection.insert(row, record::now()).await?;
        // It is visible only after the caller commits; a woken worker that finds nothing
        // falls back to its poll.
        self.enqueued.notify_waiters();
        Ok(id)
    }

    /// A worker that sends this outbox's due messages through `transport` (the breaker
    /// stack); set it up with its builder methods, then [`run`](Worker::run) or
    /// [`drain`](Worker::drain) it.
    pub fn worker<T: Transport + 'static>(&self, transport: T) -> Worker<T> {
        Worker::new(self.clone(), transport)
    }

    /// Counts what the outbox holds. The queued and dead (and on PostgreSQL the held) are
    /// counts the database keeps as the queue changes, and the oldest is an index's first
    /// entry: a call reads none of a due backlog, only the messages waiting for a retry, and
    /// takes well under a millisecond with a million queued.
    ///
    /// # Example
    /// ```
    /// use mail_breaker::outbox::Outbox;
    ///
    /// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
    /// let dir = std::env::temp_dir().join(format!("outbox-stats-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
    /// let stats = outbox.stats().await?;
    /// assert_eq!((stats.queued, stats.due, stats.leased, stats.dead), (0, 0, 0, 0));
    /// assert_eq!(stats.oldest, None);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), mail_breaker::SendError>(())
    /// # }).unwrap();
    /// ```
    pub async fn stats(&self) -> Result<OutboxStats, SendError> {
        self.backend.stats(record::now()).await
    }

    /// Up to `limit` dead letters, those dead longest first.
    pub async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadLetter>, SendError> {
        self.backend
            .dead_letters(limit)
            .await?
            .into_iter()
            .map(record::DeadRow::read)
            .collect()
    }

    /// A page of dead letters, newest first: up to `limit` of those whose ids are below
    /// `before` (from the newest for `None`). The last one's id is the cursor of the next
    /// page; an empty page is the end. Newest is by id, the order messages entered the
    /// outbox, so a page is the same whatever dies or is requeued meanwhile: a letter that
    /// dies during a walk is on a page already read (or a later one), and none is read twice.
    /// One statement, on an index of the dead letters alone: a page reads none of the queue.
    ///
    /// ```
    /// use mail_breaker::outbox::Outbox;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = std::env::temp_dir().join(format!("outbox-dead-page-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
    /// let mut before = None;
    /// loop {
    ///     let page = outbox.dead_letters_page(before, 500).await?;
    ///     let Some(last) = page.last() else { break };
    ///     for letter in &page {
    ///         println!("{}: {}", letter.id, letter.error);
    ///     }
    ///     before = Some(last.id);
    /// }
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), mail_breaker::SendError>(())
    /// # }).unwrap();
    /// ```
    pub async fn dead_letters_page(
        &self,
        before: Option<OutboxId>,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, SendError> {
        self.backend
            .dead_letters_page(before, limit)
            .await?
            .into_iter()
            .map(record::DeadRow::read)
            .collect()
    }

    /// Makes a dead letter due again now, as if enqueued now: its age (for `max_age`) and
    /// its attempt count start afresh; its last error is kept until the next answer.
    /// `Ok(false)` when `id` is not a dead letter.
    pub async fn requeue(&self, id: OutboxId) -> Result<bool, SendError> {
        let requeued = self.backend.requeue(id, record::now()).await?;
        self.enqueued.notify_waiters();
        Ok(requeued)
    }

    /// Deletes a message, queued or dead. `Ok(false)` when there was none with `id`.
    /// To delete a dead letter and never mail still waiting to be sent, use
    /// [`purge_dead`](Self::purge_dead).
    pub async fn purge(&self, id: OutboxId) -> Result<bool, SendError> {
        self.backend.purge(id).await
    }

    /// Deletes the message `id` only if it is a dead letter, in one statement: a message
    /// requeued (by another operator, or another process) after it was read dead is left
    /// queued. `Ok(false)` when `id` is not a dead letter now (queued, being sent, or gone).
    ///
    /// ```
    /// use mail_breaker::outbox::Outbox;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = std::env::temp_dir().join(format!("outbox-purge-dead-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let outbox = Outbox::sqlite(dir.join("mail.db")).await?;
    /// # let message = mail_breaker::Message::builder()
    /// #     .from("app@example.com".parse().unwrap())
    /// #     .to("user@example.org".parse().unwrap())
    /// #     .body(String::from("welcome"))
    /// #     .unwrap();
    /// let id = outbox.enqueue(&message).await?;
    /// assert!(!outbox.purge_dead(id).await?, "queued mail is not deleted");
    /// assert_eq!(outbox.stats().await?.queued, 1);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), mail_breaker::SendError>(())
    /// # }).unwrap();
    /// ```
    pub async fn purge_dead(&self, id: OutboxId) -> Result<bool, SendError> {
        self.backend.purge_dead(id).await
    }

    /// The database's pool for the suppression list, `None` for an outbox without one.
    #[cfg(feature = "webhooks")]
    pub(crate) fn suppression_store(&self) -> Option<crate::suppression::SqlStore> {
        self.backend.suppression_store()
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    pub(crate) fn enqueued(&self) -> &Notify {
        &self.enqueued
    }
}

fn config_error(error: crate::ConfigError) -> SendError {
    SendError::new(
        crate::Category::Configuration,
        "outbox.config",
        error.to_string(),
    )
}

/// A connection [`Outbox::enqueue_in`] can write to: `&mut sqlx::SqliteConnection`, or
/// `&mut sqlx::PgConnection` with the `postgres` feature (what `&mut *tx` gives for an
/// `sqlx::Transaction`).
pub trait OutboxConnection: sealed::Insert {}

impl<C: sealed::Insert> OutboxConnection for C {}

mod sealed {
    use super::record::{self, NewRow};
    use super::schedule::Millis;
    use super::{OutboxId, SendError};

    /// How each kind of connection stores a row.
    #[async_trait::async_trait]
    pub trait Insert: Send {
        async fn insert(self, row: NewRow, now: Millis) -> Result<OutboxId, SendError>;
    }

    #[async_trait::async_trait]
    impl Insert for &mut sqlx::SqliteConnection {
        async fn insert(self, row: NewRow, now: Millis) -> Result<OutboxId, SendError> {
            super::sqlite::insert(self, &row, now)
                .await
                .map_err(|e| record::database_error("enqueueing in the caller's transaction", e))
        }
    }

    #[cfg(feature = "postgres")]
    #[async_trait::async_trait]
    impl Insert for &mut sqlx::PgConnection {
        async fn insert(self, row: NewRow, _now: Millis) -> Result<OutboxId, SendError> {
            super::postgres::insert(self, &row)
                .await
                .map_err(|e| record::database_error("enqueueing in the caller's transaction", e))
        }
    }
}
