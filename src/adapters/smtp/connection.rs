//! One SMTP connection on a socket the crate opens: each of the server's addresses in turn,
//! TLS (implicit or STARTTLS), the greeting, EHLO and AUTH, each reply checked against the
//! command; and the reads and writes a transaction makes on it.
//!
//! # What a hostile server cannot do
//! - **Inject replies through STARTTLS**: octets that arrive after the `220` to STARTTLS and
//!   before the handshake close the connection with a Network error (`smtp.starttls_injection`);
//!   what the server offered before TLS is forgotten, and EHLO is said again.
//! - **Read a password in clear**: credentials go only over TLS unless the builder said
//!   [`auth_without_tls`](super::SmtpBuilder::auth_without_tls); otherwise no AUTH is sent and
//!   the send fails with `Configuration`, `smtp.auth_in_clear` (a server that hides STARTTLS
//!   from an opportunistic client gets nothing).
//! - **Grow memory or panic**: replies are read by [`ReplyReader`], bounded in every size.

use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncTokioStream, Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use super::capabilities::Capabilities;
use super::classify::{Stage, refusal, unreadable};
use super::command::Commands;
use super::implicit_tls;
use super::reply::{Reply, ReplyReader};
use super::socket;
use crate::receipt::SourceText;
use crate::{Category, SendError};

/// Where and how to connect; the same for every connection of a transport.
#[derive(Clone)]
pub(super) struct ConnectionSettings {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) tls: Tls,
    pub(super) credentials: Option<Credentials>,
    /// An OAuth 2.0 login instead of credentials, shared by every connection.
    pub(super) oauth2: Option<std::sync::Arc<crate::oauth::OAuthLogin>>,
    pub(super) auth_without_tls: bool,
    pub(super) hello_name: ClientId,
    pub(super) connect_timeout: Duration,
    pub(super) pipelining: bool,
    pub(super) chunking: bool,
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the credentials.
        f.debug_struct("ConnectionSettings")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("authenticates", &self.credentials.is_some())
            .field("oauth2", &self.oauth2)
            .field("auth_without_tls", &self.auth_without_tls)
            .field("hello_name", &self.hello_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("pipelining", &self.pipelining)
            .field("chunking", &self.chunking)
            .finish()
    }
}

/// A stream and the replies read ahead from it.
struct Wire {
    stream: Box<dyn AsyncTokioStream>,
    replies: ReplyReader,
}

impl Wire {
    async fn write(&mut self, octets: &[u8]) -> Result<(), SendError> {
        let written = async {
            self.stream.write_all(octets).await?;
            self.stream.flush().await
        };
        written.await.map_err(|error| {
            SendError::new(
                Category::Network,
                "smtp.network",
                format!("writing to the server failed: {error}"),
            )
            .with_source(SourceText::masked(error.to_string()))
        })
    }

    async fn read(&mut self) -> Result<Reply, SendError> {
        self.replies
            .read(&mut self.stream)
            .await
            .map_err(|error| unreadable(&error))
    }

    /// Whether octets the client has not read as a reply are waiting: read ahead already, or
    /// in the socket now (looked at without waiting), or the server closed its side. A
    /// connection in this state would answer the next command with an old reply.
    fn has_unread(&mut self) -> bool {
        if !self.replies.is_empty() {
            return true;
        }
        let mut octets = [0u8; 64];
        let mut buffer = ReadBuf::new(&mut octets);
        let mut context = Context::from_waker(Waker::noop());
        // Octets, the end of the stream, or an error: none leaves a usable session.
        Pin::new(&mut self.stream)
            .poll_read(&mut context, &mut buffer)
            .is_ready()
    }

    /// Writes `commands` and reads one reply.
    async fn command(&mut self, commands: &mut Commands) -> Result<Reply, SendError> {
        self.write(&commands.take()).await?;
        self.read().await
    }
}

/// An open, greeted and (where asked) encrypted and authenticated SMTP connection.
pub(super) struct Connection {
    wire: Wire,
    capabilities: Capabilities,
    pipelining: bool,
    chunking: bool,
    /// Transactions begun on it (MAIL sent), for `max_messages_per_connection`.
    pub(super) transactions: u32,
    /// Its last transaction was refused part-way: RSET before the next.
    pub(super) needs_reset: bool,
    /// The OAuth 2.0 token it logged in with, if it did: a server may refuse a long-lived
    /// session's mail once that token expired (`530`/`535` to `MAIL FROM`).
    pub(super) oauth_token: Option<crate::oauth::AccessToken>,
}

impl Connection {
    /// Opens a connection: each address of the host in turn, each within the connect timeout
    /// (TCP, TLS, the greeting, EHLO, STARTTLS and AUTH). An address that does not answer, or
    /// whose server says it cannot serve, gives way to the next; a refusal of the credentials
    /// or of TLS does not.
    ///
    /// A server that does not offer STARTTLS when [`Tls::Required`] asks for it is a
    /// `Configuration` error (`smtp.starttls_unavailable`): sending in clear text is not an
    /// option the caller allowed.
    pub(super) async fn open(settings: &ConnectionSettings) -> Result<Connection, SendError> {
        // A login whose token cannot be had now fails every connection: none is opened.
        // The look waits for a fetch under way (it holds the login): bounded by the send,
        // like the token itself, so that a slow source is not cut as the mail server's fault.
        if let Some(login) = &settings.oauth2
            && let Some(remembered) = within_send(login.remembered_failure()).await?
        {
            return Err(remembered);
        }
        let addresses = socket::resolve(&settings.host, settings.port)
            .await
            .map_err(|error| {
                SendError::new(
                    Category::Network,
                    "smtp.network",
                    format!("could not resolve the server's name: {error}"),
                )
            })?;
        Connection::open_any(addresses, settings).await
    }

    /// Opens a connection at the first of `addresses` that takes one.
    async fn open_any(
        addresses: Vec<SocketAddr>,
        settings: &ConnectionSettings,
    ) -> Result<Connection, SendError> {
        let mut last_error = None;
        for address in addresses {
            let span = crate::telemetry::connect_span(&settings.host, address.port());
            let opened = tracing::Instrument::instrument(
                Connection::open_at(address, settings),
                span.clone(),
            )
            .await;
            crate::telemetry::ended(&span, &opened);
            let error = match opened {
                Ok(connection) => return Ok(connection),
                Err(error) => error,
            };
            if !matches!(
                error.category(),
                Category::Network | Category::Timeout | Category::ServiceUnavailable
            ) {
                return Err(error);
            }
            // The login's token cannot be had: no other address can do better, and the
            // fetch's own failure, not its remembered copy, is the answer. (An `oauth2.*`
            // error is the token's: the lock `remembered_failure` takes may be held by a
            // fetch still under way.)
            if let Some(login) = &settings.oauth2
                && (error.code().starts_with("oauth2.")
                    || within_send(login.remembered_failure()).await?.is_some())
            {
                return Err(error);
            }
            tracing::debug!(%address, code = error.code(), "smtp.address_failed");
            last_error = Some(error);
        }
        Err(last_error.unwrap_or_else(|| {
            SendError::fixed(
                Category::Network,
                "smtp.network",
                "the server's name has no address",
            )
        }))
    }

    /// Opens a connection at `address` within the connect timeout. The time an OAuth 2.0
    /// token fetch takes is not the server's: the fetch has its own bound, and the connect
    /// timeout is counted without it (a slow token endpoint is `oauth2.*`, never blamed on
    /// the mail server as `smtp.timeout`).
    async fn open_at(
        address: SocketAddr,
        settings: &ConnectionSettings,
    ) -> Result<Connection, SendError> {
        let mut deadline =
            crate::time::later(tokio::time::Instant::now(), settings.connect_timeout);
        let (mut wire, capabilities, encrypted) =
            within(deadline, Connection::greet(address, settings)).await?;
        let authenticates = settings.credentials.is_some() || settings.oauth2.is_some();
        if authenticates && !encrypted && !settings.auth_without_tls {
            return Err(SendError::fixed(
                Category::Configuration,
                "smtp.auth_in_clear",
                "the connection is not encrypted, so the credentials were not sent \
                 (use TLS, or .auth_without_tls() for a trusted local relay)",
            ));
        }
        let mut oauth_token = None;
        if let Some(login) = &settings.oauth2 {
            let auth = crate::telemetry::auth_span();
            let token = tracing::Instrument::instrument(
                authenticate_oauth2(&mut wire, &capabilities, login, settings, &mut deadline),
                auth.clone(),
            )
            .await;
            crate::telemetry::ended(&auth, &token);
            oauth_token = Some(token?);
        } else if let Some(credentials) = &settings.credentials {
            let auth = crate::telemetry::auth_span();
            let login = tracing::Instrument::instrument(
                within(
                    deadline,
                    authenticate(&mut wire, &capabilities, credentials),
                ),
                auth.clone(),
            )
            .await;
            crate::telemetry::ended(&auth, &login);
            login?;
        }
        Ok(Connection {
            wire,
            capabilities,
            pipelining: settings.pipelining && capabilities.pipelining,
            chunking: settings.chunking && capabilities.chunking,
            transactions: 0,
            needs_reset: false,
            oauth_token,
        })
    }

    /// The connection up to its login: TCP, TLS, the greeting, EHLO and STARTTLS. The wire,
    /// what the server offers, and whether the wire is encrypted.
    async fn greet(
        address: SocketAddr,
        settings: &ConnectionSettings,
    ) -> Result<(Wire, Capabilities, bool), SendError> {
        let tcp = socket::connect(address).await.map_err(|error| {
            SendError::new(
                Category::Network,
                "smtp.network",
                format!("could not connect to the server: {error}"),
            )
            .with_source(SourceText::masked(error.to_string()))
        })?;
        let mut stream: Box<dyn AsyncTokioStream> = Box::new(tcp);
        let mut encrypted = false;
        if let Tls::Wrapper(parameters) = &settings.tls {
            let tls = crate::telemetry::tls_span();
            let shaken =
                tracing::Instrument::instrument(handshake(stream, parameters), tls.clone()).await;
            crate::telemetry::ended(&tls, &shaken);
            stream = shaken?;
            encrypted = true;
        }
        let mut wire = Wire {
            stream,
            replies: ReplyReader::new(),
        };
        let greeting = wire.read().await?;
        if greeting.code() != 220 {
            return Err(refusal(Stage::Greeting, &greeting));
        }
        let mut capabilities = ehlo(&mut wire, &settings.hello_name).await?;
        match &settings.tls {
            Tls::Required(_) if !capabilities.starttls => {
                return Err(SendError::fixed(
                    Category::Configuration,
                    "smtp.starttls_unavailable",
                    "TLS is required and the server does not offer STARTTLS",
                ));
            }
            Tls::Required(parameters) | Tls::Opportunistic(parameters) if capabilities.starttls => {
                let tls = crate::telemetry::tls_span();
                let started =
                    tracing::Instrument::instrument(starttls(wire, parameters), tls.clone()).await;
                crate::telemetry::ended(&tls, &started);
                wire = started?;
                encrypted = true;
                // What the server said in clear may have been forged: ask again.
                capabilities = ehlo(&mut wire, &settings.hello_name).await?;
            }
            _ => {}
        }
        Ok((wire, capabilities, encrypted))
    }

    /// What the server offered in its last EHLO.
    pub(super) fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Whether commands may be pipelined (the server offers it and the builder allows it).
    pub(super) fn pipelining(&self) -> bool {
        self.pipelining
    }

    /// Whether the message may go as BDAT (the server offers it and the builder allows it).
    pub(super) fn chunking(&self) -> bool {
        self.chunking
    }

    /// Writes octets, flushed.
    pub(super) async fn write(&mut self, octets: &[u8]) -> Result<(), SendError> {
        self.wire.write(octets).await
    }

    /// Reads the next reply.
    pub(super) async fn read(&mut self) -> Result<Reply, SendError> {
        self.wire.read().await
    }

    /// Whether the connection holds octets no command has read as its reply (a reply the
    /// server sent unasked, or twice), or the server closed it: such a connection is closed,
    /// never used again, so that no reply is read as another command's.
    pub(super) fn has_unread(&mut self) -> bool {
        self.wire.has_unread()
    }

    /// Says NOOP and checks the `250`: whether an idle connection still works.
    pub(super) async fn noop(&mut self) -> Result<(), SendError> {
        let reply = self.wire.command(Commands::new().noop()).await?;
        if reply.code() == 250 {
            Ok(())
        } else {
            Err(refusal(Stage::Transaction, &reply))
        }
    }

    /// Says QUIT and closes, in the background: a connection the pool retires (too old, too
    /// many messages) should not cost the send that retires it a round trip.
    pub(super) fn retire(mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut quit = Commands::new();
                quit.quit();
                let _ = tokio::time::timeout(RETIRE_TIMEOUT, self.wire.command(&mut quit)).await;
            });
        }
    }
}

/// How long a retired connection waits for the server's answer to QUIT.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The TLS handshake on `stream`.
async fn handshake(
    stream: Box<dyn AsyncTokioStream>,
    parameters: &TlsParameters,
) -> Result<Box<dyn AsyncTokioStream>, SendError> {
    implicit_tls::wrap(stream, parameters.clone())
        .await
        .map_err(|error| {
            SendError::new(
                Category::Network,
                "smtp.tls",
                format!("the TLS handshake failed: {error}"),
            )
            .with_source(SourceText::masked(error.to_string()))
        })
}

/// Says EHLO and reads what the server offers.
async fn ehlo(wire: &mut Wire, name: &ClientId) -> Result<Capabilities, SendError> {
    let reply = wire.command(Commands::new().ehlo(name)).await?;
    if reply.code() != 250 {
        return Err(refusal(Stage::Hello, &reply));
    }
    Ok(Capabilities::from_ehlo(&reply))
}

/// STARTTLS: the `220`, nothing after it, then the handshake on the same socket.
async fn starttls(mut wire: Wire, parameters: &TlsParameters) -> Result<Wire, SendError> {
    let reply = wire.command(Commands::new().starttls()).await?;
    if reply.code() != 220 {
        return Err(refusal(Stage::StartTls, &reply));
    }
    if !wire.replies.is_empty() {
        return Err(SendError::fixed(
            Category::Network,
            "smtp.starttls_injection",
            "the server sent more after its reply to STARTTLS, before the TLS handshake \
             (a response injection); the connection was closed",
        ));
    }
    let stream = handshake(wire.stream, parameters).await?;
    Ok(Wire {
        stream,
        replies: ReplyReader::new(),
    })
}

/// AUTH PLAIN, else AUTH LOGIN, whichever the server offers.
async fn authenticate(
    wire: &mut Wire,
    offered: &Capabilities,
    credentials: &Credentials,
) -> Result<(), SendError> {
    let response = |mechanism: Mechanism, challenge: Option<&str>| {
        mechanism
            .response(credentials, challenge)
            .map(|text| BASE64.encode(text))
            .map_err(|error| {
                SendError::new(Category::Configuration, "smtp.client", error.to_string())
            })
    };
    let reply = if offered.auth_plain {
        let initial = response(Mechanism::Plain, None)?;
        wire.command(Commands::new().auth("PLAIN", Some(&initial)))
            .await?
    } else if offered.auth_login {
        let reply = wire.command(Commands::new().auth("LOGIN", None)).await?;
        if reply.code() != 334 {
            return Err(refusal(Stage::Auth, &reply));
        }
        let user = response(Mechanism::Login, Some("Username:"))?;
        let reply = wire.command(Commands::new().auth_response(&user)).await?;
        if reply.code() != 334 {
            return Err(refusal(Stage::Auth, &reply));
        }
        let password = response(Mechanism::Login, Some("Password:"))?;
        wire.command(Commands::new().auth_response(&password))
            .await?
    } else {
        return Err(SendError::fixed(
            Category::Configuration,
            "smtp.auth_unsupported",
            "credentials are set and the server offers neither AUTH PLAIN nor AUTH LOGIN",
        ));
    };
    if reply.code() == 235 {
        Ok(())
    } else {
        Err(refusal(Stage::Auth, &reply))
    }
}

/// `step` unless `deadline` (the connect timeout's end) comes first: then `smtp.timeout`.
async fn within<T>(
    deadline: tokio::time::Instant,
    step: impl std::future::Future<Output = Result<T, SendError>>,
) -> Result<T, SendError> {
    tokio::time::timeout_at(deadline, step)
        .await
        .unwrap_or_else(|_elapsed| {
            Err(SendError::fixed(
                Category::Timeout,
                "smtp.timeout",
                "the server did not finish opening the connection within connect_timeout",
            ))
        })
}

tokio::task_local! {
    /// The end of the send (the transport's `timeout`) a connection is opened for, if any: a
    /// token wait it would cut is the token source's fault, not the mail server's.
    static SEND_DEADLINE: tokio::time::Instant;
}

/// Runs `open` (a send's whole transaction, connection included) knowing that the send ends
/// at `deadline`.
pub(super) async fn for_send_until<F: std::future::Future>(
    deadline: tokio::time::Instant,
    open: F,
) -> F::Output {
    SEND_DEADLINE.scope(deadline, open).await
}

/// The login's token, waited for no longer than the send it is for: a source that outlasts
/// the send is answered as its own timeout (`oauth2.timeout`, not attempted), not as the
/// mail server's `smtp.timeout`. The fetch itself goes on in its task, and its token is kept.
async fn token_within_send(
    login: &crate::oauth::OAuthLogin,
) -> Result<crate::oauth::AccessToken, SendError> {
    within_send(login.token()).await?
}

/// `wait` (a wait on the login: its token, or a look at its last failure, which waits for a
/// fetch under way) bounded by the send it is for, its cut answered `oauth2.timeout`, not
/// attempted.
async fn within_send<F: std::future::Future>(wait: F) -> Result<F::Output, SendError> {
    let Ok(send_ends) = SEND_DEADLINE.try_with(|deadline| *deadline) else {
        return Ok(wait.await);
    };
    tokio::time::timeout_at(send_ends, wait)
        .await
        .map_err(|_elapsed| {
            SendError::fixed(
                Category::Timeout,
                "oauth2.timeout",
                "the token source did not answer within the send's timeout; nothing was sent",
            )
            .not_attempted()
        })
}

/// An OAuth 2.0 login (`XOAUTH2` or `OAUTHBEARER`) with the transport's kept token; a
/// refusal (a `334` error challenge, or `535`) forgets the token, and one fetched afresh is
/// tried once more on the same connection. The token is never in an error or a log.
async fn authenticate_oauth2(
    wire: &mut Wire,
    offered: &Capabilities,
    login: &crate::oauth::OAuthLogin,
    settings: &ConnectionSettings,
    deadline: &mut tokio::time::Instant,
) -> Result<crate::oauth::AccessToken, SendError> {
    use crate::oauth::OAuthMechanism;
    let mechanism = match login.mechanism {
        Some(OAuthMechanism::XOAuth2) if offered.auth_xoauth2 => OAuthMechanism::XOAuth2,
        Some(OAuthMechanism::OAuthBearer) if offered.auth_oauthbearer => {
            OAuthMechanism::OAuthBearer
        }
        None if offered.auth_xoauth2 => OAuthMechanism::XOAuth2,
        None if offered.auth_oauthbearer => OAuthMechanism::OAuthBearer,
        _ => {
            return Err(SendError::fixed(
                Category::Configuration,
                "smtp.auth_unsupported",
                "an OAuth 2.0 login is set and the server does not offer its mechanism \
                 (XOAUTH2 or OAUTHBEARER)",
            ));
        }
    };
    let mut tries_left = 2;
    loop {
        tries_left -= 1;
        // The fetch is bounded by the login's own limits, not the connect timeout, which
        // is moved on by the time it took.
        let fetching = tokio::time::Instant::now();
        let token = token_within_send(login).await?;
        *deadline = crate::time::later(*deadline, fetching.elapsed());
        let initial =
            mechanism.initial_response(&login.user, &token, &settings.host, settings.port);
        let mut auth = Commands::new();
        let mut reply = within(
            *deadline,
            wire.command(auth.auth(mechanism.name(), Some(&initial))),
        )
        .await?;
        let challenged = reply.code() == 334;
        if challenged {
            // The server's error challenge: answered, so that it gives its final reply.
            let mut end = Commands::new();
            let answer = end.auth_response(mechanism.end_of_failed_exchange());
            reply = within(*deadline, wire.command(answer)).await?;
        }
        if reply.code() == 235 {
            return Ok(token);
        }
        let refused = challenged || reply.code() == 535;
        if !refused || tries_left == 0 {
            return Err(refusal(Stage::Auth, &reply));
        }
        tracing::debug!(mechanism = mechanism.name(), "smtp.oauth2_token_refused");
        login.refused(&token).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::TcpListener;

    fn settings(connect_timeout: Duration) -> ConnectionSettings {
        ConnectionSettings {
            host: "127.0.0.1".to_owned(),
            port: 0,
            tls: Tls::None,
            credentials: None,
            oauth2: None,
            auth_without_tls: false,
            hello_name: ClientId::Domain("client.test".to_owned()),
            connect_timeout,
            pipelining: true,
            chunking: true,
        }
    }

    /// A server that greets, answers EHLO, and then reads on; and how many connections it
    /// took.
    async fn greeting_server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("an address");
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (reader, mut writer) = stream.into_split();
                    let mut lines = BufReader::new(reader).lines();
                    writer.write_all(b"220 ready\r\n").await.ok();
                    while let Ok(Some(_)) = lines.next_line().await {
                        writer
                            .write_all(b"250-srv\r\n250 PIPELINING\r\n")
                            .await
                            .ok();
                    }
                });
            }
        });
        (address, connections)
    }

    /// A server that takes connections and never says a word.
    async fn silent_server() -> (SocketAddr, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        (listener.local_addr().expect("an address"), listener)
    }

    #[test]
    fn settings_show_where_and_how_but_never_the_credentials() {
        let mut with_credentials = settings(Duration::from_secs(3));
        with_credentials.credentials =
            Some(Credentials::new("mailer".into(), "hunter2-secret".into()));
        let shown = format!("{with_credentials:?}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
        assert!(shown.contains("authenticates: true"), "{shown}");
        assert!(shown.contains("connect_timeout: 3s"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("mailer"), "{shown}");
    }

    #[tokio::test]
    async fn an_address_that_never_greets_gives_way_to_the_next_within_the_connect_timeout() {
        let (silent, _listener) = silent_server().await;
        let (healthy, _) = greeting_server().await;
        let opened =
            Connection::open_any(vec![silent, healthy], &settings(Duration::from_millis(200)))
                .await
                .expect("the second address opens");
        assert!(opened.pipelining());
    }

    #[tokio::test]
    async fn when_every_address_fails_the_last_error_is_the_answer() {
        let (silent, _listener) = silent_server().await;
        let error = Connection::open_any(vec![silent], &settings(Duration::from_millis(100)))
            .await
            .err()
            .expect("no address opens");
        assert_eq!(error.category(), Category::Timeout);
        assert_eq!(error.code(), "smtp.timeout");
    }

    #[tokio::test]
    async fn a_configuration_error_at_one_address_is_the_answer_without_trying_the_next() {
        let (first, first_connections) = greeting_server().await;
        let (second, second_connections) = greeting_server().await;
        let mut with_credentials = settings(Duration::from_secs(5));
        with_credentials.credentials = Some(Credentials::new("u".into(), "p".into()));
        let error = Connection::open_any(vec![first, second], &with_credentials)
            .await
            .err()
            .expect("no AUTH in clear");
        assert_eq!(error.code(), "smtp.auth_in_clear");
        assert_eq!(first_connections.load(Ordering::SeqCst), 1);
        assert_eq!(second_connections.load(Ordering::SeqCst), 0);
    }
}
