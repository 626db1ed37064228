//! The outbox in an SQLite file: WAL, every enqueue synced to disk, and a claim made by one
//! `UPDATE`, which takes SQLite's write lock before it reads which messages are due, so that
//! workers in several processes on one file never claim alike.
//!
//! The bodies live in a table of their own, `mail_breaker_outbox_body`, so that the scans of
//! the scheduling table (a claim's choice of due messages, `stats`, the dead letters) and a
//! claim's rewrite of its rows never read a body: a claim reads only the bodies it took.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row, Sqlite};

use super::backend::{Backend, Bytes, DeadPart, Failed, Finish};
use super::inspect::MessageRow;
use super::lanes::Lanes;
use super::record::{
    Claim, Claimed, DeadRow, NewRow, StoredError, database_error, database_error_of,
};
use super::schedule::{Millis, millis};
use super::{OutboxId, OutboxStats};
use crate::{Category, SendError};

/// The tables and indexes, made where missing; the one index an earlier version made that
/// this one replaced is dropped.
///
/// The schedule's index (issue 50) holds `leased`, and `dead_at` (NULL in every entry), so that
/// `stats` counts the messages not yet due from the index alone: SQLite does not take a
/// partial index's condition for the value of its column. It replaces the index on
/// `(due_at, id)` alone, which a claim updated as much (a claim changes `due_at`). The index on
/// `enqueued_at` gives the oldest message's wait without a scan; no claim changes it.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS mail_breaker_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sender TEXT,
    recipients TEXT NOT NULL,
    enqueued_at INTEGER NOT NULL,
    due_at INTEGER NOT NULL,
    leased INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    dead_at INTEGER,
    error_category TEXT,
    error_code TEXT,
    error_message TEXT,
    error_transport TEXT,
    panics INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT
);
CREATE TABLE IF NOT EXISTS mail_breaker_outbox_body (
    id INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS mail_breaker_outbox_body_gone
    AFTER DELETE ON mail_breaker_outbox
    BEGIN DELETE FROM mail_breaker_outbox_body WHERE id = OLD.id; END;
CREATE INDEX IF NOT EXISTS mail_breaker_outbox_schedule
    ON mail_breaker_outbox (due_at, id, leased, dead_at) WHERE dead_at IS NULL;
DROP INDEX IF EXISTS mail_breaker_outbox_due;
CREATE INDEX IF NOT EXISTS mail_breaker_outbox_dead
    ON mail_breaker_outbox (dead_at, id) WHERE dead_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS mail_breaker_outbox_waiting
    ON mail_breaker_outbox (enqueued_at) WHERE dead_at IS NULL;
CREATE INDEX IF NOT EXISTS mail_breaker_outbox_dead_by_id
    ON mail_breaker_outbox (id) WHERE dead_at IS NOT NULL;
";

/// Whether the table lacks its kept counts (issue 50): made, with the triggers that keep them,
/// in one transaction under the write lock, from a count of the rows as they are then.
const LACKS_COUNTS: &str = "SELECT NOT EXISTS (SELECT 1 FROM sqlite_master \
     WHERE type = 'table' AND name = 'mail_breaker_outbox_counts')";

/// The queued and dead messages, counted as each row comes, goes or dies (or is requeued), so
/// that `stats` never counts the whole queue. One row, updated by every write: SQLite's
/// writers take turns anyway.
const KEEP_COUNTS: [&str; 5] = [
    "CREATE TABLE mail_breaker_outbox_counts (
        one INTEGER PRIMARY KEY CHECK (one = 1),
        queued INTEGER NOT NULL,
        dead INTEGER NOT NULL
    )",
    "INSERT INTO mail_breaker_outbox_counts (one, queued, dead) \
     SELECT 1, COALESCE(SUM(dead_at IS NULL), 0), COALESCE(SUM(dead_at IS NOT NULL), 0) \
     FROM mail_breaker_outbox",
    "CREATE TRIGGER mail_breaker_outbox_counted_in AFTER INSERT ON mail_breaker_outbox BEGIN \
     UPDATE mail_breaker_outbox_counts SET queued = queued + (NEW.dead_at IS NULL), \
     dead = dead + (NEW.dead_at IS NOT NULL); END",
    "CREATE TRIGGER mail_breaker_outbox_counted_out AFTER DELETE ON mail_breaker_outbox BEGIN \
     UPDATE mail_breaker_outbox_counts SET queued = queued - (OLD.dead_at IS NULL), \
     dead = dead - (OLD.dead_at IS NOT NULL); END",
    "CREATE TRIGGER mail_breaker_outbox_counted_dead AFTER UPDATE OF dead_at \
     ON mail_breaker_outbox WHEN (OLD.dead_at IS NULL) <> (NEW.dead_at IS NULL) BEGIN \
     UPDATE mail_breaker_outbox_counts SET \
     queued = queued + (NEW.dead_at IS NULL) - (OLD.dead_at IS NULL), \
     dead = dead + (NEW.dead_at IS NOT NULL) - (OLD.dead_at IS NOT NULL); END",
];

/// A table made before `panics` (issue 45) gets it: whether it lacks it, and the change.
const LACKS_PANICS: &str = "SELECT NOT EXISTS (SELECT 1 FROM pragma_table_info('mail_breaker_outbox') \
     WHERE name = 'panics')";
const ADD_PANICS: &str =
    "ALTER TABLE mail_breaker_outbox ADD COLUMN panics INTEGER NOT NULL DEFAULT 0";

/// A table made before idempotency keys (issue 65) gets their column: whether it lacks it,
/// and the change. Its rows keep none, and are sent under a key made from their id.
const LACKS_KEYS: &str = "SELECT NOT EXISTS (SELECT 1 FROM pragma_table_info('mail_breaker_outbox') \
     WHERE name = 'idempotency_key')";
const ADD_KEYS: &str = "ALTER TABLE mail_breaker_outbox ADD COLUMN idempotency_key TEXT";

/// A table made before the bodies had their own (issue 45) holds them in `raw`: whether it
/// does, and the move of each body to the body table, its size kept beside the schedule.
const HOLDS_BODIES: &str = "SELECT EXISTS (SELECT 1 FROM pragma_table_info('mail_breaker_outbox') \
     WHERE name = 'raw')";
const MOVE_BODIES: [&str; 4] = [
    "ALTER TABLE mail_breaker_outbox ADD COLUMN size INTEGER NOT NULL DEFAULT 0",
    "INSERT INTO mail_breaker_outbox_body (id, raw) SELECT id, raw FROM mail_breaker_outbox",
    "UPDATE mail_breaker_outbox SET size = length(raw)",
    "ALTER TABLE mail_breaker_outbox DROP COLUMN raw",
];

/// Counts a send that panicked (the error's code is parameter 5).
macro_rules! count_panic {
    () => {
        "panics = panics + (CASE WHEN ?5 = 'transport.panicked' THEN 1 ELSE 0 END), "
    };
}

/// A claim handed back unstarted: free, due at once, not counted as an attempt.
const GIVE_BACK: &str = "UPDATE mail_breaker_outbox SET leased = 0, attempts = attempts - 1, \
     due_at = ?3 WHERE id = ?1 AND attempts = ?2 AND leased > 0";

/// A failed claim's update: dead, or due again; its time, error and narrowed recipients.
const FAILED_DEAD: &str = concat!(
    "UPDATE mail_breaker_outbox SET leased = 0, dead_at = ?3, ",
    count_panic!(),
    "error_category = ?4, error_code = ?5, error_message = ?6, error_transport = ?7, \
     recipients = COALESCE(?8, recipients) WHERE id = ?1 AND attempts = ?2 AND leased > 0"
);
const FAILED_RETRY: &str = concat!(
    "UPDATE mail_breaker_outbox SET leased = 0, due_at = ?3, ",
    count_panic!(),
    "error_category = ?4, error_code = ?5, error_message = ?6, error_transport = ?7, \
     recipients = COALESCE(?8, recipients) WHERE id = ?1 AND attempts = ?2 AND leased > 0"
);

const INSERT: &str = "INSERT INTO mail_breaker_outbox \
     (sender, recipients, size, enqueued_at, due_at, idempotency_key) \
     VALUES (?1, ?2, ?3, ?4, ?4, ?5) RETURNING id";
const INSERT_BODY: &str = "INSERT INTO mail_breaker_outbox_body (id, raw) VALUES (?1, ?2)";

/// A dead letter of its own for some recipients of row `?1` (DESIGN §19): the row's sender,
/// size, times and attempts, dead at `?3` with the error `?4`..`?7`, for recipients `?2`.
const COPY_DEAD: &str = "INSERT INTO mail_breaker_outbox \
     (sender, recipients, size, enqueued_at, due_at, attempts, dead_at, \
      error_category, error_code, error_message, error_transport, idempotency_key) \
     SELECT sender, ?2, size, enqueued_at, due_at, attempts, ?3, ?4, ?5, ?6, ?7, \
     idempotency_key \
     FROM mail_breaker_outbox WHERE id = ?1 RETURNING id";
/// The body of the copy `?2` of row `?1`.
const COPY_BODY: &str = "INSERT INTO mail_breaker_outbox_body (id, raw) \
     SELECT ?2, raw FROM mail_breaker_outbox_body WHERE id = ?1";
/// A message born dead, tried once: `send_or_queue`'s record of refused recipients.
const INSERT_DEAD: &str = "INSERT INTO mail_breaker_outbox \
     (sender, recipients, size, enqueued_at, due_at, attempts, dead_at, \
      error_category, error_code, error_message, error_transport, idempotency_key) \
     VALUES (?1, ?2, ?3, ?4, ?4, 1, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id";

/// Rows in one INSERT of a batch: 6 parameters each, well below SQLite's 32,766.
const ROWS_PER_INSERT: usize = 500;

/// The due messages a claim takes, soonest first; the same rows for the read and the update.
/// Of those, the ones whose bodies fit in `?4` bytes with the bodies before them, and those
/// with fewer than `?5` bytes before them (the first, when `?5` is 1): their sizes are kept
/// beside the schedule, so the choice reads no body.
const DUE: &str = "SELECT id FROM (SELECT id, size, \
     SUM(size) OVER (ORDER BY due_at, id ROWS UNBOUNDED PRECEDING) AS total \
     FROM (SELECT id, due_at, size FROM mail_breaker_outbox \
     WHERE dead_at IS NULL AND due_at <= ?1 ORDER BY due_at, id LIMIT ?2)) \
     WHERE total <= ?4 OR total - size < ?5";

/// A claim: the due messages it takes (`DUE`) leased until `?3`, each with its body.
fn claim_sql() -> String {
    format!(
        "UPDATE mail_breaker_outbox SET attempts = attempts + 1, leased = leased + 1, \
         due_at = ?3 WHERE id IN ({DUE}) \
         RETURNING id, attempts, enqueued_at, leased, sender, recipients, \
         (SELECT raw FROM mail_breaker_outbox_body AS body \
          WHERE body.id = mail_breaker_outbox.id), panics, idempotency_key"
    )
}

/// The soonest due time of a queued message, held or not.
const NEXT_DUE: &str = "SELECT MIN(due_at) FROM mail_breaker_outbox WHERE dead_at IS NULL";

/// The oldest `?1` dead letters, without their bodies.
const DEAD_LETTERS: &str = "SELECT id, sender, recipients, attempts, dead_at, \
       error_category, error_code, error_message, error_transport \
     FROM mail_breaker_outbox WHERE dead_at IS NOT NULL \
     ORDER BY dead_at, id LIMIT ?1";

/// The `?2` dead letters below id `?1`, newest first, without their bodies: a page of them.
/// The index of dead ids alone, named, so that a page never walks the queued rows between
/// two dead ones (as the primary key's order would).
pub(crate) const DEAD_LETTERS_PAGE: &str = "SELECT id, sender, recipients, attempts, dead_at, \
       error_category, error_code, error_message, error_transport \
     FROM mail_breaker_outbox INDEXED BY mail_breaker_outbox_dead_by_id \
     WHERE dead_at IS NOT NULL AND id < ?1 ORDER BY id DESC LIMIT ?2";

/// A dead letter queued again at `?2`, as if enqueued then.
const REQUEUE: &str = "UPDATE mail_breaker_outbox SET dead_at = NULL, leased = 0, due_at = ?2, \
     enqueued_at = ?2, attempts = 0, panics = 0 WHERE id = ?1 AND dead_at IS NOT NULL";

/// A message deleted, queued or dead (its body goes with it, by trigger).
const PURGE: &str = "DELETE FROM mail_breaker_outbox WHERE id = ?1";

/// A message deleted only if it is dead now.
const PURGE_DEAD: &str = "DELETE FROM mail_breaker_outbox WHERE id = ?1 AND dead_at IS NOT NULL";

/// The counts of `stats`: the queued and the dead as kept, and the messages not yet due (a
/// retry's wait, or a lease running) from the schedule's index, the due being the rest. It
/// reads as many index entries as there are messages not yet due, none of the due backlog,
/// and no row.
const STATS: &str = "SELECT counts.queued, counts.queued - later.waiting, later.held, counts.dead, \
       (SELECT MIN(enqueued_at) FROM mail_breaker_outbox WHERE dead_at IS NULL) \
     FROM mail_breaker_outbox_counts AS counts, \
       (SELECT COUNT(*) AS waiting, COALESCE(SUM(leased > 0), 0) AS held \
        FROM mail_breaker_outbox WHERE dead_at IS NULL AND due_at > ?1) AS later \
     WHERE counts.one = 1";

/// The outbox's SQLite database.
#[derive(Debug, Clone)]
pub(crate) struct SqliteBackend {
    /// Every commit synced to disk: enqueues and claims.
    pool: SqlitePool,
    /// Commits synced at WAL checkpoints only: a worker's answers, give-backs and (but under
    /// `at_most_once`) claims, which a power cut may undo safely. An answer lost leaves the
    /// message leased, so it is sent again when the lease runs out (at least once), or dead
    /// as maybe delivered under `at_most_once`; a give-back lost is the same lease running
    /// out; a claim lost is a message sent again. One connection: the worker's claims and
    /// answers queue for it in this process rather than meet at SQLite's write lock, whose
    /// busy wait sleeps a millisecond or more.
    relaxed: Arc<Lanes<SqliteConnection>>,
}

impl SqliteBackend {
    /// Opens (creating it if missing, unless `settings` say it must exist) the database file
    /// at `path` and its table.
    pub(crate) async fn open(
        path: &Path,
        settings: &super::OutboxOptions,
    ) -> Result<SqliteBackend, SendError> {
        let create = !settings.get_existing_file_only();
        if !create {
            if !path.exists() {
                return Err(missing_file(path));
            }
            // Before anything below writes to it (its journal mode, the tables).
            holds_an_outbox(path).await?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            // Even a file removed since the check above is not made anew.
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            // `Ok` from `enqueue` means on disk: each commit waits for its sync.
            .synchronous(SqliteSynchronous::Full)
            // Workers in other processes hold the write lock for a claim's few milliseconds.
            .busy_timeout(Duration::from_secs(10));
        let opening = |e| database_error_of(Category::Configuration, "opening the SQLite file", e);
        let pool = SqlitePoolOptions::new()
            .max_connections(settings.get_connections_or(4))
            .connect_with(options.clone())
            .await
            .map_err(opening)?;
        sqlx::raw_sql(SCHEMA)
            .execute(&pool)
            .await
            .map_err(|e| database_error("creating the outbox's table", e))?;
        // The suppression list's tables live beside the outbox's (`crate::suppression`).
        #[cfg(feature = "webhooks")]
        for statement in crate::suppression::sql_schema() {
            sqlx::query(statement)
                .execute(&pool)
                .await
                .map_err(|e| database_error("creating the suppression list's tables", e))?;
        }
        // Each upgrade of an older file is made by one process, under the write lock and in
        // one transaction: two processes opening the file at once do not both make it, and
        // a crash half way leaves the file as it was (no write falls between the counts'
        // count and their triggers).
        let upgrades: [(&str, &[&str], &'static str); 4] = [
            (LACKS_PANICS, &[ADD_PANICS], "upgrading the outbox's table"),
            (
                LACKS_KEYS,
                &[ADD_KEYS],
                "keeping idempotency keys in the outbox's table",
            ),
            (
                HOLDS_BODIES,
                &MOVE_BODIES,
                "moving the outbox's bodies to their own table",
            ),
            (LACKS_COUNTS, &KEEP_COUNTS, "counting the outbox's messages"),
        ];
        for (needed, steps, doing) in upgrades {
            upgrade_once(&pool, needed, steps)
                .await
                .map_err(|e| database_error(doing, e))?;
        }
        let relaxed = options.synchronous(SqliteSynchronous::Normal);
        // Opened now, so that a file that cannot be opened fails here rather than in the worker.
        let first = relaxed.connect().await.map_err(opening)?;
        let relaxed = Lanes::new(
            1,
            Box::new(move || {
                let options = relaxed.clone();
                Box::pin(async move { options.connect().await })
            }),
        );
        relaxed.give(first);
        Ok(SqliteBackend {
            pool,
            relaxed: Arc::new(relaxed),
        })
    }
}

/// The error for an outbox file that must exist and does not: its path, and for a relative
/// one the folder it was looked for in (where the command ran, maybe not where the
/// application runs).
/// The first bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Whether the file at `path` already holds an outbox's table, read without writing to it:
/// a file that is not an SQLite database (an empty one included, which SQLite would take as
/// a new database) or that holds no outbox is an error naming it, and is left as it is.
async fn holds_an_outbox(path: &Path) -> Result<(), SendError> {
    let not_an_outbox = |why: &str| {
        SendError::new(
            Category::Configuration,
            "outbox.not_an_outbox",
            format!(
                "{} is not an outbox ({why}): an outbox is opened only where its application \
                 made one, and no other file is changed",
                path.display()
            ),
        )
    };
    let read = tokio::task::spawn_blocking({
        let path = path.to_owned();
        move || -> std::io::Result<[u8; 16]> {
            use std::io::Read as _;
            let mut header = [0u8; 16];
            std::fs::File::open(path)?.read_exact(&mut header)?;
            Ok(header)
        }
    })
    .await;
    match read {
        Ok(Ok(header)) if &header == SQLITE_HEADER => {}
        Ok(Err(error)) if error.kind() != std::io::ErrorKind::UnexpectedEof => {
            return Err(SendError::new(
                Category::Configuration,
                "outbox.unreadable",
                format!("cannot read the outbox file {}: {error}", path.display()),
            ));
        }
        _ => return Err(not_an_outbox("not an SQLite database")),
    }
    // Neither made if missing nor set to WAL: only read.
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .busy_timeout(Duration::from_secs(10));
    let mut connection = options
        .connect()
        .await
        .map_err(|e| database_error_of(Category::Configuration, "opening the SQLite file", e))?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'mail_breaker_outbox'",
    )
    .fetch_one(&mut connection)
    .await
    .map_err(|_| not_an_outbox("not an SQLite database"))?;
    let _ = connection.close().await;
    if tables == 0 {
        return Err(not_an_outbox(
            "an SQLite database without the outbox's table",
        ));
    }
    Ok(())
}

fn missing_file(path: &Path) -> SendError {
    let folder = if path.is_relative() {
        std::env::current_dir()
            .map(|folder| format!(" (in {})", folder.display()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    SendError::new(
        Category::Configuration,
        "outbox.missing",
        format!(
            "no outbox file at {}{folder}: an outbox is read only where its application keeps \
             it, and none is made here",
            path.display()
        ),
    )
}

/// Runs `steps` in one `BEGIN IMMEDIATE` transaction if `needed` (a query of one boolean,
/// asked in it) says so.
async fn upgrade_once(pool: &SqlitePool, needed: &str, steps: &[&str]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let needed: bool = sqlx::query_scalar(needed).fetch_one(&mut *tx).await?;
    if needed {
        for step in steps {
            sqlx::query(step).execute(&mut *tx).await?;
        }
    }
    tx.commit().await
}

/// Stores one row in the caller's connection (and so in its transaction, if it is in one).
pub(crate) async fn insert(
    connection: &mut SqliteConnection,
    row: &NewRow,
    now: Millis,
) -> Result<OutboxId, sqlx::Error> {
    let id: i64 = sqlx::query(INSERT)
        .bind(row.sender.as_deref())
        .bind(row.recipients.as_str())
        .bind(size_of(row))
        .bind(now)
        .bind(row.key.as_str())
        .fetch_one(&mut *connection)
        .await?
        .try_get(0)?;
    sqlx::query(INSERT_BODY)
        .bind(id)
        .bind(row.raw.as_slice())
        .execute(connection)
        .await?;
    Ok(OutboxId(id))
}

/// A body's size as the claim's choice counts it.
fn size_of(row: &NewRow) -> i64 {
    i64::try_from(row.raw.len()).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl Backend for SqliteBackend {
    #[cfg(feature = "webhooks")]
    fn suppression_store(&self) -> Option<crate::suppression::SqlStore> {
        Some(crate::suppression::SqlStore::Sqlite(self.pool.clone()))
    }

    #[cfg(feature = "admin")]
    fn database(&self) -> Option<super::admin_reads::Database<'_>> {
        Some(super::admin_reads::Database::Sqlite(&self.pool))
    }

    async fn enqueue(&self, rows: &[NewRow], now: Millis) -> Result<Vec<OutboxId>, SendError> {
        let stored = async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let mut ids = Vec::with_capacity(rows.len());
            for chunk in rows.chunks(ROWS_PER_INSERT) {
                let values = vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
                let sql = format!(
                    "INSERT INTO mail_breaker_outbox \
                     (sender, recipients, size, enqueued_at, due_at, idempotency_key) \
                     VALUES {values} RETURNING id"
                );
                let mut insert = sqlx::query_scalar::<_, i64>(&sql);
                for row in chunk {
                    insert = insert
                        .bind(row.sender.as_deref())
                        .bind(row.recipients.as_str())
                        .bind(size_of(row))
                        .bind(now)
                        .bind(now)
                        .bind(row.key.as_str());
                }
                let mut chunk_ids = insert.fetch_all(&mut *tx).await?;
                // One statement numbers its rows in the order of VALUES, which RETURNING
                // need not keep.
                chunk_ids.sort_unstable();
                let values = vec!["(?, ?)"; chunk.len()].join(", ");
                let sql = format!("INSERT INTO mail_breaker_outbox_body (id, raw) VALUES {values}");
                let mut bodies = sqlx::query(&sql);
                for (id, row) in chunk_ids.iter().zip(chunk) {
                    bodies = bodies.bind(id).bind(row.raw.as_slice());
                }
                bodies.execute(&mut *tx).await?;
                ids.extend(chunk_ids.into_iter().map(OutboxId));
            }
            tx.commit().await?;
            Ok(ids)
        };
        stored.await.map_err(|e| database_error("enqueueing", e))
    }

    async fn keep_split(
        &self,
        queued: &[NewRow],
        dead: &[(NewRow, StoredError)],
        now: Millis,
    ) -> Result<(), SendError> {
        let stored = async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            for row in queued {
                let id: i64 = sqlx::query_scalar(INSERT)
                    .bind(row.sender.as_deref())
                    .bind(row.recipients.as_str())
                    .bind(size_of(row))
                    .bind(now)
                    .bind(row.key.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
                let body = sqlx::query(INSERT_BODY).bind(id).bind(row.raw.as_slice());
                body.execute(&mut *tx).await?;
            }
            for (row, error) in dead {
                let id: i64 = sqlx::query_scalar(INSERT_DEAD)
                    .bind(row.sender.as_deref())
                    .bind(row.recipients.as_str())
                    .bind(size_of(row))
                    .bind(now)
                    .bind(error.category.as_deref())
                    .bind(error.code.as_deref())
                    .bind(error.message.as_deref())
                    .bind(error.transport.as_deref())
                    .bind(row.key.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
                let body = sqlx::query(INSERT_BODY).bind(id).bind(row.raw.as_slice());
                body.execute(&mut *tx).await?;
            }
            tx.commit().await
        };
        stored
            .await
            .map_err(|e| database_error("keeping a partial delivery", e))
    }

    async fn claim(
        &self,
        now: Millis,
        lease: Duration,
        limit: u32,
        bytes: Bytes,
        durable: bool,
    ) -> Result<Vec<Claimed>, SendError> {
        let lease_until = now.saturating_add(millis(lease));
        let (max_bytes, first) = bytes.parameters();
        let claimed = async {
            // One statement, so one transaction by itself: SQLite takes the write lock as the
            // statement starts, before it reads which messages are due, so no other writer
            // can claim the same ones in between.
            // `leased` counts the claims since the message was last free: 2 or more says a
            // worker held it before and its lease ran out.
            let sql = claim_sql();
            let claim = sqlx::query(&sql)
                .bind(now)
                .bind(limit)
                .bind(lease_until)
                .bind(max_bytes)
                .bind(first);
            let mut rows = if durable {
                claim.fetch_all(&self.pool).await?
            } else {
                let mut lane = self.relaxed.get().await?;
                let rows = claim.fetch_all(lane.connection()).await?;
                lane.done();
                rows
            };
            // RETURNING keeps no order; ids go with enqueue order.
            rows.sort_by_key(|row| row.try_get::<i64, _>(0).unwrap_or(0));
            rows.into_iter()
                .map(|row| {
                    Ok(Claimed {
                        claim: Claim {
                            id: OutboxId(row.try_get(0)?),
                            attempts: row.try_get(1)?,
                        },
                        enqueued_at: row.try_get(2)?,
                        lease_lost: row.try_get::<i64, _>(3)? > 1,
                        sender: row.try_get(4)?,
                        recipients: row.try_get(5)?,
                        raw: row.try_get(6)?,
                        panics: row.try_get(7)?,
                        key: row.try_get(8)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()
        };
        claimed
            .await
            .map_err(|e| database_error("claiming due mail", e))
    }

    async fn renew(
        &self,
        claims: &[Claim],
        now: Millis,
        lease: Duration,
        durable: bool,
    ) -> Result<Vec<Claim>, SendError> {
        let lease_until = now.saturating_add(millis(lease));
        let renewed = async {
            let mut renewed = Vec::with_capacity(claims.len());
            for chunk in claims.chunks(ROWS_PER_INSERT) {
                let sql = renew_sql(chunk.len());
                let mut renew = sqlx::query(&sql).bind(lease_until);
                for claim in chunk {
                    renew = renew.bind(claim.id.0);
                }
                for claim in chunk {
                    renew = renew.bind(claim.id.0).bind(claim.attempts);
                }
                let rows = if durable {
                    renew.fetch_all(&self.pool).await?
                } else {
                    let mut lane = self.relaxed.get().await?;
                    let rows = renew.fetch_all(lane.connection()).await?;
                    lane.done();
                    rows
                };
                for row in rows {
                    renewed.push(Claim {
                        id: OutboxId(row.try_get(0)?),
                        attempts: row.try_get(1)?,
                    });
                }
            }
            Ok(renewed)
        };
        renewed
            .await
            .map_err(|e| database_error("renewing leases", e))
    }

    async fn finish(&self, outcomes: &[(Claim, Finish)]) -> Result<(), SendError> {
        let written = async {
            // The delivered, the most of every batch, go in as few statements as there are
            // chunks of them.
            let sent: Vec<&Claim> = outcomes
                .iter()
                .filter(|(_, finish)| matches!(finish, Finish::Sent))
                .map(|(claim, _)| claim)
                .collect();
            // The usual batch, all delivered, is one statement: atomic by itself, without the
            // round trips of a transaction around it.
            let mut lane = self.relaxed.get().await?;
            if sent.len() == outcomes.len() && sent.len() <= ROWS_PER_INSERT {
                if !sent.is_empty() {
                    delete_sent(lane.connection(), &sent).await?;
                }
                lane.done();
                return Ok(());
            }
            let mut tx = lane.connection().begin_with("BEGIN IMMEDIATE").await?;
            for chunk in sent.chunks(ROWS_PER_INSERT) {
                delete_sent(&mut *tx, chunk).await?;
            }
            for (claim, finish) in outcomes {
                let keyed = |sql| sqlx::query(sql).bind(claim.id.0).bind(claim.attempts);
                if let Finish::GiveBack { now, wait } = finish {
                    let due_at = now.saturating_add(*wait);
                    keyed(GIVE_BACK).bind(due_at).execute(&mut *tx).await?;
                    continue;
                }
                let Some((failed, at, error, recipients)) = finish.failure() else {
                    continue;
                };
                let sql = match failed {
                    Failed::Dead => FAILED_DEAD,
                    Failed::Retry => FAILED_RETRY,
                };
                let query = with_error(keyed(sql), at, error, recipients);
                let updated = query.execute(&mut *tx).await?;
                // Copied only while the claim is this worker's: a stale answer leaves none.
                if updated.rows_affected() == 1 {
                    for part in finish.dead_parts() {
                        copy_dead(&mut tx, claim.id, part).await?;
                    }
                }
            }
            tx.commit().await?;
            lane.done();
            Ok(())
        };
        written
            .await
            .map_err(|e| database_error("recording answers", e))
    }

    /// The file's times are its workers' (`now` is read from the same clock).
    async fn next_due(&self, _now: Millis) -> Result<Option<Millis>, SendError> {
        sqlx::query_scalar(NEXT_DUE)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| database_error("reading the next due time", e))
    }

    async fn stats(&self, now: Millis) -> Result<OutboxStats, SendError> {
        let row = sqlx::query(STATS)
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| database_error("counting", e))?;
        super::record::stats_from(
            now,
            [
                row.try_get(0),
                row.try_get(1),
                row.try_get(2),
                row.try_get(3),
            ],
            row.try_get(4),
        )
        .map_err(|e| database_error("counting", e))
    }

    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadRow>, SendError> {
        let rows = sqlx::query(DEAD_LETTERS)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| database_error("reading the dead letters", e))?;
        dead_rows(&rows)
    }

    async fn dead_letters_page(
        &self,
        before: Option<OutboxId>,
        limit: u32,
    ) -> Result<Vec<DeadRow>, SendError> {
        let rows = sqlx::query(DEAD_LETTERS_PAGE)
            .bind(before.map_or(i64::MAX, |id| id.0))
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| database_error("reading the dead letters", e))?;
        dead_rows(&rows)
    }

    async fn requeue(&self, id: OutboxId, now: Millis) -> Result<bool, SendError> {
        let done = sqlx::query(REQUEUE)
            .bind(id.0)
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("requeueing", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge(&self, id: OutboxId) -> Result<bool, SendError> {
        let done = sqlx::query(PURGE)
            .bind(id.0)
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("purging", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_dead(&self, id: OutboxId) -> Result<bool, SendError> {
        let done = sqlx::query(PURGE_DEAD)
            .bind(id.0)
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("purging", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn message(&self, id: OutboxId) -> Result<Option<MessageRow>, SendError> {
        super::inspect::sqlite_message(&self.pool, id).await
    }
}

/// Deletes the delivered messages of these claims (at most `ROWS_PER_INSERT`), each only if
/// its claim is still the last one.
async fn delete_sent<'c>(
    executor: impl sqlx::SqliteExecutor<'c>,
    claims: &[&Claim],
) -> Result<(), sqlx::Error> {
    let sql = delete_sent_sql(claims.len());
    let mut delete = sqlx::query(&sql);
    for claim in claims {
        delete = delete.bind(claim.id.0);
    }
    for claim in claims {
        delete = delete.bind(claim.id.0).bind(claim.attempts);
    }
    delete.execute(executor).await.map(drop)
}

/// The delete of `count` delivered claims: each row found by its id (`IN` on the primary
/// key, where a row value `IN (VALUES ...)` would scan the whole table for every write), and
/// deleted only if its attempts are still the claim's. Its parameters: the ids, then each id
/// with its attempts.
fn delete_sent_sql(count: usize) -> String {
    let ids = vec!["?"; count].join(", ");
    let attempts = "WHEN ? THEN ? ".repeat(count);
    format!(
        "DELETE FROM mail_breaker_outbox WHERE id IN ({ids}) AND leased > 0 \
         AND attempts = CASE id {attempts}END"
    )
}

/// The renewal of `count` claims' leases (a lease's end is a held row's `due_at`): each row
/// found by its id, and renewed only if it is still held under the claim. Its parameters: the
/// lease's new end, the ids, then each id with its attempts.
fn renew_sql(count: usize) -> String {
    let ids = vec!["?"; count].join(", ");
    let attempts = "WHEN ? THEN ? ".repeat(count);
    format!(
        "UPDATE mail_breaker_outbox SET due_at = ? WHERE id IN ({ids}) AND leased > 0 \
         AND dead_at IS NULL AND attempts = CASE id {attempts}END RETURNING id, attempts"
    )
}

/// Binds the time, the error and the narrowed recipients of a `Dead` or `Retry` update
/// (parameters 3 to 8).
/// Dead letters as `DEAD_LETTERS` and `DEAD_LETTERS_PAGE` read them.
fn dead_rows(rows: &[sqlx::sqlite::SqliteRow]) -> Result<Vec<DeadRow>, SendError> {
    rows.iter()
        .map(|row| {
            Ok(DeadRow {
                id: row.try_get(0)?,
                sender: row.try_get(1)?,
                recipients: row.try_get(2)?,
                attempts: row.try_get(3)?,
                dead_at: row.try_get(4)?,
                error: StoredError {
                    category: row.try_get(5)?,
                    code: row.try_get(6)?,
                    message: row.try_get(7)?,
                    transport: row.try_get(8)?,
                },
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| database_error("reading the dead letters", e))
}

/// Writes `part` as a dead letter of its own, copied from row `id`.
async fn copy_dead(
    connection: &mut sqlx::SqliteConnection,
    id: OutboxId,
    part: &DeadPart,
) -> Result<(), sqlx::Error> {
    let copy: i64 = sqlx::query_scalar(COPY_DEAD)
        .bind(id.0)
        .bind(part.recipients.as_str())
        .bind(part.at)
        .bind(part.error.category.as_deref())
        .bind(part.error.code.as_deref())
        .bind(part.error.message.as_deref())
        .bind(part.error.transport.as_deref())
        .fetch_one(&mut *connection)
        .await?;
    sqlx::query(COPY_BODY)
        .bind(id.0)
        .bind(copy)
        .execute(&mut *connection)
        .await?;
    Ok(())
}

fn with_error<'q>(
    query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    at: Millis,
    error: &'q StoredError,
    recipients: Option<&'q str>,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    query
        .bind(at)
        .bind(error.category.as_deref())
        .bind(error.code.as_deref())
        .bind(error.message.as_deref())
        .bind(error.transport.as_deref())
        .bind(recipients)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_that_is_no_sqlite_database_is_refused_as_not_an_outbox_and_left_as_it_was() {
        let folder = tempfile::tempdir().expect("a temporary directory");
        let path = folder.path().join("notes.txt");
        let text = "not a database at all, just someone's notes\n".repeat(100);
        std::fs::write(&path, &text).expect("a text file");
        let options = crate::outbox::OutboxOptions::new().existing_file_only();
        let Err(error) = SqliteBackend::open(&path, &options).await else {
            panic!("a text file opened as an outbox");
        };
        assert_eq!(error.code(), "outbox.not_an_outbox", "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 1);
    }

    #[tokio::test]
    async fn a_file_shorter_than_an_sqlite_header_is_not_an_outbox_and_a_folder_is_unreadable() {
        let folder = tempfile::tempdir().expect("a temporary directory");
        let options = crate::outbox::OutboxOptions::new().existing_file_only();
        let short = folder.path().join("short.db");
        std::fs::write(&short, "SQLite").expect("a short file");
        let Err(error) = SqliteBackend::open(&short, &options).await else {
            panic!("a six-byte file opened as an outbox");
        };
        assert_eq!(error.code(), "outbox.not_an_outbox", "{error}");
        // Reading a folder fails (EISDIR), unlike a short read: it says the file cannot be read.
        let Err(error) = SqliteBackend::open(folder.path(), &options).await else {
            panic!("a folder opened as an outbox");
        };
        assert_eq!(error.code(), "outbox.unreadable", "{error}");
    }

    /// A backend in a fresh file, and the folder that holds it, removed when dropped.
    struct Fresh {
        backend: SqliteBackend,
        _folder: tempfile::TempDir,
    }

    impl std::ops::Deref for Fresh {
        type Target = SqliteBackend;

        fn deref(&self) -> &SqliteBackend {
            &self.backend
        }
    }

    /// A backend in a fresh file, in a folder named by the test.
    async fn backend(name: &str) -> Fresh {
        let folder = tempfile::Builder::new()
            .prefix(&format!("mail-breaker-sqlite-{name}-"))
            .tempdir()
            .expect("a temporary directory");
        let backend = SqliteBackend::open(
            &folder.path().join("outbox.db"),
            &crate::outbox::OutboxOptions::new(),
        )
        .await
        .expect("an SQLite outbox");
        Fresh {
            backend,
            _folder: folder,
        }
    }

    fn row(i: usize) -> NewRow {
        NewRow {
            sender: Some(String::from("app@example.com")),
            recipients: format!("user{i}@example.org"),
            raw: format!("Subject: {i}\r\n\r\nhello\r\n").into_bytes(),
            key: format!("key-{i}"),
        }
    }

    /// Each row's idempotency key, by id.
    async fn keys(backend: &SqliteBackend) -> Vec<(i64, Option<String>)> {
        sqlx::query_as("SELECT id, idempotency_key FROM mail_breaker_outbox ORDER BY id")
            .fetch_all(&backend.pool)
            .await
            .expect("the keys")
    }

    #[tokio::test]
    async fn every_row_keeps_its_idempotency_key_from_enqueue_to_claim_and_to_its_dead_parts() {
        let (backend, _) = three_queued("keys").await;
        let mut connection = backend.pool.acquire().await.expect("a connection");
        insert(&mut connection, &row(4), 1_000)
            .await
            .expect("one row");
        drop(connection);
        let split = row(5);
        let dead = row(6);
        backend
            .keep_split(&[split], &[(dead, StoredError::default())], 1_000)
            .await
            .expect("kept");
        let claimed = backend
            .claim(1_000, Duration::from_secs(60), 10, Bytes::ANY, false)
            .await
            .expect("claimed");
        let claimed: Vec<Option<String>> = claimed.iter().map(|c| c.key.clone()).collect();
        let key = |i: &str| Some(format!("key-{i}"));
        assert_eq!(claimed, [key("1"), key("2"), key("3"), key("4"), key("5")]);
        // Row 1 delivered to one recipient, another refused: its dead part keeps its key.
        let part = DeadPart {
            error: StoredError::default(),
            at: 2_000,
            recipients: String::from("refused@example.org"),
        };
        let finish = Finish::Split {
            main: Box::new(Finish::Retry {
                error: StoredError::default(),
                due_at: 9_000,
                wait: 7_000,
                recipients: Some(String::from("later@example.org")),
            }),
            dead: vec![part],
        };
        let claim = Claim {
            id: OutboxId(1),
            attempts: 1,
        };
        backend.finish(&[(claim, finish)]).await.expect("answered");
        let kept = keys(&backend).await;
        assert_eq!(
            kept,
            [
                (1, key("1")),
                (2, key("2")),
                (3, key("3")),
                (4, key("4")),
                (5, key("5")),
                (6, key("6")),
                (7, key("1")),
            ]
        );
    }

    /// A backend holding three messages enqueued at 1 s, and their ids.
    async fn three_queued(name: &str) -> (Fresh, Vec<OutboxId>) {
        let backend = backend(name).await;
        let ids = backend
            .enqueue(&[row(1), row(2), row(3)], 1_000)
            .await
            .expect("enqueued");
        (backend, ids)
    }

    #[tokio::test]
    async fn a_write_of_delivered_answers_finds_each_row_by_its_id_without_scanning_the_table() {
        let backend = backend("delete-plan").await;
        let sql = format!("EXPLAIN QUERY PLAN {}", delete_sent_sql(3));
        let mut plan = sqlx::query(&sql);
        for id in 1..=3_i64 {
            plan = plan.bind(id);
        }
        for id in 1..=3_i64 {
            plan = plan.bind(id).bind(1_i64);
        }
        let steps: Vec<String> = plan
            .fetch_all(&backend.pool)
            .await
            .expect("a plan")
            .iter()
            .map(|step| step.get::<String, _>(3))
            .collect();
        assert_eq!(
            steps,
            ["SEARCH mail_breaker_outbox USING INTEGER PRIMARY KEY (rowid=?)"],
            "{steps:?}"
        );
    }

    /// The columns of `table` declared as blobs.
    async fn blob_columns(backend: &SqliteBackend, table: &str) -> Vec<String> {
        sqlx::query_scalar("SELECT name FROM pragma_table_info(?1) WHERE type = 'BLOB'")
            .bind(table)
            .fetch_all(&backend.pool)
            .await
            .expect("the table's columns")
    }

    /// The steps of `sql`'s plan that scan a table (rather than find rows by their key).
    async fn scans(backend: &SqliteBackend, sql: &str, parameters: usize) -> Vec<String> {
        let sql = format!("EXPLAIN QUERY PLAN {sql}");
        let mut plan = sqlx::query(&sql);
        for _ in 0..parameters {
            plan = plan.bind(1_i64);
        }
        plan.fetch_all(&backend.pool)
            .await
            .expect("a plan")
            .iter()
            .map(|step| step.get::<String, _>(3))
            .filter(|step| step.starts_with("SCAN"))
            .collect()
    }

    #[tokio::test]
    async fn the_table_the_schedule_is_read_from_holds_no_body() {
        let backend = backend("no-body-in-schedule").await;
        assert_eq!(
            blob_columns(&backend, "mail_breaker_outbox").await,
            Vec::<String>::new()
        );
    }

    /// A backend holding `count` messages in the states a long outage leaves: most due, a
    /// thousand held by a worker (half of those then due again later), some dead.
    async fn backlog(name: &str, count: usize) -> Fresh {
        let backend = backend(name).await;
        let rows: Vec<NewRow> = (0..1_000).map(row).collect();
        for _ in 0..count / rows.len() {
            backend.enqueue(&rows, 1_000).await.expect("enqueued");
        }
        let minute = Duration::from_secs(60);
        let held = backend
            .claim(2_000, minute, 1_000, Bytes::ANY, false)
            .await
            .expect("claimed");
        let answers: Vec<(Claim, Finish)> = held
            .iter()
            .step_by(2)
            .enumerate()
            .map(|(i, claimed)| {
                let error = StoredError::default();
                let finish = if i % 2 == 0 {
                    Finish::Dead {
                        error,
                        at: 3_000,
                        recipients: None,
                    }
                } else {
                    Finish::Retry {
                        error,
                        due_at: 90_000,
                        wait: 87_000,
                        recipients: None,
                    }
                };
                (claimed.claim, finish)
            })
            .collect();
        backend.finish(&answers).await.expect("written");
        backend
    }

    /// Every statement the outbox runs on SQLite, with its number of parameters: the upgrade's
    /// steps, run once by the first process to open an older file, left out.
    fn statements() -> Vec<(String, usize)> {
        let mut statements: Vec<(String, usize)> = vec![
            (INSERT.into(), 5),
            (INSERT_BODY.into(), 2),
            (COPY_DEAD.into(), 7),
            (COPY_BODY.into(), 2),
            (INSERT_DEAD.into(), 9),
            (claim_sql(), 5),
            (renew_sql(3), 10),
            (delete_sent_sql(3), 9),
            (GIVE_BACK.into(), 3),
            (FAILED_DEAD.into(), 8),
            (FAILED_RETRY.into(), 8),
            (NEXT_DUE.into(), 0),
            (STATS.into(), 1),
            (DEAD_LETTERS.into(), 1),
            (DEAD_LETTERS_PAGE.into(), 2),
            (REQUEUE.into(), 2),
            (PURGE.into(), 1),
            (super::super::inspect::SQLITE_MESSAGE.into(), 1),
        ];
        #[cfg(feature = "admin")]
        statements.push((super::super::admin_reads::SQLITE_HEADS.into(), 3));
        statements
    }

    #[tokio::test]
    async fn no_statement_reads_the_queue_row_by_row_with_100_000_messages_queued() {
        let backend = backlog("plans", 100_000).await;
        for (sql, parameters) in statements() {
            let queue_scans: Vec<String> = scans(&backend, &sql, parameters)
                .await
                .into_iter()
                // "SCAN <table> [USING ...]": a pass over a table of the queue, or an index of
                // it; a scan of a subquery's rows (bounded by its LIMIT) or of the one row of
                // counts is not one.
                .filter(|step| {
                    let table = step.split_whitespace().nth(1).unwrap_or_default();
                    ["mail_breaker_outbox", "mail_breaker_outbox_body"].contains(&table)
                })
                .collect();
            assert!(queue_scans.is_empty(), "{sql}\n{queue_scans:?}");
        }
    }

    /// The steps of the plan of `sql`, its `parameters` all 1.
    async fn plan(backend: &SqliteBackend, sql: &str, parameters: usize) -> Vec<String> {
        let sql = format!("EXPLAIN QUERY PLAN {sql}");
        let mut plan = sqlx::query(&sql);
        for _ in 0..parameters {
            plan = plan.bind(1_i64);
        }
        plan.fetch_all(&backend.pool)
            .await
            .expect("a plan")
            .iter()
            .map(|step| step.get::<String, _>(3))
            .collect()
    }

    #[tokio::test]
    async fn a_page_of_dead_letters_reads_the_index_of_dead_ids_alone_and_no_queued_row() {
        let backend = backlog("dead-page-plan", 10_000).await;
        let page = "SEARCH mail_breaker_outbox USING INDEX mail_breaker_outbox_dead_by_id (id<?)";
        assert_eq!(plan(&backend, DEAD_LETTERS_PAGE, 2).await, [page]);
        #[cfg(feature = "admin")]
        assert_eq!(
            plan(&backend, super::super::admin_reads::SQLITE_HEADS, 3).await[0],
            page
        );
    }

    /// The stats as `OutboxStats` defines them, counted from the rows: queued, not dead; due,
    /// queued and due now with no worker's lease running (a held row's `due_at` is its
    /// lease's end here); leased, held with the lease running; dead; the oldest queued.
    async fn stats_by_the_rules(backend: &SqliteBackend, now: Millis) -> OutboxStats {
        let rows: Vec<(Option<i64>, i64, i64, i64)> =
            sqlx::query_as("SELECT dead_at, due_at, leased, enqueued_at FROM mail_breaker_outbox")
                .fetch_all(&backend.pool)
                .await
                .expect("the rows");
        let queued = rows.iter().filter(|(dead, ..)| dead.is_none());
        let count = |rows: &mut dyn Iterator<Item = _>| rows.count() as u64;
        OutboxStats {
            queued: count(&mut queued.clone()),
            due: count(&mut queued.clone().filter(|(_, due, ..)| *due <= now)),
            leased: count(
                &mut queued
                    .clone()
                    .filter(|(_, due, held, _)| *held > 0 && *due > now),
            ),
            dead: count(&mut rows.iter().filter(|(dead, ..)| dead.is_some())),
            oldest: queued
                .map(|(.., enqueued)| *enqueued)
                .min()
                .map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0))),
        }
    }

    #[tokio::test]
    async fn stats_agree_with_the_rows_after_every_kind_of_write() {
        let backend = backend("kept-counts").await;
        let mut random = fastrand::Rng::with_seed(50);
        let mut now: Millis = 1_000;
        let mut held: Vec<Claim> = Vec::new();
        for step in 0..400 {
            now += random.i64(0..2_000);
            let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM mail_breaker_outbox")
                .fetch_all(&backend.pool)
                .await
                .expect("the ids");
            let any_id = OutboxId(
                ids.get(random.usize(..ids.len().max(1)))
                    .copied()
                    .unwrap_or(0),
            );
            match random.u8(0..7) {
                0 | 1 => {
                    let rows: Vec<NewRow> = (0..random.usize(1..4)).map(row).collect();
                    backend.enqueue(&rows, now).await.expect("enqueued");
                }
                2 => {
                    let lease = Duration::from_millis(random.u64(1..5_000));
                    let claimed = backend
                        .claim(now, lease, random.u32(1..4), Bytes::ANY, false)
                        .await
                        .expect("claimed");
                    held.extend(claimed.iter().map(|claimed| claimed.claim));
                }
                3 if !held.is_empty() => {
                    let claim = held.swap_remove(random.usize(..held.len()));
                    let error = StoredError::default();
                    let finish = match random.u8(0..4) {
                        0 => Finish::Sent,
                        1 => Finish::GiveBack { now, wait: 0 },
                        2 => Finish::Dead {
                            error,
                            at: now,
                            recipients: None,
                        },
                        _ => Finish::Retry {
                            error,
                            due_at: now + 3_000,
                            wait: 3_000,
                            recipients: None,
                        },
                    };
                    backend.finish(&[(claim, finish)]).await.expect("written");
                }
                4 => {
                    backend.requeue(any_id, now).await.expect("requeued");
                }
                5 => {
                    backend.purge(any_id).await.expect("purged");
                }
                _ => {
                    let sent: Vec<(Claim, Finish)> =
                        held.drain(..).map(|claim| (claim, Finish::Sent)).collect();
                    backend.finish(&sent).await.expect("written");
                }
            }
            let kept = backend.stats(now).await.expect("stats");
            let expected = stats_by_the_rules(&backend, now).await;
            assert_eq!(
                (kept.queued, kept.due, kept.leased, kept.dead, kept.oldest),
                (
                    expected.queued,
                    expected.due,
                    expected.leased,
                    expected.dead,
                    expected.oldest
                ),
                "after step {step}"
            );
        }
    }

    #[tokio::test]
    async fn a_message_delivered_or_purged_leaves_no_body_behind() {
        let (backend, ids) = three_queued("bodies-go").await;
        let claimed = backend
            .claim(1_000, Duration::from_secs(60), 2, Bytes::ANY, false)
            .await
            .expect("claimed");
        let sent: Vec<_> = claimed.iter().map(|c| (c.claim, Finish::Sent)).collect();
        backend.finish(&sent).await.expect("written");
        assert!(backend.purge(ids[2]).await.expect("purged"));
        let bodies: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mail_breaker_outbox_body")
            .fetch_one(&backend.pool)
            .await
            .expect("counted");
        assert_eq!(bodies, 0);
    }

    #[tokio::test]
    async fn an_outbox_file_an_earlier_version_made_keeps_every_message_and_its_body() {
        let folder = tempfile::Builder::new()
            .prefix("mail-breaker-sqlite-old-")
            .tempdir()
            .expect("a temporary directory");
        let path = folder.path().join("outbox.db");
        {
            // The table as round 3 made it: the body in the row, no panics.
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let mut old = options.connect().await.expect("an old file");
            sqlx::raw_sql(
                "CREATE TABLE mail_breaker_outbox (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, sender TEXT,
                    recipients TEXT NOT NULL, raw BLOB NOT NULL,
                    enqueued_at INTEGER NOT NULL, due_at INTEGER NOT NULL,
                    leased INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
                    dead_at INTEGER, error_category TEXT, error_code TEXT,
                    error_message TEXT, error_transport TEXT);
                 INSERT INTO mail_breaker_outbox (sender, recipients, raw, enqueued_at, due_at)
                    VALUES ('a@example.com', 'one@example.org', X'6F6E65', 1000, 1000),
                           ('a@example.com', 'two@example.org', X'74776F', 1000, 1000);
                 INSERT INTO mail_breaker_outbox
                    (sender, recipients, raw, enqueued_at, due_at, dead_at, error_code)
                    VALUES (NULL, 'dead@example.org', X'64656164', 1000, 1000, 2000, 'smtp.rejected');",
            )
            .execute(&mut old)
            .await
            .expect("the old table");
        }
        let backend = SqliteBackend::open(&path, &crate::outbox::OutboxOptions::new())
            .await
            .expect("the old file opened");
        let stats = backend.stats(1_000).await.expect("stats");
        assert_eq!(
            (stats.queued, stats.dead),
            (2, 1),
            "counted as the file held them"
        );
        let claimed = backend
            .claim(1_000, Duration::from_secs(60), 10, Bytes::ANY, false)
            .await
            .expect("claimed");
        let bodies: Vec<&[u8]> = claimed.iter().map(|c| c.raw.as_slice()).collect();
        assert_eq!(bodies, [b"one".as_slice(), b"two"]);
        // Kept without an idempotency key: each is sent under the key that version gave it.
        assert!(claimed.iter().all(|c| c.key.is_none()), "{claimed:?}");
        let dead = backend
            .message(OutboxId(3))
            .await
            .expect("read")
            .expect("kept");
        assert_eq!(dead.raw, b"dead");
        assert_eq!(
            blob_columns(&backend, "mail_breaker_outbox").await,
            Vec::<String>::new()
        );
        // Its sizes came along: a claim bounded to 3 bytes takes one message, not more.
        backend.requeue(OutboxId(3), 3_000).await.expect("requeued");
        let bounded = backend
            .claim(
                70_000,
                Duration::from_secs(60),
                10,
                Bytes {
                    max: 3,
                    first_whatever_size: true,
                },
                false,
            )
            .await
            .expect("claimed");
        assert_eq!(bounded.len(), 1, "{bounded:?}");
    }

    #[tokio::test]
    async fn a_delivered_message_is_deleted_only_under_the_claim_that_sent_it() {
        let (backend, ids) = three_queued("delete-token").await;
        let claimed = backend
            .claim(1_000, Duration::from_secs(60), 10, Bytes::ANY, false)
            .await
            .expect("claimed");
        assert_eq!(claimed.len(), 3);
        let stale = Claim {
            id: ids[1],
            attempts: claimed[1].claim.attempts + 1,
        };
        let sent = [
            (claimed[0].claim, Finish::Sent),
            (stale, Finish::Sent),
            (claimed[2].claim, Finish::Sent),
        ];
        backend.finish(&sent).await.expect("written");
        let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM mail_breaker_outbox")
            .fetch_all(&backend.pool)
            .await
            .expect("read");
        assert_eq!(
            left,
            [ids[1].0],
            "only the one whose claim was not the last"
        );
    }

    #[tokio::test]
    async fn a_claim_takes_the_due_messages_soonest_first_and_leases_them() {
        let (backend, ids) = three_queued("claim").await;
        let claimed = backend
            .claim(1_000, Duration::from_secs(60), 2, Bytes::ANY, false)
            .await
            .expect("claimed");
        let taken: Vec<OutboxId> = claimed.iter().map(|c| c.claim.id).collect();
        assert_eq!(taken, ids[..2]);
        assert!(
            claimed
                .iter()
                .all(|c| c.claim.attempts == 1 && !c.lease_lost)
        );
        assert_eq!(claimed[1].recipients, "user2@example.org");
        assert_eq!(claimed[1].raw, row(2).raw);
        let rest = backend
            .claim(1_000, Duration::from_secs(60), 10, Bytes::ANY, true)
            .await
            .expect("claimed");
        assert_eq!(rest.len(), 1, "the leased two are not due until 61 s");
        let expired = backend
            .claim(61_000, Duration::from_secs(60), 10, Bytes::ANY, false)
            .await
            .expect("claimed");
        assert_eq!(expired.len(), 3, "every lease ran out");
        assert!(
            expired
                .iter()
                .all(|c| c.lease_lost && c.claim.attempts == 2)
        );
    }

    #[tokio::test]
    async fn a_renewal_extends_only_the_leases_still_held_under_their_claims() {
        let (backend, ids) = three_queued("renew").await;
        let minute = Duration::from_secs(60);
        let claimed = backend
            .claim(1_000, minute, 10, Bytes::ANY, false)
            .await
            .expect("claimed");
        // The third's lease runs out at 61 s and another claim takes it.
        let stale = claimed[2].claim;
        let mut renewed = backend
            .renew(&[claimed[0].claim, claimed[1].claim], 50_000, minute, false)
            .await
            .expect("renewed");
        renewed.sort_by_key(|claim| claim.id);
        assert_eq!(renewed, [claimed[0].claim, claimed[1].claim]);
        let retaken = backend
            .claim(61_000, minute, 10, Bytes::ANY, false)
            .await
            .expect("claimed");
        assert_eq!(
            retaken.iter().map(|c| c.claim.id).collect::<Vec<_>>(),
            [ids[2]],
            "the renewed two are held until 110 s"
        );
        let late = backend
            .renew(&[stale, claimed[0].claim], 62_000, minute, true)
            .await
            .expect("renewed");
        assert_eq!(late, [claimed[0].claim], "the third is another claim's now");
        backend.purge(ids[0]).await.expect("purged");
        let gone = backend
            .renew(&[claimed[0].claim], 63_000, minute, false)
            .await
            .expect("renewed");
        assert!(gone.is_empty(), "a message that is gone is not renewed");
    }
}
