//! The transport's own small connection pool.
//!
//! - At most `max_connections` sends hold a connection at once (a semaphore); the others wait
//!   their turn, within their own timeout.
//! - A connection comes back only from [`ConnectionPool::give_back`], which a send calls once
//!   the server answered its whole transaction. A send cut off anywhere (its timeout, its
//!   caller dropping it, an I/O error) drops its connection instead, which closes it: a
//!   connection with a reply still on its way is never used again.
//! - An idle connection older than `idle_timeout` is closed when a send next meets it (there
//!   is no timer task), and one that carried `max_messages_per_connection` transactions is
//!   closed instead of handed back.
//! - A connection holding octets no command read as its reply (a reply the server sent twice
//!   or unasked, read ahead or arrived while idle), or that the server closed, is closed when
//!   it comes back and when a send next takes it: its state is not known, and its next
//!   command would read an old reply as its own.
//! - No NOOP on checkout: a connection the server closed while idle that the look above did
//!   not catch fails at RSET or MAIL, before anything of the message was sent, and the send
//!   then opens a fresh one.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::connection::{Connection, ConnectionSettings};
use crate::{Category, SendError};

/// The limits of a pool.
#[derive(Debug, Clone, Copy)]
pub(super) struct PoolLimits {
    pub(super) max_connections: usize,
    pub(super) idle_timeout: Duration,
    pub(super) max_messages_per_connection: u32,
}

#[derive(Debug)]
pub(super) struct ConnectionPool {
    settings: ConnectionSettings,
    limits: PoolLimits,
    permits: Semaphore,
    /// Idle connections, the most recently used last.
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    connection: Connection,
    since: Instant,
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle").field("since", &self.since).finish()
    }
}

impl ConnectionPool {
    pub(super) fn new(settings: ConnectionSettings, limits: PoolLimits) -> Self {
        ConnectionPool {
            settings,
            permits: Semaphore::new(limits.max_connections),
            limits,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn settings(&self) -> &ConnectionSettings {
        &self.settings
    }

    pub(super) fn limits(&self) -> PoolLimits {
        self.limits
    }

    /// Waits for the turn to hold a connection; the turn ends when the permit is dropped.
    pub(super) async fn turn(&self) -> Result<SemaphorePermit<'_>, SendError> {
        self.permits.acquire().await.map_err(|_closed| {
            SendError::fixed(
                Category::Configuration,
                "smtp.shutdown",
                "the connection pool was shut down",
            )
        })
    }

    /// The most recently used idle connection that is still young enough, if any. Call it
    /// with a turn held.
    pub(super) fn take_idle(&self) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(mut candidate) = idle.pop() {
            if candidate.connection.has_unread() {
                // Dropped: closed without a word, its state not known.
                continue;
            }
            if candidate.since.elapsed() < self.limits.idle_timeout {
                return Some(candidate.connection);
            }
            candidate.connection.retire();
        }
        None
    }

    /// Opens a fresh connection. Call it with a turn held.
    pub(super) async fn open(&self) -> Result<Connection, SendError> {
        Connection::open(&self.settings).await
    }

    /// Takes back a connection whose transaction the server answered whole, unless it has
    /// carried its share of messages.
    pub(super) fn give_back(&self, mut connection: Connection) {
        if connection.has_unread() {
            // A reply no command asked for: closed, never used again.
            return;
        }
        if connection.transactions >= self.limits.max_messages_per_connection {
            connection.retire();
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // The oldest are first; those past their time would otherwise linger while the
        // newer ones take all the sends.
        let expired = idle
            .iter()
            .take_while(|old| old.since.elapsed() >= self.limits.idle_timeout)
            .count();
        for old in idle.drain(..expired) {
            old.connection.retire();
        }
        idle.push(Idle {
            connection,
            since: Instant::now(),
        });
    }
}
