//! The transaction engine: one message on an open connection, each reply checked against the
//! command it answers.
//!
//! - **Round trips.** With PIPELINING (RFC 2920) the RSET a refused transaction left, MAIL,
//!   every RCPT and DATA go in one write; with CHUNKING (RFC 3030) too, the message goes in
//!   that same write as `BDAT <n> LAST`, so a message costs one round trip. Without either,
//!   each command waits for its reply.
//! - **Recipients.** Each is answered on its own: accepted; refused for good (5xx, listed in
//!   [`Receipt::rejected_recipients`]); refused for now (4xx, listed in
//!   [`Receipt::deferred_recipients`]); or too many for this transaction (`452 4.5.3`): those
//!   go in a further transaction on the same connection once this one is delivered.
//! - **Maybe delivered.** Once the final data (the dot, or BDAT LAST) is written, a lost
//!   connection, a timeout or a reply out of turn may hide a delivery: the error says so. A
//!   4xx or 5xx answer to it is a refusal, never maybe-delivered.
//! - **What the server can take.** A message over the server's SIZE, with a line over 998
//!   octets that cannot be folded (a header line is folded before a space), or that needs SMTPUTF8 (an address, or raw UTF-8 in its header) where the
//!   server does not offer it, is `InvalidMessage` before any command. SMTPUTF8 is declared
//!   whenever the envelope or the header needs it.
//!
//! What the transaction ends with tells the pool what to do with the connection
//! ([`Ending`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use lettre::Address;

use super::capabilities::Capabilities;
use super::classify::{
    Stage, accepted_transaction, is_too_many_recipients, refusal, too_many_recipients,
};
use super::command::{self, Commands, MailParameters};
use super::connection::Connection;
use super::reply::Reply;
use crate::{AcceptedTransaction, Category, Envelope, Receipt, SendError};

/// How a transaction ended, for the connection's sake.
#[derive(Debug)]
pub(super) enum Ending {
    /// The answer for the caller; `reusable` says whether the connection may carry another
    /// transaction (the server answered every command in turn and keeps the session open).
    Answered {
        result: Result<Receipt, SendError>,
        reusable: bool,
    },
    /// A connection taken from the pool failed before the server took any command of this
    /// transaction: no reply at all, or a 4xx it sent as it closed an idle session. Nothing
    /// of the message was accepted; a fresh connection may try.
    NotBegun(SendError),
}

impl Ending {
    fn closing(error: SendError) -> Ending {
        Ending::Answered {
            result: Err(error),
            reusable: false,
        }
    }
}

/// What one send has done so far, kept outside its future so that a send cut off by its
/// timeout still answers with each transaction's truth: the transactions delivered, the
/// recipients refused, and those whose transaction was under way.
#[derive(Debug, Default)]
pub(super) struct Progress {
    ledger: Mutex<Ledger>,
    /// Whether the send took its turn at the pool's connections: until then nothing of it
    /// reached the server.
    turn_taken: std::sync::atomic::AtomicBool,
}

/// Where each recipient of a send stands.
#[derive(Debug, Default)]
struct Ledger {
    /// The transactions the server accepted, in order.
    delivered: Vec<AcceptedTransaction>,
    /// Recipients refused at RCPT (for now or for good), or whose transaction was refused
    /// or broke before its data went out, each with why.
    refused: Vec<(Address, SendError)>,
    /// Recipients of a transaction whose data went out and whose answer never came.
    maybe_delivered: Vec<(Address, SendError)>,
    /// The recipients of the transaction under way, in the order of their RCPTs.
    round: Vec<Address>,
    /// How many of `round` the server has answered.
    answered: usize,
    /// Those of `round` the server accepted.
    accepted: Vec<Address>,
    /// Recipients for a further transaction (too many for this one), each with the refusal
    /// that said so, which they keep if the send ends before their turn.
    later: Vec<(Address, SendError)>,
    /// Whether the final data (the dot, or BDAT LAST) of the transaction under way went out.
    final_data_written: bool,
}

impl Progress {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The send holds its turn at the pool's connections.
    pub(super) fn take_turn(&self) {
        self.turn_taken
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the send took its turn at the pool's connections.
    pub(super) fn took_turn(&self) -> bool {
        self.turn_taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The send begins (again, on a fresh connection) for `recipients`.
    fn begin(&self, recipients: &[Address]) {
        *self.ledger() = Ledger {
            round: recipients.to_vec(),
            ..Ledger::default()
        };
    }

    /// Forgets a write on a pooled connection that turned out closed: nothing was taken.
    fn forget(&self) {
        *self.ledger() = Ledger::default();
    }

    fn note_final_data_written(&self) {
        self.ledger().final_data_written = true;
    }

    /// The server accepted the next recipient of the transaction under way.
    fn accepted(&self, to: &Address) {
        let mut ledger = self.ledger();
        ledger.answered = ledger.answered.saturating_add(1);
        ledger.accepted.push(to.clone());
    }

    /// The server refused the next recipient (for now or for good).
    fn refused(&self, to: &Address, why: SendError) {
        let mut ledger = self.ledger();
        ledger.answered = ledger.answered.saturating_add(1);
        ledger.refused.push((to.clone(), why));
    }

    /// The server refused the next recipient as too many for this transaction.
    fn too_many(&self, to: &Address, why: SendError) {
        let mut ledger = self.ledger();
        ledger.answered = ledger.answered.saturating_add(1);
        ledger.later.push((to.clone(), why));
    }

    /// The transaction under way was delivered with `reply`; the recipients for the next
    /// one, if any are left.
    fn delivered(&self, reply: &Reply) -> Option<Vec<Address>> {
        let mut ledger = self.ledger();
        let recipients = std::mem::take(&mut ledger.accepted);
        ledger
            .delivered
            .push(accepted_transaction(reply, recipients));
        let next: Vec<Address> = ledger.later.drain(..).map(|(to, _)| to).collect();
        ledger.round.clone_from(&next);
        ledger.answered = 0;
        ledger.final_data_written = false;
        (!next.is_empty()).then_some(next)
    }

    /// The transaction under way ended without a delivery (`why`): its recipients the server
    /// did not refuse are maybe delivered where `why` says so, else refused with it.
    fn undelivered(&self, why: &SendError) {
        let mut ledger = self.ledger();
        let ledger = &mut *ledger;
        let unanswered = ledger.round.get(ledger.answered..).unwrap_or_default();
        let in_flight = ledger.accepted.drain(..).chain(unanswered.iter().cloned());
        if why.is_maybe_delivered() {
            ledger
                .maybe_delivered
                .extend(in_flight.map(|to| (to, why.clone())));
        } else {
            ledger.refused.extend(in_flight.map(|to| (to, why.clone())));
        }
        ledger.round.clear();
        ledger.answered = 0;
    }

    /// Whether a transaction of this send was delivered.
    fn any_delivered(&self) -> bool {
        !self.ledger().delivered.is_empty()
    }

    /// The answer of a send cut off by its timeout (`timed_out`): a receipt if a transaction
    /// was delivered, the transaction under way maybe delivered once its final data went out.
    pub(super) fn cut_off(
        &self,
        transport: &str,
        timed_out: SendError,
    ) -> Result<Receipt, SendError> {
        let timed_out = if self.ledger().final_data_written {
            timed_out.maybe_delivered()
        } else {
            timed_out
        };
        self.undelivered(&timed_out);
        if !self.any_delivered() {
            return Err(timed_out);
        }
        self.answer(transport)
    }

    /// The answer from what the send did: a receipt if a transaction was delivered, else the
    /// refusal that decides what the caller does.
    fn answer(&self, transport: &str) -> Result<Receipt, SendError> {
        let mut ledger = self.ledger();
        let later = std::mem::take(&mut ledger.later);
        ledger.refused.extend(later);
        if ledger.delivered.is_empty() {
            return Err(every_recipient_refused(std::mem::take(&mut ledger.refused)));
        }
        let mut receipt = Receipt::new(transport);
        for transaction in ledger.delivered.drain(..) {
            receipt = receipt.with_transaction(transaction);
        }
        for (to, why) in ledger.refused.drain(..) {
            receipt = if why.is_retryable() {
                receipt.with_deferred_recipient(to, why)
            } else {
                receipt.with_rejected_recipient(to, why)
            };
        }
        for (to, why) in ledger.maybe_delivered.drain(..) {
            receipt = receipt.with_maybe_delivered_recipient(to, why);
        }
        Ok(receipt)
    }
}

/// Sends `raw` to the recipients of `envelope` on `connection`. `reused` says it came from
/// the pool (and so may have been closed by the server while idle); `transport` names the
/// receipt. Recipients refused as too many for one transaction go in the next, on the same
/// connection, once this one is delivered.
pub(super) async fn send(
    connection: &mut Connection,
    reused: bool,
    envelope: &Envelope,
    raw: &[u8],
    transport: &str,
    progress: &Progress,
) -> Ending {
    let offered = *connection.capabilities();
    let parameters = match mail_parameters(&offered, envelope, raw) {
        Ok(parameters) => parameters,
        Err(error) => {
            return Ending::Answered {
                result: Err(error),
                reusable: true,
            };
        }
    };
    progress.begin(envelope.to());
    let mut pending: Vec<Address> = envelope.to().to_vec();
    let mut may_be_stale = reused;
    let mut reusable = true;
    loop {
        let transaction = Transaction {
            from: envelope.from(),
            recipients: &pending,
            raw,
            parameters,
            progress,
            final_data_written: AtomicBool::new(false),
            session_closed: AtomicBool::new(false),
        };
        let round = transaction.run(connection, may_be_stale).await;
        may_be_stale = false;
        reusable &= !round.closed;
        match round.end {
            End::Delivered(reply) => match progress.delivered(&reply) {
                Some(next) => pending = next,
                None => break,
            },
            // Too many even for the first of them: nothing more will go in this session.
            End::NoRecipients => break,
            End::Refused(error) => {
                if !progress.any_delivered() {
                    return Ending::Answered {
                        result: Err(error),
                        reusable,
                    };
                }
                progress.undelivered(&error);
                break;
            }
            End::Broken(error) => {
                if !progress.any_delivered() {
                    return Ending::closing(error);
                }
                progress.undelivered(&error);
                return Ending::Answered {
                    result: progress.answer(transport),
                    reusable: false,
                };
            }
            End::NotBegun(error) => return Ending::NotBegun(error),
        }
    }
    Ending::Answered {
        result: progress.answer(transport),
        reusable,
    }
}

/// One MAIL transaction's inputs.
struct Transaction<'a> {
    from: Option<&'a Address>,
    recipients: &'a [Address],
    raw: &'a [u8],
    parameters: MailParameters,
    progress: &'a Progress,
    /// Whether this transaction's final data went out.
    final_data_written: AtomicBool,
    /// The server ended the session after it had refused the transaction.
    session_closed: AtomicBool,
}

/// How one MAIL transaction ended; what it did with each recipient is in the [`Progress`].
struct Round {
    end: End,
    /// The connection cannot carry another transaction, whatever `end` says.
    closed: bool,
}

#[derive(Clone)]
enum End {
    /// The final data was accepted with this reply.
    Delivered(Reply),
    /// No recipient was accepted: each was refused, or too many for this transaction.
    NoRecipients,
    /// The server refused MAIL, DATA or the message; the session goes on (RSET first).
    Refused(SendError),
    /// The connection cannot be used again.
    Broken(SendError),
    /// A pooled connection that was found closed before the transaction began.
    NotBegun(SendError),
}

impl Transaction<'_> {
    async fn run(&self, connection: &mut Connection, may_be_stale: bool) -> Round {
        let end = match self.exchange(connection, may_be_stale).await {
            Ok(end) | Err(end) => end,
        };
        let end = match end {
            // Once the final data went out, a lost connection or a reply out of turn (a
            // Network error, unlike a `421` that refuses) may hide a delivery.
            End::Broken(error)
                if self.final_data_written.load(Ordering::Relaxed)
                    && error.category() == Category::Network =>
            {
                End::Broken(error.maybe_delivered())
            }
            End::NotBegun(error) => {
                self.progress.forget();
                End::NotBegun(error)
            }
            end => end,
        };
        connection.needs_reset = matches!(end, End::Refused(_) | End::NoRecipients);
        Round {
            end,
            closed: self.session_closed.load(Ordering::Relaxed),
        }
    }

    /// The commands and their replies; `Err` ends the exchange early.
    async fn exchange(&self, connection: &mut Connection, may_be_stale: bool) -> Result<End, End> {
        let pipelining = connection.pipelining();
        let chunking = connection.chunking();
        let reset = connection.needs_reset;
        connection.transactions = connection.transactions.saturating_add(1);

        let mut first_reply = FirstReply {
            may_be_stale,
            token_may_have_expired: may_be_stale && connection.oauth_token.is_some(),
        };
        if pipelining {
            let mut commands = Commands::new();
            if reset {
                commands.rset();
            }
            commands.mail(self.from, self.parameters);
            for to in self.recipients {
                commands.rcpt(to);
            }
            if chunking {
                commands.bdat_last(self.raw);
            } else {
                commands.data();
            }
            // DATA or BDAT goes in this write: a deadline's cut from now on may leave the
            // message with the server (DESIGN §19).
            crate::deadline::may_have_reached();
            connection
                .write(&commands.take())
                .await
                .map_err(|error| first_reply.failed(error))?;
            if chunking {
                self.note_final_data_written();
            }
        }

        if reset {
            if !pipelining {
                write(connection, Commands::new().rset())
                    .await
                    .map_err(|error| first_reply.failed(error))?;
            }
            let reply = read(connection)
                .await
                .map_err(|error| first_reply.failed(error))?;
            first_reply.check(&reply, 250)?;
        }

        if !pipelining {
            write(connection, Commands::new().mail(self.from, self.parameters))
                .await
                .map_err(|error| first_reply.failed(error))?;
        }
        let reply = read(connection)
            .await
            .map_err(|error| first_reply.failed(error))?;
        first_reply.check_refusable(&reply, 250)?;
        let mail_refused = (reply.code() != 250).then(|| refusal(Stage::Transaction, &reply));
        if let Some(refused) = &mail_refused
            && !pipelining
        {
            return Ok(End::Refused(refused.clone()));
        }

        let mut accepted = false;
        for to in self.recipients {
            if !pipelining {
                write(connection, Commands::new().rcpt(to))
                    .await
                    .map_err(End::Broken)?;
            }
            let reply = read(connection).await;
            if let Some(refused) = &mail_refused {
                // The answers to a transaction the server already refused (503 and the like).
                self.in_step(reply, &End::Refused(refused.clone()), false)?;
                continue;
            }
            let reply = reply.map_err(End::Broken)?;
            match reply.code() {
                250 | 251 => {
                    accepted = true;
                    self.progress.accepted(to);
                }
                _ if is_too_many_recipients(&reply) => {
                    self.progress.too_many(to, too_many_recipients(&reply));
                }
                421 => return Err(End::Broken(refusal(Stage::Transaction, &reply))),
                _ if matches!(reply.class(), 4 | 5) => {
                    self.progress
                        .refused(to, refusal(Stage::Transaction, &reply));
                }
                _ => return Err(End::Broken(refusal(Stage::Transaction, &reply))),
            }
        }
        let nothing_to_deliver = match &mail_refused {
            Some(refused) => Some(End::Refused(refused.clone())),
            None if !accepted => Some(End::NoRecipients),
            None => None,
        };

        if chunking {
            self.chunk(connection, pipelining, nothing_to_deliver).await
        } else {
            self.data(connection, pipelining, nothing_to_deliver).await
        }
    }

    fn note_final_data_written(&self) {
        self.final_data_written.store(true, Ordering::Relaxed);
        self.progress.note_final_data_written();
    }

    /// A reply read after the transaction was already refused (`end`), only to stay in step.
    /// A refusal is what comes (and a success, where `success_too`); one that ends the session
    /// (`421`), one out of turn or none at all leaves the answer as it is, the connection
    /// closed.
    fn in_step(
        &self,
        reply: Result<Reply, SendError>,
        end: &End,
        success_too: bool,
    ) -> Result<(), End> {
        match reply {
            Ok(reply)
                if reply.code() != 421
                    && (matches!(reply.class(), 4 | 5) || success_too && reply.class() == 2) =>
            {
                Ok(())
            }
            _ => Err(self.closed(end.clone())),
        }
    }

    /// `end`, the session closed.
    fn closed(&self, end: End) -> End {
        self.session_closed.store(true, Ordering::Relaxed);
        end
    }

    /// BDAT LAST (already written when pipelining) and its reply.
    async fn chunk(
        &self,
        connection: &mut Connection,
        pipelining: bool,
        nothing_to_deliver: Option<End>,
    ) -> Result<End, End> {
        if !pipelining {
            if let Some(end) = nothing_to_deliver {
                return Ok(end);
            }
            crate::deadline::may_have_reached();
            write(connection, Commands::new().bdat_last(self.raw))
                .await
                .map_err(End::Broken)?;
            self.note_final_data_written();
        }
        let Some(end) = nothing_to_deliver else {
            return self.final_reply(connection).await;
        };
        // The server read the chunk for a transaction it had refused.
        self.in_step(read(connection).await, &end, true)?;
        Ok(end)
    }

    /// DATA (already written when pipelining), its `354`, the message and its final reply.
    async fn data(
        &self,
        connection: &mut Connection,
        pipelining: bool,
        nothing_to_deliver: Option<End>,
    ) -> Result<End, End> {
        if !pipelining {
            if let Some(end) = nothing_to_deliver {
                return Ok(end);
            }
            crate::deadline::may_have_reached();
            write(connection, Commands::new().data())
                .await
                .map_err(End::Broken)?;
        }
        let reply = read(connection).await;
        if let Some(end) = nothing_to_deliver {
            if !reply.as_ref().is_ok_and(|reply| reply.code() == 354) {
                self.in_step(reply, &end, false)?;
                return Ok(end);
            }
            // A 354 although no recipient was accepted (RFC 2920 §3.1): end the empty
            // message at once, and read the server's refusal of it.
            let ended = write(connection, Commands::new().data_end()).await;
            if ended.is_err() {
                return Err(self.closed(end));
            }
            self.in_step(read(connection).await, &end, true)?;
            return Ok(end);
        }
        let reply = reply.map_err(End::Broken)?;
        if reply.code() != 354 {
            closing_or_unexpected(&reply)?;
            return Ok(End::Refused(refusal(Stage::Transaction, &reply)));
        }
        write(connection, Commands::new().data_body(self.raw))
            .await
            .map_err(End::Broken)?;
        self.note_final_data_written();
        self.final_reply(connection).await
    }

    /// The reply to the final data: a delivery, or a refusal.
    async fn final_reply(&self, connection: &mut Connection) -> Result<End, End> {
        let reply = read(connection).await.map_err(End::Broken)?;
        if reply.class() == 2 {
            return Ok(End::Delivered(reply));
        }
        // A 354 or another code out of turn is Broken, and so maybe delivered (see `run`).
        closing_or_unexpected(&reply)?;
        Ok(End::Refused(refusal(Stage::Transaction, &reply)))
    }
}

/// What the first reply of a transaction on a pooled connection may show: that the server
/// closed the session while it was idle.
struct FirstReply {
    may_be_stale: bool,
    /// A pooled connection logged in with an OAuth 2.0 token: a `530` or `535` to its
    /// `MAIL FROM` says the token expired during the session, not that the mail is refused.
    token_may_have_expired: bool,
}

impl FirstReply {
    /// The end for a failure to write or read before the first reply.
    fn failed(&mut self, error: SendError) -> End {
        if std::mem::take(&mut self.may_be_stale) {
            End::NotBegun(error)
        } else {
            End::Broken(error)
        }
    }

    /// `reply` must be `expected`; a 4xx on a pooled connection is the server closing it.
    fn check(&mut self, reply: &Reply, expected: u16) -> Result<(), End> {
        let stale = std::mem::take(&mut self.may_be_stale);
        if reply.code() == expected {
            return Ok(());
        }
        let error = refusal(Stage::Transaction, reply);
        Err(if stale && reply.class() == 4 {
            End::NotBegun(error)
        } else {
            End::Broken(error)
        })
    }

    /// Like [`check`](Self::check), but a refusal other than a stale session's is the
    /// caller's to handle.
    fn check_refusable(&mut self, reply: &Reply, expected: u16) -> Result<(), End> {
        let stale = std::mem::take(&mut self.may_be_stale);
        if reply.code() == expected {
            return Ok(());
        }
        let error = refusal(Stage::Transaction, reply);
        if stale && reply.class() == 4 {
            return Err(End::NotBegun(error));
        }
        if std::mem::take(&mut self.token_may_have_expired) && is_token_expired(reply) {
            return Err(End::NotBegun(error));
        }
        closing_or_unexpected(reply)
    }
}

/// Whether `reply`, to `MAIL FROM` on a session logged in with OAuth 2.0, says the login no
/// longer holds: `530` (authentication required) or `535` (credentials invalid).
fn is_token_expired(reply: &Reply) -> bool {
    matches!(reply.code(), 530 | 535)
}

/// `Err` to end the exchange if `reply` closes the session (`421`) or is no refusal at all.
fn closing_or_unexpected(reply: &Reply) -> Result<(), End> {
    if reply.code() == 421 || !matches!(reply.class(), 4 | 5) {
        return Err(End::Broken(refusal(Stage::Transaction, reply)));
    }
    Ok(())
}

async fn write(connection: &mut Connection, commands: &mut Commands) -> Result<(), SendError> {
    connection.write(&commands.take()).await
}

async fn read(connection: &mut Connection) -> Result<Reply, SendError> {
    connection.read().await
}

/// The answer when the server refused every recipient: the refusal that decides what the
/// caller does, the first of the most telling kind. A refusal about the server (a rate limit,
/// a server going down, credentials) comes before a recipient's deferral (a 4xx about its
/// mailbox: a retry may deliver to it), which comes before a refusal for good. The other
/// kinds of refusal are kept as the answer's [`causes`](SendError::causes), one of each code.
fn every_recipient_refused(refused: Vec<(Address, SendError)>) -> SendError {
    /// How much a refusal decides: lower decides more.
    fn weight(why: &SendError) -> u8 {
        match why.category() {
            Category::ServerError => 1,
            Category::Rejected | Category::InvalidMessage => 2,
            _ => 0,
        }
    }
    let mut refusals: Vec<SendError> = Vec::new();
    for (_, why) in refused {
        if !refusals.iter().any(|kept| kept.code() == why.code()) {
            refusals.push(why);
        }
    }
    let Some(decisive) = refusals
        .iter()
        .enumerate()
        .min_by_key(|(index, why)| (weight(why), *index))
        .map(|(index, _)| index)
    else {
        // An envelope always has a recipient; this is for the type's sake.
        return SendError::fixed(
            Category::InvalidMessage,
            "smtp.no_recipients",
            "the message has no recipients",
        );
    };
    let answer = refusals.remove(decisive);
    if refusals.is_empty() {
        answer
    } else {
        answer.with_causes(refusals)
    }
}

/// MAIL's parameters: SIZE where the server offers it, SMTPUTF8 where an address or the
/// message's header is not ASCII (RFC 6531 §3.4), 8BITMIME for a message that is not ASCII.
/// A message the server cannot take as it is, is refused before any command: over the
/// server's SIZE (`smtp.size`), a line over 998 octets (`smtp.line_too_long`), or in need of
/// SMTPUTF8 where the server does not offer it (`smtp.smtputf8_unavailable`), each
/// `InvalidMessage`; a body that is not ASCII where the server offers no 8BITMIME is a
/// `Configuration` error (`smtp.client`).
fn mail_parameters(
    offered: &Capabilities,
    envelope: &Envelope,
    raw: &[u8],
) -> Result<MailParameters, SendError> {
    let shape = command::shape(raw);
    let length = shape.wire_length;
    if offered
        .size_limit()
        .is_some_and(|limit| u64::try_from(length).map_or(true, |length| length > limit))
    {
        return Err(SendError::new(
            Category::InvalidMessage,
            "smtp.size",
            format!(
                "the message is {length} octets and the server takes at most {}",
                offered.size_limit().unwrap_or_default()
            ),
        ));
    }
    if let Some((line, octets)) = shape.too_long {
        return Err(SendError::new(
            Category::InvalidMessage,
            "smtp.line_too_long",
            format!(
                "line {line} of the message is {octets} octets, and SMTP carries lines of at \
                 most {} (RFC 5321 4.5.3.1.6): encode the body (quoted-printable or base64) \
                 and fold long header fields",
                command::MAX_LINE
            ),
        ));
    }
    let non_ascii = |address: &Address| !AsRef::<str>::as_ref(address).is_ascii();
    let utf8_envelope =
        envelope.from().is_some_and(non_ascii) || envelope.to().iter().any(non_ascii);
    let utf8 = utf8_envelope || shape.utf8_header;
    if utf8 && !offered.smtputf8 {
        return Err(SendError::fixed(
            Category::InvalidMessage,
            "smtp.smtputf8_unavailable",
            if utf8_envelope {
                "the envelope has addresses that are not ASCII, which need SMTPUTF8, and the \
                 server does not offer SMTPUTF8"
            } else {
                "the message's header holds raw UTF-8 (a Subject or a display name, say), \
                 which needs SMTPUTF8, and the server does not offer SMTPUTF8: encode the \
                 header (RFC 2047) or send through a server that offers it"
            },
        ));
    }
    let eight_bit = !raw.is_ascii();
    if eight_bit && !offered.eight_bit_mime {
        return Err(SendError::fixed(
            Category::Configuration,
            "smtp.client",
            "the message is not ASCII and the server does not offer 8BITMIME",
        )
        // This message's body, not the member: an ASCII message still goes (DESIGN §19).
        .about_the_message());
    }
    Ok(MailParameters {
        size: offered.size.map(|_| length),
        eight_bit,
        utf8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(category: Category, code: &str) -> SendError {
        SendError::new(category, code, "refused")
    }

    fn to(address: &str) -> Address {
        address.parse().expect("a valid address")
    }

    #[test]
    fn when_every_recipient_is_refused_a_temporary_refusal_is_the_answer() {
        let answer = every_recipient_refused(vec![
            (to("a@example.org"), refusal(Category::Rejected, "smtp.550")),
            (
                to("b@example.org"),
                refusal(Category::ServerError, "smtp.450"),
            ),
        ]);
        assert_eq!(answer.code(), "smtp.450");
    }

    #[test]
    fn when_every_recipient_is_refused_for_good_the_first_refusal_is_the_answer() {
        let answer = every_recipient_refused(vec![
            (to("a@example.org"), refusal(Category::Rejected, "smtp.550")),
            (to("b@example.org"), refusal(Category::Rejected, "smtp.553")),
        ]);
        assert_eq!(answer.code(), "smtp.550");
    }

    fn envelope() -> Envelope {
        Envelope::new(Some(to("app@example.com")), vec![to("bob@example.org")])
            .expect("an envelope")
    }

    #[test]
    fn a_message_over_the_servers_size_is_an_invalid_message() {
        let offered = Capabilities {
            size: Some(10),
            ..Capabilities::default()
        };
        let error = mail_parameters(&offered, &envelope(), b"0123456789").expect_err("too big");
        assert_eq!(error.category(), Category::InvalidMessage);
        assert_eq!(error.code(), "smtp.size");
        // Eight octets and their added CRLF are exactly the limit.
        let parameters = mail_parameters(&offered, &envelope(), b"01234567").expect("fits");
        assert_eq!(parameters.size, Some(10));
    }

    #[test]
    fn size_is_declared_only_where_the_server_offers_it() {
        let parameters =
            mail_parameters(&Capabilities::default(), &envelope(), b"x").expect("fits");
        assert_eq!(parameters.size, None);
        let unlimited = Capabilities {
            size: Some(0),
            ..Capabilities::default()
        };
        let parameters = mail_parameters(&unlimited, &envelope(), b"x").expect("fits");
        assert_eq!(parameters.size, Some(3));
    }

    #[test]
    fn a_body_that_is_not_ascii_needs_8bitmime() {
        let message = "Subject: x\r\n\r\né".as_bytes();
        let error = mail_parameters(&Capabilities::default(), &envelope(), message)
            .expect_err("no 8BITMIME");
        assert_eq!(error.category(), Category::Configuration);
        assert!(error.is_about_the_message(), "an ASCII message still goes");
        let offered = Capabilities {
            eight_bit_mime: true,
            ..Capabilities::default()
        };
        let parameters = mail_parameters(&offered, &envelope(), message).expect("fits");
        assert!(parameters.eight_bit);
        assert!(!parameters.utf8);
    }

    #[test]
    fn a_sender_or_a_recipient_that_is_not_ascii_needs_smtputf8_and_declares_it() {
        let envelopes = [
            Envelope::new(Some(to("jöran@example.com")), vec![to("bob@example.org")]),
            Envelope::new(Some(to("app@example.com")), vec![to("jöran@example.org")]),
        ];
        let offered = Capabilities {
            smtputf8: true,
            ..Capabilities::default()
        };
        for envelope in envelopes {
            let envelope = envelope.expect("an envelope");
            let error = mail_parameters(&Capabilities::default(), &envelope, b"x")
                .expect_err("no SMTPUTF8");
            assert_eq!(error.category(), Category::InvalidMessage);
            assert_eq!(error.code(), "smtp.smtputf8_unavailable");
            let parameters = mail_parameters(&offered, &envelope, b"x").expect("offered");
            assert!(parameters.utf8);
        }
        let ascii = mail_parameters(&offered, &envelope(), b"x").expect("offered");
        assert!(!ascii.utf8, "an ASCII envelope declares nothing");
    }
}
