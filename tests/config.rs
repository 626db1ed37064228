//! A whole stack's configuration read from a DSN and from TOML (DESIGN §14): the same
//! settings either way, errors that name the setting's path, nothing unknown ignored, no
//! secret shown, and no input that makes it panic.
#![cfg(all(feature = "config", feature = "smtp"))]

use mail_breaker::config::MailerConfig;
use proptest::prelude::*;

/// The path an error names, for `text` read as a DSN.
fn dsn_error(text: &str) -> (String, String) {
    let error = MailerConfig::from_dsn(text).unwrap_err();
    (error.setting().to_owned(), error.reason().to_owned())
}

/// The path an error names, for `text` read as TOML.
fn toml_error(text: &str) -> (String, String) {
    let error = MailerConfig::from_toml(text).unwrap_err();
    (error.setting().to_owned(), error.reason().to_owned())
}

#[test]
fn a_dsn_and_its_toml_read_as_the_same_configuration() {
    let dsn = MailerConfig::from_dsn(
        "retry(failover(smtp://relay.example.com?tls=required&breaker.threshold=5&breaker.reset=30s \
         smtp://backup.example.com:2525?name=backup&rate=14/s))?attempts=4&delay=2s",
    )
    .unwrap();
    let toml = MailerConfig::from_toml(
        r#"
        strategy = "failover"
        retry = { attempts = 4, delay = "2s" }

        [[member]]
        url = "smtp://relay.example.com?tls=required"
        breaker = { threshold = 5, reset = "30s" }

        [[member]]
        url = "smtp://backup.example.com:2525"
        name = "backup"
        rate = { per_second = 14 }
        "#,
    )
    .unwrap();
    assert_eq!(dsn, toml);
    assert_eq!(dsn.members(), 2);
}

#[test]
fn symfonys_failover_and_roundrobin_forms_read_nested_one_level_inside_a_retry() {
    for dsn in [
        "failover(smtp://a.example.com smtp://b.example.com)",
        "roundrobin(smtp://a.example.com smtp://b.example.com)",
        "retry(failover(smtp://a.example.com smtp://b.example.com))?attempts=3",
        "retry(roundrobin(smtp://a.example.com smtp://b.example.com))",
        "retry(smtp://a.example.com)",
    ] {
        MailerConfig::from_dsn(dsn).unwrap_or_else(|error| panic!("{dsn}: {error}"));
    }
    assert_eq!(
        dsn_error("failover(roundrobin(smtp://a smtp://b))").0,
        "dsn",
        "a pool inside a pool"
    );
}

#[test]
fn a_setting_out_of_range_names_its_path_and_says_what_was_expected() {
    assert_eq!(
        toml_error(
            r#"
            [[member]]
            url = "smtp://a.example.com"
            [[member]]
            url = "smtp://b.example.com"
            breaker = { threshold = "five" }
            "#
        ),
        (
            "member[1].breaker.threshold".to_owned(),
            r#"expected a whole number of at least 1, got "five""#.to_owned()
        )
    );
    assert_eq!(
        dsn_error("failover(smtp://a smtp://b?breaker.reset=30)").0,
        "member[1].breaker.reset"
    );
    assert_eq!(
        dsn_error("smtp://a?retry.attempts=0"),
        (
            "retry.attempts".to_owned(),
            r#"expected a whole number of at least 1, got "0""#.to_owned()
        )
    );
}

#[test]
fn an_unknown_setting_is_an_error_naming_it_never_ignored() {
    let (path, reason) = dsn_error("smtp://a?breaker.treshold=5");
    assert_eq!(path, "member[0].breaker.treshold");
    assert!(reason.contains("threshold"), "{reason}");
    assert_eq!(
        toml_error("colour = \"blue\"\n[[member]]\nurl = \"smtp://a\"").0,
        "colour"
    );
}

#[test]
fn a_provider_the_crate_does_not_know_is_an_error_on_its_url() {
    assert_eq!(dsn_error("http://example.com").0, "member[0].url");
    assert_eq!(
        dsn_error("failover(smtp://a.example.com ftp://b.example.com)").0,
        "member[1].url"
    );
}

#[test]
fn a_shared_rate_limit_without_redis_is_an_error() {
    assert_eq!(
        dsn_error("smtp://a?rate=14/s&rate.shared=true").0,
        "member[0].rate.shared"
    );
}

#[test]
fn a_breaker_counts_in_a_row_or_at_a_rate_not_both() {
    assert_eq!(
        dsn_error("smtp://a?breaker.threshold=5&breaker.error_rate=50%25").0,
        "member[0].breaker.error_rate"
    );
    MailerConfig::from_dsn(
        "smtp://a?breaker.error_rate=50%25&breaker.min_calls=20&breaker.window=1m",
    )
    .unwrap();
}

#[test]
fn a_retry_budget_is_the_default_one_or_its_three_numbers_checked() {
    MailerConfig::from_dsn("smtp://a?retry.budget=true").unwrap();
    MailerConfig::from_dsn("smtp://a?retry.budget.tokens=100&retry.budget.error_cost=10").unwrap();
    assert_eq!(
        dsn_error("smtp://a?retry.budget.tokens=10&retry.budget.min_tokens=20").0,
        "retry.budget.min_tokens"
    );
    assert_eq!(dsn_error("smtp://a?retry.budget=maybe").0, "retry.budget");
}

#[test]
fn at_most_once_reads_the_same_from_a_dsn_and_from_toml() {
    let dsn = MailerConfig::from_dsn(
        "failover(smtp://a.example.com smtp://b.example.com)?at_most_once=true",
    )
    .unwrap();
    let toml = MailerConfig::from_toml(
        "strategy = \"failover\"\nat_most_once = true\n\
         [[member]]\nurl = \"smtp://a.example.com\"\n[[member]]\nurl = \"smtp://b.example.com\"",
    )
    .unwrap();
    assert_eq!(dsn, toml);
    assert_ne!(
        dsn,
        MailerConfig::from_dsn("failover(smtp://a.example.com smtp://b.example.com)").unwrap()
    );
}

#[test]
fn environment_variables_fill_in_values_and_a_missing_one_is_named() {
    // SAFETY: no other test of this binary reads or writes these variables.
    unsafe { std::env::set_var("MAIL_BREAKER_CONFIG_TEST_PASSWORD", "hunter2") };
    let config = MailerConfig::from_dsn(
        "smtp://app:${MAIL_BREAKER_CONFIG_TEST_PASSWORD}@relay.example.com?tls=required",
    )
    .unwrap();
    assert!(!format!("{config:?}").contains("hunter2"));
    let (path, reason) =
        dsn_error("smtp://app:${MAIL_BREAKER_CONFIG_TEST_UNSET}@relay.example.com");
    assert_eq!(path, "member[0].url");
    assert_eq!(
        reason,
        "the environment variable MAIL_BREAKER_CONFIG_TEST_UNSET is not set"
    );
}

#[test]
fn any_serde_format_reads_as_toml_does() {
    let json = r#"{"member": [{"url": "smtp://a.example.com", "breaker": {"threshold": 3}}]}"#;
    let from_json: MailerConfig = serde_json::from_str(json).unwrap();
    let from_toml = MailerConfig::from_toml(
        "[[member]]\nurl = \"smtp://a.example.com\"\nbreaker = { threshold = 3 }",
    )
    .unwrap();
    assert_eq!(from_json, from_toml);
    let error = serde_json::from_str::<MailerConfig>(r#"{"member": [{"url": 5}]}"#).unwrap_err();
    assert!(error.to_string().contains("member[0].url"), "{error}");
}

/// Where an error may point: the DSN or TOML text itself, or a setting's path.
fn names_a_path(setting: &str) -> bool {
    let roots = [
        "dsn",
        "toml",
        "configuration",
        "strategy",
        "member",
        "retry",
        "outbox",
        "redis",
    ];
    roots.iter().any(|root| {
        setting == *root
            || setting.starts_with(&format!("{root}."))
            || setting.starts_with(&format!("{root}["))
    }) || !setting.contains('.') && !setting.is_empty()
}

/// A member's URL with a secret in each place a member's secret goes: an SMTP password, an
/// API's key.
fn member_with_secrets() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "smtp://app:SECRET-1@relay.example.com?tls=required",
        "smtps://app:SECRET-2@relay.example.com:465",
        "smtp://b.example.com:2525?breaker.threshold=3&rate=14/s",
        "postmark://SECRET-4@default?rate=10/s",
        "resend://SECRET-5@default",
        "sendgrid://SECRET-6@default?region=eu",
        "mailgun://SECRET-7:mg.example.com@default?region=eu",
    ])
    .prop_map(str::to_owned)
}

/// A pool of members with secrets, as a DSN.
fn pool_with_secrets() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(member_with_secrets(), 1..4),
        prop::sample::select(vec!["failover", "roundrobin"]),
    )
        .prop_map(|(members, strategy)| format!("{strategy}({})", members.join(" ")))
}

/// A DSN that reads, with a secret in each place a secret goes: the members', and the
/// stack's (Redis's password, the outbox database's).
fn dsn_with_secrets() -> impl Strategy<Value = String> {
    let stack = prop::sample::select(vec![
        "",
        "?redis=redis://mailer:SECRET-8@redis.example.com:6379/&redis.namespace=app",
        "?outbox=postgres://app:SECRET-9@db.example.com/mail&outbox.concurrency=4",
        "?retry.attempts=3",
    ]);
    (pool_with_secrets(), stack).prop_map(|(pool, stack)| format!("{pool}{stack}"))
}

/// Each secret of the documents above as it is written: with the delimiters that make it
/// the password or the key of its URL.
const SECRETS_AS_WRITTEN: [&str; 9] = [
    ":SECRET-1@",
    ":SECRET-2@",
    ":SECRET-3@",
    "//SECRET-4@",
    "//SECRET-5@",
    "//SECRET-6@",
    "//SECRET-7:mg.example.com@",
    ":SECRET-8@",
    ":SECRET-9@",
];

/// `text` with a few characters inserted, deleted or replaced at random, anywhere but in and
/// around its secrets as written: an edit there would make a secret the host of its URL (an
/// `@` deleted), which may be shown, and so no longer a secret.
fn mutated(base: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (
        base,
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<char>()), 0..6),
    )
        .prop_map(|(text, edits)| {
            let mut chars: Vec<char> = text.chars().collect();
            for (at, kind, c) in edits {
                let at = at.index(chars.len() + 1);
                if touches_a_secret(&chars, at) {
                    continue;
                }
                match kind {
                    0 => chars.insert(at, c),
                    1 if at < chars.len() => {
                        chars.remove(at);
                    }
                    _ if at < chars.len() => chars[at] = c,
                    _ => {}
                }
            }
            chars.into_iter().collect()
        })
}

/// Whether position `at` of `chars` is in, or at either end of, a secret as written.
fn touches_a_secret(chars: &[char], at: usize) -> bool {
    SECRETS_AS_WRITTEN.iter().any(|secret| {
        let secret: Vec<char> = secret.chars().collect();
        chars
            .windows(secret.len())
            .enumerate()
            .any(|(start, window)| window == secret && (start..=start + secret.len()).contains(&at))
    })
}

fn toml_document() -> impl Strategy<Value = String> {
    let documents = vec![
        "strategy = \"roundrobin\"\n[[member]]\nurl = \"smtp://a.example.com\"\nbreaker = { threshold = 5, reset = \"30s\" }\n[[member]]\nurl = \"smtp://b.example.com\"\nrate = { per_second = 14, burst = 2 }\n[retry]\nattempts = 4\ninitial = \"1s\"\nmax_delay = \"1m\"\n",
        "[[member]]\nurl = \"smtp://app:SECRET-3@relay.example.com?tls=required\"\nname = \"relay\"\npriority = 1\n",
        "[[member]]\nurl = \"smtp://a\"\n[outbox]\nurl = \"sqlite:///tmp/outbox.db\"\nconcurrency = 8\nlease = \"5m\"\n",
        "[[member]]\nurl = \"postmark://SECRET-4@default\"\n[[member]]\nurl = \"mailgun://SECRET-7:mg.example.com@default\"\n[redis]\nurl = \"rediss://mailer:SECRET-8@redis.example.com:6380/\"\n[outbox]\nurl = \"postgres://app:SECRET-9@db.example.com/mail\"\n",
    ];
    prop::sample::select(documents).prop_map(str::to_owned)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_500))]

    #[test]
    fn no_dsn_makes_it_panic_and_every_error_names_a_path(text in ".{0,120}") {
        if let Err(error) = MailerConfig::from_dsn(&text) {
            prop_assert!(names_a_path(error.setting()), "{:?}", error.setting());
        }
    }

    #[test]
    fn no_mutated_dsn_makes_it_panic_or_shows_a_secret(text in mutated(dsn_with_secrets())) {
        match MailerConfig::from_dsn(&text) {
            Ok(config) => prop_assert!(!format!("{config:?}").contains("SECRET-"), "{config:?}"),
            Err(error) => {
                prop_assert!(names_a_path(error.setting()), "{:?}", error.setting());
                let shown = format!("{error} {error:?}");
                prop_assert!(!shown.contains("SECRET-"), "{shown}");
            }
        }
    }

    #[test]
    fn no_toml_makes_it_panic_and_every_error_names_a_path(text in ".{0,200}") {
        if let Err(error) = MailerConfig::from_toml(&text) {
            prop_assert!(names_a_path(error.setting()), "{:?}", error.setting());
        }
    }

    #[test]
    fn no_mutated_toml_makes_it_panic_or_shows_a_secret(text in mutated(toml_document())) {
        match MailerConfig::from_toml(&text) {
            Ok(config) => prop_assert!(!format!("{config:?}").contains("SECRET-"), "{config:?}"),
            Err(error) => {
                prop_assert!(names_a_path(error.setting()), "{:?}", error.setting());
                let shown = format!("{error} {error:?}");
                prop_assert!(!shown.contains("SECRET-"), "{shown}");
            }
        }
    }

    /// A mailer built from a DSN (members only: building connects to no server) shows no
    /// secret in its `Debug`, and an error at build shows none either.
    #[test]
    fn no_mutated_dsn_builds_a_mailer_that_shows_a_secret(text in mutated(pool_with_secrets())) {
        let Ok(config) = MailerConfig::from_dsn(&text) else {
            return Ok(());
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let shown = match runtime.block_on(config.build()) {
            Ok(mailer) => format!("{mailer:?}"),
            Err(error) => format!("{error} {error:?}"),
        };
        prop_assert!(!shown.contains("SECRET-"), "{shown}");
    }
}

#[test]
fn an_smtp_members_connection_settings_read_the_same_from_a_dsn_and_from_toml() {
    let dsn = MailerConfig::from_dsn(
        "smtp://relay.example.com?tls=required&timeout=10s&max_connections=10&idle_timeout=30s\
         &max_messages_per_connection=100&pipelining=false&chunking=false",
    )
    .unwrap();
    let toml = MailerConfig::from_toml(
        "[[member]]\nurl = \"smtp://relay.example.com?tls=required\"\ntimeout = \"10s\"\n\
         max_connections = 10\nidle_timeout = \"30s\"\nmax_messages_per_connection = 100\n\
         pipelining = false\nchunking = false",
    )
    .unwrap();
    assert_eq!(dsn, toml);
    assert_ne!(
        dsn,
        MailerConfig::from_dsn("smtp://relay.example.com?tls=required").unwrap(),
        "the settings are kept"
    );
}

#[cfg(all(
    feature = "postmark",
    feature = "resend",
    feature = "sendgrid",
    feature = "ses"
))]
#[test]
fn an_smtp_connection_setting_on_a_member_that_is_not_smtp_is_an_error_naming_it() {
    for (dsn, setting) in [
        (
            "postmark://KEY@default?max_connections=3",
            "member[0].max_connections",
        ),
        (
            "resend://KEY@default?idle_timeout=30s",
            "member[0].idle_timeout",
        ),
        (
            "sendgrid://KEY@default?max_messages_per_connection=5",
            "member[0].max_messages_per_connection",
        ),
        ("ses://eu-west-1?pipelining=false", "member[0].pipelining"),
        (
            "failover(smtp://a postmark://KEY@default?chunking=true)",
            "member[1].chunking",
        ),
    ] {
        let (got, reason) = dsn_error(dsn);
        assert_eq!(got, setting, "{dsn}");
        assert_eq!(
            reason,
            "only an smtp:// or smtps:// member has this setting"
        );
    }
    assert!(
        MailerConfig::from_dsn("postmark://KEY@default?timeout=10s").is_ok(),
        "every member has a timeout"
    );
}

#[test]
fn a_timeout_of_zero_is_an_error_naming_it() {
    assert_eq!(
        dsn_error("smtp://relay.example.com?timeout=0s"),
        (
            "member[0].timeout".to_owned(),
            r#"expected a duration above zero, got "0s""#.to_owned()
        )
    );
    assert_eq!(
        dsn_error("smtp://relay.example.com?idle_timeout=0ms").0,
        "member[0].idle_timeout"
    );
}

#[cfg(all(feature = "postmark", feature = "sendgrid", feature = "mailgun"))]
#[test]
fn an_option_an_api_does_not_take_is_an_error_naming_the_api_and_what_it_takes() {
    assert_eq!(
        dsn_error("postmark://KEY@default?region=eu").1,
        "the option `region` is not one of this provider's: postmark takes no options"
    );
    assert_eq!(
        dsn_error("sendgrid://KEY@default?colour=red").1,
        "the option `colour` is not one of this provider's: sendgrid takes region"
    );
    // Two members run together (a space lost): the second's URL is not shown, its key with it.
    let (setting, reason) = dsn_error(
        "roundrobin(mailgun://K:mg.example.com@default?region=eu&resend://SECRET-5@default)",
    );
    assert_eq!(setting, "member[0].url");
    assert_eq!(
        reason,
        "the option holding a URL or an address is not one of this provider's: mailgun takes region"
    );
}

#[test]
fn a_setting_that_holds_a_url_is_named_by_where_it_is_never_shown() {
    // `redis=` lost its `=`: the whole URL became a setting's name.
    let (setting, reason) =
        dsn_error("failover(smtp://a.example.com)?redisredis://mailer:SECRET-8@redis.example.com/");
    assert_eq!(setting, "configuration");
    assert!(!reason.contains("SECRET"), "{reason}");
    assert!(
        reason.starts_with("a URL or an address (is an `=` missing?) is not a setting here"),
        "{reason}"
    );
}

#[test]
fn a_setting_with_an_empty_name_is_named_by_where_it_is() {
    let (setting, reason) = dsn_error("failover(smtp://a.example.com)?.redis.namespace=app");
    assert_eq!(setting, "configuration");
    assert!(
        reason.starts_with("an empty name is not a setting here"),
        "{reason}"
    );
}

/// Run by the default build (`cargo test --test config`, in `.ci/run`), which has no HTTP
/// API and no Redis.
#[cfg(not(feature = "postmark"))]
#[test]
fn a_provider_this_build_does_not_have_is_an_error_naming_its_feature() {
    let (setting, reason) = dsn_error("postmark://KEY@default");
    assert_eq!(setting, "member[0].url");
    assert!(reason.contains("`postmark` feature"), "{reason}");
}

#[cfg(not(feature = "redis"))]
#[test]
fn a_redis_store_in_a_build_without_redis_is_an_error_naming_it() {
    let (setting, reason) = dsn_error("smtp://a.example.com?redis=redis://127.0.0.1/");
    assert_eq!(setting, "redis");
    assert!(reason.contains("`redis` feature"), "{reason}");
}

#[cfg(not(feature = "redis"))]
#[test]
fn a_suppression_list_in_redis_in_a_build_without_redis_is_an_error_naming_it() {
    let (setting, reason) = dsn_error(
        "smtp://a.example.com?outbox=sqlite:///tmp/o.db&suppression=true&suppression.store=redis",
    );
    assert_eq!(setting, "suppression.store");
    assert!(reason.contains("`redis` feature"), "{reason}");
}

#[cfg(all(feature = "sendgrid", feature = "mailgun"))]
#[test]
fn an_apis_region_is_eu_or_us_and_us_is_the_default() {
    let read = |dsn: &str| MailerConfig::from_dsn(dsn).unwrap();
    for api in [
        "sendgrid://KEY@default",
        "mailgun://KEY:mg.example.com@default",
    ] {
        assert_eq!(read(&format!("{api}?region=us")), read(api), "{api}");
        assert_ne!(read(&format!("{api}?region=eu")), read(api), "{api}");
        assert_eq!(
            dsn_error(&format!("{api}?region=asia")).1,
            "region: expected eu or us"
        );
    }
}

#[cfg(feature = "mailgun")]
#[test]
fn a_mailgun_member_without_its_sending_domain_is_an_error() {
    for dsn in ["mailgun://KEY@default", "mailgun://KEY:@default"] {
        let (setting, reason) = dsn_error(dsn);
        assert_eq!(setting, "member[0].url");
        assert_eq!(
            reason,
            "names no sending domain: mailgun://KEY:DOMAIN@default"
        );
    }
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_cluster_reads_its_nodes_from_commas_in_a_dsn_as_from_a_list_in_toml() {
    let dsn = MailerConfig::from_dsn(
        "smtp://a.example.com?redis.cluster=redis://10.0.0.1:6379/,redis://10.0.0.2:6379/",
    )
    .unwrap();
    let toml = MailerConfig::from_toml(
        "[[member]]\nurl = \"smtp://a.example.com\"\n\
         [redis]\ncluster = [\"redis://10.0.0.1:6379/\", \"redis://10.0.0.2:6379/\"]",
    )
    .unwrap();
    assert_eq!(dsn, toml);
    let one = MailerConfig::from_dsn("smtp://a.example.com?redis.cluster=redis://10.0.0.1:6379/")
        .unwrap();
    assert_ne!(dsn, one, "both nodes are kept");
    assert_eq!(
        dsn_error("smtp://a.example.com?redis.cluster=,"),
        (
            "redis.cluster".to_owned(),
            "needs at least one node's URL".to_owned()
        )
    );
}

#[test]
fn the_strategy_is_failover_or_roundrobin() {
    let with = |strategy: &str| {
        MailerConfig::from_toml(&format!(
            "strategy = \"{strategy}\"\n[[member]]\nurl = \"smtp://a\"\n[[member]]\nurl = \"smtp://b\""
        ))
    };
    assert_ne!(with("roundrobin").unwrap(), with("failover").unwrap());
    assert_eq!(
        MailerConfig::from_dsn("roundrobin(smtp://a smtp://b)").unwrap(),
        with("roundrobin").unwrap()
    );
    assert_eq!(with("random").unwrap_err().setting(), "strategy");
}

#[test]
fn a_window_or_a_minimum_without_an_error_rate_is_an_error_naming_it() {
    for (query, setting) in [
        ("breaker.min_calls=4", "member[0].breaker.min_calls"),
        ("breaker.window=10s", "member[0].breaker.window"),
        (
            "breaker.threshold=3&breaker.window=10s",
            "member[0].breaker.window",
        ),
    ] {
        let (got, reason) = dsn_error(&format!("smtp://a.example.com?{query}"));
        assert_eq!(
            (got.as_str(), reason.as_str()),
            (setting, "counts only with an error_rate")
        );
    }
}

#[test]
fn a_retry_budgets_floor_may_be_as_high_as_its_tokens_and_no_higher() {
    let budget = |min: u32| {
        MailerConfig::from_toml(&format!(
            "retry = {{ budget = {{ tokens = 10, min_tokens = {min} }} }}\n[[member]]\nurl = \"smtp://a\""
        ))
    };
    assert!(budget(10).is_ok());
    let error = budget(11).unwrap_err();
    assert_eq!(error.setting(), "retry.budget.min_tokens");
    assert_eq!(error.reason(), "must not be more than tokens");
}

#[cfg(feature = "postgres")]
#[test]
fn an_outbox_is_on_sqlite_or_on_postgres_by_either_scheme() {
    for url in [
        "sqlite:///var/lib/app/outbox.db",
        "postgres://app@db.example.com/mail",
        "postgresql://app@db.example.com/mail",
    ] {
        let dsn = format!("smtp://a.example.com?outbox={url}");
        assert!(MailerConfig::from_dsn(&dsn).is_ok(), "{url}");
    }
    assert_eq!(
        dsn_error("smtp://a.example.com?outbox=mysql://db/mail"),
        (
            "outbox.url".to_owned(),
            "expected sqlite:///path/to/outbox.db or postgres://user:password@host/database"
                .to_owned()
        )
    );
}

#[test]
fn an_smtp_url_option_the_crate_does_not_know_is_an_error_naming_it_never_ignored() {
    for (option, name) in [
        ("TLS=required", "TLS"),
        ("require_tls=true", "require_tls"),
        ("tls=required&starttls=always", "starttls"),
    ] {
        let (path, reason) = dsn_error(&format!("smtp://relay.example.com?{option}"));
        assert_eq!(path, format!("member[0].url.{name}"), "{option}: {reason}");
        assert!(
            reason.contains("tls"),
            "{option}: says what is known: {reason}"
        );
        let (path, _) = toml_error(&format!(
            "[[member]]\nurl = \"smtp://relay.example.com?{option}\""
        ));
        assert_eq!(path, format!("member[0].url.{name}"), "{option}");
    }
}

#[test]
fn an_smtp_url_option_with_a_value_it_cannot_take_is_an_error_naming_it() {
    for (dsn, setting) in [
        ("smtp://relay.example.com?tls=REQUIRED", "member[0].url.tls"),
        ("smtps://relay.example.com?tls=none", "member[0].url.tls"),
        (
            "smtp://relay.example.com?tls=none&auth_without_tls=yes",
            "member[0].url.auth_without_tls",
        ),
        (
            "smtp://relay.example.com?tls=required&tls=none",
            "member[0].url.tls",
        ),
    ] {
        assert_eq!(dsn_error(dsn).0, setting, "{dsn}");
    }
}

#[test]
fn a_toml_members_url_keeps_the_settings_a_dsn_reads_from_the_same_text() {
    let url = "smtp://relay.example.com?tls=required&breaker.threshold=5&rate=14/s&name=relay";
    let dsn = MailerConfig::from_dsn(url).unwrap();
    let toml = MailerConfig::from_toml(&format!("[[member]]\nurl = \"{url}\"")).unwrap();
    assert_eq!(dsn, toml);
    let written_out = MailerConfig::from_toml(
        "[[member]]\nurl = \"smtp://relay.example.com?tls=required\"\nname = \"relay\"\n\
         breaker = { threshold = 5 }\nrate = { per_second = 14 }",
    )
    .unwrap();
    assert_eq!(toml, written_out);
}

#[test]
fn a_setting_given_in_a_toml_members_url_and_beside_it_is_an_error_naming_it() {
    let (path, reason) = toml_error(
        "[[member]]\nurl = \"smtp://relay.example.com?tls=required&breaker.threshold=5\"\n\
         breaker = { threshold = 3 }",
    );
    assert_eq!(path, "member[0].breaker.threshold");
    assert!(reason.contains("url"), "{reason}");
}

#[test]
fn clear_text_with_credentials_is_an_error_naming_auth_without_tls_unless_it_is_set() {
    let (path, reason) = dsn_error("smtp://app:SECRET-1@relay.example.com?tls=none");
    assert_eq!(path, "member[0].url.auth_without_tls");
    assert!(!reason.contains("SECRET-1"), "{reason}");
    MailerConfig::from_dsn("smtp://app:pw@relay.example.com?tls=none&auth_without_tls=true")
        .unwrap();
    MailerConfig::from_dsn("smtp://relay.example.com?tls=none").unwrap();
}

#[cfg(not(feature = "oauth2"))]
#[test]
fn oauth2_in_a_build_without_the_oauth2_feature_is_an_error_naming_it() {
    let (path, reason) = dsn_error(
        "smtp://me%40example.com@smtp.office365.com:587?auth=xoauth2\
         &oauth2.token_url=https://login.example.com/token&oauth2.client_id=id&oauth2.scope=s",
    );
    assert_eq!(path, "member[0].url.auth");
    assert!(reason.contains("oauth2"), "{reason}");
}
