//! [`Backoff`]: how long a [`RetryTransport`](crate::RetryTransport) waits between tries.

use std::time::Duration;

use crate::ConfigError;

/// The wait before each retry, when the error asks for no longer wait itself.
///
/// The [`RetryTransport`](crate::RetryTransport) waits the longer of this and the error's
/// [`retry_after`](crate::SendError::retry_after).
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_millis(500), Duration::from_secs(30));
/// assert_eq!(backoff.ceiling(1), Duration::from_millis(500));
/// assert_eq!(backoff.ceiling(3), Duration::from_secs(2));
/// assert_eq!(backoff.ceiling(20), Duration::from_secs(30));
/// assert!(backoff.delay(3) <= Duration::from_secs(2));
///
/// assert_eq!(Backoff::constant(Duration::from_secs(1)).delay(7), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backoff {
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Exponential { initial: Duration, max: Duration },
    Constant(Duration),
}

impl Backoff {
    /// Exponential backoff with full jitter: the wait before retry `n` is drawn uniformly
    /// from zero to `initial × 2ⁿ⁻¹`, that bound capped at `max`. Jitter keeps many senders
    /// that failed together from retrying together.
    ///
    /// A zero `initial`, or a `max` shorter than `initial`, is a [`ConfigError`] when the
    /// retry transport is built.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        Backoff {
            kind: Kind::Exponential { initial, max },
        }
    }

    /// The same wait before every retry (zero retries at once).
    pub fn constant(delay: Duration) -> Self {
        Backoff {
            kind: Kind::Constant(delay),
        }
    }

    /// The longest wait before retry number `retry` (1 for the second try).
    pub fn ceiling(&self, retry: u32) -> Duration {
        match self.kind {
            Kind::Constant(delay) => delay,
            Kind::Exponential { initial, max } => {
                let doublings = retry.saturating_sub(1);
                let grown = 1u128
                    .checked_shl(doublings)
                    .and_then(|factor| initial.as_nanos().checked_mul(factor));
                grown.map_or(max, |nanos| from_nanos(nanos).min(max))
            }
        }
    }

    /// The wait before retry number `retry` (1 for the second try), jitter applied.
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        match self.kind {
            Kind::Constant(_) => ceiling,
            Kind::Exponential { .. } => full_jitter(ceiling),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Kind::Exponential { initial, max } = self.kind {
            if initial.is_zero() {
                return Err(ConfigError::new(
                    "backoff",
                    "the initial wait of an exponential backoff must be longer than zero",
                ));
            }
            if max < initial {
                return Err(ConfigError::new(
                    "backoff",
                    format!(
                        "the longest wait ({max:?}) must be at least the initial wait ({initial:?})"
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for Backoff {
    /// `Backoff::exponential(500 ms, 30 s)`.
    fn default() -> Self {
        Backoff::exponential(Duration::from_millis(500), Duration::from_secs(30))
    }
}

/// `nanos` as a duration; only called below a `Duration`'s own maximum.
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 10⁹, so it fits.
    Duration::new(secs, (nanos % NANOS_PER_SEC) as u32)
}

/// A duration drawn uniformly from zero to `ceiling`.
fn full_jitter(ceiling: Duration) -> Duration {
    match u64::try_from(ceiling.as_nanos()) {
        Ok(nanos) => Duration::from_nanos(fastrand::u64(0..=nanos)),
        // Past 584 years a second's precision is plenty.
        Err(_) => Duration::from_secs(fastrand::u64(0..=ceiling.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_the_ceiling() {
        let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
        for retry in 1..40 {
            assert!(backoff.delay(retry) <= backoff.ceiling(retry));
        }
    }

    #[test]
    fn huge_ceilings_do_not_overflow() {
        let backoff = Backoff::exponential(Duration::from_secs(1), Duration::MAX);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::MAX);
        assert_eq!(backoff.ceiling(40), Duration::from_secs(1 << 39));
        // Past what nanoseconds in a u64 hold, the jitter is drawn in whole seconds.
        let delays: Vec<Duration> = (0..64).map(|_| backoff.delay(u32::MAX)).collect();
        assert!(delays.iter().all(|delay| delay.subsec_nanos() == 0));
        assert!(
            delays
                .iter()
                .any(|delay| *delay > Duration::from_secs(1 << 40)),
            "full jitter over the whole range: {delays:?}"
        );
    }
}
