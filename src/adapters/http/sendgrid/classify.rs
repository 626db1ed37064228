//! Sorting SendGrid's error answers into [`Category`]s.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use crate::adapters::http::{HeaderMap, answer_error, category_of_status};
use crate::{Category, MAX_PROVIDER_WAIT, SendError};

/// SendGrid's error body: `{"errors": [{"message": "...", "field": "...", "help": ...}]}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    errors: Vec<ErrorItem>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorItem {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    field: Option<String>,
}

/// Sorts an error answer of SendGrid's v3 API (its HTTP status, headers and body) into a
/// [`Category`], with the code `sendgrid.<status>` (SendGrid names no error codes, only
/// statuses and messages).
///
/// The status decides, and for 401 and 403 the message (SendGrid answers several account
/// problems with them).
///
/// | what happened | category |
/// |---|---|
/// | HTTP 401: a key that is invalid, expired or revoked | Authentication |
/// | HTTP 403: a key without the scope (`access forbidden`) | Authentication |
/// | HTTP 403 "does not match a verified Sender Identity": an unverified sender or domain | Configuration |
/// | HTTP 401 "Maximum credits exceeded"; HTTP 401 or 403 saying the account is suspended, disabled or banned | Configuration |
/// | HTTP 403 "Too many bad requests" (a temporary block) | RateLimited |
/// | HTTP 400 (a bad address, a missing field, a reserved header), HTTP 413 | InvalidMessage |
/// | HTTP 408 | Timeout |
/// | HTTP 429 | RateLimited |
/// | HTTP 500 and any other 5xx (a 504 is also maybe delivered) | ServerError |
/// | HTTP 503 | ServiceUnavailable |
/// | HTTP 451 (data residency: the account's region), 404, 405, 406, 415 and any other status | Configuration |
///
/// A request that got no answer is sorted by the transport (see the
/// [module table](crate::adapters::http)): connection failures are Network, timeouts
/// Timeout.
///
/// SendGrid says when its rate limit resets in `X-RateLimit-Reset`, in seconds since the
/// epoch (its "Rate Limits" page): the wait until then becomes [`SendError::retry_after`],
/// capped at a day; a `Retry-After` header, where one comes, decides instead. The error's
/// message is SendGrid's messages
/// joined (each with its field), addresses masked and cut at 300 characters.
///
/// ```
/// use mail_breaker::{Category, classify_sendgrid_error};
/// use mail_breaker::adapters::http::HeaderMap;
///
/// let body = br#"{"errors":[{"message":"The from address does not match a verified Sender Identity.","field":"from"}]}"#;
/// let error = classify_sendgrid_error(403, &HeaderMap::new(), body);
/// assert_eq!(error.category(), Category::Configuration);
/// assert_eq!(error.code(), "sendgrid.403");
/// ```
pub fn classify_sendgrid_error(status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let message = parsed
        .errors
        .iter()
        .filter_map(|item| {
            let message = item.message.as_deref()?;
            Some(match item.field.as_deref() {
                Some(field) if !field.is_empty() => format!("{field}: {message}"),
                _ => message.to_owned(),
            })
        })
        .collect::<Vec<_>>()
        .join("; ");
    let category = category_of(status, &message);
    let mut error = answer_error(
        category,
        format!("sendgrid.{status}"),
        status,
        &message,
        headers,
    );
    if is_about_the_sender(status, &message) {
        // An unverified sender identity is the message's From: another may go (DESIGN §19).
        error = error.about_the_message();
    }
    match (
        error.retry_after(),
        rate_limit_reset(headers, SystemTime::now()),
    ) {
        (None, Some(after)) => error.with_retry_after(after),
        _ => error,
    }
}

/// The wait until `X-RateLimit-Reset` (seconds since the epoch), capped at a day; none when
/// the header is missing or not a number.
fn rate_limit_reset(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let seconds: u64 = headers
        .get("x-ratelimit-reset")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let reset = UNIX_EPOCH.checked_add(Duration::from_secs(seconds))?;
    let wait = reset.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_PROVIDER_WAIT))
}

/// Whether SendGrid's answer is about this message's sender identity, not the account.
fn is_about_the_sender(status: u16, message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    status == 403
        && ["sender identity", "not verified", "unverified"]
            .iter()
            .any(|word| lower.contains(word))
        && !["credits", "suspended", "disabled", "banned"]
            .iter()
            .any(|word| lower.contains(word))
}

/// The table of [`classify_sendgrid_error`].
fn category_of(status: u16, message: &str) -> Category {
    let lower = message.to_ascii_lowercase();
    let says = |words: &[&str]| words.iter().any(|word| lower.contains(word));
    match status {
        401 | 403 if says(&["credits", "suspended", "disabled", "banned"]) => {
            Category::Configuration
        }
        403 if says(&["sender identity", "not verified", "unverified"]) => Category::Configuration,
        403 if says(&["too many bad requests", "temporar"]) => Category::RateLimited,
        // 400 and 413 InvalidMessage; 451 (data residency) Configuration.
        _ => category_of_status(status),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sorted(status: u16, message: &str) -> SendError {
        let body = format!(r#"{{"errors":[{{"message":"{message}","field":null}}]}}"#);
        classify_sendgrid_error(status, &HeaderMap::new(), body.as_bytes())
    }

    #[test]
    fn sendgrid_bad_keys_and_missing_scopes_are_authentication() {
        let error = sorted(
            401,
            "The provided authorization grant is invalid, expired, or revoked",
        );
        assert_eq!(error.category(), Category::Authentication);
        assert_eq!(error.code(), "sendgrid.401");
        assert_eq!(
            sorted(403, "access forbidden").category(),
            Category::Authentication
        );
    }

    #[test]
    fn sendgrid_an_unverified_sender_identity_is_about_the_message_and_a_stopped_account_is_not() {
        let unverified = sorted(
            403,
            "The from address does not match a verified Sender Identity.",
        );
        assert!(unverified.is_about_the_message());
        for (status, message) in [
            (401, "Maximum credits exceeded"),
            (403, "Your account has been suspended"),
            (403, "access forbidden"),
            (401, "The provided authorization grant is invalid"),
            (400, "The from address is not a verified sender"),
        ] {
            assert!(
                !sorted(status, message).is_about_the_message(),
                "{status} {message}"
            );
        }
    }

    #[test]
    fn sendgrid_unverified_senders_and_stopped_accounts_are_configuration() {
        assert_eq!(
            sorted(
                403,
                "The from address does not match a verified Sender Identity."
            )
            .category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(401, "Maximum credits exceeded").category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(403, "Your account has been suspended").category(),
            Category::Configuration
        );
        assert_eq!(sorted(451, "").category(), Category::Configuration);
    }

    #[test]
    fn sendgrid_bad_requests_are_invalid_message_naming_the_field() {
        let body = br#"{"errors":[{"message":"Does not contain a valid address.","field":"personalizations.0.to.0.email"}]}"#;
        let error = classify_sendgrid_error(400, &HeaderMap::new(), body);
        assert_eq!(error.category(), Category::InvalidMessage);
        assert!(error.message().contains("personalizations.0.to.0.email"));
        assert_eq!(sorted(413, "").category(), Category::InvalidMessage);
    }

    #[test]
    fn sendgrid_rate_limits_and_temporary_blocks_are_rate_limited() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "30".parse().expect("a header value"));
        let error = classify_sendgrid_error(429, &headers, b"");
        assert_eq!(error.category(), Category::RateLimited);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(30)));
        assert_eq!(
            sorted(403, "Too many bad requests. Temporary block").category(),
            Category::RateLimited
        );
    }

    #[test]
    fn sendgrid_rate_limit_reset_is_the_wait_until_then_capped_at_a_day() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-ratelimit-reset", value.parse().expect("a header value"));
            headers
        };
        assert_eq!(
            rate_limit_reset(&headers("1700000030"), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            rate_limit_reset(&headers("1699999990"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            rate_limit_reset(&headers("1800000000"), now),
            Some(MAX_PROVIDER_WAIT)
        );
        assert_eq!(rate_limit_reset(&headers("soon"), now), None);
        assert_eq!(rate_limit_reset(&HeaderMap::new(), now), None);
        // Retry-After, where one comes, decides.
        let mut both = headers("99999999999");
        both.insert("retry-after", "5".parse().expect("a header value"));
        let error = classify_sendgrid_error(429, &both, b"");
        assert_eq!(error.retry_after(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn sendgrid_x_ratelimit_reset_alone_gives_retry_after() {
        let in_a_minute = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
            + 60;
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-ratelimit-reset",
            in_a_minute.to_string().parse().expect("a header value"),
        );
        let after = classify_sendgrid_error(429, &headers, b"")
            .retry_after()
            .expect("the reset is kept");
        assert!(after > Duration::from_secs(50), "{after:?}");
    }

    #[test]
    fn sendgrid_messages_without_a_field_stand_alone() {
        let body = br#"{"errors":[{"message":"too many requests","field":""},{"message":"x","field":null}]}"#;
        let error = classify_sendgrid_error(429, &HeaderMap::new(), body);
        assert_eq!(error.message(), "HTTP 429: too many requests; x");
    }

    #[test]
    fn sendgrid_408_is_a_timeout() {
        assert_eq!(sorted(408, "").category(), Category::Timeout);
    }

    #[test]
    fn sendgrid_wrong_endpoints_are_configuration() {
        assert_eq!(sorted(404, "not found").category(), Category::Configuration);
        assert_eq!(sorted(406, "").category(), Category::Configuration);
    }

    #[test]
    fn sendgrid_outages_are_server_error_or_service_unavailable() {
        assert_eq!(sorted(500, "").category(), Category::ServerError);
        assert_eq!(sorted(502, "").category(), Category::ServerError);
        assert_eq!(sorted(503, "").category(), Category::ServiceUnavailable);
    }
}
