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
//! - **A server that limits how fast clients connect.** A connection refused as a rate
//!   limit (Postfix's `421 4.7.0 Error: too many connections from ...` at the greeting)
//!   pauses opening: for its `retry_after`, else [`OPEN_PAUSE`], no send opens a connection;
//!   each waits (within its own timeout) for one of the pool's live connections to come
//!   free. Only when none is open or opening is the refusal the send's answer.
//! - No NOOP on checkout: a connection the server closed while idle that the look above did
//!   not catch fails at RSET or MAIL, before anything of the message was sent, and the send
//!   then opens a fresh one.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::connection::{Connection, ConnectionSettings};
use crate::time::later;
use crate::{Category, SendError};

/// How long opening pauses after a connection was refused as a rate limit that did not say
/// how long.
pub(super) const OPEN_PAUSE: Duration = Duration::from_secs(5);

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
    /// The connections open or being opened, and the signal that one came free or closed.
    live: Arc<Live>,
    /// Until when no connection is opened, and the refusal that said so.
    paused: Mutex<Option<(Instant, SendError)>>,
}

/// How many connections of a pool are open or being opened; a waiting send listens to
/// `changed`.
#[derive(Debug, Default)]
struct Live {
    count: AtomicUsize,
    /// Notified when a connection comes back to the pool or closes.
    changed: Notify,
}

/// Counts one connection as live while it exists.
#[derive(Debug)]
struct LiveGuard(Arc<Live>);

impl LiveGuard {
    fn new(live: &Arc<Live>) -> Self {
        live.count.fetch_add(1, Ordering::SeqCst);
        LiveGuard(Arc::clone(live))
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// A connection of the pool: counted as live until it is dropped.
pub(super) struct Pooled {
    connection: Connection,
    _live: LiveGuard,
}

impl Pooled {
    /// Closes it in the background after a QUIT (see [`Connection::retire`]).
    fn retire(self) {
        self.connection.retire();
    }
}

impl Deref for Pooled {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.connection
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.connection
    }
}

struct Idle {
    connection: Pooled,
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
            live: Arc::default(),
            paused: Mutex::new(None),
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
    pub(super) fn take_idle(&self) -> Option<Pooled> {
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
    pub(super) async fn open(&self) -> Result<Pooled, SendError> {
        let live = LiveGuard::new(&self.live);
        let connection = Connection::open(&self.settings).await?;
        Ok(Pooled {
            connection,
            _live: live,
        })
    }

    /// A connection for a send that holds its turn, and whether it was idle in the pool: the
    /// most recent idle one, else a fresh one. While opening is paused after a rate-limit
    /// refusal, it waits for a live connection to come free instead, and answers with that
    /// refusal only when no connection is open or being opened.
    pub(super) async fn checkout(&self) -> Result<(Pooled, bool), SendError> {
        loop {
            // Listening before looking, so that a connection that comes free in between
            // still wakes this send.
            let changed = self.live.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(connection) = self.take_idle() {
                return Ok((connection, true));
            }
            if let Some((until, why)) = self.pause() {
                if self.live.count.load(Ordering::SeqCst) == 0 {
                    let left = until.saturating_duration_since(Instant::now());
                    return Err(why.with_retry_after(left));
                }
                tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(until) => {}
                }
                continue;
            }
            match self.open().await {
                Ok(connection) => return Ok((connection, false)),
                Err(error) if error.category() == Category::RateLimited => {
                    let pause = error.retry_after().unwrap_or(OPEN_PAUSE);
                    tracing::debug!(
                        code = error.code(),
                        pause_ms = pause.as_millis() as u64,
                        "smtp.opening_paused"
                    );
                    *self.paused.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some((later(Instant::now(), pause), error.clone()));
                    if self.live.count.load(Ordering::SeqCst) == 0 {
                        return Err(error);
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Until when opening is paused, and why; `None` once the pause is over.
    fn pause(&self) -> Option<(Instant, SendError)> {
        let mut paused = self.paused.lock().unwrap_or_else(PoisonError::into_inner);
        match &*paused {
            Some((until, why)) if Instant::now() < *until => Some((*until, why.clone())),
            Some(_) => {
                *paused = None;
                None
            }
            None => None,
        }
    }

    /// Takes back a connection whose transaction the server answered whole, unless it has
    /// carried its share of messages.
    pub(super) fn give_back(&self, mut connection: Pooled) {
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
        drop(idle);
        // A send waiting while opening is paused may take it.
        self.live.changed.notify_waiters();
    }
}
