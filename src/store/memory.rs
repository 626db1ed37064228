//! [`MemoryStore`]: breaker state in this process.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::lru::BoundedMap;
use super::{BreakerStore, StoreFuture};
use crate::State;
use crate::breaker::{Decision, Machine, Outcome, Permit, Rules, Transitions};

/// The default number of keys a [`MemoryStore`] tracks.
pub const DEFAULT_MAX_KEYS: usize = 10_000;

/// Breaker state kept in this process: the default store, one per breaker.
///
/// It tracks at most `max_keys` keys (default 10,000); past that it forgets the least
/// recently used closed breakers first, so memory stays bounded however many recipient
/// domains pass through. Each decision takes a lock for a few instructions and never
/// across an `.await`.
///
/// ```
/// use std::sync::Arc;
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, MemoryStore, Scope};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let breaker = CircuitBreakerTransport::builder(transport)
///     .scope(Scope::RecipientDomain)
///     .store(Arc::new(MemoryStore::with_max_keys(1_000)))
///     .build()
///     .unwrap();
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    machines: Mutex<BoundedMap<Machine>>,
}

impl MemoryStore {
    /// A store that tracks up to 10,000 keys.
    pub fn new() -> Self {
        MemoryStore::with_max_keys(DEFAULT_MAX_KEYS)
    }

    /// A store that tracks up to `max_keys` keys (at least 1).
    pub fn with_max_keys(max_keys: usize) -> Self {
        MemoryStore {
            machines: Mutex::new(BoundedMap::new(max_keys)),
        }
    }

    /// Runs `f` on the machine of `key` at `now`, made if missing, and marks the key used.
    fn with_machine<R>(
        &self,
        key: &str,
        rules: &Rules,
        f: impl FnOnce(&mut Machine, Instant) -> R,
    ) -> R {
        let now = Instant::now();
        self.lock().with(
            key,
            || Machine::new(rules, now),
            |machine| machine.state() == State::Closed,
            |machine| f(machine, now),
        )
    }

    /// Opens the breaker of `key` if it is closed (see [`Machine::trip`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn trip(&self, key: &str, rules: &Rules) -> Transitions {
        self.with_machine(key, rules, |machine, now| machine.trip(rules, now))
    }

    fn lock(&self) -> MutexGuard<'_, BoundedMap<Machine>> {
        // The lock guards no invariant a panic could break halfway: machines change in place
        // by plain assignments, so a poisoned lock is still sound to use.
        self.machines.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl BreakerStore for MemoryStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        StoreFuture::ready(
            self.with_machine(key, rules, |machine, now| machine.acquire(rules, now)),
        )
    }

    fn record<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
    ) -> StoreFuture<'a, Transitions> {
        StoreFuture::ready(self.with_machine(key, rules, |machine, now| {
            machine.record(rules, now, permit, outcome)
        }))
    }

    fn release(&self, key: &str, permit: Permit) {
        self.lock().peek_mut(key, |machine| machine.release(permit));
    }

    fn state(&self, key: &str, rules: &Rules) -> (State, Transitions) {
        let now = Instant::now();
        self.lock()
            .peek_mut(key, |machine| {
                let transitions = machine.expire(rules, now);
                (machine.state(), transitions)
            })
            .unwrap_or((State::Closed, Transitions::NONE))
    }

    fn tracked_keys(&self) -> usize {
        self.lock().len()
    }
}
