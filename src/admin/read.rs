//! What the page shows, read from the mailer's own snapshots at each request, and the
//! `/api/` routes that give it as JSON.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::Shared;
use super::chart::{self, Sample};
use crate::State as BreakerState;
use crate::outbox::OutboxId;

/// How many dead letters a page lists, and `/api/dead` gives unless asked for another number.
pub(crate) const DEAD_SHOWN: u32 = 100;

/// The most dead letters one read of `/api/dead` gives.
pub(crate) const DEAD_MOST: u32 = 1_000;

/// How many of a breaker's last changes are shown.
const CHANGES_SHOWN: usize = 5;

/// One member's breaker.
#[derive(Debug, Serialize)]
pub(crate) struct Breaker {
    /// The member's name, as the routes take it.
    pub name: String,
    /// The key of its breaker (the provider's name).
    pub key: String,
    /// `closed`, `open`, `half_open` or `isolated`.
    pub state: &'static str,
    pub failures: u32,
    /// Results counted (see `Snapshot::calls`).
    pub calls: u32,
    /// Of those, the ones that were not failures.
    pub successes: u32,
    pub failure_rate: Option<f64>,
    /// When it last opened, as this process saw it (milliseconds since the Unix epoch).
    pub opened_at_ms: Option<u64>,
    /// While open: how long until a probe may go (milliseconds).
    pub next_probe_ms: Option<u64>,
    pub open_streak: u32,
    pub recent_changes: Vec<Change>,
}

/// One change of a breaker's state.
#[derive(Debug, Serialize)]
pub(crate) struct Change {
    pub key: String,
    pub from: &'static str,
    pub to: &'static str,
    pub at_ms: u64,
    pub reason: String,
}

/// One member's rate limit.
#[derive(Debug, Serialize)]
pub(crate) struct Limiter {
    pub name: String,
    pub configured_per_second: f64,
    pub per_second: f64,
    pub adaptive: bool,
    /// How far below the configured rate it is now, in percent (0 when not backed off).
    pub backed_off_percent: f64,
}

/// The outbox's counts.
#[derive(Debug, Serialize)]
pub(crate) struct Outbox {
    pub queued: u64,
    pub due: u64,
    pub leased: u64,
    pub dead: u64,
    pub oldest_seconds: Option<f64>,
    /// The counts read over the last hour, oldest first.
    pub last_hour: Vec<Point>,
}

/// One reading of the chart.
#[derive(Debug, Serialize)]
pub(crate) struct Point {
    pub at_ms: u64,
    pub queued: u64,
    pub dead: u64,
    /// Messages this process's workers delivered since the reading before (0 for the first).
    pub sent: u64,
}

/// One dead letter.
#[derive(Debug, Serialize)]
pub(crate) struct Dead {
    pub id: i64,
    pub sender: Option<String>,
    pub recipients: Vec<String>,
    /// The message's `Subject`, decoded; `None` when it has none or it could not be read.
    pub subject: Option<String>,
    pub attempts: u32,
    pub category: &'static str,
    pub code: String,
    pub message: String,
    pub transport: Option<String>,
    pub died_at_ms: u64,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The word for a breaker's state: an isolated breaker is open, but held so by hand.
pub(crate) fn state_word(state: BreakerState, isolated: bool) -> &'static str {
    if isolated { "isolated" } else { state.as_str() }
}

/// Every member's breaker, in the configuration's order.
pub(crate) async fn breakers(shared: &Shared) -> Vec<Breaker> {
    let mut read = Vec::new();
    for (name, breaker) in shared.mailer.breakers() {
        let snapshot = breaker.snapshot().await;
        let changes = breaker.recent_changes();
        let opened_at = match snapshot.state() {
            BreakerState::Closed => None,
            BreakerState::Open | BreakerState::HalfOpen => changes
                .iter()
                .find(|change| change.key == snapshot.key() && change.to == BreakerState::Open)
                .map(|change| epoch_ms(change.at)),
        };
        let next_probe = match (snapshot.state(), snapshot.is_isolated()) {
            (BreakerState::Open, false) => snapshot.retry_after().map(millis),
            _ => None,
        };
        read.push(Breaker {
            name: name.to_owned(),
            key: snapshot.key().to_owned(),
            state: state_word(snapshot.state(), snapshot.is_isolated()),
            failures: snapshot.failures(),
            calls: snapshot.calls(),
            successes: snapshot.calls().saturating_sub(snapshot.failures()),
            failure_rate: snapshot.failure_rate(),
            opened_at_ms: opened_at,
            next_probe_ms: next_probe,
            open_streak: snapshot.open_streak(),
            recent_changes: changes
                .into_iter()
                .take(CHANGES_SHOWN)
                .map(|change| Change {
                    key: change.key,
                    from: change.from.as_str(),
                    to: change.to.as_str(),
                    at_ms: epoch_ms(change.at),
                    reason: change.reason,
                })
                .collect(),
        });
    }
    read
}

/// How far a limiter sending `now` a second backed off from its `configured` rate, in
/// percent: 0 when it sends at that rate (or none is configured).
fn backed_off(configured: f64, now: f64) -> f64 {
    if now >= configured {
        return 0.0;
    }
    (1.0 - now / configured) * 100.0
}

/// Every member's rate limit.
pub(crate) fn limiters(shared: &Shared) -> Vec<Limiter> {
    shared
        .mailer
        .limiters()
        .map(|limiter| {
            let (configured, now) = (limiter.configured_per_second(), limiter.per_second());
            Limiter {
                name: limiter.name().to_owned(),
                configured_per_second: configured,
                per_second: now,
                adaptive: limiter.is_adaptive(),
                backed_off_percent: backed_off(configured, now),
            }
        })
        .collect()
}

/// The outbox's counts, `None` without an outbox; read now, and kept for the chart.
pub(crate) async fn outbox(shared: &Shared) -> Option<Result<Outbox, crate::SendError>> {
    let outbox = shared.mailer.outbox()?;
    let stats = match outbox.stats().await {
        Ok(stats) => stats,
        Err(error) => return Some(Err(error)),
    };
    shared.keep(Sample::of(&stats, outbox.sent_here()), shared.chart_every);
    let history = shared.history();
    let sent = chart::sent_per_reading(&history);
    let last_hour = history
        .iter()
        .zip(sent)
        .map(|(sample, sent)| Point {
            at_ms: epoch_ms(sample.wall),
            queued: sample.queued,
            dead: sample.dead,
            sent,
        })
        .collect();
    Some(Ok(Outbox {
        queued: stats.queued,
        due: stats.due,
        leased: stats.leased,
        dead: stats.dead,
        oldest_seconds: stats.oldest.map(|age| age.as_secs_f64()),
        last_hour,
    }))
}

/// Which dead letters a page shows: up to `limit` of those below `before`, newest first
/// (`?before=ID&limit=N`, each optional; an empty value is no value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadPage {
    pub before: Option<OutboxId>,
    pub limit: u32,
}

impl DeadPage {
    /// The newest page.
    pub(crate) const NEWEST: DeadPage = DeadPage {
        before: None,
        limit: DEAD_SHOWN,
    };

    /// The page a request's query asks for; why not, for a value that is no id or count, or
    /// a limit above [`DEAD_MOST`]. Other fields are left alone.
    pub(crate) fn from_query(query: Option<&str>) -> Result<DeadPage, String> {
        let mut page = DeadPage::NEWEST;
        for pair in query.unwrap_or_default().split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match name {
                "before" => {
                    let id: i64 = value
                        .parse()
                        .map_err(|_| format!("before: {value:?} is not a dead letter's id"))?;
                    page.before = Some(OutboxId::from(id));
                }
                "limit" => {
                    page.limit = value
                        .parse()
                        .ok()
                        .filter(|limit| *limit <= DEAD_MOST)
                        .ok_or_else(|| {
                            format!("limit: {value:?} is not a count from 0 to {DEAD_MOST}")
                        })?;
                }
                _ => {}
            }
        }
        Ok(page)
    }
}

/// A page of dead letters, and the cursor of the page after it when there is one.
#[derive(Debug)]
pub(crate) struct DeadLetters {
    pub letters: Vec<Dead>,
    /// The `before` of the next (older) page; `None` when this page holds the oldest.
    pub older: Option<OutboxId>,
}

/// A page of dead letters, newest first, with their subjects.
pub(crate) async fn dead(
    shared: &Shared,
    page: DeadPage,
) -> Option<Result<DeadLetters, crate::SendError>> {
    let outbox = shared.mailer.outbox()?;
    // One more than shown: whether an older page exists, without a count.
    let read = page.limit.saturating_add(1);
    let mut letters = match outbox.dead_letters_page(page.before, read).await {
        Ok(letters) => letters,
        Err(error) => return Some(Err(error)),
    };
    let older = if letters.len() > page.limit as usize {
        letters.truncate(page.limit as usize);
        letters.last().map(|last| last.id)
    } else {
        None
    };
    // A subject that cannot be read is shown as missing, not as a failed page.
    let heads = outbox
        .dead_letter_heads(page.before, page.limit)
        .await
        .unwrap_or_default();
    let subject_of = |id: OutboxId| {
        heads
            .iter()
            .find(|(head, _)| *head == id)
            .and_then(|(_, raw)| subject(raw))
    };
    let letters = letters
        .into_iter()
        .map(|letter| Dead {
            id: i64::from(letter.id),
            sender: letter.envelope.from().map(ToString::to_string),
            recipients: letter
                .envelope
                .to()
                .iter()
                .map(ToString::to_string)
                .collect(),
            subject: subject_of(letter.id),
            attempts: letter.attempts,
            category: letter.error.category().as_str(),
            code: letter.error.code().to_owned(),
            message: letter.error.message().to_owned(),
            transport: letter.error.transport().map(str::to_owned),
            died_at_ms: epoch_ms(letter.at),
        })
        .collect();
    Some(Ok(DeadLetters { letters, older }))
}

/// The decoded `Subject` of a message's head.
pub(crate) fn subject(raw: &[u8]) -> Option<String> {
    let message = mail_parser::MessageParser::new().parse_headers(raw)?;
    message.subject().map(str::to_owned)
}

/// An error the page shows in place of what it could not read.
fn unavailable(error: &crate::SendError) -> Response {
    let body = serde_json::json!({ "error": { "code": error.code(), "message": error.message() } });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

pub(crate) async fn breakers_json(State(shared): State<Arc<Shared>>) -> Response {
    Json(breakers(&shared).await).into_response()
}

pub(crate) async fn limiters_json(State(shared): State<Arc<Shared>>) -> Response {
    Json(limiters(&shared)).into_response()
}

/// The outbox's counts; `null` when the mailer has no outbox.
pub(crate) async fn outbox_json(State(shared): State<Arc<Shared>>) -> Response {
    match outbox(&shared).await {
        None => Json(serde_json::Value::Null).into_response(),
        Some(Ok(outbox)) => Json(outbox).into_response(),
        Some(Err(error)) => unavailable(&error),
    }
}

/// A page of dead letters (`?before=ID&limit=N`), newest first: the last one's id is the
/// `before` of the next page, and an empty page the end; `[]` when the mailer has no outbox,
/// 400 for a query that is no page.
pub(crate) async fn dead_json(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Response {
    let page = match DeadPage::from_query(query.as_deref()) {
        Ok(page) => page,
        Err(why) => return bad_query(&why),
    };
    match dead(&shared, page).await {
        None => Json(Vec::<Dead>::new()).into_response(),
        Some(Ok(dead)) => Json(dead.letters).into_response(),
        Some(Err(error)) => unavailable(&error),
    }
}

/// A query the dead letters' page or API cannot read: 400, and why.
pub(crate) fn bad_query(why: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": "admin.bad_query", "message": why } });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::{DEAD_MOST, DeadPage, backed_off, epoch_ms, millis};
    use crate::outbox::OutboxId;

    #[test]
    fn a_dead_letters_query_gives_its_cursor_and_limit_and_an_empty_value_is_none() {
        let page = |query| DeadPage::from_query(query);
        assert_eq!(page(None), Ok(DeadPage::NEWEST));
        assert_eq!(page(Some("")), Ok(DeadPage::NEWEST));
        assert_eq!(page(Some("before=&limit=")), Ok(DeadPage::NEWEST));
        assert_eq!(
            page(Some("before=42&limit=7&other=x")),
            Ok(DeadPage {
                before: Some(OutboxId::from(42)),
                limit: 7
            })
        );
        assert_eq!(
            page(Some("limit=1000")).map(|page| page.limit),
            Ok(DEAD_MOST)
        );
        assert_eq!(page(Some("limit=0")).map(|page| page.limit), Ok(0));
    }

    #[test]
    fn a_dead_letters_query_with_no_id_or_a_limit_past_the_most_is_refused_saying_which() {
        for query in [
            "before=x",
            "before=1.5",
            "limit=-1",
            "limit=1001",
            "limit=ten",
        ] {
            let why = DeadPage::from_query(Some(query)).expect_err(query);
            let name = query.split('=').next().unwrap_or_default();
            assert!(why.starts_with(name), "{query}: {why}");
        }
    }

    #[test]
    fn a_limiter_backed_off_by_the_share_of_its_rate_it_gave_up() {
        assert_eq!(backed_off(20.0, 20.0), 0.0);
        assert_eq!(backed_off(20.0, 5.0), 75.0);
        assert_eq!(backed_off(20.0, 0.0), 100.0);
    }

    #[test]
    fn a_limiter_without_a_rate_has_not_backed_off() {
        assert_eq!(backed_off(0.0, 0.0), 0.0);
    }

    #[test]
    fn a_time_is_its_milliseconds_since_the_epoch_and_one_before_it_zero() {
        assert_eq!(epoch_ms(UNIX_EPOCH + Duration::from_millis(1_500)), 1_500);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }

    #[test]
    fn a_duration_is_its_milliseconds_capped_at_the_largest_u64() {
        assert_eq!(millis(Duration::from_millis(2_500)), 2_500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
