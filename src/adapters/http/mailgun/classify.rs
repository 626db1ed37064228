//! Sorting Mailgun's error answers into [`Category`]s.

use serde::Deserialize;

use crate::adapters::http::{HeaderMap, answer_error, category_of_status};
use crate::{Category, SendError};

/// Mailgun's error body: `{"message": "..."}`; some answers (a bad key's 401) are plain text.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
}

/// Sorts an error answer of Mailgun's API (its HTTP status, headers and body) into a
/// [`Category`], with the code `mailgun.<status>` (Mailgun names no error codes, only
/// statuses and messages).
///
/// The status decides, and for 400, 401 and 403 the message.
///
/// | what happened | category |
/// |---|---|
/// | HTTP 401 (a bad key); HTTP 403 otherwise | Authentication |
/// | HTTP 401, 403 or 400 saying the domain or account is not allowed to send, disabled, suspended or not verified; a sandbox domain sending to a recipient it has not authorized | Configuration |
/// | HTTP 404: the domain is not on the account, or a wrong endpoint or region | Configuration |
/// | HTTP 400 otherwise (a bad `to` address, a missing field, a message that is not MIME), HTTP 413 | InvalidMessage |
/// | HTTP 402 (not on Mailgun's current list of response codes, which documents 400, 403, 404, 429 and 500; its older API reference: "Request Failed: parameters were valid but the request failed"): Mailgun failed | ServerError |
/// | HTTP 408 | Timeout |
/// | HTTP 429 | RateLimited |
/// | HTTP 500 and any other 5xx (a 504 is also maybe delivered) | ServerError |
/// | HTTP 503 | ServiceUnavailable |
/// | any other status | Configuration |
///
/// A request that got no answer is sorted by the transport (see the
/// [module table](crate::adapters::http)): connection failures are Network, timeouts
/// Timeout.
///
/// A `Retry-After` header, in seconds or as an HTTP-date, becomes
/// [`SendError::retry_after`], capped at a day. The error's message is Mailgun's (the JSON
/// `message`, or a plain-text body), addresses masked and cut at 300 characters.
///
/// ```
/// use mail_breaker::{Category, classify_mailgun_error};
/// use mail_breaker::adapters::http::HeaderMap;
///
/// let body = br#"{"message":"Domain sandbox123.mailgun.org is not allowed to send: Free accounts are for test purposes only."}"#;
/// let error = classify_mailgun_error(403, &HeaderMap::new(), body);
/// assert_eq!(error.category(), Category::Configuration);
/// assert_eq!(error.code(), "mailgun.403");
/// ```
pub fn classify_mailgun_error(status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
    let message = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(parsed) => parsed.message,
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    let category = category_of(status, &message);
    answer_error(
        category,
        format!("mailgun.{status}"),
        status,
        &message,
        headers,
    )
}

/// The table of [`classify_mailgun_error`].
fn category_of(status: u16, message: &str) -> Category {
    let lower = message.to_ascii_lowercase();
    let account_problem = [
        "not allowed to send",
        "disabled",
        "suspended",
        "not verified",
        "unverified",
        "authorized recipients",
        "sandbox",
    ]
    .iter()
    .any(|words| lower.contains(words));
    match status {
        400 | 401 | 403 if account_problem => Category::Configuration,
        402 => Category::ServerError,
        // 404 (a domain not on the account, a wrong region) is Configuration by its status.
        _ => category_of_status(status),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sorted(status: u16, message: &str) -> SendError {
        let body = format!(r#"{{"message":"{message}"}}"#);
        classify_mailgun_error(status, &HeaderMap::new(), body.as_bytes())
    }

    #[test]
    fn mailgun_bad_keys_are_authentication() {
        let error = classify_mailgun_error(401, &HeaderMap::new(), b"Forbidden");
        assert_eq!(error.category(), Category::Authentication);
        assert_eq!(error.code(), "mailgun.401");
        assert!(error.message().contains("Forbidden"));
        assert_eq!(
            sorted(403, "Forbidden").category(),
            Category::Authentication
        );
    }

    #[test]
    fn mailgun_unverified_disabled_or_sandboxed_domains_are_configuration() {
        assert_eq!(
            sorted(
                403,
                "Domain mg.example.com is not allowed to send: domain is disabled"
            )
            .category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(400, "Sandbox subdomains are for test purposes only. Please add your own domain or add the address to authorized recipients").category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(404, "Domain not found").category(),
            Category::Configuration
        );
    }

    #[test]
    fn mailgun_bad_requests_are_invalid_message() {
        let error = sorted(
            400,
            "to parameter is not a valid address. please check documentation",
        );
        assert_eq!(error.category(), Category::InvalidMessage);
        assert_eq!(sorted(413, "").category(), Category::InvalidMessage);
    }

    #[test]
    fn mailgun_rate_limits_are_rate_limited_with_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "5".parse().expect("a header value"));
        let error = classify_mailgun_error(429, &headers, b"Too many requests");
        assert_eq!(error.category(), Category::RateLimited);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn mailgun_other_statuses_are_configuration() {
        assert_eq!(sorted(405, "").category(), Category::Configuration);
    }

    #[test]
    fn mailgun_outages_and_failed_requests_are_server_error_or_service_unavailable() {
        assert_eq!(sorted(500, "").category(), Category::ServerError);
        assert_eq!(
            sorted(402, "Request failed").category(),
            Category::ServerError
        );
        assert_eq!(sorted(503, "").category(), Category::ServiceUnavailable);
    }
}
