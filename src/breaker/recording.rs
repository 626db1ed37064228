//! What a breaker records through the [`metrics`](https://docs.rs/metrics) facade, under the
//! `metrics` feature: its sends by outcome, how long they took, and its changes of state
//! (the names are in [`crate::metrics`]). Without the feature each call is empty.

#[cfg(feature = "metrics")]
use std::time::Duration;

use tokio::time::Instant;

#[cfg(feature = "metrics")]
use crate::machine::State;
use crate::machine::{Outcome, Transition};
#[cfg(feature = "metrics")]
use crate::metrics::{OPEN, SEND_SECONDS, SENDS_TOTAL, TRANSITIONS_TOTAL};

/// Whether a send needs its start time read even when slow calls do not count.
pub(crate) const TIMES_SENDS: bool = crate::metrics::ENABLED;

/// Whether [`send_finished`] counts each send's outcome.
pub(crate) const COUNTS_SENDS: bool = crate::metrics::ENABLED;

/// A breaker held a send back.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn send_refused(transport: &str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(SENDS_TOTAL, "transport" => transport.to_owned(), "outcome" => "refused")
        .increment(1);
}

/// A send a breaker let go has its answer: `counted` is how the breaker counted it (`None`:
/// not at all), `started` when it went (read when [`TIMES_SENDS`]).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn send_finished(transport: &str, counted: Option<Outcome>, started: Option<Instant>) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match counted {
            Some(Outcome::Success) => "success",
            Some(Outcome::Failure) => "failure",
            None => "ignored",
        };
        ::metrics::counter!(SENDS_TOTAL, "transport" => transport.to_owned(), "outcome" => outcome)
            .increment(1);
        let took = started.map_or(Duration::ZERO, |started| started.elapsed());
        ::metrics::histogram!(SEND_SECONDS, "transport" => transport.to_owned())
            .record(took.as_secs_f64());
    }
}

/// A breaker of `transport` changed state.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn transition(transport: &str, transition: Transition) {
    #[cfg(feature = "metrics")]
    {
        let Transition { from, to } = transition;
        ::metrics::counter!(
            TRANSITIONS_TOTAL,
            "transport" => transport.to_owned(),
            "from" => from.as_str(),
            "to" => to.as_str()
        )
        .increment(1);
        let open = ::metrics::gauge!(OPEN, "transport" => transport.to_owned());
        match (from, to) {
            (_, State::Open) => open.increment(1.0),
            (State::Open, _) => open.decrement(1.0),
            _ => {}
        }
    }
}
