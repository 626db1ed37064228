//! The logs the README promises (DESIGN §3, tracing): the breaker's changes and refusals,
//! shadow mode, a panicking listener, the SES sandbox warning, a shared rate limiter's Redis
//! outage. Alone in their own test binary: tracing caches whether a call site is wanted per
//! process, so a test in another thread with no subscriber could hide these events from the
//! scoped subscribers below.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::{Category, CircuitBreakerTransport, Transport};
use support::message;
use support::scripted::{Reply, Scripted};
use tokio::time::advance;

const RESET: Duration = Duration::from_secs(30);

/// A writer that keeps what the tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// What was logged so far.
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Captures everything logged on this thread, at DEBUG and above, until the guard drops.
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(start_paused = true)]
async fn changes_and_refusals_are_logged_at_their_levels_with_transport_and_key() {
    let (captured, _guard) = capture();
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .build()
        .unwrap();
    inner.then([Reply::fail(Category::ServerError)]);
    let _ = breaker.send(&message()).await;
    let _ = breaker.send(&message()).await;
    advance(RESET).await;
    breaker.send(&message()).await.unwrap();
    let log = captured.text();
    let line = |event: &str| {
        log.lines()
            .find(|l| l.contains(event))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("breaker.open").contains("WARN"), "{log}");
    assert!(line("breaker.refused").contains("DEBUG"), "{log}");
    assert!(line("breaker.half_open").contains("INFO"), "{log}");
    assert!(line("breaker.closed").contains("INFO"), "{log}");
    assert!(
        line("breaker.open").contains("transport=\"p\"")
            && line("breaker.open").contains("key=\"p\""),
        "{log}"
    );
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_logs_what_it_would_refuse_once_per_change_of_state_not_once_per_send() {
    let (captured, _guard) = capture();
    let inner = Scripted::answering("p", Reply::fail(Category::ServerError));
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .shadow(true)
        .build()
        .unwrap();
    for _ in 0..10 {
        let _ = breaker.send(&message()).await;
    }
    let log = captured.text();
    let shadow_lines: Vec<_> = log
        .lines()
        .filter(|l| l.contains("breaker.shadow"))
        .collect();
    assert_eq!(shadow_lines.len(), 1, "{log}");
    assert!(shadow_lines[0].contains("INFO"), "{log}");
    assert!(shadow_lines[0].contains("refuse every send"), "{log}");
    assert!(!log.contains("breaker.refused"), "no line per send: {log}");
    assert_eq!(inner.sends(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_listener_that_panics_is_logged_at_error_and_sending_goes_on() {
    let (captured, _guard) = capture();
    let inner = Scripted::new("p");
    let breaker = CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .on_state_change(|_| panic!("a listener's bug"))
        .build()
        .unwrap();
    inner.then([Reply::fail(Category::ServerError)]);
    let _ = breaker.send(&message()).await;
    advance(RESET).await;
    breaker.send(&message()).await.expect("sending goes on");
    let log = captured.text();
    let panics: Vec<_> = log
        .lines()
        .filter(|l| l.contains("breaker.listener_panicked"))
        .collect();
    assert_eq!(
        panics.len(),
        3,
        "one per change the listener was told: {log}"
    );
    assert!(
        panics
            .iter()
            .all(|l| l.contains("ERROR") && l.contains("transport=\"p\""))
    );
}

#[cfg(feature = "ses")]
#[tokio::test]
async fn an_ses_account_in_the_sandbox_passes_verify_with_one_warning() {
    use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
    use support::ses_faults::{Fault, FaultServer};

    let (captured, _guard) = capture();
    let server = FaultServer::start(Fault::json(
        200,
        r#"{"DedicatedIpAutoWarmupEnabled":false,"EnforcementStatus":"HEALTHY","ProductionAccessEnabled":false,"SendingEnabled":true}"#,
    ))
    .await;
    let config = aws_sdk_sesv2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(server.endpoint())
        .build();
    let ses = mail_breaker::SesTransport::new(aws_sdk_sesv2::Client::from_conf(config));
    ses.verify()
        .await
        .expect("the sandbox is allowed by default");
    let log = captured.text();
    let warnings: Vec<_> = log.lines().filter(|l| l.contains("ses.sandbox")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("WARN"), "{log}");
}

/// A store on `server` that gives up on a call after 100 ms and asks again after 20 ms.
#[cfg(feature = "redis")]
async fn quick_store(server: &support::redis::RedisServer) -> mail_breaker::RedisStore {
    mail_breaker::RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_timeout(Duration::from_millis(100))
        .with_retry_interval(Duration::from_millis(20))
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_shared_rate_limiter_warns_once_per_redis_outage_and_says_when_redis_is_back() {
    use mail_breaker::RateLimitTransport;
    let Some(mut server) = support::redis::RedisServer::start("logs_rate_outage") else {
        return;
    };
    let (captured, _guard) = capture();
    let store = quick_store(&server).await;
    let limited = RateLimitTransport::builder(Scripted::new("ses"))
        .per_second(1_000.0)
        .shared(Arc::new(store))
        .build()
        .unwrap();
    let send_spaced = |count| {
        let limited = &limited;
        async move {
            for _ in 0..count {
                limited.send(&message()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await; // past the retry interval
            }
        }
    };
    send_spaced(1).await;
    server.stop();
    send_spaced(4).await; // Redis asked, and silent, four times
    let count = |event: &str| captured.text().matches(event).count();
    assert_eq!(count("rate.redis_unreachable"), 1, "{}", captured.text());
    server.restart();
    send_spaced(3).await;
    assert_eq!(count("rate.redis_answering"), 1, "{}", captured.text());
    server.stop();
    send_spaced(2).await;
    assert_eq!(count("rate.redis_unreachable"), 2, "{}", captured.text());
}

/// DESIGN §13: a limiter that knows neither `.members(n)` nor who shares it says so when Redis
/// is silent, and takes the full rate and burst.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_shared_rate_limiter_whose_redis_never_answered_warns_that_its_members_are_unknown() {
    use mail_breaker::RateLimitTransport;
    let Some(mut server) = support::redis::RedisServer::start("logs_rate_unknown") else {
        return;
    };
    let (captured, _guard) = capture();
    let store = quick_store(&server).await;
    server.stop();
    let limited = RateLimitTransport::builder(Scripted::new("ses"))
        .per_second(1_000.0)
        .shared(Arc::new(store))
        .build()
        .unwrap();
    limited.send(&message()).await.unwrap();
    let log = captured.text();
    let warning = log
        .lines()
        .find(|line| line.contains("rate.redis_unreachable"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(
        warning.contains("unknown: the full rate and burst"),
        "{warning}"
    );
}

#[cfg(feature = "oauth2")]
#[test]
fn allow_insecure_http_on_a_token_source_is_logged_once_as_a_warning_naming_its_url() {
    use mail_breaker::oauth::ClientCredentials;
    let (captured, _guard) = capture();
    let settings = |token_url: &str| ClientCredentials {
        token_url: token_url.to_owned(),
        client_id: "app-id".to_owned(),
        client_secret: "s3cret-never-logged".to_owned(),
        scope: "s".to_owned(),
    };
    let _insecure = settings("http://tokens.internal/token")
        .allow_insecure_http()
        .build()
        .unwrap();
    // Where http:// was taken anyway (loopback) or is not used (https), nothing is said.
    let _loopback = settings("http://127.0.0.1:9/token")
        .allow_insecure_http()
        .build()
        .unwrap();
    let _https = settings("https://tokens.example.com/token")
        .allow_insecure_http()
        .build()
        .unwrap();

    let text = captured.text();
    assert_eq!(text.matches("allow_insecure_http").count(), 1, "{text}");
    let line = text
        .lines()
        .find(|line| line.contains("allow_insecure_http"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("http://tokens.internal/token"), "{line}");
    assert!(!text.contains("s3cret-never-logged"), "{text}");
}

#[cfg(feature = "postmark")]
#[test]
fn allow_insecure_http_on_a_provider_transport_is_logged_once_as_a_warning() {
    let (captured, _guard) = capture();
    let _postmark = mail_breaker::PostmarkTransport::new("token-never-logged")
        .with_endpoint("http://relay.internal:8080")
        .allow_insecure_http();
    let text = captured.text();
    assert_eq!(text.matches("allow_insecure_http").count(), 1, "{text}");
    assert!(text.contains("WARN") && text.contains("postmark"), "{text}");
    assert!(!text.contains("token-never-logged"), "{text}");
}

#[cfg(feature = "webhooks")]
#[tokio::test]
async fn a_member_without_a_rate_limit_that_reaches_throttle_warns_that_it_has_no_rate_to_halve() {
    use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
    use mail_breaker::reputation::{ReputationBreaker, Tier};

    let (captured, _guard) = capture();
    let breaker = ReputationBreaker::builder("ses").build().unwrap();
    let member = breaker.wrap(Scripted::new("ses"));
    for _ in 0..1_000 {
        member.send(&message()).await.unwrap();
    }
    let bounces: Vec<DeliveryEvent> = (0..30)
        .map(|n| {
            let kind = EventKind::Bounced {
                bounce: BounceKind::Permanent,
                subtype: None,
            };
            let at = std::time::SystemTime::UNIX_EPOCH;
            let mut event = DeliveryEvent::new(
                Provider::Ses,
                format!("b{n}"),
                kind,
                format!("gone{n}@example.org"),
                at,
            );
            event.member = Some("ses".into());
            event
        })
        .collect();
    breaker.keep(&bounces).await.unwrap();
    assert_eq!(breaker.tier(), Tier::Throttle);
    let logged = captured.text();
    let line = logged
        .lines()
        .find(|line| line.contains("reputation.throttle_unpaced"))
        .unwrap_or_else(|| panic!("no warning in {logged}"));
    assert!(
        line.contains("WARN") && line.contains("member=ses"),
        "{line}"
    );
}
