//! The model check of the first key's lock-free paths (run by `scripts/loom.sh`): loom runs
//! every interleaving of two threads' sends, trips and resets, and each test checks what the
//! rules say.
//!
//! - A send's leave and its success read the clean word and the open word without the lock;
//!   every change under the lock writes both after it. So once the threads are done, the
//!   words must say what the machine says: the clean word is `period + 1` exactly while the
//!   breaker is closed with no failure in a row, and the open word is set exactly while it is
//!   open for a time.
//! - A send that starts after a trip was seen (through any synchronisation) is refused.
//! - Whatever the order, the outcome is one the rules allow: a trip is not undone by a success
//!   of an earlier period, and two failures in a row trip a threshold of two.

use loom::sync::Arc;
use loom::sync::atomic::AtomicBool;
use loom::thread;

use super::*;

/// Rules that open the breaker at `threshold` failures in a row.
fn in_a_row(threshold: u32) -> Rules {
    Rules {
        counting: Counting::Consecutive { threshold },
        ..Rules::default()
    }
}

/// One send through the breaker: its leave, then `outcome` if it was let go. Whether it was.
fn send(first: &FirstKey, rules: &Rules, outcome: Outcome) -> bool {
    match first.acquire(rules) {
        (Decision::Send(permit), _) => {
            first.record(rules, permit, outcome);
            true
        }
        _ => false,
    }
}

/// The words say what the machine says (read under its lock, with nothing else running).
fn assert_words_agree(first: &FirstKey, rules: &Rules) {
    let machine = lock(&first.machine);
    let clean = if machine.state() == State::Closed
        && matches!(rules.counting, Counting::Consecutive { .. })
        && machine.has_nothing_counted()
    {
        machine.period() + 1
    } else {
        0
    };
    assert_eq!(
        first.clean.load(Ordering::SeqCst),
        clean,
        "the clean word, with the machine {:?} in period {}",
        machine.state(),
        machine.period()
    );
    assert_eq!(
        first.open_until.load(Ordering::SeqCst) != 0,
        machine.open_until().is_some(),
        "the open word, with the machine {:?}",
        machine.state()
    );
}

/// Runs `a` and `b` on two threads over one first key, in every interleaving; then `after`.
fn race(
    rules: Rules,
    a: fn(&FirstKey, &Rules),
    b: fn(&FirstKey, &Rules),
    after: fn(&FirstKey, &Rules),
) {
    loom::model(move || {
        let first = Arc::new(FirstKey::new("smtp", &rules));
        let (first_a, rules_a) = (Arc::clone(&first), rules.clone());
        let a_done = thread::spawn(move || a(&first_a, &rules_a));
        b(&first, &rules);
        a_done.join().unwrap();
        assert_words_agree(&first, &rules);
        after(&first, &rules);
    });
}

fn state(first: &FirstKey) -> State {
    lock(&first.machine).state()
}

#[test]
fn a_tripping_failure_and_a_success_in_flight_leave_the_breaker_open_and_refusing() {
    race(
        in_a_row(1),
        |first, rules| {
            send(first, rules, Outcome::Success);
        },
        |first, rules| {
            assert!(send(first, rules, Outcome::Failure), "closed: let go");
        },
        |first, rules| {
            assert_eq!(state(first), State::Open);
            assert!(matches!(first.acquire(rules).0, Decision::Refuse { .. }));
        },
    );
}

#[test]
fn two_failures_in_a_row_from_two_threads_trip_a_threshold_of_two() {
    race(
        in_a_row(2),
        |first, rules| {
            send(first, rules, Outcome::Failure);
        },
        |first, rules| {
            send(first, rules, Outcome::Failure);
        },
        |first, _| assert_eq!(state(first), State::Open),
    );
}

#[test]
fn a_failure_and_a_success_from_two_threads_leave_the_breaker_closed() {
    race(
        in_a_row(2),
        |first, rules| {
            send(first, rules, Outcome::Failure);
        },
        |first, rules| {
            send(first, rules, Outcome::Success);
        },
        |first, _| assert_eq!(state(first), State::Closed),
    );
}

#[test]
fn a_trip_racing_a_success_leaves_the_breaker_open() {
    race(
        in_a_row(5),
        |first, rules| {
            send(first, rules, Outcome::Success);
        },
        |first, rules| {
            first.update(rules, |machine| machine.trip(rules, Instant::now()));
        },
        |first, rules| {
            assert_eq!(state(first), State::Open);
            assert!(matches!(first.acquire(rules).0, Decision::Refuse { .. }));
        },
    );
}

#[test]
fn a_reset_racing_a_tripping_failure_leaves_the_words_of_whichever_came_last() {
    race(
        in_a_row(1),
        |first, rules| {
            send(first, rules, Outcome::Failure);
        },
        |first, rules| {
            first.update(rules, Machine::reset);
        },
        |_, _| {},
    );
}

#[test]
fn a_send_that_starts_after_a_trip_was_seen_is_refused() {
    loom::model(|| {
        let rules = in_a_row(1);
        let first = Arc::new(FirstKey::new("smtp", &rules));
        let tripped = Arc::new(AtomicBool::new(false));
        let (first_b, rules_b, tripped_b) =
            (Arc::clone(&first), rules.clone(), Arc::clone(&tripped));
        let tripping = thread::spawn(move || {
            send(&first_b, &rules_b, Outcome::Failure);
            tripped_b.store(true, Ordering::Release);
        });
        if tripped.load(Ordering::Acquire) {
            let (decision, _) = first.acquire(&rules);
            assert!(
                matches!(decision, Decision::Refuse { .. }),
                "let go after the trip: {decision:?}"
            );
        } else {
            send(&first, &rules, Outcome::Success);
        }
        tripping.join().unwrap();
        assert_words_agree(&first, &rules);
    });
}
