//! One mail transaction on an open connection: RSET if the last one was refused, MAIL, one
//! RCPT per recipient with its own answer, DATA, the body and its final dot.
//!
//! What the transaction ends with tells the pool what to do with the connection:
//! [`Ending::Answered`] hands it back, [`Ending::NotBegun`] lets a fresh connection try (nothing
//! of the message reached the server), [`Ending::Broken`] closes it.

use std::sync::{Arc, OnceLock};

use lettre::Address;
use lettre::transport::smtp::Error as SmtpError;
use lettre::transport::smtp::commands::{Data, Mail, Rcpt, Rset};
use lettre::transport::smtp::extension::{Extension, MailBodyParameter, MailParameter, ServerInfo};

use super::classify::{classify_smtp_error, leaves_connection_usable, receipt_for};
use super::connection::Connection;
use super::socket::DotWatch;
use mail_breaker::{Category, Envelope, Receipt, SendError};

/// How a transaction ended, for the connection's sake.
#[derive(Debug)]
pub(super) enum Ending {
    /// The server answered the whole transaction (a receipt, or a refusal); the connection
    /// may carry another.
    Answered(Result<Receipt, SendError>),
    /// A connection taken from the pool failed before the transaction began (at RSET or
    /// MAIL, without a reply or with a `421`): the server closed it while it was idle.
    /// Nothing of the message reached the server; a fresh connection may try.
    NotBegun(SendError),
    /// The connection broke mid-transaction, or the server closes it: close it.
    Broken(SendError),
}

/// What one send's timeout needs to know: whether its final dot was written before the time
/// ran out. Set when the body begins, read after the send's future is dropped.
#[derive(Debug, Default)]
pub(super) struct Progress(OnceLock<Arc<DotWatch>>);

impl Progress {
    /// Whether the final dot of this send's message was written.
    pub(super) fn final_dot_written(&self) -> bool {
        self.0.get().is_some_and(|watch| watch.final_dot_written())
    }
}

/// Sends `raw` to the recipients of `envelope` on `connection`. `reused` says it came from
/// the pool (and so may have been closed by the server while idle); `transport` names the
/// receipt.
pub(super) async fn send(
    connection: &mut Connection,
    reused: bool,
    envelope: &Envelope,
    raw: &[u8],
    transport: &str,
    progress: &Progress,
) -> Ending {
    if connection.needs_reset {
        if let Err(error) = connection.smtp.command(Rset).await {
            return Ending::NotBegun(classify_smtp_error(&error));
        }
        connection.needs_reset = false;
    }
    let parameters = match mail_parameters(connection.smtp.server_info(), envelope, raw) {
        Ok(parameters) => parameters,
        Err(error) => return Ending::Answered(Err(error)),
    };
    connection.watch.transaction_begins();
    connection.transactions = connection.transactions.saturating_add(1);

    let mail = Mail::new(envelope.from().cloned(), parameters);
    if let Err(error) = connection.smtp.command(mail).await {
        if reused && !leaves_connection_usable(&error) {
            return Ending::NotBegun(classify_smtp_error(&error));
        }
        return refused(connection, &error);
    }

    let mut accepted = 0_usize;
    let mut rejected: Vec<(Address, SendError)> = Vec::new();
    for to in envelope.to() {
        match connection
            .smtp
            .command(Rcpt::new(to.clone(), Vec::new()))
            .await
        {
            Ok(_) => accepted += 1,
            Err(error) if leaves_connection_usable(&error) => {
                rejected.push((to.clone(), classify_smtp_error(&error)));
            }
            Err(error) => return Ending::Broken(classify_smtp_error(&error)),
        }
    }
    if accepted == 0 {
        connection.needs_reset = true;
        return Ending::Answered(Err(every_recipient_refused(rejected)));
    }

    if let Err(error) = connection.smtp.command(Data).await {
        return refused(connection, &error);
    }
    connection.watch.body_begins();
    let _ = progress.0.set(Arc::clone(&connection.watch));
    match connection.smtp.message(raw).await {
        Ok(response) => {
            let receipt = rejected
                .into_iter()
                .fold(receipt_for(transport, &response), |receipt, (to, why)| {
                    receipt.with_rejected_recipient(to, why)
                });
            Ending::Answered(Ok(receipt))
        }
        Err(error) if leaves_connection_usable(&error) => {
            connection.needs_reset = true;
            Ending::Answered(Err(classify_smtp_error(&error)))
        }
        Err(error) => {
            let error_after_body = classify_smtp_error(&error);
            Ending::Broken(if connection.watch.final_dot_written() {
                error_after_body.maybe_delivered()
            } else {
                error_after_body
            })
        }
    }
}

/// The ending after the server refused a command with `error` before the body: answered (RSET
/// before the next transaction) if the connection is still usable, else broken.
fn refused(connection: &mut Connection, error: &SmtpError) -> Ending {
    let refusal = classify_smtp_error(error);
    if leaves_connection_usable(error) {
        connection.needs_reset = true;
        Ending::Answered(Err(refusal))
    } else {
        Ending::Broken(refusal)
    }
}

/// The answer when the server refused every recipient: a refusal that may pass if any does
/// (a retry may then deliver to that recipient), else the first.
fn every_recipient_refused(rejected: Vec<(Address, SendError)>) -> SendError {
    let mut refusals = rejected.into_iter().map(|(_, why)| why);
    let Some(first) = refusals.next() else {
        // An envelope always has a recipient; this is for the type's sake.
        return SendError::new(
            Category::InvalidMessage,
            "smtp.no_recipients",
            "the message has no recipients",
        );
    };
    if first.is_retryable() {
        return first;
    }
    refusals.find(SendError::is_retryable).unwrap_or(first)
}

/// MAIL's parameters: SMTPUTF8 for non-ASCII addresses and 8BITMIME for a non-ASCII body,
/// or a `Configuration` error (`smtp.client`) if the server offers neither where needed.
fn mail_parameters(
    server: &ServerInfo,
    envelope: &Envelope,
    raw: &[u8],
) -> Result<Vec<MailParameter>, SendError> {
    let mut parameters = Vec::new();
    let non_ascii = |address: &Address| !AsRef::<str>::as_ref(address).is_ascii();
    if envelope.from().is_some_and(non_ascii) || envelope.to().iter().any(non_ascii) {
        if !server.supports_feature(Extension::SmtpUtfEight) {
            return Err(SendError::new(
                Category::Configuration,
                "smtp.client",
                "the envelope has non-ASCII addresses and the server does not offer SMTPUTF8",
            ));
        }
        parameters.push(MailParameter::SmtpUtfEight);
    }
    if !raw.is_ascii() {
        if !server.supports_feature(Extension::EightBitMime) {
            return Err(SendError::new(
                Category::Configuration,
                "smtp.client",
                "the message is not ASCII and the server does not offer 8BITMIME",
            ));
        }
        parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    Ok(parameters)
}
