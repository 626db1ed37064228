//! A message as the outbox's table holds it, in the plain values both backends store, and
//! what the table's rows read back as.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lettre::Address;

use super::schedule::Millis;
use super::{DeadLetter, OutboxId, OutboxStats};
use crate::{Category, Envelope, SendError};

/// An envelope and the formatted message, ready to be stored. (`pub` only so that the sealed
/// trait behind [`OutboxConnection`](super::OutboxConnection) may name it; this module is
/// private.)
#[derive(Debug, Clone)]
pub struct NewRow {
    /// The envelope's sender, `None` for the null sender (`MAIL FROM:<>`).
    pub sender: Option<String>,
    /// The recipients, one per line: no address holds a line break.
    pub recipients: String,
    pub raw: Vec<u8>,
    /// The key every attempt is sent under (DESIGN §21): the open handover's, or a new one.
    pub key: String,
}

impl NewRow {
    /// A row for a message handed over now, with the key it keeps: the open handover's
    /// (`send_or_queue` queueing what its first try did not deliver, or a key the
    /// application gave), else a new one.
    pub(crate) fn new(envelope: &Envelope, raw: &[u8]) -> NewRow {
        NewRow {
            sender: envelope.from().map(ToString::to_string),
            recipients: join_recipients(envelope),
            raw: raw.to_vec(),
            key: key_to_keep(raw),
        }
    }
}

/// The idempotency key a message handed over now is kept with (DESIGN §21): its Message-ID,
/// read from its header, goes into it.
pub(crate) fn key_to_keep(raw: &[u8]) -> String {
    crate::idempotency::to_keep(message_id(raw).as_deref(), raw)
}

/// The `Message-ID:` of the formatted message `raw`, unfolded, if its header has one.
fn message_id(raw: &[u8]) -> Option<String> {
    super::StoredMessage::parse_headers(raw)
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("message-id"))
        .map(|(_, value)| value.trim().to_owned())
}

fn join_recipients(envelope: &Envelope) -> String {
    let mut joined = String::new();
    for (i, to) in envelope.to().iter().enumerate() {
        if i > 0 {
            joined.push('\n');
        }
        joined.push_str(to.as_ref());
    }
    joined
}

/// The envelope stored as `sender` and `recipients`.
pub(crate) fn envelope(sender: Option<&str>, recipients: &str) -> Result<Envelope, SendError> {
    let corrupt = |what: String| {
        SendError::new(
            Category::InvalidMessage,
            "outbox.corrupt",
            format!("the outbox holds an envelope it cannot read: {what}"),
        )
    };
    let from = sender
        .map(|sender| Address::from_str(sender).map_err(|e| corrupt(e.to_string())))
        .transpose()?;
    let to = recipients
        .split('\n')
        .map(|to| Address::from_str(to).map_err(|e| corrupt(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    Envelope::new(from, to).map_err(|e| corrupt(e.to_string()))
}

/// A message a worker claimed: it holds the lease until `lease_until`.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub claim: Claim,
    pub enqueued_at: Millis,
    /// Whether a worker held it before and its lease ran out: that worker may have sent it.
    pub lease_lost: bool,
    /// How many of its sends panicked (`transport.panicked`) so far.
    pub panics: u32,
    pub sender: Option<String>,
    pub recipients: String,
    pub raw: Vec<u8>,
    /// Its idempotency key (DESIGN §21); `None` for a row an earlier version kept, whose
    /// attempts go under the key that version gave it.
    pub key: Option<String>,
}

/// Which claim of which message: `attempts` after the claim is the lease's token, so that an
/// answer from a worker whose lease ran out (and another claimed the message) changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Claim {
    pub id: OutboxId,
    pub attempts: u32,
}

/// An error as the table keeps it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoredError {
    pub category: Option<String>,
    pub code: Option<String>,
    pub message: Option<String>,
    pub transport: Option<String>,
}

impl StoredError {
    pub(crate) fn of(error: &SendError) -> StoredError {
        StoredError {
            category: Some(error.category().as_str().to_owned()),
            code: Some(error.code().to_owned()),
            message: Some(error.message().to_owned()),
            transport: error.transport().map(str::to_owned),
        }
    }

    /// The error back, or a plain one when the row holds none.
    pub(crate) fn read(self) -> SendError {
        let category = self
            .category
            .as_deref()
            .and_then(Category::from_name)
            .unwrap_or(Category::ServerError);
        let error = SendError::new(
            category,
            self.code.unwrap_or_else(|| "outbox.unknown".to_owned()),
            self.message.unwrap_or_default(),
        );
        match self.transport {
            Some(transport) => error.with_transport(transport),
            None => error,
        }
    }
}

/// A dead row's columns.
#[derive(Debug)]
pub(crate) struct DeadRow {
    pub id: i64,
    pub sender: Option<String>,
    pub recipients: String,
    pub attempts: i64,
    pub dead_at: Millis,
    pub error: StoredError,
}

impl DeadRow {
    pub(crate) fn read(self) -> Result<DeadLetter, SendError> {
        Ok(DeadLetter {
            id: OutboxId(self.id),
            envelope: envelope(self.sender.as_deref(), &self.recipients)?,
            error: self.error.read(),
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            at: from_millis(self.dead_at),
        })
    }
}

/// The counts read by a backend's `stats` (queued, due, leased, dead) and the enqueue time
/// of the oldest queued message, as [`OutboxStats`] at `now`.
pub(crate) fn stats_from(
    now: Millis,
    counts: [Result<i64, sqlx::Error>; 4],
    oldest: Result<Option<Millis>, sqlx::Error>,
) -> Result<OutboxStats, sqlx::Error> {
    let [queued, due, leased, dead] = counts;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(OutboxStats {
        queued: count(queued?),
        due: count(due?),
        leased: count(leased?),
        dead: count(dead?),
        oldest: oldest?
            .map(|at| Duration::from_millis(u64::try_from(now.saturating_sub(at)).unwrap_or(0))),
    })
}

/// The wall clock in [`Millis`].
pub(crate) fn now() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, super::schedule::millis)
}

/// `at` as a time of day.
pub(crate) fn from_millis(at: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(at).unwrap_or(0))
}

/// The error for a database the outbox cannot reach or use.
pub(crate) fn database_error(doing: &'static str, error: sqlx::Error) -> SendError {
    let category = match &error {
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => Category::Configuration,
        _ => Category::ServiceUnavailable,
    };
    database_error_of(category, doing, error)
}

/// The error for a database the outbox cannot reach or use, of `category`.
pub(crate) fn database_error_of(
    category: Category,
    doing: &'static str,
    error: sqlx::Error,
) -> SendError {
    SendError::new(
        category,
        "outbox.database",
        format!("the outbox's database failed while {doing}: {error}"),
    )
    .with_source(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_kept_is_keyed_by_the_message_id_its_header_holds() {
        let raw = b"Message-ID:\r\n <a.b@example.com>\r\nSubject: x\r\n\r\nMessage-ID: <body>\r\n";
        assert_eq!(message_id(raw).as_deref(), Some("<a.b@example.com>"));
        assert_eq!(
            message_id(b"message-id: <c@d>\r\n\r\n").as_deref(),
            Some("<c@d>")
        );
        assert_eq!(
            message_id(b"Subject: x\r\n\r\nMessage-ID: <body>\r\n"),
            None
        );
        assert_eq!(key_to_keep(raw), "a.b@example.com");
    }

    #[test]
    fn a_database_set_up_wrong_is_a_configuration_error_and_one_away_is_unavailable() {
        let wrong = database_error("opening", sqlx::Error::Configuration("bad URL".into()));
        assert_eq!(wrong.category(), Category::Configuration);
        let tls = database_error("opening", sqlx::Error::Tls("no certificate".into()));
        assert_eq!(tls.category(), Category::Configuration);
        let away = database_error(
            "claiming",
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        );
        assert_eq!(away.category(), Category::ServiceUnavailable);
        assert_eq!(away.code(), "outbox.database");
    }
}
