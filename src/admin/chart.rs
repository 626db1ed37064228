//! The outbox over the last hour: its counts read every [`EVERY`] by this process, and the
//! small SVG chart drawn from them on the server.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use maud::{Markup, PreEscaped, html};

use super::WeakShared;
use crate::outbox::OutboxStats;

/// How often the outbox's counts are kept.
pub(crate) const EVERY: Duration = Duration::from_secs(15);

/// How far back the chart goes.
const SPAN: Duration = Duration::from_secs(60 * 60);

/// The most readings kept: an hour of readings at the default period.
const KEPT: usize = 720;

/// One reading of the outbox's counts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// When, on this process's clock (what the window is measured on).
    pub taken: Instant,
    /// When, on the wall clock (what is shown).
    pub wall: SystemTime,
    pub queued: u64,
    pub dead: u64,
    /// The messages this process's workers had delivered by then, in all
    /// ([`Outbox::sent_here`](crate::outbox::Outbox::sent_here)).
    pub sent_here: u64,
}

impl Sample {
    pub(crate) fn of(stats: &OutboxStats, sent_here: u64) -> Sample {
        Sample {
            taken: Instant::now(),
            wall: SystemTime::now(),
            queued: stats.queued,
            dead: stats.dead,
            sent_here,
        }
    }
}

/// Adds `sample` to `history` unless the last was kept less than `every` before `now`, and
/// forgets those older than an hour.
pub(crate) fn keep(history: &mut VecDeque<Sample>, sample: Sample, every: Duration, now: Instant) {
    let recent = history
        .back()
        .is_some_and(|last| now.saturating_duration_since(last.taken) < every);
    if !recent {
        history.push_back(sample);
    }
    while history.len() > KEPT
        || history
            .front()
            .is_some_and(|first| now.saturating_duration_since(first.taken) > SPAN)
    {
        history.pop_front();
    }
}

/// Reads the outbox's counts `every` while the page's state lives, inside a Tokio runtime
/// (outside one, the chart has the readings the page's own requests made).
pub(crate) fn start_sampling(shared: WeakShared, every: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        loop {
            let Some(alive) = shared.upgrade() else {
                return;
            };
            if let Some(outbox) = alive.mailer.outbox()
                && let Ok(stats) = outbox.stats().await
            {
                alive.keep(Sample::of(&stats, outbox.sent_here()), sampler_gap(every));
            }
            drop(alive);
            tokio::time::sleep(every).await;
        }
    });
}

/// How long after the last reading the sampler keeps its own: half the period, so that a
/// reading a request made just before does not push the sampler's a whole period back.
fn sampler_gap(every: Duration) -> Duration {
    every / 2
}

/// What each reading of `history` adds to the messages sent: the difference from the reading
/// before (0 for the first, and for one after the count started again from 0).
pub(crate) fn sent_per_reading(history: &[Sample]) -> Vec<u64> {
    let mut before = None;
    history
        .iter()
        .map(|sample| {
            let sent = before.map_or(0, |before| sample.sent_here.saturating_sub(before));
            before = Some(sample.sent_here);
            sent
        })
        .collect()
}

/// Width and height of the chart's drawing, in its own units.
const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 80.0;

/// The fewest readings' periods the chart spans, so that a page just started does not
/// stretch its first readings across its width.
const SHORTEST_SPAN: u32 = 20;

/// The queued and dead counts of `history`, read `every`, as an inline SVG: across, the
/// time since the oldest reading (at least 20 periods, at most an hour) up to the newest at
/// the right edge; up, the counts from zero to the largest.
pub(crate) fn svg(history: &[Sample], every: Duration) -> Markup {
    let now = history.last().map_or_else(Instant::now, |last| last.taken);
    let shortest = every.saturating_mul(SHORTEST_SPAN).min(SPAN);
    let spanned = history.first().map_or(SPAN, |first| {
        now.saturating_duration_since(first.taken)
            .clamp(shortest, SPAN)
    });
    let sent = sent_per_reading(history);
    let top = history
        .iter()
        .zip(&sent)
        .map(|(sample, sent)| sample.queued.max(sample.dead).max(*sent))
        .max()
        .unwrap_or(0)
        .max(1);
    let y = |count: u64| HEIGHT - HEIGHT * count as f64 / top as f64;
    let line = |values: &mut dyn Iterator<Item = u64>| {
        let mut points = String::new();
        for (sample, value) in history.iter().zip(values) {
            let age = now.saturating_duration_since(sample.taken).min(spanned);
            let x = WIDTH * (1.0 - age.as_secs_f64() / spanned.as_secs_f64());
            let _ = write!(points, "{x:.1},{:.1} ", y(value));
        }
        points
    };
    let over = super::page::span(spanned);
    let label = format!(
        "Queued (solid), dead (dashed) and sent by this process per reading (dotted) over \
         the last {over}; at most {top}, {} readings",
        history.len()
    );
    html! {
        svg class="chart" viewBox=(format!("-4 -4 {} {}", WIDTH + 8.0, HEIGHT + 8.0))
            role="img" aria-label=(label) {
            title { (label) }
            line class="axis" x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            polyline class="sent" points=(line(&mut sent.iter().copied())) {}
            polyline class="dead" points=(line(&mut history.iter().map(|sample| sample.dead))) {}
            polyline class="queued"
                points=(line(&mut history.iter().map(|sample| sample.queued))) {}
            @if let Some(last) = history.last() {
                circle class="queued" cx=(WIDTH) cy=(format!("{:.1}", y(last.queued))) r="3" {}
            }
        }
        p class="chart-scale" {
            "0 to " (top) " over the last " (over) " "
            span class="key-queued" { (PreEscaped("&mdash;")) " queued" }
            " "
            span class="key-dead" { "- - dead" }
            " "
            span class="key-sent" { (PreEscaped("&middot;&middot;&middot;")) " sent here" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(taken: Instant, queued: u64) -> Sample {
        Sample {
            taken,
            wall: SystemTime::now(),
            queued,
            dead: 0,
            sent_here: 0,
        }
    }

    fn sent(taken: Instant, sent_here: u64) -> Sample {
        Sample {
            sent_here,
            ..sample(taken, 0)
        }
    }

    #[test]
    fn each_reading_shows_the_messages_sent_here_since_the_reading_before() {
        let start = Instant::now();
        let history: Vec<Sample> = [0, 5, 5, 12]
            .into_iter()
            .enumerate()
            .map(|(i, total)| sent(start + EVERY * i as u32, total))
            .collect();
        assert_eq!(sent_per_reading(&history), [0, 5, 0, 7]);
    }

    #[test]
    fn a_count_that_started_again_from_zero_shows_no_messages_sent_rather_than_a_wrap() {
        let start = Instant::now();
        let history = [sent(start, 7), sent(start + EVERY, 2)];
        assert_eq!(sent_per_reading(&history), [0, 0]);
    }

    #[test]
    fn the_chart_draws_the_messages_sent_per_reading_on_the_same_scale() {
        let start = Instant::now();
        let history = [sent(start, 0), sent(start + SPAN, 4)];
        let drawn = svg(&history, EVERY).into_string();
        assert!(
            drawn.contains("class=\"sent\" points=\"0.0,80.0 360.0,0.0 \""),
            "{drawn}"
        );
        assert!(drawn.contains("at most 4"), "{drawn}");
    }

    #[test]
    fn a_reading_within_the_period_of_the_last_is_not_kept() {
        let start = Instant::now();
        let mut history = VecDeque::new();
        keep(&mut history, sample(start, 1), EVERY, start);
        let soon = start + Duration::from_secs(5);
        keep(&mut history, sample(soon, 2), EVERY, soon);
        let later = start + EVERY;
        keep(&mut history, sample(later, 3), EVERY, later);
        let kept: Vec<u64> = history.iter().map(|sample| sample.queued).collect();
        assert_eq!(kept, [1, 3]);
    }

    #[test]
    fn at_most_720_readings_are_kept_the_oldest_forgotten_first() {
        let start = Instant::now();
        let every = Duration::from_secs(1);
        let mut history = VecDeque::new();
        for index in 0..(KEPT as u64 + 5) {
            let taken = start + every * u32::try_from(index).unwrap();
            keep(&mut history, sample(taken, index), every, taken);
        }
        assert_eq!(history.len(), KEPT);
        assert_eq!(history.front().map(|sample| sample.queued), Some(5));
    }

    #[test]
    fn a_reading_exactly_an_hour_old_is_still_kept() {
        let start = Instant::now();
        let mut history = VecDeque::new();
        keep(&mut history, sample(start, 1), EVERY, start);
        let later = start + SPAN;
        keep(&mut history, sample(later, 2), EVERY, later);
        let kept: Vec<u64> = history.iter().map(|sample| sample.queued).collect();
        assert_eq!(kept, [1, 2]);
    }

    #[test]
    fn the_sampler_keeps_its_reading_half_a_period_after_a_requests() {
        let start = Instant::now();
        let mut history = VecDeque::new();
        keep(&mut history, sample(start, 1), EVERY, start);
        let half = start + EVERY / 2;
        keep(&mut history, sample(half, 2), sampler_gap(EVERY), half);
        assert_eq!(history.len(), 2, "kept half a period after the request's");
        let soon = half + EVERY / 4;
        keep(&mut history, sample(soon, 3), sampler_gap(EVERY), soon);
        assert_eq!(history.len(), 2, "not a quarter of a period after");
    }

    #[test]
    fn readings_older_than_an_hour_are_forgotten() {
        let start = Instant::now();
        let mut history = VecDeque::new();
        keep(&mut history, sample(start, 1), EVERY, start);
        let later = start + SPAN + Duration::from_secs(1);
        keep(&mut history, sample(later, 2), EVERY, later);
        let kept: Vec<u64> = history.iter().map(|sample| sample.queued).collect();
        assert_eq!(kept, [2]);
    }

    #[test]
    fn the_chart_puts_the_newest_reading_at_the_right_edge_and_the_largest_at_the_top() {
        let start = Instant::now();
        let history = [
            sample(start, 0),
            sample(start + Duration::from_secs(30 * 60), 4),
            sample(start + SPAN, 2),
        ];
        let drawn = svg(&history, EVERY).into_string();
        assert!(drawn.contains("0.0,80.0 180.0,0.0 360.0,40.0"), "{drawn}");
        assert!(drawn.contains("over the last 1 h 0 min"), "{drawn}");
    }

    #[test]
    fn the_chart_spans_from_its_oldest_reading_but_at_least_twenty_periods() {
        let start = Instant::now();
        let every = Duration::from_secs(3); // 20 periods: a minute
        let history = [sample(start, 1), sample(start + Duration::from_secs(20), 1)];
        let drawn = svg(&history, every).into_string();
        assert!(drawn.contains("240.0,0.0 360.0,0.0"), "{drawn}");
        let history = [
            sample(start, 1),
            sample(start + Duration::from_secs(600), 1),
        ];
        let drawn = svg(&history, every).into_string();
        assert!(drawn.contains("0.0,0.0 360.0,0.0"), "{drawn}");
    }
}
