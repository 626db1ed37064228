//! [`Mailer`]: the stack a [`MailerConfig`] describes, built and ready to send.
//!
//! Each member is its provider, paced by its rate limit if it has one, behind its own
//! breaker; the members are pooled (in order for `failover`, in turn for `roundrobin`); a
//! retry goes around the pool; an outbox, if configured, keeps what the stack cannot send
//! now and a worker in the background sends it later.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::ConfigError;
use super::provider::Provider;
use super::tree::{
    Backoff, BreakerConfig, Budget, ConnectionConfig, Counting, MailerConfig, MemberConfig,
    RateConfig, RedisConfig, RetryConfig, Strategy,
};
use crate::{
    CircuitBreakerTransport, Envelope, Message, PoolTransport, RateLimitTransport, Receipt,
    RetryTransport, SendError, Transport,
};

/// A member's breaker as a [`Mailer`] holds it: around its provider (and rate limit), boxed
/// so that every member's breaker is of one type.
pub type MemberBreaker = CircuitBreakerTransport<Box<dyn Transport>>;

/// A member's rate limit as a [`Mailer`] holds it, from [`Mailer::limiters`]: its name (the
/// member's), the rate configured and the rate now.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mailer = mail_breaker::Mailer::from_dsn("smtp://relay:587?rate=10/s&rate.adaptive=true")?
///     .build()
///     .await?;
/// for limiter in mailer.limiters() {
///     println!("{}: {} of {} a second", limiter.name(), limiter.per_second(), limiter.configured_per_second());
/// }
/// # Ok(())
/// # }
/// ```
pub struct MemberLimiter {
    name: String,
    configured: f64,
    adaptive: bool,
    limiter: Arc<RateLimitTransport<Box<dyn Transport>>>,
}

impl fmt::Debug for MemberLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemberLimiter")
            .field("name", &self.name)
            .field("configured", &self.configured)
            .field("per_second", &self.per_second())
            .field("adaptive", &self.adaptive)
            .finish()
    }
}

impl MemberLimiter {
    /// The member's name, which the limiter goes by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rate configured, in sends per second.
    pub fn configured_per_second(&self) -> f64 {
        self.configured
    }

    /// The rate allowed now: the configured rate, or less while an adaptive limiter recovers
    /// from a provider's throttle.
    pub fn per_second(&self) -> f64 {
        self.limiter.per_second()
    }

    /// Whether a provider's throttle lowers the rate.
    pub fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    /// The limiter itself.
    pub fn limiter(&self) -> &RateLimitTransport<Box<dyn Transport>> {
        &self.limiter
    }
}

/// The whole stack a [`MailerConfig`] describes, as one [`Transport`]; with its members'
/// breakers by name, for snapshots, isolation and reset.
///
/// ```no_run
/// use mail_breaker::config::Mailer;
/// use mail_breaker::Transport;
///
/// # async fn run(message: lettre::Message) -> Result<(), Box<dyn std::error::Error>> {
/// let mailer = Mailer::from_dsn(&std::env::var("MAILER_DSN")?)?.build().await?;
/// mailer.send(&message).await?;
/// if let Some(breaker) = mailer.breaker("backup") {
///     println!("{:?}", breaker.snapshot().await.state());
/// }
/// # Ok(())
/// # }
/// ```
pub struct Mailer {
    stack: Box<dyn Transport>,
    breakers: Vec<(String, Arc<MemberBreaker>)>,
    limiters: Vec<MemberLimiter>,
    #[cfg(feature = "outbox")]
    outbox: Option<crate::outbox::Outbox>,
    /// Stops the outbox's worker when the mailer goes.
    #[cfg(feature = "outbox")]
    _worker: Option<WorkerGuard>,
    /// The stack behind the outbox, which its workers send through.
    #[cfg(feature = "outbox")]
    behind_outbox: Option<Arc<dyn Transport>>,
    /// The suppression list asked before every send, when configured.
    #[cfg(feature = "webhooks")]
    suppression: Option<crate::suppression::SuppressionList>,
    /// The members' reputation breakers (`reputation.*`), in the configuration's order.
    #[cfg(feature = "webhooks")]
    reputations: Vec<crate::reputation::ReputationBreaker>,
    /// The webhook receivers the configuration names (`webhooks.*`).
    #[cfg(feature = "webhooks")]
    receivers: Option<super::webhooks::Receivers>,
    /// The SES members' own transports by name, for reading their accounts' standing.
    #[cfg(feature = "ses")]
    ses_members: Vec<(String, crate::SesTransport)>,
    config: MailerConfig,
}

impl Mailer {
    /// Reads a DSN (see [`MailerConfig::from_dsn`]); [`build`](MailerConfig::build) makes
    /// the mailer.
    pub fn from_dsn(dsn: &str) -> Result<MailerConfig, ConfigError> {
        MailerConfig::from_dsn(dsn)
    }

    /// Reads a TOML document (see [`MailerConfig::from_toml`]);
    /// [`build`](MailerConfig::build) makes the mailer.
    pub fn from_toml(toml: &str) -> Result<MailerConfig, ConfigError> {
        MailerConfig::from_toml(toml)
    }

    /// The breaker of the member named `name` (its `name` setting, or its provider's name,
    /// as `smtp://relay.example.com:587`).
    pub fn breaker(&self, name: &str) -> Option<&MemberBreaker> {
        self.breakers
            .iter()
            .find(|(member, _)| member == name)
            .map(|(_, breaker)| &**breaker)
    }

    /// Every member's breaker with its name, in the configuration's order.
    pub fn breakers(&self) -> impl Iterator<Item = (&str, &MemberBreaker)> {
        self.breakers
            .iter()
            .map(|(name, breaker)| (name.as_str(), &**breaker))
    }

    /// The reputation breaker of the member named `name`, when its configuration has a
    /// `reputation` table: hand it to the webhook receivers as an
    /// [`EventSink`](crate::events::EventSink), reset it after the cause is mended.
    ///
    /// ```
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mailer = mail_breaker::Mailer::from_dsn(
    ///     "smtp://relay.example.com:587?name=relay&reputation.complaints.open=0.1%",
    /// )?
    /// .build()
    /// .await?;
    /// let breaker = mailer.reputation("relay").expect("configured");
    /// assert_eq!(breaker.rules().complaints.open, 1_000);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "webhooks")]
    pub fn reputation(&self, name: &str) -> Option<&crate::reputation::ReputationBreaker> {
        self.reputations
            .iter()
            .find(|breaker| breaker.member() == name)
    }

    /// Every member's reputation breaker, in the configuration's order (members without one
    /// left out).
    #[cfg(feature = "webhooks")]
    pub fn reputations(&self) -> impl Iterator<Item = &crate::reputation::ReputationBreaker> {
        self.reputations.iter()
    }

    /// The SES transport of the member named `name`, when that member sends through Amazon
    /// SES: its [`account`](crate::SesTransport::account) says the account's enforcement
    /// status (HEALTHY, PROBATION, SHUTDOWN), shown beside the member's reputation breaker.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mailer = mail_breaker::Mailer::from_dsn("ses://eu-west-1?name=ses")?.build().await?;
    /// if let Some(ses) = mailer.ses("ses") {
    ///     println!("{}", ses.account().await?.enforcement);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "ses")]
    pub fn ses(&self, name: &str) -> Option<&crate::SesTransport> {
        self.ses_members
            .iter()
            .find(|(member, _)| member == name)
            .map(|(_, ses)| ses)
    }

    /// Every member's rate limit, in the configuration's order (members without one left out).
    pub fn limiters(&self) -> impl Iterator<Item = &MemberLimiter> {
        self.limiters.iter()
    }

    /// The outbox the stack queues in, when it has one.
    #[cfg(feature = "outbox")]
    pub fn outbox(&self) -> Option<&crate::outbox::Outbox> {
        self.outbox.as_ref()
    }

    /// A new worker for the outbox, set up as the configuration says (`concurrency`,
    /// `lease`, `max_age`, `poll`, `at_most_once`), sending through the stack behind the
    /// outbox; `None` without an outbox. For draining in the foreground a mailer built with
    /// [`build_without_worker`](MailerConfig::build_without_worker):
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use mail_breaker::config::Mailer;
    ///
    /// let mailer = Mailer::from_dsn("smtp://127.0.0.1:2525?outbox=sqlite:///tmp/outbox.db")?
    ///     .build_without_worker()
    ///     .await?;
    /// if let Some(worker) = mailer.worker() {
    ///     worker.drain().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "outbox")]
    pub fn worker(&self) -> Option<crate::outbox::Worker<Arc<dyn Transport>>> {
        let outbox = self.outbox.as_ref()?;
        let config = self.config.outbox.as_ref()?;
        let behind = Arc::clone(self.behind_outbox.as_ref()?);
        Some(configured_worker(
            outbox,
            behind,
            config,
            self.config.at_most_once_anywhere(),
        ))
    }

    /// The suppression list the stack asks before every send (`suppression=true`), when it
    /// has one: give it to the webhook receivers as their [`EventSink`](crate::events::EventSink),
    /// or operate it by hand.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use mail_breaker::config::Mailer;
    /// use mail_breaker::suppression::Reason;
    ///
    /// let mailer = Mailer::from_dsn(
    ///     "smtp://127.0.0.1:2525?outbox=sqlite:///tmp/outbox.db&suppression=true",
    /// )?
    /// .build()
    /// .await?;
    /// if let Some(list) = mailer.suppression() {
    ///     list.add("unsubscribed@example.org", Reason::Manual).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "webhooks")]
    pub fn suppression(&self) -> Option<&crate::suppression::SuppressionList> {
        self.suppression.as_ref()
    }

    /// The sink the webhook receivers keep events in: the suppression list (when the stack
    /// has one) and every member's reputation breaker, each event kept once by its id; `None`
    /// when the stack has neither. See [`MailerEvents`](super::MailerEvents).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let mailer = mail_breaker::Mailer::from_dsn("smtp://127.0.0.1:2525?name=relay&reputation.failover=false")?
    ///     .build()
    ///     .await?;
    /// assert!(mailer.event_sink().is_some(), "the relay's reputation breaker");
    /// let plain = mail_breaker::Mailer::from_dsn("smtp://127.0.0.1:2525")?.build().await?;
    /// assert!(plain.event_sink().is_none(), "nothing to feed");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "webhooks")]
    pub fn event_sink(&self) -> Option<super::MailerEvents> {
        super::MailerEvents::new(self.suppression.clone(), self.reputations.clone())
    }

    /// The webhook receivers the configuration names (`webhooks.*`: each provider's secret,
    /// the member its events are about, the body limit), keeping what they verify in
    /// [`event_sink`](Self::event_sink); `None` without a `webhooks` table. Each call gives
    /// receivers of their own (Mailgun's used tokens are remembered per receiver): build the
    /// router once.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let dsn = format!(
    ///     "resend://re_123@default?outbox=sqlite://{}/outbox.db&suppression=true\
    ///      &webhooks.resend.secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ///     dir.path().display()
    /// );
    /// let mailer = mail_breaker::Mailer::from_dsn(&dsn)?.build().await?;
    /// let receivers = mailer.webhooks().expect("a webhooks table");
    /// // Providers post to /webhooks/resend; each route authenticates itself.
    /// let app: axum::Router = axum::Router::new().nest("/webhooks", receivers.router());
    /// # let _ = app;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "webhooks")]
    pub fn webhooks(&self) -> Option<crate::webhooks::Webhooks> {
        let receivers = self.receivers.as_ref()?;
        let sink = self.event_sink()?;
        Some(receivers.webhooks(Arc::new(sink)))
    }

    /// Whether the members' breakers keep their state in a shared store (Redis, `[redis]`
    /// or `redis=` in the DSN), so that [`isolate`](crate::CircuitBreakerTransport::isolate)
    /// and [`reset`](crate::CircuitBreakerTransport::reset) reach every process that shares
    /// it. Without one each process has breakers of its own.
    pub fn shares_breakers(&self) -> bool {
        self.config.redis.is_some()
    }
}

impl fmt::Debug for Mailer {
    /// The tree of the stack, every key and password as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailer")
            .field("name", &self.stack.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Transport for Mailer {
    fn name(&self) -> &str {
        self.stack.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        use tracing::Instrument as _;
        let span = crate::telemetry::send_span();
        let result = self
            .stack
            .send_raw(envelope, raw)
            .instrument(span.clone())
            .await;
        crate::telemetry::ended(&span, &result);
        result
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        use tracing::Instrument as _;
        let span = crate::telemetry::send_span();
        let result = self.stack.send(message).instrument(span.clone()).await;
        crate::telemetry::ended(&span, &result);
        result
    }

    fn send_many<'a>(&'a self, messages: crate::MessageStream<'a>) -> crate::ReceiptStream<'a> {
        self.stack.send_many(messages)
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.stack.verify().await
    }
}

impl MailerConfig {
    /// Builds the stack: connects to Redis and opens the outbox if configured, makes each
    /// member's provider, rate limit and breaker, and starts the outbox's worker (which
    /// stops when the mailer is dropped).
    ///
    /// A Redis that refuses the password or whose certificate is not trusted is an error
    /// here, naming `redis.url`; one that does not answer is not: the breakers decide alone
    /// until it does, as [`RedisStore`](crate::RedisStore) does. An outbox that cannot be
    /// opened is an error naming `outbox.url`.
    pub async fn build(self) -> Result<Mailer, ConfigError> {
        self.build_with(true).await
    }

    /// Builds the stack as [`build`](Self::build) does, but starts no outbox worker: mail the
    /// stack cannot send is queued and stays there until a worker (another process's, or
    /// [`Mailer::worker`]) sends it. For tools that read or operate the outbox.
    pub async fn build_without_worker(self) -> Result<Mailer, ConfigError> {
        self.build_with(false).await
    }

    /// Whether at-most-once was asked for anywhere: on the stack, on the retry or on the
    /// outbox. Asked once, it holds for every layer the mailer builds (DESIGN §19): the pool
    /// does not fail over, the retry does not resend and the worker dead-letters a message
    /// that may have been delivered, whichever of the three settings said so.
    fn at_most_once_anywhere(&self) -> bool {
        self.at_most_once
            || self.retry.as_ref().is_some_and(|retry| retry.at_most_once)
            || self
                .outbox
                .as_ref()
                .is_some_and(|outbox| outbox.at_most_once)
    }

    #[cfg_attr(not(feature = "outbox"), allow(unused_variables))]
    async fn build_with(self, start_worker: bool) -> Result<Mailer, ConfigError> {
        let at_most_once = self.at_most_once_anywhere();
        let store = match &self.redis {
            Some(redis) => Some(connect(redis).await?),
            None => None,
        };
        let mut breakers: Vec<(String, Arc<MemberBreaker>)> = Vec::new();
        let mut limiters = Vec::new();
        #[cfg(feature = "webhooks")]
        let reputation_store = reputation_store(store.as_ref());
        #[cfg(not(feature = "webhooks"))]
        let reputation_store = ();
        #[cfg(feature = "webhooks")]
        let mut reputations = Vec::new();
        #[cfg(feature = "ses")]
        let mut ses_members = Vec::new();
        for (index, member) in self.members.iter().enumerate() {
            let path = format!("member[{index}]");
            let BuiltMember {
                name,
                breaker,
                limiter,
                reputation,
                ses,
            } = build_member(member, &path, store.as_ref(), &reputation_store)?;
            #[cfg(feature = "webhooks")]
            reputations.extend(reputation);
            #[cfg(not(feature = "webhooks"))]
            let () = reputation;
            #[cfg(feature = "ses")]
            ses_members.extend(ses.map(|ses| (name.clone(), ses)));
            #[cfg(not(feature = "ses"))]
            let () = ses;
            if let Some(taken) = breakers.iter().position(|(other, _)| *other == name) {
                return Err(ConfigError::new(
                    format!("{path}.name"),
                    format!("member[{taken}] has the same name; give one of them its own name"),
                ));
            }
            breakers.push((name, breaker));
            limiters.extend(limiter);
        }
        #[cfg(feature = "webhooks")]
        let receivers = match &self.webhooks {
            Some(webhooks) => {
                let names: Vec<&str> = breakers.iter().map(|(name, _)| name.as_str()).collect();
                Some(super::webhooks::Receivers::new(
                    webhooks,
                    &self.members,
                    &names,
                )?)
            }
            None => None,
        };
        let pooled: Box<dyn Transport> = match breakers.as_slice() {
            [(_, only)] => Box::new(Arc::clone(only)),
            members => {
                let mut pool = PoolTransport::builder().strategy(match self.strategy {
                    Strategy::Failover => crate::Strategy::Priority,
                    Strategy::RoundRobin => crate::Strategy::RoundRobin,
                });
                if at_most_once {
                    pool = pool.at_most_once();
                }
                for (index, ((_, breaker), member)) in members.iter().zip(&self.members).enumerate()
                {
                    let order = u32::try_from(index).unwrap_or(u32::MAX);
                    pool = pool.add(Arc::clone(breaker), member.priority.unwrap_or(order));
                }
                Box::new(pool.build().map_err(|error| error.within("member"))?)
            }
        };
        let stack: Box<dyn Transport> = match &self.retry {
            Some(retry) => Box::new(build_retry(pooled, retry, at_most_once)?),
            None => pooled,
        };
        #[cfg(feature = "outbox")]
        {
            let suppression = Suppression::new(self.suppression, store.as_ref());
            #[cfg_attr(not(feature = "webhooks"), allow(unused_variables))]
            let (stack, outbox, worker, behind_outbox, suppression) = match &self.outbox {
                Some(config) => {
                    with_outbox(stack, config, at_most_once, start_worker, suppression).await?
                }
                None => {
                    let (stack, list) = suppression.around(stack, None)?;
                    (stack, None, None, None, list)
                }
            };
            Ok(Mailer {
                stack,
                breakers,
                limiters,
                outbox,
                _worker: worker,
                behind_outbox,
                #[cfg(feature = "webhooks")]
                suppression,
                #[cfg(feature = "webhooks")]
                reputations,
                #[cfg(feature = "webhooks")]
                receivers,
                #[cfg(feature = "ses")]
                ses_members,
                config: self,
            })
        }
        #[cfg(not(feature = "outbox"))]
        Ok(Mailer {
            stack,
            breakers,
            limiters,
            #[cfg(feature = "webhooks")]
            reputations,
            #[cfg(feature = "ses")]
            ses_members,
            config: self,
        })
    }
}

/// The Redis store the breakers and shared rate limits keep their state in.
#[cfg(feature = "redis")]
type Store = Arc<crate::RedisStore>;
/// Without the `redis` feature there is none ([`MailerConfig`] refuses a `[redis]`).
#[cfg(not(feature = "redis"))]
type Store = std::convert::Infallible;

/// Where the members' reputation breakers keep their state: the Redis store the breakers
/// share, or one memory store for the mailer's members.
#[cfg(feature = "webhooks")]
type ReputationStore = Arc<dyn crate::reputation::ReputationStore>;
/// Without the `webhooks` feature there is none ([`MailerConfig`] refuses `reputation`).
#[cfg(not(feature = "webhooks"))]
type ReputationStore = ();

#[cfg(feature = "webhooks")]
fn reputation_store(store: Option<&Store>) -> ReputationStore {
    match store {
        #[cfg(feature = "redis")]
        Some(store) => Arc::clone(store) as ReputationStore,
        _ => Arc::new(crate::reputation::MemoryReputation::new()),
    }
}

/// A member's reputation breaker as the mailer keeps it, when it has one.
#[cfg(feature = "webhooks")]
type HeldReputation = Option<crate::reputation::ReputationBreaker>;
#[cfg(not(feature = "webhooks"))]
type HeldReputation = ();

/// The member's provider held back by its reputation breaker, innermost (the breaker is
/// the member's own), when its configuration has a `reputation` table.
#[cfg(feature = "webhooks")]
fn with_reputation(
    provider: Box<dyn Transport>,
    member: &MemberConfig,
    name: &str,
    path: &str,
    store: &ReputationStore,
) -> Result<(Box<dyn Transport>, HeldReputation), ConfigError> {
    use crate::reputation::{Limits, ReputationBreaker, ReputationRules};
    let Some(config) = &member.reputation else {
        return Ok((provider, None));
    };
    let limits = |given: &super::tree::LimitsConfig, default: Limits| Limits {
        warn: given.warn.unwrap_or(default.warn),
        throttle: given.throttle.unwrap_or(default.throttle),
        open: given.open.unwrap_or(default.open),
        minimum_sends: given.min_sends.unwrap_or(default.minimum_sends),
    };
    let defaults = ReputationRules::default();
    let rules = ReputationRules {
        hard_bounces: limits(&config.hard_bounces, defaults.hard_bounces),
        complaints: limits(&config.complaints, defaults.complaints),
        window_sends: config.window_sends.unwrap_or(defaults.window_sends),
        buckets: config.buckets.unwrap_or(defaults.buckets),
    };
    let breaker = ReputationBreaker::builder(name)
        .rules(rules)
        .store(Arc::clone(store))
        .failover(config.failover)
        .build()
        .map_err(|error| error.within(&format!("{path}.reputation")))?;
    Ok((Box::new(breaker.wrap(provider)), Some(breaker)))
}

#[cfg(not(feature = "webhooks"))]
fn with_reputation(
    provider: Box<dyn Transport>,
    _member: &MemberConfig,
    _name: &str,
    _path: &str,
    _store: &ReputationStore,
) -> Result<(Box<dyn Transport>, HeldReputation), ConfigError> {
    Ok((provider, ()))
}

/// An SES member's own transport as the mailer keeps it, for its account's standing.
#[cfg(feature = "ses")]
type HeldSes = Option<crate::SesTransport>;
#[cfg(not(feature = "ses"))]
type HeldSes = ();

/// What building one member gives the mailer.
struct BuiltMember {
    name: String,
    breaker: Arc<MemberBreaker>,
    limiter: Option<MemberLimiter>,
    reputation: HeldReputation,
    /// The SES member's own transport, for its account's standing.
    ses: HeldSes,
}

/// A member's name, breaker, rate limit, reputation breaker and (SES) own transport.
fn build_member(
    member: &MemberConfig,
    path: &str,
    store: Option<&Store>,
    reputation_store: &ReputationStore,
) -> Result<BuiltMember, ConfigError> {
    let (provider, ses) = build_provider(&member.provider, &member.connection, path)?;
    let name = member
        .name
        .clone()
        .unwrap_or_else(|| provider.name().to_owned());
    let (provider, reputation) = with_reputation(provider, member, &name, path, reputation_store)?;
    let rate = member
        .rate
        .clone()
        .or_else(|| default_rate(&member.provider));
    let (paced, limiter): (Box<dyn Transport>, _) = match &rate {
        Some(rate) => {
            // Amazon SES counts each recipient against its maximum send rate.
            let per_recipient = matches!(member.provider, Provider::Ses { .. });
            let limiter = Arc::new(build_rate(
                provider,
                rate,
                &name,
                store,
                path,
                per_recipient,
                &reputation,
            )?);
            let held = MemberLimiter {
                name: name.clone(),
                configured: rate.per_second,
                adaptive: rate.adaptive == Some(true),
                limiter: Arc::clone(&limiter),
            };
            (Box::new(limiter), Some(held))
        }
        None => (provider, None),
    };
    let breaker = build_breaker(paced, &member.breaker, store)
        .map_err(|error| error.within(&format!("{path}.breaker")))?;
    Ok(BuiltMember {
        name,
        breaker: Arc::new(breaker),
        limiter,
        reputation,
        ses,
    })
}

/// The member's provider, reached as `connection` says. `path` is the member's: an error in
/// its URL names `path.url`, one in a connection setting that setting.
fn build_provider(
    provider: &Provider,
    connection: &ConnectionConfig,
    path: &str,
) -> Result<(Box<dyn Transport>, HeldSes), ConfigError> {
    let url_path = format!("{path}.url");
    #[cfg(not(feature = "ses"))]
    let none = ();
    #[cfg(feature = "ses")]
    let none = None;
    match provider {
        #[cfg(feature = "smtp")]
        Provider::Smtp { url } => {
            let smtp = smtp_builder(&url.0, connection)
                .map_err(|error| error.within(&url_path))?
                .build()
                .map_err(|error| {
                    let within = if CONNECTION_SETTINGS.contains(&error.setting()) {
                        path
                    } else {
                        &url_path
                    };
                    error.within(within)
                })?;
            Ok((Box::new(smtp), none))
        }
        #[cfg(feature = "ses")]
        Provider::Ses { region, endpoint } => {
            let mut ses = ses(region, endpoint.as_deref(), &url_path)?;
            if let Some(timeout) = connection.timeout {
                ses = ses.with_timeout(timeout);
            }
            // A clone shares the client: the account is read with the member's own.
            Ok((Box::new(ses.clone()), Some(ses)))
        }
        Provider::Api {
            api,
            key,
            domain,
            eu,
            endpoint,
        } => api_transport(
            *api,
            &key.0,
            domain.as_deref(),
            *eu,
            endpoint.as_deref(),
            connection.timeout,
            &url_path,
        )
        .map(|transport| (transport, none)),
        #[cfg(feature = "graph")]
        Provider::Graph {
            client_id,
            secret,
            tenant,
            sender,
            endpoint,
            token_url,
        } => {
            let mut settings =
                crate::oauth::ClientCredentials::for_graph(tenant, client_id, &secret.0);
            if let Some(url) = token_url {
                settings.token_url.clone_from(url);
            }
            // The URL's reader has checked every setting the source refuses.
            let tokens = settings.build().map_err(|error| error.within(&url_path))?;
            let mut graph = crate::GraphTransport::new(sender, tokens);
            if let Some(endpoint) = endpoint {
                graph = graph.with_endpoint(endpoint);
            }
            if let Some(timeout) = connection.timeout {
                graph = graph.with_timeout(timeout);
            }
            Ok((Box::new(graph), none))
        }
        #[allow(unreachable_patterns)]
        _ => Err(ConfigError::new(
            url_path,
            "this provider is not built in this version of the crate",
        )),
    }
}

/// The rate limit of a member that sets none: Exchange Online's 30 messages a minute for a
/// Graph member (0.5 a second, one at a time), none for the others.
fn default_rate(provider: &Provider) -> Option<RateConfig> {
    matches!(provider, Provider::Graph { .. }).then(|| RateConfig {
        per_second: 0.5,
        burst: Some(1),
        max_in_flight: None,
        max_wait: None,
        adaptive: None,
        min_per_second: None,
        shared: false,
        fleet: None,
    })
}

/// The settings of an SMTP member's connections, as the builder names them.
#[cfg(feature = "smtp")]
const CONNECTION_SETTINGS: [&str; 4] = [
    "timeout",
    "max_connections",
    "idle_timeout",
    "max_messages_per_connection",
];

/// The SMTP transport's builder for `url`, with the member's connection settings.
#[cfg(feature = "smtp")]
fn smtp_builder(
    url: &str,
    connection: &ConnectionConfig,
) -> Result<crate::SmtpBuilder, ConfigError> {
    let mut builder = super::smtp_url::read(url)?.builder()?;
    let smtp = &connection.smtp;
    if let Some(timeout) = connection.timeout {
        builder = builder.timeout(timeout);
    }
    if let Some(connections) = smtp.max_connections {
        builder = builder.max_connections(connections);
    }
    if let Some(idle) = smtp.idle_timeout {
        builder = builder.idle_timeout(idle);
    }
    if let Some(messages) = smtp.max_messages_per_connection {
        builder = builder.max_messages_per_connection(messages);
    }
    if let Some(on) = smtp.pipelining {
        builder = builder.pipelining(on);
    }
    if let Some(on) = smtp.chunking {
        builder = builder.chunking(on);
    }
    Ok(builder)
}

#[allow(unused_variables)]
fn api_transport(
    api: super::provider::Api,
    key: &str,
    domain: Option<&str>,
    eu: bool,
    endpoint: Option<&str>,
    timeout: Option<Duration>,
    path: &str,
) -> Result<Box<dyn Transport>, ConfigError> {
    #[allow(unused_imports)] // unused when no HTTP API is built
    use super::provider::Api;
    let not_built = || {
        ConfigError::new(
            path.to_owned(),
            "this provider is not built in this version of the crate",
        )
    };
    match api {
        #[cfg(feature = "postmark")]
        Api::Postmark => {
            let mut postmark = crate::PostmarkTransport::new(key);
            if let Some(endpoint) = endpoint {
                postmark = postmark.with_endpoint(endpoint);
            }
            if let Some(timeout) = timeout {
                postmark = postmark.with_timeout(timeout);
            }
            Ok(Box::new(postmark))
        }
        #[cfg(feature = "resend")]
        Api::Resend => {
            let mut resend = crate::ResendTransport::new(key);
            if let Some(endpoint) = endpoint {
                resend = resend.with_endpoint(endpoint);
            }
            if let Some(timeout) = timeout {
                resend = resend.with_timeout(timeout);
            }
            Ok(Box::new(resend))
        }
        #[cfg(feature = "sendgrid")]
        Api::SendGrid => {
            let mut sendgrid = crate::SendGridTransport::new(key);
            if eu {
                sendgrid = sendgrid.eu();
            }
            if let Some(endpoint) = endpoint {
                sendgrid = sendgrid.with_endpoint(endpoint);
            }
            if let Some(timeout) = timeout {
                sendgrid = sendgrid.with_timeout(timeout);
            }
            Ok(Box::new(sendgrid))
        }
        #[cfg(feature = "mailgun")]
        Api::Mailgun => {
            let mut mailgun = crate::MailgunTransport::new(key, domain.unwrap_or_default());
            if eu {
                mailgun = mailgun.eu();
            }
            if let Some(endpoint) = endpoint {
                mailgun = mailgun.with_endpoint(endpoint);
            }
            if let Some(timeout) = timeout {
                mailgun = mailgun.with_timeout(timeout);
            }
            Ok(Box::new(mailgun))
        }
        #[allow(unreachable_patterns)]
        _ => Err(not_built()),
    }
}

/// SES in `region`, with the keys of the environment (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, and `AWS_SESSION_TOKEN` if set).
#[cfg(feature = "ses")]
fn ses(
    region: &str,
    endpoint: Option<&str>,
    path: &str,
) -> Result<crate::SesTransport, ConfigError> {
    use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
    let key = |name: &str| {
        std::env::var(name).map_err(|_| {
            ConfigError::new(
                path.to_owned(),
                format!("SES takes its keys from the environment, and {name} is not set"),
            )
        })
    };
    let credentials = Credentials::new(
        key("AWS_ACCESS_KEY_ID")?,
        key("AWS_SECRET_ACCESS_KEY")?,
        std::env::var("AWS_SESSION_TOKEN").ok(),
        None,
        "environment",
    );
    let mut config = aws_sdk_sesv2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(credentials);
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(crate::SesTransport::new(aws_sdk_sesv2::Client::from_conf(
        config.build(),
    )))
}

/// The member's provider paced by its rate limit, named as the member (so that limiters of
/// one name share a budget through Redis).
#[allow(unused_variables)]
fn build_rate(
    provider: Box<dyn Transport>,
    rate: &RateConfig,
    name: &str,
    store: Option<&Store>,
    path: &str,
    per_recipient: bool,
    reputation: &HeldReputation,
) -> Result<RateLimitTransport<Box<dyn Transport>>, ConfigError> {
    let mut builder = RateLimitTransport::builder(provider)
        .name(name)
        .per_second(rate.per_second);
    // The reputation breaker's throttle halves the member's rate (issue 64).
    #[cfg(feature = "webhooks")]
    if let Some(reputation) = reputation {
        builder = builder.slowed_by(reputation.clone());
    }
    if per_recipient {
        builder = builder.cost_per_recipient();
    }
    if let Some(burst) = rate.burst {
        builder = builder.burst(burst);
    }
    if let Some(max_in_flight) = rate.max_in_flight {
        builder = builder.max_in_flight(max_in_flight);
    }
    if let Some(max_wait) = rate.max_wait {
        builder = builder.max_wait(max_wait);
    }
    if let Some(adaptive) = rate.adaptive {
        builder = builder.adaptive(adaptive);
    }
    if let Some(min) = rate.min_per_second {
        builder = builder.min_per_second(min);
    }
    if let Some(fleet) = rate.fleet {
        builder = builder.members(fleet);
    }
    #[cfg(feature = "redis")]
    if rate.shared
        && let Some(store) = store
    {
        builder = builder.shared(Arc::clone(store));
    }
    builder
        .build()
        .map_err(|error| error.within(&format!("{path}.rate")))
}

#[allow(unused_variables)]
fn build_breaker(
    inner: Box<dyn Transport>,
    config: &BreakerConfig,
    store: Option<&Store>,
) -> Result<MemberBreaker, ConfigError> {
    let mut builder = CircuitBreakerTransport::builder(inner);
    match config.counting {
        Some(Counting::InARow(threshold)) => builder = builder.failure_threshold(threshold),
        Some(Counting::Rate {
            percent,
            min_calls,
            window,
        }) => {
            let defaults = crate::ErrorRate::default();
            builder = builder.error_rate(crate::ErrorRate {
                threshold_percent: percent,
                minimum_requests: min_calls.unwrap_or(defaults.minimum_requests),
                window: window.unwrap_or(defaults.window),
                ..defaults
            });
        }
        None => {}
    }
    if let Some(reset) = config.reset {
        builder = builder.reset_timeout(reset);
    }
    if let Some(longest) = config.max_reset {
        builder = builder.max_reset_timeout(longest);
    }
    if let Some(timeout) = config.probe_timeout {
        builder = builder.probe_timeout(timeout);
    }
    if let Some(successes) = config.half_open_successes {
        builder = builder.half_open_successes(successes);
    }
    if let Some(limit) = config.slow_call {
        builder = builder.slow_call(limit);
    }
    if config.per_recipient_domain == Some(true) {
        builder = builder.scope(crate::Scope::RecipientDomain);
    }
    if let Some(max_keys) = config.max_keys {
        builder = builder.max_keys(max_keys);
    }
    if let Some(shadow) = config.shadow {
        builder = builder.shadow(shadow);
    }
    #[cfg(feature = "redis")]
    if let Some(store) = store {
        builder = builder.store(Arc::clone(store) as Arc<dyn crate::store::BreakerStore>);
    }
    builder.build()
}

fn build_retry(
    inner: Box<dyn Transport>,
    config: &RetryConfig,
    at_most_once: bool,
) -> Result<RetryTransport<Box<dyn Transport>>, ConfigError> {
    let mut builder = RetryTransport::builder(inner);
    if let Some(attempts) = config.attempts {
        builder = builder.max_attempts(attempts);
    }
    match config.backoff {
        Some(Backoff::Exponential { initial, max }) => {
            builder = builder.backoff(crate::Backoff::exponential(initial, max));
        }
        Some(Backoff::Constant(delay)) => {
            builder = builder.backoff(crate::Backoff::constant(delay))
        }
        None => {}
    }
    if let Some(limit) = config.max_elapsed {
        builder = builder.max_elapsed(limit);
    }
    match config.budget {
        Some(Budget::Default) => builder = builder.budget(Arc::new(crate::RetryBudget::default())),
        Some(Budget::Tokens {
            tokens,
            min_tokens,
            error_cost,
        }) => {
            let budget = crate::RetryBudget::new(tokens, min_tokens, error_cost)
                .map_err(|error| error.within("retry.budget"))?;
            builder = builder.budget(Arc::new(budget));
        }
        None => {}
    }
    if at_most_once {
        builder = builder.at_most_once();
    }
    builder.build().map_err(|error| error.within("retry"))
}

/// Connects to the configured Redis (or cluster): a wrong address or password is an error
/// now, naming `redis.url`.
#[cfg(feature = "redis")]
async fn connect(config: &RedisConfig) -> Result<Store, ConfigError> {
    use crate::RedisStore;
    let ca = match &config.ca {
        Some(file) => Some(std::fs::read(file).map_err(|error| {
            ConfigError::new("redis.ca", format!("cannot read the file: {error}"))
        })?),
        None => None,
    };
    let urls: Vec<&str> = config.urls.iter().map(|url| url.0.as_str()).collect();
    let connected = match (config.cluster, &ca) {
        (false, None) => RedisStore::connect(urls[0]).await,
        (false, Some(ca)) => RedisStore::connect_with_ca(urls[0], ca).await,
        (true, None) => RedisStore::connect_cluster(&urls).await,
        (true, Some(ca)) => RedisStore::connect_cluster_with_ca(&urls, ca).await,
    };
    let setting = if config.cluster {
        "redis.cluster"
    } else {
        "redis.url"
    };
    let mut store =
        connected.map_err(|error| ConfigError::new(setting, error.reason().to_owned()))?;
    if let Some(quorum) = config.quorum {
        store = store.with_quorum(quorum);
    }
    if let Some(member) = &config.member {
        store = store.with_member(member.clone());
    }
    if let Some(namespace) = &config.namespace {
        store = store.with_namespace(namespace.clone());
    }
    if let Some(timeout) = config.timeout {
        store = store.with_timeout(timeout);
    }
    if let Some(interval) = config.retry_interval {
        store = store.with_retry_interval(interval);
    }
    Ok(Arc::new(store))
}

#[cfg(not(feature = "redis"))]
async fn connect(_: &RedisConfig) -> Result<Store, ConfigError> {
    Err(ConfigError::new(
        "redis",
        "a Redis store needs the crate's `redis` feature, which this build does not have",
    ))
}

/// Stops the outbox's worker when dropped: it claims nothing more and lets its sends in
/// flight finish.
#[cfg(feature = "outbox")]
struct WorkerGuard {
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The stack in front of an outbox (or the outbox alone, `queue_only`), a worker that
/// sends what it keeps through the same stack (unless `start_worker` is false), and that stack.
#[cfg(feature = "outbox")]
async fn with_outbox(
    stack: Box<dyn Transport>,
    config: &super::tree::OutboxConfig,
    at_most_once: bool,
    start_worker: bool,
    suppression: Suppression,
) -> Result<
    (
        Box<dyn Transport>,
        Option<crate::outbox::Outbox>,
        Option<WorkerGuard>,
        Option<Arc<dyn Transport>>,
        Option<SuppressionList>,
    ),
    ConfigError,
> {
    use super::tree::Database;
    use crate::outbox::{Outbox, OutboxTransport};
    let opened = match &config.database {
        Database::Sqlite(path) if config.must_exist => {
            let options = crate::outbox::OutboxOptions::new().existing_file_only();
            Outbox::sqlite_with(path, &options).await
        }
        Database::Sqlite(path) => Outbox::sqlite(path).await,
        #[cfg(feature = "postgres")]
        Database::Postgres(url) => Outbox::postgres(&url.0).await,
        #[cfg(not(feature = "postgres"))]
        Database::Postgres(_) => {
            return Err(ConfigError::new(
                "outbox.url",
                "an outbox on PostgreSQL needs the crate's `postgres` feature",
            ));
        }
    };
    let outbox =
        opened.map_err(|error| ConfigError::new("outbox.url", error.message().to_owned()))?;
    // The list is the first layer behind the outbox: mail queued before an address was
    // suppressed is checked when a worker sends it.
    let (stack, list) = suppression.around(stack, Some(&outbox))?;
    let stack: Arc<dyn Transport> = Arc::from(stack);
    let worker = Arc::new(configured_worker(
        &outbox,
        Arc::clone(&stack),
        config,
        at_most_once,
    ));
    worker.validate().map_err(|error| {
        ConfigError::new(
            format!("outbox.{}", error.setting()),
            error.reason().to_owned(),
        )
    })?;
    let guard = if start_worker {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A worker task that ends without being stopped is started again, and why is logged.
        let stopped = crate::outbox::supervise::stopped_by(stopped);
        tokio::spawn(crate::outbox::supervise::supervise(
            stopped,
            move |stopped| {
                let worker = Arc::clone(&worker);
                async move { worker.run(stopped).await }
            },
        ));
        Some(WorkerGuard { _stop: stop })
    } else {
        None
    };
    let front: Box<dyn Transport> = if config.queue_only {
        Box::new(OutboxTransport::queue_only(outbox.clone()))
    } else {
        let mut transport = OutboxTransport::send_or_queue(outbox.clone(), Arc::clone(&stack));
        if at_most_once {
            transport = transport.at_most_once();
        }
        Box::new(transport)
    };
    Ok((front, Some(outbox), guard, Some(stack), list))
}

/// The suppression list a configuration asks for, before it is opened.
#[cfg(feature = "outbox")]
struct Suppression {
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    config: Option<super::tree::SuppressionConfig>,
    #[cfg(all(feature = "webhooks", feature = "redis"))]
    redis: Option<Store>,
}

/// Without the `webhooks` feature there is no list ([`MailerConfig`] refuses `suppression`).
#[cfg(all(feature = "outbox", not(feature = "webhooks")))]
type SuppressionList = std::convert::Infallible;
#[cfg(feature = "webhooks")]
use crate::suppression::SuppressionList;

#[cfg(feature = "outbox")]
impl Suppression {
    #[cfg_attr(
        not(all(feature = "webhooks", feature = "redis")),
        allow(unused_variables)
    )]
    fn new(config: Option<super::tree::SuppressionConfig>, redis: Option<&Store>) -> Suppression {
        Suppression {
            config,
            #[cfg(all(feature = "webhooks", feature = "redis"))]
            redis: redis.cloned(),
        }
    }

    /// `stack` behind the list when one is configured, and the list; `stack` as it is when
    /// none is.
    #[cfg_attr(not(feature = "webhooks"), allow(unused_variables))]
    fn around(
        self,
        stack: Box<dyn Transport>,
        outbox: Option<&crate::outbox::Outbox>,
    ) -> Result<(Box<dyn Transport>, Option<SuppressionList>), ConfigError> {
        #[cfg(feature = "webhooks")]
        {
            use super::tree::SuppressionConfig;
            let list = match self.config {
                None => return Ok((stack, None)),
                Some(SuppressionConfig::Outbox) => {
                    let Some(outbox) = outbox else {
                        return Err(ConfigError::new(
                            "suppression",
                            "the suppression list is kept in the outbox's database, and the \
                             stack has no outbox",
                        ));
                    };
                    SuppressionList::in_outbox(outbox)
                        .map_err(|error| ConfigError::new("suppression", error.to_string()))?
                }
                Some(SuppressionConfig::Redis) => {
                    #[cfg(feature = "redis")]
                    match &self.redis {
                        Some(store) => SuppressionList::redis(store),
                        None => {
                            return Err(ConfigError::new(
                                "suppression.store",
                                "a suppression list in Redis needs the stack's [redis]",
                            ));
                        }
                    }
                    #[cfg(not(feature = "redis"))]
                    return Err(ConfigError::new(
                        "suppression.store",
                        "a suppression list in Redis needs the crate's `redis` feature",
                    ));
                }
            };
            let guarded = crate::suppression::SuppressionTransport::new(stack, list.clone());
            Ok((Box::new(guarded), Some(list)))
        }
        #[cfg(not(feature = "webhooks"))]
        Ok((stack, None))
    }
}

/// A worker for `outbox` through `stack`, set up as `config` says; `at_most_once` is the
/// stack-wide flag ([`MailerConfig::at_most_once_anywhere`]).
#[cfg(feature = "outbox")]
fn configured_worker(
    outbox: &crate::outbox::Outbox,
    stack: Arc<dyn Transport>,
    config: &super::tree::OutboxConfig,
    at_most_once: bool,
) -> crate::outbox::Worker<Arc<dyn Transport>> {
    let mut worker = outbox.worker(stack);
    if let Some(concurrency) = config.concurrency {
        worker = worker.concurrency(concurrency);
    }
    if let Some(lease) = config.lease {
        worker = worker.lease(lease);
    }
    if let Some(max_age) = config.max_age {
        worker = worker.max_age(max_age);
    }
    if let Some(poll) = config.poll {
        worker = worker.poll(poll);
    }
    if at_most_once {
        worker = worker.at_most_once();
    }
    worker
}

#[cfg(all(test, feature = "smtp"))]
mod tests {
    use std::time::Duration;

    use super::super::tree::{ConnectionConfig, SmtpConnection};
    use super::smtp_builder;

    #[test]
    fn an_smtp_members_connection_settings_reach_its_transports_builder() {
        let connection = ConnectionConfig {
            timeout: Some(Duration::from_secs(7)),
            smtp: SmtpConnection {
                max_connections: Some(3),
                idle_timeout: Some(Duration::from_secs(9)),
                max_messages_per_connection: Some(4),
                pipelining: Some(false),
                chunking: Some(false),
            },
        };
        let shown = format!(
            "{:?}",
            smtp_builder("smtp://127.0.0.1:2525", &connection).unwrap()
        );
        for field in [
            "timeout: 7s",
            "max_connections: 3",
            "idle_timeout: 9s",
            "max_messages_per_connection: 4",
            "pipelining: false",
            "chunking: false",
        ] {
            assert!(shown.contains(field), "{field} in {shown}");
        }
    }
}
