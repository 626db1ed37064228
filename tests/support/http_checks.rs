//! Checks every HTTP e-mail API transport must pass, written once and run by each provider's
//! test file: what a request without an answer means (DESIGN §9, issue 8), that no error
//! shows the API key, and the end-to-end failover through a pool beside an SMTP breaker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mail_breaker::{Category, Message, SendError, Transport};

use super::http_api::{ApiServer, Reply};
use super::servers::free_port;

/// The timeout the tests give each transport: short, so a hanging server fails fast.
pub const TIMEOUT: Duration = Duration::from_millis(400);

/// The body of [`message`], which must never show up in an error's text.
pub const BODY: &str = "the secret body of the http tests";

/// A message with To, Cc and Bcc recipients, a Message-ID and a body that errors must not show.
pub fn message() -> Message {
    Message::builder()
        .from("App <app@example.com>".parse().expect("a valid sender"))
        .to("Bob <bob@example.org>".parse().expect("a valid recipient"))
        .cc("carol@example.org".parse().expect("a valid recipient"))
        .bcc("dave@example.net".parse().expect("a valid recipient"))
        .reply_to("help@example.com".parse().expect("a valid address"))
        .subject("http test")
        .message_id(Some("<m-1@example.com>".to_owned()))
        .body(BODY.to_owned())
        .expect("a valid message")
}

/// Sends [`message`] and expects an error.
pub async fn send_error<T: Transport>(transport: &T) -> SendError {
    transport
        .send(&message())
        .await
        .expect_err("the send must fail")
}

/// Asserts that the error's text shows neither `secret`, nor the message body, nor a full
/// recipient address.
pub fn assert_discreet(error: &SendError, secret: &str) {
    let text = format!("{error} / {error:?}");
    assert!(!text.contains(secret), "the API key leaked: {text}");
    assert!(!text.contains(BODY), "the body leaked: {text}");
    for address in ["bob@", "carol@", "dave@"] {
        assert!(!text.contains(address), "an address leaked: {text}");
    }
}

/// A port nothing listens on: connecting is refused, so nothing is sent.
pub async fn connection_refused_is_network_and_not_maybe_delivered<T: Transport>(
    make: impl Fn(String) -> T,
    provider: &str,
) {
    let transport = make(format!("http://127.0.0.1:{}", free_port()));
    let error = send_error(&transport).await;
    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), format!("{provider}.network"));
    assert!(!error.is_maybe_delivered(), "nothing was sent: {error}");
}

/// A server that reads the request and never answers: the provider may have taken it.
pub async fn no_answer_is_timeout_and_maybe_delivered<T: Transport>(
    make: impl Fn(String) -> T,
    provider: &str,
) {
    let server = ApiServer::start(|_| Reply::Hang).await;
    let transport = make(server.endpoint());
    let started = tokio::time::Instant::now();
    let error = send_error(&transport).await;
    assert_eq!(error.category(), Category::Timeout, "{error}");
    assert_eq!(error.code(), format!("{provider}.timeout"));
    assert!(error.is_maybe_delivered(), "the request went out: {error}");
    assert!(
        started.elapsed() < TIMEOUT * 3,
        "the timeout bounds the send"
    );
    assert_eq!(server.request_count(), 1);
}

/// A server that reads the request and hangs up: the provider may have taken it.
pub async fn dropped_connection_is_network_and_maybe_delivered<T: Transport>(
    make: impl Fn(String) -> T,
    provider: &str,
) {
    let server = ApiServer::start(|_| Reply::Drop).await;
    let transport = make(server.endpoint());
    let error = send_error(&transport).await;
    assert_eq!(error.category(), Category::Network, "{error}");
    assert_eq!(error.code(), format!("{provider}.network"));
    assert!(error.is_maybe_delivered(), "the request went out: {error}");
}

/// The end-to-end check of issue 14: a pool of the provider's breaker (priority 1) and an
/// SMTP breaker over smtp-sink (priority 2). The provider answers 503 until its breaker
/// opens; mail flows through SMTP meanwhile, without touching the provider; once the
/// provider is back and the reset timeout has passed, a probe closes its breaker.
#[cfg(feature = "smtp")]
pub async fn pool_fails_over_to_smtp_and_a_probe_brings_the_provider_back<T>(
    test: &str,
    make: impl Fn(String) -> T,
    healthy: Reply,
    expected_message_id: &str,
) where
    T: Transport + 'static,
{
    use mail_breaker::{CircuitBreakerTransport, PoolTransport, SmtpTransport, State};

    use super::smtp_sink::SmtpSink;

    const RESET: Duration = Duration::from_millis(300);

    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let provider_up = Arc::new(AtomicBool::new(false));
    let up = Arc::clone(&provider_up);
    let server = ApiServer::start(move |_| {
        if up.load(Ordering::SeqCst) {
            healthy.clone()
        } else {
            Reply::text(503, "down for maintenance")
        }
    })
    .await;
    let provider = make(server.endpoint());
    let provider_name = provider.name().to_owned();
    let provider_breaker = Arc::new(
        CircuitBreakerTransport::builder(provider)
            .failure_threshold(2)
            .reset_timeout(RESET)
            .build()
            .expect("valid breaker settings"),
    );
    let smtp = CircuitBreakerTransport::new(
        SmtpTransport::unencrypted("127.0.0.1", sink.port())
            .with_name("smtp-sink")
            .with_timeout(Duration::from_secs(5)),
    );
    let pool = PoolTransport::builder()
        .add(Arc::clone(&provider_breaker), 1)
        .add(smtp, 2)
        .build()
        .expect("a pool with members");

    for _ in 0..2 {
        let receipt = pool.send(&message()).await.expect("SMTP takes it");
        assert_eq!(receipt.transport(), "smtp-sink");
    }
    assert_eq!(
        server.request_count(),
        2,
        "both sends tried the provider first"
    );
    assert_eq!(provider_breaker.state(), State::Open);

    let receipt = pool.send(&message()).await.expect("SMTP takes it");
    assert_eq!(receipt.transport(), "smtp-sink");
    assert_eq!(
        server.request_count(),
        2,
        "the open breaker kept the send away from the provider"
    );

    provider_up.store(true, Ordering::SeqCst);
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;
    let receipt = pool.send(&message()).await.expect("the probe succeeds");
    assert_eq!(receipt.transport(), provider_name);
    assert_eq!(receipt.message_id(), Some(expected_message_id));
    assert_eq!(provider_breaker.state(), State::Closed);
    assert_eq!(server.request_count(), 3);
    assert_eq!(
        sink.received(),
        3,
        "SMTP delivered the three failed-over messages"
    );
}
