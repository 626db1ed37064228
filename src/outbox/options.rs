//! [`OutboxOptions`]: how an outbox connects to its database.

use std::time::Duration;

use crate::ConfigError;

/// How an [`Outbox`](super::Outbox) connects to its database: the sizes of its connection
/// pools and, on PostgreSQL, the bound on each statement. For
/// [`Outbox::sqlite_with`](super::Outbox::sqlite_with) and `Outbox::postgres_with`.
///
/// ```
/// use mail_breaker::outbox::OutboxOptions;
/// use std::time::Duration;
///
/// let options = OutboxOptions::new()
///     .connections(16)
///     .worker_connections(4)
///     .statement_timeout(Duration::from_secs(2));
/// assert!(options.validate().is_ok());
/// assert_eq!(OutboxOptions::new().connections(0).validate().unwrap_err().setting(), "connections");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxOptions {
    connections: Option<u32>,
    worker_connections: usize,
    statement_timeout: Duration,
    /// SQLite: open the file only if it exists, never make a new one.
    existing_file_only: bool,
}

impl Default for OutboxOptions {
    fn default() -> Self {
        OutboxOptions::new()
    }
}

impl OutboxOptions {
    /// The defaults: 4 connections on SQLite and 8 on PostgreSQL for enqueues and reads, 2
    /// for a PostgreSQL worker's claims and answers, statements bounded at 5 s.
    pub fn new() -> OutboxOptions {
        OutboxOptions {
            connections: None,
            worker_connections: 2,
            statement_timeout: Duration::from_secs(5),
            existing_file_only: false,
        }
    }

    /// The most connections the outbox opens for enqueues, reads and durable claims (at
    /// least 1).
    pub fn connections(mut self, connections: u32) -> Self {
        self.connections = Some(connections);
        self
    }

    /// PostgreSQL: the connections this process's workers share for their claims, renewals
    /// and answers (default 2, at least 1). SQLite writes one at a time, so its workers
    /// share one connection whatever this says.
    pub fn worker_connections(mut self, connections: usize) -> Self {
        self.worker_connections = connections;
        self
    }

    /// PostgreSQL: how long the server may take over a statement before it cancels it
    /// (its `statement_timeout`, default 5 s). The client waits a second more, then drops
    /// the statement and closes its connection: a database behind a link that drops packets
    /// never hears the statement, and only the client can give up. An enqueue that overran
    /// is an error coded `outbox.maybe_queued` (it may have been committed).
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Checks the settings: a `ConfigError` naming the first out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.connections == Some(0) {
            return Err(ConfigError::new(
                "connections",
                "an outbox needs at least one connection",
            ));
        }
        if self.worker_connections == 0 {
            return Err(ConfigError::new(
                "worker_connections",
                "a worker needs at least one connection",
            ));
        }
        if self.statement_timeout < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "statement_timeout",
                "a statement needs at least a millisecond",
            ));
        }
        Ok(())
    }

    /// SQLite: a file that does not exist is an error naming it, rather than a new outbox
    /// (for [`MailerConfig::existing_outbox`](crate::config::MailerConfig::existing_outbox)).
    #[cfg_attr(not(feature = "config"), allow(dead_code))]
    pub(crate) fn existing_file_only(mut self) -> Self {
        self.existing_file_only = true;
        self
    }

    pub(crate) fn get_existing_file_only(&self) -> bool {
        self.existing_file_only
    }

    /// The connections set, or `default` (the backend's) when none was.
    pub(crate) fn get_connections_or(&self, default: u32) -> u32 {
        self.connections.unwrap_or(default)
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn get_connections(&self) -> u32 {
        self.get_connections_or(8)
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn get_worker_connections(&self) -> usize {
        self.worker_connections
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn get_statement_timeout(&self) -> Duration {
        self.statement_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_is_kept_as_given() {
        let options = OutboxOptions::new()
            .connections(16)
            .worker_connections(4)
            .statement_timeout(Duration::from_secs(2));
        assert_eq!(options.get_connections(), 16);
        assert_eq!(options.get_connections_or(4), 16);
        assert_eq!(options.get_worker_connections(), 4);
        assert_eq!(options.get_statement_timeout(), Duration::from_secs(2));
    }

    #[test]
    fn the_defaults_are_the_backends_connections_two_for_workers_and_five_seconds() {
        let options = OutboxOptions::default();
        assert_eq!(options.get_connections(), 8, "PostgreSQL's");
        assert_eq!(options.get_connections_or(4), 4, "SQLite's");
        assert_eq!(options.get_worker_connections(), 2);
        assert_eq!(options.get_statement_timeout(), Duration::from_secs(5));
    }

    #[test]
    fn each_setting_out_of_range_is_a_config_error_naming_it() {
        let refused = |options: OutboxOptions| options.validate().unwrap_err().setting().to_owned();
        assert_eq!(refused(OutboxOptions::new().connections(0)), "connections");
        assert_eq!(
            refused(OutboxOptions::new().worker_connections(0)),
            "worker_connections"
        );
        let timeout = |timeout| OutboxOptions::new().statement_timeout(timeout);
        assert_eq!(refused(timeout(Duration::ZERO)), "statement_timeout");
        assert_eq!(
            refused(timeout(Duration::from_micros(999))),
            "statement_timeout"
        );
        assert!(timeout(Duration::from_millis(1)).validate().is_ok());
        assert!(OutboxOptions::new().connections(1).validate().is_ok());
    }
}
