//! [`SmtpBuilder`]: where an [`SmtpTransport`] connects, how, and its pool's limits, checked
//! when built; and the constructors that start one.

use std::fmt;
use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::{SMTP_PORT, SUBMISSION_PORT, SUBMISSIONS_PORT};

use super::SmtpTransport;
use super::connection::ConnectionSettings;
use super::pool::PoolLimits;
use crate::ConfigError;
use crate::error::{at_least_one, non_zero_duration};

/// The settings of an [`SmtpTransport`] on the crate's own connections; made by
/// [`SmtpTransport::relay`], [`starttls_relay`](SmtpTransport::starttls_relay),
/// [`builder_dangerous`](SmtpTransport::builder_dangerous) or
/// [`from_url`](SmtpTransport::from_url).
///
/// | setting | default |
/// |---|---|
/// | [`timeout`](Self::timeout): the whole send, connect, TLS, AUTH and transaction | 60 s |
/// | [`connect_timeout`](Self::connect_timeout): opening a connection at one address, TLS, greeting, EHLO and AUTH | 10 s |
/// | [`max_connections`](Self::max_connections): sends in flight; more wait their turn | 10 |
/// | [`idle_timeout`](Self::idle_timeout): an idle connection older than this is closed | 30 s |
/// | [`max_messages_per_connection`](Self::max_messages_per_connection) | 100 |
/// | [`hello_name`](Self::hello_name): the name said in EHLO | this host's name |
/// | [`name`](Self::name): in logs, receipts and errors | `smtp://host:port` (`smtps://` for implicit TLS) |
/// | [`pipelining`](Self::pipelining), [`chunking`](Self::chunking): used where the server offers them | on |
/// | [`auth_without_tls`](Self::auth_without_tls): credentials on an unencrypted connection | refused |
/// | [`oauth2`](Self::oauth2): log in with OAuth 2.0 (XOAUTH2, OAUTHBEARER) instead of a password | no |
///
/// A setting that cannot work (0 connections, a zero timeout) is a [`ConfigError`] from
/// [`build`](Self::build) naming it.
///
/// ```
/// use std::time::Duration;
/// use lettre::transport::smtp::authentication::Credentials;
/// use mail_breaker::{SmtpTransport, Transport};
///
/// let smtp = SmtpTransport::starttls_relay("smtp.example.com")?
///     .credentials(Credentials::new("user".into(), "secret".into()))
///     .timeout(Duration::from_secs(30))
///     .max_connections(10)
///     .idle_timeout(Duration::from_secs(30))
///     .max_messages_per_connection(100)
///     .build()?;
/// assert_eq!(smtp.name(), "smtp://smtp.example.com:587");
///
/// let err = SmtpTransport::builder_dangerous("localhost").max_connections(0).build().unwrap_err();
/// assert_eq!(err.setting(), "max_connections");
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until .build()"]
pub struct SmtpBuilder {
    host: String,
    port: u16,
    tls: Tls,
    credentials: Option<Credentials>,
    oauth2: Option<(String, Box<dyn crate::oauth::TokenSource>)>,
    oauth2_mechanism: Option<crate::oauth::OAuthMechanism>,
    auth_without_tls: bool,
    timeout: Duration,
    connect_timeout: Duration,
    pipelining: bool,
    chunking: bool,
    max_connections: usize,
    idle_timeout: Duration,
    max_messages_per_connection: u32,
    hello_name: Option<ClientId>,
    name: Option<String>,
}

impl SmtpBuilder {
    fn new(host: &str, port: u16, tls: Tls) -> Self {
        SmtpBuilder {
            host: host.to_owned(),
            port,
            tls,
            credentials: None,
            oauth2: None,
            oauth2_mechanism: None,
            auth_without_tls: false,
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            pipelining: true,
            chunking: true,
            max_connections: 10,
            idle_timeout: Duration::from_secs(30),
            max_messages_per_connection: 100,
            hello_name: None,
            name: None,
        }
    }

    /// Authenticates each connection with these credentials (AUTH PLAIN or LOGIN, whichever
    /// the server offers); default: no AUTH. The credentials go only over TLS: on an
    /// unencrypted connection (no TLS, or an opportunistic one whose server did not offer
    /// STARTTLS) a send fails with `Configuration`, `smtp.auth_in_clear`, and nothing of the
    /// credentials is sent, unless [`auth_without_tls`](Self::auth_without_tls) allows it.
    ///
    /// ```
    /// use lettre::transport::smtp::authentication::Credentials;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::starttls_relay("smtp.example.com")?
    ///     .credentials(Credentials::new("user".into(), "secret".into()))
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Logs each connection in as `user` with OAuth 2.0 (DESIGN §16), a token from `source`:
    /// `XOAUTH2` where the server offers it, else `OAUTHBEARER` (RFC 7628), unless
    /// [`oauth2_mechanism`](Self::oauth2_mechanism) chooses. The transport keeps a token until
    /// a minute before it expires; a refused one is fetched afresh once, and a second refusal
    /// is the send's answer, `Authentication`. Like credentials, a token goes only over TLS
    /// unless [`auth_without_tls`](Self::auth_without_tls) allows it. See
    /// [`oauth`](crate::oauth) for Microsoft 365 and Gmail.
    ///
    /// ```
    /// use mail_breaker::oauth::{AccessToken, TokenSource};
    /// # use mail_breaker::{SendError, SmtpTransport};
    /// struct Fixed;
    /// #[async_trait::async_trait]
    /// impl TokenSource for Fixed {
    ///     async fn token(&self) -> Result<AccessToken, SendError> {
    ///         Ok(AccessToken::new("token"))
    ///     }
    /// }
    /// let smtp = SmtpTransport::starttls_relay("smtp.gmail.com")?
    ///     .oauth2("me@gmail.com", Fixed)
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn oauth2(
        mut self,
        user: impl Into<String>,
        source: impl crate::oauth::TokenSource + 'static,
    ) -> Self {
        self.oauth2 = Some((user.into(), Box::new(source)));
        self
    }

    /// The SASL mechanism of the [`oauth2`](Self::oauth2) login, whatever else the server
    /// offers: one it does not offer fails the send with `Configuration`,
    /// `smtp.auth_unsupported`.
    ///
    /// ```
    /// use mail_breaker::oauth::{AccessToken, OAuthMechanism, TokenSource};
    /// # use mail_breaker::{SendError, SmtpTransport};
    /// # struct Fixed;
    /// # #[async_trait::async_trait]
    /// # impl TokenSource for Fixed {
    /// #     async fn token(&self) -> Result<AccessToken, SendError> { Ok(AccessToken::new("t")) }
    /// # }
    /// let smtp = SmtpTransport::starttls_relay("smtp.gmail.com")?
    ///     .oauth2("me@gmail.com", Fixed)
    ///     .oauth2_mechanism(OAuthMechanism::OAuthBearer)
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn oauth2_mechanism(mut self, mechanism: crate::oauth::OAuthMechanism) -> Self {
        self.oauth2_mechanism = Some(mechanism);
        self
    }

    /// Lets the credentials go over a connection without TLS: for a relay on the same host or
    /// a trusted network only, since anyone who can read the traffic reads the password.
    ///
    /// ```
    /// use lettre::transport::smtp::authentication::Credentials;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
    ///     .port(2525)
    ///     .credentials(Credentials::new("user".into(), "secret".into()))
    ///     .auth_without_tls()
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn auth_without_tls(mut self) -> Self {
        self.auth_without_tls = true;
        self
    }

    /// Bounds opening one connection at one of the server's addresses: TCP connect, TLS, the
    /// greeting, EHLO and AUTH (default 10 s), within the whole send's
    /// [`timeout`](Self::timeout). An address that does not answer in time gives way to the
    /// next address of the name, so a dead first address (say an IPv6 one) does not eat the
    /// whole send.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
    ///     .connect_timeout(Duration::from_secs(2))
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether to pipeline commands (RFC 2920) where the server offers PIPELINING (default
    /// on): MAIL, every RCPT and DATA then go in one write.
    ///
    /// ```
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").pipelining(false).build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn pipelining(mut self, on: bool) -> Self {
        self.pipelining = on;
        self
    }

    /// Whether to send the message as `BDAT` (RFC 3030) where the server offers CHUNKING
    /// (default on): with pipelining, the message then goes in the same write as its commands.
    ///
    /// ```
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").chunking(false).build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn chunking(mut self, on: bool) -> Self {
        self.chunking = on;
        self
    }

    /// Bounds each whole send: waiting for a connection, connecting, TLS, AUTH and the
    /// transaction (default 60 s). A send cut off by it answers `smtp.timeout`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").timeout(Duration::from_secs(10)).build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many sends may hold a connection at once (default 10); further sends wait their
    /// turn within their timeout. Also how many messages `send_many` sends at once.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").max_connections(4).build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// A connection idle longer than this is closed rather than used (default 30 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
    ///     .idle_timeout(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// After this many messages a connection is closed and a fresh one opened (default 100).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
    ///     .max_messages_per_connection(1000)
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn max_messages_per_connection(mut self, messages: u32) -> Self {
        self.max_messages_per_connection = messages;
        self
    }

    /// The server's port (the constructor's default: 465, 587 or 25).
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").port(2525).build()?;
    /// assert_eq!(smtp.name(), "smtp://127.0.0.1:2525");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// How to use TLS: [`Tls::Wrapper`] (implicit), [`Tls::Required`] (STARTTLS, else fail),
    /// [`Tls::Opportunistic`] or [`Tls::None`]. Use it to trust a private certificate:
    ///
    /// ```no_run
    /// use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    /// use mail_breaker::SmtpTransport;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pem = std::fs::read("relay-ca.pem")?;
    /// let parameters = TlsParameters::builder("relay.internal".to_owned())
    ///     .add_root_certificate(Certificate::from_pem(&pem)?)
    ///     .build()?;
    /// let smtp = SmtpTransport::builder_dangerous("relay.internal")
    ///     .port(587)
    ///     .tls(Tls::Required(parameters))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// The name said in EHLO (default: this host's name). A name with a space or a control
    /// character is a [`ConfigError`] naming `hello_name` from [`build`](Self::build).
    ///
    /// ```
    /// use lettre::transport::smtp::extension::ClientId;
    /// # use mail_breaker::SmtpTransport;
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
    ///     .hello_name(ClientId::Domain("app.example.com".to_owned()))
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn hello_name(mut self, name: ClientId) -> Self {
        self.hello_name = Some(name);
        self
    }

    /// The transport's name in logs, receipts and errors (default `smtp://host:port`, or
    /// `smtps://host:port` with implicit TLS).
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").name("local relay").build()?;
    /// assert_eq!(smtp.name(), "local relay");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Checks the settings and builds the transport. No connection is opened until the first
    /// send, and no Tokio runtime is needed to build it.
    ///
    /// ```
    /// # use mail_breaker::SmtpTransport;
    /// let err = SmtpTransport::builder_dangerous("127.0.0.1").timeout(std::time::Duration::ZERO).build().unwrap_err();
    /// assert_eq!(err.to_string(), "invalid timeout: must be longer than zero");
    /// ```
    pub fn build(self) -> Result<SmtpTransport, ConfigError> {
        at_least_one("max_connections", self.max_connections as u64)?;
        if self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return Err(ConfigError::new(
                "max_connections",
                format!(
                    "must be at most {}, got {}",
                    tokio::sync::Semaphore::MAX_PERMITS,
                    self.max_connections
                ),
            ));
        }
        at_least_one(
            "max_messages_per_connection",
            self.max_messages_per_connection.into(),
        )?;
        non_zero_duration("timeout", self.timeout)?;
        non_zero_duration("connect_timeout", self.connect_timeout)?;
        non_zero_duration("idle_timeout", self.idle_timeout)?;
        if let Some(name) = &self.hello_name {
            check_hello_name(name)?;
        }
        if self.oauth2.is_some() && self.credentials.is_some() {
            return Err(ConfigError::new(
                "oauth2",
                "a password (credentials) or OAuth 2.0, not both",
            ));
        }
        Ok(self.assemble())
    }

    /// The transport, settings unchecked: for defaults known to be valid.
    fn assemble(self) -> SmtpTransport {
        let scheme = if matches!(self.tls, Tls::Wrapper(_)) {
            "smtps"
        } else {
            "smtp"
        };
        let name = self
            .name
            .unwrap_or_else(|| format!("{scheme}://{}:{}", self.host, self.port));
        let hello_name = self
            .hello_name
            .filter(|name| check_hello_name(name).is_ok())
            .or_else(|| Some(ClientId::default()).filter(|name| check_hello_name(name).is_ok()))
            .unwrap_or(ClientId::Ipv4(std::net::Ipv4Addr::LOCALHOST));
        let settings = ConnectionSettings {
            host: self.host,
            port: self.port,
            tls: self.tls,
            credentials: self.credentials,
            oauth2: self.oauth2.map(|(user, source)| {
                std::sync::Arc::new(crate::oauth::OAuthLogin::new(
                    user,
                    source,
                    self.oauth2_mechanism,
                ))
            }),
            auth_without_tls: self.auth_without_tls,
            hello_name,
            connect_timeout: self.connect_timeout,
            pipelining: self.pipelining,
            chunking: self.chunking,
        };
        let limits = PoolLimits {
            max_connections: self.max_connections,
            idle_timeout: self.idle_timeout,
            max_messages_per_connection: self.max_messages_per_connection,
        };
        SmtpTransport::own(settings, limits, name, self.timeout)
    }
}

impl fmt::Debug for SmtpBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the credentials.
        f.debug_struct("SmtpBuilder")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("authenticates", &self.credentials.is_some())
            .field("oauth2", &self.oauth2.is_some())
            .field("oauth2_mechanism", &self.oauth2_mechanism)
            .field("auth_without_tls", &self.auth_without_tls)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("pipelining", &self.pipelining)
            .field("chunking", &self.chunking)
            .field("max_connections", &self.max_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field(
                "max_messages_per_connection",
                &self.max_messages_per_connection,
            )
            .field("hello_name", &self.hello_name)
            .field("name", &self.name)
            .finish()
    }
}

impl SmtpTransport {
    /// A relay with implicit TLS (SMTPS) on port 465, the certificate checked against the
    /// system's roots for `host`. A [`ConfigError`] naming `host` if TLS cannot check that
    /// name.
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::relay("smtp.example.com")?.build()?;
    /// assert_eq!(smtp.name(), "smtps://smtp.example.com:465");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn relay(host: &str) -> Result<SmtpBuilder, ConfigError> {
        let parameters = tls_parameters(host)?;
        Ok(SmtpBuilder::new(
            host,
            SUBMISSIONS_PORT,
            Tls::Wrapper(parameters),
        ))
    }

    /// A relay on port 587 that must offer STARTTLS: a server that does not is a
    /// `Configuration` error on send, never a message in clear text.
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::starttls_relay("smtp.example.com")?.build()?;
    /// assert_eq!(smtp.name(), "smtp://smtp.example.com:587");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn starttls_relay(host: &str) -> Result<SmtpBuilder, ConfigError> {
        let parameters = tls_parameters(host)?;
        Ok(SmtpBuilder::new(
            host,
            SUBMISSION_PORT,
            Tls::Required(parameters),
        ))
    }

    /// A server on port 25 without TLS: for local relays and tests. Everything, credentials
    /// included, goes in clear text.
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::builder_dangerous("127.0.0.1").port(2525).build()?;
    /// assert_eq!(smtp.name(), "smtp://127.0.0.1:2525");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn builder_dangerous(host: &str) -> SmtpBuilder {
        SmtpBuilder::new(host, SMTP_PORT, Tls::None)
    }

    /// A transport from a URL in lettre's forms:
    ///
    /// | URL | TLS | default port |
    /// |---|---|---|
    /// | `smtp://host` | none | 25 |
    /// | `smtp://host?tls=required` | STARTTLS, required | 587 |
    /// | `smtp://host?tls=opportunistic` | STARTTLS if offered | 587 |
    /// | `smtp://host?tls=none` | none | 25 |
    /// | `smtps://host` | implicit | 465 |
    ///
    /// `user:password@` (percent-encoded) gives credentials, `:port` the port, and a path
    /// (`smtp://host/client.example.com`) the EHLO name. Anything else, any other option
    /// included, is a [`ConfigError`] naming `url`. Credentials on a clear-text URL are kept,
    /// and every send then fails with `smtp.auth_in_clear` rather than log in in clear text
    /// ([`SmtpBuilder::auth_without_tls`] allows it); `Mailer::from_dsn` reads more options
    /// (`auth_without_tls`, OAuth 2.0) and takes credentials without `tls` for STARTTLS.
    ///
    /// ```
    /// # use mail_breaker::{SmtpTransport, Transport};
    /// let smtp = SmtpTransport::from_url("smtp://user:p%40ss@smtp.example.com:2587?tls=required")?
    ///     .build()?;
    /// assert_eq!(smtp.name(), "smtp://smtp.example.com:2587");
    /// assert_eq!(SmtpTransport::from_url("http://example.com").unwrap_err().setting(), "url");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<SmtpBuilder, ConfigError> {
        let bad = |why: String| ConfigError::new("url", why);
        let url = url::Url::parse(url).map_err(|error| bad(format!("not a URL: {error}")))?;
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| bad("names no host".to_owned()))?;
        // An IPv6 host comes bracketed; the socket wants it bare.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        // `tls` once, and nothing else: an option ignored could be one that asked for TLS.
        let mut tls_asked = None;
        for (key, value) in url.query_pairs() {
            if key != "tls" || tls_asked.is_some() {
                return Err(bad(format!(
                    "{}: the URL's only option is tls, once (the others are Mailer::from_dsn's)",
                    option_named(&key)
                )));
            }
            tls_asked = Some(value.into_owned());
        }
        let mut builder = match (url.scheme(), tls_asked.as_deref()) {
            ("smtp", None | Some("none")) => SmtpTransport::builder_dangerous(host),
            ("smtp", Some("required")) => SmtpTransport::starttls_relay(host)?,
            ("smtp", Some("opportunistic")) => SmtpBuilder::new(
                host,
                SUBMISSION_PORT,
                Tls::Opportunistic(tls_parameters(host)?),
            ),
            ("smtps", _) => SmtpTransport::relay(host)?,
            (scheme, tls) => {
                // The value as given only when it is a plain word: a URL mistyped into it
                // may carry a password.
                let tls = match tls {
                    None => String::new(),
                    Some(word)
                        if word.len() <= 20 && word.bytes().all(|b| b.is_ascii_alphanumeric()) =>
                    {
                        format!(" with tls={word}")
                    }
                    Some(_) => " with that tls option".to_owned(),
                };
                return Err(bad(format!(
                    "scheme `{scheme}`{tls}: expected smtp, smtp with tls=required, \
                     tls=opportunistic or tls=none, or smtps"
                )));
            }
        };
        if let Some(port) = url.port() {
            builder = builder.port(port);
        }
        let path = url.path().trim_matches('/');
        if !path.is_empty() {
            builder = builder.hello_name(ClientId::Domain(path.to_owned()));
        }
        if let Some(password) = url.password() {
            let decode = |text: &str| {
                percent_encoding::percent_decode_str(text)
                    .decode_utf8()
                    .map(|text| text.into_owned())
                    .map_err(|_| bad("credentials that are not UTF-8".to_owned()))
            };
            builder =
                builder.credentials(Credentials::new(decode(url.username())?, decode(password)?));
        }
        Ok(builder)
    }

    /// A transport to a server on `host:port` without TLS or authentication (a local relay,
    /// a test server), named `smtp://host:port`, with the builder's defaults: the same as
    /// `builder_dangerous(host).port(port).build()`.
    ///
    /// ```
    /// let smtp = mail_breaker::SmtpTransport::unencrypted("127.0.0.1", 2525);
    /// # use mail_breaker::Transport;
    /// assert_eq!(smtp.name(), "smtp://127.0.0.1:2525");
    /// ```
    pub fn unencrypted(host: &str, port: u16) -> SmtpTransport {
        SmtpTransport::builder_dangerous(host).port(port).assemble()
    }
}

/// An option of a URL's query as an error names it: the key when it is a plain word, else
/// only "an option" (text mistyped into a URL may carry a password).
fn option_named(key: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
    if !key.is_empty() && key.len() <= 40 && key.bytes().all(plain) {
        format!("option `{key}`")
    } else {
        "an option".to_owned()
    }
}

/// A name EHLO can carry: printable ASCII without spaces, so no command can be smuggled in it.
fn check_hello_name(name: &ClientId) -> Result<(), ConfigError> {
    let text = name.to_string();
    if text.is_empty() || !text.bytes().all(|octet| octet.is_ascii_graphic()) {
        return Err(ConfigError::new(
            "hello_name",
            format!(
                "must be a domain or an address literal, without spaces or control characters, got {text:?}"
            ),
        ));
    }
    Ok(())
}

/// TLS checked against the system's roots for `host`.
fn tls_parameters(host: &str) -> Result<TlsParameters, ConfigError> {
    TlsParameters::new(host.to_owned()).map_err(|error| {
        ConfigError::new(
            "host",
            format!("TLS cannot check the name `{host}`: {error}"),
        )
    })
}
