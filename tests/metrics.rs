//! The metrics of DESIGN §8, read back through `metrics-util`'s `DebuggingRecorder` after
//! scripted outages under paused time. Each test records into a recorder of its own, set for
//! its thread only, so tests running side by side do not see each other's counts.
#![cfg(feature = "metrics")]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::metrics::{
    OPEN, POOL_FAILOVERS_TOTAL, RETRIES_THROTTLED_TOTAL, RETRIES_TOTAL, SEND_SECONDS, SENDS_TOTAL,
    TRANSITIONS_TOTAL,
};
use mail_breaker::{
    Backoff, Category, CircuitBreakerTransport, PoolTransport, RetryBudget, RetryTransport, Scope,
    State, Transport,
};
use metrics::LocalRecorderGuard;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::scripted::{Reply, Scripted};
use support::{message, message_to, numbered_messages};
use tokio::time::advance;

const RESET: Duration = Duration::from_secs(30);

/// One metric's series: its kind, name and labels (sorted by label name).
type Series = (MetricKind, String, Vec<(String, String)>);

/// Everything recorded since the test began. The debugging recorder's snapshot hands over
/// what was recorded since the last one (a gauge's increments too), so each reading is
/// added to the totals kept here.
struct Recorded {
    snapshotter: Snapshotter,
    counters: BTreeMap<Series, u64>,
    gauges: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
}

impl Recorded {
    /// A recorder set as this thread's own until the guard drops. `#[tokio::test]` runs its
    /// tasks on the test's thread, so every send of the test records here.
    fn start() -> (Recorded, LocalRecorderGuard<'static>) {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let guard = metrics::set_default_local_recorder(recorder);
        let recorded = Recorded {
            snapshotter: recorder.snapshotter(),
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            histograms: BTreeMap::new(),
        };
        (recorded, guard)
    }

    /// Adds what was recorded since the last reading.
    fn read(&mut self) -> &mut Self {
        for (key, _unit, _description, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            let series = (kind, key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(count) => *self.counters.entry(series).or_default() += count,
                DebugValue::Gauge(delta) => *self.gauges.entry(series).or_default() += *delta,
                DebugValue::Histogram(values) => self
                    .histograms
                    .entry(series)
                    .or_default()
                    .extend(values.into_iter().map(|value| *value)),
            }
        }
        self
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let series = series(MetricKind::Counter, name, labels);
        self.read().counters.get(&series).copied().unwrap_or(0)
    }

    fn gauge(&mut self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let series = series(MetricKind::Gauge, name, labels);
        self.read().gauges.get(&series).copied().unwrap_or(0.0)
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let series = series(MetricKind::Histogram, name, labels);
        self.read()
            .histograms
            .get(&series)
            .cloned()
            .unwrap_or_default()
    }

    /// `mail_breaker_sends_total` of `transport` for `outcome`.
    fn sends(&mut self, transport: &str, outcome: &str) -> u64 {
        self.counter(
            SENDS_TOTAL,
            &[("transport", transport), ("outcome", outcome)],
        )
    }

    /// `mail_breaker_transitions_total` of `transport` from `from` to `to`.
    fn transitions(&mut self, transport: &str, from: State, to: State) -> u64 {
        self.counter(
            TRANSITIONS_TOTAL,
            &[
                ("transport", transport),
                ("from", from.as_str()),
                ("to", to.as_str()),
            ],
        )
    }

    /// Every label of every series recorded, as `name=value`.
    fn all_labels(&mut self) -> Vec<String> {
        self.read();
        let names = self.counters.keys().chain(self.gauges.keys());
        names
            .chain(self.histograms.keys())
            .flat_map(|(_, _, labels)| labels.iter().map(|(key, value)| format!("{key}={value}")))
            .collect()
    }
}

fn series(kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    labels.sort();
    (kind, name.to_owned(), labels)
}

/// A breaker that opens after three failures in a row and probes after 30 s.
fn breaker(inner: &Scripted) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(3)
        .reset_timeout(RESET)
        .build()
        .expect("valid settings")
}

fn down_for(delay: Duration) -> Reply {
    Reply::after(delay, Reply::fail(Category::ServiceUnavailable))
}

#[tokio::test(start_paused = true)]
async fn after_an_outage_and_a_probe_that_closes_the_breaker_the_counters_and_the_gauge_hold_what_happened()
 {
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::new("primary");
    provider.then([
        Reply::Ok,
        down_for(Duration::from_secs(2)),
        down_for(Duration::from_secs(2)),
        down_for(Duration::from_secs(2)),
    ]);
    let breaker = breaker(&provider);

    breaker.send(&message()).await.expect("delivered");
    for _ in 0..3 {
        breaker
            .send(&message())
            .await
            .expect_err("the provider is down");
    }
    for _ in 0..2 {
        let refused = breaker.send(&message()).await.expect_err("refused");
        assert_eq!(refused.code(), "breaker.open");
    }
    assert_eq!(recorded.gauge(OPEN, &[("transport", "primary")]), 1.0);

    advance(RESET).await;
    breaker.send(&message()).await.expect("the probe delivers");
    breaker.send(&message()).await.expect("delivered");

    assert_eq!(provider.sends(), 6);
    assert_eq!(recorded.sends("primary", "success"), 3);
    assert_eq!(recorded.sends("primary", "failure"), 3);
    assert_eq!(recorded.sends("primary", "refused"), 2);
    assert_eq!(recorded.sends("primary", "ignored"), 0);
    assert_eq!(
        recorded.transitions("primary", State::Closed, State::Open),
        1
    );
    assert_eq!(
        recorded.transitions("primary", State::Open, State::HalfOpen),
        1
    );
    assert_eq!(
        recorded.transitions("primary", State::HalfOpen, State::Closed),
        1
    );
    assert_eq!(recorded.gauge(OPEN, &[("transport", "primary")]), 0.0);
    assert_eq!(
        recorded.histogram(SEND_SECONDS, &[("transport", "primary")]),
        [0.0, 2.0, 2.0, 2.0, 0.0, 0.0],
        "one duration per send that went, none for the refused"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_fails_counts_a_second_opening_and_the_gauge_stays_at_one() {
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::answering("primary", Reply::fail(Category::Network));
    let breaker = breaker(&provider);

    for _ in 0..3 {
        breaker
            .send(&message())
            .await
            .expect_err("the provider is down");
    }
    advance(RESET).await;
    breaker.send(&message()).await.expect_err("the probe fails");

    assert_eq!(recorded.sends("primary", "failure"), 4);
    assert_eq!(
        recorded.transitions("primary", State::Closed, State::Open),
        1
    );
    assert_eq!(
        recorded.transitions("primary", State::Open, State::HalfOpen),
        1
    );
    assert_eq!(
        recorded.transitions("primary", State::HalfOpen, State::Open),
        1
    );
    assert_eq!(recorded.gauge(OPEN, &[("transport", "primary")]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_the_sends_an_open_breaker_would_refuse_go_and_count_as_ignored() {
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::answering("primary", Reply::fail(Category::Timeout));
    let breaker = CircuitBreakerTransport::builder(provider.clone())
        .failure_threshold(3)
        .reset_timeout(RESET)
        .shadow(true)
        .build()
        .expect("valid settings");

    for _ in 0..5 {
        let error = breaker
            .send(&message())
            .await
            .expect_err("the provider is down");
        assert_eq!(error.code(), "test.timeout", "shadow mode never refuses");
    }

    assert_eq!(provider.sends(), 5);
    assert_eq!(recorded.sends("primary", "failure"), 3);
    assert_eq!(recorded.sends("primary", "ignored"), 2);
    assert_eq!(recorded.sends("primary", "refused"), 0);
    assert_eq!(
        recorded.transitions("primary", State::Closed, State::Open),
        1
    );
    assert_eq!(recorded.gauge(OPEN, &[("transport", "primary")]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn isolating_counts_an_opening_and_its_refusals_and_reset_brings_the_gauge_back_to_zero() {
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::new("primary");
    let breaker = breaker(&provider);

    breaker.isolate().await;
    assert_eq!(recorded.gauge(OPEN, &[("transport", "primary")]), 1.0);
    advance(Duration::from_secs(3600)).await;
    let refused = breaker.send(&message()).await.expect_err("isolated");
    assert_eq!(refused.code(), "breaker.isolated");
    breaker.reset().await;
    breaker.send(&message()).await.expect("delivered");

    assert_eq!(recorded.sends("primary", "refused"), 1);
    assert_eq!(recorded.sends("primary", "success"), 1);
    assert_eq!(
        recorded.transitions("primary", State::Closed, State::Open),
        1
    );
    assert_eq!(
        recorded.transitions("primary", State::Open, State::Closed),
        1
    );
    assert_eq!(recorded.gauge(OPEN, &[("transport", "primary")]), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_batch_counts_each_message_once_whether_it_went_or_was_refused() {
    let (mut recorded, _guard) = Recorded::start();
    // One message at a time, so that each answer is counted before the next is admitted.
    let provider = Scripted::answering("primary", Reply::fail(Category::ServerError));
    let breaker = breaker(&provider);

    let messages = futures::stream::iter(numbered_messages(5)).boxed();
    let answers: Vec<_> = breaker.send_many(messages).collect().await;

    assert_eq!(answers.len(), 5);
    assert_eq!(provider.sends(), 3);
    assert_eq!(recorded.sends("primary", "failure"), 3);
    assert_eq!(recorded.sends("primary", "refused"), 2);
    assert_eq!(recorded.sends("primary", "success"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_pool_counts_each_move_to_the_next_member_but_not_giving_up_after_the_last() {
    let (mut recorded, _guard) = Recorded::start();
    let primary = Scripted::answering("primary", Reply::fail(Category::Network));
    let backup = Scripted::new("backup");
    let pool = PoolTransport::builder()
        .name("outbound")
        .add(breaker(&primary), 1)
        .add(breaker(&backup), 2)
        .build()
        .expect("a pool with members");

    for _ in 0..5 {
        let receipt = pool.send(&message()).await.expect("the backup delivers");
        assert_eq!(receipt.transport(), "backup");
    }
    backup.set_default(Reply::fail(Category::Network));
    pool.send(&message())
        .await
        .expect_err("every member failed");

    let from_primary = [("pool", "outbound"), ("from", "primary")];
    let from_backup = [("pool", "outbound"), ("from", "backup")];
    assert_eq!(recorded.counter(POOL_FAILOVERS_TOTAL, &from_primary), 6);
    assert_eq!(recorded.counter(POOL_FAILOVERS_TOTAL, &from_backup), 0);
    assert_eq!(recorded.sends("primary", "failure"), 3);
    assert_eq!(recorded.sends("primary", "refused"), 3);
    assert_eq!(recorded.sends("backup", "success"), 5);
    assert_eq!(recorded.sends("backup", "failure"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pools_batch_counts_a_failover_from_each_member_it_leaves() {
    let (mut recorded, _guard) = Recorded::start();
    let primary = Scripted::answering("primary", Reply::fail(Category::Network)).batched();
    let backup = Scripted::new("backup").batched();
    let pool = PoolTransport::builder()
        .add(primary.clone(), 1)
        .add(backup.clone(), 2)
        .build()
        .expect("a pool with members");

    let messages = futures::stream::iter(numbered_messages(3)).boxed();
    let answers: Vec<_> = pool.send_many(messages).collect().await;

    assert!(answers.iter().all(Result::is_ok));
    let from_primary = [("pool", "pool"), ("from", "primary")];
    assert_eq!(recorded.counter(POOL_FAILOVERS_TOTAL, &from_primary), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_are_counted_under_the_retried_transports_name_and_so_are_those_the_budget_refuses()
{
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::answering("primary", Reply::fail(Category::ServerError));
    provider.then([Reply::fail(Category::ServerError), Reply::Ok]);
    let retrying = RetryTransport::builder(provider.clone())
        .max_attempts(5)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .build()
        .expect("valid settings");
    retrying
        .send(&message())
        .await
        .expect("the second try delivers");
    assert_eq!(
        recorded.counter(RETRIES_TOTAL, &[("transport", "primary")]),
        1
    );

    // 20 tokens, a floor of 5, 10 a failure: the first failure leaves 10 and is retried,
    // the second leaves 0 and is not.
    let budget = Arc::new(RetryBudget::new(20, 5, 10).expect("a valid budget"));
    let throttled = RetryTransport::builder(Scripted::answering(
        "backup",
        Reply::fail(Category::ServerError),
    ))
    .max_attempts(5)
    .backoff(Backoff::constant(Duration::from_secs(1)))
    .budget(budget)
    .build()
    .expect("valid settings");
    throttled
        .send(&message())
        .await
        .expect_err("the budget stops the retries");

    assert_eq!(
        recorded.counter(RETRIES_TOTAL, &[("transport", "backup")]),
        1
    );
    assert_eq!(
        recorded.counter(RETRIES_THROTTLED_TOTAL, &[("transport", "backup")]),
        1
    );
    assert_eq!(
        recorded.counter(RETRIES_THROTTLED_TOTAL, &[("transport", "primary")]),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_per_recipient_domain_labels_its_metrics_with_the_transport_and_never_a_domain() {
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::answering("primary", Reply::fail(Category::ServiceUnavailable));
    let breaker = CircuitBreakerTransport::builder(provider)
        .failure_threshold(1)
        .reset_timeout(RESET)
        .scope(Scope::RecipientDomain)
        .build()
        .expect("valid settings");

    for to in [
        "user@example.org",
        "user@another.net",
        "other@example.org",
        "a@third.example",
    ] {
        breaker
            .send(&message_to(to))
            .await
            .expect_err("failed or refused");
    }

    assert_eq!(breaker.state_of("example.org"), State::Open);
    assert_eq!(
        recorded.gauge(OPEN, &[("transport", "primary")]),
        3.0,
        "one per domain open"
    );
    assert_eq!(recorded.sends("primary", "failure"), 3);
    assert_eq!(recorded.sends("primary", "refused"), 1);
    let labels = recorded.all_labels();
    assert!(!labels.is_empty());
    for label in labels {
        assert!(
            !label.contains("example") && !label.contains("another") && !label.contains('@'),
            "a label carries a domain or an address: {label}"
        );
    }
}

/// A folder of its own for one test's outbox.
#[cfg(feature = "outbox")]
fn outbox_folder(test: &str) -> std::path::PathBuf {
    let folder = std::env::temp_dir().join(format!(
        "mail-breaker-metrics-{test}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

#[cfg(feature = "outbox")]
#[tokio::test]
async fn an_outbox_worker_counts_each_answer_it_wrote_by_outcome() {
    use mail_breaker::metrics::OUTBOX_SENT_TOTAL;
    let (mut recorded, _guard) = Recorded::start();
    let folder = outbox_folder("answers");
    let outbox = mail_breaker::Outbox::sqlite(folder.join("outbox.db"))
        .await
        .unwrap();
    outbox.enqueue_many(&numbered_messages(3)).await.unwrap();
    let provider = Scripted::new("provider");
    provider.then([
        Reply::Ok,
        Reply::fail(Category::Rejected),
        Reply::fail(Category::Timeout),
    ]);
    outbox
        .worker(provider)
        .concurrency(1)
        .drain()
        .await
        .unwrap();
    for outcome in ["sent", "dead", "retry"] {
        assert_eq!(
            recorded.counter(OUTBOX_SENT_TOTAL, &[("outcome", outcome)]),
            1,
            "{outcome}"
        );
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// Delivers to every recipient but `refused@` (550) and `gone@` (551), whom it rejects.
#[cfg(feature = "outbox")]
struct RefusingOne;

#[cfg(feature = "outbox")]
#[async_trait::async_trait]
impl mail_breaker::Transport for RefusingOne {
    fn name(&self) -> &str {
        "refusing-one"
    }

    async fn send_raw(
        &self,
        envelope: &mail_breaker::Envelope,
        _raw: &[u8],
    ) -> Result<mail_breaker::Receipt, mail_breaker::SendError> {
        let mut receipt = mail_breaker::Receipt::new("refusing-one");
        for to in envelope.to() {
            let code = match to.user() {
                "refused" => "smtp.550",
                "gone" => "smtp.551",
                _ => continue,
            };
            receipt = receipt.with_rejected_recipient(
                to.clone(),
                mail_breaker::SendError::new(Category::Rejected, code, "no such user"),
            );
        }
        Ok(receipt)
    }
}

#[cfg(feature = "outbox")]
#[tokio::test]
async fn an_outbox_worker_counts_each_dead_letter_a_partial_delivery_leaves() {
    use mail_breaker::metrics::OUTBOX_SENT_TOTAL;
    let (mut recorded, _guard) = Recorded::start();
    let folder = outbox_folder("partial");
    let outbox = mail_breaker::Outbox::sqlite(folder.join("outbox.db"))
        .await
        .unwrap();
    let message = mail_breaker::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("now@example.org".parse().unwrap())
        .to("refused@example.org".parse().unwrap())
        .to("gone@example.org".parse().unwrap())
        .body(String::from("hello"))
        .unwrap();
    outbox.enqueue(&message).await.unwrap();
    outbox.worker(RefusingOne).drain().await.unwrap();
    // The row itself is the first dead letter (550), and the 551 one is written beside it.
    assert_eq!(outbox.dead_letters(10).await.unwrap().len(), 2);
    for (outcome, answers) in [("dead", 2), ("retry", 0)] {
        assert_eq!(
            recorded.counter(OUTBOX_SENT_TOTAL, &[("outcome", outcome)]),
            answers,
            "{outcome}"
        );
    }
    let _ = std::fs::remove_dir_all(&folder);
}

#[cfg(feature = "outbox")]
#[tokio::test]
async fn an_outbox_worker_sets_the_gauges_from_the_counts_it_read() {
    use mail_breaker::metrics::{OUTBOX_DEAD, OUTBOX_DUE, OUTBOX_OLDEST_SECONDS, OUTBOX_QUEUED};
    let (mut recorded, _guard) = Recorded::start();
    let folder = outbox_folder("gauges");
    let outbox = mail_breaker::Outbox::sqlite(folder.join("outbox.db"))
        .await
        .unwrap();
    outbox.enqueue_many(&numbered_messages(2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let provider = Scripted::answering("provider", Reply::fail(Category::Rejected));
    // It reads the counts as it starts, before it sends anything.
    outbox.worker(provider).drain().await.unwrap();
    assert_eq!(recorded.gauge(OUTBOX_QUEUED, &[]), 2.0);
    assert_eq!(recorded.gauge(OUTBOX_DUE, &[]), 2.0);
    assert_eq!(recorded.gauge(OUTBOX_DEAD, &[]), 0.0);
    assert!(recorded.gauge(OUTBOX_OLDEST_SECONDS, &[]) >= 0.02);
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn a_rate_limiter_shows_its_rate_from_when_it_is_built_before_any_send() {
    use mail_breaker::metrics::RATE_PER_SECOND;
    let (mut recorded, _guard) = Recorded::start();

    let _limited = mail_breaker::RateLimitTransport::builder(Scripted::new("idle"))
        .per_second(7.0)
        .build()
        .expect("valid settings");

    assert_eq!(
        recorded.gauge(RATE_PER_SECOND, &[("transport", "idle")]),
        7.0,
        "a limiter that has not sent yet shows its rate all the same"
    );
}

/// A factor the limiter follows (a reputation breaker's throttle).
#[derive(Debug, Clone, Default)]
struct Factor(std::sync::Arc<std::sync::Mutex<f64>>);

impl mail_breaker::rate::RateFactor for Factor {
    fn rate_factor(&self) -> f64 {
        *self.0.lock().unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_limiters_gauge_shows_its_rate_times_the_factor_it_follows_after_a_change() {
    use mail_breaker::metrics::RATE_PER_SECOND;
    let (mut recorded, _guard) = Recorded::start();
    let factor = Factor::default();
    *factor.0.lock().unwrap() = 1.0;
    let limited = mail_breaker::RateLimitTransport::builder(Scripted::new("ses"))
        .per_second(8.0)
        .burst(100)
        .slowed_by(factor.clone())
        .build()
        .expect("valid settings");
    limited.send(&message()).await.unwrap();
    *factor.0.lock().unwrap() = 0.5;
    limited.send(&message()).await.unwrap();
    *factor.0.lock().unwrap() = 0.25;
    limited.send(&message()).await.unwrap();
    // Read once: the recorder's reader adds up what each read finds.
    assert_eq!(
        recorded.gauge(RATE_PER_SECOND, &[("transport", "ses")]),
        2.0,
        "the rate times the factor of the last change"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rate_limiter_counts_its_refusals_and_shows_its_rate() {
    use mail_breaker::metrics::{RATE_PER_SECOND, RATE_REFUSED_TOTAL, RATE_WAIT_SECONDS};
    let (mut recorded, _guard) = Recorded::start();
    let provider = Scripted::new("ses");
    provider.then([
        Reply::Ok,
        Reply::Err(mail_breaker::SendError::new(
            Category::RateLimited,
            "ses.throttling",
            "slow down",
        )),
    ]);
    let limited = mail_breaker::RateLimitTransport::builder(provider)
        .per_second(10.0)
        .max_wait(Duration::from_millis(150))
        .adaptive(true)
        .build()
        .unwrap();
    limited.send(&message()).await.unwrap();
    let _ = limited.send(&message()).await; // waits 100 ms, then throttled: 5 a second
    // Set to 10 when built, then to 5: the gauge holds the last.
    assert_eq!(
        recorded.gauge(RATE_PER_SECOND, &[("transport", "ses")]),
        5.0
    );
    // The slot the throttled send took is owed at 5 a second (issue 45, point 12): the next
    // is 200 ms away, 50 ms past the longest wait.
    assert_eq!(
        limited.send(&message()).await.unwrap_err().code(),
        "rate.limited"
    );
    assert_eq!(
        recorded.counter(RATE_REFUSED_TOTAL, &[("transport", "ses")]),
        1
    );
    assert_eq!(
        recorded.histogram(RATE_WAIT_SECONDS, &[("transport", "ses")]),
        [0.0, 0.1]
    );
}

#[test]
fn describe_gives_every_metric_its_description_and_the_durations_their_unit() {
    use mail_breaker::metrics::*;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let counters = [
        SENDS_TOTAL,
        TRANSITIONS_TOTAL,
        POOL_FAILOVERS_TOTAL,
        RETRIES_TOTAL,
        RETRIES_THROTTLED_TOTAL,
        OUTBOX_SENT_TOTAL,
        OUTBOX_WORKER_RESTARTS_TOTAL,
        RATE_REFUSED_TOTAL,
        SUPPRESSED_TOTAL,
    ];
    let gauges = [
        OPEN,
        OUTBOX_QUEUED,
        OUTBOX_DUE,
        OUTBOX_DEAD,
        OUTBOX_OLDEST_SECONDS,
        RATE_PER_SECOND,
        REPUTATION_TIER,
        REPUTATION_HARD_BOUNCE_RATE,
        REPUTATION_COMPLAINT_RATE,
    ];
    let histograms = [SEND_SECONDS, RATE_WAIT_SECONDS];
    metrics::with_local_recorder(&recorder, || {
        describe();
        // A description shows with a series: one of each.
        for name in counters {
            metrics::counter!(name).increment(1);
        }
        for name in gauges {
            metrics::gauge!(name).set(1.0);
        }
        for name in histograms {
            metrics::histogram!(name).record(1.0);
        }
    });
    let described: BTreeMap<String, (Option<metrics::Unit>, String)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, description, _)| {
            let name = key.key().name().to_owned();
            (
                name,
                (unit, description.map(|d| d.to_string()).unwrap_or_default()),
            )
        })
        .collect();
    let every: Vec<&str> = counters
        .iter()
        .chain(&gauges)
        .chain(&histograms)
        .copied()
        .collect();
    for name in every {
        let (unit, description) = described.get(name).cloned().unwrap_or_default();
        assert!(!description.is_empty(), "{name} has no description");
        let seconds = name.ends_with("_seconds");
        assert_eq!(
            unit == Some(metrics::Unit::Seconds),
            seconds,
            "{name}'s unit: {unit:?}"
        );
    }
}

/// Every series recorded, with its value: counters and gauges as written, histograms as the
/// list of their values, so that a comparison sees a series too many as well as one wrong.
fn every_series(recorded: &mut Recorded) -> Vec<(Series, String)> {
    recorded.read();
    let counters = recorded
        .counters
        .iter()
        .map(|(series, count)| (series.clone(), count.to_string()));
    let gauges = recorded
        .gauges
        .iter()
        .map(|(series, value)| (series.clone(), value.to_string()));
    let histograms = recorded
        .histograms
        .iter()
        .map(|(series, values)| (series.clone(), format!("{values:?}")));
    let mut every: Vec<_> = counters.chain(gauges).chain(histograms).collect();
    every.sort();
    every
}

/// `(series, value)` as `every_series` gives it.
fn expect(kind: MetricKind, name: &str, labels: &[(&str, &str)], value: &str) -> (Series, String) {
    (series(kind, name, labels), value.to_owned())
}

#[tokio::test(start_paused = true)]
async fn a_send_of_each_outcome_records_every_metric_with_its_name_labels_and_value() {
    use mail_breaker::metrics::{RATE_PER_SECOND, RATE_REFUSED_TOTAL, RATE_WAIT_SECONDS};
    use mail_breaker::{RateLimitTransport, SendError};
    use metrics_util::MetricKind::{Counter, Gauge, Histogram};
    let (mut recorded, _guard) = Recorded::start();

    // A success, a failure that opens, a refusal: a pool moves on from the refused member.
    let primary = Scripted::new("primary");
    primary.then([Reply::Ok, down_for(Duration::from_secs(2))]);
    let backup = Scripted::new("backup");
    let breaker_of = |inner: &Scripted| {
        CircuitBreakerTransport::builder(inner.clone())
            .failure_threshold(1)
            .reset_timeout(RESET)
            .build()
            .expect("valid settings")
    };
    let pool = PoolTransport::builder()
        .name("outbound")
        .add(breaker_of(&primary), 1)
        .add(breaker_of(&backup), 2)
        .build()
        .expect("a pool with members");
    pool.send(&message()).await.expect("primary delivers");
    pool.send(&message()).await.expect("backup delivers");
    pool.send(&message()).await.expect("backup delivers");

    // Sent without leave in shadow mode: ignored.
    let shadowed = CircuitBreakerTransport::builder(Scripted::answering(
        "shadowed",
        Reply::fail(Category::Network),
    ))
    .failure_threshold(1)
    .shadow(true)
    .build()
    .expect("valid settings");
    for _ in 0..2 {
        shadowed.send(&message()).await.expect_err("down");
    }

    // A retry, then one the budget refuses.
    let budget = Arc::new(RetryBudget::new(20, 5, 10).expect("a valid budget"));
    let retrying = RetryTransport::builder(Scripted::answering(
        "retried",
        Reply::fail(Category::ServerError),
    ))
    .max_attempts(5)
    .backoff(Backoff::constant(Duration::from_secs(1)))
    .budget(budget)
    .build()
    .expect("valid settings");
    retrying.send(&message()).await.expect_err("throttled");

    // A wait, a throttle that halves the rate, a refusal.
    let ses = Scripted::new("ses");
    ses.then([
        Reply::Ok,
        Reply::Err(SendError::new(
            Category::RateLimited,
            "ses.throttling",
            "slow down",
        )),
    ]);
    let limited = RateLimitTransport::builder(ses)
        .name("paced")
        .per_second(10.0)
        .max_wait(Duration::from_millis(150))
        .adaptive(true)
        .build()
        .expect("valid settings");
    limited.send(&message()).await.expect("delivered");
    let _ = limited.send(&message()).await;
    limited.send(&message()).await.expect_err("no slot in time");

    let primary_closed_open = [("transport", "primary"), ("from", "closed"), ("to", "open")];
    let shadowed_closed_open = [
        ("transport", "shadowed"),
        ("from", "closed"),
        ("to", "open"),
    ];
    let mut expected = vec![
        expect(
            Counter,
            SENDS_TOTAL,
            &[("transport", "primary"), ("outcome", "success")],
            "1",
        ),
        expect(
            Counter,
            SENDS_TOTAL,
            &[("transport", "primary"), ("outcome", "failure")],
            "1",
        ),
        expect(
            Counter,
            SENDS_TOTAL,
            &[("transport", "primary"), ("outcome", "refused")],
            "1",
        ),
        expect(
            Counter,
            SENDS_TOTAL,
            &[("transport", "backup"), ("outcome", "success")],
            "2",
        ),
        expect(
            Counter,
            SENDS_TOTAL,
            &[("transport", "shadowed"), ("outcome", "failure")],
            "1",
        ),
        expect(
            Counter,
            SENDS_TOTAL,
            &[("transport", "shadowed"), ("outcome", "ignored")],
            "1",
        ),
        expect(Counter, TRANSITIONS_TOTAL, &primary_closed_open, "1"),
        expect(Counter, TRANSITIONS_TOTAL, &shadowed_closed_open, "1"),
        expect(Gauge, OPEN, &[("transport", "primary")], "1"),
        expect(Gauge, OPEN, &[("transport", "shadowed")], "1"),
        expect(
            Histogram,
            SEND_SECONDS,
            &[("transport", "primary")],
            "[0.0, 2.0]",
        ),
        expect(
            Histogram,
            SEND_SECONDS,
            &[("transport", "backup")],
            "[0.0, 0.0]",
        ),
        expect(
            Histogram,
            SEND_SECONDS,
            &[("transport", "shadowed")],
            "[0.0, 0.0]",
        ),
        expect(
            Counter,
            POOL_FAILOVERS_TOTAL,
            &[("pool", "outbound"), ("from", "primary")],
            "2",
        ),
        expect(Counter, RETRIES_TOTAL, &[("transport", "retried")], "1"),
        expect(
            Counter,
            RETRIES_THROTTLED_TOTAL,
            &[("transport", "retried")],
            "1",
        ),
        expect(
            Histogram,
            RATE_WAIT_SECONDS,
            &[("transport", "paced")],
            "[0.0, 0.1]",
        ),
        expect(Gauge, RATE_PER_SECOND, &[("transport", "paced")], "5"),
        expect(Counter, RATE_REFUSED_TOTAL, &[("transport", "paced")], "1"),
    ];
    expected.sort();
    assert_eq!(every_series(&mut recorded), expected);
}

#[tokio::test(start_paused = true)]
async fn a_recorder_installed_after_the_stack_was_built_receives_its_metrics() {
    use mail_breaker::metrics::{RATE_PER_SECOND, RATE_WAIT_SECONDS};
    let primary = Scripted::answering("primary", Reply::fail(Category::Network));
    let backup = Scripted::new("backup");
    backup.then([Reply::fail(Category::Network)]);
    let stack = RetryTransport::builder(
        PoolTransport::builder()
            .name("outbound")
            .add(breaker(&primary), 1)
            .add(breaker(&backup), 2)
            .build()
            .expect("a pool with members"),
    )
    .backoff(Backoff::constant(Duration::from_secs(1)))
    .build()
    .expect("valid settings");
    let limited = mail_breaker::RateLimitTransport::builder(Scripted::new("ses"))
        .name("paced")
        .per_second(10.0)
        .build()
        .expect("valid settings");

    let (mut recorded, _guard) = Recorded::start();
    stack
        .send(&message())
        .await
        .expect("the backup's second try delivers");
    limited.send(&message()).await.expect("delivered");

    assert_eq!(recorded.sends("primary", "failure"), 2);
    assert_eq!(recorded.sends("backup", "failure"), 1);
    assert_eq!(recorded.sends("backup", "success"), 1);
    assert_eq!(
        recorded.counter(
            POOL_FAILOVERS_TOTAL,
            &[("pool", "outbound"), ("from", "primary")]
        ),
        2
    );
    assert_eq!(
        recorded.counter(RETRIES_TOTAL, &[("transport", "outbound")]),
        1
    );
    assert_eq!(
        recorded.histogram(RATE_WAIT_SECONDS, &[("transport", "paced")]),
        [0.0]
    );
    assert_eq!(
        recorded.gauge(RATE_PER_SECOND, &[("transport", "paced")]),
        10.0,
        "the rate, set at the limiter's first send under the recorder"
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_keeps_recording_into_the_recorder_its_first_send_found() {
    let provider = Scripted::new("primary");
    let breaker = breaker(&provider);
    let (mut first, first_guard) = Recorded::start();
    breaker.send(&message()).await.expect("delivered");
    drop(first_guard);

    let (mut later, _guard) = Recorded::start();
    breaker.send(&message()).await.expect("delivered");

    assert_eq!(first.sends("primary", "success"), 2);
    assert_eq!(later.sends("primary", "success"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_transport_renamed_after_its_first_send_is_counted_under_its_new_name() {
    let (mut recorded, _guard) = Recorded::start();
    let mut breaker = breaker(&Scripted::answering(
        "before",
        Reply::fail(Category::Network),
    ));
    breaker.send(&message()).await.expect_err("down");
    // The breaker's key is the transport's name: "after" starts its own count of three.
    breaker.inner_mut().rename("after");
    for _ in 0..4 {
        let _ = breaker.send(&message()).await;
    }
    let mut retrying = RetryTransport::builder(Scripted::answering(
        "before",
        Reply::fail(Category::Network),
    ))
    .max_attempts(2)
    .backoff(Backoff::constant(Duration::from_secs(1)))
    .build()
    .expect("valid settings");
    retrying.send(&message()).await.expect_err("down");
    retrying.inner_mut().rename("after");
    retrying.send(&message()).await.expect_err("down");

    assert_eq!(recorded.sends("before", "failure"), 1);
    assert_eq!(recorded.sends("after", "failure"), 3);
    assert_eq!(recorded.sends("after", "refused"), 1);
    assert_eq!(recorded.transitions("after", State::Closed, State::Open), 1);
    assert_eq!(recorded.gauge(OPEN, &[("transport", "after")]), 1.0);
    assert_eq!(
        recorded.histogram(SEND_SECONDS, &[("transport", "after")]),
        [0.0, 0.0, 0.0]
    );
    assert_eq!(
        recorded.counter(RETRIES_TOTAL, &[("transport", "before")]),
        1
    );
    assert_eq!(
        recorded.counter(RETRIES_TOTAL, &[("transport", "after")]),
        1
    );
}

#[cfg(feature = "webhooks")]
#[tokio::test]
async fn each_members_bounce_and_complaint_rates_and_tier_are_gauges_labelled_by_the_member() {
    use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, Provider};
    use mail_breaker::metrics::{
        REPUTATION_COMPLAINT_RATE, REPUTATION_HARD_BOUNCE_RATE, REPUTATION_TIER,
    };
    use mail_breaker::reputation::{Limits, ReputationBreaker, ReputationRules};

    let (mut recorded, _guard) = Recorded::start();
    // 10 sends make a volume; warn at 5 %, throttle at 20 %, open at 30 % for both rates.
    let limits = Limits {
        warn: 50_000,
        throttle: 200_000,
        open: 300_000,
        minimum_sends: 10,
    };
    let breaker = |member: &str| {
        ReputationBreaker::builder(member)
            .rules(ReputationRules {
                hard_bounces: limits,
                complaints: limits,
                window_sends: 20,
                buckets: 2,
            })
            .build()
            .unwrap()
    };
    let (ses, postmark) = (breaker("ses"), breaker("postmark"));
    for member in [&ses, &postmark] {
        let transport = member.wrap(Scripted::new(member.member()));
        for _ in 0..10 {
            transport.send(&message()).await.unwrap();
        }
    }
    let heard = |member: &str, kind: EventKind| {
        let mut event = DeliveryEvent::new(
            Provider::Ses,
            format!("{member}-1"),
            kind,
            "someone@example.org",
            std::time::SystemTime::now(),
        );
        event.member = Some(member.into());
        event
    };
    let bounce = EventKind::Bounced {
        bounce: BounceKind::Permanent,
        subtype: None,
    };
    ses.record(&[heard("ses", bounce)]).await.unwrap();
    let complaint = EventKind::Complained { feedback: None };
    postmark
        .record(&[heard("postmark", complaint)])
        .await
        .unwrap();

    let gauge = |recorded: &mut Recorded, name: &str, member: &str| {
        let series = series(MetricKind::Gauge, name, &[("member", member)]);
        recorded.gauges.get(&series).copied()
    };
    recorded.read();
    assert_eq!(
        gauge(&mut recorded, REPUTATION_HARD_BOUNCE_RATE, "ses"),
        Some(0.1)
    );
    assert_eq!(
        gauge(&mut recorded, REPUTATION_COMPLAINT_RATE, "ses"),
        Some(0.0)
    );
    assert_eq!(
        gauge(&mut recorded, REPUTATION_TIER, "ses"),
        Some(1.0),
        "warn"
    );
    assert_eq!(
        gauge(&mut recorded, REPUTATION_COMPLAINT_RATE, "postmark"),
        Some(0.1)
    );
    assert_eq!(
        gauge(&mut recorded, REPUTATION_HARD_BOUNCE_RATE, "postmark"),
        Some(0.0)
    );
}
