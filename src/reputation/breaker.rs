//! [`ReputationBreaker`]: one member's reputation, kept in a store, told of sends by its
//! [`ReputationTransport`](super::ReputationTransport) and of bounces and complaints as an
//! [`EventSink`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use async_trait::async_trait;

use super::rules::{Limits, ReputationRules};
use super::store::{Heard, MemoryReputation, Recorded, ReputationStore, Signal};
use super::window::{Standing, Tier, TierChange};
use crate::events::{BounceKind, DeliveryEvent, EventKind, EventSink, KeepError, Kept};
use crate::{Category, ConfigError, SendError};

/// What a [`ReputationBreaker`] calls on a change of tier its process made.
type Listener = dyn Fn(&str, TierChange) + Send + Sync;

/// One pool member's reputation breaker (DESIGN §20): rolling rates of hard bounces and
/// complaints over its sends, with the tiers of [`Tier`].
///
/// - Its [`ReputationTransport`](super::ReputationTransport) ([`wrap`](Self::wrap)) counts
///   each message the provider accepted (one send per recipient) and refuses every send
///   while the breaker is open: `reputation.open` (`ServiceUnavailable`,
///   [not attempted](SendError::is_not_attempted),
///   [`is_reputation_hold`](SendError::is_reputation_hold)).
/// - As an [`EventSink`] (or through [`record`](Self::record)) it counts the permanent
///   bounces and complaints whose [`member`](DeliveryEvent::member) is its own, each
///   `(provider, event id, recipient)` once; other events and other members' change nothing.
/// - `warn`: the listener set with [`on_tier_change`](ReputationBuilder::on_tier_change)
///   is called, the metrics say it, [`tier`](Self::tier) shows it. `throttle`: the same,
///   and [`rate_factor`](Self::rate_factor) is ½ until the rates fall below warn: a
///   [`RateLimitTransport`](crate::RateLimitTransport) built
///   [`slowed_by`](crate::RateLimitBuilder::slowed_by) the breaker sends at half its rate
///   (a [`Mailer`](crate::Mailer) does so for a member with a `rate` and a `reputation`).
///   A member without a rate limit has no rate to halve: it sends as before, and the change
///   to `throttle` is logged as a warning saying so (`reputation.throttle_unpaced`).
///   `open`: only [`reset`](Self::reset), by a person, closes it; it never half-opens.
/// - Its state is in its [`ReputationStore`]: the process's [`MemoryReputation`] by
///   default, a `RedisStore` to share it with a fleet.
///
/// A clone is the same breaker.
///
/// # Example
/// ```
/// use std::time::SystemTime;
/// use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, Provider};
/// use mail_breaker::reputation::{ReputationBreaker, Tier};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let breaker = ReputationBreaker::builder("ses")
///     .on_tier_change(|member, change| println!("{member}: {} -> {}", change.from, change.to))
///     .build()?;
/// let bounce = |n: u32| {
///     let mut event = DeliveryEvent::new(
///         Provider::Ses,
///         format!("notification-{n}"),
///         EventKind::Bounced { bounce: BounceKind::Permanent, subtype: None },
///         format!("gone{n}@example.org"),
///         SystemTime::now(),
///     );
///     event.member = Some("ses".into());
///     event
/// };
/// let events: Vec<_> = (0..3).map(bounce).collect();
/// breaker.record(&events).await?;
/// assert_eq!(breaker.tier(), Tier::Healthy, "no sends counted yet: under the minimum volume");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct ReputationBreaker {
    shared: Arc<Shared>,
}

struct Shared {
    member: String,
    rules: ReputationRules,
    store: Arc<dyn ReputationStore>,
    failover: bool,
    /// The tier this process last heard from the store, as [`Tier::number`].
    last: AtomicI64,
    listener: Option<Arc<Listener>>,
    /// Whether a rate limiter reads [`ReputationBreaker::rate_factor`].
    paced: AtomicBool,
}

impl ReputationBreaker {
    /// A builder for the breaker of the member named `member`: the name its events carry in
    /// [`DeliveryEvent::member`], and its key in the store.
    pub fn builder(member: impl Into<String>) -> ReputationBuilder {
        ReputationBuilder {
            member: member.into(),
            rules: ReputationRules::default(),
            store: None,
            failover: false,
            listener: None,
        }
    }

    /// The member's name.
    ///
    /// ```
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// assert_eq!(ReputationBreaker::builder("ses").build()?.member(), "ses");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn member(&self) -> &str {
        &self.shared.member
    }

    /// The rules it decides by.
    ///
    /// ```
    /// # use mail_breaker::reputation::{ReputationBreaker, ReputationRules};
    /// let breaker = ReputationBreaker::builder("ses").build()?;
    /// assert_eq!(*breaker.rules(), ReputationRules::default());
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn rules(&self) -> &ReputationRules {
        &self.shared.rules
    }

    /// Whether a pool may fail the member's mail over to the next member while it is open
    /// (`reputation.failover=true`).
    ///
    /// ```
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// assert!(!ReputationBreaker::builder("ses").build()?.fails_over());
    /// assert!(ReputationBreaker::builder("ses").failover(true).build()?.fails_over());
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn fails_over(&self) -> bool {
        self.shared.failover
    }

    /// The tier this process last heard from the store (at the last send, event or
    /// [`standing`](Self::standing)); `Healthy` before any.
    ///
    /// ```
    /// # use mail_breaker::reputation::{ReputationBreaker, Tier};
    /// assert_eq!(ReputationBreaker::builder("ses").build()?.tier(), Tier::Healthy);
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn tier(&self) -> Tier {
        Tier::from_number(self.shared.last.load(Ordering::Relaxed))
    }

    /// What the member's sending rate is multiplied by now: ½ from `throttle` up, 1
    /// otherwise, as this process last heard the tier (at the member's last send or event,
    /// so a send paced just after another process throttled it may still go at the whole
    /// rate). A [`RateLimitTransport`](crate::RateLimitTransport) reads it at each send when
    /// built [`slowed_by`](crate::RateLimitBuilder::slowed_by) the breaker.
    ///
    /// ```
    /// use mail_breaker::reputation::ReputationBreaker;
    ///
    /// let breaker = ReputationBreaker::builder("ses").build()?;
    /// assert_eq!(breaker.rate_factor(), 1.0);
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn rate_factor(&self) -> f64 {
        if self.tier() >= Tier::Throttle {
            0.5
        } else {
            1.0
        }
    }

    /// Whether a rate limiter reads this breaker's [`rate_factor`](Self::rate_factor) (one
    /// was built [`slowed_by`](crate::RateLimitBuilder::slowed_by) it): whether `throttle`
    /// slows the member.
    ///
    /// ```
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// assert!(!ReputationBreaker::builder("ses").build()?.is_paced());
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn is_paced(&self) -> bool {
        self.shared.paced.load(Ordering::Relaxed)
    }

    /// Where the member stands now, as the store says (for the page, a command, a test).
    ///
    /// ```
    /// # use mail_breaker::reputation::{ReputationBreaker, Standing};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let breaker = ReputationBreaker::builder("ses").build()?;
    /// assert_eq!(breaker.standing().await?, Standing::default());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn standing(&self) -> Result<Standing, KeepError> {
        let standing = self
            .shared
            .store
            .standing(&self.shared.member, &self.shared.rules)
            .await?;
        self.heard_tier(standing);
        Ok(standing)
    }

    /// Counts the permanent bounces and complaints among `events` whose member is this
    /// breaker's, each `(provider, event id, recipient)` once; the others change nothing.
    /// [`Kept::new`] counts those newly counted.
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use mail_breaker::events::{DeliveryEvent, EventKind, Provider};
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let breaker = ReputationBreaker::builder("ses").build()?;
    /// let complaint = EventKind::Complained { feedback: Some("abuse".into()) };
    /// let mut event = DeliveryEvent::new(Provider::Ses, "n-1", complaint, "a@example.org", SystemTime::now());
    /// event.member = Some("ses".into());
    /// assert_eq!(breaker.record(&[event.clone()]).await?.new, 1);
    /// assert_eq!(breaker.record(&[event]).await?.new, 0, "a resent event counts once");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn record(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
        let heard: Vec<Heard> = events
            .iter()
            .filter(|event| event.member.as_deref() == Some(self.member()))
            .filter_map(heard_of)
            .collect();
        if heard.is_empty() {
            return Ok(Kept { new: 0 });
        }
        let recorded = self.store_record(0, &heard).await?;
        Ok(Kept { new: recorded.new })
    }

    /// Closes the breaker and clears its counts, for every process sharing its store: what
    /// a person does once the cause is mended. Nothing else closes it.
    ///
    /// ```
    /// # use mail_breaker::reputation::{ReputationBreaker, Tier};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let breaker = ReputationBreaker::builder("ses").build()?;
    /// breaker.reset().await?;
    /// assert_eq!(breaker.tier(), Tier::Healthy);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn reset(&self) -> Result<(), KeepError> {
        let change = self
            .shared
            .store
            .reset(&self.shared.member, &self.shared.rules)
            .await?;
        tracing::warn!(member = %self.shared.member, from = %change.from, "reputation.reset");
        self.changed(change, Standing::default());
        Ok(())
    }

    /// A transport that sends through `inner` for this member: see
    /// [`ReputationTransport`](super::ReputationTransport).
    ///
    /// ```
    /// # use mail_breaker::{LettreTransport, Transport};
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// let ses = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name("ses");
    /// let transport = ReputationBreaker::builder("ses").build()?.wrap(ses);
    /// assert_eq!(transport.name(), "ses");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn wrap<T>(&self, inner: T) -> super::ReputationTransport<T> {
        super::ReputationTransport::new(inner, self.clone())
    }

    /// `Ok` when a send may go; the hold when the breaker is open. A store that cannot be
    /// reached is answered from the tier last heard.
    pub(crate) async fn admit(&self, transport: &str) -> Result<(), SendError> {
        let tier = match self.standing().await {
            Ok(standing) => standing.tier,
            Err(error) => {
                tracing::warn!(member = %self.shared.member, error = %error, "reputation.store_unreachable: deciding from the tier last heard");
                self.tier()
            }
        };
        if tier < Tier::Open {
            return Ok(());
        }
        Err(SendError::new(
            Category::ServiceUnavailable,
            "reputation.open",
            format!(
                "member {} is held back for its bounces or complaints: nothing was sent; \
                 a person resets its reputation breaker",
                self.shared.member
            ),
        )
        .with_transport(transport)
        .not_attempted()
        .refusing_every_message()
        .held_for_reputation(self.shared.failover))
    }

    /// Counts `sends` sends the provider accepted. A store that cannot be reached loses
    /// them, with a warning: the send itself went.
    pub(crate) async fn sent(&self, sends: u64) {
        if sends == 0 {
            return;
        }
        if let Err(error) = self.store_record(sends, &[]).await {
            tracing::warn!(member = %self.shared.member, sends, error = %error, "reputation.sends_not_counted");
        }
    }

    /// Counts `heard` as [`record`](Self::record) would, for the crate's own tests.
    #[cfg(test)]
    pub(crate) async fn store_record_for_tests(&self, heard: &[Heard]) {
        self.store_record(0, heard)
            .await
            .expect("a memory store answers");
    }

    async fn store_record(&self, sends: u64, heard: &[Heard]) -> Result<Recorded, KeepError> {
        let recorded = self
            .shared
            .store
            .record(&self.shared.member, &self.shared.rules, sends, heard)
            .await?;
        self.changed(recorded.change, recorded.standing);
        Ok(recorded)
    }

    /// Tells the listener, the logs and the metrics of a change this process's call made.
    fn changed(&self, change: TierChange, standing: Standing) {
        self.shared
            .last
            .store(change.to.number(), Ordering::Relaxed);
        record_metrics(&self.shared.member, standing);
        if !change.changed() {
            return;
        }
        let member = &self.shared.member;
        let window = standing.window;
        tracing::warn!(
            member = %member,
            from = %change.from,
            to = %change.to,
            sends = window.sends,
            hard_bounces = window.hard_bounces,
            complaints = window.complaints,
            "reputation.tier_changed"
        );
        if change.to == Tier::Throttle && !self.is_paced() {
            tracing::warn!(
                member = %member,
                "reputation.throttle_unpaced: the member has no rate limit to halve; it sends as before"
            );
        }
        if let Some(listener) = &self.shared.listener {
            listener(member, change);
        }
    }

    /// A tier heard from the store without this process changing it (another process did).
    fn heard_tier(&self, standing: Standing) {
        self.shared
            .last
            .store(standing.tier.number(), Ordering::Relaxed);
    }
}

/// The signal an event gives, with its id; `None` for events that say nothing of reputation.
fn heard_of(event: &DeliveryEvent) -> Option<Heard> {
    let signal = match event.kind {
        EventKind::Bounced {
            bounce: BounceKind::Permanent,
            ..
        } => Signal::HardBounce,
        EventKind::Complained { .. } => Signal::Complaint,
        _ => return None,
    };
    Some(Heard {
        id: format!("{}:{}:{}", event.provider, event.event_id, event.recipient),
        signal,
    })
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn record_metrics(member: &str, standing: Standing) {
    #[cfg(feature = "metrics")]
    {
        let label = member.to_owned();
        ::metrics::gauge!(crate::metrics::REPUTATION_TIER, "member" => label.clone())
            .set(standing.tier.number() as f64);
        ::metrics::gauge!(crate::metrics::REPUTATION_HARD_BOUNCE_RATE, "member" => label.clone())
            .set(standing.window.hard_bounce_rate());
        ::metrics::gauge!(crate::metrics::REPUTATION_COMPLAINT_RATE, "member" => label)
            .set(standing.window.complaint_rate());
    }
}

impl crate::rate::RateFactor for ReputationBreaker {
    /// ½ from `throttle` up: see [`ReputationBreaker::rate_factor`].
    fn rate_factor(&self) -> f64 {
        ReputationBreaker::rate_factor(self)
    }

    fn read_by(&self, _limiter: &str) {
        self.shared.paced.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl EventSink for ReputationBreaker {
    /// Counts the member's permanent bounces and complaints: see
    /// [`record`](ReputationBreaker::record).
    async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
        self.record(events).await
    }
}

impl fmt::Debug for ReputationBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReputationBreaker")
            .field("member", &self.shared.member)
            .field("tier", &self.tier())
            .field("rules", &self.shared.rules)
            .field("store", &self.shared.store)
            .field("failover", &self.shared.failover)
            .finish()
    }
}

/// The settings of a [`ReputationBreaker`]; made by [`ReputationBreaker::builder`].
///
/// ```
/// use mail_breaker::reputation::{Limits, ReputationBreaker};
///
/// let breaker = ReputationBreaker::builder("ses")
///     .hard_bounces(Limits { open: 25_000, ..Limits::HARD_BOUNCES }) // under throttle's 3 %
///     .build();
/// assert_eq!(breaker.unwrap_err().setting(), "hard_bounces");
/// ```
#[must_use = "a builder does nothing until .build()"]
pub struct ReputationBuilder {
    member: String,
    rules: ReputationRules,
    store: Option<Arc<dyn ReputationStore>>,
    failover: bool,
    listener: Option<Arc<Listener>>,
}

impl ReputationBuilder {
    /// All the rules at once (default [`ReputationRules::default`]).
    ///
    /// ```
    /// # use mail_breaker::reputation::{ReputationBreaker, ReputationRules};
    /// let rules = ReputationRules { window_sends: 50_000, ..ReputationRules::default() };
    /// let breaker = ReputationBreaker::builder("ses").rules(rules).build()?;
    /// assert_eq!(breaker.rules().bucket_sends(), 5_000);
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn rules(mut self, rules: ReputationRules) -> Self {
        self.rules = rules;
        self
    }

    /// The hard bounces' thresholds and minimum volume (default [`Limits::HARD_BOUNCES`]).
    ///
    /// ```
    /// # use mail_breaker::reputation::{Limits, ReputationBreaker};
    /// let strict = Limits { warn: 10_000, throttle: 20_000, open: 30_000, minimum_sends: 1_000 };
    /// let breaker = ReputationBreaker::builder("ses").hard_bounces(strict).build()?;
    /// assert_eq!(breaker.rules().hard_bounces.open, 30_000);
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn hard_bounces(mut self, limits: Limits) -> Self {
        self.rules.hard_bounces = limits;
        self
    }

    /// The complaints' thresholds and minimum volume (default [`Limits::COMPLAINTS`]).
    ///
    /// ```
    /// # use mail_breaker::reputation::{Limits, ReputationBreaker};
    /// let lenient = Limits { open: 1_000, ..Limits::COMPLAINTS }; // 0.1 %
    /// let breaker = ReputationBreaker::builder("ses").complaints(lenient).build()?;
    /// assert_eq!(breaker.rules().complaints.open, 1_000);
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn complaints(mut self, limits: Limits) -> Self {
        self.rules.complaints = limits;
        self
    }

    /// Where the counts and the open flag are kept (default: a [`MemoryReputation`] of this
    /// breaker's own). A `RedisStore` shares them with every process using it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use mail_breaker::reputation::{MemoryReputation, ReputationBreaker};
    /// let store = Arc::new(MemoryReputation::new());
    /// let breaker = ReputationBreaker::builder("ses").store(store).build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn store(mut self, store: Arc<dyn ReputationStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// `reputation.failover`: whether a pool may hand the member's mail to the next member
    /// while the breaker is open (default `false`: failing over then burns the next account
    /// too, unless it is another provider's with a reputation of its own).
    ///
    /// ```
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// let breaker = ReputationBreaker::builder("postmark").failover(true).build()?;
    /// assert!(breaker.fails_over());
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn failover(mut self, failover: bool) -> Self {
        self.failover = failover;
        self
    }

    /// Called with the member's name and the change on each change of tier a call in this
    /// process made (a send, an event, a reset): `warn`, `throttle`, `open` and back.
    ///
    /// ```
    /// # use mail_breaker::reputation::{ReputationBreaker, Tier};
    /// let breaker = ReputationBreaker::builder("ses")
    ///     .on_tier_change(|member, change| {
    ///         if change.to >= Tier::Warn {
    ///             eprintln!("{member}'s reputation: {}", change.to);
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn on_tier_change(
        mut self,
        listener: impl Fn(&str, TierChange) + Send + Sync + 'static,
    ) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// Builds the breaker; a [`ConfigError`] naming the first setting that cannot work (see
    /// [`ReputationRules::check`]) or `member` when it is empty.
    ///
    /// ```
    /// # use mail_breaker::reputation::ReputationBreaker;
    /// assert_eq!(ReputationBreaker::builder("").build().unwrap_err().setting(), "member");
    /// ```
    pub fn build(self) -> Result<ReputationBreaker, ConfigError> {
        if self.member.is_empty() {
            return Err(ConfigError::new("member", "must name the member, got \"\""));
        }
        self.rules.check()?;
        let store = self
            .store
            .unwrap_or_else(|| Arc::new(MemoryReputation::new()));
        Ok(ReputationBreaker {
            shared: Arc::new(Shared {
                member: self.member,
                rules: self.rules,
                store,
                failover: self.failover,
                last: AtomicI64::new(Tier::Healthy.number()),
                listener: self.listener,
                paced: AtomicBool::new(false),
            }),
        })
    }
}

impl fmt::Debug for ReputationBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReputationBuilder")
            .field("member", &self.member)
            .field("rules", &self.rules)
            .field("failover", &self.failover)
            .finish_non_exhaustive()
    }
}
