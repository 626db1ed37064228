//! Reading one message back, as an operator looks at it: its envelope, headers, attempts and
//! last error ([`Outbox::message`]). What `mail-breaker outbox show` and `outbox dead` print.
//!
//! Each backend answers with one `SELECT` by primary key ([`MessageRow`]); the rest is read
//! here, so that the two databases' files gain one small method each.

use std::time::SystemTime;

use super::record::{self, StoredError};
use super::schedule::Millis;
use super::{Outbox, OutboxId};
use crate::{Envelope, SendError};

/// One message as its outbox holds it, queued or dead, from [`Outbox::message`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoredMessage {
    /// Its id in the outbox.
    pub id: OutboxId,
    /// Who it is for (narrowed to the recipients still owed, after a partial delivery).
    pub envelope: Envelope,
    /// The formatted message, as it will be sent.
    pub raw: Vec<u8>,
    /// How many times a worker took it to send.
    pub attempts: u32,
    /// When it was queued.
    pub enqueued_at: SystemTime,
    /// When a worker may take it next: its due time, or the end of the lease a worker holds.
    /// Meaningless once it is dead.
    pub due_at: SystemTime,
    /// Whether a worker holds it right now (a send in flight).
    pub leased: bool,
    /// When it died; `None` while it is queued.
    pub dead_at: Option<SystemTime>,
    /// The last error a send met, `None` when none has failed yet.
    pub error: Option<SendError>,
}

impl StoredMessage {
    /// Whether it is a dead letter.
    pub fn is_dead(&self) -> bool {
        self.dead_at.is_some()
    }

    /// The header fields of the formatted message, in order, each as `(name, value)` with
    /// folded lines joined; values as written (an encoded word stays encoded).
    ///
    /// ```
    /// # use mail_breaker::outbox::StoredMessage;
    /// let headers = StoredMessage::parse_headers(b"Subject: a long\r\n  subject\r\nTo: b@example.org\r\n\r\nbody");
    /// assert_eq!(headers, [("Subject".to_owned(), "a long subject".to_owned()),
    ///                      ("To".to_owned(), "b@example.org".to_owned())]);
    /// ```
    pub fn headers(&self) -> Vec<(String, String)> {
        StoredMessage::parse_headers(&self.raw)
    }

    /// Its `Subject:` as written, `None` when it has none.
    pub fn subject(&self) -> Option<String> {
        self.headers()
            .into_iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("subject"))
            .map(|(_, value)| value)
    }

    /// The header fields of a formatted message (see [`headers`](Self::headers)): the lines
    /// before the first empty one; a line that starts with a space or tab continues the one
    /// before; a line without a colon is skipped.
    pub fn parse_headers(raw: &[u8]) -> Vec<(String, String)> {
        let text = String::from_utf8_lossy(raw);
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() {
                break;
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((name, value)) = line.split_once(':') {
                fields.push((name.trim().to_owned(), value.trim().to_owned()));
            }
        }
        fields
    }
}

/// The columns of one message, as both backends read them.
#[derive(Debug)]
pub(crate) struct MessageRow {
    pub id: i64,
    pub sender: Option<String>,
    pub recipients: String,
    pub raw: Vec<u8>,
    pub attempts: i64,
    pub enqueued_at: Millis,
    /// The due time, or the lease's end while leased.
    pub due_at: Millis,
    pub leased: bool,
    pub dead_at: Option<Millis>,
    pub error: StoredError,
}

impl MessageRow {
    fn read(self) -> Result<StoredMessage, SendError> {
        let failed = self.error.code.is_some() || self.error.category.is_some();
        Ok(StoredMessage {
            id: OutboxId(self.id),
            envelope: record::envelope(self.sender.as_deref(), &self.recipients)?,
            raw: self.raw,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            enqueued_at: record::from_millis(self.enqueued_at),
            due_at: record::from_millis(self.due_at),
            leased: self.leased,
            dead_at: self.dead_at.map(record::from_millis),
            error: failed.then(|| self.error.read()),
        })
    }
}

impl Outbox {
    /// The message `id`, queued or dead, with its envelope, the formatted message, its
    /// attempts and its last error; `Ok(None)` when the outbox holds no message `id` (sent,
    /// or purged). Reads only: it changes nothing and takes no lease.
    ///
    /// ```no_run
    /// # async fn run(outbox: mail_breaker::outbox::Outbox) -> Result<(), mail_breaker::SendError> {
    /// for dead in outbox.dead_letters(10).await? {
    ///     if let Some(message) = outbox.message(dead.id).await? {
    ///         println!("{}: {:?} ({})", dead.id, message.subject(), dead.error);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn message(&self, id: OutboxId) -> Result<Option<StoredMessage>, SendError> {
        self.backend()
            .message(id)
            .await?
            .map(MessageRow::read)
            .transpose()
    }
}

/// The `SELECT` of one message on SQLite (`leased` counts claims there).
pub(crate) const SQLITE_MESSAGE: &str = "SELECT id, sender, recipients, \
       (SELECT raw FROM mail_breaker_outbox_body AS body \
        WHERE body.id = mail_breaker_outbox.id), \
       attempts, enqueued_at, due_at, leased > 0, dead_at, \
       error_category, error_code, error_message, error_transport \
     FROM mail_breaker_outbox WHERE id = ?1";

/// One message on SQLite, by [`SQLITE_MESSAGE`].
pub(crate) async fn sqlite_message(
    pool: &sqlx::SqlitePool,
    id: OutboxId,
) -> Result<Option<MessageRow>, SendError> {
    let row = sqlx::query(SQLITE_MESSAGE)
        .bind(id.0)
        .fetch_optional(pool)
        .await;
    read_row(row)
}

/// The `SELECT` of one message on PostgreSQL (a lease's end is `lease_until` there).
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_message(
    pool: &sqlx::PgPool,
    id: OutboxId,
) -> Result<Option<MessageRow>, SendError> {
    let row = sqlx::query(
        "SELECT id, sender, recipients, raw, attempts::bigint, enqueued_at, \
           CASE WHEN leased THEN COALESCE(lease_until, due_at) ELSE due_at END, leased, dead_at, \
           error_category, error_code, error_message, error_transport \
         FROM mail_breaker_outbox WHERE id = $1",
    )
    .bind(id.0)
    .fetch_optional(pool)
    .await;
    read_row(row)
}

/// One message's columns, in the order both backends' `SELECT`s give them.
fn read_row<R>(row: Result<Option<R>, sqlx::Error>) -> Result<Option<MessageRow>, SendError>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let read = |row: &R| -> Result<MessageRow, sqlx::Error> {
        Ok(MessageRow {
            id: row.try_get(0)?,
            sender: row.try_get(1)?,
            recipients: row.try_get(2)?,
            raw: row.try_get(3)?,
            attempts: row.try_get(4)?,
            enqueued_at: row.try_get(5)?,
            due_at: row.try_get(6)?,
            leased: row.try_get(7)?,
            dead_at: row.try_get(8)?,
            error: StoredError {
                category: row.try_get(9)?,
                code: row.try_get(10)?,
                message: row.try_get(11)?,
                transport: row.try_get(12)?,
            },
        })
    };
    match row {
        Ok(None) => Ok(None),
        Ok(Some(row)) => read(&row).map(Some),
        Err(error) => Err(error),
    }
    .map_err(|e| record::database_error("reading a message", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(raw: &[u8], dead_at: Option<SystemTime>) -> StoredMessage {
        StoredMessage {
            id: OutboxId(1),
            envelope: record::envelope(None, "user@example.org").expect("an envelope"),
            raw: raw.to_vec(),
            attempts: 0,
            enqueued_at: SystemTime::UNIX_EPOCH,
            due_at: SystemTime::UNIX_EPOCH,
            leased: false,
            dead_at,
            error: None,
        }
    }

    #[test]
    fn headers_are_the_fields_before_the_first_empty_line_with_folded_lines_joined() {
        let raw = b"From: a@example.com\r\nSubject: a long\r\n\tsubject\r\nno colon here\r\n\r\nTo: not@header";
        assert_eq!(
            StoredMessage::parse_headers(raw),
            [
                ("From".to_owned(), "a@example.com".to_owned()),
                ("Subject".to_owned(), "a long subject".to_owned()),
            ]
        );
        assert_eq!(stored(raw, None).headers().len(), 2);
    }

    #[test]
    fn the_subject_is_found_whatever_its_case_and_is_none_without_one() {
        assert_eq!(
            stored(b"To: b@example.org\r\nSUBJECT: Receipt\r\n\r\n", None)
                .subject()
                .as_deref(),
            Some("Receipt")
        );
        assert_eq!(stored(b"To: b@example.org\r\n\r\n", None).subject(), None);
    }

    #[test]
    fn a_message_is_dead_when_it_has_a_time_of_death() {
        assert!(stored(b"", Some(SystemTime::UNIX_EPOCH)).is_dead());
        assert!(!stored(b"", None).is_dead());
    }

    fn row(error: StoredError) -> MessageRow {
        MessageRow {
            id: 1,
            sender: None,
            recipients: "user@example.org".to_owned(),
            raw: Vec::new(),
            attempts: 1,
            enqueued_at: 0,
            due_at: 0,
            leased: false,
            dead_at: None,
            error,
        }
    }

    #[test]
    fn a_row_with_an_errors_code_or_its_category_alone_has_failed() {
        let code = StoredError {
            code: Some("smtp.rejected".to_owned()),
            ..StoredError::default()
        };
        let category = StoredError {
            category: Some("Rejected".to_owned()),
            ..StoredError::default()
        };
        for error in [code, category] {
            assert!(row(error).read().expect("read").error.is_some());
        }
        let none = row(StoredError::default()).read().expect("read");
        assert!(none.error.is_none());
    }
}
