//! The reputation breaker's rules as a pure value: a member's rolling counts of sends, hard
//! bounces and complaints, and the tier they put it in. It takes counts and returns the
//! change of tier; no I/O, no clock, no locks. The memory store holds one per member; the
//! Redis store's script (`reputation.lua`) restates it, and both run the same rules tests.

use std::fmt;

use super::rules::{Limits, ReputationRules};

/// How a member's reputation stands, from the least to the most severe.
///
/// ```
/// use mail_breaker::reputation::Tier;
///
/// assert!(Tier::Open > Tier::Throttle && Tier::Throttle > Tier::Warn);
/// assert_eq!(Tier::Throttle.as_str(), "throttle");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Tier {
    /// Below every warn threshold, or below the minimum volumes: mail goes as usual.
    #[default]
    Healthy,
    /// A rate reached its warn threshold: mail goes, the breaker tells (callback, metric).
    Warn,
    /// A rate reached its throttle threshold: the member's rate is halved until the rates
    /// fall below warn.
    Throttle,
    /// A rate reached its open threshold: every send is refused (`reputation.open`) until a
    /// person resets the breaker. It never half-opens by time, nor closes by itself.
    Open,
}

impl Tier {
    /// The tier's name: `healthy`, `warn`, `throttle`, `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Healthy => "healthy",
            Tier::Warn => "warn",
            Tier::Throttle => "throttle",
            Tier::Open => "open",
        }
    }

    /// The tier's number in a store (0 to 3); any other number reads as `Open`, the safe
    /// side for a value a store could not have written.
    pub(crate) fn from_number(number: i64) -> Tier {
        match number {
            0 => Tier::Healthy,
            1 => Tier::Warn,
            2 => Tier::Throttle,
            _ => Tier::Open,
        }
    }

    /// The tier's number in a store.
    pub(crate) fn number(self) -> i64 {
        self as i64
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sends, hard bounces and complaints: what one call adds, or what a window holds.
///
/// ```
/// use mail_breaker::reputation::Counts;
///
/// let window = Counts { sends: 1_000, hard_bounces: 39, complaints: 0 };
/// assert_eq!(window.hard_bounce_rate(), 0.039);
/// assert_eq!(Counts::default().complaint_rate(), 0.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Counts {
    /// Messages' recipients the provider accepted.
    pub sends: u64,
    /// Permanent bounces heard.
    pub hard_bounces: u64,
    /// Complaints heard.
    pub complaints: u64,
}

impl Counts {
    /// `n` sends.
    pub fn sends(n: u64) -> Counts {
        Counts {
            sends: n,
            ..Counts::default()
        }
    }

    /// Hard bounces over sends, 0 with no sends.
    pub fn hard_bounce_rate(&self) -> f64 {
        ratio(self.hard_bounces, self.sends)
    }

    /// Complaints over sends, 0 with no sends.
    pub fn complaint_rate(&self) -> f64 {
        ratio(self.complaints, self.sends)
    }

    fn add(&mut self, other: Counts) {
        self.sends = self.sends.saturating_add(other.sends);
        self.hard_bounces = self.hard_bounces.saturating_add(other.hard_bounces);
        self.complaints = self.complaints.saturating_add(other.complaints);
    }
}

fn ratio(events: u64, sends: u64) -> f64 {
    if sends == 0 {
        0.0
    } else {
        events as f64 / sends as f64
    }
}

/// A change of tier made by one call; `from == to` is none.
///
/// ```
/// use mail_breaker::reputation::{Tier, TierChange};
///
/// assert!(TierChange { from: Tier::Warn, to: Tier::Open }.changed());
/// assert!(!TierChange::default().changed());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TierChange {
    /// The tier before the call.
    pub from: Tier,
    /// The tier after it.
    pub to: Tier,
}

impl TierChange {
    /// Whether the call changed the tier.
    pub fn changed(&self) -> bool {
        self.from != self.to
    }
}

/// Where a member stands: its tier and what its window holds now.
///
/// ```
/// use mail_breaker::reputation::{Counts, Reputation, ReputationRules, Tier};
///
/// let rules = ReputationRules::default();
/// let mut member = Reputation::new(&rules);
/// member.record(&rules, Counts::sends(10));
/// assert_eq!(member.standing().window.sends, 10);
/// assert_eq!(member.standing().tier, Tier::Healthy);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Standing {
    /// The tier.
    pub tier: Tier,
    /// The counts over the window the rates are taken over.
    pub window: Counts,
}

/// One bucket of the window: its number (the sends before it over the bucket size) and its
/// counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Bucket {
    number: u64,
    counts: Counts,
}

/// One member's reputation: the pure core of a
/// [`ReputationBreaker`](super::ReputationBreaker).
///
/// ```
/// use mail_breaker::reputation::{Counts, Reputation, ReputationRules, Tier};
///
/// let rules = ReputationRules::default();
/// let mut member = Reputation::new(&rules);
/// member.record(&rules, Counts::sends(1_000));
/// let change = member.record(&rules, Counts { hard_bounces: 41, ..Counts::default() });
/// assert_eq!(change.to, Tier::Open);
/// member.record(&rules, Counts::sends(100_000)); // clean mail does not close it
/// assert_eq!(member.tier(), Tier::Open);
/// member.reset();
/// assert_eq!(member.tier(), Tier::Healthy);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reputation {
    /// Every send counted since the last reset: it numbers the buckets.
    total_sends: u64,
    /// The bucket size the ring was filled with; other rules start it afresh.
    bucket_sends: u64,
    /// Bucket `n` lives at `n % buckets`.
    ring: Vec<Bucket>,
    /// Set at the open threshold; only [`reset`](Self::reset) clears it.
    open: bool,
    tier: Tier,
}

impl Reputation {
    /// A member with nothing counted.
    pub fn new(rules: &ReputationRules) -> Reputation {
        Reputation {
            total_sends: 0,
            bucket_sends: rules.bucket_sends(),
            ring: empty_ring(rules),
            open: false,
            tier: Tier::Healthy,
        }
    }

    /// The tier after the last call.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The tier and the window's counts.
    pub fn standing(&self) -> Standing {
        Standing {
            tier: self.tier,
            window: self.window(),
        }
    }

    /// Adds `counts` (its sends first, then its bounces and complaints, which fall in the
    /// bucket the sends leave current) and decides the tier once, after all of it.
    pub fn record(&mut self, rules: &ReputationRules, counts: Counts) -> TierChange {
        if self.bucket_sends != rules.bucket_sends() || self.ring.len() != ring_len(rules) {
            // Other rules: the old buckets do not fit them; the open flag stays.
            self.total_sends = 0;
            self.bucket_sends = rules.bucket_sends();
            self.ring = empty_ring(rules);
        }
        self.add_sends(counts.sends);
        let current = self.current();
        let bucket = self.bucket(current);
        bucket.counts.hard_bounces = bucket
            .counts
            .hard_bounces
            .saturating_add(counts.hard_bounces);
        bucket.counts.complaints = bucket.counts.complaints.saturating_add(counts.complaints);
        let from = self.tier;
        self.tier = self.decide(rules);
        TierChange {
            from,
            to: self.tier,
        }
    }

    /// Clears every count and closes the breaker: what a person does once the cause is
    /// mended (the list cleaned, the sender fixed).
    pub fn reset(&mut self) -> TierChange {
        let from = self.tier;
        self.total_sends = 0;
        for (number, bucket) in self.ring.iter_mut().enumerate() {
            *bucket = Bucket {
                number: number as u64,
                counts: Counts::default(),
            };
        }
        self.open = false;
        self.tier = Tier::Healthy;
        TierChange {
            from,
            to: Tier::Healthy,
        }
    }

    /// The counts of the buckets in the window: the current one and the `buckets - 1` before.
    pub fn window(&self) -> Counts {
        let current = self.current();
        let len = self.ring.len() as u64;
        let mut sum = Counts::default();
        for bucket in &self.ring {
            if bucket.number <= current && bucket.number.saturating_add(len) > current {
                sum.add(bucket.counts);
            }
        }
        sum
    }

    fn current(&self) -> u64 {
        self.total_sends / self.bucket_sends
    }

    /// The bucket numbered `number`, emptied first if its slot held an older one.
    fn bucket(&mut self, number: u64) -> &mut Bucket {
        let len = self.ring.len() as u64;
        // The ring is never empty: `ring_len` is at least 1.
        let slot = (number % len.max(1)) as usize;
        let bucket = &mut self.ring[slot];
        if bucket.number != number {
            *bucket = Bucket {
                number,
                counts: Counts::default(),
            };
        }
        bucket
    }

    fn add_sends(&mut self, sends: u64) {
        let size = self.bucket_sends;
        let mut left = sends;
        // Sends past a whole window fill buckets that roll out before this call ends.
        let whole = size.saturating_mul(self.ring.len() as u64);
        if left > whole {
            let skipped = left - whole;
            self.total_sends = self.total_sends.saturating_add(skipped);
            left = whole;
        }
        while left > 0 {
            let room = size - self.total_sends % size;
            let take = left.min(room);
            let current = self.current();
            let bucket = self.bucket(current);
            bucket.counts.sends = bucket.counts.sends.saturating_add(take);
            self.total_sends = self.total_sends.saturating_add(take);
            left -= take;
        }
    }

    fn decide(&mut self, rules: &ReputationRules) -> Tier {
        if self.open {
            return Tier::Open;
        }
        let window = self.window();
        let mut tier = level(&rules.hard_bounces, window.hard_bounces, window.sends).max(level(
            &rules.complaints,
            window.complaints,
            window.sends,
        ));
        // A throttle lasts until the rates fall below warn (issue 64), so that a member
        // whose rate just dips under the throttle threshold is not at full speed again.
        if tier == Tier::Warn && self.tier == Tier::Throttle {
            tier = Tier::Throttle;
        }
        self.open = tier == Tier::Open;
        tier
    }
}

/// The tier one rate reaches: none below the minimum volume, else the highest threshold the
/// rate is at or above.
pub(crate) fn level(limits: &Limits, events: u64, sends: u64) -> Tier {
    if sends == 0 || sends < limits.minimum_sends {
        return Tier::Healthy;
    }
    // events / sends >= ppm / 1e6, without division or rounding.
    let at = |ppm: u32| u128::from(events) * 1_000_000 >= u128::from(ppm) * u128::from(sends);
    if at(limits.open) {
        Tier::Open
    } else if at(limits.throttle) {
        Tier::Throttle
    } else if at(limits.warn) {
        Tier::Warn
    } else {
        Tier::Healthy
    }
}

fn ring_len(rules: &ReputationRules) -> usize {
    rules.buckets.max(1) as usize
}

fn empty_ring(rules: &ReputationRules) -> Vec<Bucket> {
    (0..ring_len(rules) as u64)
        .map(|number| Bucket {
            number,
            counts: Counts::default(),
        })
        .collect()
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
