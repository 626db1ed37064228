//! The breaker script's side in Rust: key names, arguments, and reading its reply.

use std::fmt::Write as _;
use std::time::Duration;

use crate::State;
use crate::machine::{Counting, Decision, Outcome, Permit, Rules, Transition, Transitions};

/// The breaker's rules restated for Redis (`breaker.lua`).
pub(super) const SOURCE: &str = include_str!("breaker.lua");

/// The name of the hash that holds the breaker of `key` in `namespace`.
///
/// Both parts are untrusted (a recipient domain comes from the message), so each is escaped:
/// bytes outside `[A-Za-z0-9._-]` become `%XX`. Distinct pairs give distinct names, no part
/// can close the `{...}` hash tag early, and all keys of one breaker share its tag, so a
/// Redis Cluster keeps each breaker on one node.
pub(super) fn key_name(namespace: &str, key: &str) -> String {
    let mut name = String::with_capacity(16 + namespace.len() + key.len());
    name.push_str("mail-breaker:");
    escape_into(&mut name, namespace);
    name.push_str(":{");
    escape_into(&mut name, key);
    name.push('}');
    name
}

fn escape_into(out: &mut String, part: &str) {
    for byte in part.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// Which call of the script to make.
#[derive(Debug, Clone, Copy)]
pub(super) enum Call {
    Acquire,
    Record(Permit, Outcome),
    Release(Permit),
}

/// The script's arguments (ARGV) for `call` under `rules`, keys kept `expiry` after their last write.
pub(super) fn arguments(call: Call, rules: &Rules, expiry: Duration) -> Vec<u64> {
    let (error_rate, threshold, percent, minimum, window, buckets) = match rules.counting {
        Counting::Consecutive { threshold } => (0, u64::from(threshold), 0, 0, 0, 1),
        Counting::ErrorRate(rate) => (
            1,
            0,
            u64::from(rate.threshold_percent),
            u64::from(rate.minimum_requests),
            micros(rate.window),
            u64::from(rate.buckets),
        ),
    };
    let mut args = vec![
        error_rate,
        threshold,
        percent,
        minimum,
        window,
        buckets,
        micros(rules.reset_timeout),
        micros(rules.probe_timeout),
        u64::from(rules.half_open_successes),
        // Within MAX_EXPIRY, so the number fits Redis's range whatever the settings.
        key_expiry(rules, expiry)
            .min(super::MAX_EXPIRY)
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX),
    ];
    match call {
        Call::Acquire => {}
        Call::Record(permit, outcome) => {
            args.extend([
                permit.period(),
                permit.probe().unwrap_or(0),
                u64::from(outcome == Outcome::Failure),
            ]);
        }
        Call::Release(permit) => args.extend([permit.period(), permit.probe().unwrap_or(0)]),
    }
    args
}

/// The script's name for `call`, its first argument.
pub(super) fn call_name(call: Call) -> &'static str {
    match call {
        Call::Acquire => "acquire",
        Call::Record(..) => "record",
        Call::Release(_) => "release",
    }
}

/// How long a breaker's key lives after its last write: `idle` at least, and never so short
/// that an open breaker, its probe or its window would be forgotten while they matter.
fn key_expiry(rules: &Rules, idle: Duration) -> Duration {
    let window = match rules.counting {
        Counting::Consecutive { .. } => Duration::ZERO,
        Counting::ErrorRate(rate) => rate.window,
    };
    let needed = (rules.reset_timeout.saturating_add(rules.probe_timeout))
        .saturating_mul(2)
        .saturating_add(window)
        .saturating_add(Duration::from_secs(1));
    idle.max(needed)
}

/// A setting in microseconds, at most [`MAX_EXPIRY`](super::MAX_EXPIRY): the script adds
/// it to the server's clock, and Lua's numbers are exact only below 2^53.
fn micros(duration: Duration) -> u64 {
    duration
        .min(super::MAX_EXPIRY)
        .as_micros()
        .try_into()
        .unwrap_or(u64::MAX)
}

/// What one call of the script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) decision: Decision,
    pub(super) state: State,
    pub(super) transitions: Transitions,
}

/// A reply the script cannot have given: another program wrote to our keys, or a script of
/// another version answered.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the breaker script answered {0:?}, which is not a breaker reply")]
pub(super) struct BadReply(Vec<i64>);

impl Reply {
    pub(super) fn parse(values: Vec<i64>) -> Result<Reply, BadReply> {
        let read = |values: &[i64]| -> Option<Reply> {
            let [sent, period, probe, retry_after, state, changes @ ..] = values else {
                return None;
            };
            let period = u64::try_from(*period).ok()?;
            if period & super::LOCAL_PERIOD != 0 {
                return None; // would be taken for a permit of the local store
            }
            let decision = match sent {
                1 => Decision::Send(Permit::new(
                    period,
                    Some(u64::try_from(*probe).ok()?).filter(|&n| n > 0),
                )),
                0 => Decision::Refuse {
                    retry_after: Duration::from_micros(u64::try_from(*retry_after).ok()?),
                },
                _ => return None,
            };
            if changes.len() % 2 != 0 || changes.len() > 4 {
                return None;
            }
            let mut transitions = Transitions::NONE;
            for pair in changes.chunks_exact(2) {
                transitions.push(Transition {
                    from: state_of(pair[0])?,
                    to: state_of(pair[1])?,
                });
            }
            Some(Reply {
                decision,
                state: state_of(*state)?,
                transitions,
            })
        };
        read(&values).ok_or(BadReply(values))
    }
}

fn state_of(code: i64) -> Option<State> {
    match code {
        0 => Some(State::Closed),
        1 => Some(State::Open),
        2 => Some(State::HalfOpen),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_escape_everything_outside_the_safe_set() {
        assert_eq!(
            key_name("app", "Example.org"),
            "mail-breaker:app:{Example.org}"
        );
        assert_eq!(key_name("a:b", "x}{y%"), "mail-breaker:a%3Ab:{x%7D%7By%25}");
        assert_eq!(key_name("", "é"), "mail-breaker::{%C3%A9}");
    }

    #[test]
    fn distinct_namespace_and_key_pairs_never_share_a_name() {
        assert_ne!(key_name("a:b", "c"), key_name("a", "b:c"));
        assert_ne!(key_name("a", "%3A"), key_name("a", ":"));
    }

    #[test]
    fn replies_of_another_shape_or_with_unknown_states_are_refused() {
        assert!(Reply::parse(vec![1, 0, 0, 0, 7]).is_err());
        assert!(Reply::parse(vec![1, 0, 0]).is_err());
        assert!(Reply::parse(vec![0, 3, 0, 5, 1, 0, 1]).is_ok());
    }

    #[test]
    fn settings_of_any_length_reach_redis_within_its_range() {
        let forever = Rules {
            reset_timeout: Duration::MAX,
            probe_timeout: Duration::MAX,
            ..Rules::default()
        };
        let args = arguments(Call::Acquire, &forever, Duration::MAX);
        let max_micros = super::super::MAX_EXPIRY.as_micros() as u64;
        assert_eq!(args[6], max_micros, "reset timeout");
        assert_eq!(args[7], max_micros, "probe timeout");
        assert_eq!(
            args[9],
            super::super::MAX_EXPIRY.as_millis() as u64,
            "expiry"
        );
        assert!(max_micros < 1 << 53, "exact in Lua");
    }

    #[test]
    fn key_expiry_outlasts_an_open_breaker_and_its_probe() {
        let rules = Rules {
            reset_timeout: Duration::from_secs(3600),
            ..Rules::default()
        };
        assert!(key_expiry(&rules, Duration::from_secs(60)) > Duration::from_secs(7200));
    }
}
