//! Sorting Postmark's error answers into [`Category`]s.

use serde::Deserialize;

use crate::adapters::http::{HeaderMap, answer_error, category_of_status};
use crate::{Category, SendError};

/// Postmark's error body: `{"ErrorCode": 406, "Message": "..."}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(rename = "ErrorCode", default)]
    error_code: i64,
    #[serde(rename = "Message", default)]
    message: String,
}

/// Sorts an error answer of Postmark's API (its HTTP status, headers and body) into a
/// [`Category`], with the code `postmark.<status>.<ErrorCode>` where the body names an
/// API error code (`postmark.422.406`), else `postmark.<status>` (`postmark.503`).
///
/// Postmark answers a request it cannot process with HTTP 422 and an `ErrorCode` in the
/// body; the code decides first, then the HTTP status.
///
/// | what happened | category |
/// |---|---|
/// | HTTP 401 or 403; `ErrorCode` 10 (bad or missing server token) | Authentication |
/// | `ErrorCode` 406: an inactive recipient (hard bounced, complained, suppressed) | Rejected |
/// | `ErrorCode` 400 (sender signature not found), 401 (not confirmed), 300 naming the sender signature: an unverified sender or domain | Configuration |
/// | `ErrorCode` 405 (not allowed to send: no credits), 412 (account pending), 413 (account may not send: suspended) | Configuration |
/// | `ErrorCode` 300 (invalid email request: a bad address, a missing field), 402, 403, 409 (the JSON), 410 (too many messages), 411 (forbidden attachment type); any other code of a 422; HTTP 400, 413 and 422 | InvalidMessage |
/// | `ErrorCode` 429; HTTP 429 | RateLimited |
/// | HTTP 408 | Timeout |
/// | `ErrorCode` 100 (maintenance); HTTP 503 | ServiceUnavailable |
/// | HTTP 500 and any other 5xx (a 504 is also maybe delivered) | ServerError |
/// | any other status (404, 405, 415: a wrong endpoint) | Configuration |
///
/// A request that got no answer is sorted by the transport (see the
/// [module table](crate::adapters::http)): connection failures are Network, timeouts
/// Timeout.
///
/// A `Retry-After` header, in seconds or as an HTTP-date, becomes
/// [`SendError::retry_after`], capped at a day. The error's message is Postmark's, addresses
/// masked and cut at 300 characters; the request is never part of it. A suspended account or
/// an unverified sender is Configuration so that a pool fails over on it while a breaker does
/// not count it: Postmark is up, this account cannot use it.
///
/// ```
/// use mail_breaker::{Category, classify_postmark_error};
/// use mail_breaker::adapters::http::HeaderMap;
///
/// let body = br#"{"ErrorCode":406,"Message":"You tried to send to recipient(s) that have been marked as inactive. Found inactive addresses: bob@example.org."}"#;
/// let error = classify_postmark_error(422, &HeaderMap::new(), body);
/// assert_eq!(error.category(), Category::Rejected);
/// assert_eq!(error.code(), "postmark.422.406");
/// assert!(!error.to_string().contains("bob@"));
/// ```
pub fn classify_postmark_error(status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let category = category_of(status, parsed.error_code, &parsed.message);
    let code = if parsed.error_code != 0 {
        format!("postmark.{status}.{}", parsed.error_code)
    } else {
        format!("postmark.{status}")
    };
    let error = answer_error(category, code, status, &parsed.message, headers);
    if is_about_the_sender(parsed.error_code, &parsed.message) {
        // The sender signature is the message's From: another message may go (DESIGN §19).
        return error.about_the_message();
    }
    error
}

/// Whether Postmark's answer is about this message's sender signature (400 not found, 401
/// not confirmed, 300 naming it), not the account.
fn is_about_the_sender(error_code: i64, message: &str) -> bool {
    match error_code {
        400 | 401 => true,
        300 => message.to_ascii_lowercase().contains("sender signature"),
        _ => false,
    }
}

/// The table of [`classify_postmark_error`]: the API error code first, then the status.
fn category_of(status: u16, error_code: i64, message: &str) -> Category {
    match error_code {
        10 => Category::Authentication,
        406 => Category::Rejected,
        400 | 401 | 405 | 412 | 413 => Category::Configuration,
        300 if message.to_ascii_lowercase().contains("sender signature") => Category::Configuration,
        300 | 402 | 403 | 409 | 410 | 411 => Category::InvalidMessage,
        429 => Category::RateLimited,
        100 => Category::ServiceUnavailable,
        // Any other code comes with a 422, which the status sorts as InvalidMessage.
        _ => category_of_status(status),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sorted(status: u16, error_code: i64, message: &str) -> SendError {
        let body = format!(r#"{{"ErrorCode":{error_code},"Message":"{message}"}}"#);
        classify_postmark_error(status, &HeaderMap::new(), body.as_bytes())
    }

    /// The API error code decides before the status: each under a status (418) that would
    /// say Configuration by itself.
    #[test]
    fn postmark_error_codes_decide_before_the_http_status() {
        let table = [
            (10, Category::Authentication),
            (406, Category::Rejected),
            (300, Category::InvalidMessage),
            (402, Category::InvalidMessage),
            (411, Category::InvalidMessage),
            (429, Category::RateLimited),
            (100, Category::ServiceUnavailable),
        ];
        for (code, category) in table {
            assert_eq!(sorted(418, code, "").category(), category, "{code}");
        }
        assert_eq!(sorted(500, 405, "").category(), Category::Configuration);
        assert_eq!(sorted(418, 999, "").category(), Category::Configuration);
    }

    #[test]
    fn postmark_bad_tokens_are_authentication() {
        let error = sorted(401, 10, "Bad or missing Server API token.");
        assert_eq!(error.category(), Category::Authentication);
        assert_eq!(error.code(), "postmark.401.10");
        assert_eq!(
            classify_postmark_error(403, &HeaderMap::new(), b"").category(),
            Category::Authentication
        );
    }

    #[test]
    fn postmark_inactive_recipients_are_rejected() {
        let error = sorted(422, 406, "Found inactive addresses: bob@example.org.");
        assert_eq!(error.category(), Category::Rejected);
        assert!(!error.to_string().contains("bob@"));
    }

    #[test]
    fn postmark_sender_signature_errors_are_about_the_message_and_account_ones_are_not() {
        for (code, message) in [
            (400, "Sender signature not found"),
            (401, "Sender signature not confirmed"),
            (
                300,
                "The 'From' address you supplied is not a Sender Signature",
            ),
        ] {
            assert!(sorted(422, code, message).is_about_the_message(), "{code}");
        }
        for (code, message) in [
            (405, "Not allowed to send"),
            (412, "Account pending approval"),
            (413, "Not allowed to send"),
            (10, "Bad or missing Server API token."),
            (300, "Invalid 'To' address"),
        ] {
            assert!(!sorted(422, code, message).is_about_the_message(), "{code}");
        }
    }

    #[test]
    fn postmark_unverified_senders_and_stopped_accounts_are_configuration() {
        for code in [400, 401, 405, 412, 413] {
            assert_eq!(
                sorted(422, code, "").category(),
                Category::Configuration,
                "{code}"
            );
        }
        let unverified = sorted(
            422,
            300,
            "Invalid 'From' address: 'a@example.com' is not a verified Sender Signature.",
        );
        assert_eq!(unverified.category(), Category::Configuration);
    }

    #[test]
    fn postmark_bad_requests_are_invalid_message() {
        for code in [300, 402, 403, 409, 410, 411, 999] {
            assert_eq!(
                sorted(422, code, "Invalid email request").category(),
                Category::InvalidMessage,
                "{code}"
            );
        }
        assert_eq!(
            classify_postmark_error(413, &HeaderMap::new(), b"").category(),
            Category::InvalidMessage
        );
    }

    #[test]
    fn postmark_rate_limits_are_rate_limited_with_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "12".parse().expect("a header value"));
        let error = classify_postmark_error(429, &headers, b"");
        assert_eq!(error.category(), Category::RateLimited);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(12)));
        assert_eq!(
            sorted(422, 429, "Rate limit exceeded").category(),
            Category::RateLimited
        );
    }

    #[test]
    fn postmark_outages_are_server_error_or_service_unavailable() {
        assert_eq!(
            classify_postmark_error(500, &HeaderMap::new(), b"oops").category(),
            Category::ServerError
        );
        let unavailable = classify_postmark_error(503, &HeaderMap::new(), b"");
        assert_eq!(unavailable.category(), Category::ServiceUnavailable);
        assert_eq!(unavailable.code(), "postmark.503");
        assert_eq!(
            sorted(422, 100, "Maintenance").category(),
            Category::ServiceUnavailable
        );
        assert!(classify_postmark_error(504, &HeaderMap::new(), b"").is_maybe_delivered());
    }

    #[test]
    fn postmark_wrong_endpoints_are_configuration() {
        assert_eq!(
            classify_postmark_error(404, &HeaderMap::new(), b"").category(),
            Category::Configuration
        );
    }
}
