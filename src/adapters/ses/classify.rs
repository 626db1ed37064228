//! Sorting the AWS SDK's errors for SES into [`Category`]s.

use std::time::Duration;

use aws_sdk_sesv2::config::http::HttpResponse;
use aws_sdk_sesv2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::adapters::answer::safe_message;
use crate::receipt::SourceText;
use crate::{Category, SendError};

/// Sorts an error of an SES v2 call (`SendEmail`, `GetAccount`, any other) into a
/// [`Category`], with the code `ses.<ErrorCode>` for a service error that names its code
/// (`ses.TooManyRequestsException`), `ses.<HTTP status>` for one that does not (`ses.503`),
/// else `ses.timeout`, `ses.network`, `ses.client` or `ses.response`.
///
/// The error code comes from the `x-amzn-ErrorType` header or the `__type` / `code` field of
/// the JSON body (the SDK reads both); the code decides first, then the HTTP status.
///
/// | what happened | category |
/// |---|---|
/// | `TooManyRequestsException`, `Throttling`, `ThrottlingException`, HTTP 429 | RateLimited |
/// | `ServiceUnavailable`, `ServiceUnavailableException`, HTTP 503 | ServiceUnavailable |
/// | `InternalFailure`, `InternalServerError`, other HTTP 5xx | ServerError |
/// | `MessageRejected` | Rejected |
/// | `MailFromDomainNotVerifiedException`, `FromEmailAddressNotVerifiedException`; any code but an authentication or rate one with a message saying "not verified" ("Email address is not verified"): the sender identity, which fails every message | Configuration |
/// | `LimitExceededException` ("there are too many instances of the specified resource type": an account limit, not a send rate) | Configuration |
/// | HTTP 401 and 403, signature and credential codes (`SignatureDoesNotMatch`, `AccessDenied`, `UnrecognizedClientException`, `ExpiredToken`, ...) | Authentication |
/// | `AccountSuspendedException`, `SendingPausedException`, `NotFoundException` (a configuration set or template that does not exist), other HTTP 4xx (a wrong endpoint) | Configuration |
/// | `BadRequestException`, `ValidationException`, other HTTP 400, HTTP 413 | InvalidMessage |
/// | operation or attempt timeout, a read timeout (**maybe delivered**); a connect timeout; HTTP 408 (the server stopped waiting for the request) | Timeout |
/// | a connection dropped after the request went out, a 2xx whose body was cut off (**maybe delivered**); connection refused, DNS, TLS | Network |
/// | a request that could not be built or dispatched (no region, no credentials) | Configuration |
///
/// A `Retry-After` header, in seconds or as an HTTP-date, becomes [`SendError::retry_after`],
/// whatever the category, capped at [`MAX_PROVIDER_WAIT`](crate::MAX_PROVIDER_WAIT) (a day). Account suspension is Configuration so that a pool fails over on it while a
/// breaker does not count it: the provider is up, this account cannot use it.
///
/// **Maybe delivered** ([`SendError::is_maybe_delivered`]) marks a request that went out and
/// got no answer: SES may have taken the message. An operation timeout is marked too, since
/// the SDK does not say whether it struck before the request went out; a failure to connect
/// (the hyper client's `Connect` error: refused, DNS, TLS, connect timeout) is not.
///
/// The error's message is the service's message, addresses masked and cut at 300 characters
/// (authentication messages at their first sentence, since signature errors can echo the
/// request that was signed); a request body is never part of it.
///
/// ```
/// use aws_sdk_sesv2::error::SdkError;
/// use aws_sdk_sesv2::operation::send_email::SendEmailError;
/// use mail_breaker::{classify_ses_error, Category};
///
/// let error: SdkError<SendEmailError, aws_sdk_sesv2::config::http::HttpResponse> =
///     SdkError::timeout_error("operation timed out");
/// let sorted = classify_ses_error(&error);
/// assert_eq!(sorted.category(), Category::Timeout);
/// assert_eq!(sorted.code(), "ses.timeout");
/// ```
pub fn classify_ses_error<E>(error: &SdkError<E, HttpResponse>) -> SendError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match error {
        SdkError::ServiceError(service) => {
            let response = service.raw();
            from_response(
                error.code(),
                error.message(),
                Some(response.status().as_u16()),
                response,
            )
        }
        SdkError::TimeoutError(_) => SendError::new(
            Category::Timeout,
            "ses.timeout",
            "SES did not answer in time (operation or attempt timeout); it may have taken the message",
        )
        .maybe_delivered()
        .with_source(source_text(error)),
        SdkError::DispatchFailure(failure) => {
            let connecting = is_connect_failure(&DisplayErrorContext(error).to_string());
            let sorted = if failure.is_user() {
                SendError::new(
                    Category::Configuration,
                    "ses.client",
                    "the request could not be dispatched as configured",
                )
            } else if failure.is_timeout() && connecting {
                SendError::new(
                    Category::Timeout,
                    "ses.timeout",
                    "no connection to SES in time (connect timeout)",
                )
            } else if failure.is_timeout() {
                SendError::new(
                    Category::Timeout,
                    "ses.timeout",
                    "SES did not answer in time (read timeout); it may have taken the message",
                )
                .maybe_delivered()
            } else if connecting {
                SendError::new(
                    Category::Network,
                    "ses.network",
                    "the connection to SES could not be made",
                )
            } else {
                SendError::new(
                    Category::Network,
                    "ses.network",
                    "the connection to SES dropped before it answered; it may have taken the message",
                )
                .maybe_delivered()
            };
            sorted.with_source(source_text(error))
        }
        SdkError::ResponseError(response_error) => {
            let response = response_error.raw();
            let status = response.status().as_u16();
            let sorted = if status >= 400 {
                from_response(None, None, Some(status), response)
            } else {
                // A success status with a body cut off or unreadable: SES may have taken it.
                SendError::new(
                    Category::Network,
                    "ses.response",
                    "the response from SES was cut off or unreadable; it may have taken the message",
                )
                .maybe_delivered()
            };
            sorted.with_source(source_text(error))
        }
        // ConstructionFailure and anything a later SDK adds: no request reached SES.
        _ => SendError::new(
            Category::Configuration,
            "ses.client",
            "the request could not be built (region, credentials or endpoint missing?)",
        )
        .with_source(source_text(error)),
    }
}

/// A service's error answer, sorted by its code, status and message.
fn from_response(
    code: Option<&str>,
    message: Option<&str>,
    status: Option<u16>,
    response: &HttpResponse,
) -> SendError {
    let message = message.unwrap_or("");
    let category = category_of(code, status, message);
    let code = match (code, status) {
        (Some(code), _) if !code.is_empty() => format!("ses.{code}"),
        (_, Some(status)) => format!("ses.{status}"),
        _ => "ses.unknown".to_owned(),
    };
    let text = if message.is_empty() {
        match status {
            Some(status) => format!("SES answered HTTP {status}"),
            None => "SES answered an error".to_owned(),
        }
    } else {
        safe_message(message, category)
    };
    let mut sorted = SendError::new(category, code, text);
    if is_about_the_message(category, message, &sorted) {
        sorted = sorted.about_the_message();
    }
    match retry_after(response) {
        Some(after) => sorted.with_retry_after(after),
        None => sorted,
    }
}

/// The table of [`classify_ses_error`]: the code decides first, then the HTTP status.
fn category_of(code: Option<&str>, status: Option<u16>, message: &str) -> Category {
    let by_code = code.and_then(category_of_code);
    // SES says "Email address is not verified" under more than one code (MessageRejected
    // among them): the sender identity (or, in the sandbox, the recipient) is not verified,
    // which fails every such message until the account is set up, so a pool fails over.
    if matches!(
        by_code,
        None | Some(Category::InvalidMessage | Category::Rejected)
    ) && is_unverified_address(message)
    {
        return Category::Configuration;
    }
    if let Some(category) = by_code {
        return category;
    }
    match status {
        Some(429) => Category::RateLimited,
        // Request Timeout: the server stopped waiting for the request, so it did not take it.
        Some(408) => Category::Timeout,
        Some(503) => Category::ServiceUnavailable,
        Some(401 | 403) => Category::Authentication,
        Some(400 | 413) => Category::InvalidMessage,
        Some(400..=499) => Category::Configuration,
        // An error without a status the SDK could read: treat the provider as failing.
        _ => Category::ServerError,
    }
}

/// The category an SES (or generic AWS) error code names, if it names one.
fn category_of_code(code: &str) -> Option<Category> {
    let category = match code {
        "TooManyRequestsException"
        | "Throttling"
        | "ThrottlingException"
        | "ThrottledException"
        | "RequestLimitExceeded" => Category::RateLimited,
        "ServiceUnavailable" | "ServiceUnavailableException" => Category::ServiceUnavailable,
        "InternalFailure" | "InternalServerError" | "InternalError" | "InternalServiceError" => {
            Category::ServerError
        }
        "MessageRejected" => Category::Rejected,
        "MailFromDomainNotVerifiedException"
        | "MailFromDomainNotVerified"
        | "FromEmailAddressNotVerifiedException"
        | "LimitExceededException" => Category::Configuration,
        "SignatureDoesNotMatch"
        | "InvalidSignatureException"
        | "IncompleteSignature"
        | "IncompleteSignatureException"
        | "AccessDenied"
        | "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "ExpiredTokenException"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException"
        | "NotAuthorized"
        | "RequestExpired" => Category::Authentication,
        "AccountSuspendedException"
        | "AccountSuspended"
        | "SendingPausedException"
        | "AccountSendingPausedException"
        | "ConfigurationSetSendingPausedException"
        | "NotFoundException"
        | "ConfigurationSetDoesNotExistException" => Category::Configuration,
        "BadRequestException"
        | "ValidationException"
        | "ValidationError"
        | "InvalidParameterValue"
        | "InvalidParameterValueException"
        | "SerializationException" => Category::InvalidMessage,
        _ => return None,
    };
    Some(category)
}

/// Whether SES's message says a sender or recipient is not a verified identity, as the
/// sandbox and an unverified sender answer: "Email address is not verified. The following
/// identities failed the check in region ...".
/// Whether SES's answer is about this message's sender (or, in the sandbox, recipient) and
/// not about the account: an identity not verified fails the messages that use it, while the
/// member sends everyone else's mail (DESIGN §19).
fn is_about_the_message(category: Category, message: &str, sorted: &SendError) -> bool {
    category == Category::Configuration
        && (is_unverified_address(message)
            || matches!(
                sorted.code(),
                "ses.MailFromDomainNotVerifiedException"
                    | "ses.MailFromDomainNotVerified"
                    | "ses.FromEmailAddressNotVerifiedException"
            ))
}

fn is_unverified_address(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("not verified") || lower.contains("did not have authority to send")
}

/// Whether a dispatch failure happened while connecting (nothing was sent): hyper's client
/// names it `Connect` (refused, DNS, TLS handshake, connect timeout).
fn is_connect_failure(chain: &str) -> bool {
    chain.contains("client error (Connect)")
}

/// The response's `Retry-After` header (seconds or an HTTP-date), capped at a day.
fn retry_after(response: &HttpResponse) -> Option<Duration> {
    crate::adapters::answer::retry_after(response.headers().get("retry-after")?)
}

/// The SDK error's chain of causes as text, addresses masked, kept as the source.
fn source_text<E>(error: &SdkError<E, HttpResponse>) -> SourceText
where
    E: std::error::Error + 'static,
{
    let text = DisplayErrorContext(error).to_string();
    SourceText::masked(safe_message(&text, Category::Network))
}

#[cfg(test)]
mod tests {
    use super::*;

    use aws_sdk_sesv2::error::ErrorMetadata;
    use aws_sdk_sesv2::operation::send_email::SendEmailError;
    use aws_smithy_runtime_api::client::result::ConnectorError;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    fn response(status: u16, headers: &[(&'static str, &'static str)]) -> HttpResponse {
        let status = StatusCode::try_from(status).expect("a valid status");
        let mut response = HttpResponse::new(status, SdkBody::empty());
        for (name, value) in headers {
            response.headers_mut().insert(*name, *value);
        }
        response
    }

    fn service_error(
        status: u16,
        code: Option<&str>,
        message: &str,
        headers: &[(&'static str, &'static str)],
    ) -> SdkError<SendEmailError, HttpResponse> {
        let mut meta = ErrorMetadata::builder().message(message);
        if let Some(code) = code {
            meta = meta.code(code);
        }
        SdkError::service_error(
            SendEmailError::generic(meta.build()),
            response(status, headers),
        )
    }

    fn sorted(status: u16, code: Option<&str>, message: &str) -> SendError {
        classify_ses_error(&service_error(status, code, message, &[]))
    }

    #[test]
    fn throttling_is_rate_limited() {
        let error = sorted(429, Some("TooManyRequestsException"), "Too many requests");
        assert_eq!(error.category(), Category::RateLimited);
        assert_eq!(error.code(), "ses.TooManyRequestsException");
        assert_eq!(
            sorted(400, Some("Throttling"), "Maximum sending rate exceeded.").category(),
            Category::RateLimited
        );
        assert_eq!(sorted(429, None, "").category(), Category::RateLimited);
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date_is_kept_and_capped_at_a_day() {
        let error = classify_ses_error(&service_error(
            429,
            Some("TooManyRequestsException"),
            "slow down",
            &[("retry-after", "7")],
        ));
        assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
        let past = classify_ses_error(&service_error(
            429,
            None,
            "",
            &[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")],
        ));
        assert_eq!(past.retry_after(), Some(Duration::ZERO));
        let absurd = classify_ses_error(&service_error(429, None, "", &[("retry-after", "1e20")]));
        assert_eq!(absurd.retry_after(), Some(crate::MAX_PROVIDER_WAIT));
        let garbage = classify_ses_error(&service_error(429, None, "", &[("retry-after", "NaN")]));
        assert_eq!(garbage.retry_after(), None);
    }

    #[test]
    fn server_failures_are_server_error_and_503_is_service_unavailable() {
        assert_eq!(
            sorted(500, Some("InternalFailure"), "").category(),
            Category::ServerError
        );
        assert_eq!(sorted(502, None, "").category(), Category::ServerError);
        let unavailable = sorted(503, None, "");
        assert_eq!(unavailable.category(), Category::ServiceUnavailable);
        assert_eq!(unavailable.code(), "ses.503");
    }

    #[test]
    fn an_unverified_identity_is_about_the_message_and_an_account_failure_is_not() {
        for (code, message) in [
            (Some("MessageRejected"), "Email address is not verified."),
            (Some("MailFromDomainNotVerifiedException"), ""),
            (Some("FromEmailAddressNotVerifiedException"), ""),
        ] {
            assert!(
                sorted(400, code, message).is_about_the_message(),
                "{code:?}"
            );
        }
        for (code, message) in [
            (Some("AccountSuspendedException"), ""),
            (Some("SendingPausedException"), ""),
            (Some("AccessDenied"), "identity is not verified"),
            (Some("MessageRejected"), "Illegal address"),
            (Some("LimitExceededException"), ""),
        ] {
            assert!(
                !sorted(400, code, message).is_about_the_message(),
                "{code:?}"
            );
        }
    }

    #[test]
    fn rejected_messages_are_rejected_and_unverified_identities_configuration() {
        assert_eq!(
            sorted(400, Some("MessageRejected"), "").category(),
            Category::Rejected
        );
        for code in [
            "MailFromDomainNotVerifiedException",
            "FromEmailAddressNotVerifiedException",
            "LimitExceededException",
        ] {
            assert_eq!(
                sorted(400, Some(code), "").category(),
                Category::Configuration,
                "{code}"
            );
        }
        assert_eq!(
            sorted(
                400,
                Some("MessageRejected"),
                "Email address is not verified."
            )
            .category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(
                400,
                Some("BadRequestException"),
                "Email address is not verified."
            )
            .category(),
            Category::Configuration
        );
        assert_eq!(
            sorted(403, Some("AccessDenied"), "identity is not verified").category(),
            Category::Authentication
        );
        let unverified = sorted(
            400,
            Some("SomethingNew"),
            "Email address is not verified. The following identities failed the check in region US-EAST-1: bob@example.org",
        );
        assert_eq!(unverified.category(), Category::Configuration);
        assert!(!unverified.to_string().contains("bob@"));
        assert!(
            unverified.is_about_the_message(),
            "one sender, not the account"
        );
    }

    #[test]
    fn credential_failures_are_authentication_cut_at_the_first_sentence() {
        let error = sorted(
            403,
            Some("SignatureDoesNotMatch"),
            "The request signature we calculated does not match. The Canonical String for this request should have been 'POST ...'",
        );
        assert_eq!(error.category(), Category::Authentication);
        assert!(!error.to_string().contains("Canonical"));
        assert_eq!(sorted(403, None, "").category(), Category::Authentication);
        assert_eq!(
            sorted(400, Some("UnrecognizedClientException"), "").category(),
            Category::Authentication
        );
    }

    #[test]
    fn suspended_or_paused_accounts_are_configuration() {
        for code in ["AccountSuspendedException", "SendingPausedException"] {
            assert_eq!(
                sorted(400, Some(code), "").category(),
                Category::Configuration
            );
        }
        assert_eq!(sorted(404, None, "").category(), Category::Configuration);
    }

    #[test]
    fn bad_requests_are_invalid_message() {
        assert_eq!(
            sorted(400, Some("BadRequestException"), "").category(),
            Category::InvalidMessage
        );
        assert_eq!(sorted(400, None, "").category(), Category::InvalidMessage);
        assert_eq!(sorted(413, None, "").category(), Category::InvalidMessage);
    }

    #[test]
    fn an_http_408_is_a_timeout_that_was_not_delivered() {
        // 408 Request Timeout: the server gave up waiting for the request, so it has not
        // taken the message, and trying again may pass.
        let error = sorted(408, None, "");
        assert_eq!(error.category(), Category::Timeout);
        assert_eq!(error.code(), "ses.408");
        assert!(error.is_retryable());
        assert!(!error.is_maybe_delivered());
    }

    #[test]
    fn timeouts_and_dispatch_failures_are_timeout_and_network() {
        let timeout: SdkError<SendEmailError, HttpResponse> = SdkError::timeout_error("late");
        assert_eq!(classify_ses_error(&timeout).category(), Category::Timeout);
        let connect_timeout: SdkError<SendEmailError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::timeout("connect".into()));
        assert_eq!(classify_ses_error(&connect_timeout).code(), "ses.timeout");
        let refused: SdkError<SendEmailError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io("connection refused".into()));
        let error = classify_ses_error(&refused);
        assert_eq!(error.category(), Category::Network);
        assert_eq!(error.code(), "ses.network");
        assert!(std::error::Error::source(&error).is_some());
    }

    #[test]
    fn a_request_that_went_out_without_an_answer_is_maybe_delivered_and_a_failed_connect_is_not() {
        let dispatch = |error: ConnectorError| -> SendError {
            classify_ses_error(&SdkError::<SendEmailError, HttpResponse>::dispatch_failure(
                error,
            ))
        };
        let refused = dispatch(ConnectorError::io(
            "client error (Connect): tcp connect error: Connection refused".into(),
        ));
        assert_eq!(refused.category(), Category::Network);
        assert!(!refused.is_maybe_delivered());
        let connect_timeout = dispatch(ConnectorError::timeout(
            "client error (Connect): HTTP connect timeout occurred after 3.1s".into(),
        ));
        assert_eq!(connect_timeout.category(), Category::Timeout);
        assert!(!connect_timeout.is_maybe_delivered());
        let read_timeout = dispatch(ConnectorError::timeout("read timed out".into()));
        assert_eq!(read_timeout.category(), Category::Timeout);
        assert!(read_timeout.is_maybe_delivered());
        let dropped = dispatch(ConnectorError::io(
            "connection closed before message completed".into(),
        ));
        assert_eq!(dropped.category(), Category::Network);
        assert!(dropped.is_maybe_delivered());
        let user = dispatch(ConnectorError::user("bad header".into()));
        assert_eq!(user.category(), Category::Configuration);
        assert!(!user.is_maybe_delivered());
        let operation: SdkError<SendEmailError, HttpResponse> = SdkError::timeout_error("late");
        assert!(classify_ses_error(&operation).is_maybe_delivered());
    }

    /// The code decides before the status: each under a status that would say another
    /// category by itself.
    #[test]
    fn error_codes_decide_before_the_http_status() {
        let table = [
            ("ServiceUnavailable", 500, Category::ServiceUnavailable),
            ("InternalFailure", 400, Category::ServerError),
            ("ValidationException", 404, Category::InvalidMessage),
            ("BadRequestException", 500, Category::InvalidMessage),
        ];
        for (code, status, category) in table {
            assert_eq!(
                sorted(status, Some(code), "").category(),
                category,
                "{code}"
            );
        }
    }

    #[test]
    fn an_empty_error_code_gives_the_status_as_code() {
        assert_eq!(sorted(400, Some(""), "").code(), "ses.400");
    }

    #[test]
    fn a_response_that_could_not_be_read_is_sorted_by_its_status() {
        let unreadable = |status: u16| -> SendError {
            classify_ses_error(&SdkError::<SendEmailError, HttpResponse>::response_error(
                "the body could not be read",
                response(status, &[]),
            ))
        };
        let cut_off = unreadable(200);
        assert_eq!(cut_off.category(), Category::Network);
        assert_eq!(cut_off.code(), "ses.response");
        assert!(cut_off.is_maybe_delivered());
        let unavailable = unreadable(503);
        assert_eq!(unavailable.category(), Category::ServiceUnavailable);
        assert_eq!(unavailable.code(), "ses.503");
        assert!(!unavailable.is_maybe_delivered());
        assert_eq!(unreadable(400).category(), Category::InvalidMessage);
    }

    #[test]
    fn construction_failures_are_configuration() {
        let error: SdkError<SendEmailError, HttpResponse> =
            SdkError::construction_failure("no region");
        assert_eq!(
            classify_ses_error(&error).category(),
            Category::Configuration
        );
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x".repeat(1000);
        let error = sorted(500, None, &long);
        assert!(error.message().len() < 400);
    }
}
