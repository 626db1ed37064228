//! The circuit breaker: stops sending to a provider that keeps failing, answers at once while
//! it is down, and lets one probe through to learn whether it is back.

use std::fmt;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;

use crate::{Envelope, Message, MessageStream, Receipt, ReceiptStream, SendError, Transport};

mod batch;
mod builder;
mod events;
mod future;
pub(crate) mod gate;
mod operate;
mod recording;
#[cfg(test)]
mod refusal_tests;
mod scope;

/// The pure core, kept under its first-round path: `breaker::machine::Machine` still names it.
pub use crate::machine;
pub use crate::machine::{
    Counting, Decision, ErrorRate, Machine, Outcome, Permit, Rules, Snapshot, State, Transition,
    Transitions,
};
pub use builder::CircuitBreakerBuilder;
pub use events::{RecentChange, StateChange};
pub use scope::Scope;

use future::LocalSend;
use gate::Gate;

/// The future of one send, as `async_trait` spells it.
pub(crate) type BoxedSend<'a> =
    Pin<Box<dyn Future<Output = Result<Receipt, SendError>> + Send + 'a>>;

/// A [`Transport`] that stops sending to a provider that keeps failing.
///
/// - **closed**: every send goes through. An error that passes `is_failure` (by default a
///   Network, Timeout, ServerError or ServiceUnavailable error) is a failure; any other
///   result starts the count again.
/// - **open**: after `failure_threshold` failures in a row (or a failure rate, with
///   [`error_rate`](CircuitBreakerBuilder::error_rate)), sends are answered at once with a
///   `breaker.open` error (ServiceUnavailable) whose `retry_after` is the time left.
/// - **half-open**: once `reset_timeout` has passed, the next send goes through as the one
///   probe; the others are refused. Enough successful probes close the breaker; a failed
///   probe, or one that has not answered within `probe_timeout`, opens it again.
///
/// A result counts only in the period of the breaker it was sent in: a late answer from before
/// the breaker opened or closed changes nothing. A probe whose caller drops its future frees
/// the probe slot at once. [`verify`](Transport::verify) is never guarded.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, State, Transport};
/// use lettre::transport::stub::AsyncStubTransport;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let breaker = CircuitBreakerTransport::builder(provider)
///     .failure_threshold(3)
///     .reset_timeout(Duration::from_secs(30))
///     .on_state_change(|change| println!("{} -> {}", change.from, change.to))
///     .build()
///     .unwrap();
///
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// breaker.send(&message).await.unwrap();
/// assert_eq!(breaker.state(), State::Closed);
/// # });
/// ```
pub struct CircuitBreakerTransport<T> {
    inner: T,
    gate: Gate,
}

impl<T: Transport> CircuitBreakerTransport<T> {
    /// A breaker with the default settings: 5 failures in a row, 30 s reset and probe timeouts.
    pub fn new(inner: T) -> Self {
        match CircuitBreakerBuilder::new(inner).build() {
            Ok(breaker) => breaker,
            Err(never) => unreachable!("the default settings are valid: {never}"),
        }
    }

    /// A builder to set each setting.
    pub fn builder(inner: T) -> CircuitBreakerBuilder<T> {
        CircuitBreakerBuilder::new(inner)
    }

    /// The rules, store and listener it decides with (the tower layer's).
    #[cfg(feature = "tower")]
    pub(crate) fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The state of the breaker under [`Scope::Transport`].
    pub fn state(&self) -> State {
        self.state_of(self.inner.name())
    }

    /// The state of the breaker for `key` under another scope (e.g. a recipient domain,
    /// lower-cased). A key the store does not track is closed.
    pub fn state_of(&self, key: &str) -> State {
        let (state, transitions) = self.gate.store.state(key, &self.gate.rules);
        self.gate.announce(self.inner.name(), key, transitions);
        state
    }

    /// How many breakers the store tracks now, within its bound. With the in-process store,
    /// a key is tracked from its first failure (from its first send when counting an
    /// [`error_rate`](crate::breaker::CircuitBreakerBuilder::error_rate), where every result
    /// counts). A key never tracked, such as a domain whose sends only succeed, has a new,
    /// closed breaker.
    pub fn tracked_keys(&self) -> usize {
        self.gate.store.tracked_keys()
    }

    /// The rules the breaker decides by.
    pub fn rules(&self) -> &Rules {
        &self.gate.rules
    }

    /// The transport it guards.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The transport it guards, mutably.
    pub fn inner_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The transport it guards, dropping the breaker.
    pub fn into_inner(self) -> T {
        self.inner
    }

    /// The future of a send through `send`, if the breaker gives leave, counted after.
    ///
    /// Boxed here, as `async_trait` would box it, but as the gate's own future rather than an
    /// `async` block around it: one layer of future less, whose every poll would move the
    /// send's result once more. On the breaker's own memory store, that future is written by
    /// hand ([`LocalSend`]). The inner send `send` makes is polled inside it, unboxed when the
    /// transport gives it so ([`Transport::send_unboxed`]).
    fn guarded<'a, F>(
        &'a self,
        envelope: &'a Envelope,
        send: impl FnOnce() -> F + Send + 'a,
    ) -> BoxedSend<'a>
    where
        F: Future<Output = Result<Receipt, SendError>> + Send + 'a,
    {
        let (gate, transport) = (&self.gate, self.inner.name());
        match &gate.memory {
            Some(memory) => {
                boxed_in_place(|| LocalSend::new(gate, memory, transport, envelope, send))
            }
            None => boxed_in_place(|| gate.guard_shared(transport, envelope, send)),
        }
    }
}

/// Boxes the future `make` makes, written straight into its box once that is allocated:
/// `Box::pin(future)` builds the future on the stack and copies it over (for the breaker's
/// own, 184 bytes by a `memcpy` call, about 20 instructions of every send).
#[inline(always)]
fn boxed_in_place<'a, F>(make: impl FnOnce() -> F) -> BoxedSend<'a>
where
    F: Future<Output = Result<Receipt, SendError>> + Send + 'a,
{
    let slot: Box<MaybeUninit<F>> = Box::new_uninit();
    let boxed: Box<F> = Box::write(slot, make());
    Box::into_pin(boxed)
}

#[async_trait::async_trait]
impl<T: Transport> Transport for CircuitBreakerTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    // `send_raw` and `send` spelled as `async_trait` spells them, to return the gate's future
    // boxed as it is (see `guarded`).

    fn send_raw<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        envelope: &'life1 Envelope,
        raw: &'life2 [u8],
    ) -> BoxedSend<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        self.guarded(envelope, move || self.inner.send_raw_unboxed(envelope, raw))
    }

    fn send<'life0, 'life1, 'async_trait>(
        &'life0 self,
        message: &'life1 Message,
    ) -> BoxedSend<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.guarded(message.envelope(), move || self.inner.send_unboxed(message))
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        batch::send_many(&self.inner, &self.gate, messages)
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.inner.verify().await
    }
}

crate::transport::lettre_async_transport!(CircuitBreakerTransport<T>, T);

impl<T: fmt::Debug> fmt::Debug for CircuitBreakerTransport<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerTransport")
            .field("inner", &self.inner)
            .field("rules", &self.gate.rules)
            .field("scope", &self.gate.scope)
            .field("store", &self.gate.store)
            .finish_non_exhaustive()
    }
}
