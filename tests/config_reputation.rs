//! A member's reputation breaker from a DSN or a TOML document (`reputation.*`), every key
//! checked as all others are (issue 64).

use mail_breaker::Mailer;
use mail_breaker::reputation::{Limits, ReputationRules, Tier};

#[tokio::test]
async fn a_members_reputation_keys_in_a_dsn_set_its_breaker() {
    let mailer = Mailer::from_dsn(
        "smtp://relay.example.com:587?name=relay&reputation.failover=true\
         &reputation.hard_bounces.open=3.5%25&reputation.hard_bounces.min_sends=800\
         &reputation.complaints.warn=0.02%25&reputation.window_sends=20000&reputation.buckets=20",
    )
    .unwrap()
    .build()
    .await
    .unwrap();
    let breaker = mailer.reputation("relay").expect("a reputation breaker");
    assert!(breaker.fails_over());
    let rules = breaker.rules();
    assert_eq!(rules.hard_bounces.open, 35_000);
    assert_eq!(rules.hard_bounces.minimum_sends, 800);
    assert_eq!(
        rules.hard_bounces.warn,
        Limits::HARD_BOUNCES.warn,
        "unset keeps the default"
    );
    assert_eq!(rules.complaints.warn, 200);
    assert_eq!((rules.window_sends, rules.buckets), (20_000, 20));
    assert_eq!(breaker.tier(), Tier::Healthy);
}

#[tokio::test]
async fn a_members_reputation_table_in_toml_sets_its_breaker_and_others_have_none() {
    let mailer = Mailer::from_toml(
        r#"
        [[member]]
        url = "smtp://relay.example.com:587"
        name = "relay"
        reputation = { complaints = { open = "0.1%", min_sends = 5000 } }

        [[member]]
        url = "smtp://backup.example.com:587"
        name = "backup"
        "#,
    )
    .unwrap()
    .build()
    .await
    .unwrap();
    let rules = mailer.reputation("relay").expect("configured").rules();
    assert_eq!(rules.complaints.open, 1_000);
    assert_eq!(rules.complaints.minimum_sends, 5_000);
    assert_eq!(rules.hard_bounces, ReputationRules::default().hard_bounces);
    assert!(mailer.reputation("backup").is_none());
    assert_eq!(mailer.reputations().count(), 1);
}

#[test]
fn an_unknown_reputation_key_is_an_error_naming_it() {
    let error =
        Mailer::from_dsn("smtp://relay.example.com?reputation.hard_bounces.opne=4%25").unwrap_err();
    assert_eq!(error.setting(), "member[0].reputation.hard_bounces.opne");
    let error = Mailer::from_dsn("smtp://relay.example.com?reputation.fail_over=true").unwrap_err();
    assert_eq!(error.setting(), "member[0].reputation.fail_over");
}

#[test]
fn a_reputation_rate_must_be_a_percentage_above_zero_and_at_most_a_hundred() {
    for bad in ["0", "101%25", "-1", "lots", "0.00001%25"] {
        let dsn = format!("smtp://relay.example.com?reputation.complaints.open={bad}");
        let error = Mailer::from_dsn(&dsn).unwrap_err();
        assert_eq!(
            error.setting(),
            "member[0].reputation.complaints.open",
            "{bad}"
        );
    }
}

#[tokio::test]
async fn a_reputation_rate_is_taken_from_one_part_per_million_to_a_hundred_percent() {
    let mailer = Mailer::from_dsn(
        "smtp://relay.example.com?name=relay&reputation.hard_bounces.open=100%25\
         &reputation.complaints.warn=0.0001%25",
    )
    .expect("100% is at most a hundred, 0.0001% is one part per million")
    .build()
    .await
    .unwrap();
    let rules = mailer.reputation("relay").expect("a breaker").rules();
    assert_eq!(rules.hard_bounces.open, 1_000_000);
    assert_eq!(rules.complaints.warn, 1);
}

#[tokio::test]
async fn reputation_thresholds_that_do_not_rise_are_an_error_naming_the_rate() {
    let error = Mailer::from_dsn("smtp://relay.example.com?reputation.hard_bounces.open=2.5%25")
        .unwrap()
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.setting(), "member[0].reputation.hard_bounces");
    assert!(error.reason().contains("must rise"), "{error}");
}

#[tokio::test]
async fn a_reputation_window_too_small_for_its_minimum_volume_is_an_error_naming_it() {
    let error = Mailer::from_dsn("smtp://relay.example.com?reputation.window_sends=1000")
        .unwrap()
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.setting(), "member[0].reputation.window_sends");
}

#[path = "../examples/support/mod.rs"]
mod embedded;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_members_mail_is_held_once_its_reputation_breaker_opens() {
    use mail_breaker::Transport;
    use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, Provider};
    let server = embedded::EmbeddedSmtp::start();
    let mailer = Mailer::from_dsn(&format!(
        "smtp://127.0.0.1:{}?name=relay&reputation.window_sends=100&reputation.buckets=10\
         &reputation.hard_bounces.min_sends=2&reputation.complaints.min_sends=2",
        server.port()
    ))
    .unwrap()
    .build()
    .await
    .unwrap();
    let message = || {
        mail_breaker::Message::builder()
            .from("app@example.com".parse().unwrap())
            .to("user@example.org".parse().unwrap())
            .body(String::from("hello"))
            .unwrap()
    };
    for _ in 0..2 {
        mailer.send(&message()).await.expect("healthy: sent");
    }
    let breaker = mailer.reputation("relay").expect("a reputation breaker");
    let mut bounce = DeliveryEvent::new(
        Provider::Ses,
        "bounce-1",
        EventKind::Bounced {
            bounce: BounceKind::Permanent,
            subtype: None,
        },
        "user@example.org",
        std::time::SystemTime::now(),
    );
    bounce.member = Some("relay".into());
    breaker.record(&[bounce]).await.unwrap();
    assert_eq!(breaker.tier(), Tier::Open, "one hard bounce in two sends");

    let held = mailer.send(&message()).await.expect_err("held");

    assert_eq!(held.code(), "reputation.open");
    assert!(held.is_reputation_hold());
    assert_eq!(server.accepted(), 2, "nothing more reached the provider");
}
