//! The page's suppression list (feature `webhooks`): the addresses held back, searched by a
//! part of the address (`?suppressed=TEXT` on the page, `GET /api/suppressions?q=TEXT&limit=N`),
//! a bounded number at a time, and `POST /suppressions/{address}/remove`.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Form, OriginalUri, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::{Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;

use super::Shared;
use super::actions::{self, Fields};
use super::read::{self, epoch_ms};
use super::text::Escaped;
use crate::suppression::{Suppression, SuppressionError};

/// How many addresses the page lists, and the API gives unless asked for another number.
pub(crate) const SUPPRESSIONS_SHOWN: u32 = 100;

/// The most addresses one read of `/api/suppressions` gives.
pub(crate) const SUPPRESSIONS_MOST: u32 = 1_000;

/// The longest search text taken: an address is at most 320 bytes.
const LONGEST_SEARCH: usize = 320;

/// One suppressed address.
#[derive(Debug, Serialize)]
pub(crate) struct Entry {
    pub address: String,
    /// `bounced`, `complained` or `manual`.
    pub reason: &'static str,
    pub provider: Option<String>,
    pub event_id: Option<String>,
    pub at_ms: u64,
    /// When a hold for transient bounces ends; `None` for good.
    pub until_ms: Option<u64>,
}

impl Entry {
    fn of(entry: Suppression) -> Entry {
        Entry {
            address: entry.address,
            reason: entry.reason.as_str(),
            provider: entry.provider,
            event_id: entry.event_id,
            at_ms: epoch_ms(entry.at),
            until_ms: entry.until.map(epoch_ms),
        }
    }
}

/// What a search asks for: the text the address holds and how many at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Search {
    pub text: String,
    pub limit: u32,
}

impl Search {
    /// The search a query names with `field` (`q` for the API, `suppressed` on the page)
    /// and `limit`; why not for a limit that is no count up to [`SUPPRESSIONS_MOST`] or a text
    /// longer than an address. Other fields are left alone.
    pub(crate) fn from_query(query: Option<&str>, field: &str) -> Result<Search, String> {
        let mut search = Search {
            text: String::new(),
            limit: SUPPRESSIONS_SHOWN,
        };
        for pair in query.unwrap_or_default().split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            // A form sends a space as `+`.
            let value = value.replace('+', " ");
            let value = percent_encoding::percent_decode_str(&value).decode_utf8_lossy();
            let value = value.trim();
            if name == field {
                if value.len() > LONGEST_SEARCH {
                    return Err(format!(
                        "{field}: longer than an address can be ({LONGEST_SEARCH} bytes)"
                    ));
                }
                value.clone_into(&mut search.text);
            } else if name == "limit" && !value.is_empty() {
                search.limit = value
                    .parse()
                    .ok()
                    .filter(|limit| *limit <= SUPPRESSIONS_MOST)
                    .ok_or_else(|| {
                        format!("limit: {value:?} is not a count from 0 to {SUPPRESSIONS_MOST}")
                    })?;
            }
        }
        Ok(search)
    }
}

/// The addresses a search finds, `None` when the mailer has no suppression list.
pub(crate) async fn find(
    shared: &Shared,
    search: &Search,
) -> Option<Result<Vec<Entry>, SuppressionError>> {
    let list = shared.mailer.suppression()?;
    Some(
        list.search(&search.text, search.limit)
            .await
            .map(|found| found.into_iter().map(Entry::of).collect()),
    )
}

/// `GET /api/suppressions?q=TEXT&limit=N`: the addresses holding `TEXT` (every address
/// without it), by address, at most `N` (100 by default, up to 1000); `null` without a
/// suppression list, 400 for a query that is no search.
pub(crate) async fn suppressions_json(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Response {
    let search = match Search::from_query(query.as_deref(), "q") {
        Ok(search) => search,
        Err(why) => return read::bad_query(&why),
    };
    match find(&shared, &search).await {
        None => Json(serde_json::Value::Null).into_response(),
        Some(Ok(found)) => Json(found).into_response(),
        Some(Err(error)) => unreadable(&error),
    }
}

fn unreadable(error: &SuppressionError) -> Response {
    let body = serde_json::json!({
        "error": { "code": "suppression.store", "message": error.to_string() }
    });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// `POST /suppressions/{address}/remove`: takes the address off the list.
pub(crate) async fn remove(
    State(shared): State<Arc<Shared>>,
    Path(address): Path<String>,
    (OriginalUri(original), routed): (OriginalUri, Uri),
    headers: HeaderMap,
    Form(fields): Form<Fields>,
) -> Response {
    let action = "suppression_remove";
    if let Some(refusal) = actions::refused(&shared, &original, &headers, &fields, action) {
        return refusal;
    }
    let Some(list) = shared.mailer.suppression() else {
        return actions::not_found("the mailer has no suppression list".to_owned());
    };
    match list.remove(&address).await {
        Ok(true) => {
            // The address is the operator's business, not the log's: its domain alone.
            let domain = address.rsplit_once('@').map_or("", |(_, domain)| domain);
            tracing::info!(domain = %Escaped(domain), action, "admin.suppression_removed");
            actions::back(&original, &routed)
        }
        Ok(false) => actions::not_found("that address is not on the suppression list".to_owned()),
        Err(SuppressionError::InvalidAddress { why, .. }) => (
            StatusCode::BAD_REQUEST,
            format!("that is no address: {why}\n"),
        )
            .into_response(),
        Err(error) => {
            tracing::warn!(action, error = %error, "admin.failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the suppression list did not answer: {error}\n"),
            )
                .into_response()
        }
    }
}

/// The suppression routes: the JSON, and the removal unless the page is read-only.
pub(crate) fn routes(routes: Router<Arc<Shared>>, read_only: bool) -> Router<Arc<Shared>> {
    let routes = routes.route("/api/suppressions", get(suppressions_json));
    let path = "/suppressions/{address}/remove";
    if read_only {
        routes.route(path, post(actions::read_only))
    } else {
        routes.route(path, post(remove))
    }
}

/// The list's section of the page: a search box and the addresses found (nothing without a
/// suppression list).
pub(crate) fn section(
    shared: &Shared,
    mount: &str,
    search: &Search,
    found: Option<Result<Vec<Entry>, SuppressionError>>,
) -> Markup {
    let page = if mount.is_empty() { "/" } else { mount };
    html! {
        @if let Some(found) = found {
            h2 { "Suppression list" }
            form method="get" action=(page) class="search" {
                input type="search" name="suppressed" value=(search.text) placeholder="part of an address" aria-label="search the suppression list";
                button type="submit" { "Search" }
            }
            @match found {
                Err(error) => p class="problem" { "The suppression list did not answer: " (error) },
                Ok(found) if found.is_empty() => p class="muted" id="suppressions" { "None." },
                Ok(found) => {
                    div class="table" {
                        table id="suppressions" {
                            thead { tr {
                                th { "address" } th { "reason" } th { "provider" } th { "until" }
                                @if !shared.read_only { th {} }
                            } }
                            tbody {
                                @for entry in &found { (row(shared, mount, entry)) }
                            }
                        }
                    }
                    @if found.len() >= search.limit as usize {
                        p class="muted" { "The first " (search.limit) " shown: search for a part of the address to find others." }
                    }
                }
            }
        }
    }
}

fn row(shared: &Shared, mount: &str, entry: &Entry) -> Markup {
    let path = utf8_percent_encode(&entry.address, NON_ALPHANUMERIC).to_string();
    html! {
        tr {
            td { (entry.address) }
            td { (entry.reason) }
            td { (entry.provider.as_deref().unwrap_or("by hand")) }
            td { @if entry.until_ms.is_some() { "a hold" } @else { "for good" } }
            @if !shared.read_only {
                td {
                    form method="post" action=(format!("{mount}/suppressions/{path}/remove")) {
                        input type="hidden" name="token" value=(shared.token);
                        button type="submit" class="danger" { "Remove" }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SUPPRESSIONS_MOST, SUPPRESSIONS_SHOWN, Search};

    #[test]
    fn a_search_query_gives_its_text_decoded_and_its_limit() {
        let search = Search::from_query(Some("q=shop%2Eexample+x&limit=7&other=1"), "q");
        assert_eq!(
            search,
            Ok(Search {
                text: "shop.example x".into(),
                limit: 7
            })
        );
        let none = Search::from_query(None, "q");
        assert_eq!(none.map(|search| search.limit), Ok(SUPPRESSIONS_SHOWN));
    }

    #[test]
    fn a_search_query_with_a_limit_past_the_most_or_a_text_past_an_address_is_refused() {
        let most = format!("limit={SUPPRESSIONS_MOST}");
        assert!(Search::from_query(Some(&most), "q").is_ok());
        for query in ["limit=1001", "limit=x", "limit=-1"] {
            let why = Search::from_query(Some(query), "q").expect_err(query);
            assert!(why.starts_with("limit"), "{why}");
        }
        let long = format!("q={}", "a".repeat(321));
        assert!(Search::from_query(Some(&long), "q").is_err());
        let longest = format!("q={}", "a".repeat(320));
        assert!(Search::from_query(Some(&longest), "q").is_ok());
    }
}
