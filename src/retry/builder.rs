//! [`RetryBuilder`]: the retry transport's settings, checked when built.

use std::sync::Arc;
use std::time::Duration;

use super::{Backoff, Policy, RetryBudget, RetryTransport};
use crate::ConfigError;
use crate::error::{at_least_one, non_zero_duration};

/// Settings for a [`RetryTransport`]; made by [`RetryTransport::builder`].
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use mail_breaker::{Backoff, LettreTransport, RetryBudget, RetryTransport};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let transport = RetryTransport::builder(provider)
///     .max_attempts(4)
///     .backoff(Backoff::exponential(Duration::from_millis(500), Duration::from_secs(30)))
///     .max_elapsed(Duration::from_secs(120))
///     .budget(Arc::new(RetryBudget::new(1000, 250, 10)?))
///     .build()?;
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct RetryBuilder<T> {
    inner: T,
    max_attempts: u32,
    backoff: Backoff,
    max_elapsed: Option<Duration>,
    budget: Option<Arc<RetryBudget>>,
    at_most_once: bool,
}

impl<T> RetryBuilder<T> {
    pub(crate) fn new(inner: T) -> Self {
        RetryBuilder {
            inner,
            max_attempts: 3,
            backoff: Backoff::default(),
            max_elapsed: None,
            budget: None,
            at_most_once: false,
        }
    }

    /// Tries in all, the first included (default 3; 1 never retries).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait before each retry (default `Backoff::exponential(500 ms, 30 s)`); the error's
    /// `retry_after` lengthens it.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest a message may take from its first try: a retry whose wait would end
    /// later is not made, and the last error is returned at once (default: no limit).
    pub fn max_elapsed(mut self, limit: Duration) -> Self {
        self.max_elapsed = Some(limit);
        self
    }

    /// A budget that stops retries while too many of them fail (default: none).
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Never sends a message again that the provider may already hold: an error marked
    /// [`is_maybe_delivered`](crate::SendError::is_maybe_delivered) (the connection dropped
    /// or timed out after SMTP's final dot) is returned as it is, not retried. The default is
    /// at-least-once: such an error is retried like any other of its category, and the
    /// message may arrive twice.
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, RetryTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// let transport = RetryTransport::builder(provider).at_most_once().build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Checks the settings and builds the transport.
    pub fn build(self) -> Result<RetryTransport<T>, ConfigError> {
        at_least_one("max_attempts", self.max_attempts.into())?;
        self.backoff.validate()?;
        if let Some(limit) = self.max_elapsed {
            non_zero_duration("max_elapsed", limit)?;
        }
        Ok(RetryTransport {
            inner: self.inner,
            policy: Policy {
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                max_elapsed: self.max_elapsed,
                budget: self.budget,
                at_most_once: self.at_most_once,
                recorded: super::Recorded::default(),
            },
        })
    }
}
