//! The small trait the outbox's two databases implement: SQLite (`sqlite.rs`) and
//! PostgreSQL (`postgres.rs`). Every method is one statement or one transaction.

use std::fmt::Debug;
use std::time::Duration;

use super::inspect::MessageRow;
use super::record::{Claim, Claimed, DeadRow, NewRow, StoredError};
use super::schedule::Millis;
use super::{OutboxId, OutboxStats};
use crate::SendError;

/// What the worker wrote back for one claim.
#[derive(Debug, Clone)]
pub(crate) enum Finish {
    /// Delivered: the row goes.
    Sent,
    /// Claimed and not sent (the worker stopped, or the stack refused it without an
    /// attempt): due again `wait` after `now` (a database with a clock of its own counts it
    /// from its own now) for any worker, the claim not counted as an attempt.
    GiveBack { now: Millis, wait: Millis },
    /// Dead with its error, at a time.
    Dead {
        error: StoredError,
        at: Millis,
        /// The recipients it is now for, when a delivery deferred only some of them.
        recipients: Option<String>,
    },
    /// Due again at `due_at`, its last error kept.
    Retry {
        error: StoredError,
        due_at: Millis,
        /// `due_at` less the time of the answer: how long from now it waits (a database
        /// with a clock of its own counts it from its own now).
        wait: Millis,
        /// The recipients it is now for, when a delivery deferred only some of them.
        recipients: Option<String>,
    },
    /// A delivery that left its recipients in more than one state (DESIGN §19): `main` for
    /// the message's own row (dead or due again, narrowed to its recipients), and a dead
    /// letter of its own for each of `dead`, copied from the row (sender, body, times,
    /// attempts) in the same transaction, once the row's update found the claim still held.
    Split {
        main: Box<Finish>,
        dead: Vec<DeadPart>,
    },
}

/// Recipients of a message that are dead with an error of their own, beside the rest of the
/// message: refused in a partial delivery, or maybe delivered under `at_most_once`.
#[derive(Debug, Clone)]
pub(crate) struct DeadPart {
    pub error: StoredError,
    /// When they died (a database with a clock of its own uses its own now).
    pub at: Millis,
    /// One per line, as the outbox keeps them.
    pub recipients: String,
}

/// How many bytes of bodies a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bytes {
    pub max: u64,
    /// The first message is taken even if its body alone is larger than `max`.
    pub first_whatever_size: bool,
}

impl Bytes {
    /// No bound.
    #[cfg(test)]
    pub(crate) const ANY: Bytes = Bytes {
        max: u64::MAX,
        first_whatever_size: true,
    };

    /// The bound as SQL parameters: the bytes, and the bytes before a message below which it
    /// is taken whatever its size (1: only the first; 0: none).
    pub(crate) fn parameters(self) -> (i64, i64) {
        (
            i64::try_from(self.max).unwrap_or(i64::MAX),
            i64::from(self.first_whatever_size),
        )
    }
}

/// Which time a failed claim's update sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failed {
    /// `dead_at`: the message is dead.
    Dead,
    /// `due_at`: it is tried again then.
    Retry,
}

impl Finish {
    /// How long a retry or a message given back waits from the answer; zero for any other
    /// outcome.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn wait(&self) -> Millis {
        match self {
            Finish::Retry { wait, .. } | Finish::GiveBack { wait, .. } => *wait,
            Finish::Split { main, .. } => main.wait(),
            _ => 0,
        }
    }

    /// For a failure: which update, its time, the error, and the narrowed recipients.
    pub(crate) fn failure(&self) -> Option<(Failed, Millis, &StoredError, Option<&str>)> {
        match self {
            Finish::Sent | Finish::GiveBack { .. } => None,
            Finish::Dead {
                error,
                at,
                recipients,
            } => Some((Failed::Dead, *at, error, recipients.as_deref())),
            Finish::Retry {
                error,
                due_at,
                recipients,
                ..
            } => Some((Failed::Retry, *due_at, error, recipients.as_deref())),
            Finish::Split { main, .. } => main.failure(),
        }
    }

    /// The dead letters of their own a split delivery leaves beside the message's row.
    pub(crate) fn dead_parts(&self) -> &[DeadPart] {
        match self {
            Finish::Split { dead, .. } => dead,
            _ => &[],
        }
    }

    /// The outcome for the message's own row: `main` of a split, else itself.
    pub(crate) fn own(&self) -> &Finish {
        match self {
            Finish::Split { main, .. } => main,
            own => own,
        }
    }
}

#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync + Debug {
    /// Stores the rows, all or none, committed before it returns; their ids in order.
    async fn enqueue(&self, rows: &[NewRow], now: Millis) -> Result<Vec<OutboxId>, SendError>;

    /// Stores, in one transaction, `queued` to be sent and `dead` as dead letters, each with
    /// its error, counted as tried once (what `send_or_queue` keeps of a partial delivery).
    async fn keep_split(
        &self,
        queued: &[NewRow],
        dead: &[(NewRow, StoredError)],
        now: Millis,
    ) -> Result<(), SendError>;

    /// Leases up to `limit` messages due now (soonest first) for `lease`, in one statement no
    /// other worker can interleave with. `now` is this process's clock; PostgreSQL reads its
    /// own (`now()`), so that workers on machines whose clocks differ agree. It stops before
    /// the message whose body would bring the bodies taken past `bytes.max`; with
    /// `bytes.first_whatever_size` it takes the first however large (a worker holding nothing
    /// must make progress). `durable`: the claim is synced to disk
    /// before it returns (`at_most_once` needs it: a claim that a power cut undid would let
    /// a message that went be sent again); else a lost claim only means a message sent again,
    /// which at-least-once allows.
    async fn claim(
        &self,
        now: Millis,
        lease: Duration,
        limit: u32,
        bytes: Bytes,
        durable: bool,
    ) -> Result<Vec<Claimed>, SendError>;

    /// Extends the leases of these claims to `lease` from now, in one statement: those still
    /// held under the claim (no other worker took the message since, and it is still there).
    /// The claims renewed; `durable` as for [`claim`](Self::claim).
    async fn renew(
        &self,
        claims: &[Claim],
        now: Millis,
        lease: Duration,
        durable: bool,
    ) -> Result<Vec<Claim>, SendError>;

    /// Writes back the outcome of each claim, in one transaction. A claim whose lease another
    /// worker has taken since is left alone.
    async fn finish(&self, outcomes: &[(Claim, Finish)]) -> Result<(), SendError>;

    /// The soonest due time of a queued message (a held one's is its lease's end), on the
    /// clock that read `now`: a database that keeps its own clock counts how long from its
    /// now, and gives that wait from the caller's.
    async fn next_due(&self, now: Millis) -> Result<Option<Millis>, SendError>;

    async fn stats(&self, now: Millis) -> Result<OutboxStats, SendError>;

    /// The dead letters, oldest death first.
    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadRow>, SendError>;

    /// Up to `limit` dead letters whose ids are below `before` (all of them for `None`),
    /// highest id first, in one statement reading an index of the dead letters' ids alone.
    async fn dead_letters_page(
        &self,
        before: Option<OutboxId>,
        limit: u32,
    ) -> Result<Vec<DeadRow>, SendError>;

    /// Makes a dead message due now again, as if enqueued now (age, attempts and panics
    /// start afresh; its error kept); whether it was dead.
    async fn requeue(&self, id: OutboxId, now: Millis) -> Result<bool, SendError>;

    /// Deletes a message, queued or dead; whether it was there.
    async fn purge(&self, id: OutboxId) -> Result<bool, SendError>;

    /// Deletes a message only if it is dead, in one statement (a requeue between an
    /// operator's read and this leaves it queued); whether it was deleted.
    async fn purge_dead(&self, id: OutboxId) -> Result<bool, SendError>;

    /// One message, queued or dead, read and left as it is (`inspect.rs`).
    async fn message(&self, id: OutboxId) -> Result<Option<MessageRow>, SendError>;
    /// The database's pool, for the suppression list kept beside the outbox; `None` for one
    /// without a table.
    #[cfg(feature = "webhooks")]
    fn suppression_store(&self) -> Option<crate::suppression::SqlStore> {
        None
    }
    /// The database, for the operator page's reads (`admin_reads.rs`); `None` for one
    /// without a table.
    #[cfg(feature = "admin")]
    fn database(&self) -> Option<super::admin_reads::Database<'_>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_and_a_give_back_wait_as_long_as_they_said_and_nothing_else_waits() {
        let retry = Finish::Retry {
            error: StoredError::default(),
            due_at: 9_000,
            wait: 4_000,
            recipients: None,
        };
        assert_eq!(retry.wait(), 4_000);
        assert_eq!(Finish::Sent.wait(), 0);
        assert_eq!(Finish::GiveBack { now: 5, wait: 7 }.wait(), 7);
    }

    #[test]
    fn a_split_delivery_waits_as_long_as_the_part_it_keeps_queued() {
        let split = Finish::Split {
            main: Box::new(Finish::Retry {
                error: StoredError::default(),
                due_at: 9_000,
                wait: 4_000,
                recipients: Some("later@example.org".to_owned()),
            }),
            dead: Vec::new(),
        };
        assert_eq!(split.wait(), 4_000);
    }
}
