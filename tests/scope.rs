//! Which breaker a message answers to: one per lower-cased recipient domain, or one per key
//! of a custom function, with the number of breakers bounded (issue 4, acceptance 4).

mod support;

use std::time::Duration;

use mail_breaker::{
    Category, CircuitBreakerTransport, Envelope, Message, Receipt, Scope, SendError, State,
    Transport,
};
use support::message_to;
use support::scripted::{Reply, Scripted};

fn by_domain(inner: &Scripted, threshold: u32) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(threshold)
        .reset_timeout(Duration::from_secs(30))
        .scope(Scope::RecipientDomain)
        .build()
        .expect("valid settings")
}

fn failing() -> Scripted {
    Scripted::answering("p", Reply::fail(Category::Network))
}

/// A message from `app@example.com` to each of `recipients`.
fn message_to_all(recipients: &[&str]) -> Message {
    let mut builder = Message::builder().from("app@example.com".parse().expect("a sender"));
    for to in recipients {
        builder = builder.to(to.parse().expect("a recipient"));
    }
    builder
        .body(String::from("hello"))
        .expect("a valid message")
}

fn is_refused(result: &Result<Receipt, SendError>) -> bool {
    matches!(result, Err(error) if error.code() == "breaker.open")
}

/// Two failures to `failing_to`, at a breaker that opens at two, open the one
/// breaker of `domain`, which then holds a message to `held`.
async fn assert_one_breaker(failing_to: [&str; 2], domain: &str, held: &str) {
    let breaker = by_domain(&failing(), 2);
    for to in failing_to {
        let _ = breaker.send(&message_to(to)).await;
    }
    assert_eq!(breaker.state_of(domain), State::Open);
    assert!(is_refused(&breaker.send(&message_to(held)).await));
}

#[tokio::test(start_paused = true)]
async fn recipient_domains_are_lower_cased_into_one_breaker() {
    assert_one_breaker(
        ["a@Example.ORG", "b@EXAMPLE.org"],
        "example.org",
        "c@example.org",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn recipient_domains_with_capitals_past_ascii_are_lower_cased_into_one_breaker() {
    assert_one_breaker(
        ["a@bÜcher.example", "b@BÜCHER.example"],
        "bücher.example",
        "c@bücher.example",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_for_one_domain_does_not_hold_mail_for_another() {
    let inner = failing();
    let breaker = by_domain(&inner, 1);
    let _ = breaker.send(&message_to("user@down.example")).await;
    assert_eq!(breaker.state_of("down.example"), State::Open);

    inner.set_default(Reply::Ok);
    assert!(breaker.send(&message_to("user@up.example")).await.is_ok());
    assert_eq!(breaker.state_of("up.example"), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_message_to_two_domains_is_held_while_either_domain_is_open() {
    let inner = failing();
    let breaker = by_domain(&inner, 1);
    let _ = breaker.send(&message_to("user@down.example")).await;
    inner.set_default(Reply::Ok);

    let both = message_to_all(&["a@up.example", "b@down.example"]);
    assert!(is_refused(&breaker.send(&both).await));
    let reversed = message_to_all(&["b@down.example", "a@up.example"]);
    assert!(is_refused(&breaker.send(&reversed).await));
    assert_eq!(inner.sends(), 1, "neither was sent");
}

#[tokio::test(start_paused = true)]
async fn the_result_of_a_message_to_two_domains_counts_for_each_domain() {
    let breaker = by_domain(&failing(), 2);
    let both = message_to_all(&["a@one.example", "b@two.example", "c@one.example"]);
    let _ = breaker.send(&both).await;
    let _ = breaker.send(&both).await;
    assert_eq!(breaker.state_of("one.example"), State::Open);
    assert_eq!(breaker.state_of("two.example"), State::Open);
    assert_eq!(breaker.tracked_keys(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_message_held_by_one_domain_gives_back_the_probe_of_the_other() {
    let inner = failing();
    let breaker = by_domain(&inner, 1);
    let _ = breaker.send(&message_to("a@half-open.example")).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let _ = breaker.send(&message_to("b@open.example")).await;
    tokio::time::sleep(Duration::from_secs(11)).await; // half-open.example may probe now

    let both = message_to_all(&["a@half-open.example", "b@open.example"]);
    assert!(
        is_refused(&breaker.send(&both).await),
        "held by open.example"
    );
    inner.set_default(Reply::Ok);
    assert!(
        breaker
            .send(&message_to("a@half-open.example"))
            .await
            .is_ok(),
        "the probe slot was given back"
    );
    assert_eq!(breaker.state_of("half-open.example"), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_custom_scope_keys_breakers_by_its_function() {
    let inner = failing();
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .scope(Scope::custom(|envelope: &Envelope| {
            envelope
                .from()
                .map(|from| from.domain().to_owned())
                .unwrap_or_default()
        }))
        .build()
        .expect("valid settings");
    let _ = breaker.send(&message_to("user@example.org")).await;
    assert_eq!(
        breaker.state_of("example.com"),
        State::Open,
        "keyed by the sender's domain"
    );
    assert_eq!(breaker.state_of("example.org"), State::Closed);
    assert!(is_refused(
        &breaker.send(&message_to("other@example.net")).await
    ));
}

#[tokio::test(start_paused = true)]
async fn the_state_of_a_key_never_seen_is_closed() {
    let breaker = by_domain(&failing(), 1);
    assert_eq!(breaker.state_of("never.example"), State::Closed);
    assert_eq!(breaker.tracked_keys(), 0);
}

/// A provider that fails every send at once, for sends by the million.
#[derive(Debug)]
struct Fails;

#[async_trait::async_trait]
impl Transport for Fails {
    fn name(&self) -> &str {
        "fails"
    }

    async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        Err(SendError::new(Category::Network, "test.down", "down"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_million_failing_recipient_domains_keep_at_most_max_keys_breakers() {
    // One failure each: a domain is tracked from its first failure.
    let breaker = CircuitBreakerTransport::builder(Fails)
        .scope(Scope::RecipientDomain)
        .max_keys(10_000)
        .build()
        .expect("valid settings");
    let from: lettre::Address = "app@example.com".parse().expect("a sender");
    for i in 0..1_000_000u32 {
        let to = lettre::Address::new("user", format!("d{i}.example")).expect("a recipient");
        let envelope = Envelope::new(Some(from.clone()), vec![to]).expect("an envelope");
        assert!(breaker.send_raw(&envelope, b"hello").await.is_err());
        if i % 100_000 == 0 {
            assert!(breaker.tracked_keys() <= 10_000);
        }
    }
    assert_eq!(breaker.tracked_keys(), 10_000);
}

#[tokio::test(start_paused = true)]
async fn messages_to_the_same_domains_in_any_order_take_their_probes_in_one_order_so_one_of_them_probes()
 {
    // A store whose answers take a moment, so that two messages' decisions cross.
    let store = std::sync::Arc::new(support::slow_store::SlowStore::answering_late(
        Duration::from_millis(10),
    ));
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(Duration::from_secs(30))
        .scope(Scope::RecipientDomain)
        .store(store)
        .build()
        .expect("valid settings");
    inner.then([Reply::fail(Category::Network)]);
    let _ = breaker.send(&message_to_all(&["a@x.org", "b@y.org"])).await;
    assert_eq!(breaker.state_of("x.org"), State::Open);
    assert_eq!(breaker.state_of("y.org"), State::Open);
    tokio::time::advance(Duration::from_secs(30)).await;

    let (x_then_y, y_then_x) = (
        message_to_all(&["a@x.org", "b@y.org"]),
        message_to_all(&["b@y.org", "a@x.org"]),
    );
    let (one, other) = tokio::join!(breaker.send(&x_then_y), breaker.send(&y_then_x));
    assert!(
        one.is_ok() || other.is_ok(),
        "one message took both probes: {one:?} / {other:?}"
    );
    assert_eq!(inner.sends(), 2, "the first failure, then one probe");
}

/// A provider that fails every send to one domain and delivers the rest.
#[derive(Debug)]
struct FailsFor(&'static str);

#[async_trait::async_trait]
impl Transport for FailsFor {
    fn name(&self) -> &str {
        "fails-for"
    }

    async fn send_raw(&self, envelope: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        if envelope.to().iter().any(|to| to.domain() == self.0) {
            Err(SendError::new(Category::Network, "test.down", "down"))
        } else {
            Ok(Receipt::new("fails-for"))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_domains_that_succeed_keeps_the_count_of_one_that_fails() {
    let breaker = CircuitBreakerTransport::builder(FailsFor("flaky.example"))
        .scope(Scope::RecipientDomain)
        .failure_threshold(3)
        .max_keys(100)
        .build()
        .expect("valid settings");
    let from: lettre::Address = "app@example.com".parse().expect("a sender");
    let send_to = |domain: String| {
        let to = lettre::Address::new("user", domain).expect("a recipient");
        Envelope::new(Some(from.clone()), vec![to]).expect("an envelope")
    };
    // The first domain is kept apart from the others, never forgotten.
    let first = send_to("first.example".into());
    assert!(breaker.send_raw(&first, b"hi").await.is_ok());
    for _ in 0..2 {
        let _ = breaker
            .send_raw(&send_to("flaky.example".into()), b"hi")
            .await;
    }
    // Ten times as many healthy domains as the breaker keeps: none takes a place.
    for i in 0..1_000 {
        let healthy = send_to(format!("d{i}.example"));
        assert!(breaker.send_raw(&healthy, b"hi").await.is_ok());
    }
    let _ = breaker
        .send_raw(&send_to("flaky.example".into()), b"hi")
        .await;
    assert_eq!(breaker.state_of("flaky.example"), State::Open);
}

#[tokio::test]
async fn isolating_a_breaker_scoped_by_recipient_domain_refuses_the_domain_it_already_sent_to() {
    let inner = Scripted::new("p");
    let breaker = by_domain(&inner, 3);
    breaker
        .send(&message_to("x@known.example"))
        .await
        .expect("closed, the provider answers");
    breaker.isolate().await;

    let refused = breaker
        .send(&message_to("y@known.example"))
        .await
        .expect_err("isolated as a whole, a domain already seen included");

    assert_eq!(refused.code(), "breaker.isolated");
    assert_eq!(
        inner.sends(),
        1,
        "only the send before the isolation reached the provider"
    );
}

#[tokio::test]
async fn isolating_a_breaker_scoped_by_recipient_domain_refuses_a_domain_first_seen_after_it_until_reset()
 {
    let inner = Scripted::new("p");
    let breaker = by_domain(&inner, 3);
    breaker.isolate().await;
    let refused = breaker
        .send(&message_to("x@first-seen-now.example"))
        .await
        .expect_err("isolated as a whole");
    assert_eq!(refused.code(), "breaker.isolated");
    assert_eq!(refused.retry_after(), None);
    assert_eq!(inner.sends(), 0, "nothing reached the provider");

    breaker.reset().await;
    breaker
        .send(&message_to("x@another-new.example"))
        .await
        .expect("reset lifts the isolation for every domain");
    assert_eq!(inner.sends(), 1);
}
