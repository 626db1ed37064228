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
    while history
        .front()
        .is_some_and(|first| now.saturating_duration_since(first.taken) > SPAN)
    {
        history.pop_front();
    }
}

/// Reads the outbox's counts every [`EVERY`] while the page's state lives, inside a Tokio
/// runtime (outside one, the chart has the readings the page's own requests made).
pub(crate) fn start_sampling(shared: WeakShared) {
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
                // A little under EVERY, so that a reading a request made just before does
                // not push this one a whole period back.
                alive.keep(Sample::of(&stats), EVERY / 2);
            }
            drop(alive);
            tokio::time::sleep(EVERY).await;
        }
    });
}

/// Width and height of the chart's drawing, in its own units.
const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 80.0;

/// The queued and dead counts of `history` over the last hour as an inline SVG, the hour
/// across and the counts up from zero to the largest.
pub(crate) fn svg(history: &[Sample]) -> Markup {
    let now = history.last().map_or_else(Instant::now, |last| last.taken);
    let top = history
        .iter()
        .map(|sample| sample.queued.max(sample.dead))
        .max()
        .unwrap_or(0)
        .max(1);
    let line = |value: fn(&Sample) -> u64| {
        let mut points = String::new();
        for sample in history {
            let age = now.saturating_duration_since(sample.taken).min(SPAN);
            let x = WIDTH * (1.0 - age.as_secs_f64() / SPAN.as_secs_f64());
            let y = HEIGHT - HEIGHT * value(sample) as f64 / top as f64;
            let _ = write!(points, "{x:.1},{y:.1} ");
        }
        points
    };
    let label = format!(
        "Queued (solid) and dead (dashed) over the last hour; at most {top}, {} readings",
        history.len()
    );
    html! {
        svg class="chart" viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none"
            role="img" aria-label=(label) {
            title { (label) }
            line class="axis" x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            polyline class="queued" points=(line(|sample| sample.queued)) {}
            polyline class="dead" points=(line(|sample| sample.dead)) {}
        }
        p class="chart-scale" {
            "0 to " (top) " over the last hour "
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
        ];
        let drawn = svg(&history).into_string();
        assert!(drawn.contains("180.0,80.0 360.0,0.0"), "{drawn}");
    }
}
