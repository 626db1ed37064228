//! What a breaker records through the [`metrics`](https://docs.rs/metrics) facade, under the
//! `metrics` feature: its sends by outcome, how long they took, and its changes of state
//! (the names are in [`crate::metrics`]). Without the feature [`Recording`] holds nothing
//! and each call is empty.
//!
//! Each series is a handle the breaker takes at its first use and keeps (see
//! [`crate::handles`]), labelled with the transport's name when the breaker was built: a
//! send records through an atomic handle, with no label allocated, no key hashed and no
//! recorder asked. A breaker per recipient domain keeps one set for all its domains, as its
//! labels name the transport, never the domain.
//!
//! A send's duration costs two reads of the clock, so they are made only for a histogram
//! that keeps values: with no recorder installed, or one that filters
//! `mail_breaker_send_seconds` out, the handle is a no-op and no clock is read for it.

#[cfg(feature = "metrics")]
use std::cell::Cell;
#[cfg(feature = "metrics")]
use std::sync::Arc;

use tokio::time::Instant;

#[cfg(feature = "metrics")]
use crate::handles::Kept;
#[cfg(feature = "metrics")]
use crate::machine::State;
use crate::machine::{Outcome, Transition};
#[cfg(feature = "metrics")]
use crate::metrics::{OPEN, SEND_SECONDS, SENDS_TOTAL, TRANSITIONS_TOTAL};
#[cfg(feature = "metrics")]
use ::metrics::{Counter, Gauge, Histogram, IntoF64, counter, gauge, histogram};

/// When a send let go on the breaker's clean path went: under the `metrics` feature, read
/// only when the recorder keeps the send's duration ([`Recording::clean_start`]); nothing
/// without the feature.
#[cfg(feature = "metrics")]
pub(crate) type CleanStart = Option<Instant>;
#[cfg(not(feature = "metrics"))]
pub(crate) type CleanStart = ();

/// A breaker's metrics: the handles it keeps, shared by its gate and the reporter of the
/// changes its store learns of late. Nothing without the `metrics` feature.
#[derive(Clone)]
pub(crate) struct Recording {
    #[cfg(feature = "metrics")]
    handles: Arc<Handles>,
}

/// The handles of one breaker, each taken at its first use.
#[cfg(feature = "metrics")]
struct Handles {
    /// The transport's name when the breaker was built: every handle's `transport` label.
    transport: Arc<str>,
    /// `mail_breaker_sends_total`, one per outcome, in the order of [`OUTCOMES`].
    sends: [Kept<Counter>; 4],
    seconds: Kept<Timed>,
    /// `mail_breaker_transitions_total`, one per change, at `3 * from + to`.
    transitions: [Kept<Counter>; 9],
    open: Kept<Gauge>,
}

/// The send-time histogram, and whether the recorder keeps what it is given: a no-op
/// handle (no recorder, or one that filters the series out) needs no clock read.
#[cfg(feature = "metrics")]
struct Timed {
    histogram: Histogram,
    wanted: bool,
}

#[cfg(feature = "metrics")]
impl Timed {
    fn new(histogram: Histogram) -> Self {
        let wanted = keeps_values(&histogram);
        Timed { histogram, wanted }
    }
}

/// Whether `histogram` does anything with a value: the facade asks for the value only for
/// a handle that is not a no-op, and a value recorded no times records nothing.
#[cfg(feature = "metrics")]
fn keeps_values(histogram: &Histogram) -> bool {
    let asked = Cell::new(false);
    histogram.record_many(Asked(&asked), 0);
    asked.get()
}

/// A value that notes it was asked for.
#[cfg(feature = "metrics")]
struct Asked<'a>(&'a Cell<bool>);

#[cfg(feature = "metrics")]
impl IntoF64 for Asked<'_> {
    fn into_f64(self) -> f64 {
        self.0.set(true);
        0.0
    }
}

/// A send's duration, read from the clock only when a histogram asks for it: a send that
/// went at `started` (none read: zero).
#[cfg(feature = "metrics")]
struct Took(Option<Instant>);

#[cfg(feature = "metrics")]
impl IntoF64 for Took {
    fn into_f64(self) -> f64 {
        self.0
            .map_or(0.0, |started| started.elapsed().as_secs_f64())
    }
}

/// The `outcome` labels, by their place in [`Handles::sends`].
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 4] = ["success", "failure", "ignored", "refused"];
#[cfg(feature = "metrics")]
const REFUSED: usize = 3;

/// The place of `counted`'s outcome in [`OUTCOMES`].
#[cfg(feature = "metrics")]
fn outcome_index(counted: Option<Outcome>) -> usize {
    match counted {
        Some(Outcome::Success) => 0,
        Some(Outcome::Failure) => 1,
        None => 2,
    }
}

#[cfg(feature = "metrics")]
fn state_index(state: State) -> usize {
    match state {
        State::Closed => 0,
        State::Open => 1,
        State::HalfOpen => 2,
    }
}

#[cfg(feature = "metrics")]
impl Handles {
    fn sends(&self, outcome: usize) -> &Counter {
        self.sends[outcome].get(|| {
            let transport = Arc::clone(&self.transport);
            counter!(SENDS_TOTAL, "transport" => transport, "outcome" => OUTCOMES[outcome])
        })
    }

    fn seconds(&self) -> &Timed {
        self.seconds.get(|| {
            let transport = Arc::clone(&self.transport);
            Timed::new(histogram!(SEND_SECONDS, "transport" => transport))
        })
    }

    fn transitions(&self, transition: Transition) -> &Counter {
        let Transition { from, to } = transition;
        self.transitions[3 * state_index(from) + state_index(to)]
            .get(|| transitions(&self.transport, transition))
    }

    fn open(&self) -> &Gauge {
        self.open.get(|| open(&self.transport))
    }
}

/// The handle of `mail_breaker_transitions_total` for `transition` of `transport`.
#[cfg(feature = "metrics")]
fn transitions(transport: &str, Transition { from, to }: Transition) -> Counter {
    counter!(
        TRANSITIONS_TOTAL,
        "transport" => transport.to_owned(),
        "from" => from.as_str(),
        "to" => to.as_str()
    )
}

/// The handle of `mail_breaker_open` for `transport`.
#[cfg(feature = "metrics")]
fn open(transport: &str) -> Gauge {
    gauge!(OPEN, "transport" => transport.to_owned())
}

impl Recording {
    /// The metrics of a breaker around `transport`, its name now.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(transport: &std::sync::Arc<str>) -> Self {
        Recording {
            #[cfg(feature = "metrics")]
            handles: Arc::new(Handles {
                transport: Arc::clone(transport),
                sends: Default::default(),
                seconds: Kept::new(),
                transitions: Default::default(),
                open: Kept::new(),
            }),
        }
    }

    /// The kept handles, when `transport` is still the name they are labelled with; `None`
    /// for a transport renamed through `inner_mut` since the breaker was built, whose
    /// metrics are then taken for each call under its new name.
    #[cfg(feature = "metrics")]
    #[inline]
    fn kept(&self, transport: &str) -> Option<&Handles> {
        let handles = &*self.handles;
        (*handles.transport == *transport).then_some(handles)
    }

    /// Whether a send of `transport` needs its start time for the send-time histogram: only
    /// when the recorder keeps its values (the handle is taken here at its first use). A
    /// transport renamed since the breaker was built takes its handle when the send ends, so
    /// its sends are timed whatever the recorder.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn times_sends(&self, transport: &str) -> bool {
        #[cfg(feature = "metrics")]
        return self
            .kept(transport)
            .is_none_or(|handles| handles.seconds().wanted);
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// When a send of `transport` let go on the clean path went, read if
    /// [`times_sends`](Self::times_sends).
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn clean_start(&self, transport: &str) -> CleanStart {
        #[cfg(feature = "metrics")]
        return self.times_sends(transport).then(Instant::now);
    }

    /// A breaker held a send back.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn send_refused(&self, transport: &str) {
        #[cfg(feature = "metrics")]
        match self.kept(transport) {
            Some(handles) => handles.sends(REFUSED).increment(1),
            None => counter!(
                SENDS_TOTAL,
                "transport" => transport.to_owned(),
                "outcome" => OUTCOMES[REFUSED]
            )
            .increment(1),
        }
    }

    /// A send the breaker let go has its answer: `counted` is how the breaker counted it
    /// (`None`: not at all), `started` when it went (read when [`times_sends`](Self::times_sends)
    /// or slow calls count). The clock is read again only for a histogram that keeps it.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn send_finished(
        &self,
        transport: &str,
        counted: Option<Outcome>,
        started: Option<Instant>,
    ) {
        #[cfg(feature = "metrics")]
        {
            let outcome = outcome_index(counted);
            match self.kept(transport) {
                // The histogram first: its value reads the clock, and the send ends there,
                // not after the counter's add.
                Some(handles) => {
                    handles.seconds().histogram.record(Took(started));
                    handles.sends(outcome).increment(1);
                }
                None => {
                    histogram!(SEND_SECONDS, "transport" => transport.to_owned())
                        .record(Took(started));
                    let outcome = OUTCOMES[outcome];
                    counter!(SENDS_TOTAL, "transport" => transport.to_owned(), "outcome" => outcome)
                        .increment(1);
                }
            }
        }
    }

    /// A send let go on the clean path (closed, nothing counted, no slow calls) has its
    /// answer, counted as `outcome`; it went at `started`.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn clean_finished(&self, transport: &str, outcome: Outcome, started: CleanStart) {
        #[cfg(feature = "metrics")]
        self.send_finished(transport, Some(outcome), started);
    }

    /// The breaker of `transport` changed state.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn transition(&self, transport: &str, transition: Transition) {
        #[cfg(feature = "metrics")]
        {
            let moved = |count: &Counter, open: &Gauge| {
                count.increment(1);
                match (transition.from, transition.to) {
                    (_, State::Open) => open.increment(1.0),
                    (State::Open, _) => open.decrement(1.0),
                    _ => {}
                }
            };
            match self.kept(transport) {
                Some(handles) => moved(handles.transitions(transition), handles.open()),
                None => moved(&transitions(transport, transition), &open(transport)),
            }
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::sync::Arc;

    use metrics_util::debugging::DebuggingRecorder;

    use super::Recording;

    #[test]
    fn a_send_is_timed_only_when_the_recorder_keeps_its_duration() {
        let transport: Arc<str> = Arc::from("primary");
        let unrecorded = Recording::new(&transport);
        assert!(
            !unrecorded.times_sends("primary"),
            "no recorder: the histogram is a no-op, no clock to read"
        );
        let recorder = DebuggingRecorder::new();
        let recorded = metrics::with_local_recorder(&recorder, || {
            let recorded = Recording::new(&transport);
            assert!(recorded.times_sends("primary"));
            recorded
        });
        assert!(
            recorded.times_sends("primary"),
            "the kept handle still wants the durations"
        );
        assert!(
            recorded.times_sends("renamed"),
            "a name without kept handles is timed, its handle taken at the end"
        );
    }
}
