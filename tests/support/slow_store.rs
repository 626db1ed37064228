//! A [`BreakerStore`] whose every answer takes a while, as a store across a network does: it
//! gives the breaker's futures await points that a caller can be dropped at.

use std::time::Duration;

use mail_breaker::breaker::{Decision, Outcome, Permit, Rules, Transitions};
use mail_breaker::store::{Reporter, StoreFuture};
use mail_breaker::{BreakerStore, MemoryStore, State};

/// A [`MemoryStore`] that waits `delay` before each `acquire` and `record`, then decides: a
/// caller that stops waiting before then has changed nothing. `release` and `state` answer
/// at once.
#[derive(Debug)]
pub struct SlowStore {
    inner: MemoryStore,
    delay: Duration,
    decides_first: bool,
}

impl SlowStore {
    /// A store whose decisions each take `delay`.
    pub fn new(delay: Duration) -> Self {
        SlowStore {
            inner: MemoryStore::new(),
            delay,
            decides_first: false,
        }
    }

    /// A store that decides each `acquire` at once and answers `delay` later, as a remote
    /// store whose reply is on its way: two callers' decisions can then cross.
    pub fn answering_late(delay: Duration) -> Self {
        SlowStore {
            decides_first: true,
            ..SlowStore::new(delay)
        }
    }
}

impl BreakerStore for SlowStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        StoreFuture::pending(async move {
            if self.decides_first {
                let answer = self.inner.acquire(key, rules, late).await;
                tokio::time::sleep(self.delay).await;
                return answer;
            }
            tokio::time::sleep(self.delay).await;
            self.inner.acquire(key, rules, late).await
        })
    }

    fn record<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        StoreFuture::pending(async move {
            tokio::time::sleep(self.delay).await;
            self.inner.record(key, rules, permit, outcome, late).await
        })
    }

    fn release(&self, key: &str, rules: &Rules, permit: Permit, late: &Reporter) {
        self.inner.release(key, rules, permit, late);
    }

    fn state(&self, key: &str, rules: &Rules) -> (State, Transitions) {
        self.inner.state(key, rules)
    }

    fn tracked_keys(&self) -> usize {
        self.inner.tracked_keys()
    }
}
