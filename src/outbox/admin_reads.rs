//! Reads for the operator page (feature `admin`) that the outbox's API does not make: the
//! head of each dead letter's message, where its subject is. Kept apart from the backends'
//! own statements; like them, they read the outbox's table through the outbox.

use sqlx::Row;

use super::record::database_error;
use super::{Outbox, OutboxId};
use crate::SendError;

/// How much of a message is read for its headers: a subject lies well within it.
const HEAD_BYTES: i64 = 16 * 1024;

/// The heads, `?1` bytes of each, of the `?3` dead letters below id `?2` on SQLite: the page
/// `DEAD_LETTERS_PAGE` reads, from the same index.
pub(crate) const SQLITE_HEADS: &str = "SELECT id, (SELECT substr(raw, 1, ?1) FROM mail_breaker_outbox_body AS body \
       WHERE body.id = mail_breaker_outbox.id) \
     FROM mail_breaker_outbox INDEXED BY mail_breaker_outbox_dead_by_id \
     WHERE dead_at IS NOT NULL AND id < ?2 ORDER BY id DESC LIMIT ?3";

/// The database behind an outbox, for the reads in this file.
pub(crate) enum Database<'a> {
    Sqlite(&'a sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(&'a sqlx::PgPool),
}

impl Outbox {
    /// The first bytes of each dead letter's message (its headers), for the page
    /// [`dead_letters_page`](Outbox::dead_letters_page) reads with the same `before` and
    /// `limit`; empty for a backend without a table.
    pub(crate) async fn dead_letter_heads(
        &self,
        before: Option<OutboxId>,
        limit: u32,
    ) -> Result<Vec<(OutboxId, Vec<u8>)>, SendError> {
        let read = |e| database_error("reading the dead letters' headers", e);
        let before = before.map_or(i64::MAX, i64::from);
        let rows = match self.backend().database() {
            Some(Database::Sqlite(pool)) => sqlx::query(SQLITE_HEADS)
                .bind(HEAD_BYTES)
                .bind(before)
                .bind(limit)
                .fetch_all(pool)
                .await
                .map_err(read)?
                .iter()
                .map(|row| Ok((OutboxId(row.try_get(0)?), row.try_get(1)?)))
                .collect::<Result<Vec<_>, sqlx::Error>>(),
            #[cfg(feature = "postgres")]
            Some(Database::Postgres(pool)) => sqlx::query(
                "SELECT id, substring(raw FROM 1 FOR $1) FROM mail_breaker_outbox \
                 WHERE dead_at IS NOT NULL AND id < $2 ORDER BY id DESC LIMIT $3",
            )
            .bind(i32::try_from(HEAD_BYTES).unwrap_or(i32::MAX))
            .bind(before)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
            .map_err(read)?
            .iter()
            .map(|row| Ok((OutboxId(row.try_get(0)?), row.try_get(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>(),
            None => Ok(Vec::new()),
        };
        rows.map_err(read)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::backend::{Bytes, Finish};
    use super::super::record::StoredError;
    use super::*;

    #[tokio::test]
    async fn a_dead_letters_head_is_read_from_the_sqlite_file_it_died_in() {
        let folder = tempfile::Builder::new()
            .prefix("mail-breaker-heads-")
            .tempdir()
            .expect("a temporary directory");
        let outbox = Outbox::sqlite(folder.path().join("outbox.db"))
            .await
            .expect("an outbox");
        let envelope = crate::Envelope::new(None, vec!["user@example.org".parse().unwrap()])
            .expect("an envelope");
        let id = outbox
            .enqueue_raw(&envelope, b"Subject: gone\r\n\r\nbody")
            .await
            .expect("enqueued");
        let claimed = outbox
            .backend()
            .claim(i64::MAX / 2, Duration::from_secs(60), 1, Bytes::ANY, true)
            .await
            .expect("claimed");
        let dead = Finish::Dead {
            error: StoredError::default(),
            at: 1,
            recipients: None,
        };
        outbox
            .backend()
            .finish(&[(claimed[0].claim, dead)])
            .await
            .expect("written");
        let heads = outbox.dead_letter_heads(None, 10).await.expect("read");
        assert_eq!(heads, [(id, b"Subject: gone\r\n\r\nbody".to_vec())]);
    }
}
