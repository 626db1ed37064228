//! Where breakers keep their state: [`BreakerStore`], with [`MemoryStore`] for one process
//! and `RedisStore` (feature `redis`) for a fleet.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::State;
use crate::machine::{Decision, Outcome, Permit, Rules, Snapshot, Transitions};

mod lru;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{
    DEFAULT_IDLE_EXPIRY, DEFAULT_RETRY_INTERVAL, DEFAULT_TIMEOUT, MAX_EXPIRY, RedisStore,
};
pub use memory::MemoryStore;

/// The state behind a [`CircuitBreakerTransport`](crate::CircuitBreakerTransport): one
/// breaker [`Machine`](crate::machine::Machine) per key, and the decisions made on it.
///
/// A store may be shared by several breakers, and by several processes. The breaker asks it
/// for a decision before each send ([`acquire`](BreakerStore::acquire)) and tells it each
/// result ([`record`](BreakerStore::record)) or that a send was abandoned
/// ([`release`](BreakerStore::release)). Each call returns the changes of state it made, so
/// that exactly the caller whose call made a change reports it to its listener.
///
/// The crate has two: [`MemoryStore`] (the default, one process) and `RedisStore`
/// (feature `redis`, a fleet). Write your own to keep breakers elsewhere (another shared
/// database) or to watch the decisions (metrics).
///
/// # What the breaker does
/// - For each send it calls `acquire` once per key of the message (one under
///   [`Scope::Transport`](crate::Scope::Transport), one per recipient domain under
///   [`Scope::RecipientDomain`](crate::Scope::RecipientDomain)), in order, and stops at the
///   first refusal.
/// - Each [`Permit`] it was given goes back to the same store with the same key exactly
///   once: through `record` with the send's [`Outcome`] when the send answered, or through
///   `release` when it did not (its caller dropped the future, another key refused the
///   message, or a batch was abandoned). `release` is called from `Drop`.
/// - It passes the same [`Rules`] and [`Reporter`] with every call, and reports every
///   [`Transitions`] it is given, returned or through the reporter, to the listener and
///   the logs.
///
/// # Implementing a store
/// - **Atomic per key.** Each call decides on the key's state as one step: two acquires in
///   half-open never both get the probe, and two results never both close the breaker.
/// - **The rules of [`Machine`](crate::machine::Machine).** A store that keeps state in
///   this process holds one `Machine` per key and calls its methods (as [`MemoryStore`]
///   does). A store that keeps it elsewhere restates them (as `RedisStore`'s script does);
///   the crate's `tests/store_scenarios.rs` runs one table of scenarios against each store.
/// - **Permits are the store's.** The breaker never looks inside a permit; build them with
///   [`Permit::new`] from whatever period and probe numbers the store keeps, and use the
///   period to ignore results from an earlier period. A store may use the period's bits to
///   tell its own permits apart (`RedisStore` marks the permits of its local fallback).
/// - **Transitions once.** Return exactly the changes of state that this call made, and no
///   change that another caller made, or listeners hear a change twice or never. A change
///   that a call made but could not return (its caller went away; the store stopped waiting
///   for a remote answer that came later) goes to the call's [`Reporter`].
/// - **Never fail a send.** When the backend cannot be reached, decide from local state and
///   say so in the logs, once; a store outage must not turn the protection off, nor make a
///   send wait longer than the store's timeout.
/// - **Never block.** `release`, `state` and `tracked_keys` are synchronous: answer from
///   memory, and send anything remote in the background (`tokio::spawn` when
///   [`tokio::runtime::Handle::try_current`] finds a runtime).
/// - Answer a local decision with [`StoreFuture::ready`], which allocates nothing; a remote
///   one with [`StoreFuture::pending`].
///
/// # Example
/// Using a store directly:
/// ```
/// use std::sync::Arc;
/// use mail_breaker::{BreakerStore, MemoryStore, State};
/// use mail_breaker::breaker::{Decision, Outcome, Rules};
/// use mail_breaker::store::Reporter;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn BreakerStore> = Arc::new(MemoryStore::new());
/// let rules = Rules::default();
/// let late = Reporter::none();
/// let (decision, _) = store.acquire("smtp://relay", &rules, &late).await;
/// let Decision::Send(permit) = decision else { unreachable!() };
/// store.record("smtp://relay", &rules, permit, Outcome::Success, &late).await;
/// assert_eq!(store.state("smtp://relay", &rules).0, State::Closed);
/// # });
/// ```
///
/// A store of your own, here one that counts refusals and lets a [`MemoryStore`] decide:
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use mail_breaker::{BreakerStore, CircuitBreakerTransport, LettreTransport, MemoryStore, State};
/// use mail_breaker::breaker::{Decision, Outcome, Permit, Rules, Transitions};
/// use mail_breaker::store::{Reporter, StoreFuture};
/// # use lettre::transport::stub::AsyncStubTransport;
///
/// #[derive(Debug, Default)]
/// struct CountingStore {
///     inner: MemoryStore,
///     refused: AtomicU64,
/// }
///
/// impl BreakerStore for CountingStore {
///     fn acquire<'a>(&'a self, key: &'a str, rules: &'a Rules, late: &'a Reporter)
///         -> StoreFuture<'a, (Decision, Transitions)> {
///         StoreFuture::pending(async move {
///             let (decision, transitions) = self.inner.acquire(key, rules, late).await;
///             if let Decision::Refuse { .. } = decision {
///                 self.refused.fetch_add(1, Ordering::Relaxed);
///             }
///             (decision, transitions)
///         })
///     }
///     fn record<'a>(&'a self, key: &'a str, rules: &'a Rules, permit: Permit,
///                   outcome: Outcome, late: &'a Reporter) -> StoreFuture<'a, Transitions> {
///         self.inner.record(key, rules, permit, outcome, late)
///     }
///     fn release(&self, key: &str, rules: &Rules, permit: Permit, late: &Reporter) {
///         self.inner.release(key, rules, permit, late)
///     }
///     fn state(&self, key: &str, rules: &Rules) -> (State, Transitions) {
///         self.inner.state(key, rules)
///     }
///     fn tracked_keys(&self) -> usize {
///         self.inner.tracked_keys()
///     }
/// }
///
/// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let store = Arc::new(CountingStore::default());
/// let breaker = CircuitBreakerTransport::builder(transport)
///     .store(store.clone())
///     .build()
///     .unwrap();
/// ```
pub trait BreakerStore: Send + Sync + fmt::Debug {
    /// Decides whether a send for `key` may go now, and as the probe or not. Returns the
    /// decision and the changes of state this call made (open to half-open, or a probe past
    /// its deadline reopening the breaker). A remote store whose caller stopped waiting, or
    /// that gave up waiting itself, reports what the call made to `late` when it learns it.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)>;

    /// Counts the result of a send for `key` made with `permit`, which this store gave. A
    /// permit from an earlier period counts for nothing. Returns the changes this call made;
    /// those a remote store learns of only after it stopped waiting go to `late`.
    fn record<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions>;

    /// Forgets a send whose caller stopped waiting; a probe frees its slot at once, unless
    /// its deadline has passed, when the breaker reopens from that deadline (see
    /// [`Machine::release`](crate::machine::Machine::release)). Called from `Drop`, so it
    /// must not block: a remote store sends it in the background. Every change of state it
    /// makes goes to `late`, at once or when the background call answers.
    fn release(&self, key: &str, rules: &Rules, permit: Permit, late: &Reporter);

    /// The state of `key` as this store last knew it, after what time alone does (a probe
    /// past its deadline reopens the breaker), with the changes that made. A key the store
    /// does not know is closed. Must not block: a remote store answers from what it last saw.
    fn state(&self, key: &str, rules: &Rules) -> (State, Transitions);

    /// How many keys the store keeps in this process now.
    fn tracked_keys(&self) -> usize;

    /// What the breaker of `key` knows, for an operator (see [`Snapshot`]), after what time
    /// alone does; changes that makes go to `late`. Never fails: a remote store that cannot
    /// be reached answers from local state.
    ///
    /// The default answers from [`state`](Self::state) alone, with nothing counted.
    fn snapshot<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Snapshot> {
        let (state, transitions) = self.state(key, rules);
        late.report(key, transitions);
        StoreFuture::ready(Snapshot::new(key, state, false, 0, 0, None, None, 0))
    }

    /// A snapshot of every key the store tracks (a remote store: every key it holds in the
    /// backend). The default knows of none.
    fn snapshots<'a>(
        &'a self,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Vec<Snapshot>> {
        let _ = (rules, late);
        StoreFuture::ready(Vec::new())
    }

    /// Holds the breaker of `key` open until [`reset`](Self::reset): see
    /// [`Machine::isolate`](crate::machine::Machine::isolate). Returns the changes it made.
    /// A remote store that cannot be reached isolates locally and logs a warning.
    ///
    /// The default cannot isolate: it logs a warning and changes nothing.
    fn isolate<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        let _ = (rules, late);
        tracing::warn!(key, store = ?self, "store.isolate_unsupported: this store cannot isolate a breaker");
        StoreFuture::ready(Transitions::NONE)
    }

    /// [`acquire`](Self::acquire) for `key` of the breaker named `breaker` (its transport's
    /// name), which also refuses with [`Decision::Isolated`] while that breaker is isolated
    /// as a whole ([`isolate_breaker`](Self::isolate_breaker)), whatever the key: a key
    /// first seen after the isolation is refused too. The breaker calls this one.
    ///
    /// The default knows no isolation of a whole breaker and asks `acquire`.
    fn acquire_in<'a>(
        &'a self,
        breaker: &'a str,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        let _ = breaker;
        self.acquire(key, rules, late)
    }

    /// Isolates the breaker named `breaker` as a whole: every key, also one first seen
    /// later, is refused by [`acquire_in`](Self::acquire_in) until
    /// [`lift_isolation`](Self::lift_isolation). Says what the change reached, or why the
    /// store could not make it for everyone sharing it (a remote store then isolates in
    /// this process, as it does for a key it cannot reach).
    ///
    /// The default cannot: an error, and nothing changes.
    fn isolate_breaker<'a>(
        &'a self,
        breaker: &'a str,
    ) -> StoreFuture<'a, Result<Reach, crate::SendError>> {
        let _ = breaker;
        StoreFuture::ready(Err(whole_breaker_unsupported(self)))
    }

    /// Lifts the isolation of the breaker named `breaker` as a whole, for every key. Says
    /// what it reached, as [`isolate_breaker`](Self::isolate_breaker) does.
    ///
    /// The default cannot: an error, and nothing changes.
    fn lift_isolation<'a>(
        &'a self,
        breaker: &'a str,
    ) -> StoreFuture<'a, Result<Reach, crate::SendError>> {
        let _ = breaker;
        StoreFuture::ready(Err(whole_breaker_unsupported(self)))
    }

    /// Closes the breaker of `key`, clears its counts and lifts its isolation: see
    /// [`Machine::reset`](crate::machine::Machine::reset). Returns the changes it made.
    ///
    /// The default cannot reset: it logs a warning and changes nothing.
    fn reset<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        let _ = (rules, late);
        tracing::warn!(key, store = ?self, "store.reset_unsupported: this store cannot reset a breaker");
        StoreFuture::ready(Transitions::NONE)
    }
}

/// What an isolation or reset by hand reached
/// ([`try_isolate`](crate::CircuitBreakerTransport::try_isolate),
/// [`try_reset`](crate::CircuitBreakerTransport::try_reset)): every process sharing the
/// store, or this one alone, whose breakers no other process reads.
///
/// ```
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, Reach};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// // The default store lives in this process's memory.
/// let breaker = CircuitBreakerTransport::new(stub);
/// match breaker.try_isolate().await {
///     Ok(Reach::Fleet) => println!("isolated for every process sharing the store"),
///     Ok(Reach::ThisProcess) => println!("isolated in this process only"),
///     Err(error) => println!("the store could not be reached: {error}"),
/// }
/// assert_eq!(breaker.try_reset().await.unwrap(), Reach::ThisProcess);
/// # });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reach {
    /// Every process that shares the store (a `RedisStore` that answered).
    Fleet,
    /// This process alone: its store is in its own memory.
    ThisProcess,
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reach::Fleet => "every process sharing the store",
            Reach::ThisProcess => "this process only",
        })
    }
}

#[cfg(test)]
#[test]
fn a_reach_says_in_words_whom_a_change_reached() {
    assert_eq!(Reach::Fleet.to_string(), "every process sharing the store");
    assert_eq!(Reach::ThisProcess.to_string(), "this process only");
}

/// The error of a store that cannot isolate or reset a breaker as a whole.
fn whole_breaker_unsupported<S: fmt::Debug + ?Sized>(store: &S) -> crate::SendError {
    tracing::warn!(store = ?store, "store.isolate_unsupported: this store cannot isolate a breaker as a whole");
    crate::SendError::fixed(
        crate::Category::Configuration,
        "store.unsupported",
        "this breaker store cannot isolate or reset a breaker as a whole: nothing was changed",
    )
}

/// Where a [`BreakerStore`] reports the changes of state that a call made but could not
/// return: a release (called from `Drop`), or a remote call whose answer came after its
/// caller stopped waiting. The breaker gives each call one that tells its listener and its
/// logs, so that every change is heard exactly once.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use mail_breaker::State;
/// use mail_breaker::breaker::{Transition, Transitions};
/// use mail_breaker::store::Reporter;
///
/// let heard = Arc::new(Mutex::new(Vec::new()));
/// let sink = Arc::clone(&heard);
/// let late = Reporter::new(move |key, transitions| {
///     sink.lock().unwrap().extend(transitions.iter().map(|t| (key.to_owned(), t.to)));
/// });
/// let mut reopened = Transitions::NONE;
/// reopened.push(Transition { from: State::HalfOpen, to: State::Open });
/// late.report("smtp://relay", reopened);
/// assert_eq!(*heard.lock().unwrap(), [("smtp://relay".to_owned(), State::Open)]);
/// ```
#[derive(Clone, Default)]
pub struct Reporter {
    report: Option<Arc<ReportFn>>,
}

/// What a [`Reporter`] calls with a key and its changes.
type ReportFn = dyn Fn(&str, Transitions) + Send + Sync;

impl Reporter {
    /// A reporter that hands each key's changes to `report`.
    pub fn new(report: impl Fn(&str, Transitions) + Send + Sync + 'static) -> Self {
        Reporter {
            report: Some(Arc::new(report)),
        }
    }

    /// A reporter that drops what it is told (for using a store directly).
    pub fn none() -> Self {
        Reporter::default()
    }

    /// Reports the changes `transitions` of the breaker of `key`; nothing if there are none.
    pub fn report(&self, key: &str, transitions: Transitions) {
        if let Some(report) = &self.report
            && !transitions.is_empty()
        {
            report(key, transitions);
        }
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("reports", &self.report.is_some())
            .finish()
    }
}

/// The answer of a [`BreakerStore`]: ready at once, or a future to wait for.
///
/// ```
/// use mail_breaker::store::{Reporter, StoreFuture};
///
/// # futures::executor::block_on(async {
/// assert_eq!(StoreFuture::ready(7).await, 7);
/// assert_eq!(StoreFuture::pending(async { 8 }).await, 8);
/// # });
/// ```
pub struct StoreFuture<'a, T> {
    inner: Inner<'a, T>,
}

enum Inner<'a, T> {
    Ready(Option<T>),
    Pending(BoxFuture<'a, T>),
}

impl<'a, T> StoreFuture<'a, T> {
    /// An answer known now; allocates nothing.
    pub fn ready(value: T) -> Self {
        StoreFuture {
            inner: Inner::Ready(Some(value)),
        }
    }

    /// An answer still to come.
    pub fn pending(future: impl Future<Output = T> + Send + 'a) -> Self {
        StoreFuture {
            inner: Inner::Pending(Box::pin(future)),
        }
    }
}

impl<T> Future for StoreFuture<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Neither variant is structurally pinned: the boxed future is pinned on the heap.
        let this = Pin::into_inner(self);
        match &mut this.inner {
            Inner::Ready(value) => match value.take() {
                Some(value) => Poll::Ready(value),
                None => panic!("StoreFuture polled after it completed"),
            },
            Inner::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> Unpin for StoreFuture<'_, T> {}

impl<T> fmt::Debug for StoreFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.inner {
            Inner::Ready(_) => "ready",
            Inner::Pending(_) => "pending",
        };
        f.debug_struct("StoreFuture").field("kind", &kind).finish()
    }
}
