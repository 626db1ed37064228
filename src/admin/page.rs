//! The page itself: server-rendered HTML with its style inline, no script and nothing from
//! another host. maud escapes every value written into it, so a subject or a provider's
//! answer holding `<script>` shows as text.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{OriginalUri, RawQuery, State};
use axum::http::{Uri, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::Shared;
use super::chart;
use super::read::{self, Breaker, DeadLetters, DeadPage, Limiter, Outbox};

/// How often the page reloads itself, in seconds.
pub(crate) const REFRESH_SECONDS: u32 = 5;

const STYLE: &str = r#"
:root { color-scheme: light dark; --bg: #f7f7f8; --card: #fff; --fg: #1d1f23; --muted: #5d6470;
  --line: #d9dce1; --closed: #1a7f37; --open: #c62828; --half: #a15c00; --isolated: #6f42c1; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #111317; --card: #1b1e24; --fg: #e6e8eb; --muted: #9aa3ae; --line: #30353d;
    --closed: #4ac26b; --open: #ff6b6b; --half: #f0a63a; --isolated: #b392f0; } }
* { box-sizing: border-box; }
body { margin: 0; padding: 1rem; background: var(--bg); color: var(--fg);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
header { display: flex; flex-wrap: wrap; align-items: baseline; gap: .5rem 1rem; }
h1 { font-size: 1.3rem; margin: 0 0 .5rem; }
h2 { font-size: 1.05rem; margin: 1.4rem 0 .5rem; }
.muted, .when { color: var(--muted); font-size: .85rem; }
.cards { display: grid; gap: .75rem; grid-template-columns: repeat(auto-fill, minmax(min(100%, 21rem), 1fr)); }
.card { background: var(--card); border: 1px solid var(--line); border-left: 6px solid var(--muted);
  border-radius: 8px; padding: .75rem .9rem; overflow-wrap: anywhere; }
.card.closed { border-left-color: var(--closed); } .card.open { border-left-color: var(--open); }
.card.half_open { border-left-color: var(--half); } .card.isolated { border-left-color: var(--isolated); }
.name { font-weight: 600; }
.state { display: inline-block; font-weight: 700; text-transform: uppercase; letter-spacing: .04em;
  font-size: .8rem; padding: .1rem .5rem; border-radius: 99px; color: #fff; background: var(--muted); }
.state.closed { background: var(--closed); } .state.open { background: var(--open); }
.state.half_open { background: var(--half); } .state.isolated { background: var(--isolated); }
@media (prefers-color-scheme: dark) { .state { color: #111317; } }
dl { display: grid; grid-template-columns: auto 1fr; gap: .1rem .8rem; margin: .5rem 0; }
dt { color: var(--muted); } dd { margin: 0; }
ul.changes { margin: .3rem 0; padding-left: 1.1rem; font-size: .88rem; }
form { display: inline; }
button { font: inherit; font-size: .85rem; padding: .35rem .8rem; margin: .3rem .3rem 0 0;
  border-radius: 6px; border: 1px solid var(--line); background: var(--bg); color: var(--fg); cursor: pointer; min-height: 2.2rem; }
button.danger { border-color: var(--open); color: var(--open); }
.table { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; background: var(--card); font-size: .9rem; }
th, td { text-align: left; padding: .4rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
td.error { overflow-wrap: anywhere; min-width: 12rem; }
.counts { display: flex; flex-wrap: wrap; gap: .5rem; margin: 0; }
.count { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .4rem .8rem; min-width: 5.5rem; }
.count b { display: block; font-size: 1.3rem; }
svg.chart { display: block; width: 100%; max-width: 40rem; height: auto; background: var(--card); border: 1px solid var(--line); border-radius: 8px; }
svg.chart .axis { stroke: var(--line); } svg.chart polyline { fill: none; stroke-width: 2; vector-effect: non-scaling-stroke; }
svg.chart .queued { stroke: var(--half); } svg.chart circle.queued { fill: var(--half); } svg.chart .dead { stroke: var(--open); stroke-dasharray: 4 3; } svg.chart .sent { stroke: var(--closed); stroke-dasharray: 1 3; }
.chart-scale { margin: .2rem 0; color: var(--muted); font-size: .8rem; }
.key-queued { color: var(--half); } .key-dead { color: var(--open); } .key-sent { color: var(--closed); }
.problem { color: var(--open); }
.notice { background: var(--card); border: 1px solid var(--half); border-left: 6px solid var(--half);
  border-radius: 8px; padding: .5rem .9rem; margin: .5rem 0; }
nav.pages { display: flex; gap: 1rem; margin: .5rem 0; }
form.search { display: flex; gap: .4rem; margin: 0 0 .5rem; }
input[type=search] { font: inherit; padding: .35rem .5rem; border-radius: 6px; border: 1px solid var(--line);
  background: var(--card); color: var(--fg); min-width: 0; flex: 0 1 20rem; }
nav.pages a { color: var(--fg); }
@media (max-width: 600px) {
  table#dead thead { display: none; }
  table#dead tr { display: block; border-bottom: 1px solid var(--line); padding: .3rem 0; }
  table#dead td { display: grid; grid-template-columns: 6rem 1fr; border: 0; padding: .2rem .5rem; }
  table#dead td::before { content: attr(data-label); color: var(--muted); }
  table#dead td.error { min-width: 0; }
}
"#;

/// `GET /`: the page; `?before=ID` lists the dead letters older than `ID` (the cursor the
/// page's "older" link carries), and 400 for a query that is no page.
pub(crate) async fn show(
    State(shared): State<Arc<Shared>>,
    OriginalUri(original): OriginalUri,
    routed: Uri,
    RawQuery(query): RawQuery,
) -> Response {
    let dead_page = match DeadPage::from_query(query.as_deref()) {
        Ok(page) => page,
        Err(why) => return read::bad_query(&why),
    };
    let mount = super::mount_path(original.path(), routed.path()).to_owned();
    let breakers = read::breakers(&shared).await;
    let limiters = read::limiters(&shared);
    let outbox = read::outbox(&shared).await;
    let dead = read::dead(&shared, dead_page).await;
    let reputation = reputation_sections(&shared, &mount, query.as_deref()).await;
    let page = Page {
        shared: &shared,
        mount: &mount,
        now: SystemTime::now(),
        notice: query.as_deref().and_then(Notice::from_query),
        dead_page,
    };
    let markup = page.render(&breakers, &limiters, outbox, dead, reputation);
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'",
            ),
            // Not `no-referrer`: under it a browser sends a form's POST with `Origin: null`.
            (header::REFERRER_POLICY, "same-origin"),
        ],
        markup.into_string(),
    )
        .into_response()
}

/// The reputation cards and the suppression list (feature `webhooks`), rendered apart: the
/// cards go after the breakers, the list after the dead letters.
#[cfg(feature = "webhooks")]
async fn reputation_sections(
    shared: &Shared,
    mount: &str,
    query: Option<&str>,
) -> (Markup, Markup) {
    use super::{reputation, suppressions};
    let cards = reputation::cards(shared).await;
    // A search the page cannot read lists the first addresses, as an empty one does.
    let search =
        suppressions::Search::from_query(query, "suppressed").unwrap_or(suppressions::Search {
            text: String::new(),
            limit: suppressions::SUPPRESSIONS_SHOWN,
        });
    let found = suppressions::find(shared, &search).await;
    (
        reputation::section(shared, mount, &cards),
        suppressions::section(shared, mount, &search, found),
    )
}

#[cfg(not(feature = "webhooks"))]
async fn reputation_sections(_: &Shared, _: &str, _: Option<&str>) -> (Markup, Markup) {
    (html! {}, html! {})
}

/// What an action tells the page it sends the browser back to (`?notice=...`): a fixed
/// word, never text from the request, shown as one of the page's own sentences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// An isolation that reached this process alone (a store in its memory).
    IsolatedHere,
    /// A reset that reached this process alone.
    ResetHere,
}

impl Notice {
    /// The query that carries this notice.
    pub(crate) fn query(self) -> &'static str {
        match self {
            Notice::IsolatedHere => "notice=isolated-here",
            Notice::ResetHere => "notice=reset-here",
        }
    }

    /// The notice a page's query names, if it names one.
    fn from_query(query: &str) -> Option<Notice> {
        query.split('&').find_map(|pair| match pair {
            "notice=isolated-here" => Some(Notice::IsolatedHere),
            "notice=reset-here" => Some(Notice::ResetHere),
            _ => None,
        })
    }

    fn sentence(self) -> &'static str {
        match self {
            Notice::IsolatedHere => {
                "Isolated in this process only: its breakers live in its own memory, so no \
                 other process of the application saw the change. Share them through Redis \
                 to act on the fleet."
            }
            Notice::ResetHere => {
                "Reset in this process only: its breakers live in its own memory, so no other \
                 process of the application saw the change. Share them through Redis to act \
                 on the fleet."
            }
        }
    }
}

/// One rendering of the page.
struct Page<'a> {
    shared: &'a Shared,
    /// The path the router is mounted at (`""` at the root), before each action's path.
    mount: &'a str,
    now: SystemTime,
    /// What the action that sent the browser here wants said.
    notice: Option<Notice>,
    /// Which dead letters are listed.
    dead_page: DeadPage,
}

impl Page<'_> {
    fn render(
        &self,
        breakers: &[Breaker],
        limiters: &[Limiter],
        outbox: Option<Result<Outbox, crate::SendError>>,
        dead: Option<Result<DeadLetters, crate::SendError>>,
        (reputation, suppressions): (Markup, Markup),
    ) -> Markup {
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    meta http-equiv="refresh" content=(REFRESH_SECONDS);
                    title { "Mail: " (self.shared.mailer.breakers().count()) " providers" }
                    style { (maud::PreEscaped(STYLE)) }
                }
                body {
                    header {
                        h1 { "Mail providers" }
                        span class="muted" {
                            "read at " (clock(self.now)) " UTC, again every " (REFRESH_SECONDS) " s"
                            @if self.shared.read_only { " · read-only" }
                        }
                    }
                    @if let Some(notice) = self.notice {
                        p class="notice" role="status" { (notice.sentence()) }
                    }
                    h2 { "Breakers" }
                    div class="cards" id="breakers" {
                        @for breaker in breakers { (self.breaker(breaker)) }
                    }
                    (reputation)
                    @if !limiters.is_empty() {
                        h2 { "Rate limits" }
                        (self.limiters(limiters))
                    }
                    h2 { "Outbox" }
                    (self.outbox(outbox))
                    @if let Some(dead) = dead {
                        h2 { "Dead letters" }
                        (self.dead(dead))
                    }
                    (suppressions)
                }
            }
        }
    }

    fn breaker(&self, breaker: &Breaker) -> Markup {
        let word = breaker.state.replace('_', "-");
        let path = utf8_percent_encode(&breaker.name, NON_ALPHANUMERIC).to_string();
        html! {
            section class=(format!("card {}", breaker.state)) data-member=(breaker.name) {
                div {
                    span class="name" { (breaker.name) } " "
                    span class=(format!("state {}", breaker.state)) data-state=(breaker.state) { (word) }
                }
                @if breaker.key != breaker.name { div class="muted" { (breaker.key) } }
                dl {
                    dt { "failures" } dd class="failures" { (breaker.failures) }
                    dt { "successes" } dd { (breaker.successes) }
                    @if let Some(rate) = breaker.failure_rate {
                        dt { "failure rate" } dd { (format!("{:.0} %", rate * 100.0)) }
                    }
                    @if let Some(at) = breaker.opened_at_ms {
                        dt { "opened" } dd { (self.ago(at)) }
                    }
                    @if let Some(after) = breaker.next_probe_ms {
                        dt { "next probe" } dd { "in " (span(Duration::from_millis(after))) }
                    }
                    @if breaker.state == "isolated" {
                        dt { "next probe" } dd { "none until reset" }
                    }
                }
                @if !breaker.recent_changes.is_empty() {
                    ul class="changes" {
                        @for change in &breaker.recent_changes {
                            li {
                                span class="when" { (self.ago(change.at_ms)) } " "
                                (change.from.replace('_', "-")) " → " (change.to.replace('_', "-"))
                                @if !change.reason.is_empty() { ": " (change.reason) }
                            }
                        }
                    }
                }
                @if !self.shared.read_only {
                    div class="actions" {
                        @if breaker.state != "isolated" {
                            (self.form(&format!("breakers/{path}/isolate"), "Isolate", true))
                        }
                        @if breaker.state != "closed" || breaker.failures > 0 {
                            (self.form(&format!("breakers/{path}/reset"), "Reset", false))
                        }
                    }
                }
            }
        }
    }

    fn limiters(&self, limiters: &[Limiter]) -> Markup {
        html! {
            div class="table" {
                table id="limiters" {
                    thead { tr { th { "member" } th { "configured" } th { "now" } th { "backed off" } } }
                    tbody {
                        @for limiter in limiters {
                            tr {
                                td { (limiter.name) }
                                td { (rate(limiter.configured_per_second)) }
                                td { (rate(limiter.per_second)) }
                                td {
                                    @if limiter.adaptive { (format!("{:.0} %", limiter.backed_off_percent)) }
                                    @else { span class="muted" { "not adaptive" } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn outbox(&self, outbox: Option<Result<Outbox, crate::SendError>>) -> Markup {
        html! {
            @match outbox {
                None => p class="muted" { "This mailer has no outbox." },
                Some(Err(error)) => p class="problem" { "The outbox did not answer: " (error.message()) },
                Some(Ok(outbox)) => {
                    div class="counts" id="outbox" {
                        div class="count" { b class="queued" { (outbox.queued) } "queued" }
                        div class="count" { b { (outbox.due) } "due" }
                        div class="count" { b { (outbox.leased) } "sending" }
                        div class="count" { b class="dead" { (outbox.dead) } "dead" }
                        div class="count" {
                            b { @match outbox.oldest_seconds {
                                Some(age) => (span(Duration::try_from_secs_f64(age).unwrap_or_default())),
                                None => "—",
                            } }
                            "oldest"
                        }
                    }
                    (chart::svg(&self.shared.history(), self.shared.chart_every))
                }
            }
        }
    }

    fn dead(&self, dead: Result<DeadLetters, crate::SendError>) -> Markup {
        html! {
            @match dead {
                Err(error) => p class="problem" { "The outbox did not answer: " (error.message()) },
                Ok(dead) => {
                    @if dead.letters.is_empty() {
                        p class="muted" { @if self.dead_page.before.is_some() { "None older." } @else { "None." } }
                    } @else {
                        (self.dead_table(&dead))
                    }
                    (self.dead_pages(dead.older))
                }
            }
        }
    }

    /// Links to the newest dead letters (from an older page) and to the next older page.
    fn dead_pages(&self, older: Option<crate::outbox::OutboxId>) -> Markup {
        html! {
            @if self.dead_page.before.is_some() || older.is_some() {
                nav class="pages" id="dead-pages" {
                    @if self.dead_page.before.is_some() {
                        a class="newest" href=(self.page_path()) { "← newest" }
                    }
                    @if let Some(older) = older {
                        a class="older" href=(format!("{}?before={older}", self.page_path())) { "older →" }
                    }
                }
            }
        }
    }

    fn dead_table(&self, dead: &DeadLetters) -> Markup {
        html! {
            div class="table" {
                table id="dead" {
                    thead { tr {
                        th { "to" } th { "subject" } th { "attempts" } th { "last error" } th { "died" }
                        @if !self.shared.read_only { th {} }
                    } }
                    tbody {
                        @for letter in &dead.letters {
                            tr data-id=(letter.id) {
                                td data-label="to" { div { @for (i, to) in letter.recipients.iter().enumerate() {
                                    @if i > 0 { br; } (to)
                                } } }
                                td data-label="subject" { div class="subject" { @match &letter.subject {
                                    Some(subject) => (subject),
                                    None => span class="muted" { "(none)" },
                                } } }
                                td data-label="attempts" { (letter.attempts) }
                                td class="error" data-label="last error" { div { code { (letter.code) } " " (letter.message) } }
                                td class="when" data-label="died" { (self.ago(letter.died_at_ms)) }
                                @if !self.shared.read_only {
                                    td data-label="" { div {
                                        // A suppressed recipient's letter would be refused again: no
                                        // requeue here (the command's `requeue ID` is the deliberate way).
                                        @if !crate::outbox::is_suppressed_code(&letter.code) {
                                            (self.form(&format!("outbox/dead/{}/requeue", letter.id), "Requeue", false))
                                        }
                                        (self.form(&format!("outbox/dead/{}/purge", letter.id), "Purge", true))
                                    } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The page's own path: the mount path itself (a router nested at `/ops/mail` answers
    /// `/ops/mail`, and not `/ops/mail/`), or `/` at the root.
    fn page_path(&self) -> &str {
        if self.mount.is_empty() {
            "/"
        } else {
            self.mount
        }
    }

    /// A form that POSTs the page's token to `action` (under the mount path).
    fn form(&self, action: &str, label: &str, danger: bool) -> Markup {
        html! {
            form method="post" action=(format!("{}/{action}", self.mount)) {
                input type="hidden" name="token" value=(self.shared.token);
                button type="submit" class=[danger.then_some("danger")] { (label) }
            }
        }
    }

    /// How long before the page was read `at_ms` was.
    fn ago(&self, at_ms: u64) -> String {
        let now = read::epoch_ms(self.now);
        format!(
            "{} ago",
            span(Duration::from_millis(now.saturating_sub(at_ms)))
        )
    }
}

/// A duration as people read it: `45 s`, `3 min 5 s`, `2 h 10 min`.
pub(crate) fn span(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ => format!("{} h {} min", seconds / 3600, seconds / 60 % 60),
    }
}

/// A rate in sends per second.
fn rate(per_second: f64) -> String {
    if per_second >= 10.0 {
        format!("{per_second:.0}/s")
    } else {
        format!("{per_second:.2}/s")
    }
}

/// The time of day of `at`, UTC, as `HH:MM:SS`.
fn clock(at: SystemTime) -> String {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}

#[cfg(test)]
mod tests {
    use super::{clock, rate, span};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn the_time_of_day_is_written_in_utc_to_the_second() {
        assert_eq!(
            clock(UNIX_EPOCH + Duration::from_secs(1_796_457_662)),
            "08:01:02"
        );
        assert_eq!(clock(UNIX_EPOCH), "00:00:00");
    }

    #[test]
    fn a_rate_of_ten_or_more_a_second_is_whole_and_a_slower_one_has_two_decimals() {
        assert_eq!(rate(14.0), "14/s");
        assert_eq!(rate(10.0), "10/s");
        assert_eq!(rate(2.5), "2.50/s");
        assert_eq!(rate(0.25), "0.25/s");
    }

    #[test]
    fn a_span_reads_in_the_largest_units_that_fit() {
        assert_eq!(span(Duration::from_millis(999)), "0 s");
        assert_eq!(span(Duration::from_secs(59)), "59 s");
        assert_eq!(span(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(span(Duration::from_secs(7800)), "2 h 10 min");
    }
}
