//! The generic cell rate algorithm, pure: a limiter's state and the time in, whether a send
//! may go (now, after a wait, or not within the longest wait) out. The local limiter keeps
//! one; the fleet's script in Redis (`rate.lua`) restates it step for step.
//!
//! # The arithmetic both keep
//! Times are whole microseconds (the Redis server's clock has no finer grain, and a Lua
//! number holds whole numbers exactly up to 2⁵³). The one step in floating point is the
//! interval, `ceil(1e6 / rate)`, at least 1 µs: rounded up, so that the limiter never sends
//! faster than the provider's quota. Intervals, tolerances and waits are capped at
//! [`CAP`] µs (35 years), so that every sum stays exact in a Lua number. The rate itself is
//! the same `f64` sum in both (see `adaptive.rs`).
//!
//! # A rate change creates no credit
//! The theoretical arrival time (`tat`) is kept with the interval it was counted in. When the
//! rate has changed since, what is still owed (`tat - now`) is a number of sends at the old
//! interval, and is owed at the new one: `ceil(owed × new / old)`. So a limiter that had
//! spent its burst has not a send more after its rate halves (GCRA's tolerance grows with
//! the interval, and `tat` alone would hand it a new burst), and a recovering rate pays its
//! debt faster.
//!
//! # A send that costs several slots
//! A send may cost `cost` slots (one per recipient, for a provider that counts them). It
//! goes once `min(cost, burst)` slots are free, and owes them all: `tat` moves on by
//! `cost` intervals (at most [`CAP`] µs). So a message to more recipients than the burst is
//! never refused for good, and the sends after it wait for what it took.

use std::time::Duration;

/// The longest interval, tolerance and wait the arithmetic holds, in µs: about 35 years.
pub(crate) const CAP: u64 = 1 << 50;

/// The most a limiter may owe, in µs: a tolerance, a wait and an interval.
const OWED_CAP: u64 = 3 * CAP;

/// What a limiter may let through: `per_second` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    pub per_second: f64,
    pub burst: u32,
}

impl Rate {
    /// The time between two sends at this rate, in whole µs: `ceil(1e6 / rate)`, at least 1,
    /// at most [`CAP`].
    pub(crate) fn interval_micros(&self) -> u64 {
        // `as` saturates: a rate of NaN or infinity gives 0, one too low to space gives
        // `u64::MAX`; below 2⁵⁰ the whole number is exact.
        ((1e6 / self.per_second).ceil() as u64).clamp(1, CAP)
    }

    /// How far ahead of its own slot a send may go: the burst beyond the first send, at most
    /// [`CAP`].
    pub(crate) fn tolerance_micros(&self) -> u64 {
        self.interval_micros()
            .saturating_mul(u64::from(self.burst.saturating_sub(1)))
            .min(CAP)
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

/// One limiter's state: the theoretical arrival time of the next send, in µs on the
/// limiter's own clock, with the interval it was counted in (`None` before the first send).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gcra {
    tat: Option<(u64, u64)>,
}

impl Gcra {
    /// Reserves the next `cost` slots (at least 1) at `rate` for a send asked for at `now`
    /// (µs) that may wait up to `max_wait`.
    pub(crate) fn reserve(&mut self, now: u64, rate: Rate, max_wait: Duration, cost: u32) -> Slot {
        let interval = rate.interval_micros();
        let tat = match self.tat {
            None => now,
            Some((tat, counted_in)) => owed_at(now, tat, counted_in, interval),
        };
        let cost = cost.max(1);
        // How far past `tat` the last slot this send needs now lies: the burst bounds it.
        let ahead = interval
            .saturating_mul(u64::from(cost.min(rate.burst.max(1)) - 1))
            .min(CAP);
        let charge = interval.saturating_mul(u64::from(cost)).min(CAP);
        let slot = tat
            .saturating_add(ahead)
            .saturating_sub(rate.tolerance_micros())
            .max(now);
        let wait = slot - now;
        let max_wait = micros(max_wait).min(CAP);
        if wait > max_wait {
            return Slot::Refused {
                retry_after: Duration::from_micros(wait - max_wait),
            };
        }
        self.tat = Some((tat.saturating_add(charge), interval));
        Slot::After(Duration::from_micros(wait))
    }
}

/// The theoretical arrival time at `now` of a limiter whose `tat` was counted in intervals of
/// `counted_in` µs, counted in intervals of `interval`: what it owes, as many sends, at the
/// new interval, rounded up (see the module's docs).
fn owed_at(now: u64, tat: u64, counted_in: u64, interval: u64) -> u64 {
    if tat <= now {
        return now;
    }
    let owed = tat - now;
    if counted_in == interval {
        return tat;
    }
    // The same three `f64` steps as the script's, so that both round alike.
    let rescaled = (owed as f64 * interval as f64 / counted_in as f64).ceil();
    let rescaled = if rescaled >= OWED_CAP as f64 {
        OWED_CAP
    } else {
        rescaled as u64 // a whole number below 2⁵², not below 0: exact
    };
    now.saturating_add(rescaled)
}

/// `duration` in whole µs, saturating.
pub(crate) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    fn rate(per_second: f64, burst: u32) -> Rate {
        Rate { per_second, burst }
    }

    #[test]
    fn a_rate_above_one_a_microsecond_still_spaces_sends_by_one_microsecond() {
        assert_eq!(rate(2e6, 1).interval_micros(), 1);
        assert_eq!(rate(f64::MAX, 1).interval_micros(), 1);
    }

    #[test]
    fn a_rate_no_number_can_space_still_spaces_sends_by_one_microsecond() {
        assert_eq!(rate(f64::INFINITY, 1).interval_micros(), 1);
        assert_eq!(rate(f64::NAN, 1).interval_micros(), 1);
    }

    #[test]
    fn what_a_limiter_owes_rescaled_to_a_longer_interval_is_kept_up_to_three_caps() {
        // CAP µs owed at 1 µs a send is CAP sends: 2 CAP µs at 2 µs a send.
        assert_eq!(owed_at(0, CAP, 1, 2), 2 * CAP);
        assert_eq!(owed_at(0, CAP, 1, 4), 3 * CAP);
    }

    #[test]
    fn a_rate_too_low_to_space_in_the_arithmetic_waits_the_longest_interval() {
        assert_eq!(rate(f64::MIN_POSITIVE, 1).interval_micros(), CAP);
        assert_eq!(rate(1.0, 1).interval_micros(), 1_000_000);
    }

    #[test]
    fn an_interval_that_is_not_whole_is_rounded_up_never_faster_than_the_rate() {
        assert_eq!(rate(3.0, 1).interval_micros(), 333_334);
        assert_eq!(rate(14.0, 1).interval_micros(), 71_429);
    }

    #[test]
    fn halving_the_rate_of_a_limiter_that_spent_its_burst_gives_it_no_send() {
        let mut gcra = Gcra::default();
        for _ in 0..10 {
            gcra.reserve(0, rate(10.0, 10), Duration::ZERO, 1);
        }
        assert_eq!(
            gcra.reserve(0, rate(5.0, 10), Duration::ZERO, 1),
            Slot::Refused {
                retry_after: Duration::from_millis(200)
            },
            "ten sends owed at 200 ms each, less 1.8 s of tolerance"
        );
    }

    #[test]
    fn a_rate_change_keeps_what_is_owed_as_a_number_of_sends() {
        let mut gcra = Gcra::default();
        gcra.reserve(0, rate(10.0, 1), Duration::ZERO, 1); // owes 100 ms: one send
        assert_eq!(
            gcra.reserve(50 * MS, rate(20.0, 1), Duration::from_secs(1), 1),
            Slot::After(Duration::from_millis(25)),
            "half a send owed at 50 ms a send"
        );
        assert_eq!(owed_at(10, 5, 7, 9), 10, "nothing owed: nothing to count");
        assert_eq!(owed_at(0, 3, 2, 3), 5, "1.5 sends owed, rounded up");
    }

    #[test]
    fn the_first_send_goes_at_once() {
        let mut gcra = Gcra::default();
        assert_eq!(
            gcra.reserve(5 * MS, rate(50.0, 1), Duration::ZERO, 1),
            Slot::After(Duration::ZERO)
        );
    }

    #[test]
    fn sends_asked_for_together_are_spaced_by_the_interval() {
        let mut gcra = Gcra::default();
        let waits: Vec<Slot> = (0..4)
            .map(|_| gcra.reserve(0, rate(50.0, 1), Duration::from_secs(1), 1))
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
                gcra.reserve(0, rate(10.0, 3), Duration::ZERO, 1),
                Slot::After(Duration::ZERO)
            );
        }
        assert_eq!(
            gcra.reserve(0, rate(10.0, 3), Duration::from_secs(1), 1),
            Slot::After(Duration::from_millis(100))
        );
    }

    #[test]
    fn a_send_that_would_wait_past_max_wait_is_refused_and_reserves_nothing() {
        let mut gcra = Gcra::default();
        gcra.reserve(0, rate(10.0, 1), Duration::ZERO, 1);
        gcra.reserve(0, rate(10.0, 1), Duration::from_secs(1), 1); // its slot: 100 ms
        assert_eq!(
            gcra.reserve(0, rate(10.0, 1), Duration::from_millis(150), 1),
            Slot::Refused {
                retry_after: Duration::from_millis(50)
            },
            "the slot at 200 ms is 50 ms past the longest wait"
        );
        assert_eq!(
            gcra.reserve(0, rate(10.0, 1), Duration::from_millis(200), 1),
            Slot::After(Duration::from_millis(200)),
            "the refusal reserved nothing"
        );
    }

    #[test]
    fn a_quiet_limiter_does_not_save_up_more_than_its_burst() {
        let mut gcra = Gcra::default();
        gcra.reserve(0, rate(10.0, 2), Duration::ZERO, 1);
        let later = 10_000 * MS;
        assert_eq!(
            gcra.reserve(later, rate(10.0, 2), Duration::ZERO, 1),
            Slot::After(Duration::ZERO)
        );
        assert_eq!(
            gcra.reserve(later, rate(10.0, 2), Duration::ZERO, 1),
            Slot::After(Duration::ZERO)
        );
        assert_eq!(
            gcra.reserve(later, rate(10.0, 2), Duration::ZERO, 1),
            Slot::Refused {
                retry_after: Duration::from_millis(100)
            }
        );
    }

    #[test]
    fn a_send_of_several_slots_goes_when_they_are_free_and_owes_them_all() {
        let mut gcra = Gcra::default();
        assert_eq!(
            gcra.reserve(0, rate(10.0, 4), Duration::ZERO, 3),
            Slot::After(Duration::ZERO)
        );
        assert_eq!(
            gcra.reserve(0, rate(10.0, 4), Duration::ZERO, 2),
            Slot::Refused {
                retry_after: Duration::from_millis(100)
            },
            "one slot of the burst left, two needed"
        );
        assert_eq!(
            gcra.reserve(0, rate(10.0, 4), Duration::ZERO, 0),
            Slot::After(Duration::ZERO),
            "a cost of none is one slot"
        );
    }

    #[test]
    fn a_send_costing_more_than_the_burst_goes_once_the_burst_is_whole() {
        let mut gcra = Gcra::default();
        assert_eq!(
            gcra.reserve(0, rate(10.0, 2), Duration::ZERO, 5),
            Slot::After(Duration::ZERO)
        );
        assert_eq!(
            gcra.reserve(0, rate(10.0, 2), Duration::ZERO, 1),
            Slot::Refused {
                retry_after: Duration::from_millis(400)
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
                let _ = gcra.reserve(now, rate(per_second, u32::MAX), Duration::MAX, u32::MAX);
                let _ = gcra.reserve(now, rate(per_second, 0), Duration::ZERO, 1);
            }
        }
    }
}
