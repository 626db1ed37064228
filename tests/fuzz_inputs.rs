//! Hostile input, generated: any SMTP reply a server can send lands in a category without a
//! panic, and any address lettre accepts finds its breaker under `Scope::RecipientDomain`.
//!
//! These are proptest cases that run with the other tests in CI; a failure prints the
//! smallest input that fails.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use lettre::Address;
use mail_breaker::{
    Category, CircuitBreakerTransport, Envelope, MemoryStore, Scope, SmtpTransport, State,
    Transport, classify_smtp_reply,
};
use proptest::prelude::*;
use support::raw_smtp::{Answer, RawSmtp};
use support::scripted::{Reply, Scripted};
use tokio::runtime::Runtime;

/// The categories a reply code's family may land in (DESIGN §7).
fn categories_of_family(code: u16) -> &'static [Category] {
    match code {
        421 => &[Category::ServiceUnavailable],
        400..=499 => &[Category::ServerError, Category::RateLimited],
        530 | 534 | 535 => &[Category::Authentication],
        // Too big (DESIGN §10): 552 always, and any 5xx whose text carries the status 5.3.4.
        552 => &[Category::InvalidMessage],
        500..=599 => &[Category::Rejected, Category::InvalidMessage],
        _ => &[Category::Network],
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn any_reply_code_and_text_lands_in_a_category_of_its_code_family(
        code in any::<u16>(),
        text in any::<String>(),
    ) {
        let error = classify_smtp_reply(code, &text);
        prop_assert!(
            categories_of_family(code).contains(&error.category()),
            "{code} {text:?} gave {:?}", error.category()
        );
        prop_assert_eq!(error.code(), format!("smtp.{code}"));
        prop_assert!(error.is_retryable() == error.category().is_retryable());
    }

    #[test]
    fn a_reply_is_rate_limited_only_when_it_is_a_4xx_with_a_4_7_status(
        code in 0u16..1000,
        status in "[0-9]{1,2}\\.[0-9]{1,4}\\.[0-9]{1,4}",
        words in "(rate|limit|too many|throttled|slow down|mailbox|greylisted| |[a-z]){0,12}",
    ) {
        let text = format!("{code} {status} {words}");
        let error = classify_smtp_reply(code, &text);
        if error.category() == Category::RateLimited {
            prop_assert!((400..=499).contains(&code) && code != 421, "{text}");
            // RFC 3463 allows up to three digits per part: "4.07.0" is the status 4.7.0.
            let parts: Vec<u32> = status.split('.').map(|part| part.parse().unwrap_or(u32::MAX)).collect();
            prop_assert!(parts[0] == 4 && parts[1] == 7, "{text}");
        }
    }

    #[test]
    fn a_4xx_reply_with_a_4_7_rate_status_is_rate_limited(
        code in (400u16..=499).prop_filter("not 421", |code| *code != 421),
        detail in 0u16..1000,
        // Words that say what is limited; "too many" alone does not (issue 46: Postfix's
        // `421 4.7.0 Error: too many errors`).
        word in "(rate|limit|too many connections|too many messages|throttl|throttled|slow down)",
    ) {
        let text = format!("{code} 4.7.{detail} {word}");
        prop_assert_eq!(classify_smtp_reply(code, &text).category(), Category::RateLimited);
    }

    #[test]
    fn an_address_in_a_reply_never_reaches_the_error_text(
        code in any::<u16>(),
        before in any::<String>(),
        local in "[a-zA-Z0-9._+-]{1,40}",
        after in any::<String>(),
    ) {
        let text = format!("{before} <{local}@example.org> {after}");
        let shown = classify_smtp_reply(code, &text).to_string();
        prop_assert!(!shown.contains(&format!("{local}@")), "{shown}");
    }
}

// ---- the same, through lettre over a real connection ----

/// One reply line as a server might send it: any code from 000 to 999, a space or a
/// continuation dash, any printable text (non-ASCII included).
fn reply_line() -> impl Strategy<Value = (u16, char, String)> {
    (
        0u16..1000,
        prop_oneof![Just(' '), Just('-')],
        "[^\r\n]{0,200}",
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_reply_line_to_mail_from_over_a_real_connection_is_answered_in_a_category(
        (code, separator, text) in reply_line(),
    ) {
        let runtime = runtime();
        let result = runtime.block_on(async {
            let line = format!("{code:03}{separator}{text}\r\n").into_bytes();
            let server = RawSmtp::start(b"220 raw.test ESMTP\r\n".to_vec(), move |command| {
                match command {
                    "MAIL" => Answer::SayAndHangUp(line.clone()),
                    other => Answer::healthy(other),
                }
            })
            .await;
            let smtp = SmtpTransport::unencrypted("127.0.0.1", server.port())
                .with_timeout(Duration::from_secs(10));
            smtp.send(&support::message()).await
        });
        match result {
            // lettre goes on after a 2xx or 3xx; the server has hung up by then.
            Ok(receipt) => prop_assert!(false, "delivered to a server that hung up: {receipt:?}"),
            Err(error) => {
                prop_assert!(error.category() != Category::Timeout, "a hang: {error}");
                if let Some(reply) = error.code().strip_prefix("smtp.").and_then(|c| c.parse::<u16>().ok()) {
                    prop_assert_eq!(reply, code, "{}", error);
                    prop_assert!(categories_of_family(reply).contains(&error.category()), "{}", error);
                } else {
                    prop_assert_eq!(error.category(), Category::Network, "{}", error);
                }
            }
        }
    }
}

// ---- Scope::RecipientDomain on any address ----

/// Breakers per recipient domain that open at the first failure, over a transport that fails.
fn domain_breakers(max_keys: usize) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(Scripted::answering(
        "provider",
        Reply::fail(Category::ServerError),
    ))
    .failure_threshold(1)
    .scope(Scope::RecipientDomain)
    .store(Arc::new(MemoryStore::with_max_keys(max_keys)))
    .build()
    .expect("valid settings")
}

/// Local parts: plain, punctuated, non-ASCII, and very long.
fn local_part() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9]{1,20}",
        "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]{1,64}",
        "[a-zA-Zäöüßéñ日本語Ωж]{1,30}",
        "[a-z]{60,300}", // lettre refuses local parts past 64 characters
        any::<String>(),
    ]
}

/// Domains: mixed-case ASCII, IDN (non-ASCII labels), up to many long labels, and anything.
fn domain() -> impl Strategy<Value = String> {
    let label = prop_oneof![
        "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?",
        "[a-zA-ZÄÖÜäöüßÉéÑñ日本語ΩωЖж]{1,20}",
    ];
    prop_oneof![
        4 => prop::collection::vec(label, 1..5).prop_map(|labels| labels.join(".")),
        1 => prop::collection::vec("[a-zA-Z]{63}", 1..40).prop_map(|labels| labels.join(".")),
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn any_address_lettre_accepts_opens_the_breaker_of_its_lower_cased_domain(
        parts in prop::collection::vec((local_part(), domain()), 1..5),
    ) {
        let addresses: Vec<Address> = parts
            .iter()
            .filter_map(|(local, domain)| Address::new(local, domain).ok())
            .collect();
        // Input lettre refuses never reaches a transport.
        prop_assume!(!addresses.is_empty());
        let envelope = Envelope::new(None, addresses.clone()).expect("recipients");
        let breakers = domain_breakers(10_000);
        runtime().block_on(async {
            let first = breakers.send_raw(&envelope, b"Subject: x\r\n\r\nhi").await;
            prop_assert!(first.is_err());
            let again = breakers.send_raw(&envelope, b"Subject: x\r\n\r\nhi").await;
            prop_assert_eq!(again.map_err(|e| e.code().to_owned()).unwrap_err(), "breaker.open");
            Ok::<(), TestCaseError>(())
        })?;
        let keys: BTreeSet<String> = addresses.iter().map(|a| a.domain().to_lowercase()).collect();
        for key in &keys {
            prop_assert_eq!(breakers.state_of(key), State::Open, "{}", key);
        }
        prop_assert_eq!(breakers.tracked_keys(), keys.len());
        prop_assert_eq!(breakers.inner().sends(), 1);
    }

    #[test]
    fn ascii_domains_that_differ_only_in_case_share_one_breaker(
        labels in prop::collection::vec("[a-zA-Z][a-zA-Z0-9]{0,20}", 1..4),
        flips in prop::collection::vec(any::<bool>(), 1..200),
    ) {
        let domain = labels.join(".");
        let flipped: String = domain
            .chars()
            .zip(flips.iter().cycle())
            .map(|(c, flip)| if *flip { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() })
            .collect();
        let first = Address::new("a", &domain).expect("a valid address");
        let second = Address::new("b", &flipped).expect("a valid address");
        let breakers = domain_breakers(10_000);
        runtime().block_on(async {
            let envelope = Envelope::new(None, vec![first]).expect("recipients");
            let _ = breakers.send_raw(&envelope, b"hi").await;
            let envelope = Envelope::new(None, vec![second]).expect("recipients");
            let refused = breakers.send_raw(&envelope, b"hi").await.unwrap_err();
            prop_assert_eq!(refused.code(), "breaker.open");
            Ok::<(), TestCaseError>(())
        })?;
        prop_assert_eq!(breakers.tracked_keys(), 1);
        prop_assert_eq!(breakers.state_of(&domain.to_ascii_lowercase()), State::Open);
    }
}

#[test]
fn ten_thousand_huge_distinct_failing_domains_keep_the_tracked_keys_within_the_bound() {
    // One failure each: a domain is tracked from its first failure.
    let failing = Scripted::answering("provider", Reply::fail(Category::Network));
    let breakers = CircuitBreakerTransport::builder(failing)
        .scope(Scope::RecipientDomain)
        .store(Arc::new(MemoryStore::with_max_keys(100)))
        .build()
        .expect("valid settings");
    let long_label = "x".repeat(63);
    runtime().block_on(async {
        for i in 0..10_000 {
            let domain = format!("{long_label}.{long_label}.D{i}.Example.ORG");
            let address = Address::new("user", &domain).expect("a valid address");
            let envelope = Envelope::new(None, vec![address]).expect("recipients");
            breakers
                .send_raw(&envelope, b"hi")
                .await
                .expect_err("failed");
            assert!(breakers.tracked_keys() <= 100);
        }
    });
    assert_eq!(breakers.tracked_keys(), 100);
}

#[test]
fn an_idn_domain_opens_the_breaker_of_its_lower_cased_unicode_form() {
    let breakers = domain_breakers(10_000);
    let address = Address::new("Jörg", "BÜCHER.Beispiel.DE").expect("a valid IDN address");
    runtime().block_on(async {
        let envelope = Envelope::new(None, vec![address]).expect("recipients");
        let _ = breakers.send_raw(&envelope, b"hi").await;
    });
    assert_eq!(breakers.state_of("bücher.beispiel.de"), State::Open);
    assert_eq!(breakers.tracked_keys(), 1);
}
