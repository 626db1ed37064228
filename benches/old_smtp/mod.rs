//! The SMTP transport as it was before the crate spoke SMTP itself (commit 45e5ca1,
//! `src/adapters/smtp/`): lettre's `AsyncSmtpConnection` on the crate's own sockets
//! (TCP_NODELAY), pooled by the crate, one command and one reply at a time. Kept here only
//! so that `benches/smtp_throughput.rs` can compare the rewrite with it; not part of the
//! crate.
//!
//! Trimmed to what compiles outside the crate and what the bench needs (send, and Ok or
//! Err): the crate-private helpers it used are replaced by local equivalents
//! (`SendError::fixed` by `SendError::new`, no masked error sources, no `ConfigError`
//! checks), and the lettre-transport wrapper, implicit TLS, `from_url` and the other
//! constructors are left out. `connection.rs`, `pool.rs`, `socket.rs` and `transaction.rs`
//! are the crate's files as they were, their unit tests removed.
#![allow(dead_code)]

mod builder;
mod classify;
mod connection;
mod pool;
mod socket;
mod transaction;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use connection::{Connection, ConnectionSettings};
use mail_breaker::{Category, Envelope, Receipt, SendError, Transport};
use pool::{ConnectionPool, PoolLimits};
use transaction::{Ending, Progress};

/// The old transport on its own connections.
#[derive(Clone)]
pub struct SmtpTransport {
    pool: Arc<ConnectionPool>,
    name: String,
    timeout: Duration,
}

impl SmtpTransport {
    /// A transport on the crate's own connections; made by the builder.
    fn own(
        settings: ConnectionSettings,
        limits: PoolLimits,
        name: String,
        timeout: Duration,
    ) -> Self {
        SmtpTransport {
            pool: Arc::new(ConnectionPool::new(settings, limits)),
            name,
            timeout,
        }
    }

    fn timed_out(&self) -> SendError {
        SendError::new(
            Category::Timeout,
            "smtp.timeout",
            "the server did not finish the send in time",
        )
    }

    /// One send on the pool, until `deadline`.
    async fn send_on_pool(
        &self,
        envelope: &Envelope,
        raw: &[u8],
        deadline: Instant,
    ) -> Result<Receipt, SendError> {
        let progress = Progress::default();
        let attempt = self.transaction_on_pool(&self.pool, envelope, raw, &progress);
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_elapsed) if progress.final_dot_written() => {
                Err(self.timed_out().maybe_delivered())
            }
            Err(_elapsed) => Err(self.timed_out()),
        }
    }

    /// Takes a connection, idle or fresh, runs the transaction on it, and hands the connection
    /// back if the server answered the whole transaction. A pooled connection found closed
    /// before the transaction began is replaced by one fresh connection.
    async fn transaction_on_pool(
        &self,
        pool: &ConnectionPool,
        envelope: &Envelope,
        raw: &[u8],
        progress: &Progress,
    ) -> Result<Receipt, SendError> {
        let _turn = pool.turn().await?;
        let (mut connection, mut reused) = match pool.take_idle() {
            Some(connection) => (connection, true),
            None => (pool.open().await?, false),
        };
        loop {
            let ending =
                transaction::send(&mut connection, reused, envelope, raw, &self.name, progress)
                    .await;
            match ending {
                Ending::Answered(result) => {
                    pool.give_back(connection);
                    return result;
                }
                Ending::NotBegun(_error) if reused => {
                    drop(connection);
                    connection = pool.open().await?;
                    reused = false;
                }
                Ending::NotBegun(error) | Ending::Broken(error) => return Err(error),
            }
        }
    }

    async fn verify_on_pool(&self) -> Result<(), SendError> {
        let _turn = self.pool.turn().await?;
        let connection: Connection = self.pool.open().await?;
        self.pool.give_back(connection);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Transport for SmtpTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let deadline = Instant::now()
            .checked_add(self.timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        self.send_on_pool(envelope, raw, deadline)
            .await
            .map_err(|error| error.with_transport(&self.name))
    }

    async fn verify(&self) -> Result<(), SendError> {
        match tokio::time::timeout(self.timeout, self.verify_on_pool()).await {
            Ok(result) => result,
            Err(_elapsed) => Err(self.timed_out()),
        }
    }
}

impl fmt::Debug for SmtpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("old::SmtpTransport")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("server", self.pool.settings())
            .field("limits", &self.pool.limits())
            .finish_non_exhaustive()
    }
}
