//! Sending through a caller's own `lettre::AsyncSmtpTransport` ([`SmtpTransport::new`]) without
//! ever letting lettre's pool take back a half-used connection.
//!
//! lettre's pool takes back any connection that was not marked broken, including one whose
//! send was dropped between writing a command and reading its reply; the next send on it then
//! reads the replies meant for the last one. So each send runs as a task of its own, which
//! the send's timeout and its caller's drop do not cancel: the send's answer comes at its
//! deadline, and the task finishes the transaction in the background, reading every reply,
//! before lettre gets its connection back.
//!
//! # The trade-off
//! - A send that timed out may still deliver afterwards, so its `smtp.timeout` is marked
//!   [`maybe_delivered`](crate::SendError::maybe_delivered).
//! - A server that never answers holds the task, and one of lettre's connections, until the
//!   operating system gives up on the socket: lettre's own timeout bounds only the connect.
//! - Each send copies its message once, for the task.
//!
//! The crate's own connections ([`SmtpTransport::unencrypted`], the builder) have none of
//! these costs: a cut-off send closes its connection at once.
//!
//! [`SmtpTransport::new`]: super::SmtpTransport::new
//! [`SmtpTransport::unencrypted`]: super::SmtpTransport::unencrypted

use lettre::transport::smtp::response::Response;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use tokio::time::Instant;

use super::classify::classify_smtp_error;
use crate::{Category, Envelope, SendError};

/// A send through lettre's transport that ran past its deadline, or whose task ended
/// without an answer.
#[derive(Debug)]
pub(super) enum Unfinished {
    /// The deadline passed; the task goes on.
    TimedOut,
    /// lettre answered with an error.
    Failed(SendError),
}

/// Sends through `transport` in a task of its own, waiting for its answer until `deadline`.
pub(super) async fn send(
    transport: &AsyncSmtpTransport<Tokio1Executor>,
    envelope: &Envelope,
    raw: &[u8],
    deadline: Instant,
) -> Result<Response, Unfinished> {
    let transport = transport.clone();
    let envelope = envelope.clone();
    let raw = raw.to_vec();
    let task = tokio::spawn(async move { transport.send_raw(&envelope, &raw).await });
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(Ok(response))) => Ok(response),
        Ok(Ok(Err(error))) => Err(Unfinished::Failed(classify_smtp_error(&error))),
        Ok(Err(_join_error)) => Err(Unfinished::Failed(task_lost())),
        Err(_elapsed) => Err(Unfinished::TimedOut),
    }
}

/// Checks lettre's connection in a task of its own, waiting until `deadline`: `Ok(false)`
/// when the server did not accept a connection.
pub(super) async fn test_connection(
    transport: &AsyncSmtpTransport<Tokio1Executor>,
    deadline: Instant,
) -> Result<bool, Unfinished> {
    let transport = transport.clone();
    let task = tokio::spawn(async move { transport.test_connection().await });
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(Ok(reachable))) => Ok(reachable),
        Ok(Ok(Err(error))) => Err(Unfinished::Failed(classify_smtp_error(&error))),
        Ok(Err(_join_error)) => Err(Unfinished::Failed(task_lost())),
        Err(_elapsed) => Err(Unfinished::TimedOut),
    }
}

/// The error for a send whose task panicked or was cancelled by a runtime shutting down.
fn task_lost() -> SendError {
    SendError::fixed(
        Category::Network,
        "smtp.task_lost",
        "the task sending through lettre ended without an answer",
    )
}
