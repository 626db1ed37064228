//! Pacing sends to a provider's quota: [`RateLimitTransport`], GCRA with a burst, a bound on
//! sends in flight, and a rate that a provider's throttles lower and quiet seconds restore.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::{Category, Envelope, Receipt, SendError, Transport};

mod adaptive;
mod builder;
mod gcra;
mod local;
#[cfg(feature = "redis")]
mod shared;

pub use builder::RateLimitBuilder;
use gcra::Slot;
use local::LocalLimiter;

/// The code of the error a limiter answers when a send cannot have a slot in time.
pub const RATE_LIMITED: &str = "rate.limited";

/// Something outside a limiter that slows it: the factor its rate is multiplied by, read at
/// each send. A member's [`ReputationBreaker`](crate::reputation::ReputationBreaker)
/// (feature `webhooks`) is one: ½ while it throttles, 1 otherwise. Handed to a limiter with
/// [`slowed_by`](RateLimitBuilder::slowed_by).
///
/// ```
/// use mail_breaker::rate::RateFactor;
///
/// #[derive(Debug)]
/// struct Night;
/// impl RateFactor for Night {
///     fn rate_factor(&self) -> f64 {
///         0.25
///     }
/// }
/// assert_eq!(Night.rate_factor(), 0.25);
/// ```
pub trait RateFactor: Send + Sync + std::fmt::Debug {
    /// The factor now, above 0 and at most 1; anything else (0, a negative number, more than
    /// 1, NaN) is read as 1: it never stops a limiter nor speeds it past its rate.
    fn rate_factor(&self) -> f64;

    /// Told once that the limiter named `limiter` reads this factor (when it is built).
    fn read_by(&self, limiter: &str) {
        let _ = limiter;
    }
}

/// `factor` as a limiter reads it: in (0, 1], else 1.
fn sane(factor: f64) -> f64 {
    if factor > 0.0 && factor <= 1.0 {
        factor
    } else {
        1.0
    }
}

/// A [`Transport`] that sends at most at a provider's rate: `per_second` on average,
/// `burst` at once, at most `max_in_flight` under way.
///
/// - A send waits for its slot, up to [`max_wait`](RateLimitBuilder::max_wait), and never
///   past the deadline of the send it is part of (an outbox worker's `send_timeout`). One
///   that cannot have a slot within it is answered at once with a `RateLimited` error coded
///   `rate.limited`, its [`retry_after`](SendError::retry_after) the time its slot would
///   come past the wait; it never trips a breaker, and nothing was sent.
/// - [Adaptive](RateLimitBuilder::adaptive): each `RateLimited` answer from the provider
///   halves the rate (not below [`min_per_second`](RateLimitBuilder::min_per_second)); each
///   second without one gives 5 % of the configured rate back, up to it.
/// - Shared with `.shared(store)` (feature `redis`): every process whose limiter has the
///   same name in the store's namespace draws from one budget in Redis, and a throttle
///   lowers everyone's rate; while Redis does not answer, each paces itself at its share
///   of the rate and of the burst (`1 / members`, see [`members`](RateLimitBuilder::members)).
/// - Built with [`cost_per_recipient`](RateLimitBuilder::cost_per_recipient), a send costs
///   one slot per recipient of its envelope (Amazon SES counts its maximum send rate so).
///
/// Time is read from `tokio::time`, so `tokio::time::pause()` drives it in tests.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use mail_breaker::{LettreTransport, RateLimitTransport, Transport};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let ses = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let limited = RateLimitTransport::builder(ses)
///     .per_second(14.0) // the account's quota
///     .burst(14)
///     .max_in_flight(10)
///     .max_wait(Duration::from_secs(5))
///     .adaptive(true)
///     .build()?;
/// assert_eq!(limited.per_second(), 14.0);
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct RateLimitTransport<T> {
    inner: T,
    name: Arc<str>,
    limiter: Limiter,
    in_flight: Option<Arc<Semaphore>>,
    max_wait: Duration,
    adaptive: bool,
    /// Each recipient costs a slot, not each message.
    per_recipient: bool,
    /// Its metrics' handles, under the `metrics` feature.
    recorded: Recorded,
    /// What slows the rate from outside (a reputation breaker's throttle), if anything.
    slowed_by: Option<Arc<dyn RateFactor>>,
    /// The factor read at the last send, as `f64` bits: a change is logged and measured.
    last_factor: AtomicU64,
}

impl<T: Transport> RateLimitTransport<T> {
    /// Settings for a limiter around `inner`; `per_second` must be set.
    pub fn builder(inner: T) -> RateLimitBuilder<T> {
        RateLimitBuilder::new(inner)
    }

    /// The rate allowed now, in sends per second: the configured rate, or less while an
    /// adaptive limiter recovers from a throttle or what it is
    /// [slowed by](RateLimitBuilder::slowed_by) slows it.
    pub fn per_second(&self) -> f64 {
        self.limiter.per_second() * self.factor()
    }

    /// The factor what it is [slowed by](RateLimitBuilder::slowed_by) says now (1 when
    /// nothing slows it).
    fn factor(&self) -> f64 {
        self.slowed_by
            .as_ref()
            .map_or(1.0, |slowed_by| sane(slowed_by.rate_factor()))
    }

    /// The factor for this send; a change since the last send is logged and sets the rate's
    /// gauge.
    fn read_factor(&self) -> f64 {
        let factor = self.factor();
        let before = f64::from_bits(self.last_factor.swap(factor.to_bits(), Ordering::Relaxed));
        if before != factor {
            let per_second = self.limiter.per_second() * factor;
            tracing::info!(limiter = %self.name, factor, per_second, "rate.slowed_by: the rate follows its factor");
            self.recorded.per_second(&self.name, per_second);
        }
        factor
    }

    /// The limiter's name: the inner transport's, unless set.
    pub fn limiter_name(&self) -> &str {
        &self.name
    }

    /// The transport it paces.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The transport it paces, to change.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The transport it paces, given back.
    pub fn into_inner(self) -> T {
        self.inner
    }

    /// How many slots a send to `envelope` costs: one, or one per recipient when counted so.
    fn cost(&self, envelope: &Envelope) -> u32 {
        if self.per_recipient {
            u32::try_from(envelope.to().len())
                .unwrap_or(u32::MAX)
                .max(1)
        } else {
            1
        }
    }

    /// Waits for a send's turn: a place among the sends in flight and `cost` slots of the
    /// rate, together within `max_wait`.
    async fn turn(
        &self,
        cost: u32,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, SendError> {
        // The clock is read only where a wait must be measured: the limiter reads it once.
        // No wait passes the deadline of the send this is part of (DESIGN §19): a slot
        // further off is refused now, as one past max_wait is, and nothing is sent.
        let max_wait = self.max_wait_within_deadline();
        let factor = self.read_factor();
        let (permit, queued) = match &self.in_flight {
            Some(places) => {
                let asked = Instant::now();
                match tokio::time::timeout(max_wait, Arc::clone(places).acquire_owned()).await {
                    Ok(Ok(permit)) => (Some(permit), asked.elapsed()),
                    // A semaphore this transport owns is never closed.
                    Ok(Err(_)) | Err(_) => return Err(self.refusal(None)),
                }
            }
            None => (None, Duration::ZERO),
        };
        match self
            .limiter
            .reserve(max_wait.saturating_sub(queued), cost, factor)
            .await
        {
            Slot::After(wait) => {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                let waited = queued.saturating_add(wait);
                self.recorded.wait(&self.name, waited, &self.limiter);
                Ok(permit)
            }
            Slot::Refused { retry_after } => Err(self.refusal(Some(retry_after))),
        }
    }

    /// `max_wait`, or the time left before the deadline of the send under way if shorter.
    fn max_wait_within_deadline(&self) -> Duration {
        match crate::deadline::current() {
            Some(at) => self
                .max_wait
                .min(at.saturating_duration_since(Instant::now())),
            None => self.max_wait,
        }
    }

    fn refusal(&self, retry_after: Option<Duration>) -> SendError {
        self.recorded.refused(&self.name, &self.limiter);
        let error = match retry_after {
            Some(retry_after) => SendError::new(
                Category::RateLimited,
                RATE_LIMITED,
                format!(
                    "the rate limit has no slot within max_wait ({:?}) or the send's deadline: \
                     nothing was sent",
                    self.max_wait
                ),
            )
            .with_retry_after(retry_after),
            None => SendError::new(
                Category::RateLimited,
                RATE_LIMITED,
                format!(
                    "max_in_flight sends stayed under way for max_wait ({:?}) or until the \
                     send's deadline: nothing was sent",
                    self.max_wait
                ),
            ),
        };
        // A rate limit holds back every message, whatever its recipients.
        error
            .with_transport(&*self.name)
            .not_attempted()
            .refusing_every_message()
    }

    /// Lowers the rate when the provider throttled (not a limiter below this one, whose
    /// refusal was never attempted).
    async fn heard(&self, result: &Result<Receipt, SendError>) {
        if let Err(error) = result
            && self.adaptive
            && error.category() == Category::RateLimited
            && !error.is_not_attempted()
        {
            self.limiter.throttled().await;
            let now = self.per_second();
            tracing::info!(limiter = %self.name, per_second = now, "rate.throttled");
            self.recorded.per_second(&self.name, now);
        }
    }
}

/// Where a limiter keeps its budget: in this process, or in Redis for the fleet.
#[derive(Debug)]
enum Limiter {
    Local(LocalLimiter),
    /// Boxed: its connection, script and fallback make it several times the local one.
    #[cfg(feature = "redis")]
    Shared(Box<shared::SharedLimiter>),
}

impl Limiter {
    /// Reserves `cost` slots at the rate times `factor`.
    async fn reserve(&self, max_wait: Duration, cost: u32, factor: f64) -> Slot {
        match self {
            Limiter::Local(local) => local.reserve(max_wait, cost, factor),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.reserve(max_wait, cost, factor).await,
        }
    }

    async fn throttled(&self) {
        match self {
            Limiter::Local(local) => local.throttled(),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.throttled().await,
        }
    }

    /// The rate before any factor: configured, or lowered by the provider's throttles.
    fn per_second(&self) -> f64 {
        match self {
            Limiter::Local(local) => local.per_second(),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.per_second(),
        }
    }
}

#[async_trait::async_trait]
impl<T: Transport> Transport for RateLimitTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let _place = self.turn(self.cost(envelope)).await?;
        let result = self.inner.send_raw(envelope, raw).await;
        self.heard(&result).await;
        result
    }

    async fn send(&self, message: &crate::Message) -> Result<Receipt, SendError> {
        let _place = self.turn(self.cost(message.envelope())).await?;
        let result = self.inner.send(message).await;
        self.heard(&result).await;
        result
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.inner.verify().await
    }
}

crate::transport::lettre_async_transport!(RateLimitTransport<T>, T);

/// The handles of a limiter's metrics, each taken at its first use and kept (see
/// [`crate::handles`]), labelled with the limiter's name; nothing without the `metrics`
/// feature.
#[derive(Debug, Default)]
struct Recorded {
    #[cfg(feature = "metrics")]
    wait: crate::handles::Kept<::metrics::Histogram>,
    #[cfg(feature = "metrics")]
    per_second: crate::handles::Kept<::metrics::Gauge>,
    #[cfg(feature = "metrics")]
    refused: crate::handles::Kept<::metrics::Counter>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl Recorded {
    /// The limiter `name` was built to allow `per_second`: set under the `metrics` feature
    /// ([`RATE_PER_SECOND`](crate::metrics::RATE_PER_SECOND)) in the recorder installed now,
    /// if any. No handle is kept: a recorder installed after the limiter was built has the
    /// rate set at the limiter's first send.
    fn built(name: &str, per_second: f64) {
        #[cfg(feature = "metrics")]
        ::metrics::gauge!(crate::metrics::RATE_PER_SECOND, "transport" => name.to_owned())
            .set(per_second);
    }

    /// A send through the limiter `name` waited `waited` for its turn: recorded under the
    /// `metrics` feature ([`RATE_WAIT_SECONDS`](crate::metrics::RATE_WAIT_SECONDS)).
    #[inline]
    fn wait(&self, name: &Arc<str>, waited: Duration, limiter: &Limiter) {
        #[cfg(feature = "metrics")]
        self.wait
            .get(|| {
                self.first_use(name, limiter);
                let name = Arc::clone(name);
                ::metrics::histogram!(crate::metrics::RATE_WAIT_SECONDS, "transport" => name)
            })
            .record(waited.as_secs_f64());
    }

    /// The limiter `name` allows `per_second` now: set under the `metrics` feature
    /// ([`RATE_PER_SECOND`](crate::metrics::RATE_PER_SECOND)).
    #[inline]
    fn per_second(&self, name: &Arc<str>, per_second: f64) {
        #[cfg(feature = "metrics")]
        self.rate(name).set(per_second);
    }

    /// The limiter `name` answered a send `rate.limited`: counted under the `metrics`
    /// feature ([`RATE_REFUSED_TOTAL`](crate::metrics::RATE_REFUSED_TOTAL)).
    #[inline]
    fn refused(&self, name: &Arc<str>, limiter: &Limiter) {
        #[cfg(feature = "metrics")]
        self.refused
            .get(|| {
                self.first_use(name, limiter);
                let name = Arc::clone(name);
                ::metrics::counter!(crate::metrics::RATE_REFUSED_TOTAL, "transport" => name)
            })
            .increment(1);
    }

    /// The gauge of the rate, taken at its first use.
    #[cfg(feature = "metrics")]
    fn rate(&self, name: &Arc<str>) -> &::metrics::Gauge {
        self.per_second.get(|| {
            let name = Arc::clone(name);
            ::metrics::gauge!(crate::metrics::RATE_PER_SECOND, "transport" => name)
        })
    }

    /// The limiter's first send (or refusal) under the recorder its handles are taken from:
    /// the rate is set there, which a recorder installed after the limiter was built has
    /// not seen.
    #[cfg(feature = "metrics")]
    fn first_use(&self, name: &Arc<str>, limiter: &Limiter) {
        self.rate(name).set(limiter.per_second());
    }
}

#[cfg(test)]
mod tests {
    use super::sane;

    #[test]
    fn a_rate_factor_outside_zero_to_one_reads_as_one() {
        for outside in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert_eq!(sane(outside), 1.0, "{outside}");
        }
        for inside in [0.25, 1.0, f64::MIN_POSITIVE] {
            assert_eq!(sane(inside), inside, "{inside}");
        }
    }
}
