//! [`RateLimitBuilder`]: a limiter's settings, checked when built.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::RateLimitTransport;
use super::local::LocalLimiter;
use crate::{ConfigError, Transport};

/// Settings for a [`RateLimitTransport`]; made by [`RateLimitTransport::builder`].
///
/// ```
/// use mail_breaker::{LettreTransport, RateLimitTransport};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let error = RateLimitTransport::builder(provider).burst(5).build().unwrap_err();
/// assert_eq!(error.setting(), "per_second");
/// ```
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct RateLimitBuilder<T> {
    inner: T,
    per_second: Option<f64>,
    burst: u32,
    max_in_flight: Option<usize>,
    max_wait: Duration,
    adaptive: bool,
    min_per_second: f64,
    name: Option<String>,
    members: u32,
    #[cfg(feature = "redis")]
    shared: Option<Arc<crate::RedisStore>>,
}

impl<T: Transport> RateLimitBuilder<T> {
    pub(super) fn new(inner: T) -> Self {
        RateLimitBuilder {
            inner,
            per_second: None,
            burst: 1,
            max_in_flight: None,
            max_wait: Duration::from_secs(5),
            adaptive: false,
            min_per_second: 1.0,
            name: None,
            members: 1,
            #[cfg(feature = "redis")]
            shared: None,
        }
    }

    /// The provider's quota: sends per second on average (required; fractions allowed, e.g.
    /// `0.5` for one every two seconds).
    pub fn per_second(mut self, per_second: f64) -> Self {
        self.per_second = Some(per_second);
        self
    }

    /// Sends that may go at once after a quiet spell (default 1: evenly spaced).
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// Sends under way at once (default unlimited).
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = Some(max_in_flight);
        self
    }

    /// How long a send may wait for its turn before it is answered `rate.limited` (default
    /// 5 s; zero: never wait).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Whether a `RateLimited` answer from the provider halves the rate, which then climbs
    /// back by 5 % of the configured rate each quiet second (default `false`).
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// The lowest rate throttles bring an adaptive limiter to (default 1 per second).
    pub fn min_per_second(mut self, per_second: f64) -> Self {
        self.min_per_second = per_second;
        self
    }

    /// The limiter's name, for logs and metrics, and the key limiters share a budget by
    /// (default: the inner transport's name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// One budget for every process whose limiter has the same [name](Self::name) in the
    /// store's namespace: GCRA in Redis (or a Redis Cluster), one script call per send, timed
    /// by the server's clock, on the store's connection and within its timeout. A throttle
    /// lowers the fleet's rate. While Redis does not answer, each process paces itself at
    /// its share (`per_second / members`, see [`members`](Self::members)), logs one
    /// warning, and tries Redis again once per the store's retry interval.
    #[cfg(feature = "redis")]
    pub fn shared(mut self, store: Arc<crate::RedisStore>) -> Self {
        self.shared = Some(store);
        self
    }

    /// How many processes share the budget (default 1): while Redis does not answer, each
    /// paces itself at `per_second / members`.
    pub fn members(mut self, members: u32) -> Self {
        self.members = members;
        self
    }

    /// The limiter, or a [`ConfigError`] naming the first setting out of range.
    pub fn build(self) -> Result<RateLimitTransport<T>, ConfigError> {
        let per_second = self.per_second.ok_or_else(|| {
            ConfigError::new("per_second", "a rate limit needs its rate: set per_second")
        })?;
        positive_rate("per_second", per_second)?;
        positive_rate("min_per_second", self.min_per_second)?;
        if self.min_per_second > per_second {
            return Err(ConfigError::new(
                "min_per_second",
                format!(
                    "the lowest rate ({}) must not be above the rate ({per_second})",
                    self.min_per_second
                ),
            ));
        }
        crate::error::at_least_one("burst", u64::from(self.burst))?;
        crate::error::at_least_one("members", u64::from(self.members))?;
        if let Some(max_in_flight) = self.max_in_flight {
            crate::error::at_least_one("max_in_flight", max_in_flight as u64)?;
        }
        let in_flight = self
            .max_in_flight
            // Tokio's semaphore holds at most this many permits.
            .map(|places| Arc::new(Semaphore::new(places.min(Semaphore::MAX_PERMITS))));
        let name: Arc<str> = Arc::from(self.name.unwrap_or_else(|| self.inner.name().to_owned()));
        crate::metrics::rate_per_second(&name, per_second);
        let local = || LocalLimiter::new(per_second, self.burst, self.min_per_second);
        #[cfg(feature = "redis")]
        let limiter = match &self.shared {
            Some(store) => super::Limiter::Shared(super::shared::SharedLimiter::new(
                store,
                &name,
                per_second,
                self.burst,
                self.min_per_second,
                self.members,
            )),
            None => super::Limiter::Local(local()),
        };
        #[cfg(not(feature = "redis"))]
        let limiter = super::Limiter::Local(local());
        Ok(RateLimitTransport {
            limiter,
            inner: self.inner,
            name,
            in_flight,
            max_wait: self.max_wait,
            adaptive: self.adaptive,
        })
    }
}

fn positive_rate(setting: &'static str, rate: f64) -> Result<(), ConfigError> {
    if rate.is_finite() && rate > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::new(
            setting,
            format!("a rate must be a finite number of sends per second above zero, not {rate}"),
        ))
    }
}
