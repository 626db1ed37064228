//! [`StateChange`], and telling the listener and the logs about it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::machine::{State, Transitions};
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

/// The reporter a breaker gives its store for changes it learns of late (see [`Reporter`]):
/// they are logged and told to the listener like any other.
pub(crate) fn reporter(listener: Option<Listener>, transport: Arc<str>, shadow: bool) -> Reporter {
    Reporter::new(move |key, transitions| {
        announce(listener.as_ref(), &transport, key, transitions, shadow)
    })
}

/// Logs each change and tells the listener, which may panic without stopping anything.
///
/// In shadow mode each change also says, once, what the breaker would now refuse.
pub(crate) fn announce(
    listener: Option<&Listener>,
    transport: &str,
    key: &str,
    transitions: Transitions,
    shadow: bool,
) {
    for transition in transitions.iter() {
        crate::metrics::transition(transport, transition);
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
