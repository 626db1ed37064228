//! Where breakers keep their state: [`BreakerStore`], with [`MemoryStore`] for one process
//! and `RedisStore` (feature `redis`) for a fleet.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::State;
use crate::breaker::{Decision, Outcome, Permit, Rules, Transitions};

mod lru;
pub(crate) mod memory;
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{DEFAULT_IDLE_EXPIRY, DEFAULT_RETRY_INTERVAL, DEFAULT_TIMEOUT, RedisStore};
pub use memory::MemoryStore;

/// The state behind a [`CircuitBreakerTransport`](crate::CircuitBreakerTransport): one
/// breaker [`Machine`](crate::breaker::Machine) per key, and the decisions made on it.
///
/// A store may be shared by several breakers, and by several processes. The breaker asks it
/// for a decision before each send ([`acquire`](BreakerStore::acquire)) and tells it each
/// result ([`record`](BreakerStore::record)) or that a send was abandoned
/// ([`release`](BreakerStore::release)). Each call returns the changes of state it made, so
/// that exactly the caller whose call made a change reports it to its listener.
///
/// # Implementing a store
/// - Each call is atomic for its key: two acquires in half-open never both get the probe.
/// - A store never fails a send: when its backend is unreachable it decides from local state
///   (and says so in its logs), so a store outage never turns the protection off.
/// - Answer a local decision with [`StoreFuture::ready`], which allocates nothing; a remote
///   one with [`StoreFuture::pending`].
///
/// ```
/// use std::sync::Arc;
/// use mail_breaker::{BreakerStore, MemoryStore, State};
/// use mail_breaker::breaker::{Decision, Outcome, Rules};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn BreakerStore> = Arc::new(MemoryStore::new());
/// let rules = Rules::default();
/// let (decision, _) = store.acquire("smtp://relay", &rules).await;
/// let Decision::Send(permit) = decision else { unreachable!() };
/// store.record("smtp://relay", &rules, permit, Outcome::Success).await;
/// assert_eq!(store.state("smtp://relay", &rules).0, State::Closed);
/// # });
/// ```
pub trait BreakerStore: Send + Sync + fmt::Debug {
    /// Decides whether a send for `key` may go now.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
    ) -> StoreFuture<'a, (Decision, Transitions)>;

    /// Counts the result of a send for `key` made with `permit`.
    fn record<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
    ) -> StoreFuture<'a, Transitions>;

    /// Forgets a send whose caller stopped waiting; a probe frees its slot at once. Called
    /// from `Drop`, so it must not block: a remote store sends it in the background.
    fn release(&self, key: &str, permit: Permit);

    /// The state of `key` as this store last knew it, after what time alone does (a probe
    /// past its deadline reopens the breaker), with the changes that made.
    fn state(&self, key: &str, rules: &Rules) -> (State, Transitions);

    /// How many keys the store tracks now.
    fn tracked_keys(&self) -> usize;
}

/// The answer of a [`BreakerStore`]: ready at once, or a future to wait for.
///
/// ```
/// use mail_breaker::store::StoreFuture;
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
