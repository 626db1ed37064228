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

// The checks of issue 23 (DESIGN §11), each named as the rule it keeps. Categories new since
// then are read through `Category::as_str`, so that these checks also build against older code.

/// A redirect is an answer, not an order: the request (with its key and its message) never
/// goes to where a 3xx points, whatever the kind of redirect.
pub async fn a_redirect_is_not_followed<T: Transport>(make: impl Fn(String) -> T, healthy: Reply) {
    for status in [301, 302, 303, 307, 308] {
        let answer = healthy.clone();
        let elsewhere = ApiServer::start(move |_| answer.clone()).await;
        let target = elsewhere.endpoint();
        let server = ApiServer::start(move |request| Reply::Answer {
            status,
            headers: vec![("Location".to_owned(), format!("{target}{}", request.path))],
            body: String::new(),
        })
        .await;
        let result = make(server.endpoint()).send(&message()).await;
        assert_eq!(
            elsewhere.request_count(),
            0,
            "the request followed the {status} redirect"
        );
        let error = result.expect_err("a redirect is no delivery");
        assert_eq!(
            error.category(),
            Category::Configuration,
            "{status}: {error}"
        );
        assert!(!error.is_maybe_delivered(), "{status}: {error}");
    }
}

/// `http://` goes only to a loopback host: to any other host, which would carry the key and
/// the message in clear text, a send is a Configuration error (`<provider>.endpoint`) before
/// any connection, unless the transport was built with `allow_insecure_http()` (`insecure`).
pub async fn an_http_endpoint_off_loopback_is_refused_unless_insecure_http_is_allowed<T, I>(
    make: impl Fn(String) -> T,
    insecure: impl Fn(String) -> I,
    provider: &str,
) where
    T: Transport,
    I: Transport,
{
    // TEST-NET-1: no host answers there, so a send that tries it ends as Network or Timeout.
    let elsewhere = "http://192.0.2.1:9".to_owned();
    let error = send_error(&make(elsewhere.clone())).await;
    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), format!("{provider}.endpoint"), "{error}");
    assert!(error.message().contains("https://"), "{error}");
    assert!(!error.is_maybe_delivered(), "{error}");
    for tried in [
        send_error(&insecure(elsewhere)).await,
        send_error(&make("https://192.0.2.1:9".to_owned())).await,
    ] {
        assert_ne!(tried.code(), format!("{provider}.endpoint"), "{tried}");
    }
}

/// An error answer whose body goes on (and stalls) past 64 KiB is sorted from its first 64 KiB
/// at once, not waited for until the timeout: `make` gives a transport with a timeout of 5 s.
pub async fn an_answer_body_is_read_up_to_64_kib<T: Transport>(make: impl Fn(String) -> T) {
    let mut bytes =
        b"HTTP/1.1 500 Status\r\nContent-Type: text/plain\r\nContent-Length: 100000000\r\n\r\n"
            .to_vec();
    bytes.extend(std::iter::repeat_n(b'x', 70 * 1024));
    let server = ApiServer::start(move |_| Reply::RawThenHang(bytes.clone())).await;
    let started = tokio::time::Instant::now();
    let error = send_error(&make(server.endpoint())).await;
    assert_eq!(error.category(), Category::ServerError, "{error}");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the rest of the body was waited for: {:?}",
        started.elapsed()
    );
}

/// A 2xx whose body is not the provider's success answer (a proxy's HTML page, a wrong
/// endpoint) is no delivery: ServerError, and maybe delivered.
pub async fn a_2xx_with_a_foreign_body_is_a_server_error_maybe_delivered<T: Transport>(
    make: impl Fn(String) -> T,
) {
    let server = ApiServer::start(|_| {
        Reply::Answer {
            status: 200,
            headers: vec![("Content-Type".to_owned(), "text/html".to_owned())],
            body: "<html><body>Welcome to nginx!</body></html>".to_owned(),
        }
        .with_header("X-Message-Id", "not-a-provider")
    })
    .await;
    let error = send_error(&make(server.endpoint())).await;
    assert_eq!(error.category(), Category::ServerError, "{error}");
    assert!(error.is_maybe_delivered(), "{error}");
}

/// A 2xx whose body is cut off mid-read is a delivery (the provider said it took the message),
/// without a message id.
pub async fn a_2xx_cut_off_mid_body_is_a_delivery<T: Transport>(
    make: impl Fn(String) -> T,
    status: u16,
) {
    let server = ApiServer::start(move |_| Reply::cut_off(status, 1000, "{\"id\":")).await;
    let receipt = make(server.endpoint())
        .send(&message())
        .await
        .expect("a 2xx is a delivery even when its body is cut off");
    assert_eq!(receipt.message_id(), None);
}

/// HTTP 408 says the provider gave up waiting for the request: Timeout, not Configuration.
pub async fn a_408_is_a_timeout<T: Transport>(make: impl Fn(String) -> T) {
    let server = ApiServer::start(|_| Reply::text(408, "Request Timeout")).await;
    let error = send_error(&make(server.endpoint())).await;
    assert_eq!(error.category(), Category::Timeout, "{error}");
}

/// A message a JSON API cannot express is `unsupported` (a pool fails over on it), never
/// InvalidMessage, and nothing is sent for it.
pub async fn a_message_a_json_api_cannot_carry_is_unsupported<T: Transport>(
    make: impl Fn(String) -> T,
) {
    let server = ApiServer::start(|_| Reply::json(500, "{}")).await;
    let transport = make(server.endpoint());
    for (what, message) in uncarriable_messages() {
        let error = transport
            .send(&message)
            .await
            .expect_err("a JSON API cannot carry it");
        assert_eq!(error.category().as_str(), "unsupported", "{what}: {error}");
        assert!(!error.is_retryable(), "{what}");
    }
    assert_eq!(server.request_count(), 0, "nothing was sent");
}

/// Messages no JSON API can express: a signed message, a calendar invitation, and one whose
/// only recipient is Bcc.
pub fn uncarriable_messages() -> Vec<(&'static str, Message)> {
    use lettre::message::header::ContentType;
    use lettre::message::{MultiPart, SinglePart};

    let builder = || {
        Message::builder()
            .from("App <app@example.com>".parse().expect("a valid sender"))
            .subject("cannot be carried")
    };
    let to = || "bob@example.org".parse().expect("a valid recipient");
    let signed = builder()
        .to(to())
        .multipart(
            MultiPart::signed(
                "application/pgp-signature".to_owned(),
                "pgp-sha256".to_owned(),
            )
            .singlepart(SinglePart::plain("signed text".to_owned()))
            .singlepart(
                SinglePart::builder()
                    .header(ContentType::parse("application/pgp-signature").expect("a type"))
                    .body("-----BEGIN PGP SIGNATURE-----".to_owned()),
            ),
        )
        .expect("a signed message");
    let invitation = builder()
        .to(to())
        .multipart(
            MultiPart::alternative()
                .singlepart(SinglePart::plain("You are invited".to_owned()))
                .singlepart(
                    SinglePart::builder()
                        .header(
                            ContentType::parse("text/calendar; method=REQUEST; charset=utf-8")
                                .expect("a type"),
                        )
                        .body("BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n".to_owned()),
                ),
        )
        .expect("a calendar invitation");
    let bcc_only = builder()
        .bcc(to())
        .body("only a blind copy".to_owned())
        .expect("a Bcc-only message");
    vec![
        ("a signed message", signed),
        ("a calendar invitation", invitation),
        ("a Bcc-only message", bcc_only),
    ]
}

/// A pool of the provider (priority 1) and SMTP (priority 2): a message the provider cannot
/// carry is delivered by SMTP, without a request to the provider, and the provider's breaker
/// stays closed.
#[cfg(feature = "smtp")]
pub async fn a_message_the_provider_cannot_carry_is_delivered_by_an_smtp_member<T>(
    test: &str,
    make: impl Fn(String) -> T,
) where
    T: Transport + 'static,
{
    use mail_breaker::{CircuitBreakerTransport, PoolTransport, SmtpTransport, State};

    use super::smtp_sink::SmtpSink;

    let Some(sink) = SmtpSink::start_counting(test, &[]) else {
        return;
    };
    let server = ApiServer::start(|_| Reply::json(500, "{}")).await;
    let provider = Arc::new(
        CircuitBreakerTransport::builder(make(server.endpoint()))
            .failure_threshold(1)
            .build()
            .expect("valid breaker settings"),
    );
    let smtp = CircuitBreakerTransport::new(
        SmtpTransport::unencrypted("127.0.0.1", sink.port())
            .with_name("smtp-sink")
            .with_timeout(Duration::from_secs(5)),
    );
    let pool = PoolTransport::builder()
        .add(Arc::clone(&provider), 1)
        .add(smtp, 2)
        .build()
        .expect("a pool with members");
    let messages = uncarriable_messages();
    for (what, message) in &messages {
        let receipt = pool
            .send(message)
            .await
            .unwrap_or_else(|error| panic!("{what} must reach SMTP: {error}"));
        assert_eq!(receipt.transport(), "smtp-sink", "{what}");
    }
    assert_eq!(server.request_count(), 0, "nothing went to the provider");
    assert_eq!(
        provider.state(),
        State::Closed,
        "the provider is not failing"
    );
    assert_eq!(sink.received(), messages.len());
}

/// The bytes of a Latin-1 CSV: `café;prix\r\n` with é as the single byte 0xE9.
pub const LATIN1_CSV: &[u8] = b"caf\xe9;prix\r\n";

/// A message with [`LATIN1_CSV`] attached as `text/csv; charset=iso-8859-1`.
pub fn message_with_latin1_csv() -> Message {
    use lettre::message::header::ContentType;
    use lettre::message::{Attachment, MultiPart, SinglePart};

    Message::builder()
        .from("App <app@example.com>".parse().expect("a valid sender"))
        .to("bob@example.org".parse().expect("a valid recipient"))
        .subject("a csv")
        .multipart(
            MultiPart::mixed()
                .singlepart(SinglePart::plain("see the file".to_owned()))
                .singlepart(Attachment::new("prices.csv".to_owned()).body(
                    LATIN1_CSV.to_vec(),
                    ContentType::parse("text/csv; charset=iso-8859-1").expect("a type"),
                )),
        )
        .expect("a message with an attachment")
}

/// The same CSV in a message written by hand, quoted-printable, with its charset.
pub fn raw_quoted_printable_csv() -> (mail_breaker::Envelope, Vec<u8>) {
    let raw = b"From: app@example.com\r\nTo: bob@example.org\r\nSubject: a csv\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"B\"\r\n\r\n--B\r\nContent-Type: text/plain\r\n\r\nsee the file\r\n\
--B\r\nContent-Type: text/csv; charset=iso-8859-1\r\nContent-Transfer-Encoding: quoted-printable\r\n\
Content-Disposition: attachment; filename=\"prices.csv\"\r\n\r\ncaf=E9;prix\r\n\r\n--B--\r\n"
        .to_vec();
    let envelope = mail_breaker::Envelope::new(
        Some("app@example.com".parse().expect("an address")),
        vec!["bob@example.org".parse().expect("an address")],
    )
    .expect("an envelope");
    (envelope, raw)
}

/// An attachment keeps its bytes exactly (the transfer-decoded part, never text re-encoded
/// as UTF-8) and its type is a bare `type/subtype`: `attachments[0]` of the JSON the
/// provider got, its content (base64) under `content_key`, its type under `type_key`.
pub async fn an_attachment_keeps_its_bytes_and_a_bare_type<T: Transport>(
    make: impl Fn(String) -> T,
    success: Reply,
    attachments_key: &str,
    content_key: &str,
    type_key: &str,
) {
    use base64::Engine;

    let server = ApiServer::start(move |_| success.clone()).await;
    let transport = make(server.endpoint());
    transport
        .send(&message_with_latin1_csv())
        .await
        .expect("the provider takes it");
    let (envelope, raw) = raw_quoted_printable_csv();
    transport
        .send_raw(&envelope, &raw)
        .await
        .expect("the provider takes it");
    for (how, request) in ["base64 by lettre", "quoted-printable"]
        .iter()
        .zip(server.requests())
    {
        let json = request.json();
        let attachment = &json[attachments_key][0];
        let content = attachment[content_key].as_str().expect("base64 content");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(content)
            .expect("valid base64");
        assert_eq!(bytes, LATIN1_CSV, "{how}: the bytes changed");
        assert_eq!(attachment[type_key], "text/csv", "{how}");
    }
}
