//! Sorting Resend's error answers into [`Category`]s.

use serde::Deserialize;

use crate::adapters::http::{HeaderMap, answer_error, category_of_status};
use crate::{Category, SendError};

/// Resend's error body: `{"statusCode": 422, "name": "invalid_parameter", "message": "..."}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    name: String,
    #[serde(default)]
    message: String,
}

/// Sorts an error answer of Resend's API (its HTTP status, headers and body) into a
/// [`Category`], with the code `resend.<name>` where the body names its error type
/// (`resend.rate_limit_exceeded`), else `resend.<status>` (`resend.503`).
///
/// The error type decides first, then the HTTP status.
///
/// | what happened | category |
/// |---|---|
/// | `missing_api_key`, `restricted_api_key` (401), `invalid_api_key` (403), any error saying "API key is invalid"; HTTP 401 and 403 | Authentication |
/// | `validation_error` with HTTP 403, `invalid_to_address` (403): a testing-only account, or a sending domain not verified | Configuration |
/// | `monthly_quota_exceeded` (429): no sending until the plan changes | Configuration |
/// | `invalid_access`, `invalid_region`, `not_found`, `method_not_allowed`: a wrong setup or endpoint | Configuration |
/// | `validation_error` (400, 422), `invalid_idempotency_key`, `invalid_attachment`, `invalid_from_address`, `invalid_parameter`, `missing_required_field`; HTTP 400, 413 and 422 | InvalidMessage |
/// | `invalid_idempotent_request` (409): the key (the Message-ID) was used for another message | InvalidMessage |
/// | `rate_limit_exceeded`, `daily_quota_exceeded` (429); `concurrent_idempotent_requests` (409: the first request with this key is still being processed); HTTP 429 | RateLimited |
/// | `security_error` (451); HTTP 451 | Rejected |
/// | `application_error`, `internal_server_error`; HTTP 500 and any other 5xx (a 504 is also maybe delivered) | ServerError |
/// | HTTP 503 | ServiceUnavailable |
/// | HTTP 408 | Timeout |
/// | any other status | Configuration |
///
/// A request that got no answer is sorted by the transport (see the
/// [module table](crate::adapters::http)): connection failures are Network, timeouts
/// Timeout.
///
/// A `Retry-After` header, in seconds or as an HTTP-date, becomes
/// [`SendError::retry_after`], capped at a day. The error's message is Resend's, addresses
/// masked and cut at 300 characters.
///
/// ```
/// use mail_breaker::{Category, classify_resend_error};
/// use mail_breaker::adapters::http::HeaderMap;
///
/// let body = br#"{"statusCode":403,"name":"validation_error","message":"The example.com domain is not verified. Please, add and verify your domain."}"#;
/// let error = classify_resend_error(403, &HeaderMap::new(), body);
/// assert_eq!(error.category(), Category::Configuration);
/// assert_eq!(error.code(), "resend.validation_error");
/// ```
pub fn classify_resend_error(status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let category = category_of(status, &parsed.name, &parsed.message);
    let code = if parsed.name.is_empty() {
        format!("resend.{status}")
    } else {
        format!("resend.{}", parsed.name)
    };
    let error = answer_error(category, code, status, &parsed.message, headers);
    if parsed.name == "validation_error"
        && status == 403
        && parsed.message.to_ascii_lowercase().contains("not verified")
    {
        // "The example.com domain is not verified": the message's From domain; a message
        // from a verified domain still goes (DESIGN §19).
        return error.about_the_message();
    }
    error
}

/// The table of [`classify_resend_error`]: the error type first, then the status.
fn category_of(status: u16, name: &str, message: &str) -> Category {
    if message.to_ascii_lowercase().contains("api key is invalid") {
        return Category::Authentication;
    }
    match name {
        "missing_api_key" | "restricted_api_key" | "invalid_api_key" => Category::Authentication,
        "validation_error" if status == 403 => Category::Configuration,
        "invalid_to_address" => Category::Configuration,
        "monthly_quota_exceeded"
        | "invalid_access"
        | "invalid_region"
        | "not_found"
        | "method_not_allowed" => Category::Configuration,
        "validation_error"
        | "invalid_idempotency_key"
        | "invalid_attachment"
        | "invalid_from_address"
        | "invalid_parameter"
        | "missing_required_field"
        | "invalid_idempotent_request" => Category::InvalidMessage,
        "rate_limit_exceeded" | "daily_quota_exceeded" | "concurrent_idempotent_requests" => {
            Category::RateLimited
        }
        "security_error" => Category::Rejected,
        "application_error" | "internal_server_error" => Category::ServerError,
        _ if status == 451 => Category::Rejected,
        _ => category_of_status(status),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sorted(status: u16, name: &str, message: &str) -> SendError {
        let body = format!(r#"{{"statusCode":{status},"name":"{name}","message":"{message}"}}"#);
        classify_resend_error(status, &HeaderMap::new(), body.as_bytes())
    }

    /// The error type decides before the status: each under a status (418) that would say
    /// Configuration by itself, and the Configuration ones under a 500.
    #[test]
    fn resend_error_types_decide_before_the_http_status() {
        let table = [
            ("missing_api_key", Category::Authentication),
            ("restricted_api_key", Category::Authentication),
            ("invalid_api_key", Category::Authentication),
            ("validation_error", Category::InvalidMessage),
            ("invalid_idempotency_key", Category::InvalidMessage),
            ("invalid_attachment", Category::InvalidMessage),
            ("invalid_from_address", Category::InvalidMessage),
            ("invalid_parameter", Category::InvalidMessage),
            ("missing_required_field", Category::InvalidMessage),
            ("invalid_idempotent_request", Category::InvalidMessage),
            ("rate_limit_exceeded", Category::RateLimited),
            ("daily_quota_exceeded", Category::RateLimited),
            ("concurrent_idempotent_requests", Category::RateLimited),
            ("security_error", Category::Rejected),
            ("application_error", Category::ServerError),
            ("internal_server_error", Category::ServerError),
        ];
        for (name, category) in table {
            assert_eq!(sorted(418, name, "").category(), category, "{name}");
        }
        for name in [
            "invalid_to_address",
            "monthly_quota_exceeded",
            "invalid_access",
            "invalid_region",
            "not_found",
            "method_not_allowed",
        ] {
            assert_eq!(
                sorted(500, name, "").category(),
                Category::Configuration,
                "{name}"
            );
        }
        assert_eq!(
            sorted(500, "validation_error", "").category(),
            Category::InvalidMessage
        );
    }

    #[test]
    fn resend_an_unnamed_451_is_rejected() {
        assert_eq!(
            classify_resend_error(451, &HeaderMap::new(), b"").category(),
            Category::Rejected
        );
    }

    #[test]
    fn resend_key_errors_are_authentication() {
        assert_eq!(
            sorted(401, "missing_api_key", "").category(),
            Category::Authentication
        );
        assert_eq!(
            sorted(401, "restricted_api_key", "").category(),
            Category::Authentication
        );
        assert_eq!(
            sorted(403, "invalid_api_key", "").category(),
            Category::Authentication
        );
        assert_eq!(
            sorted(400, "validation_error", "API key is invalid").category(),
            Category::Authentication
        );
    }

    #[test]
    fn resend_an_unverified_from_domain_is_about_the_message_and_a_testing_account_is_not() {
        let unverified = sorted(
            403,
            "validation_error",
            "The example.com domain is not verified. Please, add and verify your domain.",
        );
        assert!(unverified.is_about_the_message());
        let testing = sorted(
            403,
            "validation_error",
            "You can only send testing emails to your own email address (me@example.com).",
        );
        assert!(!testing.is_about_the_message());
        assert!(!sorted(429, "monthly_quota_exceeded", "").is_about_the_message());
        assert!(!sorted(401, "invalid_api_key", "").is_about_the_message());
    }

    #[test]
    fn resend_unverified_domains_testing_accounts_and_monthly_quotas_are_configuration() {
        let error = sorted(
            403,
            "validation_error",
            "You can only send testing emails to your own email address (me@example.com).",
        );
        assert_eq!(error.category(), Category::Configuration);
        assert!(!error.to_string().contains("me@"));
        assert_eq!(
            sorted(429, "monthly_quota_exceeded", "").category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(422, "invalid_region", "").category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(403, "invalid_to_address", "").category(),
            Category::Configuration
        );
    }

    #[test]
    fn resend_bad_fields_and_reused_keys_are_invalid_message() {
        for name in [
            "validation_error",
            "invalid_idempotency_key",
            "invalid_attachment",
            "invalid_from_address",
            "invalid_parameter",
            "missing_required_field",
            "invalid_idempotent_request",
        ] {
            assert_eq!(
                sorted(422, name, "").category(),
                Category::InvalidMessage,
                "{name}"
            );
        }
    }

    #[test]
    fn resend_rate_limits_quotas_and_concurrent_keys_are_rate_limited() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "2".parse().expect("a header value"));
        let error = classify_resend_error(
            429,
            &headers,
            br#"{"statusCode":429,"name":"rate_limit_exceeded","message":"Too many requests."}"#,
        );
        assert_eq!(error.category(), Category::RateLimited);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(
            sorted(429, "daily_quota_exceeded", "").category(),
            Category::RateLimited
        );
        assert_eq!(
            sorted(409, "concurrent_idempotent_requests", "").category(),
            Category::RateLimited
        );
    }

    #[test]
    fn resend_wrong_endpoints_and_other_statuses_are_configuration() {
        assert_eq!(
            sorted(404, "not_found", "").category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(405, "method_not_allowed", "").category(),
            Category::Configuration
        );
        assert_eq!(
            classify_resend_error(418, &HeaderMap::new(), b"").category(),
            Category::Configuration
        );
    }

    #[test]
    fn resend_security_errors_are_rejected() {
        assert_eq!(
            sorted(451, "security_error", "").category(),
            Category::Rejected
        );
    }

    #[test]
    fn resend_outages_are_server_error_or_service_unavailable() {
        assert_eq!(
            sorted(500, "application_error", "").category(),
            Category::ServerError
        );
        assert_eq!(
            sorted(500, "internal_server_error", "").category(),
            Category::ServerError
        );
        let unavailable = classify_resend_error(503, &HeaderMap::new(), b"<html>");
        assert_eq!(unavailable.category(), Category::ServiceUnavailable);
        assert_eq!(unavailable.code(), "resend.503");
    }
}
