//! The failover pool: sends through the first member that can serve, in priority or turn.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::cascade::{self, Stages, Verdict};
use crate::panicked::catch_panic;
use crate::{
    Category, ConfigError, Envelope, Message, MessageStream, Receipt, ReceiptStream, SendError,
    Transport,
};

/// In which order a [`PoolTransport`] tries its members.
///
/// ```
/// use mail_breaker::Strategy;
/// assert_eq!(Strategy::default(), Strategy::Priority);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// The lowest priority number first, then the next; members of equal priority take the
    /// first try in turn, so they share the load.
    #[default]
    Priority,
    /// Every member takes the first try in turn, whatever its priority; the others follow
    /// it in the order of their priorities, coming round to the first.
    RoundRobin,
}

/// A [`Transport`] that fails over between several providers.
///
/// A send tries the members in the [`Strategy`]'s order. An error that says the provider
/// cannot serve (any [`Category`] but `Rejected` and `InvalidMessage`; `Unsupported` too, since
/// another member may carry what this one cannot) moves on to the next member; `Rejected` and `InvalidMessage` are about the message, so they are returned as
/// they are and no other member sees it. Built with
/// [`at_most_once`](PoolBuilder::at_most_once), an error marked
/// [`is_maybe_delivered`](SendError::is_maybe_delivered) is returned as it is too, and so
/// is a [reputation hold](SendError::is_reputation_hold) (`reputation.open`: the member's
/// bounces or complaints near its provider's limits, where failing over would burn the next
/// account too) unless the member's breaker allows failover. Wrap each member in a
/// [`CircuitBreakerTransport`](crate::CircuitBreakerTransport): a member whose breaker is open
/// answers at once and the pool moves on without waiting.
///
/// # All members failed
/// When every member answered `Unsupported`, the error is `pool.unsupported` (Unsupported,
/// so not retried), each member's error in [`causes`](SendError::causes). Otherwise it
/// is `pool.exhausted` (ServiceUnavailable, so retryable) with the smallest
/// `retry_after` of the members' errors, and each member's error in
/// [`causes`](SendError::causes), in the order tried. A member whose error gives no
/// `retry_after` may be tried again at once, so then the pool gives none either.
///
/// When no member sent the message (each held it back: an open breaker, a rate limit), the
/// error is marked [`is_not_attempted`](SendError::is_not_attempted).
///
/// # A member that cannot work
/// A member that answered `Authentication` or `Configuration` about itself (credentials
/// refused, a transport set up wrong) is passed over for 60 s: its breaker is
/// left alone, and meanwhile its place in the order answers `pool.skipped` (of the
/// category it answered, marked [`is_not_attempted`](SendError::is_not_attempted), its
/// `retry_after` the time left) without a send. It is asked again once the 60 s passed. A
/// failure [about one message](SendError::is_about_the_message) (an unverified sender, a
/// body the server cannot carry, a send that panicked) fails that message over but does not
/// pass the member over: the next message may go.
///
/// # A member that panics
/// A member's send that panics is answered `transport.panicked` (Configuration), naming the
/// member, and the pool goes on to the next member as for any error of that category; a
/// batch that panics fails as a whole and hands its messages on.
///
/// # Batches
/// [`send_many`](Transport::send_many) sends the whole batch to the first member as one
/// batch of its own `send_many`; only the messages that need failover go on, as one batch,
/// to the next member. The answers come in message order, one per message. A member whose
/// batch fails as a whole ([`SendError::batch_failure`]) hands the rest of the batch to the
/// next member.
///
/// # Example
/// ```
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, PoolTransport, Strategy, Transport};
/// use lettre::transport::stub::AsyncStubTransport;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let primary = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!())
///     .with_name("primary");
/// let backup = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!())
///     .with_name("backup");
/// let pool = PoolTransport::builder()
///     .add(CircuitBreakerTransport::new(primary), 1)
///     .add(CircuitBreakerTransport::new(backup), 2)
///     .strategy(Strategy::Priority)
///     .build()?;
///
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// let receipt = pool.send(&message).await.unwrap();
/// assert_eq!(receipt.transport(), "primary");
/// # Ok::<(), mail_breaker::ConfigError>(())
/// # }).unwrap();
/// ```
pub struct PoolTransport {
    name: String,
    /// Sorted by priority, ties in the order added.
    members: Vec<Member>,
    /// `(start, len)` of each run of equal priority in `members`.
    groups: Vec<(usize, usize)>,
    strategy: Strategy,
    turn: AtomicUsize,
    /// Maybe-delivered errors are answers, not failed over.
    at_most_once: bool,
}

struct Member {
    transport: Box<dyn Transport>,
    priority: u32,
    /// Set while the member is passed over for having answered that it cannot work.
    skip: Skip,
    /// The pool's moves on from this member, counted under the `metrics` feature.
    failovers: Failovers,
}

/// The handle of [`POOL_FAILOVERS_TOTAL`](crate::metrics::POOL_FAILOVERS_TOTAL) for one
/// member, taken at its first failover and kept (see [`crate::handles`]); nothing without the
/// `metrics` feature.
#[derive(Default)]
struct Failovers {
    #[cfg(feature = "metrics")]
    counter: crate::handles::Named<::metrics::Counter>,
}

impl Failovers {
    /// `pool` moved on from this member, named `from` now.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn record(&self, pool: &str, from: &str) {
        #[cfg(feature = "metrics")]
        self.counter.record(
            from,
            |from| {
                ::metrics::counter!(
                    crate::metrics::POOL_FAILOVERS_TOTAL,
                    "pool" => pool.to_owned(),
                    "from" => from.to_owned()
                )
            },
            |counter| counter.increment(1),
        );
    }
}

/// How long a member that answered `Authentication` or `Configuration` is passed over: its
/// credentials or settings will not mend by themselves within one message's failover, and
/// every message meanwhile would pay a connection to it (Symfony's failover waits 60 s too).
const SKIP_FOR: Duration = Duration::from_secs(60);

/// Whether a member is passed over, and until when.
#[derive(Default)]
struct Skip {
    /// Read on every send: a skip is rare, so the lock is taken only while one is set.
    set: AtomicBool,
    until: Mutex<Option<Skipped>>,
}

struct Skipped {
    until: Instant,
    /// The answer that made the member pass over.
    code: String,
    category: Category,
}

impl Skip {
    fn lock(&self) -> MutexGuard<'_, Option<Skipped>> {
        // One assignment at a time under this lock: a panic cannot leave it torn.
        self.until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The error that answers for `member` while it is passed over, or `None` to send.
    fn refusal(&self, member: &str) -> Option<SendError> {
        if !self.set.load(Ordering::Relaxed) {
            return None;
        }
        let mut skipped = self.lock();
        let now = Instant::now();
        let left = match &*skipped {
            Some(skip) if skip.until > now => skip.until - now,
            _ => {
                *skipped = None;
                self.set.store(false, Ordering::Relaxed);
                return None;
            }
        };
        let skip = skipped.as_ref()?;
        Some(
            SendError::new(
                skip.category,
                "pool.skipped",
                format!(
                    "passed over for {} s after it answered {}: nothing was sent",
                    left.as_secs_f64().ceil(),
                    skip.code
                ),
            )
            .with_transport(member)
            .with_retry_after(left)
            .not_attempted()
            .refusing_every_message(),
        )
    }

    /// Passes the member over for [`SKIP_FOR`] if `error` says it cannot work.
    fn heard(&self, pool: &str, member: &str, error: &SendError) {
        let cannot_work = matches!(
            error.category(),
            Category::Authentication | Category::Configuration
        );
        // A failure about one message (an unverified sender, a body the server cannot
        // carry, a panic) says nothing of the member: the next message may go.
        if !cannot_work || error.is_not_attempted() || error.is_about_the_message() {
            return;
        }
        tracing::warn!(
            pool,
            transport = member,
            code = error.code(),
            skip_s = SKIP_FOR.as_secs(),
            "pool.member_skipped"
        );
        *self.lock() = Some(Skipped {
            until: crate::time::later(Instant::now(), SKIP_FOR),
            code: error.code().to_owned(),
            category: error.category(),
        });
        self.set.store(true, Ordering::Relaxed);
    }
}

impl PoolTransport {
    /// A builder to add members to.
    pub fn builder() -> PoolBuilder {
        PoolBuilder {
            name: String::from("pool"),
            members: Vec::new(),
            strategy: Strategy::Priority,
            at_most_once: false,
        }
    }

    /// The members with their priorities, lowest priority number first.
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, PoolTransport, Transport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let stub = |name: &str| LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name(name);
    /// let pool = PoolTransport::builder().add(stub("b"), 2).add(stub("a"), 1).build()?;
    /// let names: Vec<_> = pool.members().map(|(member, priority)| (member.name(), priority)).collect();
    /// assert_eq!(names, [("a", 1), ("b", 2)]);
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn members(&self) -> impl Iterator<Item = (&dyn Transport, u32)> {
        self.members
            .iter()
            .map(|member| (&*member.transport, member.priority))
    }

    /// The strategy it tries its members by.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Runs every member's [`verify`](Transport::verify) at once and gives each member's
    /// name with its result, lowest priority number first.
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, PoolTransport, Transport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// # let stub = |name: &str| LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name(name);
    /// let pool = PoolTransport::builder().add(stub("a"), 1).add(stub("b"), 2).build()?;
    /// for (name, result) in pool.verify_each().await {
    ///     println!("{name}: {}", if result.is_ok() { "reachable" } else { "unreachable" });
    /// }
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// # }).unwrap();
    /// ```
    pub async fn verify_each(&self) -> Vec<(&str, Result<(), SendError>)> {
        futures::future::join_all(self.members.iter().map(|member| async move {
            (member.transport.name(), member.transport.verify().await)
        }))
        .await
    }

    /// The indices of the members in the order one send tries them.
    fn order(&self) -> Vec<usize> {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let count = self.members.len();
        match self.strategy {
            Strategy::RoundRobin => (0..count).map(|i| (turn + i) % count).collect(),
            Strategy::Priority => self
                .groups
                .iter()
                .flat_map(|&(start, len)| (0..len).map(move |i| start + (turn + i) % len))
                .collect(),
        }
    }

    /// Tries each member in turn with `send` until one delivers or says no for good.
    async fn fail_over<'s, F, Fut>(&'s self, mut send: F) -> Result<Receipt, SendError>
    where
        F: FnMut(&'s dyn Transport) -> Fut,
        Fut: Future<Output = Result<Receipt, SendError>>,
    {
        let mut errors = Vec::new();
        let order = self.order();
        for (tried, &index) in order.iter().enumerate() {
            let Member {
                transport,
                skip,
                failovers,
                ..
            } = &self.members[index];
            let member = &**transport;
            let answer = match skip.refusal(member.name()) {
                Some(skipped) => Err(skipped),
                None => {
                    // Each member's try is its own: what an earlier one did (and answered)
                    // is not what the one in flight at a deadline's cut did.
                    crate::deadline::try_begins();
                    let span = crate::telemetry::try_span(member.name());
                    let answer = tracing::Instrument::instrument(
                        catch_panic(member.name(), send(member)),
                        span.clone(),
                    )
                    .await;
                    crate::telemetry::ended(&span, &answer);
                    crate::deadline::try_answered(&answer);
                    answer
                }
            };
            match answer {
                Ok(receipt) => return Ok(receipt),
                Err(error) if !self.fails_over(&error) => return Err(self.as_it_is(error)),
                Err(error) => {
                    skip.heard(&self.name, member.name(), &error);
                    tracing::debug!(
                        pool = %self.name,
                        transport = member.name(),
                        code = error.code(),
                        "pool.failover"
                    );
                    if tried + 1 < order.len() {
                        failovers.record(&self.name, member.name());
                    }
                    errors.push(error);
                }
            }
        }
        Err(self.exhausted(errors))
    }

    /// The error for a message every member failed; `errors` holds each member's.
    fn exhausted(&self, errors: Vec<SendError>) -> SendError {
        tracing::debug!(pool = %self.name, members = errors.len(), "pool.exhausted");
        if errors
            .iter()
            .all(|error| error.category() == Category::Unsupported)
        {
            // No member can carry it, now or later: trying the pool again would not help.
            return SendError::new(
                Category::Unsupported,
                "pool.unsupported",
                format!(
                    "no member of the pool can carry this message ({} tried)",
                    errors.len()
                ),
            )
            .with_transport(&self.name)
            .with_causes(errors);
        }
        let mut error = SendError::new(
            Category::ServiceUnavailable,
            "pool.exhausted",
            format!("every member of the pool failed ({} tried)", errors.len()),
        )
        .with_transport(&self.name);
        let waits: Option<Vec<_>> = errors.iter().map(SendError::retry_after).collect();
        if let Some(soonest) = waits.and_then(|waits| waits.into_iter().min()) {
            error = error.with_retry_after(soonest);
        }
        if errors.iter().all(SendError::is_not_attempted) {
            // No member sent it: a breaker around the pool learns nothing of the providers.
            error = error.not_attempted();
        }
        if errors.iter().all(SendError::refuses_every_message) {
            // Every member holds back every message: the whole pool does.
            error = error.refusing_every_message();
        }
        error.with_causes(errors)
    }
}

impl PoolTransport {
    /// Whether `error` says the member cannot serve now, so that the next member should try:
    /// not when it is about the message, nor, at most once, when the member may hold it.
    fn fails_over(&self, error: &SendError) -> bool {
        let about_the_message = matches!(
            error.category(),
            Category::Rejected | Category::InvalidMessage
        );
        let maybe_held = self.at_most_once && error.is_maybe_delivered();
        // Held for its reputation: the next account would be burnt too, unless the member
        // says its mail may go elsewhere (`reputation.failover=true`).
        let held = error.is_reputation_hold() && !error.hold_fails_over();
        !(about_the_message || maybe_held || held)
    }

    /// An error the pool answers without failing over. A reputation hold of one member
    /// among several holds back that member's mail alone, not every message the pool is
    /// handed: an outbox worker moves that message and goes on with the others.
    fn as_it_is(&self, error: SendError) -> SendError {
        if error.is_reputation_hold() && self.members.len() > 1 {
            error.for_one_member()
        } else {
            error
        }
    }
}

#[async_trait::async_trait]
impl Transport for PoolTransport {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        // Every member's try under one idempotency key (DESIGN §21).
        crate::idempotency::handover(self.fail_over(|member| member.send_raw(envelope, raw))).await
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        crate::idempotency::handover(self.fail_over(|member| member.send(message))).await
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        let failover = Failover {
            pool: self,
            order: self.order(),
        };
        // No handover follows one message from member to member: its bytes key it.
        crate::idempotency::keyed_by_bytes(cascade::send_many(failover, messages)).boxed()
    }

    /// `Ok` when at least one member can be reached; otherwise `pool.unreachable`
    /// (ServiceUnavailable) naming every member, with each member's error in `causes`.
    async fn verify(&self) -> Result<(), SendError> {
        let results = self.verify_each().await;
        if results.iter().any(|(_, result)| result.is_ok()) {
            return Ok(());
        }
        let names: Vec<&str> = results.iter().map(|(name, _)| *name).collect();
        let causes = results
            .into_iter()
            .filter_map(|(_, result)| result.err())
            .collect();
        Err(SendError::new(
            Category::ServiceUnavailable,
            "pool.unreachable",
            format!("no member of the pool can be reached: {}", names.join(", ")),
        )
        .with_transport(&self.name)
        .with_causes(causes))
    }
}

crate::transport::lettre_async_transport!(PoolTransport);

impl fmt::Debug for PoolTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members = names_and_priorities(&self.members);
        f.debug_struct("PoolTransport")
            .field("name", &self.name)
            .field("members", &members)
            .field("strategy", &self.strategy)
            .finish_non_exhaustive()
    }
}

/// One `send_many` of the pool: stage `k` is the `k`-th member in this batch's order.
struct Failover<'a> {
    pool: &'a PoolTransport,
    order: Vec<usize>,
}

impl<'a> Failover<'a> {
    fn member(&self, stage: usize) -> &'a dyn Transport {
        let pool: &'a PoolTransport = self.pool;
        &*pool.members[self.order[stage]].transport
    }
}

impl<'a> Stages<'a> for Failover<'a> {
    /// Each member's error so far.
    type Note = Vec<SendError>;

    fn count(&self) -> usize {
        self.order.len()
    }

    fn name(&self, stage: usize) -> &str {
        self.member(stage).name()
    }

    fn note(&self) -> Vec<SendError> {
        Vec::new()
    }

    fn send_many(&self, stage: usize, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        let pool: &'a PoolTransport = self.pool;
        let member = &pool.members[self.order[stage]];
        match member.skip.refusal(member.transport.name()) {
            // Passed over: each message is answered so, and goes on to the next member.
            Some(skipped) => messages.map(move |_| Err(skipped.clone())).boxed(),
            None => member.transport.send_many(messages),
        }
    }

    fn judge(
        &self,
        stage: usize,
        errors: &mut Vec<SendError>,
        result: Result<Receipt, SendError>,
        _repeated: bool,
    ) -> Verdict {
        match result {
            Ok(receipt) => Verdict::Answer(Ok(receipt)),
            Err(error) if !self.pool.fails_over(&error) => {
                Verdict::Answer(Err(self.pool.as_it_is(error)))
            }
            Err(error) => {
                let member = &self.pool.members[self.order[stage]];
                member
                    .skip
                    .heard(&self.pool.name, member.transport.name(), &error);
                errors.push(error.clone());
                if stage + 1 >= self.count() {
                    Verdict::Answer(Err(self.pool.exhausted(std::mem::take(errors))))
                } else {
                    let from = member.transport.name();
                    member.failovers.record(&self.pool.name, from);
                    Verdict::Next {
                        error,
                        not_before: None,
                    }
                }
            }
        }
    }
}

/// The members of a [`PoolTransport`]; made by [`PoolTransport::builder`].
///
/// ```
/// use mail_breaker::{ConfigError, PoolTransport};
///
/// let err: ConfigError = PoolTransport::builder().build().unwrap_err();
/// assert_eq!(err.setting(), "add");
/// ```
#[must_use = "a builder does nothing until .build()"]
pub struct PoolBuilder {
    name: String,
    members: Vec<Member>,
    strategy: Strategy,
    at_most_once: bool,
}

impl PoolBuilder {
    /// Adds a member; a lower `priority` number is tried first.
    pub fn add(mut self, member: impl Transport + 'static, priority: u32) -> Self {
        self.members.push(Member {
            transport: Box::new(member),
            priority,
            skip: Skip::default(),
            failovers: Failovers::default(),
        });
        self
    }

    /// How to order the members (default [`Strategy::Priority`]).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Never hands a message to the next member while the member that failed may already
    /// hold it: an error marked [`is_maybe_delivered`](SendError::is_maybe_delivered) (the
    /// connection dropped or timed out after SMTP's final dot) is returned as it is. The
    /// default is at-least-once: such an error fails over like any other of its category,
    /// and the message may arrive twice.
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, PoolTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let stub = |name: &str| LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name(name);
    /// let pool = PoolTransport::builder().add(stub("a"), 1).add(stub("b"), 2).at_most_once().build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// The pool's name in logs and errors (default `"pool"`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Builds the pool; a [`ConfigError`] naming `add` when it has no member.
    pub fn build(self) -> Result<PoolTransport, ConfigError> {
        let mut members = self.members;
        if members.is_empty() {
            return Err(ConfigError::new(
                "add",
                "a pool needs at least one member, got none",
            ));
        }
        members.sort_by_key(|member| member.priority); // stable: ties keep the order added
        let mut groups: Vec<(usize, usize)> = Vec::new();
        for (index, member) in members.iter().enumerate() {
            match groups.last_mut() {
                Some((start, len)) if members[*start].priority == member.priority => *len += 1,
                _ => groups.push((index, 1)),
            }
        }
        Ok(PoolTransport {
            name: self.name,
            members,
            groups,
            strategy: self.strategy,
            turn: AtomicUsize::new(0),
            at_most_once: self.at_most_once,
        })
    }
}

impl fmt::Debug for PoolBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members = names_and_priorities(&self.members);
        f.debug_struct("PoolBuilder")
            .field("name", &self.name)
            .field("members", &members)
            .field("strategy", &self.strategy)
            .field("at_most_once", &self.at_most_once)
            .finish()
    }
}

/// Each member's name and priority, for `Debug`.
fn names_and_priorities(members: &[Member]) -> Vec<(&str, u32)> {
    members
        .iter()
        .map(|member| (member.transport.name(), member.priority))
        .collect()
}
