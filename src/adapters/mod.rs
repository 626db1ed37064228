//! Transports for real providers: SMTP through lettre, lettre's other transports, SES, and
//! the HTTP e-mail APIs (Postmark, Resend, SendGrid, Mailgun, Microsoft Graph).

#[cfg(any(
    feature = "ses",
    feature = "postmark",
    feature = "resend",
    feature = "sendgrid",
    feature = "mailgun",
    feature = "graph"
))]
pub(crate) mod answer;
#[cfg(any(
    feature = "postmark",
    feature = "resend",
    feature = "sendgrid",
    feature = "mailgun",
    feature = "graph"
))]
pub mod http;
#[cfg(any(
    feature = "postmark",
    feature = "resend",
    feature = "sendgrid",
    feature = "mailgun",
    feature = "oauth2"
))]
pub(crate) mod http_policy;
pub mod lettre;
#[cfg(feature = "ses")]
pub mod ses;
#[cfg(feature = "smtp")]
pub mod smtp;
