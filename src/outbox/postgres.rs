//! The outbox in PostgreSQL, for a fleet: workers in many processes share one queue, and a
//! claim takes due rows with `FOR UPDATE SKIP LOCKED`, so that two never take one message.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Postgres, Row};

use super::OutboxOptions;
use super::backend::{Backend, Bytes, DeadPart, Failed, Finish};
use super::inspect::MessageRow;
use super::lanes::Lanes;
use super::record::{Claim, Claimed, DeadRow, NewRow, StoredError, database_error};
use super::schedule::{Millis, millis};
use super::{OutboxId, OutboxStats};
use crate::SendError;

/// The table, as created new. A claim leases a row by `leased` and `lease_until`, neither of
/// them in an index, and leaves `due_at` alone: its update is then HOT (heap-only, the new
/// version on the same page, no index entry written), for which every page keeps half its
/// room (`fillfactor`). A claim written as `due_at = lease_until` wrote two index entries per
/// row, and nearly four times the WAL (565 bytes a message in a drain, against 152).
const SCHEMA: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS mail_breaker_outbox (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sender TEXT,
        recipients TEXT NOT NULL,
        raw BYTEA NOT NULL,
        enqueued_at BIGINT NOT NULL,
        due_at BIGINT NOT NULL,
        leased BOOLEAN NOT NULL DEFAULT FALSE,
        attempts INTEGER NOT NULL DEFAULT 0,
        dead_at BIGINT,
        error_category TEXT,
        error_code TEXT,
        error_message TEXT,
        error_transport TEXT,
        lease_until BIGINT,
        panics INTEGER NOT NULL DEFAULT 0,
        idempotency_key TEXT
    ) WITH (fillfactor = 50)",
    "CREATE INDEX IF NOT EXISTS mail_breaker_outbox_due
        ON mail_breaker_outbox (due_at, id) WHERE dead_at IS NULL",
    "CREATE INDEX IF NOT EXISTS mail_breaker_outbox_dead
        ON mail_breaker_outbox (dead_at, id) WHERE dead_at IS NOT NULL",
    // The dead letters' ids alone, for their pages (`dead_letters_page`): the primary key's
    // order would walk every queued row between two dead ones.
    "CREATE INDEX IF NOT EXISTS mail_breaker_outbox_dead_by_id
        ON mail_breaker_outbox (id) WHERE dead_at IS NOT NULL",
];

/// A table made before `lease_until` gets it, and its pages' room for HOT updates. Its rows
/// leased then have no `lease_until`: their lease ends at their `due_at`, as it was written.
const UPGRADE: [&str; 2] = [
    "ALTER TABLE mail_breaker_outbox ADD COLUMN IF NOT EXISTS lease_until BIGINT",
    "ALTER TABLE mail_breaker_outbox SET (fillfactor = 50)",
];

/// Whether the table lacks `lease_until`: only then does opening take the locks of `UPGRADE`.
const OLD_TABLE: &str = "SELECT NOT EXISTS (SELECT 1 FROM pg_attribute \
     WHERE attrelid = 'mail_breaker_outbox'::regclass AND attname = 'lease_until' \
     AND NOT attisdropped)";

/// A table made before `panics` (issue 45) gets it: whether it lacks it, and the change
/// (which writes no row: the default is a constant).
const LACKS_PANICS: &str = "SELECT NOT EXISTS (SELECT 1 FROM pg_attribute \
     WHERE attrelid = 'mail_breaker_outbox'::regclass AND attname = 'panics' \
     AND NOT attisdropped)";
const ADD_PANICS: &str =
    "ALTER TABLE mail_breaker_outbox ADD COLUMN IF NOT EXISTS panics INTEGER NOT NULL DEFAULT 0";

/// A table made before idempotency keys (issue 65) gets their column (no row is written:
/// its rows keep none, and are sent under a key made from their id).
const LACKS_KEYS: &str = "SELECT NOT EXISTS (SELECT 1 FROM pg_attribute \
     WHERE attrelid = 'mail_breaker_outbox'::regclass AND attname = 'idempotency_key' \
     AND NOT attisdropped)";
const ADD_KEYS: &str =
    "ALTER TABLE mail_breaker_outbox ADD COLUMN IF NOT EXISTS idempotency_key TEXT";

/// Bodies compressed with lz4 rather than PostgreSQL's default, pglz, where the server has it
/// (PostgreSQL 14 and later, built with it): a body of 2 KB then costs the server about 16 µs
/// less to store, and a batched enqueue makes 48% more a second on 2 cores
/// (`benches/README.md`).
/// Whether the table's bodies take the server's default and the server offers lz4 (a
/// compression someone chose for the column is left alone). `attcompression` is read
/// through `to_jsonb`, so that a server older than 14 (which has neither it nor lz4) answers
/// false rather than an error.
const DEFAULT_COMPRESSION: &str = "SELECT EXISTS (SELECT 1 FROM pg_settings \
     WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)) \
     AND EXISTS (SELECT 1 FROM pg_attribute AS a \
     WHERE a.attrelid = 'mail_breaker_outbox'::regclass AND a.attname = 'raw' \
     AND COALESCE(to_jsonb(a) ->> 'attcompression', '') = '')";
/// The change: only bodies stored after it are compressed so; it rewrites no row.
const COMPRESS_WITH_LZ4: &str =
    "ALTER TABLE mail_breaker_outbox ALTER COLUMN raw SET COMPRESSION lz4";

/// A key for the advisory lock that keeps processes starting together from creating the
/// table at once (PostgreSQL's `IF NOT EXISTS` does not guard against that race).
const SCHEMA_LOCK: i64 = 0x6d61_696c_6f75_7462; // "mailoutb"

/// The database's clock in milliseconds since the Unix epoch: every lease and due time the
/// database sets by itself comes from it, so that workers on machines whose clocks differ
/// agree on when a message is due and when a lease ends.
macro_rules! now_ms {
    () => {
        "(EXTRACT(EPOCH FROM now()) * 1000)::bigint"
    };
}

mod counts;

/// A claim handed back unstarted: free, due at once, not counted as an attempt.
const GIVE_BACK: &str = concat!(
    "UPDATE mail_breaker_outbox SET leased = FALSE, attempts = attempts - 1, due_at = ",
    now_ms!(),
    " + $3 WHERE id = $1 AND attempts = $2 AND leased"
);

/// A failed claim's update: dead, or due again; its time, error and narrowed recipients.
/// Counts a send that panicked (the error's code is parameter 5).
macro_rules! count_panic {
    () => {
        "panics = panics + (CASE WHEN $5 = 'transport.panicked' THEN 1 ELSE 0 END), "
    };
}

/// Dead at the database's now (`$3`, the worker's time, is not read); or due again `$3`
/// milliseconds after the database's now: the worker's wait, on the database's clock.
const FAILED_DEAD: &str = concat!(
    "UPDATE mail_breaker_outbox SET leased = FALSE, dead_at = ",
    now_ms!(),
    " + 0 * $3, ",
    count_panic!(),
    "error_category = $4, error_code = $5, error_message = $6, error_transport = $7, \
     recipients = COALESCE($8, recipients) WHERE id = $1 AND attempts = $2 AND leased"
);
const FAILED_RETRY: &str = concat!(
    "UPDATE mail_breaker_outbox SET leased = FALSE, due_at = ",
    now_ms!(),
    " + $3, ",
    count_panic!(),
    "error_category = $4, error_code = $5, error_message = $6, error_transport = $7, \
     recipients = COALESCE($8, recipients) WHERE id = $1 AND attempts = $2 AND leased"
);

/// `now()` is the transaction's start, the same in both places.
const INSERT: &str = concat!(
    "INSERT INTO mail_breaker_outbox \
     (sender, recipients, raw, enqueued_at, due_at, idempotency_key) VALUES ($1, $2, $3, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", $4) RETURNING id"
);

/// The `$2` dead letters below id `$1`, newest first, without their bodies: a page of them,
/// read from the index of the dead letters' ids (`mail_breaker_outbox_dead_by_id`).
pub(crate) const DEAD_LETTERS_PAGE: &str = "SELECT id, sender, recipients, attempts, dead_at, \
       error_category, error_code, error_message, error_transport \
     FROM mail_breaker_outbox WHERE dead_at IS NOT NULL AND id < $1 \
     ORDER BY id DESC LIMIT $2";

/// A dead letter of its own for some recipients (`$2`) of row `$1` (DESIGN §19): the row's
/// sender, body, times and attempts, dead at the database's now with the error `$3`..`$6`.
const COPY_DEAD: &str = concat!(
    "INSERT INTO mail_breaker_outbox \
     (sender, recipients, raw, enqueued_at, due_at, attempts, dead_at, \
      error_category, error_code, error_message, error_transport, idempotency_key) \
     SELECT sender, $2, raw, enqueued_at, due_at, attempts, ",
    now_ms!(),
    ", $3, $4, $5, $6, idempotency_key FROM mail_breaker_outbox WHERE id = $1"
);

/// A message born dead, tried once: `send_or_queue`'s record of refused recipients.
const INSERT_DEAD: &str = concat!(
    "INSERT INTO mail_breaker_outbox \
     (sender, recipients, raw, enqueued_at, due_at, attempts, dead_at, \
      error_category, error_code, error_message, error_transport, idempotency_key) \
     VALUES ($1, $2, $3, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", 1, ",
    now_ms!(),
    ", $4, $5, $6, $7, $8)"
);

/// The longest wait for a connection, as for `enqueue`'s pool.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs a statement on a connection of the backend's pool within its bound: a connection
/// whose statement failed or overran is closed, never handed back to the pool (whose check
/// of it would wait on a dead link in turn). An async block giving `Result<_, sqlx::Error>`.
macro_rules! on_pool {
    ($backend:expr, |$connection:ident| $statement:expr) => {
        async {
            let mut pooled = $backend.pool.acquire().await?;
            let answered = {
                let $connection = &mut *pooled;
                within($backend.bound, $statement).await
            };
            if answered.is_err() {
                pooled.close_on_drop();
            }
            answered
        }
    };
}

/// `statement` within `bound`: one that overran is an I/O error `TimedOut`, and its future
/// (and with it the statement) is dropped.
async fn within<T>(
    bound: Duration,
    statement: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(bound, statement)
        .await
        .unwrap_or_else(|_| Err(overran(bound)))
}

fn overran(bound: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("PostgreSQL did not answer a statement within {bound:?}"),
    ))
}

fn is_overrun(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
}

/// The outbox's PostgreSQL database.
#[derive(Debug, Clone)]
pub(crate) struct PostgresBackend {
    /// The client's bound on each statement (or transaction): the server's
    /// `statement_timeout` and a second more, for a server that never hears the statement.
    bound: Duration,
    /// Every commit waits for the WAL's flush: enqueues, and claims under `at_most_once`.
    pool: PgPool,
    /// Commits that do not wait for the flush (`synchronous_commit = off`): answers,
    /// give-backs and claims, which a crash of the server may undo safely (a message held
    /// longer, or sent again; see the SQLite backend).
    relaxed: Arc<Lanes<PgConnection>>,
}

impl PostgresBackend {
    pub(crate) async fn open(
        url: &str,
        settings: &OutboxOptions,
    ) -> Result<PostgresBackend, SendError> {
        // Read once, for the pool and for the worker's lanes. The server gives up on a
        // statement after `statement_timeout`; the client a second later.
        let statement_timeout = settings.get_statement_timeout();
        let bound = statement_timeout.saturating_add(Duration::from_secs(1));
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| database_error("connecting to PostgreSQL", e))?
            .options([(
                "statement_timeout",
                statement_timeout.as_millis().max(1).to_string(),
            )]);
        let pool = PgPoolOptions::new()
            .max_connections(settings.get_connections())
            // While the server is down, `enqueue` answers `Err` after this rather than hang.
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(options.clone())
            .await
            .map_err(|e| database_error("connecting to PostgreSQL", e))?;
        let created = async {
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(SCHEMA_LOCK)
                .execute(&mut *tx)
                .await?;
            for statement in SCHEMA {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            // The suppression list's tables live beside the outbox's (`crate::suppression`).
            #[cfg(feature = "webhooks")]
            for statement in crate::suppression::sql_schema() {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            let old: bool = sqlx::query_scalar(OLD_TABLE).fetch_one(&mut *tx).await?;
            if old {
                for statement in UPGRADE {
                    sqlx::query(statement).execute(&mut *tx).await?;
                }
            }
            let lacks: bool = sqlx::query_scalar(LACKS_PANICS).fetch_one(&mut *tx).await?;
            if lacks {
                sqlx::query(ADD_PANICS).execute(&mut *tx).await?;
            }
            let lacks: bool = sqlx::query_scalar(LACKS_KEYS).fetch_one(&mut *tx).await?;
            if lacks {
                sqlx::query(ADD_KEYS).execute(&mut *tx).await?;
            }
            let default_compression: bool = sqlx::query_scalar(DEFAULT_COMPRESSION)
                .fetch_one(&mut *tx)
                .await?;
            if default_compression {
                sqlx::query(COMPRESS_WITH_LZ4).execute(&mut *tx).await?;
            }
            let uncounted: bool = sqlx::query_scalar(counts::LACKS_COUNTS)
                .fetch_one(&mut *tx)
                .await?;
            if uncounted {
                for statement in counts::KEEP_COUNTS {
                    sqlx::query(statement).execute(&mut *tx).await?;
                }
            }
            tx.commit().await
        };
        created
            .await
            .map_err(|e| database_error("creating the outbox's table", e))?;
        // A statement that meets a dead connection fails; the worker tries again later, and
        // the lane opens a fresh connection.
        let relaxed = Lanes::new(
            settings.get_worker_connections(),
            Box::new(move || {
                let options = options.clone();
                Box::pin(async move {
                    let connecting = async {
                        let mut connection = options.connect().await?;
                        // Each of the worker's statements finds its rows by the primary key
                        // whatever its parameters, so one plan serves every call: planning
                        // a write of a few answers anew each time cost more than running it.
                        for setting in [
                            "SET synchronous_commit = off",
                            "SET plan_cache_mode = force_generic_plan",
                        ] {
                            sqlx::query(setting).execute(&mut connection).await?;
                        }
                        Ok(connection)
                    };
                    // While the server is unreachable, a claim or write fails after this.
                    tokio::time::timeout(CONNECT_TIMEOUT, connecting)
                        .await
                        .unwrap_or_else(|_| {
                            Err(sqlx::Error::Io(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!(
                                    "connecting to PostgreSQL took longer than {CONNECT_TIMEOUT:?}"
                                ),
                            )))
                        })
                })
            }),
        );
        Ok(PostgresBackend {
            bound,
            pool,
            relaxed: Arc::new(relaxed),
        })
    }
}

/// Stores one row in the caller's connection (and so in its transaction, if it is in one).
/// Its enqueue time is the database's.
pub(crate) async fn insert(
    connection: &mut PgConnection,
    row: &NewRow,
) -> Result<OutboxId, sqlx::Error> {
    let id: i64 = sqlx::query(INSERT)
        .bind(row.sender.as_deref())
        .bind(row.recipients.as_str())
        .bind(row.raw.as_slice())
        .bind(row.key.as_str())
        .fetch_one(connection)
        .await?
        .try_get(0)?;
    Ok(OutboxId(id))
}

#[async_trait::async_trait]
impl Backend for PostgresBackend {
    #[cfg(feature = "webhooks")]
    fn suppression_store(&self) -> Option<crate::suppression::SqlStore> {
        Some(crate::suppression::SqlStore::Postgres(self.pool.clone()))
    }

    #[cfg(feature = "admin")]
    fn database(&self) -> Option<super::admin_reads::Database<'_>> {
        Some(super::admin_reads::Database::Postgres(&self.pool))
    }

    async fn enqueue(&self, rows: &[NewRow], _now: Millis) -> Result<Vec<OutboxId>, SendError> {
        if let [row] = rows {
            return on_pool!(self, |connection| insert(connection, row))
                .await
                .map(|id| vec![id])
                .map_err(enqueue_error);
        }
        let senders: Vec<Option<&str>> = rows.iter().map(|row| row.sender.as_deref()).collect();
        let recipients: Vec<&str> = rows.iter().map(|row| row.recipients.as_str()).collect();
        let raws: Vec<&[u8]> = rows.iter().map(|row| row.raw.as_slice()).collect();
        let keys: Vec<&str> = rows.iter().map(|row| row.key.as_str()).collect();
        // One statement for the whole batch: all or none, without a transaction around it.
        let ids = sqlx::query_scalar(concat!(
            "INSERT INTO mail_breaker_outbox \
             (sender, recipients, raw, enqueued_at, due_at, idempotency_key) \
             SELECT sender, recipients, raw, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ", key FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[]) \
             AS batch(sender, recipients, raw, key) RETURNING id"
        ))
        .bind(senders)
        .bind(recipients)
        .bind(raws)
        .bind(keys);
        let mut ids: Vec<i64> = on_pool!(self, |connection| ids.fetch_all(connection))
            .await
            .map_err(enqueue_error)?;
        // Identities are drawn in the order of the rows, which RETURNING need not keep.
        ids.sort_unstable();
        Ok(ids.into_iter().map(OutboxId).collect())
    }

    async fn keep_split(
        &self,
        queued: &[NewRow],
        dead: &[(NewRow, StoredError)],
        _now: Millis,
    ) -> Result<(), SendError> {
        let stored = async {
            let mut pooled = self.pool.acquire().await?;
            let written = within(self.bound, async {
                let mut tx = sqlx::Connection::begin(&mut *pooled).await?;
                for row in queued {
                    insert(&mut tx, row).await?;
                }
                for (row, error) in dead {
                    sqlx::query(INSERT_DEAD)
                        .bind(row.sender.as_deref())
                        .bind(row.recipients.as_str())
                        .bind(row.raw.as_slice())
                        .bind(error.category.as_deref())
                        .bind(error.code.as_deref())
                        .bind(error.message.as_deref())
                        .bind(error.transport.as_deref())
                        .bind(row.key.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            })
            .await;
            if written.is_err() {
                pooled.close_on_drop();
            }
            written
        };
        stored.await.map_err(enqueue_error)
    }

    async fn claim(
        &self,
        now: Millis,
        lease: Duration,
        limit: u32,
        bytes: Bytes,
        durable: bool,
    ) -> Result<Vec<Claimed>, SendError> {
        let (max_bytes, first) = bytes.parameters();
        // The rows are updated as found by the locked versions' places (`ctid`, which no
        // other transaction can move while the lock holds), not by a join with `due`: a
        // join's plan for any parameters (the one kept after a few calls) is a hash join over
        // a scan of the whole table, at every claim. The index on `due_at` leads past the rows
        // other claims hold (their `due_at` is when they became due), which are at most what
        // the workers hold ahead.
        // Due and lease times are the database's (`now()`). The time it was enqueued is given
        // on the worker's clock (`$5`, its now), so that its age, which `max_age` bounds, is
        // the same on both.
        // Of the due rows locked, those whose bodies fit in `$3` bytes with the bodies before
        // them, and those with fewer than `$4` bytes before them (the first, when `$4` is 1);
        // the others are let go when the statement ends.
        // `octet_length` reads a stored body's size, not its bytes.
        let claim = sqlx::query(concat!(
            "WITH due AS ( \
                 SELECT ctid, id, leased, due_at, octet_length(raw) AS size \
                 FROM mail_breaker_outbox \
                 WHERE dead_at IS NULL AND due_at <= ",
            now_ms!(),
            " AND (NOT leased OR lease_until IS NULL OR lease_until <= ",
            now_ms!(),
            ") ORDER BY due_at, id LIMIT $1 FOR UPDATE SKIP LOCKED), \
             fits AS (SELECT ctid, id, leased FROM (SELECT ctid, id, leased, size, \
                 SUM(size) OVER (ORDER BY due_at, id ROWS UNBOUNDED PRECEDING) AS total \
                 FROM due) AS sized WHERE total <= $3 OR total - size < $4) \
             UPDATE mail_breaker_outbox AS m \
             SET attempts = m.attempts + 1, leased = TRUE, lease_until = ",
            now_ms!(),
            " + $2 WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM fits)) \
             RETURNING m.id, m.attempts, m.enqueued_at - ",
            now_ms!(),
            " + $5, \
                 m.id = ANY(ARRAY(SELECT id FROM fits WHERE leased)), \
                 m.sender, m.recipients, m.raw, m.panics, m.idempotency_key"
        ))
        .bind(i64::from(limit))
        .bind(millis(lease))
        .bind(max_bytes)
        .bind(first)
        .bind(now);
        let rows = async {
            if durable {
                return on_pool!(self, |connection| claim.fetch_all(connection)).await;
            }
            within(self.bound, async {
                let mut lane = self.relaxed.get().await?;
                let rows = claim.fetch_all(lane.connection()).await?;
                lane.done();
                Ok(rows)
            })
            .await
        };
        let rows = rows
            .await
            .map_err(|e| database_error("claiming due mail", e))?;
        let mut claimed: Vec<Claimed> = rows
            .into_iter()
            .map(|row| {
                Ok(Claimed {
                    claim: Claim {
                        id: OutboxId(row.try_get(0)?),
                        attempts: u32::try_from(row.try_get::<i32, _>(1)?).unwrap_or(0),
                    },
                    enqueued_at: row.try_get(2)?,
                    lease_lost: row.try_get(3)?,
                    sender: row.try_get(4)?,
                    recipients: row.try_get(5)?,
                    raw: row.try_get(6)?,
                    panics: u32::try_from(row.try_get::<i32, _>(7)?).unwrap_or(0),
                    key: row.try_get(8)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| database_error("claiming due mail", e))?;
        // RETURNING keeps no order; ids go with enqueue order.
        claimed.sort_by_key(|message| message.claim.id);
        Ok(claimed)
    }

    async fn renew(
        &self,
        claims: &[Claim],
        _now: Millis,
        lease: Duration,
        durable: bool,
    ) -> Result<Vec<Claim>, SendError> {
        let (ids, attempts): (Vec<i64>, Vec<i32>) = claims
            .iter()
            .map(|claim| {
                (
                    claim.id.0,
                    i32::try_from(claim.attempts).unwrap_or(i32::MAX),
                )
            })
            .unzip();
        // Each row found by its id, and renewed only if it is still held under the claim.
        let renew = sqlx::query(concat!(
            "UPDATE mail_breaker_outbox SET lease_until = ",
            now_ms!(),
            " + $3 WHERE id = ANY($1::bigint[]) AND leased AND dead_at IS NULL \
             AND attempts = ($2::int[])[array_position($1::bigint[], id)] \
             RETURNING id, attempts"
        ))
        .bind(ids)
        .bind(attempts)
        .bind(millis(lease));
        let rows = async {
            if durable {
                return on_pool!(self, |connection| renew.fetch_all(connection)).await;
            }
            within(self.bound, async {
                let mut lane = self.relaxed.get().await?;
                let rows = renew.fetch_all(lane.connection()).await?;
                lane.done();
                Ok(rows)
            })
            .await
        };
        let rows = rows
            .await
            .map_err(|e| database_error("renewing leases", e))?;
        rows.iter()
            .map(|row| {
                Ok(Claim {
                    id: OutboxId(row.try_get(0)?),
                    attempts: u32::try_from(row.try_get::<i32, _>(1)?).unwrap_or(0),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| database_error("renewing leases", e))
    }

    async fn finish(&self, outcomes: &[(Claim, Finish)]) -> Result<(), SendError> {
        let written = async {
            // Answers may be lost to a crash of the server, safely: the message stays leased,
            // and is sent again when the lease runs out (dead as maybe delivered under
            // at_most_once). So their commit does not wait for the WAL's flush.
            let only_sent = outcomes
                .iter()
                .all(|(_, finish)| matches!(finish, Finish::Sent));
            let (ids, attempts): (Vec<i64>, Vec<i32>) = outcomes
                .iter()
                .filter(|(_, finish)| matches!(finish, Finish::Sent))
                .map(|(claim, _)| {
                    (
                        claim.id.0,
                        i32::try_from(claim.attempts).unwrap_or(i32::MAX),
                    )
                })
                .unzip();
            // The delivered, the most of every batch, in one statement: each row found by its
            // id, and deleted only if its attempts are still the claim's.
            let delete = (!ids.is_empty()).then(|| {
                sqlx::query(
                    "DELETE FROM mail_breaker_outbox \
                     WHERE id = ANY($1::bigint[]) AND leased \
                     AND attempts = ($2::int[])[array_position($1::bigint[], id)]",
                )
                .bind(ids)
                .bind(attempts)
            });
            let mut lane = self.relaxed.get().await?;
            // One statement is atomic by itself: the usual batch, all delivered, needs no
            // transaction around it.
            if only_sent {
                if let Some(delete) = delete {
                    delete.execute(lane.connection()).await?;
                }
                lane.done();
                return Ok(());
            }
            let mut tx = lane.connection().begin().await?;
            if let Some(delete) = delete {
                delete.execute(&mut *tx).await?;
            }
            for (claim, finish) in outcomes {
                let attempts = i32::try_from(claim.attempts).unwrap_or(i32::MAX);
                let keyed = |sql| sqlx::query(sql).bind(claim.id.0).bind(attempts);
                if let Finish::GiveBack { .. } = finish {
                    keyed(GIVE_BACK)
                        .bind(finish.wait())
                        .execute(&mut *tx)
                        .await?;
                    continue;
                }
                let Some((failed, at, error, recipients)) = finish.failure() else {
                    continue;
                };
                let (sql, time) = match failed {
                    Failed::Dead => (FAILED_DEAD, at),
                    Failed::Retry => (FAILED_RETRY, finish.wait()),
                };
                let query = with_error(keyed(sql), time, error, recipients);
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
        // A lane whose write overran is dropped with it, and its connection closed.
        within(self.bound, written)
            .await
            .map_err(|e| database_error("recording answers", e))
    }

    /// Counted on the database's clock and given on the worker's (`now`): the wait is the
    /// same whatever the two clocks read.
    async fn next_due(&self, now: Millis) -> Result<Option<Millis>, SendError> {
        // A walk along the index on `due_at`, one row at a time, through the held rows to the
        // first free one: a held row is free no sooner than its `due_at`, so none after that
        // one is free sooner than it. The walk reads the held rows and one more, never the
        // backlog; a scan for the held rows alone would read the whole table (no index on
        // `leased`, which would make every claim's update write index entries again).
        let statement = sqlx::query_scalar(concat!(
            "WITH RECURSIVE walk (due_at, id, leased, free_at) AS ( \
                 (SELECT due_at, id, leased, \
                      CASE WHEN leased THEN GREATEST(due_at, lease_until) ELSE due_at END \
                          AS free_at \
                  FROM mail_breaker_outbox WHERE dead_at IS NULL \
                  ORDER BY due_at, id LIMIT 1) \
                 UNION ALL \
                 SELECT next.* FROM walk, LATERAL ( \
                     SELECT m.due_at, m.id, m.leased, \
                         CASE WHEN m.leased THEN GREATEST(m.due_at, m.lease_until) \
                              ELSE m.due_at END AS free_at \
                     FROM mail_breaker_outbox AS m \
                     WHERE m.dead_at IS NULL AND (m.due_at, m.id) > (walk.due_at, walk.id) \
                     ORDER BY m.due_at, m.id LIMIT 1) AS next \
                 WHERE walk.leased) \
             SELECT MIN(free_at) - ",
            now_ms!(),
            " + $1 FROM walk",
        ))
        .bind(now);
        on_pool!(self, |connection| statement.fetch_one(connection))
            .await
            .map_err(|e| database_error("reading the next due time", e))
    }

    async fn stats(&self, _now: Millis) -> Result<OutboxStats, SendError> {
        let statement = sqlx::query(counts::STATS);
        let row = on_pool!(self, |connection| statement.fetch_one(connection))
            .await
            .map_err(|e| database_error("counting", e))?;
        let now: Option<Millis> = row.try_get(5).map_err(|e| database_error("counting", e))?;
        super::record::stats_from(
            now.unwrap_or(0),
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
        let statement = sqlx::query(
            "SELECT id, sender, recipients, attempts, dead_at, \
               error_category, error_code, error_message, error_transport \
             FROM mail_breaker_outbox WHERE dead_at IS NOT NULL \
             ORDER BY dead_at, id LIMIT $1",
        )
        .bind(i64::from(limit));
        let rows = on_pool!(self, |connection| statement.fetch_all(connection))
            .await
            .map_err(|e| database_error("reading the dead letters", e))?;
        dead_rows(&rows)
    }

    async fn dead_letters_page(
        &self,
        before: Option<OutboxId>,
        limit: u32,
    ) -> Result<Vec<DeadRow>, SendError> {
        let statement = sqlx::query(DEAD_LETTERS_PAGE)
            .bind(before.map_or(i64::MAX, |id| id.0))
            .bind(i64::from(limit));
        let rows = on_pool!(self, |connection| statement.fetch_all(connection))
            .await
            .map_err(|e| database_error("reading the dead letters", e))?;
        dead_rows(&rows)
    }

    async fn requeue(&self, id: OutboxId, _now: Millis) -> Result<bool, SendError> {
        let statement = sqlx::query(concat!(
            "UPDATE mail_breaker_outbox SET dead_at = NULL, leased = FALSE, attempts = 0, \
             panics = 0, due_at = ",
            now_ms!(),
            ", enqueued_at = ",
            now_ms!(),
            " WHERE id = $1 AND dead_at IS NOT NULL"
        ))
        .bind(id.0);
        let done = on_pool!(self, |connection| statement.execute(connection))
            .await
            .map_err(|e| database_error("requeueing", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge(&self, id: OutboxId) -> Result<bool, SendError> {
        let statement = sqlx::query("DELETE FROM mail_breaker_outbox WHERE id = $1").bind(id.0);
        let done = on_pool!(self, |connection| statement.execute(connection))
            .await
            .map_err(|e| database_error("purging", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_dead(&self, id: OutboxId) -> Result<bool, SendError> {
        let statement =
            sqlx::query("DELETE FROM mail_breaker_outbox WHERE id = $1 AND dead_at IS NOT NULL")
                .bind(id.0);
        let done = on_pool!(self, |connection| statement.execute(connection))
            .await
            .map_err(|e| database_error("purging", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn message(&self, id: OutboxId) -> Result<Option<MessageRow>, SendError> {
        super::inspect::postgres_message(&self.pool, id).await
    }
}

/// The error of an enqueue: one whose statement went out and was not answered within the
/// bound may have been committed all the same (`outbox.maybe_queued`).
fn enqueue_error(error: sqlx::Error) -> SendError {
    if is_overrun(&error) {
        return SendError::new(
            crate::Category::Timeout,
            "outbox.maybe_queued",
            format!(
                "PostgreSQL did not answer the enqueue ({error}); it may have committed it, \
                 and a worker will send it if so"
            ),
        )
        .with_source(error);
    }
    database_error("enqueueing", error)
}

/// Binds the time, the error and the narrowed recipients of a `Dead` or `Retry` update
/// (parameters 3 to 8).
/// Dead letters as `dead_letters` and `DEAD_LETTERS_PAGE` read them.
fn dead_rows(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<DeadRow>, SendError> {
    rows.iter()
        .map(|row| {
            Ok(DeadRow {
                id: row.try_get(0)?,
                sender: row.try_get(1)?,
                recipients: row.try_get(2)?,
                attempts: i64::from(row.try_get::<i32, _>(3)?),
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
    connection: &mut PgConnection,
    id: OutboxId,
    part: &DeadPart,
) -> Result<(), sqlx::Error> {
    sqlx::query(COPY_DEAD)
        .bind(id.0)
        .bind(part.recipients.as_str())
        .bind(part.error.category.as_deref())
        .bind(part.error.code.as_deref())
        .bind(part.error.message.as_deref())
        .bind(part.error.transport.as_deref())
        .execute(connection)
        .await?;
    Ok(())
}

fn with_error<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    at: Millis,
    error: &'q StoredError,
    recipients: Option<&'q str>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
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

    #[test]
    fn only_an_enqueue_left_unanswered_past_its_bound_may_have_been_queued() {
        let overrun = enqueue_error(overran(Duration::from_secs(6)));
        assert_eq!(overrun.code(), "outbox.maybe_queued", "{overrun}");
        let refused = enqueue_error(sqlx::Error::PoolTimedOut);
        assert_ne!(refused.code(), "outbox.maybe_queued", "{refused}");
        let reset = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_ne!(enqueue_error(reset).code(), "outbox.maybe_queued");
    }
}
