//! One SMTP connection on a socket the crate opens: connect with TCP_NODELAY, TLS (implicit
//! or STARTTLS), the greeting, EHLO and AUTH, all spoken by lettre's `AsyncSmtpConnection`.

use std::fmt;
use std::sync::Arc;

use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, AsyncTokioStream, Tls};
use lettre::transport::smtp::commands::Quit;
use lettre::transport::smtp::extension::ClientId;

use super::classify::classify_smtp_error;
use super::socket::{DotWatch, WatchedSocket};
use mail_breaker::{Category, SendError};

/// Where and how to connect; the same for every connection of a transport.
#[derive(Clone)]
pub(super) struct ConnectionSettings {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) tls: Tls,
    pub(super) credentials: Option<Credentials>,
    pub(super) hello_name: ClientId,
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the credentials.
        f.debug_struct("ConnectionSettings")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("authenticates", &self.credentials.is_some())
            .field("hello_name", &self.hello_name)
            .finish()
    }
}

/// An open, greeted and (where asked) encrypted and authenticated SMTP connection.
pub(super) struct Connection {
    pub(super) smtp: AsyncSmtpConnection,
    pub(super) watch: Arc<DotWatch>,
    /// Transactions begun on it (MAIL sent), for `max_messages_per_connection`.
    pub(super) transactions: u32,
    /// Its last transaction was refused part-way: RSET before the next.
    pub(super) needs_reset: bool,
}

impl Connection {
    /// Opens a connection: TCP, TLS, the greeting, EHLO, STARTTLS and AUTH as `settings` say.
    ///
    /// A server that does not offer STARTTLS when [`Tls::Required`] asks for it is a
    /// `Configuration` error (`smtp.starttls_unavailable`): sending in clear text is not an
    /// option the caller allowed.
    pub(super) async fn open(settings: &ConnectionSettings) -> Result<Connection, SendError> {
        let watch = Arc::new(DotWatch::default());
        let socket = WatchedSocket::connect(&settings.host, settings.port, Arc::clone(&watch))
            .await
            .map_err(|error| {
                SendError::new(
                    Category::Network,
                    "smtp.network",
                    format!("could not connect to the server: {error}"),
                )
            })?;
        // The bench sends without TLS; implicit TLS is left out of this copy.
        if matches!(settings.tls, Tls::Wrapper(_)) {
            return Err(SendError::new(
                Category::Configuration,
                "smtp.client",
                "implicit TLS is not in the bench's copy of the old transport",
            ));
        }
        let stream: Box<dyn AsyncTokioStream> = Box::new(socket);
        let mut smtp = AsyncSmtpConnection::connect_with_transport(stream, &settings.hello_name)
            .await
            .map_err(|error| classify_smtp_error(&error))?;
        match &settings.tls {
            Tls::Required(_) if !smtp.can_starttls() => {
                smtp.abort().await;
                return Err(SendError::new(
                    Category::Configuration,
                    "smtp.starttls_unavailable",
                    "TLS is required and the server does not offer STARTTLS",
                ));
            }
            Tls::Required(parameters) | Tls::Opportunistic(parameters) if smtp.can_starttls() => {
                smtp.starttls(parameters.clone(), &settings.hello_name)
                    .await
                    .map_err(|error| classify_smtp_error(&error))?;
            }
            _ => {}
        }
        if let Some(credentials) = &settings.credentials {
            smtp.auth(DEFAULT_MECHANISMS, credentials)
                .await
                .map_err(|error| classify_smtp_error(&error))?;
        }
        Ok(Connection {
            smtp,
            watch,
            transactions: 0,
            needs_reset: false,
        })
    }

    /// Says QUIT and closes, in the background: a connection the pool retires (too old, too
    /// many messages) should not cost the send that retires it a round trip.
    pub(super) fn retire(mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let quit = self.smtp.command(Quit);
                let _ = tokio::time::timeout(RETIRE_TIMEOUT, quit).await;
            });
        }
    }
}

/// How long a retired connection waits for the server's answer to QUIT.
const RETIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
