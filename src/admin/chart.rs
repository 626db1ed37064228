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
}

impl Sample {
    pub(crate) fn of(stats: &OutboxStats) -> Sample {
        Sample {
            taken: Instant::now(),
            wall: SystemTime::now(),
            queued: stats.queued,
            dead: stats.dead,
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
                // Half the period, so that a reading a request made just before does not
                // push this one a whole period back.
                alive.keep(Sample::of(&stats), every / 2);
            }
            drop(alive);
            tokio::time::sleep(every).await;
        }
    });
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
    let top = history
        .iter()
        .map(|sample| sample.queued.max(sample.dead))
        .max()
        .unwrap_or(0)
        .max(1);
    let y = |count: u64| HEIGHT - HEIGHT * count as f64 / top as f64;
    let line = |value: fn(&Sample) -> u64| {
        let mut points = String::new();
        for sample in history {
            let age = now.saturating_duration_since(sample.taken).min(spanned);
            let x = WIDTH * (1.0 - age.as_secs_f64() / spanned.as_secs_f64());
            let _ = write!(points, "{x:.1},{:.1} ", y(value(sample)));
        }
        points
    };
    let over = super::page::span(spanned);
    let label = format!(
        "Queued (solid) and dead (dashed) over the last {over}; at most {top}, {} readings",
        history.len()
    );
    html! {
        svg class="chart" viewBox=(format!("-4 -4 {} {}", WIDTH + 8.0, HEIGHT + 8.0))
            role="img" aria-label=(label) {
            title { (label) }
            line class="axis" x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            polyline class="dead" points=(line(|sample| sample.dead)) {}
            polyline class="queued" points=(line(|sample| sample.queued)) {}
            @if let Some(last) = history.last() {
                circle class="queued" cx=(WIDTH) cy=(format!("{:.1}", y(last.queued))) r="3" {}
            }
        }
        p class="chart-scale" {
            "0 to " (top) " over the last " (over) " "
            span class="key-queued" { (PreEscaped("&mdash;")) " queued" }
            " "
            span class="key-dead" { "- - dead" }
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
        }
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
