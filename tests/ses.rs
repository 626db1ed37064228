//! SesTransport through the real AWS SDK: against moto's SES server (delivery, unverified
//! senders) and against a local HTTP server answering SES-style failures (DESIGN §2, §7).
#![cfg(feature = "ses")]

mod support;

use std::time::{Duration, Instant};

use aws_sdk_sesv2::Client;
use aws_sdk_sesv2::config::retry::RetryConfig;
use aws_sdk_sesv2::config::timeout::TimeoutConfig;
use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
use futures::StreamExt;
use mail_breaker::{
    Category, CircuitBreakerTransport, Message, SendError, SesTransport, State, Transport,
};
use mail_breaker::{SesAccount, SesEnforcement as Enforcement};
use support::moto::Moto;
use support::servers::free_port;
use support::ses_faults::{Fault, FaultServer};

/// The operation timeout of the test clients: short, so a hanging server fails fast.
const OPERATION_TIMEOUT: Duration = Duration::from_millis(300);
/// A secret that must never show up in an error's text.
const SECRET_KEY: &str = "test-secret-key-never-shown";
/// The body text of every test message, which must never show up in an error's text.
const BODY: &str = "hello from the ses tests";

fn client_with_timeout(endpoint: &str, timeout: Duration) -> Client {
    let config = aws_sdk_sesv2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "AKIDTESTONLY",
            SECRET_KEY,
            None,
            None,
            "tests",
        ))
        .endpoint_url(endpoint)
        .timeout_config(TimeoutConfig::builder().operation_timeout(timeout).build())
        .build();
    Client::from_conf(config)
}

fn client(endpoint: &str) -> Client {
    client_with_timeout(endpoint, OPERATION_TIMEOUT)
}

fn message_from(from: &str) -> Message {
    Message::builder()
        .from(from.parse().expect("a valid sender"))
        .to("user@example.org".parse().expect("a valid recipient"))
        .bcc(
            "hidden-copy@example.net"
                .parse()
                .expect("a valid recipient"),
        )
        .subject("ses test")
        .body(BODY.to_owned())
        .expect("a valid message")
}

/// A sender moto knows as a verified identity.
const VERIFIED: &str = "app@example.com";
/// A sender moto has never heard of.
const UNVERIFIED: &str = "stranger@example.net";

/// moto, with `VERIFIED` created as an identity through the SDK; `None` where moto is missing.
async fn moto_with_verified_sender(test: &str) -> Option<(Moto, Client)> {
    let moto = Moto::start(test).await?;
    // moto's server is slower than the fault server: give it a realistic timeout.
    let client = client_with_timeout(&moto.endpoint(), Duration::from_secs(10));
    client
        .create_email_identity()
        .email_identity(VERIFIED)
        .send()
        .await
        .expect("moto creates the identity");
    Some((moto, client))
}

/// Sends one message through a fresh `SesTransport` to a server answering `fault`.
async fn send_against(fault: Fault) -> SendError {
    let server = FaultServer::start(fault).await;
    let ses = SesTransport::new(client(&server.endpoint()));
    let error = ses
        .send(&message_from(VERIFIED))
        .await
        .expect_err("the server answers a failure");
    println!(
        "{error} / source: {:?}",
        std::error::Error::source(&error).map(|s| s.to_string())
    );
    assert_eq!(error.transport(), Some("ses:us-east-1"));
    assert_no_secrets(&error);
    error
}

fn assert_no_secrets(error: &SendError) {
    let text = format!(
        "{error} {:?}",
        std::error::Error::source(error).map(|s| s.to_string())
    );
    assert!(!text.contains(SECRET_KEY), "secret in {text}");
    assert!(!text.contains(BODY), "message body in {text}");
}

// ---- moto ----

#[tokio::test]
async fn verified_sender_delivers_and_the_receipt_has_a_message_id() {
    let test = "verified_sender_delivers_and_the_receipt_has_a_message_id";
    let Some((_moto, client)) = moto_with_verified_sender(test).await else {
        return;
    };
    let ses = SesTransport::new(client);
    let receipt = ses
        .send(&message_from(VERIFIED))
        .await
        .expect("moto accepts mail from a verified sender");
    assert_eq!(receipt.transport(), "ses:us-east-1");
    let id = receipt.message_id().expect("SES gives a MessageId");
    assert!(!id.is_empty());
}

#[tokio::test]
async fn every_envelope_recipient_reaches_ses_including_bcc() {
    let test = "every_envelope_recipient_reaches_ses_including_bcc";
    let Some((moto, client)) = moto_with_verified_sender(test).await else {
        return;
    };
    let ses = SesTransport::new(client);
    let message = message_from(VERIFIED);
    // lettre leaves Bcc out of the formatted message: only the destinations carry it.
    assert!(!String::from_utf8_lossy(&message.formatted()).contains("hidden-copy@"));
    ses.send(&message).await.expect("moto accepts the message");
    let state = moto.state_dump().await;
    assert!(
        state.contains("hidden-copy@example.net"),
        "the Bcc recipient is among the destinations moto recorded"
    );
}

#[tokio::test]
async fn an_unverified_sender_is_configuration_and_does_not_trip_the_breaker() {
    let test = "an_unverified_sender_is_configuration_and_does_not_trip_the_breaker";
    let Some((_moto, client)) = moto_with_verified_sender(test).await else {
        return;
    };
    let breaker = CircuitBreakerTransport::builder(SesTransport::new(client))
        .failure_threshold(1)
        .build()
        .expect("valid settings");
    for _ in 0..2 {
        let error = breaker
            .send(&message_from(UNVERIFIED))
            .await
            .expect_err("moto refuses an unverified sender");
        assert_eq!(error.category(), Category::Configuration);
        assert_eq!(error.code(), "ses.MessageRejected");
        assert!(!error.to_string().contains("stranger@"), "{error}");
        assert_no_secrets(&error);
    }
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test]
async fn send_many_answers_each_message_in_order() {
    let test = "send_many_answers_each_message_in_order";
    let Some((_moto, client)) = moto_with_verified_sender(test).await else {
        return;
    };
    let ses = SesTransport::new(client).with_concurrency(3);
    let senders: Vec<&str> = (0..9)
        .map(|i| if i % 3 == 1 { UNVERIFIED } else { VERIFIED })
        .collect();
    let messages = futures::stream::iter(senders.iter().map(|from| message_from(from))).boxed();
    let results: Vec<_> = ses.send_many(messages).collect().await;
    assert_eq!(results.len(), senders.len());
    for (result, from) in results.iter().zip(&senders) {
        match result {
            Ok(receipt) => {
                assert_eq!(*from, VERIFIED);
                assert!(receipt.message_id().is_some());
            }
            Err(error) => {
                assert_eq!(*from, UNVERIFIED);
                assert_eq!(error.category(), Category::Configuration);
            }
        }
    }
}

#[tokio::test]
async fn send_many_keeps_at_most_its_concurrency_in_flight() {
    let delay = Duration::from_millis(200);
    let accepted = Fault::json(200, r#"{"MessageId":"fault-server-id"}"#).after(delay);
    let server = FaultServer::start(accepted).await;
    let ses = SesTransport::new(client_with_timeout(
        &server.endpoint(),
        Duration::from_secs(10),
    ))
    .with_concurrency(3);
    let messages = futures::stream::iter((0..9).map(|_| message_from(VERIFIED))).boxed();
    let started = Instant::now();
    let results: Vec<_> = ses.send_many(messages).collect().await;
    let elapsed = started.elapsed();
    println!(
        "send_many: 9 messages, 200 ms each, concurrency 3: {} ms, at most {} in flight",
        elapsed.as_millis(),
        server.most_in_flight()
    );
    assert_eq!(results.len(), 9);
    for result in &results {
        let receipt = result.as_ref().expect("the server accepts every message");
        assert_eq!(receipt.message_id(), Some("fault-server-id"));
    }
    assert_eq!(server.requests(), 9);
    assert_eq!(server.most_in_flight(), 3);
    // Three rounds of three, not nine one after another.
    assert!(elapsed < delay * 6, "{elapsed:?}");
}

// ---- SES-style failures from a local HTTP server ----

#[tokio::test]
async fn service_unavailable_503_is_service_unavailable() {
    let error = send_against(Fault::ses_error(
        503,
        "ServiceUnavailable",
        "Service is unable to handle request.",
    ))
    .await;
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(error.code(), "ses.ServiceUnavailable");
}

#[tokio::test]
async fn internal_failure_500_is_server_error() {
    let error = send_against(Fault::typed_body(
        500,
        "InternalFailure",
        "The request processing has failed because of an unknown error.",
    ))
    .await;
    assert_eq!(error.category(), Category::ServerError);
    assert_eq!(error.code(), "ses.InternalFailure");
}

#[tokio::test]
async fn bare_500_without_an_error_code_is_server_error() {
    let error = send_against(Fault::Answer {
        status: 500,
        headers: vec![("Content-Type".into(), "text/html".into())],
        body: "<html>oops</html>".into(),
    })
    .await;
    assert_eq!(error.category(), Category::ServerError);
    assert_eq!(error.code(), "ses.500");
}

#[tokio::test]
async fn throttling_429_is_rate_limited_with_its_retry_after() {
    let error = send_against(
        Fault::ses_error(429, "TooManyRequestsException", "Too many requests.")
            .with_header("Retry-After", "7"),
    )
    .await;
    assert_eq!(error.category(), Category::RateLimited);
    assert_eq!(error.code(), "ses.TooManyRequestsException");
    assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn message_rejected_400_is_rejected() {
    let error = send_against(Fault::ses_error(
        400,
        "MessageRejected",
        "Illegal address: app@example.com",
    ))
    .await;
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(error.code(), "ses.MessageRejected");
    assert!(!error.to_string().contains("app@"), "{error}");
}

#[tokio::test]
async fn mail_from_domain_not_verified_is_configuration() {
    let error = send_against(Fault::ses_error(
        400,
        "MailFromDomainNotVerifiedException",
        "The sending domain is not verified.",
    ))
    .await;
    assert_eq!(error.category(), Category::Configuration);
}

#[tokio::test]
async fn signature_mismatch_403_is_authentication() {
    let error = send_against(Fault::ses_error(
        403,
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. The Canonical String for this request should have been 'POST /v2/email/outbound-emails'",
    ))
    .await;
    assert_eq!(error.category(), Category::Authentication);
    assert_eq!(error.code(), "ses.SignatureDoesNotMatch");
    assert!(!error.to_string().contains("Canonical"), "{error}");
}

#[tokio::test]
async fn access_denied_403_is_authentication() {
    let error = send_against(Fault::typed_body(
        403,
        "AccessDeniedException",
        "User is not authorized to perform ses:SendEmail",
    ))
    .await;
    assert_eq!(error.category(), Category::Authentication);
}

#[tokio::test]
async fn bad_request_400_is_invalid_message() {
    let error = send_against(Fault::ses_error(
        400,
        "BadRequestException",
        "Raw message is too large.",
    ))
    .await;
    assert_eq!(error.category(), Category::InvalidMessage);
    assert_eq!(error.code(), "ses.BadRequestException");
}

#[tokio::test]
async fn suspended_or_paused_account_is_configuration_and_does_not_trip_the_breaker() {
    for (code, text) in [
        ("AccountSuspendedException", "The account is suspended."),
        (
            "SendingPausedException",
            "Sending is paused for this account.",
        ),
    ] {
        let server = FaultServer::start(Fault::ses_error(400, code, text)).await;
        let breaker =
            CircuitBreakerTransport::builder(SesTransport::new(client(&server.endpoint())))
                .failure_threshold(1)
                .build()
                .expect("valid settings");
        for _ in 0..2 {
            let error = breaker
                .send(&message_from(VERIFIED))
                .await
                .expect_err("the account cannot send");
            assert_eq!(error.category(), Category::Configuration);
            assert_eq!(error.code(), format!("ses.{code}"));
        }
        assert_eq!(breaker.state(), State::Closed);
        assert_eq!(server.requests(), 2);
    }
}

#[tokio::test]
async fn a_connection_dropped_after_the_request_is_network_and_maybe_delivered() {
    let error = send_against(Fault::Drop).await;
    assert_eq!(error.category(), Category::Network);
    assert_eq!(error.code(), "ses.network");
    assert!(error.is_maybe_delivered(), "the request went out: {error}");
}

#[tokio::test]
async fn refused_connection_is_network() {
    let ses = SesTransport::new(client(&format!("http://127.0.0.1:{}", free_port())));
    let error = ses
        .send(&message_from(VERIFIED))
        .await
        .expect_err("nothing listens");
    assert_eq!(error.category(), Category::Network);
    assert_eq!(error.code(), "ses.network");
    assert!(!error.is_maybe_delivered(), "nothing was sent: {error}");
}

#[tokio::test]
async fn server_that_hangs_past_the_operation_timeout_is_timeout_and_maybe_delivered() {
    let server = FaultServer::start(Fault::Hang).await;
    let ses = SesTransport::new(client(&server.endpoint()));
    let started = Instant::now();
    let error = ses
        .send(&message_from(VERIFIED))
        .await
        .expect_err("the server never answers");
    let elapsed = started.elapsed();
    println!("hang: timed out after {} ms", elapsed.as_millis());
    assert_eq!(error.category(), Category::Timeout);
    assert_eq!(error.code(), "ses.timeout");
    assert!(error.is_maybe_delivered(), "the request went out: {error}");
    assert!(elapsed >= OPERATION_TIMEOUT, "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn sdk_retries_are_off_by_default() {
    let server = FaultServer::start(Fault::ses_error(503, "ServiceUnavailable", "down")).await;
    let ses = SesTransport::new(client(&server.endpoint()));
    let _ = ses.send(&message_from(VERIFIED)).await;
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn sdk_retries_come_back_with_with_sdk_retries() {
    let server = FaultServer::start(Fault::ses_error(503, "ServiceUnavailable", "down")).await;
    let retry = RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(Duration::from_millis(10));
    let client = client_with_timeout(&server.endpoint(), Duration::from_secs(10));
    let ses = SesTransport::new(client).with_sdk_retries(retry);
    let error = ses
        .send(&message_from(VERIFIED))
        .await
        .expect_err("every attempt fails");
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(server.requests(), 3);
}

// ---- verify (GetAccount) ----

fn account(sending_enabled: bool, production: bool, enforcement: &str) -> Fault {
    Fault::json(
        200,
        &format!(
            r#"{{"DedicatedIpAutoWarmupEnabled":false,"EnforcementStatus":"{enforcement}","ProductionAccessEnabled":{production},"SendingEnabled":{sending_enabled}}}"#
        ),
    )
}

async fn verify_against(fault: Fault, deny_sandbox: bool) -> Result<(), SendError> {
    let server = FaultServer::start(fault).await;
    let ses = SesTransport::new(client(&server.endpoint()));
    let ses = if deny_sandbox {
        ses.deny_sandbox()
    } else {
        ses
    };
    ses.verify().await
}

#[tokio::test]
async fn verify_accepts_a_healthy_production_account() {
    verify_against(account(true, true, "HEALTHY"), true)
        .await
        .expect("a healthy account");
}

#[tokio::test]
async fn verify_accepts_a_sandboxed_account_with_a_warning() {
    verify_against(account(true, false, "HEALTHY"), false)
        .await
        .expect("the sandbox is allowed by default");
}

#[tokio::test]
async fn verify_refuses_a_sandboxed_account_when_the_sandbox_is_denied() {
    let error = verify_against(account(true, false, "HEALTHY"), true)
        .await
        .expect_err("deny_sandbox");
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "ses.sandbox");
}

#[tokio::test]
async fn verify_reports_an_account_with_sending_disabled_as_configuration() {
    let error = verify_against(account(false, true, "HEALTHY"), false)
        .await
        .expect_err("sending is disabled");
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "ses.SendingPaused");
}

#[tokio::test]
async fn verify_reports_a_shut_down_account_as_suspended() {
    let error = verify_against(account(false, true, "SHUTDOWN"), false)
        .await
        .expect_err("the account is shut down");
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "ses.AccountSuspended");
}

#[tokio::test]
async fn verify_sorts_a_failing_get_account_call() {
    let error = verify_against(Fault::ses_error(503, "ServiceUnavailable", "down"), false)
        .await
        .expect_err("SES is down");
    assert_eq!(error.category(), Category::ServiceUnavailable);
}

#[test]
fn transport_is_named_after_the_region() {
    let ses = SesTransport::new(client("http://127.0.0.1:9"));
    assert_eq!(ses.name(), "ses:us-east-1");
    assert_eq!(ses.with_name("ses-primary").name(), "ses-primary");
}

// Issue 23 (DESIGN §11): each test keeps one rule, and failed on the code before it.

/// LimitExceededException says "too many instances of the specified resource type" (the
/// SES v2 API reference): an account limit, not a send rate.
#[tokio::test]
async fn limit_exceeded_is_configuration_not_a_rate_limit() {
    let error = send_against(Fault::ses_error(
        400,
        "LimitExceededException",
        "There are too many instances of the specified resource type.",
    ))
    .await;
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "ses.LimitExceededException");
}

/// "Email address is not verified" hits every message from that sender: the account is set
/// up wrong, so a pool fails over instead of stopping.
#[tokio::test]
async fn an_email_address_that_is_not_verified_is_configuration() {
    let error = send_against(Fault::ses_error(
        400,
        "MessageRejected",
        "Email address is not verified. The following identities failed the check in region US-EAST-1: app@example.com",
    ))
    .await;
    assert_eq!(error.category(), Category::Configuration);
    assert_eq!(error.code(), "ses.MessageRejected");
}

#[tokio::test]
async fn a_2xx_cut_off_mid_body_is_maybe_delivered() {
    let error = send_against(Fault::CutOff {
        status: 200,
        declared: 500,
        sent: r#"{"MessageId":"#.to_owned(),
    })
    .await;
    assert!(error.is_maybe_delivered(), "SES answered 200: {error}");
}

#[tokio::test]
async fn new_imposes_a_30_second_operation_timeout_on_a_client_without_one() {
    let config = aws_sdk_sesv2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("AKID", SECRET_KEY, None, None, "tests"))
        .endpoint_url("http://127.0.0.1:9")
        .build();
    let ses = SesTransport::new(Client::from_conf(config));
    let timeout = ses
        .client()
        .config()
        .timeout_config()
        .and_then(|timeouts| timeouts.operation_timeout());
    assert_eq!(timeout, Some(Duration::from_secs(30)));
    // A client that has its own keeps it.
    let own = SesTransport::new(client("http://127.0.0.1:9"));
    let timeout = own
        .client()
        .config()
        .timeout_config()
        .and_then(|timeouts| timeouts.operation_timeout());
    assert_eq!(timeout, Some(OPERATION_TIMEOUT));
}

#[tokio::test]
async fn with_timeout_sets_the_operation_timeout_and_keeps_the_others() {
    let config = aws_sdk_sesv2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("AKID", SECRET_KEY, None, None, "tests"))
        .endpoint_url("http://127.0.0.1:9")
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .build(),
        )
        .build();
    let ses = SesTransport::new(Client::from_conf(config)).with_timeout(Duration::from_secs(7));
    let timeouts = ses
        .client()
        .config()
        .timeout_config()
        .cloned()
        .expect("timeouts");
    assert_eq!(timeouts.operation_timeout(), Some(Duration::from_secs(7)));
    assert_eq!(timeouts.connect_timeout(), Some(Duration::from_secs(2)));
}

#[tokio::test]
async fn debug_shows_the_settings_and_no_secret() {
    let ses = SesTransport::new(client("http://127.0.0.1:9"))
        .with_configuration_set("transactional")
        .with_concurrency(3);
    let text = format!("{ses:?}");
    assert!(text.starts_with("SesTransport {"), "{text}");
    assert!(text.contains("ses:us-east-1"), "{text}");
    assert!(text.contains("transactional"), "{text}");
    assert!(text.contains("concurrency: 3"), "{text}");
    assert!(!text.contains(SECRET_KEY), "{text}");
}

// ---- the account's standing (GetAccount), for the page and `mail-breaker reputation` ----

async fn account_against(fault: Fault) -> Result<SesAccount, SendError> {
    let server = FaultServer::start(fault).await;
    SesTransport::new(client(&server.endpoint()))
        .account()
        .await
}

#[tokio::test]
async fn the_account_reads_healthy_probation_and_shutdown_as_ses_says_them() {
    for (said, read) in [
        ("HEALTHY", Enforcement::Healthy),
        ("PROBATION", Enforcement::Probation),
        ("SHUTDOWN", Enforcement::Shutdown),
    ] {
        let account = account_against(account(said != "SHUTDOWN", true, said))
            .await
            .expect(said);
        assert_eq!(account.enforcement, read, "{said}");
        assert_eq!(account.enforcement.as_str(), said);
        assert_eq!(account.enforcement.to_string(), said);
        assert_eq!(account.sending_enabled, said != "SHUTDOWN", "{said}");
        assert!(account.production_access, "{said}");
    }
}

#[tokio::test]
async fn an_enforcement_status_ses_adds_later_is_kept_as_it_is_said() {
    let account = account_against(account(true, false, "UNDER_REVIEW"))
        .await
        .expect("an answer");
    assert_eq!(
        account.enforcement,
        Enforcement::Other("UNDER_REVIEW".into())
    );
    assert_eq!(account.enforcement.as_str(), "UNDER_REVIEW");
    assert!(!account.production_access);
}

#[tokio::test]
async fn an_account_that_cannot_be_read_is_an_error_with_its_reason_never_a_panic() {
    let error = account_against(Fault::ses_error(403, "AccessDeniedException", "no access"))
        .await
        .expect_err("access denied");
    assert_eq!(error.category(), Category::Authentication);
    for fault in [
        Fault::Drop,
        Fault::json(200, "{not json"),
        Fault::json(200, "[]"),
    ] {
        let read = account_against(fault.clone()).await;
        if let Err(error) = read {
            assert!(!error.message().is_empty(), "{fault:?}");
        }
    }
}

#[tokio::test]
async fn reading_the_account_of_a_server_that_never_answers_ends_at_its_own_short_timeout() {
    let server = FaultServer::start(Fault::Hang).await;
    // A client of its own with a long operation timeout: the reading's bound is its own.
    let ses = SesTransport::new(client_with_timeout(
        &server.endpoint(),
        Duration::from_secs(3_600),
    ));
    let error = ses
        .account_within(Duration::from_millis(200))
        .await
        .expect_err("no answer");
    assert_eq!(error.code(), "ses.timeout");
    assert_eq!(error.category(), Category::Timeout);
}
