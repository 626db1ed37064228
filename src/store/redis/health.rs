//! Whether Redis answers: the store asks it while it does, decides locally while it does not,
//! and tries it again every so often. One warning when it stops answering, not one per send.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct Health {
    state: Mutex<Reach>,
    retry_interval: Duration,
    /// How many times Redis stopped answering: outage 1 is the first.
    outages: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
enum Reach {
    Answering,
    /// Not answering; the next call at or after `retry_at` tries Redis again.
    Silent {
        retry_at: Instant,
    },
}

impl Health {
    pub(super) fn new(retry_interval: Duration) -> Self {
        Health {
            state: Mutex::new(Reach::Answering),
            retry_interval,
            outages: AtomicU64::new(0),
        }
    }

    pub(super) fn with_retry_interval(self, retry_interval: Duration) -> Self {
        Health {
            retry_interval,
            ..self
        }
    }

    pub(super) fn retry_interval(&self) -> Duration {
        self.retry_interval
    }

    /// The number of the current outage, or of the last one while Redis answers.
    pub(super) fn outage(&self) -> u64 {
        self.outages.load(Ordering::Acquire)
    }

    /// Whether Redis answered the last call made to it.
    pub(super) fn is_answering(&self) -> bool {
        matches!(*self.lock(), Reach::Answering)
    }

    /// Whether this call should ask Redis. While Redis is silent, one call per retry
    /// interval does (the others decide locally at once), so a dead store costs at most one
    /// timeout per interval.
    pub(super) fn should_ask(&self) -> bool {
        let mut state = self.lock();
        match *state {
            Reach::Answering => true,
            Reach::Silent { retry_at } => {
                let now = Instant::now();
                if now < retry_at {
                    return false;
                }
                *state = Reach::Silent {
                    retry_at: crate::time::later_std(now, self.retry_interval),
                };
                true
            }
        }
    }

    /// Redis answered.
    pub(super) fn answered(&self, namespace: &str) {
        let mut state = self.lock();
        if let Reach::Silent { .. } = *state {
            *state = Reach::Answering;
            drop(state);
            tracing::info!(
                namespace,
                "store.redis_answering: the Redis breaker store answers again; breakers share their state again"
            );
        }
    }

    /// Redis failed or did not answer in time.
    pub(super) fn failed(&self, namespace: &str, why: &dyn fmt::Display) {
        let mut state = self.lock();
        let was_answering = matches!(*state, Reach::Answering);
        if was_answering {
            self.outages.fetch_add(1, Ordering::AcqRel);
        }
        *state = Reach::Silent {
            retry_at: crate::time::later_std(Instant::now(), self.retry_interval),
        };
        drop(state);
        if was_answering {
            tracing::warn!(
                namespace,
                error = %why,
                "store.redis_unreachable: the Redis breaker store failed; breakers decide from this process's own state until it answers"
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, Reach> {
        // Every change under this lock is one assignment: a panic cannot leave it torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_redis_is_asked_again_once_its_retry_interval_has_passed() {
        let health = Health::new(Duration::from_secs(3_600)).with_retry_interval(Duration::ZERO);
        assert_eq!(health.retry_interval(), Duration::ZERO);
        health.failed("ns", &"refused");
        assert!(!health.is_answering());
        assert!(
            health.should_ask(),
            "an interval of zero has passed at once"
        );
    }

    #[test]
    fn a_silent_redis_is_not_asked_before_its_retry_interval_has_passed() {
        let health = Health::new(Duration::ZERO).with_retry_interval(Duration::from_secs(3_600));
        assert_eq!(health.retry_interval(), Duration::from_secs(3_600));
        assert!(health.should_ask(), "an answering Redis is always asked");
        health.failed("ns", &"refused");
        assert!(!health.should_ask());
        health.answered("ns");
        assert!(health.is_answering());
        assert!(health.should_ask());
    }

    #[test]
    fn each_outage_is_counted_once_however_many_calls_fail_in_it() {
        let health = Health::new(Duration::from_secs(3_600));
        assert_eq!(health.outage(), 0);
        health.failed("ns", &"refused");
        health.failed("ns", &"refused");
        assert_eq!(health.outage(), 1);
        health.answered("ns");
        assert_eq!(
            health.outage(),
            1,
            "the last outage's number while Redis answers"
        );
        health.failed("ns", &"refused");
        assert_eq!(health.outage(), 2);
    }
}
