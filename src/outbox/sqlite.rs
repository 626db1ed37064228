//! The outbox in an SQLite file: WAL, every commit synced to disk, and a claim taken under
//! `BEGIN IMMEDIATE`, so that workers in several processes on one file never claim alike.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use super::backend::{Backend, Failed, Finish};
use super::record::{
    Claim, Claimed, DeadRow, NewRow, StoredError, database_error, database_error_of,
};
use super::schedule::Millis;
use super::{OutboxId, OutboxStats};
use crate::{Category, SendError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS mail_breaker_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sender TEXT,
    recipients TEXT NOT NULL,
    raw BLOB NOT NULL,
    enqueued_at INTEGER NOT NULL,
    due_at INTEGER NOT NULL,
    leased INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    dead_at INTEGER,
    error_category TEXT,
    error_code TEXT,
    error_message TEXT,
    error_transport TEXT
);
CREATE INDEX IF NOT EXISTS mail_breaker_outbox_due
    ON mail_breaker_outbox (due_at, id) WHERE dead_at IS NULL;
CREATE INDEX IF NOT EXISTS mail_breaker_outbox_dead
    ON mail_breaker_outbox (dead_at, id) WHERE dead_at IS NOT NULL;
";

/// A claim handed back unstarted: free, due at once, not counted as an attempt.
const GIVE_BACK: &str = "UPDATE mail_breaker_outbox SET leased = 0, attempts = attempts - 1, \
     due_at = ?3 WHERE id = ?1 AND attempts = ?2 AND leased > 0";

/// A failed claim's update: dead, or due again; its time, error and narrowed recipients.
const FAILED_DEAD: &str = "UPDATE mail_breaker_outbox SET leased = 0, dead_at = ?3, \
     error_category = ?4, error_code = ?5, error_message = ?6, error_transport = ?7, \
     recipients = COALESCE(?8, recipients) WHERE id = ?1 AND attempts = ?2 AND leased > 0";
const FAILED_RETRY: &str = "UPDATE mail_breaker_outbox SET leased = 0, due_at = ?3, \
     error_category = ?4, error_code = ?5, error_message = ?6, error_transport = ?7, \
     recipients = COALESCE(?8, recipients) WHERE id = ?1 AND attempts = ?2 AND leased > 0";

const INSERT: &str = "INSERT INTO mail_breaker_outbox (sender, recipients, raw, enqueued_at, due_at) \
     VALUES (?1, ?2, ?3, ?4, ?4) RETURNING id";

/// Rows in one INSERT of a batch: 5 parameters each, well below SQLite's 32,766.
const ROWS_PER_INSERT: usize = 500;

/// The due messages a claim takes, soonest first; the same rows for the read and the update.
const DUE: &str = "SELECT id FROM mail_breaker_outbox WHERE dead_at IS NULL AND due_at <= ?1 \
     ORDER BY due_at, id LIMIT ?2";

/// The outbox's SQLite database.
#[derive(Debug, Clone)]
pub(crate) struct SqliteBackend {
    /// Every commit synced to disk: enqueues and claims.
    pool: SqlitePool,
    /// Commits synced at WAL checkpoints only: a worker's answers, give-backs and (but under
    /// `at_most_once`) claims, which a power cut may undo safely. An answer lost leaves the
    /// message leased, so it is sent again when the lease runs out (at least once), or dead
    /// as maybe delivered under `at_most_once`; a give-back lost is the same lease running
    /// out; a claim lost is a message sent again.
    relaxed: SqlitePool,
}

impl SqliteBackend {
    /// Opens (creating it if missing) the database file at `path` and its table.
    pub(crate) async fn open(path: &Path) -> Result<SqliteBackend, SendError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // `Ok` from `enqueue` means on disk: each commit waits for its sync.
            .synchronous(SqliteSynchronous::Full)
            // Workers in other processes hold the write lock for a claim's few milliseconds.
            .busy_timeout(Duration::from_secs(10));
        let opening = |e| database_error_of(Category::Configuration, "opening the SQLite file", e);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.clone())
            .await
            .map_err(opening)?;
        sqlx::raw_sql(SCHEMA)
            .execute(&pool)
            .await
            .map_err(|e| database_error("creating the outbox's table", e))?;
        // One connection: the worker's claims and answers queue for it in this process
        // rather than meet at SQLite's write lock, whose busy wait sleeps a millisecond or more.
        let relaxed = SqlitePoolOptions::new()
            .max_connections(1)
            // A file's connection does not die: no ping before each statement.
            .test_before_acquire(false)
            .connect_with(options.synchronous(SqliteSynchronous::Normal))
            .await
            .map_err(opening)?;
        Ok(SqliteBackend { pool, relaxed })
    }

    async fn immediate(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }
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
        .bind(row.raw.as_slice())
        .bind(now)
        .fetch_one(connection)
        .await?
        .try_get(0)?;
    Ok(OutboxId(id))
}

#[async_trait::async_trait]
impl Backend for SqliteBackend {
    async fn enqueue(&self, rows: &[NewRow], now: Millis) -> Result<Vec<OutboxId>, SendError> {
        let stored = async {
            let mut tx = self.immediate().await?;
            let mut ids = Vec::with_capacity(rows.len());
            for chunk in rows.chunks(ROWS_PER_INSERT) {
                let values = vec!["(?, ?, ?, ?, ?)"; chunk.len()].join(", ");
                let sql = format!(
                    "INSERT INTO mail_breaker_outbox \
                     (sender, recipients, raw, enqueued_at, due_at) VALUES {values} RETURNING id"
                );
                let mut insert = sqlx::query_scalar::<_, i64>(&sql);
                for row in chunk {
                    insert = insert
                        .bind(row.sender.as_deref())
                        .bind(row.recipients.as_str())
                        .bind(row.raw.as_slice())
                        .bind(now)
                        .bind(now);
                }
                let mut chunk_ids = insert.fetch_all(&mut *tx).await?;
                // One statement numbers its rows in the order of VALUES, which RETURNING
                // need not keep.
                chunk_ids.sort_unstable();
                ids.extend(chunk_ids.into_iter().map(OutboxId));
            }
            tx.commit().await?;
            Ok(ids)
        };
        stored.await.map_err(|e| database_error("enqueueing", e))
    }

    async fn claim(
        &self,
        now: Millis,
        lease_until: Millis,
        limit: u32,
        durable: bool,
    ) -> Result<Vec<Claimed>, SendError> {
        let claimed = async {
            let pool = if durable { &self.pool } else { &self.relaxed };
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            // `leased` counts the claims since the message was last free: 2 or more says a
            // worker held it before and its lease ran out.
            let mut rows = sqlx::query(&format!(
                "UPDATE mail_breaker_outbox SET attempts = attempts + 1, leased = leased + 1, \
                 due_at = ?3 WHERE id IN ({DUE}) \
                 RETURNING id, attempts, enqueued_at, leased, sender, recipients, raw"
            ))
            .bind(now)
            .bind(limit)
            .bind(lease_until)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
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
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()
        };
        claimed
            .await
            .map_err(|e| database_error("claiming due mail", e))
    }

    fn writes_at_once(&self) -> usize {
        // One writer at a time in SQLite, and one connection for them: more would only queue.
        1
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
            if sent.len() == outcomes.len() && sent.len() <= ROWS_PER_INSERT {
                if !sent.is_empty() {
                    delete_sent(&self.relaxed, &sent).await?;
                }
                return Ok(());
            }
            let mut tx = self.relaxed.begin_with("BEGIN IMMEDIATE").await?;
            for chunk in sent.chunks(ROWS_PER_INSERT) {
                delete_sent(&mut *tx, chunk).await?;
            }
            for (claim, finish) in outcomes {
                let keyed = |sql| sqlx::query(sql).bind(claim.id.0).bind(claim.attempts);
                if let Finish::GiveBack { now } = finish {
                    keyed(GIVE_BACK).bind(*now).execute(&mut *tx).await?;
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
                query.execute(&mut *tx).await?;
            }
            tx.commit().await
        };
        written
            .await
            .map_err(|e| database_error("recording answers", e))
    }

    async fn next_due(&self) -> Result<Option<Millis>, SendError> {
        sqlx::query_scalar("SELECT MIN(due_at) FROM mail_breaker_outbox WHERE dead_at IS NULL")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| database_error("reading the next due time", e))
    }

    async fn stats(&self, now: Millis) -> Result<OutboxStats, SendError> {
        let row = sqlx::query(
            "SELECT \
               COALESCE(SUM(dead_at IS NULL), 0), \
               COALESCE(SUM(dead_at IS NULL AND due_at <= ?1), 0), \
               COALESCE(SUM(dead_at IS NULL AND leased > 0 AND due_at > ?1), 0), \
               COALESCE(SUM(dead_at IS NOT NULL), 0), \
               MIN(CASE WHEN dead_at IS NULL THEN enqueued_at END) \
             FROM mail_breaker_outbox",
        )
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
        let rows = sqlx::query(
            "SELECT id, sender, recipients, attempts, dead_at, \
               error_category, error_code, error_message, error_transport \
             FROM mail_breaker_outbox WHERE dead_at IS NOT NULL \
             ORDER BY dead_at, id LIMIT ?1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| database_error("reading the dead letters", e))?;
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

    async fn requeue(&self, id: OutboxId, now: Millis) -> Result<bool, SendError> {
        let done = sqlx::query(
            "UPDATE mail_breaker_outbox SET dead_at = NULL, leased = 0, due_at = ?2 \
             WHERE id = ?1 AND dead_at IS NOT NULL",
        )
        .bind(id.0)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(|e| database_error("requeueing", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge(&self, id: OutboxId) -> Result<bool, SendError> {
        let done = sqlx::query("DELETE FROM mail_breaker_outbox WHERE id = ?1")
            .bind(id.0)
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("purging", e))?;
        Ok(done.rows_affected() == 1)
    }
}

/// Deletes the delivered messages of these claims (at most `ROWS_PER_INSERT`), each only if
/// its claim is still the last one.
async fn delete_sent<'c>(
    executor: impl sqlx::SqliteExecutor<'c>,
    claims: &[&Claim],
) -> Result<(), sqlx::Error> {
    let pairs = vec!["(?, ?)"; claims.len()].join(", ");
    let sql = format!(
        "DELETE FROM mail_breaker_outbox WHERE leased > 0 AND (id, attempts) IN (VALUES {pairs})"
    );
    let mut delete = sqlx::query(&sql);
    for claim in claims {
        delete = delete.bind(claim.id.0).bind(claim.attempts);
    }
    delete.execute(executor).await.map(drop)
}

/// Binds the time, the error and the narrowed recipients of a `Dead` or `Retry` update
/// (parameters 3 to 8).
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
