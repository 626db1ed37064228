//! The page's actions: isolate and reset a member's breaker, requeue and purge a dead
//! letter. Each checks the request first ([`guard`](super::guard)), is logged, and sends the
//! browser back to the page.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Form, OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::Shared;
use super::guard;
use super::page::Notice;
use super::text::Escaped;
use crate::Reach;
use crate::outbox::OutboxId;

/// A POST to a read-only page.
pub(crate) async fn read_only() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "GET")],
        "this page is read-only: it takes no action\n",
    )
        .into_response()
}

/// The form's fields: only `token` is read.
pub(crate) type Fields = HashMap<String, String>;

/// Refuses a request to `uri` that may not act (403, logged), else `None`.
pub(crate) fn refused(
    shared: &Shared,
    uri: &Uri,
    headers: &HeaderMap,
    fields: &Fields,
    action: &str,
) -> Option<Response> {
    let token = fields.get("token").map(String::as_str);
    let site = guard::Site {
        authority: guard::authority(uri, headers),
        public_origin: shared.public_origin.as_deref(),
        // HTTP/2's `:scheme` (or an absolute request line) says it, else the page's setting.
        scheme: uri.scheme_str().or(shared.scheme),
    };
    let refusal = guard::check(headers, &site, token, &shared.token).err()?;
    tracing::warn!(action, why = refusal.as_str(), "admin.refused");
    Some(
        (
            StatusCode::FORBIDDEN,
            format!("forbidden: {}\n", refusal.as_str()),
        )
            .into_response(),
    )
}

/// Back to the page the form was on: the path this router is mounted at.
pub(crate) fn back(original: &Uri, routed: &Uri) -> Response {
    back_saying(original, routed, None)
}

/// Back to the page, which then shows `notice`, if any.
fn back_saying(original: &Uri, routed: &Uri, notice: Option<Notice>) -> Response {
    // A router nested at `/ops/mail` answers its page at `/ops/mail`, not `/ops/mail/`.
    let mount = super::mount_path(original.path(), routed.path());
    let page = if mount.is_empty() { "/" } else { mount };
    match notice {
        Some(notice) => Redirect::to(&format!("{page}?{}", notice.query())).into_response(),
        None => Redirect::to(page).into_response(),
    }
}

pub(crate) fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, format!("{what}\n")).into_response()
}

/// Isolates (`ISOLATE`) or resets a member's breaker.
pub(crate) async fn on_breaker<const ISOLATE: bool>(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    (OriginalUri(original), routed): (OriginalUri, Uri),
    headers: HeaderMap,
    Form(fields): Form<Fields>,
) -> Response {
    let action = if ISOLATE { "isolate" } else { "reset" };
    if let Some(refusal) = refused(&shared, &original, &headers, &fields, action) {
        return refusal;
    }
    let Some(breaker) = shared.mailer.breaker(&name) else {
        return not_found(format!("no member is named {name:?}"));
    };
    let reached = if ISOLATE {
        breaker.try_isolate().await
    } else {
        breaker.try_reset().await
    };
    match reached {
        Ok(reach) => {
            tracing::info!(member = %Escaped(&name), action, reach = %reach, "admin.breaker_changed");
            // A change the rest of the fleet did not see is said on the page, not hidden
            // behind a redirect that looks like every other.
            let notice = match (reach, ISOLATE) {
                (Reach::Fleet, _) => None,
                (Reach::ThisProcess, true) => Some(Notice::IsolatedHere),
                (Reach::ThisProcess, false) => Some(Notice::ResetHere),
            };
            back_saying(&original, &routed, notice)
        }
        Err(error) => {
            tracing::warn!(member = %Escaped(&name), action, error = %error, "admin.failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the breaker store could not be reached: {}\n",
                    error.message()
                ),
            )
                .into_response()
        }
    }
}

/// Requeues (`REQUEUE`) or purges a dead letter.
pub(crate) async fn on_dead_letter<const REQUEUE: bool>(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<i64>,
    (OriginalUri(original), routed): (OriginalUri, Uri),
    headers: HeaderMap,
    Form(fields): Form<Fields>,
) -> Response {
    let action = if REQUEUE { "requeue" } else { "purge" };
    if let Some(refusal) = refused(&shared, &original, &headers, &fields, action) {
        return refusal;
    }
    let Some(outbox) = shared.mailer.outbox() else {
        return not_found("the mailer has no outbox".to_owned());
    };
    let id = OutboxId::from(id);
    if REQUEUE {
        // A dead letter of suppressed recipients is not requeued from the page (it would be
        // refused again); `mail-breaker outbox requeue ID` does it deliberately.
        match outbox.message(id).await {
            Ok(Some(message))
                if message.is_dead()
                    && message
                        .error
                        .as_ref()
                        .is_some_and(|error| crate::outbox::is_suppressed_code(error.code())) =>
            {
                return (
                    StatusCode::CONFLICT,
                    format!(
                        "dead letter {id} is for suppressed recipients: take them off the \
                         suppression list first, then requeue it with `mail-breaker outbox \
                         requeue {id}`\n"
                    ),
                )
                    .into_response();
            }
            Ok(_) => {}
            Err(error) => return failed(action, &error),
        }
    }
    // Each acts on the message only if it is dead when the statement runs: a purge from
    // this page never deletes mail requeued since the page was read.
    let done = if REQUEUE {
        outbox.requeue(id).await
    } else {
        outbox.purge_dead(id).await
    };
    match done {
        Ok(true) => {
            tracing::info!(id = %id, action, "admin.dead_letter");
            back(&original, &routed)
        }
        Ok(false) => not_found(format!("no dead letter has id {id}")),
        Err(error) => failed(action, &error),
    }
}

fn failed(action: &str, error: &crate::SendError) -> Response {
    tracing::warn!(action, error = %error, "admin.failed");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the outbox did not answer: {}\n", error.message()),
    )
        .into_response()
}
