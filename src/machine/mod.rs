//! The pure core: the breaker's rules as a state machine that takes the time and an event
//! and returns the decision and the changes of state. No I/O, no locks, no async.
//!
//! The layers build on it, each depending only downward: the stores ([`crate::store`]) hold
//! machines, the breaker's shell ([`crate::breaker`]) asks a store before each send, and the
//! wrappers (pool, retry) compose breakers.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

mod policy;

use self::policy::Counter;
pub use self::policy::{Counting, ErrorRate, MAX_BUCKETS};
use crate::time::later;

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Every send goes through; failures are counted.
    Closed,
    /// Sends are answered at once with `breaker.open`; nothing is sent.
    Open,
    /// One send at a time goes through as a probe; the others are refused.
    HalfOpen,
}

impl State {
    /// The state's name in snake case: `closed`, `open`, `half_open`.
    ///
    /// ```
    /// assert_eq!(mail_breaker::State::HalfOpen.as_str(), "half_open");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The settings a [`Machine`] decides by; the builder makes them and checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How a closed breaker counts failures.
    pub counting: Counting,
    /// How long it stays open before it lets a probe through.
    pub reset_timeout: Duration,
    /// How long a probe may take before it counts as failed.
    pub probe_timeout: Duration,
    /// How many successful probes in a row close it.
    pub half_open_successes: u32,
    /// With `Some(longest)`, each reopening without a close in between doubles the open
    /// time, from `reset_timeout` up to `longest`; `None` keeps it at `reset_timeout`.
    pub max_reset_timeout: Option<Duration>,
}

impl Rules {
    /// How long the breaker stays open at its `streak`-th opening since it last closed
    /// (1 for the first): `reset_timeout`, doubled at each reopening up to
    /// `max_reset_timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mail_breaker::breaker::Rules;
    ///
    /// let rules = Rules {
    ///     reset_timeout: Duration::from_secs(30),
    ///     max_reset_timeout: Some(Duration::from_secs(100)),
    ///     ..Rules::default()
    /// };
    /// assert_eq!(rules.open_time(1), Duration::from_secs(30));
    /// assert_eq!(rules.open_time(2), Duration::from_secs(60));
    /// assert_eq!(rules.open_time(3), Duration::from_secs(100));
    /// assert_eq!(Rules::default().open_time(7), Duration::from_secs(30));
    /// ```
    pub fn open_time(&self, streak: u32) -> Duration {
        let Some(longest) = self.max_reset_timeout else {
            return self.reset_timeout;
        };
        let doublings = streak.saturating_sub(1);
        let grown = 1u32
            .checked_shl(doublings)
            .and_then(|factor| self.reset_timeout.checked_mul(factor))
            .unwrap_or(Duration::MAX);
        grown.min(longest).max(self.reset_timeout)
    }
}

impl Default for Rules {
    /// 5 failures in a row, 30 s reset and probe timeouts, 1 probe.
    fn default() -> Self {
        Rules {
            counting: Counting::Consecutive { threshold: 5 },
            reset_timeout: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(30),
            half_open_successes: 1,
            max_reset_timeout: None,
        }
    }
}

/// Leave to send one message, and the period it was given in.
///
/// Give it back with its result through [`Machine::record`], or through
/// [`Machine::release`] when the send was abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permit {
    period: u64,
    probe: Option<u64>,
}

impl Permit {
    /// A permit given in `period`, as the probe numbered `probe` if it is one. For stores that
    /// keep their state elsewhere and rebuild permits from it.
    pub fn new(period: u64, probe: Option<u64>) -> Self {
        Permit { period, probe }
    }

    /// The period of the breaker the permit was given in; a result from another period counts for nothing.
    pub fn period(&self) -> u64 {
        self.period
    }

    /// The probe's number, if this permit is the half-open breaker's probe.
    pub fn probe(&self) -> Option<u64> {
        self.probe
    }

    /// Whether this permit is the half-open breaker's probe.
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }
}

/// What the breaker says to one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send it, and report the result with this permit.
    Send(Permit),
    /// Do not send; try again after `retry_after`.
    Refuse {
        /// The time until the breaker may let a send through.
        retry_after: Duration,
    },
    /// Do not send: the breaker was isolated by hand and stays open until it is reset.
    Isolated,
}

/// How a send went, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The provider worked (delivered, or refused this one message).
    Success,
    /// The provider failed.
    Failure,
}

/// One change of state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transition {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
}

/// The changes of state one event made, oldest first (at most two: a probe that expired
/// reopens the breaker, and the same call may find the new reset timeout passed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transitions {
    items: [Option<Transition>; 2],
}

impl Transitions {
    /// No change.
    pub const NONE: Transitions = Transitions {
        items: [None, None],
    };

    /// Adds a change after the others. A third change in one event is a broken store.
    pub fn push(&mut self, transition: Transition) {
        if let Some(slot) = self.items.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some(transition);
        } else {
            debug_assert!(false, "more than two transitions in one event");
        }
    }

    /// The changes, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Transition> + '_ {
        self.items.iter().flatten().copied()
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.items[0].is_none()
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    /// Open until reset, whatever the time: no probe goes.
    Isolated,
    HalfOpen {
        probe: Option<Probe>,
        successes: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    number: u64,
    deadline: Instant,
}

/// What one breaker knows, for an operator: its state, what it counted, and when it may let
/// a probe go. Taken with `CircuitBreakerTransport::snapshot`, `snapshot_of` and `snapshots`.
///
/// ```
/// use tokio::time::Instant;
/// use mail_breaker::breaker::{Machine, Rules};
/// use mail_breaker::State;
///
/// let rules = Rules::default();
/// let mut machine = Machine::new(&rules, Instant::now());
/// let (snapshot, _) = machine.snapshot("smtp://relay:25", &rules, Instant::now());
/// assert_eq!(snapshot.key(), "smtp://relay:25");
/// assert_eq!(snapshot.state(), State::Closed);
/// assert_eq!((snapshot.failures(), snapshot.calls()), (0, 0));
/// assert_eq!(snapshot.failure_rate(), None); // counted in a row, not as a rate
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    key: String,
    state: State,
    isolated: bool,
    failures: u32,
    calls: u32,
    failure_rate: Option<f64>,
    retry_after: Option<Duration>,
    open_streak: u32,
}

impl Snapshot {
    /// A snapshot from its parts, for a store that keeps state elsewhere and reads it back.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        key: impl Into<String>,
        state: State,
        isolated: bool,
        failures: u32,
        calls: u32,
        failure_rate: Option<f64>,
        retry_after: Option<Duration>,
        open_streak: u32,
    ) -> Self {
        Snapshot {
            key: key.into(),
            state,
            isolated,
            failures,
            calls,
            failure_rate,
            retry_after,
            open_streak,
        }
    }

    /// The breaker's key: the transport's name, or a recipient domain.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Its state; an isolated breaker is open.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether it is held open by hand until reset.
    pub fn is_isolated(&self) -> bool {
        self.isolated
    }

    /// Failures counted: in a row, or in the window under error-rate counting.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Results counted: in the window under error-rate counting; under consecutive counting,
    /// since the breaker last closed, the results that changed the count (each failure, and
    /// each success that ended a run of failures: a success while nothing is counted changes
    /// nothing, so a healthy breaker costs nothing to keep).
    pub fn calls(&self) -> u32 {
        self.calls
    }

    /// Under error-rate counting, the share of failures in the window (0.0 to 1.0), `None`
    /// while the window is empty or when counting in a row.
    pub fn failure_rate(&self) -> Option<f64> {
        self.failure_rate
    }

    /// While open, the time until a probe may go; while a probe is out, the time until its
    /// deadline; `None` when a send may go now, or while isolated.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Openings since the breaker last closed: what doubles the open time under
    /// `max_reset_timeout`.
    pub fn open_streak(&self) -> u32 {
        self.open_streak
    }
}

/// One breaker's state: the rules of DESIGN §3 as plain synchronous code.
///
/// Every method takes the time it acts at, so tests drive it without a clock and stores
/// other than memory can replay it.
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use mail_breaker::breaker::{Decision, Machine, Outcome, Rules};
/// use mail_breaker::State;
///
/// let rules = Rules::default(); // 5 failures in a row, 30 s
/// let start = Instant::now();
/// let mut machine = Machine::new(&rules, start);
/// for _ in 0..5 {
///     let (Decision::Send(permit), _) = machine.acquire(&rules, start) else { unreachable!() };
///     machine.record(&rules, start, permit, Outcome::Failure);
/// }
/// assert_eq!(machine.state(), State::Open);
/// let (decision, _) = machine.acquire(&rules, start + Duration::from_secs(10));
/// assert_eq!(decision, Decision::Refuse { retry_after: Duration::from_secs(20) });
/// ```
#[derive(Debug, Clone)]
pub struct Machine {
    phase: Phase,
    counter: Counter,
    period: u64,
    probes_given: u64,
    /// Openings since the breaker last closed: the open time grows with it.
    open_streak: u32,
}

impl Machine {
    /// A closed breaker, made at `now`. Nothing it decides depends on when it was made: an
    /// error-rate window's slices start at the first result it counts.
    pub fn new(rules: &Rules, now: Instant) -> Self {
        let _ = now; // in the signature still, for the callers written against it
        Machine::closed(rules)
    }

    /// A closed breaker, made without reading the clock (see [`new`](Self::new)).
    pub(crate) fn closed(rules: &Rules) -> Self {
        Machine {
            phase: Phase::Closed,
            counter: Counter::new(&rules.counting),
            period: 0,
            probes_given: 0,
            open_streak: 0,
        }
    }

    /// The state, as of the last event.
    pub fn state(&self) -> State {
        match self.phase {
            Phase::Closed => State::Closed,
            Phase::Open { .. } | Phase::Isolated => State::Open,
            Phase::HalfOpen { .. } => State::HalfOpen,
        }
    }

    /// Whether the breaker is held open by hand, until [`reset`](Self::reset).
    pub fn is_isolated(&self) -> bool {
        matches!(self.phase, Phase::Isolated)
    }

    /// Openings since the breaker last closed (0 while closed).
    pub fn open_streak(&self) -> u32 {
        self.open_streak
    }

    /// The current period: it moves on at every change of state, and at a [`reset`](Self::reset)
    /// of a closed breaker, so that results sent before it count for nothing.
    pub fn period(&self) -> u64 {
        self.period
    }

    /// Whether the closed breaker's count is empty: no failure in a row, nothing in the window.
    pub fn has_nothing_counted(&self) -> bool {
        self.counter.is_empty()
    }

    /// Whether a success of a send it let go while closed would change nothing: closed,
    /// with no failure in a row to clear.
    pub(crate) fn ignores_a_success(&self, rules: &Rules) -> bool {
        matches!(self.phase, Phase::Closed) && self.counter.ignores_a_success(&rules.counting)
    }

    /// Until when the breaker refuses every send, while it is open for a time.
    pub(crate) fn open_until(&self) -> Option<Instant> {
        match self.phase {
            Phase::Open { until } => Some(until),
            _ => None,
        }
    }

    /// Whether a probe is out and has not answered.
    pub fn has_probe_in_flight(&self) -> bool {
        matches!(self.phase, Phase::HalfOpen { probe: Some(_), .. })
    }

    /// Decides whether a send may go at `now`.
    pub fn acquire(&mut self, rules: &Rules, now: Instant) -> (Decision, Transitions) {
        let mut transitions = self.expire(rules, now);
        if let Phase::Open { until } = self.phase
            && now >= until
        {
            self.enter(
                Phase::HalfOpen {
                    probe: None,
                    successes: 0,
                },
                &mut transitions,
            );
        }
        let decision = match &mut self.phase {
            Phase::Closed => Decision::Send(Permit::new(self.period, None)),
            Phase::Open { until } => Decision::Refuse {
                retry_after: until.saturating_duration_since(now),
            },
            Phase::Isolated => Decision::Isolated,
            Phase::HalfOpen {
                probe: Some(probe), ..
            } => Decision::Refuse {
                retry_after: probe.deadline.saturating_duration_since(now),
            },
            Phase::HalfOpen {
                probe: probe @ None,
                ..
            } => {
                self.probes_given += 1;
                *probe = Some(Probe {
                    number: self.probes_given,
                    deadline: later(now, rules.probe_timeout),
                });
                Decision::Send(Permit::new(self.period, Some(self.probes_given)))
            }
        };
        (decision, transitions)
    }

    /// [`record`](Self::record), reading the clock (`now`) only when the result changes
    /// something: a success of a closed breaker with nothing counted in a row, by far the
    /// most common result, changes nothing and reads no clock.
    pub(crate) fn record_lazily(
        &mut self,
        rules: &Rules,
        now: impl FnOnce() -> Instant,
        permit: Permit,
        outcome: Outcome,
    ) -> Transitions {
        if outcome == Outcome::Success && permit.probe.is_none() && self.ignores_a_success(rules) {
            return Transitions::NONE;
        }
        self.record(rules, now(), permit, outcome)
    }

    /// Counts the result of a send made with `permit`, at `now`.
    pub fn record(
        &mut self,
        rules: &Rules,
        now: Instant,
        permit: Permit,
        outcome: Outcome,
    ) -> Transitions {
        let mut transitions = self.expire(rules, now);
        if permit.period != self.period {
            return transitions; // sent in an earlier period: it decides nothing
        }
        let failed = outcome == Outcome::Failure;
        match &mut self.phase {
            Phase::Closed
                if permit.probe.is_none() && self.counter.record(&rules.counting, now, failed) =>
            {
                self.open(rules, now, &mut transitions);
            }
            Phase::HalfOpen { probe, successes } if is_current_probe(probe, permit) => {
                if failed {
                    self.open(rules, now, &mut transitions);
                } else {
                    *successes += 1;
                    *probe = None;
                    if *successes >= rules.half_open_successes {
                        self.enter(Phase::Closed, &mut transitions);
                    }
                }
            }
            _ => {}
        }
        transitions
    }

    /// Forgets the send made with `permit` at `now`: its caller stopped waiting. A probe
    /// frees its slot, so the next send probes, unless its deadline has already passed: then
    /// it failed, as [`expire`](Self::expire) says, and the breaker reopens from that deadline.
    ///
    /// A permit that is not a probe holds nothing: its release changes nothing.
    pub fn release(&mut self, rules: &Rules, now: Instant, permit: Permit) -> Transitions {
        if !permit.is_probe() {
            return Transitions::NONE;
        }
        let transitions = self.expire(rules, now);
        if permit.period != self.period {
            return transitions;
        }
        if let Phase::HalfOpen { probe, .. } = &mut self.phase
            && is_current_probe(probe, permit)
        {
            *probe = None;
        }
        transitions
    }

    /// Opens a closed breaker at `now` for `reset_timeout`, as a failure would. For a store
    /// that falls back to local state while its shared state says the breaker is open, so
    /// that the fallback keeps holding sends. A breaker that is not closed is left as it is.
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use mail_breaker::breaker::{Machine, Rules};
    /// use mail_breaker::State;
    ///
    /// let rules = Rules::default();
    /// let mut machine = Machine::new(&rules, Instant::now());
    /// machine.trip(&rules, Instant::now());
    /// assert_eq!(machine.state(), State::Open);
    /// ```
    pub fn trip(&mut self, rules: &Rules, now: Instant) -> Transitions {
        let mut transitions = Transitions::NONE;
        if let Phase::Closed = self.phase {
            self.open(rules, now, &mut transitions);
        }
        transitions
    }

    /// Holds the breaker open until [`reset`](Self::reset), whatever the time: sends are
    /// answered [`Decision::Isolated`] and no probe goes. A probe in flight decides nothing.
    /// Returns the change, if it was not open already.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use mail_breaker::breaker::{Decision, Machine, Rules};
    /// use mail_breaker::State;
    ///
    /// let rules = Rules::default();
    /// let now = Instant::now();
    /// let mut machine = Machine::new(&rules, now);
    /// machine.isolate();
    /// assert_eq!(machine.state(), State::Open);
    /// let later = now + Duration::from_secs(3600);
    /// assert_eq!(machine.acquire(&rules, later).0, Decision::Isolated);
    /// machine.reset();
    /// assert!(matches!(machine.acquire(&rules, later).0, Decision::Send(_)));
    /// ```
    pub fn isolate(&mut self) -> Transitions {
        let mut transitions = Transitions::NONE;
        match self.phase {
            Phase::Isolated => {}
            // Open already: no change of state a listener could hear, and no permit is out.
            Phase::Open { .. } => self.phase = Phase::Isolated,
            Phase::Closed | Phase::HalfOpen { .. } => {
                self.enter(Phase::Isolated, &mut transitions);
            }
        }
        transitions
    }

    /// What the breaker knows at `now`, after what time alone does (with the changes that
    /// made), for an operator: see [`Snapshot`].
    pub fn snapshot(&mut self, key: &str, rules: &Rules, now: Instant) -> (Snapshot, Transitions) {
        let transitions = self.expire(rules, now);
        let retry_after = match self.phase {
            Phase::Open { until } => Some(until.saturating_duration_since(now)),
            Phase::HalfOpen {
                probe: Some(probe), ..
            } => Some(probe.deadline.saturating_duration_since(now)),
            Phase::Closed | Phase::Isolated | Phase::HalfOpen { probe: None, .. } => None,
        };
        let counted = self.counter.reading(&rules.counting, now);
        let snapshot = Snapshot {
            key: key.to_owned(),
            state: self.state(),
            isolated: self.is_isolated(),
            failures: counted.failures,
            calls: counted.calls,
            failure_rate: counted.rate,
            retry_after,
            open_streak: self.open_streak,
        };
        (snapshot, transitions)
    }

    /// Closes the breaker and clears its counts, whatever its state; a result of a send made
    /// before changes nothing. Returns the change, if it was not closed.
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use mail_breaker::breaker::{Machine, Rules};
    /// use mail_breaker::State;
    ///
    /// let rules = Rules::default();
    /// let mut machine = Machine::new(&rules, Instant::now());
    /// machine.trip(&rules, Instant::now());
    /// let changes = machine.reset();
    /// assert_eq!(machine.state(), State::Closed);
    /// assert_eq!(changes.iter().count(), 1);
    /// ```
    pub fn reset(&mut self) -> Transitions {
        let mut transitions = Transitions::NONE;
        self.open_streak = 0;
        if matches!(self.phase, Phase::Closed) {
            self.counter.reset();
            self.period += 1;
        } else {
            self.enter(Phase::Closed, &mut transitions);
        }
        transitions
    }

    /// Applies what time alone does: a probe past its deadline fails and reopens the breaker
    /// from that deadline. (Open to half-open waits for the next send.)
    pub fn expire(&mut self, rules: &Rules, now: Instant) -> Transitions {
        let mut transitions = Transitions::NONE;
        if let Phase::HalfOpen {
            probe: Some(probe), ..
        } = self.phase
            && now >= probe.deadline
        {
            self.open(rules, probe.deadline, &mut transitions);
        }
        transitions
    }

    /// Opens the breaker from `from` for the open time of its streak: the first opening
    /// since it closed waits `reset_timeout`, each reopening twice the last, up to the rules'
    /// longest.
    fn open(&mut self, rules: &Rules, from: Instant, transitions: &mut Transitions) {
        self.open_streak = if self.state() == State::Closed {
            1
        } else {
            self.open_streak.saturating_add(1)
        };
        let until = later(from, rules.open_time(self.open_streak));
        self.enter(Phase::Open { until }, transitions);
    }

    fn enter(&mut self, phase: Phase, transitions: &mut Transitions) {
        let from = self.state();
        self.phase = phase;
        self.period += 1;
        if matches!(phase, Phase::Closed) {
            // Failures counted before the breaker opened say nothing about the provider now.
            self.counter.reset();
            self.open_streak = 0;
        }
        transitions.push(Transition {
            from,
            to: self.state(),
        });
    }
}

fn is_current_probe(probe: &Option<Probe>, permit: Permit) -> bool {
    matches!((probe, permit.probe), (Some(probe), Some(number)) if probe.number == number)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_a_row(threshold: u32) -> Rules {
        Rules {
            counting: Counting::Consecutive { threshold },
            ..Rules::default()
        }
    }

    /// A closed machine made now, and now.
    fn closed_now(rules: &Rules) -> (Machine, Instant) {
        let now = Instant::now();
        (Machine::new(rules, now), now)
    }

    fn permit_of(machine: &mut Machine, rules: &Rules, now: Instant) -> Permit {
        match machine.acquire(rules, now) {
            (Decision::Send(permit), _) => permit,
            (decision, _) => panic!("expected a permit, got {decision:?}"),
        }
    }

    #[test]
    fn a_success_of_a_closed_breaker_with_nothing_counted_changes_nothing_and_reads_no_clock() {
        let rules = in_a_row(2);
        let (mut machine, now) = closed_now(&rules);
        let permit = permit_of(&mut machine, &rules, now);
        let changes = machine.record_lazily(
            &rules,
            || panic!("read the clock"),
            permit,
            Outcome::Success,
        );
        assert!(changes.is_empty());
        assert!(machine.has_nothing_counted());
        assert_eq!(machine.counter.reading(&rules.counting, now).calls, 0);
    }

    #[test]
    fn a_failure_is_counted_at_the_time_the_clock_gives() {
        let rules = in_a_row(1);
        let (mut machine, now) = closed_now(&rules);
        let permit = permit_of(&mut machine, &rules, now);
        let later = now + Duration::from_secs(7);
        machine.record_lazily(&rules, || later, permit, Outcome::Failure);
        assert_eq!(machine.open_until(), Some(later + rules.reset_timeout));
    }

    #[test]
    fn a_success_after_a_failure_in_a_row_clears_the_count() {
        let rules = in_a_row(2);
        let (mut machine, now) = closed_now(&rules);
        let first = permit_of(&mut machine, &rules, now);
        let second = permit_of(&mut machine, &rules, now);
        machine.record_lazily(&rules, || now, first, Outcome::Failure);
        machine.record_lazily(&rules, || now, second, Outcome::Success);
        assert!(machine.has_nothing_counted());
        let third = permit_of(&mut machine, &rules, now);
        machine.record_lazily(&rules, || now, third, Outcome::Failure);
        assert_eq!(
            machine.state(),
            State::Closed,
            "one failure in a row of two"
        );
    }

    #[test]
    fn a_probes_success_is_counted_even_with_nothing_counted() {
        let rules = in_a_row(1);
        let (mut machine, now) = closed_now(&rules);
        let permit = permit_of(&mut machine, &rules, now);
        machine.record(&rules, now, permit, Outcome::Failure);
        let after = now + rules.reset_timeout;
        let probe = permit_of(&mut machine, &rules, after);
        assert!(probe.is_probe());
        machine.record_lazily(&rules, || after, probe, Outcome::Success);
        assert_eq!(machine.state(), State::Closed);
    }

    #[test]
    fn a_success_under_error_rate_counting_is_counted() {
        let rules = Rules {
            counting: Counting::ErrorRate(ErrorRate {
                threshold_percent: 50,
                minimum_requests: 1,
                window: Duration::from_secs(60),
                buckets: 6,
            }),
            ..Rules::default()
        };
        let (mut machine, now) = closed_now(&rules);
        let permit = permit_of(&mut machine, &rules, now);
        machine.record_lazily(&rules, || now, permit, Outcome::Success);
        assert!(!machine.has_nothing_counted());
    }

    #[test]
    fn a_success_under_a_threshold_of_zero_opens_as_record_says() {
        let rules = in_a_row(0);
        let (mut lazy, now) = closed_now(&rules);
        let mut eager = lazy.clone();
        let permit = permit_of(&mut lazy, &rules, now);
        permit_of(&mut eager, &rules, now);
        let lazily = lazy.record_lazily(&rules, || now, permit, Outcome::Success);
        let eagerly = eager.record(&rules, now, permit, Outcome::Success);
        assert_eq!(lazily, eagerly);
        assert_eq!(lazy.state(), eager.state());
    }
}
