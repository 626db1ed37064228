//! What a route answers: a refusal (`400`, nothing kept), or the sink's verdict on the
//! events (`200` once kept, `503` when keeping failed, so that the provider resends).

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::events::{DeliveryEvent, EventSink};

/// Why a request was refused before any event was read from it. The text is the answer's
/// body: it helps whoever configures the provider, and names no secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// A header or field the provider always sends is missing or unreadable.
    #[error("missing or unreadable {0}")]
    Missing(&'static str),
    /// The body is not the provider's envelope.
    #[error("the body is not {0}")]
    Malformed(&'static str),
    /// No signature matches.
    #[error("the signature does not match")]
    BadSignature,
    /// The signed time is outside the window.
    #[error("the signed time is outside the accepted window")]
    Stale,
    /// SNS: the signing certificate's URL is not an SNS certificate's.
    #[error("the signing certificate URL is not an SNS certificate URL")]
    CertificateUrl,
    /// SNS: the certificate could not be fetched or read.
    #[error("the signing certificate could not be fetched or read")]
    Certificate,
    /// AWS could not be reached for the signing certificate (a network error, a timeout, a
    /// `5xx`): the message may be genuine, so it is answered `503` and SNS sends it again
    /// (SNS takes any answer below `500` as delivered).
    #[error("the signing certificate could not be fetched for now; send it again")]
    CertificateUnavailable,
    /// SNS: the topic is not in the allow-list.
    #[error("the topic is not allowed")]
    Topic,
    /// SNS: the message type or signature version is not one this receiver reads.
    #[error("unsupported {0}")]
    Unsupported(&'static str),
    /// SNS: the confirmation URL is not an SNS confirmation URL.
    #[error("the SubscribeURL is not an SNS confirmation URL")]
    SubscribeUrl,
    /// Mailgun: the token was seen before with another body.
    #[error("the token was already used with another body")]
    TokenReused,
    /// Postmark: the basic credentials are missing or wrong.
    #[error("missing or wrong credentials")]
    Credentials,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        tracing::warn!(reason = %self, "webhook request refused");
        if self == Refused::Credentials {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"webhooks\"")],
                self.to_string(),
            )
                .into_response();
        }
        if self == Refused::CertificateUnavailable {
            return (StatusCode::SERVICE_UNAVAILABLE, self.to_string()).into_response();
        }
        (StatusCode::BAD_REQUEST, self.to_string()).into_response()
    }
}

/// Sets each event's member, hands them to the sink, and answers as the provider needs:
/// `200` once kept, `503` when the sink failed (the provider sends them again).
pub(crate) async fn keep(
    sink: &Arc<dyn EventSink>,
    member: &Option<String>,
    mut events: Vec<DeliveryEvent>,
) -> Response {
    if events.is_empty() {
        return (StatusCode::OK, "no events").into_response();
    }
    for event in &mut events {
        event.member.clone_from(member);
    }
    match sink.keep(&events).await {
        Ok(kept) => (
            StatusCode::OK,
            format!("kept {} new of {} events", kept.new, events.len()),
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "webhook events could not be kept; the provider will resend");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the events could not be kept",
            )
                .into_response()
        }
    }
}
