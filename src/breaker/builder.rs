//! [`CircuitBreakerBuilder`]: the breaker's settings, checked when built.

use std::sync::Arc;
use std::time::Duration;

use super::CircuitBreakerTransport;
use super::events::{self, Listener, StateChange};
use super::gate::{FailurePredicate, Gate};
use super::recording::Recording;
use super::scope::Scope;
use crate::error::{at_least_one, non_zero_duration};
use crate::machine::Rules;
use crate::machine::{Counting, ErrorRate};
use crate::store::{BreakerStore, MemoryStore, memory::DEFAULT_MAX_KEYS};
use crate::{ConfigError, SendError, Transport};

/// Settings for a [`CircuitBreakerTransport`]; made by [`CircuitBreakerTransport::builder`].
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::{CircuitBreakerTransport, ErrorRate, LettreTransport};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let breaker = CircuitBreakerTransport::builder(transport)
///     .error_rate(ErrorRate { threshold_percent: 50, minimum_requests: 20,
///                             window: Duration::from_secs(10), buckets: 10 })
///     .reset_timeout(Duration::from_secs(30))
///     .probe_timeout(Duration::from_secs(10))
///     .half_open_successes(2)
///     .build()?;
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until .build()"]
pub struct CircuitBreakerBuilder<T> {
    inner: T,
    failure_threshold: u32,
    error_rate: Option<ErrorRate>,
    reset_timeout: Duration,
    probe_timeout: Option<Duration>,
    half_open_successes: u32,
    is_failure: FailurePredicate,
    listener: Option<Listener>,
    scope: Scope,
    store: Option<Arc<dyn BreakerStore>>,
    max_keys: usize,
    max_reset_timeout: Option<Duration>,
    slow_call: Option<Duration>,
    shadow: bool,
}

impl<T: Transport> CircuitBreakerBuilder<T> {
    pub(crate) fn new(inner: T) -> Self {
        CircuitBreakerBuilder {
            inner,
            failure_threshold: 5,
            error_rate: None,
            reset_timeout: Duration::from_secs(30),
            probe_timeout: None,
            half_open_successes: 1,
            is_failure: Arc::new(|error: &SendError| error.category().is_breaker_failure()),
            listener: None,
            scope: Scope::Transport,
            store: None,
            max_keys: DEFAULT_MAX_KEYS,
            max_reset_timeout: None,
            slow_call: None,
            shadow: false,
        }
    }

    /// Failures in a row that open the breaker (default 5).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures;
        self
    }

    /// Opens on the failure rate in a sliding window instead of failures in a row.
    pub fn error_rate(mut self, rate: ErrorRate) -> Self {
        self.error_rate = Some(rate);
        self
    }

    /// How long the breaker stays open before a probe may go (default 30 s).
    ///
    /// Zero is a [`ConfigError`]. Any longer time is accepted: a time past about thirty years
    /// (up to `Duration::MAX`) means "until a person resets it" and is taken as thirty years,
    /// so no sum of times can overflow.
    pub fn reset_timeout(mut self, timeout: Duration) -> Self {
        self.reset_timeout = timeout;
        self
    }

    /// How long a probe may take before it counts as failed (default: the reset timeout).
    /// The probe's send is not cancelled; its late result is ignored. Zero is a
    /// [`ConfigError`]; a time past about thirty years is taken as thirty years.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = Some(timeout);
        self
    }

    /// Successful probes in a row that close the breaker (default 1).
    pub fn half_open_successes(mut self, successes: u32) -> Self {
        self.half_open_successes = successes;
        self
    }

    /// Which errors count as the provider failing (default:
    /// [`Category::is_breaker_failure`](crate::Category::is_breaker_failure)). Every other
    /// result, a success or not, counts as the provider working.
    pub fn is_failure(
        mut self,
        is_failure: impl Fn(&SendError) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.is_failure = Arc::new(is_failure);
        self
    }

    /// Called once for every change of state. A listener that panics is caught and logged.
    pub fn on_state_change(
        mut self,
        listener: impl Fn(&StateChange) + Send + Sync + 'static,
    ) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// Which breaker each message answers to (default [`Scope::Transport`]).
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Where the breaker keeps its state (default: a [`MemoryStore`] of its own).
    pub fn store(mut self, store: Arc<dyn BreakerStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// How many keys the default [`MemoryStore`] tracks (default 10,000); the least recently
    /// used closed breakers are forgotten first. A key is tracked from its first failure
    /// (see [`MemoryStore`]), so domains that only succeed take no place. A store given with
    /// [`store`](Self::store) keeps its own bound.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Lets the open time grow while the provider stays down: each reopening without a
    /// close in between doubles it, from [`reset_timeout`](Self::reset_timeout) up to
    /// `longest`. A close starts again from `reset_timeout`. Less than `reset_timeout` is a
    /// [`ConfigError`] (default: no growth).
    ///
    /// ```
    /// use std::time::Duration;
    /// # use mail_breaker::{CircuitBreakerTransport, LettreTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// // Open 30 s, then 60 s, 120 s, ... and at most 10 minutes while probes keep failing.
    /// let breaker = CircuitBreakerTransport::builder(transport)
    ///     .reset_timeout(Duration::from_secs(30))
    ///     .max_reset_timeout(Duration::from_secs(600))
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn max_reset_timeout(mut self, longest: Duration) -> Self {
        self.max_reset_timeout = Some(longest);
        self
    }

    /// Counts a send that succeeded but took longer than `limit` as a failure; its caller
    /// still gets its receipt. Zero is a [`ConfigError`] (default: no limit).
    ///
    /// ```
    /// use std::time::Duration;
    /// # use mail_breaker::{CircuitBreakerTransport, LettreTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// let breaker = CircuitBreakerTransport::builder(transport)
    ///     .slow_call(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn slow_call(mut self, limit: Duration) -> Self {
        self.slow_call = Some(limit);
        self
    }

    /// In shadow mode the breaker counts, changes state and tells its listener (and metrics)
    /// as it would, but never refuses a send: for tuning thresholds on live traffic before
    /// enforcing them. Each change of state logs at INFO what it would now refuse.
    ///
    /// ```
    /// # use mail_breaker::{CircuitBreakerTransport, LettreTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// let breaker = CircuitBreakerTransport::builder(transport).shadow(true).build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Checks the settings and builds the breaker.
    pub fn build(self) -> Result<CircuitBreakerTransport<T>, ConfigError> {
        at_least_one("failure_threshold", self.failure_threshold.into())?;
        non_zero_duration("reset_timeout", self.reset_timeout)?;
        let probe_timeout = self.probe_timeout.unwrap_or(self.reset_timeout);
        non_zero_duration("probe_timeout", probe_timeout)?;
        at_least_one("half_open_successes", self.half_open_successes.into())?;
        at_least_one("max_keys", self.max_keys as u64)?;
        if let Some(longest) = self.max_reset_timeout
            && longest < self.reset_timeout
        {
            return Err(ConfigError::new(
                "max_reset_timeout",
                format!(
                    "must be at least the reset timeout ({:?}), got {longest:?}",
                    self.reset_timeout
                ),
            ));
        }
        if let Some(limit) = self.slow_call {
            non_zero_duration("slow_call", limit)?;
        }
        let counting = match self.error_rate {
            Some(rate) => {
                rate.validate()?;
                Counting::ErrorRate(rate)
            }
            None => Counting::Consecutive {
                threshold: self.failure_threshold,
            },
        };
        let (store, memory): (Arc<dyn BreakerStore>, _) = match self.store {
            Some(store) => (store, None),
            None => {
                let memory = Arc::new(MemoryStore::with_max_keys(self.max_keys));
                (memory.clone(), Some(memory))
            }
        };
        let transport_name: Arc<str> = Arc::from(self.inner.name());
        let history = Arc::new(events::History::new(&counting));
        let recording = Recording::new(&transport_name);
        let late = events::reporter(
            self.listener.clone(),
            recording.clone(),
            Arc::clone(&transport_name),
            self.shadow,
            Arc::clone(&history),
        );
        Ok(CircuitBreakerTransport {
            inner: self.inner,
            gate: Gate {
                rules: Rules {
                    counting,
                    reset_timeout: self.reset_timeout,
                    probe_timeout,
                    half_open_successes: self.half_open_successes,
                    max_reset_timeout: self.max_reset_timeout,
                },
                scope: self.scope,
                store,
                memory,
                is_failure: self.is_failure,
                listener: self.listener,
                transport_name,
                recording,
                late,
                shadow: self.shadow,
                slow_call: self.slow_call,
                history,
            },
        })
    }
}

impl<T> std::fmt::Debug for CircuitBreakerBuilder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreakerBuilder")
            .field("failure_threshold", &self.failure_threshold)
            .field("error_rate", &self.error_rate)
            .field("reset_timeout", &self.reset_timeout)
            .field("probe_timeout", &self.probe_timeout)
            .field("half_open_successes", &self.half_open_successes)
            .field("scope", &self.scope)
            .field("store", &self.store)
            .field("max_keys", &self.max_keys)
            .field("max_reset_timeout", &self.max_reset_timeout)
            .field("slow_call", &self.slow_call)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}
