//! The page's reputation cards (feature `webhooks`): each member's reputation breaker (its
//! tier, rates, the sends counted and its thresholds), the SES account's enforcement status
//! beside an SES member's, `GET /api/reputation` with the same, and
//! `POST /reputation/{name}/reset`: only a person closes an open reputation breaker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::extract::{Form, OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::{Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;

use super::Shared;
use super::actions::{self, Fields};
use super::text::Escaped;
use crate::reputation::{Limits, ReputationBreaker, Tier};

/// One member's reputation breaker, as the page and `/api/reputation` show it.
#[derive(Debug, Serialize)]
pub(crate) struct Card {
    pub member: String,
    /// `healthy`, `warn`, `throttle` or `open`.
    pub tier: &'static str,
    /// Sends counted in the window.
    pub sends: u64,
    pub hard_bounces: u64,
    pub complaints: u64,
    pub hard_bounce_rate: f64,
    pub complaint_rate: f64,
    pub thresholds: Thresholds,
    /// Whether the pool may fail its mail over while it is open.
    pub failover: bool,
    /// Why the store could not be read (the tier is then the one last heard).
    pub error: Option<String>,
    /// The SES account's standing, for an SES member.
    pub ses: Option<SesStatus>,
}

/// Both rates' thresholds, in percent.
#[derive(Debug, Serialize)]
pub(crate) struct Thresholds {
    pub hard_bounces: Threshold,
    pub complaints: Threshold,
}

/// One rate's thresholds, in percent, and its minimum volume.
#[derive(Debug, Serialize)]
pub(crate) struct Threshold {
    pub warn_percent: f64,
    pub throttle_percent: f64,
    pub open_percent: f64,
    pub minimum_sends: u64,
}

impl Threshold {
    fn of(limits: &Limits) -> Threshold {
        // Parts per million to percent: 40_000 is 4 %.
        let percent = |ppm: u32| f64::from(ppm) / 10_000.0;
        Threshold {
            warn_percent: percent(limits.warn),
            throttle_percent: percent(limits.throttle),
            open_percent: percent(limits.open),
            minimum_sends: limits.minimum_sends,
        }
    }
}

/// An SES account's enforcement status: `HEALTHY`, `PROBATION`, `SHUTDOWN` (or another word
/// SES says), or `unknown` with the reason it could not be read.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SesStatus {
    pub enforcement: String,
    pub sending_enabled: Option<bool>,
    pub production_access: Option<bool>,
    pub error: Option<String>,
}

/// How long a reading of an SES account is shown before SES is asked again: the page
/// refreshes every 5 s, and `GetAccount` is an authenticated call SES limits per account.
#[cfg_attr(not(feature = "ses"), allow(dead_code))]
const SES_READ_EVERY: Duration = Duration::from_secs(60);

/// How long a failed reading is shown before SES is asked again.
#[cfg_attr(not(feature = "ses"), allow(dead_code))]
const SES_RETRY_AFTER: Duration = Duration::from_secs(15);

/// Each SES member's last reading and when it was taken, kept by the page.
#[derive(Debug, Default)]
pub(crate) struct SesReadings(Mutex<HashMap<String, (Instant, SesStatus)>>);

#[cfg_attr(not(feature = "ses"), allow(dead_code))]
impl SesReadings {
    /// The reading of `member` still fresh at `now`.
    fn fresh(&self, member: &str, now: Instant) -> Option<SesStatus> {
        let readings = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, status) = readings.get(member)?;
        let keep = if status.error.is_some() {
            SES_RETRY_AFTER
        } else {
            SES_READ_EVERY
        };
        (now.saturating_duration_since(*at) < keep).then(|| status.clone())
    }

    fn keep(&self, member: &str, at: Instant, status: &SesStatus) {
        let mut readings = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        readings.insert(member.to_owned(), (at, status.clone()));
    }
}

/// The SES account of the member named `member`, when it is an SES member: the page's last
/// reading while fresh, else read now.
#[cfg(feature = "ses")]
async fn ses_status(shared: &Shared, member: &str) -> Option<SesStatus> {
    let ses = shared.mailer.ses(member)?;
    let now = Instant::now();
    if let Some(status) = shared.ses_readings.fresh(member, now) {
        return Some(status);
    }
    let status = read_ses(ses).await;
    shared.ses_readings.keep(member, now, &status);
    Some(status)
}

#[cfg(feature = "ses")]
async fn read_ses(ses: &crate::SesTransport) -> SesStatus {
    match ses.account().await {
        Ok(account) => SesStatus {
            enforcement: account.enforcement.as_str().to_owned(),
            sending_enabled: Some(account.sending_enabled),
            production_access: Some(account.production_access),
            error: None,
        },
        Err(error) => SesStatus {
            enforcement: "unknown".to_owned(),
            sending_enabled: None,
            production_access: None,
            error: Some(format!("{}: {}", error.code(), error.message())),
        },
    }
}

#[cfg(not(feature = "ses"))]
async fn ses_status(_shared: &Shared, _member: &str) -> Option<SesStatus> {
    None
}

async fn card(shared: &Shared, breaker: &ReputationBreaker) -> Card {
    let (standing, error) = match breaker.standing().await {
        Ok(standing) => (Some(standing), None),
        Err(error) => (None, Some(error.to_string())),
    };
    let window = standing.map(|standing| standing.window).unwrap_or_default();
    let tier = standing.map_or_else(|| breaker.tier(), |standing| standing.tier);
    let rules = breaker.rules();
    Card {
        member: breaker.member().to_owned(),
        tier: tier.as_str(),
        sends: window.sends,
        hard_bounces: window.hard_bounces,
        complaints: window.complaints,
        hard_bounce_rate: window.hard_bounce_rate(),
        complaint_rate: window.complaint_rate(),
        thresholds: Thresholds {
            hard_bounces: Threshold::of(&rules.hard_bounces),
            complaints: Threshold::of(&rules.complaints),
        },
        failover: breaker.fails_over(),
        error,
        ses: ses_status(shared, breaker.member()).await,
    }
}

/// Every member's reputation card, in the configuration's order; the SES accounts are read
/// at once, each within its own short timeout.
pub(crate) async fn cards(shared: &Shared) -> Vec<Card> {
    let reading = shared
        .mailer
        .reputations()
        .map(|breaker| card(shared, breaker));
    futures::future::join_all(reading).await
}

/// `GET /api/reputation`: every member's reputation card (`[]` when none has a breaker).
pub(crate) async fn reputation_json(State(shared): State<Arc<Shared>>) -> Response {
    Json(cards(&shared).await).into_response()
}

/// `POST /reputation/{name}/reset`: closes the member's reputation breaker and clears its
/// counts, for every process sharing its store.
pub(crate) async fn reset(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    (OriginalUri(original), routed): (OriginalUri, Uri),
    headers: HeaderMap,
    Form(fields): Form<Fields>,
) -> Response {
    let action = "reputation_reset";
    if let Some(refusal) = actions::refused(&shared, &original, &headers, &fields, action) {
        return refusal;
    }
    let Some(breaker) = shared.mailer.reputation(&name) else {
        return actions::not_found(format!("no member named {name:?} has a reputation breaker"));
    };
    match breaker.reset().await {
        Ok(()) => {
            tracing::info!(member = %Escaped(&name), action, "admin.reputation_reset");
            actions::back(&original, &routed)
        }
        Err(error) => {
            tracing::warn!(member = %Escaped(&name), action, error = %error, "admin.failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the reputation store could not be reached: {error}\n"),
            )
                .into_response()
        }
    }
}

/// The reputation routes: the JSON, and the reset unless the page is read-only.
pub(crate) fn routes(routes: Router<Arc<Shared>>, read_only: bool) -> Router<Arc<Shared>> {
    let routes = routes.route("/api/reputation", get(reputation_json));
    let path = "/reputation/{name}/reset";
    if read_only {
        routes.route(path, post(actions::read_only))
    } else {
        routes.route(path, post(reset))
    }
}

/// A rate as a percentage with two decimals: `4.10 %`.
fn percent(rate: f64) -> String {
    format!("{:.2} %", rate * 100.0)
}

/// A threshold in percent, as short as it reads: `4 %`, `0.08 %`.
fn threshold(percent: f64) -> String {
    format!("{percent} %")
}

/// The cards' section of the page (nothing when no member has a reputation breaker).
pub(crate) fn section(shared: &Shared, mount: &str, cards: &[Card]) -> Markup {
    html! {
        @if !cards.is_empty() {
            h2 { "Reputation" }
            div class="cards" id="reputation" {
                @for card in cards { (one(shared, mount, card)) }
            }
        }
    }
}

fn one(shared: &Shared, mount: &str, card: &Card) -> Markup {
    let state = match card.tier {
        "healthy" => "closed",
        "warn" | "throttle" => "half_open",
        _ => "open",
    };
    let path = utf8_percent_encode(&card.member, NON_ALPHANUMERIC).to_string();
    let hard = &card.thresholds.hard_bounces;
    let complaints = &card.thresholds.complaints;
    html! {
        section class=(format!("card {state}")) data-reputation=(card.member) {
            div {
                span class="name" { (card.member) } " "
                span class=(format!("state {state}")) data-tier=(card.tier) { (card.tier) }
            }
            dl {
                dt { "hard bounces" }
                dd class="hard-bounce-rate" { (percent(card.hard_bounce_rate)) " (" (card.hard_bounces) ")" }
                dt { "complaints" }
                dd class="complaint-rate" { (percent(card.complaint_rate)) " (" (card.complaints) ")" }
                dt { "sends counted" } dd class="sends" { (card.sends) }
                dt { "opens at" }
                dd { (threshold(hard.open_percent)) " bounces, " (threshold(complaints.open_percent)) " complaints" }
                dt { "acts past" }
                dd { (hard.minimum_sends) " / " (complaints.minimum_sends) " sends" }
                @if let Some(ses) = &card.ses {
                    dt { "SES account" }
                    dd class="ses" data-enforcement=(ses.enforcement) {
                        (ses.enforcement)
                        @if ses.sending_enabled == Some(false) { ", sending disabled" }
                        @if let Some(error) = &ses.error { span class="problem" { ": " (error) } }
                    }
                }
            }
            @if let Some(error) = &card.error {
                p class="problem" { "The reputation store did not answer: " (error) }
            }
            @if !shared.read_only && card.tier != Tier::Healthy.as_str() {
                div class="actions" {
                    form method="post" action=(format!("{mount}/reputation/{path}/reset")) {
                        input type="hidden" name="token" value=(shared.token);
                        button type="submit" { "Reset reputation" }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{percent, threshold};

    #[test]
    fn a_rate_is_shown_in_percent_with_two_decimals() {
        assert_eq!(percent(0.041), "4.10 %");
        assert_eq!(percent(0.0), "0.00 %");
    }

    #[test]
    fn a_threshold_is_shown_in_percent_as_short_as_it_reads() {
        assert_eq!(threshold(4.0), "4 %");
        assert_eq!(threshold(0.08), "0.08 %");
    }
}
