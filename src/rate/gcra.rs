//! The generic cell rate algorithm, pure: a limiter's state and the time in, whether a send
//! may go (now, after a wait, or not within the longest wait) out. The local limiter keeps
//! one; the shared one's script in Redis restates it.

use std::time::Duration;

/// What a limiter may let through: `per_second` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    pub per_second: f64,
    pub burst: u32,
}

impl Rate {
    /// The time between two sends at this rate, in nanoseconds (at least 1).
    pub(crate) fn interval_nanos(&self) -> u64 {
        let nanos = 1e9 / self.per_second;
        if nanos.is_finite() && nanos >= 1.0 {
            // Below 2⁶⁴ ns (584 years) the cast is exact enough; above it saturates.
            nanos as u64
        } else if nanos.is_finite() {
            1
        } else {
            u64::MAX
        }
    }

    /// How far ahead of its own slot a send may go: the burst beyond the first send.
    pub(crate) fn tolerance_nanos(&self) -> u64 {
        self.interval_nanos()
            .saturating_mul(u64::from(self.burst.saturating_sub(1)))
    }
}

/// A send's answer from the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Its slot is `wait` from now (zero: at once); it is reserved.
    After(Duration),
    /// No slot within the longest wait; the next one is `retry_after` from now. Nothing is
    /// reserved.
    Refused { retry_after: Duration },
}

/// One limiter's state: the theoretical arrival time of the next send, in nanoseconds on
/// the limiter's own clock (`None` before the first send).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gcra {
    tat: Option<u64>,
}

impl Gcra {
    /// Reserves the next slot at `rate` for a send asked for at `now` that may wait up to
    /// `max_wait`.
    pub(crate) fn reserve(&mut self, now: u64, rate: Rate, max_wait: Duration) -> Slot {
        let interval = rate.interval_nanos();
        let tat = self.tat.map_or(now, |tat| tat.max(now));
        let slot = tat.saturating_sub(rate.tolerance_nanos()).max(now);
        let wait = slot - now;
        if u128::from(wait) > max_wait.as_nanos() {
            return Slot::Refused {
                retry_after: Duration::from_nanos(wait.saturating_sub(nanos(max_wait))),
            };
        }
        self.tat = Some(tat.saturating_add(interval));
        Slot::After(Duration::from_nanos(wait))
    }
}

/// `duration` in nanoseconds, saturating.
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn rate(per_second: f64, burst: u32) -> Rate {
        Rate { per_second, burst }
    }

    #[test]
    fn a_rate_above_one_a_nanosecond_still_spaces_sends_by_one_nanosecond() {
        assert_eq!(rate(2e9, 1).interval_nanos(), 1);
        assert_eq!(rate(f64::MAX, 1).interval_nanos(), 1);
    }

    #[test]
    fn a_rate_too_low_to_space_in_nanoseconds_waits_the_longest_interval() {
        assert_eq!(rate(f64::MIN_POSITIVE, 1).interval_nanos(), u64::MAX);
        assert_eq!(rate(1.0, 1).interval_nanos(), 1_000_000_000);
    }

    #[test]
    fn the_first_send_goes_at_once() {
        let mut gcra = Gcra::default();
        assert_eq!(
            gcra.reserve(5 * MS, rate(50.0, 1), Duration::ZERO),
            Slot::After(Duration::ZERO)
        );
    }

    #[test]
    fn sends_asked_for_together_are_spaced_by_the_interval() {
        let mut gcra = Gcra::default();
        let waits: Vec<Slot> = (0..4)
            .map(|_| gcra.reserve(0, rate(50.0, 1), Duration::from_secs(1)))
            .collect();
        let expected: Vec<Slot> = [0, 20, 40, 60]
            .map(|ms| Slot::After(Duration::from_millis(ms)))
            .into();
        assert_eq!(waits, expected);
    }

    #[test]
    fn a_burst_goes_at_once_and_the_next_send_waits_its_interval() {
        let mut gcra = Gcra::default();
        for _ in 0..3 {
            assert_eq!(
                gcra.reserve(0, rate(10.0, 3), Duration::ZERO),
                Slot::After(Duration::ZERO)
            );
        }
        assert_eq!(
            gcra.reserve(0, rate(10.0, 3), Duration::from_secs(1)),
            Slot::After(Duration::from_millis(100))
        );
    }

    #[test]
    fn a_send_that_would_wait_past_max_wait_is_refused_and_reserves_nothing() {
        let mut gcra = Gcra::default();
        gcra.reserve(0, rate(10.0, 1), Duration::ZERO);
        gcra.reserve(0, rate(10.0, 1), Duration::from_secs(1)); // its slot: 100 ms
        assert_eq!(
            gcra.reserve(0, rate(10.0, 1), Duration::from_millis(150)),
            Slot::Refused {
                retry_after: Duration::from_millis(50)
            },
            "the slot at 200 ms is 50 ms past the longest wait"
        );
        assert_eq!(
            gcra.reserve(0, rate(10.0, 1), Duration::from_millis(200)),
            Slot::After(Duration::from_millis(200)),
            "the refusal reserved nothing"
        );
    }

    #[test]
    fn a_quiet_limiter_does_not_save_up_more_than_its_burst() {
        let mut gcra = Gcra::default();
        gcra.reserve(0, rate(10.0, 2), Duration::ZERO);
        let later = 10_000 * MS;
        assert_eq!(
            gcra.reserve(later, rate(10.0, 2), Duration::ZERO),
            Slot::After(Duration::ZERO)
        );
        assert_eq!(
            gcra.reserve(later, rate(10.0, 2), Duration::ZERO),
            Slot::After(Duration::ZERO)
        );
        assert_eq!(
            gcra.reserve(later, rate(10.0, 2), Duration::ZERO),
            Slot::Refused {
                retry_after: Duration::from_millis(100)
            }
        );
    }

    #[test]
    fn extreme_rates_neither_panic_nor_overflow() {
        for per_second in [
            0.0,
            f64::MIN_POSITIVE,
            1e-300,
            1e12,
            f64::INFINITY,
            f64::NAN,
        ] {
            let mut gcra = Gcra::default();
            for now in [0, u64::MAX - 1, u64::MAX] {
                let _ = gcra.reserve(now, rate(per_second, u32::MAX), Duration::MAX);
                let _ = gcra.reserve(now, rate(per_second, 0), Duration::ZERO);
            }
        }
    }
}
