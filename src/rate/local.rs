//! The limiter of one process: GCRA at a rate that a provider's throttles may lower, behind a
//! lock held for a few instructions.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::adaptive::Adaptive;
use super::gcra::{Gcra, Rate, Slot};

/// One process's limiter: its own clock, GCRA state and rate.
#[derive(Debug)]
pub(crate) struct LocalLimiter {
    origin: Instant,
    burst: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    gcra: Gcra,
    rate: Adaptive,
}

impl LocalLimiter {
    pub(crate) fn new(per_second: f64, burst: u32, floor: f64) -> LocalLimiter {
        LocalLimiter {
            origin: Instant::now(),
            burst,
            state: Mutex::new(State {
                gcra: Gcra::default(),
                rate: Adaptive::new(per_second, floor),
            }),
        }
    }

    /// Whole µs since the limiter was made (see `gcra.rs` on why µs).
    fn now(&self) -> u64 {
        super::gcra::micros(Instant::now().duration_since(self.origin))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two plain values, whole after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves the next `cost` slots, at the rate times `factor`, for a send that may wait
    /// up to `max_wait`.
    pub(crate) fn reserve(&self, max_wait: Duration, cost: u32, factor: f64) -> Slot {
        let now = self.now();
        let mut state = self.state();
        let rate = Rate {
            // The same product as the fleet's script, so that both have the same `f64`.
            per_second: state.rate.at(now) * factor,
            burst: self.burst,
        };
        state.gcra.reserve(now, rate, max_wait, cost)
    }

    /// The provider throttled a send: the rate halves.
    pub(crate) fn throttled(&self) {
        let now = self.now();
        self.state().rate.throttled(now);
    }

    /// The rate allowed now, before any factor.
    pub(crate) fn per_second(&self) -> f64 {
        let now = self.now();
        self.state().rate.at(now)
    }
}
