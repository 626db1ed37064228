//! How a closed breaker counts failures: in a row, or as a rate over a sliding window.

use std::time::Duration;

use tokio::time::Instant;

use crate::ConfigError;
use crate::error::{at_least_one, non_zero_duration};

/// Open the breaker on the share of failures in a sliding window, instead of failures in a row.
///
/// The window is cut into `buckets` equal slices; the oldest slice drops out as time moves on.
/// The breaker opens once the window holds at least `minimum_requests` results and at least
/// `threshold_percent` % of them are failures.
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::ErrorRate;
///
/// let rate = ErrorRate { threshold_percent: 25, minimum_requests: 100, ..ErrorRate::default() };
/// assert_eq!(rate.window, Duration::from_secs(10));
/// assert_eq!(rate.buckets, 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRate {
    /// The failure percentage, 1 to 100, at or over which the breaker opens.
    pub threshold_percent: u8,
    /// The fewest results in the window before the rate is judged at all.
    pub minimum_requests: u32,
    /// How far back results count.
    pub window: Duration,
    /// How many slices the window moves in.
    pub buckets: u32,
}

impl Default for ErrorRate {
    /// 50 %, 20 requests, 10 s, 10 buckets.
    fn default() -> Self {
        ErrorRate {
            threshold_percent: 50,
            minimum_requests: 20,
            window: Duration::from_secs(10),
            buckets: 10,
        }
    }
}

impl ErrorRate {
    /// Checks that the settings can work, naming the first that cannot.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.threshold_percent == 0 || self.threshold_percent > 100 {
            return Err(ConfigError::new(
                "error_rate.threshold_percent",
                format!("must be 1 to 100, got {}", self.threshold_percent),
            ));
        }
        at_least_one("error_rate.minimum_requests", self.minimum_requests.into())?;
        at_least_one("error_rate.buckets", self.buckets.into())?;
        if self.buckets > MAX_BUCKETS {
            return Err(ConfigError::new(
                "error_rate.buckets",
                format!("must be at most {MAX_BUCKETS}, got {}", self.buckets),
            ));
        }
        non_zero_duration("error_rate.window", self.window)?;
        if self.window < Duration::from_millis(self.buckets.into()) {
            return Err(ConfigError::new(
                "error_rate.window",
                format!(
                    "must span at least 1 ms per bucket: {} ms for {} buckets, got {:?}",
                    self.buckets, self.buckets, self.window
                ),
            ));
        }
        Ok(())
    }

    /// The width of one slice, in whole microseconds (at least one): the finest time the
    /// Redis script counts in, so that both stores cut the window at the same instants.
    fn bucket_width(&self) -> Duration {
        let micros = self.window.as_micros() / u128::from(self.buckets.max(1));
        Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX).max(1))
    }
}

/// The most buckets a window may have: each breaker keeps them all, and the Redis script
/// reads them all on every result.
pub const MAX_BUCKETS: u32 = 1_000;

/// How a closed breaker decides to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Open after this many failures in a row.
    Consecutive {
        /// Failures in a row that open the breaker.
        threshold: u32,
    },
    /// Open when the failure rate in a sliding window reaches a threshold.
    ErrorRate(ErrorRate),
}

/// The failures a closed breaker has counted so far.
#[derive(Debug, Clone)]
pub(crate) enum Counter {
    Consecutive { failures: u32, calls: u32 },
    Window(Window),
}

/// What a counter holds, for a snapshot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    pub(crate) failures: u32,
    pub(crate) calls: u32,
    /// The share of failures, under error-rate counting with something in the window.
    pub(crate) rate: Option<f64>,
}

impl Counter {
    pub(crate) fn new(counting: &Counting) -> Self {
        match counting {
            Counting::Consecutive { .. } => Counter::Consecutive {
                failures: 0,
                calls: 0,
            },
            Counting::ErrorRate(rate) => Counter::Window(Window::new(rate)),
        }
    }

    /// Counts one result; true when the breaker should open.
    pub(crate) fn record(&mut self, counting: &Counting, now: Instant, failed: bool) -> bool {
        match (self, counting) {
            (Counter::Consecutive { failures, calls }, Counting::Consecutive { threshold }) => {
                // Only results that change the count are counted as calls: a success while
                // nothing is counted changes nothing, so a healthy breaker writes nothing.
                if failed || *failures > 0 {
                    *calls = calls.saturating_add(1);
                }
                *failures = if failed {
                    failures.saturating_add(1)
                } else {
                    0
                };
                *failures >= *threshold
            }
            (Counter::Window(window), Counting::ErrorRate(rate)) => {
                window.record(rate, now, failed);
                window.is_tripped(rate, now)
            }
            // The rules changed under a live counter (a store shared by two configurations):
            // start this counter again under the new rules.
            (counter, counting) => {
                *counter = Counter::new(counting);
                counter.record(counting, now, failed)
            }
        }
    }

    /// Whether counting a success changes nothing: no failure in a row to clear, under
    /// the counting this counter was made for.
    pub(crate) fn ignores_a_success(&self, counting: &Counting) -> bool {
        matches!(
            (self, counting),
            (Counter::Consecutive { failures: 0, .. }, Counting::Consecutive { threshold })
                if *threshold > 0
        )
    }

    /// Whether nothing is counted: no failure in a row, no result in any bucket.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Counter::Consecutive { failures, .. } => *failures == 0,
            Counter::Window(window) => window.buckets.iter().all(|b| b.total == 0),
        }
    }

    /// What the counter holds at `now`.
    pub(crate) fn reading(&self, counting: &Counting, now: Instant) -> Reading {
        match (self, counting) {
            (Counter::Window(window), Counting::ErrorRate(rate)) => {
                let (total, failures) = window.in_window(rate, now);
                Reading {
                    failures: u32::try_from(failures).unwrap_or(u32::MAX),
                    calls: u32::try_from(total).unwrap_or(u32::MAX),
                    rate: (total > 0).then(|| failures as f64 / total as f64),
                }
            }
            (Counter::Consecutive { failures, calls }, _) => Reading {
                failures: *failures,
                calls: *calls,
                rate: None,
            },
            (Counter::Window(_), Counting::Consecutive { .. }) => Reading {
                failures: 0,
                calls: 0,
                rate: None,
            },
        }
    }

    /// Forgets every counted result; the window's slices start again at the next one.
    pub(crate) fn reset(&mut self) {
        match self {
            Counter::Consecutive { failures, calls } => {
                *failures = 0;
                *calls = 0;
            }
            Counter::Window(window) => {
                window.origin = None;
                window.buckets.fill(Bucket::default());
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which slice of time since the window's origin this bucket holds.
    slice: u64,
    total: u32,
    failures: u32,
}

/// A ring of buckets, each holding the results of one slice of time.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// Where slice 1 starts: at the first result counted since the count was last cleared,
    /// so that the slices do not depend on when the breaker was made (in Redis, on when its
    /// key was first written). `None` while nothing is counted.
    origin: Option<Instant>,
    buckets: Vec<Bucket>,
}

impl Window {
    fn new(rate: &ErrorRate) -> Self {
        Window {
            origin: None,
            buckets: vec![Bucket::default(); rate.buckets as usize],
        }
    }

    fn slice_at(rate: &ErrorRate, origin: Instant, now: Instant) -> u64 {
        let since = now.saturating_duration_since(origin).as_nanos();
        // Slice 0 is never live, so a zeroed bucket never counts.
        (since / rate.bucket_width().as_nanos()) as u64 + 1
    }

    fn record(&mut self, rate: &ErrorRate, now: Instant, failed: bool) {
        let origin = *self.origin.get_or_insert(now);
        let slice = Window::slice_at(rate, origin, now);
        let len = self.buckets.len() as u64;
        let bucket = &mut self.buckets[(slice % len) as usize];
        if bucket.slice != slice {
            *bucket = Bucket {
                slice,
                ..Bucket::default()
            };
        }
        bucket.total = bucket.total.saturating_add(1);
        bucket.failures = bucket.failures.saturating_add(u32::from(failed));
    }

    /// The results and failures in the window at `now`.
    fn in_window(&self, rate: &ErrorRate, now: Instant) -> (u64, u64) {
        let Some(origin) = self.origin else {
            return (0, 0); // nothing counted since the count was cleared
        };
        let current = Window::slice_at(rate, origin, now);
        let oldest = current.saturating_sub(self.buckets.len() as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| b.slice >= oldest && b.slice <= current && b.slice != 0)
            .fold((0u64, 0u64), |(t, f), b| {
                (t + u64::from(b.total), f + u64::from(b.failures))
            })
    }

    fn is_tripped(&self, rate: &ErrorRate, now: Instant) -> bool {
        let (total, failures) = self.in_window(rate, now);
        total >= u64::from(rate.minimum_requests)
            && failures * 100 >= u64::from(rate.threshold_percent) * total
    }
}
