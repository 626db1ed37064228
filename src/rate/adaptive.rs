//! The rate an adaptive limiter allows now, pure: a provider's throttle halves it, and each
//! quiet second gives 5 % of the configured rate back, up to it. Throttles within a second of
//! the one that halved it change nothing: they answer sends that went out before the halving
//! (sixteen sends in flight throttled together are one signal, not sixteen).

/// Microseconds in a second: the limiter's clock counts whole µs, as the fleet's script does.
const SECOND: u64 = 1_000_000;

/// The share of the configured rate that each second without a throttle gives back.
const CLIMB_PER_SECOND: f64 = 0.05;

/// What a throttle does to the rate.
const ON_THROTTLE: f64 = 0.5;

/// How long after a halving further throttles are taken as answers to earlier sends.
const SETTLING: u64 = SECOND;

/// An adaptive rate: where it stood at its last throttle, and when that was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Adaptive {
    configured: f64,
    floor: f64,
    /// The rate just after the last halving (the configured rate before any).
    base: f64,
    /// When the last halving came, on the limiter's clock in µs; `None` before any.
    since: Option<u64>,
}

impl Adaptive {
    /// A rate that starts at `configured` and never goes below `floor` (at most `configured`).
    pub(crate) fn new(configured: f64, floor: f64) -> Adaptive {
        Adaptive {
            configured,
            floor: floor.min(configured),
            base: configured,
            since: None,
        }
    }

    /// The rate allowed at `now`.
    pub(crate) fn at(&self, now: u64) -> f64 {
        let Some(since) = self.since else {
            return self.configured;
        };
        let quiet_seconds = now.saturating_sub(since) / SECOND;
        // The script sums in the same order, so that both have the very same `f64`.
        let climbed = self.base + CLIMB_PER_SECOND * self.configured * quiet_seconds as f64;
        climbed.min(self.configured)
    }

    /// A throttle from the provider at `now`: the rate halves, not below the floor; unless
    /// it halved less than a second ago.
    pub(crate) fn throttled(&mut self, now: u64) {
        if self
            .since
            .is_some_and(|since| now.saturating_sub(since) < SETTLING)
        {
            return;
        }
        self.base = (self.at(now) * ON_THROTTLE).max(self.floor);
        self.since = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adaptive_rate_starts_at_the_configured_rate() {
        assert_eq!(Adaptive::new(100.0, 1.0).at(0), 100.0);
        assert_eq!(Adaptive::new(100.0, 1.0).at(u64::MAX), 100.0);
    }

    #[test]
    fn a_throttle_halves_the_rate() {
        let mut rate = Adaptive::new(100.0, 1.0);
        rate.throttled(10 * SECOND);
        assert_eq!(rate.at(10 * SECOND), 50.0);
    }

    #[test]
    fn throttles_within_a_second_of_a_halving_change_nothing() {
        let mut rate = Adaptive::new(100.0, 1.0);
        rate.throttled(10 * SECOND);
        rate.throttled(10 * SECOND);
        rate.throttled(11 * SECOND - 1);
        assert_eq!(rate.at(11 * SECOND - 1), 50.0);
        rate.throttled(11 * SECOND);
        assert_eq!(rate.at(11 * SECOND), 27.5, "55 a second then, halved");
    }

    #[test]
    fn the_first_throttle_halves_even_at_the_limiters_first_instant() {
        let mut rate = Adaptive::new(100.0, 1.0);
        rate.throttled(0);
        assert_eq!(rate.at(0), 50.0);
    }

    #[test]
    fn each_quiet_second_gives_back_five_percent_of_the_configured_rate() {
        let mut rate = Adaptive::new(100.0, 1.0);
        rate.throttled(10 * SECOND);
        assert_eq!(
            rate.at(10 * SECOND + SECOND - 1),
            50.0,
            "not before a whole second"
        );
        assert_eq!(rate.at(11 * SECOND), 55.0);
        assert_eq!(rate.at(14 * SECOND), 70.0);
        assert_eq!(
            rate.at(30 * SECOND),
            100.0,
            "never above the configured rate"
        );
    }

    #[test]
    fn a_throttle_halves_the_rate_it_had_climbed_back_to() {
        let mut rate = Adaptive::new(100.0, 1.0);
        rate.throttled(0);
        rate.throttled(2 * SECOND); // at 60
        assert_eq!(rate.at(2 * SECOND), 30.0);
    }

    #[test]
    fn the_rate_never_falls_below_its_floor() {
        let mut rate = Adaptive::new(100.0, 40.0);
        rate.throttled(0);
        rate.throttled(SECOND); // 55, halved to 27.5: floored
        assert_eq!(rate.at(SECOND), 40.0);
        let mut capped = Adaptive::new(10.0, 50.0);
        capped.throttled(0);
        assert_eq!(capped.at(0), 10.0, "a floor above the rate is the rate");
    }
}
