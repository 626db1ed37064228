//! What the breakers, pools and retries count, under the `metrics` feature: the names below,
//! recorded through the [`metrics`](https://docs.rs/metrics) facade into whatever recorder
//! the application installs (Prometheus, StatsD, ...). Without the feature nothing is
//! recorded and nothing of it is compiled into the send path.
//!
//! Each breaker, pool member, retry and rate limiter takes the handle of a series from the
//! recorder at its first use and keeps it, so that a send costs an atomic add per series:
//! install the recorder before the first send (building the stack before it is fine). The
//! [operating chapter](crate::guide::operating) says more.
//!
//! | name | kind | labels | what it counts |
//! | --- | --- | --- | --- |
//! | [`mail_breaker_sends_total`](SENDS_TOTAL) | counter | `transport`, `outcome` | sends through a breaker, by how the breaker took them |
//! | [`mail_breaker_transitions_total`](TRANSITIONS_TOTAL) | counter | `transport`, `from`, `to` | changes of state |
//! | [`mail_breaker_open`](OPEN) | gauge | `transport` | the breaker's keys open now |
//! | [`mail_breaker_send_seconds`](SEND_SECONDS) | histogram | `transport` | how long the sends that went took |
//! | [`mail_breaker_pool_failovers_total`](POOL_FAILOVERS_TOTAL) | counter | `pool`, `from` | a pool moving on from a member |
//! | [`mail_breaker_retries_total`](RETRIES_TOTAL) | counter | `transport` | retries scheduled |
//! | [`mail_breaker_retries_throttled_total`](RETRIES_THROTTLED_TOTAL) | counter | `transport` | retries the budget refused |
//! | [`mail_breaker_outbox_queued`](OUTBOX_QUEUED) | gauge | | messages in the outbox waiting to be sent |
//! | [`mail_breaker_outbox_due`](OUTBOX_DUE) | gauge | | of those, the ones due now |
//! | [`mail_breaker_outbox_dead`](OUTBOX_DEAD) | gauge | | dead letters |
//! | [`mail_breaker_outbox_oldest_seconds`](OUTBOX_OLDEST_SECONDS) | gauge | | how long the oldest queued message has waited |
//! | [`mail_breaker_outbox_sent_total`](OUTBOX_SENT_TOTAL) | counter | `outcome` | answers an outbox worker recorded: `sent`, `retry` or `dead` |
//! | [`mail_breaker_outbox_worker_restarts_total`](OUTBOX_WORKER_RESTARTS_TOTAL) | counter | | outbox workers a `Mailer` started again after they ended |
//! | [`mail_breaker_rate_wait_seconds`](RATE_WAIT_SECONDS) | histogram | `transport` | how long sends waited for their turn at a rate limit |
//! | [`mail_breaker_rate_per_second`](RATE_PER_SECOND) | gauge | `transport` | the rate a limiter allows now |
//! | [`mail_breaker_rate_refused_total`](RATE_REFUSED_TOTAL) | counter | `transport` | sends a limiter answered `rate.limited` |
//! | [`mail_breaker_suppressed_total`](SUPPRESSED_TOTAL) | counter | `reason` | recipients the suppression list held back (`bounced`, `complained`, `manual`, and `held` for a while after transient bounces) |
//! | [`mail_breaker_reputation_tier`](REPUTATION_TIER) | gauge | `member` | a member's reputation tier: 0 healthy, 1 warn, 2 throttle, 3 open |
//! | [`mail_breaker_reputation_hard_bounce_rate`](REPUTATION_HARD_BOUNCE_RATE) | gauge | `member` | hard bounces over sends in the reputation window |
//! | [`mail_breaker_reputation_complaint_rate`](REPUTATION_COMPLAINT_RATE) | gauge | `member` | complaints over sends in the reputation window |
//!
//! A rate limiter's `transport` label is its name (the inner transport's unless set).
//!
//! **In OpenTelemetry's words.** Exported through an OpenTelemetry recorder, each name is
//! the instrument below, with its unit as UCUM writes it; the labels are the attributes.
//! The traces are in [`telemetry`](crate::telemetry).
//!
//! | name | instrument | unit |
//! | --- | --- | --- |
//! | `mail_breaker_sends_total` | Counter (a monotonic sum) | `{send}` |
//! | `mail_breaker_transitions_total` | Counter | `{transition}` |
//! | `mail_breaker_open` | Gauge | `{key}` |
//! | `mail_breaker_send_seconds` | Histogram | `s` |
//! | `mail_breaker_pool_failovers_total` | Counter | `{failover}` |
//! | `mail_breaker_retries_total`, `mail_breaker_retries_throttled_total` | Counter | `{retry}` |
//! | `mail_breaker_outbox_queued`, `mail_breaker_outbox_due`, `mail_breaker_outbox_dead` | Gauge | `{message}` |
//! | `mail_breaker_outbox_oldest_seconds` | Gauge | `s` |
//! | `mail_breaker_outbox_sent_total` | Counter | `{answer}` |
//! | `mail_breaker_outbox_worker_restarts_total` | Counter | `{restart}` |
//! | `mail_breaker_rate_wait_seconds` | Histogram | `s` |
//! | `mail_breaker_rate_per_second` | Gauge | `{send}/s` |
//! | `mail_breaker_rate_refused_total` | Counter | `{send}` |
//! | `mail_breaker_suppressed_total` | Counter | `{recipient}` |
//! | `mail_breaker_reputation_tier` | Gauge | `1` (0 to 3) |
//! | `mail_breaker_reputation_hard_bounce_rate`, `mail_breaker_reputation_complaint_rate` | Gauge | `1` (a ratio) |
//!
//! The outbox's gauges are what its workers last read from the database (each worker reads
//! at most once a second while it works, and less often under a backlog whose count takes
//! long: after a read that took `t`, not before `20 t`): with several workers, take any
//! one's value, not their sum.
//!
//! `outcome` is one of `success` and `failure` (the result counted as such), `ignored` (the
//! send went, but the breaker counted nothing: shadow mode let it through without leave) and
//! `refused` (the breaker held it back; nothing was sent). `from` and `to` are
//! [`State::as_str`](crate::State::as_str) names. An answer that comes after its breaker
//! moved on (a probe past its deadline) is labelled by its result, though the breaker no
//! longer counts it: the stores do not say which results they counted.
//!
//! No label carries a recipient domain or an address: a breaker under
//! [`Scope::RecipientDomain`](crate::Scope::RecipientDomain) is labelled with its transport's
//! name, never its key, so the number of series stays bounded by the number of transports.
//!
//! # The open gauge across processes
//! `mail_breaker_open` goes up on a change into `open` and down on a change out of it, in
//! the process whose call made the change. With a shared
//! [`RedisStore`](crate::store) only that process hears it, so one process's value may be
//! off (even below zero) while the sum over all processes (`sum by (transport)`) is the
//! number of keys open. `half_open` does not count as open. An open breaker that a full
//! [`MemoryStore`](crate::MemoryStore) forgets (only when every key it keeps is open) is
//! still counted: no change of state says it went.

/// Counter of sends through a breaker; labels `transport` and `outcome`
/// (`success`, `failure`, `ignored` or `refused`).
///
/// ```
/// assert_eq!(mail_breaker::metrics::SENDS_TOTAL, "mail_breaker_sends_total");
/// ```
pub const SENDS_TOTAL: &str = "mail_breaker_sends_total";

/// Counter of changes of state; labels `transport`, `from` and `to`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::TRANSITIONS_TOTAL, "mail_breaker_transitions_total");
/// ```
pub const TRANSITIONS_TOTAL: &str = "mail_breaker_transitions_total";

/// Gauge of the breaker's keys open now, as this process heard it; label `transport`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::OPEN, "mail_breaker_open");
/// ```
pub const OPEN: &str = "mail_breaker_open";

/// Histogram of how long each send that went took, in seconds; label `transport`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::SEND_SECONDS, "mail_breaker_send_seconds");
/// ```
pub const SEND_SECONDS: &str = "mail_breaker_send_seconds";

/// Counter of a pool moving on from a member that could not serve; labels `pool` and `from`
/// (the member's name). The last member's failure is no failover: the pool gives up.
///
/// ```
/// assert_eq!(mail_breaker::metrics::POOL_FAILOVERS_TOTAL, "mail_breaker_pool_failovers_total");
/// ```
pub const POOL_FAILOVERS_TOTAL: &str = "mail_breaker_pool_failovers_total";

/// Counter of retries a [`RetryTransport`](crate::RetryTransport) scheduled; label `transport`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::RETRIES_TOTAL, "mail_breaker_retries_total");
/// ```
pub const RETRIES_TOTAL: &str = "mail_breaker_retries_total";

/// Counter of retries the [`RetryBudget`](crate::RetryBudget) refused; label `transport`.
///
/// ```
/// assert_eq!(
///     mail_breaker::metrics::RETRIES_THROTTLED_TOTAL,
///     "mail_breaker_retries_throttled_total"
/// );
/// ```
pub const RETRIES_THROTTLED_TOTAL: &str = "mail_breaker_retries_throttled_total";

/// Gauge of the messages in the outbox waiting to be sent, dead ones excluded.
///
/// ```
/// assert_eq!(mail_breaker::metrics::OUTBOX_QUEUED, "mail_breaker_outbox_queued");
/// ```
pub const OUTBOX_QUEUED: &str = "mail_breaker_outbox_queued";

/// Gauge of the queued messages due now that no worker holds.
///
/// ```
/// assert_eq!(mail_breaker::metrics::OUTBOX_DUE, "mail_breaker_outbox_due");
/// ```
pub const OUTBOX_DUE: &str = "mail_breaker_outbox_due";

/// Gauge of the outbox's dead letters.
///
/// ```
/// assert_eq!(mail_breaker::metrics::OUTBOX_DEAD, "mail_breaker_outbox_dead");
/// ```
pub const OUTBOX_DEAD: &str = "mail_breaker_outbox_dead";

/// Gauge of how long the oldest queued message has waited, in seconds (0 when none is).
///
/// ```
/// assert_eq!(mail_breaker::metrics::OUTBOX_OLDEST_SECONDS, "mail_breaker_outbox_oldest_seconds");
/// ```
pub const OUTBOX_OLDEST_SECONDS: &str = "mail_breaker_outbox_oldest_seconds";

/// Counter of the answers an outbox worker recorded; label `outcome`: `sent` (it left the
/// outbox), `retry` (due again later) or `dead`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::OUTBOX_SENT_TOTAL, "mail_breaker_outbox_sent_total");
/// ```
pub const OUTBOX_SENT_TOTAL: &str = "mail_breaker_outbox_sent_total";

/// Counter of the outbox workers a `Mailer` started again after they ended without being
/// stopped (a panic outside any send, or an error).
///
/// ```
/// assert_eq!(
///     mail_breaker::metrics::OUTBOX_WORKER_RESTARTS_TOTAL,
///     "mail_breaker_outbox_worker_restarts_total"
/// );
/// ```
pub const OUTBOX_WORKER_RESTARTS_TOTAL: &str = "mail_breaker_outbox_worker_restarts_total";

/// Histogram of how long each send waited for its turn at a rate limit, in seconds; label
/// `transport` (the limiter's name).
///
/// ```
/// assert_eq!(mail_breaker::metrics::RATE_WAIT_SECONDS, "mail_breaker_rate_wait_seconds");
/// ```
pub const RATE_WAIT_SECONDS: &str = "mail_breaker_rate_wait_seconds";

/// Gauge of the rate a limiter allows now, in sends per second; label `transport`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::RATE_PER_SECOND, "mail_breaker_rate_per_second");
/// ```
pub const RATE_PER_SECOND: &str = "mail_breaker_rate_per_second";

/// Counter of sends a limiter answered `rate.limited` without sending; label `transport`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::RATE_REFUSED_TOTAL, "mail_breaker_rate_refused_total");
/// ```
pub const RATE_REFUSED_TOTAL: &str = "mail_breaker_rate_refused_total";

/// Counter of recipients a [`SuppressionTransport`](crate::suppression) answered as
/// suppressed without sending to them; label `reason` (`bounced`, `complained`, `manual`).
///
/// ```
/// assert_eq!(mail_breaker::metrics::SUPPRESSED_TOTAL, "mail_breaker_suppressed_total");
/// ```
pub const SUPPRESSED_TOTAL: &str = "mail_breaker_suppressed_total";

/// Gives each metric its description and unit, for exporters that show them (Prometheus'
/// `# HELP` lines). Call it once, after installing the recorder; the metrics are recorded
/// whether it is called or not.
///
/// ```
/// let recorder = metrics_util::debugging::DebuggingRecorder::new();
/// metrics::with_local_recorder(&recorder, mail_breaker::metrics::describe);
/// ```
#[cfg(feature = "metrics")]
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        SENDS_TOTAL,
        "Sends through a breaker, by outcome: success, failure, ignored (sent, not counted) or refused (held back)"
    );
    describe_counter!(TRANSITIONS_TOTAL, "Changes of a breaker's state");
    describe_gauge!(
        OPEN,
        "Keys of the breaker open now, as changed by this process's calls"
    );
    describe_histogram!(
        SEND_SECONDS,
        Unit::Seconds,
        "How long each send that went through a breaker took"
    );
    describe_counter!(
        POOL_FAILOVERS_TOTAL,
        "Times a pool moved on from a member that could not serve"
    );
    describe_counter!(RETRIES_TOTAL, "Retries scheduled");
    describe_counter!(RETRIES_THROTTLED_TOTAL, "Retries the retry budget refused");
    describe_histogram!(
        RATE_WAIT_SECONDS,
        Unit::Seconds,
        "How long sends waited for their turn at a rate limit"
    );
    describe_gauge!(
        RATE_PER_SECOND,
        "The rate a limiter allows now, in sends per second"
    );
    describe_counter!(
        RATE_REFUSED_TOTAL,
        "Sends a rate limiter answered rate.limited"
    );
    describe_gauge!(OUTBOX_QUEUED, "Messages in the outbox waiting to be sent");
    describe_gauge!(OUTBOX_DUE, "Messages in the outbox due now");
    describe_gauge!(OUTBOX_DEAD, "Dead letters in the outbox");
    describe_gauge!(
        OUTBOX_OLDEST_SECONDS,
        Unit::Seconds,
        "How long the oldest message in the outbox has waited"
    );
    describe_counter!(
        OUTBOX_SENT_TOTAL,
        "Answers an outbox worker recorded, by outcome: sent, retry or dead"
    );
    describe_counter!(
        OUTBOX_WORKER_RESTARTS_TOTAL,
        "Outbox workers started again after they ended without being stopped"
    );
    describe_counter!(
        SUPPRESSED_TOTAL,
        "Recipients the suppression list held back, by reason"
    );
    describe_gauge!(
        REPUTATION_TIER,
        "A member's reputation tier: 0 healthy, 1 warn, 2 throttle, 3 open"
    );
    describe_gauge!(
        REPUTATION_HARD_BOUNCE_RATE,
        "A member's hard bounces over its sends in the reputation window"
    );
    describe_gauge!(
        REPUTATION_COMPLAINT_RATE,
        "A member's complaints over its sends in the reputation window"
    );
}

/// Whether the `metrics` feature is compiled in: without it the rooms that record through
/// the facade (the breaker, the pool, the retry, the rate limiter, the outbox) skip the work
/// that only their metrics need, such as reading the clock or the outbox's counts.
// Read by the outbox's worker; the breaker asks its histogram handle instead.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))]
pub(crate) const ENABLED: bool = cfg!(feature = "metrics");

/// Gauge of a member's reputation tier (0 healthy, 1 warn, 2 throttle, 3 open); label
/// `member`. Set by the process that last counted a send or an event of the member.
///
/// ```
/// assert_eq!(mail_breaker::metrics::REPUTATION_TIER, "mail_breaker_reputation_tier");
/// ```
pub const REPUTATION_TIER: &str = "mail_breaker_reputation_tier";

/// Gauge of a member's hard-bounce rate over its reputation window (0 to 1); label `member`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::REPUTATION_HARD_BOUNCE_RATE, "mail_breaker_reputation_hard_bounce_rate");
/// ```
pub const REPUTATION_HARD_BOUNCE_RATE: &str = "mail_breaker_reputation_hard_bounce_rate";

/// Gauge of a member's complaint rate over its reputation window (0 to 1); label `member`.
///
/// ```
/// assert_eq!(mail_breaker::metrics::REPUTATION_COMPLAINT_RATE, "mail_breaker_reputation_complaint_rate");
/// ```
pub const REPUTATION_COMPLAINT_RATE: &str = "mail_breaker_reputation_complaint_rate";
