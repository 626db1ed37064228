//! [`CircuitBreakerLayer`]: the mail breaker's machine and stores around any tower service.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use ::tower::{Layer, Service};
use tokio::time::{Instant, Sleep};

use crate::breaker::{CircuitBreakerBuilder, CircuitBreakerTransport, StateChange};
use crate::machine::{Decision, ErrorRate, Outcome, Permit, Snapshot, State, Transitions};
use crate::store::BreakerStore;
use crate::{Category, ConfigError, Envelope, Receipt, SendError, Transport};

/// How a layer's service answers while its breaker holds calls back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Refuse {
    /// `poll_ready` is ready, and the call is answered at once with
    /// [`BreakerError::Refused`]: `tower::buffer` in front goes on serving (an error from
    /// `poll_ready` would close it for good). The default.
    #[default]
    InCall,
    /// `poll_ready` stays pending until the breaker's next probe time (or, while it is
    /// isolated, rechecks every reset timeout): `tower::balance` sends to another endpoint,
    /// instead of favouring the one that refuses fastest.
    NotReady,
}

/// What a call's result says of the service, as a [`Classify`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The service worked.
    Success,
    /// The service failed: the breaker counts a failure. The category says how, for logs.
    Failure(Category),
    /// Says nothing of the service (the request's own fault, a cancellation): not counted,
    /// and a probe's slot is given back.
    NotCounted,
}

/// Decides what a result says of the service. Any `Fn(&Result<R, E>) -> Verdict` is one;
/// [`EveryError`] is the default.
pub trait Classify<R, E>: Clone + Send + Sync + 'static {
    /// The verdict on `result`.
    fn classify(&self, result: &Result<R, E>) -> Verdict;
}

impl<R, E, F> Classify<R, E> for F
where
    F: Fn(&Result<R, E>) -> Verdict + Clone + Send + Sync + 'static,
{
    fn classify(&self, result: &Result<R, E>) -> Verdict {
        self(result)
    }
}

/// The default [`Classify`]: every `Ok` a success, every `Err` a failure (`ServerError`).
///
/// ```
/// use mail_breaker::tower::{Classify, EveryError, Verdict};
/// assert_eq!(EveryError.classify(&Ok::<u8, ()>(1)), Verdict::Success);
/// assert!(matches!(EveryError.classify(&Err::<u8, ()>(())), Verdict::Failure(_)));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct EveryError;

impl<R, E> Classify<R, E> for EveryError {
    fn classify(&self, result: &Result<R, E>) -> Verdict {
        match result {
            Ok(_) => Verdict::Success,
            Err(_) => Verdict::Failure(Category::ServerError),
        }
    }
}

/// The [`Classify`] of a mail stack's answers ([`TransportService`](super::TransportService)):
/// as the mail breaker counts them. A failure is an error whose category
/// [counts](Category::is_breaker_failure); an error that sent nothing
/// ([not attempted](SendError::is_not_attempted)) is not counted; the rest (a refusal of
/// the message) are the provider working.
///
/// ```
/// use mail_breaker::tower::{Classify, SendErrors, Verdict};
/// use mail_breaker::{Category, Receipt, SendError};
/// let down: Result<Receipt, SendError> = Err(SendError::new(Category::Network, "x", "down"));
/// assert_eq!(SendErrors.classify(&down), Verdict::Failure(Category::Network));
/// let refused: Result<Receipt, SendError> = Err(SendError::new(Category::Rejected, "x", "no"));
/// assert_eq!(SendErrors.classify(&refused), Verdict::Success);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SendErrors;

impl<R> Classify<R, SendError> for SendErrors {
    fn classify(&self, result: &Result<R, SendError>) -> Verdict {
        match result {
            Ok(_) => Verdict::Success,
            Err(error) if error.is_not_attempted() => Verdict::NotCounted,
            Err(error) if error.category().is_breaker_failure() => {
                Verdict::Failure(error.category())
            }
            Err(_) => Verdict::Success,
        }
    }
}

/// The error of a layer's service: the breaker refused the call, or the service failed.
#[derive(Debug)]
pub enum BreakerError<E> {
    /// The breaker held the call back; nothing reached the service. The error says why
    /// (`breaker.open` with its `retry_after`, or `breaker.isolated`).
    Refused(SendError),
    /// The service's own error.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for BreakerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BreakerError::Refused(error) => error.fmt(f),
            BreakerError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BreakerError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BreakerError::Refused(error) => Some(error),
            BreakerError::Inner(error) => Some(error),
        }
    }
}

/// The breaker's name, standing where the mail breaker has a transport: it is never sent
/// through.
#[derive(Debug)]
pub(crate) struct Named(String);

#[async_trait::async_trait]
impl Transport for Named {
    fn name(&self) -> &str {
        &self.0
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        Err(SendError::new(
            Category::Configuration,
            "tower.no_transport",
            "a tower layer's breaker sends nothing itself",
        ))
    }
}

type Breaker = Arc<CircuitBreakerTransport<Named>>;

/// The circuit breaker as a [`tower::Layer`], for any [`Service`]: the same rules, state
/// machine and stores (memory, or Redis shared by a fleet) as
/// [`CircuitBreakerTransport`], with a [`Classify`] from the service's result to success,
/// failure or not counted.
///
/// - `poll_ready` decides (asks the store for leave) and keeps its decision for the next
///   `call`; a probe reserved there is given back when the service is dropped without a
///   call, and a probe kept past `probe_timeout` without a call is refused at the call (the
///   store gave its slot to another by then).
/// - While the breaker holds calls back: [`Refuse::InCall`] (the default) or
///   [`Refuse::NotReady`].
/// - [`handle`](Self::handle) reads and operates the breaker: snapshot, isolate, reset.
///   Every service the layer makes shares that one breaker.
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::tower::{BreakerError, CircuitBreakerLayer};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let layer = CircuitBreakerLayer::builder("inventory-api")
///     .failure_threshold(1)
///     .reset_timeout(Duration::from_secs(30))
///     .build()?;
/// let service = ServiceBuilder::new()
///     .layer(layer.clone())
///     .service(service_fn(|_: ()| async { Err::<(), _>(std::io::Error::other("down")) }));
/// let failed = service.clone().oneshot(()).await;
/// assert!(matches!(failed, Err(BreakerError::Inner(_))));
/// let refused = service.oneshot(()).await;
/// assert!(matches!(refused, Err(BreakerError::Refused(_))));
/// assert_eq!(layer.handle().state(), mail_breaker::State::Open);
/// # Ok::<(), mail_breaker::ConfigError>(())
/// # }).unwrap();
/// ```
pub struct CircuitBreakerLayer<C = EveryError> {
    breaker: Breaker,
    classify: C,
    refuse: Refuse,
}

impl<C: Clone> Clone for CircuitBreakerLayer<C> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            breaker: Arc::clone(&self.breaker),
            classify: self.classify.clone(),
            refuse: self.refuse,
        }
    }
}

impl<C> fmt::Debug for CircuitBreakerLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("name", &self.breaker.inner().0)
            .field("refuse", &self.refuse)
            .finish_non_exhaustive()
    }
}

impl CircuitBreakerLayer {
    /// A builder for a breaker named `name` (its key in the store, its name in logs,
    /// metrics and state changes), with the mail breaker's defaults: 5 failures in a row,
    /// 30 s reset and probe timeouts.
    pub fn builder(name: impl Into<String>) -> CircuitBreakerLayerBuilder<EveryError> {
        CircuitBreakerLayerBuilder {
            breaker: CircuitBreakerTransport::builder(Named(name.into())),
            classify: EveryError,
            refuse: Refuse::InCall,
        }
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// The breaker every service of this layer shares: read it, operate it.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            breaker: Arc::clone(&self.breaker),
        }
    }
}

impl<S, C: Clone> Layer<S> for CircuitBreakerLayer<C> {
    type Service = CircuitBreakerService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreakerService {
            inner,
            breaker: Arc::clone(&self.breaker),
            classify: self.classify.clone(),
            refuse: self.refuse,
            ready: Ready::Undecided,
        }
    }
}

/// Settings for a [`CircuitBreakerLayer`], checked when built: the mail breaker's
/// ([`CircuitBreakerBuilder`]'s), and how the layer classifies and refuses.
#[must_use = "a builder does nothing until .build()"]
pub struct CircuitBreakerLayerBuilder<C> {
    breaker: CircuitBreakerBuilder<Named>,
    classify: C,
    refuse: Refuse,
}

impl<C> fmt::Debug for CircuitBreakerLayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayerBuilder")
            .field("breaker", &self.breaker)
            .field("refuse", &self.refuse)
            .finish_non_exhaustive()
    }
}

impl<C> CircuitBreakerLayerBuilder<C> {
    /// Failures in a row that open the breaker (default 5).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.breaker = self.breaker.failure_threshold(failures);
        self
    }

    /// Opens on the failure rate in a sliding window instead of failures in a row.
    pub fn error_rate(mut self, rate: ErrorRate) -> Self {
        self.breaker = self.breaker.error_rate(rate);
        self
    }

    /// How long the breaker stays open before a probe (default 30 s).
    pub fn reset_timeout(mut self, timeout: Duration) -> Self {
        self.breaker = self.breaker.reset_timeout(timeout);
        self
    }

    /// How long a probe may take before the breaker reopens (default: the reset timeout).
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.breaker = self.breaker.probe_timeout(timeout);
        self
    }

    /// Successful probes in a row that close the breaker (default 1).
    pub fn half_open_successes(mut self, successes: u32) -> Self {
        self.breaker = self.breaker.half_open_successes(successes);
        self
    }

    /// Called on every change of state.
    pub fn on_state_change(
        mut self,
        listener: impl Fn(&StateChange) + Send + Sync + 'static,
    ) -> Self {
        self.breaker = self.breaker.on_state_change(listener);
        self
    }

    /// Where the breaker's state lives (default: this process's memory); a
    /// [`RedisStore`](crate::RedisStore) shares it with every process on the same Redis.
    pub fn store(mut self, store: Arc<dyn BreakerStore>) -> Self {
        self.breaker = self.breaker.store(store);
        self
    }

    /// A success slower than `limit` counts as a failure.
    pub fn slow_call(mut self, limit: Duration) -> Self {
        self.breaker = self.breaker.slow_call(limit);
        self
    }

    /// Counts and changes state, but never refuses a call.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.breaker = self.breaker.shadow(shadow);
        self
    }

    /// The longest reset timeout (it doubles at each failed probe up to this; default: no
    /// growth).
    pub fn max_reset_timeout(mut self, longest: Duration) -> Self {
        self.breaker = self.breaker.max_reset_timeout(longest);
        self
    }

    /// How the service answers while the breaker holds calls back (default
    /// [`Refuse::InCall`]).
    pub fn when_open(mut self, refuse: Refuse) -> Self {
        self.refuse = refuse;
        self
    }

    /// What a result says of the service (default [`EveryError`]).
    pub fn classify<D>(self, classify: D) -> CircuitBreakerLayerBuilder<D> {
        CircuitBreakerLayerBuilder {
            breaker: self.breaker,
            classify,
            refuse: self.refuse,
        }
    }

    /// Checks the settings (a `ConfigError` names the one out of range) and builds the
    /// layer.
    pub fn build(self) -> Result<CircuitBreakerLayer<C>, ConfigError> {
        Ok(CircuitBreakerLayer {
            breaker: Arc::new(self.breaker.build()?),
            classify: self.classify,
            refuse: self.refuse,
        })
    }
}

/// Reads and operates the breaker of a [`CircuitBreakerLayer`].
#[derive(Clone)]
pub struct BreakerHandle {
    breaker: Breaker,
}

impl fmt::Debug for BreakerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerHandle")
            .field("name", &self.breaker.inner().0)
            .finish()
    }
}

impl BreakerHandle {
    /// Its state now, as this process knows it.
    pub fn state(&self) -> State {
        self.breaker.state()
    }

    /// Its state and counts, from its store.
    pub async fn snapshot(&self) -> Snapshot {
        self.breaker.snapshot().await
    }

    /// Opens it until [`reset`](Self::reset): every call is refused.
    pub async fn isolate(&self) {
        self.breaker.isolate().await;
    }

    /// Closes it, its counts cleared.
    pub async fn reset(&self) {
        self.breaker.reset().await;
    }
}

/// A service behind a [`CircuitBreakerLayer`].
pub struct CircuitBreakerService<S, C> {
    inner: S,
    breaker: Breaker,
    classify: C,
    refuse: Refuse,
    ready: Ready,
}

impl<S: Clone, C: Clone> Clone for CircuitBreakerService<S, C> {
    /// A clone decides for itself: it holds no decision of this one's.
    fn clone(&self) -> Self {
        CircuitBreakerService {
            inner: self.inner.clone(),
            breaker: Arc::clone(&self.breaker),
            classify: self.classify.clone(),
            refuse: self.refuse,
            ready: Ready::Undecided,
        }
    }
}

impl<S, C> fmt::Debug for CircuitBreakerService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerService")
            .field("name", &self.breaker.inner().0)
            .field("refuse", &self.refuse)
            .finish_non_exhaustive()
    }
}

type Deciding = Pin<Box<dyn Future<Output = (Decision, Transitions)> + Send>>;

/// What `poll_ready` decided, kept for the next `call`.
enum Ready {
    Undecided,
    /// The store is deciding (a remote store).
    Deciding(Deciding),
    /// Leave to call, its permit held.
    Admitted(Admission),
    /// Held back: the call is refused (`Refuse::InCall`); `None` while isolated.
    Refused(Option<Duration>),
    /// Held back, pending until the next probe time (`Refuse::NotReady`).
    Waiting(Pin<Box<Sleep>>),
}

/// Leave for one call: its permit (none in shadow mode past a refusal), given back if the
/// call never answers.
struct Admission {
    breaker: Breaker,
    permit: Option<Permit>,
    at: Instant,
}

impl Admission {
    fn name(&self) -> &str {
        &self.breaker.inner().0
    }

    /// Counts `outcome` with the permit; the permit is spent once the store recorded it
    /// (dropped before, it is given back).
    async fn record(mut self, outcome: Outcome) {
        let Some(permit) = self.permit else { return };
        let gate = self.breaker.gate();
        let name = &self.breaker.inner().0;
        gate.recording
            .send_finished(name, Some(outcome), Some(self.at));
        let transitions = gate
            .store
            .record(name, &gate.rules, permit, outcome, &gate.late)
            .await;
        self.permit = None;
        gate.announce(name, name, transitions);
    }

    /// A probe kept longer than the probe timeout: the store gave its slot away.
    fn is_stale_probe(&self) -> bool {
        self.permit.is_some_and(|permit| permit.is_probe())
            && self.at.elapsed() >= self.breaker.gate().rules.probe_timeout
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            let gate = self.breaker.gate();
            gate.store
                .release(self.name(), &gate.rules, permit, &gate.late);
        }
    }
}

impl<S, C> CircuitBreakerService<S, C> {
    /// Asks the store for leave: at once from the memory store, or a future to poll.
    fn decide(&self) -> Result<(Decision, Transitions), Deciding> {
        let gate = self.breaker.gate();
        let name = &self.breaker.inner().0;
        if gate.memory.is_some()
            && let Some(decision) = futures::FutureExt::now_or_never(gate.store.acquire_in(
                name,
                name,
                &gate.rules,
                &gate.late,
            ))
        {
            return Ok(decision);
        }
        let breaker = Arc::clone(&self.breaker);
        Err(Box::pin(async move {
            let gate = breaker.gate();
            let name = &breaker.inner().0;
            gate.store
                .acquire_in(name, name, &gate.rules, &gate.late)
                .await
        }))
    }

    /// What the store's `decision` makes of the next call.
    fn decided(&self, decision: (Decision, Transitions)) -> Ready {
        let gate = self.breaker.gate();
        let name = &self.breaker.inner().0;
        match gate.admitted(name, Cow::Borrowed(name.as_str()), decision) {
            Ok(unspent) => Ready::Admitted(Admission {
                breaker: Arc::clone(&self.breaker),
                permit: unspent.into_permit(),
                at: Instant::now(),
            }),
            Err(held) => match self.refuse {
                Refuse::InCall => Ready::Refused(held.retry_after),
                Refuse::NotReady => {
                    let wait = held.retry_after.unwrap_or(gate.rules.reset_timeout);
                    let until = crate::time::later(Instant::now(), wait);
                    Ready::Waiting(Box::pin(tokio::time::sleep_until(until)))
                }
            },
        }
    }

    fn refusal(&self, retry_after: Option<Duration>) -> SendError {
        let gate = self.breaker.gate();
        gate.refusal(
            &self.breaker.inner().0,
            crate::breaker::gate::HeldBack { retry_after },
        )
    }
}

impl<S, C, Request> Service<Request> for CircuitBreakerService<S, C>
where
    S: Service<Request>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    C: Classify<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = BreakerError<S::Error>;
    type Future = ResponseFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.ready {
                Ready::Undecided => {
                    self.ready = match self.decide() {
                        Ok(decision) => self.decided(decision),
                        Err(deciding) => Ready::Deciding(deciding),
                    };
                }
                Ready::Deciding(deciding) => {
                    let decision = ready!(deciding.as_mut().poll(cx));
                    self.ready = self.decided(decision);
                }
                Ready::Admitted(_) => {
                    return match ready!(self.inner.poll_ready(cx)) {
                        Ok(()) => Poll::Ready(Ok(())),
                        Err(error) => {
                            // The permit goes back: nothing was called.
                            self.ready = Ready::Undecided;
                            Poll::Ready(Err(BreakerError::Inner(error)))
                        }
                    };
                }
                Ready::Refused(_) => return Poll::Ready(Ok(())),
                Ready::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.ready = Ready::Undecided;
                }
            }
        }
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match std::mem::replace(&mut self.ready, Ready::Undecided) {
            Ready::Admitted(admission) if admission.is_stale_probe() => {
                let retry_after = Some(Duration::ZERO);
                drop(admission);
                ResponseFuture::refused(self.refusal(retry_after))
            }
            Ready::Admitted(mut admission) => {
                // The call's time counts from here, not from the `poll_ready` that let it go.
                admission.at = Instant::now();
                let call = self.inner.call(request);
                let classify = self.classify.clone();
                ResponseFuture {
                    inner: Box::pin(async move {
                        let result = call.await;
                        match classify.classify(&result) {
                            // The permit goes back with the admission.
                            Verdict::NotCounted => drop(admission),
                            Verdict::Success => {
                                // A slow call is a failure when it answered `Ok`, as the
                                // mail breaker counts it.
                                let outcome = if result.is_ok() && is_slow(&admission) {
                                    Outcome::Failure
                                } else {
                                    Outcome::Success
                                };
                                admission.record(outcome).await;
                            }
                            Verdict::Failure(_) => admission.record(Outcome::Failure).await,
                        }
                        result.map_err(BreakerError::Inner)
                    }),
                }
            }
            Ready::Refused(retry_after) => ResponseFuture::refused(self.refusal(retry_after)),
            // Called without `poll_ready` saying ready: tower's contract is broken; refuse
            // rather than call a service that may not be ready.
            _ => ResponseFuture::refused(
                SendError::new(
                    Category::Configuration,
                    "tower.not_ready",
                    "called before poll_ready answered ready",
                )
                .not_attempted()
                .with_transport(&self.breaker.inner().0),
            ),
        }
    }
}

fn is_slow(admission: &Admission) -> bool {
    admission
        .breaker
        .gate()
        .slow_call
        .is_some_and(|limit| admission.at.elapsed() > limit)
}

/// The answer of a [`CircuitBreakerService`]'s call.
pub struct ResponseFuture<R, E> {
    inner: Pin<Box<dyn Future<Output = Result<R, BreakerError<E>>> + Send>>,
}

impl<R: Send + 'static, E: Send + 'static> ResponseFuture<R, E> {
    fn refused(error: SendError) -> Self {
        ResponseFuture {
            inner: Box::pin(std::future::ready(Err(BreakerError::Refused(error)))),
        }
    }
}

impl<R, E> fmt::Debug for ResponseFuture<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<R, E> Future for ResponseFuture<R, E> {
    type Output = Result<R, BreakerError<E>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}
