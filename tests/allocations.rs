//! How many heap allocations a send through a breaker makes, counted by a global allocator
//! of this test binary alone. A count is stable where a time is not: a change that adds an
//! allocation to the hot path fails here, on any machine, under any load.
//!
//! The counts are the same with the `metrics` feature and without it: with it, each test
//! first installs a recorder whose handles are atomics (its own recording allocates
//! nothing), so that a send records through handles the breaker, the pool and the retry
//! took at their first send and kept. `.ci/run` runs this binary with the default features,
//! and again with every feature in the whole suite.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mail_breaker::{
    Backoff, Category, CircuitBreakerTransport, Envelope, Message, PoolTransport, Receipt,
    RetryTransport, Scope, SendError, State, Transport,
};

/// Counts the allocations of the thread that makes them, so that tests running beside each
/// other do not count each other's.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: the caller's contract for `layout` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: as for `alloc`; `ptr` was allocated by `System` through this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// A transport that answers every send at once: delivered (one `Receipt`, one allocation
/// for its transport name) or down.
struct Immediate {
    fail: bool,
}

#[async_trait::async_trait]
impl Transport for Immediate {
    fn name(&self) -> &str {
        "immediate"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        if self.fail {
            Err(SendError::new(Category::Network, "test.down", "down"))
        } else {
            Ok(Receipt::new("immediate"))
        }
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        self.send_raw(message.envelope(), b"").await
    }
}

/// Whether [`Switch`] fails: set by the one test that uses it.
static SWITCH_FAILS: AtomicBool = AtomicBool::new(false);

/// [`Immediate`], failing or delivering as [`SWITCH_FAILS`] says.
struct Switch;

#[async_trait::async_trait]
impl Transport for Switch {
    fn name(&self) -> &str {
        "switch"
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let fail = SWITCH_FAILS.load(Ordering::Relaxed);
        Immediate { fail }.send_raw(envelope, raw).await
    }
}

/// The same transport, whose send is an `async fn` of its own that it also gives unboxed
/// ([`Transport::send_raw_unboxed`]), as a transport may for the wrappers around it.
struct Unboxed;

impl Unboxed {
    async fn deliver(&self) -> Result<Receipt, SendError> {
        Ok(Receipt::new("unboxed"))
    }
}

#[async_trait::async_trait]
impl Transport for Unboxed {
    fn name(&self) -> &str {
        "unboxed"
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        self.deliver().await
    }

    fn send_raw_unboxed<'a>(
        &'a self,
        _envelope: &'a Envelope,
        _raw: &'a [u8],
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
        self.deliver()
    }
}

const ROUNDS: u64 = 1_000;

/// The allocations of one `send_raw` of each envelope through `transport`, averaged over
/// [`ROUNDS`] rounds after one round to warm up; the thread's own count, on one thread.
fn per_send(transport: &dyn Transport, envelopes: &[Envelope]) -> f64 {
    recorder::install();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        for envelope in envelopes {
            let _ = transport.send_raw(envelope, b"hello").await;
        }
        let before = allocations();
        for _ in 0..ROUNDS {
            for envelope in envelopes {
                let _ = transport.send_raw(envelope, b"hello").await;
            }
        }
        (allocations() - before) as f64 / (ROUNDS * envelopes.len() as u64) as f64
    })
}

fn envelope_to(to: &str) -> Envelope {
    Envelope::new(
        Some("app@example.com".parse().expect("a valid sender")),
        vec![to.parse().expect("a valid recipient")],
    )
    .expect("a valid envelope")
}

/// What the bare transport allocates per send: its future (boxed by `async_trait`) and its
/// receipt. The breaker's own cost is counted above it.
fn bare() -> f64 {
    per_send(
        &Immediate { fail: false },
        &[envelope_to("user@example.org")],
    )
}

#[test]
fn the_bare_transport_allocates_its_future_and_its_receipt() {
    assert_eq!(bare(), 2.0);
}

#[test]
fn a_closed_send_allocates_only_the_breakers_own_future() {
    let breaker = CircuitBreakerTransport::new(Immediate { fail: false });
    let sent = per_send(&breaker, &[envelope_to("user@example.org")]);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(sent - bare(), 1.0, "{sent} allocations per closed send");
    recorder::saw_at_least(
        "mail_breaker_sends_total{transport=immediate,outcome=success}",
        ROUNDS,
    );
}

#[test]
fn a_closed_send_over_a_transport_that_gives_its_future_unboxed_allocates_no_more_than_the_bare_send()
 {
    let bare = per_send(&Unboxed, &[envelope_to("user@example.org")]);
    assert_eq!(bare, 2.0, "the bare send's own future and receipt");
    let breaker = CircuitBreakerTransport::new(Unboxed);
    let sent = per_send(&breaker, &[envelope_to("user@example.org")]);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(sent, bare, "{sent} allocations per closed send");
}

#[test]
fn a_refusal_allocates_only_the_breakers_own_future() {
    recorder::install();
    let breaker = CircuitBreakerTransport::new(Immediate { fail: true });
    let envelope = [envelope_to("user@example.org")];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        for _ in 0..5 {
            let _ = breaker.send_raw(&envelope[0], b"hello").await;
        }
    });
    assert_eq!(breaker.state(), State::Open);
    let refused = per_send(&breaker, &envelope);
    assert_eq!(refused, 1.0, "{refused} allocations per refusal");
    recorder::saw_at_least(
        "mail_breaker_sends_total{transport=immediate,outcome=refused}",
        ROUNDS,
    );
}

#[test]
fn a_send_to_a_tracked_domain_allocates_only_the_breakers_own_future() {
    recorder::install();
    let breaker = CircuitBreakerTransport::builder(Switch)
        .scope(Scope::RecipientDomain)
        .build()
        .expect("a valid breaker");
    // The first domain a store sees is kept apart; the others share its bounded map, which
    // keeps a domain from its first failure: one each, too few to open its breaker.
    let envelopes: Vec<Envelope> = (0..50)
        .map(|i| envelope_to(&format!("user@d{i}.example")))
        .collect();
    SWITCH_FAILS.store(true, Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        for envelope in &envelopes {
            assert!(breaker.send_raw(envelope, b"hello").await.is_err());
        }
    });
    SWITCH_FAILS.store(false, Ordering::Relaxed);
    assert_eq!(breaker.tracked_keys(), 50);
    let sent = per_send(&breaker, &envelopes);
    assert_eq!(breaker.tracked_keys(), 50);
    assert_eq!(breaker.state_of("d49.example"), State::Closed);
    assert_eq!(
        sent - per_send(&Switch, &envelopes),
        1.0,
        "{sent} allocations per domain-scoped send"
    );
}

/// A breaker per recipient domain over `inner`, keeping at most `max_keys`.
fn domain_breaker<T: Transport>(inner: T, max_keys: usize) -> CircuitBreakerTransport<T> {
    CircuitBreakerTransport::builder(inner)
        .scope(Scope::RecipientDomain)
        .max_keys(max_keys)
        .build()
        .expect("a valid breaker")
}

/// Envelopes to 1,000 domains of one length.
fn thousand_domains() -> Vec<Envelope> {
    (0..1_000)
        .map(|i| envelope_to(&format!("user@d{i:04}.example")))
        .collect()
}

#[test]
fn a_send_to_a_domain_the_breaker_does_not_track_allocates_only_the_breakers_own_future() {
    let breaker = domain_breaker(Immediate { fail: false }, 100);
    // Domains that only succeed take no place in the map: each send decides on a new
    // breaker and keeps nothing.
    let envelopes = thousand_domains();
    let sent = per_send(&breaker, &envelopes);
    assert_eq!(breaker.tracked_keys(), 1, "the first domain, kept apart");
    assert_eq!(
        sent - bare(),
        1.0,
        "{sent} allocations per send of an untracked domain"
    );
}

#[test]
fn failing_domains_churning_through_a_full_map_allocate_no_keys() {
    recorder::install();
    let breaker = domain_breaker(Immediate { fail: true }, 100);
    // 1,000 domains of one length through 100 places, one failure each (too few to open a
    // breaker): every send forgets one and keeps a new one in the forgotten one's buffer.
    let envelopes = thousand_domains();
    // The first domain, kept apart from the map and never forgotten, is not one of them:
    // its failures would add up until it opened.
    let _ = per_send(&breaker, &[envelope_to("user@first.example")]);
    let failed = per_send(&breaker, &envelopes);
    assert_eq!(breaker.tracked_keys(), 100);
    assert_eq!(breaker.state_of("d0999.example"), State::Closed);
    let bare = per_send(&Immediate { fail: true }, &envelopes);
    assert_eq!(
        failed - bare,
        1.0,
        "{failed} allocations per failed send of a new domain"
    );
}

/// Fails every other send (the first, the third, ...): retried once, each send delivers.
struct EveryOther {
    sends: AtomicU64,
}

#[async_trait::async_trait]
impl Transport for EveryOther {
    fn name(&self) -> &str {
        "every-other"
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let fail = self.sends.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
        Immediate { fail }.send_raw(envelope, raw).await
    }
}

/// A pool of two breakers: `first` (which never opens) and a member that delivers.
fn pool_over(first: Immediate) -> PoolTransport {
    let first = CircuitBreakerTransport::builder(first)
        .failure_threshold(u32::MAX)
        .build()
        .expect("a valid breaker");
    let second = CircuitBreakerTransport::new(Unboxed);
    PoolTransport::builder()
        .name("outbound")
        .add(first, 1)
        .add(second, 2)
        .build()
        .expect("a pool with members")
}

#[test]
fn a_send_through_a_retry_around_a_pool_of_breakers_allocates_only_their_futures_and_the_order() {
    let stack = RetryTransport::new(pool_over(Immediate { fail: false }));
    let sent = per_send(&stack, &[envelope_to("user@example.org")]);
    // The retry's future, the pool's future and its order of members, the breaker's future.
    assert_eq!(
        sent - bare(),
        4.0,
        "{sent} allocations per send through the stack"
    );
    recorder::saw_at_least(
        "mail_breaker_sends_total{transport=immediate,outcome=success}",
        ROUNDS,
    );
}

#[test]
fn a_send_that_fails_over_allocates_only_the_futures_the_order_and_the_first_members_error() {
    let pool = pool_over(Immediate { fail: true });
    let sent = per_send(&pool, &[envelope_to("user@example.org")]);
    assert_eq!(
        sent, FAILED_OVER,
        "{sent} allocations per send that fails over"
    );
    recorder::saw_at_least(
        "mail_breaker_pool_failovers_total{pool=outbound,from=immediate}",
        ROUNDS,
    );
}

/// The allocations of a send that fails over, as the default build (which records nothing)
/// counted them: the pool's future, its order of members and its list of errors, the first
/// breaker's future, its transport's future and error, the second breaker's future, its
/// transport's future and receipt.
const FAILED_OVER: f64 = 9.0;

#[test]
fn a_send_retried_once_allocates_only_the_futures_and_the_first_tries_error() {
    let retrying = RetryTransport::builder(EveryOther {
        sends: AtomicU64::new(0),
    })
    .backoff(Backoff::constant(Duration::ZERO))
    .build()
    .expect("valid settings");
    let sent = per_send(&retrying, &[envelope_to("user@example.org")]);
    assert_eq!(sent, RETRIED, "{sent} allocations per send retried once");
    recorder::saw_at_least("mail_breaker_retries_total{transport=every-other}", ROUNDS);
}

/// The allocations of a send retried once, as the default build counted them: the retry's
/// future, and each try's future with its error or receipt, and what the retry's wait and
/// its error's clone for the log take.
const RETRIED: f64 = 8.0;

/// The recorder of the `metrics` build: every handle an atomic, registered once per series.
#[cfg(feature = "metrics")]
mod recorder {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, Once, PoisonError};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };

    /// One series: a counter's count, a gauge's value (as `f64` bits), or how many values
    /// a histogram took.
    #[derive(Default)]
    struct Series(AtomicU64);

    impl CounterFn for Series {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::Relaxed);
        }

        fn absolute(&self, value: u64) {
            self.0.fetch_max(value, Ordering::Relaxed);
        }
    }

    impl GaugeFn for Series {
        fn increment(&self, value: f64) {
            let _ = self
                .0
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    Some((f64::from_bits(bits) + value).to_bits())
                });
        }

        fn decrement(&self, value: f64) {
            GaugeFn::increment(self, -value);
        }

        fn set(&self, value: f64) {
            self.0.store(value.to_bits(), Ordering::Relaxed);
        }
    }

    impl HistogramFn for Series {
        fn record(&self, _value: f64) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The series by `name{label=value,...}`.
    #[derive(Default)]
    struct Atomics {
        series: Mutex<HashMap<String, Arc<Series>>>,
    }

    impl Atomics {
        fn series(&self, key: &Key) -> Arc<Series> {
            let labels: Vec<String> = key
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(series.entry(name).or_default())
        }
    }

    impl Recorder for Atomics {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.series(key))
        }

        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(self.series(key))
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.series(key))
        }
    }

    static RECORDER: std::sync::OnceLock<&'static Atomics> = std::sync::OnceLock::new();
    static INSTALLED: Once = Once::new();

    /// Installs the recorder for the whole binary, before the test's first send.
    pub fn install() {
        INSTALLED.call_once(|| {
            let recorder: &'static Atomics = Box::leak(Box::default());
            metrics::set_global_recorder(recorder).expect("the only recorder");
            let _ = RECORDER.set(recorder);
        });
    }

    /// Asserts that `series` counted at least `count`: the sends above were recorded.
    pub fn saw_at_least(series: &str, count: u64) {
        let recorder = RECORDER.get().expect("the recorder, installed");
        let seen = recorder
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(series)
            .map_or(0, |series| series.0.load(Ordering::Relaxed));
        assert!(seen >= count, "{series} counted {seen}, not {count}");
    }
}

/// Without the `metrics` feature nothing is recorded: nothing to install, nothing to read.
#[cfg(not(feature = "metrics"))]
mod recorder {
    pub fn install() {}

    pub fn saw_at_least(_series: &str, _count: u64) {}
}
