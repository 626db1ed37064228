//! The list in the outbox's database, SQLite or PostgreSQL: one set of statements for both
//! (written with `$n`, which SQLite reads as `?n`), each change one transaction.
//!
//! Three tables: the list itself (`mail_breaker_suppression`, by address), the ids of the
//! events kept (`mail_breaker_suppression_event`, by provider, id and recipient: a resent
//! event finds its row and changes nothing), and the transient bounces still within their
//! window (`mail_breaker_suppression_transient`).

use async_trait::async_trait;
use sqlx::Row;

use super::rules::{self, Change, Millis, Planned};
use super::{Entry, Reason, Store, SuppressionError};

/// The tables and indexes, made where missing, in the outbox's schema step (on PostgreSQL
/// under its lock). The same text for both databases: SQLite takes `BIGINT` as an integer.
pub(crate) const SCHEMA: [&str; 7] = [
    "CREATE TABLE IF NOT EXISTS mail_breaker_suppression (
        address TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        provider TEXT,
        event_id TEXT,
        suppressed_at BIGINT NOT NULL,
        hold_until BIGINT
    )",
    // The holds, for their pruning.
    "CREATE INDEX IF NOT EXISTS mail_breaker_suppression_holds
        ON mail_breaker_suppression (hold_until) WHERE hold_until IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS mail_breaker_suppression_event (
        provider TEXT NOT NULL,
        event_id TEXT NOT NULL,
        recipient TEXT NOT NULL,
        kept_at BIGINT NOT NULL,
        PRIMARY KEY (provider, event_id, recipient)
    )",
    // The ids kept, by age, for their pruning.
    "CREATE INDEX IF NOT EXISTS mail_breaker_suppression_event_by_age
        ON mail_breaker_suppression_event (kept_at)",
    "CREATE TABLE IF NOT EXISTS mail_breaker_suppression_transient (
        address TEXT NOT NULL,
        bounced_at BIGINT NOT NULL,
        provider TEXT NOT NULL,
        event_id TEXT NOT NULL
    )",
    // A count of one address's bounces in a window reads only its entries.
    "CREATE INDEX IF NOT EXISTS mail_breaker_suppression_transient_by_address
        ON mail_breaker_suppression_transient (address, bounced_at)",
    "CREATE INDEX IF NOT EXISTS mail_breaker_suppression_transient_by_time
        ON mail_breaker_suppression_transient (bounced_at)",
];

/// An event's id kept; no row when it was kept before.
const KEEP_ID: &str = "INSERT INTO mail_breaker_suppression_event \
     (provider, event_id, recipient, kept_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/// An address suppressed by an event (`$6` the end of a hold, NULL for good). An entry for
/// good is left as it is (its first cause kept); a hold is replaced by an entry for good or
/// by a hold that ends later.
const SUPPRESS: &str = "INSERT INTO mail_breaker_suppression \
     (address, reason, provider, event_id, suppressed_at, hold_until) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (address) DO UPDATE SET \
     reason = excluded.reason, provider = excluded.provider, event_id = excluded.event_id, \
     suppressed_at = excluded.suppressed_at, hold_until = excluded.hold_until \
     WHERE mail_breaker_suppression.hold_until IS NOT NULL \
     AND (excluded.hold_until IS NULL OR excluded.hold_until > mail_breaker_suppression.hold_until)";

/// An address suppressed by hand, replacing whatever the list held for it.
const PUT_REPLACING: &str = "INSERT INTO mail_breaker_suppression \
     (address, reason, provider, event_id, suppressed_at, hold_until) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (address) DO UPDATE SET \
     reason = excluded.reason, provider = excluded.provider, event_id = excluded.event_id, \
     suppressed_at = excluded.suppressed_at, hold_until = excluded.hold_until";

/// An address imported: an entry for good is left as it is; a hold becomes one for good.
const PUT_KEEPING: &str = "INSERT INTO mail_breaker_suppression \
     (address, reason, provider, event_id, suppressed_at, hold_until) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (address) DO UPDATE SET \
     reason = excluded.reason, provider = excluded.provider, event_id = excluded.event_id, \
     suppressed_at = excluded.suppressed_at, hold_until = excluded.hold_until \
     WHERE mail_breaker_suppression.hold_until IS NOT NULL";

const COUNT_TRANSIENT: &str = "INSERT INTO mail_breaker_suppression_transient \
     (address, bounced_at, provider, event_id) VALUES ($1, $2, $3, $4)";

/// An address's transient bounces after `$2` up to `$3`.
const TRANSIENTS_IN_WINDOW: &str = "SELECT COUNT(*) FROM mail_breaker_suppression_transient \
     WHERE address = $1 AND bounced_at > $2 AND bounced_at <= $3";

/// The ids kept at `$1` or before: forgotten.
const PRUNE_EVENTS: &str = "DELETE FROM mail_breaker_suppression_event WHERE kept_at <= $1";

const PRUNE_TRANSIENTS: &str =
    "DELETE FROM mail_breaker_suppression_transient WHERE bounced_at <= $1";
const PRUNE_HOLDS: &str = "DELETE FROM mail_breaker_suppression \
     WHERE hold_until IS NOT NULL AND hold_until <= $1";

const REMOVE: &str = "DELETE FROM mail_breaker_suppression WHERE address = $1";
const FORGET_TRANSIENTS: &str = "DELETE FROM mail_breaker_suppression_transient WHERE address = $1";

const COLUMNS: &str = "address, reason, provider, event_id, suppressed_at, hold_until";

/// Entries in force at `$1` after `$2`, by address, at most `$3`.
const PAGE: &str = "SELECT address, reason, provider, event_id, suppressed_at, hold_until \
     FROM mail_breaker_suppression WHERE address > $2 \
     AND (hold_until IS NULL OR hold_until > $1) ORDER BY address LIMIT $3";

/// Entries in force at `$1` whose address holds `$2` (a `LIKE` pattern's text, escaped
/// with `\`), by address, at most `$3`. `lower` on both sides: SQLite's `LIKE` ignores
/// ASCII case and PostgreSQL's does not.
const SEARCH: &str = "SELECT address, reason, provider, event_id, suppressed_at, hold_until \
     FROM mail_breaker_suppression \
     WHERE lower(address) LIKE '%' || lower($2) || '%' ESCAPE '\\' \
     AND (hold_until IS NULL OR hold_until > $1) ORDER BY address LIMIT $3";

/// `text` as the inside of a `LIKE` pattern: its `%`, `_` and `\` matched as written.
fn like_text(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Addresses looked up in one statement: well below SQLite's 32,766 parameters.
const ADDRESSES_PER_LOOKUP: usize = 500;

/// The outbox's database, as the list reaches it: the outbox's own pool.
#[derive(Debug, Clone)]
pub(crate) enum SqlStore {
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Runs `$body` in a transaction of the store's database, with `$sql` turning a statement's
/// text into the database's: the same code for SQLite (a write transaction from its start,
/// so that two never deadlock upgrading a read) and PostgreSQL.
///
/// `$lock` is the statement that serialises the transactions counting one address's transient
/// bounces (its address `$1`), where the database needs one: PostgreSQL's transactions read
/// only what was committed when each statement began, so three receivers keeping three
/// bounces at once would each count its own alone. SQLite's write transactions already take
/// turns.
macro_rules! in_transaction {
    ($store:expr, |$tx:ident, $sql:ident, $lock:ident| $body:block) => {
        match $store {
            SqlStore::Sqlite(pool) => {
                let $sql = sqlite_text;
                let $lock: Option<&str> = None;
                let mut $tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let out = $body;
                $tx.commit().await?;
                Ok(out)
            }
            #[cfg(feature = "postgres")]
            SqlStore::Postgres(pool) => {
                let $sql = postgres_text;
                let $lock: Option<&str> = Some(LOCK_ADDRESS);
                let mut $tx = pool.begin().await?;
                let out = $body;
                $tx.commit().await?;
                Ok(out)
            }
        }
    };
}

/// PostgreSQL's lock on one address's transient bounces until the transaction ends.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
const LOCK_ADDRESS: &str =
    "SELECT pg_advisory_xact_lock(hashtext('mail_breaker_suppression:' || $1))";

/// Runs `$body` with `$db`, the store's pool, outside a transaction (a read).
macro_rules! on_pool {
    ($store:expr, |$db:ident, $sql:ident| $body:block) => {
        match $store {
            SqlStore::Sqlite($db) => {
                let $sql = sqlite_text;
                $body
            }
            #[cfg(feature = "postgres")]
            SqlStore::Postgres($db) => {
                let $sql = postgres_text;
                $body
            }
        }
    };
}

fn sqlite_text(text: &str) -> String {
    text.replace('$', "?")
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn postgres_text(text: &str) -> String {
    text.to_owned()
}

fn store_error(doing: &'static str) -> impl Fn(sqlx::Error) -> SuppressionError {
    move |error| SuppressionError::Store {
        doing,
        reason: error.to_string(),
    }
}

/// An entry read from a row of `COLUMNS`.
fn entry<R: Row>(row: &R) -> Result<Entry, sqlx::Error>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    let reason: String = row.try_get(1)?;
    let reason = Reason::from_export(&reason).ok_or_else(|| {
        sqlx::Error::Decode(format!("a suppression whose reason is {reason:?}").into())
    })?;
    Ok(Entry {
        address: row.try_get(0)?,
        reason,
        provider: row.try_get(2)?,
        event_id: row.try_get(3)?,
        at: row.try_get(4)?,
        until: row.try_get(5)?,
    })
}

#[async_trait]
impl Store for SqlStore {
    async fn keep(&self, events: &[Planned], now: Millis) -> Result<usize, SuppressionError> {
        let kept: Result<usize, sqlx::Error> = async {
            in_transaction!(self, |tx, sql, lock| {
                sqlx::query(&sql(PRUNE_EVENTS))
                    .bind(now.saturating_sub(rules::EVENT_MEMORY))
                    .execute(&mut *tx)
                    .await?;
                let mut new = 0;
                for event in events {
                    let first = sqlx::query(&sql(KEEP_ID))
                        .bind(event.provider)
                        .bind(event.event_id.as_str())
                        .bind(event.recipient.as_str())
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    if first.rows_affected() == 0 {
                        continue;
                    }
                    new += 1;
                    let hold = match event.change {
                        Change::Nothing => continue,
                        Change::Suppress(reason) => Some((reason, None)),
                        Change::CountTransient => {
                            if let Some(lock) = lock {
                                sqlx::query(lock)
                                    .bind(event.recipient.as_str())
                                    .execute(&mut *tx)
                                    .await?;
                            }
                            sqlx::query(&sql(COUNT_TRANSIENT))
                                .bind(event.recipient.as_str())
                                .bind(event.at)
                                .bind(event.provider)
                                .bind(event.event_id.as_str())
                                .execute(&mut *tx)
                                .await?;
                            let count: i64 = sqlx::query_scalar(&sql(TRANSIENTS_IN_WINDOW))
                                .bind(event.recipient.as_str())
                                .bind(rules::window_start(event.at))
                                .bind(event.at)
                                .fetch_one(&mut *tx)
                                .await?;
                            let count = u64::try_from(count).unwrap_or(0);
                            rules::transient_hold(count, event.at)
                                .map(|until| (Reason::Bounced, Some(until)))
                        }
                    };
                    if let Some((reason, until)) = hold {
                        sqlx::query(&sql(SUPPRESS))
                            .bind(event.recipient.as_str())
                            .bind(reason.as_str())
                            .bind(event.provider)
                            .bind(event.event_id.as_str())
                            .bind(event.at)
                            .bind(until)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                sqlx::query(&sql(PRUNE_TRANSIENTS))
                    .bind(rules::window_start(now))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&sql(PRUNE_HOLDS))
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                new
            })
        }
        .await;
        kept.map_err(store_error("keeping delivery events"))
    }

    async fn put(&self, entries: &[Entry], replace: bool) -> Result<usize, SuppressionError> {
        let statement = if replace { PUT_REPLACING } else { PUT_KEEPING };
        let put: Result<usize, sqlx::Error> = async {
            in_transaction!(self, |tx, sql, _lock| {
                let text = sql(statement);
                let mut added = 0;
                for entry in entries {
                    let done = sqlx::query(&text)
                        .bind(entry.address.as_str())
                        .bind(entry.reason.as_str())
                        .bind(entry.provider.as_deref())
                        .bind(entry.event_id.as_deref())
                        .bind(entry.at)
                        .bind(entry.until)
                        .execute(&mut *tx)
                        .await?;
                    added += usize::try_from(done.rows_affected()).unwrap_or(0);
                }
                added
            })
        }
        .await;
        put.map_err(store_error("adding addresses"))
    }

    async fn remove(&self, address: &str) -> Result<bool, SuppressionError> {
        let removed: Result<bool, sqlx::Error> = async {
            in_transaction!(self, |tx, sql, _lock| {
                let done = sqlx::query(&sql(REMOVE))
                    .bind(address)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&sql(FORGET_TRANSIENTS))
                    .bind(address)
                    .execute(&mut *tx)
                    .await?;
                done.rows_affected() > 0
            })
        }
        .await;
        removed.map_err(store_error("removing an address"))
    }

    async fn find(
        &self,
        addresses: &[String],
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError> {
        let found: Result<Vec<Entry>, sqlx::Error> = async {
            let mut found = Vec::new();
            for chunk in addresses.chunks(ADDRESSES_PER_LOOKUP) {
                let list = (0..chunk.len())
                    .map(|index| format!("${}", index + 2))
                    .collect::<Vec<_>>()
                    .join(", ");
                let text = format!(
                    "SELECT {COLUMNS} FROM mail_breaker_suppression WHERE address IN ({list}) \
                     AND (hold_until IS NULL OR hold_until > $1)"
                );
                on_pool!(self, |db, sql| {
                    let text = sql(&text);
                    let mut query = sqlx::query(&text).bind(now);
                    for address in chunk {
                        query = query.bind(address.as_str());
                    }
                    for row in query.fetch_all(db).await? {
                        found.push(entry(&row)?);
                    }
                });
            }
            Ok(found)
        }
        .await;
        found.map_err(store_error("looking addresses up"))
    }

    async fn page(
        &self,
        after: Option<&str>,
        limit: u32,
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError> {
        let page: Result<Vec<Entry>, sqlx::Error> = async {
            on_pool!(self, |db, sql| {
                let rows = sqlx::query(&sql(PAGE))
                    .bind(now)
                    .bind(after.unwrap_or(""))
                    .bind(i64::from(limit))
                    .fetch_all(db)
                    .await?;
                rows.iter().map(entry).collect()
            })
        }
        .await;
        page.map_err(store_error("reading a page of the list"))
    }

    async fn search(
        &self,
        text: &str,
        limit: u32,
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError> {
        let pattern = like_text(text);
        let found: Result<Vec<Entry>, sqlx::Error> = async {
            on_pool!(self, |db, sql| {
                let rows = sqlx::query(&sql(SEARCH))
                    .bind(now)
                    .bind(&pattern)
                    .bind(i64::from(limit))
                    .fetch_all(db)
                    .await?;
                rows.iter().map(entry).collect()
            })
        }
        .await;
        found.map_err(store_error("searching the list"))
    }
}
