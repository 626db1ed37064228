//! What an outbox worker reports through the [`metrics`](https://docs.rs/metrics) facade,
//! under the `metrics` feature: its gauges and its answers, by the names of
//! [`crate::metrics`]. The outbox records them itself, so that the metrics module, which
//! stands below the outbox, knows nothing of it.

use super::OutboxStats;

/// An outbox worker recorded `count` answers with `outcome` (`sent`, `retry` or `dead`).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(super) fn answers(outcome: &'static str, count: u64) {
    #[cfg(feature = "metrics")]
    if count > 0 {
        ::metrics::counter!(crate::metrics::OUTBOX_SENT_TOTAL, "outcome" => outcome)
            .increment(count);
    }
}

/// What an outbox worker last read of its outbox.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(super) fn stats(stats: &OutboxStats) {
    #[cfg(feature = "metrics")]
    {
        use crate::metrics::{OUTBOX_DEAD, OUTBOX_DUE, OUTBOX_OLDEST_SECONDS, OUTBOX_QUEUED};
        ::metrics::gauge!(OUTBOX_QUEUED).set(stats.queued as f64);
        ::metrics::gauge!(OUTBOX_DUE).set(stats.due as f64);
        ::metrics::gauge!(OUTBOX_DEAD).set(stats.dead as f64);
        ::metrics::gauge!(OUTBOX_OLDEST_SECONDS)
            .set(stats.oldest.map_or(0.0, |oldest| oldest.as_secs_f64()));
    }
}

/// A worker task that ended without being stopped was started again.
#[cfg_attr(not(all(feature = "metrics", feature = "config")), allow(dead_code))]
pub(super) fn worker_restarted() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(crate::metrics::OUTBOX_WORKER_RESTARTS_TOTAL).increment(1);
}
