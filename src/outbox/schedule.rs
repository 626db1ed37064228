//! What an answer does to a queued message: sent, dead, or due again at a time. Pure: a
//! message's state and an answer in, its next state out; no clock, no I/O.

use std::time::Duration;

use crate::{Backoff, Category, SendError};

/// Milliseconds since the Unix epoch: how the outbox keeps time in its table, so that
/// workers on many machines read the same due times.
pub(crate) type Millis = i64;

/// The worker's settings that decide a message's fate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// The wait after a failure that may pass, by attempt.
    pub backoff: Backoff,
    /// The wait after a failure of the setup (credentials, configuration, a transport that
    /// cannot carry the message): someone must fix something first.
    pub setup_wait: Duration,
    /// How long a message is tried before it is dead as `outbox.expired`.
    pub max_age: Duration,
    /// Whether a message that may have reached the provider is never sent again.
    pub at_most_once: bool,
}

/// What the outbox knows of a message when its answer comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempted {
    /// When it was enqueued.
    pub enqueued_at: Millis,
    /// Attempts so far, this one included (1 after the first).
    pub attempts: u32,
    /// When the answer came.
    pub now: Millis,
}

/// A failed message's next state.
#[derive(Debug, Clone)]
pub(crate) enum Next {
    /// Never tried again; kept with its error among the dead letters.
    Dead(SendError),
    /// Tried again from `due_at`; `error` is kept as its last.
    Retry { due_at: Millis, error: SendError },
}

/// The next state of a message whose attempt failed with `error`. `delay` is the backoff's
/// wait before retry `n` (jitter applied by the caller, so that this stays deterministic).
pub(crate) fn after_failure(
    policy: &Policy,
    message: Attempted,
    error: SendError,
    delay: impl FnOnce(u32) -> Duration,
) -> Next {
    if error.is_maybe_delivered() && policy.at_most_once {
        return Next::Dead(maybe_delivered(error));
    }
    let wait = match error.category() {
        Category::Rejected | Category::InvalidMessage => return Next::Dead(error),
        Category::Authentication | Category::Configuration | Category::Unsupported => {
            policy.setup_wait
        }
        _ => delay(message.attempts),
    };
    let deadline = message.enqueued_at.saturating_add(millis(policy.max_age));
    if message.now >= deadline {
        return Next::Dead(expired(error, policy.max_age));
    }
    let wait = wait.max(error.retry_after().unwrap_or_default());
    // The last try falls on the deadline, so that a message is tried until `max_age`.
    let due_at = message.now.saturating_add(millis(wait)).min(deadline);
    Next::Retry { due_at, error }
}

/// What becomes of a message claimed again after its lease ran out: the worker that held it
/// stopped answering mid-send, so the provider may have it. `None`: send it again.
pub(crate) fn after_lost_lease(policy: &Policy) -> Option<SendError> {
    policy.at_most_once.then(|| {
        SendError::fixed(
            Category::Network,
            "outbox.maybe_delivered",
            "a worker's lease on this message ran out mid-send: the provider may have it, \
             and at_most_once forbids sending it again",
        )
    })
}

/// The dead letter of a maybe-delivered failure under `at_most_once`.
fn maybe_delivered(error: SendError) -> SendError {
    let mut dead = SendError::new(
        error.category(),
        "outbox.maybe_delivered",
        format!(
            "the provider may have the message ({}: {}), and at_most_once forbids sending it again",
            error.code(),
            error.message()
        ),
    );
    if let Some(transport) = error.transport() {
        dead = dead.with_transport(transport);
    }
    dead.with_causes(vec![error])
}

/// The dead letter of a message still failing at `max_age`.
fn expired(error: SendError, max_age: Duration) -> SendError {
    let mut dead = SendError::new(
        error.category(),
        "outbox.expired",
        format!(
            "still failing after the outbox's max_age of {max_age:?}; last error {}: {}",
            error.code(),
            error.message()
        ),
    );
    if let Some(transport) = error.transport() {
        dead = dead.with_transport(transport);
    }
    dead.with_causes(vec![error])
}

/// `duration` in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> Millis {
    Millis::try_from(duration.as_millis()).unwrap_or(Millis::MAX)
}
