//! The crate's spans as OpenTelemetry receives them (DESIGN §22, issue 66): one run through
//! a whole stack from a DSN (a retry, a pool of two breakers, the outbox, the crate's SMTP
//! client) with the SDK's in-memory exporter behind `tracing-opentelemetry`.
#![cfg(all(feature = "smtp", feature = "outbox", feature = "config"))]

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::collections::HashMap;

use embedded::{EmbeddedSmtp, Mode};
use mail_breaker::telemetry::{ATTRIBUTE_NAMES, SPAN_NAMES};
use mail_breaker::{Mailer, Message, Transport};
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt as _;

/// What must never reach a trace: the envelope's addresses, the subject, the DSN's user and
/// password.
const SECRETS: [&str; 5] = [
    "carol@victim.example",
    "app@sender.example",
    "Quarterly numbers",
    "ops-user",
    "hunter2-secret",
];

fn message(subject: &str) -> Message {
    Message::builder()
        .from("app@sender.example".parse().expect("a sender"))
        .to("carol@victim.example".parse().expect("a recipient"))
        .subject(format!("Quarterly numbers: {subject}"))
        .body(String::from("the numbers"))
        .expect("a message")
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.local_addr().expect("its address").port()
}

/// Every span the run made, once it ended.
async fn traced_run() -> Vec<SpanData> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("telemetry-test"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_level(false)
        .with_target(false);
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("mail_breaker=debug"))
        .with(layer);
    let _default = tracing::subscriber::set_default(subscriber);

    let relay = EmbeddedSmtp::start();
    let folder = tempfile::tempdir().expect("a folder");
    let dsn = format!(
        "failover(smtp://ops-user:hunter2-secret@127.0.0.1:{}?name=down&auth_without_tls=true&breaker.threshold=1 \
         smtp://127.0.0.1:{}?name=relay)?retry.attempts=2&retry.delay=10ms&outbox=sqlite://{}/outbox.db",
        dead_port(),
        relay.port(),
        folder.path().display()
    );
    let mailer = Mailer::from_dsn(&dsn)
        .expect("a valid DSN")
        .build_without_worker()
        .await
        .expect("built");
    mailer.send(&message("sent")).await.expect("delivered");
    relay.set_mode(Mode::Failing);
    let queued = mailer.send(&message("queued")).await.expect("queued");
    assert!(queued.is_queued(), "{queued:?}");
    relay.set_mode(Mode::Accept);
    mailer
        .worker()
        .expect("an outbox")
        .drain()
        .await
        .expect("drained");
    assert_eq!(relay.accepted(), 2);
    drop(mailer);
    provider.force_flush().expect("flushed");
    exporter.get_finished_spans().expect("the spans")
}

#[tokio::test]
async fn the_spans_of_a_whole_stack_are_named_and_nested_as_documented_and_hold_no_address_subject_or_secret()
 {
    let spans = traced_run().await;
    let by_id: HashMap<SpanId, &SpanData> = spans
        .iter()
        .map(|span| (span.span_context.span_id(), span))
        .collect();
    let parent = |span: &SpanData| by_id.get(&span.parent_span_id).map(|p| p.name.to_string());

    // Every span and attribute name is one the guide lists.
    for span in &spans {
        assert!(SPAN_NAMES.contains(&&*span.name), "span {}", span.name);
        for attribute in &span.attributes {
            let key = attribute.key.as_str();
            assert!(
                ATTRIBUTE_NAMES.contains(&key),
                "attribute {key} on {}",
                span.name
            );
        }
    }

    // The tree: each send, its members' tries, their breakers' decisions and transactions.
    let names: Vec<(String, Option<String>)> = spans
        .iter()
        .map(|span| (span.name.to_string(), parent(span)))
        .collect();
    let has = |name: &str, under: Option<&str>| {
        names
            .iter()
            .any(|(n, p)| n == name && p.as_deref() == under)
    };
    assert!(has("mail_breaker.send", None), "{names:?}");
    assert!(
        has("mail_breaker.try", Some("mail_breaker.send")),
        "{names:?}"
    );
    assert!(
        has("mail_breaker.decide", Some("mail_breaker.try")),
        "{names:?}"
    );
    assert!(
        has("mail_breaker.smtp.connect", Some("mail_breaker.try")),
        "{names:?}"
    );
    assert!(
        has("mail_breaker.smtp.transaction", Some("mail_breaker.try")),
        "{names:?}"
    );
    assert!(has("mail_breaker.outbox.claim", None), "{names:?}");
    // No member logs in (the one with credentials is never reached): no login's span.
    assert!(
        !names.iter().any(|(n, _)| n == "mail_breaker.smtp.auth"),
        "{names:?}"
    );
    assert!(has("mail_breaker.outbox.answer", None), "{names:?}");

    // The failed connect names its error; the worker's send names its attempt.
    let attribute = |span: &SpanData, key: &str| {
        span.attributes
            .iter()
            .find(|a| a.key.as_str() == key)
            .map(|a| a.value.to_string())
    };
    assert!(
        spans
            .iter()
            .any(|span| span.name == "mail_breaker.smtp.connect"
                && attribute(span, "error.type").as_deref() == Some("smtp.network"))
    );
    assert!(
        spans
            .iter()
            .any(|span| span.name == "mail_breaker.smtp.connect"
                && attribute(span, "server.address").as_deref() == Some("127.0.0.1")
                && attribute(span, "error.type").is_none())
    );
    assert!(spans.iter().any(|span| span.name == "mail_breaker.send"
        && attribute(span, "mail_breaker.outbox.attempt").as_deref() == Some("1")));
    assert!(
        spans
            .iter()
            .any(|span| span.name == "mail_breaker.smtp.transaction"
                && attribute(span, "error.type").as_deref() == Some("smtp.451"))
    );
    assert!(spans.iter().any(|span| span.name == "mail_breaker.decide"
        && attribute(span, "mail_breaker.breaker.state").as_deref() == Some("open")));

    // Nothing anywhere holds an address, the subject, the user or the password.
    for span in &spans {
        let mut texts = vec![span.name.to_string()];
        texts.extend(span.attributes.iter().map(|a| a.value.to_string()));
        for event in span.events.iter() {
            texts.push(event.name.to_string());
            texts.extend(event.attributes.iter().map(|a| a.value.to_string()));
        }
        for text in texts {
            for secret in SECRETS {
                assert!(
                    !text.contains(secret),
                    "{secret} in {text:?} of {}",
                    span.name
                );
            }
        }
    }
}
