//! [`SmtpTransport`]: SMTP spoken by the crate itself on connections it opens and pools; or
//! through a caller's own lettre transport. Each send is bounded in time, its errors sorted
//! into [`Category`]s.
//!
//! The SMTP client, from the wire up; none of the first four knows of the pool:
//! - `reply.rs`: the reply reader, every size bounded.
//! - `command.rs`: the command writer, and the message made safe for the wire.
//! - `capabilities.rs`: what the server's EHLO offers.
//! - `transaction.rs`: the transaction engine: one message, pipelined and chunked where the
//!   server allows, each reply checked against its command.
//! - `connection.rs`: one connection: each address, TLS, greeting, EHLO, STARTTLS, AUTH.
//! - `socket.rs`: the TCP socket; `implicit_tls.rs`: TLS on it.
//! - `pool.rs`: the connection pool and its limits.
//! - `classify.rs`: the category of a server's answer.
//! - `builder.rs`: the constructors and [`SmtpBuilder`].
//! - `lettre_pool.rs`: sending through a caller's lettre transport without desyncing it.

mod builder;
mod capabilities;
mod classify;
mod command;
mod connection;
mod implicit_tls;
mod lettre_pool;
mod pool;
pub(crate) mod reply;
mod socket;
mod transaction;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lettre::{AsyncSmtpTransport, Tokio1Executor};
use tokio::time::Instant;

pub use builder::SmtpBuilder;
pub use classify::{classify_smtp_error, classify_smtp_reply};

use crate::time::later;
use crate::{Category, Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};
use connection::ConnectionSettings;
use lettre_pool::Unfinished;
use pool::{ConnectionPool, PoolLimits};
use transaction::{Ending, Progress};

/// Sends over SMTP, each whole send bounded in time.
///
/// # On the crate's own connections
/// [`relay`](Self::relay), [`starttls_relay`](Self::starttls_relay),
/// [`builder_dangerous`](Self::builder_dangerous), [`from_url`](Self::from_url) and
/// [`unencrypted`](Self::unencrypted) make a transport that speaks SMTP itself on sockets it
/// opens (TCP_NODELAY and keepalive set) and keeps in a pool of its own:
///
/// - **One round trip per message.** Where the server offers PIPELINING, MAIL, every RCPT and
///   DATA go in one write; with CHUNKING too, the message goes in that same write as `BDAT`.
/// - **A connection is reused only after its whole transaction was answered**, each reply
///   checked against the command it answers. A send cut off anywhere (by its timeout, by its
///   caller dropping it, by an I/O error) or a reply out of turn closes its connection, so a
///   late reply can never be read as the answer to another message; so does a connection
///   holding octets no command read as its reply (a reply sent twice or unasked). After a
///   refused transaction the next one begins with RSET.
/// - **No NOOP per message.** A pooled connection the server closed while it was idle shows
///   it in its first reply (none, or the `421`/`451` it sent as it closed); the send then goes
///   on one fresh connection without an error.
/// - **Each recipient is answered on its own.** The message goes to the recipients the server
///   accepted; those refused for good are in [`Receipt::rejected_recipients`], those refused
///   for now (a 4xx) in [`Receipt::deferred_recipients`], each with its error; recipients
///   refused as too many for one transaction (`452 4.5.3`, or a `552` saying so) get the
///   message in a further transaction, and [`Receipt::transactions`] lists each transaction's
///   reply, queue id and recipients. A further transaction that breaks, or runs out of the
///   send's time, after its data was written leaves its recipients in
///   [`Receipt::maybe_delivered_recipients`]; what the earlier ones delivered stays a
///   receipt. When every recipient is refused, the refusal that decides what the caller does
///   is the answer (a rate limit before a recipient's deferral before a refusal for good).
/// - **What the server can take** is checked before any command: an address holding CR, LF
///   or another control character, a line over 998 octets (a header line is folded before
///   a space first, as lettre writes a `To:` of many recipients on one line), or a message that needs SMTPUTF8
///   (an address, or raw UTF-8 in its header) where the server does not offer it is
///   `InvalidMessage`; SMTPUTF8 is declared whenever it is needed.
/// - **A server that limits how fast clients connect**: after a connection refused as a rate
///   limit, the pool opens none for a while, and sends wait (within their timeout) for one of
///   its connections to come free.
/// - **Maybe delivered.** A Network error or Timeout after the final data was written is marked
///   [`SendError::maybe_delivered`]: the server may hold the message. Never before that point,
///   and never for a 4xx or 5xx answer to it.
/// - **Safe against a hostile server**: bounded reads, no reply injection through STARTTLS,
///   credentials only over TLS, the body CRLF-normalised and dot-stuffed (no SMTP smuggling);
///   see [the guide's SMTP chapter](crate::guide::smtp).
/// - [`SmtpBuilder::max_connections`] sends hold a connection at once; others wait their turn
///   within their timeout, and one whose timeout comes while it waits is `smtp.timeout`
///   [not attempted](crate::SendError::is_not_attempted): it never reached the server.
///   `send_many` sends that many messages at once, answers in order.
///
/// # Through a lettre transport
/// [`new`](Self::new) wraps a caller's `lettre::AsyncSmtpTransport`: the slower, less safe
/// path, since lettre speaks the SMTP (one round trip per command, none of the guarantees
/// against a hostile server above). lettre's pool would take back a connection whose send was
/// cut off, so each send runs as a task that finishes in the background; a send that timed
/// out may still deliver, and its `smtp.timeout` is marked maybe-delivered. lettre builds its
/// pool with a Tokio task, so build the lettre transport inside a Tokio runtime.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use mail_breaker::{SmtpTransport, Transport};
///
/// let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
///     .port(2525)
///     .timeout(Duration::from_secs(10))
///     .max_connections(4)
///     .build()?;
/// assert_eq!(smtp.name(), "smtp://127.0.0.1:2525");
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct SmtpTransport {
    sender: Sender,
    name: String,
    timeout: Duration,
    concurrency: usize,
}

/// What a send goes through.
#[derive(Clone)]
enum Sender {
    Own(Arc<ConnectionPool>),
    Lettre(AsyncSmtpTransport<Tokio1Executor>),
}

impl SmtpTransport {
    /// Wraps a lettre SMTP transport, named `"smtp"` until [`with_name`](Self::with_name).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lettre::{AsyncSmtpTransport, Tokio1Executor};
    /// use mail_breaker::SmtpTransport;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let relay = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1").port(2525).build();
    /// let smtp = SmtpTransport::new(relay)
    ///     .with_name("smtp://127.0.0.1:2525")
    ///     .with_timeout(Duration::from_secs(10));
    /// # let _ = smtp;
    /// # });
    /// ```
    pub fn new(inner: AsyncSmtpTransport<Tokio1Executor>) -> Self {
        SmtpTransport {
            sender: Sender::Lettre(inner),
            name: "smtp".to_owned(),
            timeout: Duration::from_secs(60),
            concurrency: 10,
        }
    }

    /// A transport on the crate's own connections; made by the builder.
    fn own(
        settings: ConnectionSettings,
        limits: PoolLimits,
        name: String,
        timeout: Duration,
    ) -> Self {
        SmtpTransport {
            concurrency: limits.max_connections,
            sender: Sender::Own(Arc::new(ConnectionPool::new(settings, limits))),
            name,
            timeout,
        }
    }

    /// Sets the name used in logs, receipts and breaker keys.
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::unencrypted("127.0.0.1", 2525).with_name("local relay");
    /// assert_eq!(smtp.name(), "local relay");
    /// ```
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Bounds each whole send, waiting for a connection to final reply (default 60 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::unencrypted("127.0.0.1", 2525).with_timeout(Duration::from_secs(5));
    /// # let _ = smtp;
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many messages `send_many` sends at once (default: `max_connections`, 10 for
    /// [`new`](Self::new); at least 1).
    ///
    /// ```
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::unencrypted("127.0.0.1", 2525).with_concurrency(4);
    /// # let _ = smtp;
    /// ```
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The lettre transport it sends with, for a transport made by [`new`](Self::new);
    /// `None` on the crate's own connections.
    ///
    /// ```
    /// # use mail_breaker::SmtpTransport;
    /// assert!(SmtpTransport::unencrypted("127.0.0.1", 2525).inner().is_none());
    /// ```
    pub fn inner(&self) -> Option<&AsyncSmtpTransport<Tokio1Executor>> {
        match &self.sender {
            Sender::Lettre(transport) => Some(transport),
            Sender::Own(_) => None,
        }
    }

    fn timed_out(&self) -> SendError {
        SendError::fixed(
            Category::Timeout,
            "smtp.timeout",
            "the server did not finish the send in time",
        )
    }

    /// The answer of a send whose own timeout came while it waited for its turn at the
    /// pool's connections, all of them busy with other sends: not attempted.
    fn no_turn(&self) -> SendError {
        SendError::fixed(
            Category::Timeout,
            "smtp.timeout",
            "every connection stayed busy with other sends past this send's timeout; nothing \
             was sent",
        )
        .not_attempted()
    }

    /// One send on the pool, until `deadline`.
    async fn send_on_pool(
        &self,
        pool: &ConnectionPool,
        envelope: &Envelope,
        raw: &[u8],
        deadline: Instant,
    ) -> Result<Receipt, SendError> {
        // This client says where its try is: nothing of it has gone until it writes DATA or
        // BDAT (DESIGN §19), so a deadline's cut before then is not maybe-delivered.
        crate::deadline::not_reached();
        let progress = Progress::default();
        let attempt = connection::for_send_until(
            deadline,
            self.transaction_on_pool(pool, envelope, raw, &progress),
        );
        let result = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            // Cut off while every connection was busy with other sends: this one never
            // reached the server, which it says nothing about.
            Err(_elapsed) if !progress.took_turn() => Err(self.no_turn()),
            // The cut-off transaction's connection was dropped with it, and so closed; what
            // its earlier transactions delivered is kept.
            Err(_elapsed) => progress.cut_off(&self.name, self.timed_out()),
        };
        // Answered: a deadline's cut from now on (in a layer above, still at work) does not
        // take this try for one in flight.
        crate::deadline::try_answered(&result);
        result
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
        // Waits of unknown length: bounded by the send's deadline, and cut there as not
        // attempted (nothing of the message went).
        let _turn = crate::deadline::bounded(pool.turn(), || Err(self.past_deadline())).await?;
        progress.take_turn();
        let (mut connection, mut reused) =
            crate::deadline::bounded(pool.checkout(), || Err(self.past_deadline())).await?;
        loop {
            let span = crate::telemetry::transaction_span(&self.name);
            let ending = tracing::Instrument::instrument(
                transaction::send(&mut connection, reused, envelope, raw, &self.name, progress),
                span.clone(),
            )
            .await;
            match &ending {
                Ending::Answered { result, .. } => crate::telemetry::ended(&span, result),
                Ending::NotBegun(error) => crate::telemetry::failed(&span, error),
            }
            match ending {
                Ending::Answered { result, reusable } => {
                    if reusable {
                        pool.give_back(connection);
                    }
                    return result;
                }
                Ending::NotBegun(error) if reused => {
                    tracing::debug!(
                        transport = %self.name,
                        code = error.code(),
                        "smtp.stale_connection_replaced"
                    );
                    // A session whose OAuth 2.0 token expired: the token is forgotten, so
                    // that the fresh connection logs in with a new one (once: it is not
                    // reused, so its own refusal is the answer).
                    if matches!(error.code(), "smtp.530" | "smtp.535")
                        && let (Some(token), Some(login)) =
                            (connection.oauth_token.take(), &pool.settings().oauth2)
                    {
                        login.refused(&token).await;
                    }
                    drop(connection);
                    // The stale connection took nothing: the try has not reached the server.
                    crate::deadline::not_reached();
                    (connection, reused) =
                        crate::deadline::bounded(pool.checkout(), || Err(self.past_deadline()))
                            .await?;
                }
                Ending::NotBegun(error) => return Err(error),
            }
        }
    }

    /// The answer of a send whose deadline (an outbox worker's `send_timeout`) came while it
    /// waited for a connection: its turn, a connect, or the login's token. Nothing of the
    /// message went.
    fn past_deadline(&self) -> SendError {
        SendError::fixed(
            Category::Timeout,
            "smtp.deadline",
            "the send's deadline came while it waited for a connection (its turn, a connect \
             or a login's token); nothing was sent",
        )
        .with_transport(&self.name)
        .not_attempted()
    }

    /// Checks a connection of the pool, within its turn: an idle one answers NOOP, else a
    /// fresh one is opened (connect, TLS, AUTH) and kept for the next send.
    async fn verify_on_pool(&self, pool: &ConnectionPool) -> Result<(), SendError> {
        let _turn = pool.turn().await?;
        if let Some(mut connection) = pool.take_idle()
            && connection.noop().await.is_ok()
        {
            pool.give_back(connection);
            return Ok(());
        }
        let connection = pool.open().await?;
        pool.give_back(connection);
        Ok(())
    }

    /// Sends one formatted message within the timeout: `send_raw`, as a future of its own.
    async fn deliver(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let deadline = later(Instant::now(), self.timeout);
        if let Err(error) = command::check_envelope(envelope) {
            return Err(error.with_transport(&self.name));
        }
        let result = match &self.sender {
            Sender::Own(pool) => self.send_on_pool(pool, envelope, raw, deadline).await,
            Sender::Lettre(transport) => {
                match lettre_pool::send(transport, envelope, raw, deadline).await {
                    Ok(response) => Ok(classify::receipt_for(&self.name, &response)),
                    Err(Unfinished::Failed(error)) => Err(error),
                    // The send goes on in the background and may yet deliver.
                    Err(Unfinished::TimedOut) => Err(self.timed_out().maybe_delivered()),
                }
            }
        };
        result.map_err(|error| error.with_transport(&self.name))
    }
}

#[async_trait::async_trait]
impl Transport for SmtpTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.deliver(envelope, raw).await
    }

    crate::transport::unboxed_through_deliver!();

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    /// Checks that the server takes a connection (connect, TLS, greeting, AUTH) within the
    /// timeout. On the crate's own connections it uses an idle pooled connection (NOOP) or
    /// opens one that the pool keeps, always within `max_connections`.
    async fn verify(&self) -> Result<(), SendError> {
        let deadline = later(Instant::now(), self.timeout);
        let result = match &self.sender {
            Sender::Own(pool) => {
                match tokio::time::timeout_at(deadline, self.verify_on_pool(pool)).await {
                    Ok(result) => result,
                    Err(_elapsed) => Err(self.timed_out()),
                }
            }
            Sender::Lettre(transport) => {
                match lettre_pool::test_connection(transport, deadline).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(SendError::fixed(
                        Category::ServiceUnavailable,
                        "smtp.unreachable",
                        "the server did not accept a connection",
                    )),
                    Err(Unfinished::Failed(error)) => Err(error),
                    Err(Unfinished::TimedOut) => Err(self.timed_out()),
                }
            }
        };
        result.map_err(|error| error.with_transport(&self.name))
    }
}

impl fmt::Debug for SmtpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("SmtpTransport");
        debug
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency);
        if let Sender::Own(pool) = &self.sender {
            debug
                .field("server", pool.settings())
                .field("limits", &pool.limits());
        }
        debug.finish_non_exhaustive()
    }
}
