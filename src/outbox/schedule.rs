//! What an answer does to a queued message: sent, dead, or due again at a time. Pure: a
//! message's state and an answer in, its next state out; no clock, no I/O.

use std::time::Duration;

use crate::{Backoff, Category, Receipt, SendError};

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
    /// Sends of it that panicked so far, this one included.
    pub panics: u32,
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
    if error.code() == crate::panicked::PANICKED && message.panics >= PANICS_TO_DEAD {
        return Next::Dead(error);
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

/// Whether the worker sends again a message whose first attempt failed with `error`:
/// everything but a refusal of the message itself and, under `at_most_once`, a send that may
/// have reached the provider. `send_or_queue` keeps exactly these (DESIGN §19), so that a
/// failure the worker would retry is never lost because the stack had one member.
pub(crate) fn sends_again(error: &SendError, at_most_once: bool) -> bool {
    !(matches!(
        error.category(),
        Category::Rejected | Category::InvalidMessage
    ) || (at_most_once && error.is_maybe_delivered()))
}

/// What a delivery that reached some recipients and not others leaves owed (DESIGN §19).
#[derive(Debug, Clone)]
pub(crate) struct Owed {
    /// The recipients to send again (the deferred, and the maybe-delivered unless
    /// `at_most_once`), one per line, with the first of their errors.
    pub again: Option<(SendError, String)>,
    /// Recipients dead with an error of their own, each group one dead letter: those the
    /// provider refused, and under `at_most_once` those it may have.
    pub dead: Vec<(SendError, String)>,
}

/// What `receipt`, an `Ok` that may not have reached every recipient, leaves owed: nothing
/// when every recipient was delivered. A recipient the provider may have (no answer after
/// the data) is sent again only at least once; at most once it is a dead letter of its own
/// (`outbox.maybe_delivered`). Recipients refused while others were accepted are a dead
/// letter of their own with the refusal, one for each code of refusal, so that no recipient's truth is written off as sent.
pub(crate) fn owed_after(receipt: &Receipt, at_most_once: bool) -> Owed {
    let lines = |part: &[(lettre::Address, SendError)]| {
        part.iter()
            .map(|(to, _)| to.as_ref())
            .collect::<Vec<&str>>()
            .join("\n")
    };
    let deferred = receipt.deferred_recipients();
    let maybe = receipt.maybe_delivered_recipients();
    let rejected = receipt.rejected_recipients();
    let mut again: Vec<(lettre::Address, SendError)> = deferred.to_vec();
    let mut dead = Vec::new();
    // One dead letter per code, in the order each code first came: recipients refused for
    // another reason (a suppressed address beside a provider's 550) are not requeued alike.
    let mut codes: Vec<&str> = Vec::new();
    for (_, why) in rejected {
        if !codes.contains(&why.code()) {
            codes.push(why.code());
        }
    }
    for code in codes {
        let group: Vec<(lettre::Address, SendError)> = rejected
            .iter()
            .filter(|(_, why)| why.code() == code)
            .cloned()
            .collect();
        if let Some((_, why)) = group.first() {
            dead.push((why.clone(), lines(&group)));
        }
    }
    if at_most_once {
        if let Some((_, why)) = maybe.first() {
            dead.push((maybe_delivered(why.clone()), lines(maybe)));
        }
    } else {
        again.extend_from_slice(maybe);
    }
    Owed {
        again: again.first().map(|(_, why)| (why.clone(), lines(&again))),
        dead,
    }
}

/// A message whose send panicked this many times is dead: the bug is not going away.
pub(crate) const PANICS_TO_DEAD: u32 = 3;

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
pub(crate) fn maybe_delivered(error: SendError) -> SendError {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn policy() -> Policy {
        Policy {
            backoff: Backoff::constant(Duration::from_secs(1)),
            setup_wait: Duration::from_secs(3_600),
            max_age: Duration::from_secs(86_400),
            at_most_once: false,
        }
    }

    fn attempted(attempts: u32, now: Millis) -> Attempted {
        Attempted {
            enqueued_at: 1_000,
            attempts,
            panics: 0,
            now,
        }
    }

    #[test]
    fn a_message_whose_send_panicked_a_third_time_is_dead_and_waits_the_setup_wait_before() {
        let panicked = || {
            SendError::new(
                Category::Configuration,
                "transport.panicked",
                "the send panicked",
            )
        };
        for panics in 1..PANICS_TO_DEAD {
            let message = Attempted {
                panics,
                ..attempted(panics, 2_000)
            };
            let next = after_failure(&policy(), message, panicked(), |_| MINUTE);
            assert_eq!(retry_at(next), 2_000 + 3_600_000, "panic {panics}");
        }
        let third = Attempted {
            panics: PANICS_TO_DEAD,
            ..attempted(5, 2_000)
        };
        let error = dead(after_failure(&policy(), third, panicked(), |_| MINUTE));
        assert_eq!(error.code(), "transport.panicked");
        assert_eq!(error.category(), Category::Configuration);
    }

    fn error(category: Category) -> SendError {
        SendError::new(category, "test.code", "scripted").with_transport("smtp://relay:25")
    }

    fn retry_at(next: Next) -> Millis {
        match next {
            Next::Retry { due_at, .. } => due_at,
            Next::Dead(error) => panic!("expected a retry, got dead: {error}"),
        }
    }

    fn dead(next: Next) -> SendError {
        match next {
            Next::Dead(error) => error,
            Next::Retry { due_at, .. } => panic!("expected dead, got a retry at {due_at}"),
        }
    }

    #[test]
    fn a_rejected_message_is_dead_at_once_with_its_error() {
        let next = after_failure(
            &policy(),
            attempted(1, 2_000),
            error(Category::Rejected),
            |_| MINUTE,
        );
        let error = dead(next);
        assert_eq!(error.category(), Category::Rejected);
        assert_eq!(error.code(), "test.code");
        assert_eq!(error.transport(), Some("smtp://relay:25"));
    }

    #[test]
    fn recipients_refused_with_different_codes_are_dead_letters_of_their_own_one_per_code() {
        let refusal = |code: &str| SendError::new(Category::Rejected, code, "refused");
        let receipt = Receipt::new("smtp://relay:25")
            .with_rejected_recipient("a@example.org".parse().unwrap(), refusal("smtp.550"))
            .with_rejected_recipient(
                "b@example.org".parse().unwrap(),
                refusal("suppressed.bounced"),
            )
            .with_rejected_recipient("c@example.org".parse().unwrap(), refusal("smtp.550"));
        let owed = owed_after(&receipt, false);
        let dead: Vec<(&str, &str)> = owed
            .dead
            .iter()
            .map(|(error, to)| (error.code(), to.as_str()))
            .collect();
        assert_eq!(
            dead,
            vec![
                ("smtp.550", "a@example.org\nc@example.org"),
                ("suppressed.bounced", "b@example.org")
            ]
        );
    }

    #[test]
    fn an_invalid_message_is_dead_at_once_with_its_error() {
        let next = after_failure(
            &policy(),
            attempted(1, 2_000),
            error(Category::InvalidMessage),
            |_| MINUTE,
        );
        assert_eq!(dead(next).code(), "test.code");
    }

    #[test]
    fn a_failure_that_may_pass_is_due_again_after_the_backoff_for_its_attempt() {
        let next = after_failure(
            &policy(),
            attempted(3, 2_000),
            error(Category::Network),
            |retry| {
                assert_eq!(retry, 3, "the backoff is asked for the attempt just made");
                MINUTE
            },
        );
        assert_eq!(retry_at(next), 2_000 + 60_000);
    }

    #[test]
    fn a_retry_after_longer_than_the_backoff_sets_the_due_time() {
        let open = error(Category::ServiceUnavailable).with_retry_after(2 * MINUTE);
        let next = after_failure(&policy(), attempted(1, 2_000), open, |_| MINUTE);
        assert_eq!(retry_at(next), 2_000 + 120_000);
    }

    #[test]
    fn a_backoff_longer_than_the_retry_after_sets_the_due_time() {
        let open = error(Category::ServiceUnavailable).with_retry_after(Duration::from_secs(5));
        let next = after_failure(&policy(), attempted(1, 2_000), open, |_| MINUTE);
        assert_eq!(retry_at(next), 2_000 + 60_000);
    }

    #[test]
    fn a_setup_failure_waits_the_setup_wait_not_the_backoff() {
        for category in [
            Category::Authentication,
            Category::Configuration,
            Category::Unsupported,
        ] {
            let next = after_failure(&policy(), attempted(1, 2_000), error(category), |_| MINUTE);
            assert_eq!(retry_at(next), 2_000 + 3_600_000, "{category:?}");
        }
    }

    #[test]
    fn a_failure_at_max_age_is_dead_as_expired_with_the_last_error_inside() {
        let now = 1_000 + 86_400_000;
        let error = dead(after_failure(
            &policy(),
            attempted(9, now),
            error(Category::Timeout),
            |_| MINUTE,
        ));
        assert_eq!(error.code(), "outbox.expired");
        assert_eq!(error.category(), Category::Timeout);
        assert_eq!(error.transport(), Some("smtp://relay:25"));
        assert_eq!(error.causes()[0].code(), "test.code");
    }

    #[test]
    fn a_failure_just_before_max_age_is_tried_once_more_at_max_age() {
        let now = 1_000 + 86_400_000 - 1;
        let next = after_failure(
            &policy(),
            attempted(9, now),
            error(Category::Timeout),
            |_| MINUTE,
        );
        assert_eq!(retry_at(next), 1_000 + 86_400_000);
    }

    #[test]
    fn a_maybe_delivered_failure_is_retried_by_default() {
        let lost = error(Category::Timeout).maybe_delivered();
        let next = after_failure(&policy(), attempted(1, 2_000), lost, |_| MINUTE);
        assert_eq!(retry_at(next), 62_000);
    }

    #[test]
    fn a_maybe_delivered_failure_is_dead_under_at_most_once() {
        let policy = Policy {
            at_most_once: true,
            ..policy()
        };
        let lost = error(Category::Timeout).maybe_delivered();
        let error = dead(after_failure(&policy, attempted(1, 2_000), lost, |_| {
            MINUTE
        }));
        assert_eq!(error.code(), "outbox.maybe_delivered");
        assert_eq!(error.category(), Category::Timeout);
        assert_eq!(error.transport(), Some("smtp://relay:25"));
        assert_eq!(error.causes()[0].code(), "test.code");
    }

    #[test]
    fn a_failure_not_maybe_delivered_is_retried_under_at_most_once() {
        let policy = Policy {
            at_most_once: true,
            ..policy()
        };
        let next = after_failure(
            &policy,
            attempted(1, 2_000),
            error(Category::Network),
            |_| MINUTE,
        );
        assert_eq!(retry_at(next), 62_000);
    }

    #[test]
    fn a_lost_lease_is_sent_again_by_default_and_dead_under_at_most_once() {
        assert!(after_lost_lease(&policy()).is_none());
        let policy = Policy {
            at_most_once: true,
            ..policy()
        };
        let error = after_lost_lease(&policy).expect("dead under at_most_once");
        assert_eq!(error.code(), "outbox.maybe_delivered");
    }

    #[test]
    fn durations_past_what_millis_hold_saturate() {
        assert_eq!(millis(Duration::MAX), Millis::MAX);
        assert_eq!(millis(Duration::from_millis(1_500)), 1_500);
        let policy = Policy {
            max_age: Duration::MAX,
            setup_wait: Duration::MAX,
            ..policy()
        };
        let next = after_failure(
            &policy,
            attempted(1, 2_000),
            error(Category::Authentication),
            |_| MINUTE,
        );
        assert_eq!(retry_at(next), Millis::MAX);
    }

    fn category() -> impl Strategy<Value = Category> {
        prop::sample::select(Category::ALL.to_vec())
    }

    /// The rules of DESIGN §12, written out on their own: what happens to a failed message.
    #[allow(clippy::too_many_arguments)]
    fn model(
        category: Category,
        maybe_delivered: bool,
        retry_after: Option<u64>,
        at_most_once: bool,
        backoff_ms: u64,
        setup_ms: u64,
        max_age_ms: u64,
        enqueued_at: i64,
        now: i64,
    ) -> Result<i64, &'static str> {
        if maybe_delivered && at_most_once {
            return Err("outbox.maybe_delivered");
        }
        if matches!(category, Category::Rejected | Category::InvalidMessage) {
            return Err("test.code");
        }
        let deadline = enqueued_at + max_age_ms as i64;
        if now >= deadline {
            return Err("outbox.expired");
        }
        let own_wait = match category {
            Category::Authentication | Category::Configuration | Category::Unsupported => setup_ms,
            _ => backoff_ms,
        };
        let wait = own_wait.max(retry_after.unwrap_or(0));
        Ok((now + wait as i64).min(deadline))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn every_failure_follows_the_rules(
            category in category(),
            maybe_delivered: bool,
            retry_after in prop::option::of(0u64..10_000_000),
            at_most_once: bool,
            backoff_ms in 0u64..10_000_000,
            setup_ms in 0u64..10_000_000,
            max_age_ms in 0u64..100_000_000,
            enqueued_at in 0i64..1_000_000_000,
            age in 0i64..200_000_000,
            attempts in 1u32..100,
        ) {
            let now = enqueued_at + age;
            let policy = Policy {
                backoff: Backoff::constant(Duration::from_millis(backoff_ms)),
                setup_wait: Duration::from_millis(setup_ms),
                max_age: Duration::from_millis(max_age_ms),
                at_most_once,
            };
            let mut error = SendError::new(category, "test.code", "scripted");
            if maybe_delivered {
                error = error.maybe_delivered();
            }
            if let Some(wait) = retry_after {
                error = error.with_retry_after(Duration::from_millis(wait));
            }
            let message = Attempted { enqueued_at, attempts, panics: 0, now };
            let next = after_failure(&policy, message, error, |retry| {
                assert_eq!(retry, attempts);
                Duration::from_millis(backoff_ms)
            });
            let expected = model(
                category, maybe_delivered, retry_after, at_most_once,
                backoff_ms, setup_ms, max_age_ms, enqueued_at, now,
            );
            match (next, expected) {
                (Next::Retry { due_at, error }, Ok(expected_due)) => {
                    prop_assert_eq!(due_at, expected_due);
                    prop_assert!(due_at >= now);
                    prop_assert_eq!(error.code(), "test.code");
                }
                (Next::Dead(error), Err(code)) => {
                    prop_assert_eq!(error.code(), code);
                    prop_assert_eq!(error.category(), category);
                }
                (next, expected) => prop_assert!(false, "got {next:?}, the rules say {expected:?}"),
            }
        }

        /// What `send_or_queue` keeps is what the worker retries: for a message just
        /// enqueued, `sends_again` holds exactly when `after_failure` answers a retry.
        #[test]
        fn sends_again_is_what_the_worker_retries_a_young_message_for(
            category in category(),
            maybe_delivered: bool,
            at_most_once: bool,
        ) {
            let mut error = SendError::new(category, "test.code", "scripted");
            if maybe_delivered {
                error = error.maybe_delivered();
            }
            let policy = Policy { at_most_once, ..policy() };
            let message = Attempted { enqueued_at: 1_000, attempts: 1, panics: 0, now: 1_000 };
            let retried = matches!(
                after_failure(&policy, message, error.clone(), |_| MINUTE),
                Next::Retry { .. }
            );
            prop_assert_eq!(sends_again(&error, at_most_once), retried);
        }
    }
}
