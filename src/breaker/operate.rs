//! Operating a breaker by hand: what it knows ([`Snapshot`]s), and holding it open or
//! closing it ([`isolate`](CircuitBreakerTransport::isolate),
//! [`reset`](CircuitBreakerTransport::reset)). None of these fails: a store that cannot be
//! reached answers from, and acts on, local state, and says so in the logs.

use super::CircuitBreakerTransport;
use super::events::RecentChange;
use crate::machine::{Snapshot, Transitions};
use crate::store::Reach;
use crate::{SendError, Transport};

impl<T: Transport> CircuitBreakerTransport<T> {
    /// What the breaker under [`Scope::Transport`](crate::Scope::Transport) knows: its state,
    /// what it counted, when a probe may go.
    ///
    /// ```
    /// use mail_breaker::{CircuitBreakerTransport, LettreTransport, State};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// let breaker = CircuitBreakerTransport::new(stub);
    /// let snapshot = breaker.snapshot().await;
    /// assert_eq!(snapshot.state(), State::Closed);
    /// assert_eq!(snapshot.failures(), 0);
    /// # });
    /// ```
    pub async fn snapshot(&self) -> Snapshot {
        self.snapshot_of(self.inner.name()).await
    }

    /// What the breaker of `key` knows (a recipient domain, lower-cased, under
    /// [`Scope::RecipientDomain`](crate::Scope::RecipientDomain)). A key never seen is closed
    /// with nothing counted.
    pub async fn snapshot_of(&self, key: &str) -> Snapshot {
        let gate = &self.gate;
        gate.store.snapshot(key, &gate.rules, &gate.late).await
    }

    /// A snapshot of every key the store tracks (see
    /// [`tracked_keys`](crate::CircuitBreakerTransport::tracked_keys)); with a `RedisStore`, every key of its
    /// namespace in Redis.
    ///
    /// ```
    /// use mail_breaker::{CircuitBreakerTransport, LettreTransport, Transport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// # let message = lettre::Message::builder().from("a@example.com".parse().unwrap())
    /// #     .to("b@example.org".parse().unwrap()).body(String::from("hi")).unwrap();
    /// let breaker = CircuitBreakerTransport::new(stub);
    /// breaker.send(&message).await.unwrap();
    /// for snapshot in breaker.snapshots().await {
    ///     println!("{}: {} ({} failures)", snapshot.key(), snapshot.state(), snapshot.failures());
    /// }
    /// # });
    /// ```
    pub async fn snapshots(&self) -> Vec<Snapshot> {
        let gate = &self.gate;
        gate.store.snapshots(&gate.rules, &gate.late).await
    }

    /// Holds the breaker under [`Scope::Transport`](crate::Scope::Transport) open until
    /// [`reset`](Self::reset), however long it waits: sends are answered at once with
    /// `breaker.isolated` (ServiceUnavailable, no `retry_after`), so a pool fails over, and
    /// no probe goes. For taking a provider out of rotation by hand. With a `RedisStore` it
    /// holds for every process that shares the breaker.
    ///
    /// ```
    /// use mail_breaker::{CircuitBreakerTransport, LettreTransport, State, Transport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// # let message = lettre::Message::builder().from("a@example.com".parse().unwrap())
    /// #     .to("b@example.org".parse().unwrap()).body(String::from("hi")).unwrap();
    /// let breaker = CircuitBreakerTransport::new(stub);
    /// breaker.isolate().await;
    /// assert_eq!(breaker.send(&message).await.unwrap_err().code(), "breaker.isolated");
    /// breaker.reset().await;
    /// assert!(breaker.send(&message).await.is_ok());
    /// # });
    /// ```
    pub async fn isolate(&self) {
        if let Err(error) = self.try_isolate().await {
            tracing::warn!(
                transport = self.inner.name(),
                error = %error,
                "breaker.isolate_partial: the isolation did not reach every process sharing the store"
            );
        }
    }

    /// [`isolate`](Self::isolate), saying what the change reached: [`Reach::Fleet`] when
    /// every process sharing the store holds it (a `RedisStore` that answered),
    /// [`Reach::ThisProcess`] when the store is this process's own memory, which no other
    /// process reads. The error is the store's: a `RedisStore` that cannot be reached
    /// (`store.unreachable`) has isolated the breaker in this process only, as `isolate`
    /// does; a store of your own that cannot isolate a whole breaker changed nothing of it.
    ///
    /// Isolation holds the breaker as a whole (DESIGN §19), whatever its
    /// [`Scope`](crate::Scope): under [`Scope::RecipientDomain`](crate::Scope::RecipientDomain)
    /// a domain first seen after it is refused too, in every process sharing the store, until
    /// [`reset`](Self::reset) or [`try_reset`](Self::try_reset).
    ///
    /// ```
    /// use mail_breaker::{CircuitBreakerTransport, LettreTransport, Reach, Scope, Transport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// # let message = lettre::Message::builder().from("a@example.com".parse().unwrap())
    /// #     .to("b@new-domain.example".parse().unwrap()).body(String::from("hi")).unwrap();
    /// let breaker = CircuitBreakerTransport::builder(stub)
    ///     .scope(Scope::RecipientDomain)
    ///     .build()
    ///     .unwrap();
    /// // The default store is this process's memory: the change reaches it alone.
    /// assert_eq!(breaker.try_isolate().await.unwrap(), Reach::ThisProcess);
    /// assert_eq!(breaker.send(&message).await.unwrap_err().code(), "breaker.isolated");
    /// # });
    /// ```
    pub async fn try_isolate(&self) -> Result<Reach, SendError> {
        let name = self.inner.name();
        let whole = self.gate.store.isolate_breaker(name).await;
        // The transport's own key too, so that its state and snapshot show the isolation
        // and the listener hears it, as before.
        self.isolate_key(name).await;
        whole
    }

    /// Holds the breaker of `key` open until [`reset_key`](Self::reset_key).
    pub async fn isolate_key(&self, key: &str) {
        let gate = &self.gate;
        let transitions = gate.store.isolate(key, &gate.rules, &gate.late).await;
        self.by_hand(key, transitions, true);
    }

    /// Closes the breaker under [`Scope::Transport`](crate::Scope::Transport), clears its
    /// counts and its open streak, and lifts an isolation.
    pub async fn reset(&self) {
        if let Err(error) = self.try_reset().await {
            tracing::warn!(
                transport = self.inner.name(),
                error = %error,
                "breaker.reset_partial: the reset did not reach every process sharing the store"
            );
        }
    }

    /// [`reset`](Self::reset), saying what the change reached, as
    /// [`try_isolate`](Self::try_isolate) does. It lifts an isolation of the whole breaker
    /// for every key, and closes the breaker under
    /// [`Scope::Transport`](crate::Scope::Transport) (another key's breaker keeps its
    /// counts: [`reset_key`](Self::reset_key) closes one).
    ///
    /// ```
    /// use mail_breaker::{CircuitBreakerTransport, LettreTransport, Reach, Transport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
    /// # let message = lettre::Message::builder().from("a@example.com".parse().unwrap())
    /// #     .to("b@example.org".parse().unwrap()).body(String::from("hi")).unwrap();
    /// let breaker = CircuitBreakerTransport::new(stub);
    /// breaker.isolate().await;
    /// match breaker.try_reset().await {
    ///     Ok(Reach::Fleet) => println!("reset for every process"),
    ///     Ok(Reach::ThisProcess) => println!("reset in this process only"),
    ///     Err(error) => eprintln!("not reset everywhere: {error}"),
    /// }
    /// assert!(breaker.send(&message).await.is_ok());
    /// # });
    /// ```
    pub async fn try_reset(&self) -> Result<Reach, SendError> {
        let name = self.inner.name();
        let whole = self.gate.store.lift_isolation(name).await;
        self.reset_key(name).await;
        whole
    }

    /// Closes the breaker of `key`, clears its counts and lifts an isolation.
    pub async fn reset_key(&self, key: &str) {
        let gate = &self.gate;
        let transitions = gate.store.reset(key, &gate.rules, &gate.late).await;
        self.by_hand(key, transitions, false);
    }

    /// The last changes of state this process saw, of every key, newest first (at most 20),
    /// each with its time and reason; an isolation or reset by hand is one even when the
    /// state stays. With a `RedisStore`, a change another process made shows here when this
    /// one learns of it.
    pub fn recent_changes(&self) -> Vec<RecentChange> {
        self.gate.history.recent()
    }

    /// Remembers an isolation (or reset) with its reason, then logs its changes and tells
    /// the listener.
    fn by_hand(&self, key: &str, transitions: Transitions, isolated: bool) {
        let gate = &self.gate;
        gate.history.by_hand(key, transitions, isolated);
        if !transitions.is_empty() {
            let listener = gate.listener.as_ref();
            let transport = self.inner.name();
            let recording = &gate.recording;
            super::events::announce(
                listener,
                recording,
                transport,
                key,
                transitions,
                gate.shadow,
                None,
            );
        }
    }
}
