//! The guide's configuration reference (`src/guide/configuration.md`, "Every setting")
//! against the configuration reader: for each table, the reader is asked which settings it
//! takes (an unknown setting's error lists them), and the guide's table must name exactly
//! those. A setting the reader learns and the guide does not document, or one the guide
//! documents and the reader refuses, fails here.
#![cfg(all(
    feature = "config",
    feature = "smtp",
    feature = "outbox",
    feature = "redis",
    feature = "ses",
    feature = "sendgrid",
    feature = "mailgun"
))]

use std::collections::{BTreeMap, BTreeSet};

use mail_breaker::config::MailerConfig;

/// The guide's chapter.
const GUIDE: &str = include_str!("../src/guide/configuration.md");

/// A setting no table takes.
const UNKNOWN: &str = "not_a_setting";

/// The rows of the table after `heading` in the guide: first column (backticks taken off) to
/// the set of second columns.
fn guide_table(heading: &str) -> BTreeMap<String, BTreeSet<String>> {
    let after = GUIDE
        .split_once(heading)
        .unwrap_or_else(|| panic!("the guide has no `{heading}`"))
        .1;
    let mut table: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let rows = after
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2); // the header and its rule
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(&place), Some(&setting)) = (cells.get(1), cells.get(2)) else {
            panic!("a row of the guide's table without two cells: {row}");
        };
        for place in place.split(", ") {
            table
                .entry(place.trim_matches('`').to_owned())
                .or_default()
                .insert(setting.trim_matches('`').to_owned());
        }
    }
    table
}

/// What the reader says a table takes: the list in its error for an unknown setting.
fn reader_settings(document: &str) -> BTreeSet<String> {
    let error = MailerConfig::from_toml(document)
        .expect_err("a document with a setting no table takes is refused");
    assert!(
        error.setting().ends_with(UNKNOWN),
        "the error names the unknown setting, not {}: {error}",
        error.setting()
    );
    let (_, list) = error
        .reason()
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("the reader's error lists no settings: {error}"));
    list.split(", ").map(str::to_owned).collect()
}

/// A document with [`UNKNOWN`] in the table at `place` (the guide's first column), and what
/// that table needs besides.
fn document_with_unknown(place: &str) -> String {
    let member = "[[member]]\nurl = \"smtp://relay.example.com\"\n";
    match place {
        "the stack" => format!("{UNKNOWN} = 1\n{member}"),
        "member" => format!("{member}{UNKNOWN} = 1\n"),
        "member.breaker" => format!("{member}breaker = {{ {UNKNOWN} = 1 }}\n"),
        "member.rate" => format!("{member}rate = {{ per_second = 1, {UNKNOWN} = 1 }}\n"),
        "member.reputation" => format!("{member}reputation = {{ {UNKNOWN} = 1 }}\n"),
        "member.reputation.hard_bounces" => {
            format!("{member}reputation = {{ hard_bounces = {{ {UNKNOWN} = 1 }} }}\n")
        }
        "member.reputation.complaints" => {
            format!("{member}reputation = {{ complaints = {{ {UNKNOWN} = 1 }} }}\n")
        }
        "retry" => format!("retry = {{ {UNKNOWN} = 1 }}\n{member}"),
        "retry.budget" => {
            format!("retry = {{ budget = {{ tokens = 10, {UNKNOWN} = 1 }} }}\n{member}")
        }
        "outbox" => {
            format!("outbox = {{ url = \"sqlite:///tmp/outbox.db\", {UNKNOWN} = 1 }}\n{member}")
        }
        "redis" => {
            format!("redis = {{ url = \"redis://127.0.0.1/\", {UNKNOWN} = 1 }}\n{member}")
        }
        "webhooks" => format!("webhooks = {{ {UNKNOWN} = 1 }}\n{member}"),
        provider if provider.starts_with("webhooks.") => {
            let provider = provider.trim_start_matches("webhooks.");
            format!("webhooks = {{ {provider} = {{ {UNKNOWN} = 1 }} }}\n{member}")
        }
        other => panic!("the guide's table names a place the test does not know: {other}"),
    }
}

#[test]
fn the_guide_names_every_setting_of_every_table_the_reader_takes_and_no_other() {
    let guide = guide_table("# Every setting");
    let places = [
        "the stack",
        "member",
        "member.breaker",
        "member.rate",
        "member.reputation",
        "member.reputation.hard_bounces",
        "member.reputation.complaints",
        "retry",
        "retry.budget",
        "outbox",
        "redis",
        "webhooks",
        "webhooks.ses",
        "webhooks.postmark",
        "webhooks.sendgrid",
        "webhooks.mailgun",
        "webhooks.resend",
    ];
    assert_eq!(
        guide.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        places.into_iter().collect::<BTreeSet<_>>(),
        "the guide's table of settings has a row for each table of the configuration"
    );
    let mut differences = Vec::new();
    for place in places {
        // Without the `webhooks` feature the reader refuses the reputation table whole.
        if (place.starts_with("member.reputation") || place.starts_with("webhooks"))
            && !cfg!(feature = "webhooks")
        {
            continue;
        }
        let read = reader_settings(&document_with_unknown(place));
        let documented = &guide[place];
        for missing in read.difference(documented) {
            differences.push(format!(
                "{place}: the reader takes `{missing}`, the guide does not name it"
            ));
        }
        for extra in documented.difference(&read) {
            differences.push(format!(
                "{place}: the guide names `{extra}`, the reader does not take it"
            ));
        }
    }
    assert!(differences.is_empty(), "\n{}\n", differences.join("\n"));
}

/// What a provider's URL takes, from the reader's error for an unknown option in `url`.
fn provider_options(url: &str) -> BTreeSet<String> {
    let dsn = format!("{url}{UNKNOWN}=1");
    let error = MailerConfig::from_dsn(&dsn).expect_err("an unknown option is refused");
    let reason = error.reason();
    let (_, list) = reason
        .split_once(" takes ")
        .or_else(|| reason.split_once("expected one of "))
        .unwrap_or_else(|| panic!("the reader's error lists no options: {error}"));
    list.split(", ").map(str::to_owned).collect()
}

#[test]
fn the_guide_names_every_option_of_the_providers_urls_the_reader_takes() {
    let guide = guide_table("takes options of its own");
    for (provider, url) in [
        ("smtp://", "smtp://relay.example.com?"),
        ("ses://", "ses://eu-west-1?"),
        ("sendgrid://", "sendgrid://KEY@default?"),
        ("mailgun://", "mailgun://KEY:mg.example.com@default?"),
    ] {
        let documented = guide.get(provider).cloned().unwrap_or_default();
        assert_eq!(
            provider_options(url),
            documented,
            "{provider}: the reader's options against the guide's"
        );
    }
}

#[test]
fn the_guides_table_reader_reads_each_row_under_its_place() {
    let guide = guide_table("# Every setting");
    assert!(guide["member.breaker"].contains("threshold"));
    assert!(guide["the stack"].contains("strategy"));
    assert!(!guide["member"].contains("threshold"));
}
