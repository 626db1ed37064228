//! The crate's spans, in OpenTelemetry's words (DESIGN §22).
//!
//! Every span is a `tracing` span: an OpenTelemetry backend receives them through
//! `tracing-opentelemetry`, grouped with the rest of a request's trace. Their names and
//! attributes are listed here, and no other appears: no attribute, span name or event field
//! holds an envelope address, a subject, a user name or a secret.
//!
//! | span | level | parent | attributes |
//! |---|---|---|---|
//! | `mail_breaker.send`: a message handed to a [`Mailer`](crate::Mailer), or an outbox attempt | INFO | the caller's | `mail_breaker.operation` = `send`, `mail_breaker.outbox.attempt` (the worker's), `error.type` |
//! | `mail_breaker.try`: one pool member's try | INFO | `send` | `mail_breaker.operation` = `try`, `mail_breaker.member`, `error.type` |
//! | `mail_breaker.decide`: a breaker's decision | DEBUG | `try` or `send` | `mail_breaker.operation` = `decide`, `mail_breaker.member`, `mail_breaker.breaker.state` (`closed`, `open`, `half_open`), `error.type` (`breaker.open`, `breaker.isolated` when refused) |
//! | `mail_breaker.smtp.connect`: a new SMTP connection | INFO | the send's | `mail_breaker.operation` = `connect`, `server.address`, `server.port`, `error.type` |
//! | `mail_breaker.smtp.tls`: `STARTTLS`'s, or implicit TLS's, handshake | INFO | `connect` | `mail_breaker.operation` = `tls`, `error.type` |
//! | `mail_breaker.smtp.auth`: logging in | INFO | `connect` | `mail_breaker.operation` = `auth`, `error.type` |
//! | `mail_breaker.smtp.transaction`: `MAIL FROM` to the final answer | INFO | the send's | `mail_breaker.operation` = `transaction`, `mail_breaker.member`, `error.type` |
//! | `mail_breaker.http`: an HTTP API's request | INFO | the send's | `mail_breaker.operation` = `http`, `mail_breaker.member`, `http.request.method`, `url.template`, `server.address`, `http.response.status_code`, `error.type` |
//! | `mail_breaker.outbox.claim`: a worker's claim of due mail | DEBUG | none | `mail_breaker.operation` = `claim`, `error.type` |
//! | `mail_breaker.outbox.answer`: a worker writing answers back | DEBUG | none | `mail_breaker.operation` = `answer`, `error.type` |
//!
//! `error.type` is the error's [code](crate::SendError::code) (`smtp.421`,
//! `resend.rate_limit_exceeded`, `breaker.open`), set only when the operation failed; on
//! `mail_breaker.http` it is the HTTP status of a 4xx or 5xx answer (`429`), as
//! OpenTelemetry's HTTP conventions have it, the provider's code being on the spans above.
//! `url.template` is the path with its variable parts named (`/v1.0/users/{sender}/sendMail`),
//! never `url.full`, which would carry Microsoft Graph's sender mailbox. `server.address` is
//! the provider's host, a name the configuration holds, not a recipient's.

use tracing::Span;

use crate::SendError;

/// Every span name the crate makes.
pub const SPAN_NAMES: [&str; 10] = [
    "mail_breaker.send",
    "mail_breaker.try",
    "mail_breaker.decide",
    "mail_breaker.smtp.connect",
    "mail_breaker.smtp.tls",
    "mail_breaker.smtp.auth",
    "mail_breaker.smtp.transaction",
    "mail_breaker.http",
    "mail_breaker.outbox.claim",
    "mail_breaker.outbox.answer",
];

/// Every attribute name the crate's spans carry.
///
/// ```
/// assert!(mail_breaker::telemetry::ATTRIBUTE_NAMES.contains(&"error.type"));
/// assert!(!mail_breaker::telemetry::ATTRIBUTE_NAMES.contains(&"url.full"));
/// ```
pub const ATTRIBUTE_NAMES: [&str; 11] = [
    "mail_breaker.operation",
    "mail_breaker.member",
    "mail_breaker.breaker.state",
    "mail_breaker.outbox.attempt",
    "error.type",
    "server.address",
    "server.port",
    "url.template",
    "http.request.method",
    "http.response.status_code",
    // The field tracing-opentelemetry reads a span's status from.
    "otel.status_code",
];

/// A span of one operation: its name, `mail_breaker.operation`, the fields given, and the
/// `error.type` and status that [`failed`] sets; every span of the crate is one.
macro_rules! operation_span {
    ($level:ident, $name:literal, $operation:literal $(, $field:literal = $value:expr)* $(,)?) => {
        tracing::span!(
            tracing::Level::$level,
            $name,
            "mail_breaker.operation" = $operation,
            $($field = $value,)*
            "error.type" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        )
    };
}

/// Records on `span` how its operation ended: its error's code as `error.type`, and the
/// span's status as an error.
pub(crate) fn failed(span: &Span, error: &SendError) {
    if !span.is_disabled() {
        span.record("error.type", error.code());
        span.record("otel.status_code", "ERROR");
    }
}

/// [`failed`] when `result` is an error.
pub(crate) fn ended<T>(span: &Span, result: &Result<T, SendError>) {
    if let Err(error) = result {
        failed(span, error);
    }
}

/// The span of a message handed over (`mail_breaker.send`).
#[cfg_attr(not(any(feature = "config", feature = "outbox")), allow(dead_code))]
pub(crate) fn send_span() -> Span {
    operation_span!(
        INFO,
        "mail_breaker.send",
        "send",
        "mail_breaker.outbox.attempt" = tracing::field::Empty,
    )
}

/// The span of one pool member's try (`mail_breaker.try`).
pub(crate) fn try_span(member: &str) -> Span {
    operation_span!(
        INFO,
        "mail_breaker.try",
        "try",
        "mail_breaker.member" = member,
    )
}

/// Whether anyone listens at DEBUG, where a breaker's decision has its span: one read of the
/// level, so that the send path with no listener stays as it is.
#[inline]
pub(crate) fn decisions_traced() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG)
}

/// The span of a breaker's decision (`mail_breaker.decide`), at DEBUG.
pub(crate) fn decide_span(member: &str) -> Span {
    operation_span!(
        DEBUG,
        "mail_breaker.decide",
        "decide",
        "mail_breaker.member" = member,
        "mail_breaker.breaker.state" = tracing::field::Empty,
    )
}

/// Records a breaker's decision on its span: the state it left the breaker in, and the
/// refusal's code if it refused.
pub(crate) fn decided(span: &Span, state: Option<crate::State>, refused: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    if let Some(state) = state {
        span.record("mail_breaker.breaker.state", state.as_str());
    }
    if let Some(code) = refused {
        span.record("error.type", code);
        span.record("otel.status_code", "ERROR");
    }
}

/// The span of a new SMTP connection to `host` (as configured) at `port`.
#[cfg_attr(not(feature = "smtp"), allow(dead_code))]
pub(crate) fn connect_span(host: &str, port: u16) -> Span {
    operation_span!(
        INFO,
        "mail_breaker.smtp.connect",
        "connect",
        "server.address" = host,
        "server.port" = port,
    )
}

/// The span of a connection's TLS handshake.
#[cfg_attr(not(feature = "smtp"), allow(dead_code))]
pub(crate) fn tls_span() -> Span {
    operation_span!(INFO, "mail_breaker.smtp.tls", "tls",)
}

/// The span of a connection's login.
#[cfg_attr(not(feature = "smtp"), allow(dead_code))]
pub(crate) fn auth_span() -> Span {
    operation_span!(INFO, "mail_breaker.smtp.auth", "auth",)
}

/// The span of one SMTP transaction of `member`.
#[cfg_attr(not(feature = "smtp"), allow(dead_code))]
pub(crate) fn transaction_span(member: &str) -> Span {
    operation_span!(
        INFO,
        "mail_breaker.smtp.transaction",
        "transaction",
        "mail_breaker.member" = member,
    )
}

/// The span of an HTTP API's request: `method` to `template` (the path, its variable parts
/// named) on `host`.
#[cfg_attr(
    not(any(
        feature = "postmark",
        feature = "resend",
        feature = "sendgrid",
        feature = "mailgun",
        feature = "graph"
    )),
    allow(dead_code)
)]
pub(crate) fn http_span(member: &str, method: &str, template: &str, host: &str) -> Span {
    operation_span!(
        INFO,
        "mail_breaker.http",
        "http",
        "mail_breaker.member" = member,
        "http.request.method" = method,
        "url.template" = template,
        "server.address" = host,
        "http.response.status_code" = tracing::field::Empty,
    )
}

/// The span of an outbox worker's claim, or of its answers written back.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))]
pub(crate) fn outbox_span(answer: bool) -> Span {
    if answer {
        operation_span!(DEBUG, "mail_breaker.outbox.answer", "answer")
    } else {
        operation_span!(DEBUG, "mail_breaker.outbox.claim", "claim")
    }
}

/// Records an HTTP answer's status on its span: `error.type` is the status for a 4xx or a
/// 5xx (as OpenTelemetry's HTTP conventions say); the send's own span carries the provider's
/// error code.
#[cfg_attr(
    not(any(
        feature = "postmark",
        feature = "resend",
        feature = "sendgrid",
        feature = "mailgun",
        feature = "graph"
    )),
    allow(dead_code)
)]
pub(crate) fn answered(span: &Span, status: u16) {
    if span.is_disabled() {
        return;
    }
    span.record("http.response.status_code", status);
    if status >= 400 {
        span.record("error.type", status.to_string());
        span.record("otel.status_code", "ERROR");
    }
}
