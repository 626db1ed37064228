//! Property test: the breaker's state machine agrees with a small reference model on every
//! decision, state and change of state, over random sequences of time steps, sends, results
//! and drops.

use std::time::Duration;

use mail_breaker::State;
use mail_breaker::breaker::{Counting, Decision, Machine, Outcome, Permit, Rules, Transition};
use proptest::prelude::*;
use tokio::time::Instant;

/// The reference model: the rules of DESIGN §3 written as plainly as possible, with time in
/// whole milliseconds and every result of the current closed period kept in a list.
#[derive(Debug)]
struct Model {
    rules: Rules,
    state: State,
    open_until: u64,
    probe: Option<(u64, u64)>, // (number, deadline)
    probes_given: u64,
    successes: u32,
    results: Vec<(u64, bool)>, // (time, failed) since the breaker last closed
    period: u64,
    changes: Vec<(State, State)>,
}

impl Model {
    fn new(rules: Rules) -> Self {
        Model {
            rules,
            state: State::Closed,
            open_until: 0,
            probe: None,
            probes_given: 0,
            successes: 0,
            results: Vec::new(),
            period: 0,
            changes: Vec::new(),
        }
    }

    fn ms(d: Duration) -> u64 {
        d.as_millis() as u64
    }

    fn go(&mut self, to: State) {
        self.changes.push((self.state, to));
        self.state = to;
        self.period += 1;
        self.probe = None;
        self.successes = 0;
        if to == State::Closed {
            self.results.clear();
        }
    }

    fn open(&mut self, from: u64) {
        self.go(State::Open);
        self.open_until = from + Self::ms(self.rules.reset_timeout);
    }

    fn expire(&mut self, now: u64) {
        if let (State::HalfOpen, Some((_, deadline))) = (self.state, self.probe)
            && now >= deadline
        {
            self.open(deadline);
        }
    }

    /// `Some((period, probe))` to send, or `None` with the wait in ms.
    fn acquire(&mut self, now: u64) -> Result<(u64, Option<u64>), u64> {
        self.expire(now);
        if self.state == State::Open && now >= self.open_until {
            self.go(State::HalfOpen);
        }
        match (self.state, self.probe) {
            (State::Closed, _) => Ok((self.period, None)),
            (State::Open, _) => Err(self.open_until - now),
            (State::HalfOpen, Some((_, deadline))) => Err(deadline - now),
            (State::HalfOpen, None) => {
                self.probes_given += 1;
                self.probe = Some((self.probes_given, now + Self::ms(self.rules.probe_timeout)));
                Ok((self.period, Some(self.probes_given)))
            }
        }
    }

    fn tripped(&self, now: u64) -> bool {
        match self.rules.counting {
            Counting::Consecutive { threshold } => {
                let in_a_row = self
                    .results
                    .iter()
                    .rev()
                    .take_while(|(_, failed)| *failed)
                    .count();
                in_a_row >= threshold as usize
            }
            Counting::ErrorRate(rate) => {
                let width = Self::ms(rate.window) / u64::from(rate.buckets);
                let current = now / width;
                let live: Vec<_> = self
                    .results
                    .iter()
                    .filter(|(t, _)| t / width + u64::from(rate.buckets) > current)
                    .collect();
                let failures = live.iter().filter(|(_, failed)| *failed).count() as u64;
                live.len() as u64 >= u64::from(rate.minimum_requests)
                    && failures * 100 >= u64::from(rate.threshold_percent) * live.len() as u64
            }
        }
    }

    fn record(&mut self, now: u64, period: u64, probe: Option<u64>, failed: bool) {
        self.expire(now);
        if period != self.period {
            return;
        }
        match (self.state, probe) {
            (State::Closed, None) => {
                self.results.push((now, failed));
                if self.tripped(now) {
                    self.open(now);
                }
            }
            (State::HalfOpen, Some(number)) if self.probe.map(|p| p.0) == Some(number) => {
                if failed {
                    self.open(now);
                } else {
                    self.successes += 1;
                    self.probe = None;
                    if self.successes >= self.rules.half_open_successes {
                        self.go(State::Closed);
                    }
                }
            }
            _ => {}
        }
    }

    fn release(&mut self, period: u64, probe: Option<u64>) {
        if period == self.period && probe.is_some() && self.probe.map(|p| p.0) == probe {
            self.probe = None;
        }
    }
}

#[derive(Debug, Clone)]
enum Event {
    Wait(u64),
    Send,
    Answer { pick: usize, failed: bool },
    Drop { pick: usize },
    Look,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (0u64..6_000).prop_map(Event::Wait),
        4 => Just(Event::Send),
        4 => (any::<usize>(), prop::bool::weighted(0.6)).prop_map(|(pick, failed)| Event::Answer { pick, failed }),
        1 => any::<usize>().prop_map(|pick| Event::Drop { pick }),
        1 => Just(Event::Look),
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
                    // Whole milliseconds per bucket, so the model's integer time slices line up.
                    window: Duration::from_millis(
                        secs * 1000 / u64::from(buckets) * u64::from(buckets),
                    ),
                    buckets,
                })
            }
        ),
    ];
    (counting, 1u64..30, 1u64..30, 1u32..4).prop_map(|(counting, reset, probe, successes)| Rules {
        counting,
        reset_timeout: Duration::from_secs(reset),
        probe_timeout: Duration::from_secs(probe),
        half_open_successes: successes,
    })
}

fn changes(transitions: impl Iterator<Item = Transition>) -> Vec<(State, State)> {
    transitions.map(|t| (t.from, t.to)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn the_machine_agrees_with_the_reference_model(rules in rules(), events in prop::collection::vec(event(), 1..120)) {
        let start = Instant::now();
        let mut machine = Machine::new(&rules, start);
        let mut model = Model::new(rules);
        let mut now_ms = 0u64;
        let mut outstanding: Vec<Permit> = Vec::new();
        for (step, event) in events.into_iter().enumerate() {
            let now = start + Duration::from_millis(now_ms);
            model.changes.clear();
            let transitions = match event {
                Event::Wait(ms) => {
                    now_ms += ms;
                    continue;
                }
                Event::Send => {
                    let (decision, transitions) = machine.acquire(&rules, now);
                    let expected = model.acquire(now_ms);
                    match (decision, expected) {
                        (Decision::Send(permit), Ok((period, probe))) => {
                            prop_assert_eq!((permit.period(), permit.probe()), (period, probe), "step {}", step);
                            outstanding.push(permit);
                        }
                        (Decision::Refuse { retry_after }, Err(wait)) => {
                            prop_assert_eq!(retry_after, Duration::from_millis(wait), "step {}", step);
                        }
                        (got, want) => prop_assert!(false, "step {}: machine {:?}, model {:?}", step, got, want),
                    }
                    transitions
                }
                Event::Answer { pick, failed } => {
                    if outstanding.is_empty() {
                        continue;
                    }
                    let permit = outstanding.remove(pick % outstanding.len());
                    let outcome = if failed { Outcome::Failure } else { Outcome::Success };
                    model.record(now_ms, permit.period(), permit.probe(), failed);
                    machine.record(&rules, now, permit, outcome)
                }
                Event::Drop { pick } => {
                    if outstanding.is_empty() {
                        continue;
                    }
                    let permit = outstanding.remove(pick % outstanding.len());
                    model.release(permit.period(), permit.probe());
                    machine.release(permit);
                    Default::default()
                }
                Event::Look => {
                    model.expire(now_ms);
                    machine.expire(&rules, now)
                }
            };
            prop_assert_eq!(changes(transitions.iter()), model.changes.clone(), "step {}", step);
            prop_assert_eq!(machine.state(), model.state, "step {}", step);
            prop_assert_eq!(machine.period(), model.period, "step {}", step);
        }
    }
}
