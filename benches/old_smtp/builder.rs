//! [`SmtpBuilder`], trimmed to what the bench sets: where the old transport connects and its
//! pool's limits. Settings are not checked (the crate's `ConfigError` checks are private).

use std::time::Duration;

use lettre::transport::smtp::SMTP_PORT;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::Tls;
use lettre::transport::smtp::extension::ClientId;

use super::SmtpTransport;
use super::connection::ConnectionSettings;
use super::pool::PoolLimits;

/// The settings of the old transport, with the crate's defaults of the time.
#[derive(Debug)]
#[must_use = "a builder does nothing until .build()"]
pub struct SmtpBuilder {
    host: String,
    port: u16,
    tls: Tls,
    credentials: Option<Credentials>,
    timeout: Duration,
    max_connections: usize,
    idle_timeout: Duration,
    max_messages_per_connection: u32,
}

impl SmtpTransport {
    /// A server on port 25 without TLS.
    pub fn builder_dangerous(host: &str) -> SmtpBuilder {
        SmtpBuilder {
            host: host.to_owned(),
            port: SMTP_PORT,
            tls: Tls::None,
            credentials: None,
            timeout: Duration::from_secs(60),
            max_connections: 10,
            idle_timeout: Duration::from_secs(30),
            max_messages_per_connection: 100,
        }
    }
}

impl SmtpBuilder {
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections.max(1);
        self
    }

    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    pub fn max_messages_per_connection(mut self, messages: u32) -> Self {
        self.max_messages_per_connection = messages.max(1);
        self
    }

    pub fn build(self) -> SmtpTransport {
        let name = format!("old+smtp://{}:{}", self.host, self.port);
        let settings = ConnectionSettings {
            host: self.host,
            port: self.port,
            tls: self.tls,
            credentials: self.credentials,
            hello_name: ClientId::default(),
        };
        let limits = PoolLimits {
            max_connections: self.max_connections,
            idle_timeout: self.idle_timeout,
            max_messages_per_connection: self.max_messages_per_connection,
        };
        SmtpTransport::own(settings, limits, name, self.timeout)
    }
}
