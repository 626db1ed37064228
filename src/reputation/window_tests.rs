use proptest::prelude::*;

use super::*;

fn defaults() -> ReputationRules {
    ReputationRules::default()
}

fn bounces(n: u64) -> Counts {
    Counts {
        hard_bounces: n,
        ..Counts::default()
    }
}

fn complaints(n: u64) -> Counts {
    Counts {
        complaints: n,
        ..Counts::default()
    }
}

/// A member that sent `sends` and then heard `then`.
fn after(sends: u64, then: Counts) -> Reputation {
    let rules = defaults();
    let mut member = Reputation::new(&rules);
    member.record(&rules, Counts::sends(sends));
    member.record(&rules, then);
    member
}

#[test]
fn thirty_nine_hard_bounces_in_a_thousand_sends_warn_without_opening() {
    // 3.9 %: past warn (2 %) and throttle (3 %), under open (4 %).
    assert_eq!(after(1_000, bounces(39)).tier(), Tier::Throttle);
}

#[test]
fn forty_one_hard_bounces_in_a_thousand_sends_open() {
    assert_eq!(after(1_000, bounces(41)).tier(), Tier::Open);
}

#[test]
fn a_threshold_is_reached_at_its_value_and_not_one_event_below() {
    let cases = [
        (19, Tier::Healthy),
        (20, Tier::Warn),
        (29, Tier::Warn),
        (30, Tier::Throttle),
        (39, Tier::Throttle),
        (40, Tier::Open),
    ];
    for (hard_bounces, tier) in cases {
        assert_eq!(
            after(1_000, bounces(hard_bounces)).tier(),
            tier,
            "{hard_bounces} in 1,000"
        );
    }
}

#[test]
fn one_complaint_in_two_thousand_sends_does_nothing() {
    assert_eq!(after(2_000, complaints(1)).tier(), Tier::Healthy);
}

#[test]
fn three_complaints_in_two_thousand_five_hundred_sends_open() {
    assert_eq!(after(2_500, complaints(3)).tier(), Tier::Open);
}

#[test]
fn complaints_below_their_minimum_volume_decide_nothing_until_the_volume_is_reached() {
    let rules = defaults();
    let mut member = after(2_499, complaints(3));
    assert_eq!(member.tier(), Tier::Healthy, "2,499 sends: under 2,500");
    let change = member.record(&rules, Counts::sends(1));
    assert_eq!(
        change,
        TierChange {
            from: Tier::Healthy,
            to: Tier::Open
        }
    );
}

#[test]
fn hard_bounces_below_their_minimum_volume_decide_nothing() {
    assert_eq!(after(499, bounces(499)).tier(), Tier::Healthy);
    assert_eq!(after(500, bounces(20)).tier(), Tier::Open);
}

#[test]
fn a_throttle_lasts_until_the_rates_fall_below_warn() {
    let rules = defaults();
    let mut member = after(1_000, bounces(30));
    assert_eq!(member.tier(), Tier::Throttle);
    member.record(&rules, Counts::sends(499)); // 30 in 1,499: 2.001 %, under throttle's 3 %
    assert_eq!(member.tier(), Tier::Throttle, "still at or above warn");
    member.record(&rules, Counts::sends(1)); // 30 in 1,500: 2 %, still at warn
    assert_eq!(member.tier(), Tier::Throttle);
    member.record(&rules, Counts::sends(1));
    assert_eq!(member.tier(), Tier::Healthy);
}

#[test]
fn a_member_that_reaches_warn_from_below_is_warned_not_throttled() {
    let rules = defaults();
    let mut member = after(1_000, bounces(25));
    assert_eq!(member.tier(), Tier::Warn);
    member.record(&rules, bounces(4)); // 29 in 1,000: 2.9 %
    assert_eq!(member.tier(), Tier::Warn);
}

#[test]
fn a_throttle_that_fell_below_warn_warns_again_before_it_throttles_again() {
    let rules = defaults();
    let mut member = after(1_000, bounces(30));
    member.record(&rules, Counts::sends(501)); // 30 in 1,501: under 2 %
    assert_eq!(member.tier(), Tier::Healthy);
    member.record(&rules, bounces(1)); // 31 in 1,501: 2.07 %
    assert_eq!(member.tier(), Tier::Warn);
}

#[test]
fn an_open_breaker_stays_open_whatever_clean_mail_follows_until_a_reset() {
    let rules = defaults();
    let mut member = after(1_000, bounces(41));
    member.record(&rules, Counts::sends(1_000_000));
    assert_eq!(member.tier(), Tier::Open);
    assert_eq!(
        member.reset(),
        TierChange {
            from: Tier::Open,
            to: Tier::Healthy
        }
    );
    assert_eq!(member.standing(), Standing::default());
    member.record(&rules, Counts::sends(1_000));
    assert_eq!(member.tier(), Tier::Healthy, "the old bounces are gone");
}

#[test]
fn bounces_roll_out_of_the_window_with_their_bucket() {
    let rules = defaults();
    let mut member = after(1_000, bounces(30));
    member.record(&rules, Counts::sends(9_000));
    assert_eq!(
        member.window().hard_bounces,
        30,
        "still in the last 10,000 sends"
    );
    member.record(&rules, Counts::sends(1_000));
    assert_eq!(member.window().hard_bounces, 0);
    assert_eq!(
        member.window().sends,
        9_000,
        "nine full buckets and an empty new one"
    );
}

#[test]
fn rules_with_another_bucket_size_start_the_window_afresh_and_keep_it_open() {
    let rules = defaults();
    let mut member = after(1_000, bounces(41));
    let other = ReputationRules {
        window_sends: 20_000,
        ..rules
    };
    member.record(&other, Counts::sends(1));
    assert_eq!(member.window(), Counts::sends(1));
    assert_eq!(member.tier(), Tier::Open);
}

#[test]
fn a_tier_read_from_a_store_is_open_unless_it_is_a_known_number() {
    for tier in [Tier::Healthy, Tier::Warn, Tier::Throttle, Tier::Open] {
        assert_eq!(Tier::from_number(tier.number()), tier);
    }
    assert_eq!(Tier::from_number(-1), Tier::Open);
    assert_eq!(Tier::from_number(9), Tier::Open);
}

/// The rules as written, over every unit counted: each send, bounce and complaint is in the
/// bucket numbered by the sends before it (over the bucket size); the window is the current
/// bucket and the `buckets - 1` before it; each rate decides past its minimum volume, the
/// highest threshold reached wins; a throttle lasts while a rate is at or above warn; open
/// stays until reset.
#[derive(Default)]
struct Model {
    /// (bucket, what) for each unit: 0 a send, 1 a bounce, 2 a complaint.
    units: Vec<(u64, u8)>,
    sends: u64,
    open: bool,
    /// Whether the last tier was `Throttle`.
    throttled: bool,
}

impl Model {
    fn record(&mut self, rules: &ReputationRules, counts: Counts) -> Tier {
        let size = rules.bucket_sends();
        for _ in 0..counts.sends {
            self.units.push((self.sends / size, 0));
            self.sends += 1;
        }
        let current = self.sends / size;
        self.units
            .extend((0..counts.hard_bounces).map(|_| (current, 1)));
        self.units
            .extend((0..counts.complaints).map(|_| (current, 2)));
        let in_window = |what: u8| {
            self.units
                .iter()
                .filter(|(bucket, w)| *w == what && *bucket + u64::from(rules.buckets) > current)
                .count() as u64
        };
        let (sends, hard, complained) = (in_window(0), in_window(1), in_window(2));
        let rate_tier = |limits: &Limits, events: u64| {
            if sends == 0 || sends < limits.minimum_sends {
                return Tier::Healthy;
            }
            let rate = events as f64 / sends as f64 * 1e6;
            // Exact here: the model's numbers are small.
            [
                (limits.open, Tier::Open),
                (limits.throttle, Tier::Throttle),
                (limits.warn, Tier::Warn),
            ]
            .into_iter()
            .find(|(ppm, _)| rate >= f64::from(*ppm) - 1e-9)
            .map_or(Tier::Healthy, |(_, tier)| tier)
        };
        let mut tier =
            rate_tier(&rules.hard_bounces, hard).max(rate_tier(&rules.complaints, complained));
        // A throttle lasts while a rate is at or above its warn threshold.
        if tier == Tier::Warn && self.throttled {
            tier = Tier::Throttle;
        }
        self.throttled = tier == Tier::Throttle;
        self.open |= tier == Tier::Open;
        if self.open { Tier::Open } else { tier }
    }
}

fn small_rules() -> ReputationRules {
    // Small enough that random sequences cross every threshold and roll the window.
    ReputationRules {
        hard_bounces: Limits {
            warn: 100_000,
            throttle: 200_000,
            open: 300_000,
            minimum_sends: 5,
        },
        complaints: Limits {
            warn: 50_000,
            throttle: 50_000,
            open: 150_000,
            minimum_sends: 10,
        },
        window_sends: 20,
        buckets: 4,
    }
}

fn step() -> impl Strategy<Value = Counts> {
    prop_oneof![
        (1u64..8).prop_map(Counts::sends),
        (0u64..3, 0u64..2).prop_map(|(hard_bounces, complaints)| Counts {
            sends: 0,
            hard_bounces,
            complaints
        }),
        (0u64..4, 0u64..2, 0u64..2).prop_map(|(sends, hard_bounces, complaints)| Counts {
            sends,
            hard_bounces,
            complaints
        }),
    ]
}

proptest! {
    #[test]
    fn the_window_decides_as_the_rules_say_after_any_sequence(steps in prop::collection::vec(step(), 0..120)) {
        let rules = small_rules();
        prop_assert!(rules.check().is_ok());
        let mut member = Reputation::new(&rules);
        let mut model = Model::default();
        for counts in steps {
            let before = member.tier();
            let change = member.record(&rules, counts);
            let expected = model.record(&rules, counts);
            prop_assert_eq!(change, TierChange { from: before, to: expected });
        }
    }
}

#[test]
fn each_tier_has_its_name_in_text() {
    let names: Vec<String> = [Tier::Healthy, Tier::Warn, Tier::Throttle, Tier::Open]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(names, ["healthy", "warn", "throttle", "open"]);
}

#[test]
fn the_rates_are_events_over_sends_and_zero_without_sends() {
    let window = Counts {
        sends: 2_500,
        hard_bounces: 50,
        complaints: 2,
    };
    assert_eq!(window.hard_bounce_rate(), 0.02);
    assert_eq!(window.complaint_rate(), 0.0008);
    let nothing_sent = Counts {
        sends: 0,
        hard_bounces: 3,
        complaints: 1,
    };
    assert_eq!(nothing_sent.hard_bounce_rate(), 0.0);
    assert_eq!(nothing_sent.complaint_rate(), 0.0);
}

#[test]
fn a_change_is_a_change_only_between_two_tiers() {
    assert!(
        TierChange {
            from: Tier::Healthy,
            to: Tier::Warn
        }
        .changed()
    );
    assert!(
        !TierChange {
            from: Tier::Open,
            to: Tier::Open
        }
        .changed()
    );
}

#[test]
fn sends_past_a_whole_window_in_one_call_leave_the_window_full_of_them_alone() {
    let rules = defaults();
    let mut member = after(1_500, bounces(100));
    member.record(&rules, Counts::sends(25_000));
    // 26,500 sends in all: the current bucket holds 500, the nine before it 9,000.
    assert_eq!(member.window(), Counts::sends(9_500));
    assert_eq!(member.tier(), Tier::Open, "open stays open");
}
