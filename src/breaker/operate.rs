//! Operating a breaker by hand: what it knows ([`Snapshot`]s), and holding it open or
//! closing it ([`isolate`](CircuitBreakerTransport::isolate),
//! [`reset`](CircuitBreakerTransport::reset)). None of these fails: a store that cannot be
//! reached answers from, and acts on, local state, and says so in the logs.

use super::CircuitBreakerTransport;
use super::events::RecentChange;
use crate::Transport;
use crate::machine::{Snapshot, Transitions};

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
        self.isolate_key(self.inner.name()).await
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
        self.reset_key(self.inner.name()).await
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
