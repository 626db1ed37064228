//! The settings a reputation breaker decides by: for each rate its three thresholds and its
//! minimum volume, and the window of sends the rates are taken over.

use crate::ConfigError;

/// Parts per million: `40_000` is 4 %, `800` is 0.08 %.
pub type Ppm = u32;

/// The thresholds of one rate (hard bounces or complaints over sends) and the volume below
/// which the rate decides nothing.
///
/// A threshold is reached *at* its value: 40 hard bounces in 1,000 sends is 4 %, which
/// opens at the default `open` of 4 %. Set `warn` or `throttle` equal to the next threshold
/// up to leave that tier out: the higher tier is looked at first.
///
/// ```
/// use mail_breaker::reputation::Limits;
///
/// let bounces = Limits::HARD_BOUNCES;
/// assert_eq!(bounces.open, 40_000); // 4 %
/// assert_eq!(bounces.minimum_sends, 500);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The rate, in parts per million, at which the breaker warns (a callback, a metric, the
    /// tier shown).
    pub warn: Ppm,
    /// The rate at which the member's sending rate is halved, until the rate falls below
    /// `warn` again.
    pub throttle: Ppm,
    /// The rate at which the breaker opens and refuses every send until a person resets it.
    pub open: Ppm,
    /// How many sends the window must hold before this rate decides anything: one complaint
    /// in a hundred sends is 1 % and says nothing yet.
    pub minimum_sends: u64,
}

impl Limits {
    /// Hard (permanent) bounces: warn at 2 %, throttle at 3 %, open at 4 %, past 500 sends.
    /// SES reviews an account at 5 % and pauses it at 10 %: the breaker acts first.
    pub const HARD_BOUNCES: Limits = Limits {
        warn: 20_000,
        throttle: 30_000,
        open: 40_000,
        minimum_sends: 500,
    };

    /// Complaints: warn at 0.04 %, throttle at 0.06 %, open at 0.08 %, past 2,500 sends (so
    /// that one complaint never opens it). SES reviews at 0.1 % and pauses at 0.5 %.
    pub const COMPLAINTS: Limits = Limits {
        warn: 400,
        throttle: 600,
        open: 800,
        minimum_sends: 2_500,
    };

    /// Checks that the thresholds rise (`0 < warn <= throttle <= open`); `setting` names the
    /// rate in the error.
    fn check(&self, setting: &'static str) -> Result<(), ConfigError> {
        if self.warn == 0 {
            return Err(ConfigError::new(
                setting,
                "the warn threshold must be above 0 ppm, got 0",
            ));
        }
        if !(self.warn <= self.throttle && self.throttle <= self.open) {
            return Err(ConfigError::new(
                setting,
                format!(
                    "thresholds must rise: warn {} <= throttle {} <= open {} (ppm)",
                    self.warn, self.throttle, self.open
                ),
            ));
        }
        Ok(())
    }
}

/// The most buckets a window may be cut into: each is a few numbers in the store.
pub const MAX_BUCKETS: u32 = 100;

/// What a reputation breaker decides by: the two rates' [`Limits`] and the rolling window.
///
/// # The window
/// The rates are taken over the last [`window_sends`](Self::window_sends) sends, not over a
/// time: a provider's own rates move with the volume sent (SES: "a representative volume"),
/// and a rate only falls by sending clean mail, never by waiting. The window is cut into
/// [`buckets`](Self::buckets) buckets of `window_sends / buckets` sends; a bounce or a
/// complaint is counted in the bucket of the sends going out when it is heard (it comes
/// hours after the send it is about). When the newest bucket is full, a new one starts and
/// the oldest is dropped, so the window holds between `window_sends - bucket` and
/// `window_sends` sends. No clock is read: every process sharing a store agrees on it.
///
/// Defaults: the last 10,000 sends in 10 buckets of 1,000.
///
/// ```
/// use mail_breaker::reputation::ReputationRules;
///
/// let rules = ReputationRules::default();
/// assert_eq!(rules.bucket_sends(), 1_000);
/// assert!(rules.check().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReputationRules {
    /// Hard bounces over sends.
    pub hard_bounces: Limits,
    /// Complaints over sends.
    pub complaints: Limits,
    /// How many recent sends the rates are taken over.
    pub window_sends: u64,
    /// How many buckets the window rolls by (at least 2).
    pub buckets: u32,
}

impl Default for ReputationRules {
    fn default() -> Self {
        ReputationRules {
            hard_bounces: Limits::HARD_BOUNCES,
            complaints: Limits::COMPLAINTS,
            window_sends: 10_000,
            buckets: 10,
        }
    }
}

impl ReputationRules {
    /// How many sends one bucket holds: `window_sends / buckets`, at least 1.
    pub fn bucket_sends(&self) -> u64 {
        (self.window_sends / u64::from(self.buckets.max(1))).max(1)
    }

    /// Checks the rules, naming the first setting that cannot work: thresholds that do not
    /// rise, fewer than 2 or more than [`MAX_BUCKETS`] buckets, or a window too small to ever
    /// hold a rate's minimum volume once it has rolled.
    ///
    /// ```
    /// use mail_breaker::reputation::ReputationRules;
    ///
    /// let small = ReputationRules { window_sends: 1_000, ..ReputationRules::default() };
    /// assert_eq!(small.check().unwrap_err().setting(), "window_sends");
    /// ```
    pub fn check(&self) -> Result<(), ConfigError> {
        self.hard_bounces.check("hard_bounces")?;
        self.complaints.check("complaints")?;
        if !(2..=MAX_BUCKETS).contains(&self.buckets) {
            return Err(ConfigError::new(
                "buckets",
                format!("must be 2 to {MAX_BUCKETS}, got {}", self.buckets),
            ));
        }
        let kept = self.window_sends.saturating_sub(self.bucket_sends());
        let needed = self
            .hard_bounces
            .minimum_sends
            .max(self.complaints.minimum_sends);
        if self.window_sends / u64::from(self.buckets) == 0 || kept < needed {
            return Err(ConfigError::new(
                "window_sends",
                format!(
                    "a window of {} sends in {} buckets keeps {kept} sends once it rolls, \
                     fewer than a minimum volume of {needed}",
                    self.window_sends, self.buckets
                ),
            ));
        }
        Ok(())
    }
}
