//! [`StateChange`], and telling the listener and the logs about it.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use super::recording::Recording;
use crate::machine::{Counting, State, Transition, Transitions};
use crate::store::Reporter;

/// A listener for changes of state, set with
/// [`CircuitBreakerBuilder::on_state_change`](crate::breaker::CircuitBreakerBuilder::on_state_change).
pub(crate) type Listener = Arc<dyn Fn(&StateChange) + Send + Sync>;

/// One breaker changed state.
///
/// ```
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, State};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let breaker = CircuitBreakerTransport::builder(stub)
///     .on_state_change(|change| {
///         if change.to == State::Open {
///             eprintln!("{} stopped sending to {}", change.transport, change.key);
///         }
///     })
///     .build()
///     .unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateChange {
    /// The breaker's key: the transport's name under `Scope::Transport`, else the scope's key.
    pub key: String,
    /// The state it left.
    pub from: State,
    /// The state it entered.
    pub to: State,
    /// The name of the transport the breaker guards.
    pub transport: String,
}

/// A change of state a breaker remembers, with why it happened, from
/// [`recent_changes`](crate::CircuitBreakerTransport::recent_changes): for an operator's page.
///
/// ```
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, State};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let breaker = CircuitBreakerTransport::new(stub);
/// breaker.isolate().await;
/// let change = &breaker.recent_changes()[0];
/// assert_eq!((change.from, change.to), (State::Closed, State::Open));
/// assert_eq!(change.reason, "isolated by hand");
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecentChange {
    /// The breaker's key: the transport's name under `Scope::Transport`, else the scope's key.
    pub key: String,
    /// The state it left.
    pub from: State,
    /// The state it entered (an isolated breaker is open).
    pub to: State,
    /// When this process saw the change.
    pub at: SystemTime,
    /// Why, in words: the counting rule that opened it, a probe's outcome, or an operator's
    /// hand.
    pub reason: String,
}

/// How many changes a breaker remembers, over all its keys.
const REMEMBERED: usize = 20;

/// The last changes of one breaker, newest last; written only when the state changes, so a
/// healthy breaker never takes its lock.
#[derive(Debug)]
pub(crate) struct History {
    changes: Mutex<VecDeque<RecentChange>>,
    /// Why a closed breaker opens, from its counting rule.
    tripped: String,
}

impl History {
    pub(crate) fn new(counting: &Counting) -> History {
        let tripped = match counting {
            Counting::Consecutive { threshold } => format!("{threshold} failures in a row"),
            Counting::ErrorRate(rate) => format!(
                "failures reached {} % of at least {} sends within {:?}",
                rate.threshold_percent, rate.minimum_requests, rate.window
            ),
        };
        History {
            changes: Mutex::new(VecDeque::with_capacity(REMEMBERED)),
            tripped,
        }
    }

    /// Remembers a change the breaker made by its rules.
    fn changed(&self, key: &str, transition: Transition) {
        let reason = match (transition.from, transition.to) {
            (State::Closed, State::Open) => self.tripped.as_str(),
            (State::Open, State::HalfOpen) => "the open time passed: a probe may go",
            (State::HalfOpen, State::Closed) => "the probes succeeded",
            (State::HalfOpen, State::Open) => "a probe failed or passed its deadline",
            _ => "",
        };
        self.remember(key, transition.from, transition.to, reason);
    }

    /// Remembers an operator's isolation or reset, which may change no state (isolating an
    /// open breaker keeps it open).
    pub(crate) fn by_hand(&self, key: &str, transitions: Transitions, isolated: bool) {
        let (reason, to) = if isolated {
            ("isolated by hand", State::Open)
        } else {
            ("reset by hand", State::Closed)
        };
        let from = transitions.iter().next().map_or(to, |change| change.from);
        self.remember(key, from, to, reason);
    }

    fn remember(&self, key: &str, from: State, to: State, reason: &str) {
        let mut changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        if changes.len() == REMEMBERED {
            changes.pop_front();
        }
        changes.push_back(RecentChange {
            key: key.to_owned(),
            from,
            to,
            at: SystemTime::now(),
            reason: reason.to_owned(),
        });
    }

    /// The changes remembered, newest first.
    pub(crate) fn recent(&self) -> Vec<RecentChange> {
        let changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        changes.iter().rev().cloned().collect()
    }
}

/// The reporter a breaker gives its store for changes it learns of late (see [`Reporter`]):
/// they are logged, remembered and told to the listener like any other.
pub(crate) fn reporter(
    listener: Option<Listener>,
    recording: Recording,
    transport: Arc<str>,
    shadow: bool,
    history: Arc<History>,
) -> Reporter {
    Reporter::new(move |key, transitions| {
        announce(
            listener.as_ref(),
            &recording,
            &transport,
            key,
            transitions,
            shadow,
            Some(&history),
        )
    })
}

/// Logs and records each change, remembers it in `history` (`None` when the caller remembered
/// it with its own reason), and tells the listener, which may panic without stopping anything.
///
/// In shadow mode each change also says, once, what the breaker would now refuse.
pub(crate) fn announce(
    listener: Option<&Listener>,
    recording: &Recording,
    transport: &str,
    key: &str,
    transitions: Transitions,
    shadow: bool,
    history: Option<&History>,
) {
    for transition in transitions.iter() {
        recording.transition(transport, transition);
        if let Some(history) = history {
            history.changed(key, transition);
        }
        let (from, to) = (transition.from.as_str(), transition.to.as_str());
        match transition.to {
            State::Open => tracing::warn!(transport, key, from, to, "breaker.open"),
            State::HalfOpen => tracing::info!(transport, key, from, to, "breaker.half_open"),
            State::Closed => tracing::info!(transport, key, from, to, "breaker.closed"),
        }
        if shadow {
            let would = match transition.to {
                State::Open => "refuse every send until a probe may go",
                State::HalfOpen => "let one probe through and refuse the others",
                State::Closed => "let every send through again",
            };
            tracing::info!(
                transport,
                key,
                to,
                would,
                "breaker.shadow: shadow mode lets every send through; an enforcing breaker would now do what `would` says"
            );
        }
        let Some(listener) = listener else { continue };
        let change = StateChange {
            key: key.to_owned(),
            from: transition.from,
            to: transition.to,
            transport: transport.to_owned(),
        };
        if catch_unwind(AssertUnwindSafe(|| listener(&change))).is_err() {
            tracing::error!(
                transport,
                key,
                "breaker.listener_panicked: on_state_change panicked; sending goes on"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::{
        Category, CircuitBreakerTransport, Envelope, Receipt, SendError, State, Transport,
    };

    /// A provider that fails while `down` is set.
    struct Provider {
        down: AtomicBool,
    }

    #[async_trait::async_trait]
    impl Transport for Provider {
        fn name(&self) -> &str {
            "provider"
        }

        async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
            if self.down.load(Ordering::SeqCst) {
                Err(SendError::new(Category::Network, "test.down", "down"))
            } else {
                Ok(Receipt::new("provider"))
            }
        }
    }

    fn breaker() -> CircuitBreakerTransport<Provider> {
        let provider = Provider {
            down: AtomicBool::new(true),
        };
        CircuitBreakerTransport::builder(provider)
            .failure_threshold(2)
            .reset_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    }

    fn message() -> crate::Message {
        lettre::Message::builder()
            .from("app@example.com".parse().unwrap())
            .to("user@example.org".parse().unwrap())
            .body(String::from("hello"))
            .unwrap()
    }

    /// The remembered changes, oldest first, as (from, to, reason).
    fn told(breaker: &CircuitBreakerTransport<Provider>) -> Vec<(State, State, String)> {
        let mut changes: Vec<_> = breaker
            .recent_changes()
            .into_iter()
            .map(|change| (change.from, change.to, change.reason))
            .collect();
        changes.reverse();
        changes
    }

    #[tokio::test(start_paused = true)]
    async fn each_change_of_state_is_remembered_with_why_it_happened() {
        let breaker = breaker();
        for _ in 0..2 {
            let _ = breaker.send(&message()).await;
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        breaker.inner().down.store(false, Ordering::SeqCst);
        breaker.send(&message()).await.unwrap();
        let said = |from, to, why: &str| (from, to, why.to_owned());
        assert_eq!(
            told(&breaker),
            [
                said(State::Closed, State::Open, "2 failures in a row"),
                said(
                    State::Open,
                    State::HalfOpen,
                    "the open time passed: a probe may go"
                ),
                said(State::HalfOpen, State::Closed, "the probes succeeded"),
            ]
        );
        assert!(
            breaker
                .recent_changes()
                .iter()
                .all(|change| change.key == "provider")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_is_remembered_as_the_reason_the_breaker_reopened() {
        let breaker = breaker();
        for _ in 0..2 {
            let _ = breaker.send(&message()).await;
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        let _ = breaker.send(&message()).await;
        let last = &breaker.recent_changes()[0];
        assert_eq!((last.from, last.to), (State::HalfOpen, State::Open));
        assert_eq!(last.reason, "a probe failed or passed its deadline");
    }

    #[tokio::test]
    async fn isolating_and_resetting_by_hand_are_remembered_even_when_the_state_stays() {
        let breaker = breaker();
        for _ in 0..2 {
            let _ = breaker.send(&message()).await;
        }
        breaker.isolate().await; // open already: no change of state
        breaker.reset().await;
        breaker.reset().await; // closed already
        let said = |from, to, why: &str| (from, to, why.to_owned());
        assert_eq!(
            told(&breaker),
            [
                said(State::Closed, State::Open, "2 failures in a row"),
                said(State::Open, State::Open, "isolated by hand"),
                said(State::Open, State::Closed, "reset by hand"),
                said(State::Closed, State::Closed, "reset by hand"),
            ]
        );
    }

    #[tokio::test]
    async fn a_breaker_remembers_only_its_last_twenty_changes_newest_first() {
        let breaker = breaker();
        for _ in 0..15 {
            breaker.isolate().await;
            breaker.reset().await;
        }
        let changes = breaker.recent_changes();
        assert_eq!(changes.len(), 20);
        assert_eq!(changes[0].reason, "reset by hand");
        assert_eq!(changes[1].reason, "isolated by hand");
        assert!(changes.windows(2).all(|pair| pair[0].at >= pair[1].at));
    }

    #[test]
    fn under_an_error_rate_the_reason_names_the_rate_the_window_and_the_fewest_sends() {
        let rate = crate::ErrorRate {
            threshold_percent: 40,
            minimum_requests: 10,
            window: Duration::from_secs(30),
            ..crate::ErrorRate::default()
        };
        let history = super::History::new(&crate::machine::Counting::ErrorRate(rate));
        assert_eq!(
            history.tripped,
            "failures reached 40 % of at least 10 sends within 30s"
        );
    }
}
