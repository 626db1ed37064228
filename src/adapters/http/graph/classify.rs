//! Sorting Microsoft Graph's error answers into [`Category`]s.

use serde::Deserialize;

use crate::adapters::http::{HeaderMap, answer_error, category_of_status};
use crate::{Category, SendError};

/// Graph's error body: `{"error": {"code": "ErrorSendAsDenied", "message": "..."}}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: Inner,
}

#[derive(Debug, Default, Deserialize)]
struct Inner {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Sorts an error answer of Graph's `sendMail` (its HTTP status, headers and body) into a
/// [`Category`], with the code `graph.<code>` where the body names its error
/// (`graph.ErrorSendAsDenied`), else `graph.<status>` (`graph.503`).
///
/// The error's code decides first, then the HTTP status.
///
/// | what happened | category |
/// |---|---|
/// | `ErrorSendAsDenied`: the message's From is not the sender mailbox, nor one it may send as | Configuration, **about the message** (another message from the sender goes) |
/// | `ErrorAccessDenied`, `NoPermissionsInAccessToken` (no consent for `Mail.Send`, or an application access policy that leaves the mailbox out), `MailboxNotEnabledForRESTAPI`, `ResourceNotFound`, `ErrorInvalidUser` (no such mailbox), `ErrorQuotaExceeded` (the sender's mailbox is full: a MIME send is saved to Sent Items) | Configuration |
/// | `InvalidAuthenticationToken`; HTTP 401 | Authentication |
/// | `ErrorMessageSizeExceeded`, `ErrorMimeContentInvalid`, `ErrorMimeContentInvalidBase64String`, `ErrorMimeContentConversionFailed` (a MIME Graph cannot read or convert); HTTP 413 | Unsupported (another member, which takes MIME as it is, may carry it) |
/// | `ErrorInvalidRecipients`; HTTP 400 and 422 | InvalidMessage |
/// | `ApplicationThrottled`, `MailboxConcurrency`; HTTP 429 | RateLimited |
/// | HTTP 503 | ServiceUnavailable |
/// | HTTP 500, 502, 504 and any other 5xx | ServerError, **maybe delivered** (Graph may have taken the message) |
/// | HTTP 408 | Timeout |
/// | HTTP 403 without a code above, any other status | Authentication (403), Configuration |
///
/// A `Retry-After` header becomes [`SendError::retry_after`], capped at a day. The error's
/// message is Graph's, addresses masked and cut at 300 characters.
///
/// ```
/// use mail_breaker::{Category, classify_graph_error};
/// use mail_breaker::adapters::http::HeaderMap;
///
/// let body = br#"{"error":{"code":"ErrorSendAsDenied","message":"The user account which was used to submit this request does not have the right to send mail on behalf of the specified sending account."}}"#;
/// let error = classify_graph_error(403, &HeaderMap::new(), body);
/// assert_eq!(error.category(), Category::Configuration);
/// assert_eq!(error.code(), "graph.ErrorSendAsDenied");
/// assert!(error.is_about_the_message());
/// ```
pub fn classify_graph_error(status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let Inner { code, message } = parsed.error;
    // A code is Graph's own word; anything else (a proxy's text) is not quoted as one.
    let named = !code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|byte| byte.is_ascii_alphanumeric());
    let category = category_of(status, if named { &code } else { "" });
    let code_text = if named {
        format!("graph.{code}")
    } else {
        format!("graph.{status}")
    };
    let mut error = answer_error(category, code_text, status, &message, headers);
    if named && code == "ErrorSendAsDenied" {
        error = error.about_the_message();
    }
    if status >= 500 && status != 503 {
        // The request reached Graph and it failed on its side: the message may have gone.
        error = error.maybe_delivered();
    }
    error
}

/// The table of [`classify_graph_error`]: the code first, then the status.
fn category_of(status: u16, code: &str) -> Category {
    match code {
        "ErrorSendAsDenied"
        | "ErrorAccessDenied"
        | "NoPermissionsInAccessToken"
        | "MailboxNotEnabledForRESTAPI"
        | "ResourceNotFound"
        | "ErrorInvalidUser"
        | "ErrorQuotaExceeded" => Category::Configuration,
        "InvalidAuthenticationToken" => Category::Authentication,
        // Another member, which takes the MIME as it is, may carry it.
        "ErrorMessageSizeExceeded"
        | "ErrorMimeContentInvalid"
        | "ErrorMimeContentInvalidBase64String"
        | "ErrorMimeContentConversionFailed" => Category::Unsupported,
        "ErrorInvalidRecipients" => Category::InvalidMessage,
        "ApplicationThrottled" | "MailboxConcurrency" => Category::RateLimited,
        _ => match status {
            413 => Category::Unsupported,
            _ => category_of_status(status),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn body(code: &str) -> Vec<u8> {
        format!(r#"{{"error":{{"code":"{code}","message":"Graph says no to bob@example.org."}}}}"#)
            .into_bytes()
    }

    fn retry_after(seconds: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", seconds.parse().unwrap());
        headers
    }

    #[test]
    fn each_row_of_the_table_gives_its_category() {
        let table = [
            (403, "ErrorSendAsDenied", Category::Configuration),
            (403, "ErrorAccessDenied", Category::Configuration),
            (403, "NoPermissionsInAccessToken", Category::Configuration),
            (400, "MailboxNotEnabledForRESTAPI", Category::Configuration),
            (404, "ResourceNotFound", Category::Configuration),
            (404, "ErrorInvalidUser", Category::Configuration),
            (403, "ErrorQuotaExceeded", Category::Configuration),
            (401, "InvalidAuthenticationToken", Category::Authentication),
            (413, "ErrorMessageSizeExceeded", Category::Unsupported),
            (400, "ErrorInvalidRecipients", Category::InvalidMessage),
            (
                400,
                "ErrorMimeContentInvalidBase64String",
                Category::Unsupported,
            ),
            (
                400,
                "ErrorMimeContentConversionFailed",
                Category::Unsupported,
            ),
            (429, "ApplicationThrottled", Category::RateLimited),
            (503, "", Category::ServiceUnavailable),
            (500, "", Category::ServerError),
            (408, "", Category::Timeout),
            (403, "", Category::Authentication),
            (413, "", Category::Unsupported),
            (404, "", Category::Configuration),
        ];
        for (status, code, category) in table {
            let error = classify_graph_error(status, &HeaderMap::new(), &body(code));
            assert_eq!(error.category(), category, "{status} {code}");
            let expected = if code.is_empty() {
                format!("graph.{status}")
            } else {
                format!("graph.{code}")
            };
            assert_eq!(error.code(), expected);
            assert_eq!(
                error.is_about_the_message(),
                code == "ErrorSendAsDenied",
                "{status} {code}"
            );
        }
    }

    #[test]
    fn a_429_and_a_503_keep_their_retry_after_and_are_not_maybe_delivered() {
        let limited = classify_graph_error(429, &retry_after("7"), &body("ApplicationThrottled"));
        assert_eq!(limited.retry_after(), Some(Duration::from_secs(7)));
        assert!(!limited.is_maybe_delivered());
        let busy = classify_graph_error(503, &retry_after("30"), b"");
        assert_eq!(busy.category(), Category::ServiceUnavailable);
        assert_eq!(busy.retry_after(), Some(Duration::from_secs(30)));
        assert!(!busy.is_maybe_delivered());
    }

    #[test]
    fn a_5xx_but_503_is_maybe_delivered() {
        for status in [500, 502, 504, 599] {
            let error = classify_graph_error(status, &HeaderMap::new(), b"");
            assert!(error.is_maybe_delivered(), "{status}");
        }
    }

    #[test]
    fn a_code_that_is_not_a_word_is_not_quoted_as_graphs() {
        let error = classify_graph_error(
            403,
            &HeaderMap::new(),
            br#"{"error":{"code":"<script>\u001b[31m","message":""}}"#,
        );
        assert_eq!(error.code(), "graph.403");
    }

    #[test]
    fn the_message_masks_addresses() {
        let error = classify_graph_error(403, &HeaderMap::new(), &body("ErrorAccessDenied"));
        assert!(
            !error.message().contains("bob@example.org"),
            "{}",
            error.message()
        );
    }
}
