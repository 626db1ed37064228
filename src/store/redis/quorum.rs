//! The quorum: with a quorum above 1, each member keeps a breaker of its own beside the
//! fleet's, so that one sick member (a broken route, a bad DNS answer) cannot open the
//! breaker for everyone.
//!
//! The member's own breaker counts only this process's results, by the same rules, in a
//! [`MemoryStore`]: when they meet the rule it opens for this member alone, refuses with
//! `breaker.open` and probes for itself. The fleet's breaker, in Redis, counts every
//! member's results and opens only once failures from `quorum` distinct members meet the
//! rule. A send goes when both let it; a permit then holds one permit of each, packed into
//! the one [`Permit`] the breaker carries.

use super::LOCAL_PERIOD;
use crate::State;
use crate::machine::Permit;

/// The mark of a permit that holds a permit of each breaker.
const JOINT: u64 = 1 << 62;
/// The bits each half keeps: the fleet's permit in the low half, the member's own in the
/// high half (its period one bit shorter, below [`JOINT`] and the local mark).
const SHARED_BITS: u32 = 32;
const SHARED_MASK: u64 = (1 << SHARED_BITS) - 1;
const OWN_PERIOD_MASK: u64 = (1 << 30) - 1;

/// The name this process has in the fleet when none is given: its host name and process id.
pub(super) fn default_member() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let host = host_name(kernel, |name| std::env::var(name).ok());
    format!("{host}:{}", std::process::id())
}

/// The host's name: the kernel's (`kernel`, as read from `/proc`) unless it is blank, else
/// the `HOSTNAME` or `COMPUTERNAME` variable (read by `var`), else `localhost`.
fn host_name(kernel: Option<String>, var: impl Fn(&str) -> Option<String>) -> String {
    kernel
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| var("HOSTNAME"))
        .or_else(|| var("COMPUTERNAME"))
        .unwrap_or_else(|| String::from("localhost"))
}

/// One permit holding the fleet's permit `shared` and the member's own `own`.
///
/// Periods and probe numbers count changes of state and probes, so they stay far below the
/// bits kept here (2^32 and 2^30); one that did not would come back as another number, and
/// its result would count for nothing, as a result from another period does.
pub(super) fn join(shared: Permit, own: Permit) -> Permit {
    // The fleet's permit keeps its mark of a permit the local fallback gave.
    let period = (shared.period() & LOCAL_PERIOD)
        | JOINT
        | (own.period() & OWN_PERIOD_MASK) << SHARED_BITS
        | (shared.period() & SHARED_MASK);
    let probe = match (shared.probe(), own.probe()) {
        (None, None) => None,
        (shared, own) => Some(
            (own.unwrap_or(0) & SHARED_MASK) << SHARED_BITS | (shared.unwrap_or(0) & SHARED_MASK),
        ),
    };
    Permit::new(period, probe)
}

/// The fleet's permit and the member's own, if `permit` holds both.
pub(super) fn split(permit: Permit) -> Option<(Permit, Permit)> {
    if permit.period() & JOINT == 0 {
        return None;
    }
    let shared_period = permit.period() & (SHARED_MASK | LOCAL_PERIOD);
    let own_period = (permit.period() >> SHARED_BITS) & OWN_PERIOD_MASK;
    let (shared_probe, own_probe) = match permit.probe() {
        None => (None, None),
        Some(both) => (
            Some(both & SHARED_MASK).filter(|&n| n > 0),
            Some(both >> SHARED_BITS).filter(|&n| n > 0),
        ),
    };
    Some((
        Permit::new(shared_period, shared_probe),
        Permit::new(own_period, own_probe),
    ))
}

/// The state of a member that both breakers hold: the stricter one.
pub(super) fn stricter(shared: State, own: State) -> State {
    let rank = |state: State| match state {
        State::Closed => 0,
        State::HalfOpen => 1,
        State::Open => 2,
    };
    if rank(own) > rank(shared) {
        own
    } else {
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joint_permit_gives_back_both_permits() {
        for (shared, own) in [
            (Permit::new(0, None), Permit::new(0, None)),
            (Permit::new(7, Some(3)), Permit::new(2, None)),
            (Permit::new(7, None), Permit::new(5, Some(9))),
            (
                Permit::new(u64::from(u32::MAX), Some(1)),
                Permit::new(OWN_PERIOD_MASK, Some(2)),
            ),
        ] {
            let joint = join(shared, own);
            assert_eq!(split(joint), Some((shared, own)));
            assert_eq!(
                joint.period() & LOCAL_PERIOD,
                0,
                "never taken for a local permit"
            );
        }
        let local = Permit::new(LOCAL_PERIOD | 3, None);
        assert_eq!(
            split(join(local, Permit::new(1, None))).map(|(shared, _)| shared),
            Some(local)
        );
        assert_eq!(split(Permit::new(4, Some(1))), None);
    }

    #[test]
    fn a_host_is_named_by_the_kernel_then_by_its_variables_then_localhost() {
        let vars = |given: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                given
                    .iter()
                    .find(|(var, _)| *var == name)
                    .map(|(_, value)| (*value).to_owned())
            }
        };
        let both = vars(&[("HOSTNAME", "from-env"), ("COMPUTERNAME", "windows")]);
        assert_eq!(host_name(Some("web-1\n".to_owned()), both), "web-1");
        assert_eq!(host_name(Some(" \n".to_owned()), both), "from-env");
        assert_eq!(host_name(None, both), "from-env");
        assert_eq!(
            host_name(None, vars(&[("COMPUTERNAME", "windows")])),
            "windows"
        );
        assert_eq!(host_name(None, vars(&[])), "localhost");
    }

    #[test]
    fn a_member_shows_the_stricter_of_its_two_breakers() {
        let states = [State::Closed, State::HalfOpen, State::Open];
        for (i, &shared) in states.iter().enumerate() {
            for (j, &own) in states.iter().enumerate() {
                let expected = states[i.max(j)];
                assert_eq!(stricter(shared, own), expected, "{shared:?} and {own:?}");
            }
        }
    }

    #[test]
    fn a_member_has_a_name_by_default() {
        let name = default_member();
        assert!(
            name.ends_with(&format!(":{}", std::process::id())),
            "{name}"
        );
    }
}
