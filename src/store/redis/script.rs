//! The breaker script's side in Rust: key names, arguments, and reading its reply.

use std::fmt::Write as _;
use std::time::Duration;

use crate::State;
use crate::machine::{
    Counting, Decision, Outcome, Permit, Rules, Snapshot, Transition, Transitions,
};

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

/// The name of the set of members whose failures are in the current count of the breaker of
/// `key`: beside its hash, under the same hash tag, so a cluster keeps both in one slot.
pub(super) fn members_name(namespace: &str, key: &str) -> String {
    let mut name = key_name(namespace, key);
    name.push_str(":members");
    name
}

/// The name of the flag that isolates the breaker named `breaker` as a whole in
/// `namespace` (DESIGN §19): beside the hash of its transport's key, under the same hash
/// tag, and of a shape that [`key_of_name`] and [`namespace_pattern`] never take for a
/// breaker.
pub(super) fn isolation_name(namespace: &str, breaker: &str) -> String {
    let mut name = key_name(namespace, breaker);
    name.push_str(":isolated");
    name
}

/// The name of the hash of the rate limiter `name` in `namespace`, escaped as a breaker's
/// (a Redis Cluster keeps it on one node, under its own hash tag).
pub(crate) fn rate_key(namespace: &str, name: &str) -> String {
    let mut key = String::with_capacity(24 + namespace.len() + name.len());
    key.push_str("mail-breaker:");
    escape_into(&mut key, namespace);
    key.push_str(":rate:{");
    escape_into(&mut key, name);
    key.push('}');
    key
}

/// The name of the hash of the reputation breaker of `member` in `namespace`, escaped as a
/// breaker's, under its own hash tag; the ids it counted are beside it (`:seen`), under the
/// same tag. Neither takes the shape of a breaker's key.
#[cfg(feature = "webhooks")]
pub(crate) fn reputation_key(namespace: &str, member: &str) -> String {
    let mut key = String::with_capacity(32 + namespace.len() + member.len());
    key.push_str("mail-breaker:");
    escape_into(&mut key, namespace);
    key.push_str(":reputation:{");
    escape_into(&mut key, member);
    key.push('}');
    key
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
    Isolate,
    Reset,
    Snapshot,
}

/// The script's number arguments (ARGV[3] on) for `call` under `rules`, keys kept `expiry`
/// after their last write, the shared breaker opening once `quorum` members failed.
pub(super) fn arguments(call: Call, rules: &Rules, expiry: Duration, quorum: u32) -> Vec<u64> {
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
        rules.max_reset_timeout.map_or(0, micros),
        u64::from(quorum),
    ];
    match call {
        Call::Acquire | Call::Isolate | Call::Reset | Call::Snapshot => {}
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
        Call::Isolate => "isolate",
        Call::Reset => "reset",
        Call::Snapshot => "snapshot",
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
                0 if *retry_after == -1 => Decision::Isolated,
                0 => Decision::Refuse {
                    retry_after: Duration::from_micros(u64::try_from(*retry_after).ok()?),
                },
                _ => return None,
            };
            Some(Reply {
                decision,
                state: state_of(*state)?,
                transitions: transitions_of(changes)?,
            })
        };
        read(&values).ok_or(BadReply(values))
    }
}

/// The changes of state at the end of a reply: pairs of from and to.
fn transitions_of(changes: &[i64]) -> Option<Transitions> {
    if !changes.len().is_multiple_of(2) || changes.len() > 4 {
        return None;
    }
    let mut transitions = Transitions::NONE;
    for pair in changes.chunks_exact(2) {
        transitions.push(Transition {
            from: state_of(pair[0])?,
            to: state_of(pair[1])?,
        });
    }
    Some(transitions)
}

/// The script's answer to `snapshot`, read into a [`Snapshot`] of `key`, with the changes
/// of state that time made.
pub(super) fn parse_snapshot(
    key: &str,
    rules: &Rules,
    values: Vec<i64>,
) -> Result<(Snapshot, Transitions), BadReply> {
    let read = |values: &[i64]| -> Option<(Snapshot, Transitions)> {
        let [
            state,
            isolated,
            failures,
            calls,
            retry_after,
            streak,
            changes @ ..,
        ] = values
        else {
            return None;
        };
        let (failures, calls) = (u32::try_from(*failures).ok()?, u32::try_from(*calls).ok()?);
        let failure_rate = match rules.counting {
            Counting::ErrorRate(_) if calls > 0 => Some(f64::from(failures) / f64::from(calls)),
            _ => None,
        };
        let retry_after = match *retry_after {
            -1 => None,
            micros => Some(Duration::from_micros(u64::try_from(micros).ok()?)),
        };
        let snapshot = Snapshot::new(
            key,
            state_of(*state)?,
            *isolated == 1,
            failures,
            calls,
            failure_rate,
            retry_after,
            u32::try_from(*streak).ok()?,
        );
        Some((snapshot, transitions_of(changes)?))
    };
    read(&values).ok_or(BadReply(values))
}

/// The breaker key a Redis key name holds, undoing [`key_name`]'s escapes; `None` for a
/// name of another shape.
pub(super) fn key_of_name(namespace: &str, name: &str) -> Option<String> {
    let prefix = key_name(namespace, "");
    let escaped = name
        .strip_prefix(prefix.strip_suffix('}')?)?
        .strip_suffix('}')?;
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The SCAN pattern that matches every breaker key of `namespace`.
pub(super) fn namespace_pattern(namespace: &str) -> String {
    let mut pattern = key_name(namespace, "");
    pattern.pop(); // the closing brace
    pattern.push_str("*}");
    pattern
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
    fn a_key_name_gives_back_its_key() {
        for key in ["Example.org", "x}{y%", "é", "", "a:b"] {
            assert_eq!(
                key_of_name("a:b", &key_name("a:b", key)).as_deref(),
                Some(key)
            );
        }
        assert_eq!(key_of_name("app", "mail-breaker:other:{x}"), None);
        assert_eq!(namespace_pattern("a:b"), "mail-breaker:a%3Ab:{*}");
        // The set of members beside each hash is not taken for a breaker.
        assert_eq!(key_of_name("a:b", &members_name("a:b", "x")), None);
        // Nor is the flag of a breaker isolated as a whole.
        assert_eq!(key_of_name("a:b", &isolation_name("a:b", "x")), None);
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
        let args = arguments(Call::Acquire, &forever, Duration::MAX, 1);
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
    fn the_longest_time_given_to_redis_is_a_hundred_years_and_exact_in_lua_added_to_its_clock() {
        let year = Duration::from_secs(365 * 24 * 60 * 60);
        let max = super::super::MAX_EXPIRY;
        assert!(max >= year * 99 && max <= year * 101, "{max:?}");
        // The script adds it to the server's clock in microseconds; a clock of the year 2100
        // plus the longest time is still below 2^53, where Lua's numbers stop being exact.
        let clock_in_2100 = year.as_micros() * (2100 - 1970);
        assert!(clock_in_2100 + max.as_micros() < 1 << 53);
    }

    #[test]
    fn a_rate_limiter_key_is_escaped_under_its_own_hash_tag_apart_from_the_breakers() {
        assert_eq!(
            rate_key("a:b", "ses}{"),
            "mail-breaker:a%3Ab:rate:{ses%7D%7B}"
        );
        assert_ne!(rate_key("app", "x"), key_name("app", "x"));
        assert_eq!(key_of_name("app", &rate_key("app", "x")), None);
    }

    #[test]
    fn a_script_reply_reads_as_a_send_a_probe_a_refusal_or_an_isolation() {
        let decision = |values: Vec<i64>| Reply::parse(values).unwrap().decision;
        assert_eq!(
            decision(vec![1, 4, 0, -1, 0]),
            Decision::Send(Permit::new(4, None)),
            "probe 0 is no probe"
        );
        assert_eq!(
            decision(vec![1, 4, 2, -1, 2]),
            Decision::Send(Permit::new(4, Some(2)))
        );
        assert_eq!(
            decision(vec![0, 4, 0, 1_500, 1]),
            Decision::Refuse {
                retry_after: Duration::from_micros(1_500)
            }
        );
        assert_eq!(decision(vec![0, 4, 0, -1, 1]), Decision::Isolated);
        let reply = Reply::parse(vec![0, 4, 0, 0, 1, 0, 1]).unwrap();
        assert_eq!(reply.state, State::Open);
        assert_eq!(reply.transitions.iter().count(), 1);
        assert!(
            Reply::parse(vec![1, -4, 0, -1, 0]).is_err(),
            "a negative period"
        );
        assert!(
            Reply::parse(vec![2, 4, 0, -1, 0]).is_err(),
            "neither sent nor refused"
        );
    }

    #[test]
    fn a_reply_carries_at_most_two_changes_of_state_as_pairs() {
        let open = Transition {
            from: State::Closed,
            to: State::Open,
        };
        let probing = Transition {
            from: State::Open,
            to: State::HalfOpen,
        };
        assert_eq!(transitions_of(&[]), Some(Transitions::NONE));
        let mut one = Transitions::NONE;
        one.push(open);
        assert_eq!(transitions_of(&[0, 1]), Some(one));
        let mut two = one;
        two.push(probing);
        assert_eq!(transitions_of(&[0, 1, 1, 2]), Some(two));
        assert_eq!(transitions_of(&[0]), None, "half a pair");
        assert_eq!(transitions_of(&[0, 1, 1]), None, "half a pair");
        assert_eq!(transitions_of(&[0, 1, 1, 2, 2, 0]), None, "three changes");
        assert_eq!(transitions_of(&[0, 3]), None, "an unknown state");
    }

    #[test]
    fn a_snapshot_reply_gives_the_failure_rate_only_under_error_rate_counting_with_calls() {
        let by_rate = Rules {
            counting: Counting::ErrorRate(crate::ErrorRate::default()),
            ..Rules::default()
        };
        let rate = |rules: &Rules, failures: i64, calls: i64| {
            let (snapshot, _) =
                parse_snapshot("k", rules, vec![0, 0, failures, calls, -1, 0]).unwrap();
            snapshot.failure_rate()
        };
        assert_eq!(rate(&by_rate, 3, 12), Some(0.25));
        assert_eq!(rate(&by_rate, 1, 1), Some(1.0));
        assert_eq!(rate(&by_rate, 0, 0), None, "an empty window has no rate");
        assert_eq!(rate(&Rules::default(), 3, 12), None, "counting in a row");
    }

    #[test]
    fn a_snapshot_reply_is_read_field_by_field() {
        let (snapshot, transitions) = parse_snapshot(
            "example.org",
            &Rules::default(),
            vec![1, 1, 5, 6, 2_000, 3, 0, 1],
        )
        .unwrap();
        assert_eq!(snapshot.key(), "example.org");
        assert_eq!(snapshot.state(), State::Open);
        assert!(snapshot.is_isolated());
        assert_eq!((snapshot.failures(), snapshot.calls()), (5, 6));
        assert_eq!(snapshot.retry_after(), Some(Duration::from_millis(2)));
        assert_eq!(snapshot.open_streak(), 3);
        assert_eq!(transitions.iter().count(), 1);
        let (closed, _) = parse_snapshot("k", &Rules::default(), vec![0, 0, 0, 0, -1, 0]).unwrap();
        assert!(!closed.is_isolated());
        assert_eq!(closed.retry_after(), None);
        assert!(parse_snapshot("k", &Rules::default(), vec![0, 0, 0, 0, -1]).is_err());
        assert!(parse_snapshot("k", &Rules::default(), vec![0, 0, -1, 0, -1, 0]).is_err());
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
