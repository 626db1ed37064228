//! Property test: the breaker's state machine agrees with a reference model on every
//! decision, retry_after, state, period and change of state, over random sequences of time
//! steps, sends, results, drops and looks.
//!
//! The model is written from the rules of DESIGN §3, not from `Machine`: it keeps the history
//! the rules speak of (when the breaker opened, when the probe went, every result since the
//! breaker last closed) and asks each rule of it in turn. Time rules apply before every
//! event, whatever the event: that is how the rules read ("a probe that has not answered
//! within probe_timeout is a failed probe"), and it is what caught a probe released after its
//! deadline freeing its slot instead of reopening the breaker.
//!
//! Operating rules (DESIGN §8) are in it too: isolate holds the breaker open until reset, reset
//! closes it and clears its counts, and each reopening without a close in between doubles the
//! open time up to `max_reset_timeout`.

use std::time::Duration;

use mail_breaker::State;
use mail_breaker::breaker::{
    Counting, Decision, ErrorRate, Machine, Outcome, Permit, Rules, Transition, Transitions,
};
use proptest::prelude::*;
use tokio::time::Instant;

/// What the rules keep track of, in whole milliseconds since the breaker was made.
#[derive(Debug)]
enum Standing {
    /// Every result since the breaker last closed (or was made): (time, failed).
    Closed { results: Vec<(u64, bool)> },
    /// Opened at `since` for `open_for`; sends are refused until then.
    Open { since: u64, open_for: u64 },
    /// Held open by hand until reset.
    Isolated,
    /// Probing: `probe` is the one send out, with the time it went; `successes` in a row.
    HalfOpen {
        probe: Option<(u64, u64)>,
        successes: u32,
    },
}

#[derive(Debug)]
struct Model {
    rules: Rules,
    standing: Standing,
    /// Changes of state so far: a result counts only if sent in the current one.
    changes_so_far: u64,
    /// The identity of the next probe (the model's own numbering).
    next_probe: u64,
    /// Changes of state made by the current event.
    heard: Vec<(State, State)>,
    /// Openings since the breaker last closed.
    openings: u32,
    /// Resets of a breaker that was closed already: they change no state, but results sent
    /// before them no longer count.
    quiet_resets: u64,
}

/// A send the model let go: the period it went in, and its probe identity if it probes.
#[derive(Debug, Clone, Copy)]
struct Sent {
    period: u64,
    probe: Option<u64>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Model {
    fn new(rules: Rules) -> Self {
        Model {
            rules,
            standing: Standing::Closed {
                results: Vec::new(),
            },
            changes_so_far: 0,
            next_probe: 1,
            heard: Vec::new(),
            openings: 0,
            quiet_resets: 0,
        }
    }

    /// The period a send is in: results count only in the one they were sent in.
    fn period(&self) -> u64 {
        self.changes_so_far + self.quiet_resets
    }

    /// Rule: the open time is `reset_timeout` at the first opening since the breaker closed,
    /// twice the last at each reopening, and never more than `max_reset_timeout`.
    fn open_time(&self) -> u64 {
        let reset = ms(self.rules.reset_timeout);
        match self.rules.max_reset_timeout {
            None => reset,
            Some(longest) => {
                let mut time = reset;
                for _ in 1..self.openings {
                    time = time.saturating_mul(2);
                }
                time.min(ms(longest)).max(reset)
            }
        }
    }

    fn open_from(&mut self, since: u64) {
        if self.state() == State::Closed {
            self.openings = 0;
        }
        self.openings += 1;
        let open_for = self.open_time();
        self.change_to(Standing::Open { since, open_for });
    }

    fn state(&self) -> State {
        match self.standing {
            Standing::Closed { .. } => State::Closed,
            Standing::Open { .. } | Standing::Isolated => State::Open,
            Standing::HalfOpen { .. } => State::HalfOpen,
        }
    }

    fn change_to(&mut self, standing: Standing) {
        let from = self.state();
        self.standing = standing;
        self.heard.push((from, self.state()));
        self.changes_so_far += 1;
    }

    /// Rule: a probe that has not answered within `probe_timeout` failed; the breaker opens
    /// again from that deadline. Applies before anything else at every event.
    fn time_passes(&mut self, now: u64) {
        if let Standing::HalfOpen {
            probe: Some((_, sent_at)),
            ..
        } = self.standing
        {
            let deadline = sent_at + ms(self.rules.probe_timeout);
            if now >= deadline {
                self.open_from(deadline);
            }
        }
    }

    /// A send asks to go at `now`: `Ok(sent)` or why not.
    fn send(&mut self, now: u64) -> Result<Sent, Refusal> {
        self.time_passes(now);
        // Rule: half-open is entered on the first send once reset_timeout has passed.
        if let Standing::Open { since, open_for } = self.standing
            && now >= since + open_for
        {
            self.change_to(Standing::HalfOpen {
                probe: None,
                successes: 0,
            });
        }
        let period = self.period();
        match &mut self.standing {
            Standing::Closed { .. } => Ok(Sent {
                period,
                probe: None,
            }),
            Standing::Open { since, open_for } => Err(Refusal::For(*since + *open_for - now)),
            Standing::Isolated => Err(Refusal::Isolated),
            Standing::HalfOpen {
                probe: Some((_, sent_at)),
                ..
            } => Err(Refusal::For(*sent_at + ms(self.rules.probe_timeout) - now)),
            Standing::HalfOpen { probe, .. } => {
                let id = self.next_probe;
                self.next_probe += 1;
                *probe = Some((id, now));
                Ok(Sent {
                    period,
                    probe: Some(id),
                })
            }
        }
    }

    /// Rule: the breaker of a closed period opens on failures in a row or on the rate.
    fn should_open(&self, results: &[(u64, bool)], now: u64) -> bool {
        match self.rules.counting {
            Counting::Consecutive { threshold } => {
                let in_a_row = results.iter().rev().take_while(|(_, f)| *f).count();
                in_a_row >= threshold as usize
            }
            Counting::ErrorRate(rate) => {
                // The window is `buckets` slices of equal width, counted from the first
                // result since the breaker last closed (or was reset, or made): when the
                // breaker was made, or its Redis key written, moves no boundary.
                let width = ms(rate.window) / u64::from(rate.buckets);
                let first = results.first().map_or(now, |(t, _)| *t);
                let slice_now = (now - first) / width;
                let in_window: Vec<bool> = results
                    .iter()
                    .filter(|(t, _)| slice_now - (t - first) / width < u64::from(rate.buckets))
                    .map(|(_, failed)| *failed)
                    .collect();
                let failures = in_window.iter().filter(|f| **f).count() as u64;
                let total = in_window.len() as u64;
                total >= u64::from(rate.minimum_requests)
                    && failures * 100 >= u64::from(rate.threshold_percent) * total
            }
        }
    }

    /// The send `sent` answered at `now`.
    fn answer(&mut self, now: u64, sent: Sent, failed: bool) {
        self.time_passes(now);
        // Rule: a result counts only in the period it was sent in.
        if sent.period != self.period() {
            return;
        }
        let needed = self.rules.half_open_successes;
        match &mut self.standing {
            Standing::Closed { results } if sent.probe.is_none() => {
                results.push((now, failed));
                let results = std::mem::take(results);
                if self.should_open(&results, now) {
                    self.open_from(now);
                } else {
                    self.standing = Standing::Closed { results };
                }
            }
            Standing::HalfOpen { probe, successes }
                if sent.probe.is_some() && probe.map(|(id, _)| id) == sent.probe =>
            {
                if failed {
                    self.open_from(now);
                } else {
                    *successes += 1;
                    *probe = None;
                    if *successes >= needed {
                        self.change_to(Standing::Closed {
                            results: Vec::new(),
                        });
                    }
                }
            }
            _ => {}
        }
    }

    /// The caller of `sent` stopped waiting at `now`: it decides nothing, and a probe frees
    /// its slot.
    fn drop_send(&mut self, now: u64, sent: Sent) {
        if sent.probe.is_none() {
            return; // holds nothing
        }
        self.time_passes(now);
        if sent.period != self.period() {
            return;
        }
        if let Standing::HalfOpen { probe, .. } = &mut self.standing
            && probe.map(|(id, _)| id) == sent.probe
        {
            *probe = None;
        }
    }

    /// Someone looks at the state at `now`.
    fn look(&mut self, now: u64) {
        self.time_passes(now);
    }

    /// An operator isolates the breaker: open until reset. Already open, nothing is heard.
    fn isolate(&mut self) {
        match self.standing {
            Standing::Isolated => {}
            Standing::Open { .. } => self.standing = Standing::Isolated,
            _ => self.change_to(Standing::Isolated),
        }
    }

    /// An operator resets the breaker: closed, nothing counted, the open time back to the
    /// reset timeout.
    fn reset(&mut self) {
        self.openings = 0;
        if self.state() == State::Closed {
            self.standing = Standing::Closed {
                results: Vec::new(),
            };
            self.quiet_resets += 1;
        } else {
            self.change_to(Standing::Closed {
                results: Vec::new(),
            });
        }
    }
}

/// Why the rules refuse a send.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Refusal {
    /// For this many ms.
    For(u64),
    /// Until reset.
    Isolated,
}

#[derive(Debug, Clone)]
enum Event {
    Wait(u64),
    Send,
    Answer { pick: usize, failed: bool },
    Drop { pick: usize },
    Look,
    Isolate,
    Reset,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (0u64..6_000).prop_map(Event::Wait),
        4 => Just(Event::Send),
        4 => (any::<usize>(), prop::bool::weighted(0.6)).prop_map(|(pick, failed)| Event::Answer { pick, failed }),
        2 => any::<usize>().prop_map(|pick| Event::Drop { pick }),
        1 => Just(Event::Look),
        1 => prop_oneof![9 => Just(Event::Look), 1 => Just(Event::Isolate)],
        1 => prop_oneof![4 => Just(Event::Look), 1 => Just(Event::Reset)],
    ]
}

fn rules() -> impl Strategy<Value = Rules> {
    let counting = prop_oneof![
        (1u32..6).prop_map(|threshold| Counting::Consecutive { threshold }),
        (1u8..=100, 1u32..12, 1u64..20, 1u32..10).prop_map(
            |(threshold_percent, minimum_requests, secs, buckets)| {
                Counting::ErrorRate(mail_breaker::ErrorRate {
                    threshold_percent,
                    minimum_requests,
                    // Whole milliseconds per bucket, so the model's integer slices line up.
                    window: Duration::from_millis(
                        secs * 1000 / u64::from(buckets) * u64::from(buckets),
                    ),
                    buckets,
                })
            }
        ),
    ];
    let longest = prop::option::of(0u64..200);
    (counting, 1u64..30, 1u64..30, 1u32..4, longest).prop_map(
        |(counting, reset, probe, successes, longest)| Rules {
            counting,
            reset_timeout: Duration::from_secs(reset),
            probe_timeout: Duration::from_secs(probe),
            half_open_successes: successes,
            // Never below the reset timeout: the builder refuses that.
            max_reset_timeout: longest.map(|extra| Duration::from_secs(reset + extra)),
        },
    )
}

fn changes(transitions: impl Iterator<Item = Transition>) -> Vec<(State, State)> {
    transitions.map(|t| (t.from, t.to)).collect()
}

/// 10,000 sequences, unless `PROPTEST_CASES` asks for another number (scripts/mutants.sh asks
/// for fewer, to test hundreds of mutants in hours).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(10_000)
}

#[test]
fn each_state_is_named_in_snake_case_as_logs_and_metrics_show_it() {
    for (state, name) in [
        (State::Closed, "closed"),
        (State::Open, "open"),
        (State::HalfOpen, "half_open"),
    ] {
        assert_eq!(state.as_str(), name);
        assert_eq!(state.to_string(), name);
    }
}

/// One failure opens it for a second.
fn rules_for_tests() -> Rules {
    Rules {
        counting: Counting::Consecutive { threshold: 1 },
        reset_timeout: Duration::from_secs(1),
        probe_timeout: Duration::from_secs(1),
        half_open_successes: 1,
        max_reset_timeout: None,
    }
}

#[test]
fn transitions_are_empty_only_while_nothing_changed() {
    let rules = rules_for_tests();
    let now = Instant::now();
    let mut machine = Machine::new(&rules, now);
    assert!(Transitions::NONE.is_empty());
    assert!(
        machine.reset().is_empty(),
        "resetting a closed breaker changes nothing"
    );
    let tripped = machine.trip(&rules, now);
    assert!(!tripped.is_empty());
    assert_eq!(changes(tripped.iter()), [(State::Closed, State::Open)]);
}

#[test]
fn the_open_streak_counts_the_openings_since_the_breaker_last_closed() {
    let rules = rules_for_tests();
    let mut now = Instant::now();
    let mut machine = Machine::new(&rules, now);
    assert_eq!(machine.open_streak(), 0);
    machine.trip(&rules, now);
    assert_eq!(machine.open_streak(), 1);
    // Its probe fails: open again, the streak grows.
    now += rules.reset_timeout;
    let Decision::Send(probe) = machine.acquire(&rules, now).0 else {
        panic!("the probe goes once the reset timeout has passed");
    };
    machine.record(&rules, now, probe, Outcome::Failure);
    assert_eq!(machine.open_streak(), 2);
    // Its next probe succeeds: closed, the streak is over.
    now += rules.open_time(2);
    let Decision::Send(probe) = machine.acquire(&rules, now).0 else {
        panic!("the probe goes once the open time has passed");
    };
    machine.record(&rules, now, probe, Outcome::Success);
    assert_eq!(machine.state(), State::Closed);
    assert_eq!(machine.open_streak(), 0);
}

/// A machine whose reset timeout has just passed after it tripped, under rules that close it
/// after two successful probes; with those rules and the time now.
fn half_open_needing_two_successes() -> (Rules, Machine, Instant) {
    let rules = Rules {
        half_open_successes: 2,
        ..rules_for_tests()
    };
    let tripped = Instant::now();
    let mut machine = Machine::new(&rules, tripped);
    machine.trip(&rules, tripped);
    let now = tripped + rules.reset_timeout;
    (rules, machine, now)
}

#[test]
fn each_probe_of_a_half_open_period_has_a_number_of_its_own() {
    let (rules, mut machine, now) = half_open_needing_two_successes();
    let Decision::Send(first) = machine.acquire(&rules, now).0 else {
        panic!("the first probe goes once the reset timeout has passed");
    };
    assert!(machine.has_probe_in_flight());
    machine.record(&rules, now, first, Outcome::Success);
    assert!(!machine.has_probe_in_flight());
    assert_eq!(machine.state(), State::HalfOpen, "one of two successes");
    let Decision::Send(second) = machine.acquire(&rules, now).0 else {
        panic!("the second probe goes once the first succeeded");
    };
    assert_eq!(first.period(), second.period());
    assert_eq!((first.probe(), second.probe()), (Some(1), Some(2)));
}

#[test]
fn only_the_current_probe_counts_in_half_open() {
    let (rules, mut machine, now) = half_open_needing_two_successes();
    let probe = |machine: &mut Machine| match machine.acquire(&rules, now).0 {
        Decision::Send(permit) => permit,
        refused => panic!("the probe's slot is free, not {refused:?}"),
    };
    // A probe given back, then its answer after all: the next probe's slot is not its own.
    let given_back = probe(&mut machine);
    machine.release(&rules, now, given_back);
    let current = probe(&mut machine);
    machine.record(&rules, now, given_back, Outcome::Failure);
    assert_eq!(machine.state(), State::HalfOpen);
    assert!(machine.has_probe_in_flight());
    // The current probe succeeds once; the same answer told twice counts once.
    machine.record(&rules, now, current, Outcome::Success);
    machine.record(&rules, now, current, Outcome::Success);
    assert_eq!(
        machine.state(),
        State::HalfOpen,
        "one of the two successes it needs"
    );
    let next = probe(&mut machine);
    machine.record(&rules, now, next, Outcome::Success);
    assert_eq!(machine.state(), State::Closed);
}

#[test]
fn in_a_row_the_calls_counted_are_the_results_that_changed_the_count() {
    let rules = Rules {
        counting: Counting::Consecutive { threshold: 3 },
        ..rules_for_tests()
    };
    let now = Instant::now();
    let mut machine = Machine::new(&rules, now);
    let answer = |machine: &mut Machine, outcome| {
        let Decision::Send(permit) = machine.acquire(&rules, now).0 else {
            panic!("a closed breaker lets every send through");
        };
        machine.record(&rules, now, permit, outcome);
        let snapshot = machine.snapshot("p", &rules, now).0;
        (snapshot.calls(), snapshot.failures())
    };
    assert_eq!(
        answer(&mut machine, Outcome::Success),
        (0, 0),
        "nothing to change"
    );
    assert_eq!(answer(&mut machine, Outcome::Failure), (1, 1));
    assert_eq!(
        answer(&mut machine, Outcome::Success),
        (2, 0),
        "it ended a run"
    );
    assert_eq!(
        answer(&mut machine, Outcome::Success),
        (2, 0),
        "nothing to change"
    );
}

#[test]
fn a_result_leaves_the_error_rate_window_as_soon_as_its_slice_is_a_whole_window_old() {
    let rules = Rules {
        counting: Counting::ErrorRate(ErrorRate {
            threshold_percent: 50,
            minimum_requests: 20, // so that one failure opens nothing
            window: Duration::from_secs(10),
            buckets: 10,
        }),
        ..rules_for_tests()
    };
    let start = Instant::now();
    let mut machine = Machine::new(&rules, start);
    let Decision::Send(permit) = machine.acquire(&rules, start).0 else {
        panic!("a closed breaker lets every send through");
    };
    machine.record(&rules, start, permit, Outcome::Failure);
    let failures_at = |machine: &mut Machine, at| machine.snapshot("p", &rules, at).0.failures();
    // The failure's one-second slice is the window's oldest for nine seconds more.
    assert_eq!(
        failures_at(&mut machine, start + Duration::from_millis(9_999)),
        1
    );
    assert_eq!(
        failures_at(&mut machine, start + Duration::from_secs(10)),
        0
    );
}

#[test]
fn nothing_is_counted_until_a_failure_and_again_after_a_success_in_a_row() {
    let rules = Rules {
        counting: Counting::Consecutive { threshold: 3 },
        ..rules_for_tests()
    };
    let now = Instant::now();
    let mut machine = Machine::new(&rules, now);
    assert!(machine.has_nothing_counted());
    let send = |machine: &mut Machine| match machine.acquire(&rules, now).0 {
        Decision::Send(permit) => permit,
        refused => panic!("a closed breaker lets every send through, not {refused:?}"),
    };
    let permit = send(&mut machine);
    machine.record(&rules, now, permit, Outcome::Failure);
    assert!(!machine.has_nothing_counted());
    let permit = send(&mut machine);
    machine.record(&rules, now, permit, Outcome::Success);
    assert!(machine.has_nothing_counted());
}

#[test]
fn under_an_error_rate_any_result_in_the_window_is_counted() {
    let rules = Rules {
        counting: Counting::ErrorRate(ErrorRate::default()),
        ..rules_for_tests()
    };
    let now = Instant::now();
    let mut machine = Machine::new(&rules, now);
    assert!(machine.has_nothing_counted());
    let Decision::Send(permit) = machine.acquire(&rules, now).0 else {
        panic!("a closed breaker lets every send through");
    };
    machine.record(&rules, now, permit, Outcome::Success);
    assert!(!machine.has_nothing_counted());
}

#[test]
fn a_reporter_is_told_only_of_changes() {
    let told = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&told);
    let reporter = mail_breaker::store::Reporter::new(move |_key, _transitions| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    reporter.report("smtp", Transitions::NONE);
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 0);
    let rules = rules_for_tests();
    let now = Instant::now();
    reporter.report("smtp", Machine::new(&rules, now).trip(&rules, now));
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_machine_agrees_with_the_rules(rules in rules(), events in prop::collection::vec(event(), 1..120)) {
        let start = Instant::now();
        let mut machine = Machine::new(&rules, start);
        let mut model = Model::new(rules);
        let mut now_ms = 0u64;
        let mut outstanding: Vec<(Permit, Sent)> = Vec::new();
        for (step, event) in events.into_iter().enumerate() {
            let now = start + Duration::from_millis(now_ms);
            model.heard.clear();
            let transitions = match event {
                Event::Wait(ms) => {
                    now_ms += ms;
                    continue;
                }
                Event::Send => {
                    let (decision, transitions) = machine.acquire(&rules, now);
                    match (decision, model.send(now_ms)) {
                        (Decision::Send(permit), Ok(sent)) => {
                            prop_assert_eq!(permit.period(), sent.period, "step {}: period", step);
                            prop_assert_eq!(permit.is_probe(), sent.probe.is_some(), "step {}: probe", step);
                            outstanding.push((permit, sent));
                        }
                        (Decision::Refuse { retry_after }, Err(Refusal::For(wait))) => {
                            prop_assert_eq!(retry_after, Duration::from_millis(wait), "step {}", step);
                        }
                        (Decision::Isolated, Err(Refusal::Isolated)) => {}
                        (got, want) => prop_assert!(false, "step {}: machine {:?}, rules {:?}", step, got, want),
                    }
                    transitions
                }
                Event::Answer { pick, failed } => {
                    if outstanding.is_empty() {
                        continue;
                    }
                    let (permit, sent) = outstanding.remove(pick % outstanding.len());
                    let outcome = if failed { Outcome::Failure } else { Outcome::Success };
                    model.answer(now_ms, sent, failed);
                    machine.record(&rules, now, permit, outcome)
                }
                Event::Drop { pick } => {
                    if outstanding.is_empty() {
                        continue;
                    }
                    let (permit, sent) = outstanding.remove(pick % outstanding.len());
                    model.drop_send(now_ms, sent);
                    machine.release(&rules, now, permit)
                }
                Event::Look => {
                    model.look(now_ms);
                    machine.expire(&rules, now)
                }
                Event::Isolate => {
                    model.isolate();
                    machine.isolate()
                }
                Event::Reset => {
                    model.reset();
                    machine.reset()
                }
            };
            prop_assert_eq!(changes(transitions.iter()), model.heard.clone(), "step {}", step);
            prop_assert_eq!(machine.state(), model.state(), "step {}", step);
            prop_assert_eq!(machine.period(), model.period(), "step {}", step);
            prop_assert_eq!(machine.is_isolated(), matches!(model.standing, Standing::Isolated), "step {}", step);
        }
    }
}
