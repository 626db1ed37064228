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
    /// `None`: the default floor, 1 a second or the rate if that is lower.
    min_per_second: Option<f64>,
    name: Option<String>,
    /// `None`: the processes Redis last said share the limiter.
    members: Option<u32>,
    per_recipient: bool,
    slowed_by: Option<Arc<dyn super::RateFactor>>,
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
            min_per_second: None,
            name: None,
            members: None,
            per_recipient: false,
            slowed_by: None,
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

    /// The lowest rate throttles bring an adaptive limiter to (default 1 per second, or the
    /// rate itself when that is lower: a fractional rate builds without this setting).
    /// Set, it must be above zero and at most the rate.
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, RateLimitTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let provider = || LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// // One send every two seconds, adaptive, with the default floor.
    /// assert!(RateLimitTransport::builder(provider()).per_second(0.5).adaptive(true).build().is_ok());
    /// let error = RateLimitTransport::builder(provider())
    ///     .per_second(0.5)
    ///     .min_per_second(1.0)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(error.setting(), "min_per_second");
    /// ```
    pub fn min_per_second(mut self, per_second: f64) -> Self {
        self.min_per_second = Some(per_second);
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
    /// its share of the rate and of the burst (`1 / members`, see [`members`](Self::members)),
    /// logs one warning, and tries Redis again once per the store's retry interval.
    #[cfg(feature = "redis")]
    pub fn shared(mut self, store: Arc<crate::RedisStore>) -> Self {
        self.shared = Some(store);
        self
    }

    /// How many processes share the budget: while Redis does not answer, each paces itself
    /// at `per_second / members` with a burst of `burst / members` (at least 1). Unset, it is
    /// the number of processes Redis last said share the limiter (those that called it in
    /// the last ten minutes, each known by its store's member name, `RedisStore::with_member`);
    /// knowing neither, a process takes the full rate and burst. Only a shared limiter
    /// (feature `redis`) reads it.
    pub fn members(mut self, members: u32) -> Self {
        self.members = Some(members);
        self
    }

    /// Charges a send one slot per recipient of its envelope rather than one per message:
    /// for a provider whose quota counts recipients, as Amazon SES's maximum send rate does
    /// (a message to 3 recipients is 3 of its 14 a second). A message to more recipients than
    /// the burst goes once the whole burst is free, and the sends after it wait for the rest.
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, RateLimitTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let ses = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// let limited = RateLimitTransport::builder(ses)
    ///     .per_second(14.0)
    ///     .burst(14)
    ///     .cost_per_recipient()
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn cost_per_recipient(mut self) -> Self {
        self.per_recipient = true;
        self
    }

    /// Multiplies the rate by what `factor` says at each send (see
    /// [`RateFactor`](super::RateFactor)): a member's
    /// [`ReputationBreaker`](crate::reputation::ReputationBreaker) (feature `webhooks`)
    /// halves the member's rate while it throttles, and gives it back whole once its rates
    /// fall below warn. The factor applies after a provider's throttles (an adaptive rate at
    /// its floor is halved below it) and, shared, to the fleet's budget as this process draws
    /// from it: every process whose breaker shares its store throttles alike.
    ///
    /// A [`Mailer`](crate::Mailer) does this for each member with both a `rate` and a
    /// `reputation`. By hand, hand the limiter the breaker that wraps the provider:
    ///
    /// ```
    /// # #[cfg(feature = "webhooks")] {
    /// use mail_breaker::{LettreTransport, RateLimitTransport};
    /// use mail_breaker::reputation::ReputationBreaker;
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let ses = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name("ses");
    ///
    /// let reputation = ReputationBreaker::builder("ses").build()?;
    /// let member = RateLimitTransport::builder(reputation.wrap(ses))
    ///     .per_second(14.0)
    ///     .slowed_by(reputation.clone()) // 7 a second while it throttles
    ///     .build()?;
    /// assert!(reputation.is_paced());
    /// assert_eq!(member.per_second(), 14.0);
    /// # }
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn slowed_by(mut self, factor: impl super::RateFactor + 'static) -> Self {
        self.slowed_by = Some(Arc::new(factor));
        self
    }

    /// The limiter, or a [`ConfigError`] naming the first setting out of range.
    pub fn build(self) -> Result<RateLimitTransport<T>, ConfigError> {
        let per_second = self.per_second.ok_or_else(|| {
            ConfigError::new("per_second", "a rate limit needs its rate: set per_second")
        })?;
        positive_rate("per_second", per_second)?;
        let floor = match self.min_per_second {
            Some(floor) => {
                positive_rate("min_per_second", floor)?;
                if floor > per_second {
                    return Err(ConfigError::new(
                        "min_per_second",
                        format!(
                            "the lowest rate ({floor}) must not be above the rate ({per_second})"
                        ),
                    ));
                }
                floor
            }
            None => DEFAULT_FLOOR.min(per_second),
        };
        crate::error::at_least_one("burst", u64::from(self.burst))?;
        if let Some(members) = self.members {
            crate::error::at_least_one("members", u64::from(members))?;
        }
        if let Some(max_in_flight) = self.max_in_flight {
            crate::error::at_least_one("max_in_flight", max_in_flight as u64)?;
        }
        let in_flight = self
            .max_in_flight
            // Tokio's semaphore holds at most this many permits.
            .map(|places| Arc::new(Semaphore::new(places.min(Semaphore::MAX_PERMITS))));
        let name: Arc<str> = Arc::from(self.name.unwrap_or_else(|| self.inner.name().to_owned()));
        super::Recorded::built(&name, per_second);
        let local = || LocalLimiter::new(per_second, self.burst, floor);
        #[cfg(feature = "redis")]
        let limiter = match &self.shared {
            Some(store) => super::Limiter::Shared(Box::new(super::shared::SharedLimiter::new(
                store,
                &name,
                per_second,
                self.burst,
                floor,
                self.members,
            ))),
            None => super::Limiter::Local(local()),
        };
        #[cfg(not(feature = "redis"))]
        let limiter = super::Limiter::Local(local());
        if let Some(factor) = &self.slowed_by {
            factor.read_by(&name);
        }
        Ok(RateLimitTransport {
            limiter,
            inner: self.inner,
            name,
            in_flight,
            max_wait: self.max_wait,
            adaptive: self.adaptive,
            per_recipient: self.per_recipient,
            recorded: super::Recorded::default(),
            slowed_by: self.slowed_by,
            last_factor: std::sync::atomic::AtomicU64::new(1.0_f64.to_bits()),
        })
    }
}

/// The lowest rate an adaptive limiter falls to unless set: one send a second.
const DEFAULT_FLOOR: f64 = 1.0;

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
