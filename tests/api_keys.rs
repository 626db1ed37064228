//! No API key appears in any `Debug`, `Display`, log line or error of the HTTP API
//! transports, whatever the key and whatever the provider answers (DESIGN §11, issue 23): a
//! property test over keys and error bodies that echo them, against a local server.
#![cfg(all(
    feature = "postmark",
    feature = "resend",
    feature = "sendgrid",
    feature = "mailgun"
))]

mod support;

use std::sync::{Arc, Mutex, PoisonError};

use mail_breaker::{
    MailgunTransport, PostmarkTransport, ResendTransport, SendGridTransport, Transport,
};
use proptest::prelude::*;
use support::http_api::{ApiServer, Reply};
use support::http_checks::{TIMEOUT, message};

/// A writer that keeps what the tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

/// An error body in one provider's shape, with `text` (which holds the key) as its message.
fn body(shape: usize, text: &str) -> String {
    let quoted = serde_json::to_string(text).expect("a string serializes");
    match shape {
        0 => format!(r#"{{"ErrorCode":10,"Message":{quoted}}}"#),
        1 => format!(r#"{{"statusCode":401,"name":"validation_error","message":{quoted}}}"#),
        2 => format!(r#"{{"errors":[{{"message":{quoted},"field":{quoted}}}]}}"#),
        3 => format!(r#"{{"message":{quoted}}}"#),
        // JSON that escapes every slash, as PHP's encoder does.
        4 => format!(r#"{{"message":{}}}"#, quoted.replace('/', "\\/")),
        _ => text.to_owned(),
    }
}

/// Each transport with its `Debug` text.
fn transports(key: &str, endpoint: &str) -> Vec<(String, Box<dyn Transport>)> {
    fn boxed<T: Transport + std::fmt::Debug + 'static>(
        transport: T,
    ) -> (String, Box<dyn Transport>) {
        (format!("{transport:?}"), Box::new(transport))
    }
    vec![
        boxed(
            PostmarkTransport::new(key)
                .with_endpoint(endpoint)
                .with_timeout(TIMEOUT),
        ),
        boxed(
            ResendTransport::new(key)
                .with_endpoint(endpoint)
                .with_timeout(TIMEOUT),
        ),
        boxed(
            SendGridTransport::new(key)
                .with_endpoint(endpoint)
                .with_timeout(TIMEOUT),
        ),
        boxed(
            MailgunTransport::new(key, "mg.example.com")
                .with_endpoint(endpoint)
                .with_timeout(TIMEOUT),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_api_key_appears_in_any_debug_display_log_or_error(
        key in "[!-~]{8,40}",
        before in "[ -~]{0,40}",
        after in "[ -~]{0,40}",
        shape in 0usize..6,
        status in prop::sample::select(vec![200u16, 400, 401, 403, 404, 408, 413, 422, 429, 451, 500, 503, 504]),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let text = format!("{before}{key}{after}");
        let answer = body(shape, &text);
        let mut seen = Vec::new();
        runtime.block_on(async {
            let server = ApiServer::start(move |_| Reply::Answer {
                status,
                headers: vec![("Content-Type".to_owned(), "application/json".to_owned())],
                body: answer.clone(),
            })
            .await;
            for (debug, transport) in transports(&key, &server.endpoint()) {
                seen.push(debug);
                match transport.send(&message()).await {
                    Ok(receipt) => seen.push(format!("{receipt:?}")),
                    Err(error) => {
                        seen.push(format!("{error} {error:?}"));
                        let mut source = std::error::Error::source(&error);
                        while let Some(cause) = source {
                            seen.push(cause.to_string());
                            source = cause.source();
                        }
                    }
                }
                if let Err(error) = transport.verify().await {
                    seen.push(format!("{error} {error:?}"));
                }
            }
        });
        seen.push(captured.text());
        for text in &seen {
            prop_assert!(!text.contains(&key), "the key {key:?} leaked: {text}");
        }
    }
}

/// A provider that writes the key in a form no redaction knows (every character a JSON
/// `\u` escape) gets its message left out of the error, which keeps the category, the
/// retry_after and the maybe-delivered mark.
#[tokio::test]
async fn a_message_that_still_holds_the_key_is_left_out_of_the_error() {
    const KEY: &str = "key-in-unicode-escapes";
    let escaped: String = KEY
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let body = format!(r#"{{"message":"Forbidden for {escaped}"}}"#);
    let server = ApiServer::start(move |_| Reply::Answer {
        status: 504,
        headers: vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("Retry-After".to_owned(), "7".to_owned()),
        ],
        body: body.clone(),
    })
    .await;
    let mailgun = MailgunTransport::new(KEY, "mg.example.com")
        .with_endpoint(server.endpoint())
        .with_timeout(TIMEOUT);
    let error = mailgun.send(&message()).await.expect_err("a 504");
    let text = format!("{error} {error:?}");
    assert!(!text.contains(KEY), "{text}");
    assert_eq!(error.code(), "mailgun.504");
    assert_eq!(error.category(), mail_breaker::Category::ServerError);
    assert_eq!(error.retry_after(), Some(std::time::Duration::from_secs(7)));
    assert!(error.is_maybe_delivered());
    assert_eq!(error.transport(), Some("mailgun:mg.example.com"));
    assert!(error.message().contains("left out"), "{error}");
}
